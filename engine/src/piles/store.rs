//! The pile store: frames scattered into piles by key, written with direct I/O through one
//! ring, read back pile by pile (whole, or one key sub-range at a time) through another.
//!
//! Piles do not get a file each. They are grouped: pile `p` of `P` lives in group file
//! `p * G / P` of `G` (at most [`MAX_GROUPS`]), so a run holds a constant number of files
//! open whatever its pile count. Piles gather their frames in chunks of one pool shared by
//! all of them (a pile's share is one extent): when the pool runs dry, the pile with the
//! most full chunks has them copied into one of the writer's slots and written at the end
//! of its group file, so every group file is written front to back, and a pile is the list
//! of its extents there. Sharing the pool makes extents about twice a pile's share: with
//! fixed buffers, a buffer is on average half full when another one fills; with a shared
//! pool, piles stand at every level from empty to twice the share, and the fullest goes.
//! Larger extents are what makes a pile load fast (each is a read at a scattered offset).
//! Groups hold consecutive piles, and piles are read in key order: once a group's last
//! pile is loaded its file is removed, so the scratch a pass holds shrinks as it goes.

use std::path::Path;
use std::sync::Arc;

use super::frame;
use crate::io::{
    open_backend, reap_writes, Access, Backend, Completion, DataFile, FileKey, IoConfig, Op,
    OpKind, SlotId,
};
use crate::{Error, Result};

mod reader;
pub(crate) use reader::{PileBuf, PileReader};

/// The most group files one set of piles writes.
pub(crate) const MAX_GROUPS: usize = 16;

/// Chunks per pile's share of the fill pool: the finer, the less of the pool sits in
/// piles' partly filled last chunks (half a chunk each on average: a sixteenth of the pool
/// at 8), the more requests a load's direct ring takes (one slot per chunk).
const CHUNKS_PER_EXTENT: usize = 8;

/// Group files are grown (`fallocate`) ahead of their writes by 8 writes (1 to 16 MiB at
/// a time): a full disk is found early, and the writes land inside the file in allocated
/// space, which ext4 lets run in parallel (a write that extends a file is serialised).
fn reserve_step(slot: usize) -> u64 {
    (slot as u64 * 8).clamp(1 << 20, 16 << 20)
}

/// How a set of piles is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// log2 of the pile count: pile `key >> (64 - bits)`.
    pub bits: u32,
    /// Bytes of a pile's share of the fill pool (a multiple of `chunk`); its extents in a
    /// group file are about twice this.
    pub extent: usize,
    /// Bytes of a chunk of the fill pool (a multiple of 4 KiB): every extent but a pile's
    /// last is a whole number of chunks.
    pub chunk: usize,
    /// Bytes per write: the extents of several piles of one group are gathered into one
    /// write (a multiple of `chunk`, at least two shares); the longest extent.
    pub slot: usize,
    /// Writes in flight.
    pub depth: usize,
    /// Reads in flight when a pile is loaded.
    pub read_depth: usize,
    /// log2 of the group files.
    group_bits: u32,
}

impl Layout {
    /// [`Layout::within`] this process's open-file limit (tests).
    #[cfg(test)]
    pub(crate) fn new(bits: u32, extent: usize, in_flight: usize) -> Layout {
        Layout::within(bits, extent, in_flight, crate::io::open_file_limit())
    }

    /// `1 << bits` piles written in extents of about `extent` bytes, with about
    /// `4 * in_flight` bytes of writes and `3 * in_flight` of reads (when loading) in
    /// flight: at least two requests, at most 32 writes and 64 reads. (Measured here on
    /// 20 GiB of piles in 197 KiB extents: 64 reads in flight loaded piles 1.2x faster than
    /// 21; 16 MiB of writes in flight made a rolling epoch 4% faster than 8 MiB.) From 4 MiB in flight on, the extents of a
    /// group are written about 1 MiB at a time (measured here: 60 KiB writes spread over
    /// 16 files ran at 65% of 1 MiB sequential writes); under less, one extent at a time.
    /// The group files are as many as an open-file limit of `open_files` allows.
    pub(crate) fn within(bits: u32, extent: usize, in_flight: usize, open_files: u64) -> Layout {
        let chunk = (extent / CHUNKS_PER_EXTENT / 4096 * 4096).max(4096);
        let extent = extent.max(4096).div_ceil(chunk) * chunk;
        let combine = if in_flight >= 4 << 20 {
            ((1 << 20) / extent).max(1)
        } else {
            1
        };
        let slot = extent * combine.max(2);
        Layout {
            bits,
            extent,
            chunk,
            slot,
            depth: (4 * in_flight / slot).clamp(2, 32),
            read_depth: (3 * in_flight / extent).clamp(2, 64),
            group_bits: bits.min(super::bits_within(open_files)),
        }
    }

    /// Number of piles.
    pub(crate) fn piles(&self) -> usize {
        1 << self.bits
    }

    /// Number of group files.
    pub(crate) fn groups(&self) -> usize {
        1 << self.group_bits
    }

    /// The pile that holds `key`.
    #[inline]
    pub(crate) fn pile_of(&self, key: u64) -> usize {
        if self.bits == 0 {
            0
        } else {
            (key >> (64 - self.bits)) as usize
        }
    }

    fn group_of(&self, pile: usize) -> usize {
        pile >> (self.bits - self.group_bits)
    }

    /// The keys of pile `p`: `[lo, hi)`.
    pub(crate) fn keys(&self, pile: usize) -> (u128, u128) {
        let width = 1u128 << (64 - self.bits);
        (pile as u128 * width, (pile as u128 + 1) * width)
    }

    /// Local disk a set of piles may take beyond its frames' bytes when its group files
    /// are grown at most `step` ahead of their writes ([`PileWriter::grow_at_most`]): that
    /// per group file, and each pile's last chunk written whole.
    pub(crate) fn disk_slack(&self, step: u64) -> u64 {
        self.groups() as u64 * step + self.piles() as u64 * self.chunk as u64
    }

    /// How far ahead a local read's writer of `frames` bytes grows its group files: its
    /// writes' [`reserve_step`], at most a sixteenth of the frames spread over the groups
    /// (1 MiB at least), so the slack stays a small share of what the plan reserves.
    pub(crate) fn local_step(&self, frames: u64) -> u64 {
        (frames / 16 / self.groups() as u64).clamp(1 << 20, reserve_step(self.slot))
    }

    /// Memory a writer of this layout holds: the fill pool (a share per pile), a write
    /// being gathered per group, and the writes in flight.
    pub(crate) fn writer_bytes(&self) -> u64 {
        self.piles() as u64 * self.extent as u64
            + (self.groups() + self.depth) as u64 * self.slot as u64
    }

    /// Memory a reader of this layout holds: its reads in flight.
    pub(crate) fn reader_bytes(&self) -> u64 {
        self.read_depth as u64 * self.extent as u64
    }

    /// Memory the extent lists of `bytes` of frames take (16 bytes per extent).
    pub(crate) fn extent_list_bytes(&self, bytes: u64) -> u64 {
        (bytes / self.extent as u64 + self.piles() as u64) * 16
    }
}

/// Where a pile's bytes are: `len` bytes of frames at `offset` of its group file (written
/// rounded up to the alignment).
#[derive(Clone, Copy, Debug)]
struct Extent {
    offset: u64,
    len: u64,
}

/// A group file: removed when the last owner (the set, or the loads of its piles) lets go.
#[derive(Debug)]
struct GroupFile {
    file: Arc<DataFile>,
}

impl Drop for GroupFile {
    fn drop(&mut self) {
        // Scratch: the directory goes too, so a file already gone is fine.
        let _ = std::fs::remove_file(self.file.path());
    }
}

/// A pile being written: its bytes not yet written are in `chunks` of the pool, all full
/// but the last, which holds `tail` bytes.
struct Fill {
    chunks: Vec<u32>,
    tail: usize,
    /// Full chunks (the first `full` of `chunks`).
    full: u16,
    extents: Vec<Extent>,
    bytes: u64,
}

struct GroupOut {
    file: Arc<GroupFile>,
    key: FileKey,
    /// The write being gathered (extents of this group's piles), and its bytes so far.
    current: Option<SlotId>,
    fill: usize,
    /// Where the next extent goes.
    end: u64,
    /// Bytes allocated ahead (`fallocate`), or `u64::MAX` when the filesystem cannot.
    reserved: u64,
}

/// Piles being written.
pub(crate) struct PileWriter {
    layout: Layout,
    /// Bytes of a chunk (the layout's, rounded up to the alignment).
    chunk: usize,
    /// Most chunks in one extent (a slot's worth).
    max_run: usize,
    /// The fill pool, and its free chunks.
    pool: Vec<u8>,
    free: Vec<u32>,
    unit: usize,
    dir: tempfile::TempDir,
    backend: Box<dyn Backend>,
    groups: Vec<GroupOut>,
    piles: Vec<Fill>,
    done: Vec<Completion>,
    /// The most a group file is grown ahead of its writes at once ([`reserve_step`]).
    step_cap: u64,
    /// Short writes in a row without progress, per slot.
    stalled: Vec<u32>,
    written: u64,
}

impl PileWriter {
    /// A writer whose group files go in a new directory inside `parent` (private scratch
    /// of the run; removed with the set).
    pub(crate) fn new(parent: &Path, layout: Layout, io: &IoConfig) -> Result<PileWriter> {
        let dir = tempfile::Builder::new()
            .prefix("piles-")
            .tempdir_in(parent)
            .map_err(|e| Error::io(parent, "create pile directory", None, e))?;
        let mut files = Vec::with_capacity(layout.groups());
        for g in 0..layout.groups() {
            let path = dir.path().join(format!("group-{g:02}"));
            let file = DataFile::open(&path, Access::Write, io.direct)?;
            files.push(Arc::new(GroupFile {
                file: Arc::new(file),
            }));
        }
        let unit = files
            .iter()
            .map(|g| g.file.alignment().io_unit())
            .max()
            .unwrap_or(crate::io::align::MIN_UNIT);
        let chunk = layout.chunk.div_ceil(unit) * unit;
        let max_run = layout.slot / layout.chunk;
        let cfg = IoConfig {
            // A write being gathered per group, and those in flight.
            depth: layout.groups() + layout.depth,
            slot_size: chunk * max_run,
            backend: io.write_backend(),
            direct: io.direct,
            ..IoConfig::default()
        };
        let mut backend = open_backend(&cfg, unit)?;
        let mut groups = Vec::with_capacity(files.len());
        for file in files {
            let key = backend.add_file(file.file.clone())?;
            groups.push(GroupOut {
                file,
                key,
                current: None,
                fill: 0,
                end: 0,
                reserved: 0,
            });
        }
        let piles = (0..layout.piles())
            .map(|_| Fill {
                chunks: Vec::new(),
                tail: 0,
                full: 0,
                extents: Vec::new(),
                bytes: 0,
            })
            .collect();
        // At least a chunk per pile (a share is whole chunks): a pile that needs a chunk
        // when none is free always finds another with a full one to write.
        let chunks = layout.piles() * (layout.extent / layout.chunk);
        Ok(PileWriter {
            layout,
            chunk,
            max_run,
            // Zeroed memory is mapped as it is first written.
            pool: vec![0; chunks * chunk],
            free: (0..chunks as u32).rev().collect(),
            unit,
            dir,
            stalled: vec![0; backend.depth()],
            backend,
            groups,
            piles,
            done: Vec::new(),
            written: 0,
            step_cap: u64::MAX,
        })
    }

    /// Bytes of frames given so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.piles.iter().map(|p| p.bytes).sum()
    }

    /// Grows group files at most `step` bytes ahead of their writes (a read whose local
    /// disk is capped: see [`Layout::disk_slack`]).
    pub(crate) fn grow_at_most(&mut self, step: u64) {
        self.step_cap = step.max(1);
    }

    /// Appends the head of a frame under `key` whose body is `len` bytes to the pile of
    /// `key`; the caller appends the body with [`PileWriter::append`] to the same pile.
    /// Returns the pile.
    #[inline]
    pub(crate) fn begin(&mut self, key: u64, len: u64) -> Result<usize> {
        let pile = self.layout.pile_of(key);
        let (h, n) = frame::head(key, len);
        self.append(pile, &h[..n])?;
        Ok(pile)
    }

    /// A whole frame: `key` and its body given in parts.
    pub(crate) fn frame(&mut self, key: u64, parts: &[&[u8]]) -> Result<()> {
        let len = parts.iter().map(|p| p.len() as u64).sum();
        let pile = self.begin(key, len)?;
        for p in parts {
            self.append(pile, p)?;
        }
        Ok(())
    }

    /// Appends bytes to a pile (part of a frame begun with [`PileWriter::begin`]).
    #[inline]
    pub(crate) fn append(&mut self, pile: usize, mut bytes: &[u8]) -> Result<()> {
        let chunk = self.chunk;
        while !bytes.is_empty() {
            if self.piles[pile].chunks.is_empty() || self.piles[pile].tail == chunk {
                self.take_chunk(pile)?;
            }
            let fill = &mut self.piles[pile];
            let at = *fill.chunks.last().expect("a chunk") as usize * chunk + fill.tail;
            let n = (chunk - fill.tail).min(bytes.len());
            self.pool[at..at + n].copy_from_slice(&bytes[..n]);
            fill.tail += n;
            fill.bytes += n as u64;
            bytes = &bytes[n..];
            if fill.tail == chunk {
                fill.full += 1;
                if fill.full as usize == self.max_run {
                    self.flush(pile, false)?;
                }
            }
        }
        Ok(())
    }

    /// Gives `pile` a fresh chunk; when none is free, the pile with the most full chunks
    /// (perhaps this one) writes them first.
    fn take_chunk(&mut self, pile: usize) -> Result<()> {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                let (fullest, _) = self
                    .piles
                    .iter()
                    .enumerate()
                    .max_by_key(|(_, f)| f.full)
                    .expect("a pile");
                self.flush(fullest, false)?;
                self.free.pop().expect("a write frees a chunk")
            }
        };
        let fill = &mut self.piles[pile];
        fill.chunks.push(id);
        fill.tail = 0;
        Ok(())
    }

    /// Moves a pile's full chunks (with `last`, all of its bytes, padded to the alignment)
    /// into its group's write, which goes out when the extent would not fit, and frees
    /// those chunks.
    fn flush(&mut self, pile: usize, last: bool) -> Result<()> {
        let chunk = self.chunk;
        let fill = &self.piles[pile];
        let (k, len) = if last && !fill.chunks.is_empty() {
            let k = fill.chunks.len();
            (k, (k - 1) * chunk + fill.tail)
        } else {
            (fill.full as usize, fill.full as usize * chunk)
        };
        if len == 0 {
            return Ok(());
        }
        let padded = len.div_ceil(self.unit) * self.unit;
        let g = self.layout.group_of(pile);
        if self.groups[g].current.is_some()
            && self.groups[g].fill + padded > self.backend.slot_size()
        {
            self.submit(g)?;
        }
        let slot = match self.groups[g].current {
            Some(s) => s,
            None => {
                let s = self.free_slot()?;
                self.groups[g].current = Some(s);
                self.groups[g].fill = 0;
                s
            }
        };
        let at = self.groups[g].fill;
        let s = self.backend.slot_mut(slot);
        let fill = &mut self.piles[pile];
        for (i, &c) in fill.chunks[..k].iter().enumerate() {
            let n = chunk.min(len - i * chunk);
            let from = c as usize * chunk;
            s[at + i * chunk..at + i * chunk + n].copy_from_slice(&self.pool[from..from + n]);
        }
        s[at + len..at + padded].fill(0);
        self.free.extend(fill.chunks.drain(..k));
        fill.full = 0;
        if fill.chunks.is_empty() {
            fill.tail = 0;
        }
        let out = &mut self.groups[g];
        out.fill += padded;
        fill.extents.push(Extent {
            offset: out.end + at as u64,
            len: len as u64,
        });
        Ok(())
    }

    /// Writes group `g`'s gathered extents at the end of its file.
    fn submit(&mut self, g: usize) -> Result<()> {
        let Some(slot) = self.groups[g].current.take() else {
            return Ok(());
        };
        let len = self.groups[g].fill;
        if let Err(e) = self.reserve(g, len as u64) {
            self.backend.release(slot);
            return Err(e);
        }
        let out = &mut self.groups[g];
        let op = Op {
            slot,
            file: out.key,
            offset: out.end,
            len,
            at: 0,
            kind: OpKind::Write,
            tag: 0,
        };
        out.end += len as u64;
        out.fill = 0;
        self.written += len as u64;
        self.backend
            .push(op)
            .inspect_err(|_| self.backend.release(slot))
    }

    /// Makes sure `more` bytes past the group's end are allocated: a full disk fails here,
    /// naming the file, before the write is queued.
    fn reserve(&mut self, g: usize, more: u64) -> Result<()> {
        let out = &mut self.groups[g];
        let need = out.end + more;
        if out.reserved >= need {
            return Ok(());
        }
        let step = reserve_step(self.backend.slot_size()).min(self.step_cap);
        let upto = need.div_ceil(step) * step;
        let file = &out.file.file;
        match nix::fcntl::fallocate(
            file.file(),
            nix::fcntl::FallocateFlags::empty(),
            out.reserved as i64,
            (upto - out.reserved) as i64,
        ) {
            Ok(()) => out.reserved = upto,
            Err(nix::errno::Errno::EOPNOTSUPP) => out.reserved = u64::MAX,
            Err(e) => {
                return Err(Error::io(
                    file.path(),
                    "allocate pile space",
                    Some(out.reserved),
                    std::io::Error::from(e),
                ))
            }
        }
        Ok(())
    }

    fn free_slot(&mut self) -> Result<SlotId> {
        loop {
            if let Some(s) = self.backend.acquire() {
                return Ok(s);
            }
            self.reap(1)?;
        }
    }

    /// Waits for at least `min` writes. A short write goes on where it stopped (rounded down
    /// to the alignment); eight in a row that write nothing new mean the disk is full.
    fn reap(&mut self, min: usize) -> Result<()> {
        let groups = &self.groups;
        reap_writes(
            self.backend.as_mut(),
            min,
            &mut self.done,
            &mut self.stalled,
            self.unit,
            |key| &groups[key.0 as usize].file.file,
        )
        .1
    }

    /// Waits for every write in flight (what is still being gathered stays).
    pub(crate) fn settle(&mut self) -> Result<()> {
        while self.backend.in_flight() > 0 {
            self.reap(self.backend.in_flight())?;
        }
        Ok(())
    }

    /// Writes what is left in the fill pool and waits for every write: the piles, ready
    /// to be read. Not synced: piles are scratch, read back by this process.
    pub(crate) fn finish(mut self) -> Result<PileSet> {
        for p in 0..self.piles.len() {
            self.flush(p, true)?;
        }
        for g in 0..self.groups.len() {
            self.submit(g)?;
        }
        while self.backend.in_flight() > 0 {
            self.reap(self.backend.in_flight())?;
        }
        // The space allocated ahead and not written goes back.
        for g in &self.groups {
            let file = &g.file.file;
            file.file()
                .set_len(g.end)
                .map_err(|e| Error::io(file.path(), "truncate", Some(g.end), e))?;
        }
        let PileWriter {
            layout,
            chunk,
            dir,
            backend,
            groups,
            piles,
            pool,
            ..
        } = self;
        drop(pool);
        // The ring lets go of its files; the set holds them until their piles are read.
        drop(backend);
        let piles = piles
            .into_iter()
            .enumerate()
            .map(|(i, f)| Pile {
                group: groups[layout.group_of(i)].file.clone(),
                extents: f.extents.into(),
                bytes: f.bytes,
            })
            .collect();
        // The fill pool is freed: its memory goes back now, not when the allocator sees
        // fit.
        crate::io::release_freed_heap();
        Ok(PileSet {
            layout,
            chunk,
            piles,
            dir,
        })
    }
}

/// One pile written: its group file and its extents there.
struct Pile {
    group: Arc<GroupFile>,
    extents: Arc<[Extent]>,
    bytes: u64,
}

/// Piles written and closed, in key order; their files are removed as they are read, the
/// rest (and the directory) when the set is dropped.
pub(crate) struct PileSet {
    layout: Layout,
    /// Bytes of a chunk as written (every extent but a pile's last is whole chunks).
    chunk: usize,
    piles: Vec<Pile>,
    dir: tempfile::TempDir,
}

/// One load of the pile pass: a pile, whole or one key sub-range of it.
pub(crate) struct Load {
    group: Arc<GroupFile>,
    extents: Arc<[Extent]>,
    /// Bytes of a chunk as written.
    chunk: usize,
    /// Bytes per read when the pile is copied out of the reader's ring (whole chunks).
    piece: usize,
    read_depth: usize,
    /// About how many of them this load keeps (the pile's share for one pass).
    pub expect: u64,
    /// Keys wanted: `[lo, hi)`.
    pub lo: u128,
    /// See `lo`.
    pub hi: u128,
    /// Whether this is the whole pile (one pass).
    pub whole: bool,
}

/// The loads of a pile pass and the directory they read from (keep it until the pass is
/// over; the files go as their last load is dropped).
pub(crate) struct Loads {
    /// In key order.
    pub jobs: Vec<Load>,
    /// The set's directory.
    pub dir: tempfile::TempDir,
}

impl PileSet {
    /// Number of piles.
    pub(crate) fn len(&self) -> usize {
        self.piles.len()
    }

    /// Bytes of frames in all piles.
    pub(crate) fn bytes(&self) -> u64 {
        self.piles.iter().map(|p| p.bytes).sum()
    }

    /// The pile pass: every pile in key order, in as many key sub-ranges as `passes(bytes)`
    /// says for a pile of `bytes` (at least one).
    pub(crate) fn into_loads(self, passes: impl Fn(u64) -> u64) -> Loads {
        let mut jobs = Vec::new();
        for (i, p) in self.piles.into_iter().enumerate() {
            let (lo, hi) = self.layout.keys(i);
            let n = passes(p.bytes).max(1) as u128;
            for pass in 0..n {
                jobs.push(Load {
                    group: p.group.clone(),
                    extents: p.extents.clone(),
                    chunk: self.chunk,
                    piece: self.chunk * (self.layout.extent / self.layout.chunk),
                    read_depth: self.layout.read_depth,
                    expect: p.bytes.div_ceil(n as u64),
                    lo: lo + (hi - lo) * pass / n,
                    hi: lo + (hi - lo) * (pass + 1) / n,
                    whole: n == 1,
                });
            }
        }
        Loads {
            jobs,
            dir: self.dir,
        }
    }
}

#[cfg(test)]
mod tests;
