//! The scratch filesystems' real free space, shared by the daemon's two-pass passes.
//!
//! Each pass checks the free space when it plans its piles, but two passes planned at the
//! same moment both see all of it, and both then ran out of space mid-epoch (ENOSPC). So
//! the daemon reserves a pass's scratch at admission: on each filesystem (by device) it
//! keeps what its live passes reserved, and the free space there was when none was
//! reserved (its piles are not written yet when a pass is admitted, so `statvfs` alone
//! does not say what is spoken for). A pass fits while its bytes are at most that free
//! space less the reservations (and at most what `statvfs` says now, which shrinks as
//! anyone writes). The reservation is given back when the pass ends.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::open::Refusal;
use crate::size::human_bytes;

/// The free bytes and the device of the filesystem a directory is (or will be made) on.
pub(super) type Probe = dyn Fn(&Path) -> std::io::Result<(u64, u64)> + Send + Sync;

/// One filesystem's reservations.
#[derive(Default)]
struct Ledger {
    /// Free bytes when the first live reservation was made.
    base: u64,
    /// Bytes reserved by live passes.
    reserved: u64,
}

/// The reservations on every scratch filesystem.
pub(super) struct ScratchSpace {
    ledgers: Mutex<HashMap<u64, Ledger>>,
    freed: Condvar,
    probe: Box<Probe>,
    /// Gives back scratch held for later (piles kept for a job's next pass) when a
    /// reservation does not fit: called with the bytes missing, says whether any went.
    reclaim: std::sync::OnceLock<super::budget::Reclaim>,
}

/// Scratch bytes reserved on one filesystem, given back when dropped; also claimed in the
/// scratch directory itself (`scratch::reserve`), so that `riffle read` runs sharing it
/// see what the daemon's pass will write.
pub(super) struct Reservation {
    space: Arc<ScratchSpace>,
    dev: u64,
    bytes: u64,
    _claim: Option<crate::scratch::Reservation>,
}

impl Reservation {
    /// Bytes reserved.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Gives up its claim in the scratch directory (the piles are written: the filesystem's
    /// free space says so to other processes), keeping the daemon's ledger.
    pub(super) fn written(&mut self) {
        self._claim = None;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut l = self.space.lock();
        if let Some(e) = l.get_mut(&self.dev) {
            e.reserved = e.reserved.saturating_sub(self.bytes);
        }
        self.space.freed.notify_all();
    }
}

/// `statvfs` of the nearest existing directory at or above `dir` (scratch is made when a
/// pass starts): (free bytes, device).
fn statvfs_probe(dir: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let at = dir
        .ancestors()
        .find(|a| a.is_dir())
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
    let free = crate::probe::free_bytes(at).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok((free, std::fs::metadata(at)?.dev()))
}

impl ScratchSpace {
    /// Reservations against the filesystems' real free space (`statvfs`).
    pub(super) fn new() -> Arc<ScratchSpace> {
        Self::with_probe(Box::new(statvfs_probe))
    }

    /// Reservations against what `probe` says is free (tests give a filesystem's size).
    pub(super) fn with_probe(probe: Box<Probe>) -> Arc<ScratchSpace> {
        Arc::new(ScratchSpace {
            ledgers: Mutex::new(HashMap::new()),
            freed: Condvar::new(),
            probe,
            reclaim: std::sync::OnceLock::new(),
        })
    }

    /// Sets what gives back scratch held for later when a reservation does not fit
    /// (`rolled.rs`: kept piles go before anyone is refused); called without the lock.
    pub(super) fn on_short(&self, reclaim: super::budget::Reclaim) {
        let _ = self.reclaim.set(reclaim);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Ledger>> {
        self.ledgers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most a pass could have on the filesystem under `dir`: its free space when none
    /// of this daemon's passes hold any (what `auto` plans within). `None` when unknown.
    pub(super) fn ceiling(&self, dir: &Path) -> Option<u64> {
        let (free, dev) = (self.probe)(dir).ok()?;
        let l = self.lock();
        Some(match l.get(&dev) {
            Some(e) if e.reserved > 0 => e.base.max(free),
            _ => free,
        })
    }

    /// Reserves `bytes` on the filesystem under `dir`. More than its free space with none
    /// of this daemon's passes holding any is `too_large`; more than is left beside the
    /// live reservations waits up to `wait` for them, then is `busy`.
    pub(super) fn reserve(
        self: &Arc<Self>,
        dir: &Path,
        bytes: u64,
        wait: Duration,
        stopping: &AtomicBool,
    ) -> Result<Reservation, Refusal> {
        let started = Instant::now();
        loop {
            let (free, dev) = (self.probe)(dir).map_err(|e| {
                (
                    "engine",
                    format!("scratch {}: cannot read its free space: {e}", dir.display()),
                )
            })?;
            // What other processes sharing the directory (CLI runs) reserved and have not
            // written yet is theirs.
            let theirs = crate::scratch::reserved_by_other_processes(dir).0;
            let mut l = self.lock();
            let e = l.entry(dev).or_default();
            if e.reserved == 0 {
                e.base = free;
            }
            let left = e
                .base
                .saturating_sub(e.reserved)
                .min(free)
                .saturating_sub(theirs);
            if bytes <= left {
                e.reserved += bytes;
                drop(l);
                // Best effort: a directory that cannot hold the claim still has the ledger.
                let claim = crate::scratch::reserve(dir, |_| Ok(Some((bytes, 0))))
                    .ok()
                    .flatten();
                return Ok(Reservation {
                    space: self.clone(),
                    dev,
                    bytes,
                    _claim: claim,
                });
            }
            if let Some(reclaim) = self.reclaim.get() {
                drop(l);
                if reclaim(bytes - left) {
                    continue;
                }
                l = self.lock();
            }
            let e = l.entry(dev).or_default();
            if e.reserved == 0 && theirs == 0 {
                return Err((
                    "too_large",
                    format!(
                        "the scratch piles of this job need {}, more than the {} free on the \
                         filesystem of scratch {}: asked {bytes}, limit {free}; this never \
                         fits however long it waits: free some space, give --scratch \
                         elsewhere, or use --mode lirs or auto",
                        human_bytes(bytes as f64),
                        human_bytes(free as f64),
                        dir.display()
                    ),
                ));
            }
            if stopping.load(Ordering::SeqCst) {
                return Err(("shutdown", "the daemon is shutting down".into()));
            }
            let waited = started.elapsed();
            if waited >= wait {
                return Err((
                    "busy",
                    format!(
                        "the scratch piles of this job need {} and {} of the scratch \
                         filesystem's free space is left beside the {} other passes have \
                         reserved{}: try again later",
                        human_bytes(bytes as f64),
                        human_bytes(left as f64),
                        human_bytes(e.reserved.saturating_add(theirs) as f64),
                        if waited >= Duration::from_millis(50) {
                            format!(" (waited {:.1} s for room)", waited.as_secs_f64())
                        } else {
                            String::new()
                        }
                    ),
                ));
            }
            let _ = self
                .freed
                .wait_timeout(l, (wait - waited).min(Duration::from_millis(100)))
                .unwrap_or_else(|p| p.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A filesystem of 300 bytes free (the 300 MiB, scaled): two passes of 200 never
    /// both hold it; one that alone needs more than is free is `too_large` at once; a
    /// reservation given back lets the next one in.
    #[test]
    fn concurrent_reservations_never_overcommit_the_free_space() {
        let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let w = written.clone();
        // Free space shrinks as piles are written, like the real filesystem.
        let space =
            ScratchSpace::with_probe(Box::new(move |_| Ok((300 - w.load(Ordering::SeqCst), 7))));
        let stop = AtomicBool::new(false);
        let dir = Path::new("/scratch");
        let a = space.reserve(dir, 200, Duration::ZERO, &stop).unwrap();
        // The first pass writes half its piles: statvfs says 200 free, but 100 of them are
        // the first pass's still to come.
        written.store(100, Ordering::SeqCst);
        let (code, msg) = space
            .reserve(dir, 200, Duration::ZERO, &stop)
            .err()
            .unwrap();
        assert_eq!(code, "busy", "{msg}");
        assert!(
            msg.contains("try again later") && !msg.contains("waited"),
            "{msg}"
        );
        let (code, msg) = space
            .reserve(dir, 100, Duration::ZERO, &stop)
            .map(|_| ())
            .err()
            .unwrap_or(("ok", String::new()));
        assert_eq!(
            code, "ok",
            "100 bytes fit beside the first pass's 200: {msg}"
        );
        assert_eq!(space.ceiling(dir), Some(300));
        // The first pass ends and its piles go: the whole filesystem is free again.
        drop(a);
        written.store(0, Ordering::SeqCst);
        let b = space.reserve(dir, 250, Duration::ZERO, &stop).unwrap();
        drop(b);
        let (code, msg) = space
            .reserve(dir, 301, Duration::ZERO, &stop)
            .err()
            .unwrap();
        assert_eq!(code, "too_large", "{msg}");
        assert!(msg.contains("asked 301, limit 300"), "{msg}");
    }
}
