//! The per-user node daemon (`riffle serve --user`): the private directory it lives in and
//! the locks that keep it one.
//!
//! One daemon per user and node serves every job of that user there; its clients find it
//! at a path they work out alone ([`default_dir`]): `$RIFFLE_RUNTIME_DIR`, else
//! `$XDG_RUNTIME_DIR/riffle`, else `${TMPDIR:-/tmp}/riffle-UID`. The directory holds:
//!
//! - `riffle.sock`: the socket (mode 0600; peers of another user are refused as well, by
//!   `SO_PEERCRED`);
//! - `daemon.lock`: held (`flock`) by the daemon for as long as it runs, and holding its
//!   pid and version: a second daemon for the directory refuses to start
//!   ([`take_life_lock`]), whoever started it;
//! - `start.lock`: held by a client while it looks for the daemon and starts one, and by
//!   the daemon while it leaves for idleness: a client never finds a socket about to go;
//! - `daemon.log`: the daemon's stderr, written anew by each daemon.
//!
//! The directory must be the user's alone: a directory, not a link, owned by the user,
//! with no access for group or others. In a shared /tmp a neighbour may have made the name
//! first, as a directory of their own or a link: that is refused with what was found,
//! never used (a socket there could be theirs).

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The socket's name in the directory.
pub const SOCKET: &str = "riffle.sock";
/// The daemon's lock, held while it runs.
pub const LIFE_LOCK: &str = "daemon.lock";
/// The starters' lock.
pub const START_LOCK: &str = "start.lock";
/// The daemon's log.
pub const LOG: &str = "daemon.log";

/// Longest socket path the kernel takes (`sun_path` less its terminating zero).
const SUN_PATH_MAX: usize = 107;

/// The directory the user's node daemon lives in, by the rule above (the variables read
/// now).
pub fn default_dir() -> PathBuf {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = var("RIFFLE_RUNTIME_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = var("XDG_RUNTIME_DIR").map(PathBuf::from) {
        if d.is_absolute() && d.is_dir() {
            return d.join("riffle");
        }
    }
    let tmp = var("TMPDIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    tmp.join(format!("riffle-{}", nix::unistd::geteuid().as_raw()))
}

/// Makes `dir` (mode 0700) if it is missing, and checks that it is the user's alone; its
/// parent must exist. Errors say what was found and what to do.
pub fn prepare_dir(dir: &Path) -> Result<()> {
    if !dir.is_absolute() {
        return Err(Error::Invalid(format!(
            "{}: the daemon's directory must be an absolute path",
            dir.display()
        )));
    }
    let socket = dir.join(SOCKET);
    if socket.as_os_str().len() > SUN_PATH_MAX {
        return Err(Error::Invalid(format!(
            "{}: a socket path is at most {SUN_PATH_MAX} bytes: set RIFFLE_RUNTIME_DIR to a \
             shorter directory",
            socket.display()
        )));
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(Error::io(
                dir,
                "make the daemon's directory (set RIFFLE_RUNTIME_DIR to a directory you can \
                 write)",
                None,
                e,
            ))
        }
    }
    check_private(dir)
}

/// Refuses a directory that is not the user's alone.
fn check_private(dir: &Path) -> Result<()> {
    let why = crate::door::not_owned_dir(dir, 0o077)?;
    match why {
        None => Ok(()),
        Some(why) => Err(Error::Invalid(format!(
            "{}: {why}: a private daemon's socket needs a directory only you can enter; \
             remove it, or set RIFFLE_RUNTIME_DIR to another",
            dir.display()
        ))),
    }
}

/// Takes the daemon's lock of `dir` for as long as the returned file is open, and writes
/// this process's pid and version in it. `Ok(None)` when another daemon holds it (its pid
/// and version in [`holder`]).
pub fn take_life_lock(dir: &Path) -> Result<Option<File>> {
    let path = dir.join(LIFE_LOCK);
    let mut f = crate::door::open_lock(&path).map_err(|e| Error::io(&path, "open", None, e))?;
    if f.try_lock().is_err() {
        return Ok(None);
    }
    let me = format!(
        "{} riffle {}\n",
        std::process::id(),
        env!("CARGO_PKG_VERSION")
    );
    f.set_len(0)
        .and_then(|()| f.rewind())
        .and_then(|()| f.write_all(me.as_bytes()))
        .map_err(|e| Error::io(&path, "write", None, e))?;
    Ok(Some(f))
}

/// Whether no daemon holds `dir`'s lock now (taken and let go at once; the pid written
/// in it is left as it was).
pub fn take_life_lock_probe(dir: &Path) -> Result<bool> {
    let path = dir.join(LIFE_LOCK);
    match crate::door::open_lock(&path) {
        Ok(f) => Ok(f.try_lock().is_ok()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(Error::io(&path, "open", None, e)),
    }
}

/// What the daemon's lock of `dir` holds: "PID riffle VERSION".
fn lock_text(dir: &Path) -> Option<String> {
    let mut text = String::new();
    crate::door::open_lock(&dir.join(LIFE_LOCK))
        .ok()?
        .take(256)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// The pid the daemon's lock of `dir` names.
pub fn holder_pid(dir: &Path) -> Option<i32> {
    lock_text(dir)?.split_whitespace().next()?.parse().ok()
}

/// What the daemon's lock of `dir` says of the daemon holding it: "pid N, riffle V".
pub fn holder(dir: &Path) -> Option<String> {
    let text = lock_text(dir)?;
    let (pid, version) = text.trim().split_once(' ')?;
    Some(format!("pid {pid}, {version}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_directory_not_the_users_alone_is_refused_naming_why() {
        let t = tempfile::tempdir().unwrap();
        let ok = t.path().join("mine");
        prepare_dir(&ok).unwrap();
        let mode = std::fs::metadata(&ok).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // Made twice: the second finds it as it should be.
        prepare_dir(&ok).unwrap();

        let open = t.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let e = prepare_dir(&open).unwrap_err().to_string();
        assert!(e.contains("open to others (mode 755"), "{e}");

        // A neighbour's (as root here, made theirs by chown).
        if nix::unistd::geteuid().is_root() {
            let theirs = t.path().join("theirs");
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&theirs)
                .unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            let e = prepare_dir(&theirs).unwrap_err().to_string();
            assert!(e.contains("belongs to uid 65534"), "{e}");
        }

        // In a directory others may write and rename in (not sticky).
        let shared = t.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let e = prepare_dir(&shared.join("rt")).unwrap_err().to_string();
        assert!(e.contains("not sticky (mode 777)"), "{e}");
        std::fs::set_permissions(
            &shared,
            std::os::unix::fs::PermissionsExt::from_mode(0o1777),
        )
        .unwrap();
        prepare_dir(&shared.join("rt")).unwrap();

        let link = t.path().join("link");
        std::os::unix::fs::symlink(&ok, &link).unwrap();
        let e = prepare_dir(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");

        let file = t.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let e = prepare_dir(&file).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");

        let long = t.path().join("d".repeat(120));
        let e = prepare_dir(&long).unwrap_err().to_string();
        assert!(e.contains("at most 107 bytes"), "{e}");
        assert!(prepare_dir(Path::new("rel")).is_err());
    }

    #[test]
    fn one_daemon_holds_the_life_lock_and_says_who_it_is() {
        let t = tempfile::tempdir().unwrap();
        let first = take_life_lock(t.path()).unwrap().expect("free");
        // flock locks belong to the open file description: a second open is refused, as
        // a second daemon's would be.
        assert!(take_life_lock(t.path()).unwrap().is_none());
        let who = holder(t.path()).unwrap();
        assert_eq!(
            who,
            format!(
                "pid {}, riffle {}",
                std::process::id(),
                env!("CARGO_PKG_VERSION")
            )
        );
        drop(first);
        assert!(take_life_lock(t.path()).unwrap().is_some());
    }
}
