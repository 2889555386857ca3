//! The I/O core: aligned buffers, two interchangeable backends, and readers/writers on top.
//!
//! A [`Backend`] owns a [`Slab`] of aligned slots and the files it was given. The caller
//! takes a slot, submits an [`Op`] on it, and gets the slot back in a [`Completion`]; while
//! the op is in flight the slot cannot be reached, and dropping a backend first waits for
//! every in-flight op. Two backends exist: [`uring`] (io_uring, one ring per I/O thread) and
//! [`pread`] (a thread pool doing pread/pwrite). [`open_backend`] picks one at run time;
//! both return the same bytes.
//!
//! [`RangeReader`] turns arbitrary byte ranges into whole aligned extents, and
//! [`write_file`] writes a file sequentially at a queue depth; both work on either backend.

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

pub use buffer::{footprint, prefetch, AlignedBuf, LargeBuf, Slab, SlotId};
pub use file::{file_type_name, Access, DataFile};
pub use reader::{RangeReader, ReadStats};
pub use scan::{scan_config, scan_file, ScanReport};
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

/// How to set up I/O.
#[derive(Clone, Debug)]
pub struct IoConfig {
    /// Maximum requests in flight (the queue depth), and the number of buffer slots.
    pub depth: usize,
    /// The largest single request, in bytes; longer ranges are split. Rounded up to the
    /// alignment.
    pub slot_size: usize,
    /// Which backend. `RIFFLE_IO` in the environment overrides `Auto`.
    pub backend: BackendChoice,
    /// Whether to try O_DIRECT (falls back to buffered where refused).
    pub direct: bool,
    /// io_uring: submit once this many requests are queued (1 = each request as soon as it
    /// is pushed, as fio does by default). Larger batches save system calls but let the
    /// block layer plug requests together, which adds latency on devices such as virtio
    /// disks (measured: 4 KiB QD 32 random reads, 64k IOPS batched vs 75k one by one).
    pub submit_batch: usize,
}

impl Default for IoConfig {
    fn default() -> Self {
        IoConfig {
            depth: 64,
            slot_size: 256 << 10,
            backend: BackendChoice::Auto,
            direct: true,
            submit_batch: 1,
        }
    }
}

impl IoConfig {
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
    /// Bytes (aligned for direct I/O, at most the slot size).
    pub len: usize,
    /// Read or write.
    pub kind: OpKind,
    /// A caller's value, returned in the completion.
    pub tag: u64,
}

/// A finished request; its slot is held by the caller again.
#[derive(Clone, Copy, Debug)]
pub struct Completion {
    /// The request.
    pub op: Op,
    /// Bytes transferred, or the errno.
    pub result: std::result::Result<usize, i32>,
}

/// An I/O backend: a set of slots, a set of files, and requests between them.
pub trait Backend: Send {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// A short description of the features in use (registered buffers, fixed files, ...).
    fn features(&self) -> String;
    /// The slots.
    fn slab(&self) -> &Slab;
    /// The slots, mutably (to acquire, fill and release them).
    fn slab_mut(&mut self) -> &mut Slab;
    /// Registers a file; the backend keeps it open until it is dropped.
    fn add_file(&mut self, file: Arc<DataFile>) -> Result<FileKey>;
    /// The file behind a key.
    fn file(&self, key: FileKey) -> &Arc<DataFile>;
    /// Queues a request. The slot must be held; it is in flight until its completion is
    /// returned by [`Backend::wait`]. Queued requests are submitted by the next `wait`.
    fn push(&mut self, op: Op) -> Result<()>;
    /// Submits what is queued and waits until at least `min` completions (at most the number
    /// in flight) are appended to `out`. EAGAIN/EINTR are retried inside.
    fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> Result<()>;
    /// Requests queued or in flight.
    fn in_flight(&self) -> usize;
}

/// Sets up a backend with `depth` slots of `slot_size` bytes aligned to `align`.
///
/// With [`BackendChoice::Auto`] (and `RIFFLE_IO` unset or `auto`), io_uring is used when a
/// ring can be created; otherwise the pread pool is, and the reason is announced once.
pub fn open_backend(cfg: &IoConfig, align: usize) -> Result<Box<dyn Backend>> {
    let choice = match (cfg.backend, BackendChoice::from_env()?) {
        (BackendChoice::Auto, Some(env)) => env,
        (c, _) => c,
    };
    let slot_size = cfg.slot_size.max(align).div_ceil(align) * align;
    let depth = cfg.depth.clamp(1, 4096);
    match choice {
        BackendChoice::Pread => {
            if std::env::var("RIFFLE_IO").is_ok_and(|v| v == "pread") {
                notice::once(
                    "pread-forced",
                    "RIFFLE_IO=pread: using the pread thread pool",
                );
            }
            Ok(Box::new(pread::PreadBackend::new(depth, slot_size, align)))
        }
        BackendChoice::Uring => Ok(Box::new(uring::UringBackend::new(
            depth,
            slot_size,
            align,
            cfg.submit_batch,
        )?)),
        BackendChoice::Auto => {
            match uring::UringBackend::new(depth, slot_size, align, cfg.submit_batch) {
                Ok(b) => Ok(Box::new(b)),
                Err(Error::UringUnavailable(why)) => {
                    notice::once(
                        "uring-unavailable",
                        &format!("io_uring unavailable ({why}); using the pread thread pool"),
                    );
                    Ok(Box::new(pread::PreadBackend::new(depth, slot_size, align)))
                }
                Err(e) => Err(e),
            }
        }
    }
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
mod tests;
