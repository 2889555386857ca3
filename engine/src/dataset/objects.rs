//! A dataset whose files are objects in a store, streamed rather than staged (`remote`
//! builds it): its files keep their layouts (offsets, or a fixed record size) but their
//! paths are `s3://` URLs, and their bytes are reached only through [`RemoteBytes`], a
//! sequential reader of byte ranges in file order. The two-pass scatter is the one reader
//! that takes it; the modes that read at random refuse such a dataset, naming it.

use std::path::PathBuf;
use std::sync::Arc;

use super::{Dataset, DatasetFile, Layout, OffsetIndex};
use crate::format::Format;
use crate::Result;

/// Ranged GETs a streamed read keeps in flight (their bodies are its read buffers): 32, or
/// GETs of 8 MiB, gave no shorter epochs here, within the runs' noise
/// (`docs/object-storage.md`).
pub const GETS_IN_FLIGHT: usize = 16;

/// GETs and bytes fetched from one object in one epoch, for the read's report.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ObjectCount {
    /// The object (`s3://bucket/key`).
    pub object: String,
    /// The epoch.
    pub epoch: u64,
    /// Ranged GETs that returned its bytes.
    pub gets: u64,
    /// Bytes fetched.
    pub bytes: u64,
}

/// What opening a streamed dataset asked the store for, beside the read's own GETs
/// ([`ObjectCount`]), for the read's report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct OpenCount {
    /// Listings of the URL (a LIST, paged by the store; a HEAD when it names one object).
    pub lists: u64,
    /// GETs made to find the objects' layouts: objects fetched whole to be indexed, an
    /// MDS dataset's `index.json` and its shards' headers.
    pub gets: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Objects whose layout came from the local layout cache (no GET; an MDS shard's header
    /// from the header cache).
    pub layouts_cached: u64,
    /// Objects whose layout was found by fetching (an MDS shard's header: one ranged GET).
    pub layouts_fetched: u64,
}

/// The files' bytes, in a store: read in large ranges, in file order, several in flight.
/// Also the keeper of the local disk the read may use (`--cache-limit`), which every
/// byte the read writes locally is charged against.
pub trait RemoteBytes: Send + Sync + std::fmt::Debug {
    /// Reads `ranges` (file, offset, length), in the order given, each range at most once,
    /// several in flight; calls `done(i, bytes)` for range `i` in that order. Stops asking
    /// for more once `stop()` says so. `epoch` is what the fetches are counted under.
    fn read_in_order(
        &self,
        epoch: u64,
        ranges: &mut dyn Iterator<Item = (usize, u64, usize)>,
        done: &mut dyn FnMut(usize, &[u8]),
        stop: &dyn Fn() -> bool,
    ) -> Result<()>;

    /// What each object gave each epoch so far.
    fn counts(&self) -> Vec<ObjectCount>;

    /// What opening the dataset asked the store for.
    fn opened(&self) -> OpenCount;

    /// The local disk the read may use, in bytes.
    fn cache_limit(&self) -> u64;

    /// Charges `bytes` about to be written locally (for `what`) against the limit: an
    /// error naming the limit when they would pass it, nothing charged then.
    fn charge(&self, bytes: u64, what: &str) -> Result<()>;

    /// Gives back `bytes` charged before (their files are gone).
    fn release(&self, bytes: u64);

    /// Bytes charged for as long as the dataset is open (its objects' layouts in the
    /// local cache): a read's piles have the limit less these.
    fn kept(&self) -> u64;

    /// The most charged at once.
    fn peak(&self) -> u64;

    /// Where piles go by default: the local cache of these objects.
    fn scratch_home(&self) -> PathBuf;
}

/// One object's records, as a streamed dataset's file holds them.
#[derive(Clone, Debug, PartialEq)]
pub enum RemoteLayout {
    /// Records of `size` bytes after `header` bytes.
    Fixed {
        /// Bytes before the first record.
        header: u64,
        /// Bytes per record.
        size: u64,
    },
    /// An offset index.
    Indexed(OffsetIndex),
}

impl DatasetFile {
    /// Its layout, as a streamed dataset keeps it.
    pub fn remote_layout(&self) -> RemoteLayout {
        match &self.layout {
            Layout::Fixed { header, size } => RemoteLayout::Fixed {
                header: *header,
                size: *size,
            },
            Layout::Indexed(ix) => RemoteLayout::Indexed(ix.clone()),
        }
    }

    /// A file of a streamed dataset: the object `url`, `size` bytes, laid out as `layout`.
    pub fn remote(url: PathBuf, size: u64, layout: RemoteLayout) -> DatasetFile {
        let (layout, records) = match layout {
            RemoteLayout::Fixed { header, size: rs } => (
                Layout::Fixed { header, size: rs },
                size.saturating_sub(header) / rs.max(1),
            ),
            RemoteLayout::Indexed(ix) => {
                let n = ix.len();
                (Layout::Indexed(ix), n)
            }
        };
        DatasetFile {
            path: url,
            size,
            records,
            layout,
            index_origin: None,
            beneath: None,
            under: None,
            identity: None,
        }
    }
}

impl super::OpenOptions {
    /// What `index_room` has left once the copies are open: the room for their piles.
    pub fn staged_room(&self) -> Option<u64> {
        (self.index_room.as_ref()).map(|r| r.load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl Dataset {
    /// A streamed dataset of `files` (in id order) in `format`, its bytes behind `bytes`;
    /// an MDS dataset's `columns`. Records longer than `max_record` are refused.
    pub fn streamed(
        format: Format,
        files: Vec<DatasetFile>,
        columns: Vec<super::MdsColumn>,
        bytes: Arc<dyn RemoteBytes>,
        max_record: Option<u64>,
    ) -> Result<Dataset> {
        let mut ds = Dataset::of_files(format, files);
        ds.columns = columns;
        ds.remote = Some(bytes);
        if let Some(limit) = max_record {
            ds.check_max_record(limit)?;
        }
        Ok(ds)
    }

    /// Marks this as objects staged whole under a `--cache-limit` that leaves `room` beside
    /// the copy and its index sidecars (`OpenOptions::staged_room`): all a two-pass read's
    /// piles may take. `None`: not staged under a limit, unchanged.
    pub fn staged_within(mut self, room: Option<u64>) -> Dataset {
        self.staged_room = room.or(self.staged_room);
        self
    }

    /// The local disk a staged copy's `--cache-limit` leaves for piles, if it has one.
    pub fn staged_room(&self) -> Option<u64> {
        self.staged_room
    }

    /// The store its files' bytes are streamed from, when they are (see [`RemoteBytes`]).
    pub fn remote(&self) -> Option<&Arc<dyn RemoteBytes>> {
        self.remote.as_ref()
    }

    /// Refuses a read of a streamed dataset by anything but its sequential reader.
    pub fn refuse_if_streamed(&self, mode: &str) -> Result<()> {
        match &self.remote {
            None => Ok(()),
            Some(r) => Err(crate::Error::Invalid(format!(
                "{}: the dataset does not fit --cache-limit {} and is streamed from object \
                 storage, which only two-pass reads (--mode two-pass or auto); {mode} would \
                 read it at random",
                self.files
                    .first()
                    .map_or(String::new(), |f| f.path.display().to_string()),
                crate::size::human_bytes(r.cache_limit() as f64),
            ))),
        }
    }
}
