//! The daemon's state shared by its threads: what it was started with (`ServeConfig`),
//! its counters (`Stats`), its jobs, budgets and telemetry (`Shared`).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::json;

use crate::source::Source;

/// How the daemon reads datasets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServeMode {
    /// Random reads (LIRS).
    Lirs,
    /// Sequential two-pass (scratch piles per stream).
    TwoPass,
    /// The planner's choice for each stream (its batch size, epochs and the dataset's
    /// device, from the cached profile); LIRS when no profile of the device is cached.
    Auto,
    /// Every dataset held in memory, one copy shared by all its streams, when it fits
    /// (`held.rs`); else LIRS.
    Resident,
}

/// What `riffle serve` was started with.
pub struct ServeConfig {
    /// The socket's path.
    pub socket: PathBuf,
    /// Permission bits of the socket file (0o600 by default).
    pub socket_mode: u32,
    /// The process runs under an I/O throttle (`IoConfig::throttled`): set by the caller
    /// that entered it.
    pub throttled: bool,
    /// The datasets clients may ask for, by name.
    pub datasets: Vec<(String, Source)>,
    /// The daemon's memory: the datasets' indexes, every stream's ring (each at most this /
    /// `max_clients`) and every engine pass (tables, buffers, read-ahead, piles).
    pub memory: u64,
    /// Connections served at once; more are refused with a `busy` error.
    pub max_clients: usize,
    /// The read mode.
    pub mode: ServeMode,
    /// Two-pass: where the piles go.
    pub scratch: Option<PathBuf>,
    /// Two-pass: the most scratch all passes together may plan for (`None`: no limit
    /// besides the free space, which each pass checks).
    pub scratch_limit: Option<u64>,
    /// How long a connection may leave the daemon waiting on it (no stream open, or a
    /// stream stalled until the client acknowledges) before it is closed with a `timeout`
    /// error; `None`: no limit.
    pub idle_timeout: Option<Duration>,
    /// Reads in flight per stream.
    pub queue_depth: usize,
    /// How long an OPEN waits for room in `memory` (for its ring and its pass) before it
    /// is refused with `busy`.
    pub admit_wait: Duration,
    /// How long a new LIRS job's pass waits for the other ranks of its world before it
    /// starts (ranks that come later start a pass of their own).
    pub join_window: Duration,
    /// How long a job's shared pass waits, from its start, for the streams its OPENs say
    /// this node will open (`streams`) before it decides its first batch.
    pub join_deadline: Duration,
    /// Whether two-pass streams lead with LIRS (see [`crate::modes::ReadOptions::lead`]);
    /// a device that seeks is never led.
    pub lead: bool,
    /// Whether an OPEN may name a dataset by its absolute path (or a mixture of such),
    /// opened on first use (`catalog.rs`).
    pub open_paths: bool,
    /// The local disk each `s3://` dataset opened by path may use (`--cache-limit`): staged
    /// whole when it fits, else streamed through two-pass piles within it; `None`: staged
    /// whole, unbounded.
    pub cache_limit: Option<u64>,
    /// Run on each dataset opened by path before it is served.
    pub on_open: Option<super::catalog::OnOpen>,
    /// Whether only processes of the daemon's own user may connect (`SO_PEERCRED`).
    pub owner_only: bool,
    /// The daemon exits once it has had no connection for this long (`None`: never),
    /// removing its socket and scratch.
    pub exit_idle: Option<Duration>,
    /// The lock its starters take while they look for a daemon and start one: held while
    /// the daemon leaves for idleness, so none of them finds a socket that is about to go.
    pub start_lock: Option<PathBuf>,
    /// How long piles a two-pass pass rolled past its last epoch wait for the job's next
    /// pass (`--keep-rolled`); zero: no pass rolls past its end (`rolled.rs`).
    pub keep_rolled: Duration,
}

pub(super) struct Shared {
    pub(super) cfg: ServeConfig,
    /// The datasets served: started with, and opened by path.
    pub(super) catalog: super::catalog::Catalog,
    pub(super) stopping: AtomicBool,
    /// The accept loop's wake-up pipe (read end, write end).
    pub(super) wake: (OwnedFd, OwnedFd),
    /// Every live connection's socket (as its thread writes it), to end them at shutdown.
    pub(super) conns: Mutex<HashMap<u64, Arc<super::wire::Wire>>>,
    pub(super) stats: Mutex<Stats>,
    pub(super) ring_bytes_now: AtomicU64,
    /// The jobs whose ranks share a pass.
    pub(super) jobs: super::job::Jobs,
    /// The datasets held resident.
    pub(super) residents: super::held::Residents,
    /// `--memory`: indexes, rings and passes.
    pub(super) budget: Arc<super::budget::Budget>,
    /// Every live stream's waits.
    pub(super) telemetry: super::telemetry::Telemetry,
    /// The last stream id handed out.
    pub(super) next_stream: AtomicU64,
    /// `--scratch-limit`: two-pass piles, when set.
    pub(super) scratch_budget: Option<Arc<super::budget::Budget>>,
    /// Two-pass piles' reservations of the scratch filesystems' free space.
    pub(super) space: Arc<super::space::ScratchSpace>,
    /// The open files (`ulimit -n`): passes take their dataset files and their own from
    /// it; what the daemon holds itself and what connections and rings may hold are set
    /// aside.
    pub(super) files: Arc<super::budget::Budget>,
    /// Piles rolled past a pass's last epoch, kept for its job's next pass.
    pub(super) rolled: Arc<super::rolled::Rolled>,
}

pub(super) struct Stats {
    pub(super) started: Instant,
    pub(super) connections_total: u64,
    pub(super) refused_busy: u64,
    /// Connections of another user refused (`owner_only`).
    pub(super) refused_strangers: u64,
    pub(super) streams_total: u64,
    pub(super) streams_now: u64,
    pub(super) batches: u64,
    /// Shared-memory batches the engine assembled in the ring itself (no copy).
    pub(super) batches_in_place: u64,
    /// Of those, the ones announced from the engine's thread as they completed.
    pub(super) batches_announced_early: u64,
    pub(super) records: u64,
    pub(super) bytes: u64,
    pub(super) read_ops: u64,
    /// Bytes the passes that ended read from the device.
    pub(super) device_bytes: u64,
    /// Shared passes started, and running now.
    pub(super) jobs_total: u64,
    pub(super) jobs_now: u64,
    /// Streams served by a shared pass, and by a pass of their own.
    pub(super) streams_shared: u64,
    pub(super) streams_own: u64,
    /// Streams that came after their job's pass began emitting (served by a new pass).
    pub(super) late_streams: u64,
    pub(super) errors: HashMap<String, u64>,
    /// Panics of riffle threads counted before this daemon started (`errors.panic` counts
    /// those since).
    pub(super) panics_before: u64,
    /// Per batch: from the connection thread asking the engine for it to its notification
    /// written, or to the batch reaching the connection thread when the engine's thread
    /// announced it (us).
    pub(super) batch_us: Histogram<u64>,
    /// Per batch: from the ring write's start (the arrays, when the engine assembled it in
    /// the ring) to the notification written (us).
    pub(super) send_us: Histogram<u64>,
    /// Passes over a dataset streamed from object storage: the most local disk one charged
    /// at once, and the last one's GETs and bytes per object and epoch.
    pub(super) streamed: (Option<u64>, Vec<crate::dataset::ObjectCount>),
}

impl Stats {
    /// Counts what a pass (or a stream of its own) that ended read.
    pub(super) fn count_pass(&mut self, r: &crate::modes::ReadReport) {
        self.read_ops += r.read_ops;
        self.device_bytes += r.device_bytes;
        self.streamed.0 = self.streamed.0.max(r.peak_local_bytes);
        if !r.objects.is_empty() {
            self.streamed.1 = r.objects.clone();
        }
    }

    /// Counts a batch announced (`in_place`: assembled in the ring by the engine).
    pub(super) fn count_batch(&mut self, h: &super::proto::BatchHeader, in_place: bool) {
        self.batches += 1;
        self.batches_in_place += in_place as u64;
        self.records += h.records;
        self.bytes += h.data_len;
    }
}

impl Shared {
    pub(super) fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The budgets a pass's admission takes from.
    pub(super) fn budgets(&self) -> super::budget::Budgets<'_> {
        super::budget::Budgets {
            memory: &self.budget,
            scratch: self.scratch_budget.as_ref(),
            space: &self.space,
            files: &self.files,
            clients: self.cfg.max_clients as u64,
            wait: self.cfg.admit_wait,
            stopping: &self.stopping,
        }
    }

    pub(super) fn ring_share(&self) -> u64 {
        (self.cfg.memory / self.cfg.max_clients as u64).max(64 * 1024)
    }

    pub(super) fn stats_json(&self) -> serde_json::Value {
        let (streams, job_waits) = self.telemetry.json();
        let s = self.stats();
        let secs = s.started.elapsed().as_secs_f64();
        let pct = |h: &Histogram<u64>| {
            json!({
                "p50": h.value_at_quantile(0.5),
                "p99": h.value_at_quantile(0.99),
                "max": h.max(),
            })
        };
        // Panics of the engine's threads are counted where they happen (a hook).
        let mut errors = s.errors.clone();
        let panics = super::server::panics().saturating_sub(s.panics_before);
        if panics > 0 {
            errors.insert("panic".into(), panics);
        }
        let mut v = json!({
            "uptime_s": secs,
            "clients": self.conns.lock().unwrap_or_else(|p| p.into_inner()).len(),
            "connections_total": s.connections_total,
            "refused_busy": s.refused_busy,
            "refused_strangers": s.refused_strangers,
            "streams_now": s.streams_now,
            "streams_total": s.streams_total,
            "batches": s.batches,
            "batches_in_place": s.batches_in_place,
            "batches_announced_early": s.batches_announced_early,
            "records": s.records,
            "bytes": s.bytes,
            "read_ops": s.read_ops,
            "device_bytes": s.device_bytes,
            "resident": self.residents.json(self),
            "jobs_total": s.jobs_total,
            "jobs_now": s.jobs_now,
            "streams_shared": s.streams_shared,
            "streams_own": s.streams_own,
            "late_streams": s.late_streams,
            "jobs": self.jobs.json(),
            "stream_waits": streams,
            "job_waits": job_waits,
            "iops": s.read_ops as f64 / secs.max(1e-9),
            "records_per_s": s.records as f64 / secs.max(1e-9),
            "bytes_per_s": s.bytes as f64 / secs.max(1e-9),
            "batch_latency_us": pct(&s.batch_us),
            "send_latency_us": pct(&s.send_us),
            "ring_bytes": self.ring_bytes_now.load(Ordering::Relaxed),
            "ring_bytes_limit": self.ring_share() * self.cfg.max_clients as u64,
            "ring_share": self.ring_share(),
            "memory_used": self.budget.used(),
            "memory_limit": self.budget.total(),
            "scratch_planned": self.scratch_budget.as_ref().map(|b| b.used()),
            "scratch_limit": self.scratch_budget.as_ref().map(|b| b.total()),
            "errors": errors,
            "datasets": self.catalog.all().iter().map(|(n, d)| {
                let mut v = json!({"name": n, "records": d.len()});
                // A mixture's composition: every epoch the same counts per source.
                if let Some(m) = d.mixture() {
                    v["mixture"] = m.names.iter().zip(&m.counts).enumerate().map(|(i, (name, c))| json!({
                        "name": name,
                        "records": m.starts[i + 1] - m.starts[i],
                        "per_epoch": c,
                    })).collect::<Vec<_>>().into();
                }
                v
            }).collect::<Vec<_>>(),
        });
        v["rolled"] = self.rolled.json();
        v["streamed"] = json!({
            "peak_local_bytes": s.streamed.0,
            "last_pass_objects": s.streamed.1,
        });
        v
    }
}
