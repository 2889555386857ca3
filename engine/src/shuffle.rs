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

use std::io::Read;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::format::tfrecord::masked_crc;
use crate::format::Format;
use crate::io::IoConfig;
use crate::order::EpochKey;
use crate::piles::{frame, Layout, PileReader, PileWriter};
use crate::pipeline::Stop;
use crate::{Error, Result};

mod output;
use output::OutputWriter;

/// Where records come from.
#[derive(Clone, Debug)]
pub enum Input {
    /// A path. A regular file is read with large direct reads; anything else that reads in
    /// order (a FIFO, a pipe named as `/dev/stdin` or `/dev/fd/N`, a character or block
    /// device) is streamed like standard input. Directories and sockets are refused.
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
    /// Record format: lines (`sep`; `skip` header lines at the top of each input, the first
    /// input's kept at the top of the first output), TFRecord (whole frames, CRCs checked),
    /// fixed-size records (a `header` of bytes at the top of each input, the first input's
    /// kept likewise), tar (WebDataset samples; a tar out) or files (each input a tree or
    /// manifest whose files are the records; a tar out). NumPy files and MDS are refused:
    /// `riffle read` serves them.
    pub format: Format,
    /// Where piles go (default: the output's directory).
    pub tmpdir: Option<PathBuf>,
    /// Numbered outputs.
    pub split: Option<SplitBy>,
    /// The process runs under an I/O throttle (`IoConfig::throttled`): set by the caller
    /// that entered it.
    pub throttled: bool,
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

/// Bytes per record of the epoch table an in-memory shuffle builds at the end.
const TABLE_PER_RECORD: u64 = 4;

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
    let cut = Cut::of(&opts.format)?;
    // A files dataset: its listing's files are the inputs, each one record, written as a
    // tar member named by its path under the tree (or manifest) it came from.
    let mut members: Vec<String> = Vec::new();
    let listed: Vec<Input>;
    let inputs = if let Cut::Whole = cut {
        let mut v = Vec::new();
        for i in inputs {
            let Input::File(root) = i else {
                return Err(Error::Invalid(
                    "a files dataset is a directory tree or a manifest, not standard input".into(),
                ));
            };
            let base = if root.is_dir() {
                root.clone()
            } else {
                crate::scratch::parent_dir(root).to_path_buf()
            };
            for (path, _) in crate::dataset::files::list(root)?.files {
                let rel = path.strip_prefix(&base).unwrap_or(&path);
                members.push(rel.to_string_lossy().trim_start_matches('/').to_owned());
                v.push(Input::File(path));
            }
        }
        listed = v;
        &listed[..]
    } else {
        inputs
    };
    // Empty files are skipped with a notice, as `read` and `index` skip them; the first
    // input left gives the header.
    let inputs = &crate::dataset::skip_empty(inputs.to_vec(), |i| match i {
        Input::File(p) => Some(p.as_path()),
        Input::Stdin => None,
    })?[..];
    let skip = match opts.format {
        Format::Lines { skip, .. } => skip,
        _ => 0,
    };
    let key = EpochKey::new(opts.seed, 0);
    let mut rep = ShuffleReport::default();
    let mut header: Vec<u8> = Vec::new();
    let mut mem = MemoryRecords::default();
    let mut piles: Option<Piles> = None;
    // Every input is classified before any is read, so a missing file or a directory late
    // in the list fails at once rather than after the others were read.
    let sources = classify(inputs)?;
    // Piles go beside the output file; for a stream (stdout, a FIFO, /dev/null) beside the
    // first input file (a disk that holds data, unlike /dev or a /tmp that may be memory),
    // else in the temp directory.
    let tmpdir = opts.tmpdir.clone().unwrap_or_else(|| {
        let beside = |p: &Path| crate::scratch::parent_dir(p).to_path_buf();
        match output {
            Output::File(p) if !output::is_stream(p) => beside(p),
            _ => sources
                .iter()
                .find_map(|s| match s {
                    Source::File { path, .. } => Some(beside(path)),
                    Source::Stream { .. } => None,
                })
                .unwrap_or_else(std::env::temp_dir),
        }
    });
    // Files tell their size: reserve once rather than let the buffer double past it.
    let estimate: u64 = sources.iter().map(Source::size).sum();
    if estimate > 0 && estimate <= opts.memory / 2 {
        mem.data.reserve_exact(estimate as usize);
    }
    // An input expected to fit in memory is read with smaller reads: every byte of their
    // buffers adds to the peak, which is then the records themselves.
    let small_reads = estimate > 0 && estimate <= opts.memory / 2;
    let mut id = 0u64;
    let mut last_progress = 0u64;
    for (n, input) in sources.iter().enumerate() {
        let name = input.name();
        let mut skipped = 0u64;
        let mut keep_header = n == 0;
        // A record must fit a pile's share of the budget to be sorted in memory.
        let max_record = opts.memory / 4;
        let mut member = Vec::new();
        let result = for_each_record(input, cut, max_record, &name, small_reads, |offset, rec| {
            let rec = if let Cut::Whole = cut {
                member.clear();
                crate::format::tar::append(&mut member, &members[n], rec);
                &member[..]
            } else {
                rec
            };
            rep.bytes += rec.len() as u64 + cut.sep().is_some() as u64;
            if skipped < skip {
                skipped += 1;
                if keep_header {
                    header.extend_from_slice(rec);
                    header.extend(cut.sep());
                }
                return Ok(());
            }
            keep_header = false;
            let k = key.key(id);
            id += 1;
            match &mut piles {
                Some(p) => p.add(k, rec),
                None => {
                    mem.add(rec);
                    if mem.footprint() > opts.memory / 2 {
                        // Too big for memory: from here on, scatter into piles.
                        let estimate = estimate.max(rep.bytes * 2);
                        let mut p = Piles::new(&tmpdir, estimate, opts.memory, opts.throttled)?;
                        mem.drain_into(&mut p, &key)?;
                        piles = Some(p);
                    }
                    Ok(())
                }
            }
            .map_err(|e| match e {
                Error::Io { .. } | Error::Os { .. } | Error::Cancelled { .. } => e,
                other => Error::BadInput {
                    path: name.clone().into(),
                    offset: Some(offset),
                    what: other.to_string(),
                },
            })?;
            // Progress every 4 MiB: a clock read per record would cost more than the record.
            if rep.bytes >> 22 != last_progress {
                last_progress = rep.bytes >> 22;
                progress(rep.bytes);
            }
            Ok(())
        });
        let head = result?;
        if n == 0 {
            header.extend_from_slice(&head);
        }
    }
    rep.records = id;
    let mut out = OutputWriter::new(output, opts.split, cut.sep(), cut.trailer(), opts.throttled)?;
    out.header(&header)?;
    let written = match piles {
        None => {
            rep.in_memory = true;
            mem.sort_and_write(&mut out, &key)
        }
        Some(p) => {
            let budget = opts.memory / 2;
            p.drain_in_order(budget, &mut out)
                .map(|(piles, bytes, loads)| {
                    rep.piles = piles;
                    rep.scratch_bytes = bytes;
                    rep.pile_loads = loads;
                })
        }
    };
    written?;
    rep.outputs = out.finish()?;
    rep.seconds = started.elapsed().as_secs_f64();
    Ok(rep)
}

/// The bytes the inputs are known to hold before they are read: the sizes of the regular
/// files among them (streams tell none). For a progress bar; `stat` only, nothing opened.
pub fn total_input_estimate(inputs: &[Input]) -> u64 {
    inputs
        .iter()
        .map(|i| match i {
            Input::File(p) => std::fs::metadata(p)
                .ok()
                .filter(|m| m.is_file())
                .map_or(0, |m| m.len()),
            Input::Stdin => 0,
        })
        .sum()
}

/// How an input is read, decided by `stat` (symlinks followed) before it is opened.
#[derive(Debug)]
enum Source<'a> {
    /// A regular file of `size` bytes: large direct reads through the I/O core.
    File { path: &'a Path, size: u64 },
    /// Plain reads in order, no size known: standard input (`path` None), or a path that
    /// is not a regular file. Opened once, when its turn comes: opening a FIFO waits for
    /// a writer, as `cat` does, and a second open would wait for another (or, through
    /// `/dev/fd/N`, meet the end of a pipe already drained).
    Stream { path: Option<&'a Path> },
}

impl Source<'_> {
    fn size(&self) -> u64 {
        match self {
            Source::File { size, .. } => *size,
            Source::Stream { .. } => 0,
        }
    }

    /// The input as errors name it.
    fn name(&self) -> String {
        match self {
            Source::File { path, .. } | Source::Stream { path: Some(path) } => {
                path.display().to_string()
            }
            Source::Stream { path: None } => "<stdin>".to_owned(),
        }
    }
}

/// Classifies every input, refusing what cannot be read (missing paths, directories,
/// sockets) and a pipe or FIFO given twice, counting standard input: a pipe is read to
/// its end once, so its second mention would read nothing, or wait forever for a writer.
fn classify(inputs: &[Input]) -> Result<Vec<Source<'_>>> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut pipes: Vec<((u64, u64), String)> = Vec::new();
    let mut sources = Vec::with_capacity(inputs.len());
    for input in inputs {
        let (source, meta) = match input {
            Input::Stdin => {
                let meta = std::io::stdin()
                    .as_fd()
                    .try_clone_to_owned()
                    .map(std::fs::File::from)
                    .and_then(|f| f.metadata())
                    .ok();
                (Source::Stream { path: None }, meta)
            }
            Input::File(p) => {
                let meta = std::fs::metadata(p).map_err(|e| Error::io(p, "open", None, e))?;
                let t = meta.file_type();
                let refuse = |why: &str| Error::BadInput {
                    path: p.clone(),
                    offset: None,
                    what: format!("is {}, {why}", crate::io::file_type_name(&t)),
                };
                let source = if t.is_file() {
                    Source::File {
                        path: p,
                        size: meta.len(),
                    }
                } else if t.is_dir() {
                    return Err(refuse("expected a file, a pipe or a device to read"));
                } else if t.is_socket() {
                    return Err(refuse("which cannot be opened for reading"));
                } else {
                    Source::Stream { path: Some(p) }
                };
                (source, Some(meta))
            }
        };
        if let Some(m) = meta.filter(|m| m.file_type().is_fifo()) {
            let name = source.name();
            if let Some((_, first)) = pipes.iter().find(|(id, _)| *id == (m.dev(), m.ino())) {
                return Err(Error::Invalid(format!(
                    "{first} and {name} are the same pipe, which can be read only once"
                )));
            }
            pipes.push(((m.dev(), m.ino()), name));
        }
        sources.push(source);
    }
    Ok(sources)
}

/// How an input is cut into records.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// At a separator byte (not part of the record).
    Sep(u8),
    /// TFRecord frames (the whole frame is the record, so the output is TFRecord too).
    TfRecord,
    /// Every `size` bytes after `header` bytes.
    Fixed { size: u64, header: u64 },
    /// WebDataset samples of a tar archive (their bytes, headers included), up to its
    /// end-of-archive block; the output is a tar.
    Tar,
    /// The whole input is one record (a `files` dataset), written as a tar member named
    /// by its path under the dataset's root; the output is a tar.
    Whole,
}

impl Cut {
    fn of(format: &Format) -> Result<Cut> {
        Ok(match *format {
            Format::Lines { sep, .. } => Cut::Sep(sep),
            Format::TfRecord { .. } => Cut::TfRecord,
            Format::Fixed { size: 0, .. } => {
                return Err(Error::Invalid(
                    "fixed records must have a size above 0".into(),
                ))
            }
            Format::Fixed { size, header } => Cut::Fixed { size, header },
            Format::Npy => {
                return Err(Error::Invalid(
                    "riffle shuffle writes lines, TFRecord or fixed-size records; for .npy \
                     arrays use `riffle read`, or --format fixed:ROW_BYTES:HEADER_BYTES to \
                     shuffle the raw rows"
                        .into(),
                ))
            }
            Format::Tar => Cut::Tar,
            Format::Files => Cut::Whole,
            Format::Mds => {
                return Err(Error::Invalid(
                    "riffle shuffle does not write MDS shards; `riffle read` shuffles them in \
                     place (lirs or two-pass)"
                        .into(),
                ))
            }
        })
    }

    /// The separator written after each record, if any.
    fn sep(&self) -> Option<u8> {
        match self {
            Cut::Sep(b) => Some(*b),
            _ => None,
        }
    }

    /// Bytes that end every output file: a tar's end-of-archive blocks.
    fn trailer(&self) -> Vec<u8> {
        match self {
            Cut::Tar | Cut::Whole => vec![0; 2 * crate::format::tar::BLOCK as usize],
            _ => Vec::new(),
        }
    }
}

/// Calls `f(offset, record)` for every record of an input (for lines, the separator
/// stripped, and a last record without separator still counts). Regular files are read
/// with large direct reads through the I/O core; streams with plain reads. A record longer
/// than `max` is an error. Returns the input's header bytes (fixed records).
fn for_each_record(
    source: &Source,
    cut: Cut,
    max: u64,
    name: &str,
    small_reads: bool,
    mut f: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<Vec<u8>> {
    let mut split = RecordSplitter {
        cut,
        max,
        name,
        carry: Vec::new(),
        carry_at: 0,
        pos: 0,
        header: Vec::new(),
        tar: matches!(cut, Cut::Tar).then(crate::format::tar::TarScanner::new),
        sample: None,
    };
    match *source {
        // One small file, one record (a files dataset): a plain read, not a ring set up and
        // torn down for each of many thousands of files.
        Source::File { path: p, size } if matches!(cut, Cut::Whole) && size <= 8 << 20 => {
            let bytes = std::fs::read(p).map_err(|e| Error::io(p, "read", Some(0), e))?;
            split.feed(&bytes, &mut f)?;
        }
        Source::File { path: p, .. } => {
            let file =
                std::sync::Arc::new(crate::io::DataFile::open(p, crate::io::Access::Read, true)?);
            let cfg = if small_reads {
                crate::io::IoConfig {
                    depth: 4,
                    slot_size: 1 << 20,
                    ..crate::io::IoConfig::default()
                }
            } else {
                crate::io::scan_config()
            };
            crate::io::scan_file(&file, &cfg, |_, chunk| split.feed(chunk, &mut f))?;
        }
        Source::Stream { path } => {
            let mut reader: Box<dyn Read> = match path {
                None => Box::new(std::io::stdin().lock()),
                Some(p) => {
                    Box::new(std::fs::File::open(p).map_err(|e| Error::io(p, "open", None, e))?)
                }
            };
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = match reader.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(Error::io(name, "read", Some(split.pos), e)),
                };
                split.feed(&buf[..n], &mut f)?;
            }
        }
    }
    split.finish(&mut f)?;
    Ok(split.header)
}

/// Cuts a stream of chunks into records, carrying a record split between chunks.
struct RecordSplitter<'a> {
    cut: Cut,
    max: u64,
    name: &'a str,
    carry: Vec<u8>,
    carry_at: u64,
    /// Stream offset of the next chunk.
    pos: u64,
    /// The header bytes met so far (fixed records).
    header: Vec<u8>,
    /// A tar input's scanner, and where its current sample starts (`carry` holds the
    /// bytes from there on).
    tar: Option<crate::format::tar::TarScanner>,
    sample: Option<u64>,
}

impl RecordSplitter<'_> {
    fn too_long(&self, offset: u64, len: usize) -> Error {
        Error::BadInput {
            path: self.name.into(),
            offset: Some(offset),
            what: format!(
                "a record of {len} bytes or more starts here, more than the memory budget allows \
                 ({} bytes per record)",
                self.max
            ),
        }
    }

    fn bad(&self, offset: u64, what: String) -> Error {
        Error::BadInput {
            path: self.name.into(),
            offset: Some(offset),
            what,
        }
    }

    fn feed(&mut self, chunk: &[u8], f: &mut impl FnMut(u64, &[u8]) -> Result<()>) -> Result<()> {
        match self.cut {
            Cut::Sep(sep) => self.feed_sep(sep, chunk, f),
            Cut::Tar => self.feed_tar(chunk, f),
            Cut::Whole => {
                if self.carry.len() + chunk.len() > self.max as usize {
                    return Err(self.too_long(0, self.carry.len() + chunk.len()));
                }
                self.carry.extend_from_slice(chunk);
                self.pos += chunk.len() as u64;
                Ok(())
            }
            _ => self.feed_framed(chunk, f),
        }
    }

    /// Tar samples: the scanner finds where each starts; a sample is delivered when the
    /// next one starts, and the last when the archive ends (its end-of-archive blocks and
    /// anything after them are not records). `carry` holds the input from `carry_at` on:
    /// the current sample's start, or, before the first, wherever a header the scanner has
    /// not finished began (a header may straddle two reads of a pipe). It is cut once per
    /// chunk, not once per sample.
    fn feed_tar(
        &mut self,
        chunk: &[u8],
        f: &mut impl FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        use crate::format::Scanner;
        let at = self.pos;
        self.pos += chunk.len() as u64;
        let scanner = self.tar.as_mut().expect("a tar input has a scanner");
        if scanner.ended() {
            return Ok(());
        }
        if let Err(e) = scanner.feed(at, chunk) {
            return Err(self.bad(e.offset, e.what));
        }
        let starts = scanner.take_starts();
        let end = scanner.ended().then(|| scanner.end());
        let pending = scanner.pending_from(self.pos);
        if self.carry.is_empty() {
            self.carry_at = at;
        }
        self.carry.extend_from_slice(chunk);
        let base = self.carry_at;
        let mut sample = self.sample;
        for s in starts.into_iter().chain(end) {
            if let Some(cur) = sample {
                let len = (s - cur) as usize;
                if len as u64 > self.max {
                    return Err(self.too_long(cur, len));
                }
                let from = (cur - base) as usize;
                f(cur, &self.carry[from..from + len])?;
            }
            sample = Some(s);
        }
        // Keep what a later sample needs: from the current sample's start, or from where
        // the scanner may still need bytes; nothing once the archive has ended.
        let keep = match (end, sample) {
            (Some(_), _) => {
                sample = None;
                self.pos
            }
            (None, Some(cur)) => cur,
            (None, None) => pending,
        };
        self.sample = sample;
        let cut = ((keep.max(base) - base) as usize).min(self.carry.len());
        self.carry.drain(..cut);
        self.carry_at = base + cut as u64;
        if self.carry.len() as u64 > self.max {
            return Err(self.too_long(self.carry_at, self.carry.len()));
        }
        Ok(())
    }

    fn feed_sep(
        &mut self,
        sep: u8,
        chunk: &[u8],
        f: &mut impl FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let mut start = 0usize;
        for p in memchr::memchr_iter(sep, chunk) {
            if self.carry.is_empty() {
                if (p - start) as u64 > self.max {
                    return Err(self.too_long(self.pos + start as u64, p - start));
                }
                f(self.pos + start as u64, &chunk[start..p])?;
            } else {
                self.carry.extend_from_slice(&chunk[..p]);
                if self.carry.len() as u64 > self.max {
                    return Err(self.too_long(self.carry_at, self.carry.len()));
                }
                f(self.carry_at, &self.carry)?;
                self.carry.clear();
            }
            start = p + 1;
        }
        if start < chunk.len() {
            if self.carry.is_empty() {
                self.carry_at = self.pos + start as u64;
            }
            self.carry.extend_from_slice(&chunk[start..]);
            if self.carry.len() as u64 > self.max {
                return Err(self.too_long(self.carry_at, self.carry.len()));
            }
        }
        self.pos += chunk.len() as u64;
        Ok(())
    }

    /// The length of the record at the front of `rest`, once enough of it is there to
    /// tell (`None` until then); checks a TFRecord's length CRC.
    fn frame_len(&self, rest: &[u8], at: u64) -> Result<Option<usize>> {
        let len = match self.cut {
            Cut::Sep(_) | Cut::Tar | Cut::Whole => {
                unreachable!("separated, tar and whole records are cut elsewhere")
            }
            Cut::Fixed { size, .. } => size,
            Cut::TfRecord => {
                if rest.len() < 12 {
                    return Ok(None);
                }
                let len = u64::from_le_bytes(rest[..8].try_into().expect("8 bytes"));
                let crc = u32::from_le_bytes(rest[8..12].try_into().expect("4 bytes"));
                if masked_crc(&rest[..8]) != crc {
                    return Err(self.bad(
                        at + 8,
                        "TFRecord length CRC mismatch (not a TFRecord file, or corrupt)".into(),
                    ));
                }
                len.saturating_add(16)
            }
        };
        if len > self.max {
            return Err(self.too_long(at, len.min(usize::MAX as u64) as usize));
        }
        Ok(Some(len as usize))
    }

    /// Checks a whole TFRecord frame's data CRC, then hands the record on.
    fn deliver(
        &self,
        at: u64,
        rec: &[u8],
        f: &mut impl FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        if let Cut::TfRecord = self.cut {
            let data = &rec[12..rec.len() - 4];
            let crc = u32::from_le_bytes(rec[rec.len() - 4..].try_into().expect("4 bytes"));
            if masked_crc(data) != crc {
                return Err(self.bad(
                    at + rec.len() as u64 - 4,
                    "TFRecord data CRC mismatch (corrupt record)".into(),
                ));
            }
        }
        f(at, rec)
    }

    /// Length-framed records (TFRecord, fixed), after any header bytes.
    fn feed_framed(
        &mut self,
        mut chunk: &[u8],
        f: &mut impl FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let chunk_len = chunk.len() as u64;
        let mut pos = self.pos;
        if let Cut::Fixed { header, .. } = self.cut {
            let want = header.saturating_sub(pos).min(chunk.len() as u64) as usize;
            self.header.extend_from_slice(&chunk[..want]);
            chunk = &chunk[want..];
            pos += want as u64;
        }
        // Complete a record carried over from the previous chunk.
        while !self.carry.is_empty() && !chunk.is_empty() {
            let need = match self.frame_len(&self.carry, self.carry_at)? {
                Some(len) => len - self.carry.len(),
                // A TFRecord header still incomplete: take what completes it.
                None => 12 - self.carry.len(),
            };
            let n = need.min(chunk.len());
            self.carry.extend_from_slice(&chunk[..n]);
            chunk = &chunk[n..];
            pos += n as u64;
            if let Some(len) = self.frame_len(&self.carry, self.carry_at)? {
                if self.carry.len() == len {
                    let mut rec = std::mem::take(&mut self.carry);
                    self.deliver(self.carry_at, &rec, f)?;
                    rec.clear();
                    self.carry = rec;
                }
            }
        }
        let mut at = 0usize;
        while at < chunk.len() {
            let rest = &chunk[at..];
            match self.frame_len(rest, pos + at as u64)? {
                Some(len) if rest.len() >= len => {
                    self.deliver(pos + at as u64, &rest[..len], f)?;
                    at += len;
                }
                _ => {
                    self.carry_at = pos + at as u64;
                    self.carry.extend_from_slice(rest);
                    break;
                }
            }
        }
        self.pos += chunk_len;
        Ok(())
    }

    fn finish(&mut self, f: &mut impl FnMut(u64, &[u8]) -> Result<()>) -> Result<()> {
        if let Some(scanner) = self.tar.as_mut() {
            use crate::format::Scanner;
            scanner.finish(self.pos).map_err(|e| Error::BadInput {
                path: self.name.into(),
                offset: Some(e.offset),
                what: e.what,
            })?;
            // An archive without its end-of-archive block: the last sample ends where its
            // last member does.
            let end = scanner.end();
            if let Some(cur) = self.sample.take() {
                let (from, len) = ((cur - self.carry_at) as usize, (end - cur) as usize);
                if len as u64 > self.max {
                    return Err(self.too_long(cur, len));
                }
                f(cur, &self.carry[from..from + len])?;
            }
            return Ok(());
        }
        if let Cut::Whole = self.cut {
            let rec = std::mem::take(&mut self.carry);
            return f(0, &rec);
        }
        if self.carry.is_empty() {
            return Ok(());
        }
        match self.cut {
            Cut::Sep(_) => {
                let rec = std::mem::take(&mut self.carry);
                f(self.carry_at, &rec)
            }
            Cut::TfRecord => Err(self.bad(
                self.carry_at,
                format!(
                    "truncated: the input ends inside a TFRecord frame ({} bytes of it present)",
                    self.carry.len()
                ),
            )),
            Cut::Fixed { size, .. } => Err(self.bad(
                self.carry_at,
                format!(
                    "truncated: the input ends with a partial record of {} bytes (records are \
                     {size} bytes)",
                    self.carry.len()
                ),
            )),
            Cut::Tar | Cut::Whole => unreachable!("tar and whole inputs finish above"),
        }
    }
}

/// Records held in memory, ids 0, 1, 2, ... in input order: the bytes back to back and
/// the end of each record (4 bytes per record while the bytes stay under 4 GiB, 8 after).
/// The order is the epoch table of the ids (4 bytes per record, built only at the end), so
/// keys are never stored.
#[derive(Default)]
struct MemoryRecords {
    data: Vec<u8>,
    ends: Ends,
}

/// Record ends, as narrow as the data allows.
enum Ends {
    U32(Vec<u32>),
    U64(Vec<u64>),
}

impl Default for Ends {
    fn default() -> Self {
        Ends::U32(Vec::new())
    }
}

impl Ends {
    fn push(&mut self, end: u64) {
        if let Ends::U32(v) = self {
            match u32::try_from(end) {
                Ok(e) => return v.push(e),
                // Past 4 GiB: widen once.
                Err(_) => *self = Ends::U64(v.iter().map(|&e| e as u64).collect()),
            }
        }
        if let Ends::U64(v) = self {
            v.push(end);
        }
    }

    fn get(&self, i: usize) -> usize {
        match self {
            Ends::U32(v) => v[i] as usize,
            Ends::U64(v) => v[i] as usize,
        }
    }

    fn len(&self) -> usize {
        match self {
            Ends::U32(v) => v.len(),
            Ends::U64(v) => v.len(),
        }
    }

    fn capacity_bytes(&self) -> u64 {
        match self {
            Ends::U32(v) => v.capacity() as u64 * 4,
            Ends::U64(v) => v.capacity() as u64 * 8,
        }
    }
}

impl MemoryRecords {
    fn add(&mut self, rec: &[u8]) {
        self.data.extend_from_slice(rec);
        self.ends.push(self.data.len() as u64);
    }

    fn record(&self, id: usize) -> &[u8] {
        let start = if id == 0 { 0 } else { self.ends.get(id - 1) };
        &self.data[start..self.ends.get(id)]
    }

    /// Bytes held, counting the table the final sort will need.
    fn footprint(&self) -> u64 {
        self.data.capacity() as u64
            + self.ends.capacity_bytes()
            + self.ends.len() as u64 * TABLE_PER_RECORD
    }

    fn drain_into(&mut self, p: &mut Piles, key: &EpochKey) -> Result<()> {
        for id in 0..self.ends.len() {
            p.add(key.key(id as u64), self.record(id))?;
        }
        *self = MemoryRecords::default();
        Ok(())
    }

    fn sort_and_write(&mut self, out: &mut OutputWriter, key: &EpochKey) -> Result<()> {
        let table = crate::order::EpochTable::build(self.ends.len() as u64, key);
        for pos in 0..table.len() {
            out.record(self.record(table.unit_at(pos) as usize))?;
        }
        Ok(())
    }
}

/// Piles in a scratch directory of their own (removed when dropped, on error too),
/// written and read through the pile store.
struct Piles {
    dir: crate::scratch::ScratchDir,
    writer: PileWriter,
}

impl Piles {
    fn new(tmpdir: &Path, estimate: u64, memory: u64, throttled: bool) -> Result<Piles> {
        let dir = crate::scratch::ScratchDir::new_in(tmpdir, "shuffle")?;
        // Piles of about a quarter of the budget (a larger one is read in key sub-ranges),
        // at most 4096; their shares of the fill pool take an eighth, from 16 KiB to 1 MiB each, and
        // the writes in flight another eighth (4 MiB at most).
        let target = (memory / 4).max(1 << 20);
        let mut bits = 0;
        while (estimate >> bits) > target && bits < 12 {
            bits += 1;
        }
        let extent = ((memory / 8) / (1u64 << bits)).clamp(16 << 10, 1 << 20) as usize;
        let in_flight = ((memory / 8) as usize).min(4 << 20);
        let layout = Layout::new(bits, extent, in_flight);
        let io = IoConfig::default().under_throttle(throttled);
        let writer = PileWriter::new(dir.path(), layout, &io)?;
        Ok(Piles { dir, writer })
    }

    fn add(&mut self, key: u64, rec: &[u8]) -> Result<()> {
        self.writer.frame(key, &[rec])
    }

    /// Every pile in key order (in key sub-ranges when it exceeds `budget`), sorted, out.
    /// A second thread loads and sorts the next pile while this one writes the current one
    /// (double buffering: two piles in memory at most). Returns (piles, bytes written to
    /// them, loads).
    fn drain_in_order(self, budget: u64, out: &mut OutputWriter) -> Result<(u64, u64, u64)> {
        let set = self.writer.finish()?;
        let (piles, bytes) = (set.len() as u64, set.bytes());
        // A pile's records, their index (16 bytes each) and the sort's scratch.
        let loads = set.into_loads(|size| (size * 3 / 2).div_ceil(budget.max(1)));
        let mut count = 0u64;
        let mut loader = PileReader::new(&IoConfig::default());
        // Double buffered: the next pile is loaded and sorted while this one is written;
        // spent buffers go back to the loader (fresh pages cost a fault and a clear each).
        // An output that fails (a full disk) stops the load under way at its next extent.
        let stop = Stop::default();
        crate::pipeline::pipelined(
            loads.jobs,
            &stop,
            |load, reuse: Option<Loaded>| {
                let mut p = reuse.unwrap_or_default();
                p.data.room_for((load.expect + load.expect / 8) as usize);
                loader.load(load, &mut p.data, &mut p.index, &stop)?;
                crate::order::sort_uniform(&mut p.index, &mut p.scratch, |r| r.0);
                Ok(p)
            },
            |p| {
                count += 1;
                let data = p.data.as_slice();
                // Records are visited in key order, all over the pile: ask for the next
                // ones early so their cache misses overlap this one's copy.
                const AHEAD: usize = 8;
                for (i, &(_, at)) in p.index.iter().enumerate() {
                    if let Some(&(_, ahead)) = p.index.get(i + AHEAD) {
                        for line in (ahead..data.len().min(ahead + 1024)).step_by(64) {
                            crate::io::prefetch(&data[line..]);
                        }
                    }
                    let f = frame::at(data, at);
                    out.record(&data[f.body..f.end])?;
                }
                Ok(std::ops::ControlFlow::Continue(Some(p)))
            },
        )?;
        drop(loads.dir);
        drop(self.dir);
        Ok((piles, bytes, count))
    }
}

/// A loaded pile: its frames (on huge pages: they are read in random order), and
/// (key, offset) per frame.
#[derive(Default)]
struct Loaded {
    data: crate::piles::PileBuf,
    index: Vec<(u64, usize)>,
    scratch: Vec<(u64, usize)>,
}

#[cfg(test)]
mod tests {
    /// A tar streamed in reads of any size (a pipe's: headers straddle reads, also before
    /// the first sample) is cut into exactly the samples the scanner finds in the file.
    #[test]
    fn tar_samples_are_cut_alike_whatever_the_read_sizes() {
        use crate::format::{tar, Scanner};
        let mut a = Vec::new();
        tar::append(&mut a, "dir/", b"");
        for i in 0..40u32 {
            let key = if i % 7 == 0 {
                format!("{}/{i:03}", "long".repeat(40))
            } else {
                format!("{i:03}")
            };
            tar::append(
                &mut a,
                &format!("{key}.jpg"),
                &vec![i as u8; 300 + 97 * i as usize],
            );
            tar::append(&mut a, &format!("{key}.cls"), i.to_string().as_bytes());
        }
        a.extend_from_slice(&[0u8; 1024]);
        let mut sc = tar::TarScanner::new();
        sc.feed(0, &a).unwrap();
        sc.finish(a.len() as u64).unwrap();
        let offs = sc.take_offsets();
        let want: Vec<&[u8]> = offs
            .windows(2)
            .map(|w| &a[w[0] as usize..w[1] as usize])
            .collect();
        for step in [1usize, 7, 511, 512, 513, 1000, 4096, 1 << 20] {
            let mut split = super::RecordSplitter {
                cut: super::Cut::Tar,
                max: 1 << 20,
                name: "t.tar",
                carry: Vec::new(),
                carry_at: 0,
                pos: 0,
                header: Vec::new(),
                tar: Some(tar::TarScanner::new()),
                sample: None,
            };
            let mut got: Vec<Vec<u8>> = Vec::new();
            let mut f = |_: u64, r: &[u8]| {
                got.push(r.to_vec());
                Ok(())
            };
            for c in a.chunks(step) {
                split.feed(c, &mut f).unwrap();
            }
            split.finish(&mut f).unwrap();
            assert_eq!(got.len(), want.len(), "reads of {step}");
            assert!(
                got.iter().zip(&want).all(|(g, w)| g == w),
                "reads of {step}"
            );
        }
    }

    #[test]
    fn record_ends_widen_past_4_gib() {
        let mut e = super::Ends::default();
        e.push(5);
        e.push(u32::MAX as u64);
        assert!(matches!(e, super::Ends::U32(_)));
        e.push(u32::MAX as u64 + 10);
        assert!(matches!(e, super::Ends::U64(_)));
        assert_eq!(
            (0..3).map(|i| e.get(i) as u64).collect::<Vec<_>>(),
            [5, u32::MAX as u64, u32::MAX as u64 + 10]
        );
        assert_eq!(e.len(), 3);
    }
}
