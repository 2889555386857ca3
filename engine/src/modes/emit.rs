//! Cuts one rank's batches out of an epoch's record sequence, given record by record in
//! epoch order: the batch, rank, tail and resume rules of `order::Split`, applied the same
//! way by every mode that produces its sequence itself (two-pass, the shuffle buffer)
//! rather than planning reads per batch (LIRS).

use std::time::Instant;

use crossbeam_channel::Sender;
use hdrhistogram::Histogram;

use std::sync::Arc;

use super::{Batch, Payload, PayloadLender, Ranks, ReadReport};
use crate::order::{Split, Tail};
use crate::pipeline::Stop;
use crate::Result;

/// Builds the batches of one rank from the epoch's record sequence, in order.
pub(crate) struct Emitter<'a> {
    split: Split,
    records: u64,
    first_batch: u64,
    pos: u64,
    pad_keep: Vec<(u64, Vec<u8>)>,
    pad_needed: u64,
    /// The batch being filled: its index, end position, the batch, and when it started.
    cur: Option<(u64, u64, Batch, Instant)>,
    tx: &'a Sender<Result<Batch>>,
    /// The run's stop flag, checked as each batch completes.
    stop: &'a Stop,
    epoch: u64,
    hist: &'a mut Histogram<u64>,
    report: &'a mut ReadReport,
    /// The run is stopping (the flag was seen, or the consumer has gone): nothing more is
    /// sent, and callers stop feeding records.
    pub(crate) stopped: bool,
    /// Mean record size of the dataset, to size each batch's payload once.
    mean_record: f64,
    /// Where batches are assembled when the consumer lends memory, and the longest record
    /// (a batch asks for room for its records at that size, then gives back the rest).
    lender: Option<(PayloadLender, u64)>,
    /// A shared pass's ranks: a batch of a rank not in it is skipped.
    ranks: Option<Arc<Ranks>>,
    /// Positions before this belong to a skipped batch.
    skip_end: u64,
    /// When the run started: the report's time to the first batch counts from here.
    run_started: Option<Instant>,
    /// The dataset, to describe each batch's records (labels, a mixture's ids and sources).
    ds: Option<&'a crate::dataset::Dataset>,
}

impl<'a> Emitter<'a> {
    /// An emitter for `epoch` that sends this rank's batches from `first_batch` on (earlier
    /// ones are cut but not sent: a resume). `mean_record` sizes the payloads.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        split: Split,
        first_batch: u64,
        epoch: u64,
        mean_record: f64,
        tx: &'a Sender<Result<Batch>>,
        stop: &'a Stop,
        hist: &'a mut Histogram<u64>,
        report: &'a mut ReadReport,
    ) -> Self {
        Emitter {
            split,
            records: split.records,
            first_batch,
            pos: 0,
            pad_keep: Vec::new(),
            pad_needed: Self::pad_records(&split),
            cur: None,
            tx,
            stop,
            epoch,
            hist,
            report,
            stopped: false,
            mean_record,
            lender: None,
            ranks: None,
            skip_end: 0,
            run_started: None,
            ds: None,
        }
    }

    /// Describes each batch's records from `ds` ([`Batch::describe`]).
    pub(crate) fn described(mut self, ds: &'a crate::dataset::Dataset) -> Self {
        self.ds = Some(ds);
        self
    }

    /// Reports the time from `started` to the first batch sent, if none was before.
    pub(crate) fn timed(mut self, started: Instant) -> Self {
        self.run_started = Some(started);
        self
    }

    /// Assembles batches in memory `lender` lends, when it can; `max_record` is the
    /// dataset's longest record.
    pub(crate) fn lend_from(mut self, lender: Option<PayloadLender>, max_record: u64) -> Self {
        self.lender = lender.map(|l| (l, max_record));
        self
    }

    /// Skips the batches of ranks not in `ranks` (a shared pass), when given.
    pub(crate) fn shared(mut self, ranks: Option<Arc<Ranks>>) -> Self {
        self.ranks = ranks;
        self
    }

    /// Records from the epoch's start kept in memory to pad its last round of batches.
    pub(crate) fn pad_records(split: &Split) -> u64 {
        match split.tail {
            Tail::Pad => (split.global_batches * split.batch)
                .saturating_sub(split.remaining())
                .min(split.records),
            _ => 0,
        }
    }
}

/// Capacity for a batch of `n` records: the mean size with some room, so that growing
/// (and copying) the payload is rare; at least the first record's size each.
fn payload_hint(n: usize, mean: f64, first: usize) -> usize {
    let guess = (n as f64 * mean * 1.25) as usize + 4096;
    guess.max(n.saturating_mul(first)).min(256 << 20)
}

impl Emitter<'_> {
    /// Takes the next record of the epoch's sequence.
    pub(crate) fn push(&mut self, id: u64, bytes: &[u8]) {
        let p = self.pos;
        self.pos += 1;
        if p < self.pad_needed {
            self.pad_keep.push((id, bytes.to_vec()));
        }
        self.place(p, id, bytes, false);
    }

    /// Takes the next position of the epoch's sequence without its record (a unit a
    /// streamed read left out of its piles); returns whether this emitter needed it (the
    /// caller's error).
    pub(crate) fn pass(&mut self, id: u64) -> bool {
        let p = self.pos;
        self.pos += 1;
        if p < self.pad_needed {
            // Kept in its place; a padding position of this rank's would have wanted it.
            self.pad_keep.push((id, Vec::new()));
        }
        let Some(local) = p.checked_sub(self.split.start) else {
            return false;
        };
        let g = local / self.split.batch;
        !self.stopped
            && g < self.split.global_batches
            && g % self.split.world == self.split.rank
            && g / self.split.world >= self.first_batch
            && self.ranks.as_ref().is_none_or(|r| r.in_frozen(g))
    }

    fn place(&mut self, p: u64, id: u64, bytes: &[u8], padding: bool) {
        if self.stopped {
            return;
        }
        // Positions before a resumed split's start were consumed before this read.
        let Some(local) = p.checked_sub(self.split.start) else {
            return;
        };
        let g = local / self.split.batch;
        if g >= self.split.global_batches || g % self.split.world != self.split.rank {
            return;
        }
        let j = g / self.split.world;
        if j < self.first_batch || p < self.skip_end {
            return;
        }
        let split = self.split;
        if self.cur.is_none() {
            // The first record of batch `j`: decide it once, for all its records.
            if let Some(r) = &self.ranks {
                if !r.wanted(self.epoch, g) {
                    self.skip_end = split.positions(j).end;
                    return;
                }
            }
        }
        let epoch = self.epoch;
        let (_, end, batch, _) = self.cur.get_or_insert_with(|| {
            let positions = split.positions(j);
            // Sized once for its records; the payload guess (the first record's size each) grows if short.
            let n = (positions.end - positions.start) as usize;
            let own = || Payload::with_capacity(payload_hint(n, self.mean_record, bytes.len()));
            let payload = match &self.lender {
                None => own(),
                Some((l, max)) => {
                    let room =
                        usize::try_from((n as u64).saturating_mul(*max)).unwrap_or(usize::MAX);
                    match l.0.lend(j, n, room) {
                        Some(buf) => Payload::lent(buf, 0),
                        None => own().refused(),
                    }
                }
            };
            let batch = Batch {
                epoch,
                index: j,
                ids: Vec::with_capacity(n),
                offsets: Vec::with_capacity(n + 1),
                payload,
                padding: 0,
                labels: Vec::new(),
                sources: Vec::new(),
                ready_ns: 0,
            };
            (j, positions.end, batch, Instant::now())
        });
        let end = *end;
        if batch.offsets.is_empty() {
            batch.offsets.push(0);
        }
        batch.ids.push(id);
        batch.payload.extend_from_slice(bytes);
        batch.offsets.push(batch.payload.len() as u64);
        if padding {
            batch.padding += 1;
        }
        if p + 1 == end {
            let (_, _, mut b, started) = self.cur.take().expect("current batch");
            if self.stop.is_set() {
                self.stopped = true;
                return;
            }
            b.payload.seal();
            if let Some(ds) = self.ds {
                b.describe(ds);
            }
            b.ready_ns = super::monotonic_ns();
            self.hist
                .saturating_record(started.elapsed().as_micros().max(1) as u64);
            self.report.records += b.ids.len() as u64;
            self.report.bytes += b.payload.len() as u64;
            self.report.batches += 1;
            if let (1, Some(t)) = (self.report.batches, self.run_started) {
                self.report.first_batch_seconds = t.elapsed().as_secs_f64();
            }
            // A lender may take the batch over here (announced by it).
            let b = match &self.lender {
                Some((l, _)) => l.0.ready(b),
                None => Some(b),
            };
            if let Some(b) = b {
                if self.tx.send(Ok(b)).is_err() {
                    self.stopped = true;
                }
            }
        }
    }

    /// The epoch's records are all out: pad the tail from the epoch's start.
    ///
    /// A run that stopped part way (its consumer gone, or its stop flag set between two
    /// piles) gave fewer records than the epoch has, so the padding it kept may be short:
    /// it pads nothing and counts as stopped. (A shared two-pass job whose last rank left
    /// after one batch stopped the pile pass at a pile boundary without the emitter seeing
    /// the flag, and padding then indexed past what was kept.)
    pub(crate) fn finish(&mut self) {
        if self.split.tail != Tail::Pad || self.stopped {
            return;
        }
        if self.pos < self.records || self.stop.is_set() {
            self.stopped = true;
            return;
        }
        let keep = std::mem::take(&mut self.pad_keep);
        for p in self.records..self.split.start + self.split.global_batches * self.split.batch {
            // Checked per padded position: a padded round may be long (a wide world).
            if self.stopped {
                return;
            }
            let Some((id, bytes)) = keep.get((p % self.records) as usize) else {
                self.stopped = true;
                return;
            };
            self.place(p, *id, bytes, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run stopped part way through its epoch (the consumer gone, or the stop flag set
    /// between two piles) then finishes its emitter: it pads nothing and says it stopped,
    /// where it used to index past the padding it had kept.
    #[test]
    fn finishing_a_stopped_epoch_pads_nothing_and_does_not_panic() {
        // Rank 0 of two: the padded epoch is 16 positions, so six records are kept.
        let split = Split::new(10, 4, 0, 2, Tail::Pad).unwrap();
        for stop_flag in [false, true] {
            let (tx, rx) = crossbeam_channel::bounded(16);
            let stop = Stop::default();
            let mut hist = Histogram::<u64>::new(3).unwrap();
            let mut report = ReadReport::default();
            let mut em = Emitter::new(split, 0, 0, 8.0, &tx, &stop, &mut hist, &mut report);
            // One batch out, then the run stops: five of the ten records are given.
            for id in 0..5 {
                em.push(id, &[id as u8; 8]);
            }
            if stop_flag {
                stop.set();
            }
            em.finish();
            assert!(em.stopped);
            drop(em);
            let sent: Vec<_> = rx.try_iter().map(|b| b.unwrap().ids).collect();
            assert_eq!(sent, vec![vec![0, 1, 2, 3]]);
        }
    }

    /// A whole epoch still pads its last batch from the epoch's start.
    #[test]
    fn a_whole_epoch_pads_its_tail_from_its_start() {
        let split = Split::new(10, 4, 0, 1, Tail::Pad).unwrap();
        let (tx, rx) = crossbeam_channel::bounded(16);
        let stop = Stop::default();
        let mut hist = Histogram::<u64>::new(3).unwrap();
        let mut report = ReadReport::default();
        let mut em = Emitter::new(split, 0, 0, 8.0, &tx, &stop, &mut hist, &mut report);
        for id in 0..10 {
            em.push(id, &[id as u8; 8]);
        }
        em.finish();
        assert!(!em.stopped);
        drop(em);
        let sent: Vec<_> = rx.try_iter().map(|b| b.unwrap()).collect();
        let ids: Vec<_> = sent.iter().map(|b| b.ids.clone()).collect();
        assert_eq!(
            ids,
            vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9, 0, 1]]
        );
        assert_eq!(sent[2].padding, 2);
    }
}
