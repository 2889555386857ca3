//! Resident mode: memory as the first tier. The first epoch reads the dataset's files whole,
//! in file order, with large sequential direct reads into one aligned buffer the run owns
//! (on transparent huge pages), and sends each of its batches, in order, as soon as every
//! record of it has arrived; every later epoch is a permutation of that memory, with no
//! I/O. Batches are decided by the same table and walker as LIRS's: the same batches, in
//! the same order, as `lirs` and `two-pass`.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;
use hdrhistogram::Histogram;

use super::walk::Walker;
use super::{Batch, BatchStream, Latency, Payload, ReadOptions, ReadReport, Viewed};
use crate::dataset::{Dataset, RecordLoc};
use crate::io::{IoConfig, LargeBuf};
use crate::order::{EpochKey, EpochTable, Split, Units};
use crate::pipeline::Stop;
use crate::resources::{resident_scan, Limits, LirsPlan, ResourcePlan};
use crate::{Error, Result};

/// Reads `opts.epochs` epochs of `ds` with the dataset held in memory: loaded once in the
/// first epoch, permuted in memory in every later one. When the files do not fit the budget
/// (`--memory`, or the machine's resident default), what fits is held and the rest read
/// from the device ([`super::read_partly_resident`]); refused, with the figures, when that
/// is too little to be worth it.
pub fn read_resident(ds: Arc<Dataset>, opts: ReadOptions) -> Result<BatchStream> {
    if ds.is_empty() {
        return Err(Error::Invalid("the dataset has no records".into()));
    }
    if opts.baseline.is_some() {
        return Err(Error::Invalid(
            "resident mode reads the order contract's batches, not a baseline's".into(),
        ));
    }
    opts.check(ds.len())?;
    let units = super::lirs::units_for(&ds, &opts);
    let (plan, resources) = match needs(&ds, &units, &opts, &Limits::here(None)) {
        Ok(fits) => fits,
        // Not whole: what the budget holds of it, if that is worth holding.
        Err(Error::OverBudget(whole)) => {
            return super::partial::read_partly_resident(ds, opts).map_err(|e| match e {
                Error::OverBudget(part) => Error::OverBudget(format!("{whole}; partly: {part}")),
                e => e,
            })
        }
        Err(e) => return Err(e),
    };
    BatchStream::spawn("riffle-resident", plan.prefetch, move |tx, stop, r| {
        r.resources = Some(resources);
        run(&ds, &units, &opts, &plan, tx, stop, r)
    })
}

/// The sizes and resource plan of a resident read of `ds` over `units` with `opts`, or the
/// error it would be refused with (the files do not fit the budget). For the planner too.
pub fn needs(
    ds: &Dataset,
    units: &Units,
    opts: &ReadOptions,
    limits: &Limits,
) -> Result<(LirsPlan, ResourcePlan)> {
    if ds.is_empty() {
        return Err(Error::Invalid("the dataset has no records".into()));
    }
    crate::resources::resident_plan(&super::demand(ds, units, opts), ds.bytes(), limits)
}

/// The files held whole, back to back in file order.
#[derive(Default)]
struct Memory {
    buf: LargeBuf,
    /// Where each file starts in `buf`.
    bases: Vec<u64>,
}

impl Memory {
    fn new(ds: &Dataset) -> Result<Memory> {
        let mut bases = Vec::with_capacity(ds.files().len());
        let mut total = 0u64;
        for f in ds.files() {
            bases.push(total);
            total = total.checked_add(f.size).ok_or_else(|| {
                Error::OverBudget("the dataset's files pass 2^64 bytes in all".into())
            })?;
        }
        let len = usize::try_from(total).map_err(|_| {
            Error::OverBudget(format!(
                "{total} bytes of files do not fit this address space"
            ))
        })?;
        let mut buf = LargeBuf::default();
        buf.reserve_total(len);
        Ok(Memory { buf, bases })
    }

    /// Where record `l`'s bytes start in the buffer.
    fn start_of(&self, l: &RecordLoc) -> usize {
        (self.bases[l.file] + l.offset) as usize
    }

    /// Where record `l`'s bytes end in the buffer.
    fn end_of(&self, l: &RecordLoc) -> u64 {
        self.bases[l.file] + l.offset + l.len
    }
}

impl Viewed for Memory {
    fn bytes(&self) -> &[u8] {
        self.buf.as_slice()
    }
}

/// The memory batches copy from while it loads, or view once it has loaded.
#[derive(Clone, Copy)]
enum Store<'a> {
    Loading(&'a Memory),
    Loaded(&'a Arc<Memory>),
}

impl Store<'_> {
    fn mem(&self) -> &Memory {
        match self {
            Store::Loading(m) => m,
            Store::Loaded(m) => m,
        }
    }
}

/// Where batches go, and what is counted of them.
struct Out<'a> {
    ds: &'a Dataset,
    opts: &'a ReadOptions,
    tx: &'a Sender<Result<Batch>>,
    started: Instant,
    hist: Histogram<u64>,
    r: &'a mut ReadReport,
}

/// A batch decided, waiting for its records to be loaded.
struct Planned {
    index: u64,
    ids: Vec<u64>,
    locs: Vec<RecordLoc>,
    padding: usize,
    /// The buffer must hold this many bytes before the batch can be copied out.
    need: u64,
}

/// One epoch's batches, decided in order by the epoch's table (as LIRS decides them).
struct EpochEmit<'a> {
    walker: Walker<'a>,
    split: Split,
    epoch: u64,
    next: u64,
    end: u64,
    planned: Option<Planned>,
}

impl<'a> EpochEmit<'a> {
    fn new(
        table: &'a EpochTable,
        units: &'a Units,
        opts: &ReadOptions,
        epoch: u64,
        records: u64,
    ) -> Result<Self> {
        let split = opts.split_for(epoch, records)?;
        let first = match opts.resume {
            Some(c) if c.epoch == epoch => c.batch.min(split.batches()),
            _ => 0,
        };
        Ok(EpochEmit {
            walker: Walker::new(table, units),
            split,
            epoch,
            next: first,
            end: split.batches(),
            planned: None,
        })
    }

    /// Decides batch `j`: its records, through the table, and how much must be loaded.
    fn plan(&mut self, j: u64, mem: &Memory, ds: &Dataset) -> Planned {
        let n = ds.len();
        let positions = self.split.positions(j);
        let count = (positions.end - positions.start) as usize;
        let (mut ids, mut locs) = (Vec::with_capacity(count), Vec::with_capacity(count));
        let (mut padding, mut need) = (0, 0);
        for p in positions {
            if p >= n {
                padding += 1;
            }
            let (id, _) = self.walker.at(p % n);
            let l = ds.locate(id);
            need = need.max(mem.end_of(&l));
            ids.push(id);
            locs.push(l);
        }
        Planned {
            index: j,
            ids,
            locs,
            padding,
            need,
        }
    }

    /// Sends the epoch's batches in order while their records are among the first
    /// `loaded` bytes of `mem`. Returns whether the stream stopped (the consumer gone).
    fn advance(&mut self, from: Store<'_>, loaded: u64, out: &mut Out<'_>, stop: &Stop) -> bool {
        while self.next < self.end {
            let j = self.next;
            if !out.opts.wanted(self.epoch, j) {
                if j.is_multiple_of(4096) && stop.is_set() {
                    return true;
                }
                self.next += 1;
                continue;
            }
            let p = match self.planned.take() {
                Some(p) => p,
                None => self.plan(j, from.mem(), out.ds),
            };
            if p.need > loaded {
                self.planned = Some(p);
                return false;
            }
            self.next += 1;
            if stop.is_set() || !out.send(self.epoch, p, from) {
                return true;
            }
        }
        false
    }
}

impl Out<'_> {
    /// Sends batch `p`: copied out of the memory (into a lender's region, or while the
    /// memory is still loading) or else a view of it; false when nobody takes it any more.
    fn send(&mut self, epoch: u64, p: Planned, from: Store<'_>) -> bool {
        let mem = from.mem();
        let started = Instant::now();
        let mut offsets = Vec::with_capacity(p.ids.len() + 1);
        let mut total = 0u64;
        offsets.push(0);
        for l in &p.locs {
            total += l.len;
            offsets.push(total);
        }
        // Lent memory is written in place; the engine's own is filled without being
        // zeroed first; loaded memory is viewed, not copied.
        let lent = self.opts.lender.is_some();
        let mut payload = match (&self.opts.lender, from) {
            (Some(l), _) => Payload::sized(Some(l), p.index, p.ids.len(), total as usize),
            (None, Store::Loaded(m)) => {
                let ranges = p.locs.iter().map(|l| {
                    let at = m.start_of(l);
                    at..at + l.len as usize
                });
                Payload::view(m.clone(), ranges.collect())
            }
            (None, Store::Loading(_)) => Payload::with_capacity(total as usize),
        };
        let bytes = mem.buf.as_slice();
        let copied = if payload.is_view() {
            &[][..]
        } else {
            &p.locs[..]
        };
        for (i, l) in copied.iter().enumerate() {
            let from = (mem.bases[l.file] + l.offset) as usize;
            let (to, len) = (offsets[i] as usize, l.len as usize);
            if let Some(next) = p.locs.get(i + 4) {
                crate::io::prefetch(&bytes[(mem.bases[next.file] + next.offset) as usize..]);
            }
            let src = &bytes[from..from + len];
            if lent {
                payload[to..to + len].copy_from_slice(src);
            } else {
                payload.extend_from_slice(src);
            }
        }
        let r = &mut *self.r;
        r.records += p.ids.len() as u64;
        r.bytes += total;
        r.batches += 1;
        if r.batches == 1 {
            r.first_batch_seconds = self.started.elapsed().as_secs_f64();
        }
        self.hist
            .saturating_record(started.elapsed().as_micros().max(1) as u64);
        let mut b = Batch {
            epoch,
            index: p.index,
            ids: p.ids,
            offsets,
            payload,
            padding: p.padding,
            labels: Vec::new(),
            sources: Vec::new(),
            ready_ns: super::monotonic_ns(),
        };
        b.describe(self.ds);
        // A lender may take the batch over here (announced by it).
        let b = match &self.opts.lender {
            Some(l) => l.0.ready(b),
            None => Some(b),
        };
        b.is_none_or(|b| self.tx.send(Ok(b)).is_ok())
    }
}

/// The reason a load stops early: the run is stopping.
fn stopped() -> Error {
    Error::Cancelled {
        reason: "the consumer stopped reading",
    }
}

/// Loads every file into `mem`, in order, sending `e`'s batches as they complete. Returns
/// whether the stream stopped.
fn load(
    ds: &Dataset,
    mem: &mut Memory,
    e: &mut EpochEmit<'_>,
    out: &mut Out<'_>,
    stop: &Stop,
) -> Result<bool> {
    // A helper faults the buffer in ahead of the reads that fill it (the kernel zeroes
    // each new page: at best 0.1 s a GB, and on this machine's VM up to 2 s a GB for
    // memory the host took back), so that cost is paid beside the reads, not between them.
    let done = std::sync::atomic::AtomicBool::new(false);
    let populator = mem.buf.populator();
    std::thread::scope(|scope| {
        if let Some(p) = populator {
            let done = &done;
            let _ = std::thread::Builder::new()
                .name("riffle-populate".into())
                .spawn_scoped(scope, move || {
                    const STEP: usize = 16 << 20;
                    let mut at = 0;
                    while at < p.len() && !done.load(std::sync::atomic::Ordering::Relaxed) {
                        if !p.populate(at, at + STEP) {
                            break;
                        }
                        at += STEP;
                    }
                });
        }
        let loaded = load_files(ds, mem, e, out, stop);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        loaded
    })
}

/// [`load`]'s reads: every file in order, appended to `mem`.
fn load_files(
    ds: &Dataset,
    mem: &mut Memory,
    e: &mut EpochEmit<'_>,
    out: &mut Out<'_>,
    stop: &Stop,
) -> Result<bool> {
    let (depth, slot_size) = resident_scan(ds.bytes());
    let cfg = IoConfig {
        depth,
        slot_size,
        ..out.opts.io.clone()
    };
    for i in 0..ds.files().len() {
        let file = ds.open_one(i, cfg.direct)?;
        let mut halted = false;
        let scanned = crate::io::scan_file(&file, &cfg, |_, bytes| {
            mem.buf.extend_from_slice(bytes);
            if stop.is_set() || e.advance(Store::Loading(mem), mem.buf.len() as u64, out, stop) {
                halted = true;
                return Err(stopped());
            }
            Ok(())
        });
        let s = match scanned {
            Ok(s) => s,
            Err(_) if halted => return Ok(true),
            Err(err) => return Err(err),
        };
        let want = mem.bases[i] + ds.files()[i].size;
        if mem.buf.len() as u64 != want {
            return Err(Error::BadInput {
                path: ds.files()[i].path.clone(),
                offset: Some(mem.buf.len() as u64 - mem.bases[i]),
                what: format!(
                    "the file gave {} bytes, {} when listed; was it changed while being read?",
                    mem.buf.len() as u64 - mem.bases[i],
                    ds.files()[i].size
                ),
            });
        }
        out.r.read_ops += s.read_ops;
        out.r.device_bytes += s.device_bytes;
        out.r.backend = s.backend.name().into();
        out.r.direct = s.direct;
    }
    Ok(false)
}

fn run(
    ds: &Dataset,
    units: &Units,
    opts: &ReadOptions,
    plan: &LirsPlan,
    tx: &Sender<Result<Batch>>,
    stop: &Stop,
    r: &mut ReadReport,
) -> Result<()> {
    let started = Instant::now();
    r.mode = "resident".into();
    r.grouping = opts.grouping.name().into();
    let (depth, slot) = resident_scan(ds.bytes());
    r.queue_depth = depth;
    let mut mem = Memory::new(ds)?;
    r.resident_bytes = mem.buf.capacity() as u64;
    let mut held: Option<Arc<Memory>> = None;
    let buffer = crate::io::footprint(depth * slot) as u64;
    r.set_sizes(plan, units, ds, buffer, r.resident_bytes);
    let hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("histogram");
    let mut out = Out {
        ds,
        opts,
        tx,
        started,
        hist,
        r,
    };
    for (k, epoch) in opts.epoch_range()?.enumerate() {
        if stop.is_set() {
            break;
        }
        let t = Instant::now();
        let table = EpochTable::build(units.len(), &EpochKey::new(opts.seed, epoch));
        out.r.table_seconds += t.elapsed().as_secs_f64();
        let mut e = EpochEmit::new(&table, units, opts, epoch, ds.len())?;
        // The first epoch loads the files, sending batches as they complete; the rest of
        // it and every later epoch only view the memory loaded.
        if k == 0 && load(ds, &mut mem, &mut e, &mut out, stop)? {
            out.r.epoch_seconds.push(t.elapsed().as_secs_f64());
            break;
        }
        let m = held.get_or_insert_with(|| Arc::new(std::mem::take(&mut mem)));
        let halted = e.advance(Store::Loaded(m), u64::MAX, &mut out, stop);
        out.r.epoch_seconds.push(t.elapsed().as_secs_f64());
        if halted {
            break;
        }
    }
    let Out { hist, r, .. } = out;
    r.seconds = started.elapsed().as_secs_f64();
    r.batch_latency_us = Latency::of(&hist);
    r.units_per_batch = 0.0;
    Ok(())
}
