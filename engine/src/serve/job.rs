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

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde_json::json;

use crate::modes::{self, BatchStream, Mode, PayloadLender, ReadOptions, SharedPass};
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
    pub(super) tail: Tail,
    pub(super) grouping: Grouping,
    /// Where the job starts again: (epoch, batch).
    pub(super) resume: Option<(u64, u64)>,
    /// A global resume point inside a round of batches (see `ReadOptions::resume_start`).
    pub(super) resume_start: Option<u64>,
    /// The mode that runs: [`Mode::TwoPass`] or [`Mode::Lirs`].
    pub(super) mode: Mode,
}

impl JobKey {
    /// Whether the job's pass reads through piles.
    fn two_pass(&self) -> bool {
        self.mode == Mode::TwoPass
    }
}

/// Admits a new pass: sets its memory in the options, returns what it holds until it ends
/// (or why it cannot be admitted).
pub(super) type Admit<'a> =
    dyn Fn(&mut ReadOptions) -> std::result::Result<Box<dyn Send>, super::open::Refusal> + 'a;

/// What a new pass of a job takes from the daemon: how long a LIRS pass waits for its
/// world, its admission (memory and scratch: it sets the pass's memory in the options it
/// is given and returns what is held until the pass ends), and what to do with the pass's
/// report when it has ended.
pub(super) struct NewPass<'a> {
    pub(super) window: Duration,
    pub(super) admit: &'a Admit<'a>,
    pub(super) ended: Box<dyn FnOnce(modes::ReadReport) + Send>,
}

/// A live job: its pass, and what stats say about it.
struct Job {
    pass: Weak<SharedPass>,
    id: u64,
}

/// The daemon's live jobs.
#[derive(Default)]
pub(super) struct Jobs {
    map: Mutex<HashMap<JobKey, Job>>,
    next_id: std::sync::atomic::AtomicU64,
}

/// Batches a rank's stream holds before the shared pass waits for it (besides the
/// batches in its ring, which its credits bound).
const PER_RANK: usize = 2;

impl Jobs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<JobKey, Job>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rank `rank`'s stream from job `key`'s live pass, if it can join it: (stream, job id,
    /// false).
    fn join(
        &self,
        key: &JobKey,
        rank: u64,
        lender: &Option<PayloadLender>,
    ) -> Option<(BatchStream, u64, bool)> {
        let mut jobs = self.lock();
        jobs.retain(|_, j| j.pass.strong_count() > 0);
        Self::join_in(&jobs, key, rank, lender)
    }

    fn join_in(
        jobs: &HashMap<JobKey, Job>,
        key: &JobKey,
        rank: u64,
        lender: &Option<PayloadLender>,
    ) -> Option<(BatchStream, u64, bool)> {
        let j = jobs.get(key)?;
        let s = j.pass.upgrade()?.join(rank, lender.clone())?;
        Some((s, j.id, false))
    }

    /// The stream of rank `opts.rank` of job `key`: from the job's pass when it can join
    /// it, else from a new pass of the job (which then stands for the job). Returns the
    /// stream, the job's id and whether the pass was new.
    pub(super) fn open(
        &self,
        key: JobKey,
        opts: &ReadOptions,
        src: &Source,
        root: PathBuf,
        lender: Option<PayloadLender>,
        new_pass: NewPass<'_>,
    ) -> std::result::Result<(BatchStream, u64, bool), (&'static str, String)> {
        if let Some(joined) = self.join(&key, opts.rank, &lender) {
            return Ok(joined);
        }
        // LIRS decides each batch as it plans it, so the pass waits a moment for the
        // world's other ranks; two-pass decides only after its scatter, unless LIRS leads
        // it (then as LIRS does).
        let window = if key.two_pass() && !opts.lead {
            Duration::ZERO
        } else {
            new_pass.window
        };
        // What the pass was admitted with is held until it ends.
        // Admission may wait for memory: not under the lock, so other jobs go on.
        let mut opts = opts.clone();
        let held = (new_pass.admit)(&mut opts)?;
        let mut jobs = self.lock();
        // Another rank of the job may have started its pass meanwhile: join that one.
        if let Some(joined) = Self::join_in(&jobs, &key, opts.rank, &lender) {
            return Ok(joined);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (src, two_pass) = (src.clone(), key.two_pass());
        let start: modes::StartPass = Box::new(move |all| src.read(all, two_pass.then_some(root)));
        let on_end = new_pass.ended;
        let ended: modes::PassEnded = Box::new(move |r| {
            drop(held);
            on_end(r);
        });
        let pass = SharedPass::spawn(&opts, window, PER_RANK, start, ended)
            .map_err(|e| (super::codes::reply_code(&e), e.to_string()))?;
        let stream = pass
            .join(opts.rank, lender)
            .expect("a new pass takes any rank of its world");
        jobs.insert(
            key,
            Job {
                pass: Arc::downgrade(&pass),
                id,
            },
        );
        Ok((stream, id, true))
    }

    /// The live jobs, for stats.
    pub(super) fn json(&self) -> Vec<serde_json::Value> {
        self.lock()
            .iter()
            .filter_map(|(k, j)| {
                let pass = j.pass.upgrade()?;
                Some(json!({
                    "id": j.id,
                    "dataset": k.dataset,
                    "seed": k.seed,
                    "batch_size": k.batch,
                    "world": k.world,
                    "mode": k.mode.name(),
                    "ranks_joined": pass.ranks().joined(),
                }))
            })
            .collect()
    }
}
