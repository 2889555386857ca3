//! Test hooks the backends call under `cfg(test)` (what a Drop reaps, a gate that holds
//! pread jobs, a wrapper for every backend `open_backend` makes), the [`Short`] backend,
//! and a time limit for tests whose failure would otherwise hang.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;

use crate::io::{Backend, BackendKind, Completion, DataFile, FileKey, Op, OpKind, SlotId};

/// Tags with these bits set are watched: what a backend's Drop reaps for them is kept.
pub(in crate::io) const WATCHED: u64 = 0xD809 << 48;

static REAPED_BY_DROP: Mutex<Vec<(u64, Vec<u8>)>> = Mutex::new(Vec::new());

/// Called by a backend's Drop for every completion it reaps, with the slot's bytes.
pub(in crate::io) fn reaped_by_drop(c: &Completion, slot: &[u8]) {
    if c.op.tag & WATCHED == WATCHED {
        let n = c.result.unwrap_or(0);
        let bytes = slot[c.op.at..c.op.at + n].to_vec();
        REAPED_BY_DROP.lock().unwrap().push((c.op.tag, bytes));
    }
}

/// The bytes the completion of the watched request `tag` carried, if a Drop reaped it.
pub(in crate::io) fn taken_by_drop(tag: u64) -> Option<Vec<u8>> {
    let list = REAPED_BY_DROP.lock().unwrap();
    list.iter().find(|(t, _)| *t == tag).map(|(_, b)| b.clone())
}

/// Paths whose pread jobs wait until the test opens the gate.
static GATED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static GATE_OPENED: Condvar = Condvar::new();

/// Called by a pread worker before each job: waits while the job's file is gated.
pub(in crate::io) fn pread_gate(path: &Path) {
    let mut gated = GATED.lock().unwrap();
    while gated.iter().any(|p| p == path) {
        gated = GATE_OPENED.wait(gated).unwrap();
    }
}

pub(in crate::io) fn close_gate(path: &Path) {
    GATED.lock().unwrap().push(path.to_owned());
}

pub(in crate::io) fn open_gate(path: &Path) {
    GATED.lock().unwrap().retain(|p| p != path);
    GATE_OPENED.notify_all();
}

thread_local! {
    /// Whether backends opened on this thread make every transfer short.
    static SHORT_TRANSFERS: Cell<bool> = const { Cell::new(false) };
}

/// Called by `open_backend`: wraps the backend in [`Short`] when this thread asked for it.
pub(in crate::io) fn wrap_backend(b: Box<dyn Backend>) -> Box<dyn Backend> {
    if SHORT_TRANSFERS.get() {
        Box::new(Short {
            asked: vec![None; b.depth()],
            inner: b,
        })
    } else {
        b
    }
}

/// Runs `f` with every backend it opens (on this thread) making transfers short.
pub(crate) fn with_short_transfers<T>(f: impl FnOnce() -> T) -> T {
    SHORT_TRANSFERS.set(true);
    let r = f();
    SHORT_TRANSFERS.set(false);
    r
}

/// A backend whose transfers of four alignment units or more stop short, as the kernel
/// may let them: about half is transferred, and the count reported ends 17 bytes before
/// that, off the alignment. Read bytes past what is reported are overwritten with 0xEE, so
/// a caller that used them, or restarted from the beginning, or did not continue, returns
/// wrong bytes or fails.
struct Short {
    inner: Box<dyn Backend>,
    /// The request as the caller pushed it, per slot.
    asked: Vec<Option<Op>>,
}

impl Backend for Short {
    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }
    fn features(&self) -> String {
        self.inner.features()
    }
    fn depth(&self) -> usize {
        self.inner.depth()
    }
    fn max_in_flight(&self) -> usize {
        self.inner.max_in_flight()
    }
    fn slot_size(&self) -> usize {
        self.inner.slot_size()
    }
    fn buffer_bytes(&self) -> usize {
        self.inner.buffer_bytes()
    }
    fn acquire(&mut self) -> Option<SlotId> {
        self.inner.acquire()
    }
    fn release(&mut self, slot: SlotId) {
        self.inner.release(slot)
    }
    fn acquire_at(&mut self, index: usize) -> Option<SlotId> {
        self.inner.acquire_at(index)
    }
    fn run(&self, first: SlotId, n: usize) -> &[u8] {
        self.inner.run(first, n)
    }
    fn slot(&self, slot: SlotId) -> &[u8] {
        self.inner.slot(slot)
    }
    fn slot_mut(&mut self, slot: SlotId) -> &mut [u8] {
        self.inner.slot_mut(slot)
    }
    fn add_file(&mut self, file: Arc<DataFile>) -> crate::Result<FileKey> {
        self.inner.add_file(file)
    }
    fn remove_file(&mut self, key: FileKey) {
        self.inner.remove_file(key)
    }
    fn file(&self, key: FileKey) -> &Arc<DataFile> {
        self.inner.file(key)
    }
    fn push(&mut self, op: Op) -> crate::Result<()> {
        let unit = self.inner.file(op.file).alignment().io_unit();
        let mut part = op;
        if op.len >= 4 * unit {
            part.len = op.len / 2 / unit * unit;
        }
        self.inner.push(part)?;
        self.asked[op.slot.index()] = Some(op);
        Ok(())
    }
    fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> crate::Result<()> {
        let from = out.len();
        let r = self.inner.wait(min, out);
        for c in &mut out[from..] {
            let asked = self.asked[c.op.slot.index()].take().expect("a pushed op");
            if let Ok(n) = c.result {
                let shown = if c.op.len < asked.len && n == c.op.len {
                    n - 17
                } else {
                    n
                };
                if asked.kind == OpKind::Read {
                    // The request may cover the slots after its own: poison each one's part.
                    let size = self.inner.slot_size();
                    let (from, end) = (asked.at + shown, asked.at + asked.len);
                    for k in from / size..end.div_ceil(size) {
                        let slot = SlotId(asked.slot.0 + u32::try_from(k).expect("a slot index"));
                        let (lo, hi) = (
                            from.max(k * size) - k * size,
                            end.min((k + 1) * size) - k * size,
                        );
                        self.inner.slot_mut(slot)[lo..hi].fill(0xEE);
                    }
                }
                c.result = Ok(shown);
            }
            c.op = asked;
        }
        r
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
}

/// Runs `f` on its own thread and returns what it returns, failing the test if that takes
/// more than `secs` seconds. A broken backend hangs rather than fails (a failed assertion
/// unwinds into a Drop that waits for a request that will never complete): the hung thread
/// is left behind and the test fails.
pub(in crate::io) fn within<T: Send + 'static>(
    secs: u64,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Disconnected) => match worker.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the worker sent nothing and did not panic"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("still running after {secs} s: it hangs (after a failed assertion?)")
        }
    }
}
