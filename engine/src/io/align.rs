//! Direct-I/O alignment, asked of the kernel rather than assumed.
//!
//! The order of questions: `statx(STATX_DIOALIGN)` (Linux 6.1+, per file, and it says
//! when a file cannot do direct I/O at all), then the `BLKSSZGET` ioctl on the block
//! device, then sysfs `queue/logical_block_size`, then the filesystem's preferred I/O
//! size from `fstat`. No alignment is ever hard-coded.
#![allow(unsafe_code)]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use serde::Serialize;

use crate::device;

/// What direct I/O on one file requires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Alignment {
    /// Required alignment of buffer addresses.
    pub mem: usize,
    /// Required alignment of file offsets and lengths.
    pub offset: usize,
    /// Where the figures came from: `statx`, `BLKSSZGET`, `sysfs`, `st_blksize`.
    pub source: &'static str,
    /// False when statx says the file cannot do direct I/O (both alignments 0).
    pub direct_ok: bool,
}

/// The smallest unit reads and writes are cut to, even where the file asks for less (a
/// buffered file on tmpfs asks for none): a sector, so extents and short-read restarts stay
/// whole sectors whatever the filesystem.
pub const MIN_UNIT: usize = 512;

impl Alignment {
    /// The alignment to use for buffers, offsets and lengths alike: the larger of the two.
    pub fn unit(&self) -> usize {
        self.mem.max(self.offset).max(1).next_power_of_two()
    }

    /// The unit I/O is cut to: [`Alignment::unit`], at least [`MIN_UNIT`].
    pub fn io_unit(&self) -> usize {
        self.unit().max(MIN_UNIT)
    }
}

/// Asks the kernel what direct I/O on `file` requires.
pub fn detect(file: &File) -> Alignment {
    if let Some(a) = from_statx(file) {
        return a;
    }
    let meta = file.metadata().ok();
    if let Some(meta) = &meta {
        if meta.file_type().is_block_device() {
            if let Some(sz) = blksszget(file) {
                return Alignment {
                    mem: sz,
                    offset: sz,
                    source: "BLKSSZGET",
                    direct_ok: true,
                };
            }
        }
        let dev = if meta.file_type().is_block_device() {
            meta.rdev()
        } else {
            meta.dev()
        };
        if let Some(sz) = device::logical_block_size(dev) {
            return Alignment {
                mem: sz,
                offset: sz,
                source: "sysfs",
                direct_ok: true,
            };
        }
        let blk = usize::try_from(meta.blksize())
            .unwrap_or(1)
            .max(1)
            .next_power_of_two();
        return Alignment {
            mem: blk,
            offset: blk,
            source: "st_blksize",
            direct_ok: true,
        };
    }
    // Nothing answered: the page size is the one alignment every kernel accepts for
    // direct I/O on every filesystem that supports it.
    let page = page_size();
    Alignment {
        mem: page,
        offset: page,
        source: "page size",
        direct_ok: true,
    }
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(v)
        .ok()
        .filter(|&page| page > 0)
        .unwrap_or(1 << 12)
}

fn from_statx(file: &File) -> Option<Alignment> {
    // SAFETY: an all-zero statx is a valid value of this plain C struct.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the path is a valid NUL-terminated empty string, AT_EMPTY_PATH makes statx
    // use the fd, and stx is a valid, writable statx buffer.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    let mem = stx.stx_dio_mem_align as usize;
    let offset = stx.stx_dio_offset_align as usize;
    if mem == 0 || offset == 0 {
        return Some(Alignment {
            mem: 1,
            offset: 1,
            source: "statx",
            direct_ok: false,
        });
    }
    Some(Alignment {
        mem,
        offset,
        source: "statx",
        direct_ok: true,
    })
}

fn blksszget(file: &File) -> Option<usize> {
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which is valid and writable.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::BLKSSZGET, &mut size) };
    usize::try_from(size).ok().filter(|&s| rc == 0 && s > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_a_power_of_two() {
        let f = tempfile::tempfile().unwrap();
        let a = detect(&f);
        assert!(a.unit().is_power_of_two());
        assert!(a.unit() >= a.offset && a.unit() >= a.mem);
    }
}
