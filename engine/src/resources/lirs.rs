//! LIRS's memory: the table, the reader's slots, batches under assembly and read ahead.

use super::{Demand, Figures, Kind, Limits};
use crate::io::footprint;
use crate::order::Grouping;
use crate::size::human_bytes;
use crate::{Error, Result};

/// The longest run of neighbouring records a baseline reads at once.
pub(crate) const MAX_MERGE: u64 = 1 << 20;

/// Alignment slack the slots allow for on each side of a read.
const ALIGN_SLACK: u64 = 4096;

/// How a LIRS read spends memory, decided before reading.
#[derive(Clone, Copy, Debug)]
pub struct LirsPlan {
    /// Bytes per slot: the largest single read.
    pub slot_size: usize,
    /// Batches read ahead of the consumer.
    pub prefetch: usize,
    /// Bytes of the epoch table (or of a lead's prefix).
    pub table_bytes: u64,
    /// Bytes one batch takes (payload, ids and offsets).
    pub batch_bytes: u64,
    /// Batches under assembly at once (reads of about depth / batch + 2 batches in flight).
    pub assembling: u64,
    /// Random reads in flight (`d.depth`: as the plan has it, see `resources::read_depth`).
    pub depth: usize,
}

impl LirsPlan {
    /// The plan of a read whose table holds `entries` units (all of them, or a prefix for a
    /// two-pass lead), or the error naming what does not fit the budget.
    pub fn new(d: &Demand, entries: u64) -> Result<LirsPlan> {
        if d.records == 0 {
            return Err(Error::Invalid("the dataset has no records".into()));
        }
        // The largest single read: a record, or the records starting in one block (which
        // may run into the next block); longer reads are split by the reader.
        let piece = match (d.runs, d.grouping) {
            // Baselines read runs of neighbouring records: large reads.
            (true, _) => MAX_MERGE,
            (false, Grouping::Record) => d.max_record,
            (false, Grouping::Page { unit }) => d
                .max_record
                .max(unit.saturating_add(d.max_record.min(unit))),
        };
        let mut slot_size = piece
            .saturating_add(2 * ALIGN_SLACK)
            .checked_next_power_of_two()
            .unwrap_or(1 << 20)
            .clamp(ALIGN_SLACK, 1 << 20) as usize;
        let table_width = if d.units <= u64::from(u32::MAX) { 4 } else { 8 };
        let table_bytes = entries.saturating_mul(table_width);
        let batch_bytes = d.batch_bytes();
        let depth = d.depth.max(1) as u64;
        // Enough batches under assembly to keep `depth` reads in flight: a batch needs about
        // batch / records-per-unit reads (page grouping reads a unit at once; a baseline's
        // runs of neighbours one read per slot), plus two for the batch being finished and
        // the one being planned.
        let assembling_of = |slot: usize| {
            let reads_per_batch = if d.runs {
                batch_bytes / slot as u64
            } else {
                (d.batch as f64 / d.records_per_unit.max(1e-9)).floor() as u64
            }
            .max(1);
            depth.div_ceil(reads_per_batch) + 2
        };
        let buffers_of = |slot: usize| footprint(slot.saturating_mul(d.depth.max(1))) as u64;
        // A baseline's long reads are split by the reader into slots: under a tight budget
        // its slots (and the batches their reads in flight fill) shrink to half of it, down
        // to 64 KiB, rather than the read being refused (1 MiB slots at QD 64 took 64 MiB of
        // buffers and 66 batches under assembly: 128 MiB was refused).
        if let (Some(limit), true) = (d.memory, d.runs) {
            let need = |slot: usize| {
                buffers_of(slot).saturating_add(assembling_of(slot).saturating_mul(batch_bytes))
            };
            while slot_size > 64 << 10 && need(slot_size) > limit / 2 {
                slot_size /= 2;
            }
        }
        let buffers = buffers_of(slot_size);
        let fixed = table_bytes
            .saturating_add(d.units_bytes)
            .saturating_add(d.index_bytes)
            .saturating_add(d.view_bytes)
            .saturating_add(buffers);
        let mut prefetch = d.prefetch.max(1);
        let assembling = assembling_of(slot_size);
        if let Some(limit) = d.memory {
            // Batches being assembled plus the read-ahead queue.
            let under_assembly = assembling.saturating_mul(batch_bytes);
            let room = limit.saturating_sub(fixed.saturating_add(under_assembly));
            let fit = (room / batch_bytes.max(1)).min(usize::MAX as u64) as usize;
            if fit == 0 {
                return Err(Error::OverBudget(format!(
                    "{} is too small: the table ({table_bytes} B), offset index ({} B), \
                     unit table ({} B), I/O buffers ({buffers} B) and one batch in flight \
                     ({batch_bytes} B) need {} bytes",
                    d.budget_words(),
                    d.index_bytes,
                    d.units_bytes,
                    fixed
                        .saturating_add(under_assembly)
                        .saturating_add(batch_bytes)
                )));
            }
            prefetch = prefetch.min(fit);
        }
        Ok(LirsPlan {
            slot_size,
            prefetch,
            table_bytes,
            batch_bytes,
            assembling,
            depth: d.depth.max(1),
        })
    }

    /// Bytes of the reader's slots at `depth`.
    pub fn buffer_bytes(&self, depth: usize) -> u64 {
        footprint(self.slot_size.saturating_mul(depth.max(1))) as u64
    }

    /// Bytes of batches under assembly and read ahead.
    pub fn batches_bytes(&self) -> u64 {
        (self.prefetch as u64 + self.assembling).saturating_mul(self.batch_bytes)
    }

    /// Every figure of the plan, with its reason.
    pub(super) fn figures(&self, d: &Demand, limits: &Limits) -> Figures {
        let mut f = Figures(Vec::new());
        let depth = d.depth.max(1);
        f.push(
            "table",
            Kind::Memory,
            self.table_bytes,
            format!(
                "{} unit(s) of the epoch table, {} bytes each (ids {} 2^32)",
                d.units,
                if d.units <= u64::from(u32::MAX) { 4 } else { 8 },
                if d.units <= u64::from(u32::MAX) {
                    "below"
                } else {
                    "from"
                }
            ),
        );
        f.unit_table(d);
        f.offset_index(d);
        f.push(
            "io_buffers",
            Kind::Memory,
            self.buffer_bytes(depth),
            format!(
                "{depth} slot(s) of {} (one per read in flight), huge-page rounded",
                human_bytes(self.slot_size as f64)
            ),
        );
        f.push(
            "batches",
            Kind::Memory,
            self.batches_bytes(),
            format!(
                "{} batch(es) under assembly (enough to keep {depth} reads in flight) and {} read \
                 ahead, {} each",
                self.assembling,
                self.prefetch,
                human_bytes(self.batch_bytes as f64)
            ),
        );
        f.push(
            "queue_depth",
            Kind::Count,
            depth as u64,
            format!(
                "random reads in flight, as asked (the backend allows {})",
                limits.max_in_flight
            ),
        );
        f.push(
            "io_slots",
            Kind::Count,
            depth as u64,
            "one slot per read in flight".into(),
        );
        f.push(
            "slot_size",
            Kind::Size,
            self.slot_size as u64,
            if d.runs {
                format!(
                    "a baseline's runs of neighbours, at most {} per read{}",
                    human_bytes(MAX_MERGE as f64),
                    if self.slot_size < MAX_MERGE as usize {
                        " (halved to fit the budget)"
                    } else {
                        ""
                    }
                )
            } else {
                format!(
                    "the longest read ({} record{}) and alignment slack, to a power of two, 1 MiB \
                     at most (longer reads are split)",
                    human_bytes(d.max_record as f64),
                    if matches!(d.grouping, Grouping::Page { .. }) {
                        ", or a block's records"
                    } else {
                        ""
                    }
                )
            },
        );
        f.push(
            "prefetch",
            Kind::Count,
            self.prefetch as u64,
            if self.prefetch < d.prefetch.max(1) {
                format!(
                    "batches read ahead: {} asked, fewer fit the budget",
                    d.prefetch
                )
            } else {
                "batches read ahead, as asked".into()
            },
        );
        f
    }
}
