//! A dataset: one file, a directory of files of one format, or several paths and globs,
//! seen as one sequence of records with global ids in file order.
//!
//! Opening a dataset resolves the paths, decides the format, reads `.npy` headers and
//! loads or builds the offset index of variable-length files. Afterwards
//! [`Dataset::locate`] turns a global id into (file, offset, length) in O(log files).

pub(crate) mod files;
mod freshness;
pub mod index;
mod layout;
pub(crate) mod mds;
mod objects;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::{indexed_span, Format, Span};
use crate::io::{self, DataFile, IoConfig, RangeReader};
use crate::order::RecordLayout;
use crate::{notice, Error, Result};
use layout::open_file;

pub use index::{IndexOrigin, OffsetIndex, StalePolicy};
pub use mds::MdsColumn;
pub use objects::{ObjectCount, OpenCount, RemoteBytes, RemoteLayout, GETS_IN_FLIGHT};

/// How to open a dataset.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// The format; `None` tells it from the extensions.
    pub format: Option<Format>,
    /// What to do with a stale index.
    pub stale: StalePolicy,
    /// I/O for index scans.
    pub scan_io: IoConfig,
    /// Refuse records longer than this (the memory budget), naming the first one.
    pub max_record: Option<u64>,
    /// The local disk an `s3://` dataset may take (`--cache-limit`): staged whole when it
    /// fits, streamed through two-pass piles within it when not; `None`: staged.
    pub cache_limit: Option<u64>,
    /// Whether an index built is saved as a sidecar; not for a copy about to be removed (an
    /// object streamed from a store, fetched only to find its layout), whose sidecar would
    /// take local disk its `--cache-limit` does not count.
    pub save_index: bool,
    /// A staged copy's: the local disk its `--cache-limit` leaves beside the copy, which
    /// the copy's index sidecars take as each is saved or found. A sidecar that does not
    /// fit is not saved (the index is built again at the next open); `None`: no limit.
    pub index_room: Option<Arc<std::sync::atomic::AtomicU64>>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            format: None,
            stale: StalePolicy::Rebuild,
            scan_io: io::scan_config(),
            max_record: None,
            cache_limit: None,
            save_index: true,
            index_room: None,
        }
    }
}

/// One file of a dataset.
#[derive(Clone, Debug)]
pub struct DatasetFile {
    /// Its path.
    pub path: PathBuf,
    /// Its size when opened.
    pub size: u64,
    /// Records in it.
    pub records: u64,
    layout: Layout,
    /// How its index was obtained (variable-length formats only).
    pub index_origin: Option<IndexOrigin>,
    /// A file of a tree: the tree's root, held open, beneath which it is opened (see
    /// [`files`]).
    beneath: Option<Arc<crate::door::Root>>,
    /// Its path under the root when a link led elsewhere (`None`: `path` less the root's).
    under: Option<PathBuf>,
    /// Its (device, inode) when listed (a `files` dataset's): another file at its name is
    /// refused.
    identity: Option<(u64, u64)>,
}

#[derive(Clone, Debug)]
enum Layout {
    Fixed { header: u64, size: u64 },
    Indexed(OffsetIndex),
}

impl DatasetFile {
    /// Where record `i` (local to this file) is.
    pub fn span(&self, format: &Format, i: u64) -> Span {
        match &self.layout {
            Layout::Fixed { header, size } => Span {
                offset: header + i * size,
                len: *size,
            },
            Layout::Indexed(ix) => {
                indexed_span(format, &ix.offsets, ix.last_unterminated, i as usize)
            }
        }
    }

    /// What a reader opens it by, and what it must still be.
    fn lazy(&self) -> io::LazyFile {
        io::LazyFile {
            path: self.path.clone(),
            size: self.size,
            beneath: self.beneath.clone(),
            under: self.under.clone(),
            identity: self.identity,
        }
    }

    fn index_bytes(&self) -> u64 {
        match &self.layout {
            Layout::Fixed { .. } => 0,
            Layout::Indexed(ix) => ix.memory_bytes(),
        }
    }
}

/// Where one record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordLoc {
    /// Index of the file in [`Dataset::files`].
    pub file: usize,
    /// Byte offset of the payload.
    pub offset: u64,
    /// Payload length.
    pub len: u64,
}

/// A view's draws. Large (8 bytes a record of a mixture epoch), so when they go the heap
/// they leave is handed back to the kernel: glibc keeps freed blocks of this size in its
/// arenas, and a daemon drawing epochs for many streams stayed resident at their peak.
#[derive(Debug)]
struct Draws(Vec<u64>);

impl std::ops::Deref for Draws {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        &self.0
    }
}

impl Drop for Draws {
    fn drop(&mut self) {
        if self.0.len() >= 1 << 17 {
            self.0 = Vec::new();
            io::release_freed_heap();
        }
    }
}

/// Records across one or more files.
#[derive(Debug)]
pub struct Dataset {
    format: Format,
    files: Arc<Vec<DatasetFile>>,
    /// first_id[f] is the global id of file f's first record; the last entry is the total.
    first_id: Arc<[u64]>,
    /// A view's records (`with_draws`): record i is the files' record `draws[i]` (a
    /// mixture's epoch, where a record may be drawn more than once or not at all).
    draws: Option<Arc<Draws>>,
    /// Datasets side by side (`concat`): the first id of each part, then the total. Kept
    /// by views, whose records then say their part (`part_of`).
    parts: Option<Arc<[u64]>>,
    /// Record size statistics, worked out once (a pass over every record's span).
    stats: std::sync::OnceLock<SizeStats>,
    /// Each record's label, by id, when the layout gives labels (`files`).
    labels: Option<Arc<[u32]>>,
    /// Class names in label order.
    classes: Vec<String>,
    /// An MDS dataset's columns (empty for other formats).
    columns: Vec<MdsColumn>,
    /// Where the files' bytes are when they are objects streamed from a store (their paths
    /// are then `s3://` URLs and only a sequential read through this reaches them).
    remote: Option<Arc<dyn RemoteBytes>>,
    /// A copy staged under `--cache-limit`: the local disk left beside it for piles.
    staged_room: Option<u64>,
}

impl Dataset {
    /// Opens the dataset named by `paths` (files, directories, globs).
    pub fn open<P: AsRef<Path>>(
        paths: &[P],
        opts: &OpenOptions,
        progress: &mut dyn FnMut(&Path, u64, u64),
    ) -> Result<Dataset> {
        if opts.format == Some(Format::Files) {
            return Self::open_files(paths, opts);
        }
        if let [path] = paths {
            let mds = mds::index_of(path.as_ref());
            match (&opts.format, mds) {
                (Some(Format::Mds) | None, Some(index)) => return Self::open_mds(&index, opts),
                (Some(Format::Mds), None) => {
                    return Err(Error::BadInput {
                        path: path.as_ref().into(),
                        offset: None,
                        what: "not an MDS dataset: no index.json in it".into(),
                    })
                }
                _ => {}
            }
        }
        let files = skip_empty(resolve(paths)?, |p| Some(p.as_path()))?;
        let format = decide_format(&files, opts.format.as_ref())?;
        let mut out = Vec::with_capacity(files.len());
        for path in files {
            out.push(open_file(&path, &format, opts, &mut |done, total| {
                progress(&path, done, total)
            })?);
        }
        let ds = Dataset::of_files(format, out);
        if let Some(limit) = opts.max_record {
            ds.check_max_record(limit)?;
        }
        Ok(ds)
    }

    /// An MDS dataset, its shards located by their own offset tables (see [`mds`]).
    fn open_mds(index: &Path, opts: &OpenOptions) -> Result<Dataset> {
        let (shards, columns) = mds::open(index)?;
        let files: Vec<DatasetFile> = shards
            .into_iter()
            .map(|s| DatasetFile {
                path: s.path,
                size: s.size,
                records: s.index.len(),
                layout: Layout::Indexed(s.index),
                index_origin: None,
                beneath: None,
                under: None,
                identity: None,
            })
            .collect();
        let mut ds = Dataset::of_files(Format::Mds, files);
        ds.columns = columns;
        if let Some(limit) = opts.max_record {
            ds.check_max_record(limit)?;
        }
        Ok(ds)
    }

    /// A dataset of `files` (ids in file order), nothing else set.
    fn of_files(format: Format, files: Vec<DatasetFile>) -> Dataset {
        let mut first_id = Vec::with_capacity(files.len() + 1);
        let mut total = 0u64;
        for f in &files {
            first_id.push(total);
            total += f.records;
        }
        first_id.push(total);
        Dataset {
            format,
            files: Arc::new(files),
            first_id: first_id.into(),
            draws: None,
            parts: None,
            stats: std::sync::OnceLock::new(),
            labels: None,
            classes: Vec::new(),
            columns: Vec::new(),
            remote: None,
            staged_room: None,
        }
    }

    /// An MDS dataset's columns (empty for other formats).
    pub fn columns(&self) -> &[MdsColumn] {
        &self.columns
    }

    /// A `files` dataset: one directory tree or one manifest (see [`files`]).
    fn open_files<P: AsRef<Path>>(paths: &[P], opts: &OpenOptions) -> Result<Dataset> {
        let [path] = paths else {
            return Err(Error::Invalid(format!(
                "a files dataset is one directory tree or one manifest; {} paths were given",
                paths.len()
            )));
        };
        let path = path.as_ref();
        // A tree's root is held from before it is listed: its files are opened beneath it.
        let root = if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
            Some(Arc::new(crate::door::Root::open(path)?))
        } else {
            None
        };
        let listing = files::list(path)?;
        let files: Vec<DatasetFile> = listing
            .files
            .into_iter()
            .map(|f| DatasetFile {
                beneath: root.clone(),
                // Kept only where a link led elsewhere: most files are their listed path.
                under: f
                    .under
                    .filter(|u| f.path.strip_prefix(path).ok() != Some(u.as_path())),
                identity: Some(f.identity),
                path: f.path,
                size: f.size,
                records: 1,
                layout: Layout::Fixed {
                    header: 0,
                    size: f.size,
                },
                index_origin: None,
            })
            .collect();
        let mut ds = Dataset::of_files(Format::Files, files);
        ds.labels = listing.labels.map(Arc::from);
        ds.classes = listing.classes;
        if let Some(limit) = opts.max_record {
            ds.check_max_record(limit)?;
        }
        Ok(ds)
    }

    /// Each record's label by id, when the dataset has labels (a `files` tree of class
    /// directories).
    pub fn labels(&self) -> Option<&Arc<[u32]>> {
        self.labels.as_ref()
    }

    /// Class names in label order (empty without labels).
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// The format of every file.
    pub fn format(&self) -> &Format {
        &self.format
    }

    /// The files, in id order.
    pub fn files(&self) -> &[DatasetFile] {
        &self.files
    }

    /// Total records.
    pub fn len(&self) -> u64 {
        match &self.draws {
            Some(d) => d.len() as u64,
            None => self.records(),
        }
    }

    /// Datasets side by side ([`Dataset::concat`], or a view of them): the first id of
    /// each part, then the total.
    pub fn parts(&self) -> Option<&[u64]> {
        self.parts.as_deref()
    }

    /// The part the files' record `id` (not a view's id: see [`Dataset::drawn`]) belongs
    /// to, when these are datasets side by side.
    pub fn part_of(&self, id: u64) -> Option<usize> {
        let p = self.parts.as_ref()?;
        Some(p.partition_point(|&s| s <= id).saturating_sub(1))
    }

    /// Memory a view holds of its own (its draws, 8 bytes a record, and their labels, 4):
    /// a pass over it holds this beside its buffers. 0 for a dataset (its index is
    /// [`Dataset::index_bytes`]).
    pub fn view_bytes(&self) -> u64 {
        match &self.draws {
            Some(d) => d.len() as u64 * (8 + if self.labels.is_some() { 4 } else { 0 }),
            None => 0,
        }
    }

    /// Whether this is a view of drawn records (a mixture's epoch).
    pub fn is_view(&self) -> bool {
        self.draws.is_some()
    }

    /// Records in the files (a view's `len` is its draws').
    pub fn records(&self) -> u64 {
        *self.first_id.last().expect("at least the total")
    }

    /// A view of this dataset whose record `i` is its record `draws[i]` (each below
    /// [`Dataset::records`]): a mixture's epoch. The files, indexes and format are shared;
    /// labels follow the draws.
    pub fn with_draws(&self, draws: Vec<u64>) -> Result<Dataset> {
        let n = self.records();
        if let Some(bad) = draws.iter().find(|&&d| d >= n) {
            return Err(Error::Invalid(format!(
                "draw of record {bad} from a dataset of {n} records"
            )));
        }
        if draws.is_empty() {
            return Err(Error::Invalid("a view of no records".into()));
        }
        let labels = self.labels.as_ref().map(|l| {
            // Straight into the shared slice: no second copy while it is made.
            draws.iter().map(|&d| l[d as usize]).collect::<Arc<[u32]>>()
        });
        Ok(Dataset {
            format: self.format.clone(),
            files: self.files.clone(),
            first_id: self.first_id.clone(),
            // The vector itself, not a copy (a mixture epoch's draws are large).
            draws: Some(Arc::new(Draws(draws))),
            parts: self.parts.clone(),
            // The statistics are the files' (what a view draws does not change them).
            stats: self.stats.clone(),
            labels,
            classes: self.classes.clone(),
            columns: self.columns.clone(),
            remote: self.remote.clone(),
            staged_room: self.staged_room,
        })
    }

    /// What the order contract needs of the records (count, files, spans): see
    /// [`RecordLayout`]. A view's records are its draws; the files' spans stay the files'.
    pub fn layout(&self) -> RecordLayout<'_> {
        RecordLayout {
            records: self.len(),
            file_records: self.files.iter().map(|f| f.records).collect(),
            span: Box::new(|f, i| {
                let s = self.files[f].span(&self.format, i);
                (s.offset, s.len)
            }),
        }
    }

    /// The files' record a view's record `id` is (itself without a view).
    pub fn drawn(&self, id: u64) -> u64 {
        match &self.draws {
            Some(d) => d[id as usize],
            None => id,
        }
    }

    /// Datasets of one format side by side: their records in turn (a mixture's sources);
    /// [`Dataset::parts`] says where each starts.
    pub fn concat(parts: Vec<Dataset>) -> Result<Dataset> {
        let Some(first) = parts.first() else {
            return Err(Error::Invalid("no datasets to put together".into()));
        };
        let format = first.format.clone();
        let mut files = Vec::new();
        let mut starts = Vec::new();
        let mut total = 0u64;
        for p in parts {
            if !p.format.same_kind(&format) || p.draws.is_some() {
                return Err(Error::Invalid(format!(
                    "datasets of one format only: {} and {}",
                    format.name(),
                    p.format.name()
                )));
            }
            starts.push(total);
            total += p.records();
            // The parts are consumed: their files move (a part still shared is copied).
            files.extend(Arc::try_unwrap(p.files).unwrap_or_else(|a| (*a).clone()));
        }
        starts.push(total);
        let mut ds = Dataset::of_files(format, files);
        ds.parts = Some(starts.into());
        Ok(ds)
    }

    /// Whether there are no records (never true for an opened dataset).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of memory the offset indexes hold.
    pub fn index_bytes(&self) -> u64 {
        self.files.iter().map(DatasetFile::index_bytes).sum()
    }

    /// Total bytes of the files.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// Where global record `id` is. Panics if `id >= len()`.
    pub fn locate(&self, id: u64) -> RecordLoc {
        assert!(
            id < self.len(),
            "record id {id} out of range ({} records)",
            self.len()
        );
        let id = self.drawn(id);
        let file = self.first_id.partition_point(|&first| first <= id) - 1;
        let span = self.files[file].span(&self.format, id - self.first_id[file]);
        RecordLoc {
            file,
            offset: span.offset,
            len: span.len,
        }
    }

    /// A reader of the files through the I/O core. Files are opened when first read, at
    /// most [`open_file_cap`] at once (least recently used closed first), so the dataset's
    /// file count never meets the open-file limit.
    pub fn reader(&self, cfg: &IoConfig) -> Result<RangeReader> {
        self.reader_capped(cfg, open_file_cap())
    }

    /// A reader of the files that keeps at most `cap` of them open (at least the queue
    /// depth plus one): for a reader that goes through the files in order (the two-pass
    /// scatter), which needs few, beside one that reads at random.
    pub fn reader_capped(&self, cfg: &IoConfig, cap: usize) -> Result<RangeReader> {
        let files = self.files.iter().map(DatasetFile::lazy).collect();
        RangeReader::lazy(files, cfg, cap.max(cfg.depth + 1))
    }

    /// Opens file `i` (O_DIRECT when `direct` and the filesystem allows it), refusing it if
    /// its size changed since the dataset was opened.
    pub fn open_one(&self, i: usize, direct: bool) -> Result<Arc<DataFile>> {
        DataFile::open_listed(&self.files[i].lazy(), direct).map(Arc::new)
    }

    /// Reads records `ids` and calls `done(position in ids, bytes)` in completion order.
    pub fn read_records(
        &self,
        reader: &mut RangeReader,
        ids: &[u64],
        done: impl FnMut(usize, &[u8]),
    ) -> Result<()> {
        reader.read_ranges(
            ids.iter().map(|&id| {
                let l = self.locate(id);
                (l.file, l.offset, l.len as usize)
            }),
            done,
        )
    }

    /// Record length statistics: (min, mean, max, offset-of-max as (file, offset)).
    pub fn size_stats(&self) -> SizeStats {
        *self.stats.get_or_init(|| self.compute_size_stats())
    }

    fn compute_size_stats(&self) -> SizeStats {
        let mut s = SizeStats {
            min: u64::MAX,
            max: 0,
            total: 0,
            max_at: (0, 0),
        };
        for (fi, f) in self.files.iter().enumerate() {
            match &f.layout {
                Layout::Fixed { size, header } => {
                    if f.records > 0 {
                        s.min = s.min.min(*size);
                        if *size > s.max {
                            s.max = *size;
                            s.max_at = (fi, *header);
                        }
                        s.total += size * f.records;
                    }
                }
                Layout::Indexed(_) => {
                    for i in 0..f.records {
                        let sp = f.span(&self.format, i);
                        s.min = s.min.min(sp.len);
                        if sp.len > s.max {
                            s.max = sp.len;
                            s.max_at = (fi, sp.offset);
                        }
                        s.total += sp.len;
                    }
                }
            }
        }
        if s.min == u64::MAX {
            s.min = 0;
        }
        s
    }

    fn check_max_record(&self, limit: u64) -> Result<()> {
        let s = self.size_stats();
        if s.max > limit {
            let f = &self.files[s.max_at.0];
            return Err(Error::BadInput {
                path: f.path.clone(),
                offset: Some(s.max_at.1),
                what: format!("a record of {} bytes starts here, more than the memory budget of {limit} bytes", s.max),
            });
        }
        Ok(())
    }
}

/// Record length statistics.
#[derive(Clone, Copy, Debug)]
pub struct SizeStats {
    /// Shortest record.
    pub min: u64,
    /// Longest record.
    pub max: u64,
    /// Sum of lengths.
    pub total: u64,
    /// (file index, payload offset) of the longest record.
    pub max_at: (usize, u64),
}

fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Whether a directory entry is data (not hidden, not an index sidecar or temp file).
fn is_data_file(path: &Path) -> bool {
    path.file_name().is_some_and(|n| !skipped_name(n))
}

/// Whether an entry of a dataset's directory is left out: hidden, or riffle's own sidecar
/// or its temporary file.
pub(crate) fn skipped_name(name: &std::ffi::OsStr) -> bool {
    let name = name.to_string_lossy();
    name.starts_with('.') || name.ends_with(".ridx") || name.contains(".ridx.tmp")
}

/// Dataset files a reader keeps open at once: [`io::reader_cap`] of the soft open-file
/// limit.
pub fn open_file_cap() -> usize {
    io::reader_cap(io::open_file_limit())
}

/// Expands paths, directories and globs into the ordered list of files.
pub fn resolve<P: AsRef<Path>>(paths: &[P]) -> Result<Vec<PathBuf>> {
    if paths.is_empty() {
        return Err(Error::Invalid("no dataset path given".into()));
    }
    let mut out = Vec::new();
    for p in paths {
        let p = p.as_ref();
        let text = p.to_string_lossy();
        if has_glob(&text) && !p.exists() {
            let mut hits: Vec<PathBuf> = glob::glob(&text)
                .map_err(|e| Error::Invalid(format!("{text}: bad pattern: {e}")))?
                .filter_map(|r| r.ok())
                .filter(|h| is_data_file(h))
                .filter(|h| is_regular_entry(h))
                .collect();
            if hits.is_empty() {
                return Err(Error::BadInput {
                    path: p.into(),
                    offset: None,
                    what: "the pattern matches no files".into(),
                });
            }
            hits.sort();
            out.extend(hits);
            continue;
        }
        let meta = std::fs::metadata(p).map_err(|e| Error::io(p, "open", None, e))?;
        if meta.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| Error::io(p, "list directory", None, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|e| is_data_file(e))
                .filter(|e| is_regular_entry(e))
                .collect();
            if entries.is_empty() {
                let has_dirs = std::fs::read_dir(p).is_ok_and(|rd| {
                    rd.flatten().any(|e| {
                        !e.file_name().to_string_lossy().starts_with('.')
                            && e.file_type().is_ok_and(|t| t.is_dir())
                    })
                });
                return Err(Error::BadInput {
                    path: p.into(),
                    offset: None,
                    what: if has_dirs {
                        "the directory holds no data files, only directories: for a tree of one \
                         file per sample (ImageFolder's layout), pass --format files"
                            .into()
                    } else {
                        "the directory holds no data files".into()
                    },
                });
            }
            entries.sort();
            out.extend(entries);
        } else if meta.is_file() {
            if left_out_as_sidecar(p) {
                continue;
            }
            out.push(p.to_path_buf());
        } else {
            return Err(not_regular(p, &meta.file_type()));
        }
    }
    if out.is_empty() {
        return Err(Error::Invalid(
            "the paths given are riffle's index sidecars only: no data files".into(),
        ));
    }
    Ok(out)
}

/// Whether a path named on its own is left out as one of riffle's index or listing
/// sidecars (`riffle read many/*` after a read of `many/`: the shell hands over the
/// sidecars too; they are never data), said once.
pub(crate) fn left_out_as_sidecar(path: &Path) -> bool {
    let own = is_own_sidecar(path);
    if own {
        crate::notice::once(
            "sidecars-named",
            &format!(
                "{}: riffle's own index sidecar, left out (so are any others named)",
                path.display()
            ),
        );
    }
    own
}

/// Whether a file is one of riffle's index or listing sidecars: a `.ridx` name and a
/// sidecar's magic at its start (a user's own file of that name stays data).
fn is_own_sidecar(path: &Path) -> bool {
    use std::io::Read;
    let named = path
        .file_name()
        .is_some_and(|n| n.to_string_lossy().ends_with(".ridx"));
    if !named || !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return false;
    }
    let mut head = [0u8; 8];
    crate::door::open_data(path, false)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| index::is_magic(&head) || files::is_magic(&head))
}

/// The error for a path named on its own that is not a regular file. It is found by `stat`
/// before anything is opened: a FIFO is never opened (that would wait for a writer). Block
/// devices are refused too: a dataset's size, index and staleness check come from the
/// file's `stat`, whose size is 0 for a device.
fn not_regular(path: &Path, t: &std::fs::FileType) -> Error {
    use std::os::unix::fs::FileTypeExt;
    let kind = io::file_type_name(t);
    let what = if t.is_socket() {
        format!("is {kind}; a dataset is read from regular files")
    } else {
        let why = if t.is_block_device() {
            "a dataset is read from regular files, not devices"
        } else {
            "random access needs a regular file"
        };
        format!("is {kind}; {why} (to shuffle a stream, use `riffle shuffle`)")
    };
    Error::BadInput {
        path: path.into(),
        offset: None,
        what,
    }
}

/// Whether a directory entry or glob match is a regular file (symlinks followed) to take
/// into the dataset. Subdirectories are not entered and entries that cannot be stat'ed
/// (dangling links) are left out, silently as ever. Other special files (FIFOs, sockets,
/// devices) are skipped with a notice naming each, not refused: a directory is a set of
/// data files, and one stray pipe or socket beside them should not make the rest
/// unreadable, nor be opened.
fn is_regular_entry(path: &Path) -> bool {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => true,
        Ok(m) if !m.is_dir() => {
            notice::once(
                &format!("not-regular:{}", path.display()),
                &format!(
                    "skipping {}: it is {}, not a regular file",
                    path.display(),
                    io::file_type_name(&m.file_type())
                ),
            );
            false
        }
        _ => false,
    }
}

/// Leaves out the items whose path (from `path`) is an empty (0-byte) regular file, with a
/// notice naming each: such a file holds no records, and one empty shard should not make
/// the rest of a dataset unreadable. The one policy of `read`, `index` and `shuffle`.
/// Nothing left but empty files is an error naming the first: there are no records.
pub(crate) fn skip_empty<T>(items: Vec<T>, path: impl Fn(&T) -> Option<&Path>) -> Result<Vec<T>> {
    let is_empty = |item: &T| {
        path(item).is_some_and(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.len() == 0))
    };
    let (empty, kept): (Vec<T>, Vec<T>) = items.into_iter().partition(|i| is_empty(i));
    let Some(first) = empty.first().and_then(&path) else {
        return Ok(kept);
    };
    if kept.is_empty() {
        return Err(Error::BadInput {
            path: first.into(),
            offset: Some(0),
            what: match empty.len() {
                1 => "empty file: no records".into(),
                2 => "empty file: no records, and the dataset's other file is empty too".into(),
                n => format!(
                    "empty file: no records, and the dataset's other {} files are empty too",
                    n - 1
                ),
            },
        });
    }
    let paths: Vec<&Path> = empty.iter().filter_map(&path).collect();
    notice_empty(&paths);
    Ok(kept)
}

/// Empty files named one by one at most: more are summed up in one notice.
const EMPTY_NAMED: usize = 3;

/// Says which empty files a dataset leaves out: each by name when there are a few, else
/// one notice with their count and the first few (a tree of 20,000 empty files printed
/// 20,000 lines a run).
pub(crate) fn notice_empty(paths: &[&Path]) {
    if paths.len() <= EMPTY_NAMED {
        for p in paths {
            notice::once(
                &format!("empty:{}", p.display()),
                &format!(
                    "skipping {}: it is empty (0 bytes, no records)",
                    p.display()
                ),
            );
        }
        return;
    }
    let first: Vec<String> = paths[..EMPTY_NAMED]
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    notice::once(
        &format!("empty:{}:{}", paths.len(), first[0]),
        &format!(
            "skipping {} empty files (0 bytes, no records): {} and {} more",
            paths.len(),
            first.join(", "),
            paths.len() - EMPTY_NAMED
        ),
    );
}

fn decide_format(files: &[PathBuf], given: Option<&Format>) -> Result<Format> {
    if let Some(gz) = files.iter().find(|f| {
        let n = f.to_string_lossy().to_ascii_lowercase();
        n.ends_with(".tar.gz") || n.ends_with(".tgz")
    }) {
        return Err(Error::BadInput {
            path: gz.clone(),
            offset: Some(0),
            what: "a gzip-compressed tar: riffle reads shards in place, at random, which a \
                   compressed stream does not allow; decompress it first (gunzip keeps the \
                   .tar)"
                .into(),
        });
    }
    if let Some(f) = given {
        return Ok(f.clone());
    }
    let first = &files[0];
    let format = Format::from_extension(first).ok_or_else(|| Error::BadInput {
        path: first.clone(),
        offset: None,
        what: "cannot tell the format from the extension; pass --format (npy, lines, csv, tfrecord, tar, files or fixed:SIZE)".into(),
    })?;
    for f in &files[1..] {
        match Format::from_extension(f) {
            Some(g) if g == format => {}
            other => {
                return Err(Error::BadInput {
                    path: f.clone(),
                    offset: None,
                    what: format!(
                        "mixed formats in one dataset: {} is {}, this file is {}",
                        first.display(),
                        format.name(),
                        other
                            .map(|g| g.name().to_owned())
                            .unwrap_or_else(|| "of unknown format".into())
                    ),
                })
            }
        }
    }
    Ok(format)
}
