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

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::format::Format;
use crate::io::IoConfig;
use crate::order::EpochKey;
use crate::piles::{frame, PileReader, PileWriter};
use crate::pipeline::Stop;
use crate::size::human_bytes;
use crate::{Error, Result};

mod input;
mod output;
mod parts;
use input::{classify, Source};
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

/// `inputs` without riffle's own index sidecars named among them (a shell's `many/*` after
/// a read of `many/`): they are never records.
fn without_sidecars(inputs: &[Input]) -> Result<Vec<Input>> {
    let kept: Vec<Input> = inputs
        .iter()
        .filter(|i| !matches!(i, Input::File(p) if crate::dataset::left_out_as_sidecar(p)))
        .cloned()
        .collect();
    if kept.is_empty() && !inputs.is_empty() {
        return Err(Error::Invalid(
            "the inputs given are riffle's index sidecars only: no records".into(),
        ));
    }
    Ok(kept)
}

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
    check_format(&opts.format)?;
    let inputs = without_sidecars(inputs)?;
    refuse_output_in_tree(output, &inputs, &opts.format)?;
    let named = with_member_names(&inputs, &opts.format)?;
    // Empty files are skipped with a notice, as `read` and `index` skip them; the first
    // input left gives the header.
    let named = crate::dataset::skip_empty(named, |(i, _)| match i {
        Input::File(p) => Some(p.as_path()),
        Input::Stdin => None,
    })?;
    let (inputs, members): (Vec<Input>, Vec<Option<Vec<u8>>>) = named.into_iter().unzip();
    // Every input is classified before any is read, so a missing file or a directory late
    // in the list fails at once rather than after the others were read.
    let sources = classify(&inputs)?;
    output::refuse_inputs(output, opts.split, &inputs)?;
    let tmpdir = opts
        .tmpdir
        .clone()
        .unwrap_or_else(|| scratch_beside(output, &sources));
    let _reserved = reserve_piles(opts, &tmpdir, &sources)?;
    let mut intake = Intake::new(opts, tmpdir, &sources);
    for (n, (source, member)) in sources.iter().zip(&members).enumerate() {
        intake.read(n, source, member.as_deref(), progress)?;
    }
    let mut rep = intake.write_out(output)?;
    rep.seconds = started.elapsed().as_secs_f64();
    Ok(rep)
}

/// Checks, before anything is read, that inputs known to be larger than the memory budget
/// (files tell their size) fit the free space of `tmpdir` as piles, less what other runs
/// there reserved, and reserves it until the shuffle ends: it failed with ENOSPC after
/// reading most of its input before. The piles take at least every record's bytes.
fn reserve_piles(
    opts: &ShuffleOptions,
    tmpdir: &Path,
    sources: &[Source],
) -> Result<Option<crate::scratch::Reservation>> {
    let estimate: u64 = sources.iter().map(Source::size).sum();
    if estimate <= opts.memory / 2 {
        return Ok(None);
    }
    crate::scratch::reserve(tmpdir, |others| {
        let free = crate::resources::Limits::here(Some(tmpdir))
            .scratch_free
            .map(|f| f.saturating_sub(others.0));
        match free {
            Some(free) if estimate > free => Err(Error::OverBudget(format!(
                "{}: shuffle needs at least {} of scratch space for its piles (the inputs' \
                 size, more than --memory holds) and {} is free{} (No space left on the \
                 scratch disk); give --tmpdir a larger disk, or raise --memory",
                tmpdir.display(),
                human_bytes(estimate as f64),
                human_bytes(free as f64),
                if others.0 > 0 {
                    format!(
                        ", after {} other runs there have reserved",
                        human_bytes(others.0 as f64)
                    )
                } else {
                    String::new()
                }
            ))),
            _ => Ok(Some((estimate, 0))),
        }
    })
}

/// Refuses the formats `riffle shuffle` does not write.
fn check_format(format: &Format) -> Result<()> {
    let why = match format {
        Format::Fixed { size: 0, .. } => "fixed records must have a size above 0",
        Format::Npy => {
            "riffle shuffle writes lines, TFRecord or fixed-size records; for .npy arrays use \
             `riffle read`, or --format fixed:ROW_BYTES:HEADER_BYTES to shuffle the raw rows"
        }
        Format::Mds => {
            "riffle shuffle does not write MDS shards; `riffle read` shuffles them in place \
             (lirs or two-pass)"
        }
        _ => return Ok(()),
    };
    Err(Error::Invalid(why.into()))
}

/// The separator written after each record, if any.
fn separator(format: &Format) -> Option<u8> {
    match format {
        Format::Lines { sep, .. } => Some(*sep),
        _ => None,
    }
}

/// Whether the output is a tar (samples of a tar, or a files dataset's files as members).
fn writes_tar(format: &Format) -> bool {
    matches!(format, Format::Tar | Format::Files)
}

/// Refuses an output file (a split output's parts included) inside a `files` tree that
/// is an input (issue 30 D28): the next run would list it, and pack the last run's tar as
/// a record of the new one. Leaving it out of the listing would not do: every other
/// command reading the tree would still take it for data. A FIFO or device written into
/// is never a record (a walk skips them) and is let be.
fn refuse_output_in_tree(output: &Output, inputs: &[Input], format: &Format) -> Result<()> {
    let Output::File(out) = output else {
        return Ok(());
    };
    if !matches!(format, Format::Files) || output::is_stream(out) {
        return Ok(());
    }
    let Ok(dir) = std::fs::canonicalize(crate::scratch::parent_dir(out)) else {
        return Ok(()); // no such directory: nothing can be written there, as it will say
    };
    for root in inputs.iter().filter_map(|i| match i {
        Input::File(p) if p.is_dir() => Some(p),
        _ => None,
    }) {
        let Ok(real_root) = std::fs::canonicalize(root) else {
            continue;
        };
        if dir.starts_with(&real_root) {
            return Err(Error::Invalid(format!(
                "{}: the output is inside the input tree {}, where the next run would take it \
                 for a record; write it outside the tree",
                out.display(),
                root.display()
            )));
        }
    }
    Ok(())
}

/// The inputs, each with the tar member name its record gets: for a files dataset, the
/// listing's files are the inputs, each one record, written as a tar member named by its
/// path under the tree (or manifest) it came from; other inputs get none.
fn with_member_names(inputs: &[Input], format: &Format) -> Result<Vec<(Input, Option<Vec<u8>>)>> {
    if !matches!(format, Format::Files) {
        return Ok(inputs.iter().map(|i| (i.clone(), None)).collect());
    }
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
        for f in crate::dataset::files::list(root)?.files {
            let rel = f.path.strip_prefix(&base).unwrap_or(&f.path);
            // Its bytes, not text: a name that is not UTF-8 reaches the tar as it is.
            let member = std::os::unix::ffi::OsStrExt::as_bytes(rel.as_os_str());
            let member = member.strip_prefix(b"/").unwrap_or(member).to_vec();
            // A link inside the tree is read where it resolved (no link on the way).
            let at = f
                .under
                .as_ref()
                .map_or_else(|| f.path.clone(), |u| root.join(u));
            v.push((Input::File(at), Some(member)));
        }
    }
    // Two files of one key (a/1.jpg, a/1.png) would be two samples of one key.
    let mut keys = std::collections::HashMap::new();
    for m in v.iter().filter_map(|(_, m)| m.as_deref()) {
        if let Some((key, _)) = crate::format::tar::key_suffix(m) {
            if let Some(first) = keys.insert(key, m) {
                return Err(Error::Invalid(format!(
                    "{} and {}: {}",
                    String::from_utf8_lossy(first),
                    String::from_utf8_lossy(m),
                    key_twice(key)
                )));
            }
        }
    }
    Ok(v)
}

/// Where piles go by default: beside the output file; for a stream (stdout, a FIFO,
/// /dev/null) beside the first input file (a disk that holds data, unlike /dev or a /tmp
/// that may be memory), else in the temp directory.
fn scratch_beside(output: &Output, sources: &[Source]) -> PathBuf {
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
}

/// What the inputs' records become as they are read: keyed by their position, held in
/// memory until they outgrow half the budget, then scattered into piles.
struct Intake<'a> {
    opts: &'a ShuffleOptions,
    key: EpochKey,
    tmpdir: PathBuf,
    /// The inputs' size, when files tell it.
    estimate: u64,
    /// Whether the inputs are expected to fit in memory (read with smaller reads: every
    /// byte of their buffers adds to the peak, which is then the records themselves).
    small_reads: bool,
    rep: ShuffleReport,
    /// The first input's header (skipped lines with their separators, or fixed bytes).
    header: Vec<u8>,
    mem: MemoryRecords,
    piles: Option<Piles>,
    /// The next record's id (its position among all inputs' records).
    id: u64,
    last_progress: u64,
    /// A tar's sample keys so far (see [`SampleKeys`]).
    keys: Option<SampleKeys>,
}

/// The keys of the samples a tar shuffle has read, as 128-bit hashes (16 bytes a sample):
/// two samples of one key may land side by side in the shuffled tar, where a reader
/// (riffle, WebDataset) takes them for one sample, so a key met twice is refused before
/// anything is written (issue 30 D8).
#[derive(Default)]
struct SampleKeys(std::collections::HashSet<u128>);

impl SampleKeys {
    /// Whether `key` is new (and notes it).
    fn first(&mut self, key: &[u8]) -> bool {
        use std::hash::{Hash, Hasher};
        let half = |salt: u8| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (salt, key).hash(&mut h);
            h.finish() as u128
        };
        self.0.insert(half(0) << 64 | half(1))
    }
}

/// The error for a sample key met twice.
fn key_twice(key: &[u8]) -> Error {
    Error::Invalid(format!(
        "sample {}: an earlier sample has the same key (the member name up to its first \
         dot); in the shuffled tar the two could land side by side, where readers take \
         them for one sample: refused before anything is written (give one input's \
         samples other keys, such as a prefix)",
        String::from_utf8_lossy(key)
    ))
}

impl<'a> Intake<'a> {
    fn new(opts: &'a ShuffleOptions, tmpdir: PathBuf, sources: &[Source]) -> Self {
        let estimate: u64 = sources.iter().map(Source::size).sum();
        let small_reads = estimate > 0 && estimate <= opts.memory / 2;
        let mut mem = MemoryRecords::default();
        // Files tell their size: reserve once rather than let the buffer double past it.
        if small_reads {
            mem.data.reserve_exact(estimate as usize);
        }
        Intake {
            opts,
            key: EpochKey::new(opts.seed, 0),
            tmpdir,
            estimate,
            small_reads,
            rep: ShuffleReport::default(),
            header: Vec::new(),
            mem,
            piles: None,
            id: 0,
            last_progress: 0,
            keys: matches!(opts.format, Format::Tar).then(SampleKeys::default),
        }
    }

    /// Reads input `n`; a files dataset's record is wrapped as the tar `member` it names.
    fn read(
        &mut self,
        n: usize,
        source: &Source,
        member: Option<&[u8]>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<()> {
        let name = source.name();
        let skip = match self.opts.format {
            Format::Lines { skip, .. } => skip,
            _ => 0,
        };
        let sep = separator(&self.opts.format);
        let mut skipped = 0u64;
        let mut keep_header = n == 0;
        // A record must fit a pile's share of the budget to be sorted in memory.
        let max_record = self.opts.memory / 4;
        let mut wrapped = Vec::new();
        let head = input::for_each_record(
            source,
            &self.opts.format,
            max_record,
            self.small_reads,
            |offset, rec| {
                let rec = match member {
                    Some(m) => {
                        wrapped.clear();
                        crate::format::tar::append(&mut wrapped, m, rec);
                        &wrapped[..]
                    }
                    None => rec,
                };
                self.rep.bytes += rec.len() as u64 + sep.is_some() as u64;
                if skipped < skip {
                    skipped += 1;
                    if keep_header {
                        self.header.extend_from_slice(rec);
                        self.header.extend(sep);
                    }
                    return Ok(());
                }
                keep_header = false;
                if let Some(keys) = &mut self.keys {
                    let key = crate::format::tar::sample_key(rec).map_err(|e| Error::BadInput {
                        path: name.clone().into(),
                        offset: Some(offset + e.offset),
                        what: e.what,
                    })?;
                    if let Some(k) = key.filter(|k| !keys.first(k)) {
                        return Err(Error::BadInput {
                            path: name.clone().into(),
                            offset: Some(offset),
                            what: key_twice(&k).to_string(),
                        });
                    }
                }
                self.add(rec).map_err(|e| match e {
                    Error::Io { .. } | Error::Os { .. } | Error::Cancelled { .. } => e,
                    other => Error::BadInput {
                        path: name.clone().into(),
                        offset: Some(offset),
                        what: other.to_string(),
                    },
                })?;
                // Progress every 4 MiB: a clock read per record would cost more than the
                // record.
                if self.rep.bytes >> 22 != self.last_progress {
                    self.last_progress = self.rep.bytes >> 22;
                    progress(self.rep.bytes);
                }
                Ok(())
            },
        )?;
        if n == 0 {
            self.header.extend_from_slice(&head);
        }
        Ok(())
    }

    /// Keys the next record and keeps it, in memory or in its pile.
    #[inline]
    fn add(&mut self, rec: &[u8]) -> Result<()> {
        let k = self.key.key(self.id);
        self.id += 1;
        if let Some(p) = &mut self.piles {
            return p.add(k, rec);
        }
        self.mem.add(rec);
        if self.mem.footprint() > self.opts.memory / 2 {
            // Too big for memory: from here on, scatter into piles.
            let estimate = self.estimate.max(self.rep.bytes * 2);
            let mut p = Piles::new(
                &self.tmpdir,
                estimate,
                self.opts.memory,
                self.opts.throttled,
            )?;
            self.mem.drain_into(&mut p, &self.key)?;
            self.piles = Some(p);
        }
        Ok(())
    }

    /// Writes the records out in key order: sorted in memory, or pile by pile.
    fn write_out(mut self, output: &Output) -> Result<ShuffleReport> {
        let mut rep = std::mem::take(&mut self.rep);
        rep.records = self.id;
        let trailer = if writes_tar(&self.opts.format) {
            vec![0; 2 * crate::format::tar::BLOCK as usize]
        } else {
            Vec::new()
        };
        let sep = separator(&self.opts.format);
        let mut out =
            OutputWriter::new(output, self.opts.split, sep, trailer, self.opts.throttled)?;
        out.header(&self.header)?;
        match self.piles {
            None => {
                rep.in_memory = true;
                self.mem.sort_and_write(&mut out, &self.key)?;
            }
            Some(p) => {
                let (piles, bytes, loads) = p.drain_in_order(self.opts.memory / 2, &mut out)?;
                rep.piles = piles;
                rep.scratch_bytes = bytes;
                rep.pile_loads = loads;
            }
        }
        rep.outputs = out.finish()?;
        Ok(rep)
    }
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
        let layout =
            crate::resources::shuffle_layout(estimate, memory, crate::io::open_file_limit());
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
                format!("{key}.jpg"),
                &vec![i as u8; 300 + 97 * i as usize],
            );
            tar::append(&mut a, format!("{key}.cls"), i.to_string().as_bytes());
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
            let mut cut =
                crate::format::cut::Cutter::new(&crate::format::Format::Tar, 1 << 20).unwrap();
            let mut got: Vec<Vec<u8>> = Vec::new();
            for c in a.chunks(step) {
                let mut cuts = cut.feed(c);
                while let Some((_, r)) = cuts.next_record().unwrap() {
                    got.push(r.to_vec());
                }
            }
            let mut cuts = cut.finish();
            while let Some((_, r)) = cuts.next_record().unwrap() {
                got.push(r.to_vec());
            }
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
