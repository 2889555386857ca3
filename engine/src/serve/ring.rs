//! Space in a stream's ring: contiguous regions handed out in order, returned in any order.
//!
//! A region (a "slot") is live from [`Slots::alloc`] until the client's ack
//! ([`Slots::release`]); the daemon writes only into space no live slot covers. Space is
//! reclaimed from the oldest slot on, so a slot acknowledged out of order frees its bytes
//! once every older one is acknowledged too. No I/O and no unsafe: pure bookkeeping.

use std::collections::VecDeque;

/// Every region starts at a multiple of this (u64 arrays and cache lines stay aligned).
pub const ALIGN: u64 = 64;

#[derive(Debug)]
struct Slot {
    id: u32,
    start: u64,
    end: u64,
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

    /// Slots handed out and not yet released (released ones behind an older live one count).
    pub fn outstanding(&self) -> usize {
        self.live.iter().filter(|s| !s.released).count()
    }

    /// Bytes covered by slots not yet reclaimed.
    pub fn used(&self) -> u64 {
        self.live.iter().map(|s| s.end - s.start).sum()
    }

    /// Whether a region of `len` bytes can ever fit (in an empty ring).
    pub fn fits_empty(&self, len: u64) -> bool {
        round(len) <= self.size
    }

    /// A region of `len` bytes: `(slot id, start)`, or `None` while there is no room.
    pub fn alloc(&mut self, len: u64) -> Option<(u32, u64)> {
        let len = round(len).max(ALIGN);
        let start = match (self.live.front(), self.live.back()) {
            (None, _) | (_, None) => (len <= self.size).then_some(0)?,
            (Some(old), Some(new)) => {
                if new.start >= old.start {
                    // Not wrapped: free space after the newest and before the oldest.
                    if new.end + len <= self.size {
                        new.end
                    } else if len <= old.start {
                        0
                    } else {
                        return None;
                    }
                } else if new.end + len <= old.start {
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
            end: start + len,
            released: false,
        });
        Some((id, start))
    }

    /// Returns slot `id`. False if it is not live (never handed out, or released already).
    pub fn release(&mut self, id: u32) -> bool {
        let Some(s) = self.live.iter_mut().find(|s| s.id == id && !s.released) else {
            return false;
        };
        s.released = true;
        while self.live.front().is_some_and(|s| s.released) {
            self.live.pop_front();
        }
        true
    }
}

fn round(len: u64) -> u64 {
    len.div_ceil(ALIGN) * ALIGN
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
        assert_eq!(at_d, 0);
        assert!(
            s.alloc(64).is_none(),
            "wrapped: d ends at 640 where c starts"
        );
        assert!(!s.release(a), "a second release is refused");
        assert!(!s.release(99), "an unknown slot is refused");
        assert!(s.release(c));
        assert_eq!(s.alloc(320).unwrap().1, 640);
        assert!(s.release(d));
        assert_eq!(s.outstanding(), 1);
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
