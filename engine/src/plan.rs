//! The planner: a cost model that predicts, from the cached device profile and the
//! workload, each mode's first-epoch and later-epoch time, memory and scratch space; `auto`
//! takes the cheaper of `lirs` and `two-pass` (they deliver the same batches, so the choice
//! never changes training) within the budgets.
//!
//! The model is a pure function of a [`DeviceModel`] (IOPS by block size and queue depth,
//! sequential bandwidths) and a [`Workload`] (records, sizes, units, batch, epochs,
//! budgets). Each mode's time is the larger of its I/O time and its CPU time, since the
//! engine overlaps the two:
//!
//! - `lirs`: one read per unit of about the unit's bytes plus the alignment slack, at the
//!   IOPS the probe measured for that block size and queue depth (log-interpolated), capped
//!   by the sequential bandwidth; plus the table build.
//! - `two-pass`: the first epoch scatters (one sequential read and one write of the data as
//!   frames) and then passes over the piles; each later epoch reads the piles once and,
//!   while rolling, writes them once for the next epoch. Reads and writes share the device,
//!   so their times add.
//! - `sequential` and `buffer`: one sequential read; `bmf`: one read per block.
//!
//! The CPU constants were measured on the development machine with data in memory (see
//! ARCHITECTURE.md); the bench's `planner` suite checks every prediction against a run.

use serde::Serialize;

use crate::dataset::Dataset;
use crate::modes::{Baseline, Mode, ReadOptions};
use crate::order::{Grouping, Units};
use crate::probe::Profile;
use crate::resources::{Limits, ResourcePlan};
use crate::Result;

mod resident;

/// CPU per record delivered by `lirs` (planning, completion, copy into the batch), seconds.
const LIRS_CPU_PER_UNIT: f64 = 1.6e-6;
/// CPU per unit of a table build (key, sort), seconds.
pub(crate) const TABLE_PER_UNIT: f64 = 35e-9;
/// CPU per record of a two-pass pile pass (sort, emit) or re-scatter, seconds.
const TWO_PASS_CPU_PER_RECORD: f64 = 0.25e-6;
/// CPU per record of the scatter (locate, frame, write), seconds.
const SCATTER_CPU_PER_RECORD: f64 = 0.4e-6;
/// Cost of handing over one batch (allocation, channel, waking the consumer), seconds
/// (measured on the development machine with batches of 64 small records).
pub(crate) const CPU_PER_BATCH: f64 = 40e-6;
/// LIRS copies each record from its read into the batch on the I/O thread, between
/// submissions: seconds per byte that do not overlap the device.
const LIRS_COPY_PER_BYTE: f64 = 0.2e-9;
/// The share of the summed read and write bandwidths a phase that both reads and writes
/// reaches on a real device (measured on the development machine: reads and writes of
/// many piles interleaved).
const SHARED_RW_EFFICIENCY: f64 = 0.85;
/// The most bytes per second a pile pass gets through whatever the device: loading,
/// indexing, sorting and emitting each pile in memory (measured on the development
/// machine, 4 GB of JSONL under a 1 GiB budget: 1.8 GB/s reading only, 1.1 GB/s while also
/// re-scattering for the next epoch).
const LAST_PASS_BPS: f64 = 1.8e9;
const ROLLING_PASS_BPS: f64 = 1.1e9;
/// Fixed cost of a two-pass epoch (pile files, threads, the pile directory), seconds.
const TWO_PASS_EPOCH_FIXED: f64 = 0.03;
/// Fixed cost of the first two-pass epoch beyond that (the scatter's reader and writers).
const TWO_PASS_FIRST_FIXED: f64 = 0.1;
/// Under a throttle, reads and writes of one phase overlap but not perfectly: this share
/// of the shorter one still adds (measured under `hdd` emulation).
const THROTTLED_RW_OVERLAP_LOSS: f64 = 0.15;
/// CPU per record of a sequential pass (cutting records, batch assembly), seconds.
const SEQ_CPU_PER_RECORD: f64 = 0.15e-6;

/// What the planner knows of a device: the probe's figures.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceModel {
    /// Sequential read bandwidth, bytes/s.
    pub seq_read_bps: f64,
    /// Sequential write bandwidth, bytes/s.
    pub seq_write_bps: f64,
    /// (block size, queue depth, IOPS) of random reads.
    pub random: Vec<(usize, usize, f64)>,
    /// The emulated class the profile was measured under, if any.
    pub emulated: Option<String>,
    /// Whether reads and writes share the device's bandwidth (a real device), or each has
    /// its own budget (a cgroup throttle limits read and write bandwidth separately, so
    /// under emulation they overlap).
    pub shared_rw: bool,
}

impl DeviceModel {
    /// The object store an endpoint's probe measured, as a device: its best GET throughput
    /// as the sequential read bandwidth, its GETs per second by size and requests in flight
    /// as random reads; nothing is written to it.
    pub fn from_remote(p: &crate::remote::probe::RemoteProfile) -> DeviceModel {
        DeviceModel {
            seq_read_bps: p.best_bytes_per_s,
            seq_write_bps: 0.0,
            random: (p.points.iter())
                .map(|x| (x.size as usize, x.in_flight, x.requests_per_s))
                .collect(),
            emulated: None,
            shared_rw: false,
        }
    }

    /// A stand-in for a device riffle cannot probe (no profile is cached and the probe
    /// cannot write its region: a read-only filesystem): the figures `--emulate` sets for
    /// `hdd` on a disk the kernel calls rotational, for `sata-ssd` otherwise; a class below
    /// most flash devices, so the planner's choice errs towards sequential I/O.
    pub fn fallback(rotational: bool) -> DeviceModel {
        let class = if rotational {
            crate::emulate::DeviceClass::Hdd
        } else {
            crate::emulate::DeviceClass::SataSsd
        };
        let l = class.limits();
        let iops = l.read_iops.unwrap_or(90_000) as f64;
        let read = l.read_bps.unwrap_or(550_000_000) as f64;
        // A flash device reaches its IOPS at a queue depth of 32 or so, a disk at any.
        let random = if rotational {
            vec![(4096, 1, iops), (4096, 64, iops)]
        } else {
            vec![(4096, 1, iops / 8.0), (4096, 32, iops), (4096, 128, iops)]
        };
        DeviceModel {
            seq_read_bps: read,
            seq_write_bps: l.write_bps.map_or(read, |w| w as f64),
            random,
            emulated: None,
            shared_rw: true,
        }
    }

    /// The model of a probe profile.
    pub fn from_profile(p: &Profile) -> DeviceModel {
        DeviceModel {
            seq_read_bps: p.seq_read_bps,
            seq_write_bps: p.seq_write_bps,
            random: p.random.iter().map(|x| (x.bs, x.qd, x.iops)).collect(),
            emulated: p.emulated.map(|c| c.to_string()),
            shared_rw: p.emulated.is_none(),
        }
    }

    /// Random-read IOPS at block size `bs` and queue depth `qd`: the measured queue depth
    /// nearest `qd` (in ratio), log-interpolated between measured block sizes; below the
    /// smallest block measured a read costs as much as one of that size; above the largest,
    /// the bandwidth of the largest is kept.
    pub fn iops(&self, bs: u64, qd: usize) -> f64 {
        if self.random.is_empty() {
            return self.seq_read_bps / bs.max(4096) as f64;
        }
        // At one block size: log-interpolated between the measured queue depths around
        // `qd`, the nearest one outside them.
        let best_qd = |points: &[&(usize, usize, f64)]| -> Option<f64> {
            let mut pts: Vec<(f64, f64)> = points
                .iter()
                .map(|p| (p.1.max(1) as f64, p.2.max(1e-9)))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let q = qd.max(1) as f64;
            let first = *pts.first()?;
            let last = *pts.last()?;
            if q <= first.0 {
                return Some(first.1);
            }
            if q >= last.0 {
                return Some(last.1);
            }
            let i = pts.iter().position(|p| p.0 >= q)?;
            let ((qa, ia), (qb, ib)) = (pts[i - 1], pts[i]);
            let t = (q.ln() - qa.ln()) / (qb.ln() - qa.ln());
            Some((ia.ln() * (1.0 - t) + ib.ln() * t).exp())
        };
        let mut sizes: Vec<usize> = self.random.iter().map(|p| p.0).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let at = |size: usize| -> f64 {
            let pts: Vec<&(usize, usize, f64)> =
                self.random.iter().filter(|p| p.0 == size).collect();
            best_qd(&pts).unwrap_or(1.0)
        };
        let bs = bs.max(1) as f64;
        let (lo, hi) = (sizes[0], *sizes.last().expect("sizes"));
        if bs <= lo as f64 {
            return at(lo);
        }
        if bs >= hi as f64 {
            return at(hi) * hi as f64 / bs;
        }
        let i = sizes
            .iter()
            .position(|&s| s as f64 >= bs)
            .expect("inside the range");
        let (a, b) = (sizes[i - 1], sizes[i]);
        let t = (bs.ln() - (a as f64).ln()) / ((b as f64).ln() - (a as f64).ln());
        (at(a).ln() * (1.0 - t) + at(b).ln() * t).exp()
    }
}

/// The planner's model of the device holding `path`, from its cached profile (the profile
/// of the emulated class while a throttle is in force), if one is cached.
pub fn cached_device_model(path: &std::path::Path) -> Option<DeviceModel> {
    let dev = crate::device::identify(path).ok()?;
    let (profile, _) = crate::probe::load_cached(&dev, true, crate::emulate::active(&dev))?;
    Some(DeviceModel::from_profile(&profile))
}

/// What the planner knows of the job.
#[derive(Clone, Debug, Serialize)]
pub struct Workload {
    /// Records in the dataset.
    pub records: u64,
    /// Bytes of record payload in all.
    pub bytes: u64,
    /// Largest record.
    pub max_record: u64,
    /// Records per batch.
    pub batch: u64,
    /// Epochs to read.
    pub epochs: u64,
    /// Memory budget, if any.
    pub memory: Option<u64>,
    /// Free bytes where two-pass would put its piles.
    pub scratch_free: Option<u64>,
    /// Queue depth of random reads.
    pub queue_depth: usize,
    /// The direct-I/O alignment of the files.
    pub align: u64,
}

/// One mode's prediction.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    /// `lirs`, `two-pass`, `sequential`, `buffer`, `bmf`.
    pub mode: String,
    /// `record` or `page:<unit>`.
    pub grouping: String,
    /// Whether it delivers the order contract's batches (baselines do not).
    pub contract: bool,
    /// Predicted seconds of the first epoch.
    pub first_epoch_s: f64,
    /// Predicted seconds to the first batch (DLIO's T_pre): LIRS's table and the first
    /// batch's reads; two-pass's scatter, or its lead's first batch when it leads.
    pub first_batch_s: f64,
    /// Predicted seconds of each later epoch (for two-pass: while rolling; the last epoch
    /// only reads).
    pub later_epoch_s: f64,
    /// Predicted seconds of all the epochs asked for.
    pub total_s: f64,
    /// Reads per epoch.
    pub reads_per_epoch: f64,
    /// Mean bytes per read.
    pub read_bytes: f64,
    /// What bounds it: `iops`, `bandwidth` or `cpu` (a partly resident candidate: `partly
    /// resident, ` before it).
    pub bound: String,
    /// Engine memory it would own.
    pub memory_bytes: u64,
    /// Scratch space it needs.
    pub scratch_bytes: u64,
    /// Why it cannot run within the budgets, if it cannot.
    pub unfit: Option<String>,
}

/// The mode `auto` runs: one of the two that deliver the order contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Choice {
    /// Random reads through the epoch table.
    Lirs,
    /// A sequential scatter into piles, then a pass over them.
    TwoPass,
    /// The files read once into memory, every later epoch permuted there.
    Resident,
}

impl Plan {
    /// Whether a reader that keeps a held part loaded across its reads (a daemon) should
    /// read resident: the plan's choice, or a partly resident read with the rest through
    /// piles whose epochs without the load beat the streaming choice.
    pub fn resident_wins_loaded(&self) -> bool {
        resident::wins_loaded(self)
    }
}

impl Choice {
    /// `lirs` or `two-pass`, as the CLI spells it.
    pub fn name(self) -> &'static str {
        Mode::from(self).name()
    }
}

impl From<Choice> for Mode {
    /// The mode that runs the choice.
    fn from(c: Choice) -> Mode {
        match c {
            Choice::Lirs => Mode::Lirs,
            Choice::TwoPass => Mode::TwoPass,
            Choice::Resident => Mode::Resident,
        }
    }
}

impl std::fmt::Display for Choice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The plan: every candidate, the choice and why.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    /// The device figures used.
    pub device: DeviceModel,
    /// The workload.
    pub workload: Workload,
    /// The grouping asked for.
    pub grouping: String,
    /// Every mode and grouping considered.
    pub candidates: Vec<Candidate>,
    /// The mode `auto` runs.
    pub choice: Choice,
    /// Why.
    pub reason: String,
    /// The faster of lirs and two-pass that fits, if one does: what runs where resident
    /// mode cannot (the daemon's passes).
    pub streaming: Option<Choice>,
    /// What page grouping would gain over record grouping (when record was asked for).
    pub page_gain: Option<String>,
    /// Whether a two-pass read starts with LIRS while its scatter runs (the device reads
    /// at random fast enough that the lead's reads cost the scatter little).
    pub lead: bool,
    /// For the grouping asked for, every figure a run of each mode that fits uses, and why
    /// (`riffle plan --explain`).
    pub resources: Vec<ResourcePlan>,
}

impl Plan {
    /// The candidate for (mode, grouping name).
    pub fn candidate(&self, mode: &str, grouping: &str) -> Option<&Candidate> {
        self.candidates
            .iter()
            .find(|c| c.mode == mode && c.grouping == grouping)
    }

    /// The resource plan of `mode` (`lirs` or `two-pass`), if that mode fits.
    pub fn resources_of(&self, mode: &str) -> Option<&ResourcePlan> {
        self.resources.iter().find(|r| r.mode == mode)
    }

    /// The chosen candidate.
    pub fn chosen(&self) -> &Candidate {
        self.candidate(self.choice.name(), &self.grouping)
            .expect("the choice is a candidate")
    }
}

fn grouping_name(g: Grouping) -> String {
    match g {
        Grouping::Record => "record".into(),
        Grouping::Page { unit } => format!("page:{}", crate::size::human_bytes(unit as f64)),
    }
}

/// Seconds for `units` random reads of `read` bytes each.
fn random_read_time(dev: &DeviceModel, w: &Workload, units: f64, read: f64) -> (f64, &'static str) {
    let iops = dev.iops(read as u64, w.queue_depth).max(1.0);
    let by_iops = units / iops;
    let by_bw = units * read / dev.seq_read_bps.max(1.0);
    if by_iops >= by_bw {
        (by_iops, "iops")
    } else {
        (by_bw, "bandwidth")
    }
}

/// Seconds to LIRS's first batch once its table is built: the batch's reads at the queue
/// depth (a batch of fewer reads than the depth takes one read's latency).
fn first_batch_reads(dev: &DeviceModel, w: &Workload, units: f64) -> f64 {
    let per_unit = w.records as f64 / units.max(1.0);
    let reads = (w.batch as f64 / per_unit.max(1.0)).ceil().max(1.0);
    let read = w.bytes as f64 / units.max(1.0) + w.align as f64;
    let iops = dev.iops(read as u64, w.queue_depth).max(1.0);
    reads.max(w.queue_depth as f64) / iops
}

impl DeviceModel {
    /// Whether a two-pass read should lead with LIRS on this device: its random reads of
    /// `read` bytes at `depth` move at least a sixteenth of its sequential bandwidth (a
    /// flash device). On a device that seeks (an HDD: 600 reads of 4 KiB a second against
    /// 150 MB/s), every random read breaks the scatter's sequential stream for little.
    pub fn leads(&self, read: u64, depth: usize) -> bool {
        self.iops(read, depth) * read as f64 >= self.seq_read_bps / 16.0
    }
}

/// Whether a two-pass read of `ds` with `opts` leads with LIRS outside the planner (a mode
/// asked for by name): when asked to, unless `dev` (the cached profile of its device, if
/// any) says the device seeks.
pub fn lead_for(dev: Option<&DeviceModel>, ds: &Dataset, opts: &ReadOptions) -> bool {
    // LIRS's read of a record: the mean record and about one alignment unit more.
    let read = ds.size_stats().total / ds.len().max(1) + 4096;
    opts.lead && dev.is_none_or(|d| d.leads(read, opts.io.depth))
}

/// The part of a LIRS epoch that does not overlap its reads: the table build and the
/// copies into batches.
fn table_and_copies(w: &Workload, units: f64) -> f64 {
    units * TABLE_PER_UNIT + w.bytes as f64 * LIRS_COPY_PER_BYTE
}

/// Predicts a LIRS epoch: (seconds, reads, bytes per read, bound).
fn lirs_epoch(dev: &DeviceModel, w: &Workload, units: f64) -> (f64, f64, f64, &'static str) {
    let mean_unit = w.bytes as f64 / units.max(1.0);
    // An aligned extent covering the unit: on average one alignment unit more.
    let read = mean_unit + w.align as f64;
    let (io, bound) = random_read_time(dev, w, units, read);
    let batches = (w.records as f64 / w.batch.max(1) as f64).ceil();
    let cpu = units * LIRS_CPU_PER_UNIT + batches * CPU_PER_BATCH;
    let serial = table_and_copies(w, units);
    if cpu > io {
        (cpu + serial, units, read, "cpu")
    } else {
        (io + serial, units, read, bound)
    }
}

/// Predicts two-pass: (first epoch, rolling later epoch, last epoch, bound).
fn two_pass_epochs(dev: &DeviceModel, w: &Workload, units: f64) -> (f64, f64, f64, &'static str) {
    let frames = w.bytes as f64 + units * 20.0 + w.records as f64 * 4.0;
    let read = frames / dev.seq_read_bps.max(1.0);
    let write = frames / dev.seq_write_bps.max(1.0);
    let n = w.records as f64;
    let batches = (n / w.batch.max(1) as f64).ceil();
    // The I/O thread's share of a pile pass: ordering and emitting records, handing over
    // batches; while rolling, re-scattering competes with it for the two cores.
    let emit = n * TWO_PASS_CPU_PER_RECORD + batches * CPU_PER_BATCH;
    let cpu = emit;
    let scan = w.bytes as f64 / dev.seq_read_bps.max(1.0);
    // Reads and writes of one phase share a real device; under a throttle each direction
    // has its own budget, so they overlap.
    let both = |r: f64, w: f64| {
        if dev.shared_rw {
            (r + w) / SHARED_RW_EFFICIENCY
        } else {
            r.max(w) + THROTTLED_RW_OVERLAP_LOSS * r.min(w)
        }
    };
    let scatter = both(scan, write).max(n * SCATTER_CPU_PER_RECORD) + TWO_PASS_FIRST_FIXED;
    let rolling = both(read, write)
        .max(frames / ROLLING_PASS_BPS)
        .max(emit + n * TWO_PASS_CPU_PER_RECORD)
        + TWO_PASS_EPOCH_FIXED;
    let last = read.max(frames / LAST_PASS_BPS).max(emit) + TWO_PASS_EPOCH_FIXED;
    let bound = if cpu >= rolling { "cpu" } else { "bandwidth" };
    (
        scatter + if w.epochs > 1 { rolling } else { last },
        rolling,
        last,
        bound,
    )
}

/// Builds the plan for reading `ds` with `opts` (its grouping, batch, memory, queue depth)
/// for `opts.epochs` epochs on a device described by `dev`. `scratch_free` is the free space
/// where two-pass would put its piles.
pub fn plan(
    ds: &Dataset,
    opts: &ReadOptions,
    dev: &DeviceModel,
    scratch_free: Option<u64>,
) -> Result<Plan> {
    let limits = Limits {
        scratch_free,
        ..Limits::here(None)
    };
    plan_within(ds, opts, dev, &limits)
}

/// [`plan`] within the machine's `limits` (the scratch space among them).
pub fn plan_within(
    ds: &Dataset,
    opts: &ReadOptions,
    dev: &DeviceModel,
    limits: &Limits,
) -> Result<Plan> {
    let stats = ds.size_stats();
    // The first file, opened as its reader will open it (beneath its tree's root).
    let align = (!ds.files().is_empty())
        .then(|| ds.open_one(0, false).ok())
        .flatten()
        .map(|f| f.alignment().io_unit() as u64)
        .unwrap_or(4096);
    let w = Workload {
        records: ds.len(),
        bytes: stats.total,
        max_record: stats.max,
        batch: opts.batch,
        epochs: opts.epochs.max(1),
        memory: opts.memory,
        scratch_free: limits.scratch_free,
        queue_depth: opts.io.depth,
        align,
    };
    let job = Job {
        ds,
        opts,
        dev,
        limits,
        w: &w,
    };
    let mut groupings = vec![opts.grouping];
    // A view (a mixture's epoch, drawn records) is read with record grouping.
    if opts.grouping == Grouping::Record && !ds.is_view() {
        groupings.push(Grouping::Page { unit: 4096 });
    }
    let mut candidates = Vec::new();
    let mut resources = Vec::new();
    for &g in &groupings {
        let (lirs, two, res, plans) = job.contract_candidates(g);
        candidates.push(lirs);
        candidates.push(two);
        candidates.push(res);
        if g == opts.grouping {
            resources = plans;
        }
    }
    candidates.extend(job.baselines());
    let grouping = grouping_name(opts.grouping);
    let find = |mode: &str| {
        candidates
            .iter()
            .find(|c| c.mode == mode && c.grouping == grouping)
            .expect("a candidate of each mode for the grouping asked for")
    };
    let (lirs, two) = (find("lirs"), find("two-pass"));
    let (best, refused) = match choose(lirs, two, dev, w.epochs) {
        Ok((c, why)) => (
            Some((if c == Choice::Lirs { lirs } else { two }, c, why)),
            None,
        ),
        Err(e) => (None, Some(e)),
    };
    let streaming = best.as_ref().map(|b| b.1);
    // A mixture's view is drawn anew each epoch: never held resident (`Source::read_resident`
    // refuses it), so auto picks between the streaming modes.
    let weighed = match best {
        Some((_, c, why)) if ds.is_view() => Some((
            c,
            format!("{why}; a mixture is not held resident (each epoch draws its records anew)"),
        )),
        best => resident::weigh(find("resident"), best, w.epochs),
    };
    let Some((choice, reason)) = weighed else {
        return Err(refused
            .unwrap_or_else(|| crate::Error::Internal("no mode fits, and none said why".into())));
    };
    let page_gain = (opts.grouping == Grouping::Record).then(|| page_gain(&candidates));
    let lead = opts.lead && dev.leads(lirs.read_bytes as u64, w.queue_depth);
    Ok(Plan {
        streaming,
        resources,
        device: dev.clone(),
        workload: w,
        grouping,
        candidates,
        choice,
        reason,
        lead,
        page_gain,
    })
}

/// What every candidate of a plan is priced from.
struct Job<'a> {
    ds: &'a Dataset,
    opts: &'a ReadOptions,
    dev: &'a DeviceModel,
    limits: &'a Limits,
    w: &'a Workload,
}

impl Job<'_> {
    /// The LIRS and two-pass candidates with grouping `g`, and the resource plans of those
    /// that fit.
    fn contract_candidates(
        &self,
        g: Grouping,
    ) -> (Candidate, Candidate, Candidate, Vec<ResourcePlan>) {
        let (dev, w) = (self.dev, self.w);
        let e = w.epochs as f64;
        let o = ReadOptions {
            grouping: g,
            baseline: None,
            ..self.opts.clone()
        };
        // Worked out once for both modes (page grouping walks the whole index).
        let unit_set = Units::new(&self.ds.layout(), g);
        let units = unit_set.len() as f64;
        let demand = crate::modes::demand(self.ds, &unit_set, &o);
        let mut plans = Vec::new();
        // LIRS.
        let (t, reads, read, bound) = lirs_epoch(dev, w, units);
        let lirs_first = units * TABLE_PER_UNIT + first_batch_reads(dev, w, units);
        let (memory, unfit) = match crate::resources::lirs(&demand, self.limits) {
            Ok(r) => {
                let memory = r.memory_bytes;
                plans.push(r);
                (memory, None)
            }
            Err(err) => (0, Some(err.to_string())),
        };
        let lirs = Candidate {
            mode: Choice::Lirs.name().into(),
            grouping: grouping_name(g),
            contract: true,
            first_epoch_s: t,
            first_batch_s: lirs_first,
            later_epoch_s: t,
            total_s: t * e,
            reads_per_epoch: reads,
            read_bytes: read,
            bound: bound.into(),
            memory_bytes: memory,
            scratch_bytes: 0,
            unfit,
        };
        // Two-pass. Led, the first batch comes in about LIRS's time: its table is a prefix
        // (cheaper than a whole build) but its reads compete with the scatter's (measured
        // here: 1.3x LIRS's); else after the scatter.
        let (first, rolling, last, bound) = two_pass_epochs(dev, w, units);
        let scatter = first - if w.epochs > 1 { rolling } else { last };
        let led = self.opts.lead && dev.leads(read as u64, w.queue_depth);
        let total = if w.epochs == 1 {
            first
        } else {
            first + rolling * (e - 2.0) + last
        };
        let (memory, scratch, unfit) = match crate::resources::two_pass(&demand, self.limits) {
            Ok(r) => {
                let (memory, scratch) = (r.memory_bytes, r.scratch_bytes);
                plans.push(r);
                (memory, scratch, None)
            }
            Err(crate::Error::Exhausted {
                resource, asked, ..
            }) if resource == crate::resources::SCRATCH_SPACE => {
                let why = format!(
                    "needs {} of scratch space, {} free",
                    crate::size::human_bytes(asked as f64),
                    crate::size::human_bytes(w.scratch_free.unwrap_or(0) as f64)
                );
                (0, asked, Some(why))
            }
            Err(err) => (0, 0, Some(err.to_string())),
        };
        let two = Candidate {
            mode: Choice::TwoPass.name().into(),
            grouping: grouping_name(g),
            contract: true,
            first_epoch_s: first,
            first_batch_s: if led { lirs_first } else { scatter },
            later_epoch_s: if w.epochs > 2 { rolling } else { last },
            total_s: total,
            reads_per_epoch: 4.0 * w.bytes as f64 / (4 << 20) as f64,
            read_bytes: (4 << 20) as f64,
            bound: bound.into(),
            memory_bytes: memory,
            scratch_bytes: scratch,
            unfit,
        };
        let (res, plan) =
            resident::candidate(dev, w, g, units, &demand, self.ds.bytes(), self.limits);
        plans.extend(plan);
        (lirs, two, res, plans)
    }

    /// The baselines, for comparison only: sequential, the shuffle buffer, bmf.
    fn baselines(&self) -> Vec<Candidate> {
        let (dev, w) = (self.dev, self.w);
        let e = w.epochs as f64;
        let seq_io = w.bytes as f64 / dev.seq_read_bps.max(1.0);
        let seq_cpu = w.records as f64 * SEQ_CPU_PER_RECORD;
        let seq = seq_io.max(seq_cpu);
        let seq_bound = if seq_cpu > seq_io { "cpu" } else { "bandwidth" };
        let per_batch = (w.records as f64 / w.batch.max(1) as f64).max(1.0);
        let mut out = Vec::new();
        for (mode, baseline) in [
            ("sequential", Baseline::Sequential),
            ("buffer", Baseline::Buffer { size: 10_000 }),
        ] {
            let o = ReadOptions {
                baseline: Some(baseline),
                ..self.opts.clone()
            };
            let units = crate::modes::lirs::units_for(self.ds, &o);
            let demand = crate::modes::demand(self.ds, &units, &o);
            let memory = match baseline {
                Baseline::Buffer { size } => {
                    crate::resources::buffer_plan(&demand, size, 0, self.limits).map(|(_, r)| r)
                }
                _ => crate::resources::lirs(&demand, self.limits),
            }
            .map(|r| r.memory_bytes);
            out.push(Candidate {
                mode: mode.into(),
                grouping: "record".into(),
                contract: false,
                first_epoch_s: seq,
                first_batch_s: seq / per_batch,
                later_epoch_s: seq,
                total_s: seq * e,
                reads_per_epoch: w.bytes as f64 / (1 << 20) as f64,
                read_bytes: (1 << 20) as f64,
                bound: seq_bound.into(),
                memory_bytes: memory.as_ref().copied().unwrap_or(0),
                scratch_bytes: 0,
                unfit: memory.err().map(|e| e.to_string()),
            });
        }
        let block = 64u64.min(w.records.max(1));
        let blocks = w.records.div_ceil(block) as f64;
        let read = w.bytes as f64 / blocks.max(1.0) + w.align as f64;
        let (io, bound) = random_read_time(dev, w, blocks, read);
        let bmf = io.max(seq_cpu);
        out.push(Candidate {
            mode: "bmf".into(),
            grouping: format!("blocks of {block}"),
            contract: false,
            first_epoch_s: bmf,
            first_batch_s: bmf / per_batch,
            later_epoch_s: bmf,
            total_s: bmf * e,
            reads_per_epoch: blocks,
            read_bytes: w.bytes as f64 / blocks.max(1.0),
            bound: if seq_cpu > io { "cpu" } else { bound }.into(),
            memory_bytes: 0,
            scratch_bytes: 0,
            unfit: None,
        });
        out
    }
}

/// The mode `auto` runs and why: the faster of the two that fit.
fn choose(
    lirs: &Candidate,
    two: &Candidate,
    dev: &DeviceModel,
    epochs: u64,
) -> Result<(Choice, String)> {
    Ok(match (&lirs.unfit, &two.unfit) {
        (None, None) => {
            let (win, lose, choice) = if two.total_s < lirs.total_s {
                (two, lirs, Choice::TwoPass)
            } else {
                (lirs, two, Choice::Lirs)
            };
            let why = format!(
                "{} is predicted to take {:.2} s for {} epoch(s) against {:.2} s for {} ({:.1}x); \
                 lirs is bound by {} ({:.0} reads/epoch of about {}), two-pass by {} \
                 (sequential read {}/s, write {}/s)",
                win.mode,
                win.total_s,
                epochs,
                lose.total_s,
                lose.mode,
                lose.total_s / win.total_s.max(1e-9),
                lirs.bound,
                lirs.reads_per_epoch,
                crate::size::human_bytes(lirs.read_bytes),
                two.bound,
                crate::size::human_bytes(dev.seq_read_bps),
                crate::size::human_bytes(dev.seq_write_bps),
            );
            (choice, why)
        }
        (None, Some(why)) => (Choice::Lirs, format!("two-pass cannot run: {why}")),
        (Some(why), None) => (Choice::TwoPass, format!("lirs cannot run: {why}")),
        (Some(a), Some(b)) => {
            return Err(crate::Error::OverBudget(format!(
                "neither mode fits: lirs: {a}; two-pass: {b}"
            )))
        }
    })
}

/// What page grouping would gain over record grouping, in words.
fn page_gain(candidates: &[Candidate]) -> String {
    let best = |g: &str| {
        candidates
            .iter()
            .filter(|c| c.contract && c.grouping == g && c.unfit.is_none())
            .map(|c| c.total_s)
            .fold(f64::INFINITY, f64::min)
    };
    let (rec, page) = (
        best("record"),
        best(&grouping_name(Grouping::Page { unit: 4096 })),
    );
    if page.is_finite() && rec.is_finite() && page < rec * 0.9 {
        format!(
            "page grouping (--grouping page, 4 KiB units) is predicted at {page:.2} s \
             instead of {rec:.2} s ({:.1}x faster); records that start in one 4 KiB block \
             then stay together in a batch",
            rec / page
        )
    } else {
        "page grouping would not be faster here: the best record-grouped mode is already \
         near the device's sequential bound"
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(iops4k: f64, seq: f64) -> DeviceModel {
        DeviceModel {
            seq_read_bps: seq,
            seq_write_bps: seq,
            random: vec![
                (4096, 1, iops4k / 5.0),
                (4096, 64, iops4k),
                (65536, 64, iops4k / 4.0),
                (1 << 20, 8, seq / (1 << 20) as f64),
            ],
            emulated: None,
            shared_rw: true,
        }
    }

    #[test]
    fn iops_interpolates_by_size_and_queue_depth() {
        let d = dev(80_000.0, 3e9);
        assert_eq!(d.iops(512, 64), 80_000.0);
        assert_eq!(d.iops(4096, 1), 16_000.0);
        assert_eq!(
            d.iops(4096, 256),
            80_000.0,
            "beyond the deepest queue measured"
        );
        // Between QD 1 (16k) and QD 64 (80k), log-interpolated: QD 8 is half way.
        let q8 = d.iops(4096, 8);
        assert!((q8 - (16_000.0f64 * 80_000.0).sqrt()).abs() < 1.0, "{q8}");
        let mid = d.iops(16384, 64);
        assert!(mid < 80_000.0 && mid > 20_000.0, "{mid}");
        // Beyond the largest block: the bandwidth stays.
        let big = d.iops(4 << 20, 8);
        assert!((big * (4 << 20) as f64 - 3e9).abs() < 1e6, "{big}");
    }

    #[test]
    fn small_random_reads_lose_to_sequential_passes_on_a_slow_disk() {
        let w = Workload {
            records: 1_000_000,
            bytes: 512_000_000,
            max_record: 512,
            batch: 256,
            epochs: 3,
            memory: None,
            scratch_free: None,
            queue_depth: 64,
            align: 512,
        };
        let hdd = dev(600.0, 150e6);
        let (lirs, ..) = lirs_epoch(&hdd, &w, 1e6);
        let (first, rolling, _, _) = two_pass_epochs(&hdd, &w, 1e6);
        assert!(lirs > 100.0 * rolling, "lirs {lirs} two-pass {rolling}");
        assert!(first > rolling);
        // On a fast device, 256 KiB records are as cheap to read at random as in order.
        let w = Workload {
            records: 4000,
            bytes: 4000 << 18,
            max_record: 1 << 18,
            ..w
        };
        let nvme = dev(500_000.0, 3e9);
        let (lirs, _, _, bound) = lirs_epoch(&nvme, &w, 4000.0);
        let (_, rolling, _, _) = two_pass_epochs(&nvme, &w, 4000.0);
        assert!(lirs < rolling, "lirs {lirs} two-pass {rolling} ({bound})");
    }
}
