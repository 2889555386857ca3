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

fn os(what: &str, e: nix::Error) -> Error {
    Error::Invalid(format!("{what}: {e}"))
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
pub(crate) fn arrays_len(records: usize) -> u64 {
    // ids and offsets (8 bytes each), labels and sources (4 bytes each, when present).
    (24 * records as u64 + 8).div_ceil(ALIGN) * ALIGN
}

/// `labels` as little-endian bytes (the wire form).
fn label_bytes(labels: &[u32]) -> Vec<u8> {
    labels.iter().flat_map(|v| v.to_le_bytes()).collect()
}

impl SharedRing {
    /// A ring of `len` bytes.
    pub fn new(name: &str, len: usize) -> Result<Arc<SharedRing>> {
        Ok(Arc::new(SharedRing {
            map: Ring::new(name, len)?,
            slots: Mutex::new(Slots::new(len as u64)),
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
    /// it sent, or `None` while there is no room. `owed`: a lend was refused for it (see
    /// [`crate::modes::Payload::lend_refused`]).
    pub fn put(
        &self,
        ids: &[u64],
        offsets: &[u64],
        tags: (&[u32], &[u32]),
        payload: &[u8],
        owed: bool,
    ) -> Option<Placed> {
        let (labels, sources) = tags;
        assert_eq!(
            offsets.len(),
            ids.len() + 1,
            "a batch has one offset more than ids"
        );
        let head = arrays_len(ids.len());
        let (slot, at) = self.slots().alloc(head + payload.len() as u64)?;
        if owed {
            let _ = self
                .owed
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        }
        let placed = Placed {
            slot,
            ids_at: at,
            offsets_at: at + 8 * ids.len() as u64,
            data_at: at + head,
        };
        // SAFETY: the region was just allocated and is unsent: no other region overlaps
        // it, the engine is never lent it, and the client may not touch it until it is
        // announced, after these writes.
        unsafe {
            self.map.write_u64s(placed.ids_at, ids);
            self.map.write_u64s(placed.offsets_at, offsets);
            let at = placed.offsets_at + 8 * offsets.len() as u64;
            self.map.write(at, &label_bytes(labels));
            self.map
                .write(at + 4 * labels.len() as u64, &label_bytes(sources));
            self.map.write(placed.data_at, payload);
        }
        let sent = self.slots().mark_sent(slot);
        assert!(sent, "a slot just allocated is live and unsent");
        Some(placed)
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
            offsets_at: lease.at + 8 * ids.len() as u64,
            data_at: lease.data_at,
        };
        // SAFETY: the lease owns its region exclusively until it is marked sent below; the
        // arrays fit before the payload (room was lent for at least this many records).
        unsafe {
            self.map.write_u64s(placed.ids_at, ids);
            self.map.write_u64s(placed.offsets_at, offsets);
            let at = placed.offsets_at + 8 * offsets.len() as u64;
            self.map.write(at, &label_bytes(labels));
            self.map
                .write(at + 4 * labels.len() as u64, &label_bytes(sources));
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
        let total = head.checked_add(bytes as u64)?;
        let (slot, at) = ring.slots().alloc(total)?;
        Some(Box::new(Lease {
            ring: ring.clone(),
            slot,
            at,
            records,
            data_at: at + head,
            cap: bytes,
            sent: false,
        }))
    }
}

/// A region of a [`SharedRing`] lent to the engine: its until [`SharedRing::send_lent`]
/// consumes it (the region is then the client's, and nothing can reach it through the
/// lease), or dropped, which gives it back.
struct Lease {
    ring: Arc<SharedRing>,
    slot: u32,
    at: u64,
    records: usize,
    data_at: u64,
    cap: usize,
    /// Set only by `send_lent` as it consumes the lease: its drop then leaves the slot
    /// to the client.
    sent: bool,
}

impl Lent for Lease {
    fn bytes(&self) -> &[u8] {
        // SAFETY: the region [data_at, data_at + cap) is inside the mapping (the slot was
        // allocated inside it) and is this lease's alone while the lease exists (handing
        // it over consumes the lease; after that the client may ack it and the space be
        // lent again); the mapping lives as long as `self.ring`.
        unsafe {
            std::slice::from_raw_parts(
                self.ring.map.ptr.as_ptr().add(self.data_at as usize),
                self.cap,
            )
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes this the only view of the region.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.ring.map.ptr.as_ptr().add(self.data_at as usize),
                self.cap,
            )
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
        nix::unistd::ftruncate(&fd, len as i64).map_err(|e| os("ftruncate of the memfd", e))?;
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

    /// Copies `src` to byte `at`. Panics if that runs past the end.
    ///
    /// # Safety
    /// The caller owns `at..at + src.len()` (a region of the ring's bookkeeping nobody
    /// else writes or reads while this runs).
    unsafe fn write(&self, at: u64, src: &[u8]) {
        let at = at as usize;
        assert!(
            at.checked_add(src.len()).is_some_and(|end| end <= self.len),
            "ring write of {} bytes at {at} past its end ({})",
            src.len(),
            self.len
        );
        // SAFETY: the range is inside the mapping (checked above) and the caller's alone;
        // `src` is ordinary memory of this process, which cannot overlap the mapping that
        // only owned regions point into. The client maps the file read-only.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(at), src.len())
        };
    }

    /// Writes `vals` little-endian at byte `at`.
    ///
    /// # Safety
    /// As for [`Ring::write`], over `8 * vals.len()` bytes.
    unsafe fn write_u64s(&self, at: u64, vals: &[u64]) {
        if cfg!(target_endian = "little") {
            // The in-memory form of a u64 slice on a little-endian machine is the wire form.
            let n = std::mem::size_of_val(vals);
            // SAFETY: any u64 slice is readable as its bytes (u8 has no alignment or
            // validity requirement); the view lives only for this call.
            let raw = unsafe { std::slice::from_raw_parts(vals.as_ptr().cast::<u8>(), n) };
            // SAFETY: the caller's contract, passed on.
            unsafe { self.write(at, raw) };
        } else {
            let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
            // SAFETY: the caller's contract, passed on.
            unsafe { self.write(at, &bytes) };
        }
    }

    /// A descriptor for the client: read-only when `/proc/self/fd` allows reopening the
    /// memfd so, else the read-write one.
    fn client_fd(&self) -> Result<OwnedFd> {
        let path = format!("/proc/self/fd/{}", self.fd.as_raw_fd());
        match std::fs::File::open(path) {
            Ok(f) => Ok(f.into()),
            Err(_) => self
                .fd
                .try_clone()
                .map_err(|e| Error::Invalid(format!("cannot duplicate the memfd: {e}"))),
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

/// A client's read-only view of a stream's ring.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a read-only mapping owned by this value.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` read-only.
    pub fn new(fd: &OwnedFd, len: usize) -> Result<Mapping> {
        let size = NonZeroUsize::new(len)
            .ok_or_else(|| Error::Invalid("the daemon announced an empty ring".into()))?;
        let st = nix::sys::stat::fstat(fd.as_fd()).map_err(|e| os("fstat of the memfd", e))?;
        if (st.st_size as u64) < len as u64 {
            return Err(Error::Invalid(format!(
                "the ring's memfd holds {} bytes, not the {len} announced",
                st.st_size
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
            len,
        })
    }

    /// Bytes `at..at + len`, or `None` past the end.
    ///
    /// The daemon does not write a slot between announcing it and receiving its ack, and the
    /// client's borrow of a batch ends before it acks, so the bytes are stable while seen.
    pub fn bytes(&self, at: u64, len: u64) -> Option<&[u8]> {
        let end = at.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        // SAFETY: the range is inside the mapping, which lives as long as `self`; the
        // protocol keeps the daemon from writing it while the borrow lasts (see above).
        Some(unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr().add(at as usize), len as usize)
        })
    }

    /// `n` little-endian u64 at byte `at` (8-aligned: the daemon aligns every array).
    pub fn u64s(&self, at: u64, n: u64) -> Option<&[u64]> {
        let bytes = self.bytes(at, n.checked_mul(8)?)?;
        if !cfg!(target_endian = "little") || !(bytes.as_ptr() as usize).is_multiple_of(8) {
            return None;
        }
        // SAFETY: the bytes are in the mapping (checked by `bytes`), 8-aligned (checked
        // above) and any bit pattern is a valid u64; little-endian is the wire order.
        Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<u64>(), n as usize) })
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

    #[test]
    fn a_ring_is_seen_through_a_passed_read_only_descriptor() {
        let ring = Ring::new("riffle-test", 1 << 16).unwrap();
        // SAFETY: nothing else uses this ring.
        unsafe {
            ring.write(100, b"hello");
            ring.write_u64s(128, &[1, 2, u64::MAX]);
        }
        let (a, b) = UnixStream::pair().unwrap();
        send_with_fd(&a, b"x", &ring.client_fd().unwrap()).unwrap();
        let mut buf = [0u8; 8];
        let mut fds = Vec::new();
        assert_eq!(recv_with_fds(&b, &mut buf, &mut fds).unwrap(), 1);
        assert_eq!(fds.len(), 1);
        let m = Mapping::new(&fds[0], 1 << 16).unwrap();
        assert_eq!(m.bytes(100, 5).unwrap(), b"hello");
        assert_eq!(m.u64s(128, 3).unwrap(), &[1, 2, u64::MAX]);
        assert!(m.bytes(1 << 16, 1).is_none());
        assert!(m.u64s(129, 1).is_none(), "misaligned arrays are refused");
        // The daemon's later writes show through the client's mapping.
        // SAFETY: as above.
        unsafe { ring.write(100, b"HELLO") };
        assert_eq!(m.bytes(100, 5).unwrap(), b"HELLO");
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
        unsafe { ring.write(100, b"fine") };
        let m = Mapping::new(&passed, 1 << 16).unwrap();
        assert_eq!(m.bytes(100, 4).unwrap(), b"fine");
    }
}
