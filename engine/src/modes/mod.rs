//! Modes deliver the batches of the order contract. `lirs` reads every record (or every
//! page-group) straight from the device in the epoch's order; `twopass` gives the same
//! batches from sequential reads through scratch piles; `buffer` is the shuffle-buffer
//! baseline, streamed sequentially. `emit` cuts batches from a mode's record sequence.

mod buffer;
mod cursor;
mod emit;
pub mod lirs;
mod mode;
pub mod partial;
mod payload;
pub mod resident;
mod share;
pub mod twopass;
mod walk;

use serde::Serialize;

pub use cursor::{Cursor, Resume};
pub use lirs::{read, BatchStream};
pub use mode::Mode;
pub use partial::read_partly_resident;
pub use payload::{Lender, Lent, Payload, PayloadLender, Viewed};
pub use resident::{piled_rest_scratch, read_held, read_resident, read_resident_in, Held};
pub use share::{Joining, PassEnded, Ranks, Refused, SharedPass, StartPass};
pub use twopass::{
    prefix_needs, read_prefix_piled, read_two_pass, HeldPrefix, KeepRolled, Roll, RolledPiles,
};

use crate::dataset::Dataset;
use crate::io::IoConfig;
use crate::order::{Grouping, Split, Tail, Units};

/// The baselines: orders other than the contract's, for research comparisons. Each is
/// deterministic (seed, epoch) and an exact permutation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Baseline {
    /// File order, no shuffle.
    Sequential,
    /// Blocks of `block` consecutive records; only the block order is shuffled per epoch.
    Bmf {
        /// Records per block.
        block: u64,
    },
    /// A shuffle buffer of `size` records over a sequential read (tf.data style).
    Buffer {
        /// Buffer capacity in records.
        size: u64,
    },
}

impl Baseline {
    /// The mode name: `sequential`, `bmf`, `buffer`.
    pub fn name(&self) -> &'static str {
        self.mode().name()
    }
}

/// The most batches a stream reads ahead of its consumer: memory for them is planned up
/// front, so the bound keeps that arithmetic (and the channel holding them) finite.
pub const MAX_PREFETCH: usize = 1 << 16;

/// What to read.
#[derive(Clone, Debug)]
pub struct ReadOptions {
    /// Seed of the order.
    pub seed: u64,
    /// First epoch.
    pub first_epoch: u64,
    /// Number of epochs.
    pub epochs: u64,
    /// Records per batch.
    pub batch: u64,
    /// This stream: a rank, or one of a rank's DataLoader workers (see `workers`).
    pub rank: u64,
    /// Streams in all: ranks x workers.
    pub world: u64,
    /// Streams of each rank (DataLoader workers that split the rank's batches): stream
    /// `s` is worker `s / (world / workers)` of rank `s % (world / workers)`, and the tail
    /// rule is applied over the ranks only (see [`Split`]).
    pub workers: u64,
    /// Tail policy.
    pub tail: Tail,
    /// Grouping.
    pub grouping: Grouping,
    /// Start here instead of at batch 0 of `first_epoch`.
    pub resume: Option<Cursor>,
    /// Positions of the resume epoch's sequence consumed by all ranks together before this
    /// read (a global cursor taken under another world or batch size, `E+R`): that epoch is
    /// then split from there ([`Split::resumed`]) and `resume` is its batch 0.
    pub resume_start: Option<u64>,
    /// I/O (queue depth = `io.depth`).
    pub io: IoConfig,
    /// Batches read ahead of the consumer (at most [`MAX_PREFETCH`]).
    pub prefetch: usize,
    /// Hard ceiling on engine-owned memory (tables, buffers, read-ahead), if any.
    pub memory: Option<u64>,
    /// Read a baseline's order instead of the contract's (through [`read`]: the LIRS
    /// reader, or the streaming shuffle buffer for [`Baseline::Buffer`]).
    pub baseline: Option<Baseline>,
    /// Memory to assemble batches in, lent by the consumer (the daemon's shared ring);
    /// the engine's own when `None` or when the lender has no room.
    pub lender: Option<PayloadLender>,
    /// Every rank's batches, not only `rank`'s, for a pass shared by the ranks that joined
    /// `ranks` (see [`SharedPass`]): batches come in global order, each `index` a global
    /// batch, and a batch of a rank not in the set is skipped (not read, not sent).
    pub ranks: Option<std::sync::Arc<Ranks>>,
    /// Two-pass: read the first epoch's first batches with LIRS while the scatter runs, and
    /// hand over to the pile pass where LIRS stopped (the same batches either way; the
    /// first one in about LIRS's time instead of after the whole scatter). Off for a
    /// device that seeks, where random reads would slow the scatter more than they give.
    pub lead: bool,
    /// The most dataset files the read's random reader keeps open (a daemon's share of
    /// its open-file budget; at least the queue depth plus one); `None`: the process's
    /// share ([`crate::dataset::open_file_cap`]).
    pub open_files: Option<usize>,
    /// Two-pass over local files: piles rolled by an earlier read for the first epoch (no
    /// scatter), and where the piles rolled past the last epoch go (a daemon keeps them
    /// for the job's next pass). See [`twopass::Roll`].
    pub roll: Option<std::sync::Arc<twopass::Roll>>,
}

impl ReadOptions {
    /// The epochs to read: from the resume cursor's epoch (which must be one of them) or
    /// the first epoch, to the end.
    pub(crate) fn epoch_range(&self) -> crate::Result<std::ops::Range<u64>> {
        let mut epochs = epochs_from(self.first_epoch, self.epochs)?;
        if let Some(c) = self.resume {
            if !epochs.contains(&c.epoch) {
                return Err(crate::Error::Invalid(format!(
                    "resume cursor {}:{} is outside the epochs {}..{}",
                    c.epoch, c.batch, epochs.start, epochs.end
                )));
            }
            epochs.start = c.epoch;
        }
        Ok(epochs)
    }

    /// Checks the options against a dataset of `records` before anything is read: the
    /// read-ahead, the split of batches over ranks, the epochs, and the resume cursor (in
    /// those epochs, not past the end of its own). Returns the split.
    pub(crate) fn check(&self, records: u64) -> crate::Result<Split> {
        if self.prefetch > MAX_PREFETCH {
            return Err(crate::Error::Invalid(format!(
                "a read-ahead of {} batches is more than the {MAX_PREFETCH} a stream may hold",
                self.prefetch
            )));
        }
        let split = self.split(records)?;
        self.epoch_range()?;
        if let Some(c) = self.resume {
            c.check(&self.split_for(c.epoch, records)?)?;
        }
        Ok(split)
    }

    /// The split of epoch `epoch`: `ReadOptions::split`, or, for the epoch a global
    /// cursor resumes inside a round of batches, what remains of it from there.
    pub fn split_for(&self, epoch: u64, records: u64) -> crate::Result<Split> {
        match (self.resume, self.resume_start) {
            (Some(c), Some(start)) if c.epoch == epoch && start > 0 => {
                self.split_from(records, start)
            }
            _ => self.split(records),
        }
    }

    /// The batches of an epoch of `records` this read delivers: its rank's, or with
    /// [`ReadOptions::ranks`] every rank's (a view with one rank of the same global batches).
    pub(crate) fn split(&self, records: u64) -> crate::Result<Split> {
        self.split_from(records, 0)
    }

    /// As [`ReadOptions::split`], for what remains of the epoch from global position `start`.
    fn split_from(&self, records: u64, start: u64) -> crate::Result<Split> {
        let split = Split::streams(
            records,
            self.batch,
            self.rank,
            self.world,
            self.workers,
            self.tail,
            start,
        )?;
        Ok(match self.ranks {
            Some(_) => split.all_ranks(),
            None => split,
        })
    }

    /// Whether global batch `g` of `epoch` is read: always, unless the read is shared and
    /// the batch's rank is not in it (see [`Ranks`]).
    pub(crate) fn wanted(&self, epoch: u64, g: u64) -> bool {
        self.ranks.as_ref().is_none_or(|r| r.wanted(epoch, g))
    }

    /// One epoch of `batch`-record batches, seed 0, one rank, record grouping.
    pub fn new(batch: u64) -> Self {
        ReadOptions {
            seed: 0,
            first_epoch: 0,
            epochs: 1,
            batch,
            rank: 0,
            world: 1,
            workers: 1,
            tail: Tail::Partial,
            grouping: Grouping::Record,
            resume: None,
            resume_start: None,
            io: IoConfig::default(),
            prefetch: 4,
            memory: None,
            baseline: None,
            lender: None,
            ranks: None,
            lead: true,
            open_files: None,
            roll: None,
        }
    }

    /// The same options reading `count` epochs from epoch `first`.
    pub fn with_epochs(self, first: u64, count: u64) -> Self {
        ReadOptions {
            first_epoch: first,
            epochs: count,
            ..self
        }
    }

    /// The same options for rank `rank` of `world`, the last round of batches cut by
    /// `tail`.
    pub fn with_rank(self, rank: u64, world: u64, tail: Tail) -> Self {
        ReadOptions {
            rank,
            world,
            tail,
            ..self
        }
    }

    /// The same options starting at `resume` (see [`ReadOptions::resume_start`] for
    /// `start`).
    pub fn with_resume(self, resume: Option<Cursor>, start: Option<u64>) -> Self {
        ReadOptions {
            resume,
            resume_start: start,
            ..self
        }
    }
}

/// The epochs `first..first + count`, refused when the last one is not a u64 (a range
/// that wrapped would silently read nothing).
pub fn epochs_from(first: u64, count: u64) -> crate::Result<std::ops::Range<u64>> {
    match first.checked_add(count) {
        Some(end) => Ok(first..end),
        None => Err(crate::Error::Invalid(format!(
            "epoch {first} and {count} epochs after it run past the last epoch number \
             (epoch + epochs must be at most {})",
            u64::MAX
        ))),
    }
}

/// One batch.
#[derive(Clone, Debug)]
pub struct Batch {
    /// Its epoch.
    pub epoch: u64,
    /// Its index among this rank's batches of the epoch.
    pub index: u64,
    /// Global record ids in delivery order.
    pub ids: Vec<u64>,
    /// `ids.len() + 1` offsets into `payload`: record i is `payload[offsets[i]..offsets[i+1]]`.
    pub offsets: Vec<u64>,
    /// The records' bytes, back to back (perhaps in memory the consumer lent).
    pub payload: Payload,
    /// How many records at the end are padding (repeated from the epoch's start).
    pub padding: usize,
    /// Each record's label, when the dataset has labels
    /// ([`Dataset::labels`](crate::dataset::Dataset::labels): a `files` tree of class
    /// directories); empty otherwise. A function of `ids`.
    pub labels: Vec<u32>,
    /// Each record's source, in a mixture (a view of datasets side by side: the part of
    /// each record, [`crate::dataset::Dataset::part_of`]); empty otherwise.
    pub sources: Vec<u32>,
    /// When the engine completed it ([`monotonic_ns`]): latency is measured from here.
    /// Not part of the batch's identity (equality ignores it).
    pub ready_ns: u64,
}

impl Batch {
    /// Fills in what `ds` says of the batch's records: labels (a labelled dataset), and for
    /// a view (a mixture's epoch), each record's id among the files' and its part.
    pub(crate) fn describe(&mut self, ds: &crate::dataset::Dataset) {
        if let Some(t) = ds.labels() {
            self.labels = self.ids.iter().map(|&id| t[id as usize]).collect();
        }
        if ds.is_view() {
            for id in self.ids.iter_mut() {
                *id = ds.drawn(*id);
            }
        }
        if ds.parts().is_some() {
            self.sources = (self.ids.iter())
                .map(|&id| ds.part_of(id).unwrap_or(0) as u32)
                .collect();
        }
    }
}

impl PartialEq for Batch {
    fn eq(&self, o: &Batch) -> bool {
        (self.epoch, self.index, self.padding) == (o.epoch, o.index, o.padding)
            && self.ids == o.ids
            && self.offsets == o.offsets
            && self.payload == o.payload
    }
}

impl Eq for Batch {}

/// CLOCK_MONOTONIC in nanoseconds (what Python's `time.monotonic_ns()` reads): the clock
/// of [`Batch::ready_ns`].
pub fn monotonic_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64,
        Err(_) => 0,
    }
}

impl Batch {
    /// The bytes of record `i` of the batch.
    pub fn record(&self, i: usize) -> &[u8] {
        self.payload.record(i, &self.offsets)
    }

    /// The cursor that resumes right after this batch.
    pub fn next_cursor(&self) -> Cursor {
        Cursor {
            epoch: self.epoch,
            batch: self.index + 1,
        }
    }
}

/// What a read did, for reports.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReadReport {
    /// The mode that ran.
    pub mode: String,
    /// `record` or `page`.
    pub grouping: String,
    /// Records delivered (padding included).
    pub records: u64,
    /// Batches delivered.
    pub batches: u64,
    /// Payload bytes delivered.
    pub bytes: u64,
    /// Read requests completed.
    pub read_ops: u64,
    /// Bytes the device transferred.
    pub device_bytes: u64,
    /// Seconds from start to the last batch.
    pub seconds: f64,
    /// Seconds from start to the first batch (DLIO's T_pre: tables, a scatter when
    /// nothing leads it).
    pub first_batch_seconds: f64,
    /// Two-pass: batches of the first epoch read by a LIRS lead while the scatter ran.
    pub lead_batches: u64,
    /// Batch latency from its first read to its completion: p50, p99, max (microseconds).
    pub batch_latency_us: Latency,
    /// Bytes of the epoch tables.
    pub table_bytes: u64,
    /// Two-pass: bytes of the piles held in memory (two loaded at a time).
    pub pile_bytes: u64,
    /// The resource plan the run was sized by: every figure and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<crate::resources::ResourcePlan>,
    /// Bytes of the unit table (page grouping).
    pub units_bytes: u64,
    /// Bytes of the offset indexes.
    pub index_bytes: u64,
    /// Bytes of I/O buffers.
    pub buffer_bytes: u64,
    /// Bytes of batches allowed in the read-ahead queue and under assembly.
    pub prefetch_bytes: u64,
    /// Resident mode: bytes of the dataset held in memory across epochs.
    pub resident_bytes: u64,
    /// Sum of the above: engine-owned memory.
    pub memory_bytes: u64,
    /// Mean records per shuffling unit.
    pub records_per_unit: f64,
    /// Mean reads per batch: with page grouping, the units (or parts of units) per batch.
    pub units_per_batch: f64,
    /// Seconds spent building epoch tables.
    pub table_seconds: f64,
    /// `io_uring` or `pread`.
    pub backend: String,
    /// The backend's features as it got them (registered buffers and files, ring flags,
    /// how requests are submitted); empty where a mode does not say.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub io_features: String,
    /// How the random reads were submitted and why (LIRS: chosen per device, see
    /// `probe::submit_choice`); empty where a mode does not say.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub io_submit: String,
    /// Whether reads bypassed the page cache.
    pub direct: bool,
    /// Queue depth.
    pub queue_depth: usize,
    /// Two-pass: piles per epoch.
    pub piles: u64,
    /// Two-pass: pile loads (more than piles when a pile had to be read in key ranges).
    pub pile_loads: u64,
    /// Two-pass: bytes written to scratch piles.
    pub scratch_bytes: u64,
    /// Seconds each epoch took (two-pass: the first includes the scatter).
    pub epoch_seconds: Vec<f64>,
    /// A dataset streamed from object storage: the local disk the read may use
    /// (`--cache-limit`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_limit: Option<u64>,
    /// A streamed dataset: the most local disk charged at once (piles, and objects fetched
    /// alone to be indexed), never above `cache_limit`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_local_bytes: Option<u64>,
    /// A streamed dataset: rounds per epoch (the most of any epoch), each a sequential
    /// read of the node's objects scattering one key range of its piles
    /// (`twopass::rounds`); 1 when its piles fit `cache_limit` at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rounds: Option<u64>,
    /// A streamed dataset read past its cache limit in one round: the most memory any
    /// epoch held of its piles' lowest key range, which did not fit local disk (its frames
    /// and their index; `twopass::rounds`). It is within `pile_bytes`, which
    /// `memory_bytes` counts: the range is emitted and freed before any pile is loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overflow_in_memory_bytes: Option<u64>,
    /// A streamed dataset: ranged GETs and bytes fetched, per object and epoch.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<crate::dataset::ObjectCount>,
    /// Two-pass: the first epoch's piles were rolled by an earlier read
    /// ([`ReadOptions::roll`]): no scatter, nothing of the dataset read.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub rolled_in: bool,
    /// Two-pass: bytes of the piles rolled past the last epoch and handed on.
    #[serde(skip_serializing_if = "is_zero")]
    pub rolled_out_bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ReadReport {
    /// The memory a read planned by `plan` over `units` of `ds` holds beside `held` (what
    /// the mode keeps of the data itself, resident's files), its reads' buffers taking
    /// `buffer` bytes: each part, and `memory_bytes` their sum.
    fn set_sizes(
        &mut self,
        plan: &crate::resources::LirsPlan,
        units: &Units,
        ds: &Dataset,
        buffer: u64,
        held: u64,
    ) {
        self.table_bytes = plan.table_bytes;
        self.units_bytes = units.bytes();
        self.index_bytes = ds.index_bytes();
        self.buffer_bytes = buffer;
        self.prefetch_bytes = plan.batches_bytes();
        self.memory_bytes = self.table_bytes
            + self.units_bytes
            + self.index_bytes
            + self.buffer_bytes
            + self.prefetch_bytes
            + held;
        self.records_per_unit = units.mean_records();
    }
}

/// Latency percentiles.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Worst.
    pub max: f64,
}

#[cfg(test)]
mod tests;

impl Latency {
    /// The percentiles of a histogram of microseconds.
    pub(crate) fn of(h: &hdrhistogram::Histogram<u64>) -> Latency {
        Latency {
            p50: h.value_at_quantile(0.5) as f64,
            p99: h.value_at_quantile(0.99) as f64,
            max: h.max() as f64,
        }
    }
}

/// What a read of `ds` over `units` with `opts` asks of the machine, for the resource plan.
pub fn demand(ds: &Dataset, units: &Units, opts: &ReadOptions) -> crate::resources::Demand {
    let stats = ds.size_stats();
    // Only page grouping over billions of records can make a unit wider than a two-pass
    // frame counts: look for the widest only then.
    let widest_unit = if ds.len() > crate::resources::MAX_FRAME_RECORDS {
        (0..units.len())
            .map(|u| {
                let r = units.records(u);
                r.end - r.start
            })
            .max()
            .unwrap_or(0)
    } else {
        // No unit can hold more records than the dataset: an upper bound that cannot matter.
        ds.len()
    };
    crate::resources::Demand {
        records: ds.len(),
        bytes: stats.total,
        max_record: stats.max,
        units: units.len(),
        units_bytes: units.bytes(),
        records_per_unit: units.mean_records(),
        widest_unit,
        index_bytes: ds.index_bytes(),
        view_bytes: ds.view_bytes(),
        // A streamed dataset's objects are read over connections, not files: its GETs take
        // what descriptors the run leaves (`remote::fetch::within_descriptors`).
        files: if ds.remote().is_some() {
            0
        } else {
            ds.files().len() as u64
        },
        batch: opts.batch,
        prefetch: opts.prefetch,
        depth: opts.io.depth,
        memory: opts.memory,
        memory_from: crate::resources::MemoryFrom::Flag,
        grouping: opts.grouping,
        runs: opts.baseline.is_some(),
        streamed: ds.remote().is_some(),
    }
}
