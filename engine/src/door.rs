//! The one door through which riffle opens a path: every `open(2)` of a file it reads or
//! writes is made here, with the flags its kind of file needs.
//!
//! - Metadata riffle reads (scratch `owner` files, index and listing sidecars, cached
//!   profiles, manifests): [`read_meta`]. Opened without blocking (a FIFO planted at the
//!   name is never waited on), checked with `fstat` to be a regular file (never a device
//!   such as /dev/zero or /dev/stdin), and read up to a size cap. A name riffle derived
//!   itself (a sidecar, an `owner`) is opened with `O_NOFOLLOW`: a link planted there,
//!   by anyone who can write the directory, is refused rather than read.
//! - Data files: [`open_data`] (non-blocking, optionally `O_NOATIME`; the caller checks the
//!   type, [`crate::io::DataFile::open`] does).
//! - Streams read in order: [`open_stream`]; directories for `fsync`: [`open_dir`]; files of
//!   a tree riffle generates: [`create_new`]; logs appended to: [`open_append`]; a private
//!   daemon's lock files and log: [`open_lock`], [`open_private_log`].
//! - A tree's files: [`Root::open_beneath`], beneath the tree's root with no link.
//! - New private files: [`create_private`] (`O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600),
//!   the way riffle creates a file of its own; [`crate::scratch::TempFile`] commits them.
//! - Outputs: [`output_target`] says what a destination is. A regular file (or a name that
//!   does not exist) is replaced by a committed temporary file, never truncated; a FIFO or
//!   character device is written into, never replaced; a block device, a directory or a
//!   socket is refused. [`refuse_inputs`] refuses an output that is one of the inputs.
//!
//! Nothing here depends on the rest of the engine but its errors, so every module may
//! use it.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// Caps for [`read_meta`]: no metadata file riffle writes comes near them.
pub mod cap {
    /// A scratch directory's `owner` file (three short lines).
    pub const OWNER: u64 = 64 << 10;
    /// A cached device profile (JSON, a few KiB).
    pub const PROFILE: u64 = 16 << 20;
    /// A listing sidecar or a manifest of paths (a path per file, for millions of files).
    pub const LISTING: u64 = 4 << 30;
}

/// Whether [`read_meta`] follows a symbolic link at the path's last component.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Follow {
    /// A name riffle derived itself (a sidecar, an `owner`): a link there was planted.
    No,
    /// A path the user named (a manifest): followed, as any tool would.
    Yes,
}

/// Reads a metadata file whole: opened without blocking (and, with [`Follow::No`], without
/// following a link), refused unless `fstat` says it is a regular file of at most `cap`
/// bytes, then read up to `cap` bytes. `Ok(None)` when nothing is at the path. Errors name
/// the path and what it is.
pub fn read_meta(path: &Path, cap: u64, follow: Follow) -> Result<Option<Vec<u8>>> {
    let mut flags = libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY;
    if follow == Follow::No {
        flags |= libc::O_NOFOLLOW;
    }
    let file = match OpenOptions::new().read(true).custom_flags(flags).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        // O_NOFOLLOW on a link: ELOOP.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) && follow == Follow::No => {
            return Err(not_regular(path, "a symbolic link"))
        }
        Err(e) => return Err(Error::io(path, "open", None, e)),
    };
    let meta = file
        .metadata()
        .map_err(|e| Error::io(path, "stat", None, e))?;
    if !meta.file_type().is_file() {
        return Err(not_regular(path, file_type_name(&meta.file_type())));
    }
    if meta.len() > cap {
        return Err(too_big(path, meta.len(), cap));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // The file may grow between the stat and the read: read one byte past the cap at most.
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, "read", Some(bytes.len() as u64), e))?;
    if bytes.len() as u64 > cap {
        return Err(too_big(path, bytes.len() as u64, cap));
    }
    Ok(Some(bytes))
}

fn not_regular(path: &Path, what: &str) -> Error {
    Error::BadInput {
        path: path.into(),
        offset: None,
        what: format!("is {what}, not a regular file: refused as riffle metadata"),
    }
}

fn too_big(path: &Path, size: u64, cap: u64) -> Error {
    Error::BadInput {
        path: path.into(),
        offset: None,
        what: format!("is {size} bytes, more than the {cap} riffle metadata may hold"),
    }
}

/// Opens a data file for reading without blocking (a FIFO is not waited on), with
/// `O_NOATIME` when `noatime`. The caller checks what it opened.
pub fn open_data(path: &Path, noatime: bool) -> std::io::Result<File> {
    let mut flags = libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY;
    if noatime {
        flags |= libc::O_NOATIME;
    }
    OpenOptions::new().read(true).custom_flags(flags).open(path)
}

/// Opens a stream for reading in order (a FIFO, a character device, or a descriptor's
/// link such as /dev/stdin or /proc/self/fd/N), blocking as a shell redirection does: a
/// FIFO waits for a writer, as `cat` does.
pub fn open_stream(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
}

/// Opens /dev/null: a descriptor held in reserve, closed to make room for one more when
/// the process is out of descriptors (the daemon's accept at EMFILE).
pub fn open_spare() -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/null")
}

/// Opens a directory (a link the user named followed), for `fsync` of its entries.
pub fn open_dir(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_DIRECTORY)
        .open(path)
}

/// Opens a log for appending whole lines (created if missing, mode 0666 less the umask):
/// each `write` of a line lands whole at the end, whoever else appends.
pub fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
}

/// Creates a new file for writing inside a directory riffle made for the purpose (a
/// generated tree, before it is renamed into place): `O_CREAT | O_EXCL | O_NOFOLLOW`, mode
/// 0666 less the umask (the files of a dataset, not private).
pub fn create_new(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o666)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
}

/// Writes `bytes` to a new file at `path` ([`create_new`]).
pub fn write_new(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    create_new(path)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(|e| Error::io(path, "write", None, e))
}

/// Opens what is at `path` for reading without following a link or blocking: for taking
/// the lock of a scratch entry (a directory or a temporary file).
pub fn open_entry(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
}

/// Creates a new file, read-write, mode 0600: `O_CREAT | O_EXCL | O_NOFOLLOW`, so a file
/// or link already at the name is an `AlreadyExists` error, never opened.
pub fn create_private(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
}

/// Opens (creating it, mode 0600, if missing) a lock file riffle keeps in a private
/// directory of its own, read-write, never through a link planted at the name.
pub fn open_lock(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
}

/// Opens a log riffle writes anew in a private directory of its own (created, or emptied
/// if there; mode 0600), never through a link planted at the name.
pub fn open_private_log(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
}

/// A directory tree's root, held open: the files listed in it are opened beneath it
/// ([`Root::open_beneath`]), never by a path the kernel resolves from scratch, so a link
/// or a `..` planted in the tree after it was listed cannot lead a read out of it.
#[derive(Debug)]
pub struct Root {
    dir: std::os::fd::OwnedFd,
    path: PathBuf,
}

/// How [`Root::open_beneath`] resolved a path (for tests of the fallback).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolve {
    /// `openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` (Linux 5.6 and later).
    Openat2,
    /// One `openat(2)` per component with `O_NOFOLLOW`, where `openat2` is `ENOSYS`.
    PerComponent,
}

impl Root {
    /// Opens the directory at `path` (a link the user named is followed: the tree is what
    /// it names) and holds it.
    pub fn open(path: &Path) -> Result<Root> {
        use nix::fcntl::OFlag;
        let dir = nix::fcntl::open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| Error::io(path, "open directory", None, e.into()))?;
        Ok(Root {
            dir,
            path: path.to_path_buf(),
        })
    }

    /// The path it was opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens `rel`, a path relative to the root, for reading as [`open_data`] does
    /// (non-blocking, `O_NOATIME` when `noatime`), resolved beneath the root with no
    /// symbolic link on the way: an absolute path, a `..` that leaves the tree and a link
    /// at any component (even one to a file inside the tree) are refused. `ELOOP` says a
    /// link was met, `EXDEV` that the path leads out of the tree.
    pub fn open_beneath(&self, rel: &Path, noatime: bool) -> std::io::Result<File> {
        self.open_beneath_by(rel, noatime, Resolve::Openat2)
    }

    /// [`Root::open_beneath`] by the given means (`Openat2` falls back to
    /// `PerComponent` where the kernel has no `openat2`).
    pub fn open_beneath_by(
        &self,
        rel: &Path,
        noatime: bool,
        how: Resolve,
    ) -> std::io::Result<File> {
        use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
        let mut flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
        if noatime {
            flags |= OFlag::O_NOATIME;
        }
        // Once the kernel said it has no openat2, it is not asked again.
        static NO_OPENAT2: std::sync::atomic::AtomicBool =
            std::sync::atomic::AtomicBool::new(false);
        if how == Resolve::Openat2 && !NO_OPENAT2.load(std::sync::atomic::Ordering::Relaxed) {
            let how = OpenHow::new().flags(flags).resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS,
            );
            match nix::fcntl::openat2(&self.dir, rel, how) {
                Err(nix::errno::Errno::ENOSYS) => {
                    NO_OPENAT2.store(true, std::sync::atomic::Ordering::Relaxed)
                }
                r => return r.map(File::from).map_err(std::io::Error::from),
            }
        }
        self.open_per_component(rel, flags)
    }

    /// The fallback: each directory of `rel` opened from the last with `O_NOFOLLOW` (and
    /// checked to be a directory), the file too; `..`, `/` and links refused.
    fn open_per_component(&self, rel: &Path, flags: nix::fcntl::OFlag) -> std::io::Result<File> {
        use nix::fcntl::OFlag;
        use std::path::Component;
        let out = || std::io::Error::from_raw_os_error(libc::EXDEV);
        let names: Vec<&std::ffi::OsStr> = rel
            .components()
            .filter(|c| *c != Component::CurDir)
            .map(|c| match c {
                Component::Normal(n) => Ok(n),
                _ => Err(out()),
            })
            .collect::<std::io::Result<_>>()?;
        let Some((last, dirs)) = names.split_last() else {
            return Err(std::io::Error::from_raw_os_error(libc::EISDIR));
        };
        let mode = nix::sys::stat::Mode::empty();
        let mut held: Option<std::os::fd::OwnedFd> = None;
        for name in dirs {
            let at = held.as_ref().unwrap_or(&self.dir);
            // O_PATH with O_NOFOLLOW would open a link itself: fstat says what it is.
            let fd = nix::fcntl::openat(
                at,
                *name,
                OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                mode,
            )?;
            let st = nix::sys::stat::fstat(&fd)?;
            match st.st_mode & libc::S_IFMT {
                libc::S_IFDIR => held = Some(fd),
                libc::S_IFLNK => return Err(std::io::Error::from_raw_os_error(libc::ELOOP)),
                _ => return Err(std::io::Error::from_raw_os_error(libc::ENOTDIR)),
            }
        }
        let at = held.as_ref().unwrap_or(&self.dir);
        let fd = nix::fcntl::openat(at, *last, flags | OFlag::O_NOFOLLOW, mode)?;
        Ok(File::from(fd))
    }
}

/// Why `dir` is not the user's own, if it is not: a link, not a directory, another
/// user's, or open to others by a bit of `others` (0o077: no access at all; 0o022: no
/// writing); or in a parent whose entries someone else may rename (not the user's or
/// root's, or written by others without the sticky bit, as /tmp has). A directory that is
/// not the user's may hold entries others planted (a socket, a staged copy with its
/// identity) or have them swapped after a check.
pub fn not_owned_dir(dir: &Path, others: u32) -> Result<Option<String>> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| Error::io(dir, "stat", None, e))?;
    let me = nix::unistd::geteuid().as_raw();
    let why = if meta.file_type().is_symlink() {
        Some("is a symbolic link".to_string())
    } else if !meta.is_dir() {
        Some("is not a directory".to_string())
    } else if meta.uid() != me {
        Some(format!(
            "belongs to uid {}, not to you (uid {me})",
            meta.uid()
        ))
    } else if meta.mode() & others != 0 {
        Some(format!(
            "is open to others (mode {:o}; {})",
            meta.mode() & 0o777,
            if others & 0o044 != 0 {
                "it must be 700"
            } else {
                "only you may write it"
            }
        ))
    } else {
        None
    };
    Ok(why.or_else(|| {
        let parent = dir.parent()?;
        let p = std::fs::metadata(parent).ok()?;
        let others_write = p.mode() & 0o022 != 0 && p.mode() & 0o1000 == 0;
        if p.uid() != me && p.uid() != 0 {
            Some(format!(
                "is in {}, which belongs to uid {}",
                parent.display(),
                p.uid()
            ))
        } else if others_write {
            Some(format!(
                "is in {}, which others may write and is not sticky (mode {:o})",
                parent.display(),
                p.mode() & 0o7777
            ))
        } else {
            None
        }
    }))
}

/// Why [`Root::open_beneath`] refused a path, for errors: `None` when the error is not one
/// of its refusals.
pub fn beneath_refusal(e: &std::io::Error) -> Option<&'static str> {
    match e.raw_os_error() {
        Some(libc::ELOOP) => Some(
            "is a symbolic link, or is reached through one: a tree's files are opened \
             beneath its root with no link on the way",
        ),
        Some(libc::EXDEV) => {
            Some("leads out of the tree: a tree's files are opened beneath its root")
        }
        _ => None,
    }
}

/// What an output destination is, as [`output_target`] found it.
#[derive(Debug)]
pub enum OutputTarget {
    /// Nothing, or a regular file (a link to one included: the link is replaced, never
    /// its target): written under a temporary name and renamed over it when complete.
    Replace,
    /// A FIFO or a character device (`>(cmd)`, /dev/null, a terminal), opened for
    /// writing: written into as a shell redirection would, never replaced.
    Stream(File),
}

/// Looks at `dest` (following links: /dev/stdout on a pipe is a link to one) and, for a
/// FIFO or character device, opens it for writing (blocking, as a shell redirection does,
/// until a FIFO has a reader). Refuses a block device, a directory and a socket.
pub fn output_target(dest: &Path) -> Result<OutputTarget> {
    let meta = match std::fs::metadata(dest) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(OutputTarget::Replace),
        // A dangling link: renaming over it replaces the link.
        Err(_) if std::fs::symlink_metadata(dest).is_ok() => return Ok(OutputTarget::Replace),
        Err(e) => return Err(Error::io(dest, "stat", None, e)),
    };
    let t = meta.file_type();
    if t.is_file() {
        // /dev/stdout or /proc/self/fd/1 when stdout is a file: renaming over the name
        // would replace the link (in /dev), not write the descriptor's file.
        let via_fd = |p: &Path| p.starts_with("/proc") || p.starts_with("/dev/fd");
        if via_fd(dest) || std::fs::read_link(dest).is_ok_and(|l| via_fd(&l)) {
            return Err(refused_output(
                dest,
                "a link to an open file descriptor on a file (for standard output, leave \
                 the output out)",
            ));
        }
        return Ok(OutputTarget::Replace);
    }
    if !(t.is_fifo() || t.is_char_device()) {
        return Err(refused_output(dest, file_type_name(&t)));
    }
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(dest)
        .map_err(|e| Error::io(dest, "open for writing", None, e))?;
    // The same kind of thing as looked at (not swapped for a file between the two).
    let now = f
        .metadata()
        .map_err(|e| Error::io(dest, "stat", None, e))?
        .file_type();
    if !(now.is_fifo() || now.is_char_device()) {
        return Err(refused_output(dest, "changed while being opened"));
    }
    Ok(OutputTarget::Stream(f))
}

fn refused_output(dest: &Path, what: &str) -> Error {
    Error::Invalid(format!(
        "{}: is {what}: an output is a file (written under a temporary name and renamed \
         into place when complete), a FIFO or a character device (written into)",
        dest.display()
    ))
}

/// The (device, inode) of what `path` names, following links; `None` if nothing is there.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Refuses each of `outputs` that is the same file (device and inode, through any link or
/// hard link) as one of `inputs`: checked before anything is written.
pub fn refuse_inputs(outputs: &[PathBuf], inputs: &[PathBuf]) -> Result<()> {
    let ins: Vec<(u64, u64, &Path)> = inputs
        .iter()
        .filter_map(|p| identity(p).map(|(d, i)| (d, i, p.as_path())))
        .collect();
    for out in outputs {
        let Ok(meta) = std::fs::metadata(out) else {
            continue;
        };
        // Written into, never replaced or truncated: a device may be read and written.
        if !meta.file_type().is_file() {
            continue;
        }
        if let Some((_, _, input)) = ins
            .iter()
            .find(|(d, i, _)| (*d, *i) == (meta.dev(), meta.ino()))
        {
            return Err(Error::Invalid(format!(
                "{}: the output is the input {}: refused before anything is written \
                 (write to another name)",
                out.display(),
                input.display()
            )));
        }
    }
    Ok(())
}

/// "a directory", "a FIFO (a pipe)", ...: what a path is, for errors.
pub fn file_type_name(t: &std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (a pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_a_regular_file_within_its_cap() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("m");
        assert!(read_meta(&p, 10, Follow::No).unwrap().is_none());
        std::fs::write(&p, b"hello").unwrap();
        assert_eq!(read_meta(&p, 10, Follow::No).unwrap().unwrap(), b"hello");
        let e = read_meta(&p, 4, Follow::No).unwrap_err().to_string();
        assert!(e.contains("more than the 4"), "{e}");
        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = read_meta(&fifo, 10, Follow::Yes).unwrap_err().to_string();
        assert!(e.contains("FIFO") && e.contains("fifo"), "{e}");
        let link = d.path().join("link");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let e = read_meta(&link, 10, Follow::No).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        let e = read_meta(&link, 10, Follow::Yes).unwrap_err().to_string();
        assert!(e.contains("character device"), "{e}");
    }

    /// Beneath a root, by openat2 and by the per-component fallback alike: a file is
    /// opened, a `..` out of the tree, an absolute path, an absolute link and even a link
    /// to a file inside the tree (at the last component or on the way) are refused.
    #[test]
    fn files_are_opened_beneath_the_root_with_no_link() {
        let d = tempfile::tempdir().unwrap();
        let tree = d.path().join("tree");
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        std::fs::write(tree.join("a/b/f"), b"inside").unwrap();
        std::fs::write(d.path().join("secret"), b"outside").unwrap();
        let link = |to: &Path, at: &str| std::os::unix::fs::symlink(to, tree.join(at)).unwrap();
        link(&d.path().join("secret"), "abs");
        link(Path::new("a/b/f"), "rel");
        link(Path::new("a"), "dir");
        link(Path::new("../secret"), "up");
        let root = Root::open(&tree).unwrap();
        for how in [Resolve::Openat2, Resolve::PerComponent] {
            let read = |rel: &str| {
                root.open_beneath_by(Path::new(rel), false, how)
                    .map(|mut f| {
                        let mut s = String::new();
                        f.read_to_string(&mut s).unwrap();
                        s
                    })
                    .map_err(|e| e.raw_os_error())
            };
            assert_eq!(read("a/b/f").unwrap(), "inside", "{how:?}");
            assert_eq!(read("./a/b/f").unwrap(), "inside", "{how:?}");
            assert_eq!(read("rel"), Err(Some(libc::ELOOP)), "{how:?}: link inside");
            assert_eq!(
                read("dir/b/f"),
                Err(Some(libc::ELOOP)),
                "{how:?}: link on the way"
            );
            assert_eq!(
                read("abs"),
                Err(Some(libc::ELOOP)),
                "{how:?}: absolute link"
            );
            assert_eq!(read("up"), Err(Some(libc::ELOOP)), "{how:?}: link up");
            assert_eq!(read("../secret"), Err(Some(libc::EXDEV)), "{how:?}: ..");
            assert_eq!(
                read("a/../../secret"),
                Err(Some(libc::EXDEV)),
                "{how:?}: a/../.."
            );
            let abs = d.path().join("secret");
            assert_eq!(
                read(abs.to_str().unwrap()),
                Err(Some(libc::EXDEV)),
                "{how:?}: absolute path"
            );
            assert!(read("a/b/none").is_err_and(|e| e == Some(libc::ENOENT)));
        }
        let e = root.open_beneath(Path::new("rel"), false).unwrap_err();
        assert!(beneath_refusal(&e).unwrap().contains("symbolic link"));
    }

    #[test]
    fn outputs_are_classified_and_inputs_refused() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        assert!(matches!(output_target(&f).unwrap(), OutputTarget::Replace));
        std::fs::write(&f, b"x").unwrap();
        assert!(matches!(output_target(&f).unwrap(), OutputTarget::Replace));
        assert!(matches!(
            output_target(Path::new("/dev/null")).unwrap(),
            OutputTarget::Stream(_)
        ));
        assert!(output_target(d.path()).is_err());
        // A descriptor's link to a file (/dev/stdout redirected to one) is not replaced.
        let open = File::open(&f).unwrap();
        let via = PathBuf::from(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&open)
        ));
        let e = output_target(&via).unwrap_err().to_string();
        assert!(e.contains("open file descriptor"), "{e}");
        let hard = d.path().join("hard");
        std::fs::hard_link(&f, &hard).unwrap();
        let e = refuse_inputs(std::slice::from_ref(&hard), std::slice::from_ref(&f)).unwrap_err();
        assert!(e.to_string().contains("is the input"), "{e}");
        refuse_inputs(&[d.path().join("other")], &[f]).unwrap();
    }
}
