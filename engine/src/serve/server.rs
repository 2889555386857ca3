//! The daemon: a Unix socket, one thread per connection, one engine stream and one
//! shared-memory ring per open stream.
//!
//! Memory is bounded whatever clients do: at most `max_clients` connections, each with at
//! most one stream, whose ring is at most `memory / max_clients` bytes, and whose engine
//! read-ahead is two batches. A client that stops acknowledging only stalls its own
//! stream: the daemon writes a batch only into ring space no unacknowledged slot covers.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde_json::json;

use super::proto::{self, BatchHeader, ErrorMsg, FrameBuf, Kind, OpenRequest, Transport};
use super::ring::{Slots, ALIGN};
use super::shm::{self, Ring};
use crate::dataset::Dataset;
use crate::io::IoConfig;
use crate::modes::{self, Batch, BatchStream, Cursor, ReadOptions};
use crate::order::{Grouping, Split, Tail};
use crate::{Error, Result};

/// How the daemon reads datasets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServeMode {
    /// Random reads (LIRS).
    Lirs,
    /// Sequential two-pass (scratch piles per stream).
    TwoPass,
}

/// What `riffle serve` was started with.
pub struct ServeConfig {
    /// The socket's path.
    pub socket: PathBuf,
    /// Permission bits of the socket file (0o600 by default).
    pub socket_mode: u32,
    /// The datasets clients may ask for, by name.
    pub datasets: Vec<(String, Arc<Dataset>)>,
    /// Shared memory for all rings together; each client's share is this / `max_clients`.
    pub memory: u64,
    /// Connections served at once; more are refused with a `busy` error.
    pub max_clients: usize,
    /// The read mode.
    pub mode: ServeMode,
    /// Two-pass: where the piles go.
    pub scratch: Option<PathBuf>,
    /// Reads in flight per stream.
    pub queue_depth: usize,
}

/// Most batches a stream sends before it needs an ack.
const MAX_CREDITS: u32 = 16;

/// A bound socket, ready to [`Server::run`].
pub struct Server {
    listener: UnixListener,
    shared: Arc<Shared>,
}

/// Stops a running [`Server`] from another thread (a signal handler thread).
#[derive(Clone)]
pub struct Shutdown {
    shared: Arc<Shared>,
}

impl Shutdown {
    /// Asks the server to stop: no new connections; open ones are told and closed.
    pub fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = UnixStream::connect(&self.shared.cfg.socket);
    }
}

struct Shared {
    cfg: ServeConfig,
    stopping: AtomicBool,
    /// A clone of every live connection's socket, to end them at shutdown.
    conns: Mutex<HashMap<u64, UnixStream>>,
    stats: Mutex<Stats>,
    ring_bytes_now: AtomicU64,
}

struct Stats {
    started: Instant,
    connections_total: u64,
    refused_busy: u64,
    streams_total: u64,
    streams_now: u64,
    batches: u64,
    records: u64,
    bytes: u64,
    read_ops: u64,
    errors: HashMap<String, u64>,
    /// Per batch: from asking the engine for it to its notification written (us).
    batch_us: Histogram<u64>,
    /// Per batch: from the ring write's start to the notification written (us).
    send_us: Histogram<u64>,
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
        let hist = || Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("histogram");
        Ok(Server {
            listener,
            shared: Arc::new(Shared {
                cfg,
                stopping: AtomicBool::new(false),
                conns: Mutex::new(HashMap::new()),
                stats: Mutex::new(Stats {
                    started: Instant::now(),
                    connections_total: 0,
                    refused_busy: 0,
                    streams_total: 0,
                    streams_now: 0,
                    batches: 0,
                    records: 0,
                    bytes: 0,
                    read_ops: 0,
                    errors: HashMap::new(),
                    batch_us: hist(),
                    send_us: hist(),
                }),
                ring_bytes_now: AtomicU64::new(0),
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
            let accepted = self.listener.accept();
            if self.shared.stopping.load(Ordering::SeqCst) {
                break;
            }
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
                    let mut c = Conn::new(sock, shared.clone());
                    c.serve();
                    drop(c);
                    shared
                        .conns
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&id);
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
        let _ = std::fs::remove_file(&self.shared.cfg.socket);
        Ok(())
    }
}

impl Shared {
    fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ring_share(&self) -> u64 {
        (self.cfg.memory / self.cfg.max_clients as u64).max(64 * 1024)
    }

    fn stats_json(&self) -> serde_json::Value {
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
            "records": s.records,
            "bytes": s.bytes,
            "read_ops": s.read_ops,
            "iops": s.read_ops as f64 / secs.max(1e-9),
            "records_per_s": s.records as f64 / secs.max(1e-9),
            "bytes_per_s": s.bytes as f64 / secs.max(1e-9),
            "batch_latency_us": pct(&s.batch_us),
            "send_latency_us": pct(&s.send_us),
            "ring_bytes": self.ring_bytes_now.load(Ordering::Relaxed),
            "ring_bytes_limit": self.ring_share() * self.cfg.max_clients as u64,
            "ring_share": self.ring_share(),
            "errors": s.errors,
            "datasets": self.cfg.datasets.iter().map(|(n, d)| json!({"name": n, "records": d.len()})).collect::<Vec<_>>(),
        })
    }
}

fn error_frame(code: &str, message: &str, fatal: bool) -> Vec<u8> {
    proto::json_frame(
        Kind::Error,
        &ErrorMsg {
            code: code.into(),
            message: message.into(),
            fatal,
        },
    )
}

/// Why a connection ends.
enum Leave {
    /// The client went away (end of input, reset, broken pipe).
    Gone,
    /// A fatal error frame to send, then close.
    Fatal(&'static str, String),
}

impl From<std::io::Error> for Leave {
    fn from(_: std::io::Error) -> Leave {
        Leave::Gone
    }
}

/// One open stream.
struct Stream {
    // Field order is drop order: the engine stops before its scratch directory goes.
    batches: BatchStream,
    _scratch: Option<tempfile::TempDir>,
    transport: Transport,
    ring: Option<(Ring, Slots)>,
    /// Inline: batches sent and not yet acknowledged (slot ids).
    inline_outstanding: Vec<u32>,
    inline_next: u32,
    credits: u32,
    /// A batch taken from the engine that did not fit the ring yet.
    pending: Option<(Batch, Instant)>,
    sent: u64,
}

impl Stream {
    fn outstanding(&self) -> usize {
        match &self.ring {
            Some((_, slots)) => slots.outstanding(),
            None => self.inline_outstanding.len(),
        }
    }
}

struct Conn {
    sock: UnixStream,
    shared: Arc<Shared>,
    buf: FrameBuf,
    stream: Option<Stream>,
    out: Vec<u8>,
}

impl Conn {
    fn new(sock: UnixStream, shared: Arc<Shared>) -> Conn {
        Conn {
            sock,
            shared,
            buf: FrameBuf::default(),
            stream: None,
            out: Vec::new(),
        }
    }

    fn serve(&mut self) {
        let outcome = self.handshake().and_then(|()| self.main_loop());
        let leave = match outcome {
            Ok(()) => return,
            Err(l) => l,
        };
        let (code, msg) = match leave {
            Leave::Fatal(code, msg) => (code, msg),
            Leave::Gone if self.shared.stopping.load(Ordering::SeqCst) => {
                ("shutdown", "the daemon is shutting down".to_string())
            }
            Leave::Gone => {
                self.close_stream();
                return;
            }
        };
        *self.shared.stats().errors.entry(code.into()).or_default() += 1;
        self.close_stream();
        let _ = (&self.sock).write_all(&error_frame(code, &msg, true));
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    /// Reads once from the socket: blocking, or only if something is there.
    fn fill(&mut self, block: bool) -> Result<bool, Leave> {
        if !block {
            let mut fds = [PollFd::new(self.sock.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::ZERO) {
                Ok(0) => return Ok(false),
                Ok(_) => {}
                Err(nix::Error::EINTR) => return Ok(false),
                Err(_) => return Err(Leave::Gone),
            }
        }
        const CHUNK: usize = 64 * 1024;
        let spare = self.buf.spare(CHUNK);
        let got = loop {
            match self.sock.read(spare) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.buf.filled(CHUNK, 0);
                    return Err(Leave::Gone);
                }
            }
        };
        self.buf.filled(CHUNK, got);
        if got == 0 {
            return Err(Leave::Gone);
        }
        Ok(true)
    }

    /// The next whole frame, reading as needed (or only what is there when `block` is
    /// false). Oversized or zero lengths end the connection.
    fn frame(&mut self, block: bool) -> Result<Option<(u8, Vec<u8>)>, Leave> {
        loop {
            match self.buf.next(proto::MAX_FRAME) {
                Ok(Some((k, body))) => return Ok(Some((k, body.to_vec()))),
                Ok(None) => {}
                Err(0) => {
                    return Err(Leave::Fatal(
                        "protocol",
                        "a frame of length 0 (every frame has a kind byte)".into(),
                    ))
                }
                Err(n) => {
                    return Err(Leave::Fatal(
                        "oversize",
                        format!(
                            "a frame of {n} bytes is over the limit of {} bytes",
                            proto::MAX_FRAME
                        ),
                    ))
                }
            }
            if !self.fill(block)? {
                return Ok(None);
            }
        }
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), Leave> {
        (&self.sock).write_all(bytes)?;
        Ok(())
    }

    fn handshake(&mut self) -> Result<(), Leave> {
        let (kind, body) = self.frame(true)?.expect("a blocking read returns a frame");
        if kind != Kind::Hello as u8 {
            return Err(Leave::Fatal(
                "protocol",
                format!("expected HELLO (kind 1) first, got kind {kind}"),
            ));
        }
        let hello: proto::Hello = serde_json::from_slice(&body)
            .map_err(|e| Leave::Fatal("protocol", format!("HELLO is not valid JSON: {e}")))?;
        if hello.version != proto::VERSION {
            return Err(Leave::Fatal(
                "version",
                format!(
                    "protocol version {} is not supported: this daemon speaks version {}",
                    hello.version,
                    proto::VERSION
                ),
            ));
        }
        let reply = proto::Hello {
            version: proto::VERSION,
            agent: format!("riffle {}", env!("CARGO_PKG_VERSION")),
            datasets: self
                .shared
                .cfg
                .datasets
                .iter()
                .map(|(n, _)| n.clone())
                .collect(),
            max_frame: proto::MAX_FRAME,
        };
        self.send(&proto::json_frame(Kind::Hello, &reply))
    }

    fn main_loop(&mut self) -> Result<(), Leave> {
        loop {
            if self.shared.stopping.load(Ordering::SeqCst) {
                return Err(Leave::Gone);
            }
            if self.stream.is_none() {
                let (k, body) = self.frame(true)?.expect("blocking");
                self.handle(k, &body)?;
                continue;
            }
            // Take in whatever the client sent (acks, close, stats) without waiting.
            while let Some((k, body)) = self.frame(false)? {
                self.handle(k, &body)?;
            }
            let Some(st) = self.stream.as_mut() else {
                continue;
            };
            if st.outstanding() >= st.credits as usize {
                let (k, body) = self.frame(true)?.expect("blocking");
                self.handle(k, &body)?;
                continue;
            }
            if st.pending.is_none() {
                let asked = Instant::now();
                match st.batches.next() {
                    None => {
                        let sent = st.sent;
                        self.close_stream();
                        self.send(&proto::json_frame(
                            Kind::End,
                            &proto::End {
                                reason: "done".into(),
                                batches: sent,
                            },
                        ))?;
                        continue;
                    }
                    Some(Err(e)) => {
                        self.close_stream();
                        *self
                            .shared
                            .stats()
                            .errors
                            .entry("engine".into())
                            .or_default() += 1;
                        self.send(&error_frame("engine", &e.to_string(), false))?;
                        continue;
                    }
                    Some(Ok(b)) => st.pending = Some((b, asked)),
                }
            }
            if !self.deliver()? {
                // No room in the ring until the client acknowledges something.
                let (k, body) = self.frame(true)?.expect("blocking");
                self.handle(k, &body)?;
            }
        }
    }

    /// Writes the pending batch out. False when the ring has no room for it yet.
    fn deliver(&mut self) -> Result<bool, Leave> {
        let st = self.stream.as_mut().expect("a stream");
        let (b, asked) = st.pending.take().expect("a pending batch");
        let n = b.ids.len() as u64;
        let arrays = 16 * n + 8;
        let started = Instant::now();
        let sent_ns = monotonic_ns();
        let mut h = BatchHeader {
            slot: 0,
            flags: 0,
            epoch: b.epoch,
            index: b.index,
            records: n,
            padding: b.padding as u64,
            data_len: b.payload.len() as u64,
            ids_at: 0,
            offsets_at: 0,
            data_at: 0,
            sent_ns,
        };
        self.out.clear();
        match st.ring.as_mut() {
            Some((ring, slots)) => {
                let data_off = arrays.div_ceil(ALIGN) * ALIGN;
                let total = data_off + b.payload.len() as u64;
                if !slots.fits_empty(total) {
                    let msg = format!(
                        "batch {} of epoch {} needs {total} bytes, more than the stream's ring of {} bytes: \
                         ask for a smaller batch, or start the daemon with more --memory",
                        b.index,
                        b.epoch,
                        ring.len()
                    );
                    self.close_stream();
                    *self
                        .shared
                        .stats()
                        .errors
                        .entry("too_large".into())
                        .or_default() += 1;
                    self.send(&error_frame("too_large", &msg, false))?;
                    return Ok(true);
                }
                let Some((slot, at)) = slots.alloc(total) else {
                    st.pending = Some((b, asked));
                    return Ok(false);
                };
                ring.write_u64s(at as usize, &b.ids);
                ring.write_u64s((at + 8 * n) as usize, &b.offsets);
                ring.write((at + data_off) as usize, &b.payload);
                h.slot = slot;
                h.ids_at = at;
                h.offsets_at = at + 8 * n;
                h.data_at = at + data_off;
                proto::frame_into(&mut self.out, Kind::Batch, BatchHeader::LEN);
                h.encode(&mut self.out);
            }
            None => {
                h.slot = st.inline_next;
                st.inline_next = st.inline_next.wrapping_add(1);
                st.inline_outstanding.push(h.slot);
                let hl = BatchHeader::LEN as u64;
                h.ids_at = hl;
                h.offsets_at = hl + 8 * n;
                h.data_at = hl + arrays;
                let body = hl + arrays + b.payload.len() as u64;
                if body + 1 > u32::MAX as u64 {
                    let msg = format!(
                        "batch {} of epoch {} is {body} bytes, more than one inline frame can carry: \
                         use the shared-memory transport or a smaller batch",
                        b.index, b.epoch
                    );
                    self.close_stream();
                    self.send(&error_frame("too_large", &msg, false))?;
                    return Ok(true);
                }
                proto::frame_into(&mut self.out, Kind::BatchInline, body as usize);
                h.encode(&mut self.out);
                for v in b.ids.iter().chain(b.offsets.iter()) {
                    self.out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        st.sent += 1;
        let inline = st.ring.is_none();
        (&self.sock).write_all(&self.out)?;
        if inline {
            (&self.sock).write_all(&b.payload)?;
        }
        let done = Instant::now();
        let mut s = self.shared.stats();
        s.batches += 1;
        s.records += n;
        s.bytes += b.payload.len() as u64;
        s.batch_us
            .saturating_record(done.duration_since(asked).as_micros().max(1) as u64);
        s.send_us
            .saturating_record(done.duration_since(started).as_micros().max(1) as u64);
        Ok(true)
    }

    fn handle(&mut self, kind: u8, body: &[u8]) -> Result<(), Leave> {
        match Kind::from_u8(kind) {
            Some(Kind::Ack) => {
                let acks = proto::decode_acks(body).ok_or_else(|| {
                    Leave::Fatal(
                        "protocol",
                        format!("ACK of {} bytes: expected a multiple of 4", body.len()),
                    )
                })?;
                // Acks after a stream ended are for its last batches: nothing to do.
                let Some(st) = self.stream.as_mut() else {
                    return Ok(());
                };
                for slot in acks {
                    let ok = match st.ring.as_mut() {
                        Some((_, slots)) => slots.release(slot),
                        None => match st.inline_outstanding.iter().position(|&s| s == slot) {
                            Some(i) => {
                                st.inline_outstanding.remove(i);
                                true
                            }
                            None => false,
                        },
                    };
                    if !ok {
                        return Err(Leave::Fatal(
                            "protocol",
                            format!("ACK of slot {slot}, which is not outstanding"),
                        ));
                    }
                }
                Ok(())
            }
            Some(Kind::Open) => {
                if self.stream.is_some() {
                    return Err(Leave::Fatal(
                        "protocol",
                        "OPEN while a stream is open: send CLOSE and wait for END first".into(),
                    ));
                }
                let req: OpenRequest = serde_json::from_slice(body).map_err(|e| {
                    Leave::Fatal("protocol", format!("OPEN is not a valid request: {e}"))
                })?;
                match self.open(&req) {
                    Ok(()) => Ok(()),
                    Err((code, msg)) => {
                        *self.shared.stats().errors.entry(code.into()).or_default() += 1;
                        self.send(&error_frame(code, &msg, false))
                    }
                }
            }
            Some(Kind::Close) => {
                if let Some(st) = self.stream.as_ref() {
                    let sent = st.sent;
                    self.close_stream();
                    self.send(&proto::json_frame(
                        Kind::End,
                        &proto::End {
                            reason: "closed".into(),
                            batches: sent,
                        },
                    ))?;
                } else {
                    self.send(&proto::json_frame(
                        Kind::End,
                        &proto::End {
                            reason: "closed".into(),
                            batches: 0,
                        },
                    ))?;
                }
                Ok(())
            }
            Some(Kind::Stats) => {
                let v = self.shared.stats_json();
                self.send(&proto::json_frame(Kind::StatsReply, &v))
            }
            Some(k) => Err(Leave::Fatal(
                "protocol",
                format!("a client does not send {k:?} frames"),
            )),
            None => Err(Leave::Fatal(
                "protocol",
                format!("unknown frame kind {kind}"),
            )),
        }
    }

    fn open(&mut self, req: &OpenRequest) -> Result<(), (&'static str, String)> {
        let cfg = &self.shared.cfg;
        let Some((_, ds)) = cfg.datasets.iter().find(|(n, _)| *n == req.dataset) else {
            let names: Vec<&str> = cfg.datasets.iter().map(|(n, _)| n.as_str()).collect();
            return Err((
                "unknown_dataset",
                format!(
                    "unknown dataset '{}': this daemon serves {}",
                    req.dataset,
                    names.join(", ")
                ),
            ));
        };
        let bad = |m: String| ("bad_request", m);
        let tail = match req.tail.as_str() {
            "partial" => Tail::Partial,
            "drop_last" => Tail::DropLast,
            "pad" => Tail::Pad,
            t => {
                return Err(bad(format!(
                    "unknown tail '{t}': expected partial, drop_last or pad"
                )))
            }
        };
        let grouping = match req.grouping.as_str() {
            "record" => Grouping::Record,
            "page" => Grouping::Page { unit: 4096 },
            g => {
                return Err(bad(format!(
                    "unknown grouping '{g}': expected record or page"
                )))
            }
        };
        if req.epochs == 0 {
            return Err(bad("epochs must be at least 1".into()));
        }
        let split =
            Split::new(ds.len(), req.batch_size, req.rank, req.world, tail).map_err(|e| {
                // The engine speaks in CLI flags; a client sets the `tail` field.
                bad(e.to_string().replace(
                    "choose --drop-last or --pad",
                    "set tail to drop_last or pad",
                ))
            })?;
        let opts = ReadOptions {
            seed: req.seed,
            first_epoch: req.epoch,
            epochs: req.epochs,
            batch: req.batch_size,
            rank: req.rank,
            world: req.world,
            tail,
            grouping,
            resume: req.resume.map(|c| Cursor {
                epoch: c.epoch,
                batch: c.batch,
            }),
            io: IoConfig {
                depth: cfg.queue_depth.max(1),
                ..IoConfig::default()
            },
            // The ring is the read-ahead the client sees; the engine keeps two more.
            prefetch: 2,
            memory: None,
            baseline: None,
        };
        opts.epoch_range().map_err(|e| bad(e.to_string()))?;
        // The ring: room for several of the largest possible batches, within the share.
        let max_record = ds.size_stats().max;
        let largest =
            req.batch_size.saturating_mul(max_record) + 16 * req.batch_size + 8 + 2 * ALIGN;
        let share = self.shared.ring_share();
        let (ring, credits) = match req.transport {
            Transport::Shm => {
                let want = req
                    .ring_bytes
                    .unwrap_or_else(|| largest.saturating_mul(4).max(4 << 20));
                let size = want.min(share).max(largest.min(share));
                let size = size.div_ceil(4096) * 4096;
                let ring = Ring::new(&format!("riffle-{}", req.dataset), size as usize)
                    .map_err(|e| ("shm", e.to_string()))?;
                (Some((ring, Slots::new(size))), MAX_CREDITS)
            }
            Transport::Inline => (None, 4),
        };
        let mut scratch = None;
        let batches = match cfg.mode {
            ServeMode::Lirs => modes::read(ds.clone(), opts),
            ServeMode::TwoPass => {
                let root = cfg
                    .scratch
                    .clone()
                    .or_else(|| ds.files()[0].path.parent().map(Path::to_path_buf))
                    .unwrap_or_else(std::env::temp_dir);
                let dir = tempfile::Builder::new()
                    .prefix(".riffle-serve-")
                    .tempdir_in(&root)
                    .map_err(|e| {
                        (
                            "engine",
                            format!("{}: cannot make scratch: {e}", root.display()),
                        )
                    })?;
                let path = dir.path().to_path_buf();
                scratch = Some(dir);
                modes::read_two_pass(ds.clone(), opts, path)
            }
        }
        .map_err(|e| ("engine", e.to_string()))?;
        let ring_bytes = ring.as_ref().map_or(0, |(r, _)| r.len() as u64);
        let opened = proto::Opened {
            records: ds.len(),
            batches_per_epoch: split.batches(),
            transport: req.transport,
            ring_bytes,
            credits,
            mode: match cfg.mode {
                ServeMode::Lirs => "lirs".into(),
                ServeMode::TwoPass => "two-pass".into(),
            },
        };
        let frame = proto::json_frame(Kind::Opened, &opened);
        let sent = match &ring {
            Some((r, _)) => {
                let fd = r.client_fd().map_err(|e| ("shm", e.to_string()))?;
                shm::send_with_fd(&self.sock, &frame, &fd)
            }
            None => (&self.sock).write_all(&frame),
        };
        // A failed send shows up as the client being gone at the next read.
        let _ = sent;
        self.shared
            .ring_bytes_now
            .fetch_add(ring_bytes, Ordering::Relaxed);
        {
            let mut s = self.shared.stats();
            s.streams_total += 1;
            s.streams_now += 1;
        }
        self.stream = Some(Stream {
            batches,
            _scratch: scratch,
            transport: req.transport,
            ring,
            inline_outstanding: Vec::new(),
            inline_next: 0,
            credits,
            pending: None,
            sent: 0,
        });
        Ok(())
    }

    fn close_stream(&mut self) {
        let Some(st) = self.stream.take() else {
            return;
        };
        let ring_bytes = st.ring.as_ref().map_or(0, |(r, _)| r.len() as u64);
        let _ = st.transport;
        let Stream {
            batches, _scratch, ..
        } = st;
        let report = batches.finish();
        drop(_scratch);
        self.shared
            .ring_bytes_now
            .fetch_sub(ring_bytes, Ordering::Relaxed);
        let mut s = self.shared.stats();
        s.streams_now -= 1;
        s.read_ops += report.read_ops;
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.close_stream();
    }
}

/// CLOCK_MONOTONIC in nanoseconds (what Python's `time.monotonic_ns()` reads).
pub fn monotonic_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64,
        Err(_) => 0,
    }
}
