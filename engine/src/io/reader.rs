//! Arbitrary byte ranges over aligned direct I/O.
//!
//! The caller asks for any `(file, offset, len)`; the reader reads the whole aligned extent
//! around it (split into slot-sized pieces when it is long), continues a short read that
//! is not at the end of the file where it stopped (the rest of the piece into the rest of
//! its slot), and hands the caller exactly the requested bytes, clipped at the end of the
//! file.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;

use super::{
    completion_error, open_backend, Access, Backend, BackendKind, Completion, DataFile, FileKey,
    IoConfig, Op, OpKind,
};
use crate::{Error, Result};

/// How many reads in a row may end short without progress (nothing new up to a whole
/// alignment unit) before the file is declared changed.
const MAX_RETRIES: u32 = 8;

/// Reads byte ranges of a set of files through one backend.
pub struct RangeReader {
    backend: Box<dyn Backend>,
    keys: Vec<FileKey>,
    unit: usize,
    stats: ReadStats,
}

/// Counters of what a reader did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Read requests completed (each continuation of a short read counts again).
    pub read_ops: u64,
    /// Bytes the device transferred (whole aligned extents).
    pub device_bytes: u64,
    /// Bytes handed to the caller.
    pub delivered_bytes: u64,
    /// Short reads that were continued.
    pub retries: u64,
}

/// One slot-sized piece of a request.
#[derive(Clone, Copy, Debug)]
struct Piece {
    request: usize,
    file: usize,
    /// Aligned start and length of the read.
    start: u64,
    len: usize,
    /// The wanted bytes inside the piece: [want_start, want_end) in file offsets.
    want_start: u64,
    want_end: u64,
    /// Short reads in a row that made no progress.
    retries: u32,
}

/// A request that spans several pieces, assembled as they complete.
struct Assembly {
    offset: u64,
    data: Vec<u8>,
    missing: usize,
}

impl RangeReader {
    /// Opens `paths` (O_DIRECT where allowed) on a backend chosen by `cfg`.
    pub fn open<P: AsRef<Path>>(paths: &[P], cfg: &IoConfig) -> Result<Self> {
        let files = paths
            .iter()
            .map(|p| DataFile::open(p.as_ref(), Access::Read, cfg.direct).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        Self::with_files(files, cfg)
    }

    /// A reader over files that are already open.
    pub fn with_files(files: Vec<Arc<DataFile>>, cfg: &IoConfig) -> Result<Self> {
        let unit = files
            .iter()
            .map(|f| f.alignment().unit())
            .max()
            .unwrap_or(1)
            .max(512);
        let mut backend = open_backend(cfg, unit)?;
        let keys = files
            .into_iter()
            .map(|f| backend.add_file(f))
            .collect::<Result<Vec<_>>>()?;
        Ok(RangeReader {
            backend,
            keys,
            unit,
            stats: ReadStats::default(),
        })
    }

    /// The backend in use.
    pub fn backend_kind(&self) -> BackendKind {
        self.backend.kind()
    }

    /// The backend's features, for reports.
    pub fn backend_features(&self) -> String {
        self.backend.features()
    }

    /// Whether every file is read with O_DIRECT.
    pub fn direct(&self) -> bool {
        self.keys.iter().all(|&k| self.backend.file(k).direct())
    }

    /// The alignment every read is rounded to.
    pub fn unit(&self) -> usize {
        self.unit
    }

    /// Bytes of buffer memory the reader owns.
    pub fn buffer_bytes(&self) -> usize {
        self.backend.buffer_bytes()
    }

    /// The file behind index `i`.
    pub fn file(&self, i: usize) -> &DataFile {
        self.backend.file(self.keys[i])
    }

    /// What the reader has done so far.
    pub fn stats(&self) -> ReadStats {
        self.stats
    }

    /// Reads every `(file index, offset, len)` and calls `done(request index, bytes)` for
    /// each, in completion order (not request order). Ranges are clipped at the end of the
    /// file. Requests are kept in flight up to the queue depth and submitted in batches.
    pub fn read_ranges<I, F>(&mut self, ranges: I, mut done: F) -> Result<()>
    where
        I: IntoIterator<Item = (usize, u64, usize)>,
        F: FnMut(usize, &[u8]),
    {
        let mut requests = ranges.into_iter().enumerate();
        let mut pieces: VecDeque<Piece> = VecDeque::new();
        let mut slots: Vec<Option<Piece>> = vec![None; self.backend.depth()];
        let mut assemblies: HashMap<usize, Assembly> = HashMap::new();
        let mut completions: Vec<Completion> = Vec::with_capacity(slots.len());
        let depth = slots.len();
        let result = (|| -> Result<()> {
            loop {
                while self.backend.in_flight() < depth {
                    let piece = match pieces.pop_front() {
                        Some(p) => p,
                        None => match requests.next() {
                            Some((i, (file, offset, len))) => {
                                self.plan(
                                    i,
                                    file,
                                    offset,
                                    len,
                                    &mut pieces,
                                    &mut assemblies,
                                    &mut done,
                                )?;
                                continue;
                            }
                            None => break,
                        },
                    };
                    let slot = self.backend.acquire().expect("a free slot below depth");
                    let op = Op {
                        slot,
                        file: self.keys[piece.file],
                        offset: piece.start,
                        len: piece.len,
                        at: 0,
                        kind: OpKind::Read,
                        tag: 0,
                    };
                    if let Err(e) = self.backend.push(op) {
                        self.backend.release(slot);
                        return Err(e);
                    }
                    slots[slot.index()] = Some(piece);
                }
                if self.backend.in_flight() == 0 {
                    return Ok(());
                }
                self.backend.wait(1, &mut completions)?;
                // Handle every completion (releasing its slot, unless a short read goes on
                // in it) before reporting the first error, so no slot is left held.
                let mut first_error = None;
                for c in completions.drain(..) {
                    let i = c.op.slot.index();
                    let piece = slots[i].as_mut().expect("piece for slot");
                    let outcome = match first_error {
                        None => self.finish(piece, &c, &mut assemblies, &mut done),
                        Some(_) => Ok(None),
                    };
                    let pushed = match outcome {
                        Ok(Some(rest)) => self.backend.push(rest),
                        Ok(None) => {
                            slots[i] = None;
                            self.backend.release(c.op.slot);
                            continue;
                        }
                        Err(e) => Err(e),
                    };
                    if let Err(e) = pushed {
                        first_error.get_or_insert(e);
                        slots[i] = None;
                        self.backend.release(c.op.slot);
                    }
                }
                if let Some(e) = first_error {
                    return Err(e);
                }
            }
        })();
        if result.is_err() {
            // A failed wait may have left completions here: their slots are held.
            for c in completions.drain(..) {
                self.backend.release(c.op.slot);
            }
            self.drain();
        }
        result
    }

    /// Splits one request into aligned pieces; empty requests complete at once.
    #[allow(clippy::too_many_arguments)]
    fn plan<F: FnMut(usize, &[u8])>(
        &mut self,
        request: usize,
        file: usize,
        offset: u64,
        len: usize,
        pieces: &mut VecDeque<Piece>,
        assemblies: &mut HashMap<usize, Assembly>,
        done: &mut F,
    ) -> Result<()> {
        let Some(&key) = self.keys.get(file) else {
            return Err(Error::Invalid(format!("file index {file} out of range")));
        };
        let size = self.backend.file(key).size();
        let want_start = offset.min(size);
        let want_end = offset.saturating_add(len as u64).min(size);
        if want_end <= want_start {
            done(request, &[]);
            return Ok(());
        }
        let unit = self.unit as u64;
        let slot = self.backend.slot_size() as u64;
        let start = want_start / unit * unit;
        let end = want_end.div_ceil(unit) * unit;
        let count = (end - start).div_ceil(slot) as usize;
        if count > 1 {
            let n = (want_end - want_start) as usize;
            assemblies.insert(
                request,
                Assembly {
                    offset: want_start,
                    data: vec![0; n],
                    missing: count,
                },
            );
        }
        let mut s = start;
        while s < end {
            let e = (s + slot).min(end);
            pieces.push_back(Piece {
                request,
                file,
                start: s,
                len: (e - s) as usize,
                want_start: want_start.max(s),
                want_end: want_end.min(e),
                retries: 0,
            });
            s = e;
        }
        Ok(())
    }

    /// Handles one completion; returns the rest of the piece to read after a short read
    /// (its slot stays in flight), or `None` once the piece is delivered (its slot can be
    /// released).
    fn finish<F: FnMut(usize, &[u8])>(
        &mut self,
        piece: &mut Piece,
        c: &Completion,
        assemblies: &mut HashMap<usize, Assembly>,
        done: &mut F,
    ) -> Result<Option<Op>> {
        let file = self.backend.file(c.op.file);
        let n = match c.result {
            Ok(n) => n,
            Err(errno) => return Err(completion_error(file, &c.op, errno)),
        };
        self.stats.read_ops += 1;
        self.stats.device_bytes += n as u64;
        // The slot holds the piece's first `got` bytes: earlier reads filled [0, at).
        let got = c.op.at + n;
        if piece.start + (got as u64) < piece.want_end {
            // A short read before the bytes we need: go on from where it stopped, rounded
            // down to the alignment (direct reads must start aligned; the partial unit is
            // read again). Reads that bring nothing new, again and again, mean the file
            // shrank under us.
            let keep = got / self.unit * self.unit;
            if keep > c.op.at {
                piece.retries = 0;
            } else if piece.retries >= MAX_RETRIES {
                return Err(Error::BadInput {
                    path: file.path().into(),
                    offset: Some(piece.start + got as u64),
                    what: format!(
                        "file ended early: expected {} bytes here, got {got}; was it changed while being read?",
                        piece.want_end - piece.start
                    ),
                });
            } else {
                piece.retries += 1;
            }
            self.stats.retries += 1;
            return Ok(Some(c.op.advance(keep - c.op.at)));
        }
        let buf = self.backend.slot(c.op.slot);
        let from = (piece.want_start - piece.start) as usize;
        let to = (piece.want_end - piece.start) as usize;
        let bytes = &buf[from..to];
        self.stats.delivered_bytes += bytes.len() as u64;
        match assemblies.get_mut(&piece.request) {
            None => done(piece.request, bytes),
            Some(a) => {
                let at = (piece.want_start - a.offset) as usize;
                a.data[at..at + bytes.len()].copy_from_slice(bytes);
                a.missing -= 1;
                if a.missing == 0 {
                    let a = assemblies.remove(&piece.request).expect("assembly");
                    done(piece.request, &a.data);
                }
            }
        }
        Ok(None)
    }

    /// Waits for everything in flight and frees the slots (after an error).
    fn drain(&mut self) {
        let mut sink = Vec::new();
        while self.backend.in_flight() > 0 {
            if self
                .backend
                .wait(self.backend.in_flight(), &mut sink)
                .is_err()
            {
                return;
            }
            for c in sink.drain(..) {
                self.backend.release(c.op.slot);
            }
        }
    }
}
