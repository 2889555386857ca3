//! The daemon: a Unix socket, one thread per connection (`conn.rs`), one engine stream
//! and one shared-memory ring per open stream.
//!
//! Memory is bounded whatever clients do: at most `max_clients` connections, each with at
//! most one stream, whose ring is at most `memory / max_clients` bytes, and whose engine
//! read-ahead is two batches. A client that stops acknowledging only stalls its own
//! stream: the daemon writes a batch only into ring space no unacknowledged slot covers.

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde_json::json;

use super::conn::{error_frame, Conn};
use crate::dataset::Dataset;
use crate::{Error, Result};

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
}

/// What `riffle serve` was started with.
pub struct ServeConfig {
    /// The socket's path.
    pub socket: PathBuf,
    /// Permission bits of the socket file (0o600 by default).
    pub socket_mode: u32,
    /// The datasets clients may ask for, by name.
    pub datasets: Vec<(String, Arc<Dataset>)>,
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
}

/// A bound socket, ready to [`Server::run`].
pub struct Server {
    listener: UnixListener,
    shared: Arc<Shared>,
    /// The socket file's identity (device, inode), so shutdown removes it only if the path
    /// still names this daemon's socket, not one another daemon bound there since.
    socket_id: (u64, u64),
}

/// Stops a running [`Server`] from another thread (a signal handler thread).
#[derive(Clone)]
pub struct Shutdown {
    shared: Arc<Shared>,
}

impl Shutdown {
    /// The daemon's stats, as a STATS request gets them.
    pub fn stats(&self) -> serde_json::Value {
        self.shared.stats_json()
    }

    /// Asks the server to stop: no new connections; open ones are told and closed. The
    /// accept loop is woken through a pipe of its own, whatever happened to the socket's
    /// path (removed, or taken by another daemon).
    pub fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let _ = nix::unistd::write(&self.shared.wake.1, &[1]);
    }
}

pub(super) struct Shared {
    pub(super) cfg: ServeConfig,
    pub(super) stopping: AtomicBool,
    /// The accept loop's wake-up pipe (read end, write end).
    wake: (OwnedFd, OwnedFd),
    /// A clone of every live connection's socket, to end them at shutdown.
    pub(super) conns: Mutex<HashMap<u64, UnixStream>>,
    stats: Mutex<Stats>,
    pub(super) ring_bytes_now: AtomicU64,
    /// The jobs whose ranks share a pass.
    pub(super) jobs: super::job::Jobs,
    /// `--memory`: indexes, rings and passes.
    pub(super) budget: Arc<super::budget::Budget>,
    /// Every live stream's waits.
    pub(super) telemetry: super::telemetry::Telemetry,
    /// The last stream id handed out.
    pub(super) next_stream: AtomicU64,
    /// `--scratch-limit`: two-pass piles, when set.
    pub(super) scratch_budget: Option<Arc<super::budget::Budget>>,
}

pub(super) struct Stats {
    pub(super) started: Instant,
    pub(super) connections_total: u64,
    pub(super) refused_busy: u64,
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
    /// Shared passes started, and running now.
    pub(super) jobs_total: u64,
    pub(super) jobs_now: u64,
    /// Streams served by a shared pass, and by a pass of their own.
    pub(super) streams_shared: u64,
    pub(super) streams_own: u64,
    pub(super) errors: HashMap<String, u64>,
    /// Per batch: from the connection thread asking the engine for it to its notification
    /// written, or to the batch reaching the connection thread when the engine's thread
    /// announced it (us).
    pub(super) batch_us: Histogram<u64>,
    /// Per batch: from the ring write's start (the arrays, when the engine assembled it in
    /// the ring) to the notification written (us).
    pub(super) send_us: Histogram<u64>,
}

impl Stats {
    /// Counts a batch announced (`in_place`: assembled in the ring by the engine).
    pub(super) fn count_batch(&mut self, h: &super::proto::BatchHeader, in_place: bool) {
        self.batches += 1;
        self.batches_in_place += in_place as u64;
        self.records += h.records;
        self.bytes += h.data_len;
    }
}

impl Server {
    /// Binds the socket (removing a stale one nobody listens on) with `socket_mode`.
    pub fn bind(cfg: ServeConfig) -> Result<Server> {
        if cfg.datasets.is_empty() {
            return Err(Error::Invalid("no dataset to serve".into()));
        }
        if cfg.max_clients == 0 {
            return Err(Error::Invalid("--max-clients must be at least 1".into()));
        }
        let path = &cfg.socket;
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                return Err(Error::Invalid(format!(
                    "{}: exists and is not a socket; not replacing it",
                    path.display()
                )));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(Error::Invalid(format!(
                    "{}: a daemon is already listening there",
                    path.display()
                )));
            }
            // Left behind by a daemon that died: nobody listens.
            std::fs::remove_file(path)
                .map_err(|e| Error::io(path, "remove stale socket", None, e))?;
        }
        // Created with no access for group and others, then set to the mode asked for, so
        // the socket is never more open than requested.
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
        let bound = UnixListener::bind(path);
        nix::sys::stat::umask(old);
        let listener = bound.map_err(|e| Error::io(path, "bind", None, e))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(cfg.socket_mode))
            .map_err(|e| Error::io(path, "chmod", None, e))?;
        let socket_id = std::fs::symlink_metadata(path)
            .map(|m| (m.dev(), m.ino()))
            .map_err(|e| Error::io(path, "stat", None, e))?;
        let wake = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| Error::io(path, "make the wake-up pipe", None, e.into()))?;
        let hist = || Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("histogram");
        let (cfg_memory, scratch_limit, index_bytes) = (
            cfg.memory,
            cfg.scratch_limit,
            cfg.datasets
                .iter()
                .map(|(_, d)| d.index_bytes())
                .sum::<u64>(),
        );
        Ok(Server {
            listener,
            socket_id,
            shared: Arc::new(Shared {
                cfg,
                stopping: AtomicBool::new(false),
                wake,
                conns: Mutex::new(HashMap::new()),
                stats: Mutex::new(Stats {
                    started: Instant::now(),
                    connections_total: 0,
                    refused_busy: 0,
                    streams_total: 0,
                    streams_now: 0,
                    batches: 0,
                    batches_in_place: 0,
                    batches_announced_early: 0,
                    records: 0,
                    bytes: 0,
                    read_ops: 0,
                    jobs_total: 0,
                    jobs_now: 0,
                    streams_shared: 0,
                    streams_own: 0,
                    errors: HashMap::new(),
                    batch_us: hist(),
                    send_us: hist(),
                }),
                ring_bytes_now: AtomicU64::new(0),
                jobs: Default::default(),
                telemetry: Default::default(),
                next_stream: AtomicU64::new(0),
                budget: super::budget::Budget::new(cfg_memory, index_bytes),
                scratch_budget: scratch_limit.map(|l| super::budget::Budget::new(l, 0)),
            }),
        })
    }

    /// A handle that stops [`Server::run`].
    pub fn shutdown_handle(&self) -> Shutdown {
        Shutdown {
            shared: self.shared.clone(),
        }
    }

    /// Each client's share of the ring memory.
    pub fn ring_share(&self) -> u64 {
        self.shared.ring_share()
    }

    /// Serves until [`Shutdown::shutdown`]; then tells every client, waits briefly for
    /// their threads, and removes the socket file.
    pub fn run(self) -> Result<()> {
        let mut threads: Vec<(u64, JoinHandle<()>)> = Vec::new();
        let mut next_id = 0u64;
        loop {
            // Wait for a connection or the wake-up pipe, never for the filesystem.
            let ready = {
                let mut fds = [
                    PollFd::new(self.listener.as_fd(), PollFlags::POLLIN),
                    PollFd::new(self.shared.wake.0.as_fd(), PollFlags::POLLIN),
                ];
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) => fds[0].revents().is_some_and(|r| !r.is_empty()),
                    Err(nix::errno::Errno::EINTR) => false,
                    Err(e) => {
                        crate::notice::once("serve-poll", &format!("poll failed: {e}"));
                        std::thread::sleep(Duration::from_millis(50));
                        false
                    }
                }
            };
            if self.shared.stopping.load(Ordering::SeqCst) {
                break;
            }
            if !ready {
                continue;
            }
            let accepted = self.listener.accept();
            let sock = match accepted {
                Ok((s, _)) => s,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    crate::notice::once("serve-accept", &format!("accept failed: {e}"));
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            threads.retain(|(_, t)| !t.is_finished());
            let live = self
                .shared
                .conns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .len();
            if live >= self.shared.cfg.max_clients {
                self.shared.stats().refused_busy += 1;
                let mut s = &sock;
                let _ = s.write_all(&error_frame(
                    "busy",
                    &format!(
                        "the daemon serves {} clients at once (--max-clients); try again later",
                        self.shared.cfg.max_clients
                    ),
                    true,
                ));
                continue;
            }
            let id = next_id;
            next_id += 1;
            if let Ok(clone) = sock.try_clone() {
                self.shared
                    .conns
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id, clone);
            }
            self.shared.stats().connections_total += 1;
            let shared = self.shared.clone();
            let t = std::thread::Builder::new()
                .name(format!("riffle-conn-{id}"))
                .spawn(move || {
                    // Frees the slot however the thread ends, a panic included (it is
                    // counted, and only this connection goes).
                    let _slot = SlotGuard {
                        shared: shared.clone(),
                        id,
                    };
                    let mut c = Conn::new(sock, shared.clone());
                    c.serve();
                });
            match t {
                Ok(t) => threads.push((id, t)),
                Err(e) => {
                    crate::notice::once("serve-spawn", &format!("cannot start a thread: {e}"));
                    self.shared
                        .conns
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&id);
                }
            }
        }
        // Shutdown: stop reading from every client (their threads see the end of input,
        // send a `shutdown` error and leave), then force whatever is stuck in a write.
        let conns: Vec<UnixStream> = self
            .shared
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter_map(|s| s.try_clone().ok())
            .collect();
        for s in &conns {
            let _ = s.shutdown(std::net::Shutdown::Read);
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while threads.iter().any(|(_, t)| !t.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        for s in &conns {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        for (_, t) in threads {
            let _ = t.join();
        }
        let path = &self.shared.cfg.socket;
        if std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == self.socket_id) {
            let _ = std::fs::remove_file(path);
        }
        Ok(())
    }
}

/// A connection's place in `Shared::conns`, given back when its thread ends.
struct SlotGuard {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let sock = self
            .shared
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
        if std::thread::panicking() {
            *self
                .shared
                .stats()
                .errors
                .entry("panic".into())
                .or_default() += 1;
            if let Some(s) = sock {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

impl Shared {
    pub(super) fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|p| p.into_inner())
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
        json!({
            "uptime_s": secs,
            "clients": self.conns.lock().unwrap_or_else(|p| p.into_inner()).len(),
            "connections_total": s.connections_total,
            "refused_busy": s.refused_busy,
            "streams_now": s.streams_now,
            "streams_total": s.streams_total,
            "batches": s.batches,
            "batches_in_place": s.batches_in_place,
            "batches_announced_early": s.batches_announced_early,
            "records": s.records,
            "bytes": s.bytes,
            "read_ops": s.read_ops,
            "jobs_total": s.jobs_total,
            "jobs_now": s.jobs_now,
            "streams_shared": s.streams_shared,
            "streams_own": s.streams_own,
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
            "errors": s.errors,
            "datasets": self.cfg.datasets.iter().map(|(n, d)| json!({"name": n, "records": d.len()})).collect::<Vec<_>>(),
        })
    }
}

pub use crate::modes::monotonic_ns;
