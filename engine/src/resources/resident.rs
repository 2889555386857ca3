//! A resident read's memory: the dataset's files held whole in memory the run owns, the
//! epoch table, the sequential reads that load them once, and the batches being copied out.

use super::{Demand, Figures, Kind, Limits, LirsPlan, MemoryFrom, ResourcePlan};
use crate::io::footprint;
use crate::size::human_bytes;
use crate::{Error, Result};

/// The most sequential reads in flight while a resident read loads the files.
pub const RESIDENT_SCAN_DEPTH: usize = 32;
/// Bytes of each of those reads (on this machine's virtio disk, under other builds'
/// load: 32 reads of 2 MiB loaded 1.6 GB in 0.96-1.16 s, 8 of 4 MiB in 0.97-3.8 s).
pub const RESIDENT_SCAN_SLOT: usize = 2 << 20;

/// The sequential reads a resident read of `file_bytes` keeps in flight and their size:
/// [`RESIDENT_SCAN_DEPTH`] reads of [`RESIDENT_SCAN_SLOT`], fewer for a dataset smaller than
/// that.
pub fn resident_scan(file_bytes: u64) -> (usize, usize) {
    let slots = file_bytes.div_ceil(RESIDENT_SCAN_SLOT as u64).max(1);
    (
        slots.min(RESIDENT_SCAN_DEPTH as u64) as usize,
        RESIDENT_SCAN_SLOT,
    )
}

/// The bytes holding `file_bytes` of data whole take (huge-page rounded), or `None` when
/// they do not fit in this address space.
pub fn resident_bytes(file_bytes: u64) -> Option<u64> {
    let n = usize::try_from(file_bytes).ok()?;
    n.checked_next_multiple_of(2 << 20)?;
    Some(footprint(n) as u64)
}

/// The budget a resident read of `d` plans within, and what sets it: `--memory`, else the
/// machine's resident default ([`super::memory::resident_budget`]), else none.
pub fn resident_budget(d: &Demand, limits: &Limits) -> Option<(u64, MemoryFrom)> {
    match (d.memory, limits.memory) {
        (Some(m), _) => Some((m, d.memory_from)),
        (None, Some(m)) => Some((m.resident, m.resident_from)),
        (None, None) => None,
    }
}

/// A resident read's sizes (the table and batches of its epochs, as LIRS's) and its
/// resource plan, where the dataset's `file_bytes` of files are held whole; refused, with
/// the figures, when they and the rest do not fit the budget.
pub fn resident_plan(
    d: &Demand,
    file_bytes: u64,
    limits: &Limits,
) -> Result<(LirsPlan, ResourcePlan)> {
    let held = resident_bytes(file_bytes).ok_or_else(|| {
        Error::OverBudget(format!(
            "resident mode cannot hold {file_bytes} bytes of files in this address space"
        ))
    })?;
    let (depth, slot) = resident_scan(file_bytes);
    let scan = footprint(depth * slot) as u64;
    let budget = resident_budget(d, limits);
    // The table and batches plan within what holding the files leaves.
    let left = match budget {
        Some((m, from)) => {
            let need = held.saturating_add(scan);
            if need >= m {
                return Err(Error::OverBudget(format!(
                    "resident mode needs {} to hold the dataset's files ({}) and {} for \
                     the reads that load them, more than {}",
                    human_bytes(need as f64),
                    human_bytes(file_bytes as f64),
                    human_bytes(scan as f64),
                    from.words(m),
                )));
            }
            Some(m - need)
        }
        None => None,
    };
    let sized = Demand {
        depth: 1,
        memory: left,
        memory_from: budget.map_or(d.memory_from, |b| b.1),
        ..d.clone()
    };
    let sizes = LirsPlan::new(&sized, d.units)?;
    let lirs = sizes.figures(&sized, limits);
    let mut f = Figures(Vec::new());
    f.push(
        "resident",
        Kind::Memory,
        held,
        format!(
            "the dataset's files whole ({}), huge-page rounded, read once and kept for \
             every epoch",
            human_bytes(file_bytes as f64)
        ),
    );
    f.push(
        "io_buffers",
        Kind::Memory,
        scan,
        format!(
            "{depth} sequential read(s) of {} in flight while the files load",
            human_bytes(slot as f64)
        ),
    );
    let keep = ["table", "unit_table", "offset_index", "batches", "prefetch"];
    f.0.extend(lirs.0.into_iter().filter(|x| keep.contains(&x.name)));
    f.push(
        "open_files",
        Kind::Count,
        1 + super::OWN_FILES,
        format!(
            "one of the dataset's files at a time while they load, and {} for stdio, rings \
             and the like",
            super::OWN_FILES
        ),
    );
    let plan = ResourcePlan::new("resident", f.0);
    let checked = Demand {
        memory: budget.map(|b| b.0),
        memory_from: budget.map_or(d.memory_from, |b| b.1),
        ..d.clone()
    };
    plan.check(&checked, limits)?;
    Ok((sizes, plan))
}
