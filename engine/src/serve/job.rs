//! Jobs: the streams of one training job share one engine pass.
//!
//! Streams whose OPEN asks for the same job (dataset, seed, epochs, batch size, grouping,
//! world, tail, resume point, mode) and a world of more than one rank are served by one
//! [`SharedPass`]: one LIRS walk reading only the batches of the ranks that joined, or one
//! two-pass scatter and pile pass, fanned out to each stream. A rank that cannot join the
//! job's pass (it comes after the pass decided its first batch, or its rank is already
//! served: the job was started again) starts a new pass of the same job, which later
//! ranks then join; it is never refused. A stream of a world of one has a pass of its own
//! (it assembles batches straight in its ring).
//!
//! An OPEN may say how many streams of its job this node will open (`streams`): the
//! job's pass then waits for them before its first decision, up to `--join-deadline`
//! from its start (see [`crate::modes::Joining`]), so ranks that arrive seconds apart
//! share one read of the dataset. A stream that still comes after its job's pass began
//! emitting, or after it ended without that rank ever joining any of its passes (the last
//! [`ENDED_KEPT`] ended passes are remembered), is *late*: served by the rule above, a
//! new pass of the job, which reads the dataset again and does not wait for `streams`.
//! It is counted (`late_streams`, in all, and on the missed job while it is listed) and
//! logged. A rank that comes back after the job's passes ended, having joined one of them, is
//! the job started again, not late.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde_json::json;

use crate::modes::{
    self, BatchStream, Joining, Mode, PayloadLender, Ranks, ReadOptions, Refused, SharedPass,
};
use crate::order::{Grouping, Tail};
use crate::source::Source;

/// What makes two streams ranks of the same job.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct JobKey {
    pub(super) dataset: String,
    pub(super) seed: u64,
    pub(super) first_epoch: u64,
    pub(super) epochs: u64,
    pub(super) batch: u64,
    pub(super) world: u64,
    /// Streams of each rank (DataLoader workers): the tail rule is the ranks'.
    pub(super) workers: u64,
    pub(super) tail: Tail,
    pub(super) grouping: Grouping,
    /// Where the job starts again: (epoch, batch).
    pub(super) resume: Option<(u64, u64)>,
    /// A global resume point inside a round of batches (see `ReadOptions::resume_start`).
    pub(super) resume_start: Option<u64>,
    /// The mode that runs: [`Mode::TwoPass`], [`Mode::Lirs`] or [`Mode::Resident`] (out of
    /// the dataset's held copy).
    pub(super) mode: Mode,
    /// Resident out of a copy of the files' first bytes: the rest goes through piles.
    pub(super) piled: bool,
}

impl JobKey {
    /// Whether the job's pass reads through piles.
    pub(super) fn two_pass(&self) -> bool {
        self.mode == Mode::TwoPass || self.piled
    }
}

/// Admits a new pass: sets its memory in the options, returns what it holds until it ends
/// (or why it cannot be admitted).
pub(super) type Admit<'a> =
    dyn Fn(&mut ReadOptions) -> std::result::Result<Box<dyn Send>, super::open::Refusal> + 'a;

/// What a new pass of a job takes from the daemon: how long a LIRS pass waits for its
/// world, how long any pass waits for the streams the job expects (and how many this
/// OPEN says), its admission (memory and scratch: it sets the pass's memory in the options
/// it is given and returns what is held until the pass ends), and what to do with the
/// pass's report when it has ended.
pub(super) struct NewPass<'a> {
    pub(super) window: Duration,
    pub(super) deadline: Duration,
    pub(super) streams: Option<u64>,
    pub(super) admit: &'a Admit<'a>,
    pub(super) ended: Box<dyn FnOnce(modes::ReadReport) + Send>,
}

/// A live job: its pass, and what stats say about it.
struct Job {
    pass: Weak<SharedPass>,
    /// Its ranks, which outlive the pass (who joined it).
    ranks: Arc<Ranks>,
    id: u64,
    /// Streams that came after this pass began emitting (each served by a newer pass).
    late: u64,
    /// The job whose late stream started this pass.
    late_for: Option<u64>,
}

/// A job's pass that has ended: who joined it.
struct Ended {
    key: JobKey,
    id: u64,
    ranks: Arc<Ranks>,
}

/// Ended passes remembered, to tell a late rank (it never joined the job's last pass)
/// from the job started again (its ranks come back).
const ENDED_KEPT: usize = 256;

/// The daemon's jobs: per key, its live passes, the newest (the one ranks join) last; and
/// the passes that ended most recently, oldest first.
#[derive(Default)]
struct Table {
    live: HashMap<JobKey, Vec<Job>>,
    ended: VecDeque<Ended>,
    /// Jobs whose new pass an OPEN is admitting (outside the lock): another OPEN of the
    /// job waits for it and joins it, rather than starting a second pass (which also took
    /// the job's rolled piles from the first: `rolled.rs`).
    starting: std::collections::HashSet<JobKey>,
}

impl Table {
    /// Moves the passes that have ended from `live` to `ended`.
    fn prune(&mut self) {
        let ended = &mut self.ended;
        self.live.retain(|key, passes| {
            passes.retain(|j| {
                if j.pass.strong_count() > 0 {
                    return true;
                }
                if ended.len() >= ENDED_KEPT {
                    ended.pop_front();
                }
                ended.push_back(Ended {
                    key: key.clone(),
                    id: j.id,
                    ranks: j.ranks.clone(),
                });
                false
            });
            !passes.is_empty()
        });
    }

    /// The pass of job `key` a stream of `rank` came late for, refused by the job's live
    /// pass for `why` (`None`: the job has no live pass), and whether that pass is live: a
    /// live pass that had begun emitting, or, when the job's passes have ended, the last
    /// one, if `rank` joined none of them (a rank that did is the job started again).
    fn late_for(&self, key: &JobKey, rank: u64, why: Option<Refused>) -> Option<(u64, bool)> {
        match why {
            Some(Refused::Late) => Some((self.live.get(key)?.last()?.id, true)),
            Some(Refused::Taken) => None,
            Some(Refused::Ended) | None => {
                let live = self.live.get(key).into_iter().flatten();
                let ended = self.ended.iter().filter(|e| &e.key == key);
                let passes: Vec<(u64, &Arc<Ranks>)> = (ended.map(|e| (e.id, &e.ranks)))
                    .chain(live.map(|j| (j.id, &j.ranks)))
                    .collect();
                if passes.iter().any(|(_, r)| r.has_seen(rank)) {
                    return None;
                }
                passes.iter().map(|p| p.0).max().map(|id| (id, false))
            }
        }
    }
}

/// The daemon's live jobs, and those that ended lately.
#[derive(Default)]
pub(super) struct Jobs {
    table: Mutex<Table>,
    next_id: std::sync::atomic::AtomicU64,
    /// Signalled when a job's pass has started (or failed to): see `Table::starting`.
    started: std::sync::Condvar,
}

/// A job's new pass being started by this OPEN: given up when dropped.
struct Starting<'a>(&'a Jobs, JobKey);

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        self.0.lock().starting.remove(&self.1);
        self.0.started.notify_all();
    }
}

/// What a stream got from [`Jobs::open`]: its batches, its job's id, whether the job's
/// pass is new, and whether the stream came late to the job's earlier pass.
pub(super) struct Opened {
    pub(super) stream: BatchStream,
    pub(super) id: u64,
    pub(super) new: bool,
    pub(super) late: bool,
}

/// Batches a rank's stream holds before the shared pass waits for it (besides the
/// batches in its ring, which its credits bound).
const PER_RANK: usize = 2;

impl Jobs {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rank `rank`'s stream from job `key`'s newest live pass, if it can join it; else
    /// why not (`None`: the job has no live pass).
    fn join_in(
        jobs: &mut HashMap<JobKey, Vec<Job>>,
        key: &JobKey,
        rank: u64,
        lender: &Option<PayloadLender>,
        streams: Option<u64>,
    ) -> Result<Opened, Option<Refused>> {
        let j = jobs.get_mut(key).and_then(|p| p.last_mut()).ok_or(None)?;
        let pass = j.pass.upgrade().ok_or(None)?;
        let stream = pass.join(rank, lender.clone(), streams).map_err(Some)?;
        Ok(Opened {
            stream,
            id: j.id,
            new: false,
            late: false,
        })
    }

    /// The stream of rank `opts.rank` of job `key`: from the job's pass when it can join
    /// it, else from a new pass of the job (which then stands for the job). A stream
    /// refused because the pass began emitting before it came is late: counted on the
    /// job it missed, logged, and served by the new pass. A resident job's pass reads out
    /// of `resident`, the dataset's copy.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn open(
        &self,
        key: JobKey,
        opts: &ReadOptions,
        src: &Source,
        root: PathBuf,
        resident: Option<Arc<super::held::HeldCopy>>,
        lender: Option<PayloadLender>,
        new_pass: NewPass<'_>,
    ) -> std::result::Result<Opened, (&'static str, String)> {
        let streams = new_pass.streams;
        let late = {
            let mut jobs = self.lock();
            loop {
                jobs.prune();
                match Self::join_in(&mut jobs.live, &key, opts.rank, &lender, streams) {
                    Ok(joined) => return Ok(joined),
                    // Another OPEN is starting the job's pass: join that one.
                    Err(_) if jobs.starting.contains(&key) => {
                        let wait = self.started.wait_timeout(jobs, Duration::from_millis(100));
                        jobs = wait.unwrap_or_else(|p| p.into_inner()).0;
                    }
                    Err(why) => {
                        jobs.starting.insert(key.clone());
                        break jobs.late_for(&key, opts.rank, why).is_some();
                    }
                }
            }
        };
        let _starting = Starting(self, key.clone());
        // LIRS decides each batch as it plans it, so the pass waits a moment for the
        // world's other ranks (or, when the job says its streams, for those); two-pass
        // decides only after its scatter, unless LIRS leads it (then as LIRS does), and
        // waits for the streams the job says at its first decision.
        let lirs_like = !key.two_pass() || opts.lead;
        // A late stream's pass waits as without `streams`: the streams its node said are
        // served by the pass it missed.
        let streams = if late { None } else { streams };
        let joining = Joining {
            window: if lirs_like && streams.is_none() {
                new_pass.window
            } else {
                Duration::ZERO
            },
            streams,
            deadline: new_pass.deadline,
            before_start: !key.two_pass(),
        };
        // What the pass was admitted with is held until it ends.
        // Admission may wait for memory: not under the lock, so other jobs go on.
        let mut opts = opts.clone();
        let held = (new_pass.admit)(&mut opts)?;
        let mut jobs = self.lock();
        jobs.prune();
        // Another rank of the job may have started its pass meanwhile: join that one.
        let late_for = match Self::join_in(&mut jobs.live, &key, opts.rank, &lender, streams) {
            Ok(joined) => return Ok(joined),
            Err(why) => jobs.late_for(&key, opts.rank, why),
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (src, two_pass) = (src.clone(), key.two_pass());
        let start: modes::StartPass = match resident {
            Some(h) => {
                let ds = src.dataset().clone();
                Box::new(move |all| h.start(ds, all, root))
            }
            None => Box::new(move |all| src.read(all, two_pass.then_some(root))),
        };
        let on_end = new_pass.ended;
        let ended: modes::PassEnded = Box::new(move |r| {
            drop(held);
            on_end(r);
        });
        let pass = SharedPass::spawn(&opts, joining, PER_RANK, start, ended)
            .map_err(|e| (super::codes::reply_code(&e), e.to_string()))?;
        let stream = pass.join(opts.rank, lender, streams).map_err(|why| {
            (
                "engine",
                format!("a new pass of the job refused its first rank ({why:?})"),
            )
        })?;
        let passes = jobs.live.entry(key).or_default();
        if let Some((m, live)) = late_for {
            // Counted on the missed job while it is listed: its pass may have ended (every
            // batch emitted) while its streams still read, and the stats still show it.
            if let Some(j) = passes.iter_mut().find(|j| j.id == m) {
                j.late += 1;
            }
            let when = if live { "began emitting" } else { "ended" };
            eprintln!(
                "riffle serve: job {m}: rank {} came after its pass {when}; a new pass (job \
                 {id}) reads the dataset again for it",
                opts.rank
            );
        }
        passes.push(Job {
            pass: Arc::downgrade(&pass),
            ranks: pass.ranks_handle(),
            id,
            late: 0,
            late_for: late_for.map(|l| l.0),
        });
        Ok(Opened {
            stream,
            id,
            new: true,
            late: late_for.is_some(),
        })
    }

    /// The live jobs, for stats.
    pub(super) fn json(&self) -> Vec<serde_json::Value> {
        let jobs = self.lock();
        let mut out: Vec<_> = jobs
            .live
            .iter()
            .flat_map(|(k, passes)| passes.iter().map(move |j| (k, j)))
            .filter_map(|(k, j)| {
                let pass = j.pass.upgrade()?;
                let (expected, joined) = pass.ranks().streams();
                Some(json!({
                    "id": j.id,
                    "dataset": k.dataset,
                    "seed": k.seed,
                    "batch_size": k.batch,
                    "world": k.world,
                    "workers": k.workers,
                    "mode": k.mode.name(),
                    "ranks_joined": pass.ranks().joined(),
                    "streams_expected": (expected > 0).then_some(expected),
                    "streams_joined": joined,
                    "late_streams": j.late,
                    "late_for": j.late_for,
                }))
            })
            .collect();
        out.sort_by_key(|v| v["id"].as_u64());
        out
    }
}
