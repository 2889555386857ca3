//! The fallback backend: a pool of threads doing pread/pwrite into the same aligned slots.
//!
//! Used when io_uring cannot be set up, or when `RIFFLE_IO=pread` asks for it. One thread
//! per request in flight (capped at [`MAX_THREADS`]): jobs pushed beyond the threads wait in
//! the queue, as requests past a ring's in-flight count wait in the io_uring backend.
#![allow(unsafe_code)]

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use super::{Backend, BackendKind, Completion, DataFile, FileKey, Op, OpKind, Slab, SlotId};
use crate::{Error, Result};

/// The most worker threads one pool starts: its most requests in flight.
pub const MAX_THREADS: usize = 128;

struct Job {
    op: Op,
    file: Arc<DataFile>,
    ptr: SlotPtr,
}

/// The address of an in-flight slot, sent to a worker.
struct SlotPtr(*mut u8);

// SAFETY: the pointer is to slot memory that the backend marked in flight before sending
// it; only the one worker that receives the job touches that memory until it sends the
// completion back, and the backend does not free the slab before every job is done.
unsafe impl Send for SlotPtr {}

/// A pread/pwrite thread pool with its own slots and files.
pub struct PreadBackend {
    slab: Slab,
    /// Files by key; `None` for a removed key, which `free` lists for reuse. A job holds
    /// its own reference to its file, so the fd outlives the job whatever happens here.
    files: Vec<Option<Arc<DataFile>>>,
    free: Vec<u32>,
    jobs: Option<Sender<Job>>,
    done: Receiver<Completion>,
    workers: Vec<JoinHandle<()>>,
    in_flight: usize,
}

impl PreadBackend {
    /// A pool with `depth` slots of `slot_size` bytes aligned to `align`, and as many
    /// threads as `threads` (at least one, at most `depth` and [`MAX_THREADS`]). Slots
    /// beyond [`super::MAX_SLOTS`], or whose bytes together overflow, are refused with
    /// [`Error::Exhausted`].
    pub fn new(depth: usize, slot_size: usize, align: usize, threads: usize) -> Result<Self> {
        super::check_limit("I/O slots", depth, super::MAX_SLOTS)?;
        let slab = Slab::new(depth, slot_size, align)?;
        let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded::<Job>();
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let workers = (0..threads.clamp(1, depth.max(1)).min(MAX_THREADS))
            .map(|i| {
                let rx = jobs_rx.clone();
                let tx = done_tx.clone();
                std::thread::Builder::new()
                    .name(format!("riffle-pread-{i}"))
                    .spawn(move || worker(rx, tx))
                    .map_err(|e| Error::os("cannot start a pread worker thread", e))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(PreadBackend {
            slab,
            files: Vec::new(),
            free: Vec::new(),
            jobs: Some(jobs_tx),
            done: done_rx,
            workers,
            in_flight: 0,
        })
    }

    fn take(&mut self, c: Completion, out: &mut Vec<Completion>) {
        self.in_flight -= 1;
        self.slab.complete(c.op.slot);
        out.push(c);
    }
}

fn worker(jobs: Receiver<Job>, done: Sender<Completion>) {
    for job in jobs {
        let Job { op, file, ptr } = job;
        #[cfg(test)]
        super::tests::pread_gate(file.path());
        let fd = file.file().as_raw_fd();
        let Ok(offset) = libc::off_t::try_from(op.offset) else {
            // An offset past what the kernel takes: refused as the kernel would.
            if done
                .send(Completion {
                    op,
                    result: Err(libc::EINVAL),
                })
                .is_err()
            {
                return;
            }
            continue;
        };
        let result = loop {
            // SAFETY: ptr addresses op.len bytes of the in-flight slots of this request
            // (Slab::start checked that they lie inside the slab and marked every slot
            // they cover in flight), which no one else touches until this completion is
            // sent.
            let rc = unsafe {
                match op.kind {
                    OpKind::Read => libc::pread(fd, ptr.0.cast(), op.len, offset),
                    OpKind::Write => libc::pwrite(fd, ptr.0.cast(), op.len, offset),
                }
            };
            if let Ok(n) = usize::try_from(rc) {
                break Ok(n);
            }
            let errno = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            if errno != libc::EINTR && errno != libc::EAGAIN {
                break Err(errno);
            }
        };
        if done.send(Completion { op, result }).is_err() {
            return;
        }
    }
}

impl Backend for PreadBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Pread
    }

    fn features(&self) -> String {
        format!("thread pool, {} thread(s)", self.workers.len())
    }

    fn depth(&self) -> usize {
        self.slab.count()
    }

    fn max_in_flight(&self) -> usize {
        self.workers.len()
    }

    fn slot_size(&self) -> usize {
        self.slab.slot_size()
    }

    fn buffer_bytes(&self) -> usize {
        self.slab.bytes()
    }

    fn acquire(&mut self) -> Option<SlotId> {
        self.slab.acquire()
    }

    fn release(&mut self, slot: SlotId) {
        self.slab.release(slot)
    }

    fn acquire_at(&mut self, index: usize) -> Option<SlotId> {
        self.slab.acquire_at(index)
    }

    fn run(&self, first: SlotId, n: usize) -> &[u8] {
        self.slab.get_run(first, n)
    }

    fn slot(&self, slot: SlotId) -> &[u8] {
        self.slab.get(slot)
    }

    fn slot_mut(&mut self, slot: SlotId) -> &mut [u8] {
        self.slab.get_mut(slot)
    }

    fn add_file(&mut self, file: Arc<DataFile>) -> Result<FileKey> {
        match self.free.pop() {
            Some(k) => {
                self.files[k as usize] = Some(file);
                Ok(FileKey(k))
            }
            None => {
                let key = u32::try_from(self.files.len()).map_err(|_| Error::Exhausted {
                    resource: "files on one backend",
                    asked: self.files.len() as u64 + 1,
                    limit: u64::from(u32::MAX),
                })?;
                self.files.push(Some(file));
                Ok(FileKey(key))
            }
        }
    }

    fn remove_file(&mut self, key: FileKey) {
        // A job in flight holds its own reference: its fd stays open until it is done.
        self.files[key.0 as usize]
            .take()
            .expect("removing an unknown file key");
        self.free.push(key.0);
    }

    fn file(&self, key: FileKey) -> &Arc<DataFile> {
        self.files[key.0 as usize]
            .as_ref()
            .expect("a removed file key")
    }

    fn push(&mut self, op: Op) -> Result<()> {
        let file = self
            .files
            .get(op.file.0 as usize)
            .and_then(Option::as_ref)
            .expect("unknown file key")
            .clone();
        let ptr = SlotPtr(self.slab.start(op.slot, op.at, op.len));
        let jobs = self.jobs.as_ref().expect("pool is running");
        if jobs.send(Job { op, file, ptr }).is_err() {
            // No worker got it: the slot is the caller's again.
            self.slab.abort(op.slot);
            return Err(Error::Internal("the pread pool has stopped".into()));
        }
        self.in_flight += 1;
        Ok(())
    }

    fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> Result<()> {
        let min = min.min(self.in_flight);
        let mut got = 0;
        while got < min {
            let c = self
                .done
                .recv()
                .map_err(|_| Error::Internal("the pread pool has stopped".into()))?;
            self.take(c, out);
            got += 1;
        }
        while let Ok(c) = self.done.try_recv() {
            self.take(c, out);
        }
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

impl Drop for PreadBackend {
    fn drop(&mut self) {
        // Close the job queue so idle workers exit, let busy ones finish every job sent
        // (they write into the slab, which must outlive them), then join them all: a
        // worker leaves only once the queue is closed and empty.
        self.jobs = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        // Every job sent is done; reap their completions so the slab's states agree.
        while let Ok(c) = self.done.try_recv() {
            self.in_flight -= 1;
            self.slab.complete(c.op.slot);
            #[cfg(test)]
            super::tests::reaped_by_drop(&c, self.slab.get(c.op.slot));
        }
    }
}
