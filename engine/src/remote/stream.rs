//! The *streamed* read of an `s3://` dataset that does not fit `--cache-limit`: no local
//! copy is kept. Opening it needs each object's layout (its offset index, or a fixed record
//! size), found once per object identity (ETag and size) and cached locally: an object is
//! fetched into the cache alone, indexed, and removed (so the largest object must fit the
//! limit); an MDS dataset's shards need only their headers, written into sparse files of
//! their sizes. Reading it is the two-pass scatter's sequential pass, through
//! [`Objects::read_in_order`]: ranged GETs, several in flight, in object order, each
//! conditional on the listed ETag; every byte the read writes locally is charged against
//! the limit ([`Objects::charge`]).

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::stream::{self, StreamExt};
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore};

use super::fetch;
use super::{runtime, S3Config, S3Url};
use crate::dataset::{
    Dataset, DatasetFile, ObjectCount, OffsetIndex, OpenCount, OpenOptions, RemoteBytes,
    RemoteLayout,
};
use crate::format::Format;
use crate::{Error, Result};

/// The objects of a streamed dataset, in file order, and the local disk its read may use.
pub struct Objects {
    store: Arc<dyn ObjectStore>,
    bucket: String,
    metas: Vec<ObjectMeta>,
    /// GETs and bytes by (epoch, file).
    counts: Mutex<BTreeMap<(u64, usize), (u64, u64)>>,
    /// What the open asked for.
    opened: Mutex<OpenCount>,
    limit: u64,
    used: AtomicU64,
    peak: AtomicU64,
    /// Charged for the dataset's life: its layouts in the local cache.
    kept: AtomicU64,
    home: PathBuf,
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Objects")
            .field("bucket", &self.bucket)
            .field("objects", &self.metas.len())
            .field("limit", &self.limit)
            .finish()
    }
}

impl Objects {
    /// Counts what the open asked the store for.
    fn count_open(&self, f: impl FnOnce(&mut OpenCount)) {
        f(&mut self.opened.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Charges `bytes` of the local cache the dataset keeps while open (a layout).
    fn keep(&self, bytes: u64, what: &str) -> Result<()> {
        self.charge(bytes, what)?;
        self.kept.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    fn url(&self, file: usize) -> String {
        format!("s3://{}/{}", self.bucket, self.metas[file].location)
    }

    /// Bytes `a..a + len` of file `file`, conditional on its listed ETag.
    async fn get(&self, epoch: u64, file: usize, a: u64, len: usize) -> Result<bytes::Bytes> {
        let meta = self.metas.get(file).ok_or_else(|| {
            Error::Internal(format!(
                "a streamed read of file {file} of {}",
                self.metas.len()
            ))
        })?;
        let url = self.url(file);
        let b = a + len as u64;
        let want = meta.e_tag.clone();
        let opts = GetOptions {
            range: Some(GetRange::Bounded(a..b)),
            if_match: want.clone(),
            ..Default::default()
        };
        let err = |e| fetch::store_error(&url, "ranged GET", Some((a, b)), e);
        let got = self
            .store
            .get_opts(&meta.location, opts)
            .await
            .map_err(err)?;
        if want.is_some() && got.meta.e_tag != want {
            return Err(err(object_store::Error::Precondition {
                path: url.clone(),
                source: "ETag differs".into(),
            }));
        }
        let bytes = got.bytes().await.map_err(err)?;
        if bytes.len() != len {
            return Err(Error::BadInput {
                path: PathBuf::from(&url),
                offset: Some(a),
                what: format!(
                    "a ranged GET of bytes {a}..{b} returned {} bytes",
                    bytes.len()
                ),
            });
        }
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = c.entry((epoch, file)).or_default();
        n.0 += 1;
        n.1 += len as u64;
        Ok(bytes)
    }
}

impl RemoteBytes for Objects {
    fn read_in_order(
        &self,
        epoch: u64,
        ranges: &mut dyn Iterator<Item = (usize, u64, usize)>,
        done: &mut dyn FnMut(usize, &[u8]),
        stop: &dyn Fn() -> bool,
    ) -> Result<()> {
        runtime()?.block_on(async {
            let asked = std::iter::from_fn(|| if stop() { None } else { ranges.next() });
            let mut gets = stream::iter(asked)
                .map(|(f, a, len)| self.get(epoch, f, a, len))
                .buffered(crate::dataset::GETS_IN_FLIGHT);
            let mut i = 0;
            loop {
                // A stop does not wait for the GETs in flight (a slow link, a store
                // throttling us with retries): they are dropped, and the read ends.
                let got = {
                    let next = std::pin::pin!(gets.next());
                    let stopped = std::pin::pin!(stopped(stop));
                    match futures::future::select(next, stopped).await {
                        futures::future::Either::Left((got, _)) => got,
                        futures::future::Either::Right(_) => return Ok(()),
                    }
                };
                let Some(got) = got else {
                    return Ok(());
                };
                done(i, &got?);
                i += 1;
            }
        })
    }

    fn counts(&self) -> Vec<ObjectCount> {
        let c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.iter()
            .map(|(&(epoch, file), &(gets, bytes))| ObjectCount {
                object: self.url(file),
                epoch,
                gets,
                bytes,
            })
            .collect()
    }

    fn opened(&self) -> OpenCount {
        *self.opened.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn cache_limit(&self) -> u64 {
        self.limit
    }

    fn charge(&self, bytes: u64, what: &str) -> Result<()> {
        let mut now = self.used.load(Ordering::Relaxed);
        loop {
            let next = now.saturating_add(bytes);
            if next > self.limit {
                return Err(over_limit(self.limit, now, bytes, what));
            }
            match self
                .used
                .compare_exchange(now, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    return Ok(());
                }
                Err(seen) => now = seen,
            }
        }
    }

    fn release(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(bytes))
            });
    }

    fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    fn kept(&self) -> u64 {
        self.kept.load(Ordering::Relaxed)
    }

    fn scratch_home(&self) -> PathBuf {
        self.home.clone()
    }
}

/// How often a read waiting on GETs looks whether it was stopped.
const STOP_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Returns once `stop()` holds, looking every [`STOP_POLL`].
async fn stopped(stop: &dyn Fn() -> bool) {
    while !stop() {
        tokio::time::sleep(STOP_POLL).await;
    }
}

fn over_limit(limit: u64, used: u64, more: u64, what: &str) -> Error {
    let h = |b: u64| crate::size::human_bytes(b as f64);
    Error::OverBudget(format!(
        "--cache-limit {}: {what}: {} more of local disk is needed and {} of it is in use; \
         give a larger --cache-limit, or read on more nodes (each keeps only its ranks' records)",
        h(limit),
        h(more),
        h(used)
    ))
}

/// Opens the dataset `url` names, streamed: each object's layout from the local cache
/// under `dir` (fetched and indexed once per identity), the local disk capped at `limit`.
pub(super) fn open(
    url: &S3Url,
    cfg: &S3Config,
    dir: &Path,
    objects: Vec<ObjectMeta>,
    limit: u64,
    opts: &OpenOptions,
) -> Result<Dataset> {
    let store = cfg.store(&url.bucket)?;
    let handle = Objects {
        store: store.clone(),
        bucket: url.bucket.clone(),
        metas: Vec::new(),
        counts: Mutex::default(),
        // The listing [`super::open_with`] made.
        opened: Mutex::new(OpenCount {
            lists: 1,
            ..OpenCount::default()
        }),
        limit,
        used: AtomicU64::new(0),
        peak: AtomicU64::new(0),
        kept: AtomicU64::new(0),
        home: dir.to_path_buf(),
    };
    let rt = runtime()?;
    let mds_root = objects
        .iter()
        .map(|m| m.location.as_ref())
        .filter(|k| *k == "index.json" || k.ends_with("/index.json"))
        .min_by_key(|k| k.len())
        .map(|k| k.trim_end_matches("index.json").to_string());
    let (format, files, columns, metas) = match mds_root {
        Some(root) => rt.block_on(mds(&handle, url, dir, &objects, &root, opts))?,
        None => {
            let mut files = Vec::with_capacity(objects.len());
            let mut format: Option<Format> = None;
            // Layouts found by fetching an object are written once every object is
            // indexed: each fetched copy then has the limit to itself.
            let mut found = Vec::new();
            for m in &objects {
                let (f, layout, fetched) = rt.block_on(layout_of(&handle, url, dir, m, opts))?;
                if let Some(path) = fetched {
                    found.push((path, m, f.clone(), layout.clone()));
                }
                match &format {
                    Some(had) if !had.same_kind(&f) => {
                        return Err(Error::Invalid(format!(
                            "{}: objects of one format only ({} and {} under it)",
                            url.text,
                            had.name(),
                            f.name()
                        )))
                    }
                    _ => format = Some(f),
                }
                let u = PathBuf::from(fetch::url_of(&url.bucket, m.location.as_ref()));
                files.push(DatasetFile::remote(u, m.size, layout));
            }
            for (path, m, f, layout) in found {
                let object = fetch::url_of(&url.bucket, m.location.as_ref());
                store_layout(&path, m, &f, &layout, |disk| {
                    handle.keep(disk, &format!("the layout of {object}"))
                })?;
            }
            let format = format.expect("at least one object is listed");
            (format, files, Vec::new(), objects)
        }
    };
    let handle = Objects { metas, ..handle };
    let bytes: Arc<dyn RemoteBytes> = Arc::new(handle);
    Dataset::streamed(format, files, columns, bytes, opts.max_record)
}

/// The layout cache's file for `key`: `KEY.riffle-layout` under `dir`.
fn layout_path(dir: &Path, url: &str, key: &str) -> Result<PathBuf> {
    let rel = fetch::local_rel(url, key)?;
    let mut p = dir.join(rel).into_os_string();
    p.push(".riffle-layout");
    Ok(PathBuf::from(p))
}

/// The head of a cached layout (a JSON line, then `offsets` u64s, little-endian).
#[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
struct LayoutHead {
    etag: Option<String>,
    size: u64,
    /// The format's `Debug` form, which the layout was built for.
    format: String,
    fixed: Option<(u64, u64)>,
    last_unterminated: bool,
    offsets: u64,
}

/// The local disk a file of `len` bytes takes: whole 4 KiB blocks, as filesystems
/// allocate them.
fn on_disk(len: u64) -> u64 {
    len.div_ceil(4096) * 4096
}

/// The cached layout of `meta` in `format`, if the cache holds one for its identity, and
/// the local disk its file takes.
fn cached_layout(path: &Path, meta: &ObjectMeta, format: &Format) -> Option<(RemoteLayout, u64)> {
    let bytes = std::fs::read(path).ok()?;
    let disk = on_disk(bytes.len() as u64);
    let nl = bytes.iter().position(|&b| b == b'\n')?;
    let head: LayoutHead = serde_json::from_slice(&bytes[..nl]).ok()?;
    let body = &bytes[nl + 1..];
    let fresh = meta.e_tag.is_some()
        && head.etag == meta.e_tag
        && head.size == meta.size
        && head.format == format!("{format:?}")
        && body.len() as u64 == head.offsets * 8;
    if !fresh {
        return None;
    }
    if let Some((header, size)) = head.fixed {
        return Some((RemoteLayout::Fixed { header, size }, disk));
    }
    let offsets: Vec<u64> = body
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    // A damaged cache is fetched again rather than trusted.
    let sane =
        offsets.windows(2).all(|w| w[0] <= w[1]) && offsets.last().is_some_and(|&l| l <= meta.size);
    sane.then_some((
        RemoteLayout::Indexed(OffsetIndex {
            offsets,
            last_unterminated: head.last_unterminated,
        }),
        disk,
    ))
}

/// Writes `l` to the layout cache's `path`, its local disk charged first by `charge`.
fn store_layout(
    path: &Path,
    meta: &ObjectMeta,
    format: &Format,
    l: &RemoteLayout,
    charge: impl FnOnce(u64) -> Result<()>,
) -> Result<()> {
    let (fixed, last, offsets): (_, _, &[u64]) = match l {
        RemoteLayout::Fixed { header, size } => (Some((*header, *size)), false, &[]),
        RemoteLayout::Indexed(ix) => (None, ix.last_unterminated, &ix.offsets),
    };
    let head = LayoutHead {
        etag: meta.e_tag.clone(),
        size: meta.size,
        format: format!("{format:?}"),
        fixed,
        last_unterminated: last,
        offsets: offsets.len() as u64,
    };
    let mut out = serde_json::to_vec(&head)
        .map_err(|e| Error::Internal(format!("cannot encode a layout: {e}")))?;
    out.push(b'\n');
    for o in offsets {
        out.write_all(&o.to_le_bytes())
            .expect("a Vec takes every write");
    }
    charge(on_disk(out.len() as u64))?;
    let parent = crate::scratch::parent_dir(path);
    std::fs::create_dir_all(parent)
        .map_err(|e| Error::io(parent, "create the cache directory", None, e))?;
    crate::scratch::write_atomic(path, &out)
}

/// The format and layout of object `meta`: cached, or found by fetching it alone into
/// the cache (charged against the limit), opening it, and removing it; then also where the
/// layout cache keeps it (for the caller to store).
async fn layout_of(
    h: &Objects,
    url: &S3Url,
    dir: &Path,
    meta: &ObjectMeta,
    opts: &OpenOptions,
) -> Result<(Format, RemoteLayout, Option<PathBuf>)> {
    let key = meta.location.as_ref();
    let object = fetch::url_of(&url.bucket, key);
    let told = opts
        .format
        .clone()
        .or_else(|| Format::from_extension(Path::new(key)));
    let cache = layout_path(dir, &object, key)?;
    if let Some(f) = &told {
        if let Some((l, disk)) = cached_layout(&cache, meta, f) {
            // On local disk while the dataset is open, as the piles are.
            h.keep(disk, &format!("the cached layout of {object}"))?;
            h.count_open(|c| c.layouts_cached += 1);
            return Ok((f.clone(), l, None));
        }
    }
    // Per process: two indexing the same object at once do not remove each other's copy.
    let scratch = dir.join(format!(".indexing-{}", std::process::id()));
    let dest = scratch.join(fetch::local_rel(&object, key)?);
    h.charge(
        meta.size,
        &format!("indexing {object} (fetched alone, then removed)"),
    )?;
    let fetched = fetch::fetch(&h.store, &object, meta, &dest).await;
    if fetched.is_ok() {
        h.count_open(|c| {
            c.gets += meta.size.div_ceil(fetch::CHUNK);
            c.bytes += meta.size;
            c.layouts_fetched += 1;
        });
    }
    let opened = fetched.and_then(|()| {
        // Its index only in memory: a sidecar would take local disk not charged.
        let o = OpenOptions {
            format: told,
            cache_limit: None,
            save_index: false,
            ..opts.clone()
        };
        Dataset::open(&[&dest], &o, &mut |_, _, _| {})
    });
    // The copy goes whatever happened: only its layout is kept.
    let (beside, elsewhere) = crate::dataset::index::sidecar_paths(&dest);
    for p in [dest.clone(), fetch::sidecar(&dest), beside, elsewhere] {
        let _ = std::fs::remove_file(p);
    }
    let _ = std::fs::remove_dir_all(&scratch);
    h.release(meta.size);
    let ds = opened.map_err(|e| match e {
        Error::BadInput { offset, what, .. } => Error::BadInput {
            path: PathBuf::from(&object),
            offset,
            what,
        },
        e => e,
    })?;
    let layout = ds.files()[0].remote_layout();
    Ok((ds.format().clone(), layout, Some(cache)))
}

/// An MDS dataset whose `index.json` is `ROOT/index.json`: the index fetched whole, each
/// shard's header into a sparse file of its size (a skeleton the MDS reader opens), then
/// the shards as `s3://` files in the index's order.
async fn mds(
    h: &Objects,
    url: &S3Url,
    dir: &Path,
    objects: &[ObjectMeta],
    root: &str,
    opts: &OpenOptions,
) -> Result<(
    Format,
    Vec<DatasetFile>,
    Vec<crate::dataset::MdsColumn>,
    Vec<ObjectMeta>,
)> {
    // Per process: two opening the same dataset at once do not share it.
    let skeleton = dir.join(format!(".mds-skeleton-{}", std::process::id()));
    let mut by_path = BTreeMap::new();
    let mut charged = 0;
    for m in objects
        .iter()
        .filter(|m| m.location.as_ref().starts_with(root))
    {
        let key = m.location.as_ref();
        let object = fetch::url_of(&url.bucket, key);
        let dest = skeleton.join(fetch::local_rel(&object, key)?);
        if key.ends_with("index.json") {
            h.charge(m.size, &object)?;
            charged += m.size;
            fetch::fetch(&h.store, &object, m, &dest).await?;
            h.count_open(|c| {
                c.gets += m.size.div_ceil(fetch::CHUNK);
                c.bytes += m.size;
            });
        } else {
            charged += shard_head(h, &object, m, &dest).await?;
        }
        by_path.insert(dest, m.clone());
    }
    let o = OpenOptions {
        format: Some(Format::Mds),
        cache_limit: None,
        ..opts.clone()
    };
    let index_dir =
        skeleton.join(fetch::local_rel(&url.text, root.trim_end_matches('/')).unwrap_or_default());
    let ds = Dataset::open(&[&index_dir], &o, &mut |_, _, _| {});
    let _ = std::fs::remove_dir_all(&skeleton);
    h.release(charged);
    let ds = ds?;
    let mut files = Vec::new();
    let mut metas = Vec::new();
    for f in ds.files() {
        let m = by_path.get(&f.path).ok_or_else(|| {
            Error::Internal(format!("{}: an MDS shard not listed", f.path.display()))
        })?;
        let u = PathBuf::from(fetch::url_of(&url.bucket, m.location.as_ref()));
        files.push(DatasetFile::remote(u, m.size, f.remote_layout()));
        metas.push(m.clone());
    }
    Ok((Format::Mds, files, ds.columns().to_vec(), metas))
}

/// Writes the header of MDS shard `m` (its sample count and offset table) into a sparse
/// file `dest` of the shard's size; returns the bytes charged for it.
async fn shard_head(h: &Objects, object: &str, m: &ObjectMeta, dest: &Path) -> Result<u64> {
    let get = |a: u64, b: u64| {
        let opts = GetOptions {
            range: Some(GetRange::Bounded(a..b)),
            if_match: m.e_tag.clone(),
            ..Default::default()
        };
        let err = move |e| fetch::store_error(object, "ranged GET", Some((a, b)), e);
        async move {
            let got = h.store.get_opts(&m.location, opts).await.map_err(err)?;
            got.bytes().await.map_err(err)
        }
    };
    let first = get(0, m.size.min(4)).await?;
    let n = first.get(..4).map_or(0, |b| {
        u32::from_le_bytes(b.try_into().expect("4 bytes")) as u64
    });
    let end = m.size.min(4 + 4 * (n + 1));
    let head = get(0, end).await?;
    h.count_open(|c| {
        c.gets += 2;
        c.bytes += (first.len() + head.len()) as u64;
        c.layouts_fetched += 1;
    });
    h.charge(end, &format!("the header of {object}"))?;
    let parent = crate::scratch::parent_dir(dest);
    std::fs::create_dir_all(parent)
        .map_err(|e| Error::io(parent, "create the cache directory", None, e))?;
    // Made afresh through the door: whatever was at the name (a stale header, a link
    // planted there) goes, and a new file is made without following a link.
    match std::fs::remove_file(dest) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(Error::io(dest, "remove the stale header", None, e))
        }
        _ => {}
    }
    let f = crate::door::create_new(dest).map_err(|e| Error::io(dest, "create", None, e))?;
    f.set_len(m.size)
        .and_then(|()| f.write_all_at(&head, 0))
        .map_err(|e| Error::io(dest, "write", Some(0), e))?;
    Ok(end)
}
