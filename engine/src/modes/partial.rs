//! Partly resident: the dataset nearly fits the budget. Its first bytes (the files in order,
//! as many as the budget holds after everything else: a pure function of the budget and the
//! dataset) are loaded once with large sequential direct reads and kept for every epoch; a
//! batch's records among them are copied out of memory, the others read from the device as
//! LIRS reads them, a window of batches at a time so that the queue stays full. Batches are
//! decided by the same table and walker as LIRS's: the same batches, in the same order.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;
use hdrhistogram::Histogram;

use super::walk::Walker;
use super::{Batch, BatchStream, Latency, Payload, ReadOptions, ReadReport};
use crate::dataset::{Dataset, RecordLoc};
use crate::io::{IoConfig, LargeBuf, RangeReader};
use crate::order::{EpochKey, EpochTable, Split, Units};
use crate::pipeline::Stop;
use crate::resources::{Limits, PartialPlan, ResourcePlan};
use crate::{Error, Result};

/// Reads `opts.epochs` epochs of `ds` with its first bytes held in memory (see the module
/// documentation). Refused, with the figures, when the budget holds too little of it.
pub fn read_partly_resident(
    ds: Arc<Dataset>,
    opts: ReadOptions,
    scratch: Option<std::path::PathBuf>,
) -> Result<BatchStream> {
    super::resident::refuse_unreadable(&ds, &opts)?;
    opts.check(ds.len())?;
    let units = super::lirs::units_for(&ds, &opts);
    // The rest through piles when they fit the scratch's free space, else as LIRS reads.
    if let Some(dir) = scratch {
        let d = super::demand(&ds, &units, &opts);
        // What other runs there reserved (ranks deciding at once) is not free.
        let others = crate::scratch::reserved_by_other_processes(&dir);
        let limits = beside_others(Limits::here(Some(&dir)), others);
        if let Ok((plan, resources)) = crate::resources::partial_piled_plan(&d, ds.bytes(), &limits)
        {
            return super::twopass::read_partly_piled(ds, opts, dir, plan, resources, None);
        }
    }
    let (plan, resources) = needs(&ds, &units, &opts, &Limits::here(None))?;
    BatchStream::spawn("riffle-partial", plan.rest.prefetch, move |tx, stop, r| {
        r.resources = Some(resources);
        run(&ds, &units, &opts, &plan, tx, stop, r)
    })
}

/// `limits` with what other runs reserved in the scratch (`others`: bytes, files) taken
/// from its free space.
pub(super) fn beside_others(limits: Limits, others: (u64, u64)) -> Limits {
    Limits {
        scratch_free: limits.scratch_free.map(|f| f.saturating_sub(others.0)),
        scratch_inodes: limits.scratch_inodes.map(|i| i.saturating_sub(others.1)),
        ..limits
    }
}

/// The sizes and resource plan of a partly resident read of `ds` over `units`
/// with `opts`, or the error it would be refused with. For the planner too.
pub fn needs(
    ds: &Dataset,
    units: &Units,
    opts: &ReadOptions,
    limits: &Limits,
) -> Result<(PartialPlan, ResourcePlan)> {
    if ds.is_empty() {
        return Err(Error::Invalid("the dataset has no records".into()));
    }
    crate::resources::partial_plan(&super::demand(ds, units, opts), ds.bytes(), limits)
}

/// The dataset's first bytes, back to back in file order.
pub(super) struct Held {
    buf: LargeBuf,
    /// Where each file starts, as if every file were held.
    bases: Vec<u64>,
}

impl Held {
    /// Where record `l` lies in the buffer, if it is held whole.
    pub(super) fn range(&self, l: &RecordLoc) -> Option<Range<usize>> {
        let start = self.bases[l.file] + l.offset;
        let end = start + l.len;
        (end <= self.buf.len() as u64).then_some(start as usize..end as usize)
    }

    /// The held bytes.
    pub(super) fn bytes(&self) -> &[u8] {
        self.buf.as_slice()
    }

    /// The memory holding them.
    pub(super) fn capacity(&self) -> usize {
        self.buf.capacity()
    }
}

/// The reason a load stops: the part to hold is full, or the run is stopping.
fn full() -> Error {
    Error::Cancelled {
        reason: "the held part is loaded",
    }
}

/// Loads the files' first `held` bytes in file order. `None` when the run stopped.
pub(super) fn load(
    ds: &Dataset,
    plan: &PartialPlan,
    io: &IoConfig,
    stop: &Stop,
    r: &mut ReadReport,
) -> Result<Option<Held>> {
    let mut bases = Vec::with_capacity(ds.files().len());
    let mut total = 0u64;
    for f in ds.files() {
        bases.push(total);
        total = total.saturating_add(f.size);
    }
    let want = plan.held.min(total);
    let mut buf = LargeBuf::default();
    buf.reserve_total(want as usize);
    let cfg = IoConfig {
        depth: plan.load_depth,
        slot_size: plan.load_slot,
        ..io.clone()
    };
    for (i, f) in ds.files().iter().enumerate() {
        if buf.len() as u64 >= want {
            break;
        }
        let file = ds.open_one(i, cfg.direct)?;
        let (mut filled, mut seen) = (false, 0u64);
        let scanned = crate::io::scan_file(&file, &cfg, |_, bytes| {
            seen += bytes.len() as u64;
            let take = bytes.len().min(want as usize - buf.len());
            buf.extend_from_slice(&bytes[..take]);
            if stop.is_set() {
                return Err(full());
            }
            if buf.len() as u64 == want {
                filled = true;
                return Err(full());
            }
            Ok(())
        });
        match scanned {
            Ok(s) => {
                r.read_ops += s.read_ops;
                r.device_bytes += s.device_bytes;
                r.direct = s.direct;
                if buf.len() as u64 != bases[i] + f.size {
                    return Err(Error::BadInput {
                        path: f.path.clone(),
                        offset: Some(buf.len() as u64 - bases[i]),
                        what: format!(
                            "the file gave {} bytes, {} when listed; was it changed while \
                             being read?",
                            buf.len() as u64 - bases[i],
                            f.size
                        ),
                    });
                }
            }
            // Stopped on purpose: what was read counts (the reads still in flight, at most
            // a queue's worth, are not in the figure).
            Err(_) if filled => {
                r.device_bytes += seen;
                break;
            }
            Err(_) if stop.is_set() => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    Ok(Some(Held { buf, bases }))
}

/// A batch decided, its held records copied in, the others waiting for their reads.
struct Pending {
    batch: Batch,
    /// (record of the batch, where it is) of the records read from the device.
    reads: Vec<(usize, RecordLoc)>,
}

/// Decides batch `j` of `split` through `walker` and fills in its held records.
fn plan_batch(
    ds: &Dataset,
    walker: &mut Walker<'_>,
    split: &Split,
    (epoch, j): (u64, u64),
    mem: &Held,
    opts: &ReadOptions,
) -> Pending {
    let n = ds.len();
    let positions = split.positions(j);
    let count = (positions.end - positions.start) as usize;
    let (mut ids, mut locs) = (Vec::with_capacity(count), Vec::with_capacity(count));
    let mut padding = 0;
    for p in positions {
        if p >= n {
            padding += 1;
        }
        let (id, _) = walker.at(p % n);
        ids.push(id);
        locs.push(ds.locate(id));
    }
    let mut offsets = Vec::with_capacity(count + 1);
    offsets.push(0u64);
    for l in &locs {
        offsets.push(offsets[offsets.len() - 1] + l.len);
    }
    let total = offsets[count] as usize;
    let mut payload = Payload::sized(opts.lender.as_ref(), j, count, total);
    let bytes = mem.buf.as_slice();
    let mut reads = Vec::new();
    for (i, l) in locs.into_iter().enumerate() {
        match mem.range(&l) {
            Some(r) => {
                payload[offsets[i] as usize..offsets[i + 1] as usize].copy_from_slice(&bytes[r])
            }
            None => reads.push((i, l)),
        }
    }
    Pending {
        batch: Batch {
            epoch,
            index: j,
            ids,
            offsets,
            payload,
            padding,
            labels: Vec::new(),
            sources: Vec::new(),
            ready_ns: 0,
        },
        reads,
    }
}

/// Reads the records of `window` that are not held, in one pass of the reader (every read
/// of the window in flight together, up to the queue depth).
fn read_rest(reader: &mut RangeReader, window: &mut [Pending]) -> Result<()> {
    let wanted: Vec<(usize, usize)> = (window.iter().enumerate())
        .flat_map(|(w, p)| (0..p.reads.len()).map(move |k| (w, k)))
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let ranges: Vec<(usize, u64, usize)> = (wanted.iter())
        .map(|&(w, k)| {
            let l = &window[w].reads[k].1;
            (l.file, l.offset, l.len as usize)
        })
        .collect();
    reader.read_ranges(ranges, |q, got| {
        let (w, k) = wanted[q];
        let p = &mut window[w];
        let i = p.reads[k].0;
        let (from, to) = (p.batch.offsets[i] as usize, p.batch.offsets[i + 1] as usize);
        p.batch.payload[from..to].copy_from_slice(got);
    })
}

/// Batches decided ahead and read together: enough reads to fill the queue twice over.
fn window_of(batch: u64, depth: usize, held_share: f64) -> usize {
    let reads_per_batch = (batch as f64 * (1.0 - held_share)).max(1.0);
    ((2 * depth) as f64 / reads_per_batch)
        .ceil()
        .clamp(1.0, 64.0) as usize
}

#[allow(clippy::too_many_arguments)]
fn run(
    ds: &Dataset,
    units: &Units,
    opts: &ReadOptions,
    plan: &PartialPlan,
    tx: &Sender<Result<Batch>>,
    stop: &Stop,
    r: &mut ReadReport,
) -> Result<()> {
    let started = Instant::now();
    r.mode = "resident (partly)".into();
    r.grouping = opts.grouping.name().into();
    let io = IoConfig {
        slot_size: plan.rest.slot_size,
        depth: plan.rest.depth,
        ..opts.io.clone()
    };
    let cap = opts
        .open_files
        .unwrap_or_else(crate::dataset::open_file_cap);
    let mut reader = ds.reader_capped(&io, cap)?;
    r.backend = reader.backend_kind().name().into();
    r.queue_depth = plan.rest.depth;
    let t = Instant::now();
    let Some(mem) = load(ds, plan, &opts.io, stop, r)? else {
        return Ok(());
    };
    let load_seconds = t.elapsed().as_secs_f64();
    let loaded = (r.read_ops, r.device_bytes);
    r.resident_bytes = mem.buf.capacity() as u64;
    let buffers = reader.buffer_bytes() as u64;
    r.set_sizes(&plan.rest, units, ds, buffers, r.resident_bytes);
    let share = mem.buf.len() as f64 / ds.bytes().max(1) as f64;
    let window = window_of(opts.batch, plan.rest.depth, share);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("histogram");
    'epochs: for (k, epoch) in opts.epoch_range()?.enumerate() {
        let t = Instant::now();
        let table = EpochTable::build(units.len(), &EpochKey::new(opts.seed, epoch));
        r.table_seconds += t.elapsed().as_secs_f64();
        let split = opts.split_for(epoch, ds.len())?;
        let mut walker = Walker::new(&table, units);
        let mut j = match opts.resume {
            Some(c) if c.epoch == epoch => c.batch.min(split.batches()),
            _ => 0,
        };
        while j < split.batches() {
            if stop.is_set() {
                break 'epochs;
            }
            let built = Instant::now();
            let mut pending = Vec::with_capacity(window);
            while j < split.batches() && pending.len() < window {
                if opts.wanted(epoch, j) {
                    let at = (epoch, j);
                    pending.push(plan_batch(ds, &mut walker, &split, at, &mem, opts));
                }
                j += 1;
            }
            read_rest(&mut reader, &mut pending)?;
            let each = (built.elapsed().as_micros() as u64 / pending.len().max(1) as u64).max(1);
            for p in pending {
                let mut b = p.batch;
                b.payload.seal();
                r.records += b.ids.len() as u64;
                r.bytes += b.payload.len() as u64;
                r.batches += 1;
                if r.batches == 1 {
                    r.first_batch_seconds = started.elapsed().as_secs_f64();
                }
                hist.saturating_record(each);
                b.ready_ns = super::monotonic_ns();
                b.describe(ds);
                let b = match &opts.lender {
                    Some(l) => l.0.ready(b),
                    None => Some(b),
                };
                if b.is_some_and(|b| tx.send(Ok(b)).is_err()) {
                    break 'epochs;
                }
            }
        }
        let mut secs = t.elapsed().as_secs_f64();
        if k == 0 {
            secs += load_seconds;
        }
        r.epoch_seconds.push(secs);
    }
    let s = reader.stats();
    r.read_ops = loaded.0 + s.read_ops;
    r.device_bytes = loaded.1 + s.device_bytes;
    r.seconds = started.elapsed().as_secs_f64();
    r.batch_latency_us = Latency::of(&hist);
    Ok(())
}
