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

use serde_json::json;

use super::server::{ServeMode, Shared};
use crate::dataset::Dataset;
use crate::modes::{self, BatchStream, ReadOptions, SharedPass};

/// What makes two streams ranks of the same job.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct JobKey {
    pub(super) dataset: String,
    pub(super) seed: u64,
    pub(super) first_epoch: u64,
    pub(super) epochs: u64,
    pub(super) batch: u64,
    pub(super) world: u64,
    pub(super) tail: String,
    pub(super) grouping: String,
    pub(super) resume: Option<(u64, u64)>,
    pub(super) mode: ServeMode,
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

    /// The stream of rank `opts.rank` of job `key`: from the job's pass when it can join
    /// it, else from a new pass of the job (which then stands for the job). Returns the
    /// stream, the job's id and whether the pass was new.
    pub(super) fn open(
        &self,
        shared: &Arc<Shared>,
        key: JobKey,
        opts: &ReadOptions,
        ds: &Arc<Dataset>,
        root: PathBuf,
    ) -> std::result::Result<(BatchStream, u64, bool), (&'static str, String)> {
        let mut jobs = self.lock();
        jobs.retain(|_, j| j.pass.strong_count() > 0);
        if let Some(j) = jobs.get(&key) {
            if let Some(pass) = j.pass.upgrade() {
                if let Some(s) = pass.join(opts.rank) {
                    return Ok((s, j.id, false));
                }
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        // LIRS decides each batch as it plans it, so the pass waits a moment for the
        // world's other ranks; two-pass decides only after its scatter.
        let window = match key.mode {
            ServeMode::TwoPass => std::time::Duration::ZERO,
            _ => shared.cfg.join_window,
        };
        // The pass's memory, held until it ends.
        let mut opts = opts.clone();
        let grant =
            super::budget::admit_pass(shared, ds, &mut opts, key.mode == ServeMode::TwoPass)
                .map_err(|m| ("busy", m))?;
        let (ds2, mode) = (ds.clone(), key.mode);
        let start: modes::StartPass = Box::new(move |all| match mode {
            ServeMode::TwoPass => modes::read_two_pass(ds2, all, root),
            _ => modes::read(ds2, all),
        });
        let sh = shared.clone();
        let ended: modes::PassEnded = Box::new(move |r| {
            drop(grant);
            let mut s = sh.stats();
            s.read_ops += r.read_ops;
            s.jobs_now = s.jobs_now.saturating_sub(1);
        });
        let pass = SharedPass::spawn(&opts, window, PER_RANK, start, ended)
            .map_err(|e| ("engine", e.to_string()))?;
        {
            let mut s = shared.stats();
            s.jobs_total += 1;
            s.jobs_now += 1;
        }
        let stream = pass
            .join(opts.rank)
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
                    "mode": match k.mode {
                        ServeMode::TwoPass => "two-pass",
                        _ => "lirs",
                    },
                    "ranks_joined": pass.ranks().joined(),
                }))
            })
            .collect()
    }
}
