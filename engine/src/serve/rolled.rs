//! Piles a pass rolled past its last epoch, kept for its job's next pass (issue 33).
//!
//! riffle.torch opens a stream per epoch, so each epoch of a job is a pass of its own. A
//! two-pass pass over local files (plain, or the rest of a dataset held in part) of a job
//! opened epoch by epoch (the pass took kept piles, or starts at the epoch where a pass of
//! the job ended: a job's first pass never rolls, so a job of one epoch writes no piles
//! no one reads) rolls its piles past its last epoch as it rolls them between epochs: while the epoch is emitted,
//! its frames are re-keyed into the next epoch's piles. When it ends, every batch emitted,
//! the daemon keeps the finished set under the job's key for that epoch (dataset, seed,
//! batch, world, workers, tail, grouping, mode, held part; no resume point), with the
//! files' identity (device, inode, size, mtime). A new pass of that key takes them and
//! starts at its pile pass: no scatter and no read of the dataset, and it rolls again.
//!
//! - **Scratch.** Kept piles keep the scratch their pass was admitted with (its
//!   `--scratch-limit` share and its reservation of the filesystem's free space); a pass
//!   that takes them is admitted for the rest of its need only.
//! - **Until.** They go when taken, after `--keep-rolled` seconds unused, when a pass's
//!   admission is short of scratch (kept piles go first, oldest first, before anyone waits
//!   or is refused), when the daemon stops (SIGTERM/SIGINT: they are scratch like any),
//!   or when the dataset's files changed (never served stale). A pass refused at its
//!   admission (`busy`) puts the piles it took back as they were, for the job's retry.
//! - **Not rolled.** When the next epoch's piles do not fit the scratch's free space, or
//!   writing them fails, the pass ends as it did before, and the log and the stats
//!   (`rolled.not_rolled`, `rolled.last_not_rolled`) say why.
//! - **Late.** A pass that is about to hand its piles over (its last epoch runs) is waited
//!   for, up to [`PENDING_WAIT`]: the next epoch's OPEN may come while its last pile is
//!   still being re-scattered.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::budget::{Admitted, ScratchHold};
use super::catalog::{stamp, Stamp};
use super::job::JobKey;
use super::open::Refusal;
use crate::dataset::Dataset;
use crate::modes::{ReadOptions, Roll, RolledPiles};
use crate::size::human_bytes;

/// The longest a new pass waits for a pass that is about to hand over its piles.
pub(super) const PENDING_WAIT: Duration = Duration::from_secs(10);

/// Default `--keep-rolled`: seconds kept piles wait for the job's next pass.
pub const DEFAULT_KEEP_SECS: u64 = 120;

/// Whose piles: the job (its first epoch the piles' epoch, no count, no resume point) and
/// the bytes of the dataset's held part (0: plain two-pass).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct RollKey {
    job: JobKey,
    part: u64,
}

impl RollKey {
    fn at(job: &JobKey, epoch: u64, part: u64) -> RollKey {
        RollKey {
            job: JobKey {
                first_epoch: epoch,
                epochs: 0,
                resume: None,
                resume_start: None,
                ..job.clone()
            },
            part,
        }
    }
}

struct Ready {
    piles: RolledPiles,
    holds: Vec<ScratchHold>,
    stamps: Vec<Stamp>,
    since: Instant,
}

enum Slot {
    /// A pass whose ticket this is will hand them over.
    Pending(u64),
    Ready(Box<Ready>),
}

#[derive(Default)]
struct Inner {
    slots: Vec<(RollKey, Slot)>,
    tickets: u64,
    kept: u64,
    taken: u64,
    expired: u64,
    evicted: u64,
    stale: u64,
    not_rolled: u64,
    last_not_rolled: Option<String>,
    /// Where the latest passes' epochs ended (the epoch after their last), newest last: a
    /// pass that starts at one of them is its job opened epoch by epoch.
    ends: std::collections::VecDeque<RollKey>,
}

/// Pass ends remembered to tell a job opened epoch by epoch.
const ENDS_KEPT: usize = 256;

/// The kept piles of the daemon.
pub(super) struct Rolled {
    keep_for: Duration,
    inner: Mutex<Inner>,
    changed: Condvar,
}

/// What a new pass holds of the kept piles' machinery until it ends: the scratch it was
/// admitted with (moved to its kept piles if it hands some over).
pub(super) type Holds = Arc<Mutex<Vec<ScratchHold>>>;

impl Rolled {
    /// Kept piles wait `keep_for` for their pass (zero: no pass rolls past its end).
    pub(super) fn new(keep_for: Duration) -> Arc<Rolled> {
        Arc::new(Rolled {
            keep_for,
            inner: Mutex::default(),
            changed: Condvar::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a new pass of job `key` over `ds` (`part`: a held part's bytes) with
    /// `admit` (given the scratch it already holds): when it reads through piles of
    /// local files from the start of an epoch, it takes the piles kept for that epoch
    /// (unless the files changed) and rolls past its last epoch for the job's next pass.
    /// `ds` is `None` for a mixture (a new view each epoch: nothing rolls).
    pub(super) fn admit(
        self: &Arc<Self>,
        (key, part, ds): (&JobKey, u64, Option<&Dataset>),
        opts: &mut ReadOptions,
        admit: impl FnOnce(&mut ReadOptions, u64) -> Result<Admitted, Refusal>,
    ) -> Result<Admitted, Refusal> {
        let Some(ds) = ds else {
            return admit(opts, 0);
        };
        let stamps = (self.keep_for > Duration::ZERO
            && key.two_pass()
            && key.resume.is_none()
            && key.resume_start.is_none()
            && ds.remote().is_none())
        .then(|| ds.files().iter().map(|f| stamp(&f.path)).collect())
        .and_then(|s: std::io::Result<Vec<Stamp>>| s.ok());
        let Some(stamps) = stamps else {
            return admit(opts, 0);
        };
        // Only a job opened epoch by epoch (riffle.torch: a stream per epoch) rolls past
        // its end: one whose pass took kept piles, or that starts where a pass of the job
        // ended. A job's first pass does not: a job of one epoch (or of several in one
        // stream) would write a set of piles no one reads.
        let here = RollKey::at(key, key.first_epoch, part);
        let next = RollKey::at(key, key.first_epoch.saturating_add(key.epochs), part);
        let follows = self.note_end(&here, &next);
        let taken = self.take(&here, &stamps);
        if taken.is_none() && !follows {
            return admit(opts, 0);
        }
        let kept = (taken.iter().flat_map(|r| &r.holds))
            .map(ScratchHold::bytes)
            .sum();
        let mut admitted = match admit(opts, kept) {
            Ok(a) => a,
            Err(refused) => {
                // Kept for the job's retry (a `busy` pass), as if never taken.
                if let Some(r) = taken {
                    self.put_back(here, r);
                }
                return Err(refused);
            }
        };
        let (piles, mut held) = taken.map_or((None, Vec::new()), |r| (Some(r.piles), r.holds));
        held.push(admitted.take_scratch());
        let holds: Holds = Arc::new(Mutex::new(held));
        let ticket = self.expect(&next);
        let (me, h) = (self.clone(), holds.clone());
        // Kept piles take the pass's scratch with them (the pass is over but for its
        // report); a pass that does not roll keeps it until it ends.
        let keep: crate::modes::KeepRolled = Box::new(move |outcome| {
            let held = match outcome {
                Ok(_) => std::mem::take(&mut *h.lock().unwrap_or_else(|p| p.into_inner())),
                Err(_) => Vec::new(),
            };
            me.arrive(ticket, next, outcome, held, stamps);
        });
        opts.roll = Some(Roll::new(piles, Some(keep)));
        admitted.hold_rolled(holds);
        Ok(admitted)
    }

    /// The piles kept for `key`, rolled from files that are still as `stamps` says,
    /// taken with their scratch; waits up to [`PENDING_WAIT`] for a pass about to hand
    /// them over. Piles of files that changed are dropped.
    fn take(&self, key: &RollKey, stamps: &[Stamp]) -> Option<Box<Ready>> {
        let until = Instant::now() + PENDING_WAIT;
        let mut gone = Vec::new();
        let mut g = self.lock();
        let got = loop {
            let ready = g
                .slots
                .iter()
                .position(|(k, s)| k == key && matches!(s, Slot::Ready(_)));
            if let Some(i) = ready {
                let Slot::Ready(r) = g.slots.remove(i).1 else {
                    break None;
                };
                if r.stamps != stamps {
                    g.stale += 1;
                    eprintln!(
                        "riffle serve: dataset '{}' changed since its epoch {} piles were \
                         rolled: dropped, the pass reads the files again",
                        key.job.dataset,
                        r.piles.epoch()
                    );
                    gone.push(r);
                    continue;
                }
                g.taken += 1;
                break Some(r);
            }
            let pending = (g.slots.iter()).any(|(k, s)| k == key && matches!(s, Slot::Pending(_)));
            let now = Instant::now();
            if !pending || now >= until {
                break None;
            }
            g = (self.changed.wait_timeout(g, until - now))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        drop(g);
        drop(gone);
        got
    }

    /// Keeps `r`, taken for `key` by a pass that was then refused, as it was (its age
    /// and scratch), no longer counted as taken; unless newer piles of the key came
    /// meanwhile.
    fn put_back(&self, key: RollKey, r: Box<Ready>) {
        let mut g = self.lock();
        g.taken = g.taken.saturating_sub(1);
        let newer = (g.slots.iter()).any(|(k, s)| k == &key && matches!(s, Slot::Ready(_)));
        let gone = match newer {
            true => Some(r),
            false => {
                g.slots.push((key, Slot::Ready(r)));
                None
            }
        };
        drop(g);
        self.changed.notify_all();
        // Files removed and scratch given back outside the lock.
        drop(gone);
    }

    /// Whether a pass of the job ended where `here` starts; remembers that this one ends
    /// at `next`.
    fn note_end(&self, here: &RollKey, next: &RollKey) -> bool {
        let mut g = self.lock();
        let follows = g.ends.contains(here);
        g.ends.retain(|k| k != next);
        if g.ends.len() >= ENDS_KEPT {
            g.ends.pop_front();
        }
        g.ends.push_back(next.clone());
        follows
    }

    /// Says a pass will hand over piles for `key`: its ticket.
    fn expect(&self, key: &RollKey) -> u64 {
        let mut g = self.lock();
        g.tickets += 1;
        let t = g.tickets;
        g.slots.push((key.clone(), Slot::Pending(t)));
        t
    }

    /// What the pass of `ticket` rolled for `key`: kept (in the place of older piles of
    /// the key), or why there is none.
    fn arrive(
        &self,
        ticket: u64,
        key: RollKey,
        outcome: Result<RolledPiles, String>,
        holds: Vec<ScratchHold>,
        stamps: Vec<Stamp>,
    ) {
        let mut gone = Vec::new();
        let mut g = self.lock();
        g.slots
            .retain(|(_, s)| !matches!(s, Slot::Pending(t) if *t == ticket));
        match outcome {
            Ok(piles) => {
                // Written: other processes see them in the free space, not as a claim.
                let mut holds = holds;
                holds.iter_mut().for_each(ScratchHold::written);
                let (i, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut g.slots)
                    .into_iter()
                    .partition(|(k, s)| k == &key && matches!(s, Slot::Ready(_)));
                g.slots = rest;
                gone.extend(i);
                eprintln!(
                    "riffle serve: job over '{}' (seed {}): epoch {}'s piles rolled ({}), \
                     kept up to {} s for its next pass",
                    key.job.dataset,
                    key.job.seed,
                    piles.epoch(),
                    human_bytes(piles.bytes() as f64),
                    self.keep_for.as_secs()
                );
                g.kept += 1;
                let ready = Ready {
                    piles,
                    holds,
                    stamps,
                    since: Instant::now(),
                };
                g.slots.push((key, Slot::Ready(Box::new(ready))));
            }
            Err(why) => {
                eprintln!(
                    "riffle serve: job over '{}' (seed {}): epoch {} not rolled for a next \
                     pass: {why}",
                    key.job.dataset, key.job.seed, key.job.first_epoch
                );
                g.not_rolled += 1;
                g.last_not_rolled = Some(why);
                drop(holds);
            }
        }
        drop(g);
        self.changed.notify_all();
        drop(gone);
    }

    /// Drops the kept piles unused for `--keep-rolled`.
    pub(super) fn expire(&self) {
        let keep_for = self.keep_for;
        let gone = self.drop_where(|r| r.since.elapsed() >= keep_for, u64::MAX);
        self.lock().expired += gone;
    }

    /// Drops kept piles, oldest first, until `need` bytes of scratch were given back (or
    /// none is left): whether any went.
    pub(super) fn evict(&self, need: u64) -> bool {
        let gone = self.drop_where(|_| true, need);
        self.lock().evicted += gone;
        if gone > 0 {
            eprintln!("riffle serve: {gone} kept rolled pile set(s) dropped for a pass's scratch");
        }
        gone > 0
    }

    /// Drops every kept pile set (the daemon stops).
    pub(super) fn clear(&self) {
        self.drop_where(|_| true, u64::MAX);
    }

    /// Drops kept piles matching `which`, oldest first, until `need` bytes of their
    /// scratch went: how many sets.
    fn drop_where(&self, which: impl Fn(&Ready) -> bool, need: u64) -> u64 {
        let mut gone = Vec::new();
        {
            let mut g = self.lock();
            let mut ages: Vec<(Instant, usize)> = (g.slots.iter().enumerate())
                .filter_map(|(i, (_, s))| match s {
                    Slot::Ready(r) if which(r) => Some((r.since, i)),
                    _ => None,
                })
                .collect();
            ages.sort();
            let mut freed = 0u64;
            let mut out: Vec<usize> = Vec::new();
            for (_, i) in ages {
                if freed >= need {
                    break;
                }
                if let (_, Slot::Ready(r)) = &g.slots[i] {
                    freed += r.holds.iter().map(ScratchHold::bytes).sum::<u64>().max(1);
                }
                out.push(i);
            }
            out.sort_unstable_by(|a, b| b.cmp(a));
            for i in out {
                gone.push(g.slots.remove(i));
            }
        }
        let n = gone.len() as u64;
        // Files removed and scratch given back outside the lock.
        drop(gone);
        if n > 0 {
            self.changed.notify_all();
        }
        n
    }

    /// For stats.
    pub(super) fn json(&self) -> serde_json::Value {
        let g = self.lock();
        let ready: Vec<&Ready> = (g.slots.iter())
            .filter_map(|(_, s)| match s {
                Slot::Ready(r) => Some(&**r),
                _ => None,
            })
            .collect();
        let kept: Vec<serde_json::Value> = (g.slots.iter())
            .filter_map(|(k, s)| match s {
                Slot::Ready(r) => Some(json!({
                    "dataset": k.job.dataset,
                    "seed": k.job.seed,
                    "epoch": r.piles.epoch(),
                    "bytes": r.piles.bytes(),
                    "scratch_reserved": r.holds.iter().map(ScratchHold::bytes).sum::<u64>(),
                    "age_s": r.since.elapsed().as_secs_f64(),
                })),
                _ => None,
            })
            .collect();
        json!({
            "keep_s": self.keep_for.as_secs(),
            "kept_now": ready.len(),
            "kept_bytes": ready.iter().map(|r| r.piles.bytes()).sum::<u64>(),
            "pending": g.slots.len() - ready.len(),
            "kept_total": g.kept,
            "rolled_passes": g.taken,
            "expired": g.expired,
            "evicted": g.evicted,
            "stale": g.stale,
            "not_rolled": g.not_rolled,
            "last_not_rolled": g.last_not_rolled,
            "kept": kept,
        })
    }
}
