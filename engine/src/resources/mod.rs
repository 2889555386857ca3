//! The resource plan: one pure function from what a job asks ([`Demand`]: the dataset's
//! statistics and the request) and what the machine gives ([`Limits`]: the backend's real
//! depth and slot limits, locked memory, open files, free scratch space and inodes) to
//! every figure a run then uses — buffer and slot sizes, queue depth, table, pile count and
//! layout, open files, scratch — each with the reason it has that value ([`ResourcePlan`]).
//!
//! The modes take their sizes from here ([`LirsPlan`], [`BufferPlan`], the two-pass pile plan) instead of working
//! them out, the planner (`plan.rs`) prices its candidates with it, and `riffle plan
//! --explain` prints it. Nothing here opens a file or asks the kernel except
//! [`Limits::here`], which a run calls once as it starts (and the planner once per plan).

mod buffer;
mod lirs;
pub mod memory;
mod partial;
pub(crate) mod piles;
mod resident;
#[cfg(test)]
mod tests;

use std::path::Path;

use serde::Serialize;

pub use buffer::{BufferPlan, SCAN_DEPTH, SCATTER_FILES, SLOT_OVERHEAD};
pub use lirs::LirsPlan;
pub(crate) use lirs::MAX_MERGE;
pub use memory::{MachineMemory, MemoryFrom};
pub use partial::{
    partial_piled_plan, partial_piled_rest, partial_plan, partial_scan, PartialPlan,
};
pub(crate) use piles::PilePlan;
pub use piles::MAX_FRAME_RECORDS;
pub(crate) use piles::{scan_bytes, shuffle_layout};
pub use resident::{
    resident_budget, resident_bytes, resident_plan, resident_scan, RESIDENT_SCAN_DEPTH,
    RESIDENT_SCAN_SLOT,
};

use crate::order::Grouping;
use crate::size::human_bytes;
use crate::{Error, Result};

/// What a job asks for, in numbers: the dataset's statistics and the request. The modes
/// build it from a dataset and its units (`Demand::of` in `modes/`); tests build it by hand.
#[derive(Clone, Debug, Serialize)]
pub struct Demand {
    /// Records in the dataset (or the epoch's view).
    pub records: u64,
    /// Bytes of record payload in all.
    pub bytes: u64,
    /// Longest record.
    pub max_record: u64,
    /// Shuffling units.
    pub units: u64,
    /// Memory of the unit table (0 for one record per unit).
    pub units_bytes: u64,
    /// Mean records per unit.
    pub records_per_unit: f64,
    /// Records in the unit that holds the most (a two-pass frame counts them in 31 bits).
    pub widest_unit: u64,
    /// Memory of the offset indexes.
    pub index_bytes: u64,
    /// Memory a view holds of its own while it is read (a mixture's epoch: its draws and
    /// their labels); 0 for a dataset.
    pub view_bytes: u64,
    /// Files of the dataset.
    pub files: u64,
    /// Records per batch.
    pub batch: u64,
    /// Batches read ahead, as asked (the plan may give fewer under a budget).
    pub prefetch: usize,
    /// Random reads in flight, as asked.
    pub depth: usize,
    /// The memory budget, if any (none: the machine's, [`Limits::memory`]).
    pub memory: Option<u64>,
    /// What set `memory` (`--memory`, or the machine's default budget).
    pub memory_from: MemoryFrom,
    /// How records group into units.
    #[serde(skip)]
    pub grouping: Grouping,
    /// A baseline's long sequential runs instead of the contract's reads (LIRS's reader).
    pub runs: bool,
    /// Streamed from object storage (`s3://`, not staged): the two-pass scatter's
    /// sequential reads are ranged GETs, sized as a store pays for them (`piles::scan_size`).
    pub streamed: bool,
}

impl Demand {
    /// Bytes one batch takes: its records at the mean size, and 16 bytes a record (its id
    /// and offset) and one more offset.
    pub fn batch_bytes(&self) -> u64 {
        let payload = self.batch as f64 * self.bytes as f64 / self.records.max(1) as f64;
        (payload as u64).saturating_add((self.batch + 1) * 16)
    }

    /// This demand under the machine's default budget when it names none.
    pub(crate) fn within(&self, limits: &Limits) -> Demand {
        match (self.memory, limits.memory) {
            (None, Some(m)) => Demand {
                memory: Some(m.bytes),
                memory_from: m.from,
                ..self.clone()
            },
            _ => self.clone(),
        }
    }

    /// The budget as an error that it is too small names it: `--memory 1000`, or the
    /// machine's default budget, its size and what set it.
    pub(crate) fn budget_words(&self) -> String {
        match self.memory {
            Some(m) => self.memory_from.words(m),
            None => "the memory budget".into(),
        }
    }
}

/// What the machine gives: asked once at the edge ([`Limits::here`]), or built by tests.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Limits {
    /// Most requests one backend keeps in flight.
    pub max_in_flight: usize,
    /// Most slots one backend may have.
    pub max_slots: usize,
    /// Slots that can be registered buffers; a ring with more uses plain memory.
    pub max_registered_slots: usize,
    /// RLIMIT_MEMLOCK's soft limit (registered buffers are locked), if any.
    pub memlock: Option<u64>,
    /// RLIMIT_NOFILE's soft limit.
    pub open_files: u64,
    /// Free bytes where scratch (piles) would go, if known.
    pub scratch_free: Option<u64>,
    /// Free inodes there, if known.
    pub scratch_inodes: Option<u64>,
    /// The memory a run given no `--memory` plans within ([`memory::here`]), if known.
    pub memory: Option<MachineMemory>,
}

/// The nearest existing directory at or above `p` (scratch is made when a run starts).
fn existing(p: &Path) -> Option<&Path> {
    p.ancestors().find(|a| a.is_dir())
}

impl Limits {
    /// This process's limits, with the scratch space of `scratch` (a directory, or where one
    /// would be made) when given.
    pub fn here(scratch: Option<&Path>) -> Limits {
        let io = crate::io::backend_limits(crate::io::BackendChoice::Auto);
        let (free, inodes) = scratch
            .and_then(existing)
            .and_then(|p| crate::probe::free_space(p).ok())
            .map_or((None, None), |(b, i)| (Some(b), Some(i)));
        Limits {
            max_in_flight: io.max_in_flight,
            max_slots: io.max_slots,
            max_registered_slots: io.max_registered_slots,
            memlock: io.memlock,
            open_files: crate::io::open_file_limit(),
            scratch_free: free,
            scratch_inodes: inodes,
            memory: memory::here(),
        }
    }
}

/// The resource an [`Error::Exhausted`] names when a plan's scratch bytes do not fit the
/// free space: callers match it to say where, in their own words.
pub const SCRATCH_SPACE: &str = "scratch space (bytes)";

/// The resource an [`Error::Exhausted`] names when a plan's scratch files do not fit the
/// free inodes.
pub const SCRATCH_INODES: &str = "scratch inodes";

/// Whether a figure counts bytes of memory, bytes of scratch, or things.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Bytes of engine memory: these add up to the plan's memory.
    Memory,
    /// Bytes on the scratch device.
    Scratch,
    /// A size that is not itself held (a slot size, a read size).
    Size,
    /// A count (depth, slots, piles, files, batches).
    Count,
}

/// One figure of a plan and why it has that value.
#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    /// What it is, e.g. `io_buffers`.
    pub name: &'static str,
    /// Its value: bytes for memory, scratch and sizes.
    pub value: u64,
    /// What kind of figure.
    pub kind: Kind,
    /// Why it has that value.
    pub reason: String,
}

impl Figure {
    /// The value as a person reads it.
    pub fn shown(&self) -> String {
        match self.kind {
            Kind::Count => self.value.to_string(),
            _ => human_bytes(self.value as f64),
        }
    }
}

/// Every figure a run uses, with its reasons, and the totals checked against the limits.
#[derive(Clone, Debug, Serialize)]
pub struct ResourcePlan {
    /// The mode it is for (`lirs`, `two-pass`, a baseline's name).
    pub mode: &'static str,
    /// Every figure, memory first.
    pub figures: Vec<Figure>,
    /// Engine memory: the sum of the memory figures.
    pub memory_bytes: u64,
    /// Scratch space at the peak.
    pub scratch_bytes: u64,
    /// Files the run may hold open at once.
    pub open_files: u64,
}

impl ResourcePlan {
    fn new(mode: &'static str, figures: Vec<Figure>) -> ResourcePlan {
        let sum = |k| {
            figures
                .iter()
                .filter(|f| f.kind == k)
                .map(|f| f.value)
                .fold(0u64, u64::saturating_add)
        };
        let open_files = figures
            .iter()
            .filter(|f| f.name == "open_files")
            .map(|f| f.value)
            .sum();
        ResourcePlan {
            mode,
            memory_bytes: sum(Kind::Memory),
            scratch_bytes: sum(Kind::Scratch),
            open_files,
            figures,
        }
    }

    /// The figure named `name`, if the plan has it.
    pub fn figure(&self, name: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| f.name == name)
    }

    /// Refuses the plan, naming the limit, where it asks for more than `limits` give:
    /// requests in flight or slots beyond the backend's, files beyond the open-file limit,
    /// scratch beyond the free space or inodes, memory beyond the budget.
    pub fn check(&self, d: &Demand, limits: &Limits) -> Result<()> {
        let count = |name| self.figure(name).map_or(0, |f| f.value);
        let refuse = |resource: &'static str, asked: u64, limit: u64| {
            Err(Error::Exhausted {
                resource,
                asked,
                limit,
            })
        };
        // Requests past the backend's in-flight limit wait their turn (the pread pool's
        // threads take them as they free up; a ring sized for fewer collects completions
        // first), but each one needs a slot.
        if count("queue_depth") > limits.max_slots as u64 {
            return refuse("I/O slots", count("queue_depth"), limits.max_slots as u64);
        }
        for name in ["io_slots", "pile_load_slots"] {
            if count(name) > limits.max_slots as u64 {
                return refuse("I/O slots", count(name), limits.max_slots as u64);
            }
        }
        if self.open_files > limits.open_files {
            return refuse(OPEN_FILES, self.open_files, limits.open_files);
        }
        if let Some(free) = limits.scratch_free {
            if self.scratch_bytes > free {
                return refuse(SCRATCH_SPACE, self.scratch_bytes, free);
            }
        }
        if let Some(inodes) = limits.scratch_inodes {
            let files = count("scratch_files");
            if files > inodes {
                return refuse(SCRATCH_INODES, files, inodes);
            }
        }
        let budget = match (d.memory, limits.memory) {
            (Some(m), _) => Some((m, d.memory_from)),
            (None, Some(m)) => Some((m.bytes, m.from)),
            (None, None) => None,
        };
        if let Some((m, from)) = budget {
            if self.memory_bytes > m {
                return refuse(from.resource(), self.memory_bytes, m);
            }
        }
        Ok(())
    }
}

/// Builds figures tersely: `memory("table", bytes, "why")`.
pub(crate) struct Figures(pub Vec<Figure>);

impl Figures {
    pub(crate) fn push(&mut self, name: &'static str, kind: Kind, value: u64, reason: String) {
        self.0.push(Figure {
            name,
            value,
            kind,
            reason,
        });
    }

    /// The offset index every mode holds.
    fn offset_index(&mut self, d: &Demand) {
        self.push(
            "offset_index",
            Kind::Memory,
            d.index_bytes,
            "one u64 per record of variable-length files (0 for fixed-size records)".into(),
        );
        if d.view_bytes > 0 {
            self.push(
                "view_draws",
                Kind::Memory,
                d.view_bytes,
                "a mixture epoch's draws, 8 bytes a record (and its label, 4), held while \
                 the epoch is read"
                    .into(),
            );
        }
    }

    /// The batches read ahead and the one being filled.
    fn read_ahead(&mut self, prefetch: usize, batch_bytes: u64) {
        self.push(
            "batches",
            Kind::Memory,
            (prefetch as u64 + 1).saturating_mul(batch_bytes),
            format!(
                "{prefetch} batch(es) read ahead and one being filled, {} each",
                human_bytes(batch_bytes as f64)
            ),
        );
    }

    /// The unit table of page grouping.
    fn unit_table(&mut self, d: &Demand) {
        let why = match d.grouping {
            Grouping::Record => "record grouping: one record per unit, no table".into(),
            Grouping::Page { unit } => format!(
                "page grouping: the first record of each {} block",
                human_bytes(unit as f64)
            ),
        };
        self.push("unit_table", Kind::Memory, d.units_bytes, why);
    }
}

/// Descriptors a run keeps beside its dataset's files and piles: stdio, the ring and its
/// eventfd, the scratch directory and its lock, `--ids-out`, the daemon's socket.
pub const OWN_FILES: u64 = 16;

/// The resource an [`Error::Exhausted`] names when a run's files do not fit `ulimit -n`.
pub const OPEN_FILES: &str = "open files (raise ulimit -n)";

/// Files a reader of `d` may keep open at once: each of its reads in flight holds its file,
/// and it keeps at most [`crate::io::reader_cap`] of the dataset's files (a quarter of the
/// open-file limit) open, never more than the dataset has.
fn reader_files(d: &Demand, limits: &Limits) -> u64 {
    let cap = crate::io::reader_cap(limits.open_files) as u64;
    d.files.min(cap.max(d.depth as u64 + 1))
}

/// The random reads in flight a read of `d` plans: as asked, or, for a dataset of more
/// files than a reader keeps open, one fewer than that cap (a dataset of 20,000 files at
/// QD 64 under `ulimit -n 64` held 65 files open and failed with EMFILE). The queue depth
/// never changes a batch. Returns the depth and, when lowered, why.
pub fn read_depth(d: &Demand, limits: &Limits) -> (usize, Option<String>) {
    let cap = crate::io::reader_cap(limits.open_files);
    if d.files > cap as u64 && d.depth >= cap {
        let why = format!(
            "random reads in flight: {} asked, {} fit (each holds its file open, and a reader \
             keeps at most {cap} of the dataset's {} files open: a quarter of ulimit -n {})",
            d.depth,
            cap - 1,
            d.files,
            limits.open_files
        );
        (cap - 1, Some(why))
    } else {
        (d.depth, None)
    }
}

/// The open files of a run whose readers are `readers` (each `(files, why)`) and that
/// holds `extra` files of its own (pile group files), with [`OWN_FILES`] beside.
fn open_files(readers: &[(u64, &str)], limits: &Limits, extra: u64) -> (u64, String) {
    let files: u64 = readers.iter().map(|r| r.0).sum();
    let said: Vec<String> = readers
        .iter()
        .map(|(n, why)| format!("{n} {why}"))
        .collect();
    (
        files + extra + OWN_FILES,
        format!(
            "{} (a reader keeps a quarter of the open-file limit of {} at most), {extra} of the \
             run's own files and {OWN_FILES} for stdio, rings and the like",
            said.join(", "),
            limits.open_files
        ),
    )
}

/// The resource plan of a LIRS (or baseline) read.
pub fn lirs(d: &Demand, limits: &Limits) -> Result<ResourcePlan> {
    lirs_plan(d, limits).map(|(_, plan)| plan)
}

/// A LIRS read's sizes and its resource plan, checked against `limits`.
pub fn lirs_plan(d: &Demand, limits: &Limits) -> Result<(LirsPlan, ResourcePlan)> {
    let (depth, lowered) = read_depth(d, limits);
    let d = &Demand {
        depth,
        ..d.within(limits)
    };
    let sizes = LirsPlan::new(d, d.units)?;
    let mut f = sizes.figures(d, limits);
    if let (Some(why), Some(q)) = (lowered, f.0.iter_mut().find(|f| f.name == "queue_depth")) {
        q.reason = why;
    }
    let reader = reader_files(d, limits);
    let (files, why) = open_files(&[(reader, "of the dataset's files")], limits, 0);
    f.push("open_files", Kind::Count, files, why);
    let plan = ResourcePlan::new(if d.runs { "baseline" } else { "lirs" }, f.0);
    plan.check(d, limits)?;
    Ok((sizes, plan))
}

/// A shuffle-buffer read's sizes (a buffer of `size` records, `pad_records` kept to pad)
/// and its resource plan, checked against `limits`.
pub fn buffer_plan(
    d: &Demand,
    size: u64,
    pad_records: u64,
    limits: &Limits,
) -> Result<(BufferPlan, ResourcePlan)> {
    let d = &d.within(limits);
    let sizes = BufferPlan::new(d, size, pad_records)?;
    let plan = ResourcePlan::new("buffer", sizes.figures(d).0);
    plan.check(d, limits)?;
    Ok((sizes, plan))
}

/// The resource plan of `riffle gen`: `bytes` (at least) written as `files` files (one, or
/// a tree's), through `depth` writes of `slot` bytes in flight, checked against the free
/// space and inodes where they go.
pub fn gen(
    bytes: u64,
    files: u64,
    depth: usize,
    slot: usize,
    limits: &Limits,
) -> Result<ResourcePlan> {
    let mut f = Figures(Vec::new());
    let depth = depth.max(1);
    f.push(
        "write_buffers",
        Kind::Memory,
        crate::io::footprint(slot.saturating_mul(depth)) as u64,
        format!("{depth} writes of {} in flight", human_bytes(slot as f64)),
    );
    f.push(
        "queue_depth",
        Kind::Count,
        depth as u64,
        "writes in flight".into(),
    );
    f.push(
        "io_slots",
        Kind::Count,
        depth as u64,
        "one slot per write in flight".into(),
    );
    f.push(
        "output",
        Kind::Scratch,
        bytes,
        "every record at its smallest: the least the dataset takes".into(),
    );
    f.push(
        "scratch_files",
        Kind::Count,
        files,
        "files the dataset is written as (a tree's directories aside)".into(),
    );
    f.push(
        "open_files",
        Kind::Count,
        1,
        "one file written at a time".into(),
    );
    let plan = ResourcePlan::new("gen", f.0);
    let d = Demand {
        records: 0,
        bytes,
        max_record: 0,
        units: 0,
        units_bytes: 0,
        records_per_unit: 1.0,
        widest_unit: 0,
        index_bytes: 0,
        view_bytes: 0,
        files,
        batch: 0,
        prefetch: 0,
        depth,
        memory: None,
        memory_from: MemoryFrom::Flag,
        grouping: Grouping::Record,
        runs: false,
        streamed: false,
    };
    plan.check(&d, limits)?;
    Ok(plan)
}

/// The resource plan of a two-pass read.
pub fn two_pass(d: &Demand, limits: &Limits) -> Result<ResourcePlan> {
    two_pass_plan(d, limits).map(|(_, _, plan)| plan)
}

/// A two-pass read's read-ahead (as fitted to the budget), pile plan and resource plan,
/// checked against `limits`.
pub(crate) fn two_pass_plan(
    d: &Demand,
    limits: &Limits,
) -> Result<(usize, PilePlan, ResourcePlan)> {
    let (prefetch, sizes) = PilePlan::fitted(d, limits)?;
    let d = Demand {
        prefetch,
        ..d.clone()
    };
    let mut f = sizes.figures(&d, limits);
    // The scatter keeps at most SCATTER_FILES dataset files open, a lead reading beside it
    // its reader's; the piles' group files are the run's own (one set being read, the next
    // being written).
    let (lead_depth, _) = read_depth(&d, limits);
    let lead = reader_files(
        &Demand {
            depth: lead_depth,
            ..d.clone()
        },
        limits,
    );
    let (files, why) = open_files(
        &[
            (d.files.min(SCATTER_FILES as u64), "files the scatter reads"),
            (lead, "files a lead reads beside it"),
        ],
        limits,
        2 * sizes.layout.groups() as u64,
    );
    f.push("open_files", Kind::Count, files, why);
    let plan = ResourcePlan::new("two-pass", f.0);
    plan.check(&d, limits)?;
    Ok((prefetch, sizes, plan))
}
