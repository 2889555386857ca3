//! Piles rolled past the end of a read: the last epoch's pile pass re-scatters its frames
//! into the next epoch's piles, as it does between the epochs of one read, and hands the
//! finished set on (a daemon keeps it for the next pass of the same job: riffle.torch
//! opens a stream per epoch). A read given such a set for its first epoch starts at its
//! pile pass: no scatter, no read of the dataset.
//!
//! What the set is for (dataset, seed, grouping, held part) is the hand-off's to check:
//! the read checks only the epoch and the units it was rolled for. Rolling past the end is
//! optional: when the next epoch's piles do not fit the scratch's free space, or a write
//! of them fails, the read goes on without them and says why.

use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::piles::PileSet;
use crate::scratch::ScratchDir;

/// A finished pile set for epoch [`RolledPiles::epoch`] of a read, in a scratch directory
/// of its own (removed with it, or on SIGINT/SIGTERM like any scratch).
pub struct RolledPiles {
    pub(super) set: PileSet,
    pub(super) epoch: u64,
    /// The units it holds (frames), and of them the first ones held in memory (skip frames).
    pub(super) units: (u64, u64),
    bytes: u64,
    pub(super) dir: ScratchDir,
}

impl RolledPiles {
    pub(super) fn new(set: PileSet, epoch: u64, units: (u64, u64), dir: ScratchDir) -> Self {
        RolledPiles {
            bytes: set.bytes(),
            set,
            epoch,
            units,
            dir,
        }
    }

    /// The epoch whose piles these are.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Bytes of frames in the piles.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Its directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl std::fmt::Debug for RolledPiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RolledPiles")
            .field("epoch", &self.epoch)
            .field("bytes", &self.bytes)
            .finish()
    }
}

/// What becomes of the next epoch's piles when a read ends: the set, or why there is none.
pub type KeepRolled = Box<dyn FnOnce(std::result::Result<RolledPiles, String>) + Send>;

/// A read's hand-off of rolled piles ([`super::super::ReadOptions::roll`]): piles for its
/// first epoch, taken instead of a scatter, and where the piles rolled past its last epoch
/// go. Each is taken once, by the read that runs.
#[derive(Default)]
pub struct Roll {
    start: Mutex<Option<RolledPiles>>,
    keep: Mutex<Option<Keeper>>,
}

impl std::fmt::Debug for Roll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Roll").finish_non_exhaustive()
    }
}

impl Roll {
    /// A hand-off: `start` for the read's first epoch, `keep` told what rolled past its
    /// last (told `Err` when the read never rolled, even if it never ran).
    pub fn new(start: Option<RolledPiles>, keep: Option<KeepRolled>) -> Arc<Roll> {
        Arc::new(Roll {
            start: Mutex::new(start),
            keep: Mutex::new(keep.map(|k| Keeper(Some(k)))),
        })
    }

    /// The piles for `epoch` over `units` (total, held), if it was given them.
    pub(super) fn take_start(&self, epoch: u64, units: (u64, u64)) -> Option<RolledPiles> {
        let mut s = self.start.lock().unwrap_or_else(|p| p.into_inner());
        s.take().filter(|p| p.epoch == epoch && p.units == units)
    }

    /// Where the next epoch's piles go, if anywhere.
    pub(super) fn take_keeper(&self) -> Option<Keeper> {
        self.keep.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// Told once what rolled past a read's last epoch; told why not when dropped untold.
pub(super) struct Keeper(Option<KeepRolled>);

impl Keeper {
    pub(super) fn give(mut self, outcome: std::result::Result<RolledPiles, String>) {
        if let Some(k) = self.0.take() {
            k(outcome);
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        if let Some(k) = self.0.take() {
            k(Err(
                "the read ended before its last epoch was emitted".into()
            ));
        }
    }
}

/// Whether the next epoch's piles fit the scratch at `location` beside this epoch's
/// `current` bytes, by the plan's peak `peak` (this epoch's piles go as they are read):
/// the directory they go in, or why not.
pub(super) fn room_for_next(
    location: &Path,
    current: u64,
    peak: u64,
) -> std::result::Result<ScratchDir, String> {
    let more = peak.saturating_sub(current);
    let free = crate::probe::free_bytes(location)
        .map_err(|e| format!("cannot read the scratch's free space: {e}"))?;
    if more > free {
        return Err(format!(
            "the next epoch's piles need {} more scratch, {} is free",
            crate::size::human_bytes(more as f64),
            crate::size::human_bytes(free as f64)
        ));
    }
    ScratchDir::new_in(location, "rolled").map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::room_for_next;

    /// The next epoch's piles are rolled only where the scratch's real free space holds
    /// them beside this epoch's (what is left of them), and then in a directory of their
    /// own; otherwise the read is told why, in numbers.
    #[test]
    fn the_next_epochs_piles_roll_only_where_the_free_space_holds_them() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let free = crate::probe::free_bytes(dir.path()).unwrap();
        let why = room_for_next(dir.path(), 1 << 20, free + (1 << 40)).unwrap_err();
        assert!(
            why.contains("more scratch") && why.contains("is free"),
            "{why}"
        );
        let d = room_for_next(dir.path(), 1 << 20, 2 << 20).unwrap();
        assert!(d.path().starts_with(dir.path()) && d.path().is_dir());
        let name = d.path().file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with(".riffle-scratch-rolled-"), "{name}");
    }
}
