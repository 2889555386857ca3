//! One LIRS epoch's read: its batches planned from the epoch's table, their reads handed
//! to the reader a few batches ahead, and each batch sent, in order, once its reads are in.

use std::cell::{RefCell, RefMut};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Instant;

use crossbeam_channel::Sender;
use hdrhistogram::Histogram;

use super::super::payload::Recycler;
use super::super::walk::Walker;
use super::super::{Batch, Payload, PayloadLender, ReadOptions, ReadReport};
use super::Lead;
use crate::dataset::Dataset;
use crate::io::RangeReader;
use crate::order::{EpochTable, Split, Units};
use crate::pipeline::Stop;
use crate::resources::{LirsPlan, MAX_MERGE};
use crate::{Error, Result};

/// A batch being assembled.
struct Pending {
    ids: Vec<u64>,
    offsets: Vec<u64>,
    /// Where the bytes of its reads go; each read's [`Piece`] names its run of these.
    parts: Vec<Part>,
    payload: Payload,
    padding: usize,
    missing: usize,
    started: Instant,
}

/// Bytes of one read that go to one place in the payload: `len` bytes from `from` in the
/// read to `to` in the payload. Records back to back in the file (and so in the payload)
/// are one part: a read of a unit's fixed-size records is copied in one piece.
#[derive(Clone, Copy)]
struct Part {
    from: usize,
    len: usize,
    to: usize,
}

/// Where the bytes of one read go: the parts `parts` of its batch's [`Pending::parts`]
/// (nothing allocated per read).
#[derive(Clone)]
struct Piece {
    batch: u64,
    parts: std::ops::Range<usize>,
}

/// The pieces of the reads handed to the reader and not yet reaped, by read number: read
/// `i` is at `i - first` (reads are handed in order and reaped in any order; the slots of
/// those reaped at the front are dropped).
#[derive(Default)]
struct InFlight {
    first: usize,
    pieces: VecDeque<Option<Piece>>,
}

impl InFlight {
    /// Read `i`'s piece, handed after every earlier one.
    fn insert(&mut self, i: usize, piece: Piece) {
        debug_assert_eq!(
            i,
            self.first + self.pieces.len(),
            "reads are handed in order"
        );
        self.pieces.push_back(Some(piece));
    }

    /// Takes read `i`'s piece.
    fn remove(&mut self, i: usize) -> Option<Piece> {
        let piece = self.pieces.get_mut(i.checked_sub(self.first)?)?.take();
        while let Some(None) = self.pieces.front() {
            self.pieces.pop_front();
            self.first += 1;
        }
        piece
    }
}

/// Scratch of `plan_batch`, kept from batch to batch (no allocation per batch for them).
#[derive(Default)]
struct Scratch {
    units: Vec<u64>,
    locs: Vec<crate::dataset::RecordLoc>,
}

struct EpochState<'a> {
    walker: Walker<'a>,
    split: Split,
    /// The batch after the last one to read: the epoch's end, or where a lead stopped.
    end: u64,
    next_batch: u64,
    /// Reads not yet handed to the reader for the batch being planned.
    queue: VecDeque<(usize, u64, usize, Piece)>,
    pieces: InFlight,
    handed: usize,
    scratch: Scratch,
    /// The payload buffers of batches the consumer has dropped, for the next batches.
    pool: std::sync::Arc<Recycler>,
    pending: HashMap<u64, Pending>,
    done: BTreeMap<u64, Pending>,
    /// Batches skipped (a shared pass's ranks that did not join) still ahead of
    /// `next_send`; `next_send` is either `next_batch` or a batch being read.
    skipped: BTreeSet<u64>,
    reads: u64,
    next_send: u64,
    stopped: bool,
    error: Option<Error>,
}

impl<'a> EpochState<'a> {
    /// An epoch's read through `walker` from batch `first` of `split`.
    fn new(walker: Walker<'a>, split: Split, first: u64) -> Self {
        EpochState {
            walker,
            split,
            end: split.batches(),
            next_batch: first,
            queue: Default::default(),
            pieces: InFlight::default(),
            handed: 0,
            scratch: Scratch::default(),
            pool: Recycler::new(KEEP),
            pending: HashMap::new(),
            done: BTreeMap::new(),
            skipped: BTreeSet::new(),
            reads: 0,
            next_send: first,
            stopped: false,
            error: None,
        }
    }
}

/// The table an epoch is walked through, and how many records of the epoch's sequence it
/// covers (all of them, or those of a prefix table's units).
#[derive(Clone, Copy)]
pub(super) struct Walked<'a> {
    pub(super) table: &'a EpochTable,
    pub(super) covers: u64,
}

/// How an epoch's read ended.
pub(super) struct EpochOutcome {
    pub(super) reads: u64,
    /// Stopped (the flag, or the consumer gone): no later epoch is read.
    pub(super) stopped: bool,
}

/// Reads `epoch`'s batches (from the resume cursor's, in its epoch) through `walked`:
/// every batch, or, leading a two-pass read (`lead`), the batches the lead may claim
/// that the table covers.
#[allow(clippy::too_many_arguments)]
pub(super) fn read_epoch(
    ds: &Dataset,
    units: &Units,
    opts: &ReadOptions,
    plan: &LirsPlan,
    reader: &mut RangeReader,
    walked: Walked<'_>,
    epoch: u64,
    lead: Option<&Lead>,
    tx: &Sender<Result<Batch>>,
    stop: &Stop,
    hist: &mut Histogram<u64>,
    r: &mut ReadReport,
    started: Instant,
) -> Result<EpochOutcome> {
    let split = opts.split_for(epoch, ds.len())?;
    let first = match opts.resume {
        Some(c) if c.epoch == epoch => c.batch.min(split.batches()),
        _ => 0,
    };
    let walker = match opts.baseline {
        None => Walker::new(walked.table, units),
        Some(_) => Walker::baseline(walked.table, units),
    };
    let state = RefCell::new(EpochState::new(walker, split, first));
    let e = EpochRead {
        ds,
        opts,
        plan,
        walked,
        epoch,
        lead,
        tx,
        stop,
        started,
    };
    // read_ranges returns when the iterator runs dry; with the assembly bound it can run
    // dry early, so go again until every batch is out.
    loop {
        let ranges = std::iter::from_fn(|| e.next_read(&mut state.borrow_mut()));
        reader.read_ranges(ranges, |i, bytes| e.reaped(&state, i, bytes, hist, r))?;
        let st = state.borrow();
        if st.stopped || st.error.is_some() || st.next_send >= st.end {
            break;
        }
    }
    let mut st = state.into_inner();
    if let Some(e) = st.error.take() {
        return Err(e);
    }
    Ok(EpochOutcome {
        reads: st.reads,
        stopped: st.stopped,
    })
}

/// An epoch's read apart from its state: what it reads and how, and where its batches go.
struct EpochRead<'a> {
    ds: &'a Dataset,
    opts: &'a ReadOptions,
    plan: &'a LirsPlan,
    walked: Walked<'a>,
    epoch: u64,
    lead: Option<&'a Lead>,
    tx: &'a Sender<Result<Batch>>,
    stop: &'a Stop,
    started: Instant,
}

impl EpochRead<'_> {
    /// The next read to hand the reader, planning batches as their reads are wanted; `None`
    /// when stopped, at the end, or at the bound on batches under assembly.
    fn next_read(&self, st: &mut EpochState<'_>) -> Option<(usize, u64, usize)> {
        let (ds, opts, plan, walked, epoch) =
            (self.ds, self.opts, self.plan, self.walked, self.epoch);
        // Checked per read: once the stream is stopped, no read is issued and
        // read_ranges only reaps those in flight.
        if st.stopped || self.stop.is_set() {
            st.stopped = true;
            return None;
        }
        while st.queue.is_empty() {
            // Bound the batches under assembly (the memory plan counts on it); the
            // oldest one still has reads in flight, so the reader comes back.
            if st.next_batch >= st.end || st.next_batch - st.next_send >= plan.assembling {
                return None;
            }
            let j = st.next_batch;
            if let Some(l) = self.lead {
                // A lead reads only what its table covers, and only until the pile
                // pass takes over (then the batches it claimed are its last).
                let covered =
                    walked.covers >= ds.len() || st.split.positions(j).end <= walked.covers;
                if !covered || !l.claim(j) {
                    st.end = j;
                    return None;
                }
            }
            if !opts.wanted(epoch, j) {
                // A shared pass skips the batches of ranks that never joined, up to a
                // million ranks' worth in a row: a stop is heard among them too.
                if j.is_multiple_of(4096) && self.stop.is_set() {
                    st.stopped = true;
                    return None;
                }
                st.next_batch += 1;
                if st.next_send == j {
                    st.next_send += 1;
                } else {
                    st.skipped.insert(j);
                }
                continue;
            }
            plan_batch(st, ds, opts.lender.as_ref());
        }
        let (file, offset, len, piece) = st.queue.pop_front().expect("queued read");
        let i = st.handed;
        st.handed += 1;
        st.pieces.insert(i, piece);
        Some((file, offset, len))
    }

    /// Copies read `i`'s `bytes` into their batch, and sends the batches that completes, in
    /// order.
    fn reaped(
        &self,
        state: &RefCell<EpochState<'_>>,
        i: usize,
        bytes: &[u8],
        hist: &mut Histogram<u64>,
        r: &mut ReadReport,
    ) {
        let mut st = state.borrow_mut();
        if st.stopped {
            // Reads reaped after a stop: nobody takes their batches.
            return;
        }
        let piece = st.pieces.remove(i).expect("piece of a read");
        let batch = st.pending.get_mut(&piece.batch).expect("pending batch");
        for p in &batch.parts[piece.parts] {
            let (from, len) = (p.from, p.len);
            match bytes.get(from..from + len) {
                Some(src) => batch.payload[p.to..p.to + len].copy_from_slice(src),
                None => {
                    st.error.get_or_insert(Error::Internal(
                        "a read came back shorter than its records".into(),
                    ));
                    st.stopped = true;
                    return;
                }
            }
        }
        batch.missing -= 1;
        if batch.missing == 0 {
            let b = st.pending.remove(&piece.batch).expect("pending batch");
            st.done.insert(piece.batch, b);
            self.send_ready(state, st, hist, r);
        }
    }

    /// Sends the assembled batches next in order (past those skipped), counting them in
    /// `r` and `hist`; `st` is released while each is sent.
    // A batch is a large value, and so is the error of a failed send of one (which hands
    // it back); it is sent once and dropped at once.
    #[allow(clippy::result_large_err)]
    fn send_ready<'s, 'w>(
        &self,
        state: &'s RefCell<EpochState<'w>>,
        mut st: RefMut<'s, EpochState<'w>>,
        hist: &mut Histogram<u64>,
        r: &mut ReadReport,
    ) {
        let (ds, opts, lead) = (self.ds, self.opts, self.lead);
        loop {
            let index = st.next_send;
            if st.skipped.remove(&index) {
                st.next_send += 1;
                continue;
            }
            let Some(b) = st.done.remove(&index) else {
                break;
            };
            st.next_send += 1;
            hist.saturating_record(b.started.elapsed().as_micros().max(1) as u64);
            r.records += b.ids.len() as u64;
            r.bytes += b.payload.len() as u64;
            r.batches += 1;
            if r.batches == 1 {
                r.first_batch_seconds = self.started.elapsed().as_secs_f64();
            }
            let mut out = Batch {
                epoch: self.epoch,
                index,
                ids: b.ids,
                offsets: b.offsets,
                payload: b.payload,
                padding: b.padding,
                labels: Vec::new(),
                sources: Vec::new(),
                ready_ns: super::super::monotonic_ns(),
            };
            out.describe(ds);
            drop(st);
            // A lender may take the batch over here (announced by it).
            let out = match &opts.lender {
                Some(l) => l.0.ready(out),
                None => Some(out),
            };
            let sent = out.map_or(Ok(()), |out| self.tx.send(Ok(out)));
            if let (Some(l), Ok(())) = (lead, &sent) {
                l.sent();
            }
            st = state.borrow_mut();
            if sent.is_err() {
                st.stopped = true;
                return;
            }
        }
    }
}

/// Payload buffers kept idle for the next batches (a consumer that drops each batch before
/// taking the next gives one back per batch; the read takes one per batch).
const KEEP: usize = 4;

/// The most bytes between two records that a merged read may skip over.
const MAX_GAP: u64 = 4096;

/// Works out the records of the next batch, allocates its payload (in lent memory when
/// the consumer lends some) and queues its reads:
/// one per record, or one per run of records of one unit (page grouping).
fn plan_batch(st: &mut EpochState<'_>, ds: &Dataset, lender: Option<&PayloadLender>) {
    let j = st.next_batch;
    st.next_batch += 1;
    let positions = st.split.positions(j);
    let n = ds.len();
    let count = (positions.end - positions.start) as usize;
    let mut ids = Vec::with_capacity(count);
    let Scratch { units, locs } = &mut st.scratch;
    units.clear();
    locs.clear();
    let mut padding = 0;
    for p in positions {
        if p >= n {
            padding += 1;
        }
        let (id, t) = st.walker.at(p % n);
        ids.push(id);
        units.push(t);
        locs.push(ds.locate(id));
    }
    // Offsets of the records in the payload.
    let mut offsets = Vec::with_capacity(count + 1);
    let mut total = 0u64;
    offsets.push(0);
    for l in locs.iter() {
        total += l.len;
        offsets.push(total);
    }
    // Reads: consecutive records of the same unit occurrence share one read.
    let mut parts: Vec<Part> = Vec::new();
    let mut reads = 0usize;
    let mut i = 0usize;
    while i < count {
        let mut k = i + 1;
        while k < count
            && units[k] == units[i]
            && ids[k] == ids[k - 1] + 1
            && locs[k].file == locs[i].file
            && locs[k].offset + locs[k].len - locs[i].offset <= MAX_MERGE
            && locs[k].offset - (locs[k - 1].offset + locs[k - 1].len) <= MAX_GAP
        {
            k += 1;
        }
        let start = locs[i].offset;
        let end = locs[k - 1].offset + locs[k - 1].len;
        let first = parts.len();
        for m in i..k {
            let (from, len) = ((locs[m].offset - start) as usize, locs[m].len as usize);
            let ours = parts.len() > first;
            match parts.last_mut() {
                // Back to back in the read (and so in the payload): one copy.
                Some(last) if ours && last.from + last.len == from => {
                    last.len += len;
                }
                _ => parts.push(Part {
                    from,
                    len,
                    to: offsets[m] as usize,
                }),
            }
        }
        st.queue.push_back((
            locs[i].file,
            start,
            (end - start) as usize,
            Piece {
                batch: j,
                parts: first..parts.len(),
            },
        ));
        reads += 1;
        i = k;
    }
    st.reads += reads as u64;
    st.pending.insert(
        j,
        Pending {
            ids,
            offsets,
            parts,
            // Every byte is a record's, copied in before the batch is sent: a recycled
            // buffer's old bytes never reach the consumer.
            payload: Payload::sized_in(lender, Some(&st.pool), j, count, total as usize),
            padding,
            missing: reads,
            started: Instant::now(),
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::GenFormat;
    use crate::order::{EpochKey, Grouping, Tail};

    /// Page grouping of 512 B records in 4 KiB units: each read is a unit's run of records,
    /// copied into its batch in one piece, and the pieces of the reads in flight are found
    /// by number whatever order they come back in.
    #[test]
    fn a_page_grouped_read_of_fixed_records_is_one_copy() {
        let dir = tempfile::tempdir().unwrap();
        let ds = super::super::super::tests::make(dir.path(), GenFormat::Fixed, 4096, 512, 0.0);
        let units = Units::new(&ds.layout(), Grouping::Page { unit: 4096 });
        let table = EpochTable::build(units.len(), &EpochKey::new(7, 0));
        let split = Split::new(ds.len(), 256, 0, 1, Tail::Partial).unwrap();
        let mut st = EpochState::new(Walker::new(&table, &units), split, 0);
        plan_batch(&mut st, &ds, None);
        let reads = st.queue.len();
        assert!(
            (32..=64).contains(&reads),
            "{reads} reads for 256 records in 8-record units"
        );
        let batch = &st.pending[&0];
        assert_eq!(batch.parts.len(), reads, "one part (one copy) per read");
        for (i, (_, _, len, piece)) in st.queue.iter().enumerate() {
            assert_eq!(piece.parts, i..i + 1);
            let p = batch.parts[i];
            assert_eq!((p.from, p.len), (0, *len), "the whole read, in one piece");
        }
        // Handed in order, reaped out of order: each read's piece, once.
        let mut flight = InFlight::default();
        for (i, (.., piece)) in st.queue.iter().enumerate() {
            flight.insert(i, piece.clone());
        }
        for i in (1..reads).rev() {
            assert_eq!(flight.remove(i).map(|p| p.parts), Some(i..i + 1));
            assert_eq!(flight.first, 0, "read 0 is still in flight");
        }
        assert_eq!(flight.remove(0).map(|p| p.parts), Some(0..1));
        assert!(flight.remove(0).is_none() && flight.remove(reads - 1).is_none());
        assert!(flight.pieces.is_empty() && flight.first == reads);
    }
}
