//! The shuffle-buffer baseline (tf.data's `shuffle(N)` over a sequential read): the
//! dataset is read in file order with large sequential reads, `N` records (ids and bytes)
//! are held in memory, and records leave the buffer in a seeded random order.
//!
//! The steps, per epoch: fill the buffer with the first `N` records; then, for every next
//! record, emit the record of a random slot and put the new record in that slot; at the
//! end, emit what is left, each time a random slot removed with `swap_remove`. The random
//! generator is a `SmallRng` seeded with the epoch key of `u64::MAX`, so the order depends
//! only on (seed, epoch, N, records). Batches, ranks, tails and resume are cut from that
//! sequence by the shared [`Emitter`]: a resumed or non-zero rank still reads and buffers
//! the epoch from its start (the buffer's contents depend on everything before), it just
//! does not send the batches that are not its own.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use super::emit::Emitter;
use super::{Batch, BatchStream, Latency, ReadOptions, ReadReport};
use crate::dataset::{Dataset, DatasetFile};
use crate::format::Format;
use crate::io::{BackendKind, DataFile, IoConfig, ScanReport};
use crate::order::EpochKey;
use crate::pipeline::Stop;
use crate::{Error, Result};

use crate::resources::{BufferPlan, Limits, SCAN_DEPTH, SLOT_OVERHEAD};

/// Reads `opts.epochs` epochs of `ds` through a shuffle buffer of `size` records.
pub(crate) fn read(ds: Arc<Dataset>, opts: ReadOptions, size: u64) -> Result<BatchStream> {
    if ds.is_empty() {
        return Err(Error::Invalid("the dataset has no records".into()));
    }
    let split = opts.check(ds.len())?;
    let units = crate::order::Units::blocks(ds.len(), ds.len());
    let d = super::demand(&ds, &units, &opts);
    let (plan, resources) =
        crate::resources::buffer_plan(&d, size, Emitter::pad_records(&split), &Limits::here(None))?;
    BatchStream::spawn("riffle-buffer", plan.prefetch, move |tx, stop, r| {
        r.resources = Some(resources);
        run(&ds, &opts, &plan, tx, stop, r)
    })
}

/// The buffer: `live` records in `ids[..live]` / `slots[..live]`. Slot vectors are kept
/// (also past `live`, and from epoch to epoch) so a record is copied into memory that is
/// already there rather than into a fresh allocation.
struct ShuffleBuffer {
    ids: Vec<u64>,
    slots: Vec<Vec<u8>>,
    live: usize,
    capacity: usize,
    /// Bytes the slot vectors hold (their capacities), now and at most.
    held: u64,
    peak: u64,
    budget: Option<u64>,
}

impl ShuffleBuffer {
    fn new(capacity: usize, budget: Option<u64>) -> Self {
        ShuffleBuffer {
            ids: vec![0; capacity],
            slots: (0..capacity).map(|_| Vec::new()).collect(),
            live: 0,
            capacity,
            held: 0,
            peak: 0,
            budget,
        }
    }

    /// Takes record `id` of `len` bytes: into the next empty slot while the buffer fills,
    /// else into a random slot whose record is emitted first. Returns the slot, empty and
    /// with room for `len` bytes.
    fn admit(&mut self, id: u64, len: u64, rng: &mut SmallRng, em: &mut Emitter<'_>) -> usize {
        let j = if self.live < self.capacity {
            self.live += 1;
            self.live - 1
        } else {
            let j = rng.random_range(0..self.live);
            em.push(self.ids[j], &self.slots[j]);
            j
        };
        self.ids[j] = id;
        let slot = &mut self.slots[j];
        let before = slot.capacity() as u64;
        slot.clear();
        // Slots grow to the largest record they have held; under a budget, a slot larger
        // than its new record gives the excess back once the slots are over it.
        if self.budget.is_some_and(|b| self.held > b) && before > len {
            slot.shrink_to(len as usize);
        }
        slot.reserve_exact(len as usize);
        self.held = self.held - before + slot.capacity() as u64;
        self.peak = self.peak.max(self.held);
        j
    }

    /// Emits every record left, in the buffer's random order.
    fn drain(&mut self, rng: &mut SmallRng, em: &mut Emitter<'_>) {
        while self.live > 0 {
            let j = rng.random_range(0..self.live);
            let last = self.live - 1;
            // `swap_remove(j)`: the last record takes slot j; the emitted one's vector
            // stays behind for reuse.
            self.ids.swap(j, last);
            self.slots.swap(j, last);
            self.live = last;
            em.push(self.ids[last], &self.slots[last]);
        }
    }
}

/// The reason a scan callback stops early: the run is stopping (its consumer has gone).
fn consumer_gone() -> Error {
    Error::Cancelled {
        reason: "the consumer stopped reading",
    }
}

fn run(
    ds: &Dataset,
    opts: &ReadOptions,
    plan: &BufferPlan,
    tx: &Sender<Result<Batch>>,
    stop: &Stop,
    r: &mut ReadReport,
) -> Result<()> {
    let started = Instant::now();
    let scan = IoConfig {
        depth: SCAN_DEPTH,
        slot_size: plan.scan_size,
        ..opts.io.clone()
    };
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("histogram");
    r.mode = "buffer".into();
    r.grouping = "record".into();
    r.queue_depth = SCAN_DEPTH;
    r.records_per_unit = 1.0;
    let account = |r: &mut ReadReport, slot_bytes: u64| {
        r.index_bytes = ds.index_bytes();
        r.buffer_bytes = plan.slab_bytes
            + slot_bytes.max(plan.record_bytes)
            + plan.held * SLOT_OVERHEAD
            + plan.pad_bytes;
        r.prefetch_bytes = (plan.prefetch as u64 + 1) * plan.batch_bytes;
        r.memory_bytes = r.index_bytes + r.buffer_bytes + r.prefetch_bytes;
    };
    account(r, 0);
    let mean = ds.size_stats().total as f64 / ds.len() as f64;
    let mut buf = ShuffleBuffer::new(plan.held as usize, plan.slot_budget);
    let mut scans = ScanTotals {
        read_ops: 0,
        device_bytes: 0,
        backend: None,
        direct: true,
    };
    for epoch in opts.epoch_range()? {
        let epoch_started = Instant::now();
        let key = EpochKey::new(opts.seed, epoch);
        let mut rng = SmallRng::seed_from_u64(key.key(u64::MAX));
        let split = opts.split_for(epoch, ds.len())?;
        let first_batch = match opts.resume {
            Some(c) if c.epoch == epoch => c.batch,
            _ => 0,
        };
        let mut em = Emitter::new(
            split,
            first_batch,
            epoch,
            mean,
            tx,
            stop,
            &mut hist,
            &mut *r,
        )
        .lend_from(opts.lender.clone(), ds.size_stats().max)
        .described(ds)
        .shared(opts.ranks.clone())
        .timed(started);
        if fill_epoch(ds, &scan, &mut buf, &mut rng, &mut em, stop, &mut scans)? {
            break;
        }
        buf.drain(&mut rng, &mut em);
        em.finish();
        if em.stopped {
            break;
        }
        drop(em);
        r.epoch_seconds.push(epoch_started.elapsed().as_secs_f64());
    }
    if let Some(b) = scans.backend {
        r.backend = b.name().into();
    }
    account(r, buf.peak);
    r.direct = scans.direct;
    r.read_ops = scans.read_ops;
    r.device_bytes = scans.device_bytes;
    r.units_per_batch = scans.read_ops as f64 / r.batches.max(1) as f64;
    r.seconds = started.elapsed().as_secs_f64();
    r.batch_latency_us = Latency::of(&hist);
    Ok(())
}

/// What the run's scans did, for its report.
struct ScanTotals {
    read_ops: u64,
    device_bytes: u64,
    backend: Option<BackendKind>,
    /// Each file is opened when its turn comes (one open at a time, whatever the count);
    /// the report says direct only if every one was.
    direct: bool,
}

/// Puts an epoch's records through the buffer, file by file in order, counting the scans
/// in `scans`. Returns whether the run stopped part-way.
fn fill_epoch(
    ds: &Dataset,
    scan: &IoConfig,
    buf: &mut ShuffleBuffer,
    rng: &mut SmallRng,
    em: &mut Emitter<'_>,
    stop: &Stop,
    scans: &mut ScanTotals,
) -> Result<bool> {
    let format = ds.format();
    let mut first_id = 0u64;
    for (i, f) in ds.files().iter().enumerate() {
        let file = &ds.open_one(i, scan.direct)?;
        scans.direct &= file.direct();
        let filled = fill_from_file(buf, rng, em, file, f, first_id, scan, format, stop)?;
        match filled {
            Filled::Whole(s) => {
                scans.read_ops += s.read_ops;
                scans.device_bytes += s.device_bytes;
                scans.backend.get_or_insert(s.backend);
            }
            Filled::Stopped { delivered } => {
                scans.device_bytes += delivered;
                return Ok(true);
            }
        }
        first_id += f.records;
    }
    Ok(false)
}

/// What filling the buffer from one file came to.
enum Filled {
    /// The file was read whole: the scan's counts.
    Whole(ScanReport),
    /// The run stopped part-way through the file, whose scan had delivered these bytes.
    Stopped { delivered: u64 },
}

/// Puts the records of `file` (ids from `first_id` on, laid out as `f` says) through the
/// buffer as the scan delivers them: each is admitted (emitting a random one once the
/// buffer is full) when its first byte arrives, and its bytes copied into its slot.
#[allow(clippy::too_many_arguments)]
fn fill_from_file(
    buf: &mut ShuffleBuffer,
    rng: &mut SmallRng,
    em: &mut Emitter<'_>,
    file: &Arc<DataFile>,
    f: &DatasetFile,
    first_id: u64,
    scan: &IoConfig,
    format: &Format,
    stop: &Stop,
) -> Result<Filled> {
    let end_id = first_id + f.records;
    let mut next = first_id;
    // The record being copied in: its slot and its byte range in the file.
    let mut current: Option<(usize, u64, u64)> = None;
    // What this file's scan delivered, for the report of a scan cut short.
    let mut delivered = 0u64;
    let scanned = crate::io::scan_file(file, scan, |off, bytes| {
        let chunk_end = off + bytes.len() as u64;
        delivered += bytes.len() as u64;
        loop {
            let (slot, start, end) = match current {
                Some(c) => c,
                None => {
                    if next == end_id {
                        break;
                    }
                    let span = f.span(format, next - first_id);
                    // A record starting in a later chunk waits for it (an empty
                    // one at this chunk's end is taken now).
                    if span.offset + (span.len > 0) as u64 > chunk_end {
                        break;
                    }
                    let slot = buf.admit(next, span.len, rng, em);
                    next += 1;
                    (slot, span.offset, span.offset + span.len)
                }
            };
            let (from, to) = (start.max(off), end.min(chunk_end));
            if to > from {
                buf.slots[slot]
                    .extend_from_slice(&bytes[(from - off) as usize..(to - off) as usize]);
            }
            if end > chunk_end {
                current = Some((slot, start, end));
                break;
            }
            current = None;
        }
        // Per chunk: while the buffer fills no batch is sent, so the emitter alone
        // would not notice a stop until the buffer is full.
        if em.stopped || stop.is_set() {
            em.stopped = true;
            return Err(consumer_gone());
        }
        Ok(())
    });
    let s = match scanned {
        Ok(s) => s,
        Err(_) if em.stopped => return Ok(Filled::Stopped { delivered }),
        Err(e) => return Err(e),
    };
    // Only empty records may lie at the very end of a file (an empty file yields
    // no chunk at all).
    while current.is_none() && next < end_id {
        let span = f.span(format, next - first_id);
        if span.len > 0 {
            break;
        }
        buf.admit(next, 0, rng, em);
        next += 1;
    }
    if current.is_some() || next < end_id {
        return Err(Error::BadInput {
            path: f.path.clone(),
            offset: Some(file.size()),
            what: format!(
                "the file ended inside record {} of {}; was it changed while being read?",
                next - first_id,
                f.records
            ),
        });
    }
    Ok(Filled::Whole(s))
}

#[cfg(test)]
mod tests;
