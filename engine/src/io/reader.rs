//! Arbitrary byte ranges over aligned direct I/O.
//!
//! The caller asks for any `(file, offset, len)`; the reader reads the whole aligned extent
//! around it (split into slot-sized pieces when it is long), continues a short read that
//! is not at the end of the file where it stopped (the rest of the piece into the rest of
//! its slot), and hands the caller exactly the requested bytes, clipped at the end of the
//! file.
//!
//! A lazy reader (a dataset's) opens files ahead of their reads: ranges are taken from the
//! caller a window ahead of planning, and each file of the window not open yet is opened
//! by a small pool of threads (`Opener`), so the I/O thread does not wait on `open` (on a
//! cold cache, a directory and inode read from the device) once per file of a dataset of
//! one file per record.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
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
    /// Each file's key while it is open.
    keys: Vec<Option<FileKey>>,
    /// Files opened when first read, at most `cap` at once (None: all opened up front).
    lazy: Option<Lazy>,
    unit: usize,
    stats: ReadStats,
}

/// A request and its number: (number, (file, offset, len)).
type Numbered = (usize, (usize, u64, usize));

/// Files a lazy reader opens ahead of their reads, at most: a quarter of its open-file cap,
/// up to 256.
fn open_window(cap: usize) -> usize {
    (cap / 4).clamp(1, 256)
}

/// Lazy readers alive in this process: they share one open-file budget (a daemon runs one
/// per stream; 32 streams of a dataset of one file per record, each at its own cap, ran
/// out of descriptors).
static LAZY_READERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Descriptors all lazy readers of the process may hold together: half the soft limit
/// (the rest is for sockets, rings, piles and the like).
fn shared_budget() -> usize {
    usize::try_from(super::open_file_limit() / 2).unwrap_or(usize::MAX)
}

/// A file a reader opens when it first reads it, and what it must be to be read.
#[derive(Clone, Debug, Default)]
pub struct LazyFile {
    /// Its path (as errors name it).
    pub path: PathBuf,
    /// The size it had when the dataset was opened (a file found another size is refused).
    pub size: u64,
    /// For a file of a directory tree: the tree's root, held open; the file is opened
    /// beneath it ([`crate::door::Root::open_beneath`]) with no link on the way, never by
    /// `path`.
    pub beneath: Option<Arc<crate::door::Root>>,
    /// Its path under the root when a link in the tree led elsewhere (`None`: `path` less
    /// the root's path).
    pub under: Option<PathBuf>,
    /// The (device, inode) it had when listed: another file at its name is refused.
    pub identity: Option<(u64, u64)>,
}

/// The bounded cache of open files: least recently used first out, never a file with a
/// read planned or in flight (`pins`).
struct Lazy {
    files: Vec<LazyFile>,
    direct: bool,
    cap: usize,
    /// Pieces planned or in flight per file.
    pins: Vec<u32>,
    /// Last use of each open file, and the open files by last use.
    used: Vec<u64>,
    by_use: BTreeMap<u64, usize>,
    tick: u64,
    /// Whether every file opened so far is read with O_DIRECT.
    all_direct: bool,
    /// Files opened (a file opened again after eviction counts again).
    opens: u64,
    /// Of those, files the opener threads opened ahead of their reads.
    opened_ahead: u64,
    /// The pool opening files ahead of their reads (started at the first file asked for).
    opener: Option<Opener>,
    /// The least files it may hold (a file per request in flight, and one more).
    floor: usize,
    /// The process-wide budget ([`shared_budget`]), read once.
    budget: usize,
}

impl Lazy {
    /// The files it may hold now: its cap, or its share of the process's budget when more
    /// lazy readers are alive; never below its floor.
    fn cap(&self) -> usize {
        let readers = LAZY_READERS
            .load(std::sync::atomic::Ordering::Relaxed)
            .max(1);
        self.cap.min(self.budget / readers).max(self.floor)
    }
}

impl Drop for Lazy {
    fn drop(&mut self) {
        LAZY_READERS.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Threads that open a lazy reader's files ahead of their reads. A file asked for is
/// `pending` until it is taken (installed in the backend, or found open already); the
/// files pending count against the reader's open-file cap. Dropping it closes the job
/// queue and joins the threads; files opened and never taken are closed then.
struct Opener {
    jobs: Option<crossbeam_channel::Sender<(usize, LazyFile)>>,
    done: crossbeam_channel::Receiver<(usize, Result<DataFile>)>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Whether each file is asked for and not yet taken.
    pending: Vec<bool>,
    /// How many are.
    outstanding: usize,
    /// Opened (or failed) files that arrived before they were wanted.
    arrived: HashMap<usize, Result<DataFile>>,
}

/// Threads of an `Opener`: opens block on the device on a cold cache, so a few run at once.
const OPENER_THREADS: usize = 2;

impl Opener {
    fn start(files: usize, direct: bool) -> Result<Opener> {
        let (jobs, rx) = crossbeam_channel::unbounded::<(usize, LazyFile)>();
        let (tx, done) = crossbeam_channel::unbounded();
        let mut threads = Vec::with_capacity(OPENER_THREADS);
        for n in 0..OPENER_THREADS {
            let (rx, tx) = (rx.clone(), tx.clone());
            let t = std::thread::Builder::new()
                .name(format!("riffle-open-{n}"))
                .spawn(move || {
                    for (i, spec) in rx {
                        if tx.send((i, DataFile::open_listed(&spec, direct))).is_err() {
                            return;
                        }
                    }
                })
                .map_err(|e| Error::io(Path::new("(opener thread)"), "spawn", None, e))?;
            threads.push(t);
        }
        Ok(Opener {
            jobs: Some(jobs),
            done,
            threads,
            pending: vec![false; files],
            outstanding: 0,
            arrived: HashMap::new(),
        })
    }

    /// File `i`'s open, waiting for it if it has not arrived yet.
    fn take(&mut self, i: usize) -> Result<DataFile> {
        debug_assert!(self.pending[i]);
        let got = match self.arrived.remove(&i) {
            Some(r) => r,
            None => loop {
                let (j, r) = self
                    .done
                    .recv()
                    .map_err(|_| Error::Internal("the file opener threads have stopped".into()))?;
                if j == i {
                    break r;
                }
                self.arrived.insert(j, r);
            },
        };
        self.pending[i] = false;
        self.outstanding -= 1;
        got
    }

    /// Drops file `i`'s open if it was asked for (it is open already).
    fn forget(&mut self, i: usize) {
        if self.pending[i] {
            drop(self.take(i));
        }
    }
}

impl Drop for Opener {
    fn drop(&mut self) {
        self.jobs = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
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
    /// The file's alignment.
    unit: usize,
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
            .map(|f| f.alignment().io_unit())
            .max()
            .unwrap_or(super::align::MIN_UNIT);
        let mut backend = open_backend(cfg, unit)?;
        let keys = files
            .into_iter()
            .map(|f| backend.add_file(f).map(Some))
            .collect::<Result<Vec<_>>>()?;
        Ok(RangeReader {
            backend,
            keys,
            lazy: None,
            unit,
            stats: ReadStats::default(),
        })
    }

    /// A reader that opens each file when it first reads it and holds at most `cap` open
    /// (at least the queue depth plus one): a dataset of 100,000 files needs no more fds
    /// than one of a thousand. A file that is gone, unreadable or of another size than
    /// given is an error naming it, when it is read.
    pub fn lazy(files: Vec<LazyFile>, cfg: &IoConfig, cap: usize) -> Result<Self> {
        let first = files
            .first()
            .ok_or_else(|| Error::Invalid("a reader needs at least one file".into()))?;
        // The alignment from the first file; a later one that needs more than the slots
        // give is refused when it is opened.
        let probe = DataFile::open_listed(first, cfg.direct)?;
        let unit = probe.alignment().io_unit();
        drop(probe);
        let backend = open_backend(cfg, unit)?;
        let n = files.len();
        let floor = backend.depth() + 1;
        let cap = cap.max(floor);
        LAZY_READERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(RangeReader {
            backend,
            keys: vec![None; n],
            lazy: Some(Lazy {
                files,
                direct: cfg.direct,
                cap,
                floor,
                budget: shared_budget(),
                pins: vec![0; n],
                used: vec![0; n],
                by_use: BTreeMap::new(),
                tick: 0,
                all_direct: true,
                opens: 0,
                opened_ahead: 0,
                opener: None,
            }),
            unit,
            stats: ReadStats::default(),
        })
    }

    /// Files open now, and files opened so far (a lazy reader's cache; for an eager one,
    /// its file count twice).
    pub fn open_files(&self) -> (usize, u64) {
        match &self.lazy {
            Some(l) => (l.by_use.len(), l.opens),
            None => (self.keys.len(), self.keys.len() as u64),
        }
    }

    /// Files the opener threads opened ahead of their reads (a lazy reader's; 0 otherwise).
    pub fn opened_ahead(&self) -> u64 {
        self.lazy.as_ref().map_or(0, |l| l.opened_ahead)
    }

    /// The key of file `i`, opening it (and closing the least recently used file with
    /// nothing planned on it) when it is not open.
    fn key_of(&mut self, i: usize) -> Result<FileKey> {
        let Some(slot) = self.keys.get(i) else {
            return Err(Error::Invalid(format!("file index {i} out of range")));
        };
        let Some(lazy) = self.lazy.as_mut() else {
            return slot.ok_or_else(|| Error::Invalid(format!("file index {i} is closed")));
        };
        if let Some(key) = *slot {
            if lazy.used[i] == lazy.tick && lazy.opener.is_none() {
                // Already the one used last (a dataset of one file, or a run in one file):
                // the order of use is as it was, and nothing is touched per read.
                return Ok(key);
            }
            lazy.tick += 1;
            if let Some(o) = lazy.opener.as_mut() {
                o.forget(i);
            }
            lazy.by_use.remove(&lazy.used[i]);
            lazy.used[i] = lazy.tick;
            lazy.by_use.insert(lazy.tick, i);
            return Ok(key);
        }
        lazy.tick += 1;
        // A file opened ahead already counts against the cap.
        let ahead = lazy.opener.as_ref().map_or(0, |o| o.pending[i] as usize);
        self.make_room(ahead);
        let lazy = self.lazy.as_mut().expect("a lazy reader");
        let spec = &lazy.files[i];
        let file = match lazy.opener.as_mut() {
            Some(o) if o.pending[i] => {
                lazy.opened_ahead += 1;
                o.take(i)?
            }
            _ => DataFile::open_listed(spec, lazy.direct)?,
        };
        let unit = file.alignment().io_unit();
        if !self.backend.slot_size().is_multiple_of(unit) {
            return Err(Error::BadInput {
                path: spec.path.clone(),
                offset: None,
                what: format!(
                    "needs {unit}-byte alignment, more than the reader's {}-byte slots allow \
                     (a dataset across filesystems with different alignments)",
                    self.backend.slot_size()
                ),
            });
        }
        lazy.all_direct &= file.direct();
        lazy.opens += 1;
        let key = self.backend.add_file(Arc::new(file))?;
        self.keys[i] = Some(key);
        lazy.used[i] = lazy.tick;
        lazy.by_use.insert(lazy.tick, i);
        Ok(key)
    }

    /// Closes least recently used open files with nothing planned on them while the files
    /// open and opening ahead (less `mine`, already counted by the caller) are at the cap
    /// (which shrinks as more lazy readers share the process's budget). Returns whether
    /// there is room for one more.
    fn make_room(&mut self, mine: usize) -> bool {
        let Some(lazy) = self.lazy.as_mut() else {
            return true;
        };
        let ahead = lazy.opener.as_ref().map_or(0, |o| o.outstanding) - mine;
        // The cap may have shrunk (more readers share the budget): close down to it.
        let cap = lazy.cap();
        while lazy.by_use.len() + ahead >= cap {
            let victim = lazy
                .by_use
                .iter()
                .find(|(_, &f)| lazy.pins[f] == 0)
                .map(|(&t, &f)| (t, f));
            let Some((t, f)) = victim else {
                return false;
            };
            lazy.by_use.remove(&t);
            let key = self.keys[f].take().expect("an open file");
            self.backend.remove_file(key);
        }
        true
    }

    /// Asks the opener pool to open file `file` ahead of its read, when this reader is
    /// lazy, the file is not open or asked for yet, and the window has room.
    fn open_ahead(&mut self, file: usize) -> Result<()> {
        let Some(lazy) = self.lazy.as_mut() else {
            return Ok(());
        };
        if lazy.files.len() < 2 || file >= lazy.files.len() || self.keys[file].is_some() {
            return Ok(());
        }
        if lazy.opener.is_none() {
            lazy.opener = Some(Opener::start(lazy.files.len(), lazy.direct)?);
        }
        let window = open_window(lazy.cap());
        let o = lazy.opener.as_ref().expect("started above");
        if o.pending[file] || o.outstanding >= window || !self.make_room(0) {
            return Ok(());
        }
        let lazy = self.lazy.as_mut().expect("a lazy reader");
        let o = lazy.opener.as_mut().expect("started above");
        let spec = &lazy.files[file];
        if let Some(jobs) = &o.jobs {
            if jobs.send((file, spec.clone())).is_ok() {
                o.pending[file] = true;
                o.outstanding += 1;
            }
        }
        Ok(())
    }

    fn pin(&mut self, file: usize, by: i32) {
        if let Some(l) = self.lazy.as_mut() {
            l.pins[file] = l.pins[file].saturating_add_signed(by);
        }
    }

    /// The backend in use.
    pub fn backend_kind(&self) -> BackendKind {
        self.backend.kind()
    }

    /// The backend's features, for reports.
    pub fn backend_features(&self) -> String {
        self.backend.features()
    }

    /// Whether every file is read with O_DIRECT (for a lazy reader: every file opened so
    /// far).
    pub fn direct(&self) -> bool {
        match &self.lazy {
            Some(l) => l.all_direct,
            None => self
                .keys
                .iter()
                .flatten()
                .all(|&k| self.backend.file(k).direct()),
        }
    }

    /// The alignment every read is rounded to.
    pub fn unit(&self) -> usize {
        self.unit
    }

    /// Bytes of buffer memory the reader owns.
    pub fn buffer_bytes(&self) -> usize {
        self.backend.buffer_bytes()
    }

    /// The file behind index `i`, if it is open.
    pub fn file(&self, i: usize) -> Option<&DataFile> {
        let key = (*self.keys.get(i)?)?;
        Some(self.backend.file(key))
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
        // Requests taken ahead of planning, so their files are opened ahead (lazy readers).
        let mut ahead: VecDeque<Numbered> = VecDeque::new();
        let window = self.lazy.as_ref().map_or(0, |l| open_window(l.cap()));
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
                        None => match self.next_request(&mut requests, &mut ahead, window)? {
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
                        file: self.keys[piece.file].expect("a planned piece's file is open"),
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
                            let f = piece.file;
                            slots[i] = None;
                            self.pin(f, -1);
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
            // Nothing is planned or in flight any more.
            if let Some(l) = self.lazy.as_mut() {
                l.pins.iter_mut().for_each(|p| *p = 0);
            }
        }
        result
    }

    /// The next request: taken from the window of requests read ahead, which is first
    /// refilled from `requests` (each new one's file asked to be opened ahead).
    fn next_request<I: Iterator<Item = Numbered>>(
        &mut self,
        requests: &mut I,
        ahead: &mut VecDeque<Numbered>,
        window: usize,
    ) -> Result<Option<Numbered>> {
        while ahead.len() < window {
            let Some(r) = requests.next() else { break };
            self.open_ahead(r.1 .0)?;
            ahead.push_back(r);
        }
        Ok(ahead.pop_front().or_else(|| requests.next()))
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
        let key = self.key_of(file)?;
        let size = self.backend.file(key).size();
        let unit = self.backend.file(key).alignment().io_unit();
        let want_start = offset.min(size);
        let want_end = offset.saturating_add(len as u64).min(size);
        if want_end <= want_start {
            done(request, &[]);
            return Ok(());
        }
        let unit = unit as u64;
        let slot = self.backend.slot_size() as u64;
        let start = want_start / unit * unit;
        let end = want_end.div_ceil(unit) * unit;
        let count = super::usize_of((end - start).div_ceil(slot));
        if count > 1 {
            let n = super::usize_of(want_end - want_start);
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
                len: super::usize_of(e - s),
                want_start: want_start.max(s),
                want_end: want_end.min(e),
                retries: 0,
                unit: super::usize_of(unit),
            });
            self.pin(file, 1);
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
            let keep = got / piece.unit * piece.unit;
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
        let from = super::usize_of(piece.want_start - piece.start);
        let to = super::usize_of(piece.want_end - piece.start);
        let bytes = &buf[from..to];
        self.stats.delivered_bytes += bytes.len() as u64;
        match assemblies.get_mut(&piece.request) {
            None => done(piece.request, bytes),
            Some(a) => {
                let at = super::usize_of(piece.want_start - a.offset);
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
