//! A connection's socket as the engine's thread shares it: the batches it completes in a
//! stream's ring are announced from that thread when they may be, in order with the
//! connection thread's own frames.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use super::proto::{self, BatchHeader, Kind};
use super::shm::SharedRing;
use super::state::Shared;
use super::telemetry::{record, Waits};
use crate::modes::{Batch, Payload};

/// A connection's socket, shared with the engine's thread of its open stream, which
/// announces the batches it completes in the ring itself when it may (see
/// [`announce_ready`]). Every frame is written under the lock, so frames never interleave.
pub(super) struct Wire {
    pub(super) sock: UnixStream,
    pub(super) state: Mutex<WireState>,
}

#[derive(Default)]
pub(super) struct WireState {
    /// The engine's thread may announce: a shared-memory stream is open and its OPENED
    /// is out.
    pub(super) live: bool,
    /// Batches of the stream the engine has completed, and those announced (by either
    /// thread): the engine announces one only when every earlier one is out.
    pub(super) completed: u64,
    pub(super) announced: u64,
    /// Since when the stream has waited for the engine's next batch while its client had
    /// room for it (the data stall, as the daemon sees it); `None` while it waits on the
    /// client instead, or is not waiting.
    pub(super) asked: Option<Instant>,
    /// The connection's last frame (the ERROR saying why it ends) is out, or was tried:
    /// nothing follows it, and the socket is shut down.
    pub(super) bye: bool,
}

impl Wire {
    pub(super) fn lock(&self) -> MutexGuard<'_, WireState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `bytes` whole. A write that fails (the client gone, or not reading for the
    /// socket's write timeout) may have left part of a frame: the connection is shut
    /// down, so nothing more is written after it and its thread sees the end.
    pub(super) fn write(&self, bytes: &[u8]) -> std::io::Result<()> {
        let _w = self.lock();
        let wrote = (&self.sock).write_all(bytes);
        if wrote.is_err() {
            let _ = self.sock.shutdown(std::net::Shutdown::Both);
        }
        wrote
    }

    /// Writes `frame`, the connection's last (the ERROR saying why it ends), once whoever
    /// asks (the connection's thread, or the daemon's shutdown for a thread that has not),
    /// within `wait`, and shuts the connection down: no frame follows it.
    pub(super) fn goodbye(&self, frame: &[u8], wait: Duration) {
        self.goodbye_locked(self.lock(), frame, wait);
    }

    /// [`Wire::goodbye`], unless a frame is being written now (its writer holds the lock,
    /// to a client that is not reading it): false then, and nothing is done.
    pub(super) fn try_goodbye(&self, frame: &[u8], wait: Duration) -> bool {
        match self.state.try_lock() {
            Ok(w) => self.goodbye_locked(w, frame, wait),
            Err(TryLockError::Poisoned(p)) => self.goodbye_locked(p.into_inner(), frame, wait),
            Err(TryLockError::WouldBlock) => return false,
        }
        true
    }

    fn goodbye_locked(&self, mut w: MutexGuard<'_, WireState>, frame: &[u8], wait: Duration) {
        if !w.bye {
            w.bye = true;
            w.live = false;
            // The goodbye is small: a client that does not take it at once is not
            // reading, and must not hold whoever writes it.
            let _ = self.sock.set_write_timeout(Some(wait));
            let _ = (&self.sock).write_all(frame);
        }
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// The engine's thread completed `b` (in order): announce it now if it was assembled in
/// the ring, every earlier batch is announced and the client has credit; otherwise the
/// connection thread announces it when it comes out of the stream. This saves waking the
/// connection thread between the engine and the client.
pub(super) fn announce_ready(
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
    // A failed write is the client gone, or not reading for the write timeout (and part
    // of the frame may be out): the connection is shut down, and its thread sees it at
    // its next read.
    if (&wire.sock).write_all(&out).is_err() {
        let _ = wire.sock.shutdown(std::net::Shutdown::Both);
        w.live = false;
    }
    // The wait on the engine this batch ended, and the next one's start if the client
    // still has room.
    let waited = w.asked.take().map(|a| a.elapsed());
    if ring.slots().outstanding() < credits as usize {
        w.asked = Some(Instant::now());
    }
    let next = w.asked;
    drop(w);
    record(waits, |t| {
        t.announced(waited);
        t.engine_waiting(next);
    });
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
pub(super) fn header(b: &Batch) -> BatchHeader {
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
