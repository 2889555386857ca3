//! Files and directories riffle creates, and their whole lifecycle.
//!
//! Every file riffle writes is first created here (opened by [`crate::door`], the one place
//! that opens paths), never by opening a path it chose with `O_TRUNC`:
//!
//! - [`TempFile`]: a private file (`O_CREAT | O_EXCL`, mode 0600, so a symlink or file
//!   planted at the name is never followed or reused: another name is drawn) under an
//!   unpredictable name in the destination's directory. Committed by [`TempFile::commit`]
//!   (fsync, rename over the destination, fsync of the directory) or, for a set of
//!   outputs that must appear together, [`commit_all`]. Dropped uncommitted, it is
//!   removed.
//! - [`OutFile`]: an output written through a buffer (`cat -o`, `--ids-out`): a
//!   [`TempFile`] committed by [`OutFile::finish`], or a FIFO or character device written
//!   into ([`crate::door::output_target`]); refused if it is one of the inputs.
//! - [`ScratchDir`]: a private directory (`mkdtemp`, mode 0700) for piles and other
//!   scratch, with an `owner` file (pid and start time), removed with everything in it
//!   when dropped.
//!
//! Both carry their owner's pid in their name and hold an exclusive `flock` for as long as
//! their owner lives (the lock goes with the process, whatever kills it). Before riffle
//! first creates anything in a directory it looks there for entries of earlier riffle
//! processes whose lock is free and whose owner is gone (a SIGKILL, a power cut), removes
//! them and says how many bytes it reclaimed ([`reclaim`]). SIGINT and SIGTERM are taken by
//! the binary, which calls [`remove_live`] (everything this process has live, removed)
//! before it exits; after that nothing new can be created or committed.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rand::RngExt;

use crate::{door, notice, Error, Result};

mod reserve;
pub use reserve::{reserve, reserved_by_other_processes, reserved_by_others, Reservation};

/// Names of scratch directories start with this.
pub const DIR_PREFIX: &str = ".riffle-scratch-";
/// Names of temporary files contain this (after a dot and the destination's name).
pub const FILE_MARK: &str = ".riffle-tmp-";

/// What this process has on disk that is not yet committed, for [`remove_live`].
struct Registry {
    next: u64,
    live: Vec<(u64, PathBuf, EntryKind)>,
    /// Set by [`remove_live`]: the process is exiting, nothing new may appear.
    closed: bool,
    /// Directories already searched for stale entries.
    reclaimed: BTreeSet<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EntryKind {
    File,
    Dir,
    /// A directory riffle created to hold scratch (a `--scratch` that did not exist):
    /// removed only if empty.
    CreatedParent,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    next: 0,
    live: Vec::new(),
    closed: false,
    reclaimed: BTreeSet::new(),
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

fn interrupted() -> Error {
    Error::Cancelled {
        reason: "interrupted: riffle is exiting",
    }
}

/// A registry entry, removed from the registry when dropped (the entry's own owner removes
/// or commits the path).
#[derive(Debug)]
struct Live(u64);

impl Live {
    fn add(path: &Path, kind: EntryKind) -> Result<Live> {
        Live::make(kind, || Ok((path.to_path_buf(), ()))).map(|(l, ())| l)
    }

    /// Makes an entry with `make` (which returns its path) and registers it, as one step
    /// under the registry's lock: a signal's [`remove_live`] finds it either not made yet
    /// or registered, never made and unregistered (left behind, and its parent with it).
    /// `make` must not take the registry.
    fn make<T>(kind: EntryKind, make: impl FnOnce() -> Result<(PathBuf, T)>) -> Result<(Live, T)> {
        let mut r = registry();
        if r.closed {
            return Err(interrupted());
        }
        let (path, made) = make()?;
        r.next += 1;
        let id = r.next;
        r.live.push((id, path, kind));
        Ok((Live(id), made))
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        registry().live.retain(|(id, _, _)| *id != self.0);
    }
}

/// Set by [`remove_live`] before it takes the registry: the process is exiting on a signal.
static STOPPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the process is exiting on a signal ([`remove_live`] has begun). A loop that
/// creates entries inside a live scratch directory without registering each one (a `files`
/// tree being generated) checks this every entry and stops: else it would keep adding
/// files while the directory is being removed, and the removal would chase it.
pub fn stopping() -> bool {
    STOPPING.load(std::sync::atomic::Ordering::Acquire)
}

/// Removes everything this process has live (temporary files, scratch directories, and
/// scratch parents it created, if empty), newest first, and closes the registry: from
/// here on nothing can be created or committed. For the signal handler of the binary, just
/// before it exits. Returns the entries and bytes removed.
pub fn remove_live() -> (usize, u64) {
    STOPPING.store(true, std::sync::atomic::Ordering::Release);
    let mut r = registry();
    r.closed = true;
    let mut count = 0;
    let mut bytes = 0;
    for (_, path, kind) in r.live.drain(..).rev() {
        let removed = match kind {
            EntryKind::File => {
                let size = std::fs::symlink_metadata(&path).map_or(0, |m| m.len());
                std::fs::remove_file(&path).ok().map(|()| size)
            }
            EntryKind::Dir => {
                let size = tree_bytes(&path);
                remove_tree_racing(&path).then_some(size)
            }
            EntryKind::CreatedParent => std::fs::remove_dir(&path).ok().map(|()| 0),
        };
        if let Some(b) = removed {
            count += 1;
            bytes += b;
        }
    }
    (count, bytes)
}

/// Removes the tree at `path` while the run's other threads may still be adding to it (a
/// writer that checked `stopping` just before it was set, a pile writer opening its group
/// files): a removal that finds the tree grew behind it is tried again, for up to about
/// 200 ms. True when the tree is gone.
fn remove_tree_racing(path: &Path) -> bool {
    for _ in 0..40 {
        match std::fs::remove_dir_all(path) {
            Ok(()) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
        }
    }
    false
}

/// This process's start time in clock ticks since boot (field 22 of /proc/self/stat): with
/// the pid, it tells this process from a later one that reused its pid.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether process `pid` (started at `start`, when known) lives. A process that is exiting
/// or a zombie does not: a SIGKILLed run whose parent has not reaped it yet, or whose
/// io_uring workers are still being torn down, answers signal 0 for a while after its
/// files and locks are gone (a run started at once left its scratch; one 2 s later took it).
fn alive(pid: u32, start: Option<u64>) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    if raw <= 0 {
        return false;
    }
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), None) {
        Err(nix::errno::Errno::ESRCH) => false,
        // EPERM: alive, owned by someone else.
        _ => {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
            if stat.as_deref().is_some_and(ending) {
                return false;
            }
            match start {
                Some(s) => start_time(pid).is_none_or(|now| now == s),
                None => true,
            }
        }
    }
}

/// Whether a /proc/PID/stat line is a process that is ending: a zombie or dead (state Z, X
/// or x), or exiting (PF_EXITING among its flags, field 9).
fn ending(stat: &str) -> bool {
    const PF_EXITING: u64 = 0x4;
    let Some(rest) = stat.rfind(')').map(|at| &stat[at + 1..]) else {
        return false;
    };
    let mut fields = rest.split_whitespace();
    let state = fields.next().unwrap_or("");
    // After the state: ppid, pgrp, session, tty_nr, tpgid, then the flags.
    let flags: u64 = fields.nth(5).and_then(|f| f.parse().ok()).unwrap_or(0);
    matches!(state, "Z" | "X" | "x") || flags & PF_EXITING != 0
}

fn random_suffix() -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut rng = rand::rng();
    (0..10)
        .map(|_| CHARS[rng.random_range(0..CHARS.len())] as char)
        .collect()
}

/// Where a run's scratch goes: the location given (`--scratch`), or the directory of the
/// dataset's first file (`.` for a bare name).
pub fn location(given: Option<&Path>, first_file: &Path) -> PathBuf {
    given.map_or_else(|| parent_dir(first_file).to_path_buf(), Path::to_path_buf)
}

/// The directory a path's file is in (`.` for a bare name).
pub fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// A private file under an unpredictable name, locked while this process lives and
/// removed when dropped unless committed.
#[derive(Debug)]
pub struct TempFile {
    path: PathBuf,
    /// Holds the lock (a duplicate handed to a writer shares it).
    file: File,
    _live: Live,
}

impl TempFile {
    /// A new empty file `.NAME.riffle-tmp-PID-RANDOM` in `dest`'s directory, to become
    /// `dest` by [`TempFile::commit`]. Stale temporary files of dead riffle processes in
    /// that directory are removed first (once per directory and process).
    pub fn beside(dest: &Path) -> Result<TempFile> {
        let name = dest.file_name().ok_or_else(|| {
            Error::Invalid(format!("{}: not a file name to write to", dest.display()))
        })?;
        let mut prefix = OsString::from(".");
        prefix.push(name);
        TempFile::create_in(parent_dir(dest), prefix)
    }

    /// A new empty file `.riffle-WHAT.riffle-tmp-PID-RANDOM` in `dir` that is never
    /// committed: scratch (the probe's region).
    pub fn scratch_in(dir: &Path, what: &str) -> Result<TempFile> {
        TempFile::create_in(dir, OsString::from(format!(".riffle-{what}")))
    }

    fn create_in(dir: &Path, prefix: OsString) -> Result<TempFile> {
        reclaim(dir);
        let pid = std::process::id();
        // Tests plant a link at the first name tried: `RIFFLE_TEST_TEMP_SUFFIX` fixes it
        // (every later attempt is random, as without it).
        let mut first = std::env::var("RIFFLE_TEST_TEMP_SUFFIX").ok();
        loop {
            let suffix = match first.take() {
                Some(s) => format!("{FILE_MARK}{s}"),
                None => format!("{FILE_MARK}{pid}-{}", random_suffix()),
            };
            let mut name = within_name_max(&prefix, suffix.len());
            name.push(suffix);
            let path = dir.join(&name);
            let live = Live::add(&path, EntryKind::File)?;
            match door::create_private(&path) {
                Ok(file) => {
                    // Taken at once, and never contended: the name is new and only a
                    // reclaim (which tries without blocking and then checks the pid in the
                    // name, ours and alive) ever asks for it.
                    file.lock()
                        .map_err(|e| Error::io(&path, "lock (flock)", None, e))?;
                    return Ok(TempFile {
                        path,
                        file,
                        _live: live,
                    });
                }
                // Someone has the name (a planted file or symlink): draw another.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(Error::io(
                        &path,
                        "create a temporary file (in its directory)",
                        None,
                        e,
                    ))
                }
            }
        }
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A second handle on the file (for a writer); it shares the lock.
    pub fn handle(&self) -> Result<File> {
        self.file
            .try_clone()
            .map_err(|e| Error::io(&self.path, "dup", None, e))
    }

    /// Makes the file `dest`: fsync, rename over it, fsync of the directory. The file's
    /// writers must have finished.
    pub fn commit(self, dest: &Path) -> Result<()> {
        commit_all(vec![(self, dest.to_path_buf())])
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        // Uncommitted: remove it. A committed one has an empty path (it was renamed).
        if !self.path.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Commits a set of temporary files together: each synced, then all renamed into place,
/// then each directory synced once. A failure leaves the rest uncommitted (and removed).
pub fn commit_all(files: Vec<(TempFile, PathBuf)>) -> Result<()> {
    let created = 0o666 & !umask();
    for (_, dest) in &files {
        // Only a regular file, a link (the link is replaced, not its target) or nothing
        // is renamed over: a FIFO, a device or a directory at the name stays what it is.
        if let Ok(m) = std::fs::symlink_metadata(dest) {
            let t = m.file_type();
            if !(t.is_file() || t.is_symlink()) {
                return Err(Error::Invalid(format!(
                    "{}: is {}: not replaced by a file",
                    dest.display(),
                    door::file_type_name(&t)
                )));
            }
        }
    }
    for (t, dest) in &files {
        // Private while written; once complete, the mode a plain create would have given
        // (or the mode of the file it replaces).
        let mode = match std::fs::metadata(dest) {
            Ok(m) if m.is_file() => m.mode() & 0o7777,
            _ => created,
        };
        t.file
            .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))
            .map_err(|e| Error::io(&t.path, "chmod", None, e))?;
        t.file
            .sync_all()
            .map_err(|e| Error::io(&t.path, "fsync", None, e))?;
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    for (mut t, dest) in files {
        {
            // Under the registry's lock, so a signal's cleanup sees the file either before
            // the rename (and removes the temporary name) or not at all.
            let r = registry();
            if r.closed {
                return Err(interrupted());
            }
            std::fs::rename(&t.path, &dest)
                .map_err(|e| Error::io(&dest, "rename into place", None, e))?;
            t.path = PathBuf::new();
        }
        let dir = parent_dir(&dest).to_path_buf();
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    for d in dirs {
        sync_dir(&d)?;
    }
    Ok(())
}

/// An output written through a buffer (`riffle cat -o`, `--ids-out`): a FIFO or character
/// device is written into, anything else is a private temporary file beside the
/// destination, renamed over it by [`OutFile::finish`] (dropped unfinished, on an error or
/// a signal, it is removed and the destination is untouched).
pub struct OutFile {
    dest: PathBuf,
    writer: std::io::BufWriter<File>,
    temp: Option<TempFile>,
}

impl OutFile {
    /// Opens `dest` as an output, refused if it is one of `inputs` (same device and inode)
    /// or a block device, directory or socket ([`door::output_target`]).
    pub fn create(dest: &Path, inputs: &[PathBuf]) -> Result<OutFile> {
        door::refuse_inputs(&[dest.to_path_buf()], inputs)?;
        let (file, temp) = match door::output_target(dest)? {
            door::OutputTarget::Stream(f) => (f, None),
            door::OutputTarget::Replace => {
                let t = TempFile::beside(dest)?;
                (t.handle()?, Some(t))
            }
        };
        Ok(OutFile {
            dest: dest.to_path_buf(),
            writer: std::io::BufWriter::with_capacity(1 << 20, file),
            temp,
        })
    }

    /// Where it goes.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Flushes, and commits a temporary file over the destination.
    pub fn finish(mut self) -> Result<()> {
        self.writer
            .flush()
            .map_err(|e| Error::io(&self.dest, "write", None, e))?;
        match self.temp.take() {
            Some(t) => t.commit(&self.dest),
            None => Ok(()),
        }
    }
}

/// Writes through the buffer; errors name the destination (and keep their kind).
impl Write for OutFile {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.writer.write(bytes).map_err(|e| self.named(e))
    }

    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.writer.write_all(bytes).map_err(|e| self.named(e))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.writer.flush().map_err(|e| self.named(e))
    }
}

impl OutFile {
    fn named(&self, e: std::io::Error) -> std::io::Error {
        std::io::Error::new(e.kind(), format!("{}: write: {e}", self.dest.display()))
    }
}

/// Writes `bytes` as the new content of `dest`: a private temporary file beside it, synced
/// and renamed over it, then the directory synced. Readers see the old file or the new one.
pub fn write_atomic(dest: &Path, bytes: &[u8]) -> Result<()> {
    let temp = TempFile::beside(dest)?;
    temp.handle()?
        .write_all(bytes)
        .map_err(|e| Error::io(temp.path(), "write", None, e))?;
    temp.commit(dest)
}

/// `prefix`, cut (at a byte) so that it and `suffix_len` more bytes fit in NAME_MAX (255
/// bytes): a temporary name for a destination named with 230 bytes must still be valid.
/// The suffix (mark, pid, random part) is what [`reclaim`] reads, so it is kept whole.
fn within_name_max(prefix: &OsString, suffix_len: usize) -> OsString {
    const NAME_MAX: usize = 255;
    let bytes = prefix.as_bytes();
    let keep = bytes.len().min(NAME_MAX.saturating_sub(suffix_len));
    OsString::from(std::ffi::OsStr::from_bytes(&bytes[..keep]))
}

/// The process's umask, read without changing it (/proc/self/status; 022 if unknown).
fn umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

/// fsyncs a directory, so renames and removals in it are durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    crate::door::open_dir(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, "fsync directory", None, e))
}

/// A private scratch directory, removed with its contents when dropped.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
    _lock: File,
    _live: Live,
    /// A parent this made (a scratch location that did not exist), removed if empty.
    _parent: Option<CreatedParent>,
}

#[derive(Debug)]
struct CreatedParent {
    path: PathBuf,
    _live: Live,
}

impl Drop for CreatedParent {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.path);
    }
}

impl ScratchDir {
    /// A new directory `.riffle-scratch-KIND-PID-RANDOM` in `parent` (made if missing,
    /// and then removed again when empty). Stale scratch of dead riffle processes in
    /// `parent` is removed first (once per directory and process).
    pub fn new_in(parent: &Path, kind: &str) -> Result<ScratchDir> {
        // A parent another scratch entry of this process made is removed when that entry
        // goes and leaves it empty: if it went between the check and the directory's
        // creation (a daemon's pass reservation and its piles' directory), or another
        // made it between the check and this one's making it, try again.
        use std::io::ErrorKind::{AlreadyExists, NotFound};
        let mut tries = 0;
        loop {
            match Self::new_in_once(parent, kind) {
                Err(Error::Io { op, err, .. })
                    if tries < 3
                        && ((op == "create a scratch directory in" && err.kind() == NotFound)
                            || (op == "create the scratch directory"
                                && err.kind() == AlreadyExists)) =>
                {
                    tries += 1;
                }
                r => return r,
            }
        }
    }

    fn new_in_once(parent: &Path, kind: &str) -> Result<ScratchDir> {
        let created = if parent.exists() {
            None
        } else {
            // Only the last component is made: a mistyped deep path is an error.
            let (live, ()) = Live::make(EntryKind::CreatedParent, || {
                std::fs::create_dir(parent)
                    .map_err(|e| Error::io(parent, "create the scratch directory", None, e))?;
                Ok((parent.to_path_buf(), ()))
            })?;
            Some(CreatedParent {
                path: parent.to_path_buf(),
                _live: live,
            })
        };
        reclaim(parent);
        let pid = std::process::id();
        let prefix = format!("{DIR_PREFIX}{kind}-{pid}-");
        let (live, dir) = Live::make(EntryKind::Dir, || {
            let dir = tempfile::Builder::new()
                .prefix(&prefix)
                .rand_bytes(10)
                .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
                .tempdir_in(parent)
                .map_err(|e| Error::io(parent, "create a scratch directory in", None, e))?
                .keep();
            Ok((dir.clone(), dir))
        })?;
        let lock = crate::door::open_entry(&dir)
            .and_then(|f| f.lock().map(|()| f))
            .map_err(|e| {
                let _ = std::fs::remove_dir(&dir);
                Error::io(&dir, "lock (flock)", None, e)
            })?;
        let owner = format!(
            "pid {pid}\nstart {}\ncommand {}\n",
            start_time(pid).unwrap_or(0),
            std::env::args().collect::<Vec<_>>().join(" ")
        );
        let out = ScratchDir {
            path: dir,
            _lock: lock,
            _live: live,
            _parent: created,
        };
        door::create_private(&out.path.join("owner"))
            .and_then(|mut f| f.write_all(owner.as_bytes()))
            .map_err(|e| Error::io(out.path.join("owner"), "write", None, e))?;
        Ok(out)
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl ScratchDir {
    /// Removes it now, saying so if that fails (dropping it removes it too, silently).
    pub fn close(mut self) -> Result<()> {
        let path = std::mem::take(&mut self.path);
        std::fs::remove_dir_all(&path).map_err(|e| Error::io(&path, "remove", None, e))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Bytes of the files under `path` (not following symlinks).
fn tree_bytes(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(path)
        .map(|rd| rd.flatten().map(|e| tree_bytes(&e.path())).sum())
        .unwrap_or(0)
}

/// What a stale entry's name says about its owner.
fn owner_pid(name: &[u8]) -> Option<(u32, bool)> {
    let text = std::str::from_utf8(name).ok()?;
    if let Some(rest) = text.strip_prefix(DIR_PREFIX) {
        // KIND-PID-RANDOM; KIND has no '-' after it is made by this module, but read from
        // the right to be safe.
        let mut parts = rest.rsplitn(3, '-');
        let _random = parts.next()?;
        let pid = parts.next()?.parse().ok()?;
        return Some((pid, true));
    }
    let at = text.rfind(FILE_MARK)?;
    if !text.starts_with('.') {
        return None;
    }
    let (pid, _random) = text[at + FILE_MARK.len()..].split_once('-')?;
    Some((pid.parse().ok()?, false))
}

/// Removes, from `dir`, the scratch directories and temporary files of riffle processes
/// that are gone: the owner pid in the name is dead (or, for directories, its start time
/// in `owner` is another process's) and the entry's lock is free. Prints one notice with
/// what it reclaimed. Done once per directory and process; errors only mean less is
/// reclaimed.
pub fn reclaim(dir: &Path) -> (usize, u64) {
    {
        let mut r = registry();
        let key = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        if !r.reclaimed.insert(key) {
            return (0, 0);
        }
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    let (mut count, mut bytes) = (0usize, 0u64);
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((pid, is_dir)) = owner_pid(name.as_bytes()) else {
            continue;
        };
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        // Only what this module makes: real directories and regular files, never a link.
        if (is_dir && !meta.is_dir()) || (!is_dir && !meta.file_type().is_file()) {
            continue;
        }
        // The owner file is read through the door: a FIFO, a device or a link planted
        // there (anyone may write a 1777 TMPDIR) is refused, never read or waited on, and
        // the entry is then left alone.
        let start = if is_dir {
            match door::read_meta(&path.join("owner"), door::cap::OWNER, door::Follow::No) {
                Ok(Some(o)) => String::from_utf8_lossy(&o)
                    .lines()
                    .find_map(|l| l.strip_prefix("start ").and_then(|s| s.parse().ok())),
                Ok(None) => None,
                Err(_) => continue,
            }
        } else {
            None
        };
        if alive(pid, start) {
            continue;
        }
        let Ok(handle) = door::open_entry(&path) else {
            continue;
        };
        if handle.try_lock().is_err() {
            continue;
        }
        // Same inode as listed, still (not swapped between the stat and the open).
        if handle.metadata().map(|m| m.ino()).ok() != Some(meta.ino()) {
            continue;
        }
        let size = tree_bytes(&path);
        let removed = if is_dir {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        if removed.is_ok() {
            count += 1;
            bytes += size;
        }
    }
    if count > 0 {
        notice::once(
            &format!("reclaimed:{}", dir.display()),
            &format!(
                "removed {count} scratch {} left in {} by riffle processes that ended \
                 without cleaning up ({} reclaimed)",
                if count == 1 { "entry" } else { "entries" },
                dir.display(),
                crate::size::human_bytes(bytes as f64)
            ),
        );
    }
    (count, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_symlink_at_a_temporary_name_is_never_followed() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let target = dir.path().join("victim");
        std::fs::write(&target, b"precious").unwrap();
        let t = TempFile::beside(&dir.path().join("out")).unwrap();
        let name = t.path().to_path_buf();
        drop(t);
        // Plant a link at the very name it used, then make files until one collides.
        std::os::unix::fs::symlink(&target, &name).unwrap();
        let e = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&name)
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        let t = TempFile::beside(&dir.path().join("out")).unwrap();
        assert_ne!(t.path(), name);
        t.handle().unwrap().write_all(b"new").unwrap();
        t.commit(&dir.path().join("out")).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
        assert!(!std::fs::symlink_metadata(dir.path().join("out"))
            .unwrap()
            .file_type()
            .is_symlink());
    }

    #[test]
    fn temp_files_are_private_and_removed_unless_committed() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let dest = dir.path().join("o.txt");
        let t = TempFile::beside(&dest).unwrap();
        let path = t.path().to_path_buf();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert!(path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(".o.txt.riffle-tmp-"));
        drop(t);
        assert!(!path.exists());
        assert!(!dest.exists());
    }

    #[test]
    fn stale_entries_of_dead_owners_are_reclaimed_and_live_ones_kept() {
        let dir = tempfile::tempdir_in(".").unwrap();
        // A live one: ours, locked (made first: making it reclaims the directory).
        let live = ScratchDir::new_in(dir.path(), "piles").unwrap();
        // A dead owner: a child that has exited (its pid is not reused this quickly).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let stale_dir = dir
            .path()
            .join(format!("{DIR_PREFIX}piles-{dead}-abcdefghij"));
        std::fs::create_dir(&stale_dir).unwrap();
        std::fs::write(stale_dir.join("pile-00000"), vec![7u8; 5000]).unwrap();
        let stale_file = dir.path().join(format!(".out{FILE_MARK}{dead}-abcdefghij"));
        std::fs::write(&stale_file, vec![1u8; 300]).unwrap();
        // Not riffle's: a link with a riffle name pointing elsewhere is left alone.
        let elsewhere = tempfile::tempdir_in(".").unwrap();
        let link = dir.path().join(format!("{DIR_PREFIX}x-{dead}-klmnopqrst"));
        std::os::unix::fs::symlink(elsewhere.path(), &link).unwrap();
        registry().reclaimed.clear();
        let (n, bytes) = reclaim(dir.path());
        assert_eq!((n, bytes), (2, 5300));
        assert!(!stale_dir.exists() && !stale_file.exists());
        assert!(live.path().join("owner").exists());
        assert!(std::fs::symlink_metadata(&link).is_ok() && elsewhere.path().exists());
        let kept = live.path().to_path_buf();
        drop(live);
        assert!(!kept.exists());
    }

    #[test]
    fn a_missing_scratch_location_is_made_and_removed_again() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let loc = dir.path().join("scratch");
        let s = ScratchDir::new_in(&loc, "t").unwrap();
        assert!(s.path().starts_with(&loc));
        drop(s);
        assert!(!loc.exists());
        assert!(ScratchDir::new_in(&dir.path().join("a/b"), "t").is_err());
    }

    /// Threads of one process making and dropping scratch directories in a location that
    /// does not exist: one's made parent, removed when it goes and leaves it empty, went
    /// between another's check and its directory (CI: "create a scratch directory in
    /// failed: No such file or directory", a daemon's reservation beside its pass).
    #[test]
    fn scratch_directories_made_at_once_in_a_missing_location_all_succeed() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let loc = dir.path().join("scratch");
        for _ in 0..200 {
            std::thread::scope(|s| {
                let made: Vec<_> = (0..4)
                    .map(|_| s.spawn(|| ScratchDir::new_in(&loc, "t").map(drop)))
                    .collect();
                for m in made {
                    m.join().unwrap().unwrap();
                }
            });
        }
    }

    #[test]
    fn zombies_and_exiting_processes_are_ending() {
        let live = "1234 (riffle) S 1 1234 1234 0 -1 4194560 100 0 0 0";
        assert!(!ending(live));
        assert!(ending("1234 (riffle) Z 1 1234 1234 0 -1 4227332 100 0 0 0"));
        // PF_EXITING (0x4) in the flags of a task still tearing down its rings.
        assert!(ending("1234 (a) b) D 1 1234 1234 0 -1 4194564 100 0 0 0"));
        assert!(!ending("garbage"));
        let mine = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(!ending(&mine));
    }

    #[test]
    fn owner_pids_are_read_from_names() {
        assert_eq!(
            owner_pid(b".riffle-scratch-piles-123-abcdefghij"),
            Some((123, true))
        );
        assert_eq!(
            owner_pid(b".out.jsonl.riffle-tmp-77-abcdefghij"),
            Some((77, false))
        );
        assert_eq!(owner_pid(b"out.riffle-tmp-77-x"), None);
        assert_eq!(owner_pid(b"data.jsonl"), None);
    }
}
