//! A partly resident read's memory: what a LIRS read of the rest of the dataset needs (its
//! table, reads in flight, batches), the sequential reads that load the held part once, and
//! everything the budget leaves after them, holding the dataset's first bytes.

use super::RESIDENT_SCAN_SLOT;
use super::{resident_budget, resident_scan, Demand, Figures, Kind, Limits, LirsPlan};
use super::{MemoryFrom, ResourcePlan};
use crate::io::footprint;
use crate::size::human_bytes;
use crate::{Error, Result};

/// Huge-page granule the held part is rounded down to.
const HELD_GRANULE: u64 = 2 << 20;

/// Below this share of the dataset (1/16) holding a part is not worth a mode of its own:
/// the read is refused with the figures and the planner looks elsewhere.
const MIN_HELD_SHARE: u64 = 16;

/// The sequential reads that load a partly resident read's held part, within budget `m`:
/// as a resident read's, but at most an eighth of the budget (one read at least).
pub fn partial_scan(m: u64, file_bytes: u64) -> (usize, usize) {
    let (depth, slot) = resident_scan(file_bytes);
    let fit = (m / 8 / RESIDENT_SCAN_SLOT as u64).max(1) as usize;
    (depth.min(fit), slot)
}

/// A partly resident read's sizes: what reads the rest, and what is held.
#[derive(Clone, Copy, Debug)]
pub struct PartialPlan {
    /// The LIRS reads of what is not held.
    pub rest: LirsPlan,
    /// Bytes held: the files' first bytes, back to back in file order.
    pub held: u64,
    /// Sequential reads in flight while the held part loads.
    pub load_depth: usize,
    /// Bytes of each of them.
    pub load_slot: usize,
    /// When the rest goes through two-pass piles instead of LIRS reads: the read-ahead and
    /// pile plan it runs with (`partial_piled_plan`).
    pub(crate) piles: Option<(usize, super::PilePlan)>,
}

/// The sizes of a partly resident read of `d` over `file_bytes` of files and its resource
/// plan: the bytes held (the files' first bytes, back to back in file order) are a pure
/// function of the budget and the dataset. Refused,
/// with the figures, without a budget, or when the budget holds less than a sixteenth of
/// the dataset.
pub fn partial_plan(
    d: &Demand,
    file_bytes: u64,
    limits: &Limits,
) -> Result<(PartialPlan, ResourcePlan)> {
    let (m, from) = budget(d, limits)?;
    let (depth, slot) = partial_scan(m, file_bytes);
    let scan = footprint(depth * slot) as u64;
    // The rest is read as LIRS reads, within what the load's reads leave; its table,
    // buffers and batches come first, what remains is held.
    let sized = Demand {
        memory: Some(m.saturating_sub(scan)),
        memory_from: from,
        ..d.clone()
    };
    let sizes = LirsPlan::new(&sized, d.units).map_err(|e| match e {
        Error::OverBudget(why) => Error::OverBudget(format!(
            "{} less the load's reads ({}) leaves too little to read the rest ({why})",
            from.words(m),
            human_bytes(scan as f64)
        )),
        e => e,
    })?;
    let lirs = sizes.figures(&sized, limits);
    let rest: u64 = (lirs.0.iter())
        .filter(|f| f.kind == Kind::Memory)
        .map(|f| f.value)
        .fold(0, u64::saturating_add);
    let (held, mut f) = held_part(
        (m, from),
        file_bytes,
        (depth, slot),
        (rest, "the rest's reads"),
    )?;
    f.0.extend(lirs.0);
    let plan = ResourcePlan::new("resident", f.0);
    let checked = Demand {
        memory: Some(m),
        memory_from: from,
        ..d.clone()
    };
    plan.check(&checked, limits)?;
    let sizes = PartialPlan {
        rest: sizes,
        held,
        load_depth: depth,
        load_slot: slot,
        piles: None,
    };
    Ok((sizes, plan))
}

/// The budget a partly resident read holds within, and what set it; refused without one.
fn budget(d: &Demand, limits: &Limits) -> Result<(u64, MemoryFrom)> {
    resident_budget(d, limits).ok_or_else(|| {
        Error::OverBudget(
            "a partly resident read holds what a memory budget leaves: give --memory".into(),
        )
    })
}

/// What budget `m` (set by `from`) holds of `file_bytes` after the load's `(depth, slot)`
/// reads and `rest` bytes of memory for the rest (`what` reads it), rounded down to the
/// huge-page granule, and the figures of the held part and the load; refused, with the
/// figures, under a sixteenth of the files.
fn held_part(
    (m, from): (u64, MemoryFrom),
    file_bytes: u64,
    (depth, slot): (usize, usize),
    (rest, what): (u64, &str),
) -> Result<(u64, Figures)> {
    let scan = footprint(depth * slot) as u64;
    let room = m.saturating_sub(scan).saturating_sub(rest);
    let held = (room / HELD_GRANULE * HELD_GRANULE).min(file_bytes);
    if held < file_bytes / MIN_HELD_SHARE || held == 0 {
        return Err(Error::OverBudget(format!(
            "{} holds {} of the dataset's {} after {what} ({}) and the load's reads ({}): \
             less than a sixteenth, too little to hold in memory",
            from.words(m),
            human_bytes(held as f64),
            human_bytes(file_bytes as f64),
            human_bytes(rest as f64),
            human_bytes(scan as f64),
        )));
    }
    let mut f = Figures(Vec::new());
    f.push(
        "resident",
        Kind::Memory,
        footprint(held as usize) as u64,
        format!(
            "the dataset's first {} of {} ({:.0}%), held for every epoch: what the budget \
             leaves after {what} and the load's reads",
            human_bytes(held as f64),
            human_bytes(file_bytes as f64),
            100.0 * held as f64 / file_bytes.max(1) as f64
        ),
    );
    f.push(
        "load_buffers",
        Kind::Memory,
        scan,
        format!(
            "{depth} sequential read(s) of {} in flight while the held part loads",
            human_bytes(slot as f64)
        ),
    );
    Ok((held, f))
}

/// Share of the budget a piled rest's two-pass and the load's reads each take at most
/// (1/16): what is left is held.
const PILED_SHARE: u64 = 16;

/// [`partial_plan`] with the rest read through two-pass piles (scattered once from the
/// device, then rolled from epoch to epoch: sequential reads and writes of the part not
/// held, no random reads). The piles' two-pass takes a sixteenth of the budget (up to a
/// half: the least with which each pile loads once), the load's reads another sixteenth,
/// and the rest is held: a pure function of the budget. Its scratch is the piles of the
/// part not held (a unit held is a frame head in them). Refused, with the figures, as
/// `partial_plan` is, or when even half the budget is too small for two-pass.
pub fn partial_piled_plan(
    d: &Demand,
    file_bytes: u64,
    limits: &Limits,
) -> Result<(PartialPlan, ResourcePlan)> {
    let (m, from) = budget(d, limits)?;
    let (depth, slot) = resident_scan(file_bytes);
    let depth = depth.min((m / PILED_SHARE / slot as u64).max(1) as usize);
    let scan = footprint(depth * slot) as u64;
    let fitting: Vec<_> = [
        m / PILED_SHARE,
        m / (PILED_SHARE / 2),
        m / (PILED_SHARE / 4),
        m / (PILED_SHARE / 8),
    ]
    .into_iter()
    .filter_map(|rest| {
        // The piles are sized for the part not held at most (a unit held is a frame
        // head in them): held is at least what this share leaves, rounded down.
        let least = (m.saturating_sub(scan).saturating_sub(rest)) / HELD_GRANULE * HELD_GRANULE;
        let part = 1.0 - least.min(file_bytes) as f64 / file_bytes.max(1) as f64;
        let sized = Demand {
            memory: Some(rest),
            memory_from: from,
            bytes: (d.bytes as f64 * part).ceil() as u64,
            ..d.clone()
        };
        super::two_pass_plan(&sized, limits)
            .ok()
            .filter(|p| p.2.memory_bytes <= rest)
    })
    .collect();
    // The smallest share whose piles each load once (a pile past its memory is read again
    // for each key sub-range), else the largest that fits.
    let once = |p: &&(usize, super::PilePlan, ResourcePlan)| {
        p.1.pile_budget.saturating_mul(1 << p.1.bits) >= p.1.frames + p.1.frames / 8
    };
    let piled = fitting.iter().find(once).or(fitting.last()).cloned();
    let Some((prefetch, piles, two_pass)) = piled else {
        return Err(Error::OverBudget(format!(
            "half of {} is too little for the rest's two-pass piles",
            from.words(m)
        )));
    };
    let (held, mut f) = held_part(
        (m, from),
        file_bytes,
        (depth, slot),
        (two_pass.memory_bytes, "the rest's two-pass"),
    )?;
    // Its piles were sized for the part not held (a frame head per held unit besides).
    f.0.extend(two_pass.figures);
    let plan = ResourcePlan::new("resident", f.0);
    let checked = Demand {
        memory: Some(m),
        memory_from: from,
        ..d.clone()
    };
    plan.check(&checked, limits)?;
    let sizes = PartialPlan {
        // Unused (the rest goes through piles): LIRS's sizes within the whole budget.
        rest: LirsPlan::new(&checked, d.units)?,
        held,
        load_depth: depth,
        load_slot: slot,
        piles: Some((prefetch, piles)),
    };
    Ok((sizes, plan))
}

/// A partly resident read whose held part, `held` of the files' first bytes, is kept apart
/// from the read (a daemon holds it once for every pass of the dataset, and charges it on
/// its own): the rest's two-pass piles within `d`'s whole budget, sized for the part not
/// held (a unit held is a frame head in them). The held part and its loads are not in
/// the figures. Refused, with the figures, when two-pass of the rest does not fit.
pub fn partial_piled_rest(
    d: &Demand,
    file_bytes: u64,
    held: u64,
    limits: &Limits,
) -> Result<(PartialPlan, ResourcePlan)> {
    let held = held.min(file_bytes);
    let part = 1.0 - held as f64 / file_bytes.max(1) as f64;
    let sized = Demand {
        bytes: (d.bytes as f64 * part).ceil() as u64,
        ..d.clone()
    };
    let (prefetch, piles, two_pass) =
        super::two_pass_plan(&sized, limits).map_err(|e| match e {
            Error::OverBudget(why) => Error::OverBudget(format!(
                "the two-pass piles of the {} not held: {why}",
                human_bytes(file_bytes.saturating_sub(held) as f64)
            )),
            e => e,
        })?;
    let (depth, slot) = resident_scan(file_bytes);
    let sizes = PartialPlan {
        // Unused (the rest goes through piles).
        rest: LirsPlan::new(d, d.units)?,
        held,
        load_depth: depth,
        load_slot: slot,
        piles: Some((prefetch, piles)),
    };
    Ok((sizes, ResourcePlan::new("resident", two_pass.figures)))
}
