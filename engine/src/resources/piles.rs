//! Two-pass's memory: the scatter's reads, the pile writer's fill pool, the piles loaded
//! back, and the scratch the piles take.

use super::{Demand, Figures, Kind, Limits, SCAN_DEPTH};
use crate::io::{footprint, HUGE_PAGE, MAP_THRESHOLD};
use crate::piles::Layout;
use crate::size::human_bytes;
use crate::{Error, Result};

/// log2 of the most piles one epoch uses.
pub(crate) const MAX_PILE_BITS: u32 = 12;

/// Bytes of a two-pass frame besides the record bytes and their lengths: the store's key
/// and length, the unit id and the record count (`modes/twopass.rs` checks it against its
/// frame format). Each record adds its length: 4 bytes, 8 in a wide frame.
pub(crate) const FRAME_HEAD: u64 = 12 + 12;

/// Most records one frame (one unit) holds: a u32 count word less its wide-lengths bit.
pub const MAX_FRAME_RECORDS: u64 = (1 << 31) - 1;

/// Pile count and memory shares.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PilePlan {
    /// log2 of the pile count.
    pub bits: u32,
    /// Most bytes of frames of one pile held in memory.
    pub pile_budget: u64,
    /// What such a pile takes in memory: its frames, room, index and sort scratch.
    pub pile_memory: u64,
    /// How the piles are written.
    pub layout: Layout,
    /// Bytes of frames the scatter writes.
    pub frames: u64,
    /// Bytes one batch takes.
    pub batch_bytes: u64,
    /// Size of the scatter's sequential reads (4 of them in flight).
    pub scan_size: u64,
}

impl PilePlan {
    /// The plan under `d.memory`; under a budget too tight for `d.prefetch` batches queued
    /// ahead, the read-ahead halves (down to one batch) until it fits, as LIRS's does (200
    /// records of 3 MiB in batches of 4 under --memory 64M took 60 MiB of read-ahead and
    /// were refused). Returns the read-ahead it fits with and the plan.
    pub fn fitted(d: &Demand, limits: &Limits) -> Result<(usize, PilePlan)> {
        let mut prefetch = d.prefetch.max(1);
        loop {
            let d = Demand {
                prefetch,
                ..d.clone()
            };
            match PilePlan::new(&d, limits) {
                Ok(plan) => return Ok((prefetch, plan)),
                Err(e) if (d.memory.is_none() && limits.memory.is_none()) || prefetch <= 1 => {
                    return Err(e)
                }
                Err(_) => prefetch = (prefetch / 2).max(1),
            }
        }
    }

    fn new(d: &Demand, limits: &Limits) -> Result<PilePlan> {
        if d.records == 0 {
            return Err(Error::Invalid("the dataset has no records".into()));
        }
        let frames = d
            .bytes
            .saturating_add(d.units.saturating_mul(FRAME_HEAD))
            .saturating_add(d.records.saturating_mul(4));
        let mean = frames as f64 / d.units.max(1) as f64;
        let batch_bytes = d.batch_bytes();
        let scan_size = scan_size(d.memory.or(limits.memory.map(|m| m.bytes)), d.streamed);
        let fixed = d
            .units_bytes
            .saturating_add(d.index_bytes)
            .saturating_add(d.view_bytes)
            .saturating_add((d.prefetch as u64 + 1).saturating_mul(batch_bytes))
            .saturating_add(scan_bytes(scan_size, d.streamed)); // the scatter's reader
        let budget = pile_budget(d, limits, fixed);
        // The pile store's I/O in flight scales with this (twice as much writing, three times
        // as much reading): as much as the scatter's reads, 4 MiB at most, and no more than
        // a sixteenth of the budget.
        let in_flight = (4 * scan_size).min(4 << 20).min(budget / 16) as usize;
        // The pile writer (a share of the fill pool per pile, the writes in flight, the
        // extent lists) comes off the top; the rest holds two loaded piles (double
        // buffering), each its frames, a sixteenth of room, and 32 bytes per frame (its
        // index entry and the sort's scratch).
        let writers = |piles: u64, extent: usize| {
            let l = Layout::within(piles.trailing_zeros(), extent, in_flight, limits.open_files);
            l.writer_bytes() + l.extent_list_bytes(frames) + l.reader_bytes()
        };
        // When no pile count fits with headroom: each pile's share of the fill pool is its
        // share of an eighth of the budget, from 16 KiB to 1 MiB.
        let buf_for = |piles: u64| ((budget / 8) / piles).clamp(16 << 10, 1 << 20) as usize;
        // A pile's share holds at least two of the largest units.
        let need = d
            .max_record
            .saturating_add(FRAME_HEAD + 8)
            .saturating_mul(2);
        let per_byte = 1.0 + 1.0 / 16.0 + 32.0 / mean;
        let pile_budget_of = |bits: u32, extent: usize| {
            let left = budget.saturating_sub(writers(1u64 << bits, extent));
            ((left / 2) as f64 / per_byte) as u64
        };
        // With headroom (s + 6 sqrt(s) units per pile, two piles in memory), each pile count
        // leaves some memory for the piles' shares of the fill pool, and a pile is read back
        // in extents of about twice a share: the larger, the faster (random 52 KiB reads
        // ran at 70% of 1 MiB ones here). Take the count whose piles fit with the largest
        // share (up to 1 MiB; at least 16 KiB), the fewest piles among equals.
        let fit = |bits: u32| -> Option<(usize, u64)> {
            let piles = 1u64 << bits;
            let s = d.units as f64 / piles as f64;
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
        let choice = (0..=MAX_PILE_BITS)
            .filter_map(|bits| fit(bits).map(|(extent, budget)| (bits, extent, budget)))
            .max_by_key(|&(bits, extent, _)| (extent, std::cmp::Reverse(bits)));
        // Nothing fits with headroom: piles read back in key sub-ranges. Every pile is read
        // once per sub-range, so take the pile count with the fewest passes over a pile
        // (more piles make smaller piles, but their writers leave less for the pile);
        // among equals the most piles. Only counts whose pile holds two of the largest
        // units qualify: under a small budget that is fewer piles than the most.
        let choice = choice.or_else(|| {
            (0..=MAX_PILE_BITS)
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
            let piles = 1u64 << MAX_PILE_BITS.min(4);
            let writer_bytes = writers(1, buf_for(1));
            let need_total = (2.0 * need as f64 * per_byte).ceil() as u64 + 2;
            return Err(Error::OverBudget(format!(
                "{name} is too small for two-pass: indexes, buffers and batches take {fixed} bytes, \
                 leaving {budget}; the pile writers' buffers take {writer_bytes} bytes for one pile \
                 ({many} for {piles}) and two piles in memory of two of the largest units {need_total} \
                 bytes more (at least {min_memory} bytes of memory)",
                name = d.within(limits).budget_words(),
                many = writers(piles, buf_for(piles)),
                min_memory = fixed + writer_bytes + need_total,
            )));
        };
        // A frame counts its unit's records in 31 bits: only page grouping over billions of
        // records could make a unit that holds more.
        if d.widest_unit > MAX_FRAME_RECORDS {
            return Err(Error::Invalid(format!(
                "a unit of {} records is more than a two-pass pile frame holds \
                 ({MAX_FRAME_RECORDS} records): use record grouping or a smaller --unit",
                d.widest_unit
            )));
        }
        Ok(PilePlan {
            bits,
            pile_budget,
            pile_memory: (pile_budget as f64 * per_byte) as u64,
            layout: Layout::within(bits, extent, in_flight, limits.open_files),
            frames,
            batch_bytes,
            scan_size,
        })
    }

    /// What the piles in memory take at most: two (one emitted while the next loads), or
    /// one when a single pile is loaded once, each its budget's memory, or, when the budget is larger
    /// than every frame, that of every frame (a pile holds no more). (`--memory 1T`
    /// reported 1 TiB for 1.6 GB of data, and `--memory` of 2^64 - 1 wrapped the report's
    /// sum.)
    pub fn loaded_memory(&self) -> u64 {
        let pile = if self.pile_budget > self.frames {
            (self.pile_memory as f64 * self.frames as f64 / self.pile_budget as f64) as u64
        } else {
            self.pile_memory
        };
        if self.loads_once() {
            pile
        } else {
            2 * pile
        }
    }

    /// Whether the one pile is loaded once, whole (the budget holds every frame).
    fn loads_once(&self) -> bool {
        self.piles() == 1 && self.pile_budget >= self.frames
    }

    /// The most bytes of frames one load holds.
    fn largest_load(&self) -> u64 {
        self.pile_budget.min(self.frames)
    }

    /// Number of piles.
    pub fn piles(&self) -> usize {
        1 << self.bits
    }

    /// Memory of the pile store: the writer's fill pool and writes in flight, the extent
    /// lists, the loader's reads in flight.
    pub fn writer_bytes(&self) -> u64 {
        self.layout.writer_bytes()
            + self.layout.extent_list_bytes(self.frames)
            + self.layout.reader_bytes()
    }

    /// Scratch at the peak: every unit as a frame, and, while rolling, the next epoch's
    /// piles grow as this epoch's are consumed; group files are removed as their last pile
    /// is read, so the peak is one epoch's frames and one group's. Besides, the group files
    /// grown ahead of their writes ([`Layout::local_step`]) and the piles' last chunks
    /// written whole: ranks sharing a small scratch reserved the frames alone, and the
    /// slack of two filled the disk.
    pub fn scratch_bytes(&self) -> u64 {
        let slack = self.layout.disk_slack(self.layout.local_step(self.frames));
        self.frames + self.frames / self.layout.groups() as u64 + slack
    }

    /// Every figure of the plan, with its reason (`d.prefetch` as fitted).
    pub(super) fn figures(&self, d: &Demand, limits: &Limits) -> Figures {
        let mut f = Figures(Vec::new());
        let l = &self.layout;
        f.unit_table(d);
        f.offset_index(d);
        f.push(
            "scatter_reads",
            Kind::Memory,
            scan_bytes(self.scan_size, d.streamed),
            match d.streamed {
                true => format!(
                    "{STREAMED_GETS} ranged GETs of {} in flight and the body handed on",
                    human_bytes(self.scan_size as f64)
                ),
                false => format!(
                    "{SCAN_DEPTH} sequential reads of {} in flight",
                    human_bytes(self.scan_size as f64)
                ),
            },
        );
        f.push(
            "pile_writer",
            Kind::Memory,
            l.writer_bytes(),
            format!(
                "the fill pool (a {} share for each of {} piles, in {} chunks), a write being \
                 gathered per group file ({}) and {} writes of {} in flight",
                human_bytes(l.extent as f64),
                l.piles(),
                human_bytes(l.chunk as f64),
                l.groups(),
                l.depth,
                human_bytes(l.slot as f64)
            ),
        );
        f.push(
            "extent_lists",
            Kind::Memory,
            l.extent_list_bytes(self.frames),
            "16 bytes per extent written".into(),
        );
        f.push(
            "pile_reads",
            Kind::Memory,
            l.reader_bytes(),
            format!(
                "{} reads of a {} extent in flight while a pile loads",
                l.read_depth,
                human_bytes(l.extent as f64)
            ),
        );
        f.push(
            "piles_loaded",
            Kind::Memory,
            self.loaded_memory(),
            format!(
                "{}, each its frames (at most {}), a sixteenth of room and 32 bytes a frame for \
                 its index and sort",
                if self.loads_once() {
                    "one pile in memory (every frame: it is loaded once)"
                } else {
                    "two piles in memory (one sorted and emitted while the next loads)"
                },
                human_bytes(self.largest_load() as f64)
            ),
        );
        f.read_ahead(d.prefetch, self.batch_bytes);
        self.layout_figures(&mut f, limits);
        f
    }

    /// The figures of the pile layout, the loader's ring and the scratch.
    fn layout_figures(&self, f: &mut Figures, limits: &Limits) {
        let l = &self.layout;
        f.push(
            "piles",
            Kind::Count,
            self.piles() as u64,
            "the pile count whose piles fit two in memory with headroom with the largest \
             write extents (the fewest piles among equals)"
                .into(),
        );
        f.push(
            "group_files",
            Kind::Count,
            l.groups() as u64,
            format!(
                "piles share this many files (at most 16, fewer under an open-file limit of {})",
                limits.open_files
            ),
        );
        f.push(
            "scratch_files",
            Kind::Count,
            2 * l.groups() as u64,
            "one epoch's group files, and the next epoch's while rolling".into(),
        );
        f.push(
            "write_extent",
            Kind::Size,
            2 * l.extent as u64,
            "about twice a pile's share of the fill pool per write of a pile".into(),
        );
        // The loader's ring: a slot per chunk of the load and its sixteenth of room.
        let load = self.largest_load();
        let chunks = (load + load / 16).div_ceil(l.chunk as u64);
        // The pile reader's threshold: one ring's slots, at most as many as io_uring registers.
        let direct = chunks <= limits.max_slots.min(crate::io::URING_MAX_REG_BUFFERS) as u64;
        f.push(
            "pile_load_slots",
            Kind::Count,
            if direct { chunks } else { 0 },
            if direct {
                format!(
                    "a whole pile is read straight into a ring of up to {chunks} chunk slots, \
                     {} reads in flight",
                    l.read_depth
                )
            } else {
                format!(
                    "a pile of {chunks} chunks is more than one ring's slots: it is read in \
                     pieces and copied"
                )
            },
        );
        f.push(
            "scratch",
            Kind::Scratch,
            self.scratch_bytes(),
            format!(
                "every unit as a frame ({} of frames) and one group file more while rolling",
                human_bytes(self.frames as f64)
            ),
        );
        f.push(
            "queue_depth",
            Kind::Count,
            SCAN_DEPTH.max(l.depth).max(l.read_depth) as u64,
            format!(
                "{SCAN_DEPTH} scatter reads, {} pile writes, {} pile reads in flight",
                l.depth, l.read_depth
            ),
        );
    }
}

/// `riffle shuffle`'s pile layout for an input of about `estimate` bytes under a budget of
/// `memory` and an open-file limit of `open_files`: piles of about a quarter of the budget
/// (a larger one is read in key sub-ranges), at most 4096; their shares of the fill pool
/// take an eighth, from 16 KiB to 1 MiB each, and the writes in flight another eighth (4
/// MiB at most).
pub(crate) fn shuffle_layout(estimate: u64, memory: u64, open_files: u64) -> Layout {
    let target = (memory / 4).max(1 << 20);
    let mut bits = 0;
    while (estimate >> bits) > target && bits < MAX_PILE_BITS {
        bits += 1;
    }
    let extent = ((memory / 8) / (1u64 << bits)).clamp(16 << 10, 1 << 20) as usize;
    let in_flight = usize::try_from(memory / 8)
        .unwrap_or(usize::MAX)
        .min(4 << 20);
    Layout::within(bits, extent, in_flight, open_files)
}

/// The scatter's read size: 4 MiB; under a budget below 256 MiB a sixty-fourth of it (4 x 2
/// MiB at 128 MiB); under 32 MiB, 48 KiB. 1.6 GB of 4 KiB records, two-pass, alternated runs
/// here: 48 KiB reads at every budget below 256 MiB made the scatter the bottleneck
/// (60-70k records/s at 128 MiB, 57k at 64 MiB, 48k at 32 MiB, against 131-133k, 83-88k and
/// 64k with a sixty-fourth); at 16 MiB 48 KiB stays faster (28k against 22k: larger reads
/// leave too little for the piles).
/// What the piles may take once `fixed` bytes are held: the rest of `--memory`; with
/// none, 512 MiB, or what the machine's budget leaves (a memory cgroup, ulimit -v) when
/// that is less.
fn pile_budget(d: &Demand, limits: &Limits, fixed: u64) -> u64 {
    match (d.memory, limits.memory) {
        (Some(m), _) => m.saturating_sub(fixed),
        (None, Some(m)) => m.bytes.saturating_sub(fixed).min(512 << 20),
        (None, None) => 512 << 20,
    }
}

/// Size of the scatter's sequential reads under a budget of `memory`: from local files, a
/// sixty-fourth of it from 48 KiB up to 4 MiB; from a store (`streamed`), GETs whose bodies
/// ([`STREAMED_GETS`] and one handed on) take a quarter of it, up to [`STREAMED_SCAN`].
fn scan_size(memory: Option<u64>, streamed: bool) -> u64 {
    match (memory, streamed) {
        (None, true) => STREAMED_SCAN,
        (Some(m), true) => streamed_scan(m / 4 / (STREAMED_GETS as u64 + 1)),
        (Some(m), false) if m < (32 << 20) => 48 << 10,
        (Some(m), false) => (m / 64 / 4096 * 4096).clamp(48 << 10, 4 << 20),
        (None, false) => 4 << 20,
    }
}

/// A GET body's size for `each` bytes of budget a body: whole huge pages (a body of
/// [`MAP_THRESHOLD`] or more is mapped on them, [`footprint`]) up to [`STREAMED_SCAN`], one
/// from half of one on, and below that what stays under the threshold (48 KiB at least), so
/// a body never takes more than its share rounded up (a 512 KiB body took 2 MiB).
fn streamed_scan(each: u64) -> u64 {
    let huge = HUGE_PAGE as u64;
    if each >= huge {
        (each / huge * huge).min(STREAMED_SCAN)
    } else if each >= huge / 2 {
        huge
    } else {
        (each / 4096 * 4096).clamp(48 << 10, MAP_THRESHOLD as u64 - 4096)
    }
}

/// The largest GET of a streamed scatter (each request costs a store its first byte, 40 ms
/// on loopback to s3s-fs): 4 MiB, as local scatter reads; 8 MiB GETs, or 32 in flight,
/// gave no shorter epochs here, within the runs' noise (`docs/object-storage.md`).
pub const STREAMED_SCAN: u64 = 4 << 20;

/// GETs a streamed scatter keeps in flight (`dataset::GETS_IN_FLIGHT`, which a test checks
/// against this).
pub const STREAMED_GETS: usize = 16;

/// Memory the scatter's reads of `scan_size` take: [`SCAN_DEPTH`] reads from local files,
/// or a streamed scatter's GET bodies, one a GET in flight and the one handed over.
pub(crate) fn scan_bytes(scan_size: u64, streamed: bool) -> u64 {
    if streamed {
        (STREAMED_GETS as u64 + 1).saturating_mul(footprint(scan_size as usize) as u64)
    } else {
        footprint(scan_size as usize * SCAN_DEPTH) as u64
    }
}
