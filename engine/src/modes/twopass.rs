//! Two-pass mode: the same order as LIRS, realised with sequential I/O and bounded memory
//! (the two-pass external shuffle in the seeds).
//!
//! Scatter: the dataset is read sequentially in large pieces; every shuffling unit goes, as
//! one frame (its key, id, record lengths and bytes), to pile `key >> (64 - bits)`. Piles
//! therefore hold consecutive ranges of keys. Pile pass: each pile is loaded, its frames
//! sorted by key, and their records emitted in that order: concatenated, the piles give the
//! units in global key order, which is exactly the LIRS table's order. Batches and ranks
//! are cut from that sequence the same way.
//!
//! A pile larger than its memory share (unlucky, or the budget was tight) is not loaded
//! whole: it is read again for each of several key sub-ranges, which keeps the order exact
//! and the memory bounded.

use std::cell::RefCell;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;
use hdrhistogram::Histogram;

use super::emit::Emitter;
use super::{Batch, BatchStream, Latency, ReadOptions, ReadReport};
use crate::dataset::Dataset;
use crate::io::{IoConfig, RangeReader};
use crate::order::{EpochKey, Units};
use crate::piles::{frame, Layout, PileBuf, PileReader, PileSet, PileWriter};
use crate::pipeline::Stop;
use crate::{Error, Result};

/// log2 of the most piles one epoch uses.
const MAX_PILE_BITS: u32 = 12;

/// Bytes of a frame besides the record bytes and their lengths: the store's key and length
/// ([`frame::HEAD`]), the unit id and the record count (see [`Body`]). Each record adds its
/// length: 4 bytes, 8 in a wide frame.
const FRAME_HEAD: u64 = (frame::HEAD + BODY_HEAD) as u64;

/// Reads `opts.epochs` epochs of `ds` in two-pass mode, with piles in `scratch`.
pub fn read_two_pass(ds: Arc<Dataset>, opts: ReadOptions, scratch: PathBuf) -> Result<BatchStream> {
    if ds.is_empty() {
        return Err(Error::Invalid("the dataset has no records".into()));
    }
    opts.check(ds.len())?;
    let units = Units::new(&ds.layout(), opts.grouping);
    let (opts, plan) = fitted(&ds, &units, opts)?;
    // One private directory for the run (made in `scratch`, which is made too if it is
    // missing, and removed again), locked while this process lives; each epoch's piles in
    // a directory inside it. It goes when the I/O thread ends, or on SIGINT/SIGTERM.
    let dir = crate::scratch::ScratchDir::new_in(&scratch, "two-pass")?;
    BatchStream::spawn("riffle-two-pass", opts.prefetch, move |tx, stop, r| {
        run(&ds, &units, &opts, &plan, dir.path(), tx, stop, r)
    })
}

/// What a two-pass read of `ds` over `units` (its grouping's) with `opts` would need:
/// (engine memory, scratch bytes at the peak, piles), or the error it would fail with (a
/// budget too small). For the planner.
pub fn needs(ds: &Dataset, units: &Units, opts: &ReadOptions) -> Result<(u64, u64, u64)> {
    if ds.is_empty() {
        return Err(Error::Invalid("the dataset has no records".into()));
    }
    let (opts, plan) = fitted(ds, units, opts.clone())?;
    let scan = crate::io::footprint(plan.scan_size as usize * 4) as u64;
    let memory = units.bytes()
        + ds.index_bytes()
        + scan
        + plan.writer_bytes()
        + (opts.prefetch as u64 + 1) * plan.batch_bytes
        + plan.loaded_memory();
    // Every unit as a frame; while rolling, the next epoch's piles grow as this epoch's are
    // consumed, so the peak is about one epoch's frames plus a pile.
    let frames = ds.size_stats().total + units.len() * FRAME_HEAD + ds.len() * 4;
    // Group files are removed as their last pile is read: the peak is one epoch's frames
    // and one group's.
    let scratch = frames + frames / plan.layout.groups() as u64;
    Ok((memory, scratch, plan.piles() as u64))
}

/// `opts` and its pile plan; under a `--memory` too tight for the plan with `opts.prefetch`
/// batches queued ahead, the read-ahead halves (down to one batch) until the plan fits, as
/// LIRS's does. Large batches are what the budget then lacks: 200 records of 3 MiB in
/// batches of 4 under --memory 64M took 60 MiB of read-ahead and were refused.
fn fitted(ds: &Dataset, units: &Units, opts: ReadOptions) -> Result<(ReadOptions, PilePlan)> {
    let mut o = opts;
    loop {
        match PilePlan::new(ds, units, &o) {
            Ok(plan) => return Ok((o, plan)),
            Err(e) if o.memory.is_none() || o.prefetch <= 1 => return Err(e),
            Err(_) => o.prefetch = (o.prefetch / 2).max(1),
        }
    }
}

/// Pile count and memory shares.
#[derive(Clone, Copy, Debug)]
struct PilePlan {
    bits: u32,
    /// Most bytes of frames of one pile held in memory.
    pile_budget: u64,
    /// What such a pile takes in memory: its frames, room, index and sort scratch.
    pile_memory: u64,
    /// How the piles are written.
    layout: Layout,
    /// Bytes of frames the scatter writes.
    frames: u64,
    batch_bytes: u64,
    /// Size of the scatter's sequential reads (4 of them in flight).
    scan_size: u64,
}

impl PilePlan {
    fn new(ds: &Dataset, units: &Units, opts: &ReadOptions) -> Result<Self> {
        let stats = ds.size_stats();
        let records = ds.len();
        let frames = stats.total + units.len() * FRAME_HEAD + records * 4;
        let mean = frames as f64 / units.len() as f64;
        let batch_bytes = (opts.batch as f64 * stats.total as f64 / records as f64) as u64
            + (opts.batch + 1) * 16;
        // Four sequential reads in flight: 4 MiB each; under a budget below 256 MiB a
        // sixty-fourth of it each (4 x 2 MiB at 128 MiB); under 32 MiB, 48 KiB. The pile
        // store's I/O in flight scales with this too. 1.6 GB of 4 KiB records, two-pass,
        // alternated runs here: 48 KiB reads at every budget below 256 MiB made the scatter
        // the bottleneck (60-70k records/s at 128 MiB, 57k at 64 MiB, 48k at 32 MiB, against
        // 131-133k, 83-88k and 64k with a sixty-fourth); at 16 MiB 48 KiB stays faster (28k
        // against 22k: larger reads leave too little for the piles).
        let scan_size: u64 = match opts.memory {
            Some(m) if m < (32 << 20) => 48 << 10,
            Some(m) if m < (256 << 20) => (m / 64 / 4096 * 4096).clamp(48 << 10, 4 << 20),
            _ => 4 << 20,
        };
        let scan_bytes = crate::io::footprint(scan_size as usize * 4) as u64;
        let fixed = units.bytes()
            + ds.index_bytes()
            + (opts.prefetch as u64 + 1) * batch_bytes
            + scan_bytes; // the scatter's reader (the pile loader's reads are the store's)
        let budget = match opts.memory {
            Some(m) => m.saturating_sub(fixed),
            None => 512 << 20,
        };
        // The pile store's I/O in flight scales with this (twice as much writing, three times
        // as much reading): as much as the scatter's reads, 4 MiB at most, and no more than
        // a sixteenth of the budget.
        let in_flight = (4 * scan_size as usize)
            .min(4 << 20)
            .min((budget / 16) as usize);
        // The pile writer (a share of the fill pool per pile, the writes in flight, the extent lists)
        // comes off the top; the rest holds two loaded piles (double buffering), each its
        // frames, a sixteenth of room, and 32 bytes per frame (its index entry and the
        // sort's scratch).
        let writers = |piles: u64, extent: usize| {
            let l = Layout::new(piles.trailing_zeros(), extent, in_flight);
            l.writer_bytes() + l.extent_list_bytes(frames) + l.reader_bytes()
        };
        // When no pile count fits with headroom: each pile's share of the fill pool is its share of an
        // eighth of the budget, from 16 KiB to 1 MiB.
        let buf_for = |piles: u64| ((budget / 8) / piles).clamp(16 << 10, 1 << 20) as usize;
        // A pile's share holds at least two of the largest units.
        let need = (stats.max + FRAME_HEAD + 8) * 2;
        // At most 4096 piles (they share a few files, whatever their count).
        let max_bits = MAX_PILE_BITS;
        let per_byte = 1.0 + 1.0 / 16.0 + 32.0 / mean;
        let pile_budget_of = |bits: u32, extent: usize| {
            let left = budget.saturating_sub(writers(1u64 << bits, extent));
            ((left / 2) as f64 / per_byte) as u64
        };
        // With headroom (s + 6 sqrt(s) units per pile, two piles in memory), each pile count
        // leaves some memory for the piles' shares of the fill pool, and a pile is read back
        // in extents of about twice a share: the larger, the faster (random 52 KiB reads ran at 70% of 1 MiB ones
        // here). Take the count whose piles fit with the largest share (up to 1 MiB;
        // at least 16 KiB), the fewest piles among equals.
        let fit = |bits: u32| -> Option<(usize, u64)> {
            let piles = 1u64 << bits;
            let s = units.len() as f64 / piles as f64;
            let pile = (((s + 6.0 * s.sqrt()) * mean) as u64).max(need);
            let left = budget.checked_sub((2.0 * pile as f64 * per_byte) as u64)?;
            let mut extent = ((left / piles).min(1 << 20) as usize) / 4096 * 4096;
            while extent >= 16 << 10 {
                if writers(piles, extent) <= left {
                    return Some((extent, pile_budget_of(bits, extent)));
                }
                extent = extent * 7 / 8 / 4096 * 4096;
            }
            None
        };
        let choice = (0..=max_bits)
            .filter_map(|bits| fit(bits).map(|(extent, budget)| (bits, extent, budget)))
            .max_by_key(|&(bits, extent, _)| (extent, std::cmp::Reverse(bits)));
        // Nothing fits with headroom: piles read back in key sub-ranges. Every pile is read
        // once per sub-range, so take the pile count with the fewest passes over a pile
        // (more piles make smaller piles, but their writers leave less for the pile);
        // among equals the most piles. Only counts whose pile holds two of the largest
        // units qualify: under a small budget that is fewer piles than the most.
        let choice = choice.or_else(|| {
            (0..=max_bits)
                .filter(|&bits| pile_budget_of(bits, buf_for(1u64 << bits)) >= need)
                .min_by_key(|&bits| {
                    let pile = frames.div_ceil(1u64 << bits);
                    let budget = pile_budget_of(bits, buf_for(1u64 << bits));
                    (pile.div_ceil(budget), std::cmp::Reverse(bits))
                })
                .map(|bits| {
                    let extent = buf_for(1u64 << bits);
                    (bits, extent, pile_budget_of(bits, extent))
                })
        });
        let Some((bits, extent, pile_budget)) = choice else {
            // Name what does not fit: after the fixed part, the pile writers' buffers (one
            // set per pile) take what is left, not the pile itself.
            let piles = 1u64 << max_bits.min(4);
            let writer_bytes = writers(1, buf_for(1));
            let need_total = (2.0 * need as f64 * per_byte).ceil() as u64 + 2;
            return Err(Error::Invalid(format!(
                "--memory is too small for two-pass: indexes, buffers and batches take {fixed} bytes, \
                 leaving {budget}; the pile writers' buffers take {writer_bytes} bytes for one pile \
                 ({many} for {piles}) and two piles in memory of two of the largest units {need_total} \
                 bytes more (at least {min_memory} bytes of --memory)",
                many = writers(piles, buf_for(piles)),
                need_total = need_total,
                min_memory = fixed + writer_bytes + need_total,
            )));
        };
        // A frame counts its unit's records in 31 bits: only page grouping over billions of
        // records could make a unit that holds more.
        if records > MAX_FRAME_RECORDS {
            let widest = (0..units.len())
                .map(|u| units.records(u))
                .max_by_key(|r| r.end - r.start)
                .unwrap_or(0..0);
            if widest.end - widest.start > MAX_FRAME_RECORDS {
                return Err(Error::Invalid(format!(
                    "records {}..{} form one unit, more than a two-pass pile frame holds \
                     ({MAX_FRAME_RECORDS} records): use record grouping or a smaller --unit",
                    widest.start, widest.end
                )));
            }
        }
        Ok(PilePlan {
            bits,
            pile_budget,
            pile_memory: (pile_budget as f64 * per_byte) as u64,
            layout: Layout::new(bits, extent, in_flight),
            frames,
            batch_bytes,
            scan_size,
        })
    }

    /// What the two piles in memory take at most: their budget's memory, or, when the
    /// budget is larger than every frame, that of every frame (a pile holds no more). The
    /// idle budget is still the lead's; reports count this. (`--memory 1T` reported 1 TiB
    /// for 1.6 GB of data, and `--memory` of 2^64 - 1 wrapped the report's sum.)
    fn loaded_memory(&self) -> u64 {
        let pile = if self.pile_budget > self.frames {
            (self.pile_memory as f64 * self.frames as f64 / self.pile_budget as f64) as u64
        } else {
            self.pile_memory
        };
        2 * pile
    }

    fn piles(&self) -> usize {
        1 << self.bits
    }

    /// Memory of the pile store: the writer's fill pool and writes in flight, the
    /// extent lists, the loader's reads in flight.
    fn writer_bytes(&self) -> u64 {
        self.layout.writer_bytes()
            + self.layout.extent_list_bytes(self.frames)
            + self.layout.reader_bytes()
    }
}

/// One sequential read of the scatter: units [first, end) of one file, bytes [start, stop).
#[derive(Clone, Copy, Debug)]
struct Chunk {
    first: u64,
    end: u64,
    file: usize,
    start: u64,
    stop: u64,
}

/// Cuts the units, in order, into reads of about `target` bytes, never across files; one
/// at a time, so the scatter starts reading at once (and a stop is heard) rather than after
/// the whole dataset's units are located.
struct Chunker<'a> {
    ds: &'a Dataset,
    units: &'a Units,
    target: u64,
    next: u64,
}

impl Iterator for Chunker<'_> {
    type Item = Chunk;

    fn next(&mut self) -> Option<Chunk> {
        let mut chunk: Option<Chunk> = None;
        while self.next < self.units.len() {
            let u = self.next;
            let r = self.units.records(u);
            let a = self.ds.locate(r.start);
            let b = self.ds.locate(r.end - 1);
            let (start, stop) = (a.offset, b.offset + b.len);
            match &mut chunk {
                Some(c) if c.file == a.file && stop - c.start <= self.target => {
                    c.end = u + 1;
                    c.stop = stop;
                }
                // Unit u starts the next chunk.
                Some(_) => break,
                None => {
                    chunk = Some(Chunk {
                        first: u,
                        end: u + 1,
                        file: a.file,
                        start,
                        stop,
                    })
                }
            }
            self.next += 1;
        }
        chunk
    }
}

#[allow(clippy::too_many_arguments)]
fn run(
    ds: &Dataset,
    units: &Units,
    opts: &ReadOptions,
    plan: &PilePlan,
    scratch: &Path,
    tx: &Sender<Result<Batch>>,
    stop: &Stop,
    r: &mut ReadReport,
) -> Result<()> {
    let started = Instant::now();
    let scan = IoConfig {
        depth: 4,
        slot_size: plan.scan_size as usize,
        ..opts.io.clone()
    };
    // The scatter goes through the files in order: it keeps few open, which leaves the
    // rest of the open-file budget to a LIRS lead reading beside it.
    let mut reader = ds.reader_capped(&scan, 16)?;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("histogram");
    r.mode = "two-pass".into();
    r.grouping = opts.grouping.name().into();
    r.backend = reader.backend_kind().name().into();
    r.direct = reader.direct();
    r.queue_depth = scan.depth;
    r.units_bytes = units.bytes();
    r.index_bytes = ds.index_bytes();
    // The scatter's reader, the pile loader's reads (no more), and one pile writer (the
    // next epoch's while rolling; this epoch's is closed by then).
    r.buffer_bytes = reader.buffer_bytes() as u64 + plan.writer_bytes();
    r.prefetch_bytes = (opts.prefetch as u64 + 1) * plan.batch_bytes;
    r.table_bytes = plan.loaded_memory();
    r.memory_bytes =
        r.units_bytes + r.index_bytes + r.buffer_bytes + r.prefetch_bytes + r.table_bytes;
    r.records_per_unit = units.mean_records();
    r.piles = plan.piles() as u64;
    let epochs = opts.epoch_range()?;
    let mut pile_reads = 0u64;
    let (mut lead_ops, mut lead_bytes) = (0u64, 0u64);
    let last_epoch = epochs.end;
    let mut ready: Option<PileSet> = None;
    // Pile buffers, kept from pile to pile and epoch to epoch (two in use at once).
    let pool: std::sync::Mutex<Vec<LoadedPile>> = Default::default();
    // Every way out (the last epoch, a stop, an error) reports what was done up to there.
    let outcome = (|| -> Result<()> {
        for epoch in epochs {
            if stop.is_set() {
                break;
            }
            let key = EpochKey::new(opts.seed, epoch);
            let split = opts.split_for(epoch, ds.len())?;
            let epoch_started = Instant::now();
            // Piles for this epoch: rolled over from the previous epoch's pile pass, or a
            // scatter of the dataset (the first epoch).
            let mut first_batch = match opts.resume {
                Some(c) if c.epoch == epoch => c.batch,
                _ => 0,
            };
            let set = match ready.take() {
                Some(set) => set,
                None => {
                    let (scattered, led) = if opts.lead {
                        let (scattered, led, end) = scatter_led(
                            ds,
                            units,
                            opts,
                            plan,
                            &mut reader,
                            epoch,
                            first_batch,
                            scratch,
                            tx,
                            stop,
                        );
                        first_batch = first_batch.max(end);
                        (scattered, led)
                    } else {
                        let scattered =
                            scatter(ds, units, plan, &opts.io, &mut reader, &key, scratch, stop);
                        (scattered, Ok(None))
                    };
                    let scattered = scattered?;
                    if let Some(l) = led? {
                        r.records += l.records;
                        r.bytes += l.bytes;
                        r.batches += l.batches;
                        r.lead_batches += l.batches;
                        if l.batches > 0 {
                            r.first_batch_seconds = l.first_batch_seconds;
                        }
                        lead_ops += l.read_ops;
                        lead_bytes += l.device_bytes;
                        r.table_seconds += l.table_seconds;
                    }
                    r.scratch_bytes += scattered.bytes;
                    match scattered.piles {
                        Some(set) => set,
                        None => break,
                    }
                }
            };
            // Rolling: while this epoch is emitted, its frames are re-keyed and scattered
            // for the next one, so a later epoch costs one sequential read and one write.
            let rolling = epoch + 1 < last_epoch;
            let next_key = EpochKey::new(opts.seed, epoch + 1);
            let mut next = if rolling {
                Some(PileWriter::new(scratch, plan.layout, &opts.io)?)
            } else {
                None
            };

            // Pile pass: each pile in key order, records out in sequence (from where the
            // lead stopped, if one led).
            let mut em = Emitter::new(
                split,
                first_batch,
                epoch,
                ds.size_stats().total as f64 / ds.len() as f64,
                tx,
                stop,
                &mut hist,
                &mut *r,
            )
            .lend_from(opts.lender.clone(), ds.size_stats().max)
            .described(ds)
            .shared(opts.ranks.clone())
            .timed(started);
            // The pile pass, double buffered: a loader thread reads and sorts the next pile
            // (or key sub-range of an oversized pile) while this thread emits the current one.
            let loads = set.into_loads(|bytes| bytes.div_ceil(plan.pile_budget));
            let mut loader = PileReader::new(&opts.io);
            // The device takes reads and writes in turn: a pile is loaded while no re-scatter
            // writes, and a re-scatter writes (to the end of its last write) while no pile
            // is loaded. Interleaved, the two ran slower here than in turn (a rolling epoch
            // of 20 GiB, alternated runs: 29.2/28.0/33.7/44.9 s against 27.2/25.4/31.6/32.1
            // s); the emitter, which only copies, runs beside either.
            let io_turn = std::sync::Mutex::new(());
            let take_turn = || io_turn.lock().unwrap_or_else(|e| e.into_inner());
            crate::pipeline::pipelined(
                loads.jobs,
                stop,
                |load, _| {
                    // Buffers of a pile already emitted, reused: fresh memory would be
                    // faulted in and zeroed page by page for every pile.
                    let mut p = pool
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .pop()
                        .unwrap_or_default();
                    // Sized once with a little room, as far as the pile budget allows, so
                    // the next (slightly larger) pile does not regrow it.
                    let bytes = load.expect;
                    let room = (bytes + bytes / 16).min(plan.pile_budget).max(bytes);
                    p.data.room_for(room as usize);
                    {
                        let _turn = take_turn();
                        loader.load(load, &mut p.data, &mut p.frames, stop)?;
                    }
                    crate::order::sort_uniform(&mut p.frames, &mut p.scratch, |f| f.0);
                    Ok(p)
                },
                |p| {
                    pile_reads += 1;
                    // Rolling: a third thread re-scatters the pile for the next epoch,
                    // walking it in memory order, while this one emits it in key order.
                    let data = p.data.as_slice();
                    std::thread::scope(|scope| {
                        let roll = next.as_mut().map(|sink| {
                            std::thread::Builder::new()
                                .name("riffle-rescatter".into())
                                .spawn_scoped(scope, || {
                                    let _turn = take_turn();
                                    let done = rescatter(data, sink, &next_key, stop)
                                        .and_then(|()| sink.settle());
                                    if done.is_err() {
                                        // The emitter and the loader stop too; this error is
                                        // what the run returns.
                                        stop.set();
                                    }
                                    done
                                })
                        });
                        let emitted = emit_frames(data, &p.frames, units, &mut em);
                        if emitted.is_err() {
                            stop.set();
                        }
                        match roll {
                            None => emitted,
                            Some(Err(e)) => Err(Error::Invalid(format!(
                                "cannot start a re-scatter thread: {e}"
                            ))),
                            Some(Ok(h)) => h
                                .join()
                                .unwrap_or_else(|_| {
                                    Err(Error::Invalid("the re-scatter thread panicked".into()))
                                })
                                .and(emitted),
                        }
                    })?;
                    pool.lock().unwrap_or_else(|e| e.into_inner()).push(p);
                    Ok(if em.stopped {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(None)
                    })
                },
            )?;
            em.finish();
            // Stopped, the next epoch's piles may be partial (the re-scatter gave up): they
            // are dropped, never read.
            let stopped = em.stopped || stop.is_set();
            drop(em);
            drop(loads.dir);
            if stopped {
                r.scratch_bytes += next.as_ref().map_or(0, PileWriter::bytes);
                break;
            }
            if let Some(n) = next {
                let set = n.finish()?;
                r.scratch_bytes += set.bytes();
                ready = Some(set);
            }
            r.epoch_seconds.push(epoch_started.elapsed().as_secs_f64());
        }
        Ok(())
    })();
    let s = reader.stats();
    r.pile_loads = pile_reads;
    r.read_ops = s.read_ops + pile_reads + lead_ops;
    r.device_bytes = s.device_bytes + lead_bytes;
    r.seconds = started.elapsed().as_secs_f64();
    r.batch_latency_us = Latency::of(&hist);
    outcome
}

/// The scatter of `epoch` with a LIRS lead beside it (on a thread of its own, in the memory
/// the pile pass takes once the scatter is done): the lead sends the epoch's first batches
/// from `first` on while the dataset is scattered, and stops claiming batches when the
/// scatter ends. Returns the scatter's outcome, the lead's (its report, `None` when it
/// did not run), and the first batch the pile pass sends: every batch before it was the
/// lead's, sent before this returns.
#[allow(clippy::too_many_arguments)]
fn scatter_led(
    ds: &Dataset,
    units: &Units,
    opts: &ReadOptions,
    plan: &PilePlan,
    reader: &mut RangeReader,
    epoch: u64,
    first: u64,
    scratch: &Path,
    tx: &Sender<Result<Batch>>,
    stop: &Stop,
) -> (Result<Scattered>, Result<Option<ReadReport>>, u64) {
    let key = EpochKey::new(opts.seed, epoch);
    let lead = super::lirs::Lead::new(first);
    let budget = 2 * plan.pile_memory;
    std::thread::scope(|s| {
        let led = std::thread::Builder::new()
            .name("riffle-lead".into())
            .spawn_scoped(s, || {
                super::lirs::lead(ds, units, opts, epoch, budget, &lead, tx, stop)
            });
        // The lead's first batch first: the scatter waits for it (a fraction of a second
        // at most, and nothing when the lead did not start).
        if led.is_ok() {
            lead.wait_first(std::time::Duration::from_millis(250));
        }
        let scattered = scatter(ds, units, plan, &opts.io, reader, &key, scratch, stop);
        #[cfg(test)]
        if let (Some((n, _)), Ok(h)) = (tests_hold::of(opts.seed), &led) {
            // Tests: hand over only once the lead has claimed `n` batches (or ended).
            let t = Instant::now();
            while lead.claimed() < first + n && !h.is_finished() && t.elapsed().as_secs() < 20 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        // The pile pass takes over from the first batch the lead has not claimed; the lead
        // completes and sends those it has before the pass sends anything.
        let end = lead.close();
        let led = match led {
            Ok(h) => h
                .join()
                .unwrap_or_else(|_| Err(Error::Invalid("the lead's thread panicked".into()))),
            // No thread for the lead: the pile pass does it all.
            Err(_) => Ok(None),
        };
        (scattered, led, end)
    })
}

/// Tests: where a lead hands over, by seed (reads of other seeds are not held).
#[cfg(test)]
pub(crate) mod tests_hold {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    static HOLDS: Mutex<BTreeMap<u64, (u64, u64)>> = Mutex::new(BTreeMap::new());

    /// A read of `seed` hands over to its pile pass only once its lead has claimed
    /// `batches` batches (or has ended), and its lead's table holds at most `units` units.
    pub(crate) fn set(seed: u64, batches: u64, units: u64) {
        HOLDS.lock().unwrap().insert(seed, (batches, units));
    }

    pub(crate) fn of(seed: u64) -> Option<(u64, u64)> {
        HOLDS.lock().unwrap().get(&seed).copied()
    }
}

/// What a scatter wrote: the first epoch's piles, or `None` when the run was stopped
/// part-way (the partial piles are gone with their directory), and the bytes framed into
/// them.
struct Scattered {
    piles: Option<PileSet>,
    bytes: u64,
}

/// The first epoch's piles: the dataset read in large sequential pieces, every unit framed
/// under its key into its pile. The stop flag is checked per piece: once it is set (by the
/// consumer, or here by a failed pile write) no more reads are issued, those in flight are
/// reaped and skipped, and the piles are dropped.
#[allow(clippy::too_many_arguments)]
fn scatter(
    ds: &Dataset,
    units: &Units,
    plan: &PilePlan,
    io: &IoConfig,
    reader: &mut RangeReader,
    key: &EpochKey,
    scratch: &Path,
    stop: &Stop,
) -> Result<Scattered> {
    let mut sink = PileWriter::new(scratch, plan.layout, io)?;
    let mut failure: Option<Error> = None;
    let mut head = Vec::new();
    let mut locs = Vec::new();
    // A little under a slot, so an unaligned chunk's aligned extent still fits one read.
    let mut chunker = Chunker {
        ds,
        units,
        target: plan.scan_size - 8192,
        next: 0,
    };
    // The chunks handed to the reader, by request index.
    let chunks = RefCell::new(Vec::new());
    reader.read_ranges(
        std::iter::from_fn(|| {
            if stop.is_set() {
                return None;
            }
            let c = chunker.next()?;
            chunks.borrow_mut().push(c);
            Some((c.file, c.start, (c.stop - c.start) as usize))
        }),
        |i, bytes| {
            if stop.is_set() {
                return;
            }
            let c = chunks.borrow()[i];
            for u in c.first..c.end {
                let ids = units.records(u);
                locs.clear();
                locs.extend(ids.clone().map(|id| ds.locate(id)));
                head.clear();
                let body = Body::encode(&mut head, u, locs.iter().map(|l| l.len));
                // Straight into the pile's buffer: the head, then each record's bytes.
                let framed = sink.begin(key.key(u), body).and_then(|pile| {
                    sink.append(pile, &head)?;
                    for l in &locs {
                        let from = (l.offset - c.start) as usize;
                        sink.append(pile, &bytes[from..from + l.len as usize])?;
                    }
                    Ok(())
                });
                if let Err(e) = framed {
                    // A full scratch disk: read nothing more of the dataset.
                    failure = Some(e);
                    stop.set();
                    return;
                }
            }
        },
    )?;
    if let Some(e) = failure {
        return Err(e);
    }
    if stop.is_set() {
        return Ok(Scattered {
            piles: None,
            bytes: sink.bytes(),
        });
    }
    let piles = sink.finish()?;
    Ok(Scattered {
        bytes: piles.bytes(),
        piles: Some(piles),
    })
}

/// A pile (or key sub-range of one) in memory: its frames, and their (key, offset), sorted
/// by key.
#[derive(Default)]
struct LoadedPile {
    data: PileBuf,
    frames: Vec<(u64, usize)>,
    scratch: Vec<(u64, usize)>,
}

/// Bytes of a two-pass frame body's head: the unit id (u64) and a u32 word holding the
/// record count, with [`WIDE`] set when the record lengths that follow are u64 rather than
/// u32. Then come the lengths (little-endian, like the rest) and the records' bytes.
const BODY_HEAD: usize = 8 + 4;

/// Set in a body's count word when its record lengths are u64: a unit holding a record of
/// 4 GiB or more. Other frames keep u32 lengths, so piles of small records stay small.
const WIDE: u32 = 1 << 31;

/// Most records one frame (one unit) holds: the count word's bits below [`WIDE`].
const MAX_FRAME_RECORDS: u64 = WIDE as u64 - 1;

/// A two-pass frame's body head, parsed: the scatter writes it with [`Body::encode`], the
/// pile pass and the re-scatter read it with [`Body::parse`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Body {
    unit: u64,
    /// Records in the frame.
    n: usize,
    /// Whether the lengths are u64.
    wide: bool,
}

impl Body {
    /// Appends the body head of `unit` and its records' lengths to `out` (the caller
    /// appends the records' bytes); returns the whole body's length. The unit has at most
    /// [`MAX_FRAME_RECORDS`] records (`PilePlan::new` checks it before any I/O).
    fn encode(out: &mut Vec<u8>, unit: u64, lens: impl Iterator<Item = u64> + Clone) -> u64 {
        let (n, longest, total) = lens
            .clone()
            .fold((0u64, 0u64, 0u64), |(n, m, t), l| (n + 1, m.max(l), t + l));
        debug_assert!(n <= MAX_FRAME_RECORDS, "a unit of {n} records");
        let wide = longest > u32::MAX as u64;
        let start = out.len();
        out.extend_from_slice(&unit.to_le_bytes());
        out.extend_from_slice(&(n as u32 | if wide { WIDE } else { 0 }).to_le_bytes());
        for l in lens {
            if wide {
                out.extend_from_slice(&l.to_le_bytes());
            } else {
                out.extend_from_slice(&(l as u32).to_le_bytes());
            }
        }
        (out.len() - start) as u64 + total
    }

    /// The head of a body, or `None` when it is too short to hold its lengths.
    #[inline]
    fn parse(body: &[u8]) -> Option<Body> {
        let word = u32::from_le_bytes(body.get(8..12)?.try_into().expect("4 bytes"));
        let b = Body {
            unit: u64::from_le_bytes(body[..8].try_into().expect("8 bytes")),
            n: (word & !WIDE) as usize,
            wide: word & WIDE != 0,
        };
        (body.len() >= BODY_HEAD + b.lens_bytes()).then_some(b)
    }

    /// Bytes of the lengths after the head.
    #[inline]
    fn lens_bytes(&self) -> usize {
        self.n * if self.wide { 8 } else { 4 }
    }

    /// Length `i` from the body's lengths.
    #[inline]
    fn len(&self, lens: &[u8], i: usize) -> usize {
        if self.wide {
            u64::from_le_bytes(lens[i * 8..i * 8 + 8].try_into().expect("8 bytes")) as usize
        } else {
            u32::from_le_bytes(lens[i * 4..i * 4 + 4].try_into().expect("4 bytes")) as usize
        }
    }
}

/// A frame whose body does not hold what its head says (the scratch was changed).
fn damaged(what: &str) -> Error {
    Error::Invalid(format!(
        "a two-pass pile frame is damaged ({what}); was the scratch directory changed?"
    ))
}

/// Re-scatters a loaded pile's frames, in the order they lie in memory (sequential, so
/// cheap), into the next epoch's piles under their new keys. Gives up (`Ok`, the next
/// piles left partial) once `stop` is set, checked every megabyte.
fn rescatter(data: &[u8], sink: &mut PileWriter, key: &EpochKey, stop: &Stop) -> Result<()> {
    const CHECK_EVERY: usize = 1 << 20;
    let mut at = 0;
    let mut check_at = 0;
    while at < data.len() {
        if at >= check_at {
            if stop.is_set() {
                return Ok(());
            }
            check_at = at + CHECK_EVERY;
        }
        let f = match frame::parse(data, at) {
            frame::Parsed::Whole(f) => f,
            _ => {
                return Err(damaged(&format!(
                    "a loaded pile ends inside a frame at byte {at}"
                )))
            }
        };
        let body = &data[f.body..f.end];
        let unit = Body::parse(body)
            .ok_or_else(|| damaged("a body shorter than its head"))?
            .unit;
        sink.frame(key.key(unit), &[body])?;
        at = f.end;
    }
    Ok(())
}

/// Emits the records of a pile's frames in key order (`frames` from the loader, so every
/// one is whole).
fn emit_frames(
    data: &[u8],
    frames: &[(u64, usize)],
    units: &Units,
    em: &mut Emitter<'_>,
) -> Result<()> {
    // Frames are visited in key order, all over the pile: ask for the next ones' lines
    // early so their cache misses overlap this one's copying.
    const AHEAD: usize = 8;
    for (i, &(_, at)) in frames.iter().enumerate() {
        if let Some(&(_, ahead)) = frames.get(i + AHEAD) {
            // Its first kilobyte: the hardware prefetcher follows on within longer frames.
            for line in (ahead..data.len().min(ahead + 1024)).step_by(64) {
                crate::io::prefetch(&data[line..]);
            }
        }
        let f = frame::at(data, at);
        let body = &data[f.body..f.end];
        let b = Body::parse(body).ok_or_else(|| damaged("a body shorter than its head"))?;
        if b.unit >= units.len() {
            return Err(damaged(&format!("unit {} of {}", b.unit, units.len())));
        }
        let records = units.records(b.unit);
        if records.end - records.start != b.n as u64 {
            return Err(damaged(&format!("unit {} with {} records", b.unit, b.n)));
        }
        let lens = &body[BODY_HEAD..BODY_HEAD + b.lens_bytes()];
        let mut off = BODY_HEAD + lens.len();
        for (i, id) in records.enumerate() {
            let len = b.len(lens, i);
            let Some(rec) = off.checked_add(len).and_then(|end| body.get(off..end)) else {
                return Err(damaged("record lengths past the frame's end"));
            };
            em.push(id, rec);
            off += len;
        }
        if em.stopped {
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
