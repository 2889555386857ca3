//! Reading piles back: a [`PileReader`] loads one pile (or one key sub-range of it) into a
//! [`PileBuf`], straight into a ring of chunk slots the buffer owns when the pile is whole
//! and small enough, else copied out of the reader's ring.

use std::path::Path;
use std::sync::Arc;

use super::{Extent, GroupFile, Load};
use crate::io::{
    backend_limits, completion_error, open_backend, Backend, BackendChoice, Completion, DataFile,
    FileKey, IoConfig, LargeBuf, Op, OpKind, SlotId,
};
use crate::piles::frame::{self, Parsed};
use crate::pipeline::Stop;
use crate::{Error, Result};

/// A loaded pile's bytes. A whole pile whose extents are all full but the last (what the
/// writer makes) is read straight into consecutive slots of a ring this buffer owns, which
/// lie back to back in memory: the pile is those slots, with no copy. Any other load is
/// copied out of the reader's ring into a plain buffer. Either memory is kept for the next
/// load (only one of the two at a time).
#[derive(Default)]
pub(crate) struct PileBuf {
    pub(super) ring: Option<Box<dyn Backend>>,
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
        let unit = file.alignment().io_unit();
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
        if load.whole && whole_chunks && chunks <= max_direct_slots(self.io.backend) {
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
        let (_, backend, key) = match &mut self.ring {
            Some(ring) if same => ring,
            ring => {
                // The previous group's ring (and its hold on the file) goes first.
                *ring = None;
                let cfg = IoConfig {
                    depth: load.read_depth,
                    slot_size: load.piece,
                    backend: self.io.backend,
                    direct: self.io.direct,
                    ..IoConfig::default()
                };
                let mut backend = open_backend(&cfg, unit)?;
                let key = backend.add_file(file.clone())?;
                ring.insert((load.group.clone(), backend, key))
            }
        };
        let at = Reading {
            backend: backend.as_mut(),
            key: *key,
            file: &file,
            load: &load,
            unit,
            stop,
        };
        if load.whole {
            at.copy_whole(out, frames)
        } else {
            at.copy_range(out, frames)
        }
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
        let ring = match &mut buf.ring {
            Some(ring) if fits => ring,
            ring => {
                // The old ring (nothing held, nothing in flight) goes before the new one
                // comes. Room for a slightly larger next pile, within the direct limit
                // (which `n` is under: `load` checked).
                *ring = None;
                let cfg = IoConfig {
                    depth: n.max(
                        buf.room
                            .div_ceil(slot)
                            .min(max_direct_slots(self.io.backend)),
                    ),
                    slot_size: slot,
                    in_flight: load.read_depth,
                    backend: self.io.backend,
                    direct: self.io.direct,
                    ..IoConfig::default()
                };
                ring.insert(open_backend(&cfg, unit)?)
            }
        };
        for i in 0..n {
            let Some(s) = ring.acquire_at(i) else {
                // Every slot is released between loads (`PileBuf::clear`), and the ring
                // has at least `n`: this is a broken invariant, reported, not a panic.
                let e = Error::Internal(format!(
                    "pile ring: slot {i} of {n} is not free at the start of a load"
                ));
                buf.clear();
                return Err(e);
            };
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

/// The most chunks of a whole pile read with no copy, a slot each in one ring: within what
/// a backend may have ([`crate::io::BackendLimits::max_slots`]) and at most the slots
/// io_uring can register as buffers (16,384), the one threshold both backends keep, so a
/// pile takes the same path on either. A pile of more chunks is copied.
pub(super) fn max_direct_slots(choice: BackendChoice) -> usize {
    backend_limits(choice)
        .max_slots
        .min(crate::io::URING_MAX_REG_BUFFERS)
}

/// One copied load being read: its ring, file and extents (already cut into pieces).
struct Reading<'a> {
    backend: &'a mut dyn Backend,
    key: FileKey,
    file: &'a Arc<DataFile>,
    load: &'a Load,
    unit: usize,
    stop: &'a Stop,
}

impl Reading<'_> {
    /// A whole pile: each extent is copied to its place as its read completes; frames are
    /// indexed over the prefix that is complete, while it is still in the cache.
    fn copy_whole(self, out: &mut LargeBuf, frames: &mut Vec<(u64, usize)>) -> Result<()> {
        let (extents, path, stop) = (&self.load.extents, self.file.path(), self.stop);
        let n = extents.len();
        let mut starts = Vec::with_capacity(n + 1);
        let mut total = 0usize;
        for e in extents.iter() {
            starts.push(total);
            total += e.len as usize;
        }
        starts.push(total);
        out.reserve_total(total);
        let dst = out.append_space(total);
        let mut arrived = vec![false; n];
        let (mut prefix, mut at) = (0usize, 0usize);
        read_extents(
            self.backend,
            self.key,
            self.file,
            extents,
            self.unit,
            false,
            |i, chunk| {
                stop.check()?;
                dst[starts[i]..starts[i + 1]].copy_from_slice(chunk);
                arrived[i] = true;
                while prefix < n && arrived[prefix] {
                    prefix += 1;
                }
                at = index(&dst[..starts[prefix]], at, frames, path)?;
                Ok(())
            },
        )?;
        if at != total {
            return Err(inside_a_frame(path, extents, at as u64));
        }
        Ok(())
    }

    /// One key sub-range of a pile: the frames whose keys it wants, in file order; a frame
    /// split between extents waits in `carry` until it is whole.
    fn copy_range(self, out: &mut LargeBuf, frames: &mut Vec<(u64, usize)>) -> Result<()> {
        let (load, path, stop) = (self.load, self.file.path(), self.stop);
        let mut carry: Vec<u8> = Vec::new();
        let mut consumed = 0u64;
        read_extents(
            self.backend,
            self.key,
            self.file,
            &load.extents,
            self.unit,
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
                            return Err(inside_a_frame(path, &load.extents, consumed + pos as u64))
                        }
                    }
                }
                carry.drain(..pos);
                consumed += pos as u64;
                Ok(())
            },
        )?;
        if !carry.is_empty() {
            return Err(inside_a_frame(path, &load.extents, consumed));
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
