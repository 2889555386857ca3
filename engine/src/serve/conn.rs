//! One connection of the daemon: the handshake, then streams one at a time. An open
//! stream is an engine `BatchStream` whose batches are copied into the stream's ring and
//! announced; acks, close and stats requests are taken between batches, and the thread
//! waits on the socket only when the ring or the credits are full.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::os::unix::net::UnixStream;

use super::budget::{admit_pass, admit_view, Admitted, Grant};
use super::codes::reply_code;
use super::held::HeldCopy;
use super::job::{JobKey, NewPass};
use super::open::{self, Refusal};
use super::proto::error_frame;
use super::proto::{self, BatchHeader, FrameBuf, Kind, OpenRequest, Transport};
use super::shm::{self, SharedRing};
use super::state::Shared;
use super::telemetry::{record, Waits};
use super::wire::{announce_ready, header, Wire, WireState};
use crate::dataset::Dataset;
use crate::modes::{Batch, BatchStream, Payload, PayloadLender, ReadOptions};
use crate::request::ReadJob;
use crate::source::Source;

/// How long a new connection has for its whole handshake (an idle connection holds a
/// client slot): the HELLO must be complete by then, however it trickles in.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the last frame of a connection (its ERROR) may wait on the client.
pub(super) const GOODBYE_WAIT: Duration = Duration::from_millis(100);

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
    /// The daemon memory its ring and its own pass hold (given back when it closes), and
    /// the resident copy its own pass reads (in use until then).
    _grants: (Option<Grant>, Option<Admitted>, Option<Arc<HeldCopy>>),
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

/// What a new pass of a job is: its key, the bytes of a held copy of the files' first
/// bytes it reads out of (0: none; the pass reads the rest through piles), and where its
/// piles go.
struct PassOf {
    key: JobKey,
    part: u64,
    piles: Option<std::path::PathBuf>,
}

impl PassOf {
    fn new(req: &OpenRequest, job: &ReadJob, held: Option<&Arc<HeldCopy>>) -> PassOf {
        let mut key = open::job_key(req, job);
        let part = held.map_or(0, |h| h.part());
        key.piled = part > 0;
        let piles = job
            .piles()
            .or_else(|| (part > 0).then(|| job.scratch.clone()));
        PassOf { key, part, piles }
    }
}

impl Conn {
    /// The socket of a new connection, as its thread and the daemon's shutdown share it.
    pub(super) fn wire(sock: UnixStream, shared: &Shared) -> Arc<Wire> {
        // Every write has a deadline: a client that does not read for --idle-timeout is
        // cut like one that sends nothing, rather than holding a thread (the engine's,
        // for announcements) in a write for ever.
        let _ = sock.set_write_timeout(shared.cfg.idle_timeout);
        Arc::new(Wire {
            sock,
            state: Mutex::new(WireState::default()),
        })
    }

    pub(super) fn new(wire: Arc<Wire>, shared: Arc<Shared>) -> Conn {
        Conn {
            wire,
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
        // Told first, then the stream stopped: stopping waits for its engine (reads in
        // flight, a GET to a slow store), and the daemon's shutdown does not wait for
        // that to tell the client.
        self.wire
            .goodbye(&error_frame(code, &msg, true), GOODBYE_WAIT);
        self.close_stream();
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
                .catalog
                .all()
                .into_iter()
                .map(|(n, _)| n)
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
                let (asked, began) = {
                    let mut w = self.wire.lock();
                    let began = w.asked.is_none();
                    (*w.asked.get_or_insert_with(Instant::now), began)
                };
                if began {
                    // A stall shows in the stats while it lasts.
                    record(&st.waits, |t| t.engine_waiting(Some(asked)));
                }
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
        if let Some(st) = &self.stream {
            record(&st.waits, |w| w.client_waiting(t));
        }
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

    /// Opens the stream an OPEN asks for (`open.rs` makes it a read), or says why not.
    fn open(&mut self, req: &OpenRequest) -> Result<(), Refusal> {
        let shared = self.shared.clone();
        let src = shared.catalog.get(&req.dataset, &shared)?;
        let src = &src;
        // A mixture's draws are counted before they are drawn (and then by its pass).
        let view = admit_view(&shared.budgets(), src)?;
        let (mut job, held) = open::prepare(req, src, &shared)?;
        // The ring: room for several of the largest possible batches, within the share.
        let largest = open::largest_batch(req.batch_size, &job.first, shared.ring_share())?;
        open::sane_padding(&job.split)?;
        let (ring, credits, ring_grant) = open::ring(&shared, req, largest)?;
        {
            let mut w = self.wire.lock();
            *w = WireState {
                bye: w.bye,
                ..WireState::default()
            };
        }
        // The stream's waits, listed in the stats once it is open.
        let waits = Arc::new(Mutex::new(Waits::default()));
        // Batches are assembled straight in the ring when it has room, and announced from
        // the engine's thread as they complete (once OPENED is out).
        let lender = ring.as_ref().map(|r| self.ring_lender(r, &waits, credits));
        let (batches, job_id, pass_grant) = if req.world > 1 {
            let (batches, id) = self.join_job(req, src, &job, lender, view, held.clone())?;
            (batches, Some(id), None)
        } else {
            let (batches, grant) =
                self.own_pass(req, &mut job, src, lender, view, held.as_ref())?;
            (batches, None, Some(grant))
        };
        // A pass of the job holds the copy it reads; this stream's own pass, through it.
        let held = held.filter(|_| job_id.is_none());
        let ring_bytes = ring.as_ref().map_or(0, |r| r.len() as u64);
        let stream_id = shared.next_stream.fetch_add(1, Ordering::Relaxed) + 1;
        let opened = proto::Opened {
            ring_bytes,
            credits,
            pass: if job_id.is_some() { "shared" } else { "own" }.into(),
            job: job_id,
            stream: Some(stream_id),
            ..open::opened(req, src, &job, largest)
        };
        self.send_opened(&opened, ring.as_ref())?;
        shared
            .ring_bytes_now
            .fetch_add(ring_bytes, Ordering::Relaxed);
        {
            let mut s = shared.stats();
            s.streams_total += 1;
            s.streams_now += 1;
            if job_id.is_some() {
                s.streams_shared += 1;
            } else {
                s.streams_own += 1;
            }
        }
        shared.telemetry.add(stream_id, job_id, waits.clone());
        self.stream = Some(Stream {
            batches,
            _grants: (ring_grant, pass_grant, held),
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

    /// This rank's stream from its job's shared pass (see `job.rs`): the ranks of a job
    /// share one pass, which assembles each rank's batches straight in its ring when it
    /// can and hands them over from the engine's thread.
    fn join_job(
        &self,
        req: &OpenRequest,
        src: &Source,
        job: &ReadJob,
        lender: Option<PayloadLender>,
        view: Option<Grant>,
        held: Option<Arc<HeldCopy>>,
    ) -> Result<(BatchStream, u64), Refusal> {
        let pass = PassOf::new(req, job, held.as_ref());
        let key = pass.key.clone();
        // A new pass takes over what the OPEN took for its draws; a rank joining a live
        // pass gives it back.
        let view = Mutex::new(view);
        // A resident pass holds the copy it reads (in use) until it ends, and reads with
        // its own memory and the copy's.
        let admit = |o: &mut ReadOptions| -> Result<Box<dyn Send>, Refusal> {
            let view = view.lock().unwrap_or_else(|p| p.into_inner()).take();
            let admitted = self.admit(&pass, (&job.first, src), o, view)?;
            Ok(Box::new((admitted, held.clone())))
        };
        let sh = self.shared.clone();
        let new_pass = NewPass {
            window: self.shared.cfg.join_window,
            deadline: self.shared.cfg.join_deadline,
            streams: req.streams,
            admit: &admit,
            ended: Box::new(move |r| {
                let mut s = sh.stats();
                s.count_pass(&r);
                s.jobs_now = s.jobs_now.saturating_sub(1);
            }),
        };
        let scratch = job.scratch.clone();
        let resident = held.clone();
        let got =
            (self.shared.jobs).open(key, &job.opts, src, scratch, resident, lender, new_pass)?;
        if got.new {
            let mut s = self.shared.stats();
            s.jobs_total += 1;
            s.jobs_now += 1;
            s.late_streams += got.late as u64;
        }
        Ok((got.stream, got.id))
    }

    /// Admits a new `pass` over `first` (of `src`) to the daemon's budgets, taking the piles
    /// kept for its epoch and arranging its roll past its last (`rolled.rs`; a mixture,
    /// whose view is drawn anew each epoch, never rolls).
    fn admit(
        &self,
        pass: &PassOf,
        (first, src): (&Dataset, &Source),
        opts: &mut ReadOptions,
        view: Option<Grant>,
    ) -> Result<Admitted, Refusal> {
        let ds = src.mixture().is_none().then_some(first);
        let (piles, part) = (pass.piles.as_deref(), pass.part);
        self.shared
            .rolled
            .admit((&pass.key, part, ds), opts, |o, kept| {
                admit_pass(&self.shared.budgets(), first, o, (piles, part, kept), view)
            })
    }

    /// A pass of the stream's own (a world of one), admitted to the daemon's budgets.
    fn own_pass(
        &self,
        req: &OpenRequest,
        job: &mut ReadJob,
        src: &Source,
        lender: Option<PayloadLender>,
        view: Option<Grant>,
        held: Option<&Arc<HeldCopy>>,
    ) -> Result<(BatchStream, Admitted), Refusal> {
        job.opts.lender = lender;
        let pass = PassOf::new(req, job, held);
        let grant = self.admit(&pass, (&job.first, src), &mut job.opts, view)?;
        // Two-pass: the engine makes its own private scratch directory where the piles go
        // and removes it when its thread ends. Resident: out of the dataset's copy, with
        // the pass's memory and the copy's (a part's pass: its piles in the scratch).
        let stream = match held {
            Some(h) => h.start(src.dataset().clone(), job.opts.clone(), job.scratch.clone()),
            None => job.read(src),
        };
        let stream = stream.map_err(|e| (reply_code(&e), e.to_string()))?;
        Ok((stream, grant))
    }

    /// Sends OPENED (with the ring's descriptor, for shared memory); from here the
    /// engine's thread may announce the batches it completes in the ring.
    fn send_opened(
        &self,
        opened: &proto::Opened,
        ring: Option<&Arc<SharedRing>>,
    ) -> Result<(), Refusal> {
        let frame = proto::json_frame(Kind::Opened, opened);
        let fd = match ring {
            Some(r) => Some(r.client_fd().map_err(|e| ("shm", e.to_string()))?),
            None => None,
        };
        let mut w = self.wire.lock();
        let sent = match &fd {
            Some(fd) => shm::send_with_fd(&self.wire.sock, &frame, fd),
            None => (&self.wire.sock).write_all(&frame),
        };
        w.live = ring.is_some() && !w.bye;
        // A failed send shows up as the client being gone at the next read.
        let _ = sent;
        Ok(())
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
        s.count_pass(&report);
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
