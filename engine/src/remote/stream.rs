//! The *streamed* read of an `s3://` dataset that does not fit `--cache-limit`: no local
//! copy is kept. Opening it needs each object's layout (its offset index, or a fixed record
//! size), found once per object identity (ETag and size) and cached locally: an object is
//! fetched into the cache, indexed, and removed (so the largest object must fit the limit;
//! several objects at once as the limit allows); an MDS dataset's shards need only their
//! headers (one ranged GET each, many in flight, sized from `index.json`), cached by ETag
//! and size too and written into sparse files of their sizes. Reading it is the two-pass
//! scatter's sequential pass, through [`Objects::read_in_order`]: ranged GETs, several in
//! flight, in object order, each conditional on the listed ETag; every byte the read
//! writes locally is charged against the limit ([`Objects::charge`]).

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::stream::{self, StreamExt, TryStreamExt};
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore};

use super::fetch;
use super::{runtime, S3Url};
use crate::dataset::{
    Dataset, DatasetFile, ObjectCount, OffsetIndex, OpenCount, OpenOptions, RemoteBytes,
    RemoteLayout,
};
use crate::format::Format;
use crate::io::LargeBuf;
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
    /// Requests the open may have in flight: what `ulimit -n` left before its listing
    /// connected, a connection each and, while it indexes an object, its copy's file,
    /// duplicate and ring ([`super::open_with`]).
    open_in_flight: usize,
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

    /// Bytes `a..a + len` of file `file`, conditional on its listed ETag, into `into`
    /// (cleared first: a spent body's buffer, so its pages are not faulted in again).
    async fn get(
        &self,
        epoch: u64,
        file: usize,
        (a, len): (u64, usize),
        mut into: LargeBuf,
    ) -> Result<LargeBuf> {
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
        // The body's chunks copied into `into` as they come: `GetResult::bytes` would
        // gather them into fresh memory, every 4 KiB page of it faulted in and zeroed (a
        // quarter of the scatter thread's CPU on loopback); `into` is on huge pages and
        // reused for the epoch's later GETs.
        into.clear();
        into.reserve_total(len);
        let mut body = got.into_stream();
        let mut more = false;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(err)?;
            if into.len() + chunk.len() > len {
                more = true;
                break;
            }
            into.extend_from_slice(&chunk);
        }
        if more || into.len() != len {
            let got = if more {
                format!("more than {len}")
            } else {
                into.len().to_string()
            };
            return Err(Error::BadInput {
                path: PathBuf::from(&url),
                offset: Some(a),
                what: format!("a ranged GET of bytes {a}..{b} returned {got} bytes"),
            });
        }
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = c.entry((epoch, file)).or_default();
        n.0 += 1;
        n.1 += len as u64;
        Ok(into)
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
            let in_flight =
                fetch::within_descriptors(crate::dataset::GETS_IN_FLIGHT, 1, &self.url(0))?;
            // Bodies' buffers, handed back once their range is done: at most the GETs in
            // flight and the one being handed over exist at once.
            let spare: std::cell::RefCell<Vec<LargeBuf>> = Default::default();
            let mut gets = stream::iter(asked)
                .map(|(f, a, len)| {
                    let into = spare.borrow_mut().pop().unwrap_or_default();
                    self.get(epoch, f, (a, len), into)
                })
                .buffered(in_flight);
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
                let got = got?;
                done(i, got.as_slice());
                spare.borrow_mut().push(got);
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
/// under `dir` (fetched and indexed once per identity), the local disk capped at `limit`;
/// `store` and the runtime `rt` that listed the objects ask for them.
pub(super) fn open(
    url: &S3Url,
    (store, rt, open_in_flight): (Arc<dyn ObjectStore>, &tokio::runtime::Runtime, usize),
    dir: &Path,
    objects: Vec<ObjectMeta>,
    limit: u64,
    opts: &OpenOptions,
) -> Result<Dataset> {
    let handle = Objects {
        store,
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
        open_in_flight,
    };
    let mds_root = objects
        .iter()
        .map(|m| m.location.as_ref())
        .filter(|k| *k == "index.json" || k.ends_with("/index.json"))
        .min_by_key(|k| k.len())
        .map(|k| k.trim_end_matches("index.json").to_string());
    let (format, files, columns, metas) = match mds_root {
        Some(root) => rt.block_on(mds(&handle, url, dir, &objects, &root, opts))?,
        None => {
            // Several objects indexed at once (a GET each would otherwise wait on the one
            // before it), as many as their copies fit the limit together and keep about
            // IN_FLIGHT ranged GETs in flight in all, or the open's budget of descriptors.
            let gets = handle.open_in_flight.clamp(1, fetch::IN_FLIGHT);
            let largest = objects.iter().map(|m| m.size).max().unwrap_or(0);
            let widest = largest.div_ceil(fetch::CHUNK).clamp(1, gets as u64);
            let at_once = (limit / largest.max(1)).min(gets as u64 / widest).max(1) as usize;
            let each = (gets / at_once).max(1);
            let found: Vec<(Format, RemoteLayout, Option<PathBuf>)> = rt.block_on(
                stream::iter(objects.iter().enumerate())
                    .map(|(i, m)| layout_of(&handle, url, dir, m, opts, (i, each)))
                    .buffered(at_once)
                    .try_collect(),
            )?;
            let mut files = Vec::with_capacity(objects.len());
            let mut format: Option<Format> = None;
            // Layouts found by fetching an object are written once every object is
            // indexed: the copies fetched then have the limit to themselves.
            let mut fetched = Vec::new();
            for (m, (f, layout, path)) in objects.iter().zip(found) {
                if let Some(path) = path {
                    fetched.push((path, m, f.clone(), layout.clone()));
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
            for (path, m, f, layout) in fetched {
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

/// A cache file at `path` (a layout or a header): its identity as a JSON line, its body,
/// and the local disk the file takes.
fn read_cached<H: serde::de::DeserializeOwned>(path: &Path) -> Option<(H, Vec<u8>, u64)> {
    let mut bytes = std::fs::read(path).ok()?;
    let disk = on_disk(bytes.len() as u64);
    let nl = bytes.iter().position(|&b| b == b'\n')?;
    let head = serde_json::from_slice(&bytes[..nl]).ok()?;
    Some((head, bytes.split_off(nl + 1), disk))
}

/// Writes a cache file at `path`: `head` as a JSON line, then `body`, its local disk
/// charged first by `charge`.
fn write_cached(
    path: &Path,
    head: &impl serde::Serialize,
    body: &[u8],
    charge: impl FnOnce(u64) -> Result<()>,
) -> Result<()> {
    let mut out = serde_json::to_vec(head)
        .map_err(|e| Error::Internal(format!("cannot encode a cache file's identity: {e}")))?;
    out.push(b'\n');
    out.extend_from_slice(body);
    charge(on_disk(out.len() as u64))?;
    let parent = crate::scratch::parent_dir(path);
    std::fs::create_dir_all(parent)
        .map_err(|e| Error::io(parent, "create the cache directory", None, e))?;
    crate::scratch::write_atomic(path, &out)
}

/// The cached layout of `meta` in `format`, if the cache holds one for its identity, and
/// the local disk its file takes.
fn cached_layout(path: &Path, meta: &ObjectMeta, format: &Format) -> Option<(RemoteLayout, u64)> {
    let (head, body, disk) = read_cached::<LayoutHead>(path)?;
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
    let body: Vec<u8> = offsets.iter().flat_map(|o| o.to_le_bytes()).collect();
    write_cached(path, &head, &body, charge)
}

/// The format and layout of object `meta` (the `nth` listed): cached, or found by
/// fetching it into a scratch directory of its own in the cache (charged against the
/// limit), opening it, and removing it; then also where the layout cache keeps it (for
/// the caller to store).
async fn layout_of(
    h: &Objects,
    url: &S3Url,
    dir: &Path,
    meta: &ObjectMeta,
    opts: &OpenOptions,
    (nth, gets): (usize, usize),
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
    // Per process and object: two indexing the same object at once, or this process
    // indexing several, do not remove each other's copy.
    let scratch = dir.join(format!(".indexing-{}-{nth}", std::process::id()));
    let dest = scratch.join(fetch::local_rel(&object, key)?);
    h.charge(
        meta.size,
        &format!("indexing {object} (fetched alone, then removed)"),
    )?;
    let fetched = fetch::fetch(&h.store, &object, meta, &dest, gets).await;
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

/// Shard headers of an MDS dataset fetched at once while it opens.
pub(super) const HEADS_IN_FLIGHT: usize = 32;

/// An MDS dataset whose `index.json` is `ROOT/index.json`: the index (from the local cache
/// while its ETag and size hold, else one GET), each listed shard's header (its sample
/// count and offset table, sized from the index: from the cache, else one ranged GET,
/// [`HEADS_IN_FLIGHT`] at once) into a sparse file of the shard's size (a skeleton the MDS
/// reader opens and checks as a local directory), then the shards as `s3://` files in the
/// index's order.
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
    let built = skeleton_of(h, url, dir, &skeleton, objects, root).await;
    let ds = built.and_then(|(by_path, charged)| {
        let o = OpenOptions {
            format: Some(Format::Mds),
            cache_limit: None,
            ..opts.clone()
        };
        let index_dir = skeleton
            .join(fetch::local_rel(&url.text, root.trim_end_matches('/')).unwrap_or_default());
        let ds = Dataset::open(&[&index_dir], &o, &mut |_, _, _| {});
        h.release(charged);
        Ok((ds?, by_path))
    });
    // The skeleton goes whatever happened.
    let _ = std::fs::remove_dir_all(&skeleton);
    let (ds, by_path) = ds?;
    let mut files = Vec::new();
    let mut metas = Vec::new();
    for f in ds.files() {
        let m: &ObjectMeta = by_path.get(&f.path).ok_or_else(|| {
            Error::Internal(format!("{}: an MDS shard not listed", f.path.display()))
        })?;
        let u = PathBuf::from(fetch::url_of(&url.bucket, m.location.as_ref()));
        files.push(DatasetFile::remote(u, m.size, f.remote_layout()));
        metas.push(m.clone());
    }
    Ok((Format::Mds, files, ds.columns().to_vec(), metas))
}

/// Writes the skeleton of the MDS dataset at `root` under `skeleton`: its `index.json`
/// and a sparse file holding the header of each shard it lists that the listing has.
/// Returns the shards' metadata by skeleton path, and the bytes charged for it.
async fn skeleton_of(
    h: &Objects,
    url: &S3Url,
    dir: &Path,
    skeleton: &Path,
    objects: &[ObjectMeta],
    root: &str,
) -> Result<(BTreeMap<PathBuf, ObjectMeta>, u64)> {
    let index_key = format!("{root}index.json");
    let index = objects
        .iter()
        .find(|m| m.location.as_ref() == index_key)
        .ok_or_else(|| Error::Internal(format!("{index_key}: an MDS index not listed")))?;
    let object = fetch::url_of(&url.bucket, &index_key);
    let dest = skeleton.join(fetch::local_rel(&object, &index_key)?);
    h.charge(index.size, &object)?;
    let mut charged = index.size;
    let text = if index.size > crate::dataset::mds::INDEX_MAX {
        // Refused by the MDS reader, which names the size: nothing fetched.
        Vec::new()
    } else {
        let cache = head_path(dir, &object, &index_key)?;
        // The cached copy is local disk while the dataset is open, as layouts are.
        match cached_head(&cache, index, index.size) {
            Some((t, disk)) => {
                h.keep(disk, &format!("the cached {object}"))?;
                t
            }
            None => {
                let t = get_range(h, &object, index, 0, index.size).await?;
                h.count_open(|c| {
                    c.gets += 1;
                    c.bytes += index.size;
                });
                store_head(&cache, index, &t, |disk| {
                    h.keep(disk, &format!("the cached {object}"))
                })?;
                t
            }
        }
    };
    write_sparse(&dest, index.size, &text)?;
    let samples = shard_samples(&text);
    let listed: Vec<(&ObjectMeta, u64)> = objects
        .iter()
        .filter_map(|m| {
            let name = m.location.as_ref().strip_prefix(root)?;
            samples.get(name).map(|&n| (m, n))
        })
        .collect();
    let in_flight = h.open_in_flight.clamp(1, HEADS_IN_FLIGHT);
    let mut heads = stream::iter(listed)
        .map(|(m, n)| async move {
            let key = m.location.as_ref();
            let object = fetch::url_of(&url.bucket, key);
            let dest = skeleton.join(fetch::local_rel(&object, key)?);
            let charged = shard_head(h, dir, &object, m, n, &dest).await?;
            Ok::<_, Error>((dest, m.clone(), charged))
        })
        .buffer_unordered(in_flight);
    let mut by_path = BTreeMap::new();
    while let Some(got) = heads.next().await {
        let (dest, m, c) = got?;
        charged += c;
        by_path.insert(dest, m);
    }
    Ok((by_path, charged))
}

/// The sample count `index.json` gives each shard, by file name; what it does not give
/// well is left for the MDS reader to refuse, naming it.
fn shard_samples(index: &[u8]) -> BTreeMap<String, u64> {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(index) else {
        return BTreeMap::new();
    };
    let shards = v.get("shards").and_then(|s| s.as_array());
    shards
        .into_iter()
        .flatten()
        .filter_map(|s| {
            let name = s.get("raw_data")?.get("basename")?.as_str()?;
            let n = s.get("samples")?.as_u64()?;
            Some((name.to_string(), n))
        })
        .collect()
}

/// Bytes `a..b` of object `m`, one GET conditional on its listed ETag.
async fn get_range(h: &Objects, object: &str, m: &ObjectMeta, a: u64, b: u64) -> Result<Vec<u8>> {
    if a == b {
        return Ok(Vec::new());
    }
    let opts = GetOptions {
        range: Some(GetRange::Bounded(a..b)),
        if_match: m.e_tag.clone(),
        ..Default::default()
    };
    let err = |e| fetch::store_error(object, "ranged GET", Some((a, b)), e);
    let got = h.store.get_opts(&m.location, opts).await.map_err(err)?;
    if m.e_tag.is_some() && got.meta.e_tag != m.e_tag {
        return Err(err(object_store::Error::Precondition {
            path: object.to_string(),
            source: "ETag differs".into(),
        }));
    }
    let bytes = got.bytes().await.map_err(err)?;
    if bytes.len() as u64 != b - a {
        return Err(Error::BadInput {
            path: PathBuf::from(object),
            offset: Some(a),
            what: format!(
                "a ranged GET of bytes {a}..{b} returned {} bytes",
                bytes.len()
            ),
        });
    }
    Ok(bytes.to_vec())
}

/// Writes the header of MDS shard `m`, which `index.json` says holds `samples` samples
/// (its count and `samples + 1` offsets), into a sparse file `dest` of the shard's size:
/// from the header cache while the shard's ETag and size hold, else one ranged GET
/// (nothing when the shard is too small for it: the MDS reader refuses it). Returns the
/// bytes charged for it.
async fn shard_head(
    h: &Objects,
    dir: &Path,
    object: &str,
    m: &ObjectMeta,
    samples: u64,
    dest: &Path,
) -> Result<u64> {
    let want = samples
        .checked_add(1)
        .and_then(|n| n.checked_mul(4))
        .and_then(|n| n.checked_add(4))
        .filter(|&n| n <= m.size)
        .unwrap_or(0);
    let cache = head_path(dir, object, m.location.as_ref())?;
    // The cached header is local disk while the dataset is open, as layouts are.
    let head = match cached_head(&cache, m, want) {
        Some((head, disk)) => {
            h.count_open(|c| c.layouts_cached += 1);
            h.keep(disk, &format!("the cached header of {object}"))?;
            head
        }
        None => {
            let head = get_range(h, object, m, 0, want).await?;
            h.count_open(|c| {
                c.gets += u64::from(want > 0);
                c.bytes += want;
                c.layouts_fetched += 1;
            });
            if want > 0 {
                store_head(&cache, m, &head, |disk| {
                    h.keep(disk, &format!("the cached header of {object}"))
                })?;
            }
            head
        }
    };
    h.charge(want, &format!("the header of {object}"))?;
    write_sparse(dest, m.size, &head)?;
    Ok(want)
}

/// Makes `dest` afresh through the door, a sparse file of `size` bytes beginning with
/// `head`: whatever was at the name (a stale header, a link planted there) goes, and a new
/// file is made without following a link.
fn write_sparse(dest: &Path, size: u64, head: &[u8]) -> Result<()> {
    let parent = crate::scratch::parent_dir(dest);
    std::fs::create_dir_all(parent)
        .map_err(|e| Error::io(parent, "create the cache directory", None, e))?;
    match std::fs::remove_file(dest) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(Error::io(dest, "remove the stale header", None, e))
        }
        _ => {}
    }
    let f = crate::door::create_new(dest).map_err(|e| Error::io(dest, "create", None, e))?;
    f.set_len(size)
        .and_then(|()| f.write_all_at(head, 0))
        .map_err(|e| Error::io(dest, "write", Some(0), e))
}

/// The header cache's file for `key` (an MDS shard's header, or its `index.json` whole):
/// `KEY.riffle-head` under `dir`.
fn head_path(dir: &Path, url: &str, key: &str) -> Result<PathBuf> {
    let rel = fetch::local_rel(url, key)?;
    let mut p = dir.join(rel).into_os_string();
    p.push(".riffle-head");
    Ok(PathBuf::from(p))
}

/// The head of a cached header (a JSON line, then the header's bytes).
#[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
struct HeadHead {
    etag: Option<String>,
    size: u64,
    len: u64,
}

/// The first `len` bytes of object `meta`, if the header cache holds them for its
/// identity (its ETag and size), and the local disk its file takes.
fn cached_head(path: &Path, meta: &ObjectMeta, len: u64) -> Option<(Vec<u8>, u64)> {
    let (head, body, disk) = read_cached::<HeadHead>(path)?;
    let fresh = meta.e_tag.is_some()
        && head.etag == meta.e_tag
        && head.size == meta.size
        && head.len == len
        && body.len() as u64 == len;
    fresh.then_some((body, disk))
}

/// Writes the first bytes of object `meta` to the header cache's `path`, its local disk
/// charged first by `charge`.
fn store_head(
    path: &Path,
    meta: &ObjectMeta,
    bytes: &[u8],
    charge: impl FnOnce(u64) -> Result<()>,
) -> Result<()> {
    let head = HeadHead {
        etag: meta.e_tag.clone(),
        size: meta.size,
        len: bytes.len() as u64,
    };
    write_cached(path, &head, bytes, charge)
}
