//! The shuffle-buffer baseline's memory: the held records, the sequential reads, the
//! padding records and the batches.

use super::{Demand, Figures, Kind};
use crate::io::footprint;
use crate::size::human_bytes;
use crate::{Error, Result};

/// Sequential reads in flight (the shuffle buffer's and the two-pass scatter's).
pub const SCAN_DEPTH: usize = 4;

/// Dataset files the two-pass scatter keeps open: it reads them in order, so its reads in
/// flight and the next file's open are all it needs (16 made a two-pass of a tree of 20
/// files refused under `ulimit -n 40`).
pub const SCATTER_FILES: usize = SCAN_DEPTH + 1;

/// Memory of one buffer slot besides its record's bytes: the byte vector's header and the
/// record's id.
pub const SLOT_OVERHEAD: u64 = (std::mem::size_of::<Vec<u8>>() + std::mem::size_of::<u64>()) as u64;

/// How a shuffle-buffer read spends memory, decided before reading.
#[derive(Clone, Copy, Debug)]
pub struct BufferPlan {
    /// Records the buffer holds (its capacity, at most the dataset).
    pub held: u64,
    /// Expected bytes of the held records (`held` x the mean record size).
    pub record_bytes: u64,
    /// Size of one sequential read.
    pub scan_size: usize,
    /// Bytes of the sequential reader's slab.
    pub slab_bytes: u64,
    /// Bytes of the records kept to pad the epoch's last round of batches.
    pub pad_bytes: u64,
    /// Bytes one batch takes.
    pub batch_bytes: u64,
    /// Batches in the channel (the one being filled comes on top).
    pub prefetch: usize,
    /// Under `--memory`: the bytes of slots above which oversized ones shrink to their
    /// record when it is replaced.
    pub slot_budget: Option<u64>,
}

impl BufferPlan {
    /// The plan of a buffer of `size` records that keeps `pad_records` records to pad the
    /// last round of batches, or the error naming what does not fit the budget.
    pub fn new(d: &Demand, size: u64, pad_records: u64) -> Result<BufferPlan> {
        if d.records == 0 {
            return Err(Error::Invalid("the dataset has no records".into()));
        }
        let n = d.records;
        let mean = d.bytes as f64 / n as f64;
        let held = size.clamp(1, n);
        let record_bytes = (held as f64 * mean).ceil() as u64;
        // Four large reads in flight, or small enough under a tight budget that the slab
        // stays below the huge-page threshold (as the two-pass scatter does).
        let scan_size: usize = match d.memory {
            Some(m) if m < (256 << 20) => 48 << 10,
            _ => 4 << 20,
        };
        let slab_bytes = footprint(scan_size * SCAN_DEPTH) as u64;
        let pad_bytes = (pad_records as f64 * (mean + SLOT_OVERHEAD as f64)).ceil() as u64;
        let batch_bytes = d.batch_bytes();
        let fixed = d
            .index_bytes
            .saturating_add(slab_bytes)
            .saturating_add(record_bytes)
            .saturating_add(held.saturating_mul(SLOT_OVERHEAD))
            .saturating_add(pad_bytes);
        let mut prefetch = d.prefetch.max(1);
        let mut slot_budget = None;
        if let Some(limit) = d.memory {
            // One batch being filled plus the channel.
            let fit = (limit.saturating_sub(fixed) / batch_bytes.max(1)).saturating_sub(1);
            if fit == 0 {
                return Err(Error::OverBudget(format!(
                    "{} is too small for a shuffle buffer of {held} records: the buffer \
                     ({record_bytes} B of records averaging {mean:.0} B, {} B of slots), the sequential \
                     reads ({slab_bytes} B), the offset index ({} B){} and two batches ({} B) need {} bytes; \
                     lower --buffer or raise --memory",
                    d.budget_words(),
                    held * SLOT_OVERHEAD,
                    d.index_bytes,
                    if pad_bytes > 0 {
                        format!(", the padding records ({pad_bytes} B)")
                    } else {
                        String::new()
                    },
                    2 * batch_bytes,
                    fixed.saturating_add(2 * batch_bytes)
                )));
            }
            prefetch = prefetch.min(usize::try_from(fit).unwrap_or(usize::MAX));
            // Slots are shrunk only when a record is replaced, so the slots can run over
            // their budget by a few records before they come back under it: aim below.
            let room = limit - (fixed - record_bytes) - (prefetch as u64 + 1) * batch_bytes;
            let headroom = d.max_record.saturating_mul(8);
            slot_budget = Some(room.saturating_sub(headroom).max(record_bytes));
        }
        Ok(BufferPlan {
            held,
            record_bytes,
            scan_size,
            slab_bytes,
            pad_bytes,
            batch_bytes,
            prefetch,
            slot_budget,
        })
    }

    /// Every figure of the plan, with its reason.
    pub(super) fn figures(&self, d: &Demand) -> Figures {
        let mut f = Figures(Vec::new());
        f.offset_index(d);
        f.push(
            "scan_reads",
            Kind::Memory,
            self.slab_bytes,
            format!(
                "{SCAN_DEPTH} sequential reads of {} in flight",
                human_bytes(self.scan_size as f64)
            ),
        );
        f.push(
            "buffer",
            Kind::Memory,
            self.record_bytes + self.held * SLOT_OVERHEAD,
            format!(
                "{} held records of {} on average, and {SLOT_OVERHEAD} bytes a slot",
                self.held,
                human_bytes(d.bytes as f64 / d.records.max(1) as f64)
            ),
        );
        f.push(
            "padding_records",
            Kind::Memory,
            self.pad_bytes,
            "records kept to pad the last round of batches (--pad)".into(),
        );
        f.read_ahead(self.prefetch, self.batch_bytes);
        f.push(
            "queue_depth",
            Kind::Count,
            SCAN_DEPTH as u64,
            "sequential reads in flight".into(),
        );
        f.push(
            "io_slots",
            Kind::Count,
            SCAN_DEPTH as u64,
            "one slot per read in flight".into(),
        );
        f.push(
            "open_files",
            Kind::Count,
            1,
            "the files are read one after another, one open at a time".into(),
        );
        f
    }
}
