//! Batches of an epoch and how ranks share them.
//!
//! The epoch's sequence of records is cut into global batches of B. Rank r of W takes
//! global batches r, r + W, r + 2W, ... Every rank gets the same number of batches: when
//! the records do not divide evenly, the caller must choose to drop the tail (`DropLast`:
//! only whole rounds of W full batches are kept) or to pad it (`Pad`: the sequence is
//! extended from its own start, the extra records marked as padding). A single rank may
//! also end on a partial batch (`Partial`).
//!
//! A split may start past the epoch's first positions (`Split::resumed`): a job resumed
//! from a global cursor (R positions consumed by all ranks, under any world and batch
//! size) cuts what remains, positions R onward, into batches in the same way, its tail
//! rule applied to what remains; padding still repeats the epoch's first records.
//!
//! A rank may be read by several streams, its DataLoader workers (`workers` of them, the
//! world then counting streams: ranks x workers). Stream `s` of the world is worker
//! `s / ranks` of rank `s % ranks`, and takes global batches `s, s + world, ...`: worker
//! k of n of rank r takes the rank's batches `i` with `i % n == k` (global batch
//! `i * ranks + r`), so a DataLoader taking its workers' batches in turn yields the
//! rank's batches in order. The tail rule is applied over the ranks only: every rank gets
//! the same number of batches, its workers' counts may differ by one, and a single rank
//! read by any number of workers may end on a partial batch.

use crate::{Error, Result};

/// What to do with the records that do not fill the last round of batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tail {
    /// Keep a short last batch (one rank, or when everything divides evenly).
    Partial,
    /// Drop them.
    DropLast,
    /// Fill up with records from the start of the epoch, marked as padding.
    Pad,
}

/// The batches of one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    /// Records in the epoch.
    pub records: u64,
    /// Records per batch.
    pub batch: u64,
    /// This stream (a rank, or one of a rank's workers: see the module docs).
    pub rank: u64,
    /// Streams in all: ranks x workers.
    pub world: u64,
    /// Streams (DataLoader workers) of each rank: `world / workers` ranks.
    pub workers: u64,
    /// The tail policy.
    pub tail: Tail,
    /// Global batches in the epoch (all ranks), after `start`.
    pub global_batches: u64,
    /// Positions of the epoch's sequence consumed before this split's first batch (0
    /// unless resumed from a global cursor).
    pub start: u64,
}

impl Split {
    /// Checks the arguments and works out the number of batches.
    pub fn new(records: u64, batch: u64, rank: u64, world: u64, tail: Tail) -> Result<Split> {
        Split::resumed(records, batch, rank, world, tail, 0)
    }

    /// The split of what remains of an epoch of `records` once `start` positions of its
    /// sequence are consumed (`start` below `records`): positions `start..` cut into
    /// batches of `batch` over `world` ranks, the tail rule applied to what remains.
    pub fn resumed(
        records: u64,
        batch: u64,
        rank: u64,
        world: u64,
        tail: Tail,
        start: u64,
    ) -> Result<Split> {
        Split::streams(records, batch, rank, world, 1, tail, start)
    }

    /// [`Split::resumed`] for stream `rank` of a world of `world` streams that are
    /// `workers` workers of each rank (see the module docs): the tail rule is applied over
    /// the `world / workers` ranks, and each stream gets its rank's batches in turn with
    /// the rank's other workers.
    pub fn streams(
        records: u64,
        batch: u64,
        rank: u64,
        world: u64,
        workers: u64,
        tail: Tail,
        start: u64,
    ) -> Result<Split> {
        if start >= records && start > 0 {
            return Err(Error::Invalid(format!(
                "a resume point at record {start} of an epoch of {records} leaves nothing to read"
            )));
        }
        let all_records = records;
        let records = records - start;
        if batch == 0 {
            return Err(Error::Invalid("the batch size must be at least 1".into()));
        }
        if world == 0 || rank >= world {
            return Err(Error::Invalid(format!(
                "rank {rank} is not in a world of {world}"
            )));
        }
        if workers == 0 || !world.is_multiple_of(workers) {
            return Err(Error::Invalid(format!(
                "a world of {world} streams is not {workers} workers of each rank (workers \
                 must be at least 1 and divide the world, which counts ranks x workers)"
            )));
        }
        // The tail rule is the ranks': a rank's workers share its batches.
        let streams = world;
        let world = world / workers;
        let full = records / batch;
        let all = records.div_ceil(batch);
        let too_long = || {
            Error::Invalid(format!(
                "batches of {batch} over {world} ranks make an epoch of {records} records \
                 longer than 2^64 positions once padded: choose a smaller batch size or world"
            ))
        };
        let global_batches = match tail {
            Tail::DropLast => full / world * world,
            Tail::Pad => all
                .div_ceil(world)
                .checked_mul(world)
                .ok_or_else(too_long)?,
            Tail::Partial => {
                // A round of batches longer than 2^64 records is longer than the epoch.
                let even = batch
                    .checked_mul(world)
                    .is_some_and(|round| records.is_multiple_of(round));
                if world > 1 && !even {
                    return Err(Error::Invalid(format!(
                        "{records} records do not split evenly into batches of {batch} over {world} ranks \
                         (every rank must get the same number of batches): choose --drop-last or --pad"
                    )));
                }
                all
            }
        };
        // Every position of the (padded) sequence fits in 64 bits: the arithmetic on
        // positions below (and in the modes) cannot overflow.
        global_batches
            .checked_mul(batch)
            .and_then(|n| n.checked_add(start))
            .ok_or_else(too_long)?;
        // A round of batches of every stream (`round`) fits too.
        batch.checked_mul(streams).ok_or_else(too_long)?;
        if global_batches == 0 {
            return Err(Error::Invalid(format!(
                "{records} records give no batch of {batch} for {world} rank(s) with --drop-last"
            )));
        }
        Ok(Split {
            records: all_records,
            batch,
            rank,
            world: streams,
            workers,
            tail,
            global_batches,
            start,
        })
    }

    /// Records left to split (after `start`).
    pub fn remaining(&self) -> u64 {
        self.records - self.start
    }

    /// The same global batches seen as one rank's: every rank's batches, in global order
    /// (batch `j` of the view is global batch `j`), for a pass shared by the ranks.
    pub fn all_ranks(self) -> Split {
        Split {
            rank: 0,
            world: 1,
            workers: 1,
            ..self
        }
    }

    /// Ranks in all (streams over workers).
    pub fn ranks(&self) -> u64 {
        self.world / self.workers
    }

    /// Batches this stream gets: the global batches `rank, rank + world, ...` below
    /// [`Split::global_batches`]. Every rank gets the same number; with workers, a rank's
    /// workers' counts differ by at most one.
    pub fn batches(&self) -> u64 {
        match self.global_batches.checked_sub(self.rank) {
            Some(n) if n > 0 => (n - 1) / self.world + 1,
            _ => 0,
        }
    }

    /// The global batch of this rank's batch `j`.
    pub fn global(&self, j: u64) -> u64 {
        j * self.world + self.rank
    }

    /// Positions of the epoch sequence that all ranks together consume in the epoch: the
    /// padded length with `Pad`, the records kept otherwise.
    pub fn end(&self) -> u64 {
        let all = self.global_batches * self.batch;
        self.start
            + match self.tail {
                Tail::Pad => all,
                _ => all.min(self.remaining()),
            }
    }

    /// The epoch's end as cursors count it: [`Split::end`] with padding left out, so the
    /// records consumed once every batch is read. Padding repeats records already counted;
    /// a cursor at the end of a padded epoch must be the end under any world and tail.
    pub fn cursor_end(&self) -> u64 {
        self.end().min(self.records)
    }

    /// Records per round of batches: one batch for every stream (every rank's, with one
    /// worker each).
    pub fn round(&self) -> u64 {
        // `streams` checked it fits.
        self.batch * self.world
    }

    /// Positions of the epoch sequence consumed by all ranks together once every rank has
    /// delivered its batches before `j` (`j` at most [`Split::batches`]; `None` past that),
    /// padding not counted: at most [`Split::cursor_end`].
    pub fn consumed(&self, j: u64) -> Option<u64> {
        if j > self.batches() {
            return None;
        }
        Some((self.start + j * self.world * self.batch).min(self.cursor_end()))
    }

    /// The batch of each rank that starts at position `pos` of the epoch sequence (the
    /// inverse of [`Split::consumed`]): `Ok(j)` when `pos` is the start of a round of
    /// batches or the epoch's end, otherwise the exact positions on either side of it.
    ///
    /// The end is any of: the split's own [`Split::end`], its [`Split::cursor_end`], and
    /// the epoch's record count (every record consumed, which is what a cursor taken at
    /// the end of the epoch under any other world, batch size or tail says). Positions
    /// past the end are padding or records this split drops.
    pub fn batch_at(&self, pos: u64) -> std::result::Result<u64, Between> {
        let end = self.end();
        if pos == end || pos == self.records {
            return Ok(self.batches());
        }
        let last = self.cursor_end();
        if pos > last {
            return Err(Between::PastEnd { end: last });
        }
        let round = self.round();
        if pos < self.start {
            return Err(Between::Inside {
                before: 0,
                after: self.start,
            });
        }
        let local = pos - self.start;
        if local.is_multiple_of(round) {
            return Ok(local / round);
        }
        let before = pos - local % round;
        Err(Between::Inside {
            before,
            after: (before + round).min(last),
        })
    }

    /// The positions in the (possibly padded) epoch sequence of this rank's batch `j`;
    /// positions at or past `records` are padding and map to `position % records`.
    pub fn positions(&self, j: u64) -> std::ops::Range<u64> {
        let g = self.global(j);
        let end = match self.tail {
            Tail::Pad => (g + 1) * self.batch,
            _ => ((g + 1) * self.batch).min(self.remaining()),
        };
        self.start + g * self.batch..self.start + end
    }
}

/// Why a position of the epoch sequence is not where every rank starts a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Between {
    /// It lies inside a round of batches: `before` and `after` are the exact positions on
    /// either side (`after` may be the epoch's end).
    Inside {
        /// The start of the round it lies in.
        before: u64,
        /// The start of the next round, or the epoch's end.
        after: u64,
    },
    /// It lies past the epoch's last position, `end`.
    PastEnd {
        /// Positions in the epoch.
        end: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covered(records: u64, batch: u64, world: u64, tail: Tail) -> Vec<u64> {
        let mut seen = vec![0u64; records as usize];
        let per = Split::new(records, batch, 0, world, tail)
            .unwrap()
            .batches();
        for r in 0..world {
            let s = Split::new(records, batch, r, world, tail).unwrap();
            assert_eq!(
                s.batches(),
                per,
                "every rank gets the same number of batches"
            );
            for j in 0..s.batches() {
                let p = s.positions(j);
                if tail != Tail::Partial || j + 1 < s.batches() {
                    assert_eq!(p.end - p.start, batch);
                }
                for pos in p {
                    seen[(pos % records) as usize] += 1;
                }
            }
        }
        seen
    }

    #[test]
    fn drop_last_and_pad() {
        // 103 records, batches of 10, 3 ranks: 10 full batches, 9 kept with drop-last.
        let seen = covered(103, 10, 3, Tail::DropLast);
        assert_eq!(seen.iter().filter(|&&c| c == 1).count(), 90);
        assert!(seen.iter().all(|&c| c <= 1));
        // Pad: 11 batches rounded up to 12: 120 positions, 17 of them padding.
        let seen = covered(103, 10, 3, Tail::Pad);
        assert!(seen.iter().all(|&c| c >= 1));
        assert_eq!(seen.iter().sum::<u64>(), 120);
        // Even split: exact.
        assert!(covered(120, 10, 3, Tail::Partial).iter().all(|&c| c == 1));
        assert!(covered(7, 3, 1, Tail::Partial).iter().all(|&c| c == 1));
    }

    proptest::proptest! {
        /// For any sizes: every rank gets the same number of batches of the same size;
        /// drop-last covers each record at most once and only drops less than a round of
        /// batches; pad covers every record at least once and pads less than a round;
        /// an even split covers each record exactly once.
        #[test]
        fn rank_split_properties(records in 1u64..3000, batch in 1u64..70, world in 1u64..9) {
            let round = batch * world;
            if let Ok(s) = Split::new(records, batch, 0, world, Tail::DropLast) {
                let seen = covered(records, batch, world, Tail::DropLast);
                proptest::prop_assert!(seen.iter().all(|&c| c <= 1));
                let kept = seen.iter().sum::<u64>();
                proptest::prop_assert_eq!(kept, s.global_batches * batch);
                proptest::prop_assert!(records - kept < round);
            } else {
                proptest::prop_assert!(records < round);
            }
            let seen = covered(records, batch, world, Tail::Pad);
            proptest::prop_assert!(seen.iter().all(|&c| c >= 1));
            proptest::prop_assert!(seen.iter().sum::<u64>() - records < round);
            if records % round == 0 {
                proptest::prop_assert!(covered(records, batch, world, Tail::Partial).iter().all(|&c| c == 1));
            }
        }
    }

    proptest::proptest! {
        /// Regression (issue 29 deliverable 2): streams that are DataLoader workers of a
        /// rank split that rank's batches, and the tail rule is the ranks'. For any sizes
        /// and tail: worker k of n of rank r gets exactly the rank's batches i with
        /// i % n == k, in order (so taking the workers' batches in turn yields the rank's
        /// batches in order); the workers' counts differ by at most one; every rank gets
        /// as many batches as without workers. One rank with any workers and tail partial
        /// covers every record exactly once, only its last batch short. Resumed from a
        /// position the same holds of what remains.
        #[test]
        fn workers_split_their_ranks_batches(
            records in 1u64..2000,
            batch in 1u64..40,
            ranks in 1u64..5,
            workers in 1u64..5,
            resume in 0u64..4,
        ) {
            let world = ranks * workers;
            let start = (records * resume / 4) / batch * batch;
            for tail in [Tail::DropLast, Tail::Pad, Tail::Partial] {
                let Ok(alone) = Split::resumed(records, batch, 0, ranks, tail, start) else {
                    proptest::prop_assert!(
                        Split::streams(records, batch, 0, world, workers, tail, start).is_err()
                    );
                    continue;
                };
                for r in 0..ranks {
                    let rank = Split::resumed(records, batch, r, ranks, tail, start).unwrap();
                    proptest::prop_assert_eq!(rank.batches(), alone.batches());
                    let mut counts = Vec::new();
                    for k in 0..workers {
                        let s = Split::streams(
                            records, batch, k * ranks + r, world, workers, tail, start,
                        )
                        .unwrap();
                        proptest::prop_assert_eq!(s.ranks(), ranks);
                        counts.push(s.batches());
                        for j in 0..s.batches() {
                            let i = j * workers + k;
                            proptest::prop_assert!(i < rank.batches());
                            proptest::prop_assert_eq!(s.positions(j), rank.positions(i));
                        }
                    }
                    proptest::prop_assert_eq!(counts.iter().sum::<u64>(), rank.batches());
                    let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
                    proptest::prop_assert!(hi - lo <= 1);
                }
            }
            // One rank, any workers, tail partial: every record once, in batches of
            // `batch` but the last.
            let mut seen = vec![0u32; records as usize];
            let mut short = 0;
            for k in 0..workers {
                let s = Split::streams(records, batch, k, workers, workers, Tail::Partial, 0)
                    .unwrap();
                for j in 0..s.batches() {
                    let p = s.positions(j);
                    short += u32::from(p.end - p.start < batch);
                    for pos in p {
                        seen[pos as usize] += 1;
                    }
                }
            }
            proptest::prop_assert!(seen.iter().all(|&c| c == 1));
            proptest::prop_assert_eq!(short, u32::from(records % batch != 0));
        }
    }

    #[test]
    fn workers_must_divide_the_world() {
        for (world, workers) in [(3, 2), (4, 0)] {
            let e = Split::streams(100, 10, 0, world, workers, Tail::Pad, 0)
                .unwrap_err()
                .to_string();
            assert!(e.contains("workers"), "{e}");
        }
        // 103 records over one rank of two workers: partial is fine (it is one rank).
        let s = Split::streams(103, 10, 1, 2, 2, Tail::Partial, 0).unwrap();
        assert_eq!((s.global_batches, s.batches(), s.ranks()), (11, 5, 1));
        assert_eq!(s.positions(4), 90..100);
    }

    /// A split resumed at any position, under any world, batch size and tail: what the
    /// earlier ranks read before it plus what the new ranks read covers the epoch as the
    /// new tail rule says (exactly once with an even split; drop-last loses less than a
    /// new round; pad repeats less than a round, from the epoch's start).
    #[test]
    fn resumed_splits_cover_the_rest_of_the_epoch() {
        for (records, b1, w1, k, b2, w2) in [
            (1000, 10, 2, 7, 10, 4),
            (1000, 10, 4, 5, 10, 3),
            (1024, 16, 8, 3, 16, 1),
            (999, 7, 3, 11, 20, 5),
        ] {
            let before = Split::new(records, b1, 0, w1, Tail::Pad).unwrap();
            let at = before.consumed(k).unwrap();
            for tail in [Tail::DropLast, Tail::Pad, Tail::Partial] {
                let Ok(probe) = Split::resumed(records, b2, 0, w2, tail, at) else {
                    assert_eq!(
                        tail,
                        Tail::Partial,
                        "only an uneven partial split is refused"
                    );
                    continue;
                };
                let mut seen = vec![0u32; records as usize];
                for p in 0..at {
                    seen[p as usize] += 1;
                }
                for r in 0..w2 {
                    let s = Split::resumed(records, b2, r, w2, tail, at).unwrap();
                    assert_eq!(s.batches(), probe.batches());
                    for j in 0..s.batches() {
                        for p in s.positions(j) {
                            assert!(p >= at);
                            seen[(p % records) as usize] += 1;
                        }
                    }
                }
                let once = seen.iter().filter(|&&c| c == 1).count() as u64;
                let round = b2 * w2;
                match tail {
                    Tail::DropLast => {
                        assert!(seen.iter().all(|&c| c <= 1));
                        assert!(records - once < round, "{records} {at} {tail:?}");
                    }
                    Tail::Pad => {
                        assert!(seen.iter().all(|&c| c >= 1));
                        assert!(seen.iter().map(|&c| c as u64).sum::<u64>() - records < round);
                    }
                    Tail::Partial => assert_eq!(once, records),
                }
                assert_eq!(probe.consumed(0), Some(at));
                assert_eq!(probe.batch_at(at), Ok(0));
                assert_eq!(probe.consumed(probe.batches()), Some(probe.cursor_end()));
            }
        }
        assert!(Split::resumed(10, 2, 0, 1, Tail::Partial, 10).is_err());
    }

    #[test]
    fn uneven_split_needs_a_choice() {
        let e = Split::new(103, 10, 0, 3, Tail::Partial)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--drop-last or --pad"), "{e}");
        assert!(Split::new(5, 10, 0, 2, Tail::DropLast).is_err());
        assert!(Split::new(5, 10, 2, 2, Tail::Pad).is_err());
    }

    /// Regression (issue 13): sizes from the command line are checked, never wrapped. A
    /// round of batches longer than 2^64 records overflowed (`batch * world`), and a padded
    /// epoch longer than 2^64 positions would have wrapped every position after it.
    #[test]
    fn huge_batches_and_worlds_are_errors_not_overflows() {
        let half = 1u64 << 63;
        let e = Split::new(10, half, 0, 3, Tail::Partial)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--drop-last or --pad"), "{e}");
        let e = Split::new(10, half, 0, 3, Tail::Pad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("longer than 2^64"), "{e}");
        assert!(Split::new(u64::MAX, 1, 0, half, Tail::Pad).is_err());
        assert!(Split::new(10, half, 0, 3, Tail::DropLast).is_err());
        let s = Split::new(u64::MAX, 1, 0, 1, Tail::Pad).unwrap();
        assert_eq!((s.end(), s.round()), (u64::MAX, 1));
        assert_eq!(s.consumed(s.batches()), Some(u64::MAX));
        assert_eq!(s.consumed(s.batches() - 1), Some(u64::MAX - 1));
        assert_eq!(s.batch_at(u64::MAX - 1), Ok(u64::MAX - 1));
    }
}
