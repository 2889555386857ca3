//! The io_uring backend: one ring per backend (so one per I/O thread), batched submission,
//! registered buffers and files where the kernel allows them.
//!
//! The submission queue has at least as many entries as there are slots, and every request
//! holds a slot, so in-flight requests never exceed the ring and the completion queue
//! (twice the submission queue) never overflows.
#![allow(unsafe_code)]

use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::AsRawFd;
use std::sync::{Arc, OnceLock};

use io_uring::{opcode, squeue, types, IoUring};

use super::{Backend, BackendKind, Completion, DataFile, FileKey, Op, OpKind, Slab};
use crate::{Error, Result};

/// What the kernel's io_uring supports, probed once per process.
#[derive(Clone, Debug)]
pub struct UringSupport {
    /// Why a ring cannot be created, if it cannot.
    pub unavailable: Option<String>,
    /// IORING_OP_READ_FIXED / WRITE_FIXED (registered buffers).
    pub fixed_rw: bool,
    /// IORING_OP_READ / WRITE (plain, non-vectored).
    pub plain_rw: bool,
}

/// Probes io_uring once per process.
pub fn support() -> &'static UringSupport {
    static SUPPORT: OnceLock<UringSupport> = OnceLock::new();
    SUPPORT.get_or_init(|| match IoUring::new(2) {
        Err(e) => UringSupport {
            unavailable: Some(explain(&e)),
            fixed_rw: false,
            plain_rw: false,
        },
        Ok(ring) => {
            let mut probe = io_uring::Probe::new();
            if ring.submitter().register_probe(&mut probe).is_err() {
                // Kernels before 5.6 have no probe; they have no IORING_OP_READ either.
                return UringSupport {
                    unavailable: None,
                    fixed_rw: true,
                    plain_rw: false,
                };
            }
            UringSupport {
                unavailable: None,
                fixed_rw: probe.is_supported(opcode::ReadFixed::CODE)
                    && probe.is_supported(opcode::WriteFixed::CODE),
                plain_rw: probe.is_supported(opcode::Read::CODE)
                    && probe.is_supported(opcode::Write::CODE),
            }
        }
    })
}

fn explain(e: &io::Error) -> String {
    let sysctl = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .map(|s| s.trim().to_owned());
    match (e.raw_os_error(), sysctl.as_deref()) {
        (Some(libc::ENOSYS), _) => "the kernel has no io_uring (ENOSYS)".into(),
        (Some(libc::EPERM), Some(v)) if v != "0" => {
            format!("kernel.io_uring_disabled = {v} (EPERM)")
        }
        (Some(libc::EPERM), _) => "not permitted (EPERM; seccomp or a container policy)".into(),
        _ => format!("io_uring_setup failed: {e}"),
    }
}

/// An io_uring with its own slots and files.
pub struct UringBackend {
    // Field order matters for drop: the ring is torn down only after Drop::drop has
    // reaped every in-flight request, and the slab is freed only if that succeeded.
    ring: IoUring,
    slab: ManuallyDrop<Slab>,
    files: Vec<Arc<DataFile>>,
    fixed_files: bool,
    fixed_bufs: bool,
    /// The op in flight on each slot (user_data is the slot index).
    ops: Vec<Option<Op>>,
    queued: usize,
    in_flight: usize,
    requeue: Vec<Op>,
    submit_batch: usize,
}

const MAX_FILES: u32 = 1024;

impl UringBackend {
    /// A ring with `depth` slots of `slot_size` bytes aligned to `align`, submitting once
    /// `submit_batch` requests are queued (see [`super::IoConfig::submit_batch`]).
    pub fn new(depth: usize, slot_size: usize, align: usize, submit_batch: usize) -> Result<Self> {
        let sup = support();
        if let Some(why) = &sup.unavailable {
            return Err(Error::UringUnavailable(why.clone()));
        }
        let entries = (depth as u32).next_power_of_two().max(2);
        let ring = IoUring::builder()
            .setup_cqsize(entries * 2)
            .build(entries)
            .map_err(|e| Error::UringUnavailable(explain(&e)))?;
        let mut slab = Slab::new(depth, slot_size, align);
        let iovecs = slab.iovecs();
        let knobs = std::env::var("RIFFLE_URING").unwrap_or_default();
        let want_bufs = !knobs.split(',').any(|k| k == "nofixedbufs");
        let want_files = !knobs.split(',').any(|k| k == "nofixedfiles");
        let fixed_bufs = want_bufs
            && sup.fixed_rw
            // SAFETY: the iovecs describe the slab's memory, which stays allocated and at
            // the same address for as long as the ring exists (the slab is freed in Drop
            // only after the ring has no request in flight).
            && unsafe { ring.submitter().register_buffers(&iovecs) }.is_ok();
        let fixed_files = want_files && ring.submitter().register_files_sparse(MAX_FILES).is_ok();
        if !fixed_bufs && !sup.plain_rw {
            return Err(Error::UringUnavailable(
                "the kernel supports neither registered buffers nor IORING_OP_READ".into(),
            ));
        }
        Ok(UringBackend {
            ring,
            slab: ManuallyDrop::new(slab),
            files: Vec::new(),
            fixed_files,
            fixed_bufs,
            ops: vec![None; depth],
            queued: 0,
            in_flight: 0,
            requeue: Vec::new(),
            submit_batch: submit_batch.max(1),
        })
    }

    fn sqe(&mut self, op: &Op, ptr: *mut u8) -> squeue::Entry {
        let raw = self.files[op.file.0 as usize].file().as_raw_fd();
        let len = op.len as u32;
        let idx = op.slot.index() as u16;
        macro_rules! build {
            ($fd:expr) => {
                match (op.kind, self.fixed_bufs) {
                    (OpKind::Read, true) => opcode::ReadFixed::new($fd, ptr, len, idx)
                        .offset(op.offset)
                        .build(),
                    (OpKind::Read, false) => {
                        opcode::Read::new($fd, ptr, len).offset(op.offset).build()
                    }
                    (OpKind::Write, true) => opcode::WriteFixed::new($fd, ptr, len, idx)
                        .offset(op.offset)
                        .build(),
                    (OpKind::Write, false) => {
                        opcode::Write::new($fd, ptr, len).offset(op.offset).build()
                    }
                }
            };
        }
        let e = if self.fixed_files {
            build!(types::Fixed(op.file.0))
        } else {
            build!(types::Fd(raw))
        };
        e.user_data(op.slot.index() as u64)
    }

    fn push_sqe(&mut self, entry: &squeue::Entry) -> Result<()> {
        loop {
            // SAFETY: the entry points into a slot that was marked in flight by Slab::start
            // (or stays in flight for a requeue), so its memory is neither reachable by the
            // caller nor freed until the completion is reaped in `reap`. The fd (or fixed
            // file) stays open: self.files holds it until the backend is dropped.
            let pushed = unsafe { self.ring.submission().push(entry) };
            if pushed.is_ok() {
                self.queued += 1;
                return Ok(());
            }
            // The queue cannot be full while in-flight <= slots <= entries, but if it ever
            // is, submitting frees it.
            self.submit(0)?;
        }
    }

    fn submit(&mut self, want: usize) -> Result<()> {
        loop {
            match self.ring.submit_and_wait(want) {
                Ok(_) => {
                    // The kernel may take fewer entries than were queued; what it left
                    // stays in the submission queue for the next call.
                    self.queued = self.ring.submission().len();
                    return Ok(());
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::EAGAIN)) => {
                    // The completion queue needs room (EBUSY) or the kernel is short of
                    // resources (EAGAIN): the caller reaps and tries again.
                    return Ok(());
                }
                Err(e) => {
                    return Err(Error::io("io_uring", "io_uring_enter", None, e));
                }
            }
        }
    }

    fn reap(&mut self, out: &mut Vec<Completion>) -> usize {
        let mut got = 0;
        let mut cq = self.ring.completion();
        cq.sync();
        for cqe in &mut cq {
            let slot = cqe.user_data() as usize;
            let op = self.ops[slot].expect("completion for a slot with no op");
            let res = cqe.result();
            if res == -libc::EAGAIN || res == -libc::EINTR {
                // Transient: the same request goes again, the slot stays in flight.
                self.requeue.push(op);
                continue;
            }
            self.ops[slot] = None;
            self.in_flight -= 1;
            self.slab.complete(op.slot);
            out.push(Completion {
                op,
                result: if res < 0 { Err(-res) } else { Ok(res as usize) },
            });
            got += 1;
        }
        got
    }
}

impl Backend for UringBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Uring
    }

    fn features(&self) -> String {
        let bufs = if self.fixed_bufs {
            "registered buffers"
        } else {
            "plain buffers"
        };
        let files = if self.fixed_files {
            "fixed files"
        } else {
            "plain fds"
        };
        format!("{bufs}, {files}")
    }

    fn slab(&self) -> &Slab {
        &self.slab
    }

    fn slab_mut(&mut self) -> &mut Slab {
        &mut self.slab
    }

    fn add_file(&mut self, file: Arc<DataFile>) -> Result<FileKey> {
        let key = FileKey(self.files.len() as u32);
        if self.fixed_files {
            if key.0 >= MAX_FILES {
                return Err(Error::Invalid(format!(
                    "more than {MAX_FILES} files in one ring"
                )));
            }
            let fd = file.file().as_raw_fd();
            self.ring
                .submitter()
                .register_files_update(key.0, &[fd])
                .map_err(|e| Error::io(file.path(), "register file with io_uring", None, e))?;
        }
        self.files.push(file);
        Ok(key)
    }

    fn file(&self, key: FileKey) -> &Arc<DataFile> {
        &self.files[key.0 as usize]
    }

    fn push(&mut self, op: Op) -> Result<()> {
        assert!(
            op.len <= self.slab.slot_size(),
            "request longer than a slot"
        );
        assert!((op.file.0 as usize) < self.files.len(), "unknown file key");
        let ptr = self.slab.start(op.slot);
        let entry = self.sqe(&op, ptr);
        self.ops[op.slot.index()] = Some(op);
        self.in_flight += 1;
        self.push_sqe(&entry)?;
        // Submit now so the device starts at once, unless this is the only request in
        // flight: then the caller's next call is a wait, which submits and waits in one
        // system call (at queue depth 1 that saves a call per request).
        if self.queued >= self.submit_batch && self.in_flight > 1 {
            self.submit(0)?;
        }
        Ok(())
    }

    fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> Result<()> {
        let min = min.min(self.in_flight);
        let mut got = 0;
        loop {
            got += self.reap(out);
            for op in std::mem::take(&mut self.requeue) {
                let ptr = self.slab.in_flight_ptr(op.slot);
                let entry = self.sqe(&op, ptr);
                self.push_sqe(&entry)?;
            }
            if got >= min {
                if self.queued > 0 {
                    self.submit(0)?;
                }
                return Ok(());
            }
            self.submit(1)?;
        }
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

impl Drop for UringBackend {
    fn drop(&mut self) {
        let mut sink = Vec::new();
        while self.in_flight > 0 {
            if self.wait(self.in_flight, &mut sink).is_err() {
                // The kernel may still write into the slots: leak them rather than free
                // memory that is in use.
                return;
            }
            sink.clear();
        }
        // SAFETY: nothing is in flight, so the kernel holds no pointer into the slab, and
        // the slab is dropped exactly once (here).
        unsafe { ManuallyDrop::drop(&mut self.slab) };
    }
}
