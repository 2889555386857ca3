//! Datasets the daemon holds resident (issue 33 deliverable 3): one copy of a dataset's
//! files in memory per node, shared by every job, rank and worker reading it, each through
//! its own ring as any stream.
//!
//! - **When.** A stream whose mode is resident (`--mode resident`, or `auto` when the
//!   planner picks it) asks for its dataset's copy. The first pass that reads it loads it
//!   (sending its own batches as they complete); passes that come meanwhile wait for the
//!   load; every later pass, of any job, seed or rank, copies out of it with no I/O.
//! - **Identity.** A copy is the dataset's files as they were when it was made: each file's
//!   device, inode, size and mtime, looked at on every OPEN. A file changed since is never
//!   served from the old copy: a new copy is made, and the old one goes once no pass uses it.
//! - **Budget.** A copy is charged to `--memory` (its files huge-page rounded, and the reads
//!   that load them) from when it is made until it is dropped. All copies together take at
//!   most `--memory` less what one streaming pass and one ring may take (so a stream of
//!   another dataset always fits beside them). A dataset whose copy does not fit (or is a
//!   mixture) is read by the streaming mode the plan names (LIRS without a plan), and the
//!   log and the stats (`resident.fallbacks`, `resident.last_fallback`) say why.
//! - **In part.** Files that never fit whole (more than the copies may take) are held in
//!   part: their first bytes, as many as the copies may take less the reads that load them
//!   (at most a thirty-second of it), when that is a sixteenth of them at least and the rest's
//!   two-pass piles fit the scratch (else a streaming mode, as above). The part is loaded
//!   once and shared like a whole copy (`part` in the stats); each pass scatters only the
//!   rest from the device into piles in the daemon's scratch, admitted like a two-pass
//!   pass's (`--scratch-limit`, the filesystem's free space), and rolls them over the
//!   epochs its OPEN asks for. A pass per epoch (PyTorch opens a stream each epoch)
//!   scatters the rest again: piles outlive no pass.
//! - **Eviction.** A copy no pass uses is kept for the next job. It is dropped, least
//!   recently used first, when an admission (a ring, a pass, an index, another copy) does
//!   not fit the memory left; a copy a pass uses is never dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::budget::{Ask, Grant};
use super::catalog::{stamp, Stamp};
use super::state::Shared;
use crate::dataset::Dataset;
use crate::modes::{BatchStream, Held, HeldPrefix, ReadOptions};
use crate::size::human_bytes;

/// What a copy holds: the files whole, or (they never fit) their first bytes, the rest
/// read through two-pass piles by each pass.
pub(super) enum Kept {
    Whole(Arc<Held>),
    Part(Arc<HeldPrefix>),
}

/// A copy held for the daemon: the memory, and its charge to `--memory` (given back when
/// the last pass using it and the table have let it go).
pub(super) struct HeldCopy {
    pub(super) kept: Kept,
    grant: Grant,
}

impl HeldCopy {
    /// Bytes charged to `--memory`.
    pub(super) fn charge(&self) -> u64 {
        self.grant.bytes()
    }

    /// Bytes held apart from the passes when only part of the files is (a pass then reads
    /// the rest through piles): 0 for a whole copy.
    pub(super) fn part(&self) -> u64 {
        match &self.kept {
            Kept::Whole(_) => 0,
            Kept::Part(p) => p.bytes(),
        }
    }

    /// A pass of `ds` out of this copy with `opts` (the pass's own memory, as admitted):
    /// a whole copy's reads plan with the copy's bytes too; a part's pass puts the rest
    /// through piles in `scratch`.
    pub(super) fn start(
        &self,
        ds: Arc<Dataset>,
        mut opts: ReadOptions,
        scratch: std::path::PathBuf,
    ) -> crate::Result<BatchStream> {
        match &self.kept {
            Kept::Whole(h) => {
                opts.memory = opts.memory.map(|m| m.saturating_add(self.charge()));
                crate::modes::read_held(ds, opts, h.clone())
            }
            Kept::Part(p) => crate::modes::read_prefix_piled(ds, opts, scratch, p.clone()),
        }
    }

    /// `empty`, `loading` or `loaded`; its loads, and what they read (bytes, reads); the
    /// passes reading it now.
    fn figures(&self) -> (&'static str, u64, u64, u64, u64) {
        let (state, c) = match &self.kept {
            Kept::Whole(h) => (h.state(), h.counts()),
            Kept::Part(p) => (p.state(), p.counts()),
        };
        (
            state,
            c.loads(),
            c.device_bytes(),
            c.read_ops(),
            c.readers(),
        )
    }
}

struct Entry {
    name: String,
    stamps: Vec<Stamp>,
    copy: Arc<HeldCopy>,
    used: Instant,
}

impl Entry {
    fn in_use(&self) -> bool {
        Arc::strong_count(&self.copy) > 1
    }
}

/// The daemon's held copies, and what it counts of them.
#[derive(Default)]
pub(super) struct Residents {
    copies: Mutex<Vec<Entry>>,
    /// Held while a copy is made, so streams of one dataset make it once.
    making: Mutex<()>,
    evicted: AtomicU64,
    replaced: AtomicU64,
    fallbacks: AtomicU64,
    last_fallback: Mutex<Option<String>>,
}

/// The most all copies together may take of the daemon's memory, and why: `--memory`, less
/// what the indexes hold, one pass at its largest and one client's ring share.
pub(super) fn resident_cap(shared: &Shared) -> (u64, String) {
    let b = &shared.budget;
    let (pass, _) = super::budget::pass_most(b.total());
    let ring = shared.ring_share();
    let cap = b.ceiling().saturating_sub(pass).saturating_sub(ring);
    let why = format!(
        "held copies take at most --memory {} less the indexes, one read's {} and one \
         ring's {}",
        human_bytes(b.total() as f64),
        human_bytes(pass as f64),
        human_bytes(ring as f64)
    );
    (cap, why)
}

impl Residents {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        self.copies.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The copy of dataset `name` (`ds`) for its files as they are now: the one held, else
    /// a new one charged to `--memory` (loaded by the first pass that reads it). Files that
    /// never fit whole are held in part (their first bytes, as many as the copies may
    /// take) when `rest` says the rest's piles fit the scratch ([`Residents::part`]). `Err`
    /// says why it cannot be held: the stream is then read by a streaming mode.
    pub(super) fn acquire(
        &self,
        name: &str,
        ds: &Dataset,
        shared: &Shared,
        rest: &dyn Fn(u64) -> Result<(), String>,
    ) -> Result<Arc<HeldCopy>, String> {
        let mut stamps = Vec::with_capacity(ds.files().len());
        for f in ds.files() {
            stamps.push(
                stamp(&f.path).map_err(|e| format!("cannot look at {}: {e}", f.path.display()))?,
            );
        }
        let _one = self.making.lock().unwrap_or_else(|p| p.into_inner());
        {
            let mut copies = self.lock();
            // A copy of files that changed since is never served again: it goes from the
            // table now, and from memory once no pass uses it.
            let before = copies.len();
            copies.retain(|e| e.name != name || e.stamps == stamps);
            let gone = (before - copies.len()) as u64;
            self.replaced.fetch_add(gone, Ordering::Relaxed);
            if gone > 0 {
                eprintln!(
                    "riffle serve: dataset '{name}' changed since it was held resident: a \
                     new copy is made, the old one goes when no pass uses it"
                );
            }
            if let Some(e) = copies.iter_mut().find(|e| e.name == name) {
                e.used = Instant::now();
                return Ok(e.copy.clone());
            }
        }
        let held = Held::new(ds).map_err(|e| e.to_string())?;
        let (depth, slot) = crate::resources::resident_scan(ds.bytes());
        let need = held.bytes() + crate::io::footprint(depth * slot) as u64;
        let (cap, why) = resident_cap(shared);
        if need > cap {
            let whole = format!(
                "holding it takes {} ({} of files and the reads that load them), more than \
                 the {} {why}",
                human_bytes(need as f64),
                human_bytes(ds.bytes() as f64),
                human_bytes(cap as f64)
            );
            return (self.part(name, ds, stamps, shared, rest))
                .map_err(|part| format!("{whole}; in part: {part}"));
        }
        let held = Kept::Whole(Arc::new(held));
        self.hold(name, stamps, shared, held, need)
    }

    /// A copy of `ds`'s first bytes, as many as the copies may take (less the reads that
    /// load them, rounded down to 2 MiB), for files that never fit whole: each pass reads
    /// the rest through two-pass piles. `Err` (the stream goes by a streaming mode) when
    /// that holds less than a sixteenth of the files, or `rest` says the rest's piles do not
    /// fit the scratch.
    fn part(
        &self,
        name: &str,
        ds: &Dataset,
        stamps: Vec<Stamp>,
        shared: &Shared,
        rest: &dyn Fn(u64) -> Result<(), String>,
    ) -> Result<Arc<HeldCopy>, String> {
        const GRANULE: u64 = 2 << 20;
        let (cap, _) = resident_cap(shared);
        // Its loads take at most a thirty-second of what the copies may take (16 MiB of
        // reads in flight keep a sequential load at the device's bandwidth; the charge is
        // the copy's while it is held).
        let (depth, slot) = crate::resources::resident_scan(ds.bytes());
        let depth = depth.min((cap / 32 / slot as u64).max(1) as usize);
        let load = crate::io::footprint(depth * slot) as u64;
        let bytes = (cap.saturating_sub(load) / GRANULE * GRANULE).min(ds.bytes());
        if bytes >= ds.bytes() {
            // Not a part: the files fit, not the whole copy's reads that load them.
            return Err(
                "the files would be held whole, without room for the reads that load \
                 them"
                    .into(),
            );
        }
        if bytes == 0 || bytes < ds.bytes() / 16 {
            return Err(format!(
                "{} of the files is less than a sixteenth",
                human_bytes(bytes as f64)
            ));
        }
        rest(bytes)?;
        let held = Kept::Part(Arc::new(HeldPrefix::new(ds, bytes, (depth, slot))));
        self.hold(name, stamps, shared, held, bytes + load)
    }

    /// Charges `need` bytes to `--memory` for `held`, a new copy of dataset `name`'s files
    /// as `stamps` say, and keeps it.
    fn hold(
        &self,
        name: &str,
        stamps: Vec<Stamp>,
        shared: &Shared,
        held: Kept,
        need: u64,
    ) -> Result<Arc<HeldCopy>, String> {
        let (cap, why) = resident_cap(shared);
        self.within_cap(need, cap)?;
        let grant = shared
            .budget
            .take(
                Ask {
                    what: &format!("a resident copy of dataset '{name}'"),
                    most: (cap, &why),
                    fit: |free| if need <= free { Ok(need) } else { Err(need) },
                },
                // Not worth waiting for: a streaming read goes at once.
                Duration::ZERO,
                &shared.stopping,
            )
            .map_err(|(_, m)| m)?;
        let part = match &held {
            Kept::Whole(_) => String::new(),
            Kept::Part(p) => format!(
                " (its first {}: each pass reads the rest through two-pass piles)",
                human_bytes(p.bytes() as f64)
            ),
        };
        let copy = Arc::new(HeldCopy { kept: held, grant });
        self.insert(name, stamps, copy.clone());
        eprintln!(
            "riffle serve: dataset '{name}' is held resident{part}: {} of --memory, loaded \
             by its first pass and shared by every stream of it",
            human_bytes(need as f64)
        );
        Ok(copy)
    }

    /// Keeps `copy`, of dataset `name`'s files as `stamps` say, for the next streams.
    fn insert(&self, name: &str, stamps: Vec<Stamp>, copy: Arc<HeldCopy>) {
        self.lock().push(Entry {
            name: name.to_string(),
            stamps,
            copy,
            used: Instant::now(),
        });
    }

    /// Drops copies no pass uses, least recently used first, until the copies held leave
    /// `need` bytes within `cap`; an error naming what is in use when they cannot.
    fn within_cap(&self, need: u64, cap: u64) -> Result<(), String> {
        let mut copies = self.lock();
        loop {
            let held: u64 = copies.iter().map(|e| e.copy.charge()).sum();
            if held + need <= cap {
                return Ok(());
            }
            let Some(i) = Self::idlest(&copies) else {
                return Err(format!(
                    "the copies held now take {}, and passes use them: {} more does not fit \
                     the {} held copies may take",
                    human_bytes(held as f64),
                    human_bytes(need as f64),
                    human_bytes(cap as f64)
                ));
            };
            self.evict(&mut copies, i);
        }
    }

    /// The least recently used copy no pass uses.
    fn idlest(copies: &[Entry]) -> Option<usize> {
        (copies.iter().enumerate())
            .filter(|(_, e)| !e.in_use())
            .min_by_key(|(_, e)| e.used)
            .map(|(i, _)| i)
    }

    fn evict(&self, copies: &mut Vec<Entry>, i: usize) {
        let e = copies.remove(i);
        self.evicted.fetch_add(1, Ordering::Relaxed);
        eprintln!(
            "riffle serve: dataset '{}' is no longer held resident: {} given back for \
             another admission (no pass used it)",
            e.name,
            human_bytes(e.copy.charge() as f64)
        );
    }

    /// Drops copies no pass uses, least recently used first, until `need` bytes are given
    /// back or none is left; whether any went. Run by `--memory`'s admission when a
    /// request does not fit.
    pub(super) fn evict_idle(&self, need: u64) -> bool {
        let mut copies = self.lock();
        let mut freed = 0;
        while freed < need {
            let Some(i) = Self::idlest(&copies) else {
                break;
            };
            freed += copies[i].copy.charge();
            self.evict(&mut copies, i);
        }
        freed > 0
    }

    /// A stream of dataset `name` read by `mode` instead, for `why`: counted, and logged
    /// when the reason is new.
    pub(super) fn fell_back(&self, name: &str, mode: &str, why: &str) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        let said = format!("dataset '{name}' is not held resident (read by {mode}): {why}");
        let mut last = self.last_fallback.lock().unwrap_or_else(|p| p.into_inner());
        if last.as_deref() != Some(&said) {
            eprintln!("riffle serve: {said}");
        }
        *last = Some(said);
    }

    /// The copies held and what was counted, for the stats.
    pub(super) fn json(&self, shared: &Shared) -> serde_json::Value {
        let copies = self.lock();
        let held: Vec<_> = copies
            .iter()
            .map(|e| {
                let (state, loads, device_bytes, read_ops, readers) = e.copy.figures();
                json!({
                    "dataset": e.name,
                    "bytes": e.copy.charge(),
                    "part": (e.copy.part() > 0).then_some(e.copy.part()),
                    "state": state,
                    "users": Arc::strong_count(&e.copy) - 1,
                    "readers": readers,
                    "loads": loads,
                    "device_bytes": device_bytes,
                    "read_ops": read_ops,
                    "since_used_s": e.used.elapsed().as_secs_f64(),
                })
            })
            .collect();
        let bytes: u64 = copies.iter().map(|e| e.copy.charge()).sum();
        let last = self.last_fallback.lock().unwrap_or_else(|p| p.into_inner());
        json!({
            "held": held,
            "bytes": bytes,
            "cap": resident_cap(shared).0,
            "evicted": self.evicted.load(Ordering::Relaxed),
            "replaced": self.replaced.load(Ordering::Relaxed),
            "fallbacks": self.fallbacks.load(Ordering::Relaxed),
            "last_fallback": *last,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::super::budget::{Budget, Unit};
    use super::*;
    use crate::dataset::OpenOptions;

    /// The eviction rule, through `--memory`'s admission: a request short of memory drops
    /// the copies no pass uses, least recently used first, and never one a pass uses (it
    /// waits, then is refused, instead).
    #[test]
    fn an_admission_short_of_memory_drops_idle_copies_oldest_first_never_one_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.bin");
        std::fs::write(&path, vec![7u8; 4096]).unwrap();
        let opts = OpenOptions {
            format: Some(crate::format::Format::Fixed {
                size: 64,
                header: 0,
            }),
            ..OpenOptions::default()
        };
        let ds = Dataset::open(&[path], &opts, &mut |_, _, _| {}).unwrap();
        const MB: u64 = 1 << 20;
        let budget = Budget::new(100 * MB, 0, "--memory", Unit::Bytes);
        let residents = Arc::new(Residents::default());
        let weak = Arc::downgrade(&residents);
        budget.on_short(Box::new(move |need| {
            weak.upgrade().is_some_and(|r| r.evict_idle(need))
        }));
        let stopping = AtomicBool::new(false);
        let take = |n: u64| {
            let ask = Ask {
                what: "a test's request",
                most: (u64::MAX, ""),
                fit: move |free| if n <= free { Ok(n) } else { Err(n) },
            };
            budget.take(ask, Duration::ZERO, &stopping)
        };
        let names = || -> Vec<String> { residents.lock().iter().map(|e| e.name.clone()).collect() };
        for name in ["old", "busy", "new"] {
            let copy = Arc::new(HeldCopy {
                kept: Kept::Whole(Arc::new(Held::new(&ds).unwrap())),
                grant: take(30 * MB).unwrap(),
            });
            residents.insert(name, Vec::new(), copy);
            std::thread::sleep(Duration::from_millis(2));
        }
        let busy = residents.lock()[1].copy.clone();
        // 10 MiB free: 20 more drops the least recently used idle copy.
        let _a = take(20 * MB).unwrap();
        assert_eq!(names(), ["busy", "new"]);
        let _b = take(40 * MB).unwrap();
        assert_eq!(names(), ["busy", "new"][..1]);
        // Only the copy in use is left: a request that needs its room is refused.
        let e = take(20 * MB).err().expect("refused");
        assert_eq!(e.0, "busy", "{}", e.1);
        assert_eq!(names(), ["busy"]);
        assert_eq!(residents.evicted.load(Ordering::Relaxed), 2);
        // Once no pass uses it, it goes too.
        drop(busy);
        let _c = take(20 * MB).unwrap();
        assert!(names().is_empty());
        assert_eq!(budget.used(), 80 * MB);
    }
}
