//! Whether a two-pass read's piles fit where they go: the scratch filesystem's free
//! space, and beside a staged copy the room its `--cache-limit` leaves.

use std::path::Path;

use super::ReadOptions;
use crate::dataset::Dataset;
use crate::order::Units;
use crate::resources::Limits;
use crate::{Error, Result};

/// Refuses a two-pass read of `ds` with `opts` before any I/O when its piles would not fit
/// the free space (bytes or inodes) of the filesystem holding `scratch`, less `others`
/// (what live runs there reserved and have not written: `scratch::reserved_by_others`),
/// naming it. Returns the scratch the run will write at its peak: (bytes, files), for its
/// reservation (`scratch::reserve`).
pub fn check_scratch(
    ds: &Dataset,
    opts: &ReadOptions,
    scratch: &Path,
    others: (u64, u64),
) -> Result<(u64, u64)> {
    if ds.is_empty() {
        return Ok((0, 0));
    }
    let units = Units::new(&ds.layout(), opts.grouping);
    let d = super::super::demand(ds, &units, opts);
    let here = Limits::here(Some(scratch));
    if let Some(remote) = ds.remote() {
        return streamed_fits(&d, &here, remote.cache_limit(), scratch, others);
    }
    // A staged copy's --cache-limit bounds its piles too.
    let room = ds.staged_room();
    let free = match (here.scratch_free, room) {
        (Some(f), Some(r)) => Some(f.saturating_sub(others.0).min(r)),
        (f, r) => f.map(|f| f.saturating_sub(others.0)).or(r),
    };
    let limits = Limits {
        scratch_free: free,
        scratch_inodes: here.scratch_inodes.map(|i| i.saturating_sub(others.1)),
        ..here
    };
    let reserved = if others.0 > 0 {
        format!(
            ", after {} other runs there have reserved",
            crate::size::human_bytes(others.0 as f64)
        )
    } else {
        String::new()
    };
    match crate::resources::two_pass(&d, &limits) {
        Ok(plan) => Ok((
            plan.scratch_bytes,
            plan.figure("scratch_files").map_or(0, |f| f.value),
        )),
        Err(Error::Exhausted {
            resource,
            asked,
            limit,
        }) if resource == crate::resources::SCRATCH_SPACE && room == Some(limit) => {
            Err(beside_the_copy(asked, limit))
        }
        Err(Error::Exhausted {
            resource,
            asked,
            limit,
        }) if resource == crate::resources::SCRATCH_SPACE => Err(Error::OverBudget(format!(
            "{}: two-pass needs {} of scratch space for its piles and {} is free{reserved} (No \
             space left on the scratch disk); give --scratch a larger disk, or --mode lirs",
            scratch.display(),
            crate::size::human_bytes(asked as f64),
            crate::size::human_bytes(limit as f64),
        ))),
        // Too few inodes is said as the plan says it (a count, not bytes).
        Err(e @ Error::Exhausted { resource, .. })
            if resource == crate::resources::SCRATCH_INODES =>
        {
            Err(e)
        }
        // Anything else (memory, open files) is the run's to report as it starts.
        Err(_) => Ok((0, 0)),
    }
}

/// Refuses a two-pass read of a staged copy of objects ([`Dataset::staged_room`]) whose
/// piles would not fit beside it within its `--cache-limit`, as [`check_scratch`] does; any
/// other dataset passes. For a daemon, whose admission reserves the scratch filesystem's
/// space itself.
pub fn check_staged_room(ds: &Dataset, opts: &ReadOptions) -> Result<()> {
    let Some(room) = ds.staged_room().filter(|_| !ds.is_empty()) else {
        return Ok(());
    };
    let units = Units::new(&ds.layout(), opts.grouping);
    let d = super::super::demand(ds, &units, opts);
    let limits = Limits {
        scratch_free: Some(room),
        ..Limits::here(None)
    };
    match crate::resources::two_pass(&d, &limits) {
        Err(Error::Exhausted {
            resource,
            asked,
            limit,
        }) if resource == crate::resources::SCRATCH_SPACE => Err(beside_the_copy(asked, limit)),
        _ => Ok(()),
    }
}

/// Piles of `asked` bytes that the `room` a staged copy's `--cache-limit` leaves does not
/// hold.
fn beside_the_copy(asked: u64, room: u64) -> Error {
    Error::OverBudget(format!(
        "two-pass needs {} of local disk for its piles beside the staged copy, and \
         --cache-limit leaves {}; give a larger --cache-limit, or --mode lirs (which reads \
         the copy in place)",
        crate::size::human_bytes(asked as f64),
        crate::size::human_bytes(room as f64),
    ))
}

/// A streamed read's local bytes are charged to its `--cache-limit` (its piles go in
/// rounds or hold the overflow in memory to stay within it), so its scratch filesystem
/// needs the limit, or the whole piles if they take less: not the whole piles. Refused,
/// naming both, when less is free.
fn streamed_fits(
    d: &crate::resources::Demand,
    here: &Limits,
    limit: u64,
    scratch: &Path,
    others: (u64, u64),
) -> Result<(u64, u64)> {
    let unbounded = Limits {
        scratch_free: None,
        scratch_inodes: None,
        ..*here
    };
    let (piles, files) = match crate::resources::two_pass(d, &unbounded) {
        Ok(plan) => (
            plan.scratch_bytes,
            plan.figure("scratch_files").map_or(0, |f| f.value),
        ),
        Err(_) => (limit, 0),
    };
    let need = piles.min(limit);
    let free = here.scratch_free.map(|f| f.saturating_sub(others.0));
    match free {
        Some(free) if free < need => Err(Error::OverBudget(format!(
            "{}: a streamed read may write up to {} there (its --cache-limit) and {} is free; \
             give a --cache-limit below what is free, or point RIFFLE_S3_CACHE at a larger \
             filesystem",
            scratch.display(),
            crate::size::human_bytes(need as f64),
            crate::size::human_bytes(free as f64),
        ))),
        _ => Ok((need, files)),
    }
}
