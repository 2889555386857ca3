//! A batch's bytes: the engine's own memory, or a region a consumer lent it so that the
//! records are written once, where they will be read (the daemon lends space in a stream's
//! shared-memory ring: no copy between the engine and the client), or a view of memory the
//! engine holds whole (a resident dataset: the batch names its records' places and copies
//! nothing until a consumer asks for the bytes back to back).
//!
//! A [`Lender`] is asked for a region when a batch starts; it may say no (the ring is full
//! of batches the client still holds), and the batch is then assembled in a `Vec` as
//! usual. Either way the batch reads as a `[u8]`.

use std::any::Any;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, OnceLock};

/// Lends the engine memory to assemble batches in.
pub trait Lender: Send + Sync {
    /// A region for batch `index` (of the read's batches: every rank's, numbered
    /// globally, when the read is shared by ranks), of `records` records and at most
    /// `bytes` payload bytes, or `None` (the engine then uses memory of its own). Never
    /// blocks.
    fn lend(&self, index: u64, records: usize, bytes: usize) -> Option<Box<dyn Lent>>;

    /// The engine completed `batch`, on its own thread, before queueing it for the
    /// consumer; batches come here in order. The lender may take it over right away (the
    /// daemon announces it to its client from here, saving a thread hop): it returns
    /// `None`, and the batch, handed over, is not queued. Otherwise it gives it back.
    fn ready(&self, batch: super::Batch) -> Option<super::Batch> {
        Some(batch)
    }
}

/// A lent region. Its contents start undefined; the engine writes every byte it delivers.
pub trait Lent: Send + Sync {
    /// The whole region.
    fn bytes(&self) -> &[u8];
    /// The whole region, to write.
    fn bytes_mut(&mut self) -> &mut [u8];
    /// Only the first `len` bytes are used: the rest may go back to the lender.
    fn shrink(&mut self, len: usize);
    /// For the lender to recognise its own region again.
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// The region itself, for the lender to take it back by its type.
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

/// The [`Lender`] of a read, if any (see [`super::ReadOptions::lender`]).
#[derive(Clone)]
pub struct PayloadLender(pub Arc<dyn Lender>);

impl fmt::Debug for PayloadLender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PayloadLender")
    }
}

/// Memory a batch may view instead of holding a copy: kept alive by every batch viewing it.
pub trait Viewed: Send + Sync {
    /// All of it.
    fn bytes(&self) -> &[u8];
}

/// The records' bytes of a batch, back to back.
///
/// A lent region leaves the payload only by [`Payload::into_lent`], which consumes it: a
/// batch handed over to its lender's consumer is no longer a batch, so no payload ever
/// reads bytes that are not the engine's.
///
/// Memory of the engine's own taken from a recycler goes back to it when the payload is
/// dropped (the consumer is done with the batch), for a later batch of the same read.
pub struct Payload(Repr, bool, Option<Arc<Recycler>>);

enum Repr {
    Own(Vec<u8>),
    Lent {
        buf: Box<dyn Lent>,
        len: usize,
    },
    /// Each record's bytes where `mem` holds them; put back to back (one copy) only when the
    /// payload is read whole.
    View {
        mem: Arc<dyn Viewed>,
        ranges: Vec<std::ops::Range<usize>>,
        len: usize,
        whole: OnceLock<Vec<u8>>,
    },
}

impl Payload {
    /// `len` zero bytes of the engine's own.
    pub(crate) fn zeroed(len: usize) -> Payload {
        Payload(Repr::Own(vec![0; len]), false, None)
    }

    /// Empty, with room for `cap` bytes, of the engine's own.
    pub(crate) fn with_capacity(cap: usize) -> Payload {
        Payload(Repr::Own(Vec::with_capacity(cap)), false, None)
    }

    /// The first `len` bytes of a lent region (to be written in place), or empty with the
    /// region as room when `len` is 0 (to be filled by [`Payload::extend_from_slice`]).
    pub(crate) fn lent(buf: Box<dyn Lent>, len: usize) -> Payload {
        debug_assert!(len <= buf.bytes().len());
        Payload(Repr::Lent { buf, len }, false, None)
    }

    /// A payload of `len` bytes to be written in place: lent by `lender` when it can, else
    /// the engine's own.
    pub(crate) fn sized(
        lender: Option<&PayloadLender>,
        index: u64,
        records: usize,
        len: usize,
    ) -> Payload {
        Payload::sized_in(lender, None, index, records, len)
    }

    /// As [`Payload::sized`], the engine's own memory taken from `pool` when given (its
    /// old bytes still there: every byte must be written before the batch is delivered).
    pub(crate) fn sized_in(
        lender: Option<&PayloadLender>,
        pool: Option<&Arc<Recycler>>,
        index: u64,
        records: usize,
        len: usize,
    ) -> Payload {
        let own = || match pool {
            Some(p) => p.take(len),
            None => Payload::zeroed(len),
        };
        match lender.map(|l| l.0.lend(index, records, len)) {
            Some(Some(buf)) => Payload::lent(buf, len),
            Some(None) => own().refused(),
            None => own(),
        }
    }

    /// A view of `ranges` of `mem`, one per record, in order: nothing is copied.
    pub(crate) fn view(mem: Arc<dyn Viewed>, ranges: Vec<std::ops::Range<usize>>) -> Payload {
        let len = ranges.iter().map(|r| r.len()).sum();
        debug_assert!(ranges.iter().all(|r| r.end <= mem.bytes().len()));
        Payload(
            Repr::View {
                mem,
                ranges,
                len,
                whole: OnceLock::new(),
            },
            false,
            None,
        )
    }

    /// Record `i`'s bytes, the `i`th of `offsets` (the batch's): read in place from a view.
    pub(crate) fn record(&self, i: usize, offsets: &[u64]) -> &[u8] {
        match &self.0 {
            Repr::View { mem, ranges, .. } => &mem.bytes()[ranges[i].clone()],
            _ => &self[offsets[i] as usize..offsets[i + 1] as usize],
        }
    }

    /// Whether the payload views memory the engine holds (no copy made yet).
    pub fn is_view(&self) -> bool {
        matches!(self.0, Repr::View { .. })
    }

    /// A view made the engine's own: its records copied back to back.
    fn owned(&mut self) -> &mut Vec<u8> {
        if let Repr::View { whole, .. } = &mut self.0 {
            let v = whole.take().unwrap_or_else(|| gathered(&self.0));
            self.0 = Repr::Own(v);
        }
        match &mut self.0 {
            Repr::Own(v) => v,
            _ => unreachable!("made the engine's own above"),
        }
    }

    /// Appends `src`. A lent region too small for it is left for memory of the engine's
    /// own (one copy; the lender's room estimate was short).
    pub(crate) fn extend_from_slice(&mut self, src: &[u8]) {
        if self.is_view() {
            return self.owned().extend_from_slice(src);
        }
        match &mut self.0 {
            Repr::Own(v) => v.extend_from_slice(src),
            Repr::View { .. } => unreachable!("made the engine's own above"),
            Repr::Lent { buf, len } => {
                let end = *len + src.len();
                if let Some(dst) = buf.bytes_mut().get_mut(*len..end) {
                    dst.copy_from_slice(src);
                    *len = end;
                } else {
                    let mut v = Vec::with_capacity(end.max(2 * *len));
                    v.extend_from_slice(&buf.bytes()[..*len]);
                    v.extend_from_slice(src);
                    self.0 = Repr::Own(v);
                }
            }
        }
    }

    /// The batch is complete: a lent region gives back what it did not use.
    pub(crate) fn seal(&mut self) {
        if let Repr::Lent { buf, len } = &mut self.0 {
            buf.shrink(*len);
        }
    }

    /// Marks a payload the lender refused to lend for (the engine's own memory instead).
    pub(crate) fn refused(mut self) -> Payload {
        self.1 = true;
        self
    }

    /// Whether the lender was asked for room for this batch and refused.
    pub fn lend_refused(&self) -> bool {
        self.1
    }

    /// Its length in bytes (without looking at the bytes: a lent region handed over to
    /// its lender may no longer be read through the payload).
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Own(v) => v.len(),
            Repr::Lent { len, .. } | Repr::View { len, .. } => *len,
        }
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the bytes live in a lent region.
    pub fn is_lent(&self) -> bool {
        matches!(self.0, Repr::Lent { .. })
    }

    /// The lent region and the bytes used of it, to hand over (`Err` with the payload
    /// itself when it is the engine's own memory).
    pub fn into_lent(mut self) -> Result<(Box<dyn Lent>, usize), Payload> {
        if !self.is_lent() {
            return Err(self);
        }
        match std::mem::take(&mut self.0) {
            Repr::Lent { buf, len } => Ok((buf, len)),
            Repr::Own(_) | Repr::View { .. } => unreachable!("checked lent above"),
        }
    }

    /// A payload of the first `len` bytes of a region that was not handed over after all.
    pub fn from_lent(buf: Box<dyn Lent>, len: usize) -> Payload {
        Payload::lent(buf, len)
    }

    /// The bytes as a `Vec` (a copy when lent).
    pub fn into_vec(mut self) -> Vec<u8> {
        // Taken out: a recycled buffer leaves its recycler with the bytes.
        match std::mem::take(&mut self.0) {
            Repr::Own(v) => v,
            Repr::Lent { buf, len } => buf.bytes()[..len].to_vec(),
            Repr::View { whole, .. } if whole.get().is_some() => {
                whole.into_inner().unwrap_or_default()
            }
            r @ Repr::View { .. } => gathered(&r),
        }
    }
}

/// A view's records back to back.
fn gathered(r: &Repr) -> Vec<u8> {
    match r {
        Repr::View {
            mem, ranges, len, ..
        } => {
            let (bytes, mut v) = (mem.bytes(), Vec::with_capacity(*len));
            for r in ranges {
                v.extend_from_slice(&bytes[r.clone()]);
            }
            v
        }
        _ => Vec::new(),
    }
}

impl Default for Repr {
    fn default() -> Repr {
        Repr::Own(Vec::new())
    }
}

impl Drop for Payload {
    /// A recycled buffer goes back to its recycler.
    fn drop(&mut self) {
        if let (Some(home), Repr::Own(v)) = (self.2.take(), &mut self.0) {
            home.give(std::mem::take(v));
        }
    }
}

/// Payload buffers of the engine's own, given back when their batches are dropped and taken
/// again by later batches of the same read: a batch's buffer is then neither faulted in nor
/// zeroed again (each batch's `vec![0; n]` on fresh memory was 6% of the CPU of a
/// page-grouped 512 B read on a memory-speed device, issue 34). At most `keep` buffers wait
/// here; the rest are freed.
pub(crate) struct Recycler {
    free: std::sync::Mutex<Vec<Vec<u8>>>,
    keep: usize,
}

impl Recycler {
    /// A recycler keeping at most `keep` idle buffers.
    pub(crate) fn new(keep: usize) -> Arc<Recycler> {
        Arc::new(Recycler {
            free: std::sync::Mutex::new(Vec::with_capacity(keep)),
            keep,
        })
    }

    /// A payload of `len` bytes of the engine's own, to be written in place: an idle
    /// buffer when there is one (its old bytes are still there: the caller writes every
    /// byte it delivers), else `len` zero bytes.
    pub(crate) fn take(self: &Arc<Self>, len: usize) -> Payload {
        let idle = self.lock().pop();
        let v = match idle {
            Some(mut v) => {
                // Within what the buffer held before, nothing is written here.
                v.resize(len, 0);
                v
            }
            None => vec![0; len],
        };
        Payload(Repr::Own(v), false, Some(self.clone()))
    }

    fn give(&self, v: Vec<u8>) {
        let mut free = self.lock();
        if free.len() < self.keep && v.capacity() > 0 {
            free.push(v);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Buffers idle here.
    #[cfg(test)]
    pub(crate) fn idle(&self) -> usize {
        self.lock().len()
    }
}

impl Default for Payload {
    /// Empty, the engine's own.
    fn default() -> Payload {
        Payload(Repr::Own(Vec::new()), false, None)
    }
}

impl From<Vec<u8>> for Payload {
    fn from(v: Vec<u8>) -> Payload {
        Payload(Repr::Own(v), false, None)
    }
}

impl Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Repr::Own(v) => v,
            Repr::Lent { buf, len } => &buf.bytes()[..*len],
            r @ Repr::View { whole, .. } => whole.get_or_init(|| gathered(r)),
        }
    }
}

impl DerefMut for Payload {
    fn deref_mut(&mut self) -> &mut [u8] {
        if self.is_view() {
            return self.owned();
        }
        match &mut self.0 {
            Repr::Own(v) => v,
            Repr::Lent { buf, len } => &mut buf.bytes_mut()[..*len],
            Repr::View { .. } => unreachable!("made the engine's own above"),
        }
    }
}

impl Clone for Payload {
    /// A copy in memory of the engine's own.
    fn clone(&self) -> Payload {
        Payload(Repr::Own(self.to_vec()), false, None)
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Payload) -> bool {
        **self == **other
    }
}

impl Eq for Payload {}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Payload({} bytes{})",
            self.len(),
            match self.0 {
                Repr::Own(_) => "",
                Repr::Lent { .. } => ", lent",
                Repr::View { .. } => ", a view",
            }
        )
    }
}

/// A lender of boxes of memory, for tests (as a daemon's ring lends regions).
#[cfg(test)]
pub(crate) mod boxes {
    use super::*;
    use std::sync::Mutex;

    /// Lends boxes of at most `room` bytes and remembers what each was shrunk to.
    pub(crate) struct Boxes {
        pub(crate) room: usize,
        pub(crate) shrunk: Arc<Mutex<Vec<usize>>>,
    }

    struct Region(Vec<u8>, Arc<Mutex<Vec<usize>>>);

    impl Lent for Region {
        fn bytes(&self) -> &[u8] {
            &self.0
        }
        fn bytes_mut(&mut self) -> &mut [u8] {
            &mut self.0
        }
        fn shrink(&mut self, len: usize) {
            self.1.lock().unwrap().push(len);
        }
        fn as_any_mut(&mut self) -> &mut dyn Any {
            self
        }
        fn into_any(self: Box<Self>) -> Box<dyn Any> {
            self
        }
    }

    impl Lender for Boxes {
        fn lend(&self, _index: u64, _records: usize, bytes: usize) -> Option<Box<dyn Lent>> {
            (bytes <= self.room)
                .then(|| Box::new(Region(vec![7; bytes], self.shrunk.clone())) as Box<dyn Lent>)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::boxes::Boxes;
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn lent_payloads_read_like_own_ones_and_fall_back_when_short() {
        let shrunk = Arc::new(Mutex::new(Vec::new()));
        let lender = PayloadLender(Arc::new(Boxes {
            room: 16,
            shrunk: shrunk.clone(),
        }));
        // Written in place.
        let mut p = Payload::sized(Some(&lender), 0, 2, 6);
        assert!(p.is_lent());
        p.copy_from_slice(b"abcdef");
        assert_eq!(&p[..], b"abcdef");
        assert_eq!(p.clone(), Payload::from(b"abcdef".to_vec()));
        // Too large for the lender: the engine's own.
        assert!(!Payload::sized(Some(&lender), 0, 2, 17).is_lent());
        assert!(!Payload::sized(None, 0, 2, 4).is_lent());
        // Appended: stays lent while it fits, then moves out with its bytes.
        let mut q = Payload::lent(lender.0.lend(0, 3, 8).unwrap(), 0);
        q.extend_from_slice(b"0123");
        q.extend_from_slice(b"4567");
        assert!(q.is_lent());
        q.seal();
        assert_eq!(*shrunk.lock().unwrap(), vec![8]);
        let (region, used) = q.into_lent().ok().unwrap();
        assert_eq!(&region.bytes()[..used], b"01234567");
        assert!(Payload::from(vec![1u8]).into_lent().is_err());
        let mut r = Payload::lent(lender.0.lend(0, 3, 4).unwrap(), 0);
        r.extend_from_slice(b"012");
        r.extend_from_slice(b"345");
        assert!(!r.is_lent());
        assert_eq!(r.into_vec(), b"012345");
    }

    /// Regression (issue 34): each batch's payload was a fresh `vec![0; n]`, faulted in and
    /// zeroed per batch. A payload taken from a recycler goes back to it when dropped, and
    /// the next payload reuses that buffer (no zeroing within what it held), at most
    /// `keep` of them idle; one taken apart (`into_vec`) leaves with its bytes.
    #[test]
    fn a_dropped_payload_gives_its_buffer_to_the_next() {
        let pool = Recycler::new(2);
        let mut a = pool.take(8);
        assert_eq!(&a[..], &[0; 8]);
        a.copy_from_slice(b"abcdefgh");
        let at = a.as_ptr();
        drop(a);
        assert_eq!(pool.idle(), 1);
        let b = Payload::sized_in(None, Some(&pool), 1, 2, 6);
        assert_eq!(b.as_ptr(), at, "the same buffer again");
        assert_eq!(b.len(), 6);
        assert!(!b.is_lent() && !b.is_view() && pool.idle() == 0);
        // Grown past what it held: the new bytes are zero.
        drop(b);
        let c = pool.take(10);
        assert_eq!(&c[6..], &[0; 4]);
        // At most `keep` wait; the rest are freed.
        let more: Vec<Payload> = (0..4).map(|_| pool.take(4)).collect();
        drop(c);
        drop(more);
        assert_eq!(pool.idle(), 2);
        // Taken apart: the bytes leave with the caller; a copy has no recycler.
        let d = pool.take(3);
        let e = d.clone();
        assert_eq!(d.into_vec().len(), 3);
        drop(e);
        assert_eq!(pool.idle(), 1);
        // Refused by a lender: the engine's own, recycled all the same.
        let lender = PayloadLender(Arc::new(Boxes {
            room: 0,
            shrunk: Default::default(),
        }));
        let f = Payload::sized_in(Some(&lender), Some(&pool), 0, 1, 4);
        assert!(f.lend_refused() && !f.is_lent());
        drop(f);
        assert_eq!(pool.idle(), 1);
        let g = Payload::sized_in(Some(&lender), Some(&pool), 0, 1, 0);
        assert!(g.is_lent(), "a region that fits is lent, not recycled");
        drop(g);
        assert_eq!(pool.idle(), 1);
    }

    struct Held(Vec<u8>);
    impl Viewed for Held {
        fn bytes(&self) -> &[u8] {
            &self.0
        }
    }

    #[test]
    fn a_view_reads_its_records_in_place_and_whole_like_a_copy() {
        let mem: Arc<dyn Viewed> = Arc::new(Held(b"abcdefghij".to_vec()));
        let p = Payload::view(mem.clone(), vec![6..9, 0..2, 9..10]);
        let offsets = [0, 3, 5, 6];
        assert!(p.is_view());
        assert_eq!(p.len(), 6);
        assert_eq!(p.record(0, &offsets), b"ghi");
        assert_eq!(p.record(1, &offsets), b"ab");
        // Read whole: the records back to back, as an owned payload holds them.
        assert_eq!(&p[..], b"ghiabj");
        assert_eq!(p, Payload::from(b"ghiabj".to_vec()));
        assert_eq!(p.clone().into_vec(), b"ghiabj");
        let mut q = Payload::view(mem.clone(), vec![1..3, 3..3]);
        q.extend_from_slice(b"Z");
        assert!(!q.is_view());
        assert_eq!(&q[..], b"bcZ");
        let mut w = Payload::view(mem.clone(), vec![0..1, 1..1]);
        w[0] = b'X';
        assert_eq!(&w[..], b"X");
        // The memory viewed is never written.
        assert_eq!(mem.bytes(), b"abcdefghij");
        assert!(Payload::view(mem, vec![0..1, 1..1]).into_lent().is_err());
    }
}
