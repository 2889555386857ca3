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
//! The scatter reads the dataset's files, or (a dataset streamed from object storage,
//! past `--cache-limit`) its objects with ranged GETs in object order, keeping only the
//! units of the read's streams and charging every pile byte against the limit: the one
//! seam is `scan::Scan`, a sequential byte source of file `i`'s ranges. Such a read
//! scatters every epoch from the store (its piles hold one epoch's share: nothing rolls).
//!
//! A pile larger than its memory share (unlucky, or the budget was tight) is not loaded
//! whole: it is read again for each of several key sub-ranges, which keeps the order exact
//! and the memory bounded.

mod body;
mod held;
mod roll;
mod rounds;
mod scan;
mod space;

pub(super) use held::read_partly_piled;
pub use held::{prefix_needs, read_prefix_piled, HeldPrefix};
pub use roll::{KeepRolled, Roll, RolledPiles};
pub use rounds::{streamed_figures, StreamedFigures};
pub use space::{check_scratch, check_staged_room};

use std::cell::RefCell;
use std::ops::{ControlFlow, Range};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;
use hdrhistogram::Histogram;

use super::emit::Emitter;
use super::{Batch, BatchStream, Latency, ReadOptions, ReadReport};
use crate::dataset::Dataset;
use crate::io::IoConfig;
use crate::order::{EpochKey, Split, Units};
use crate::piles::{PileBuf, PileReader, PileSet, PileWriter};
use crate::pipeline::Stop;
use crate::resources::{Limits, PilePlan};
use crate::{Error, Result};
use body::{emit_frames, encode_skip, rescatter, Body};
use held::HeldPart;
use rounds::{streamed_step, Pending};
use scan::{wanted_units, Chunker, Scan, Sequential};

/// Reads `opts.epochs` epochs of `ds` in two-pass mode, with piles in `scratch`.
pub fn read_two_pass(ds: Arc<Dataset>, opts: ReadOptions, scratch: PathBuf) -> Result<BatchStream> {
    if ds.is_empty() {
        return Err(Error::Invalid("the dataset has no records".into()));
    }
    opts.check(ds.len())?;
    let units = Units::new(&ds.layout(), opts.grouping);
    // The free space is checked by the caller ([`check_scratch`]): a full disk met during
    // the scatter (a neighbour filled it) is an error of the run like any other.
    let (prefetch, plan, resources) =
        crate::resources::two_pass_plan(&super::demand(&ds, &units, &opts), &Limits::here(None))?;
    // A dataset streamed from object storage is read sequentially only: no LIRS lead.
    let lead = opts.lead && ds.remote().is_none();
    let opts = ReadOptions {
        prefetch,
        lead,
        ..opts
    };
    // One private directory for the run (made in `scratch`, which is made too if it is
    // missing, and removed again), locked while this process lives; each epoch's piles in
    // a directory inside it. It goes when the I/O thread ends, or on SIGINT/SIGTERM.
    let dir = crate::scratch::ScratchDir::new_in(&scratch, "two-pass")?;
    BatchStream::spawn("riffle-two-pass", opts.prefetch, move |tx, stop, r| {
        r.resources = Some(resources);
        run(&ds, &units, &opts, &plan, dir.path(), None, tx, stop, r)
    })
}

/// What a two-pass read of `ds` over `units` (its grouping's) with `opts` would need:
/// (engine memory, scratch bytes at the peak, piles), or the error it would fail with (a
/// budget too small). For the planner.
pub fn needs(ds: &Dataset, units: &Units, opts: &ReadOptions) -> Result<(u64, u64, u64)> {
    let d = super::demand(ds, units, opts);
    let plan = crate::resources::two_pass(&d, &Limits::here(None))?;
    let piles = plan.figure("piles").map_or(0, |f| f.value);
    Ok((plan.memory_bytes, plan.scratch_bytes, piles))
}

#[allow(clippy::too_many_arguments)]
fn run(
    ds: &Dataset,
    units: &Units,
    opts: &ReadOptions,
    plan: &PilePlan,
    scratch: &Path,
    held: Option<&HeldPart<'_>>,
    tx: &Sender<Result<Batch>>,
    stop: &Stop,
    r: &mut ReadReport,
) -> Result<()> {
    let started = Instant::now();
    let scan = IoConfig {
        depth: crate::resources::SCAN_DEPTH,
        slot_size: plan.scan_size as usize,
        ..opts.io.clone()
    };
    // The scatter goes through the files in order: it keeps few open, which leaves the
    // rest of the open-file budget to a LIRS lead reading beside it.
    let reader = match ds.remote() {
        Some(objects) => Scan::Objects(objects.clone()),
        None => Scan::Files(ds.reader_capped(&scan, crate::resources::SCATTER_FILES)?),
    };
    let hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("histogram");
    let mut run = Run {
        ds,
        units,
        opts,
        plan,
        scratch,
        held,
        tx,
        stop,
        started,
        reader,
        hist,
        pool: Default::default(),
        pile_reads: 0,
        lead_ops: 0,
        lead_bytes: 0,
        charged: 0,
        pending: None,
        in_memory: None,
        rolled_in: None,
        keeper: None,
    };
    run.describe(r, &scan);
    let epochs = opts.epoch_range()?;
    // Piles rolled by an earlier read for the first epoch, and where those rolled past the
    // last go: local files only (a streamed read's piles hold one epoch's node share).
    if let Some(roll) = opts.roll.as_ref().filter(|_| run.reader.files().is_some()) {
        let held = held.map_or(0, HeldPart::units);
        if opts.resume.is_none() {
            run.rolled_in = roll.take_start(epochs.start, (units.len(), held));
        }
        run.keeper = roll.take_keeper();
    }
    // Every way out (the last epoch, a stop, an error) reports what was done up to there.
    let outcome = run.epochs(epochs, r);
    run.report(r);
    outcome
}

/// A two-pass run: what it reads and how, and what its epochs share (the scatter's reader,
/// the batch latencies, the pile buffers, and the reads counted beside the reader's).
struct Run<'a> {
    ds: &'a Dataset,
    units: &'a Units,
    opts: &'a ReadOptions,
    plan: &'a PilePlan,
    scratch: &'a Path,
    /// A partly resident read's held part: its units are not read, only emitted.
    held: Option<&'a HeldPart<'a>>,
    tx: &'a Sender<Result<Batch>>,
    stop: &'a Stop,
    started: Instant,
    reader: Scan,
    hist: Histogram<u64>,
    /// Pile buffers, kept from pile to pile and epoch to epoch (two in use at once).
    pool: std::sync::Mutex<Vec<LoadedPile>>,
    pile_reads: u64,
    lead_ops: u64,
    lead_bytes: u64,
    /// Local disk charged for this epoch's piles (a streamed read's).
    charged: u64,
    /// A streamed epoch done in rounds: those still to scatter (`rounds`).
    pending: Option<Pending>,
    /// A streamed epoch's lowest key range, held in memory, emitted first (`rounds`).
    in_memory: Option<rounds::InMemory>,
    /// The first epoch's piles, rolled by an earlier read (`roll`).
    rolled_in: Option<RolledPiles>,
    /// Where the piles rolled past the last epoch go (`roll`).
    keeper: Option<roll::Keeper>,
}

impl Run<'_> {
    /// Fills in the report's description of the run: its mode and reader, and the memory
    /// each part of it takes (`scan` is the scatter's I/O).
    fn describe(&self, r: &mut ReadReport, scan: &IoConfig) {
        let (ds, units, opts, plan, reader) =
            (self.ds, self.units, self.opts, self.plan, &self.reader);
        r.mode = "two-pass".into();
        r.grouping = opts.grouping.name().into();
        let (backend, direct, buffers) = reader.describe(plan.scan_size);
        r.backend = backend.into();
        r.direct = direct;
        r.queue_depth = scan.depth;
        r.units_bytes = units.bytes();
        r.index_bytes = ds.index_bytes();
        // The scatter's reader, the pile loader's reads (no more), and one pile writer (the
        // next epoch's while rolling; this epoch's is closed by then).
        r.buffer_bytes = buffers + plan.writer_bytes();
        r.prefetch_bytes = (opts.prefetch as u64 + 1) * plan.batch_bytes;
        r.pile_bytes = plan.loaded_memory();
        r.memory_bytes =
            r.units_bytes + r.index_bytes + r.buffer_bytes + r.prefetch_bytes + r.pile_bytes;
        r.records_per_unit = units.mean_records();
        r.piles = plan.piles() as u64;
    }

    /// Reads `epochs` in turn: the first one's piles scattered from the dataset, each later
    /// one's rolled over from the pile pass before it.
    fn epochs(&mut self, epochs: Range<u64>, r: &mut ReadReport) -> Result<()> {
        let (opts, stop) = (self.opts, self.stop);
        let last_epoch = epochs.end;
        let mut ready: Option<PileSet> = None;
        // Kept in this run's directory until its pile pass is over (the set's files are in
        // the rolled directory, removed with it).
        let mut rolled_dir = None;
        if let Some(p) = self.rolled_in.take() {
            r.rolled_in = true;
            ready = Some(p.set);
            rolled_dir = Some(p.dir);
        }
        for epoch in epochs {
            if stop.is_set() {
                break;
            }
            let split = opts.split_for(epoch, self.ds.len())?;
            let epoch_started = Instant::now();
            // Piles for this epoch: rolled over from the previous epoch's pile pass, or a
            // scatter of the dataset (the first epoch).
            let mut first_batch = match opts.resume {
                Some(c) if c.epoch == epoch => c.batch,
                _ => 0,
            };
            let set = match ready.take() {
                Some(set) => set,
                None => match self.scatter_first(epoch, &mut first_batch, r)? {
                    Some(set) => set,
                    None => break,
                },
            };
            // Rolling: while this epoch is emitted, its frames are re-keyed and scattered
            // for the next one, so a later epoch costs one sequential read and one write.
            // A streamed dataset's next epoch is scattered from the store again: its piles
            // hold only this epoch's units of the node's streams.
            let rolling = epoch + 1 < last_epoch && self.reader.objects().is_none();
            // Past the last epoch, when asked to (and it fits): into a directory of its own,
            // handed on with the piles.
            let keep = match self.keeper.take() {
                Some(k) if epoch + 1 == last_epoch => {
                    let peak = self.plan.scratch_bytes();
                    match roll::room_for_next(self.scratch_location(), set.bytes(), peak) {
                        Ok(dir) => Some((k, dir)),
                        Err(why) => {
                            k.give(Err(why));
                            None
                        }
                    }
                }
                k => {
                    self.keeper = k;
                    None
                }
            };
            let mut next = if rolling || keep.is_some() {
                let into = keep.as_ref().map_or(self.scratch, |(_, d)| d.path());
                let mut w = PileWriter::new(into, self.plan.layout, &opts.io)?;
                w.grow_at_most(self.plan.layout.local_step(self.plan.frames));
                Some(w)
            } else {
                None
            };
            let optional = keep.is_some();
            let (stopped, roll_failed) =
                self.pile_pass(set, split, first_batch, epoch, (&mut next, optional), r)?;
            drop(rolled_dir.take());
            // The epoch's piles are gone: their local disk is free again.
            if let Some(o) = self.reader.objects() {
                o.release(std::mem::take(&mut self.charged));
            }
            // Stopped, the next epoch's piles may be partial (the re-scatter gave up): they
            // are dropped, never read.
            if stopped {
                r.scratch_bytes += next.as_ref().map_or(0, PileWriter::bytes);
                break;
            }
            if let Some((k, dir)) = keep {
                let kept = match (roll_failed, next) {
                    (Some(e), _) => Err(format!("writing the next epoch's piles: {e}")),
                    (None, None) => Err("no next epoch's piles were written".into()),
                    (None, Some(n)) => n.finish().map_err(|e| e.to_string()),
                };
                let held = self.held.map_or(0, HeldPart::units);
                k.give(kept.map(|set| {
                    r.scratch_bytes += set.bytes();
                    r.rolled_out_bytes = set.bytes();
                    RolledPiles::new(set, epoch + 1, (self.units.len(), held), dir)
                }));
            } else if let Some(n) = next {
                let set = n.finish()?;
                r.scratch_bytes += set.bytes();
                ready = Some(set);
            }
            r.epoch_seconds.push(epoch_started.elapsed().as_secs_f64());
        }
        Ok(())
    }

    /// The scratch location this run's directory is in (where rolled piles go).
    fn scratch_location(&self) -> &Path {
        self.scratch.parent().unwrap_or(self.scratch)
    }

    /// The piles of `epoch`, the first one read: a scatter of the dataset, with a LIRS lead
    /// beside it when asked (which moves `first_batch` past the batches it sent). `None`
    /// when the run was stopped part-way.
    fn scatter_first(
        &mut self,
        epoch: u64,
        first_batch: &mut u64,
        r: &mut ReadReport,
    ) -> Result<Option<PileSet>> {
        let (ds, units, opts, plan, scratch, tx, stop) = (
            self.ds,
            self.units,
            self.opts,
            self.plan,
            self.scratch,
            self.tx,
            self.stop,
        );
        let (scattered, led) = if opts.lead && self.reader.files().is_some() {
            let (scattered, led, end) = scatter_led(
                ds,
                units,
                opts,
                plan,
                &mut self.reader,
                epoch,
                *first_batch,
                scratch,
                tx,
                stop,
            );
            *first_batch = (*first_batch).max(end);
            (scattered, led)
        } else {
            let key = EpochKey::new(opts.seed, epoch);
            let split = opts.split_for(epoch, ds.len())?;
            // A streamed read keeps only its streams' units (a node's share), in as many
            // rounds as its local disk needs (`rounds`).
            let (wanted, cut) = match self.reader.objects() {
                Some(o) => {
                    let w = wanted_units(units, &split, *first_batch, &key, opts.ranks.as_deref());
                    let cut = rounds::plan_within(ds, units, &key, w.as_ref(), pile_room(o), plan)?;
                    r.rounds = Some(r.rounds.unwrap_or(0).max(cut.len() as u64));
                    (w, Some(cut))
                }
                None => (None, None),
            };
            let memory = cut.as_ref().and_then(rounds::Rounds::in_memory);
            if memory.is_some() {
                // The frames in memory take the pile buffers' place (`rounds`).
                self.pool.lock().unwrap_or_else(|e| e.into_inner()).clear();
            }
            let mut from = Sequential {
                scan: &mut self.reader,
                epoch,
                wanted,
                round: cut.as_ref().and_then(|c| c.get(0)),
                from: self.held.map_or(0, HeldPart::units),
                memory,
            };
            let scattered = scatter(ds, units, plan, &opts.io, &mut from, &key, scratch, stop);
            if let Some(m) = from.memory.take() {
                let most = r.overflow_in_memory_bytes.unwrap_or(0).max(m.memory());
                r.overflow_in_memory_bytes = Some(most);
                self.in_memory = Some(m);
            }
            self.pending = cut.filter(|c| c.len() > 1).map(|rounds| Pending {
                rounds,
                next: 1,
                wanted: from.wanted,
                epoch,
                key,
            });
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
            self.lead_ops += l.read_ops;
            self.lead_bytes += l.device_bytes;
            r.table_seconds += l.table_seconds;
        }
        r.scratch_bytes += scattered.bytes;
        self.charged += scattered.charged;
        Ok(scattered.piles)
    }

    /// The pile pass of `epoch` over `set`: each pile in key order, records out in sequence
    /// from `first_batch` on (from where the lead stopped, if one led), and each pile
    /// re-scattered into `next` meanwhile when rolling. Returns whether the run stopped,
    /// and, when rolling is `optional` (past the last epoch), why it failed if it did (the
    /// epoch goes on without it).
    fn pile_pass(
        &mut self,
        set: PileSet,
        split: Split,
        first_batch: u64,
        epoch: u64,
        (next, optional): (&mut Option<PileWriter>, bool),
        r: &mut ReadReport,
    ) -> Result<(bool, Option<Error>)> {
        let (ds, units, opts, plan, stop) = (self.ds, self.units, self.opts, self.plan, self.stop);
        let (pool, pile_reads, held) = (&self.pool, &mut self.pile_reads, self.held);
        let next_key = EpochKey::new(opts.seed, epoch + 1);
        let mut em = Emitter::new(
            split,
            first_batch,
            epoch,
            ds.size_stats().total as f64 / ds.len() as f64,
            self.tx,
            stop,
            &mut self.hist,
            &mut *r,
        )
        .lend_from(opts.lender.clone(), ds.size_stats().max)
        .described(ds)
        .shared(opts.ranks.clone())
        .timed(self.started);
        let mut loader = PileReader::new(&opts.io);
        // The device takes reads and writes in turn: a pile is loaded while no re-scatter
        // writes, and a re-scatter writes (to the end of its last write) while no pile
        // is loaded. Interleaved, the two ran slower here than in turn (a rolling epoch
        // of 20 GiB, alternated runs: 29.2/28.0/33.7/44.9 s against 27.2/25.4/31.6/32.1
        // s); the emitter, which only copies, runs beside either.
        let io_turn = std::sync::Mutex::new(());
        let take_turn = || io_turn.lock().unwrap_or_else(|e| e.into_inner());
        // A streamed epoch in rounds passes each round's piles in turn, the next round
        // scattered once this one's are gone (`rounds`); any other epoch has one set.
        let (mut set, mut scattered) = (Some(set), 0);
        let mut roll_failed: Option<Error> = None;
        // First the lowest key range, when held in memory.
        if let Some(m) = self.in_memory.take() {
            m.emit(units, &mut em)?;
            if em.stopped {
                set = None;
            }
        }
        while let Some(s) = set.take() {
            // The pile pass, double buffered: a loader thread reads and sorts the next pile
            // (or key sub-range of an oversized pile) while this thread emits the current.
            let loads = s.into_loads(|bytes| bytes.div_ceil(plan.pile_budget));
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
                    *pile_reads += 1;
                    let sink = next.as_mut().filter(|_| roll_failed.is_none());
                    let failed = emit_and_roll(
                        &p,
                        (units, held),
                        &mut em,
                        (sink, optional),
                        &next_key,
                        stop,
                        &take_turn,
                    )?;
                    roll_failed = roll_failed.take().or(failed);
                    pool.lock().unwrap_or_else(|e| e.into_inner()).push(p);
                    Ok(if em.stopped {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(None)
                    })
                },
            )?;
            drop(loads.dir);
            if em.stopped || stop.is_set() {
                break;
            }
            if let Some(p) = self.pending.as_mut() {
                let (reader, charged) = (&mut self.reader, &mut self.charged);
                set = p.next(
                    ds,
                    units,
                    plan,
                    &opts.io,
                    reader,
                    self.scratch,
                    stop,
                    charged,
                    &mut scattered,
                )?;
            }
        }
        em.finish();
        let stopped = em.stopped || stop.is_set();
        drop(em);
        r.scratch_bytes += scattered;
        self.pending = None;
        Ok((stopped, roll_failed))
    }

    /// Fills in the report's totals: the reads of the scatter, the pile loads and the lead,
    /// the run's time and its batch latencies.
    fn report(&self, r: &mut ReadReport) {
        let (ops, bytes) = self.reader.stats();
        r.pile_loads = self.pile_reads;
        r.read_ops = ops + self.pile_reads + self.lead_ops;
        r.device_bytes = bytes + self.lead_bytes;
        if let Some(o) = self.reader.objects() {
            r.cache_limit = Some(o.cache_limit());
            r.peak_local_bytes = Some(o.peak());
            r.objects = o.counts();
        }
        r.seconds = self.started.elapsed().as_secs_f64();
        r.batch_latency_us = Latency::of(&self.hist);
    }
}

/// Emits a loaded pile's records in key order, and meanwhile, when rolling (`next` is the
/// next epoch's piles), re-scatters it under `next_key`; `take_turn` takes the device's
/// turn for the re-scatter's writes. An `optional` roll that fails does not stop the
/// emission: its error is returned as `Ok(Some(e))`.
fn emit_and_roll<'t>(
    p: &LoadedPile,
    (units, held): (&Units, Option<&HeldPart<'_>>),
    em: &mut Emitter<'_>,
    (next, optional): (Option<&mut PileWriter>, bool),
    next_key: &EpochKey,
    stop: &Stop,
    take_turn: &(impl Fn() -> std::sync::MutexGuard<'t, ()> + Sync),
) -> Result<Option<Error>> {
    // Rolling: a third thread re-scatters the pile for the next epoch,
    // walking it in memory order, while this one emits it in key order.
    let data = p.data.as_slice();
    std::thread::scope(|scope| {
        let roll = next.map(|sink| {
            std::thread::Builder::new()
                .name("riffle-rescatter".into())
                .spawn_scoped(scope, || {
                    let _turn = take_turn();
                    let done = rescatter(data, sink, next_key, stop).and_then(|()| sink.settle());
                    if done.is_err() && !optional {
                        // The emitter and the loader stop too; this error is
                        // what the run returns.
                        stop.set();
                    }
                    done
                })
        });
        let emitted = emit_frames(data, &p.frames, units, held, em);
        if emitted.is_err() {
            stop.set();
        }
        let rolled = match roll {
            None => Ok(()),
            Some(Err(e)) => Err(Error::os("cannot start a re-scatter thread", e)),
            Some(Ok(h)) => h
                .join()
                .unwrap_or_else(|_| Err(Error::Internal("the re-scatter thread panicked".into()))),
        };
        match rolled {
            Err(e) if optional => emitted.map(|()| Some(e)),
            rolled => rolled.and(emitted).map(|()| None),
        }
    })
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
    reader: &mut Scan,
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
        let mut from = Sequential {
            scan: reader,
            epoch,
            wanted: None,
            round: None,
            from: 0,
            memory: None,
        };
        let scattered = scatter(ds, units, plan, &opts.io, &mut from, &key, scratch, stop);
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
                .unwrap_or_else(|_| Err(Error::Internal("the lead's thread panicked".into()))),
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
    /// Local disk charged for the piles (a streamed read's; 0 otherwise).
    charged: u64,
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
    from: &mut Sequential<'_>,
    key: &EpochKey,
    scratch: &Path,
    stop: &Stop,
) -> Result<Scattered> {
    let Sequential {
        scan,
        epoch,
        wanted,
        round,
        from,
        memory,
    } = from;
    // A round frames only the units of its key range; it reads no chunk holding none. The
    // units of the range held in memory (`rounds`) are framed there.
    let round = *round;
    let outside = |u: u64| round.is_some_and(|r| !r.has(key.key(u)));
    let kept = memory.as_ref().map(|m| m.round());
    let unread = |u: u64| outside(u) && !kept.is_some_and(|r| r.has(key.key(u)));
    // A streamed read charges the piles' local disk before writing it: their slack first
    // (space allocated ahead, last chunks written whole), then every frame.
    let objects = scan.objects().cloned();
    let mut charged = 0u64;
    let mut charge = |bytes: u64, what: &str| -> Result<()> {
        if let Some(o) = &objects {
            o.charge(bytes, what)?;
            charged += bytes;
        }
        Ok(())
    };
    let step = objects
        .as_ref()
        .map(|o| streamed_step(&plan.layout, pile_room(o)));
    charge(
        step.map_or(0, |s| plan.layout.disk_slack(s)),
        "the piles' allocation",
    )?;
    let mut sink = PileWriter::new(scratch, plan.layout, io)?;
    // A local read's slack is bounded too: the plan reserved it (`PilePlan::scratch_bytes`).
    sink.grow_at_most(step.unwrap_or_else(|| plan.layout.local_step(plan.frames)));
    let mut failure: Option<Error> = None;
    let mut skip = Vec::new();
    let mut head = Vec::new();
    let mut locs = Vec::new();
    // Units held in memory are not read: their skip frames give them their places.
    for u in 0..*from {
        skip.clear();
        encode_skip(&mut skip, u);
        sink.frame(key.key(u), &[&skip])?;
    }
    // A little under a slot, so an unaligned chunk's aligned extent still fits one read.
    let mut chunker = Chunker {
        ds,
        units,
        target: plan.scan_size - 8192,
        next: *from,
    };
    // The chunks handed to the reader, by request index.
    let chunks = RefCell::new(Vec::new());
    let read = scan.read_ranges(
        *epoch,
        std::iter::from_fn(|| {
            if stop.is_set() {
                return None;
            }
            let c =
                std::iter::from_fn(|| chunker.next()).find(|c| !(c.first..c.end).all(unread))?;
            chunks.borrow_mut().push(c);
            Some((c.file, c.start, (c.stop - c.start) as usize))
        }),
        |i, bytes| {
            if stop.is_set() {
                return;
            }
            let c = chunks.borrow()[i];
            for u in c.first..c.end {
                if outside(u) {
                    if let Some(m) = memory.as_mut().filter(|m| m.has(key.key(u))) {
                        m.unit(u, key, wanted.as_ref(), units, ds, bytes, c.start);
                    }
                    continue;
                }
                if wanted.as_ref().is_some_and(|w| !w.has(u)) {
                    // Another node's: its positions only.
                    skip.clear();
                    encode_skip(&mut skip, u);
                    let done = charge((piles_frame_head() + skip.len()) as u64, "the piles")
                        .and_then(|()| sink.frame(key.key(u), &[&skip]));
                    if let Err(e) = done {
                        failure = Some(e);
                        stop.set();
                        return;
                    }
                    continue;
                }
                let ids = units.records(u);
                locs.clear();
                locs.extend(ids.clone().map(|id| ds.locate(id)));
                head.clear();
                let body = Body::encode(&mut head, u, locs.iter().map(|l| l.len));
                // Straight into the pile's buffer: the head, then each record's bytes.
                let framed = charge(piles_frame_head() as u64 + body, "the piles")
                    .and_then(|()| sink.begin(key.key(u), body))
                    .and_then(|pile| {
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
        &|| stop.is_set(),
    );
    // The charge goes back with the piles when the scatter fails (they are removed).
    let give_back = |e| {
        if let Some(o) = scan.objects() {
            o.release(charged);
        }
        e
    };
    read.map_err(give_back)?;
    if let Some(e) = failure {
        return Err(give_back(e));
    }
    if stop.is_set() {
        return Ok(Scattered {
            piles: None,
            bytes: sink.bytes(),
            charged,
        });
    }
    let piles = sink.finish().map_err(give_back)?;
    // The piles as the filesystem holds them: charged too, where more than the estimate.
    if let Some(o) = scan.objects() {
        let more = scan::disk_used(scratch).saturating_sub(charged);
        o.charge(more, "the piles, as written").map_err(give_back)?;
        charged += more;
    }
    Ok(Scattered {
        bytes: piles.bytes(),
        piles: Some(piles),
        charged,
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

/// The local disk a streamed read's piles have: its `--cache-limit` less what the
/// dataset keeps while open (its objects' layouts in the local cache).
fn pile_room(o: &Arc<dyn crate::dataset::RemoteBytes>) -> u64 {
    o.cache_limit().saturating_sub(o.kept())
}

/// Bytes of a pile frame's own head (before its body).
fn piles_frame_head() -> usize {
    crate::piles::frame::HEAD
}
