//! One connection of the daemon: the handshake, then streams one at a time. An open
//! stream is an engine `BatchStream` whose batches are copied into the stream's ring and
//! announced; acks, close and stats requests are taken between batches, and the thread
//! waits on the socket only when the ring or the credits are full.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::os::unix::net::UnixStream;

use super::budget::{admit_pass, Admitted, Grant};
use super::codes::reply_code;
use super::job::{JobKey, NewPass};
use super::proto::error_frame;
use super::proto::{self, BatchHeader, FrameBuf, Kind, OpenRequest, Transport};
use super::ring::ALIGN;
use super::shm::{self, SharedRing};
use super::state::{ServeMode, Shared};
use super::telemetry::{record, Waits};
use crate::io::IoConfig;
use crate::modes::{self, Batch, BatchStream, Cursor, Payload, ReadOptions};
use crate::order::{Grouping, Split, Tail};

/// Most batches a stream sends before it needs an ack.
const MAX_CREDITS: u32 = 16;

/// How long a new connection has for its whole handshake (an idle connection holds a
/// client slot): the HELLO must be complete by then, however it trickles in.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest the connection thread waits for the engine before it looks at the socket
/// (and the daemon's shutdown) again: a two-pass stream's first batch comes only after
/// its scatter, seconds or minutes away, and a CLOSE must not wait for it.
const ENGINE_WAIT: Duration = Duration::from_millis(20);

/// What became of a batch given to a transport.
enum Sent {
    /// Announced (its header; whether the engine had assembled it in the ring).
    Announced(BatchHeader, bool),
    /// Not sent: no room in the ring until the client acknowledges something.
    NoRoom,
    /// Refused (too large for the transport): the stream was closed with an error.
    Closed,
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
    /// The engine (two-pass's scratch directory is its thread's, removed when it ends).
    batches: BatchStream,
    /// The daemon memory its ring and its own pass hold (given back when it closes).
    _grants: (Option<Grant>, Option<Admitted>),
    transport: Transport,
    ring: Option<Arc<SharedRing>>,
    /// Inline: batches sent and not yet acknowledged (slot ids).
    inline_outstanding: Vec<u32>,
    inline_next: u32,
    credits: u32,
    /// A batch taken from the engine that did not fit the ring yet.
    pending: Option<(Batch, Instant)>,
    /// Its id in the daemon's stats, and its waits.
    id: u64,
    waits: Arc<Mutex<Waits>>,
}

impl Stream {
    fn outstanding(&self) -> usize {
        match &self.ring {
            Some(ring) => ring.slots().outstanding(),
            None => self.inline_outstanding.len(),
        }
    }
}

/// A connection's socket, shared with the engine's thread of its open stream, which
/// announces the batches it completes in the ring itself when it may (see
/// [`announce_ready`]). Every frame is written under the lock, so frames never interleave.
struct Wire {
    sock: UnixStream,
    state: Mutex<WireState>,
}

#[derive(Default)]
struct WireState {
    /// The engine's thread may announce: a shared-memory stream is open and its OPENED
    /// is out.
    live: bool,
    /// Batches of the stream the engine has completed, and those announced (by either
    /// thread): the engine announces one only when every earlier one is out.
    completed: u64,
    announced: u64,
    /// Since when the stream has waited for the engine's next batch while its client had
    /// room for it (the data stall, as the daemon sees it); `None` while it waits on the
    /// client instead, or is not waiting.
    asked: Option<Instant>,
}

impl Wire {
    fn lock(&self) -> MutexGuard<'_, WireState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self, bytes: &[u8]) -> std::io::Result<()> {
        let _w = self.lock();
        (&self.sock).write_all(bytes)
    }
}

/// The engine's thread completed `b` (in order): announce it now if it was assembled in
/// the ring, every earlier batch is announced and the client has credit; otherwise the
/// connection thread announces it when it comes out of the stream. This saves waking the
/// connection thread between the engine and the client.
fn announce_ready(
    wire: &Wire,
    ring: &Arc<SharedRing>,
    shared: &Shared,
    waits: &Mutex<Waits>,
    credits: u32,
    mut b: Batch,
) -> Option<Batch> {
    let started = Instant::now();
    let mut w = wire.lock();
    let seq = w.completed;
    w.completed += 1;
    if !w.live || seq != w.announced || ring.slots().outstanding() >= credits as usize {
        return Some(b);
    }
    let mut h = header(&b);
    let payload = std::mem::take(&mut b.payload);
    let (lent, used) = match payload.into_lent() {
        Ok(l) => l,
        Err(own) => {
            b.payload = own;
            return Some(b);
        }
    };
    let p = match ring.send_lent(lent, used, &b.ids, &b.offsets, (&b.labels, &b.sources)) {
        Ok(p) => p,
        Err(lent) => {
            b.payload = Payload::from_lent(lent, used);
            return Some(b);
        }
    };
    h.locate(&p);
    let mut out = Vec::with_capacity(5 + BatchHeader::LEN);
    proto::frame_into(&mut out, Kind::Batch, BatchHeader::LEN);
    h.encode(&mut out);
    w.announced += 1;
    // A failed write is the client gone: the connection thread sees it at its next read.
    let _ = (&wire.sock).write_all(&out);
    // The wait on the engine this batch ended, and the next one's start if the client
    // still has room.
    let waited = w.asked.take().map(|a| a.elapsed());
    if ring.slots().outstanding() < credits as usize {
        w.asked = Some(Instant::now());
    }
    drop(w);
    record(waits, |t| t.announced(waited));
    let mut s = shared.stats();
    s.count_batch(&h, true);
    s.batches_announced_early += 1;
    // The client's wait for this batch (none when it was ready before the client asked).
    s.batch_us
        .saturating_record(waited.map_or(1, super::telemetry::micros));
    s.send_us
        .saturating_record(super::telemetry::micros(started.elapsed()));
    None
}

/// The BATCH header of `b`, its positions still to fill in.
fn header(b: &Batch) -> BatchHeader {
    BatchHeader {
        slot: 0,
        flags: if b.labels.is_empty() {
            0
        } else {
            proto::FLAG_LABELS
        } | if b.sources.is_empty() {
            0
        } else {
            proto::FLAG_SOURCES
        },
        epoch: b.epoch,
        index: b.index,
        records: b.ids.len() as u64,
        padding: b.padding as u64,
        data_len: b.payload.len() as u64,
        ids_at: 0,
        offsets_at: 0,
        data_at: 0,
        ready_ns: b.ready_ns,
    }
}

pub(super) struct Conn {
    wire: Arc<Wire>,
    shared: Arc<Shared>,
    buf: FrameBuf,
    stream: Option<Stream>,
    out: Vec<u8>,
    /// When the daemon, waiting on this client, gives up: the end of the handshake's
    /// time, then `idle_timeout` after the client's last frame. Only waits on the client
    /// count (no stream open, or a stream stalled on its acks); `None`: no limit.
    deadline: Option<Instant>,
    /// Whether HELLO was answered (the deadline is then the idle limit).
    greeted: bool,
}

impl Conn {
    pub(super) fn new(sock: UnixStream, shared: Arc<Shared>) -> Conn {
        Conn {
            wire: Arc::new(Wire {
                sock,
                state: Mutex::new(WireState::default()),
            }),
            shared,
            buf: FrameBuf::default(),
            stream: None,
            out: Vec::new(),
            deadline: Some(Instant::now() + HELLO_TIMEOUT),
            greeted: false,
        }
    }

    pub(super) fn serve(&mut self) {
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
        let _ = self.wire.write(&error_frame(code, &msg, true));
        let _ = self.wire.sock.shutdown(std::net::Shutdown::Both);
    }

    /// Reads once from the socket: blocking, or only if something is there.
    fn fill(&mut self, block: bool) -> Result<bool, Leave> {
        if !block {
            let mut fds = [PollFd::new(self.wire.sock.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::ZERO) {
                Ok(0) => return Ok(false),
                Ok(_) => {}
                Err(nix::Error::EINTR) => return Ok(false),
                Err(_) => return Err(Leave::Gone),
            }
        }
        if block {
            // A blocking read waits no longer than the deadline, whatever trickles in.
            let left = self
                .deadline
                .map(|d| d.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                return Err(self.timed_out());
            }
            let _ = self.wire.sock.set_read_timeout(left);
        }
        const CHUNK: usize = 64 * 1024;
        let spare = self.buf.spare(CHUNK);
        let got = loop {
            match (&self.wire.sock).read(spare) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    self.buf.filled(CHUNK, 0);
                    return Err(self.timed_out());
                }
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

    fn timed_out(&self) -> Leave {
        Leave::Fatal(
            "timeout",
            if self.greeted {
                format!(
                    "the client sent nothing for {} s while the daemon waited on it \
                     (--idle-timeout)",
                    self.shared.cfg.idle_timeout.unwrap_or_default().as_secs()
                )
            } else {
                format!(
                    "no complete HELLO within {} s of connecting",
                    HELLO_TIMEOUT.as_secs()
                )
            },
        )
    }

    /// The next whole frame, reading as needed (or only what is there when `block` is
    /// false). Oversized or zero lengths end the connection. Every frame moves the idle
    /// deadline on (once the handshake is done).
    fn frame(&mut self, block: bool) -> Result<Option<(u8, Vec<u8>)>, Leave> {
        loop {
            match self.buf.next(proto::MAX_FRAME) {
                Ok(Some((k, body))) => {
                    if self.greeted {
                        self.deadline = self.shared.cfg.idle_timeout.map(|t| Instant::now() + t);
                    }
                    return Ok(Some((k, body.to_vec())));
                }
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
        self.wire.write(bytes)?;
        Ok(())
    }

    fn handshake(&mut self) -> Result<(), Leave> {
        // A connection that never completes HELLO would hold a client slot for ever: the
        // whole handshake has HELLO_TIMEOUT from the accept (the deadline set in `new`).
        let (kind, body) = self.frame(true)?.expect("a blocking read returns a frame");
        self.greeted = true;
        self.deadline = self.shared.cfg.idle_timeout.map(|t| Instant::now() + t);
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
                self.wait_on_client()?;
                continue;
            }
            if st.pending.is_none() {
                let asked = *self.wire.lock().asked.get_or_insert_with(Instant::now);
                if !st.batches.ready_within(ENGINE_WAIT) {
                    // Nothing yet: take what the client sent (a CLOSE stops the stream
                    // where it is, scatter included) and look again.
                    continue;
                }
                match st.batches.next() {
                    None => {
                        let sent = self.close_stream();
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
                            .entry(reply_code(&e).into())
                            .or_default() += 1;
                        self.send(&error_frame(reply_code(&e), &e.to_string(), false))?;
                        continue;
                    }
                    Some(Ok(b)) => {
                        // The wait on the engine ends with the batch's arrival.
                        let waited = self.wire.lock().asked.take().map(|a| a.elapsed());
                        record(&st.waits, |t| t.announced(waited));
                        st.pending = Some((b, asked))
                    }
                }
            }
            if !self.deliver()? {
                // No room in the ring until the client acknowledges something.
                self.wait_on_client()?;
            }
        }
    }

    /// Waits for the client's next frame (an ack, most likely) and takes it: the stream's
    /// back-pressure, timed.
    fn wait_on_client(&mut self) -> Result<(), Leave> {
        // Waiting on the client now, not on the engine.
        self.wire.lock().asked = None;
        let t = Instant::now();
        let (k, body) = self.frame(true)?.expect("blocking");
        if let Some(st) = &self.stream {
            record(&st.waits, |w| w.client_wait(t.elapsed()));
        }
        self.handle(k, &body)
    }

    /// Writes the pending batch out. False when the ring has no room for it yet.
    fn deliver(&mut self) -> Result<bool, Leave> {
        let st = self.stream.as_mut().expect("a stream");
        let (b, asked) = st.pending.take().expect("a pending batch");
        let started = Instant::now();
        let sent = match st.ring.clone() {
            Some(ring) => self.deliver_shm(&ring, b, asked)?,
            None => self.deliver_inline(b)?,
        };
        let h = match sent {
            Sent::Announced(h, _) => h,
            Sent::Closed => return Ok(true),
            Sent::NoRoom => return Ok(false),
        };
        let in_place = matches!(sent, Sent::Announced(_, true));
        let done = Instant::now();
        let mut s = self.shared.stats();
        s.count_batch(&h, in_place);
        s.batch_us
            .saturating_record(super::telemetry::micros(done.duration_since(asked)));
        s.send_us
            .saturating_record(super::telemetry::micros(done.duration_since(started)));
        Ok(true)
    }

    /// Shared memory: the batch's arrays (and its payload, unless the engine assembled it
    /// in the ring) go into the ring, then its header on the socket.
    fn deliver_shm(
        &mut self,
        ring: &Arc<SharedRing>,
        mut b: Batch,
        asked: Instant,
    ) -> Result<Sent, Leave> {
        let mut h = header(&b);
        // Under the wire's lock: the engine's thread announces batches too, and the
        // announcements must go out whole and in order.
        let mut w = self.wire.lock();
        // Assembled in the ring by the engine: only the arrays are written, and the region
        // is the client's from here. Otherwise the batch is copied in.
        let handed = match std::mem::take(&mut b.payload).into_lent() {
            Ok((lent, used)) => {
                match ring.send_lent(lent, used, &b.ids, &b.offsets, (&b.labels, &b.sources)) {
                    Ok(p) => Some(p),
                    Err(lent) => {
                        b.payload = Payload::from_lent(lent, used);
                        None
                    }
                }
            }
            Err(own) => {
                b.payload = own;
                None
            }
        };
        let (placed, in_place) = match handed {
            Some(p) => (p, true),
            None => {
                let total = super::shm::arrays_len(b.ids.len()) + b.payload.len() as u64;
                if !ring.slots().fits_empty(total) {
                    drop(w);
                    let msg = format!(
                        "batch {} of epoch {} needs {total} bytes, more than the stream's ring of {} bytes: \
                         ask for a smaller batch, or start the daemon with more --memory",
                        b.index,
                        b.epoch,
                        ring.len()
                    );
                    self.refuse_batch(&msg)?;
                    return Ok(Sent::Closed);
                }
                match ring
                    .put(
                        &b.ids,
                        &b.offsets,
                        (&b.labels, &b.sources),
                        &b.payload,
                        b.payload.lend_refused(),
                    )
                    .map_err(|e| Leave::Fatal(reply_code(&e), e.to_string()))?
                {
                    Some(p) => (p, false),
                    None => {
                        drop(w);
                        let st = self.stream.as_mut().expect("a stream");
                        st.pending = Some((b, asked));
                        return Ok(Sent::NoRoom);
                    }
                }
            }
        };
        h.locate(&placed);
        self.out.clear();
        proto::frame_into(&mut self.out, Kind::Batch, BatchHeader::LEN);
        h.encode(&mut self.out);
        w.announced += 1;
        (&self.wire.sock).write_all(&self.out)?;
        Ok(Sent::Announced(h, in_place))
    }

    /// Inline: the header, the arrays and the payload in one frame on the socket.
    fn deliver_inline(&mut self, b: Batch) -> Result<Sent, Leave> {
        let st = self.stream.as_mut().expect("a stream");
        let n = b.ids.len() as u64;
        let arrays = 16 * n + 8 + 4 * (b.labels.len() + b.sources.len()) as u64;
        let mut h = header(&b);
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
            self.refuse_batch(&msg)?;
            return Ok(Sent::Closed);
        }
        self.out.clear();
        proto::frame_into(
            &mut self.out,
            Kind::BatchInline,
            usize::try_from(body).unwrap_or(usize::MAX),
        );
        h.encode(&mut self.out);
        for v in b.ids.iter().chain(b.offsets.iter()) {
            self.out.extend_from_slice(&v.to_le_bytes());
        }
        for l in b.labels.iter().chain(&b.sources) {
            self.out.extend_from_slice(&l.to_le_bytes());
        }
        let mut w = self.wire.lock();
        w.announced += 1;
        (&self.wire.sock).write_all(&self.out)?;
        (&self.wire.sock).write_all(&b.payload)?;
        Ok(Sent::Announced(h, false))
    }

    /// A batch the transport cannot carry: the stream is closed with `too_large`.
    fn refuse_batch(&mut self, msg: &str) -> Result<(), Leave> {
        self.close_stream();
        *self
            .shared
            .stats()
            .errors
            .entry("too_large".into())
            .or_default() += 1;
        self.send(&error_frame("too_large", msg, false))
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
                    let ok = match &st.ring {
                        Some(ring) => ring.slots().release(slot),
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
                if self.stream.is_some() {
                    let sent = self.close_stream();
                    self.send(&proto::json_frame(
                        Kind::End,
                        &proto::End {
                            reason: "closed".into(),
                            batches: sent,
                        },
                    ))?;
                }
                // Otherwise the CLOSE crossed the stream's END (or no stream was open):
                // each stream ends with exactly one END, so it gets no answer.
                Ok(())
            }
            Some(Kind::Stats) => {
                let mut v = self.shared.stats_json();
                if let Some(st) = &self.stream {
                    v["this_stream"] = serde_json::json!(st.id);
                }
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
        let Some((_, src)) = cfg.datasets.iter().find(|(n, _)| *n == req.dataset) else {
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
        // What the first epoch reads (a mixture's view of its draws): the stream is sized by it.
        let ds = &src
            .epoch_view(req.seed, req.epoch)
            .map_err(|e| (reply_code(&e), e.to_string()))?;
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
        if req.resume.is_some() && req.resume_global.is_some() {
            return Err(bad("give resume or resume_global, not both".into()));
        }
        // A global cursor: a round's start is this rank's batch there; inside a round, the
        // rest of its epoch is cut into this job's batches from it.
        let (global_resume, resume_start) = match req.resume_global {
            Some(g) => {
                let r = modes::Resume::Global {
                    epoch: g.epoch,
                    records: g.records,
                };
                let (c, start) = r
                    .resolve_anywhere(&split)
                    .map_err(|e| bad(e.to_string().replace("--resume ", "resume ")))?;
                (Some(c), start)
            }
            None => (None, None),
        };
        let mut opts = ReadOptions {
            seed: req.seed,
            first_epoch: req.epoch,
            epochs: req.epochs,
            batch: req.batch_size,
            rank: req.rank,
            world: req.world,
            tail,
            grouping,
            resume: req
                .resume
                .map(|c| Cursor {
                    epoch: c.epoch,
                    batch: c.batch,
                })
                .or(global_resume),
            resume_start,
            io: IoConfig {
                depth: cfg.queue_depth.max(1),
                throttled: cfg.throttled,
                ..IoConfig::default()
            },
            // The ring is the read-ahead the client sees; the engine keeps four more (two
            // left the pile pass's bursts at pile boundaries waiting on the channel).
            prefetch: 4,
            memory: None,
            baseline: None,
            lender: None,
            ranks: None,
            lead: cfg.lead,
        };
        opts.epoch_range().map_err(|e| bad(e.to_string()))?;
        // The ring: room for several of the largest possible batches, within the share.
        let max_record = ds.size_stats().max;
        let largest = req
            .batch_size
            .saturating_mul(max_record)
            // ids, offsets, labels and sources: 24 bytes a record.
            .saturating_add(req.batch_size.saturating_mul(24))
            .saturating_add(8 + 2 * ALIGN);
        let share = self.shared.ring_share();
        // Refused up front rather than failing mid-stream, and so a request can never make
        // the daemon assemble batches larger than a client's share of the memory.
        if largest > share {
            return Err((
                "too_large",
                format!(
                    "batches of {} records may need {largest} bytes (the longest record is {max_record} bytes), \
                     more than each client's ring share of {share} bytes (--memory / --max-clients): \
                     ask for smaller batches, or start the daemon with more --memory",
                    req.batch_size
                ),
            ));
        }
        let budget = self.shared.budget.clone();
        let stopping = &self.shared.stopping;
        let (ring, credits, ring_grant) = match req.transport {
            Transport::Shm => {
                // Room for the batches the client may hold (its credits) and those the
                // engine is assembling in the ring or has queued, so that the engine is
                // rarely refused a region (and the batch then copied); less when the
                // daemon's memory is short, down to one largest batch.
                let want = req
                    .ring_bytes
                    .unwrap_or_else(|| largest.saturating_mul(MAX_CREDITS as u64 + 8).max(4 << 20));
                let want = want.min(share).max(largest).div_ceil(4096) * 4096;
                let least = largest.div_ceil(4096) * 4096;
                let grant = budget
                    .take("this stream's ring", cfg.admit_wait, stopping, |free| {
                        let fits = want.min(free / 4096 * 4096);
                        if fits >= least {
                            Ok(fits)
                        } else {
                            Err(least)
                        }
                    })
                    .map_err(|m| ("busy", m))?;
                let ring = SharedRing::new(&format!("riffle-{}", req.dataset), grant.bytes())
                    .map_err(|e| ("shm", e.to_string()))?;
                (Some(ring), MAX_CREDITS, Some(grant))
            }
            Transport::Inline => (None, 4, None),
        };
        // The split of the stream's first epoch (resumed inside a round, or whole), for the
        // cursor arithmetic OPENED hands the client.
        let first_split = opts
            .split_for(opts.resume.map_or(req.epoch, |c| c.epoch), ds.len())
            .map_err(|e| ("bad_request", e.to_string()))?;
        let root = crate::scratch::location(cfg.scratch.as_deref(), &ds.files()[0].path);
        let (mode, lead) = planned_mode(cfg.mode, ds, &opts, &root);
        opts.lead = lead;
        *self.wire.lock() = WireState::default();
        // The stream's waits, listed in the stats once it is open.
        let waits = Arc::new(Mutex::new(Waits::default()));
        let mut pass_grant = None;
        let (batches, job) = if req.world > 1 {
            // The ranks of a job share one pass, which assembles their batches in their rings.
            let key = JobKey {
                dataset: req.dataset.clone(),
                seed: req.seed,
                first_epoch: req.epoch,
                epochs: req.epochs,
                batch: req.batch_size,
                world: req.world,
                tail: req.tail.clone(),
                grouping: req.grouping.clone(),
                resume: opts.resume.map(|c| (c.epoch, c.batch)),
                resume_start: opts.resume_start,
                two_pass: mode == ServeMode::TwoPass,
            };
            let shared = &self.shared;
            let admit = |o: &mut ReadOptions| -> Result<Box<dyn Send>, String> {
                Ok(Box::new(self.admit(ds, o, key.two_pass)?))
            };
            let sh = shared.clone();
            let new_pass = NewPass {
                window: cfg.join_window,
                admit: &admit,
                ended: Box::new(move |r| {
                    let mut s = sh.stats();
                    s.read_ops += r.read_ops;
                    s.jobs_now = s.jobs_now.saturating_sub(1);
                }),
            };
            // The pass assembles this rank's batches straight in its ring when it can.
            // The pass hands it over straight from the engine's thread when it can.
            let lender = ring.as_ref().map(|r| self.ring_lender(r, &waits, credits));
            let (stream, id, new) =
                shared
                    .jobs
                    .open(key.clone(), &opts, src, root, lender, new_pass)?;
            if new {
                let mut s = shared.stats();
                s.jobs_total += 1;
                s.jobs_now += 1;
            }
            (stream, Some(id))
        } else {
            // Batches are assembled straight in the ring when it has room, and announced
            // from the engine's thread as they complete (once OPENED is out).
            opts.lender = ring.as_ref().map(|r| self.ring_lender(r, &waits, credits));
            let grant = self
                .admit(ds, &mut opts, mode == ServeMode::TwoPass)
                .map_err(|m| ("busy", m))?;
            pass_grant = Some(grant);
            let stream = match mode {
                ServeMode::Lirs | ServeMode::Auto => src.read(opts, None),
                // The engine makes its own private scratch directory in `root` and removes
                // it when its thread ends.
                ServeMode::TwoPass => src.read(opts, Some(root)),
            }
            .map_err(|e| (reply_code(&e), e.to_string()))?;
            (stream, None)
        };
        let ring_bytes = ring.as_ref().map_or(0, |r| r.len() as u64);
        let stream_id = self.shared.next_stream.fetch_add(1, Ordering::Relaxed) + 1;
        let opened = proto::Opened {
            records: ds.len(),
            batches_per_epoch: split.batches(),
            transport: req.transport,
            ring_bytes,
            credits,
            max_batch_bytes: largest,
            mode: match mode {
                ServeMode::Lirs | ServeMode::Auto => "lirs".into(),
                ServeMode::TwoPass => "two-pass".into(),
            },
            pass: if job.is_some() { "shared" } else { "own" }.into(),
            job,
            stream: Some(stream_id),
            format: ds.format().name().into(),
            columns: ds.columns().to_vec(),
            classes: ds.classes().to_vec(),
            sources: src.mixture().map(|m| m.names.clone()).unwrap_or_default(),
            start: first_split.start,
            start_end: first_split.end(),
            round: split.round(),
            epoch_end: split.end(),
        };
        let frame = proto::json_frame(Kind::Opened, &opened);
        let fd = match &ring {
            Some(r) => Some(r.client_fd().map_err(|e| ("shm", e.to_string()))?),
            None => None,
        };
        let sent = {
            let mut w = self.wire.lock();
            let sent = match &fd {
                Some(fd) => shm::send_with_fd(&self.wire.sock, &frame, fd),
                None => (&self.wire.sock).write_all(&frame),
            };
            w.live = ring.is_some();
            sent
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
            if job.is_some() {
                s.streams_shared += 1;
            } else {
                s.streams_own += 1;
            }
        }
        self.shared.telemetry.add(stream_id, job, waits.clone());
        self.stream = Some(Stream {
            batches,
            _grants: (ring_grant, pass_grant),
            transport: req.transport,
            ring,
            inline_outstanding: Vec::new(),
            inline_next: 0,
            credits,
            pending: None,
            id: stream_id,
            waits,
        });
        Ok(())
    }

    /// Takes from the daemon's budgets what a pass of `opts` needs (see
    /// [`admit_pass`]), setting its memory.
    fn admit(
        &self,
        ds: &crate::dataset::Dataset,
        opts: &mut ReadOptions,
        two_pass: bool,
    ) -> Result<Admitted, String> {
        let sh = &self.shared;
        admit_pass(
            (&sh.budget, sh.scratch_budget.as_ref()),
            sh.cfg.admit_wait,
            &sh.stopping,
            ds,
            opts,
            two_pass,
        )
    }

    /// Stops the open stream, if any; the batches it announced.
    fn close_stream(&mut self) -> u64 {
        let Some(st) = self.stream.take() else {
            return 0;
        };
        // Nothing more is announced from the engine's thread, which stops next.
        let announced = {
            let mut w = self.wire.lock();
            w.live = false;
            w.announced
        };
        let ring_bytes = st.ring.as_ref().map_or(0, |r| r.len() as u64);
        let _ = st.transport;
        let Stream { batches, id, .. } = st;
        self.shared.telemetry.remove(id);
        let report = batches.finish();
        self.shared
            .ring_bytes_now
            .fetch_sub(ring_bytes, Ordering::Relaxed);
        let mut s = self.shared.stats();
        s.streams_now -= 1;
        s.read_ops += report.read_ops;
        announced
    }
}

impl Conn {
    /// The lender of a stream's ring, which announces a batch completed in it from the
    /// engine's thread (see [`announce_ready`]).
    fn ring_lender(
        &self,
        r: &Arc<SharedRing>,
        waits: &Arc<Mutex<Waits>>,
        credits: u32,
    ) -> crate::modes::PayloadLender {
        let (wire, ring, shared, waits) = (
            self.wire.clone(),
            r.clone(),
            self.shared.clone(),
            waits.clone(),
        );
        r.lender(Some(Arc::new(move |b: Batch| {
            announce_ready(&wire, &ring, &shared, &waits, credits, b)
        })))
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.close_stream();
    }
}

/// A stream's mode, and whether a two-pass read leads with LIRS: for `auto`, the planner's
/// choice from the cached profile of the dataset's device (`riffle serve --mode auto`
/// probes it at start when none is cached), LIRS when there is no profile or no plan; a
/// two-pass read leads unless the profile says the device seeks.
fn planned_mode(
    asked: ServeMode,
    ds: &crate::dataset::Dataset,
    opts: &ReadOptions,
    scratch: &Path,
) -> (ServeMode, bool) {
    let model = crate::plan::cached_device_model(&ds.files()[0].path);
    match (asked, model) {
        (ServeMode::Auto, None) => (ServeMode::Lirs, false),
        (ServeMode::Auto, Some(model)) => {
            let free = crate::probe::free_bytes(scratch).ok();
            match crate::plan::plan(ds, opts, &model, free) {
                Ok(p) if p.choice == crate::plan::Choice::TwoPass => (ServeMode::TwoPass, p.lead),
                _ => (ServeMode::Lirs, false),
            }
        }
        (m, model) => (m, crate::plan::lead_for(model.as_ref(), ds, opts)),
    }
}
