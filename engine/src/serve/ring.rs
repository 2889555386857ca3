//! Space in a stream's ring: contiguous regions handed out in order, returned in any order.
//!
//! A region (a "slot") is live from [`Slots::alloc`] until it is given back. While the
//! daemon fills it (the engine assembling a batch in it, or a copy) it is unsent, and only
//! the daemon may give it back ([`Slots::cancel`]); once announced to the client
//! ([`Slots::mark_sent`]) only the client's ack returns it ([`Slots::release`]), so a
//! client cannot free a region the engine is still writing. Nothing is written into space
//! a live slot does not cover. Space is reclaimed from the oldest slot on, so a slot
//! returned out of order frees its bytes once every older one is returned too. No I/O and
//! no unsafe: pure bookkeeping.

use std::collections::VecDeque;

/// Every region starts at a multiple of this (u64 arrays and cache lines stay aligned).
pub const ALIGN: u64 = 64;

#[derive(Debug)]
struct Slot {
    id: u32,
    start: u64,
    end: u64,
    sent: bool,
    released: bool,
}

/// The live regions of one ring of `size` bytes.
#[derive(Debug)]
pub struct Slots {
    size: u64,
    live: VecDeque<Slot>,
    next_id: u32,
}

impl Slots {
    /// An empty ring of `size` bytes.
    pub fn new(size: u64) -> Slots {
        Slots {
            size,
            live: VecDeque::new(),
            next_id: 0,
        }
    }

    /// Slots announced to the client and not yet acknowledged.
    pub fn outstanding(&self) -> usize {
        self.live.iter().filter(|s| s.sent && !s.released).count()
    }

    /// Bytes covered by slots not yet reclaimed.
    pub fn used(&self) -> u64 {
        self.live.iter().map(|s| s.end - s.start).sum()
    }

    /// Whether a region of `len` bytes can ever fit (in an empty ring).
    pub fn fits_empty(&self, len: u64) -> bool {
        round(len).is_some_and(|len| len <= self.size)
    }

    /// A region of `len` bytes: `(slot id, start)`, or `None` while there is no room (and
    /// for a `len` no ring holds). Every sum is checked: a region handed out always lies
    /// inside `0..size`, which is what the unsafe views of a lent region rest on.
    pub fn alloc(&mut self, len: u64) -> Option<(u32, u64)> {
        let len = round(len)?.max(ALIGN);
        let fits = |start: u64, limit: u64| start.checked_add(len).is_some_and(|e| e <= limit);
        let start = match (self.live.front(), self.live.back()) {
            (None, _) | (_, None) => fits(0, self.size).then_some(0)?,
            (Some(old), Some(new)) => {
                if new.start >= old.start {
                    // Not wrapped: free space after the newest and before the oldest.
                    if fits(new.end, self.size) {
                        new.end
                    } else if fits(0, old.start) {
                        0
                    } else {
                        return None;
                    }
                } else if fits(new.end, old.start) {
                    // Wrapped: free space between the newest and the oldest.
                    new.end
                } else {
                    return None;
                }
            }
        };
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        self.live.push_back(Slot {
            id,
            start,
            end: start + len, // Checked by `fits` above.
            sent: false,
            released: false,
        });
        Some((id, start))
    }

    /// The end of live slot `id` (one past its last byte), if it is live.
    pub fn end_of(&self, id: u32) -> Option<u64> {
        self.live
            .iter()
            .find(|s| s.id == id && !s.released)
            .map(|s| s.end)
    }

    /// Slot `id` is announced to the client: from now on only its ack returns it. False if
    /// it is not a live unsent slot.
    pub fn mark_sent(&mut self, id: u32) -> bool {
        match self.find(id) {
            Some(s) if !s.sent => {
                s.sent = true;
                true
            }
            _ => false,
        }
    }

    /// The client's ack of slot `id`. False if it is not a slot announced to the client
    /// and not yet acknowledged.
    pub fn release(&mut self, id: u32) -> bool {
        match self.find(id) {
            Some(s) if s.sent => {
                s.released = true;
                self.reclaim();
                true
            }
            _ => false,
        }
    }

    /// The daemon gives back slot `id` that it never announced (a batch dropped). False
    /// if it is not a live unsent slot.
    pub fn cancel(&mut self, id: u32) -> bool {
        match self.find(id) {
            Some(s) if !s.sent => {
                s.released = true;
                self.reclaim();
                true
            }
            _ => false,
        }
    }

    /// Slot `id` needs only `len` bytes: when it is the newest and unsent, the rest is
    /// free again (otherwise it stays taken until the slot is returned).
    pub fn shrink(&mut self, id: u32, len: u64) {
        let Some(len) = round(len) else { return };
        let len = len.max(ALIGN);
        if let Some(s) = self.live.back_mut() {
            if s.id == id && !s.sent && !s.released && len < s.end - s.start {
                s.end = s.start + len;
            }
        }
    }

    fn find(&mut self, id: u32) -> Option<&mut Slot> {
        self.live.iter_mut().find(|s| s.id == id && !s.released)
    }

    fn reclaim(&mut self) {
        while self.live.front().is_some_and(|s| s.released) {
            self.live.pop_front();
        }
    }
}

/// `len` rounded up to a whole number of `ALIGN`s, or `None` when that overflows.
fn round(len: u64) -> Option<u64> {
    len.div_ceil(ALIGN).checked_mul(ALIGN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_never_overlap_live_ones_and_are_reclaimed_in_order() {
        let mut s = Slots::new(1000);
        let (a, at_a) = s.alloc(300).unwrap(); // 320 bytes at 0
        let (b, at_b) = s.alloc(300).unwrap(); // 320 at 320
        let (c, at_c) = s.alloc(300).unwrap(); // 320 at 640 (ends 960)
        assert!(!s.release(a), "an unsent slot cannot be acknowledged");
        assert_eq!(s.outstanding(), 0, "nothing announced yet");
        for id in [a, b, c] {
            assert!(s.mark_sent(id));
        }
        assert!(!s.mark_sent(a), "announced once");
        assert_eq!((at_a, at_b, at_c), (0, 320, 640));
        assert!(
            s.alloc(64).is_none(),
            "40 bytes left at the end, none at the start"
        );
        // Releasing b first frees nothing: a is older and still live.
        assert!(s.release(b));
        assert!(s.alloc(64).is_none());
        assert!(s.release(a));
        // a and b reclaimed: the next region wraps to 0.
        let (d, at_d) = s.alloc(600).unwrap();
        assert!(s.mark_sent(d));
        assert_eq!(at_d, 0);
        assert!(
            s.alloc(64).is_none(),
            "wrapped: d ends at 640 where c starts"
        );
        assert!(!s.release(a), "a second release is refused");
        assert!(!s.release(99), "an unknown slot is refused");
        assert!(s.release(c));
        let (e, at_e) = s.alloc(320).unwrap();
        assert_eq!(at_e, 640);
        assert!(s.mark_sent(e));
        assert!(s.release(d));
        assert_eq!(s.outstanding(), 1);
    }

    #[test]
    fn unsent_slots_shrink_and_cancel_but_only_the_daemon_returns_them() {
        let mut s = Slots::new(1024);
        let (a, _) = s.alloc(512).unwrap();
        // The engine asked for room for the longest records and used 100 bytes of it.
        s.shrink(a, 100);
        let (b, at_b) = s.alloc(512).unwrap();
        assert_eq!(at_b, 128, "the unused room is free again");
        s.shrink(a, 10); // not the newest any more: no change
        assert_eq!(s.used(), 128 + 512);
        assert!(!s.release(b), "a client cannot ack what it was never sent");
        assert!(s.cancel(b), "a batch dropped before it was sent");
        assert!(!s.cancel(b));
        assert!(s.mark_sent(a));
        assert!(!s.cancel(a), "once sent, only the client's ack returns it");
        assert!(s.release(a));
        assert_eq!(s.used(), 0);
    }

    /// Regression (issue 28): a length near 2^64 rounded up wrapped to 0, and the ring
    /// handed out a 64-byte region for it, which a lease then viewed as `len` bytes.
    #[test]
    fn lengths_that_overflow_are_refused_not_wrapped() {
        let mut s = Slots::new(1 << 20);
        for len in [u64::MAX, u64::MAX - 62, u64::MAX - ALIGN + 1, (1 << 20) + 1] {
            assert!(!s.fits_empty(len), "{len}");
            assert!(s.alloc(len).is_none(), "{len}");
        }
        assert_eq!(s.used(), 0, "nothing was taken");
        // With slots live, the ends plus a huge length must not wrap past the oldest.
        let (a, at_a) = s.alloc(1000).unwrap();
        assert_eq!(s.end_of(a), Some(at_a + 1024));
        let (b, _) = s.alloc(1000).unwrap();
        assert!(s.mark_sent(a));
        assert!(s.release(a), "a reclaimed: the ring is now free before b");
        for len in [u64::MAX, u64::MAX - 2047, u64::MAX - (1 << 20)] {
            assert!(s.alloc(len).is_none(), "{len}");
        }
        // Shrinking by a huge length is no change.
        s.shrink(b, u64::MAX);
        assert_eq!(s.end_of(b), Some(2048));
        assert_eq!(s.end_of(a), None, "released");
    }

    #[test]
    fn random_traffic_keeps_live_regions_disjoint_and_inside() {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut s = Slots::new(10_000);
        let mut live: Vec<(u32, u64, u64)> = Vec::new();
        for _ in 0..20_000 {
            if !live.is_empty() && rng.random_range(0..3) == 0 {
                let i = rng.random_range(0..live.len());
                let (id, _, _) = live.swap_remove(i);
                assert!(s.release(id));
            } else {
                let len = rng.random_range(1..4000);
                if let Some((id, at)) = s.alloc(len) {
                    assert!(s.mark_sent(id));
                    assert_eq!(at % ALIGN, 0);
                    assert!(at + len <= 10_000);
                    for &(_, a, l) in &live {
                        assert!(at + len <= a || a + l <= at, "overlap");
                    }
                    live.push((id, at, len));
                }
            }
            if live.is_empty() {
                assert_eq!(s.used(), 0, "everything released is reclaimed");
            }
        }
    }
}
