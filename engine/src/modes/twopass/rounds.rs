//! Rounds: a streamed two-pass epoch whose piles do not fit `--cache-limit` at once is done
//! in `R` rounds, each a windowed scatter.
//!
//! Piles hold consecutive key ranges and the pile pass emits them in key order, so the key
//! space can be cut into `R` contiguous ranges, one per round. Round `r` reads the node's
//! objects in order again and frames only the units whose key falls in its range (the
//! others are dropped: their own round frames them, skip frames included); its pile pass
//! emits them, with the same emitter as the rounds before it, and its piles are deleted
//! (their local disk given back) before round `r + 1` scatters. Concatenated, the rounds'
//! pile passes give every unit in global key order: the same batches as one round.
//!
//! `R` is the fewest rounds whose largest one's frames, beside the piles' slack, fit the
//! limit: each epoch's frame bytes are summed per key bucket (a 4096th of the key space)
//! and the buckets packed greedily, in key order, into rounds. `R = 1` when the node's
//! share fits, and nothing changes then. The price is `R` sequential reads of the node's
//! objects per epoch (a round GETs no chunk that holds no unit of its range, but under a
//! shuffle nearly every chunk holds some): the exact order in bounded local disk, where the
//! alternative, LIRS over ranged GETs, is bounded by a GET per record.
//!
//! The overflow held in memory: when the node's piles do not fit but the first key range
//! does not need to go to disk at all, no second round is read. The key space is cut once,
//! at the lowest bucket from which the rest fits the disk: the frames of the range below
//! it (skip frames included, in the pile frame format) are collected in memory by the
//! single scatter ([`InMemory`]), the rest go to the disk piles as in one round. The pass
//! sorts the frames in memory by key (as a loaded pile is sorted) and emits them first,
//! with the same emitter, then passes the disk piles: every unit in global key order, the
//! batches of one round, each object read once an epoch. The frames in memory, with 32
//! bytes of index and sort scratch each, may take what the plan gives the loaded piles
//! (`PilePlan::loaded_memory`, which the read's `memory_bytes` counts as `pile_bytes`):
//! they are emitted and freed before the first pile is loaded, and the pile buffers of
//! the epoch before are freed before the scatter, so the two never take memory at once.
//! When they do not fit that, the epoch is read in disk rounds as above.

use super::super::emit::Emitter;
use super::body::{emit_frames, encode_skip, Body};
use super::scan::{wanted_units, Bits, Chunker, Scan, Sequential};
use super::scatter;
use crate::dataset::Dataset;
use crate::io::IoConfig;
use crate::modes::ReadOptions;
use crate::order::{EpochKey, Units};
use crate::piles::PileSet;
use crate::pipeline::Stop;
use crate::resources::{Limits, PilePlan};
use crate::size::human_bytes;
use crate::{Error, Result};

/// log2 of the key buckets rounds are cut on.
const BUCKET_BITS: u32 = 12;

/// How far ahead of its writes a streamed read grows its pile files at most (its local
/// disk is capped, and this is part of what it charges).
const STREAMED_STEP: u64 = 1 << 20;

/// How far ahead of its writes a streamed read within `limit` bytes of local disk grows
/// each pile file of `layout`: [`STREAMED_STEP`], or under a small limit less, so that the
/// group files' steps together take at most a sixty-fourth of it (64 KiB at least: a
/// fixed 1 MiB a file took 16 MiB of a 5 MiB limit with 16 files).
pub(super) fn streamed_step(layout: &crate::piles::Layout, limit: u64) -> u64 {
    (limit / 64 / layout.groups() as u64).clamp(64 << 10, STREAMED_STEP)
}

/// One round's key range: the units whose key's bucket is in `[lo, hi)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Round {
    lo: u32,
    hi: u32,
}

impl Round {
    /// Whether `key` is in this round's range.
    #[inline]
    pub(super) fn has(&self, key: u64) -> bool {
        let b = (key >> (64 - BUCKET_BITS)) as u32;
        self.lo <= b && b < self.hi
    }
}

/// An epoch's rounds, in key order, and the local disk the largest takes.
#[derive(Clone, Debug)]
pub(super) struct Rounds {
    rounds: Vec<Round>,
    /// Bytes of frames in the largest round (without the piles' slack).
    pub largest: u64,
    /// The key range below the one disk round, held in memory: its range, and the bytes
    /// and count of its frames.
    held: Option<(Round, u64, u64)>,
}

impl Rounds {
    /// How many.
    pub(super) fn len(&self) -> usize {
        self.rounds.len()
    }

    /// Round `i`, or `None` when there is one round only (the whole key space, no filter).
    pub(super) fn get(&self, i: usize) -> Option<Round> {
        (self.rounds.len() > 1 || self.held.is_some())
            .then(|| self.rounds.get(i).copied())
            .flatten()
    }

    /// The frames of the range held in memory, empty, with room for them; `None` when
    /// every frame goes to disk.
    pub(super) fn in_memory(&self) -> Option<InMemory> {
        self.held.map(|(round, bytes, frames)| InMemory {
            round,
            data: Vec::with_capacity(bytes as usize),
            frames: Vec::with_capacity(frames as usize),
        })
    }
}

/// Memory a held range takes beside its frames' bytes, per frame: its (key, offset) index
/// entry and the sort's scratch, as the plan counts a loaded pile's.
const HELD_PER_FRAME: u64 = 32;

/// The frames of an epoch's lowest key range, collected by its scatter in memory rather
/// than on local disk, and emitted before the disk piles (see the module's note).
pub(super) struct InMemory {
    round: Round,
    data: Vec<u8>,
    frames: Vec<(u64, usize)>,
}

impl InMemory {
    /// Whether `key` is in the held range.
    #[inline]
    pub(super) fn has(&self, key: u64) -> bool {
        self.round.has(key)
    }

    /// Its range.
    pub(super) fn round(&self) -> Round {
        self.round
    }

    /// Starts a frame under `key` with a body of `len` bytes (appended after).
    pub(super) fn begin(&mut self, key: u64, len: u64) {
        let (h, n) = crate::piles::frame::head(key, len);
        self.frames.push((key, self.data.len()));
        self.data.extend_from_slice(&h[..n]);
    }

    /// Frames unit `u` of a chunk read at `start` (`bytes`) into the range held in memory, as
    /// the scatter frames it into a pile: a skip frame when the node does not keep it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn unit(
        &mut self,
        u: u64,
        key: &EpochKey,
        wanted: Option<&Bits>,
        units: &Units,
        ds: &Dataset,
        bytes: &[u8],
        start: u64,
    ) {
        let mut head = Vec::new();
        if wanted.is_some_and(|w| !w.has(u)) {
            encode_skip(&mut head, u);
            self.begin(key.key(u), head.len() as u64);
            self.append(&head);
            return;
        }
        let locs: Vec<_> = units.records(u).map(|id| ds.locate(id)).collect();
        let body = Body::encode(&mut head, u, locs.iter().map(|l| l.len));
        self.begin(key.key(u), body);
        self.append(&head);
        for l in &locs {
            let from = (l.offset - start) as usize;
            self.append(&bytes[from..from + l.len as usize]);
        }
    }

    /// Appends to the frame begun last.
    pub(super) fn append(&mut self, bytes: &[u8]) {
        self.data.extend_from_slice(bytes);
    }

    /// The memory it takes: its frames' bytes and their index.
    pub(super) fn memory(&self) -> u64 {
        self.data.len() as u64 + HELD_PER_FRAME * self.frames.len() as u64
    }

    /// Sorts the frames by key, as a loaded pile is, and emits their records through `em`.
    pub(super) fn emit(mut self, units: &Units, em: &mut Emitter<'_>) -> Result<()> {
        let mut scratch = Vec::new();
        crate::order::sort_uniform(&mut self.frames, &mut scratch, |f| f.0);
        emit_frames(&self.data, &self.frames, units, None, em)
    }
}

/// The rounds of an epoch keyed by `key` for a node keeping `wanted` (`None`: every unit),
/// within `limit` bytes of local disk of which the piles' slack takes `slack`; `frames` is
/// every unit's frame bytes, which when it fits makes one round with no count per bucket.
/// Past the disk, one round and the lowest key range held in memory when that range takes
/// at most `memory` bytes (frames and index). An error naming the figures when even one
/// bucket's frames do not fit.
#[allow(clippy::too_many_arguments)]
pub(super) fn cut(
    ds: &Dataset,
    units: &Units,
    key: &EpochKey,
    wanted: Option<&Bits>,
    limit: u64,
    (slack, step): (u64, u64),
    frames: u64,
    memory: u64,
) -> Result<Rounds> {
    // A sixty-fourth of the room is left for the filesystem's own rounding.
    let room = limit.saturating_sub(slack);
    let room = room - room / 64;
    let whole = Round {
        lo: 0,
        hi: 1 << BUCKET_BITS,
    };
    if frames <= room {
        return Ok(Rounds {
            rounds: vec![whole],
            largest: frames,
            held: None,
        });
    }
    let head = crate::piles::frame::HEAD as u64 + 12;
    let mut buckets = vec![0u64; 1 << BUCKET_BITS];
    let mut counts = vec![0u64; 1 << BUCKET_BITS];
    for u in 0..units.len() {
        let b = (key.key(u) >> (64 - BUCKET_BITS)) as usize;
        counts[b] += 1;
        buckets[b] += if wanted.is_some_and(|w| !w.has(u)) {
            head
        } else {
            units
                .records(u)
                .map(|id| {
                    let len = ds.locate(id).len;
                    len + if len > u32::MAX as u64 { 8 } else { 4 }
                })
                .sum::<u64>()
                + head
        };
    }
    let rounds = pack(&buckets, room).map_err(|need| {
        Error::OverBudget(format!(
            "--cache-limit leaves {} for piles beside the cached layouts and headers: the \
             piles take {} of local disk this epoch, and a round of \
             1/{} of them needs {} beside the piles' slack of {} (the pile files grown {} \
             ahead, each pile's last chunk), which leaves {}; give a larger --cache-limit, or \
             read on more nodes (each keeps only its ranks' records)",
            human_bytes(limit as f64),
            human_bytes(buckets.iter().sum::<u64>() as f64),
            1 << BUCKET_BITS,
            human_bytes(need as f64),
            human_bytes(slack as f64),
            human_bytes(step as f64),
            human_bytes(room as f64),
        ))
    })?;
    Ok(hold(&buckets, &counts, room, memory).unwrap_or(rounds))
}

/// One disk round of the highest buckets that fit `room` and the rest below them held in
/// memory, when that rest's frames (`buckets` bytes, `counts` frames) and their index take
/// at most `memory` bytes; `None` otherwise.
fn hold(buckets: &[u64], counts: &[u64], room: u64, memory: u64) -> Option<Rounds> {
    // The lowest bucket from which the rest fits the disk.
    let (mut lo, mut disk) = (buckets.len(), 0u64);
    while lo > 0 && disk + buckets[lo - 1] <= room {
        lo -= 1;
        disk += buckets[lo];
    }
    let bytes: u64 = buckets[..lo].iter().sum();
    let frames: u64 = counts[..lo].iter().sum();
    (lo > 0 && bytes + HELD_PER_FRAME * frames <= memory).then(|| Rounds {
        rounds: vec![Round {
            lo: lo as u32,
            hi: buckets.len() as u32,
        }],
        largest: disk,
        held: Some((
            Round {
                lo: 0,
                hi: lo as u32,
            },
            bytes,
            frames,
        )),
    })
}

/// Packs `buckets` (bytes each), in order, into the fewest contiguous rounds of at most
/// `room` bytes each (greedy, which is the fewest for contiguous ranges); `Err` with the
/// bytes of a bucket that alone does not fit.
fn pack(buckets: &[u64], room: u64) -> std::result::Result<Rounds, u64> {
    let mut rounds = Vec::new();
    let (mut lo, mut held, mut largest) = (0u32, 0u64, 0u64);
    for (b, &n) in buckets.iter().enumerate() {
        if n > room {
            return Err(n);
        }
        if held + n > room {
            rounds.push(Round { lo, hi: b as u32 });
            largest = largest.max(held);
            (lo, held) = (b as u32, 0);
        }
        held += n;
    }
    rounds.push(Round {
        lo,
        hi: buckets.len() as u32,
    });
    Ok(Rounds {
        rounds,
        largest: largest.max(held),
        held: None,
    })
}

/// The rounds of an epoch still to scatter once its first round's piles are emitted, and
/// what their scatters read with.
pub(super) struct Pending {
    pub rounds: Rounds,
    /// The next round.
    pub next: usize,
    pub wanted: Option<Bits>,
    pub epoch: u64,
    pub key: EpochKey,
}

impl Pending {
    /// Gives back the local disk `charged` for the round just emitted (its piles are gone)
    /// and scatters the next round from `reader`: its piles (`None` when no round is left,
    /// or the run was stopped part-way), `charged` and `bytes` counting what it wrote.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn next(
        &mut self,
        ds: &Dataset,
        units: &Units,
        plan: &PilePlan,
        io: &IoConfig,
        reader: &mut Scan,
        scratch: &std::path::Path,
        stop: &Stop,
        charged: &mut u64,
        bytes: &mut u64,
    ) -> Result<Option<PileSet>> {
        if let Some(o) = reader.objects() {
            o.release(std::mem::take(charged));
        }
        let Some(round) = self.rounds.get(self.next) else {
            return Ok(None);
        };
        self.next += 1;
        let mut from = Sequential {
            scan: reader,
            epoch: self.epoch,
            wanted: self.wanted.take(),
            round: Some(round),
            // A streamed read holds nothing in memory.
            from: 0,
            memory: None,
        };
        let scattered = scatter(ds, units, plan, io, &mut from, &self.key, scratch, stop);
        self.wanted = from.wanted;
        let s = scattered?;
        *charged += s.charged;
        *bytes += s.bytes;
        Ok(s.piles)
    }
}

/// What a streamed two-pass read of a dataset in object storage takes (see
/// [`streamed_figures`]), for the planner.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StreamedFigures {
    /// Ranged GETs per epoch (each object read once per round, in ranges of the scatter's
    /// reads).
    pub gets_per_epoch: u64,
    /// Bytes fetched per epoch (the node's objects once per round).
    pub bytes_per_epoch: u64,
    /// Rounds per epoch: sequential reads of the node's objects (1 when its piles fit the
    /// limit at once; 0 when even a round does not fit, see `unfit`).
    pub rounds: u64,
    /// Local disk at the peak: the largest round's piles of this read's streams' share of
    /// the records, the other units' skip frames, and the piles' slack.
    pub local_disk: u64,
    /// Engine memory: the two-pass plan's and the GET bodies in flight.
    pub memory: u64,
    /// Why no number of rounds fits the limit, if none does.
    pub unfit: Option<String>,
}

/// What a two-pass read of `ds` with `opts` would take were its files objects streamed
/// from a store within `limit` bytes of local disk (what `riffle plan` shows against a
/// staged copy): the rounds of its first epoch, and each round's reads.
pub fn streamed_figures(ds: &Dataset, opts: &ReadOptions, limit: u64) -> Result<StreamedFigures> {
    let units = Units::new(&ds.layout(), opts.grouping);
    let (_, plan, resources) = crate::resources::two_pass_plan(
        &super::super::demand(ds, &units, opts),
        &Limits::here(None),
    )?;
    let chunks = Chunker {
        ds,
        units: &units,
        target: plan.scan_size - 8192,
        next: 0,
    };
    let (gets, bytes) = chunks.fold((0, 0), |(n, b), c| (n + 1, b + c.stop - c.start));
    // One stream keeps about 1/world of the units; a shared pass (or one stream) all.
    let kept = if opts.world > 1 && opts.ranks.is_none() {
        1.0 / opts.world as f64
    } else {
        1.0
    };
    let skip = (crate::piles::frame::HEAD + 12) as f64 * units.len() as f64 * (1.0 - kept);
    let slack = plan.layout.disk_slack(streamed_step(&plan.layout, limit));
    let local = (plan.frames as f64 * kept + skip) as u64;
    let key = EpochKey::new(opts.seed, 0);
    // A plan of several nodes may not have chosen how an uneven tail goes: its share is
    // about the same with the tail dropped.
    let split = opts.split_for(0, ds.len()).or_else(|_| {
        ReadOptions {
            tail: crate::order::Tail::DropLast,
            ..opts.clone()
        }
        .split_for(0, ds.len())
    })?;
    let wanted = wanted_units(&units, &split, 0, &key, opts.ranks.as_deref());
    let (rounds, local_disk, unfit) =
        match plan_within(ds, &units, &key, wanted.as_ref(), limit, &plan) {
            Ok(r) => (r.len() as u64, r.largest + slack, None),
            Err(e) => (0, local + slack, Some(e.to_string())),
        };
    let times = rounds.max(1);
    Ok(StreamedFigures {
        gets_per_epoch: gets * times,
        bytes_per_epoch: bytes * times,
        rounds,
        local_disk,
        memory: resources.memory_bytes,
        unfit,
    })
}

/// [`cut`] for a node keeping `wanted` under `plan`'s piles within `limit`.
pub(super) fn plan_within(
    ds: &Dataset,
    units: &Units,
    key: &EpochKey,
    wanted: Option<&Bits>,
    limit: u64,
    plan: &PilePlan,
) -> Result<Rounds> {
    // Every unit's frame bytes, or (a node keeping a share) an upper bound on them.
    let frames = plan
        .frames
        .saturating_add(units.len() * (crate::piles::frame::HEAD as u64 + 12));
    let step = streamed_step(&plan.layout, limit);
    let slack = plan.layout.disk_slack(step);
    // The frames held in memory take what the loaded piles would (see the module's note).
    let memory = plan.loaded_memory();
    cut(ds, units, key, wanted, limit, (slack, step), frames, memory)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_are_the_fewest_contiguous_ranges_within_the_room() {
        // Everything fits: one round over the whole key space.
        let r = pack(&[3, 3, 3, 3], 12).unwrap();
        assert_eq!((r.len(), r.largest, r.get(0)), (1, 12, None));
        // Two rounds of 6; each holds the keys of its buckets only.
        let r = pack(&[3, 3, 3, 3], 7).unwrap();
        assert_eq!((r.len(), r.largest), (2, 6));
        let (a, b) = (r.get(0).unwrap(), r.get(1).unwrap());
        let key_of = |bucket: u64| bucket << (64 - BUCKET_BITS);
        assert!(a.has(key_of(0)) && a.has(key_of(1)) && !a.has(key_of(2)));
        assert!(b.has(key_of(2)) && b.has(key_of(3)) && !b.has(key_of(1)));
        // Uneven buckets: greedy in order.
        let r = pack(&[5, 1, 1, 5, 2], 6).unwrap();
        assert_eq!(r.len(), 3);
        // A bucket larger than the room: no number of rounds fits; its bytes named.
        assert_eq!(pack(&[1, 9, 1], 8).unwrap_err(), 9);
    }

    #[test]
    fn the_overflow_held_in_memory_is_the_lowest_range_past_what_the_disk_takes() {
        let (buckets, counts) = ([3, 3, 3, 3], [1, 1, 1, 1]);
        // Two buckets fit the disk: the highest two; the lowest two held (6 bytes and two
        // frames of index) when the memory takes them.
        let r = hold(&buckets, &counts, 7, 6 + 2 * HELD_PER_FRAME).unwrap();
        assert_eq!((r.len(), r.largest), (1, 6));
        let key_of = |bucket: u64| bucket << (64 - BUCKET_BITS);
        let disk = r.get(0).unwrap();
        assert!(!disk.has(key_of(1)) && disk.has(key_of(2)) && disk.has(key_of(3)));
        let m = r.in_memory().unwrap();
        assert!(m.has(key_of(0)) && m.has(key_of(1)) && !m.has(key_of(2)));
        // A byte less of memory: no hold, the disk rounds stand.
        assert!(hold(&buckets, &counts, 7, 5 + 2 * HELD_PER_FRAME).is_none());
    }
}
