//! Resume cursors: where a read starts again mid-epoch.
//!
//! The engine resumes from a [`Cursor`], this rank's next batch of an epoch. Users give a
//! [`Resume`], in one of these forms:
//!
//! - `E:B@WxS`: batch B of every rank of epoch E, taken under a world of W ranks and
//!   batches of S records: the form a run prints. A batch number names a position only
//!   with the world and batch size it was counted in, so under another world or batch size
//!   it is refused, with the global form that means the same position.
//! - `E:B`: the same under this run's world and batch size (the user says so by leaving
//!   the shape out).
//! - `E:B@W`: the form runs printed before cursors carried their batch size. It does not
//!   say which batch size B counts, so it is refused (unless B is 0, the epoch's start
//!   under any shape), with the global form it means if it was taken under this run's
//!   batch size.
//! - `E+R`: R records of epoch E's sequence consumed by all ranks together, the global
//!   form: valid under any world and batch size whose rounds of batches (one batch for
//!   every rank) start at R, so the union over ranks of what was read before and after is
//!   the epoch exactly once. Padding is not counted: the end of a padded epoch is `E+N`
//!   for an epoch of N records, which every world takes as its end.
//!
//! Positions are those of `order::Split`: global batch g covers positions `g*B..(g+1)*B`
//! of the epoch's sequence (padded past its records with `Pad`, cut at the kept rounds
//! with `DropLast`), so the same cursor means the same records whatever the tail rule.

use serde::Serialize;

use crate::order::split::{Between, Split};
use crate::order::Tail;
use crate::{Error, Result};

/// Where to resume: the epoch and the first batch (this rank's numbering) to deliver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Cursor {
    /// The epoch.
    pub epoch: u64,
    /// The next batch of that epoch.
    pub batch: u64,
}

impl std::str::FromStr for Cursor {
    type Err = String;
    /// `EPOCH:BATCH`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (e, b) = s
            .split_once(':')
            .ok_or_else(|| format!("'{s}': expected EPOCH:BATCH, like 3:120"))?;
        Ok(Cursor {
            epoch: number(s, "epoch", e)?,
            batch: number(s, "batch", b)?,
        })
    }
}

impl Cursor {
    /// The form a run prints for resuming under the same job: `E:B@WxS`, with the world
    /// and batch size its batch number counts in.
    pub fn rank_form(&self, world: u64, batch_size: u64) -> String {
        format!("{}:{}@{world}x{batch_size}", self.epoch, self.batch)
    }

    /// The global form under `split` (the job it was taken under): `E+R`, padding not
    /// counted, or `None` when the cursor lies past the end of its epoch.
    pub fn global_form(&self, split: &Split) -> Option<String> {
        split
            .consumed(self.batch)
            .map(|r| format!("{}+{r}", self.epoch))
    }

    /// The same epoch's batch `batch`.
    fn with_batch(self, batch: u64) -> Cursor {
        Cursor { batch, ..self }
    }

    /// Refuses a cursor past the end of its epoch (one at the end, as the last batch's
    /// [`crate::modes::Batch::next_cursor`] gives, is fine: that epoch has nothing left).
    pub(crate) fn check(&self, split: &Split) -> Result<()> {
        if self.batch > split.batches() {
            return Err(Error::Invalid(format!(
                "resume cursor {}:{} is past the end of epoch {}: {}; {}:{} is its end",
                self.epoch,
                self.batch,
                self.epoch,
                describe(split),
                self.epoch,
                split.batches()
            )));
        }
        Ok(())
    }
}

/// A resume position as a user gives it (`riffle read --resume`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    /// `E:B@WxS`, `E:B` or `E:B@W`: batch B of every rank, taken under `world` ranks and
    /// batches of `size` records (`None`: the run's it is given to). `size` is only given
    /// with `world`; `world` without `size` is the old form, refused unless B is 0.
    Rank {
        /// The epoch.
        epoch: u64,
        /// The next batch of every rank.
        batch: u64,
        /// The world it was taken under.
        world: Option<u64>,
        /// The batch size it was taken under.
        size: Option<u64>,
    },
    /// `E+R`: R records of epoch E's sequence consumed by all ranks together.
    Global {
        /// The epoch.
        epoch: u64,
        /// Positions consumed.
        records: u64,
    },
}

impl std::str::FromStr for Resume {
    type Err = String;
    /// `EPOCH:BATCH@WORLDxBATCH_SIZE`, `EPOCH:BATCH`, `EPOCH+RECORDS` (or the old
    /// `EPOCH:BATCH@WORLD`).
    fn from_str(s: &str) -> Result<Self, String> {
        let expected = || {
            format!(
                "'{s}': expected EPOCH:BATCH@WORLDxBATCH_SIZE, EPOCH:BATCH or EPOCH+RECORDS, \
                 like 3:120@8x256, 3:120 or 3+245760"
            )
        };
        if let Some((e, r)) = s.split_once('+') {
            return Ok(Resume::Global {
                epoch: number(s, "epoch", e)?,
                records: number(s, "record count", r)?,
            });
        }
        let (e, rest) = s.split_once(':').ok_or_else(expected)?;
        let (b, shape) = match rest.split_once('@') {
            Some((b, shape)) => (b, Some(shape)),
            None => (rest, None),
        };
        let (w, size) = match shape.map(|x| x.split_once('x')) {
            Some(Some((w, size))) => (Some(w), Some(size)),
            Some(None) => (shape, None),
            None => (None, None),
        };
        let world = w.map(|w| number(s, "world", w)).transpose()?;
        if world == Some(0) {
            return Err(format!("'{s}': a world has at least one rank"));
        }
        let size = size.map(|n| number(s, "batch size", n)).transpose()?;
        if size == Some(0) {
            return Err(format!("'{s}': a batch has at least one record"));
        }
        Ok(Resume::Rank {
            epoch: number(s, "epoch", e)?,
            batch: number(s, "batch", b)?,
            world,
            size,
        })
    }
}

impl std::fmt::Display for Resume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Resume::Rank {
                epoch,
                batch,
                world,
                size,
            } => {
                write!(f, "{epoch}:{batch}")?;
                match (world, size) {
                    (Some(w), Some(s)) => write!(f, "@{w}x{s}"),
                    (Some(w), None) => write!(f, "@{w}"),
                    (None, Some(s)) => write!(f, " (batches of {s})"),
                    (None, None) => Ok(()),
                }
            }
            Resume::Global { epoch, records } => write!(f, "{epoch}+{records}"),
        }
    }
}

impl From<Cursor> for Resume {
    fn from(c: Cursor) -> Resume {
        Resume::Rank {
            epoch: c.epoch,
            batch: c.batch,
            world: None,
            size: None,
        }
    }
}

impl Resume {
    /// The epoch it resumes in.
    pub fn epoch(&self) -> u64 {
        match *self {
            Resume::Rank { epoch, .. } | Resume::Global { epoch, .. } => epoch,
        }
    }

    /// This rank's cursor in the job `split` describes (this run's records, batch size,
    /// rank, world and tail), or why there is none: a cursor past the end of its epoch, a
    /// global position inside a round of batches, a cursor taken under another world or
    /// batch size, or one that does not say its batch size (with the global form to give
    /// instead).
    pub fn resolve(&self, split: &Split) -> Result<Cursor> {
        match *self {
            Resume::Rank {
                epoch,
                batch,
                world,
                size,
            } => {
                // Batch 0 is the epoch's start under any world and batch size.
                if batch == 0 {
                    return Ok(Cursor { epoch, batch });
                }
                if let (Some(w), None) = (world, size) {
                    return Err(Error::Invalid(self.no_size(epoch, batch, w, split)));
                }
                let taken = (world.unwrap_or(split.world), size.unwrap_or(split.batch));
                if taken != (split.world, split.batch) {
                    return Err(Error::Invalid(self.other_shape(epoch, batch, taken, split)));
                }
                let c = Cursor { epoch, batch };
                c.check(split).map_err(|_| {
                    Error::Invalid(format!(
                        "--resume {self} is past the end of epoch {epoch}: {}; --resume {} is its end",
                        describe(split),
                        c.with_batch(split.batches()).rank_form(split.world, split.batch)
                    ))
                })?;
                Ok(c)
            }
            Resume::Global { epoch, records } => match split.batch_at(records) {
                Ok(batch) => Ok(Cursor { epoch, batch }),
                Err(between) => Err(Error::Invalid(format!(
                    "--resume {self}: {}",
                    inexact(epoch, records, between, split)
                ))),
            },
        }
    }

    /// This rank's cursor, and, for a global position inside a round of `split`'s batches,
    /// the position itself: the read then cuts the rest of that epoch into this job's
    /// batches from there ([`crate::order::split::Split::resumed`], through
    /// [`crate::modes::ReadOptions::resume_start`]), so a global cursor converts exactly to
    /// any world and batch size. Everything [`Resume::resolve`] refuses otherwise is still
    /// refused.
    pub fn resolve_anywhere(&self, split: &Split) -> Result<(Cursor, Option<u64>)> {
        if let Resume::Global { epoch, records } = *self {
            if let Err(Between::Inside { .. }) = split.batch_at(records) {
                return Ok((Cursor { epoch, batch: 0 }, Some(records)));
            }
        }
        self.resolve(split).map(|c| (c, None))
    }

    /// Why the old `E:B@W` cannot be taken: it does not say the batch size B counts in.
    /// What it means if taken under this run's batch size, in the global form.
    fn no_size(&self, epoch: u64, batch: u64, world: u64, split: &Split) -> String {
        let head = format!(
            "--resume {self} does not say the batch size it was taken under (cursors are \
             now EPOCH:BATCH@WORLDxBATCH_SIZE), and batch {batch} starts at a different record under \
             each batch size"
        );
        let guess = format!("{epoch}:{batch}@{world}x{}", split.batch);
        match Self::position(epoch, batch, (world, split.batch), split) {
            Ok(at) => format!(
                "{head}: taken with --batch-size {} (this run's), it is --resume {guess}, \
                 record {} of epoch {epoch}: give {}",
                split.batch,
                thousands(at),
                convert(epoch, at, split)
            ),
            Err(why) => format!(
                "{head}; taken with --batch-size {} (this run's), it is --resume {guess}, \
                 and {why}",
                split.batch
            ),
        }
    }

    /// Why `E:B@WxS` cannot be given under `split`'s world and batch size, and what to
    /// give instead.
    fn other_shape(&self, epoch: u64, batch: u64, taken: (u64, u64), split: &Split) -> String {
        let at = match Self::position(epoch, batch, taken, split) {
            Ok(at) => at,
            Err(why) => return format!("--resume {self}: {why}"),
        };
        format!(
            "--resume {self} was taken under world {} and batch size {}, at record {} of \
             epoch {epoch}, and this run has world {} and batch size {}: give {}",
            taken.0,
            taken.1,
            thousands(at),
            split.world,
            split.batch,
            convert(epoch, at, split)
        )
    }

    /// The global position of batch `batch` of epoch `epoch` under `(world, size)` over
    /// `split`'s records and tail, or why there is none.
    fn position(
        epoch: u64,
        batch: u64,
        (world, size): (u64, u64),
        split: &Split,
    ) -> std::result::Result<u64, String> {
        let then = Split::new(split.records, size, 0, world, split.tail).map_err(|e| {
            format!("under world {world} and batch size {size} this job cannot run: {e}")
        })?;
        then.consumed(batch).ok_or_else(|| {
            format!(
                "that is past the end of epoch {epoch} under world {world} and batch size \
                 {size}: {}",
                describe(&then)
            )
        })
    }
}

/// What to give for global position `at` of `epoch` under `split`: its global form, and
/// how this job reads from there (or why it cannot).
fn convert(epoch: u64, at: u64, split: &Split) -> String {
    match split.batch_at(at) {
        Ok(b) => format!("--resume {epoch}+{at} (batch {b} of each rank here)"),
        Err(Between::Inside { .. }) => format!(
            "--resume {epoch}+{at} (the rest of the epoch cut into this run's batches from \
             there)"
        ),
        Err(between) => inexact(epoch, at, between, split),
    }
}
/// Why position `at` of `epoch` does not start a round of batches under `split`, with the
/// exact positions to give instead.
fn inexact(epoch: u64, at: u64, between: Between, split: &Split) -> String {
    match between {
        Between::PastEnd { end } => format!(
            "record {} is past the end of epoch {epoch}: {}; --resume {epoch}+{end} is its end",
            thousands(at),
            describe(split)
        ),
        Between::Inside { before, after } => format!(
            "record {} does not start a round of batches (a round is {} x {} = {} records); \
             the nearest exact positions are --resume {epoch}+{before} (batch {} of each \
             rank: reads {} records again) and --resume {epoch}+{after} (batch {}: skips {})",
            thousands(at),
            split.batch,
            split.world,
            split.round(),
            before / split.round(),
            thousands(at - before),
            split
                .batch_at(after)
                .expect("a round's start or the end is exact"),
            thousands(after - at)
        ),
    }
}

/// The epoch's batches as the user chose them, for messages.
fn describe(split: &Split) -> String {
    let records = match split.tail {
        Tail::DropLast if split.end() < split.records => format!(
            "{} of its {} records, the last partial round dropped",
            thousands(split.end()),
            thousands(split.records)
        ),
        Tail::Pad if split.end() > split.records => format!(
            "its {} records padded to {}",
            thousands(split.records),
            thousands(split.end())
        ),
        _ => format!("its {} records", thousands(split.records)),
    };
    if split.workers > 1 {
        return format!(
            "this stream has {} batches of {} in it under world {} ({} ranks of {} workers; \
             {records})",
            split.batches(),
            split.batch,
            split.world,
            split.ranks(),
            split.workers,
        );
    }
    format!(
        "each rank has {} batches of {} in it under world {} ({records})",
        split.batches(),
        split.batch,
        split.world,
    )
}

fn number(s: &str, what: &str, n: &str) -> Result<u64, String> {
    n.trim()
        .parse()
        .map_err(|_| format!("'{s}': {what} '{n}' is not a number (0 to 2^64 - 1)"))
}

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(records: u64, batch: u64, world: u64, tail: Tail) -> Split {
        Split::new(records, batch, 0, world, tail).unwrap()
    }

    fn resolve(s: &str, sp: &Split) -> std::result::Result<Cursor, String> {
        s.parse::<Resume>()
            .unwrap()
            .resolve(sp)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn forms_parse_and_print() {
        for s in [
            "3:120",
            "3:120@8",
            "3:120@8x256",
            "3+30720",
            "0:0",
            "18446744073709551615+0",
        ] {
            assert_eq!(s.parse::<Resume>().unwrap().to_string(), s);
        }
        for bad in [
            "3",
            "3:x",
            "3:1@0",
            "3:1@0x5",
            "3:1@2x0",
            "3:1@2x",
            "3:1@x5",
            "3:1x5",
            "3:1@",
            "+5",
            "3+-1",
            "3:99999999999999999999",
        ] {
            assert!(bad.parse::<Resume>().is_err(), "{bad}");
        }
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(4000), "4,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }

    /// Regression (issue 13): `--resume 0:20@2` under world 4 skipped 2,000 of 10,000
    /// records; it is refused with the global form that means the same position.
    #[test]
    fn a_cursor_from_another_world_is_refused_with_its_global_form() {
        let w4 = split(10_000, 100, 4, Tail::Partial);
        let e = resolve("0:20@2x100", &w4).unwrap_err();
        assert!(
            e.contains("taken under world 2 and batch size 100, at record 4,000 of epoch 0")
                && e.contains("give --resume 0+4000 (batch 10 of each rank here)"),
            "{e}"
        );
        assert_eq!(
            resolve("0+4000", &w4).unwrap(),
            Cursor {
                epoch: 0,
                batch: 10
            }
        );
        // 0:21@2 is record 4,200: between two rounds of 400, given in its global form, which
        // resumes there exactly (the rest cut into world 4's batches from record 4,200).
        let e = resolve("0:21@2x100", &w4).unwrap_err();
        assert!(e.contains("--resume 0+4200"), "{e}");
        let g: Resume = "0+4200".parse().unwrap();
        assert!(g.resolve(&w4).is_err(), "not a round's start under world 4");
        assert_eq!(
            g.resolve_anywhere(&w4).unwrap(),
            (Cursor { epoch: 0, batch: 0 }, Some(4200))
        );
        // The same world and batch size, given or left out, is taken as it is.
        assert_eq!(resolve("0:21@4x100", &w4).unwrap().batch, 21);
        assert_eq!(resolve("0:21", &w4).unwrap().batch, 21);
    }

    /// Regression (issue 30, D6): `--resume 0:30@1` taken under `--batch-size 100` and
    /// given with `--batch-size 200` skipped 2,000 records (50: repeated 1,500), rc 0. A
    /// cursor carries its batch size; one from another batch size is refused with the
    /// global form of its position, and the old form without a batch size is refused with
    /// the global form it has under this run's batch size.
    #[test]
    fn a_cursor_from_another_batch_size_is_refused_with_its_global_form() {
        let b200 = split(10_000, 200, 1, Tail::Partial);
        let e = resolve("0:30@1x100", &b200).unwrap_err();
        assert!(
            e.contains("batch size 100, at record 3,000 of epoch 0")
                && e.contains("this run has world 1 and batch size 200")
                && e.contains("give --resume 0+3000 (batch 15 of each rank here)"),
            "{e}"
        );
        assert_eq!(resolve("0+3000", &b200).unwrap().batch, 15);
        let b50 = split(10_000, 50, 1, Tail::Partial);
        let e = resolve("0:30@1x100", &b50).unwrap_err();
        assert!(e.contains("give --resume 0+3000 (batch 60"), "{e}");
        // Inside a round of the new batch size: the global form resumes there exactly.
        let b400 = split(10_000, 400, 1, Tail::Partial);
        let e = resolve("0:30@1x100", &b400).unwrap_err();
        assert!(e.contains("--resume 0+3000 (the rest of the epoch"), "{e}");
        // The old form does not say its batch size: refused, with what it means under this
        // run's batch size, in both forms.
        for (sp, words) in [
            (
                &b200,
                "--resume 0:30@1x200, record 6,000 of epoch 0: give --resume 0+6000",
            ),
            (
                &b50,
                "--resume 0:30@1x50, record 1,500 of epoch 0: give --resume 0+1500",
            ),
        ] {
            let e = resolve("0:30@1", sp).unwrap_err();
            assert!(
                e.contains("does not say the batch size") && e.contains(words),
                "{e}"
            );
        }
        let e = resolve("0:30@2", &b200).unwrap_err();
        assert!(
            e.contains("past the end of epoch 0 under world 2 and batch size 200"),
            "{e}"
        );
        // Batch 0 is the epoch's start under any shape.
        for c in ["4:0@1", "4:0@3x7"] {
            assert_eq!(
                resolve(c, &b200).unwrap(),
                Cursor { epoch: 4, batch: 0 },
                "{c}"
            );
        }
        // The printed form names the shape, and is taken by the same job.
        let c = Cursor {
            epoch: 0,
            batch: 30,
        };
        assert_eq!(c.rank_form(1, 200), "0:30@1x200");
        assert_eq!(resolve(&c.rank_form(1, 200), &b200).unwrap(), c);
    }

    /// Regression (issue 30, D19): `--world 3 --pad` printed its end as `0+10200` (the
    /// padded length), which world 1 refused as past the end. The global form counts
    /// records, not padded positions, and the epoch's record count is the end under every
    /// world and tail.
    #[test]
    fn the_end_of_a_padded_epoch_is_its_record_count_under_any_world() {
        let pad = split(10_000, 100, 3, Tail::Pad);
        assert_eq!(pad.end(), 10_200);
        let end = Cursor {
            epoch: 0,
            batch: pad.batches(),
        };
        assert_eq!(end.global_form(&pad).unwrap(), "0+10000");
        for other in [
            split(10_000, 100, 1, Tail::Partial),
            split(10_000, 100, 2, Tail::Partial),
            split(10_000, 64, 3, Tail::DropLast),
            split(10_000, 100, 3, Tail::Pad),
            split(10_000, 300, 7, Tail::Pad),
        ] {
            assert_eq!(
                resolve("0+10000", &other).unwrap().batch,
                other.batches(),
                "{other:?}"
            );
        }
        // A padded split still takes its own padded end; positions among the padding are
        // past the records, refused with the end to give.
        assert_eq!(resolve("0+10200", &pad).unwrap().batch, 34);
        let e = resolve("0+10100", &pad).unwrap_err();
        assert!(
            e.contains("past the end") && e.contains("0+10000 is its end"),
            "{e}"
        );
        // Inside the last round, the nearest exact position after is the records' end.
        let e = resolve("0+9950", &pad).unwrap_err();
        assert!(e.contains("--resume 0+10000 (batch 34"), "{e}");
    }

    /// Regression (issue 13): a cursor past the end of its epoch read nothing and exited 0.
    #[test]
    fn past_the_end_is_refused_naming_the_batch_count() {
        let w2 = split(10_000, 100, 2, Tail::Partial);
        assert_eq!(w2.batches(), 50);
        assert_eq!(
            resolve("0:50", &w2).unwrap().batch,
            50,
            "the end itself is fine"
        );
        let e = resolve("0:51", &w2).unwrap_err();
        assert!(
            e.contains("past the end") && e.contains("50 batches"),
            "{e}"
        );
        let e = resolve("0+10200", &w2).unwrap_err();
        assert!(e.contains("past the end") && e.contains("0+10000"), "{e}");
        assert_eq!(resolve("0+10000", &w2).unwrap().batch, 50);
        let e = resolve("0:18446744073709551615@4", &w2).unwrap_err();
        assert!(e.contains("past the end"), "{e}");
    }

    /// Global positions follow the tail rule: a partial last batch ends at the records,
    /// drop-last at the kept rounds, pad at the padded length.
    #[test]
    fn global_positions_follow_the_tail_rule() {
        let one = split(7, 3, 1, Tail::Partial);
        assert_eq!(one.end(), 7);
        assert_eq!(resolve("0+7", &one).unwrap().batch, 3);
        assert_eq!(resolve("0+6", &one).unwrap().batch, 2);
        let drop = split(103, 10, 3, Tail::DropLast);
        assert_eq!(drop.end(), 90);
        assert_eq!(resolve("0+90", &drop).unwrap().batch, 3);
        assert!(resolve("0+100", &drop)
            .unwrap_err()
            .contains("past the end"));
        let pad = split(103, 10, 3, Tail::Pad);
        assert_eq!(pad.end(), 120);
        assert_eq!(resolve("0+120", &pad).unwrap().batch, 4);
        assert_eq!(resolve("0+103", &pad).unwrap().batch, 4);
        // Every record consumed is the end under drop-last too.
        assert_eq!(resolve("0+103", &drop).unwrap().batch, 3);
        // The printed global form converts back to the same cursor.
        for s in [one, drop, pad] {
            for b in 0..=s.batches() {
                let c = Cursor { epoch: 2, batch: b };
                let g = c.global_form(&s).unwrap();
                assert_eq!(resolve(&g, &s).unwrap(), c, "{g}");
            }
            assert!(Cursor {
                epoch: 2,
                batch: s.batches() + 1
            }
            .global_form(&s)
            .is_none());
        }
    }

    proptest::proptest! {
        /// Elastic resume: a cursor taken under one world and converted to its global form
        /// resumes under any other world (when that form is exact there) so that the
        /// positions read before and after, over all ranks, are the epoch exactly once.
        #[test]
        fn converted_cursors_cover_the_epoch_once(
            records in 1u64..2000, batch in 1u64..40, w1 in 1u64..6, w2 in 1u64..6, cut in 0u64..60,
        ) {
            let (Ok(a), Ok(b)) = (
                Split::new(records, batch, 0, w1, Tail::DropLast),
                Split::new(records, batch, 0, w2, Tail::DropLast),
            ) else {
                return Ok(());
            };
            let j = cut.min(a.batches());
            let before = a.consumed(j).unwrap();
            if let Ok(k) = b.batch_at(before) {
                let mut seen = vec![0u32; records as usize];
                for r in 0..w1 {
                    let s = Split::new(records, batch, r, w1, Tail::DropLast).unwrap();
                    for p in (0..j).flat_map(|x| s.positions(x)) {
                        seen[p as usize] += 1;
                    }
                }
                for r in 0..w2 {
                    let s = Split::new(records, batch, r, w2, Tail::DropLast).unwrap();
                    for p in (k..s.batches()).flat_map(|x| s.positions(x)) {
                        seen[p as usize] += 1;
                    }
                }
                proptest::prop_assert!(seen.iter().all(|&c| c <= 1));
                // Up to where the new world stops, every position was read once.
                proptest::prop_assert!(seen[..b.end() as usize].iter().all(|&c| c == 1));
            }
        }
    }
}
