//! Aligned memory owned by the engine.
//!
//! O_DIRECT needs the buffer address, the file offset and the length aligned to what the
//! device and filesystem ask for (see [`super::align`]). [`AlignedBuf`] is a zeroed,
//! aligned heap allocation; [`Slab`] cuts one of them into equal slots that the backends
//! hand to the kernel and track, so that no slot can be read, written or freed by the
//! caller while a request on it is in flight.
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::ptr::NonNull;

use crate::{Error, Result};

/// A zero-initialised buffer whose address is a multiple of `align`.
///
/// Buffers of 256 KiB and more are mapped directly, rounded up to whole 2 MiB huge pages,
/// and asked to be backed by transparent huge pages: a large direct read into physically
/// scattered 4 KiB pages needs one DMA segment per page and is split by the block layer
/// once it exceeds the device's segment limit (virtio: 254). Measured here: 1 MiB
/// sequential reads went from 1.1 to 3.2 GB/s, 64 KiB random reads at QD 64 from 16k to
/// 34k IOPS.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    align: usize,
    backing: Backing,
}

enum Backing {
    Heap(Layout),
    /// The whole mapping (start, length), of which `ptr..ptr+len` is an aligned part.
    Mmap(*mut libc::c_void, usize),
}

/// The huge-page size the mapping is aligned to.
pub const HUGE: usize = 2 << 20;

/// Buffers at least this large are mapped on huge pages.
pub const MAP_THRESHOLD: usize = 256 << 10;

// SAFETY: AlignedBuf uniquely owns its memory, like a Box<[u8]>; sharing it follows the
// usual borrow rules through &self / &mut self.
unsafe impl Send for AlignedBuf {}
// SAFETY: see above: &AlignedBuf only gives out &[u8].
unsafe impl Sync for AlignedBuf {}

/// The bytes an [`AlignedBuf`] of `len` bytes really takes: large buffers are rounded up
/// to whole huge pages. Memory budgets must plan with this, not with `len`.
pub fn footprint(len: usize) -> usize {
    if len >= MAP_THRESHOLD {
        len.next_multiple_of(HUGE)
    } else {
        len
    }
}

impl AlignedBuf {
    /// Allocates `len` zeroed bytes aligned to `align` (a power of two). `len` may be zero.
    /// Panics if `len` rounded up to the alignment passes `isize::MAX`, and aborts (as a
    /// `Vec` does) when the memory cannot be had: see [`AlignedBuf::try_new`].
    pub fn new(len: usize, align: usize) -> Self {
        assert!(
            align.is_power_of_two(),
            "alignment {align} is not a power of two"
        );
        let len = len.max(align);
        let layout = Layout::from_size_align(len, align).expect("buffer layout");
        Self::try_new(len, align).unwrap_or_else(|| alloc::handle_alloc_error(layout))
    }

    /// As [`AlignedBuf::new`], `None` when the memory cannot be had or `len` rounded up to
    /// the alignment passes `isize::MAX`. Panics if `align` is not a power of two.
    pub fn try_new(len: usize, align: usize) -> Option<Self> {
        assert!(
            align.is_power_of_two(),
            "alignment {align} is not a power of two"
        );
        let len = len.max(align);
        if len >= MAP_THRESHOLD {
            if let Some(buf) = len
                .checked_next_multiple_of(HUGE)
                .and_then(|whole| Self::mapped(whole, align))
            {
                return Some(buf);
            }
        }
        // A zero-sized layout cannot be allocated; len is at least one alignment unit.
        let layout = Layout::from_size_align(len, align).ok()?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        Some(AlignedBuf {
            ptr: NonNull::new(raw)?,
            len,
            align,
            backing: Backing::Heap(layout),
        })
    }

    fn mapped(len: usize, align: usize) -> Option<Self> {
        let step = align.max(HUGE);
        let total = len.checked_add(step)?;
        // SAFETY: an anonymous private mapping with no address hint has no preconditions;
        // the result is checked against MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let start = (base as usize).next_multiple_of(step);
        // SAFETY: start..start+len lies inside the mapping (start - base < step, and the
        // mapping is len + step long). MADV_HUGEPAGE is only advice; failure is harmless.
        unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
        let ptr = NonNull::new(start as *mut u8)?;
        Some(AlignedBuf {
            ptr,
            len,
            align,
            backing: Backing::Mmap(base, total),
        })
    }

    /// The buffer's length in bytes (at least one alignment unit).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: an aligned buffer holds at least one alignment unit.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The buffer's alignment.
    pub fn align(&self) -> usize {
        self.align
    }

    /// The start address, for handing to the kernel.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr points to len initialised bytes (zeroed by the allocator or by the
        // kernel for a fresh anonymous mapping) owned by self, borrowed for &self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        match self.backing {
            // SAFETY: ptr was allocated with exactly this layout and is freed once.
            Backing::Heap(layout) => unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) },
            // SAFETY: (base, total) is the mapping made in `mapped`, unmapped once.
            Backing::Mmap(base, total) => unsafe {
                libc::munmap(base, total);
            },
        }
    }
}

/// Names one slot of a backend: a handle the caller passes back to the backend to reach
/// the slot's bytes, never the memory itself. Which operations a slot allows depends on
/// its state (free, held by the caller, or in flight), which the backend checks on every
/// use: see [`super::Backend::acquire`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotId(pub(crate) u32);

impl SlotId {
    /// The slot's index in its slab.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Free,
    /// Handed to the caller by `acquire`, or returned by a completion.
    Held,
    /// Owned by the kernel (or a pread worker) until its completion is reaped.
    InFlight,
}

/// One aligned allocation cut into `count` slots of `slot_size` bytes, with the state of
/// each slot. The backends own a slab each and never hand it out: callers reach slots only
/// through the backend's slot operations, by [`SlotId`]. The state machine Free -> Held ->
/// InFlight -> Held -> Free is what keeps a buffer out of the caller's hands while the
/// kernel may write into it, and since no caller can hold the slab itself, none can free,
/// replace or swap its memory either.
pub(crate) struct Slab {
    mem: AlignedBuf,
    slot_size: usize,
    states: Vec<SlotState>,
    /// Per slot in flight at the head of a request: the slots the request covers (it and
    /// the ones after it, see [`Slab::span`]); 0 for every other slot.
    spans: Vec<u32>,
    free: Vec<u32>,
    /// Where each free slot sits in `free` (`u32::MAX` when not free), so that a slot is
    /// taken by index in constant time.
    free_at: Vec<u32>,
}

/// The bytes of `count` slots of `slot_size` bytes: both above zero and the product at
/// most `isize::MAX` (what an allocation may be), else [`Error::Exhausted`].
pub(crate) fn slab_bytes(count: usize, slot_size: usize) -> Result<usize> {
    if count == 0 || slot_size == 0 {
        return Err(Error::Invalid(format!(
            "{count} I/O slots of {slot_size} bytes: both must be above zero"
        )));
    }
    let limit = isize::MAX.unsigned_abs();
    match count.checked_mul(slot_size).filter(|&b| b <= limit) {
        Some(bytes) => Ok(bytes),
        None => Err(Error::Exhausted {
            resource: "bytes of I/O slots",
            asked: u64::try_from(count as u128 * slot_size as u128).unwrap_or(u64::MAX),
            limit: limit as u64,
        }),
    }
}

impl Slab {
    /// A slab of `count` slots of `slot_size` bytes (a multiple of `align`, a power of two).
    /// A count or size of zero is an [`Error::Invalid`]; a count past `u32::MAX`, or slots
    /// whose bytes together overflow `isize::MAX`, are refused with [`Error::Exhausted`];
    /// memory the allocator cannot give is an [`Error::OverBudget`] naming the size.
    ///
    /// The memory is aligned to at least a page even when the device asks for less: a
    /// page-sized read into a buffer that straddles two pages costs the device an extra
    /// DMA segment, and halves throughput on virtio disks.
    pub(crate) fn new(count: usize, slot_size: usize, align: usize) -> Result<Self> {
        let bytes = slab_bytes(count, slot_size)?;
        assert!(
            align.is_power_of_two() && slot_size.is_multiple_of(align),
            "slot size must be aligned"
        );
        let index_limit = u32::try_from(count).map_err(|_| Error::Exhausted {
            resource: "I/O slots",
            asked: count as u64,
            limit: u64::from(u32::MAX),
        })?;
        let mem =
            AlignedBuf::try_new(bytes, align.max(super::align::page_size())).ok_or_else(|| {
                Error::OverBudget(format!("could not allocate {bytes} bytes of I/O slots"))
            })?;
        Ok(Slab {
            mem,
            slot_size,
            states: vec![SlotState::Free; count],
            spans: vec![0; count],
            free: (0..index_limit).rev().collect(),
            free_at: (0..index_limit).rev().collect(),
        })
    }

    /// Number of slots.
    pub(crate) fn count(&self) -> usize {
        self.states.len()
    }

    /// Size of each slot.
    pub(crate) fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Bytes of memory the slab owns.
    pub(crate) fn bytes(&self) -> usize {
        self.mem.len()
    }

    /// Takes a free slot, if any.
    pub(crate) fn acquire(&mut self) -> Option<SlotId> {
        let i = self.free.pop()?;
        self.free_at[i as usize] = u32::MAX;
        self.states[i as usize] = SlotState::Held;
        Some(SlotId(i))
    }

    /// Gives a held slot back. Panics if the slot is in flight: releasing it would let the
    /// next user see the kernel write into it.
    pub(crate) fn release(&mut self, slot: SlotId) {
        assert_eq!(
            self.state(slot),
            SlotState::Held,
            "release of a slot that is not held"
        );
        self.states[slot.index()] = SlotState::Free;
        // Fewer than u32::MAX slots are free (the count fits u32: `new`).
        self.free_at[slot.index()] = u32::try_from(self.free.len()).expect("a u32 slot count");
        self.free.push(slot.0);
    }

    /// Takes slot `index` if it is free.
    pub(crate) fn acquire_at(&mut self, index: usize) -> Option<SlotId> {
        if self.states.get(index) != Some(&SlotState::Free) {
            return None;
        }
        let at = self.free_at[index] as usize;
        self.free.swap_remove(at);
        // Indices and positions are below the count, which fits u32 (`new`).
        let id = u32::try_from(index).expect("a u32 slot index");
        if let Some(&moved) = self.free.get(at) {
            self.free_at[moved as usize] = u32::try_from(at).expect("a u32 slot position");
        }
        self.free_at[index] = u32::MAX;
        self.states[index] = SlotState::Held;
        Some(SlotId(id))
    }

    /// The bytes of `n` held slots from `first` on, back to back. Panics if any of them is
    /// not held.
    pub(crate) fn get_run(&self, first: SlotId, n: usize) -> &[u8] {
        let end = first
            .index()
            .checked_add(n)
            .filter(|&end| end <= self.states.len())
            .expect("slots past the end of the slab");
        assert!(
            self.states[first.index()..end]
                .iter()
                .all(|s| *s == SlotState::Held),
            "a slot of the run is not held by the caller"
        );
        // SAFETY: the slots lie inside the allocation (end <= count) and every one is Held,
        // so no request is in flight on any of them: nothing writes these bytes while &self
        // lives. Slots outside the run may be written by the kernel meanwhile.
        unsafe {
            std::slice::from_raw_parts(
                self.mem.ptr.as_ptr().add(first.index() * self.slot_size),
                n * self.slot_size,
            )
        }
    }

    /// The state of `slot`. Panics if the slab has no such slot (a [`SlotId`] of another
    /// backend): every slot access goes through here or checks the range itself.
    fn state(&self, slot: SlotId) -> SlotState {
        match self.states.get(slot.index()) {
            Some(&st) => st,
            None => panic!(
                "slot {} of a slab of {} slots",
                slot.index(),
                self.states.len()
            ),
        }
    }

    /// The bytes of a held slot.
    pub(crate) fn get(&self, slot: SlotId) -> &[u8] {
        assert_eq!(
            self.state(slot),
            SlotState::Held,
            "slot is not held by the caller"
        );
        // SAFETY: the slot lies inside the allocation (index < count) and is Held, so no
        // request is in flight on it: nothing writes these bytes while &self lives. Only
        // this slot's bytes are borrowed; other slots may be written by the kernel meanwhile.
        unsafe {
            std::slice::from_raw_parts(
                self.mem.ptr.as_ptr().add(slot.index() * self.slot_size),
                self.slot_size,
            )
        }
    }

    /// The bytes of a held slot, mutably.
    pub(crate) fn get_mut(&mut self, slot: SlotId) -> &mut [u8] {
        assert_eq!(
            self.state(slot),
            SlotState::Held,
            "slot is not held by the caller"
        );
        // SAFETY: as in `get`; &mut self makes this the only borrow of the slot.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.mem.as_mut_ptr().add(slot.index() * self.slot_size),
                self.slot_size,
            )
        }
    }

    /// The slots a request on `[at, at + len)` of `slot`'s bytes covers: a request may run
    /// on past its slot into the ones after it (bytes counted from the start of `slot`),
    /// so that one read fills consecutive slots, which lie back to back in memory.
    pub(crate) fn span(&self, at: usize, len: usize) -> usize {
        at.saturating_add(len).div_ceil(self.slot_size).max(1)
    }

    /// Marks the held slots a request covers in flight (`slot` and, when `at + len` runs past
    /// it, the ones after it: [`Slab::span`]) and returns the address of bytes
    /// `[at, at + len)` from `slot`'s start for the kernel. Those slots stay unreachable
    /// through `get`/`get_mut`/`release` until [`Slab::complete`] (or [`Slab::abort`], if
    /// the kernel never got the request). Panics if any of them is not held.
    pub(crate) fn start(&mut self, slot: SlotId, at: usize, len: usize) -> *mut u8 {
        let span = self.span(at, len);
        let end = slot.index().saturating_add(span);
        // The slot itself first: a SlotId of another backend panics here.
        self.state(slot);
        assert!(
            end <= self.count(),
            "bytes {at}..+{len} of slot {} run past the slab's {} slots",
            slot.index(),
            self.count()
        );
        assert!(
            self.states[slot.index()..end]
                .iter()
                .all(|s| *s == SlotState::Held),
            "submit of a slot that is not held"
        );
        let ptr = self.range_ptr(slot, at, len);
        self.states[slot.index()..end].fill(SlotState::InFlight);
        // span <= count, which fits u32 (`new`).
        self.spans[slot.index()] = u32::try_from(span).expect("a u32 span");
        ptr
    }

    /// Marks the slots of the request at `slot` (marked by [`Slab::start`]) as returned to
    /// the caller: its completion was reaped.
    pub(crate) fn complete(&mut self, slot: SlotId) {
        let span = self.spans.get(slot.index()).map_or(0, |&s| s as usize);
        assert!(
            span > 0 && self.state(slot) == SlotState::InFlight,
            "completion for a slot not in flight at the head of a request"
        );
        let end = slot.index() + span;
        debug_assert!(self.states[slot.index()..end]
            .iter()
            .all(|s| *s == SlotState::InFlight));
        self.states[slot.index()..end].fill(SlotState::Held);
        self.spans[slot.index()] = 0;
    }

    /// Gives the slots marked by [`Slab::start`] back to the caller because the request
    /// never reached the kernel (queuing it failed). Only for that: a request the kernel
    /// has must be reaped, with [`Slab::complete`].
    pub(crate) fn abort(&mut self, slot: SlotId) {
        self.complete(slot);
    }

    /// The address of bytes `[at, at + len)` of the request in flight at `slot`, to
    /// resubmit it (or its rest). Panics if that range leaves the request's slots.
    pub(crate) fn in_flight_ptr(&mut self, slot: SlotId, at: usize, len: usize) -> *mut u8 {
        assert!(self.in_flight(slot), "slot is not in flight");
        assert!(
            self.span(at, len) <= self.spans[slot.index()] as usize,
            "bytes {at}..+{len} leave the request's slots"
        );
        self.range_ptr(slot, at, len)
    }

    /// The address of bytes `at..at + len` counted from `slot`'s start, which must lie
    /// inside the slab.
    fn range_ptr(&mut self, slot: SlotId, at: usize, len: usize) -> *mut u8 {
        let start = slot
            .index()
            .checked_mul(self.slot_size)
            .and_then(|b| b.checked_add(at));
        assert!(
            start
                .and_then(|b| b.checked_add(len))
                .is_some_and(|end| end <= self.count() * self.slot_size),
            "bytes {at}..+{len} of slot {} are not inside the slab",
            slot.index()
        );
        // SAFETY: start + len <= count * slot_size, the allocation's size, so the offset
        // stays inside the allocation.
        unsafe { self.mem.as_mut_ptr().add(start.expect("checked above")) }
    }

    /// Whether the slot is in flight.
    pub(crate) fn in_flight(&self, slot: SlotId) -> bool {
        self.state(slot) == SlotState::InFlight
    }

    /// The whole allocation as iovecs, one per slot, for buffer registration.
    pub(crate) fn iovecs(&mut self) -> Vec<libc::iovec> {
        let base = self.mem.as_mut_ptr();
        (0..self.count())
            .map(|i| libc::iovec {
                // SAFETY: i < count, so the offset stays inside the allocation.
                iov_base: unsafe { base.add(i * self.slot_size) }.cast(),
                iov_len: self.slot_size,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    // Test data is made with casts that are meant to wrap (byte patterns from counters).
    #![allow(
        clippy::cast_possible_truncation,
        clippy::cast_possible_wrap,
        clippy::cast_sign_loss
    )]
    use super::*;

    #[test]
    fn large_buf_appends_grows_and_keeps_its_memory() {
        let mut b = LargeBuf::default();
        assert!(b.is_empty() && b.as_slice().is_empty());
        let chunk: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        for _ in 0..40 {
            b.extend_from_slice(&chunk);
        }
        assert_eq!(b.len(), 4_000_000);
        assert!(b.as_slice().chunks(100_000).all(|c| c == &chunk[..]));
        let cap = b.capacity();
        assert!(cap >= b.len());
        b.clear();
        b.append_space(10).copy_from_slice(b"0123456789");
        assert_eq!(b.as_slice(), b"0123456789");
        assert_eq!(b.capacity(), cap, "clear keeps the memory");
        b.reserve_total(cap + 1);
        assert!(b.capacity() > cap);
        assert_eq!(b.as_slice(), b"0123456789", "growing keeps the bytes");
    }

    /// Slots taken by index lie back to back; a run is only lent while every slot of it is
    /// held, never while one is free or in flight.
    #[test]
    fn runs_of_held_slots() {
        let mut s = Slab::new(4, 4096, 4096).unwrap();
        let other = s.acquire().unwrap();
        assert!(
            s.acquire_at(other.index()).is_none(),
            "a held slot is not free"
        );
        assert!(s.acquire_at(4).is_none(), "past the end");
        s.release(other);
        let run: Vec<SlotId> = (0..3).map(|i| s.acquire_at(i).unwrap()).collect();
        for (i, &slot) in run.iter().enumerate() {
            assert_eq!(slot.index(), i);
            s.get_mut(slot).fill(i as u8 + 1);
        }
        let bytes = s.get_run(run[0], 3);
        assert_eq!(bytes.len(), 3 * 4096);
        assert!((0..3).all(|i| bytes[i * 4096..(i + 1) * 4096]
            .iter()
            .all(|&b| b == i as u8 + 1)));
        let last = s.acquire().unwrap();
        assert_eq!(last.index(), 3, "the one slot left");
        s.start(run[1], 0, 4096);
        let in_flight =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.get_run(run[0], 3).len()));
        assert!(in_flight.is_err(), "a run with a slot in flight is lent");
        s.complete(run[1]);
        s.release(run[2]);
        let freed =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.get_run(run[0], 3).len()));
        assert!(freed.is_err(), "a run with a free slot is lent");
        assert_eq!(s.get_run(run[0], 2).len(), 2 * 4096);
        let past =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.get_run(last, 2).len()));
        assert!(past.is_err(), "a run past the end is lent");
    }

    #[test]
    fn aligned_and_zeroed() {
        for len in [10_000, 5 << 20] {
            for align in [512, 4096, 65536] {
                let mut b = AlignedBuf::new(len, align);
                assert_eq!(b.as_slice().as_ptr() as usize % align, 0);
                assert!(b.len() >= len);
                assert!(b.as_slice().iter().all(|&x| x == 0));
                b.as_mut_slice()[len - 1] = 1;
            }
        }
    }

    #[test]
    fn slot_lifecycle() {
        let mut s = Slab::new(2, 4096, 4096).unwrap();
        let a = s.acquire().unwrap();
        let b = s.acquire().unwrap();
        assert!(s.acquire().is_none());
        s.get_mut(a)[0] = 7;
        let p = s.start(a, 0, 4096);
        assert_eq!(p as usize % 4096, 0);
        assert!(s.in_flight(a));
        s.complete(a);
        assert_eq!(s.get(a)[0], 7);
        let q = s.start(a, 512, 512);
        assert_eq!(q as usize, p as usize + 512);
        s.abort(a);
        s.release(a);
        s.release(b);
        assert!(s.acquire().is_some());
    }

    #[test]
    #[should_panic(expected = "not held")]
    fn a_request_cannot_reach_into_a_slot_not_held() {
        let mut s = Slab::new(2, 4096, 4096).unwrap();
        let a = s.acquire_at(0).unwrap();
        s.start(a, 4096 - 512, 1024);
    }

    #[test]
    #[should_panic(expected = "run past")]
    fn a_request_cannot_reach_past_the_last_slot() {
        let mut s = Slab::new(2, 4096, 4096).unwrap();
        let a = s.acquire_at(0).unwrap();
        let b = s.acquire_at(1).unwrap();
        assert_eq!(b.index(), 1);
        s.start(a, 4096, 4096 + 512);
    }

    /// A request over several held slots puts them all in flight, and its completion gives
    /// them all back; slots are taken by index whatever order they were freed in.
    #[test]
    fn a_request_covers_its_slots_until_completed() {
        let mut s = Slab::new(4, 4096, 4096).unwrap();
        for i in [2, 0, 3, 1] {
            assert_eq!(s.acquire_at(i).unwrap().index(), i);
        }
        for i in [3, 1, 0, 2] {
            s.release(SlotId(i));
        }
        let run: Vec<SlotId> = (0..3).map(|i| s.acquire_at(i).unwrap()).collect();
        assert_eq!(s.span(512, 8192), 3);
        s.start(run[0], 512, 8192);
        for &slot in &run {
            assert!(
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.get(slot).len()))
                    .is_err()
            );
        }
        let inner = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.complete(run[1])));
        assert!(inner.is_err(), "an inner slot completes on its own");
        s.complete(run[0]);
        assert_eq!(s.get_run(run[0], 3).len(), 3 * 4096);
        assert_eq!(s.acquire().unwrap().index(), 3);
    }

    /// Slots whose bytes together pass what an allocation may be are refused with a typed
    /// error, never a wrapped product; so are zero slots.
    #[test]
    fn an_overflowing_slab_is_refused() {
        for (count, size) in [(1usize << 40, 1usize << 30), (usize::MAX / 4096 + 1, 4096)] {
            match Slab::new(count, size, 4096) {
                Err(Error::Exhausted {
                    resource,
                    asked,
                    limit,
                }) => {
                    assert_eq!(resource, "bytes of I/O slots");
                    assert!(asked > limit, "{asked} <= {limit}");
                    assert_eq!(limit, isize::MAX as u64);
                }
                other => panic!("{count} x {size}: {:?}", other.err()),
            }
        }
        let e = Slab::new(0, 4096, 4096).err().expect("zero slots refused");
        assert!(e.to_string().contains("above zero"), "{e}");
        let e = Slab::new(1 << 33, 4096, 4096)
            .err()
            .expect("2^33 slots refused");
        assert!(matches!(e, Error::Exhausted { .. }), "{e}");
    }

    /// A slot a slab does not have (a `SlotId` of a larger backend) panics before any
    /// memory is touched, on every accessor.
    #[test]
    fn a_slot_out_of_range_panics_on_every_accessor() {
        let mut s = Slab::new(2, 4096, 4096).unwrap();
        let far = SlotId(7);
        type Try = Box<dyn FnOnce(&mut Slab)>;
        let tries: [(&str, Try); 7] = [
            ("get", Box::new(move |s| assert!(s.get(far).is_empty()))),
            (
                "get_mut",
                Box::new(move |s| assert!(s.get_mut(far).is_empty())),
            ),
            (
                "get_run",
                Box::new(move |s| assert!(s.get_run(far, 1).is_empty())),
            ),
            (
                "get_run wrap",
                Box::new(|s| assert!(s.get_run(SlotId(1), usize::MAX).is_empty())),
            ),
            ("release", Box::new(move |s| s.release(far))),
            (
                "start",
                Box::new(move |s| assert!(s.start(far, 0, 4096).is_null())),
            ),
            ("complete", Box::new(move |s| s.complete(far))),
        ];
        for (what, f) in tries {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut s)));
            assert!(r.is_err(), "{what} of a slot out of range returned");
        }
        assert!(s.acquire_at(7).is_none(), "acquire_at past the end");
        assert_eq!(
            s.acquire().map(SlotId::index),
            Some(0),
            "the slab is unharmed"
        );
    }

    /// Faulting a buffer's reserved memory in changes no byte already written, and leaves
    /// the rest ready to be appended (issue 33: a resident load's helper).
    #[test]
    fn populating_a_large_buffer_keeps_what_it_holds() {
        let mut b = LargeBuf::default();
        b.reserve_total(8 << 20);
        b.extend_from_slice(&[7u8; 5000]);
        let p = b.populator().expect("reserved memory");
        assert_eq!(p.len(), b.capacity());
        assert!(p.populate(0, 3 << 20), "MADV_POPULATE_WRITE (Linux 5.14+)");
        assert!(
            p.populate(p.len() - 100, p.len() + 4096),
            "clipped to the range"
        );
        assert!(b.as_slice().iter().all(|&x| x == 7));
        b.extend_from_slice(&[9u8; 100]);
        assert_eq!(&b.as_slice()[4999..5001], &[7, 9]);
        assert!(LargeBuf::default().populator().is_none());
    }

    #[test]
    #[should_panic(expected = "not held")]
    fn in_flight_slot_is_unreachable() {
        let mut s = Slab::new(1, 4096, 4096).unwrap();
        let a = s.acquire().unwrap();
        s.start(a, 0, 4096);
        let _ = s.get(a);
    }
}

/// A growable byte buffer for large working sets (whole piles): on transparent huge pages
/// when large, so random access over it costs few TLB misses, and kept between uses so its
/// pages are faulted in once.
#[derive(Default)]
pub struct LargeBuf {
    mem: Option<AlignedBuf>,
    len: usize,
}

impl LargeBuf {
    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Empties it, keeping the memory.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The bytes held.
    pub fn as_slice(&self) -> &[u8] {
        self.mem.as_ref().map_or(&[], |m| &m.as_slice()[..self.len])
    }

    /// Bytes it can hold without growing.
    pub fn capacity(&self) -> usize {
        self.mem.as_ref().map_or(0, AlignedBuf::len)
    }

    /// Room for `more` bytes beyond the current length (growing by half at least).
    pub fn reserve(&mut self, more: usize) {
        let (need, cap) = (self.len + more, self.capacity());
        if need > cap {
            self.reserve_total(need.max(cap + cap / 2));
        }
    }

    /// Room for `total` bytes in all, growing to exactly that (rounded to whole pages).
    pub fn reserve_total(&mut self, total: usize) {
        let cap = self.capacity();
        if total <= cap {
            return;
        }
        let mut grown = AlignedBuf::new(total, 4096);
        if let Some(old) = &self.mem {
            grown.as_mut_slice()[..self.len].copy_from_slice(&old.as_slice()[..self.len]);
        }
        self.mem = Some(grown);
    }

    /// Appends `bytes`.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.append_space(bytes.len()).copy_from_slice(bytes);
    }

    /// Appends `n` bytes (whatever the memory held) and returns them to be filled.
    pub fn append_space(&mut self, n: usize) -> &mut [u8] {
        if n == 0 {
            return &mut [];
        }
        self.reserve(n);
        let start = self.len;
        self.len += n;
        let mem = self.mem.as_mut().expect("reserved");
        &mut mem.as_mut_slice()[start..start + n]
    }
}

impl LargeBuf {
    /// The memory reserved beyond the bytes held, for a helper thread to fault in ahead of
    /// the appends that will fill it ([`Populator::populate`]); `None` when nothing is
    /// reserved.
    pub fn populator(&self) -> Option<Populator> {
        let m = self.mem.as_ref()?;
        Some(Populator {
            start: m.ptr.as_ptr() as usize,
            len: m.len,
        })
    }
}

/// The address range of a buffer's memory, to be faulted in by another thread while its
/// owner fills it: a new mapping's first touch costs the kernel a zeroed page (on this
/// machine's VM, memory the host took back cost up to 2 s a GB to touch again, 85% of a
/// 1.6 GB load's time in `clear_page`), which a helper can pay beside the reads.
///
/// It holds no reference: the buffer must outlive every call (its owner keeps it, and
/// does not reallocate it, until the helper is joined).
#[derive(Clone, Copy, Debug)]
pub struct Populator {
    start: usize,
    len: usize,
}

impl Populator {
    /// Bytes of the range.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Faults in `[from, to)` of the range for writing (`MADV_POPULATE_WRITE`), leaving any
    /// byte already there as it is. False when the kernel cannot (before Linux 5.14), and
    /// nothing changed.
    pub fn populate(&self, from: usize, to: usize) -> bool {
        let to = to.min(self.len);
        if from >= to {
            return true;
        }
        // madvise wants a page-aligned start.
        let start = (self.start + from) & !4095;
        let end = self.start + to;
        // SAFETY: [start, end) lies within the mapping the buffer owns (start rounded down to
        // its page stays inside it: the buffer is page aligned). MADV_POPULATE_WRITE only
        // populates page tables as a write fault would, never changing a byte already
        // mapped, so the owner's concurrent writes are unaffected.
        let r = unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                end - start,
                libc::MADV_POPULATE_WRITE,
            )
        };
        r == 0
    }
}

/// Hands the heap's free memory back to the kernel (glibc keeps what was freed in its
/// per-thread arenas, counted in the process's resident memory): called after a large set
/// of heap buffers is freed, so the memory a run holds is what it uses. (Measured here: a
/// two-pass scatter's fill buffers, 98 MB, stayed resident through the next epoch in one
/// run of two, taking a 256 MiB run to 346 MB.) Does nothing off glibc.
pub(crate) fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only returns free heap pages to the
    // kernel and never touches memory in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A hint that the first cache line of `bytes` will be read soon (for loops that visit
/// memory in an order the hardware cannot predict). Does nothing off x86_64.
#[inline(always)]
pub fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = bytes.as_ptr();
        // SAFETY: SSE is part of the x86_64 baseline, and a prefetch is only a hint: it
        // never faults and changes no memory, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}
