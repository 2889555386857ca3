//! Where the scatter reads the dataset, in order: its files through the I/O core, or (a
//! dataset streamed from object storage, `Dataset::remote`) its objects through ranged GETs
//! in object order. The scatter sees one sequential byte source of file `i`'s ranges
//! either way ([`Scan::read_ranges`]).
//!
//! A streamed read also keeps its local disk within `--cache-limit`: every pile byte is
//! charged before it is written and given back once the epoch's piles are gone, and a node
//! keeps only the units its streams read in the epoch ([`wanted_units`]); the others go
//! to the piles as skip frames (a head, no bytes), so the pile pass still counts their
//! positions.

use std::sync::Arc;

use crate::dataset::{Dataset, RemoteBytes};
use crate::io::RangeReader;
use crate::order::{EpochKey, EpochTable, Split, Units};
use crate::Result;

/// The scatter's sequential source.
#[allow(clippy::large_enum_variant)] // one per run, never moved in a loop
pub(super) enum Scan {
    /// The dataset's files.
    Files(RangeReader),
    /// Objects in a store.
    Objects(Arc<dyn RemoteBytes>),
}

impl Scan {
    /// Reads `ranges` (file, offset, length) of epoch `epoch`'s scatter, calling
    /// `done(i, bytes)` for range `i` (in completion order); asks for no more once `stop()`.
    pub(super) fn read_ranges(
        &mut self,
        epoch: u64,
        mut ranges: impl Iterator<Item = (usize, u64, usize)>,
        mut done: impl FnMut(usize, &[u8]),
        stop: &dyn Fn() -> bool,
    ) -> Result<()> {
        match self {
            Scan::Files(r) => r.read_ranges(ranges, done),
            Scan::Objects(o) => o.read_in_order(epoch, &mut ranges, &mut done, stop),
        }
    }

    /// The files' reader, for a LIRS lead (a streamed dataset is never led).
    pub(super) fn files(&mut self) -> Option<&mut RangeReader> {
        match self {
            Scan::Files(r) => Some(r),
            Scan::Objects(_) => None,
        }
    }

    /// The objects, when streamed.
    pub(super) fn objects(&self) -> Option<&Arc<dyn RemoteBytes>> {
        match self {
            Scan::Files(_) => None,
            Scan::Objects(o) => Some(o),
        }
    }

    /// The backend's name, whether reads bypass the page cache, and its buffers' bytes
    /// (reads of `scan` bytes).
    pub(super) fn describe(&self, scan: u64) -> (&'static str, bool, u64) {
        match self {
            Scan::Files(r) => (r.backend_kind().name(), r.direct(), r.buffer_bytes() as u64),
            Scan::Objects(_) => ("s3", false, crate::resources::scan_bytes(scan, true)),
        }
    }

    /// Requests completed and bytes transferred.
    pub(super) fn stats(&self) -> (u64, u64) {
        match self {
            Scan::Files(r) => {
                let s = r.stats();
                (s.read_ops, s.device_bytes)
            }
            Scan::Objects(o) => o
                .counts()
                .iter()
                .fold((0, 0), |(n, b), c| (n + c.gets, b + c.bytes)),
        }
    }
}

/// One sequential read of the scatter: units [first, end) of one file, bytes [start, stop).
#[derive(Clone, Copy, Debug)]
pub(super) struct Chunk {
    pub first: u64,
    pub end: u64,
    pub file: usize,
    pub start: u64,
    pub stop: u64,
}

/// Cuts the units, in order, into reads of about `target` bytes, never across files; one
/// at a time, so the scatter starts reading at once (and a stop is heard) rather than after
/// the whole dataset's units are located.
pub(super) struct Chunker<'a> {
    pub ds: &'a Dataset,
    pub units: &'a Units,
    pub target: u64,
    pub next: u64,
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

/// A set of small integers, one bit each.
pub(super) struct Bits(Vec<u64>);

impl Bits {
    fn new(n: u64) -> Bits {
        Bits(vec![0; n.div_ceil(64) as usize])
    }
    fn set(&mut self, i: u64) {
        self.0[(i / 64) as usize] |= 1 << (i % 64);
    }
    /// Whether `i` is in the set.
    pub(super) fn has(&self, i: u64) -> bool {
        self.0[(i / 64) as usize] & (1 << (i % 64)) != 0
    }
    fn any_in(&self, r: std::ops::Range<u64>) -> bool {
        r.into_iter().any(|i| self.has(i))
    }
}

/// The units whose records this read's streams take in the epoch keyed by `key`, with
/// `split` (from batch `first` on), or `None` when it takes every unit (one stream of
/// one). A shared pass (`ranks`) takes the batches of the ranks it froze; one stream
/// its own. What the other nodes take is left out of this node's piles.
pub(super) fn wanted_units(
    units: &Units,
    split: &Split,
    first: u64,
    key: &EpochKey,
    ranks: Option<&crate::modes::Ranks>,
) -> Option<Bits> {
    let frozen = ranks.map(|r| r.freeze());
    if frozen.is_none() && split.world <= 1 {
        return None;
    }
    let mut positions = Bits::new(split.records);
    for j in first..split.batches() {
        if let Some((world, set)) = &frozen {
            // A shared pass's batches are global: batch `j` is rank `j % world`'s.
            if !set.contains(&(split.global(j) % world)) {
                continue;
            }
        }
        for p in split.positions(j) {
            // Padding takes records from the epoch's start again.
            positions.set(p % split.records);
        }
    }
    let table = EpochTable::build(units.len(), key);
    let mut wanted = Bits::new(units.len());
    let mut at = 0;
    for i in 0..table.len() {
        let u = table.unit_at(i);
        let r = units.records(u);
        let n = r.end - r.start;
        if positions.any_in(at..at + n) {
            wanted.set(u);
        }
        at += n;
    }
    Some(wanted)
}

/// What one scatter reads from: the source, the epoch its fetches count under, the units
/// it keeps (`None`: all), and its round's key range.
pub(super) struct Sequential<'a> {
    pub scan: &'a mut Scan,
    pub epoch: u64,
    pub wanted: Option<Bits>,
    /// Units before this one are held in memory (a partly resident read): not read, each a
    /// skip frame in the piles.
    pub from: u64,
    /// The round whose key range it frames (`None`: every unit).
    pub round: Option<super::rounds::Round>,
    /// Where the units of the key range held in memory are framed (`rounds`), if any.
    pub memory: Option<super::rounds::InMemory>,
}

/// Bytes the filesystem holds for the files under `dir` (their allocated blocks).
pub(super) fn disk_used(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => disk_used(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}
