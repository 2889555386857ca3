//! Shared memory and descriptor passing for `riffle serve`: the only unsafe code of the
//! daemon and its Rust client.
//!
//! The daemon owns a [`SharedRing`] per stream: a sealed memfd (it cannot shrink or grow,
//! so no client can make the daemon's writes fault) mapped read-write; the client gets a
//! read-only descriptor of the same file and maps it with [`Mapping`]. Which bytes of the
//! ring belong to whom is kept by `serve::ring`: the daemon (its connection thread, or the
//! engine assembling a batch in a region it was lent) writes only regions it holds, never
//! one announced to the client and not yet acknowledged.
#![allow(unsafe_code)]

use std::any::Any;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use super::ring::{Slots, ALIGN};
use crate::modes::{Lender, Lent, PayloadLender};
use crate::{Error, Result};

fn os(what: &'static str, e: nix::Error) -> Error {
    Error::os(what, e)
}

/// The daemon's side of one stream's shared memory: the mapping, and which of its regions
/// are whose ([`Slots`]). The connection thread copies batches in ([`SharedRing::put`]);
/// the engine, through [`SharedRing::lender`], assembles batches in regions it is lent,
/// which the connection then announces without a copy ([`SharedRing::send_lent`]).
pub struct SharedRing {
    map: Ring,
    slots: Mutex<Slots>,
    /// Batches the engine assembled in its own memory because a lend was refused, not yet
    /// copied in. While there are any, nothing more is lent: regions are then taken in
    /// batch order, so such a batch never waits behind room held by a later batch (which
    /// cannot be sent before it) and finds a place once the client acks what it holds.
    owed: AtomicU64,
}

/// Where a batch's arrays and payload are in the ring, and its slot.
#[derive(Clone, Copy, Debug)]
pub struct Placed {
    /// The slot the client acknowledges.
    pub slot: u32,
    /// The ids (u64 each).
    pub ids_at: u64,
    /// The offsets (u64 each, one more than the ids).
    pub offsets_at: u64,
    /// The payload.
    pub data_at: u64,
}

impl super::proto::BatchHeader {
    /// Points the header at a batch placed in the ring.
    pub fn locate(&mut self, p: &Placed) {
        self.slot = p.slot;
        self.ids_at = p.ids_at;
        self.offsets_at = p.offsets_at;
        self.data_at = p.data_at;
    }
}

/// Bytes before a payload in a region: the ids and offsets of `records` records, and room
/// for their labels (u32 each, after the offsets, when the dataset has labels), aligned.
/// Saturates at `u64::MAX` (no ring holds that: such a batch never fits).
pub(crate) fn arrays_len(records: usize) -> u64 {
    // ids and offsets (8 bytes each), labels and sources (4 bytes each, when present).
    u64::try_from(records)
        .ok()
        .and_then(|n| {
            n.checked_mul(24)?
                .checked_add(8)?
                .div_ceil(ALIGN)
                .checked_mul(ALIGN)
        })
        .unwrap_or(u64::MAX)
}

/// Refuses arrays that do not fit the room `arrays_len(ids)` makes: one offset more than
/// ids, at most one label and one source per id.
fn check_arrays(ids: usize, offsets: usize, labels: usize, sources: usize) -> Result<()> {
    if ids.checked_add(1) != Some(offsets) || labels > ids || sources > ids {
        return Err(Error::Internal(format!(
            "a batch of {ids} ids came with {offsets} offsets, {labels} labels and {sources} \
             sources (one offset more than ids, at most one label and one source per id)"
        )));
    }
    Ok(())
}

/// Writes a batch's arrays where `p` places them: ids, offsets, then labels and sources
/// (u32 each) right after the offsets. Every write is checked against `w`'s region.
fn write_arrays(
    w: &RegionWriter<'_>,
    p: &Placed,
    ids: &[u64],
    offsets: &[u64],
    tags: (&[u32], &[u32]),
) -> Result<()> {
    let (labels, sources) = tags;
    w.write_u64s(p.ids_at, ids)?;
    w.write_u64s(p.offsets_at, offsets)?;
    let labels_at = byte_len(offsets.len(), 8).and_then(|n| p.offsets_at.checked_add(n));
    let sources_at = byte_len(labels.len(), 4).and_then(|n| labels_at?.checked_add(n));
    let (Some(labels_at), Some(sources_at)) = (labels_at, sources_at) else {
        return Err(Error::Internal(
            "a batch's arrays run past 2^64 bytes".into(),
        ));
    };
    w.write(labels_at, &label_bytes(labels))?;
    w.write(sources_at, &label_bytes(sources))
}

/// `n` items of `size` bytes, in bytes, if that is a u64.
fn byte_len(n: usize, size: u64) -> Option<u64> {
    u64::try_from(n).ok()?.checked_mul(size)
}

/// `labels` as little-endian bytes (the wire form).
fn label_bytes(labels: &[u32]) -> Vec<u8> {
    labels.iter().flat_map(|v| v.to_le_bytes()).collect()
}

impl SharedRing {
    /// A ring of `len` bytes.
    pub fn new(name: &str, len: u64) -> Result<Arc<SharedRing>> {
        let size = usize::try_from(len).map_err(|_| {
            Error::OverBudget(format!(
                "a shared-memory ring of {len} bytes cannot be mapped"
            ))
        })?;
        Ok(Arc::new(SharedRing {
            map: Ring::new(name, size)?,
            slots: Mutex::new(Slots::new(len)),
            owed: AtomicU64::new(0),
        }))
    }

    /// Its size.
    pub fn len(&self) -> usize {
        self.map.len
    }

    /// Whether it has no bytes (never: [`SharedRing::new`] refuses that).
    pub fn is_empty(&self) -> bool {
        self.map.len == 0
    }

    /// The regions. Only the serve module touches them: the safety of lent regions rests
    /// on this bookkeeping.
    pub(super) fn slots(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A descriptor for the client (see `Ring::client_fd`).
    pub fn client_fd(&self) -> Result<OwnedFd> {
        self.map.client_fd()
    }

    /// Copies a batch the engine assembled in its own memory into a fresh region and marks
    /// it sent; `Ok(None)` while there is no room. `owed`: a lend was refused for it (see
    /// [`crate::modes::Payload::lend_refused`]). Arrays of lengths that do not make a
    /// batch (see `check_arrays`) are an error, as is any write that would leave the
    /// region taken for the batch: nothing is then written and the region is given back.
    pub fn put(
        &self,
        ids: &[u64],
        offsets: &[u64],
        tags: (&[u32], &[u32]),
        payload: &[u8],
        owed: bool,
    ) -> Result<Option<Placed>> {
        check_arrays(ids.len(), offsets.len(), tags.0.len(), tags.1.len())?;
        let head = arrays_len(ids.len());
        let total = byte_len(payload.len(), 1)
            .and_then(|n| n.checked_add(head))
            .ok_or_else(|| {
                Error::Internal(format!("a batch of {} payload bytes", payload.len()))
            })?;
        let Some((slot, at)) = self.slots().alloc(total) else {
            return Ok(None);
        };
        if owed {
            let _ = self
                .owed
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        }
        // The slot covers `at..at + total` inside the ring (`Slots::alloc`), so these sums
        // do not wrap: `8 * ids` is less than `head`.
        let placed = Placed {
            slot,
            ids_at: at,
            offsets_at: at + 8 * ids.len() as u64,
            data_at: at + head,
        };
        let end = self.slots().end_of(slot).unwrap_or(at);
        // SAFETY: the slot was just allocated and is unsent: no other region overlaps it,
        // the engine is never lent it, and the client may not touch it until it is
        // announced, after these writes.
        let w = unsafe { RegionWriter::new(&self.map, at, end) };
        let written = write_arrays(&w, &placed, ids, offsets, tags)
            .and_then(|()| w.write(placed.data_at, payload));
        if let Err(e) = written {
            self.slots().cancel(slot);
            return Err(e);
        }
        let sent = self.slots().mark_sent(slot);
        assert!(sent, "a slot just allocated is live and unsent");
        Ok(Some(placed))
    }

    /// Lends the engine regions of this ring (see [`crate::modes::Lender`]); `on_ready`
    /// gets each batch the engine completes, on the engine's thread.
    pub fn lender(self: &Arc<Self>, on_ready: Option<OnReady>) -> PayloadLender {
        PayloadLender(Arc::new(RingLender {
            ring: self.clone(),
            on_ready,
        }))
    }

    /// Makes a batch assembled in a region of this ring ready to announce: writes its
    /// arrays beside the payload's `used` bytes and marks the slot sent; the region is
    /// the client's from here (the lease is consumed). `Err` gives the region back when it
    /// is not one of this ring's (or was lent for fewer records): the batch is copied.
    /// `labels` (empty, or one per id) go after the offsets.
    pub fn send_lent(
        self: &Arc<Self>,
        mut lent: Box<dyn Lent>,
        used: usize,
        ids: &[u64],
        offsets: &[u64],
        tags: (&[u32], &[u32]),
    ) -> std::result::Result<Placed, Box<dyn Lent>> {
        let (labels, sources) = tags;
        let ours = lent
            .as_any_mut()
            .downcast_mut::<Lease>()
            .is_some_and(|lease| {
                Arc::ptr_eq(&lease.ring, self)
                    && ids.len() <= lease.records
                    && offsets.len() == ids.len() + 1
                    && labels.len() <= ids.len()
                    && sources.len() <= ids.len()
                    && used <= lease.cap
            });
        if !ours {
            return Err(lent);
        }
        let mut lease = lent
            .into_any()
            .downcast::<Lease>()
            .expect("checked to be a lease above");
        let placed = Placed {
            slot: lease.slot,
            ids_at: lease.at,
            // Inside the lease's arrays (room for `lease.records >= ids` records).
            offsets_at: lease.at + 8 * ids.len() as u64,
            data_at: lease.data_at,
        };
        // SAFETY: the lease owns its region exclusively until it is marked sent below, and
        // the arrays' part of it, `at..data_at`, is not lent out as payload.
        let w = unsafe { RegionWriter::new(&self.map, lease.at, lease.data_at) };
        if write_arrays(&w, &placed, ids, offsets, tags).is_err() {
            // Checked above not to happen; if it did, the batch is copied instead (and
            // `put` refuses it with the reason).
            return Err(lease);
        }
        let sent = self.slots().mark_sent(lease.slot);
        assert!(sent, "a lease's slot is live and unsent until handed over");
        // The slot is the client's now: dropping the lease must not give it back.
        lease.sent = true;
        Ok(placed)
    }
}

/// Called with each batch the engine completes, on the engine's thread: `None` when it
/// took the batch over (announced it), else the batch back.
pub type OnReady = Arc<dyn Fn(crate::modes::Batch) -> Option<crate::modes::Batch> + Send + Sync>;

struct RingLender {
    ring: Arc<SharedRing>,
    on_ready: Option<OnReady>,
}

impl Lender for RingLender {
    fn ready(&self, batch: crate::modes::Batch) -> Option<crate::modes::Batch> {
        match &self.on_ready {
            Some(f) => f(batch),
            None => Some(batch),
        }
    }

    fn lend(&self, _index: u64, records: usize, bytes: usize) -> Option<Box<dyn Lent>> {
        let ring = &self.ring;
        let lent = self.try_lend(records, bytes);
        if lent.is_none() {
            // The engine assembles this batch in its own memory; it is owed a place.
            ring.owed.fetch_add(1, Ordering::SeqCst);
        }
        lent
    }
}

impl RingLender {
    fn try_lend(&self, records: usize, bytes: usize) -> Option<Box<dyn Lent>> {
        let ring = &self.ring;
        if ring.owed.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let head = arrays_len(records);
        let total = head.checked_add(byte_len(bytes, 1)?)?;
        let (slot, at) = ring.slots().alloc(total)?;
        let lease = Lease::new(ring, slot, at, records, at.checked_add(head), bytes);
        if lease.is_none() {
            ring.slots().cancel(slot);
        }
        Some(Box::new(lease?))
    }
}

/// A region of a [`SharedRing`] lent to the engine: its until [`SharedRing::send_lent`]
/// consumes it (the region is then the client's, and nothing can reach it through the
/// lease), or dropped, which gives it back.
///
/// Invariant (made by [`Lease::new`], kept by `shrink`, which only lowers `cap`):
/// `data_at + cap` is at most the end of the lease's slot, which is inside the mapping;
/// `data` is `data_at` as a `usize`. The views of the payload rest on it.
struct Lease {
    ring: Arc<SharedRing>,
    slot: u32,
    at: u64,
    records: usize,
    data_at: u64,
    data: usize,
    cap: usize,
    /// Set only by `send_lent` as it consumes the lease: its drop then leaves the slot
    /// to the client.
    sent: bool,
}

impl Lease {
    /// The lease of live unsent slot `slot` (at `at`), its payload of `cap` bytes at
    /// `data_at`: `None` unless that payload lies inside the slot (and so the mapping).
    fn new(
        ring: &Arc<SharedRing>,
        slot: u32,
        at: u64,
        records: usize,
        data_at: Option<u64>,
        cap: usize,
    ) -> Option<Lease> {
        let data_at = data_at?;
        let end = data_at.checked_add(byte_len(cap, 1)?)?;
        let slot_end = ring.slots().end_of(slot)?;
        let inside = at <= data_at && end <= slot_end && slot_end <= ring.len() as u64;
        Some(Lease {
            ring: ring.clone(),
            slot,
            at,
            records,
            data_at,
            data: usize::try_from(data_at).ok().filter(|_| inside)?,
            cap,
            sent: false,
        })
    }
}

impl Lent for Lease {
    fn bytes(&self) -> &[u8] {
        // SAFETY: the region [data_at, data_at + cap) is inside the mapping (the slot was
        // allocated inside it) and is this lease's alone while the lease exists (handing
        // it over consumes the lease; after that the client may ack it and the space be
        // lent again); the mapping lives as long as `self.ring`.
        // The bounds: `data + cap` is inside the mapping (the invariant of `Lease`).
        unsafe { std::slice::from_raw_parts(self.ring.map.ptr.as_ptr().add(self.data), self.cap) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes this the only view of the region.
        unsafe {
            std::slice::from_raw_parts_mut(self.ring.map.ptr.as_ptr().add(self.data), self.cap)
        }
    }

    fn shrink(&mut self, len: usize) {
        if len < self.cap {
            self.cap = len;
            let total = self.data_at - self.at + len as u64;
            self.ring.slots().shrink(self.slot, total);
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.sent {
            self.ring.slots().cancel(self.slot);
        }
    }
}

/// The mapping of one stream's memfd.
struct Ring {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; nothing in it is tied to the
// thread that created it.
unsafe impl Send for Ring {}
// SAFETY: shared between the connection thread and the engine, which write only regions
// they own by the bookkeeping of `SharedRing` (disjoint by construction); reads of the
// mapping by this process go through those same owned regions.
unsafe impl Sync for Ring {}

impl Ring {
    /// A new memfd of `len` bytes (sealed against resizing), mapped read-write.
    fn new(name: &str, len: usize) -> Result<Ring> {
        let size = NonZeroUsize::new(len)
            .ok_or_else(|| Error::Invalid("a shared-memory ring needs at least one byte".into()))?;
        let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
            .map_err(|e| os("memfd_create", e))?;
        let bytes = i64::try_from(len)
            .map_err(|_| Error::OverBudget(format!("a shared-memory ring of {len} bytes")))?;
        nix::unistd::ftruncate(&fd, bytes).map_err(|e| os("ftruncate of the memfd", e))?;
        fcntl(
            &fd,
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW),
        )
        .map_err(|e| os("sealing the memfd", e))?;
        // SAFETY: a fresh shared mapping of a file of exactly `len` bytes that cannot shrink
        // (sealed), so every byte of it stays backed; no other mapping in this process
        // aliases it, and it is unmapped only in Drop.
        let ptr = unsafe {
            mmap(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                // Populated now: no page faults when batches are written later, and the
                // ring's memory is all accounted for from the start.
                MapFlags::MAP_SHARED | MapFlags::MAP_POPULATE,
                &fd,
                0,
            )
        }
        .map_err(|e| os("mmap of the memfd", e))?;
        let ring = Ring {
            fd,
            ptr: ptr.cast(),
            len,
        };
        // Only the mapping above may write: from here on, no writable mapping and no
        // write() through any descriptor of this file (a client reopening
        // /proc/self/fd/N read-write included), and no more seals.
        fcntl(
            &ring.fd,
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_FUTURE_WRITE | SealFlag::F_SEAL_SEAL),
        )
        .map_err(|e| os("sealing the memfd against writes", e))?;
        Ok(ring)
    }

    /// Copies `src` to byte `at`; an error, and nothing written, if that runs past the end.
    ///
    /// # Safety
    /// The caller owns `at..at + src.len()` (a region of the ring's bookkeeping nobody
    /// else writes or reads while this runs).
    unsafe fn write(&self, at: u64, src: &[u8]) -> Result<()> {
        let start = usize::try_from(at)
            .ok()
            .filter(|&a| a.checked_add(src.len()).is_some_and(|end| end <= self.len))
            .ok_or_else(|| {
                Error::Internal(format!(
                    "ring write of {} bytes at {at} past its end ({})",
                    src.len(),
                    self.len
                ))
            })?;
        // SAFETY: the range is inside the mapping (checked above) and the caller's alone;
        // `src` is ordinary memory of this process, which cannot overlap the mapping that
        // only owned regions point into. The client maps the file read-only.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(start), src.len())
        };
        Ok(())
    }
}

/// Writes into one region of the ring its holder owns (a slot allocated and not yet sent,
/// or the arrays' part of a lease). Every write is checked to land inside the region, so
/// a length that disagrees with the room taken is an error, never a write into the
/// neighbouring region (a batch announced to the client, or one the engine is filling).
struct RegionWriter<'a> {
    ring: &'a Ring,
    start: u64,
    end: u64,
}

impl<'a> RegionWriter<'a> {
    /// # Safety
    /// The caller owns `start..end` of `ring`: nobody else writes or reads it while the
    /// writer lives.
    unsafe fn new(ring: &'a Ring, start: u64, end: u64) -> RegionWriter<'a> {
        RegionWriter { ring, start, end }
    }

    /// Copies `src` to byte `at` of the ring, which must be inside the region.
    fn write(&self, at: u64, src: &[u8]) -> Result<()> {
        let inside = at >= self.start
            && byte_len(src.len(), 1)
                .and_then(|n| at.checked_add(n))
                .is_some_and(|end| end <= self.end);
        if !inside {
            return Err(Error::Internal(format!(
                "a write of {} bytes at {at} leaves the region {}..{} taken for it",
                src.len(),
                self.start,
                self.end
            )));
        }
        // SAFETY: inside the region, which the caller of `new` owns.
        unsafe { self.ring.write(at, src) }
    }

    /// Writes `vals` little-endian at byte `at`, inside the region.
    fn write_u64s(&self, at: u64, vals: &[u64]) -> Result<()> {
        if cfg!(target_endian = "little") {
            // The in-memory form of a u64 slice on a little-endian machine is the wire form.
            let n = std::mem::size_of_val(vals);
            // SAFETY: any u64 slice is readable as its bytes (u8 has no alignment or
            // validity requirement); the view lives only for this call.
            let raw = unsafe { std::slice::from_raw_parts(vals.as_ptr().cast::<u8>(), n) };
            self.write(at, raw)
        } else {
            let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
            self.write(at, &bytes)
        }
    }
}

impl Ring {
    /// A descriptor for the client: read-only when `/proc/self/fd` allows reopening the
    /// memfd so, else the read-write one.
    fn client_fd(&self) -> Result<OwnedFd> {
        let path = format!("/proc/self/fd/{}", self.fd.as_raw_fd());
        match crate::door::open_stream(std::path::Path::new(&path)) {
            Ok(f) => Ok(f.into()),
            Err(_) => self
                .fd
                .try_clone()
                .map_err(|e| Error::os("cannot duplicate the memfd", e)),
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the mapping was made in `new` with this length and is unmapped only here;
        // no reference into it outlives `self`.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

/// A client's read-only mapping of a stream's ring.
///
/// The daemon writes the same memory from its own process, so no `&[u8]` into it is ever
/// handed out: while one lived, Rust would assume its bytes cannot change, which another
/// process can break at any time (the daemon keeps to the protocol, but this process
/// cannot make it). Bytes are copied out instead ([`Mapping::read_at`]).
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a read-only mapping owned by this value.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` read-only.
    pub fn new(fd: &OwnedFd, len: u64) -> Result<Mapping> {
        let size = usize::try_from(len)
            .ok()
            .and_then(NonZeroUsize::new)
            .ok_or_else(|| {
                Error::Protocol(format!("the daemon announced a ring of {len} bytes"))
            })?;
        let st = nix::sys::stat::fstat(fd.as_fd()).map_err(|e| os("fstat of the memfd", e))?;
        let held = u64::try_from(st.st_size).unwrap_or(0);
        if held < len {
            return Err(Error::Protocol(format!(
                "the ring's memfd holds {held} bytes, not the {len} announced"
            )));
        }
        // SAFETY: a fresh read-only shared mapping of `len` bytes of a file at least that
        // long (checked above; the daemon seals it against shrinking). It is unmapped only
        // in Drop.
        let ptr = unsafe {
            mmap(
                None,
                size,
                ProtFlags::PROT_READ,
                MapFlags::MAP_SHARED | MapFlags::MAP_POPULATE,
                fd,
                0,
            )
        }
        .map_err(|e| os("mmap of the ring", e))?;
        Ok(Mapping {
            ptr: ptr.cast(),
            len: size.get(),
        })
    }

    /// Its size.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Whether it has no bytes (never: [`Mapping::new`] refuses that).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where `at..at + len` starts, as an index of the mapping, or an error when that
    /// range is not all inside it.
    pub fn check(&self, at: u64, len: u64) -> Result<usize> {
        at.checked_add(len)
            .filter(|&end| end <= self.len as u64)
            .and_then(|_| usize::try_from(at).ok())
            .ok_or_else(|| {
                Error::Protocol(format!(
                    "{len} bytes at {at} of the ring lie past its end ({} bytes)",
                    self.len
                ))
            })
    }

    /// Copies the `out.len()` bytes at `at` into `out`; an error when they are not all
    /// inside the mapping.
    ///
    /// The daemon does not write a slot between announcing it and receiving its ack, so
    /// the bytes of an announced batch are stable while they are copied.
    pub fn read_at(&self, at: u64, out: &mut [u8]) -> Result<()> {
        let start = self.check(at, out.len() as u64)?;
        // SAFETY: `start..start + out.len()` is inside the mapping (checked above), which
        // lives as long as `self`. The bytes are copied through raw pointers, no reference
        // to the shared memory is made, and every value is a valid u8: a daemon breaking
        // the protocol by writing the range meanwhile could only leave `out` a mix of old
        // and new bytes, which callers check like any input from the daemon. `out` is this
        // process's own memory and cannot overlap a read-only mapping of the ring.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(start), out.as_mut_ptr(), out.len())
        };
        Ok(())
    }

    /// `n` little-endian u64s at byte `at`, copied out. The range is checked before
    /// anything is allocated, so a count from a hostile header costs nothing.
    pub fn read_u64s(&self, at: u64, n: u64) -> Result<Vec<u64>> {
        let raw = self.read_vec(at, n, 8)?;
        Ok(raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect())
    }

    /// `n` little-endian u32s at byte `at`, copied out (checked as `read_u64s`).
    pub fn read_u32s(&self, at: u64, n: u64) -> Result<Vec<u32>> {
        let raw = self.read_vec(at, n, 4)?;
        Ok(raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect())
    }

    /// `n` items of `size` bytes at `at`, copied into a vector once the range is checked.
    fn read_vec(&self, at: u64, n: u64, size: u64) -> Result<Vec<u8>> {
        let len = n.checked_mul(size).ok_or_else(|| {
            Error::Protocol(format!("{n} items of {size} bytes at {at} of the ring"))
        })?;
        self.check(at, len)?;
        // Inside the mapping, hence a usize.
        let mut out = vec![0u8; usize::try_from(len).unwrap_or(0)];
        self.read_at(at, &mut out)?;
        Ok(out)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this length; borrows of it cannot outlive `self`.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

/// Writes all of `bytes` to `sock`, with `fd` attached to the first byte (SCM_RIGHTS).
pub fn send_with_fd(sock: &UnixStream, bytes: &[u8], fd: &OwnedFd) -> std::io::Result<()> {
    use std::io::Write;
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let iov = [std::io::IoSlice::new(bytes)];
    let n = loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(n) => break n,
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    // The descriptor went with the first byte; the rest (if the socket took only part)
    // follows as plain data.
    let mut s = sock;
    s.write_all(&bytes[n..])
}

/// Reads what is there (blocking until something is) into `buf`, collecting descriptors
/// that came with it. Returns the bytes read (0 at end of stream).
pub fn recv_with_fds(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> std::io::Result<usize> {
    let mut space = nix::cmsg_space!([RawFd; 4]);
    loop {
        let mut iov = [std::io::IoSliceMut::new(buf)];
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => {
                let n = msg.bytes;
                for c in msg.cmsgs().map_err(std::io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        for r in raw {
                            // SAFETY: the kernel just installed `r` in this process for
                            // this message (SCM_RIGHTS); nothing else owns it.
                            fds.push(unsafe { OwnedFd::from_raw_fd(r) });
                        }
                    }
                }
                return Ok(n);
            }
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused memfd keeps the OS's errno and names the call, as its message always did.
    #[test]
    fn a_failed_memfd_call_keeps_its_errno() {
        // A name with a NUL byte in it is no C string: EINVAL before the kernel is asked.
        let e = Ring::new("riffle\0test", 4096).err().expect("refused");
        assert_eq!(e.kind(), crate::ErrorKind::Os, "{e}");
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
        assert!(e.to_string().starts_with("memfd_create: "), "{e}");
    }

    #[test]
    fn a_ring_is_seen_through_a_passed_read_only_descriptor() {
        let ring = Ring::new("riffle-test", 1 << 16).unwrap();
        // SAFETY: nothing else uses this ring.
        unsafe {
            let w = RegionWriter::new(&ring, 64, 1024);
            w.write(100, b"hello").unwrap();
            w.write_u64s(128, &[1, 2, u64::MAX]).unwrap();
        }
        let (a, b) = UnixStream::pair().unwrap();
        send_with_fd(&a, b"x", &ring.client_fd().unwrap()).unwrap();
        let mut buf = [0u8; 8];
        let mut fds = Vec::new();
        assert_eq!(recv_with_fds(&b, &mut buf, &mut fds).unwrap(), 1);
        assert_eq!(fds.len(), 1);
        let m = Mapping::new(&fds[0], 1 << 16).unwrap();
        let read = |at: u64, n: usize| {
            let mut v = vec![0u8; n];
            m.read_at(at, &mut v).map(|()| v)
        };
        assert_eq!(read(100, 5).unwrap(), b"hello");
        assert_eq!(m.read_u64s(128, 3).unwrap(), [1, 2, u64::MAX]);
        assert_eq!(m.read_u32s(128, 2).unwrap(), [1, 0]);
        assert!(read(1 << 16, 1).is_err());
        assert!(
            read((1 << 16) - 4, 5).is_err(),
            "a read that runs past the end"
        );
        assert!(read(u64::MAX, 1).is_err());
        // Counts from a hostile header are refused before anything is allocated.
        assert!(m.read_u64s(0, u64::MAX / 4).is_err());
        assert!(m.read_u64s(8, 1 << 13).is_err(), "8 bytes past the end");
        assert_eq!(m.read_u64s(8, (1 << 13) - 1).unwrap().len(), (1 << 13) - 1);
        // The daemon's later writes show through the client's mapping.
        // SAFETY: as above.
        unsafe { ring.write(100, b"HELLO").unwrap() };
        assert_eq!(read(100, 5).unwrap(), b"HELLO");
        // The sealed memfd cannot be shrunk by whoever holds it.
        assert!(nix::unistd::ftruncate(&ring.fd, 0).is_err());
    }

    /// Regression (issue 15): memfd inodes are 0777, so a client could reopen the passed
    /// descriptor read-write through /proc and scribble on the ring the daemon writes.
    /// The write seal refuses a writable mapping and write() through any descriptor.
    #[test]
    fn a_client_cannot_write_the_ring_even_through_a_reopened_descriptor() {
        use std::os::unix::fs::FileExt;
        let ring = Ring::new("riffle-test", 1 << 16).unwrap();
        let passed = ring.client_fd().unwrap();
        let reopened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", passed.as_raw_fd()))
            .expect("memfds are 0777: the reopen itself succeeds");
        let e = reopened.write_at(b"evil", 100).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
        for fd in [passed.as_fd(), reopened.as_fd()] {
            // SAFETY: a fresh mapping that is unmapped at once if it is ever made.
            let writable = unsafe {
                mmap(
                    None,
                    NonZeroUsize::new(4096).unwrap(),
                    ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                    MapFlags::MAP_SHARED,
                    fd,
                    0,
                )
            };
            match writable {
                Ok(p) => {
                    // SAFETY: just mapped, 4096 bytes, used by nothing.
                    let _ = unsafe { munmap(p, 4096) };
                    panic!("a writable shared mapping of the ring was allowed");
                }
                // EACCES for the read-only descriptor; EPERM (the seal) for the one
                // reopened read-write.
                Err(e) => assert!(
                    matches!(e, nix::errno::Errno::EPERM | nix::errno::Errno::EACCES),
                    "{e}"
                ),
            }
        }
        // The daemon's own mapping still writes, and a read-only one still reads.
        // SAFETY: nothing else uses this ring.
        unsafe { ring.write(100, b"fine").unwrap() };
        let m = Mapping::new(&passed, 1 << 16).unwrap();
        let mut got = [0u8; 4];
        m.read_at(100, &mut got).unwrap();
        assert_eq!(&got, b"fine");
    }

    /// Regression (issue 28): `put` checked only that there was one offset more than ids
    /// (with a panic), so labels or sources longer than the ids were written past the
    /// arrays' room, over the payload or into the next region.
    #[test]
    fn a_put_whose_arrays_do_not_make_a_batch_is_refused() {
        let ring = SharedRing::new("riffle-test", 1 << 16).unwrap();
        let (ids, offs) = ([1u64, 2], [0u64, 3, 6]);
        for (offsets, labels, sources, what) in [
            (&offs[..], &[1u32, 2, 3][..], &[][..], "3 labels"),
            (&offs[..], &[][..], &[9u32; 5][..], "5 sources"),
            (&offs[..2], &[][..], &[][..], "2 offsets"),
            (&[0u64, 1, 2, 3][..], &[][..], &[][..], "4 offsets"),
        ] {
            let e = ring
                .put(&ids, offsets, (labels, sources), b"abcdef", false)
                .unwrap_err()
                .to_string();
            assert!(e.contains(what), "{e}");
        }
        assert_eq!(ring.slots().used(), 0, "nothing was taken");
        // A batch that does make sense is placed, and reads back through a client's
        // mapping: its arrays, its labels after the offsets, its payload.
        let p = ring
            .put(&ids, &offs, (&[7, 8], &[]), b"abcdef", false)
            .unwrap()
            .expect("room");
        let m = Mapping::new(&ring.client_fd().unwrap(), 1 << 16).unwrap();
        assert_eq!(m.read_u64s(p.ids_at, 2).unwrap(), ids);
        assert_eq!(m.read_u64s(p.offsets_at, 3).unwrap(), offs);
        assert_eq!(m.read_u32s(p.offsets_at + 24, 2).unwrap(), [7, 8]);
        let mut data = [0u8; 6];
        m.read_at(p.data_at, &mut data).unwrap();
        assert_eq!(&data, b"abcdef");
        // No room is not an error: the caller waits for acks.
        assert!(ring
            .put(&ids, &offs, (&[], &[]), &[0u8; 1 << 16], false)
            .unwrap()
            .is_none());
    }

    #[test]
    fn region_writes_stay_inside_their_region() {
        let ring = Ring::new("riffle-test", 1 << 16).unwrap();
        // SAFETY: nothing else uses this ring.
        let w = unsafe { RegionWriter::new(&ring, 64, 128) };
        assert!(w.write(63, b"x").is_err(), "before the region");
        assert!(w.write(120, &[0; 9]).is_err(), "past its end");
        assert!(w.write(u64::MAX, b"x").is_err());
        assert!(w.write_u64s(64, &[0; 9]).is_err());
        assert!(w.write_u64s(64, &[0; 8]).is_ok());
        // SAFETY: as above.
        assert!(unsafe { ring.write((1 << 16) - 1, b"ab") }.is_err());
    }

    /// Regression (issue 28): `Slots::alloc` wrapped for lengths near 2^64, and a lease
    /// then viewed more of the ring than its slot held. A lend the ring cannot hold is
    /// refused; a lease's views are its payload's bytes exactly.
    #[test]
    fn a_lend_the_ring_cannot_hold_is_refused() {
        let ring = SharedRing::new("riffle-test", 1 << 16).unwrap();
        let lender = RingLender {
            ring: ring.clone(),
            on_ready: None,
        };
        for (records, bytes) in [
            (usize::MAX, 1),
            (1, usize::MAX),
            (1, usize::MAX - 100),
            (usize::MAX / 24, 0),
            (1, 1 << 16),
        ] {
            assert!(
                lender.try_lend(records, bytes).is_none(),
                "{records} {bytes}"
            );
        }
        assert_eq!(ring.slots().used(), 0);
        let mut lent = lender.try_lend(2, 1000).unwrap();
        assert_eq!(lent.bytes_mut().len(), 1000);
        lent.bytes_mut()[..3].copy_from_slice(b"abc");
        lent.shrink(3);
        assert_eq!(lent.bytes(), b"abc");
        // More labels than the lease has room for: the region comes back to be copied.
        let lent = ring
            .send_lent(lent, 3, &[1, 2], &[0, 1, 3], (&[1, 2, 3], &[]))
            .unwrap_err();
        let Ok(p) = ring.send_lent(lent, 3, &[1, 2], &[0, 1, 3], (&[4, 5], &[6, 7])) else {
            panic!("a lease of this ring with room for its arrays is sent in place");
        };
        let m = Mapping::new(&ring.client_fd().unwrap(), 1 << 16).unwrap();
        assert_eq!(m.read_u32s(p.offsets_at + 24, 4).unwrap(), [4, 5, 6, 7]);
        let lent = lender.try_lend(1, 10).unwrap();
        drop(lent);
        assert_eq!(
            ring.slots().outstanding(),
            1,
            "the dropped lease gave its slot back"
        );
    }
}
