//! The I/O core: aligned buffers, two interchangeable backends, and readers/writers on top.
//!
//! A [`Backend`] owns a slab of aligned slots and the files it was given, and never hands
//! the slab out: the caller acquires a slot (a [`SlotId`]), fills or reads it through the
//! backend, submits an [`Op`] on it, and gets it back in a [`Completion`]; while the op is
//! in flight the slot cannot be reached, and dropping a backend first waits for every
//! in-flight op. Two backends exist: [`uring`] (io_uring, one ring per I/O thread) and
//! [`pread`] (a thread pool doing pread/pwrite). [`open_backend`] picks one at run time;
//! both return the same bytes.
//!
//! [`RangeReader`] turns arbitrary byte ranges into whole aligned extents, and
//! [`write_file`] writes a file sequentially at a queue depth; both work on either backend.
//!
//! Sizes here are handed to the kernel and to raw memory: a cast that could cut, wrap or
//! lose a sign is an error in this module tree, never a silent change of size.
#![deny(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss
)]

pub mod align;
mod buffer;
mod file;
pub mod pread;
mod reader;
mod scan;
mod stream;
pub mod uring;
mod writer;

use std::sync::Arc;

use serde::Serialize;

pub(crate) use buffer::release_freed_heap;
use buffer::slab_bytes;
use buffer::Slab;
pub use buffer::{
    footprint, prefetch, AlignedBuf, LargeBuf, Populator, SlotId, HUGE as HUGE_PAGE, MAP_THRESHOLD,
};
pub use file::{file_type_name, Access, DataFile};
pub use reader::{LazyFile, RangeReader, ReadStats};
pub use scan::{scan_config, scan_file, ScanReport};
pub(crate) use stream::reap_writes;
pub use stream::StreamWriter;
pub use writer::{pattern_filler, write_file, write_temp, WriteReport};

use crate::{notice, Error, Result};

/// Which backend carries the I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// io_uring.
    Uring,
    /// A thread pool doing pread/pwrite.
    Pread,
}

impl BackendKind {
    /// The name used in reports: `io_uring` or `pread`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Uring => "io_uring",
            BackendKind::Pread => "pread",
        }
    }
}

/// Which backend the caller wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// io_uring when it can be set up, the pread pool otherwise (announced once).
    #[default]
    Auto,
    /// io_uring or an error.
    Uring,
    /// The pread pool.
    Pread,
}

impl BackendChoice {
    /// The choice from `RIFFLE_IO` (`uring`, `io_uring`, `pread`, `auto`), if set.
    pub fn from_env() -> Result<Option<BackendChoice>> {
        match std::env::var("RIFFLE_IO") {
            Err(_) => Ok(None),
            Ok(v) => match v.as_str() {
                "" | "auto" => Ok(Some(BackendChoice::Auto)),
                "uring" | "io_uring" | "io-uring" => Ok(Some(BackendChoice::Uring)),
                "pread" => Ok(Some(BackendChoice::Pread)),
                other => Err(Error::Invalid(format!(
                    "RIFFLE_IO={other}: expected auto, uring or pread"
                ))),
            },
        }
    }
}

/// The most slots one backend may have: a million (4 GiB of 4 KiB slots, a pile of a
/// million chunks). Slot state is a few bytes per slot and is walked nowhere per request, so
/// the cap only keeps a wrong count from allocating without end.
pub const MAX_SLOTS: usize = 1 << 20;

/// What a backend can give this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BackendLimits {
    /// What the choice resolves to here (`Auto`: io_uring when a ring can be set up now).
    pub kind: BackendKind,
    /// The most requests in flight: io_uring, the kernel's cap on a ring's entries
    /// (32,768); pread, its thread cap (128).
    pub max_in_flight: usize,
    /// The most slots one backend may have ([`MAX_SLOTS`]); the slots' bytes together
    /// must also fit `isize::MAX`.
    pub max_slots: usize,
    /// The most slots that can be registered buffers (io_uring: the kernel's 16,384, the
    /// range of a u16 buffer index; 0 where there are none): a ring of more slots uses
    /// plain memory, and says so in [`Backend::features`].
    pub max_registered_slots: usize,
    /// The soft RLIMIT_MEMLOCK in bytes (`None`: unlimited), which registered buffers
    /// count against on kernels before 5.12 and without CAP_IPC_LOCK: a ring whose
    /// registration is refused uses plain memory.
    pub memlock: Option<u64>,
}

/// [`IoConfig::submit_batch`]: queued requests go to the kernel only when the caller waits,
/// in one io_uring_enter with the wait (a reader refilling after a burst of completions
/// submits the whole refill at once). Pays on a device that answers in microseconds, where
/// the system call per request is most of the CPU per read; see `docs/issue34.md`.
pub const SUBMIT_AT_WAIT: usize = usize::MAX;

/// [`IoConfig::submit_batch`]: not chosen by the caller. A LIRS read chooses from its
/// device (`probe::submit_choice`); the backend itself reads it as 1 (each request at once).
pub const SUBMIT_AUTO: usize = 0;

/// The kernel's cap on a ring's submission entries (IORING_MAX_ENTRIES).
pub(crate) const URING_MAX_ENTRIES: usize = 32768;

/// The kernel's cap on registered buffers (IORING_MAX_REG_BUFFERS).
pub(crate) const URING_MAX_REG_BUFFERS: usize = 16384;

/// What `choice` can give this process (`RIFFLE_IO` applies to `Auto`, as in
/// [`open_backend`]). Cheap: io_uring's support is probed once per process, the rest is
/// constants and one `getrlimit`.
pub fn backend_limits(choice: BackendChoice) -> BackendLimits {
    let choice = match (choice, BackendChoice::from_env()) {
        (BackendChoice::Auto, Ok(Some(env))) => env,
        (c, _) => c,
    };
    let uring = match choice {
        BackendChoice::Pread => None,
        BackendChoice::Uring => Some(uring::support().ok()),
        BackendChoice::Auto => uring::support().ok().map(Some),
    };
    let memlock = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK)
        .ok()
        .and_then(|(soft, _)| (soft != nix::sys::resource::RLIM_INFINITY).then_some(soft));
    match uring {
        Some(sup) => BackendLimits {
            kind: BackendKind::Uring,
            max_in_flight: URING_MAX_ENTRIES,
            max_slots: MAX_SLOTS,
            max_registered_slots: if sup.is_some_and(|s| s.fixed_rw) {
                URING_MAX_REG_BUFFERS
            } else {
                0
            },
            memlock,
        },
        None => BackendLimits {
            kind: BackendKind::Pread,
            max_in_flight: pread::MAX_THREADS,
            max_slots: MAX_SLOTS,
            max_registered_slots: 0,
            memlock,
        },
    }
}

/// How to set up I/O.
#[derive(Clone, Debug)]
pub struct IoConfig {
    /// The number of buffer slots, and (when `in_flight` is 0) the most requests in flight.
    pub depth: usize,
    /// The largest single request, in bytes; longer ranges are split. Rounded up to the
    /// alignment.
    pub slot_size: usize,
    /// Which backend. `RIFFLE_IO` in the environment overrides `Auto`.
    pub backend: BackendChoice,
    /// Whether to try O_DIRECT (falls back to buffered where refused).
    pub direct: bool,
    /// io_uring: submit once this many requests are queued (1 = each request as soon as it
    /// is pushed, as fio does by default; [`SUBMIT_AT_WAIT`] = with the caller's next wait,
    /// in the same io_uring_enter). Larger batches save system calls but hold requests back
    /// from the device while the caller handles a burst of completions, which costs
    /// throughput on devices such as virtio disks (measured: 4 KiB QD 32 random reads, 64k
    /// IOPS batched vs 75k one by one; page-grouped 512 B records, 0.84-0.88 x the
    /// records/s submitted at each wait). [`SUBMIT_AUTO`] (the default): a read that knows
    /// its device chooses (a LIRS read: `probe::submit_choice`, at each wait on a
    /// memory-speed device), any other request goes at once as with 1.
    pub submit_batch: usize,
    /// The most requests in flight when that is fewer than the slots (slots that also hold
    /// data between reads, as a loaded pile's do); 0 for `depth` (up to the backend's
    /// [`BackendLimits::max_in_flight`]). An io_uring's ring is sized from this, not from
    /// the slots; the pread pool starts this many threads. Pushing more is allowed: the
    /// backend keeps at most this many at the kernel and the rest wait their turn.
    pub in_flight: usize,
    /// The io_uring features a ring is set up with (ignored by the pread pool).
    pub uring: UringFeatures,
    /// The process runs under an I/O throttle (device emulation), set by the caller that
    /// entered it: writes then take the pread pool unless a backend was named
    /// ([`IoConfig::write_backend`]).
    pub throttled: bool,
}

/// The io_uring features a ring asks for. Every field but SQPOLL is on by default and used
/// where the kernel allows it (a ring that cannot have them is set up without; the backend's
/// `features()` says what it got); turning one off is for measuring what it is worth (the
/// bench's fast-device suite). `RIFFLE_URING=nofixedbufs,nofixedfiles` turns the first two
/// off from the environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct UringFeatures {
    /// Registered buffers (READ_FIXED / WRITE_FIXED): the slab is pinned and mapped once,
    /// not per request.
    pub fixed_buffers: bool,
    /// Registered files: no file-table lookup and reference count per request.
    pub fixed_files: bool,
    /// IORING_SETUP_COOP_TASKRUN: completions run when the thread next enters the kernel,
    /// not through a task-work interrupt. Never with SQPOLL (the kernel refuses the pair).
    pub coop_taskrun: bool,
    /// IORING_SETUP_SQPOLL with this idle time in milliseconds: a kernel thread of the
    /// process takes requests off the submission queue, so a push needs no system call
    /// while it is awake (it spins on a core meanwhile). `None` (the default): off.
    pub sqpoll_idle_ms: Option<u32>,
}

impl Default for UringFeatures {
    fn default() -> Self {
        UringFeatures {
            fixed_buffers: true,
            fixed_files: true,
            coop_taskrun: true,
            sqpoll_idle_ms: None,
        }
    }
}

impl Default for IoConfig {
    fn default() -> Self {
        IoConfig {
            depth: 64,
            slot_size: 256 << 10,
            backend: BackendChoice::Auto,
            direct: true,
            submit_batch: SUBMIT_AUTO,
            in_flight: 0,
            uring: UringFeatures::default(),
            throttled: false,
        }
    }
}

impl IoConfig {
    /// The backend writes use: under a throttle, the pread pool rather than io_uring
    /// (unless one was asked for by name). io_uring hands direct writes that extend a file
    /// to its io-wq workers, and a cgroup v1 blkio throttle does not charge their I/O:
    /// measured here, two-pass pile writes ran far above the `hdd` limit through io_uring
    /// and at it through the pool. Reads are submitted by the process itself and are
    /// throttled either way.
    pub fn write_backend(&self) -> BackendChoice {
        match self.backend {
            BackendChoice::Auto if self.throttled => BackendChoice::Pread,
            other => other,
        }
    }

    /// This configuration with [`IoConfig::throttled`] set to `throttled`.
    pub fn under_throttle(self, throttled: bool) -> Self {
        IoConfig { throttled, ..self }
    }

    /// Large sequential writes: 1 MiB requests, 8 in flight (dataset generation, test files).
    pub fn sequential_write() -> Self {
        IoConfig {
            depth: 8,
            slot_size: 1 << 20,
            ..IoConfig::default()
        }
    }
}

/// Index of a file registered with a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileKey(pub u32);

/// Read or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Read `len` bytes at `offset` into the slot.
    Read,
    /// Write the first `len` bytes of the slot at `offset`.
    Write,
}

/// One request on one slot.
#[derive(Clone, Copy, Debug)]
pub struct Op {
    /// The slot whose memory the kernel reads from or writes into.
    pub slot: SlotId,
    /// The file.
    pub file: FileKey,
    /// Byte offset in the file (aligned for direct I/O).
    pub offset: u64,
    /// Bytes (aligned for direct I/O). `at + len` may pass the slot size: the request then
    /// covers the slots after `slot` too (see [`Backend::push`]).
    pub len: usize,
    /// Where in the slot the bytes go (read) or come from (write): the request uses the
    /// slot's bytes `[at, at + len)`. Zero for a fresh request; a continuation after a short
    /// transfer starts further in ([`Op::advance`]). Aligned for direct I/O.
    pub at: usize,
    /// Read or write.
    pub kind: OpKind,
    /// A caller's value, returned in the completion.
    pub tag: u64,
}

impl Op {
    /// The rest of this request once its first `n` bytes are transferred: the same slot,
    /// file and tag, `n` bytes further on in both the file and the slot. For continuing a
    /// short read or write where it stopped (round `n` down to the alignment first when
    /// the file is read with O_DIRECT).
    pub fn advance(self, n: usize) -> Op {
        assert!(
            n <= self.len,
            "advancing {n} bytes past a {}-byte request",
            self.len
        );
        Op {
            offset: self.offset + n as u64,
            len: self.len - n,
            at: self.at + n,
            ..self
        }
    }
}

/// A finished request; its slot is held by the caller again.
#[derive(Clone, Copy, Debug)]
pub struct Completion {
    /// The request.
    pub op: Op,
    /// Bytes transferred (into or from the slot's bytes `[op.at, op.at + n)`), or the
    /// errno.
    pub result: std::result::Result<usize, i32>,
}

/// An I/O backend: a set of slots, a set of files, and requests between them.
///
/// The slots are only reachable through these methods, by [`SlotId`]: a slot is Free,
/// Held (acquired, or returned by a completion) or InFlight (pushed, until its completion
/// is returned by [`Backend::wait`]). Only a held slot's bytes can be borrowed or the slot
/// released; the methods panic on any other. The memory itself is never handed out, so
/// safe code cannot free, replace or swap it while the kernel may write into it.
pub trait Backend: Send {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// A short description of the features in use (registered buffers, fixed files, ...).
    fn features(&self) -> String;
    /// Number of slots.
    fn depth(&self) -> usize;
    /// The most requests at the kernel at once (at most [`Backend::depth`]); requests
    /// pushed beyond it wait inside the backend for one to complete.
    fn max_in_flight(&self) -> usize;
    /// Bytes per slot.
    fn slot_size(&self) -> usize;
    /// Bytes of memory the slots take.
    fn buffer_bytes(&self) -> usize;
    /// Takes a free slot, if any; it is held by the caller until released or pushed.
    fn acquire(&mut self) -> Option<SlotId>;
    /// Takes slot `index` (below [`Backend::depth`]) if it is free: a caller that wants
    /// its data in consecutive slots (see [`Backend::run`]) picks them.
    fn acquire_at(&mut self, index: usize) -> Option<SlotId>;
    /// Gives a held slot back. Panics if the slot is not held (free, or in flight).
    fn release(&mut self, slot: SlotId);
    /// The bytes of a held slot. Panics if the slot is not held.
    fn slot(&self, slot: SlotId) -> &[u8];
    /// The bytes of `n` consecutive held slots from `first` on, back to back (slots lie
    /// next to each other in memory, `slot_size` apart). Panics if any of them is not held.
    fn run(&self, first: SlotId, n: usize) -> &[u8];
    /// The bytes of a held slot, to fill before a write. Panics if the slot is not held.
    fn slot_mut(&mut self, slot: SlotId) -> &mut [u8];
    /// Registers a file; the backend keeps it open until it is removed or the backend is
    /// dropped. Keys of removed files are given out again.
    fn add_file(&mut self, file: Arc<DataFile>) -> Result<FileKey>;
    /// Lets go of a file (closing it unless someone else holds it). Panics if a request on
    /// it is queued or in flight: a file is never closed under the kernel.
    fn remove_file(&mut self, key: FileKey);
    /// The file behind a key. Panics on a removed key.
    fn file(&self, key: FileKey) -> &Arc<DataFile>;
    /// Queues a request on a held slot. Its bytes `[op.at, op.at + op.len)` are counted from
    /// the slot's start and may run on into the slots after it (one read into consecutive
    /// slots: see [`Backend::run`]); every slot it covers must be held (it panics
    /// otherwise, or if the bytes run past the last slot). On `Ok` those slots are in flight
    /// until the completion (for `op.slot`) is returned by [`Backend::wait`]; queued
    /// requests are submitted at the latest by the next `wait`. On `Err` the request was
    /// not queued and the slots are held by the caller again.
    fn push(&mut self, op: Op) -> Result<()>;
    /// Submits what is queued and waits until at least `min` completions (at most the number
    /// in flight) are appended to `out`. EAGAIN/EINTR are retried inside. On `Err`, the
    /// completions appended before the error stay in `out` (their slots are held by the
    /// caller), and every request still in flight stays counted and is retried by the next
    /// `wait` (or by dropping the backend).
    fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> Result<()>;
    /// Requests queued or in flight.
    fn in_flight(&self) -> usize;
}

/// Dataset files one reader keeps open at once under an open-file limit of `limit`: a
/// quarter of it, from 4 to 1,024 (io_uring's registered-file table here, so every open
/// file is a fixed one). The resource plan lowers the queue depth below it for datasets of
/// more files (each read in flight holds its file open). Under `ulimit -n 32` a reader of a
/// tree keeps 8 open: at least 16 made every read of one refused below `ulimit -n 32`.
pub fn reader_cap(limit: u64) -> usize {
    (limit / 4).clamp(4, 1024) as usize
}

/// The process's soft limit on open files (`ulimit -n`); 2^20 when unlimited or unknown.
/// The one place it is read: the lazy readers' shared budget, the datasets' file cap, the
/// pile store's group files and the resource plan all size themselves from it.
pub fn open_file_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _)| soft)
        .filter(|&soft| soft != nix::sys::resource::RLIM_INFINITY)
        .unwrap_or(1 << 20)
}

/// Sets up a backend with `cfg.depth` slots of `cfg.slot_size` bytes (rounded up to
/// `align`), with at most `cfg.in_flight` requests at the kernel (0: as many as the slots,
/// up to the backend's limit).
///
/// Nothing is cut down in silence: more slots than [`BackendLimits::max_slots`], an
/// explicit `in_flight` above [`BackendLimits::max_in_flight`], or slots whose bytes
/// overflow are refused with [`Error::Exhausted`].
///
/// With [`BackendChoice::Auto`] (and `RIFFLE_IO` unset or `auto`), io_uring is used when a
/// ring can be created; otherwise the pread pool is, and the reason is announced: once per
/// process when the kernel lacks io_uring or forbids it, once per reason when a resource
/// ran short (too many open files, locked memory), in which case the next backend tries
/// io_uring again.
pub fn open_backend(cfg: &IoConfig, align: usize) -> Result<Box<dyn Backend>> {
    let choice = match (cfg.backend, BackendChoice::from_env()?) {
        (BackendChoice::Auto, Some(env)) => env,
        (c, _) => c,
    };
    let limits = backend_limits(choice);
    let slot_size = cfg
        .slot_size
        .max(align)
        .checked_next_multiple_of(align)
        .ok_or(Error::Exhausted {
            resource: "bytes per I/O slot",
            asked: u64::try_from(cfg.slot_size).unwrap_or(u64::MAX),
            limit: isize::MAX.unsigned_abs() as u64,
        })?;
    let depth = cfg.depth.max(1);
    check_limit("I/O slots", depth, limits.max_slots)?;
    slab_bytes(depth, slot_size)?;
    // An explicit count is checked against the limits; 0 (as many as the slots) is left
    // for the backend opened to read as its own limit allows (the pool: 128 threads).
    if cfg.in_flight > 0 {
        check_limit(
            "I/O requests in flight",
            cfg.in_flight,
            limits.max_in_flight,
        )?;
    }
    let in_flight = cfg.in_flight.min(depth);
    let pread = || -> Result<Box<dyn Backend>> {
        let threads = if in_flight == 0 { depth } else { in_flight };
        Ok(Box::new(pread::PreadBackend::new(
            depth, slot_size, align, threads,
        )?))
    };
    let sizes = uring::Sizes {
        slots: depth,
        slot_size,
        align,
        in_flight,
        submit_batch: cfg.submit_batch,
    };
    let backend: Box<dyn Backend> = match choice {
        BackendChoice::Pread => {
            if std::env::var("RIFFLE_IO").is_ok_and(|v| v == "pread") {
                notice::once(
                    "pread-forced",
                    "RIFFLE_IO=pread: using the pread thread pool",
                );
            }
            pread()?
        }
        BackendChoice::Uring => Box::new(uring::UringBackend::with_sizes(sizes, cfg.uring)?),
        BackendChoice::Auto => match uring::UringBackend::open(sizes, cfg.uring) {
            Ok(b) => Box::new(b),
            Err(uring::Unavailable::Unsupported(why)) => {
                notice::once(
                    "uring-unavailable",
                    &format!("io_uring unavailable ({why}); using the pread thread pool"),
                );
                pread()?
            }
            Err(uring::Unavailable::Transient(why)) => {
                notice::once(
                    &format!("uring-transient:{why}"),
                    &format!(
                        "io_uring could not be set up: {why}; the pread thread pool does \
                         this I/O (io_uring is tried again next time)"
                    ),
                );
                pread()?
            }
        },
    };
    #[cfg(test)]
    let backend = tests::wrap_backend(backend);
    Ok(backend)
}

// Offsets are u64 and lengths usize throughout: the I/O core runs on 64-bit targets only,
// where a u64 that counts bytes of one request or one slot always fits a usize.
const _: () = assert!(usize::BITS >= 64, "riffle's I/O needs a 64-bit target");

/// A byte count bounded by a usize quantity (a slot, a request's length, a file's span
/// under one), computed in u64 with file offsets, back as a usize. Lossless: usize is 64
/// bits here (asserted above).
#[allow(clippy::cast_possible_truncation)]
#[inline]
pub(crate) const fn usize_of(n: u64) -> usize {
    n as usize
}

/// `asked` of `resource` when it is at most `limit`, else [`Error::Exhausted`].
fn check_limit(resource: &'static str, asked: usize, limit: usize) -> Result<()> {
    if asked <= limit {
        return Ok(());
    }
    Err(Error::Exhausted {
        resource,
        asked: asked as u64,
        limit: limit as u64,
    })
}

/// Turns a completion's errno into an [`Error`] naming the file and offset.
pub fn completion_error(file: &DataFile, op: &Op, errno: i32) -> Error {
    let what = match op.kind {
        OpKind::Read => "read",
        OpKind::Write => "write",
    };
    Error::io(
        file.path(),
        what,
        Some(op.offset),
        std::io::Error::from_raw_os_error(errno),
    )
}

#[cfg(test)]
pub(crate) mod tests;
