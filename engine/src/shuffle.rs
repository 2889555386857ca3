//! `riffle shuffle`: shuffles the lines (or other records) of files too big for memory,
//! in place of `shuf` or terashuf.
//!
//! Every record gets the key of its position in the input under the seed (the order
//! contract's keyed bijection), and the output is the records sorted by key: the same
//! output for the same seed and input whatever the memory budget. When the input fits in
//! the budget it is sorted in memory and no temporary file is made; otherwise records are
//! scattered into piles by the top bits of their key (sequential writes), and each pile is
//! loaded, sorted and written out (sequential reads), the two-pass external shuffle of the
//! seeds. A pile that outgrows its share is read in key sub-ranges, never whole.
//!
//! The output is written under a temporary name in its directory and renamed into place
//! when complete, so an interrupted shuffle never leaves a partial output behind.

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::order::EpochKey;
use crate::{Error, Result};

/// Where records come from.
#[derive(Clone, Debug)]
pub enum Input {
    /// A file.
    File(PathBuf),
    /// Standard input.
    Stdin,
}

/// Where they go.
#[derive(Clone, Debug)]
pub enum Output {
    /// A file (or numbered files when split).
    File(PathBuf),
    /// Standard output.
    Stdout,
}

/// How to split the output into numbered files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitBy {
    /// At most this many records per file.
    Lines(u64),
    /// Start a new file once this many bytes are written.
    Bytes(u64),
}

/// Options.
#[derive(Clone, Debug)]
pub struct ShuffleOptions {
    /// Seed of the order.
    pub seed: u64,
    /// Hard budget for records held in memory, index included.
    pub memory: u64,
    /// Record separator.
    pub sep: u8,
    /// Header lines at the top of each input, kept once at the top of the first output.
    pub skip: u64,
    /// Where piles go (default: the output's directory).
    pub tmpdir: Option<PathBuf>,
    /// Numbered outputs.
    pub split: Option<SplitBy>,
}

/// What a shuffle did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ShuffleReport {
    /// Records shuffled (headers excluded).
    pub records: u64,
    /// Input bytes.
    pub bytes: u64,
    /// Whether it fitted in memory (no temporary files).
    pub in_memory: bool,
    /// Piles used.
    pub piles: u64,
    /// Pile loads (more than piles when one was read in key ranges).
    pub pile_loads: u64,
    /// Bytes written to temporary piles.
    pub scratch_bytes: u64,
    /// Output files written.
    pub outputs: Vec<String>,
    /// Wall time.
    pub seconds: f64,
}

/// Bytes of index per record held in memory: key, offset and length.
const PER_RECORD: u64 = 8 + 8 + 4;
/// Bytes of frame head per record in a pile: key and length.
const FRAME_HEAD: usize = 12;

/// Shuffles `inputs` into `output`.
pub fn shuffle(
    inputs: &[Input],
    output: &Output,
    opts: &ShuffleOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<ShuffleReport> {
    let started = Instant::now();
    if opts.memory < (1 << 20) {
        return Err(Error::Invalid("--memory must be at least 1 MiB".into()));
    }
    let key = EpochKey::new(opts.seed, 0);
    let mut rep = ShuffleReport::default();
    let mut header: Vec<u8> = Vec::new();
    let mut mem = MemoryRecords::default();
    let mut piles: Option<Piles> = None;
    let tmpdir = opts.tmpdir.clone().unwrap_or_else(|| match output {
        Output::File(p) => p
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf(),
        Output::Stdout => std::env::temp_dir(),
    });
    let mut id = 0u64;
    for (n, input) in inputs.iter().enumerate() {
        let name = match input {
            Input::File(p) => p.display().to_string(),
            Input::Stdin => "<stdin>".to_owned(),
        };
        let reader: Box<dyn Read> = match input {
            Input::File(p) => {
                Box::new(std::fs::File::open(p).map_err(|e| Error::io(p, "open", None, e))?)
            }
            Input::Stdin => Box::new(std::io::stdin().lock()),
        };
        let mut skipped = 0u64;
        let mut keep_header = n == 0;
        let result = for_each_record(reader, opts.sep, opts.memory / 4, &name, |offset, rec| {
            rep.bytes += rec.len() as u64 + 1;
            if skipped < opts.skip {
                skipped += 1;
                if keep_header {
                    header.extend_from_slice(rec);
                    header.push(opts.sep);
                }
                return Ok(());
            }
            keep_header = false;
            let k = key.key(id);
            id += 1;
            match &mut piles {
                Some(p) => p.add(k, rec),
                None => {
                    mem.add(k, rec)?;
                    if mem.footprint() > opts.memory / 2 {
                        // Too big for memory: from here on, scatter into piles.
                        let estimate = total_input_estimate(inputs).max(rep.bytes * 2);
                        let mut p = Piles::new(&tmpdir, estimate, opts.memory)?;
                        mem.drain_into(&mut p)?;
                        piles = Some(p);
                    }
                    Ok(())
                }
            }
            .map_err(|e| match e {
                Error::Io { .. } => e,
                other => Error::BadInput {
                    path: name.clone().into(),
                    offset: Some(offset),
                    what: other.to_string(),
                },
            })?;
            progress(rep.bytes);
            Ok(())
        });
        result?;
    }
    rep.records = id;
    let mut out = OutputWriter::new(output, opts.split, opts.sep)?;
    out.header(&header)?;
    let written = match piles {
        None => {
            rep.in_memory = true;
            mem.sort_and_write(&mut out)
        }
        Some(mut p) => {
            p.finish()?;
            rep.piles = p.count() as u64;
            rep.scratch_bytes = p.written();
            let budget = opts.memory / 2;
            p.drain_in_order(budget, &mut out, &mut rep.pile_loads)
        }
    };
    written?;
    rep.outputs = out.finish()?;
    rep.seconds = started.elapsed().as_secs_f64();
    Ok(rep)
}

fn total_input_estimate(inputs: &[Input]) -> u64 {
    inputs
        .iter()
        .map(|i| match i {
            Input::File(p) => std::fs::metadata(p).map(|m| m.len()).unwrap_or(0),
            Input::Stdin => 0,
        })
        .sum()
}

/// Calls `f(offset, record)` for every record of a stream (the separator stripped; a last
/// record without separator still counts). A record longer than `max` is an error.
fn for_each_record(
    mut r: Box<dyn Read>,
    sep: u8,
    max: u64,
    name: &str,
    mut f: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    let too_long = |offset: u64, len: usize| Error::BadInput {
        path: name.into(),
        offset: Some(offset),
        what: format!(
            "a record of {len} bytes or more starts here, more than the memory budget allows \
             ({max} bytes per record)"
        ),
    };
    let mut buf = vec![0u8; (max as usize / 2).clamp(64 << 10, 4 << 20)];
    let mut have = 0usize;
    let mut base = 0u64; // file offset of buf[0]
    loop {
        let n = r
            .read(&mut buf[have..])
            .map_err(|e| Error::io(name, "read", Some(base + have as u64), e))?;
        let end = have + n;
        let mut start = 0usize;
        for p in memchr::memchr_iter(sep, &buf[..end]) {
            if (p - start) as u64 > max {
                return Err(too_long(base + start as u64, p - start));
            }
            f(base + start as u64, &buf[start..p])?;
            start = p + 1;
        }
        if n == 0 {
            if start < end {
                if (end - start) as u64 > max {
                    return Err(too_long(base + start as u64, end - start));
                }
                f(base + start as u64, &buf[start..end])?;
            }
            return Ok(());
        }
        // Keep the partial record; grow the buffer if one record fills it.
        buf.copy_within(start..end, 0);
        base += start as u64;
        have = end - start;
        if have == buf.len() {
            if buf.len() as u64 > max {
                return Err(too_long(base, buf.len()));
            }
            buf.resize(buf.len() * 2, 0);
        }
    }
}

/// Records held in memory: the bytes back to back, and (key, offset, length) per record.
#[derive(Default)]
struct MemoryRecords {
    data: Vec<u8>,
    index: Vec<(u64, u64, u32)>,
}

impl MemoryRecords {
    fn add(&mut self, key: u64, rec: &[u8]) -> Result<()> {
        let len = u32::try_from(rec.len())
            .map_err(|_| Error::Invalid("a record of 4 GiB or more".into()))?;
        self.index.push((key, self.data.len() as u64, len));
        self.data.extend_from_slice(rec);
        Ok(())
    }

    fn footprint(&self) -> u64 {
        self.data.capacity() as u64 + self.index.capacity() as u64 * PER_RECORD
    }

    fn drain_into(&mut self, p: &mut Piles) -> Result<()> {
        for &(k, off, len) in &self.index {
            p.add(k, &self.data[off as usize..off as usize + len as usize])?;
        }
        *self = MemoryRecords::default();
        Ok(())
    }

    fn sort_and_write(&mut self, out: &mut OutputWriter) -> Result<()> {
        self.index.sort_unstable_by_key(|&(k, _, _)| k);
        for &(_, off, len) in &self.index {
            out.record(&self.data[off as usize..off as usize + len as usize])?;
        }
        Ok(())
    }
}

/// Pile files in a temporary directory (removed when dropped, on error too).
struct Piles {
    dir: tempfile::TempDir,
    bits: u32,
    writers: Vec<(PathBuf, BufWriter<std::fs::File>, u64)>,
}

impl Piles {
    fn new(tmpdir: &Path, estimate: u64, memory: u64) -> Result<Piles> {
        let dir = tempfile::Builder::new()
            .prefix(".riffle-shuffle-")
            .tempdir_in(tmpdir)
            .map_err(|e| Error::io(tmpdir, "create temporary directory", None, e))?;
        // Piles of about a quarter of the budget, with headroom; buffers share another
        // quarter.
        let target = (memory / 4).max(1 << 20);
        let mut bits = 0;
        while (estimate >> bits) > target && bits < 14 {
            bits += 1;
        }
        let piles = 1usize << bits;
        let buf = ((memory / 4) as usize / piles).clamp(8 << 10, 1 << 20);
        let writers = (0..piles)
            .map(|i| {
                let path = dir.path().join(format!("pile-{i:05}"));
                let f = std::fs::File::create(&path)
                    .map_err(|e| Error::io(&path, "create pile", None, e))?;
                Ok((path, BufWriter::with_capacity(buf, f), 0u64))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Piles { dir, bits, writers })
    }

    fn count(&self) -> usize {
        self.writers.len()
    }

    fn written(&self) -> u64 {
        self.writers.iter().map(|w| w.2).sum()
    }

    fn add(&mut self, key: u64, rec: &[u8]) -> Result<()> {
        let i = if self.bits == 0 {
            0
        } else {
            (key >> (64 - self.bits)) as usize
        };
        let (path, w, n) = &mut self.writers[i];
        let mut head = [0u8; FRAME_HEAD];
        head[..8].copy_from_slice(&key.to_le_bytes());
        head[8..].copy_from_slice(&(rec.len() as u32).to_le_bytes());
        w.write_all(&head)
            .and_then(|()| w.write_all(rec))
            .map_err(|e| Error::io(&*path, "write pile", Some(*n), e))?;
        *n += (FRAME_HEAD + rec.len()) as u64;
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        for (path, w, _) in &mut self.writers {
            w.flush()
                .map_err(|e| Error::io(&*path, "write pile", None, e))?;
        }
        Ok(())
    }

    /// Each pile in key order (in key sub-ranges when it exceeds `budget`), sorted, out.
    fn drain_in_order(self, budget: u64, out: &mut OutputWriter, loads: &mut u64) -> Result<()> {
        let shift = if self.bits == 0 { 0 } else { 64 - self.bits };
        let width: u128 = if self.bits == 0 { 1 << 64 } else { 1 << shift };
        for (i, (path, w, size)) in self.writers.into_iter().enumerate() {
            drop(w);
            let lo = if self.bits == 0 {
                0
            } else {
                (i as u128) << shift
            };
            let passes = (size * 3 / 2).div_ceil(budget.max(1)).max(1) as u128;
            for pass in 0..passes {
                let a = lo + width * pass / passes;
                let b = lo + width * (pass + 1) / passes;
                let (data, mut index) = load(&path, a, b)?;
                *loads += 1;
                index.sort_unstable_by_key(|&(k, _, _)| k);
                for (_, off, len) in index {
                    out.record(&data[off..off + len])?;
                }
            }
            let _ = std::fs::remove_file(&path);
        }
        drop(self.dir);
        Ok(())
    }
}

/// The records of a pile with keys in [lo, hi).
/// A loaded pile: the record bytes, and (key, offset, length) per record.
type Loaded = (Vec<u8>, Vec<(u64, usize, usize)>);

fn load(path: &Path, lo: u128, hi: u128) -> Result<Loaded> {
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, "open pile", None, e))?;
    let mut r = BufReader::with_capacity(1 << 20, f);
    let (mut data, mut index) = (Vec::new(), Vec::new());
    let mut head = [0u8; FRAME_HEAD];
    let mut at = 0u64;
    loop {
        match r.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok((data, index)),
            Err(e) => return Err(Error::io(path, "read pile", Some(at), e)),
        }
        let k = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(head[8..].try_into().expect("4 bytes")) as usize;
        if (lo..hi).contains(&(k as u128)) {
            let off = data.len();
            data.resize(off + len, 0);
            r.read_exact(&mut data[off..])
                .map_err(|e| Error::io(path, "read pile", Some(at), e))?;
            index.push((k, off, len));
        } else {
            std::io::copy(&mut (&mut r).take(len as u64), &mut std::io::sink())
                .map_err(|e| Error::io(path, "read pile", Some(at), e))?;
        }
        at += (FRAME_HEAD + len) as u64;
    }
}

type OpenOutput = (PathBuf, PathBuf, BufWriter<Box<dyn Write>>);

/// Writes records to stdout or to files under temporary names, renamed when complete.
struct OutputWriter {
    target: Output,
    split: Option<SplitBy>,
    sep: u8,
    /// The open output: its final path, its temporary path (empty for stdout), the writer.
    current: Option<OpenOutput>,
    done: Vec<(PathBuf, PathBuf)>,
    records: u64,
    bytes: u64,
    index: usize,
}

impl OutputWriter {
    fn new(target: &Output, split: Option<SplitBy>, sep: u8) -> Result<Self> {
        let mut w = OutputWriter {
            target: target.clone(),
            split,
            sep,
            current: None,
            done: Vec::new(),
            records: 0,
            bytes: 0,
            index: 0,
        };
        w.open_next()?;
        Ok(w)
    }

    fn name(&self) -> Option<PathBuf> {
        match (&self.target, self.split) {
            (Output::File(p), None) => Some(p.clone()),
            (Output::File(p), Some(_)) => {
                let mut s = p.as_os_str().to_owned();
                s.push(format!(".{:03}", self.index));
                Some(PathBuf::from(s))
            }
            (Output::Stdout, _) => None,
        }
    }

    fn open_next(&mut self) -> Result<()> {
        let w: (PathBuf, PathBuf, Box<dyn Write>) = match self.name() {
            None => (
                PathBuf::from("<stdout>"),
                PathBuf::new(),
                Box::new(std::io::stdout()),
            ),
            Some(final_path) => {
                let dir = final_path
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .unwrap_or(Path::new("."));
                let file_name = final_path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let tmp = dir.join(format!(".{file_name}.riffle-tmp-{}", std::process::id()));
                let f =
                    std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, "create", None, e))?;
                (final_path, tmp, Box::new(f))
            }
        };
        self.current = Some((w.0, w.1, BufWriter::with_capacity(1 << 20, w.2)));
        self.index += 1;
        self.records = 0;
        self.bytes = 0;
        Ok(())
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let (path, tmp, w) = self.current.as_mut().expect("an open output");
        let shown = if tmp.as_os_str().is_empty() {
            path.clone()
        } else {
            tmp.clone()
        };
        w.write_all(bytes)
            .map_err(|e| Error::io(shown, "write", None, e))
    }

    fn header(&mut self, h: &[u8]) -> Result<()> {
        self.write(h)
    }

    fn record(&mut self, rec: &[u8]) -> Result<()> {
        let full = match self.split {
            Some(SplitBy::Lines(n)) => self.records >= n,
            Some(SplitBy::Bytes(n)) => self.bytes >= n,
            None => false,
        };
        if full {
            self.close_current()?;
            self.open_next()?;
        }
        self.write(rec)?;
        self.write(&[self.sep])?;
        self.records += 1;
        self.bytes += rec.len() as u64 + 1;
        Ok(())
    }

    fn close_current(&mut self) -> Result<()> {
        if let Some((path, tmp, mut w)) = self.current.take() {
            let shown = if tmp.as_os_str().is_empty() {
                path.clone()
            } else {
                tmp.clone()
            };
            w.flush().map_err(|e| Error::io(&shown, "write", None, e))?;
            if !tmp.as_os_str().is_empty() {
                let f = w
                    .into_inner()
                    .map_err(|e| Error::io(&shown, "write", None, e.into_error()))?;
                drop(f);
                self.done.push((path, tmp));
            }
        }
        Ok(())
    }

    /// Closes everything and renames the finished files into place.
    fn finish(mut self) -> Result<Vec<String>> {
        self.close_current()?;
        let mut names = Vec::new();
        for (path, tmp) in std::mem::take(&mut self.done) {
            std::fs::rename(&tmp, &path)
                .map_err(|e| Error::io(&path, "rename into place", None, e))?;
            names.push(path.display().to_string());
        }
        if matches!(self.target, Output::Stdout) {
            names.push("<stdout>".into());
        }
        Ok(names)
    }
}

impl Drop for OutputWriter {
    fn drop(&mut self) {
        // Anything still here was not completed: remove the temporary files.
        if let Some((_, tmp, _)) = self.current.take() {
            if !tmp.as_os_str().is_empty() {
                let _ = std::fs::remove_file(tmp);
            }
        }
        for (_, tmp) in self.done.drain(..) {
            let _ = std::fs::remove_file(tmp);
        }
    }
}
