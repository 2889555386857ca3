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

use super::frame::{self, Parsed};
use crate::io::{
    completion_error, open_backend, reap_writes, Access, Backend, Completion, DataFile, FileKey,
    IoConfig, LargeBuf, Op, OpKind, SlotId,
};
use crate::pipeline::Stop;
use crate::{Error, Result};

/// The most group files one set of piles writes.
pub(crate) const MAX_GROUPS: usize = 16;

/// The most slots (chunks) a loaded pile's own ring has (a pile of more chunks is copied
/// out of the reader's ring instead).
pub(crate) const MAX_DIRECT_SLOTS: usize = 16384;

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
    /// `1 << bits` piles written in extents of about `extent` bytes, with about
    /// `4 * in_flight` bytes of writes and `3 * in_flight` of reads (when loading) in
    /// flight: at least two requests, at most 32 writes and 64 reads. (Measured here on
    /// 20 GiB of piles in 197 KiB extents: 64 reads in flight loaded piles 1.2x faster than
    /// 21; 16 MiB of writes in flight made a rolling epoch 4% faster than 8 MiB.) From 4 MiB in flight on, the extents of a
    /// group are written about 1 MiB at a time (measured here: 60 KiB writes spread over
    /// 16 files ran at 65% of 1 MiB sequential writes); under less, one extent at a time.
    pub(crate) fn new(bits: u32, extent: usize, in_flight: usize) -> Layout {
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
            group_bits: bits.min(super::max_group_bits()),
        }
    }

    /// [`Layout::new`] with as many group files as an open-file limit of `open_files`
    /// allows (the resource plan's limit, rather than this process's).
    pub(crate) fn within(bits: u32, extent: usize, in_flight: usize, open_files: u64) -> Layout {
        Layout {
            group_bits: bits.min(super::bits_within(open_files)),
            ..Layout::new(bits, extent, in_flight)
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
            .map(|g| g.file.alignment().unit())
            .max()
            .unwrap_or(512)
            .max(512);
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
        })
    }

    /// Bytes of frames given so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.piles.iter().map(|p| p.bytes).sum()
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
        let step = reserve_step(self.backend.slot_size());
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

/// A loaded pile's bytes. A whole pile whose extents are all full but the last (what the
/// writer makes) is read straight into consecutive slots of a ring this buffer owns, which
/// lie back to back in memory: the pile is those slots, with no copy. Any other load is
/// copied out of the reader's ring into a plain buffer. Either memory is kept for the next
/// load (only one of the two at a time).
#[derive(Default)]
pub(crate) struct PileBuf {
    ring: Option<Box<dyn Backend>>,
    /// The ring's slots holding the pile (0, 1, ...), held until the next load.
    held: Vec<SlotId>,
    /// Bytes of the pile in those slots.
    len: usize,
    copy: LargeBuf,
    /// Bytes to make room for when memory is (re)allocated: a little more than the pile,
    /// so the next, slightly larger one fits.
    room: usize,
}

impl PileBuf {
    /// The pile's bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        match (&self.ring, self.held.first()) {
            (Some(ring), Some(&first)) => &ring.run(first, self.held.len())[..self.len],
            _ => self.copy.as_slice(),
        }
    }

    /// Asks for room for `bytes` when memory is next allocated.
    pub(crate) fn room_for(&mut self, bytes: usize) {
        self.room = bytes;
    }

    fn clear(&mut self) {
        if let Some(ring) = self.ring.as_mut() {
            for slot in self.held.drain(..) {
                ring.release(slot);
            }
        }
        self.len = 0;
        self.copy.clear();
    }
}

/// Reads loads, keeping one ring while they come from the same group file.
#[derive(Default)]
pub(crate) struct PileReader {
    ring: Option<(Arc<GroupFile>, Box<dyn Backend>, FileKey)>,
    io: IoConfig,
}

impl PileReader {
    /// A reader with `io`'s backend choice and direct flag.
    pub(crate) fn new(io: &IoConfig) -> PileReader {
        PileReader {
            ring: None,
            io: io.clone(),
        }
    }

    /// Loads `load` into `out` (cleared first): the frames whose keys it wants, back to back,
    /// and their (key, offset in `out`) into `frames` in file order. Given up, with an
    /// error, once `stop` is set (checked per extent).
    pub(crate) fn load(
        &mut self,
        load: Load,
        buf: &mut PileBuf,
        frames: &mut Vec<(u64, usize)>,
        stop: &Stop,
    ) -> Result<()> {
        buf.clear();
        frames.clear();
        let file = load.group.file.clone();
        let path = file.path().to_path_buf();
        let unit = file.alignment().unit().max(512);
        let chunk = load.chunk;
        let n = load.extents.len();
        let whole_chunks = n > 0
            && chunk.is_multiple_of(unit)
            && load.extents[..n - 1]
                .iter()
                .all(|e| (e.len as usize).is_multiple_of(chunk));
        let chunks: usize = load
            .extents
            .iter()
            .map(|e| (e.len as usize).div_ceil(chunk))
            .sum();
        if load.whole && whole_chunks && chunks <= MAX_DIRECT_SLOTS {
            buf.copy = LargeBuf::default();
            return self.load_direct(&load, buf, frames, chunks, unit, stop);
        }
        // Read in pieces of at most `piece` bytes (whole chunks, so aligned: the writer's
        // chunk is a multiple of its files' alignment): the reader's ring holds a few of
        // those, whatever the extents' lengths.
        debug_assert!(load.piece.is_multiple_of(unit));
        let extents = pieces(&load.extents, load.piece);
        let load = Load {
            extents: extents.into(),
            ..load
        };
        buf.ring = None;
        let out = &mut buf.copy;
        out.reserve_total(buf.room);
        let same = matches!(&self.ring, Some((g, _, _)) if Arc::ptr_eq(g, &load.group));
        if !same {
            // The previous group's ring (and its hold on the file) goes first.
            self.ring = None;
            let cfg = IoConfig {
                depth: load.read_depth,
                slot_size: load.piece,
                backend: self.io.backend,
                direct: self.io.direct,
                ..IoConfig::default()
            };
            let mut backend = open_backend(&cfg, unit)?;
            let key = backend.add_file(file.clone())?;
            self.ring = Some((load.group.clone(), backend, key));
        }
        let (_, backend, key) = self.ring.as_mut().expect("a ring");
        if load.whole {
            // Each extent is copied to its place as its read completes; frames are indexed
            // over the prefix that is complete, while it is still in the cache.
            let n = load.extents.len();
            let mut starts = Vec::with_capacity(n + 1);
            let mut total = 0usize;
            for e in load.extents.iter() {
                starts.push(total);
                total += e.len as usize;
            }
            starts.push(total);
            out.reserve_total(total);
            let dst = out.append_space(total);
            let mut arrived = vec![false; n];
            let (mut prefix, mut at) = (0usize, 0usize);
            read_extents(
                backend.as_mut(),
                *key,
                &file,
                &load.extents,
                unit,
                false,
                |i, chunk| {
                    stop.check()?;
                    dst[starts[i]..starts[i + 1]].copy_from_slice(chunk);
                    arrived[i] = true;
                    while prefix < n && arrived[prefix] {
                        prefix += 1;
                    }
                    at = index(&dst[..starts[prefix]], at, frames, &path)?;
                    Ok(())
                },
            )?;
            if at != total {
                return Err(inside_a_frame(&path, &load.extents, at as u64));
            }
        } else {
            // A frame split between extents waits in `carry` until it is whole.
            let mut carry: Vec<u8> = Vec::new();
            let mut consumed = 0u64;
            read_extents(
                backend.as_mut(),
                *key,
                &file,
                &load.extents,
                unit,
                true,
                |_, chunk| {
                    stop.check()?;
                    carry.extend_from_slice(chunk);
                    let mut pos = 0usize;
                    loop {
                        match frame::parse(&carry, pos) {
                            Parsed::Whole(f) => {
                                if (load.lo..load.hi).contains(&(f.key as u128)) {
                                    frames.push((f.key, out.len()));
                                    out.extend_from_slice(&carry[pos..f.end]);
                                }
                                pos = f.end;
                            }
                            Parsed::Partial => break,
                            Parsed::Damaged => {
                                return Err(inside_a_frame(
                                    &path,
                                    &load.extents,
                                    consumed + pos as u64,
                                ))
                            }
                        }
                    }
                    carry.drain(..pos);
                    consumed += pos as u64;
                    Ok(())
                },
            )?;
            if !carry.is_empty() {
                return Err(inside_a_frame(&path, &load.extents, consumed));
            }
        }
        Ok(())
    }

    /// A whole pile read straight into `buf`'s ring of `chunks` slots of a chunk, each
    /// extent by one read into as many consecutive slots as it has chunks: its extents
    /// (whole chunks but the last, which ends the pile) then lie back to back.
    fn load_direct(
        &mut self,
        load: &Load,
        buf: &mut PileBuf,
        frames: &mut Vec<(u64, usize)>,
        chunks: usize,
        unit: usize,
        stop: &Stop,
    ) -> Result<()> {
        let (n, slot) = (chunks, load.chunk);
        let file = load.group.file.clone();
        let fits = buf
            .ring
            .as_ref()
            .is_some_and(|r| r.depth() >= n && r.slot_size() == slot);
        if !fits {
            // The old ring (nothing held, nothing in flight) goes before the new one comes.
            buf.ring = None;
            let cfg = IoConfig {
                depth: n.max(buf.room.div_ceil(slot)).min(MAX_DIRECT_SLOTS),
                slot_size: slot,
                in_flight: load.read_depth,
                backend: self.io.backend,
                direct: self.io.direct,
                ..IoConfig::default()
            };
            buf.ring = Some(open_backend(&cfg, unit)?);
        }
        let ring = buf.ring.as_mut().expect("a ring");
        for i in 0..n {
            let s = ring
                .acquire_at(i)
                .expect("a ring's slots are all free between loads");
            buf.held.push(s);
        }
        // The file is registered for this load only: a ring kept between loads holds no
        // group file, so a group's file goes (and its space with it) once its piles are read.
        let read = ring.add_file(file.clone()).and_then(|key| {
            read_into_slots(
                ring.as_mut(),
                key,
                &file,
                &load.extents,
                &buf.held,
                unit,
                load.read_depth,
                stop,
            )?;
            ring.remove_file(key);
            Ok(())
        });
        if let Err(e) = read {
            // Reads may still be in flight: the ring goes (its drop waits for them), and
            // its slots with it.
            buf.held.clear();
            buf.ring = None;
            return Err(e);
        }
        buf.len = load.extents.iter().map(|e| e.len as usize).sum();
        let at = index(buf.as_slice(), 0, frames, file.path())?;
        if at != buf.len {
            let e = inside_a_frame(file.path(), &load.extents, at as u64);
            buf.clear();
            return Err(e);
        }
        Ok(())
    }
}

/// What became of read `c` of `want` bytes: `Ok(true)` when all of it is in its slot,
/// `Ok(false)` when a short read was pushed again to go on where it stopped (`stall`
/// counts short reads in a row without progress; more than 8 end the read as a file that
/// ended early). On `Err` the slot is held by the caller.
fn finished(
    backend: &mut dyn Backend,
    file: &DataFile,
    c: &Completion,
    want: usize,
    unit: usize,
    stall: &mut u32,
) -> Result<bool> {
    let n = c
        .result
        .map_err(|errno| completion_error(file, &c.op, errno))?;
    if c.op.at + n >= want {
        return Ok(true);
    }
    let keep = (c.op.at + n) / unit * unit;
    *stall = if keep > c.op.at { 0 } else { *stall + 1 };
    if *stall > 8 {
        return Err(Error::BadInput {
            path: file.path().into(),
            offset: Some(c.op.offset + n as u64),
            what: "a pile file ended early (was the scratch directory changed?)".into(),
        });
    }
    backend.push(c.op.advance(keep - c.op.at))?;
    Ok(false)
}

/// Reads the extents of a file back to back into `slots` (consecutive, held by the caller),
/// each by one request into as many slots as it needs, at most `depth` at a time. On `Ok`
/// nothing is in flight and every slot is held by the caller again; on `Err` requests may
/// still be in flight: the caller drops the backend (which waits for them) rather than
/// touch the slots. A short read goes on where it stopped.
#[allow(clippy::too_many_arguments)]
fn read_into_slots(
    backend: &mut dyn Backend,
    key: FileKey,
    file: &DataFile,
    extents: &[Extent],
    slots: &[SlotId],
    unit: usize,
    depth: usize,
    stop: &Stop,
) -> Result<()> {
    let depth = depth.max(1);
    let size = backend.slot_size();
    let mut stalled = vec![0u32; extents.len()];
    let mut done = Vec::with_capacity(depth);
    let (mut next, mut first) = (0usize, 0usize);
    loop {
        while next < extents.len() && backend.in_flight() < depth {
            let e = extents[next];
            let len = (e.len as usize).div_ceil(unit) * unit;
            let slot = slots[first];
            first += len.div_ceil(size);
            backend.push(Op {
                slot,
                file: key,
                offset: e.offset,
                len,
                at: 0,
                kind: OpKind::Read,
                tag: next as u64,
            })?;
            next += 1;
        }
        if backend.in_flight() == 0 {
            return Ok(());
        }
        backend.wait(1, &mut done)?;
        for c in done.drain(..) {
            let i = c.op.tag as usize;
            finished(
                backend,
                file,
                &c,
                extents[i].len as usize,
                unit,
                &mut stalled[i],
            )?;
        }
        stop.check()?;
    }
}

/// The (key, offset) of every whole frame of `data` from `at` on; returns where the first
/// incomplete frame starts.
fn index(data: &[u8], mut at: usize, frames: &mut Vec<(u64, usize)>, path: &Path) -> Result<usize> {
    loop {
        match frame::parse(data, at) {
            Parsed::Whole(f) => {
                frames.push((f.key, at));
                at = f.end;
            }
            Parsed::Partial => return Ok(at),
            Parsed::Damaged => {
                return Err(Error::BadInput {
                    path: path.into(),
                    offset: None,
                    what: format!("a pile holds a damaged frame at its byte {at}"),
                })
            }
        }
    }
}

/// A pile that ends inside a frame: the offset in its group file of the extent holding byte
/// `at` of the pile.
fn inside_a_frame(path: &Path, extents: &[Extent], at: u64) -> Error {
    let mut pos = 0u64;
    let mut file_offset = None;
    for e in extents {
        if at < pos + e.len {
            file_offset = Some(e.offset + (at - pos));
            break;
        }
        pos += e.len;
    }
    Error::BadInput {
        path: path.into(),
        offset: file_offset,
        what: format!(
            "pile ends inside a frame (byte {at} of the pile; was the scratch directory changed?)"
        ),
    }
}

/// `extents` cut into pieces of at most `piece` bytes (a multiple of the alignment), in
/// order.
fn pieces(extents: &[Extent], piece: usize) -> Vec<Extent> {
    let piece = piece as u64;
    let mut out = Vec::with_capacity(extents.len());
    for e in extents {
        let mut at = 0;
        while at < e.len {
            let len = piece.min(e.len - at);
            out.push(Extent {
                offset: e.offset + at,
                len,
            });
            at += len;
        }
    }
    out
}

/// Reads `extents` of a file, at the backend's depth, and hands each extent's bytes to
/// `f(index, bytes)`: in order when `in_order`, else as each read completes (a slow read
/// then holds up nothing but itself). A short read goes on where it stopped.
fn read_extents(
    backend: &mut dyn Backend,
    key: FileKey,
    file: &DataFile,
    extents: &[Extent],
    unit: usize,
    in_order: bool,
    mut f: impl FnMut(usize, &[u8]) -> Result<()>,
) -> Result<()> {
    let depth = backend.depth();
    let mut ready: std::collections::HashMap<u64, SlotId> = Default::default();
    let (mut next_submit, mut next_deliver, mut delivered) = (0usize, 0usize, 0usize);
    let mut stalled = vec![0u32; depth];
    let mut done = Vec::with_capacity(depth);
    let outcome = (|| -> Result<()> {
        while delivered < extents.len() {
            while next_submit < extents.len() && backend.in_flight() + ready.len() < depth {
                let e = extents[next_submit];
                let slot = backend.acquire().expect("a free slot below depth");
                stalled[slot.index()] = 0;
                let op = Op {
                    slot,
                    file: key,
                    offset: e.offset,
                    len: (e.len as usize).div_ceil(unit) * unit,
                    at: 0,
                    kind: OpKind::Read,
                    tag: next_submit as u64,
                };
                backend.push(op).inspect_err(|_| backend.release(slot))?;
                next_submit += 1;
            }
            if let Some(slot) = ready.remove(&(next_deliver as u64)) {
                let len = extents[next_deliver].len as usize;
                let r = f(next_deliver, &backend.slot(slot)[..len]);
                backend.release(slot);
                r?;
                next_deliver += 1;
                delivered += 1;
                continue;
            }
            let waited = backend.wait(1, &mut done);
            let mut first = waited.err();
            for c in done.drain(..) {
                let want = extents[c.op.tag as usize].len as usize;
                let stall = &mut stalled[c.op.slot.index()];
                let err = match finished(backend, file, &c, want, unit, stall) {
                    Ok(false) => continue,
                    Ok(true) if in_order => {
                        ready.insert(c.op.tag, c.op.slot);
                        continue;
                    }
                    Ok(true) => {
                        delivered += 1;
                        f(c.op.tag as usize, &backend.slot(c.op.slot)[..want]).err()
                    }
                    Err(e) => Some(e),
                };
                backend.release(c.op.slot);
                if first.is_none() {
                    first = err;
                }
            }
            if let Some(e) = first {
                return Err(e);
            }
        }
        Ok(())
    })();
    // Slots of extents read but not delivered go back; those in flight are reaped by the
    // next load or when the ring is dropped.
    for (_, slot) in ready.drain() {
        backend.release(slot);
    }
    if outcome.is_err() {
        // Whatever is still in flight is waited for here, so the next load starts clean.
        while backend.in_flight() > 0 {
            if backend.wait(backend.in_flight(), &mut done).is_err() {
                break;
            }
            for c in done.drain(..) {
                backend.release(c.op.slot);
            }
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::BackendChoice;

    /// Frames of every size, from empty to several extents long, under random keys.
    fn frames(n: u64, seed: u64) -> Vec<(u64, Vec<u8>)> {
        let key = crate::order::EpochKey::new(seed, 0);
        (0..n)
            .map(|i| {
                let len = match i % 10 {
                    0 => 0,
                    1 => 9_000 + i as usize,
                    _ => (i * 37 % 700) as usize,
                };
                (
                    key.key(i),
                    (0..len).map(|j| (i as usize + j) as u8).collect(),
                )
            })
            .collect()
    }

    fn written(
        layout: Layout,
        all: &[(u64, Vec<u8>)],
        backend: BackendChoice,
    ) -> (tempfile::TempDir, PileSet) {
        let dir = tempfile::tempdir_in(".").unwrap();
        let io = IoConfig {
            backend,
            ..IoConfig::default()
        };
        let mut w = PileWriter::new(dir.path(), layout, &io).unwrap();
        for (k, body) in all {
            // Bodies in two parts, as the two-pass scatter gives them.
            let (a, b) = body.split_at(body.len() / 3);
            w.frame(*k, &[a, b]).unwrap();
        }
        let set = w.finish().unwrap();
        (dir, set)
    }

    /// Every frame comes back from its pile, whole and in the order written, whether the
    /// pile is read whole or in key sub-ranges, on both backends; frames span extents.
    #[test]
    fn piles_read_back_whole_and_in_key_sub_ranges() {
        let all = frames(3000, 7);
        // One extent per write, and extents of a group gathered into 1 MiB writes.
        let layouts = [
            Layout::new(5, 4096, 64 << 10),
            Layout::new(5, 4096, 4 << 20),
        ];
        assert_eq!((layouts[0].slot, layouts[1].slot), (8192, 1 << 20));
        assert_eq!(
            layouts[0].groups(),
            16.min(1 << super::super::max_group_bits())
        );
        for (layout, backend) in [
            (layouts[0], BackendChoice::Uring),
            (layouts[0], BackendChoice::Pread),
            (layouts[1], BackendChoice::Uring),
            (layouts[1], BackendChoice::Pread),
        ] {
            for passes in [1u64, 3] {
                let (_dir, set) = written(layout, &all, backend);
                assert_eq!(set.len(), 32);
                let total: u64 = all
                    .iter()
                    .map(|(_, b)| (frame::head_len(b.len() as u64) + b.len()) as u64)
                    .sum();
                assert_eq!(set.bytes(), total);
                let loads = set.into_loads(|_| passes);
                assert_eq!(loads.jobs.len() as u64, 32 * passes);
                let mut reader = PileReader::new(&IoConfig {
                    backend,
                    ..IoConfig::default()
                });
                let mut got: Vec<Vec<(u64, Vec<u8>)>> = vec![Vec::new(); 32];
                let (mut out, mut index) = (PileBuf::default(), Vec::new());
                for (i, load) in loads.jobs.into_iter().enumerate() {
                    let pile = i / passes as usize;
                    let (lo, hi) = (load.lo, load.hi);
                    assert_eq!(load.whole, passes == 1);
                    reader
                        .load(load, &mut out, &mut index, &Stop::default())
                        .unwrap();
                    // Whole piles are read into the buffer's own ring, with no copy.
                    assert_eq!(out.ring.is_some(), passes == 1);
                    for &(k, at) in &index {
                        assert!((lo..hi).contains(&(k as u128)));
                        let f = frame::at(out.as_slice(), at);
                        assert_eq!(f.key, k);
                        got[pile].push((k, out.as_slice()[f.body..f.end].to_vec()));
                    }
                }
                for (pile, frames) in got.iter().enumerate() {
                    let mut want: Vec<_> = all
                        .iter()
                        .filter(|(k, _)| layout.pile_of(*k) == pile)
                        .cloned()
                        .collect();
                    let mut frames = frames.clone();
                    if passes > 1 {
                        // Sub-ranges give each frame once; across them the order is by range.
                        want.sort();
                        frames.sort();
                    }
                    assert!(
                        frames == want,
                        "{backend:?}, {passes} passes: pile {pile} differs"
                    );
                }
            }
        }
    }

    /// Piles sharing one fill pool write extents of about twice their share (fixed buffers
    /// of a share each wrote extents of exactly one share), every one but a pile's last a
    /// whole number of chunks; and such piles read back whole into their own ring.
    #[test]
    fn a_shared_pool_writes_extents_of_twice_a_share() {
        let layout = Layout::new(5, 64 << 10, 4 << 20);
        assert_eq!((layout.extent, layout.chunk), (64 << 10, 8 << 10));
        let key = crate::order::EpochKey::new(9, 0);
        let all: Vec<(u64, Vec<u8>)> = (0..60_000u64)
            .map(|i| (key.key(i), vec![i as u8; 100 + (i % 200) as usize]))
            .collect();
        let (_dir, set) = written(layout, &all, BackendChoice::Auto);
        let mut lens: Vec<u64> = Vec::new();
        for p in &set.piles {
            let (last, rest) = p.extents.split_last().unwrap();
            assert!(last.len > 0);
            assert!(
                rest.iter().all(|e| e.len % (8 << 10) == 0),
                "a partial chunk"
            );
            lens.extend(rest.iter().map(|e| e.len));
        }
        lens.sort();
        let median = lens[lens.len() / 2];
        assert!(
            median >= 3 * layout.extent as u64 / 2,
            "median extent {median} bytes for a share of {}",
            layout.extent
        );
        assert!(lens.iter().all(|&l| l <= layout.slot as u64));
        let mut reader = PileReader::default();
        let (mut out, mut index) = (PileBuf::default(), Vec::new());
        let mut got = Vec::new();
        for load in set.into_loads(|_| 1).jobs {
            reader
                .load(load, &mut out, &mut index, &Stop::default())
                .unwrap();
            assert!(out.ring.is_some(), "a whole pile is read into its own ring");
            for &(k, at) in &index {
                let f = frame::at(out.as_slice(), at);
                got.push((k, out.as_slice()[f.body..f.end].to_vec()));
            }
        }
        let mut want = all;
        want.sort();
        got.sort();
        assert!(got == want, "frames differ");
    }

    /// Thousands of piles hold no more files than [`MAX_GROUPS`], while written and while
    /// read: the open files of a run do not grow with its pile count.
    #[test]
    fn thousands_of_piles_share_a_few_files() {
        let all = frames(20_000, 11);
        let (dir, set) = written(Layout::new(12, 4096, 64 << 10), &all, BackendChoice::Auto);
        assert_eq!(set.len(), 4096);
        let files = std::fs::read_dir(
            dir.path()
                .read_dir()
                .unwrap()
                .next()
                .unwrap()
                .unwrap()
                .path(),
        )
        .unwrap()
        .count();
        assert!((1..=MAX_GROUPS).contains(&files), "{files} pile files");
        let mut distinct: Vec<_> = set.piles.iter().map(|p| Arc::as_ptr(&p.group)).collect();
        distinct.dedup();
        assert_eq!(distinct.len(), files);
        let mut n = 0;
        let mut reader = PileReader::default();
        let (mut out, mut index) = (PileBuf::default(), Vec::new());
        for load in set.into_loads(|_| 1).jobs {
            reader
                .load(load, &mut out, &mut index, &Stop::default())
                .unwrap();
            n += index.len();
        }
        assert_eq!(n, all.len());
    }

    /// Reads cut short (about half of each, ending off the alignment) go on where they
    /// stopped: every frame comes back, whether the pile is read straight into the
    /// buffer's own ring (whole) or copied out of the reader's (key sub-ranges).
    #[test]
    fn short_reads_go_on_where_they_stopped() {
        let all = frames(1500, 11);
        let mut want = all.clone();
        want.sort();
        for backend in [BackendChoice::Uring, BackendChoice::Pread] {
            for passes in [1u64, 2] {
                let (_dir, set) = written(Layout::new(3, 32 << 10, 256 << 10), &all, backend);
                let loads = set.into_loads(|_| passes);
                let mut got = crate::io::tests::with_short_transfers(|| {
                    let mut reader = PileReader::new(&IoConfig {
                        backend,
                        ..IoConfig::default()
                    });
                    let (mut out, mut index) = (PileBuf::default(), Vec::new());
                    let mut got = Vec::new();
                    for load in loads.jobs {
                        reader
                            .load(load, &mut out, &mut index, &Stop::default())
                            .unwrap();
                        for &(k, at) in &index {
                            let f = frame::at(out.as_slice(), at);
                            got.push((k, out.as_slice()[f.body..f.end].to_vec()));
                        }
                    }
                    got
                });
                got.sort();
                assert!(got == want, "{backend:?}, {passes} passes: frames differ");
            }
        }
    }

    /// A whole pile of more chunks than a buffer's own ring takes slots is read through
    /// the reader's ring and copied instead: every frame comes back, in the order written.
    #[test]
    fn a_pile_of_more_chunks_than_slots_is_copied() {
        let all = frames(40_000, 5);
        let (_dir, set) = written(Layout::new(0, 4096, 64 << 10), &all, BackendChoice::Auto);
        let mut loads = set.into_loads(|_| 1).jobs;
        assert_eq!(loads.len(), 1);
        let load = loads.pop().unwrap();
        assert!(load.whole);
        let chunks: u64 = load.extents.iter().map(|e| e.len.div_ceil(4096)).sum();
        assert!(chunks > MAX_DIRECT_SLOTS as u64, "{chunks} chunks");
        let mut reader = PileReader::default();
        let (mut out, mut index) = (PileBuf::default(), Vec::new());
        reader
            .load(load, &mut out, &mut index, &Stop::default())
            .unwrap();
        assert!(out.ring.is_none(), "read into a ring of its own");
        let got: Vec<(u64, Vec<u8>)> = index
            .iter()
            .map(|&(k, at)| {
                let f = frame::at(out.as_slice(), at);
                (k, out.as_slice()[f.body..f.end].to_vec())
            })
            .collect();
        assert!(got == all, "frames differ");
    }

    /// A group file goes as soon as the last load of its piles is dropped, not at the end
    /// of the pass: the scratch a pass holds shrinks as it goes. Whole piles (read into
    /// the buffer's own ring, which holds the file for the load only) let go at once; key
    /// sub-ranges (read through the reader's ring for the group) when the reader moves on.
    #[test]
    fn group_files_go_as_their_piles_are_read() {
        for passes in [1u64, 2] {
            let all = frames(2000, 3);
            let (dir, set) = written(Layout::new(4, 4096, 64 << 10), &all, BackendChoice::Auto);
            let groups = set.piles.iter().map(|p| p.group.file.path().to_path_buf());
            let mut groups: Vec<_> = groups.collect();
            groups.dedup();
            assert!(groups.len() > 1);
            let loads = set.into_loads(|_| passes);
            let mut jobs = loads.jobs.into_iter();
            let per_group = 16 / groups.len() * passes as usize;
            let mut reader = PileReader::default();
            let (mut out, mut index) = (PileBuf::default(), Vec::new());
            for _ in 0..per_group {
                assert!(groups[0].exists());
                reader
                    .load(jobs.next().unwrap(), &mut out, &mut index, &Stop::default())
                    .unwrap();
            }
            assert_eq!(groups[0].exists(), passes > 1, "{passes} passes");
            assert!(groups[1].exists());
            reader
                .load(jobs.next().unwrap(), &mut out, &mut index, &Stop::default())
                .unwrap();
            assert!(!groups[0].exists(), "read group file still there");
            drop(jobs);
            drop(reader);
            drop(loads.dir);
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        }
    }

    /// A group file cut short (the scratch changed under the run) is an error naming the
    /// file, never a panic or a wrong pile; so is a stopped run.
    #[test]
    fn a_cut_group_file_and_a_stop_are_errors() {
        let all = frames(500, 5);
        let (_dir, set) = written(Layout::new(0, 4096, 64 << 10), &all, BackendChoice::Auto);
        let path = set.piles[0].group.file.path().to_path_buf();
        let size = std::fs::metadata(&path).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(size - 5000).unwrap();
        let mut loads = set.into_loads(|_| 1);
        let load = loads.jobs.pop().unwrap();
        let (mut out, mut index) = (PileBuf::default(), Vec::new());
        let e = PileReader::default()
            .load(load, &mut out, &mut index, &Stop::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");

        let (_dir, set) = written(Layout::new(0, 4096, 64 << 10), &all, BackendChoice::Auto);
        let stop = Stop::default();
        stop.set();
        let load = set.into_loads(|_| 1).jobs.pop().unwrap();
        let e = PileReader::default().load(load, &mut out, &mut index, &stop);
        assert!(e.unwrap_err().to_string().contains("stopped"));
    }
}
