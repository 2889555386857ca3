//! Scratch space reserved by runs that share a location: three ranks of a job started at
//! once on one small scratch disk each saw the whole free space, all chose two-pass and
//! all failed with ENOSPC. A run that will write piles decides and reserves under an
//! exclusive `flock` of the location ([`reserve`]), seeing what every live run there has
//! reserved and not yet written ([`reserved_by_others`]); its reservation is a scratch
//! directory `.riffle-scratch-reserve-PID-RANDOM` holding a `reserved` file ("bytes N",
//! "inodes M"), so it carries its owner's pid and lock like any scratch, goes when the run
//! ends, and is reclaimed, not counted, once its owner is dead.
//!
//! The daemon's admission reserves each two-pass pass's piles the same way (beside its own
//! ledger of its passes), and leaves what other processes reserved
//! ([`reserved_by_other_processes`]).

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::{alive, owner_pid, tree_bytes, ScratchDir, DIR_PREFIX};
use crate::{door, Result};

/// The kind of a reservation's scratch directory.
const KIND: &str = "reserve";

/// A run's claim on scratch space, held until it is dropped.
#[derive(Debug)]
pub struct Reservation {
    dir: ScratchDir,
}

impl Reservation {
    /// Its directory (`.riffle-scratch-reserve-PID-RANDOM`).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Bytes and files of scratch that live runs in `location` have reserved and not written
/// yet: each live reservation's figures less what its owner's other scratch directories
/// there already hold (the free space counts those). Dead owners' reservations count
/// nothing.
pub fn reserved_by_others(location: &Path) -> (u64, u64) {
    reserved_except(location, None)
}

/// [`reserved_by_others`] of processes other than this one: what a daemon, which counts
/// its own passes' reservations itself, must leave to the runs beside it.
pub fn reserved_by_other_processes(location: &Path) -> (u64, u64) {
    reserved_except(location, Some(std::process::id()))
}

fn reserved_except(location: &Path, me: Option<u32>) -> (u64, u64) {
    let Ok(entries) = std::fs::read_dir(location) else {
        return (0, 0);
    };
    let mut claims = Vec::new();
    let mut held: Vec<(u32, u64, u64)> = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some((pid, true)) = owner_pid(name.as_bytes()) else {
            continue;
        };
        if Some(pid) == me {
            continue;
        }
        let path = e.path();
        if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        let reservation = name
            .to_str()
            .is_some_and(|n| n.starts_with(&format!("{DIR_PREFIX}{KIND}-")));
        if reservation {
            claims.push((pid, path));
        } else {
            held.push((pid, tree_bytes(&path), files_in(&path)));
        }
    }
    let (mut bytes, mut inodes) = (0u64, 0u64);
    for (pid, path) in claims {
        let read = |f: &str| door::read_meta(&path.join(f), door::cap::OWNER, door::Follow::No);
        let Ok(Some(owner)) = read("owner") else {
            continue;
        };
        let start = field(&owner, "start");
        if !alive(pid, start) {
            continue;
        }
        let Ok(Some(claim)) = read("reserved") else {
            continue;
        };
        let (used, files) = held
            .iter()
            .filter(|h| h.0 == pid)
            .fold((0u64, 0u64), |(b, f), h| (b + h.1, f + h.2));
        bytes += field(&claim, "bytes").unwrap_or(0).saturating_sub(used);
        inodes += field(&claim, "inodes").unwrap_or(0).saturating_sub(files);
    }
    (bytes, inodes)
}

/// A `NAME VALUE` line's value.
fn field(text: &[u8], name: &str) -> Option<u64> {
    String::from_utf8_lossy(text).lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|v| v.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// Entries under `path`, itself included.
fn files_in(path: &Path) -> u64 {
    1 + std::fs::read_dir(path).map_or(0, |rd| {
        rd.flatten()
            .map(|e| {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    files_in(&e.path())
                } else {
                    1
                }
            })
            .sum()
    })
}

/// Decides and reserves scratch in `location` as one step among the runs there: under an
/// exclusive lock of the location, `decide` is given what live runs have reserved and not
/// written (bytes, files; see [`reserved_by_others`]) and returns what this run will write
/// there (`None`: nothing, e.g. it chose to read without piles), which is then reserved
/// until the returned [`Reservation`] is dropped. A location that does not exist yet
/// (the run makes it) has no other runs: `decide` is given nothing and no lock is taken.
pub fn reserve<F>(location: &Path, decide: F) -> Result<Option<Reservation>>
where
    F: FnOnce((u64, u64)) -> Result<Option<(u64, u64)>>,
{
    // Held until this returns: a second run's decision waits for this one's reservation.
    let lock = crate::door::open_dir(location).and_then(|f| f.lock().map(|()| f));
    let others = match &lock {
        Ok(_) => reserved_by_others(location),
        Err(_) => (0, 0),
    };
    let Some((bytes, inodes)) = decide(others)? else {
        return Ok(None);
    };
    let dir = ScratchDir::new_in(location, KIND)?;
    let path = dir.path().join("reserved");
    door::create_private(&path)
        .and_then(|mut f| f.write_all(format!("bytes {bytes}\ninodes {inodes}\n").as_bytes()))
        .map_err(|e| crate::Error::io(&path, "write", None, e))?;
    drop(lock);
    Ok(Some(Reservation { dir }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_reservations_count_less_what_their_owner_wrote_and_dead_ones_nothing() {
        let loc = tempfile::tempdir_in(".").unwrap();
        assert_eq!(reserved_by_others(loc.path()), (0, 0));
        let first = reserve(loc.path(), |others| {
            assert_eq!(others, (0, 0));
            Ok(Some((10_000, 5)))
        })
        .unwrap()
        .unwrap();
        assert_eq!(reserved_by_others(loc.path()), (10_000, 5));
        // Its piles, written: what is on disk no longer counts as reserved.
        let piles = ScratchDir::new_in(loc.path(), "two-pass").unwrap();
        std::fs::write(piles.path().join("group-0"), vec![0u8; 4000]).unwrap();
        let (bytes, inodes) = reserved_by_others(loc.path());
        assert!(bytes <= 6000 && inodes <= 3, "{bytes} {inodes}");
        // A second run sees the first's claim; one that reserves nothing holds nothing.
        let none = reserve(loc.path(), |others| {
            assert_eq!(others, (bytes, inodes));
            Ok(None)
        })
        .unwrap();
        assert!(none.is_none());
        drop(piles);
        drop(first);
        assert_eq!(reserved_by_others(loc.path()), (0, 0));
        // A dead owner's reservation, left by a SIGKILL, counts nothing.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let stale = loc
            .path()
            .join(format!("{DIR_PREFIX}{KIND}-{dead}-abcdefghij"));
        std::fs::create_dir(&stale).unwrap();
        std::fs::write(stale.join("owner"), format!("pid {dead}\nstart 1\n")).unwrap();
        std::fs::write(stale.join("reserved"), "bytes 99999\ninodes 9\n").unwrap();
        assert_eq!(reserved_by_others(loc.path()), (0, 0));
    }
}
