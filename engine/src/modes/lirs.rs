//! LIRS mode: each epoch's table says which records form each batch; the records (or, with
//! page grouping, the runs of records of one unit) are read straight from the device at
//! the configured queue depth and assembled into contiguous batches. An I/O thread runs
//! ahead of the consumer by a bounded number of batches.

mod epoch;

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use hdrhistogram::Histogram;

use super::{Baseline, Batch, Latency, ReadOptions, ReadReport};
use crate::dataset::Dataset;
use crate::io::{IoConfig, RangeReader};
use crate::order::{EpochKey, EpochTable, Units};
use crate::pipeline::Stop;
use crate::resources::{Limits, LirsPlan};
use crate::{Error, Result};
use epoch::{read_epoch, Walked};

/// Batches as they arrive; [`BatchStream::report`] once it is exhausted. Dropping it (or
/// [`finish`](BatchStream::finish)) stops the read at once, wherever it is (a two-pass
/// scatter included): no more reads are issued, those in flight are reaped, and scratch
/// piles are removed before it returns.
pub struct BatchStream {
    rx: Receiver<Result<Batch>>,
    report: Arc<Mutex<ReadReport>>,
    thread: Option<JoinHandle<()>>,
    /// The run's stop flag: set before the receiver is dropped, checked by every loop of
    /// the run, so it does not wait for its next send to notice.
    stop: Stop,
    /// Dropped when the stream stops: a stream fed by a shared pass leaves its job.
    guard: Option<Box<dyn Send>>,
}

impl Iterator for BatchStream {
    type Item = Result<Batch>;
    fn next(&mut self) -> Option<Result<Batch>> {
        match self.rx.recv() {
            Ok(b) => Some(b),
            Err(_) => {
                // The I/O thread is gone: a normal end, or a panic that must not pass for
                // the end of the epoch.
                let t = self.thread.take()?;
                match t.join() {
                    Ok(()) => None,
                    Err(p) => {
                        let what = p
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "unknown panic".into());
                        Some(Err(Error::Internal(format!(
                            "the I/O thread failed: {what}"
                        ))))
                    }
                }
            }
        }
    }
}

impl BatchStream {
    /// What the read did (complete once the stream has ended).
    pub fn report(&self) -> ReadReport {
        self.report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stops the stream where it is (reads in flight are waited for, scratch removed) and
    /// returns what it did up to there.
    pub fn finish(mut self) -> ReadReport {
        self.stop();
        self.report()
    }

    /// Whether [`next`](Iterator::next) would return at once (a batch, an error or the
    /// end), waiting up to `wait` for it. For a consumer that must not block on the
    /// engine for long (the daemon takes a client's CLOSE while a scatter runs).
    pub fn ready_within(&self, wait: Duration) -> bool {
        // Once the sender is gone (the end, or a stop) the receiver is ready at once.
        let mut sel = crossbeam_channel::Select::new();
        sel.recv(&self.rx);
        sel.ready_timeout(wait).is_ok()
    }

    fn stop(&mut self) {
        // The flag stops the I/O thread and its helpers at their next check (a range, a
        // chunk, a batch), wherever they are; the receiver dropped makes a send that is
        // blocked fail. The thread then reaps the requests it has in flight, removes its
        // scratch, and exits.
        self.stop.set();
        let (_, dead) = crossbeam_channel::bounded(0);
        self.rx = dead;
        self.guard = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for BatchStream {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Reads `opts.epochs` epochs of `ds` in LIRS mode, or in a baseline's order
/// (`opts.baseline`; the shuffle buffer streams through its own module).
///
/// ```
/// # fn main() -> riffle::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let path = dir.path().join("train.npy");
/// # let spec = riffle::gen::GenSpec { format: riffle::gen::GenFormat::Npy, records: 1000,
/// #     record_size: 64, jitter: 0.0, labels: 10, sorted: false, seed: 0 };
/// # riffle::gen::generate(&path, &spec, &Default::default(), &mut |_, _| {})?;
/// use riffle::dataset::{Dataset, OpenOptions};
/// use riffle::modes::{read, ReadOptions};
///
/// let ds = Dataset::open(&[&path], &OpenOptions::default(), &mut |_, _, _| {})?;
/// for batch in read(ds.into(), ReadOptions::new(256))? {
///     let batch = batch?;
///     assert_eq!(batch.offsets.len(), batch.ids.len() + 1);
///     println!("batch {} starts with records {:?}", batch.index, &batch.ids[..4]);
/// }
/// # Ok(())
/// # }
/// ```
pub fn read(ds: Arc<Dataset>, opts: ReadOptions) -> Result<BatchStream> {
    if ds.is_empty() {
        return Err(Error::Invalid("the dataset has no records".into()));
    }
    // The shuffle buffer streams the dataset sequentially: a mode of its own.
    if let Some(Baseline::Buffer { size }) = opts.baseline {
        return super::buffer::read(ds, opts, size);
    }
    // Check the split, epochs and cursor now so argument errors surface before any
    // thread starts.
    opts.check(ds.len())?;
    let units = units_for(&ds, &opts);
    let (plan, resources) =
        crate::resources::lirs_plan(&super::demand(&ds, &units, &opts), &Limits::here(None))?;
    let prefetch = plan.prefetch;
    BatchStream::spawn("riffle-lirs", prefetch, move |tx, stop, r| {
        r.resources = Some(resources);
        run(&ds, &units, &opts, &plan, tx, stop, r)
    })
}

/// The dataset files a read's random reader may keep open: as the options say, else the
/// process's share.
fn open_files_of(opts: &ReadOptions) -> usize {
    opts.open_files
        .unwrap_or_else(crate::dataset::open_file_cap)
}

/// The shuffling units a LIRS read of `ds` with `opts` walks: the grouping's, or a
/// baseline's blocks.
pub fn units_for(ds: &Dataset, opts: &ReadOptions) -> Units {
    match opts.baseline {
        None => Units::new(&ds.layout(), opts.grouping),
        Some(Baseline::Bmf { block }) => Units::blocks(ds.len(), block),
        // One unit of everything: the table is trivial and the walker yields file order.
        // (The shuffle buffer streams through its own module; it has no units.)
        Some(Baseline::Sequential) | Some(Baseline::Buffer { .. }) => {
            Units::blocks(ds.len(), ds.len())
        }
    }
}

/// The engine memory a LIRS read of `ds` over `units` (from [`units_for`]) with `opts`
/// would own (tables, indexes, buffers, batches), or the error the read would fail with (a
/// budget too small). For the planner.
pub fn memory_needs(ds: &Dataset, units: &Units, opts: &ReadOptions) -> Result<u64> {
    if ds.is_empty() {
        return Err(Error::Invalid("the dataset has no records".into()));
    }
    let d = super::demand(ds, units, opts);
    Ok(crate::resources::lirs(&d, &Limits::here(None))?.memory_bytes)
}

impl BatchStream {
    /// Runs `work` on a new I/O thread that sends batches through a channel of `capacity`
    /// and fills in the report; an error ends the stream as its last item.
    ///
    /// `work` checks the stop flag it is given between pieces of work and returns (`Ok`)
    /// soon after it is set.
    pub(crate) fn spawn<F>(name: &str, capacity: usize, work: F) -> Result<BatchStream>
    where
        F: FnOnce(&Sender<Result<Batch>>, &Stop, &mut ReadReport) -> Result<()> + Send + 'static,
    {
        let (tx, rx) = crossbeam_channel::bounded(capacity.max(1));
        let report = Arc::new(Mutex::new(ReadReport::default()));
        let shared = report.clone();
        let stop = Stop::default();
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut r = ReadReport::default();
                let outcome = work(&tx, &flag, &mut r);
                *shared.lock().unwrap_or_else(|p| p.into_inner()) = r;
                if let Err(e) = outcome {
                    let _ = tx.send(Err(e));
                }
            })
            .map_err(|e| Error::os("cannot start the I/O thread", e))?;
        Ok(BatchStream {
            rx,
            report,
            thread: Some(thread),
            stop,
            guard: None,
        })
    }

    /// A stream of the batches another thread sends through `rx` (a shared pass's fan-out);
    /// `guard` is dropped when the stream stops or is dropped.
    pub(crate) fn fed(rx: Receiver<Result<Batch>>, guard: Box<dyn Send>) -> BatchStream {
        BatchStream {
            rx,
            report: Default::default(),
            thread: None,
            stop: Stop::default(),
            guard: Some(guard),
        }
    }
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
    let io = read_io(ds, opts, plan, r);
    let mut reader = ds.reader_capped(&io, open_files_of(opts))?;
    said_io(r, &reader);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("histogram");
    r.mode = opts.baseline.map(|b| b.name()).unwrap_or("lirs").into();
    r.grouping = opts.grouping.name().into();
    r.backend = reader.backend_kind().name().into();
    r.direct = reader.direct();
    r.queue_depth = plan.depth;
    r.set_sizes(plan, units, ds, reader.buffer_bytes() as u64, 0);
    let epochs = opts.epoch_range()?;
    let mut total_reads = 0u64;
    for epoch in epochs {
        if stop.is_set() {
            break;
        }
        let t = Instant::now();
        let table = EpochTable::build(units.len(), &EpochKey::new(opts.seed, epoch));
        r.table_seconds += t.elapsed().as_secs_f64();
        let walked = Walked {
            table: &table,
            covers: ds.len(),
        };
        let out = read_epoch(
            ds,
            units,
            opts,
            plan,
            &mut reader,
            walked,
            epoch,
            None,
            tx,
            stop,
            &mut hist,
            r,
            started,
        )?;
        total_reads += out.reads;
        if out.stopped {
            break;
        }
    }
    finish_report(r, &reader, total_reads, started, &hist);
    Ok(())
}

/// The I/O of a LIRS read planned as `plan`: the depth as planned (lower than asked for a
/// dataset of more files than the reader keeps open, `resources::read_depth`), and its
/// requests submitted as its device pays for (`probe::submit_choice`, said in the report).
fn read_io(ds: &Dataset, opts: &ReadOptions, plan: &LirsPlan, r: &mut ReadReport) -> IoConfig {
    let asked = opts.io.submit_batch;
    let choice = match ds.files().first() {
        Some(f) => crate::probe::submit_choice(&f.path, asked),
        None => crate::probe::SubmitChoice {
            batch: asked.max(1),
            why: "a dataset of no files".into(),
        },
    };
    r.io_submit = format!("{}: {}", choice.shown(), choice.why);
    IoConfig {
        slot_size: plan.slot_size,
        depth: plan.depth,
        submit_batch: choice.batch,
        ..opts.io.clone()
    }
}

/// The backend's features in the report; a read the pread pool carries (io_uring
/// unavailable, or `RIFFLE_IO=pread`) submits nothing in batches, whatever was chosen.
fn said_io(r: &mut ReadReport, reader: &RangeReader) {
    r.io_features = reader.backend_features();
    if reader.backend_kind() != crate::io::BackendKind::Uring {
        r.io_submit = "each at once: the pread thread pool".into();
    }
}

/// What a LIRS read did, once it has: its reads per batch, the reader's counts, its time
/// and batch latency.
fn finish_report(
    r: &mut ReadReport,
    reader: &RangeReader,
    reads: u64,
    started: Instant,
    hist: &Histogram<u64>,
) {
    let s = reader.stats();
    r.units_per_batch = reads as f64 / r.batches.max(1) as f64;
    r.read_ops = s.read_ops;
    r.device_bytes = s.device_bytes;
    r.seconds = started.elapsed().as_secs_f64();
    r.batch_latency_us = Latency::of(hist);
}

/// A LIRS read leading a two-pass read's first epoch (see [`lead`]): which batches it
/// takes. It claims batches in order while the pile pass is not ready; the pile pass then
/// [`close`](Lead::close)s it and starts at the first batch it did not claim.
#[derive(Debug)]
pub(crate) struct Lead {
    state: Mutex<LeadState>,
    /// Signalled when the lead sends its first batch or closes.
    first: std::sync::Condvar,
}

#[derive(Debug)]
struct LeadState {
    /// The first batch not claimed.
    next: u64,
    closed: bool,
    /// Whether the lead has sent a batch.
    sent: bool,
}

impl Lead {
    /// A lead whose first batch is `first` (the resume point's, or 0).
    pub(crate) fn new(first: u64) -> Lead {
        Lead {
            state: Mutex::new(LeadState {
                next: first,
                closed: false,
                sent: false,
            }),
            first: std::sync::Condvar::new(),
        }
    }

    /// The lead sent a batch (the first wakes [`Lead::wait_first`]).
    fn sent(&self) {
        let mut s = self.lock();
        if !s.sent {
            s.sent = true;
            self.first.notify_all();
        }
    }

    /// Waits, at most `limit`, until the lead has sent its first batch or has closed:
    /// the scatter starts after it, so the first batch's random reads do not queue behind
    /// the scatter's large sequential ones (measured here: 2.6x LIRS's time to the first
    /// batch with both at once).
    pub(crate) fn wait_first(&self, limit: std::time::Duration) {
        let s = self.lock();
        let _ = self
            .first
            .wait_timeout_while(s, limit, |s| !s.sent && !s.closed)
            .unwrap_or_else(|p| p.into_inner());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LeadState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the lead may read batch `j` (asked in order): not once it is closed.
    fn claim(&self, j: u64) -> bool {
        let mut s = self.lock();
        if s.closed {
            return false;
        }
        s.next = s.next.max(j + 1);
        true
    }

    /// The first batch not claimed yet.
    #[cfg(test)]
    pub(crate) fn claimed(&self) -> u64 {
        self.lock().next
    }

    /// Ends the lead's claims: the batches before the returned one are the lead's (it
    /// still completes and sends those it claimed), the rest the pile pass's.
    pub(crate) fn close(&self) -> u64 {
        let mut s = self.lock();
        s.closed = true;
        self.first.notify_all();
        s.next
    }
}

/// The memory a lead of a read of `ds` over `units` with `opts` takes in `budget` bytes:
/// (table entries, the plan), or `None` when not even a small table and one batch fit.
fn lead_plan(
    ds: &Dataset,
    units: &Units,
    opts: &ReadOptions,
    budget: u64,
) -> Option<(u64, LirsPlan)> {
    // The table covers a quarter of the epoch at most (a lead is done when the scatter
    // is, long before that on a flash device), in a quarter of the budget at most; the
    // rest is for buffers and batches, and a lead reads a few batches ahead, no more.
    let width = if units.len() <= u32::MAX as u64 { 4 } else { 8 };
    let entries = (budget / 4 / (2 * width)).min(units.len() / 4);
    let o = ReadOptions {
        memory: Some(budget),
        prefetch: opts.prefetch.min(4),
        ..opts.clone()
    };
    let d = super::demand(ds, units, &o);
    // Beside the scatter's reader: the depth the open-file limit allows.
    let (depth, _) = crate::resources::read_depth(&d, &Limits::here(None));
    let plan = LirsPlan::new(&crate::resources::Demand { depth, ..d }, entries).ok()?;
    // A prefix that cannot cover one batch is no lead.
    (entries as f64 * units.mean_records() >= opts.batch as f64).then_some((entries, plan))
}

/// Reads the first batches of `epoch` with LIRS while a two-pass read scatters it, in
/// at most `budget` bytes (the pile pass's memory, idle until the scatter ends): through a
/// prefix of the epoch's table, claiming each batch from `lead` and sending it on `tx`,
/// until the lead is closed or the prefix runs out. Returns what it did, or `None` when
/// the budget is too small for a useful lead (nothing was read).
#[allow(clippy::too_many_arguments)]
pub(crate) fn lead(
    ds: &Dataset,
    units: &Units,
    opts: &ReadOptions,
    epoch: u64,
    budget: u64,
    lead: &Lead,
    tx: &Sender<Result<Batch>>,
    stop: &Stop,
) -> Result<Option<ReadReport>> {
    let started = Instant::now();
    let Some((entries, plan)) = lead_plan(ds, units, opts, budget) else {
        lead.close();
        return Ok(None);
    };
    #[cfg(test)]
    let entries =
        super::twopass::tests_hold::of(opts.seed).map_or(entries, |(_, u)| entries.min(u));
    let key = EpochKey::new(opts.seed, epoch);
    let Some(table) = EpochTable::prefix(units.len(), &key, entries, &|| stop.is_set()) else {
        lead.close();
        return Ok(None);
    };
    let covers = if table.len() >= units.len() {
        ds.len()
    } else {
        (0..table.len())
            .map(|i| {
                let u = units.records(table.unit_at(i));
                u.end - u.start
            })
            .sum()
    };
    let mut r = ReadReport {
        table_seconds: started.elapsed().as_secs_f64(),
        table_bytes: table.bytes(),
        ..Default::default()
    };
    let io = read_io(ds, opts, &plan, &mut r);
    let mut reader = ds.reader_capped(&io, open_files_of(opts))?;
    said_io(&mut r, &reader);
    r.buffer_bytes = reader.buffer_bytes() as u64;
    r.prefetch_bytes = plan.batches_bytes();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("histogram");
    let walked = Walked {
        table: &table,
        covers,
    };
    let out = read_epoch(
        ds,
        units,
        opts,
        &plan,
        &mut reader,
        walked,
        epoch,
        Some(lead),
        tx,
        stop,
        &mut hist,
        &mut r,
        started,
    );
    // Whatever happened, the lead takes no more batches.
    lead.close();
    let out = out?;
    finish_report(&mut r, &reader, out.reads, started, &hist);
    Ok(Some(r))
}
