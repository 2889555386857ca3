//! Opening data files for direct I/O, with the buffered fallback.

use std::fs::File;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use std::path::{Path, PathBuf};

use super::align::{self, Alignment};
use crate::{device, door, notice, Error, Result};

/// An open file the engine reads or writes, with how it is accessed.
#[derive(Debug)]
pub struct DataFile {
    file: File,
    path: PathBuf,
    size: u64,
    direct: bool,
    buffered_reason: Option<String>,
    align: Alignment,
}

/// Whether to open for reading or for writing a new file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read only.
    Read,
    /// Create a new file (it must not exist: `O_EXCL`, never following a symlink, mode
    /// 0600), then write. Files that outlive the run are made through
    /// [`crate::scratch::TempFile`] and [`DataFile::create`] instead.
    Write,
}

impl DataFile {
    /// Opens `path`, with O_DIRECT when `want_direct` and the file allows it, buffered
    /// otherwise. A fallback to buffered I/O is announced once on stderr and recorded in
    /// [`DataFile::buffered_reason`]. `RIFFLE_DIRECT=0` in the environment forces buffered.
    ///
    /// A read opens the path without blocking (a FIFO is never waited on), with O_NOATIME
    /// where allowed (again without it where refused), and refuses anything but a regular
    /// file: random access needs one.
    pub fn open(path: &Path, access: Access, want_direct: bool) -> Result<DataFile> {
        let file = match access {
            Access::Read => open_read(path, false, |noatime| door::open_data(path, noatime))?.0,
            Access::Write => {
                door::create_private(path).map_err(|e| Error::io(path, "open", None, e))?
            }
        };
        Self::create(file, path, want_direct)
    }

    /// Opens a listed file for reading as [`DataFile::open`] does, and refuses it unless it
    /// is still what was listed: a file of a tree is opened beneath the tree's root with no
    /// link on the way (a link or `..` planted since is refused), and a file of another
    /// size, or another file (device and inode) at its name, is refused, naming the path.
    pub fn open_listed(spec: &super::LazyFile, want_direct: bool) -> Result<DataFile> {
        let path = spec.path.as_path();
        let (file, meta) = match &spec.beneath {
            Some(root) => {
                // An absolute path (not under the root) is refused by the open itself.
                let rel = match &spec.under {
                    Some(u) => u.as_path(),
                    None => path.strip_prefix(root.path()).unwrap_or(path),
                };
                open_read(path, true, |noatime| root.open_beneath(rel, noatime))?
            }
            None => open_read(path, false, |noatime| door::open_data(path, noatime))?,
        };
        let changed = |what: String| Error::BadInput {
            path: path.into(),
            offset: None,
            what: format!("{what}: refused, not read"),
        };
        if let Some((dev, ino)) = spec.identity {
            use std::os::unix::fs::MetadataExt;
            if (meta.dev(), meta.ino()) != (dev, ino) {
                return Err(changed(format!(
                    "another file is at this name since the dataset was opened (inode {}, \
                     was {ino})",
                    meta.ino()
                )));
            }
        }
        if meta.len() != spec.size {
            return Err(changed(format!(
                "the file changed since the dataset was opened ({} bytes, was {})",
                meta.len(),
                spec.size
            )));
        }
        Self::create(file, path, want_direct)
    }

    /// Takes a file already open (read-write for writing, such as a
    /// [`crate::scratch::TempFile`]'s handle) and turns on O_DIRECT when `want_direct` and
    /// the file allows it, as [`DataFile::open`] does.
    pub fn create(file: File, path: &Path, want_direct: bool) -> Result<DataFile> {
        let align = align::detect(&file);
        let meta = file
            .metadata()
            .map_err(|e| Error::io(path, "stat", None, e))?;
        let fs_type = device::fs_type_of(std::os::unix::fs::MetadataExt::dev(&meta), path);
        let reason = if !want_direct {
            Some("direct I/O not requested".to_owned())
        } else if std::env::var("RIFFLE_DIRECT").is_ok_and(|v| v == "0") {
            Some("RIFFLE_DIRECT=0 is set".to_owned())
        } else if device::is_memory_fs(&fs_type) {
            Some(format!(
                "{fs_type} keeps data in memory, so O_DIRECT cannot bypass a cache"
            ))
        } else if !align.direct_ok {
            Some(format!(
                "{fs_type} does not support direct I/O on this file (statx)"
            ))
        } else {
            None
        };
        // One open file, whose flags are set here: blocking (io_uring would otherwise
        // answer EAGAIN rather than wait) and direct when allowed.
        let flags = fcntl(&file, FcntlArg::F_GETFL)
            .map_err(|e| Error::io(path, "fcntl", None, e.into()))?;
        let base = OFlag::from_bits_truncate(flags) & !OFlag::O_NONBLOCK;
        let set = |f: OFlag| fcntl(&file, FcntlArg::F_SETFL(f)).map(|_| ());
        let buffered_reason = match reason {
            Some(r) => {
                set(base).map_err(|e| Error::io(path, "fcntl", None, e.into()))?;
                Some(r)
            }
            None => match set(base | OFlag::O_DIRECT) {
                Ok(()) => None,
                Err(nix::errno::Errno::EINVAL) => {
                    set(base).map_err(|e| Error::io(path, "fcntl", None, e.into()))?;
                    Some(format!("{fs_type} refused O_DIRECT (EINVAL)"))
                }
                Err(e) => return Err(Error::io(path, "set O_DIRECT", None, e.into())),
            },
        };
        if let Some(r) = &buffered_reason {
            if want_direct {
                notice::once(
                    &format!("buffered:{r}"),
                    &format!(
                        "using buffered reads, not O_DIRECT: {r} ({})",
                        path.display()
                    ),
                );
            }
        }
        let size = meta.len();
        Ok(DataFile {
            file,
            path: path.into(),
            size,
            direct: buffered_reason.is_none(),
            buffered_reason,
            align,
        })
    }

    /// The path it was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The size at open time (or as last set by [`DataFile::set_size`]).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Records a new logical size (after writes) and truncates the file to it.
    pub fn set_size(&mut self, size: u64) -> Result<()> {
        self.file
            .set_len(size)
            .map_err(|e| Error::io(&self.path, "truncate", Some(size), e))?;
        self.size = size;
        Ok(())
    }

    /// Whether reads and writes bypass the page cache.
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// Why the file is accessed through the page cache, when it is.
    pub fn buffered_reason(&self) -> Option<&str> {
        self.buffered_reason.as_deref()
    }

    /// What direct I/O on this file requires.
    pub fn alignment(&self) -> Alignment {
        self.align
    }

    /// The underlying file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Flushes written data to the device.
    pub fn sync_data(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| Error::io(&self.path, "fdatasync", None, e))
    }
}

/// Opens a file for reading through `open(noatime)`: with `O_NOATIME` where the kernel
/// allows it (the file's owner, or CAP_FOWNER: no inode written back for a read-only pass
/// over 100,000 files), again without it where refused (once refused, not asked for
/// again: a dataset of 100,000 files of another owner would pay a failed open for each).
/// Anything but a regular file is refused: random access needs one; so is, `beneath` a
/// tree's root, a path through a link or out of the tree.
fn open_read(
    path: &Path,
    beneath: bool,
    open: impl Fn(bool) -> std::io::Result<File>,
) -> Result<(File, std::fs::Metadata)> {
    use std::sync::atomic::{AtomicBool, Ordering};
    static NOATIME_REFUSED: AtomicBool = AtomicBool::new(false);
    let file = if NOATIME_REFUSED.load(Ordering::Relaxed) {
        open(false)
    } else {
        match open(true) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                NOATIME_REFUSED.store(true, Ordering::Relaxed);
                open(false)
            }
            r => r,
        }
    };
    let file = file.map_err(|e| match door::beneath_refusal(&e).filter(|_| beneath) {
        Some(why) => Error::BadInput {
            path: path.into(),
            offset: None,
            what: format!("{why}: refused, not read"),
        },
        None => Error::io(path, "open", None, e),
    })?;
    let meta = file
        .metadata()
        .map_err(|e| Error::io(path, "stat", None, e))?;
    if !meta.file_type().is_file() {
        return Err(Error::BadInput {
            path: path.into(),
            offset: None,
            what: format!(
                "is {}, not a regular file: random access needs a file (to shuffle a stream, \
                 use `riffle shuffle`)",
                file_type_name(&meta.file_type())
            ),
        });
    }
    Ok((file, meta))
}

/// "a directory", "a FIFO (a pipe)", ...: what a path is, for errors (kept in the door,
/// which has no other dependency).
pub use crate::door::file_type_name;
