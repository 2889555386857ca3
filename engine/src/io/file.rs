//! Opening data files for direct I/O, with the buffered fallback.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::align::{self, Alignment};
use crate::{device, notice, Error, Result};

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

/// Whether to open for reading or for (truncating) writing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read only.
    Read,
    /// Create or truncate, then write.
    Write,
}

impl DataFile {
    /// Opens `path`, with O_DIRECT when `want_direct` and the file allows it, buffered
    /// otherwise. A fallback to buffered I/O is announced once on stderr and recorded in
    /// [`DataFile::buffered_reason`]. `RIFFLE_DIRECT=0` in the environment forces buffered.
    pub fn open(path: &Path, access: Access, want_direct: bool) -> Result<DataFile> {
        let plain =
            Self::open_flags(path, access, 0).map_err(|e| Error::io(path, "open", None, e))?;
        if access == Access::Read {
            let meta = plain
                .metadata()
                .map_err(|e| Error::io(path, "stat", None, e))?;
            if meta.is_dir() {
                return Err(Error::BadInput {
                    path: path.into(),
                    offset: None,
                    what: "is a directory, expected a file".into(),
                });
            }
        }
        let align = align::detect(&plain);
        let fs_type = device::fs_type(path);
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
        let (file, buffered_reason) = match reason {
            Some(r) => (plain, Some(r)),
            None => match Self::open_flags(path, access, libc::O_DIRECT) {
                Ok(f) => (f, None),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    (plain, Some(format!("{fs_type} refused O_DIRECT (EINVAL)")))
                }
                Err(e) => return Err(Error::io(path, "open with O_DIRECT", None, e)),
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
        let size = file
            .metadata()
            .map_err(|e| Error::io(path, "stat", None, e))?
            .len();
        Ok(DataFile {
            file,
            path: path.into(),
            size,
            direct: buffered_reason.is_none(),
            buffered_reason,
            align,
        })
    }

    fn open_flags(path: &Path, access: Access, extra: i32) -> std::io::Result<File> {
        let mut o = OpenOptions::new();
        match access {
            Access::Read => o.read(true),
            Access::Write => o.read(true).write(true).create(true).truncate(true),
        };
        o.custom_flags(libc::O_CLOEXEC | extra).open(path)
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
