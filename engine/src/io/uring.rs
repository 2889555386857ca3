//! The io_uring backend: one ring per backend (so one per I/O thread), batched submission,
//! registered buffers and files where the kernel allows them.
//!
//! The ring is sized from the most requests in flight, not from the slots: a ring of 16,384
//! chunk slots with 16 reads in flight has 16 entries. The backend keeps at most that many
//! requests at the kernel (a push past it first reaps a completion, kept for the next
//! `wait`), so the submission queue always has room and the completion queue (twice the
//! submission queue) never overflows. A request counts as in flight from the moment it is
//! pushed until its completion is returned by `wait`, and only then: a push that fails
//! gives the slot back, and a requeued request stays counted until the kernel has it again.
#![allow(unsafe_code)]

use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::AsRawFd;
use std::sync::{Arc, OnceLock};

use io_uring::{opcode, squeue, types, IoUring};

use super::{
    Backend, BackendKind, Completion, DataFile, FileKey, Op, OpKind, Slab, SlotId, UringFeatures,
    SUBMIT_AT_WAIT, URING_MAX_ENTRIES, URING_MAX_REG_BUFFERS,
};
use crate::{Error, Result};

/// What the kernel's io_uring supports (probed once per process, when it can be).
#[derive(Clone, Debug)]
pub struct UringSupport {
    /// IORING_OP_READ_FIXED / WRITE_FIXED (registered buffers).
    pub fixed_rw: bool,
    /// IORING_OP_READ / WRITE (plain, non-vectored).
    pub plain_rw: bool,
}

/// Why an io_uring backend cannot be set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// The kernel lacks io_uring or a feature riffle needs (ENOSYS, EINVAL), or a policy
    /// forbids it (EPERM: seccomp, `kernel.io_uring_disabled`). This lasts as long as the
    /// process, so the probe's answer is kept.
    Unsupported(String),
    /// A resource ran short (EMFILE, ENFILE, ENOMEM: open files, memory or locked memory)
    /// or the kernel answered something unexpected: it may pass, so nothing is kept and
    /// the next backend tries again.
    Transient(String),
}

impl Unavailable {
    /// The reason, for notices and errors.
    pub fn why(&self) -> &str {
        match self {
            Unavailable::Unsupported(why) | Unavailable::Transient(why) => why,
        }
    }
}

/// What the kernel's io_uring supports. The answer is probed with a small ring and kept
/// for the process when it is definite (supported, or unsupported); a transient failure
/// (see [`Unavailable::Transient`]) is returned without being kept, so a long-lived
/// process is not left without io_uring by one bad moment.
pub fn support() -> std::result::Result<&'static UringSupport, Unavailable> {
    static SUPPORT: OnceLock<std::result::Result<UringSupport, String>> = OnceLock::new();
    probe_cached(&SUPPORT, || IoUring::new(2))
}

/// [`support`] over a given cache and ring constructor (tests inject failures here).
pub(super) fn probe_cached(
    cache: &OnceLock<std::result::Result<UringSupport, String>>,
    setup: impl FnOnce() -> io::Result<IoUring>,
) -> std::result::Result<&UringSupport, Unavailable> {
    let known = match cache.get() {
        Some(known) => known,
        None => {
            let found = match setup() {
                Ok(ring) => Ok(probe_ops(&ring)),
                Err(e) => match classify(&e) {
                    Unavailable::Unsupported(why) => Err(why),
                    transient => return Err(transient),
                },
            };
            cache.get_or_init(|| found)
        }
    };
    known
        .as_ref()
        .map_err(|why| Unavailable::Unsupported(why.clone()))
}

fn probe_ops(ring: &IoUring) -> UringSupport {
    let mut probe = io_uring::Probe::new();
    if ring.submitter().register_probe(&mut probe).is_err() {
        // Kernels before 5.6 have no probe; they have no IORING_OP_READ either.
        return UringSupport {
            fixed_rw: true,
            plain_rw: false,
        };
    }
    UringSupport {
        fixed_rw: probe.is_supported(opcode::ReadFixed::CODE)
            && probe.is_supported(opcode::WriteFixed::CODE),
        plain_rw: probe.is_supported(opcode::Read::CODE) && probe.is_supported(opcode::Write::CODE),
    }
}

/// Sorts an `io_uring_setup` failure into what lasts and what may pass, with the reason.
pub(super) fn classify(e: &io::Error) -> Unavailable {
    let sysctl = || {
        std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
            .ok()
            .map(|s| s.trim().to_owned())
    };
    match e.raw_os_error() {
        Some(libc::ENOSYS) => {
            Unavailable::Unsupported("the kernel has no io_uring (ENOSYS)".into())
        }
        Some(libc::EPERM) => Unavailable::Unsupported(match sysctl() {
            Some(v) if v != "0" => format!("kernel.io_uring_disabled = {v} (EPERM)"),
            _ => "not permitted (EPERM; seccomp or a container policy)".into(),
        }),
        Some(libc::EINVAL) => Unavailable::Unsupported(
            "the kernel refused the ring's parameters (EINVAL; a kernel too old for them)".into(),
        ),
        Some(libc::EMFILE) => Unavailable::Transient(
            "too many open files in this process (EMFILE; see ulimit -n)".into(),
        ),
        Some(libc::ENFILE) => {
            Unavailable::Transient("too many open files in the system (ENFILE)".into())
        }
        Some(libc::ENOMEM) => Unavailable::Transient(
            "out of memory or over the locked-memory limit (ENOMEM; see ulimit -l)".into(),
        ),
        _ => Unavailable::Transient(format!("io_uring_setup failed: {e}")),
    }
}

/// A ring as set up, with the flags it got.
struct Ring {
    ring: IoUring,
    coop_taskrun: bool,
    sqpoll: bool,
}

/// A ring of `entries` submission entries (twice as many completion entries) with what
/// `features` asks for, else a plain ring (a kernel without the flags).
fn build_ring(entries: u32, features: UringFeatures) -> std::result::Result<Ring, Unavailable> {
    // COOP_TASKRUN (Linux 5.19): completions are run when this thread next enters the
    // kernel (every wait does) instead of interrupting it with a task-work signal. The
    // kernel refuses it with SQPOLL, whose thread runs the completions itself.
    let coop = features.coop_taskrun && features.sqpoll_idle_ms.is_none();
    let build = |coop: bool, sqpoll: Option<u32>| {
        let mut b = IoUring::builder();
        b.setup_cqsize(entries * 2);
        if coop {
            b.setup_coop_taskrun();
        }
        if let Some(idle) = sqpoll {
            b.setup_sqpoll(idle);
        }
        b.build(entries)
    };
    match build(coop, features.sqpoll_idle_ms) {
        Ok(ring) => Ok(Ring {
            ring,
            coop_taskrun: coop,
            sqpoll: features.sqpoll_idle_ms.is_some(),
        }),
        Err(_) => Ok(Ring {
            ring: build(false, None).map_err(|e| classify(&e))?,
            coop_taskrun: false,
            sqpoll: false,
        }),
    }
}

/// An io_uring with its own slots and files.
pub struct UringBackend {
    // Field order matters for drop: the ring is torn down only after Drop::drop has
    // reaped every in-flight request, and the slab is freed only if that succeeded.
    ring: IoUring,
    slab: ManuallyDrop<Slab>,
    /// Files by key; `None` for a removed key, which `free` lists for reuse.
    files: Vec<Option<Arc<DataFile>>>,
    free: Vec<u32>,
    fixed_files: bool,
    fixed_bufs: bool,
    /// Whether the ring was set up with COOP_TASKRUN, and with SQPOLL.
    coop_taskrun: bool,
    sqpoll: bool,
    /// The op in flight on each slot (user_data is the slot index).
    ops: Vec<Option<Op>>,
    /// Entries in the submission queue that the kernel has not taken yet.
    queued: usize,
    /// Requests pushed whose completion `wait` has not returned: in the submission queue,
    /// in the kernel, waiting in `requeue`, or reaped into `ready`. Those but `ready`'s
    /// are exactly the slots that are InFlight.
    in_flight: usize,
    /// The most requests at the kernel (in flight but not in `ready`): at most the ring's
    /// submission entries.
    max_in_flight: usize,
    /// Completions reaped to make room for a push, returned by the next `wait`.
    ready: Vec<Completion>,
    /// Why the slots are not registered buffers, when they are not.
    plain_why: Option<&'static str>,
    /// Requests that completed with EAGAIN/EINTR, to be queued again (still in flight).
    requeue: Vec<Op>,
    submit_batch: usize,
    #[cfg(test)]
    faults: Faults,
}

/// Failures the tests inject where the kernel would rarely produce them.
#[cfg(test)]
#[derive(Default)]
pub(super) struct Faults {
    /// The next this many pushes into the submission queue find it full.
    pub(super) sq_full: u32,
    /// The next this many io_uring_enter calls fail with EIO.
    pub(super) enter: u32,
    /// The next this many completions reaped read as EAGAIN.
    pub(super) eagain: u32,
}

const MAX_FILES: u32 = 1024;

/// The most bytes one read or write moves (Linux's MAX_RW_COUNT: `INT_MAX` rounded down to
/// a page): a longer request is sent as this many and completes short, as the kernel would
/// make it anyway, and the caller continues it.
const MAX_RW_COUNT: u32 = 0x7fff_f000;

/// The sizes of a ring's slots and queue.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Number of slots.
    pub slots: usize,
    /// Bytes per slot (a multiple of `align`).
    pub slot_size: usize,
    /// The slots' alignment (a power of two).
    pub align: usize,
    /// The most requests at the kernel at once (0: as many as the slots); the ring has
    /// this many submission entries, rounded up to a power of two.
    pub in_flight: usize,
    /// Submit once this many requests are queued (see [`super::IoConfig::submit_batch`]).
    pub submit_batch: usize,
}

impl Sizes {
    /// The slots and the requests in flight (0 read as the slots, up to the kernel's cap;
    /// more than the slots read as the slots), or [`Error::Exhausted`] when the slots, an
    /// explicit in-flight count or the slots' bytes pass the limits.
    fn checked(&self) -> Result<(usize, usize)> {
        super::check_limit("I/O slots", self.slots, super::MAX_SLOTS)?;
        super::slab_bytes(self.slots, self.slot_size)?;
        let in_flight = match self.in_flight {
            0 => self.slots.min(URING_MAX_ENTRIES),
            n => {
                super::check_limit("I/O requests in flight", n, URING_MAX_ENTRIES)?;
                n.min(self.slots)
            }
        };
        Ok((self.slots, in_flight))
    }
}

impl UringBackend {
    /// A ring with `depth` slots of `slot_size` bytes aligned to `align`, as many requests
    /// in flight, submitting once `submit_batch` requests are queued (see
    /// [`super::IoConfig::submit_batch`]). Any reason it cannot be set up is an
    /// [`Error::UringUnavailable`], sizes beyond the limits an [`Error::Exhausted`].
    pub fn new(depth: usize, slot_size: usize, align: usize, submit_batch: usize) -> Result<Self> {
        Self::with_features(
            depth,
            slot_size,
            align,
            submit_batch,
            UringFeatures::default(),
        )
    }

    /// As [`UringBackend::new`], asking for `features`.
    pub fn with_features(
        depth: usize,
        slot_size: usize,
        align: usize,
        submit_batch: usize,
        features: UringFeatures,
    ) -> Result<Self> {
        let sizes = Sizes {
            slots: depth,
            slot_size,
            align,
            in_flight: 0,
            submit_batch,
        };
        Self::with_sizes(sizes, features)
    }

    /// A ring of `sizes`, asking for `features`: errors as [`UringBackend::new`].
    pub fn with_sizes(sizes: Sizes, features: UringFeatures) -> Result<Self> {
        sizes.checked()?;
        Self::open(sizes, features).map_err(|u| Error::UringUnavailable(u.why().to_owned()))
    }

    /// As [`UringBackend::with_sizes`], telling a lasting lack of io_uring from a transient
    /// one. Sizes beyond the limits (which [`super::open_backend`] and
    /// [`UringBackend::with_sizes`] refuse first, with [`Error::Exhausted`]) are a
    /// transient failure here, naming the error.
    pub fn open(sizes: Sizes, features: UringFeatures) -> std::result::Result<Self, Unavailable> {
        let sup = support()?;
        let (slots, in_flight) = sizes
            .checked()
            .map_err(|e| Unavailable::Transient(e.to_string()))?;
        // A power of two of at most 32,768 entries (`checked`): the conversion cannot fail.
        let entries = u32::try_from(in_flight.next_power_of_two().max(2))
            .map_err(|_| Unavailable::Transient(format!("{in_flight} entries")))?;
        let ring = build_ring(entries, features)?;
        let mut slab = Slab::new(slots, sizes.slot_size, sizes.align)
            .map_err(|e| Unavailable::Transient(e.to_string()))?;
        debug_assert!(URING_MAX_REG_BUFFERS <= usize::from(u16::MAX) + 1);
        let knobs = std::env::var("RIFFLE_URING").unwrap_or_default();
        let want_bufs = features.fixed_buffers && !knobs.split(',').any(|k| k == "nofixedbufs");
        let want_files = features.fixed_files && !knobs.split(',').any(|k| k == "nofixedfiles");
        // A registered buffer per slot, named by a u16 index: at most 16,384 (the kernel's
        // cap), so every slot index of a ring with registered buffers fits a u16.
        let plain_why = if !want_bufs {
            Some("not asked for")
        } else if !sup.fixed_rw {
            Some("the kernel has no READ_FIXED")
        } else if slots > URING_MAX_REG_BUFFERS {
            Some("more slots than can be registered")
        } else {
            let iovecs = slab.iovecs();
            // SAFETY: the iovecs describe the slab's memory, which stays allocated and at
            // the same address for as long as the ring exists (the slab is freed in Drop
            // only after the ring has no request in flight, and is never handed out).
            match unsafe { ring.ring.submitter().register_buffers(&iovecs) } {
                Ok(()) => None,
                Err(_) => Some("registration refused: see ulimit -l"),
            }
        };
        let fixed_bufs = plain_why.is_none();
        let fixed_files = want_files
            && ring
                .ring
                .submitter()
                .register_files_sparse(MAX_FILES)
                .is_ok();
        if !fixed_bufs && !sup.plain_rw {
            return Err(Unavailable::Unsupported(
                "the kernel supports neither registered buffers nor IORING_OP_READ".into(),
            ));
        }
        Ok(UringBackend {
            ring: ring.ring,
            slab: ManuallyDrop::new(slab),
            files: Vec::new(),
            free: Vec::new(),
            fixed_files,
            fixed_bufs,
            coop_taskrun: ring.coop_taskrun,
            sqpoll: ring.sqpoll,
            ops: vec![None; slots],
            queued: 0,
            in_flight: 0,
            max_in_flight: in_flight,
            ready: Vec::new(),
            plain_why,
            requeue: Vec::new(),
            submit_batch: sizes.submit_batch.max(1),
            #[cfg(test)]
            faults: Faults::default(),
        })
    }

    /// The failures to inject (tests only).
    #[cfg(test)]
    pub(super) fn faults(&mut self) -> &mut Faults {
        &mut self.faults
    }

    /// Requests waiting to be queued again after EAGAIN/EINTR (tests only).
    #[cfg(test)]
    pub(super) fn requeued(&self) -> usize {
        self.requeue.len()
    }

    /// Entries in the submission queue the kernel has not taken (tests only).
    #[cfg(test)]
    pub(super) fn sq_queued(&mut self) -> usize {
        self.ring.submission().len()
    }

    /// Completions posted and not reaped yet (tests only).
    #[cfg(test)]
    pub(super) fn cq_ready(&mut self) -> usize {
        let mut cq = self.ring.completion();
        cq.sync();
        cq.len()
    }

    /// The submission entry for `op`, whose bytes are at `ptr` (from the slab).
    fn sqe(&self, op: &Op, ptr: *mut u8) -> squeue::Entry {
        let raw = self.file(op.file).file().as_raw_fd();
        let len = u32::try_from(op.len)
            .unwrap_or(MAX_RW_COUNT)
            .min(MAX_RW_COUNT);
        // A ring with registered buffers has at most 16,384 slots, so the index fits.
        let idx = u16::try_from(op.slot.index()).unwrap_or(u16::MAX);
        // A buffer is registered per slot: a request that runs on into the next slots
        // reads into plain memory.
        let fixed_buf = self.fixed_bufs && self.slab.span(op.at, op.len) == 1;
        macro_rules! build {
            ($fd:expr) => {
                match (op.kind, fixed_buf) {
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
        // The first MAX_FILES files are registered; any beyond use their plain fd, so the
        // file count has no ceiling.
        let e = if self.fixed_files && op.file.0 < MAX_FILES {
            build!(types::Fixed(op.file.0))
        } else {
            build!(types::Fd(raw))
        };
        e.user_data(op.slot.0.into())
    }

    /// Puts an entry in the submission queue. On `Err` it is not there.
    fn push_sqe(&mut self, entry: &squeue::Entry) -> Result<()> {
        loop {
            #[cfg(test)]
            let full = self.faults.sq_full > 0 && {
                self.faults.sq_full -= 1;
                true
            };
            #[cfg(not(test))]
            let full = false;
            // SAFETY: the entry points into the slots that Slab::start marked in flight (the
            // request's slot and any it runs on into; they stay in flight for a requeue),
            // so their memory is neither reachable by the
            // caller nor freed until the completion is reaped in `reap`. The fd (or fixed
            // file) stays open: self.files holds it until the backend is dropped.
            if !full && unsafe { self.ring.submission().push(entry) }.is_ok() {
                self.queued += 1;
                return Ok(());
            }
            // The queue cannot be full while at most `max_in_flight` <= entries requests are
            // at the kernel (`make_room`), but if it ever is, submitting frees it.
            self.submit(0)?;
        }
    }

    fn submit(&mut self, want: usize) -> Result<()> {
        #[cfg(test)]
        if self.faults.enter > 0 {
            self.faults.enter -= 1;
            let e = io::Error::from_raw_os_error(libc::EIO);
            return Err(Error::io("io_uring", "io_uring_enter", None, e));
        }
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

    /// Moves the posted completions into `ready` (their slots held by the caller again);
    /// EAGAIN/EINTR ones are requeued instead.
    fn reap(&mut self) {
        let mut cq = self.ring.completion();
        cq.sync();
        for cqe in &mut cq {
            // user_data is a slot index (a u32), set in `sqe`.
            let op = usize::try_from(cqe.user_data())
                .ok()
                .and_then(|slot| self.ops.get(slot).copied().flatten())
                .expect("completion for a slot with no op");
            let res = cqe.result();
            #[cfg(test)]
            let res = if self.faults.eagain > 0 {
                self.faults.eagain -= 1;
                -libc::EAGAIN
            } else {
                res
            };
            if res == -libc::EAGAIN || res == -libc::EINTR {
                // Transient: the same request goes again, the slot stays in flight.
                self.requeue.push(op);
                continue;
            }
            self.ops[op.slot.index()] = None;
            self.slab.complete(op.slot);
            self.ready.push(Completion {
                op,
                result: usize::try_from(res).map_err(|_| res.saturating_neg()),
            });
        }
    }

    /// Requests at the kernel: in flight and not reaped into `ready`.
    fn at_kernel(&self) -> usize {
        self.in_flight - self.ready.len()
    }

    /// Waits until fewer than `max_in_flight` requests are at the kernel, reaping into
    /// `ready`: so the rings sized from it never fill.
    fn make_room(&mut self) -> Result<()> {
        while self.at_kernel() >= self.max_in_flight {
            self.submit(1)?;
            self.reap();
            self.resubmit()?;
        }
        Ok(())
    }

    /// Queues the requeued requests again. Each leaves `requeue` only once it is in the
    /// submission queue, so an error loses none: they stay in flight, and the next `wait`
    /// (or Drop) tries again.
    fn resubmit(&mut self) -> Result<()> {
        while let Some(op) = self.requeue.last().copied() {
            let ptr = self.slab.in_flight_ptr(op.slot, op.at, op.len);
            let entry = self.sqe(&op, ptr);
            self.push_sqe(&entry)?;
            self.requeue.pop();
        }
        Ok(())
    }
}

impl Backend for UringBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Uring
    }

    fn features(&self) -> String {
        let bufs = match self.plain_why {
            None => "registered buffers".to_owned(),
            Some(why) => format!("plain buffers ({why})"),
        };
        let files = if self.fixed_files {
            "fixed files"
        } else {
            "plain fds"
        };
        // The defaults (COOP_TASKRUN, no SQPOLL) go unsaid.
        let coop = if self.coop_taskrun {
            ""
        } else {
            ", no COOP_TASKRUN"
        };
        let sqpoll = if self.sqpoll { ", SQPOLL" } else { "" };
        let submit = match self.submit_batch {
            1 => String::new(),
            SUBMIT_AT_WAIT => ", submitted at each wait".to_owned(),
            n => format!(", submitted {n} at a time"),
        };
        format!("{bufs}, {files}{coop}{sqpoll}{submit}")
    }

    fn depth(&self) -> usize {
        self.slab.count()
    }

    fn max_in_flight(&self) -> usize {
        self.max_in_flight
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
        let key = FileKey(match self.free.last() {
            Some(&k) => k,
            None => u32::try_from(self.files.len()).map_err(|_| Error::Exhausted {
                resource: "files on one backend",
                asked: self.files.len() as u64 + 1,
                limit: u64::from(u32::MAX),
            })?,
        });
        if self.fixed_files && key.0 < MAX_FILES {
            let fd = file.file().as_raw_fd();
            self.ring
                .submitter()
                .register_files_update(key.0, &[fd])
                .map_err(|e| Error::io(file.path(), "register file with io_uring", None, e))?;
        }
        if self.free.pop().is_none() {
            self.files.push(None);
        }
        self.files[key.0 as usize] = Some(file);
        Ok(key)
    }

    fn remove_file(&mut self, key: FileKey) {
        assert!(
            self.ops.iter().flatten().all(|op| op.file != key),
            "removing a file with a request in flight"
        );
        let file = self.files[key.0 as usize]
            .take()
            .expect("removing an unknown file key");
        if self.fixed_files && key.0 < MAX_FILES {
            // An empty slot (-1): the ring lets go of its reference. Should the kernel
            // refuse, the slot keeps the file open until it is reused or the ring dropped.
            let _ = self.ring.submitter().register_files_update(key.0, &[-1]);
        }
        drop(file);
        self.free.push(key.0);
    }

    fn file(&self, key: FileKey) -> &Arc<DataFile> {
        self.files[key.0 as usize]
            .as_ref()
            .expect("a removed file key")
    }

    fn push(&mut self, op: Op) -> Result<()> {
        assert!(
            self.files
                .get(op.file.0 as usize)
                .is_some_and(Option::is_some),
            "unknown file key"
        );
        // Room first: on an error here the request was never started.
        self.make_room()?;
        let ptr = self.slab.start(op.slot, op.at, op.len);
        let entry = self.sqe(&op, ptr);
        if let Err(e) = self.push_sqe(&entry) {
            // The kernel never saw the request: nothing is in flight, the slot is the
            // caller's again.
            self.slab.abort(op.slot);
            return Err(e);
        }
        self.ops[op.slot.index()] = Some(op);
        self.in_flight += 1;
        // Submit now so the device starts at once, unless this is the only request in
        // flight: then the caller's next call is a wait, which submits and waits in one
        // system call (at queue depth 1 that saves a call per request). With a batch
        // ([`IoConfig::submit_batch`](super::IoConfig::submit_batch)) the queue goes once
        // it holds that many, and with [`SUBMIT_AT_WAIT`] only with the caller's next wait.
        // The request is queued whatever happens here, so an error is left to the next
        // wait, which submits the same queue and reports it.
        if self.queued >= self.submit_batch && self.at_kernel() > 1 {
            let _ = self.submit(0);
        }
        Ok(())
    }

    fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> Result<()> {
        let min = min.min(self.in_flight);
        loop {
            self.reap();
            if self.ready.len() >= min {
                // Delivered before anything else can fail: the completions are the
                // caller's from here on, whatever the submit below says.
                self.in_flight -= self.ready.len();
                out.append(&mut self.ready);
                self.resubmit()?;
                if self.queued > 0 {
                    self.submit(0)?;
                }
                return Ok(());
            }
            self.resubmit()?;
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
            #[cfg(test)]
            for c in &sink {
                super::tests::reaped_by_drop(c, self.slab.get(c.op.slot));
            }
            sink.clear();
        }
        // The ring's own teardown runs later, in a kernel worker, and holds its registered
        // files until then: a file removed just after a read (a copy fetched to be indexed)
        // kept its disk space for a while, and the next copy found the disk full. Let them
        // go now.
        if self.fixed_files {
            let _ = self.ring.submitter().unregister_files();
        }
        // SAFETY: nothing is in flight, so the kernel holds no pointer into the slab, and
        // the slab is dropped exactly once (here).
        unsafe { ManuallyDrop::drop(&mut self.slab) };
    }
}
