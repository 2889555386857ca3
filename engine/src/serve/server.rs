//! The daemon: a Unix socket, one thread per connection (`conn.rs`), one engine stream
//! and one shared-memory ring per open stream.
//!
//! Memory is bounded whatever clients do: at most `max_clients` connections, each with at
//! most one stream, whose ring is at most `memory / max_clients` bytes, and whose engine
//! read-ahead is two batches. A client that stops acknowledging only stalls its own
//! stream: the daemon writes a batch only into ring space no unacknowledged slot covers.

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::budget::{Budget, Unit};
use super::conn::Conn;
use super::proto::error_frame;
pub use super::state::{ServeConfig, ServeMode};
use super::state::{Shared, Stats};
use super::wire::Wire;
use crate::size::human_bytes;
use crate::{Error, Result};

/// A bound socket, ready to [`Server::run`].
pub struct Server {
    listener: UnixListener,
    shared: Arc<Shared>,
    /// The socket file's identity (device, inode), so shutdown removes it only if the path
    /// still names this daemon's socket, not one another daemon bound there since.
    socket_id: (u64, u64),
    /// A descriptor kept in reserve: when `accept` fails for want of descriptors (EMFILE,
    /// ENFILE), it is closed so the connection can be accepted, told `busy` and closed,
    /// and then opened again (a connection left in the backlog got nothing, for ever).
    spare: Mutex<Option<std::fs::File>>,
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

/// An admission short of memory first drops the resident copies no pass uses; one short
/// of scratch, the piles kept for a job's next pass.
fn reclaim_when_short(shared: &Arc<Shared>) {
    let weak = Arc::downgrade(shared);
    shared.budget.on_short(Box::new(move |need| {
        weak.upgrade().is_some_and(|s| s.residents.evict_idle(need))
    }));
    let rolled = Arc::downgrade(&shared.rolled);
    let evict = move |need| rolled.upgrade().is_some_and(|r| r.evict(need));
    shared.space.on_short(Box::new(evict.clone()));
    if let Some(b) = &shared.scratch_budget {
        b.on_short(Box::new(evict));
    }
}

impl Server {
    /// Binds the socket (removing a stale one nobody listens on) with `socket_mode`.
    pub fn bind(cfg: ServeConfig) -> Result<Server> {
        if cfg.datasets.is_empty() && !cfg.open_paths {
            return Err(Error::Invalid("no dataset to serve".into()));
        }
        if cfg.max_clients == 0 {
            return Err(Error::Invalid("--max-clients must be at least 1".into()));
        }
        check_durations(&cfg)?;
        check_memory(&cfg)?;
        if let Some(dir) = &cfg.scratch {
            check_scratch(dir)?;
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
        let files = files_budget(&cfg)?;
        let spare = spare_fd(path)?;
        count_panics();
        let hist = || Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("histogram");
        let (cfg_memory, scratch_limit, keep_rolled, index_bytes) = (
            cfg.memory,
            cfg.scratch_limit,
            cfg.keep_rolled,
            cfg.datasets
                .iter()
                .map(|(_, d)| d.dataset().index_bytes())
                .sum::<u64>(),
        );
        let shared = Arc::new(Shared {
            catalog: super::catalog::Catalog::new(
                cfg.datasets.clone(),
                cfg.open_paths,
                cfg.on_open.clone(),
            ),
            cfg,
            stopping: AtomicBool::new(false),
            wake,
            conns: Mutex::new(HashMap::new()),
            stats: Mutex::new(Stats {
                started: Instant::now(),
                connections_total: 0,
                refused_busy: 0,
                refused_strangers: 0,
                streams_total: 0,
                streams_now: 0,
                batches: 0,
                batches_in_place: 0,
                batches_announced_early: 0,
                records: 0,
                bytes: 0,
                read_ops: 0,
                device_bytes: 0,
                jobs_total: 0,
                jobs_now: 0,
                streams_shared: 0,
                streams_own: 0,
                late_streams: 0,
                errors: HashMap::new(),
                panics_before: panics(),
                batch_us: hist(),
                send_us: hist(),
                streamed: Default::default(),
            }),
            ring_bytes_now: AtomicU64::new(0),
            jobs: Default::default(),
            residents: Default::default(),
            telemetry: Default::default(),
            next_stream: AtomicU64::new(0),
            budget: Budget::new(cfg_memory, index_bytes, "--memory", Unit::Bytes),
            scratch_budget: scratch_limit
                .map(|l| Budget::new(l, 0, "--scratch-limit", Unit::Bytes)),
            space: super::space::ScratchSpace::new(),
            files,
            rolled: super::rolled::Rolled::new(keep_rolled),
        });
        reclaim_when_short(&shared);
        Ok(Server {
            listener,
            socket_id,
            spare: Mutex::new(Some(spare)),
            shared,
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
        let mut idle_since = Instant::now();
        loop {
            let ready = self.wait_for_client();
            if self.shared.stopping.load(Ordering::SeqCst) {
                break;
            }
            self.shared.rolled.expire();
            if !ready {
                if self.idle_for(&mut idle_since) && self.leave_idle() {
                    self.shared.stopping.store(true, Ordering::SeqCst);
                    break;
                }
                continue;
            }
            let accepted = self.listener.accept();
            let sock = match accepted {
                Ok((s, _)) => s,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    self.shed();
                    continue;
                }
                Err(e) => {
                    // Others (ENOBUFS, ENOMEM): back off instead of spinning.
                    crate::notice::once("serve-accept", &format!("accept failed: {e}"));
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            threads.retain(|(_, t)| !t.is_finished());
            if self.refused_stranger(&sock) || self.refused_busy(&sock) {
                continue;
            }
            // A connection, however short, is activity: idleness counts from here at least.
            idle_since = Instant::now();
            let id = next_id;
            next_id += 1;
            if let Some(t) = self.start_conn(sock, id) {
                threads.push((id, t));
            }
        }
        self.close_conns(threads);
        // Kept piles are scratch: they go with the daemon.
        self.shared.rolled.clear();
        let path = &self.shared.cfg.socket;
        if std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == self.socket_id) {
            let _ = std::fs::remove_file(path);
        }
        Ok(())
    }

    /// Waits for a connection or the wake-up pipe (at most a second when the daemon
    /// leaves once idle), never for the filesystem; true when a connection is waiting.
    fn wait_for_client(&self) -> bool {
        let mut fds = [
            PollFd::new(self.listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.shared.wake.0.as_fd(), PollFlags::POLLIN),
        ];
        // Kept rolled piles expire on this tick too.
        let tick = self.shared.cfg.exit_idle.is_some() || !self.shared.cfg.keep_rolled.is_zero();
        let timeout = match tick {
            true => PollTimeout::from(1000u16),
            false => PollTimeout::NONE,
        };
        match poll(&mut fds, timeout) {
            Ok(_) => fds[0].revents().is_some_and(|r| !r.is_empty()),
            Err(nix::errno::Errno::EINTR) => false,
            Err(e) => {
                crate::notice::once("serve-poll", &format!("poll failed: {e}"));
                std::thread::sleep(Duration::from_millis(50));
                false
            }
        }
    }

    /// Out of descriptors at `accept`: closes the spare one, accepts the connection, tells
    /// it `busy` and closes it, then takes the spare again. Without a spare (another
    /// process took the last descriptor meanwhile) it backs off a moment.
    fn shed(&self) {
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        self.shared.stats().refused_busy += 1;
        *spare = None;
        if let Ok((sock, _)) = self.listener.accept() {
            let _ = sock.set_write_timeout(Some(Duration::from_millis(100)));
            let mut s = &sock;
            let _ = s.write_all(&error_frame(
                "busy",
                "the daemon has no file descriptor left to serve another connection \
                 (ulimit -n): try again later",
                true,
            ));
        } else {
            std::thread::sleep(Duration::from_millis(10));
        }
        *spare = crate::door::open_spare().ok();
        crate::notice::once(
            "serve-accept",
            "out of file descriptors at accept: connections are refused with busy (raise \
             ulimit -n or lower --max-clients)",
        );
    }

    /// Connections live now.
    fn live_conns(&self) -> usize {
        self.shared
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Whether the daemon has had no connection for its `exit_idle` (`idle_since` is moved
    /// on while it has one).
    fn idle_for(&self, idle_since: &mut Instant) -> bool {
        let Some(limit) = self.shared.cfg.exit_idle else {
            return false;
        };
        let live = self.live_conns();
        if live > 0 {
            *idle_since = Instant::now();
            return false;
        }
        idle_since.elapsed() >= limit
    }

    /// Leaves for idleness unless a starter is at work: holding the starters' lock (kept
    /// until the process exits, so a starter that comes now waits, finds no socket and
    /// starts a new daemon once this one is gone), with no connection live or waiting in
    /// the backlog, the socket is removed. True when it was.
    fn leave_idle(&self) -> bool {
        let lock = match &self.shared.cfg.start_lock {
            Some(path) => match crate::door::open_lock(path) {
                Ok(f) if f.try_lock().is_ok() => Some(f),
                // A starter holds it: it is about to connect.
                Ok(_) => return false,
                Err(e) => {
                    crate::notice::once(
                        "serve-idle-lock",
                        &format!("{}: cannot open the starters' lock: {e}", path.display()),
                    );
                    None
                }
            },
            None => None,
        };
        let live = self.live_conns();
        let mut fds = [PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)];
        let waiting = poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0);
        if live > 0 || waiting {
            return false;
        }
        let path = &self.shared.cfg.socket;
        if std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == self.socket_id) {
            let _ = std::fs::remove_file(path);
        }
        // Released when the process exits: see above.
        std::mem::forget(lock);
        crate::notice::once(
            "serve-idle",
            &format!(
                "no client for {} s (--exit-idle): leaving",
                self.shared.cfg.exit_idle.unwrap_or_default().as_secs()
            ),
        );
        true
    }

    /// Refuses `sock` when the daemon serves only its own user and the peer is another
    /// (`SO_PEERCRED`); true when it did.
    fn refused_stranger(&self, sock: &UnixStream) -> bool {
        if !self.shared.cfg.owner_only {
            return false;
        }
        let me = nix::unistd::geteuid().as_raw();
        let peer = nix::sys::socket::getsockopt(sock, nix::sys::socket::sockopt::PeerCredentials);
        if peer.is_ok_and(|c| c.uid() == me) {
            return false;
        }
        self.shared.stats().refused_strangers += 1;
        let _ = sock.set_write_timeout(Some(Duration::from_millis(100)));
        let mut s = sock;
        let _ = s.write_all(&error_frame(
            "permission",
            &format!(
                "this daemon serves only its own user (uid {me}): start your own (riffle \
                 serve --user, or riffle.torch with a dataset path)"
            ),
            true,
        ));
        true
    }

    /// Refuses `sock` with a `busy` error when the daemon already serves its most clients;
    /// true when it did.
    fn refused_busy(&self, sock: &UnixStream) -> bool {
        let live = self.live_conns();
        if live >= self.shared.cfg.max_clients {
            self.shared.stats().refused_busy += 1;
            let mut s = sock;
            let _ = s.write_all(&error_frame(
                "busy",
                &format!(
                    "the daemon serves {} clients at once (--max-clients); try again later",
                    self.shared.cfg.max_clients
                ),
                true,
            ));
            return true;
        }
        false
    }

    /// Serves `sock` as connection `id` on a thread of its own, or `None` when no thread
    /// could be started (the connection is dropped).
    fn start_conn(&self, sock: UnixStream, id: u64) -> Option<JoinHandle<()>> {
        let wire = Conn::wire(sock, &self.shared);
        self.shared
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, wire.clone());
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
                let mut c = Conn::new(wire, shared.clone());
                c.serve();
            });
        match t {
            Ok(t) => Some(t),
            Err(e) => {
                crate::notice::once("serve-spawn", &format!("cannot start a thread: {e}"));
                self.shared
                    .conns
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
                None
            }
        }
    }

    /// Shutdown: stops reading from every client (their threads see the end of input,
    /// send a `shutdown` error and leave), tells those whose thread has not within the
    /// grace itself, then forces whatever is stuck in a write, and joins the connections'
    /// `threads`.
    fn close_conns(&self, threads: Vec<(u64, JoinHandle<()>)>) {
        let conns: Vec<(u64, Arc<Wire>)> = self
            .shared
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(id, w)| (*id, w.clone()))
            .collect();
        for (_, w) in &conns {
            let _ = w.sock.shutdown(std::net::Shutdown::Read);
        }
        // Clients that read get their `shutdown` error within this from their threads.
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        while threads.iter().any(|(_, t)| !t.is_finished()) && Instant::now() < deadline {
            self.refuse_while_stopping(Duration::from_millis(10));
        }
        // A thread that has not said goodbye by now (not yet run on a loaded machine, or
        // still stopping its stream's engine) does not decide whether its client is
        // told: the daemon writes the goodbye itself, once no frame is half written
        // (waiting a little for a writer to finish one). A thread stuck in a write to a
        // client that does not read is cut loose by shutting the socket down, so shutdown
        // takes well under a second whatever clients do.
        let goodbye = error_frame("shutdown", "the daemon is shutting down", true);
        let unfinished = |id: u64| threads.iter().any(|(i, t)| *i == id && !t.is_finished());
        let mut left: Vec<&Arc<Wire>> = (conns.iter())
            .filter(|(id, _)| unfinished(*id))
            .map(|(_, w)| w)
            .collect();
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        while !left.is_empty() && Instant::now() < deadline {
            left.retain(|w| !w.try_goodbye(&goodbye, super::conn::GOODBYE_WAIT));
            if !left.is_empty() {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        for (_, w) in &conns {
            let _ = w.sock.shutdown(std::net::Shutdown::Both);
        }
        for (_, t) in threads {
            let _ = t.join();
        }
        // Connections that came meanwhile are told too, not reset.
        self.refuse_while_stopping(Duration::ZERO);
    }

    /// Answers connections that arrive while the daemon stops with a `shutdown` error
    /// (waiting up to `wait` for one), so a client made in the grace period is told why.
    fn refuse_while_stopping(&self, wait: Duration) {
        let mut fds = [PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)];
        let ms = u16::try_from(wait.as_millis()).unwrap_or(u16::MAX);
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(n) if n > 0 => {}
            _ => return,
        }
        let _ = self.listener.set_nonblocking(true);
        while let Ok((sock, _)) = self.listener.accept() {
            let _ = sock.set_nonblocking(false);
            let _ = sock.set_write_timeout(Some(Duration::from_millis(50)));
            let mut s = &sock;
            let _ = s.write_all(&error_frame(
                "shutdown",
                "the daemon is shutting down",
                true,
            ));
        }
        let _ = self.listener.set_nonblocking(false);
    }
}

/// The longest wait the daemon takes (`--idle-timeout`, `--admit-wait`, `--join-window`,
/// `--join-deadline`): a deadline is the moment now plus one of them, which must be a time
/// the clock can say. Longer ones were taken at start and then overflowed in every connection.
pub const LONGEST_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// Descriptors each connection may hold: its socket, the clone kept to end it at
/// shutdown, and its stream's ring.
const FILES_PER_CLIENT: u64 = 3;

/// The daemon's open-file budget: `ulimit -n`, less what it holds now (the socket, its
/// pipe, standard streams) and what `--max-clients` connections may hold with their rings,
/// and a few spare; what is left is for the passes' files. Refused when connections alone
/// could use them all.
fn files_budget(cfg: &ServeConfig) -> Result<Arc<Budget>> {
    let limit = crate::io::open_file_limit();
    let open_now = std::fs::read_dir("/proc/self/fd").map_or(16, |d| d.count() as u64);
    let clients = (cfg.max_clients as u64).saturating_mul(FILES_PER_CLIENT);
    let base = open_now.saturating_add(clients).saturating_add(4);
    // Each pass needs a few of its own and two of the dataset's at the least.
    if base.saturating_add(8) > limit {
        return Err(Error::Invalid(format!(
            "--max-clients {} may hold {clients} open files with their rings, and the daemon \
             holds {open_now}: more than ulimit -n {limit} leaves for reading: raise ulimit \
             -n, or lower --max-clients",
            cfg.max_clients
        )));
    }
    Ok(Budget::new(limit, base, "ulimit -n", Unit::Files))
}

/// The descriptor kept in reserve for shedding connections at EMFILE (see `Server::shed`).
fn spare_fd(socket: &std::path::Path) -> Result<std::fs::File> {
    crate::door::open_spare()
        .map_err(|e| Error::io(socket, "open /dev/null as a spare descriptor", None, e))
}

/// Refuses waits no deadline can hold (see [`LONGEST_WAIT`]).
fn check_durations(cfg: &ServeConfig) -> Result<()> {
    let waits = [
        ("--idle-timeout", cfg.idle_timeout.unwrap_or_default()),
        ("--admit-wait", cfg.admit_wait),
        ("--join-window", cfg.join_window),
        ("--join-deadline", cfg.join_deadline),
    ];
    for (flag, d) in waits {
        if d > LONGEST_WAIT {
            return Err(Error::Invalid(format!(
                "{flag} of {} s is longer than the daemon can wait (at most {} s, a year)",
                d.as_secs(),
                LONGEST_WAIT.as_secs()
            )));
        }
    }
    Ok(())
}

/// Refuses a `--memory` in which no stream could ever be served: the datasets' indexes,
/// plus, for the dataset that needs most, a LIRS read of batches of one record (a pass
/// takes at most a quarter of the memory) and a ring for one such batch.
fn check_memory(cfg: &ServeConfig) -> Result<()> {
    let index: u64 = cfg
        .datasets
        .iter()
        .map(|(_, d)| d.dataset().index_bytes())
        .sum();
    let cap = super::budget::PASS_MAX.min(cfg.memory / 4);
    for (name, src) in &cfg.datasets {
        let ds = src.dataset();
        let ring = super::open::largest_batch(1, ds, u64::MAX)
            .map_or(u64::MAX, |b| b.div_ceil(4096) * 4096);
        let opts = crate::modes::ReadOptions::new(1);
        let (pass, fits) = match super::budget::pass_needs(ds, &opts, (false, 0), cap) {
            Ok(n) => (n, true),
            Err(least) => (least, false),
        };
        let need = index.saturating_add(pass).saturating_add(ring);
        if !fits || need > cfg.memory {
            let least = need.max(pass.saturating_mul(4));
            return Err(Error::Invalid(format!(
                "--memory {} is too little for any stream of dataset '{name}': the datasets' \
                 indexes take {}, a read of one-record batches needs {} (a read takes at \
                 most a quarter of --memory) and its ring {}: give --memory {} or more",
                human_bytes(cfg.memory as f64),
                human_bytes(index as f64),
                human_bytes(pass as f64),
                human_bytes(ring as f64),
                human_bytes(least as f64),
            )));
        }
    }
    Ok(())
}

/// Refuses a `--scratch` where no pile could be written: not a directory (a regular
/// file), not writable, or a kernel filesystem (/proc, /sys). One that does not exist
/// yet is made when the first pass needs it, so its nearest existing parent is checked.
fn check_scratch(dir: &std::path::Path) -> Result<()> {
    let refuse = |why: &str| {
        Err(Error::Invalid(format!(
            "--scratch {}: {why}; two-pass piles need a writable directory",
            dir.display()
        )))
    };
    let mut at = dir;
    while !at.exists() {
        match at.parent() {
            Some(p) if !p.as_os_str().is_empty() => at = p,
            _ => return refuse("no part of it exists"),
        }
    }
    let meta = match std::fs::metadata(at) {
        Ok(m) => m,
        Err(e) => return refuse(&format!("cannot stat {}: {e}", at.display())),
    };
    if !meta.is_dir() {
        return refuse(&format!("{} is not a directory", at.display()));
    }
    if let Ok(fs) = nix::sys::statfs::statfs(at) {
        use nix::sys::statfs::{PROC_SUPER_MAGIC, SYSFS_MAGIC};
        if fs.filesystem_type() == PROC_SUPER_MAGIC || fs.filesystem_type() == SYSFS_MAGIC {
            return refuse("it is on a kernel filesystem (proc or sysfs)");
        }
    }
    if let Err(e) = nix::unistd::access(
        at,
        nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
    ) {
        return refuse(&format!("{} is not writable: {e}", at.display()));
    }
    Ok(())
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
        // The panic itself is counted by the hook (`count_panics`).
        if std::thread::panicking() {
            if let Some(w) = sock {
                let _ = w.sock.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// How long shutdown waits for connections to say goodbye before it cuts them.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(300);

/// Panics of the process's riffle threads (a connection's, a job's, an engine pass's and
/// its helpers': every thread the engine names `riffle-...`) since the hook was set.
static PANICS: AtomicU64 = AtomicU64::new(0);

/// Counts every panic of a riffle thread in [`PANICS`], whoever owns the thread: a pass's
/// engine thread panics where the daemon cannot catch it (its stream is only stopped and
/// joined), and the daemon's `errors` must still show it. The hook before it still runs
/// (the message goes to stderr as before). Set once per process.
fn count_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let ours = std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("riffle"));
            if ours {
                PANICS.fetch_add(1, Ordering::Relaxed);
            }
            before(info);
        }));
    });
}

/// Panics of riffle threads counted so far (see [`count_panics`]).
pub(super) fn panics() -> u64 {
    PANICS.load(Ordering::Relaxed)
}

pub use crate::modes::monotonic_ns;

#[cfg(test)]
mod tests {
    use super::*;

    /// A panic in any riffle thread (a pass's engine thread, which the daemon only stops
    /// and joins) is counted for the daemon's `errors`; a thread of someone else's is not.
    #[test]
    fn panics_of_riffle_threads_are_counted() {
        count_panics();
        let before = panics();
        let t = std::thread::Builder::new()
            .name("riffle-two-pass".into())
            .spawn(|| panic!("a deliberate panic of an engine thread"))
            .unwrap();
        assert!(t.join().is_err());
        let after = panics();
        assert!(after > before, "panic not counted: {before} -> {after}");
        let t = std::thread::Builder::new()
            .name("someone-else".into())
            .spawn(|| panic!("a deliberate panic of another thread"))
            .unwrap();
        assert!(t.join().is_err());
        // Other tests may run riffle threads meanwhile, but none of them panics.
        assert_eq!(panics(), after);
    }
}
