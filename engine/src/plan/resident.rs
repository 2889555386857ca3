//! The resident candidate: the files read once at the device's sequential bandwidth, then
//! every epoch a permutation in memory; and whether it beats the streaming modes.

use super::{
    grouping_name, Candidate, Choice, DeviceModel, Workload, CPU_PER_BATCH, TABLE_PER_UNIT,
};
use crate::resources::{Demand, Limits, ResourcePlan};
use crate::size::human_bytes;

/// Copying a record out of resident memory into its batch, at random addresses: seconds
/// per byte (measured on the development machine, 400,000 records of 4 KiB on huge pages,
/// batches of 256: a later epoch in 0.22-0.3 s with the per-record and per-batch costs).
const RESIDENT_COPY_PER_BYTE: f64 = 0.12e-9;
/// Per record: locating it, a cache miss on its first line, its id and offset.
const RESIDENT_CPU_PER_RECORD: f64 = 0.1e-6;
/// Loading opens each file and sets up its own sequential reader (an io_uring and its
/// buffers): seconds per file (measured on the development machine: a tree of 300 files
/// of 100 B loaded in 0.3 s).
const RESIDENT_PER_FILE: f64 = 1e-3;
/// Loading: each byte is copied once from the read's slot into the resident buffer, and
/// its page faulted in, beside the reads in flight: seconds per byte that do not overlap.
const RESIDENT_LOAD_PER_BYTE: f64 = 0.05e-9;

/// An epoch's work in memory: the table, each record located and copied, each batch.
fn in_memory(w: &Workload, units: f64) -> f64 {
    let batches = (w.records as f64 / w.batch.max(1) as f64).ceil();
    units * TABLE_PER_UNIT
        + w.bytes as f64 * RESIDENT_COPY_PER_BYTE
        + w.records as f64 * RESIDENT_CPU_PER_RECORD
        + batches * CPU_PER_BATCH
}

/// Loading `bytes` of the files with sequential reads, copied and faulted in as they come.
fn loading(dev: &DeviceModel, demand: &Demand, bytes: u64) -> f64 {
    bytes as f64 / dev.seq_read_bps.max(1.0)
        + bytes as f64 * RESIDENT_LOAD_PER_BYTE
        + demand.files as f64 * RESIDENT_PER_FILE
}

/// The resident candidate with grouping `g` over `units` shuffling units, and its resource
/// plan if it fits: `file_bytes` of files held whole within the budget.
pub(super) fn candidate(
    dev: &DeviceModel,
    w: &Workload,
    g: crate::order::Grouping,
    units: f64,
    demand: &Demand,
    file_bytes: u64,
    limits: &Limits,
) -> (Candidate, Option<ResourcePlan>) {
    let e = w.epochs as f64;
    let later = in_memory(w, units);
    let load = loading(dev, demand, file_bytes);
    // A batch is complete once every record of it is loaded: with records spread over the
    // files, most are complete only near the end of the load, so the copies add to it.
    let first = load + later;
    let (memory, plan, unfit) = match crate::resources::resident_plan(demand, file_bytes, limits) {
        Ok((_, r)) => (r.memory_bytes, Some(r), None),
        // What `--mode resident` runs: the rest through piles when they fit the scratch,
        // else read as LIRS reads.
        Err(whole) => match (limits.scratch_free)
            .and_then(|_| crate::resources::partial_piled_plan(demand, file_bytes, limits).ok())
        {
            Some((p, r)) => {
                return partly_piled(dev, w, (g, units), demand, (file_bytes, p.held), r)
            }
            None => match crate::resources::partial_plan(demand, file_bytes, limits) {
                Ok((p, r)) => return partly(dev, w, (g, units), demand, (file_bytes, p.held), r),
                Err(part) => (0, None, Some(format!("{whole}; partly: {part}"))),
            },
        },
    };
    let c = Candidate {
        mode: Choice::Resident.name().into(),
        grouping: grouping_name(g),
        contract: true,
        first_epoch_s: first,
        first_batch_s: load,
        later_epoch_s: later,
        total_s: first + later * (e - 1.0),
        reads_per_epoch: file_bytes as f64 / (4 << 20) as f64 / e,
        read_bytes: (4 << 20) as f64,
        bound: if load > later { "bandwidth" } else { "cpu" }.into(),
        memory_bytes: memory,
        scratch_bytes: 0,
        unfit,
    };
    (c, plan)
}

/// How a partly resident candidate's `bound` starts. `auto` runs one whose rest is read
/// as LIRS reads only when no streaming mode fits (random reads of the rest: on a disk the
/// planner prices it under two-pass); one whose rest goes through piles ([`PILED`]) when
/// it is predicted faster than the streaming choice. `--mode resident` runs either
/// whenever the whole dataset does not fit.
pub(super) const PARTLY: &str = "partly resident, ";

/// How a partly resident candidate whose rest goes through two-pass piles starts its
/// `bound`.
pub(super) const PILED: &str = "partly resident, rest by two-pass, ";

/// The partly resident candidate: `held` of the files' `file_bytes` loaded once, then every
/// epoch copies the held records out of memory and reads the rest as LIRS reads records.
fn partly(
    dev: &DeviceModel,
    w: &Workload,
    (g, units): (crate::order::Grouping, f64),
    demand: &Demand,
    (file_bytes, held): (u64, u64),
    plan: ResourcePlan,
) -> (Candidate, Option<ResourcePlan>) {
    let e = w.epochs as f64;
    let share = held as f64 / file_bytes.max(1) as f64;
    let record = w.bytes as f64 / w.records.max(1) as f64;
    let rest = w.records as f64 * (1.0 - share);
    let (reads, bound) = super::random_read_time(dev, w, rest, record + w.align as f64);
    let cpu = in_memory(w, units);
    let later = reads.max(cpu);
    let load = loading(dev, demand, held);
    let first = load + later;
    let bound = format!("{PARTLY}{}", if reads >= cpu { bound } else { "cpu" });
    let times = (first, load, later, first + later * (e - 1.0));
    partly_candidate(g, times, (rest, record), bound, plan)
}

/// A partly resident candidate with grouping `g`: its (first epoch, first batch, later
/// epoch, total) seconds, (reads per epoch, bytes per read), bound and resource plan.
fn partly_candidate(
    g: crate::order::Grouping,
    (first, load, later, total): (f64, f64, f64, f64),
    (reads, read_bytes): (f64, f64),
    bound: String,
    plan: ResourcePlan,
) -> (Candidate, Option<ResourcePlan>) {
    let c = Candidate {
        mode: Choice::Resident.name().into(),
        grouping: grouping_name(g),
        contract: true,
        first_epoch_s: first,
        first_batch_s: load,
        later_epoch_s: later,
        total_s: total,
        reads_per_epoch: reads,
        read_bytes,
        bound,
        memory_bytes: plan.memory_bytes,
        scratch_bytes: plan.scratch_bytes,
        unfit: None,
    };
    (c, Some(plan))
}

/// The partly resident candidate whose rest goes through two-pass piles: `held` of the
/// files' `file_bytes` loaded once, the rest scattered once and then rolled from epoch to
/// epoch as two-pass rolls the whole, the held records copied out of memory in their
/// places.
fn partly_piled(
    dev: &DeviceModel,
    w: &Workload,
    (g, units): (crate::order::Grouping, f64),
    demand: &Demand,
    (file_bytes, held): (u64, u64),
    plan: ResourcePlan,
) -> (Candidate, Option<ResourcePlan>) {
    let e = w.epochs as f64;
    let share = held as f64 / file_bytes.max(1) as f64;
    let part = |s: f64| Workload {
        records: (w.records as f64 * s) as u64,
        bytes: (w.bytes as f64 * s) as u64,
        ..w.clone()
    };
    let rest = part(1.0 - share);
    let (first, rolling, last, bound) = super::two_pass_epochs(dev, &rest, units * (1.0 - share));
    // (With one epoch, two_pass_epochs's first is the scatter and the last pass.)
    // The held records, copied out of memory by the pile pass (their table is the rest's).
    let copies = in_memory(&part(share), 0.0);
    let load = loading(dev, demand, held);
    let first = load + first + copies;
    let later = rolling + copies;
    // The first epoch rolls unless it is the only one; the last one does not roll.
    let total = if w.epochs > 1 {
        first + later * (e - 2.0) + last + copies
    } else {
        first
    };
    let reads = (rest.bytes as f64 / (4 << 20) as f64, (4 << 20) as f64);
    let bound = format!("{PILED}{bound}");
    partly_candidate(g, (first, load, later, total), reads, bound, plan)
}

/// Whether the resident candidate `res` beats the streaming choice `best` (the faster of
/// lirs and two-pass that fits, if any): the choice and why, in either case.
pub(super) fn weigh(
    res: &Candidate,
    best: Option<(&Candidate, Choice, String)>,
    epochs: u64,
) -> Option<(Choice, String)> {
    let said = |c: &Candidate| {
        format!(
            "resident is predicted at {:.2} s for {epochs} epoch(s) ({:.2} s for the first, \
             which loads what it holds once, then {:.3} s for each later one), holding {}",
            c.total_s,
            c.first_epoch_s,
            c.later_epoch_s,
            human_bytes(c.memory_bytes as f64)
        )
    };
    if res.bound.starts_with(PARTLY) && !res.bound.starts_with(PILED) && res.unfit.is_none() {
        if let Some((b, choice, why)) = best {
            return Some((
                choice,
                format!(
                    "{why}; {} (partly resident: --mode resident runs it) against {:.2} s for {}",
                    said(res),
                    b.total_s,
                    b.mode
                ),
            ));
        }
    }
    match (best, &res.unfit) {
        (None, None) => Some((
            Choice::Resident,
            format!("neither lirs nor two-pass fits; {}", said(res)),
        )),
        (None, Some(_)) => None,
        (Some((b, _, why)), None) if res.total_s < b.total_s => Some((
            Choice::Resident,
            format!(
                "{} against {:.2} s for {} ({:.1}x); without it: {why}",
                said(res),
                b.total_s,
                b.mode,
                b.total_s / res.total_s.max(1e-9)
            ),
        )),
        (Some((b, choice, why)), None) => Some((
            choice,
            format!(
                "{why}; {} against {:.2} s for {}, which is not slower",
                said(res),
                b.total_s,
                b.mode
            ),
        )),
        (Some((_, choice, why)), Some(unfit)) => {
            Some((choice, format!("{why}; resident cannot run: {unfit}")))
        }
    }
}

/// Whether a reader that keeps the held part across its reads (a daemon holds a dataset's
/// copy for every pass of it, and loads it once) should read `plan` resident: its choice,
/// or a partly resident candidate with the rest through piles whose epochs without the
/// load beat the streaming choice (a daemon's passes of one epoch each price the load
/// every time, which it pays once).
pub(super) fn wins_loaded(plan: &super::Plan) -> bool {
    if plan.choice == Choice::Resident {
        return true;
    }
    let Some(streaming) = plan.streaming else {
        return false;
    };
    let find = |mode: &str| {
        (plan.candidates.iter()).find(|c| c.mode == mode && c.grouping == plan.grouping)
    };
    match (find(Choice::Resident.name()), find(streaming.name())) {
        (Some(r), Some(s)) => {
            r.unfit.is_none()
                && r.bound.starts_with(PILED)
                && r.total_s - r.first_batch_s < s.total_s
        }
        _ => false,
    }
}
