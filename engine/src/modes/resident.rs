//! Resident mode: memory as the first tier. The first epoch reads the dataset's files whole,
//! in file order, with large sequential direct reads into one aligned buffer the run owns
//! (on transparent huge pages), and sends each of its batches, in order, as soon as every
//! record of it has arrived; every later epoch is a permutation of that memory, with no
//! I/O. Batches are decided by the same table and walker as LIRS's: the same batches, in
//! the same order, as `lirs` and `two-pass`.
//!
//! The memory is a [`Held`]: an object apart from the read, which a daemon keeps and shares
//! between every read of the dataset (other jobs, seeds, ranks, later passes). The first
//! read that finds it empty loads it (sending its own batches as they complete); reads that
//! come meanwhile wait for the load, and every read after copies out of it with no I/O.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

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
    read_resident_in(ds, opts, None)
}

/// [`read_resident`] with `scratch` for piles: a partly resident read then takes the part
/// it does not hold through two-pass piles there (sequential reads and writes of that
/// part each epoch) when they fit its free space, rather than with random reads.
pub fn read_resident_in(
    ds: Arc<Dataset>,
    opts: ReadOptions,
    scratch: Option<std::path::PathBuf>,
) -> Result<BatchStream> {
    if !ds.is_empty() && opts.baseline.is_none() {
        let units = super::lirs::units_for(&ds, &opts);
        // Not whole: what the budget holds of it, if that is worth holding.
        if let Err(Error::OverBudget(whole)) = needs(&ds, &units, &opts, &Limits::here(None)) {
            return super::partial::read_partly_resident(ds, opts, scratch).map_err(|e| match e {
                Error::OverBudget(part) => Error::OverBudget(format!("{whole}; partly: {part}")),
                e => e,
            });
        }
    }
    let held = Arc::new(Held::new(&ds)?);
    read_held(ds, opts, held)
}

/// The scratch a resident read of `ds` with `opts` will write into `scratch`, given what
/// other runs there reserved (`others`, bytes and files): the piles of its rest when it
/// holds the files in part and they fit, else none (held whole, or the rest read by LIRS).
/// What `riffle read` reserves for it, so ranks deciding at once share the disk as two-pass
/// runs do; [`super::partial::read_partly_resident`] decides the same way.
pub fn piled_rest_scratch(
    ds: &Dataset,
    opts: &ReadOptions,
    scratch: &std::path::Path,
    others: (u64, u64),
) -> Option<(u64, u64)> {
    if ds.is_empty() || opts.baseline.is_some() {
        return None;
    }
    let units = super::lirs::units_for(ds, opts);
    if !matches!(
        needs(ds, &units, opts, &Limits::here(None)),
        Err(Error::OverBudget(_))
    ) {
        return None;
    }
    let d = super::demand(ds, &units, opts);
    let limits = super::partial::beside_others(Limits::here(Some(scratch)), others);
    let (_, resources) = crate::resources::partial_piled_plan(&d, ds.bytes(), &limits).ok()?;
    Some((
        resources.scratch_bytes,
        resources.figure("scratch_files").map_or(0, |f| f.value),
    ))
}

/// Refuses what no resident read takes: an empty dataset, or a baseline's order.
pub(super) fn refuse_unreadable(ds: &Dataset, opts: &ReadOptions) -> Result<()> {
    if ds.is_empty() {
        return Err(Error::Invalid("the dataset has no records".into()));
    }
    if opts.baseline.is_some() {
        return Err(Error::Invalid(
            "resident mode reads the order contract's batches, not a baseline's".into(),
        ));
    }
    Ok(())
}

/// [`read_resident`] out of `held`, the memory of `ds`'s files that other reads may share:
/// loaded by this read if nobody has loaded it yet, waited for while another read loads
/// it, else only copied out of (no I/O). `opts.memory` is the budget of the read with the
/// copy in it (a daemon adds the copy's bytes, which it charges once for all its reads, to
/// each read's own). Refused when `held` was made for files of other sizes.
pub fn read_held(ds: Arc<Dataset>, opts: ReadOptions, held: Arc<Held>) -> Result<BatchStream> {
    refuse_unreadable(&ds, &opts)?;
    let sizes: Vec<u64> = ds.files().iter().map(|f| f.size).collect();
    if sizes != held.sizes {
        return Err(Error::Invalid(format!(
            "the memory held for {} file(s) of {} bytes is not that of this dataset's {} \
             file(s) of {} bytes",
            held.sizes.len(),
            held.sizes.iter().sum::<u64>(),
            sizes.len(),
            ds.bytes()
        )));
    }
    opts.check(ds.len())?;
    let units = super::lirs::units_for(&ds, &opts);
    let (plan, resources) = needs(&ds, &units, &opts, &Limits::here(None))?;
    BatchStream::spawn("riffle-resident", plan.prefetch, move |tx, stop, r| {
        r.resources = Some(resources);
        let _reading = held.reading();
        run(&ds, &units, &opts, &plan, &held, tx, stop, r)
    })
}

/// A dataset's files held whole in memory, shared by the reads of it (see the module
/// docs): empty, being loaded by one read, or loaded. A load its read gave up (the
/// consumer stopped, or an error) leaves it empty again, and the next read loads it.
pub struct Held {
    /// The size of each file it holds, in order.
    sizes: Vec<u64>,
    /// The bytes it takes when loaded (huge-page rounded).
    bytes: u64,
    state: Mutex<HeldState>,
    changed: Condvar,
    counts: LoadCounts,
}

/// What a held copy's loads read and the reads using it now: a whole copy's ([`Held`]) and
/// a daemon's part's (`HeldPrefix`) alike.
#[derive(Debug, Default)]
pub struct LoadCounts {
    loads: AtomicU64,
    device_bytes: AtomicU64,
    read_ops: AtomicU64,
    readers: AtomicU64,
}

impl LoadCounts {
    /// Loads finished: 1 once loaded (a load given up leaves it empty and counts none).
    pub fn loads(&self) -> u64 {
        self.loads.load(Ordering::Relaxed)
    }

    /// Bytes its loads read from the device, in all.
    pub fn device_bytes(&self) -> u64 {
        self.device_bytes.load(Ordering::Relaxed)
    }

    /// Reads its loads issued, in all.
    pub fn read_ops(&self) -> u64 {
        self.read_ops.load(Ordering::Relaxed)
    }

    /// Reads using it now.
    pub fn readers(&self) -> u64 {
        self.readers.load(Ordering::Relaxed)
    }

    /// Counts what a load read: `bytes` in `ops` reads.
    pub(super) fn read(&self, bytes: u64, ops: u64) {
        self.device_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.read_ops.fetch_add(ops, Ordering::Relaxed);
    }

    /// Counts a load finished.
    pub(super) fn loaded(&self) {
        self.loads.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a read that starts using it; [`LoadCounts::leave`] when it ends.
    pub(super) fn enter(&self) {
        self.readers.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a read that ends.
    pub(super) fn leave(&self) {
        self.readers.fetch_sub(1, Ordering::Relaxed);
    }
}

enum HeldState {
    Empty,
    Loading,
    Loaded(Arc<Memory>),
}

/// What a read finds when it needs the memory: loaded, or its turn to load it.
enum Claim<'a> {
    Loaded(Arc<Memory>),
    Load(Loading<'a>),
    Stopped,
}

/// A read's turn to load a [`Held`]: given back (empty, the waiting reads woken) unless
/// [`Loading::done`].
struct Loading<'a>(&'a Held);

impl Loading<'_> {
    /// Publishes the loaded memory to every read.
    fn done(self, mem: Memory) -> Arc<Memory> {
        let mem = Arc::new(mem);
        *self.0.lock() = HeldState::Loaded(mem.clone());
        self.0.counts.loaded();
        self.0.changed.notify_all();
        std::mem::forget(self);
        mem
    }
}

impl Drop for Loading<'_> {
    fn drop(&mut self) {
        *self.0.lock() = HeldState::Empty;
        self.0.changed.notify_all();
    }
}

/// Counts a read of a [`Held`] while it lasts.
struct Reading<'a>(&'a Held);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.0.counts.leave();
    }
}

/// How often a read waiting for another's load looks whether its own stream stopped.
const LOOK_AGAIN: Duration = Duration::from_millis(100);

impl Held {
    /// Empty memory for `ds`'s files; nothing is allocated until a read loads it.
    pub fn new(ds: &Dataset) -> Result<Held> {
        let total = ds
            .files()
            .iter()
            .try_fold(0u64, |t, f| t.checked_add(f.size));
        let bytes = total
            .and_then(crate::resources::resident_bytes)
            .ok_or_else(|| {
                Error::OverBudget("the dataset's files do not fit this address space whole".into())
            })?;
        Ok(Held {
            sizes: ds.files().iter().map(|f| f.size).collect(),
            bytes,
            state: Mutex::new(HeldState::Empty),
            changed: Condvar::new(),
            counts: LoadCounts::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HeldState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The bytes it takes loaded (the files' bytes, huge-page rounded).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether it holds the files now.
    pub fn is_loaded(&self) -> bool {
        matches!(*self.lock(), HeldState::Loaded(_))
    }

    /// `empty`, `loading` or `loaded`.
    pub fn state(&self) -> &'static str {
        match *self.lock() {
            HeldState::Empty => "empty",
            HeldState::Loading => "loading",
            HeldState::Loaded(_) => "loaded",
        }
    }

    /// What its loads read, and the reads using it now.
    pub fn counts(&self) -> &LoadCounts {
        &self.counts
    }

    fn reading(&self) -> Reading<'_> {
        self.counts.enter();
        Reading(self)
    }

    /// The loaded memory, or this read's turn to load it; waits while another read loads
    /// it, until `stop`.
    fn claim(&self, stop: &Stop) -> Claim<'_> {
        let mut st = self.lock();
        loop {
            match &*st {
                HeldState::Loaded(m) => return Claim::Loaded(m.clone()),
                HeldState::Empty => {
                    *st = HeldState::Loading;
                    return Claim::Load(Loading(self));
                }
                HeldState::Loading if stop.is_set() => return Claim::Stopped,
                HeldState::Loading => {
                    st = (self.changed)
                        .wait_timeout(st, LOOK_AGAIN)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }
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

/// The memory of `held`, for the first epoch `e` this read sends: loaded by this read when
/// it is empty (sending `e`'s batches as they complete), else waited for while another
/// read loads it. `None` when the stream stopped.
fn obtain(
    ds: &Dataset,
    held: &Held,
    e: &mut EpochEmit<'_>,
    out: &mut Out<'_>,
    stop: &Stop,
) -> Result<Option<Arc<Memory>>> {
    let turn = match held.claim(stop) {
        Claim::Loaded(m) => return Ok(Some(m)),
        Claim::Stopped => return Ok(None),
        Claim::Load(turn) => turn,
    };
    let mut mem = Memory::new(ds)?;
    let before = (out.r.device_bytes, out.r.read_ops);
    let halted = load(ds, &mut mem, e, out, stop);
    (held.counts).read(out.r.device_bytes - before.0, out.r.read_ops - before.1);
    // Given up (stopped, or an error): `turn` leaves it empty for the next read.
    if halted? {
        return Ok(None);
    }
    Ok(Some(turn.done(mem)))
}

#[allow(clippy::too_many_arguments)]
fn run(
    ds: &Dataset,
    units: &Units,
    opts: &ReadOptions,
    plan: &LirsPlan,
    held: &Held,
    tx: &Sender<Result<Batch>>,
    stop: &Stop,
    r: &mut ReadReport,
) -> Result<()> {
    let started = Instant::now();
    r.mode = "resident".into();
    r.grouping = opts.grouping.name().into();
    let (depth, slot) = resident_scan(ds.bytes());
    r.queue_depth = depth;
    r.resident_bytes = held.bytes;
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
    let mut mem: Option<Arc<Memory>> = None;
    for epoch in opts.epoch_range()? {
        if stop.is_set() {
            break;
        }
        let t = Instant::now();
        let table = EpochTable::build(units.len(), &EpochKey::new(opts.seed, epoch));
        out.r.table_seconds += t.elapsed().as_secs_f64();
        let mut e = EpochEmit::new(&table, units, opts, epoch, ds.len())?;
        // The first epoch loads the files if nobody has, sending batches as they complete;
        // the rest of it, every later epoch (and every epoch of a read that finds them
        // loaded) only view the memory loaded (or copy it into a lender's regions).
        if mem.is_none() {
            mem = obtain(ds, held, &mut e, &mut out, stop)?;
        }
        let halted = match &mem {
            Some(m) => e.advance(Store::Loaded(m), u64::MAX, &mut out, stop),
            None => true,
        };
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
