//! Datasets in object storage: `s3://bucket/key` (one object), `s3://bucket/prefix/` (every
//! object under it) and `s3://bucket/prefix/*.tar` (a glob of keys), read through the
//! `object_store` crate and staged into a local cache, where the local modes read them.
//!
//! This is the *staged* read of issue 32: each object is fetched once with ranged GETs,
//! many in flight, into `<cache>/<endpoint>/<bucket>/<key>`, beside a sidecar holding the
//! object's identity (ETag and size). A later open lists the objects again and reuses a
//! copy only when its identity still holds, so a replaced object is fetched again and the
//! dataset's index is rebuilt as for a changed local file; an object replaced or removed
//! while it is fetched is an error naming it and the byte range, never a mixed copy.
//!
//! The endpoint and credentials come the standard AWS way (`AWS_ENDPOINT_URL`,
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`,
//! `AWS_ALLOW_HTTP`, then the profile `AWS_PROFILE` names in `~/.aws/credentials` and
//! `~/.aws/config`, read by `profile.rs`); plain HTTP is allowed without asking for a
//! loopback endpoint. The cache is `RIFFLE_S3_CACHE`, else `$XDG_CACHE_HOME/riffle/s3`,
//! else `~/.cache/riffle/s3`.
//!
//! The crate is async: all of it stays in this module, on a current-thread tokio runtime
//! made per call and driven by the calling thread (`block_on`), so nothing else in the
//! engine sees a future.

mod fetch;
pub mod probe;
mod profile;
mod stream;

/// Staging: bytes per ranged GET, and GETs in flight per object.
pub use fetch::{CHUNK as STAGE_RANGE, IN_FLIGHT as STAGE_IN_FLIGHT};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::{BackoffConfig, ObjectStore, RetryConfig};

use crate::{Error, Result};

/// The scheme riffle reads from object storage.
pub const SCHEME: &str = "s3://";

/// Whether `path` names objects (`s3://...`) rather than local files.
pub fn is_remote(path: &Path) -> bool {
    path.to_str().is_some_and(|s| s.starts_with(SCHEME))
}

/// An `s3://` URL, split: the bucket, the literal key prefix, and the glob over whole keys
/// when the key has glob characters.
#[derive(Clone, Debug, PartialEq)]
pub struct S3Url {
    /// As the user wrote it.
    pub text: String,
    /// The bucket.
    pub bucket: String,
    /// The key, or the part of it before the first glob character.
    pub key: String,
    /// The glob every listed key must match, when the key has one.
    pub pattern: Option<glob::Pattern>,
}

impl S3Url {
    /// Parses `s3://bucket[/key]`; the key may hold glob characters (`*`, `?`, `[`).
    pub fn parse(text: &str) -> Result<S3Url> {
        let bad = |why: &str| Error::Invalid(format!("'{text}': {why}"));
        let rest = text
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("not an s3:// URL"))?;
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket (expected s3://bucket/key)"));
        }
        let pattern = match key.find(['*', '?', '[']) {
            None => None,
            Some(_) => Some(
                glob::Pattern::new(key).map_err(|e| bad(&format!("a bad glob in the key: {e}")))?,
            ),
        };
        let literal = match &pattern {
            None => key.to_string(),
            // The prefix to list: up to the last '/' before the first glob character.
            Some(_) => {
                let first = key.find(['*', '?', '[']).unwrap_or(key.len());
                key[..first]
                    .rfind('/')
                    .map_or(String::new(), |i| key[..=i].to_string())
            }
        };
        Ok(S3Url {
            text: text.to_string(),
            bucket: bucket.to_string(),
            key: literal,
            pattern,
        })
    }
}

/// Where staged objects go: `RIFFLE_S3_CACHE`, else `$XDG_CACHE_HOME/riffle/s3`, else
/// `$HOME/.cache/riffle/s3`.
pub fn cache_root() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("RIFFLE_S3_CACHE").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir).join("riffle/s3"));
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".cache/riffle/s3")),
        None => Err(Error::Invalid(
            "s3:// datasets are staged in a local cache: set RIFFLE_S3_CACHE (no HOME)".into(),
        )),
    }
}

/// The cache of `cfg`'s endpoint under `root`, made (mode 0700) if missing, and refused
/// unless it is the user's own: a staged copy found there is read as the object when its
/// recorded identity matches, so a directory others may write (a shared `RIFFLE_S3_CACHE`,
/// a neighbour who made the name first in /tmp) could hand the read planted records.
fn endpoint_cache(root: &Path, cfg: &S3Config) -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::create_dir_all(root)
        .map_err(|e| Error::io(root, "create the object cache (RIFFLE_S3_CACHE)", None, e))?;
    let dir = root.join(cfg.cache_dir());
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io(&dir, "create the object cache", None, e)),
    }
    match crate::door::not_owned_dir(&dir, 0o022)? {
        None => Ok(dir),
        Some(why) => Err(Error::Invalid(format!(
            "{}: {why}: staged copies are trusted as the objects they stand for, so their \
             cache must be yours alone; point RIFFLE_S3_CACHE at a directory of your own",
            dir.display()
        ))),
    }
}

/// Where the objects are and who asks: the endpoint and credentials. [`S3Config::from_env`]
/// reads them the standard AWS way; tests name them.
#[derive(Clone, Debug, Default)]
pub struct S3Config {
    /// The endpoint (`AWS_ENDPOINT_URL`, or `AWS_ENDPOINT`); AWS itself when `None`.
    pub endpoint: Option<String>,
    /// The access key and secret; when `None`, `object_store`'s own chain (the
    /// environment, then the instance's or container's credentials).
    pub credentials: Option<(String, String)>,
    /// The session token that goes with `credentials` (a profile's `aws_session_token`).
    pub session_token: Option<String>,
    /// The region (`AWS_REGION`, `AWS_DEFAULT_REGION`); `us-east-1` when unset.
    pub region: Option<String>,
    /// How long a request is retried before its error is returned (3 minutes when
    /// `None`; `RIFFLE_S3_RETRY_SECONDS` sets it from the environment).
    pub retry_timeout: Option<Duration>,
}

impl S3Config {
    /// From the environment and the AWS profile, as the AWS CLI reads them
    /// (`docs/object-storage.md`): `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT`),
    /// `AWS_REGION` (or `AWS_DEFAULT_REGION`) and `AWS_ACCESS_KEY_ID` beat the profile's
    /// `endpoint_url`, `region` and keys; keys in neither are left to `object_store`'s
    /// chain (instance and container credentials). An unreadable or malformed profile
    /// file, or `AWS_PROFILE` naming a profile neither file has, is an error.
    pub fn from_env() -> Result<S3Config> {
        profile::config(&|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// The directory of the cache this endpoint's objects go under: its host and port,
    /// made safe as one path component (`aws` for AWS itself).
    fn cache_dir(&self) -> String {
        match &self.endpoint {
            None => "aws".into(),
            Some(e) => {
                let host = e.split("://").nth(1).unwrap_or(e);
                let host = host.split('/').next().unwrap_or(host);
                host.chars()
                    .map(|c| match c {
                        'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '-' => c,
                        _ => '_',
                    })
                    .collect()
            }
        }
    }

    /// The store for `bucket`, with retries and exponential backoff on 5xx, throttling
    /// and dropped connections (`object_store`'s retry layer).
    fn store(&self, bucket: &str) -> Result<Arc<dyn ObjectStore>> {
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_region(self.region.as_deref().unwrap_or("us-east-1"));
        if let Some(e) = &self.endpoint {
            b = b.with_endpoint(e);
            if is_loopback_http(e) {
                b = b.with_allow_http(true);
            }
        }
        if let Some((key, secret)) = &self.credentials {
            b = b.with_access_key_id(key).with_secret_access_key(secret);
            if let Some(token) = &self.session_token {
                b = b.with_token(token);
            }
        }
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(15),
                base: 2.0,
            },
            max_retries: 10,
            retry_timeout: self.retry_timeout.unwrap_or(Duration::from_secs(180)),
        };
        let store = b.with_retry(retry).build().map_err(|e| {
            Error::Invalid(format!("s3://{bucket}: cannot configure the store: {e}"))
        })?;
        Ok(Arc::new(store))
    }
}

/// Whether `endpoint` is plain HTTP to this machine (allowed without `AWS_ALLOW_HTTP`).
fn is_loopback_http(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("http://") else {
        return false;
    };
    let host = rest.split(['/', '?']).next().unwrap_or("");
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A current-thread runtime for one call: the only place a future is driven.
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("tokio runtime", "start the object-store runtime", None, e))
}

/// Stages every object `url` names into the local cache and returns their local paths,
/// in key order (as a local directory's files are listed). `url` is one object, a prefix
/// (every object under `key/`) or a glob of keys; it must name at least one object.
pub fn stage(url: &str, cfg: &S3Config) -> Result<Vec<PathBuf>> {
    stage_in(url, cfg, &cache_root()?)
}

/// As [`stage`], into the cache `root`.
pub fn stage_in(url: &str, cfg: &S3Config, root: &Path) -> Result<Vec<PathBuf>> {
    let url = S3Url::parse(url)?;
    let store = cfg.store(&url.bucket)?;
    let dir = endpoint_cache(root, cfg)?.join(&url.bucket);
    runtime()?.block_on(fetch::stage(&store, &url, &dir))
}

/// The paths a spec's words name once `s3://` URLs are staged: local paths as they are,
/// each URL replaced by its objects' local copies, or by the copy of its MDS `index.json`
/// when it holds one (the staged directory is then read as a local MDS directory is).
pub fn resolve(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    resolve_counted(paths).map(|(out, _)| out)
}

/// As [`resolve`], with the bytes of the staged copies (every object staged, an MDS
/// dataset's shards and `index.json` alike).
pub fn resolve_counted(paths: &[PathBuf]) -> Result<(Vec<PathBuf>, u64)> {
    // Local paths alone never read the AWS environment or profile files.
    if !names_a_url(paths) {
        return Ok((paths.to_vec(), 0));
    }
    let (mut out, mut staged) = (Vec::with_capacity(paths.len()), 0);
    let cfg = S3Config::from_env()?;
    for p in paths {
        match p.to_str().filter(|s| s.starts_with(SCHEME)) {
            Some(url) => {
                let copies = stage(url, &cfg)?;
                for c in &copies {
                    staged += std::fs::metadata(c).map_or(0, |m| m.len());
                }
                out.extend(mds_index_or_all(copies));
            }
            None => out.push(p.clone()),
        }
    }
    Ok((out, staged))
}

/// Options to open the staged copies of `paths` (of `staged` bytes) with: their index
/// sidecars take the room `--cache-limit` leaves beside them. As given without a limit or a
/// URL.
pub fn staged_options(
    paths: &[PathBuf],
    staged: u64,
    opts: &crate::dataset::OpenOptions,
) -> crate::dataset::OpenOptions {
    let mut o = opts.clone();
    if let Some(limit) = opts.cache_limit.filter(|_| names_a_url(paths)) {
        o.index_room = Some(std::sync::Arc::new(std::sync::atomic::AtomicU64::new(
            limit.saturating_sub(staged),
        )));
    }
    o
}

/// Whether any of `paths` is an `s3://` URL.
pub fn names_a_url(paths: &[PathBuf]) -> bool {
    paths
        .iter()
        .any(|p| p.to_str().is_some_and(|s| s.starts_with(SCHEME)))
}

/// Staged copies as a dataset names them: an MDS dataset (the objects hold an
/// `index.json`) by its shallowest `index.json` alone, which lists its shards (as the
/// streamed read takes the shallowest one for the root); any other objects all.
fn mds_index_or_all(staged: Vec<PathBuf>) -> Vec<PathBuf> {
    let index = staged
        .iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "index.json"))
        .min_by_key(|p| p.components().count());
    match index {
        Some(i) => vec![i.clone()],
        None => staged,
    }
}

/// The identity of the objects `url` names now (one listing, with the endpoint and
/// credentials of the environment): a digest of their keys, sizes and ETags, which changes
/// when an object is added, removed or replaced.
pub fn identity(url: &str) -> Result<u64> {
    use std::hash::{Hash, Hasher};
    let cfg = S3Config::from_env()?;
    let url = S3Url::parse(url)?;
    let store = cfg.store(&url.bucket)?;
    let objects = runtime()?.block_on(fetch::list_alone(&store, &url))?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for m in &objects {
        (m.location.as_ref(), m.size, &m.e_tag).hash(&mut h);
    }
    Ok(h.finish())
}

/// [`resolve`] within `limit`: refused, naming the URLs and the limit, when their objects
/// take more together (nothing is fetched then). `reader` says who reads the staged copies
/// (and so why they must fit), for the error.
pub fn resolve_within(paths: &[PathBuf], limit: Option<u64>, reader: &str) -> Result<Vec<PathBuf>> {
    check_fits(paths, limit, reader)?;
    resolve(paths)
}

/// Refuses `paths` when their `s3://` URLs name more bytes together than `limit` (the local
/// disk their staged copies may take), naming them and both figures; nothing is fetched.
pub fn check_fits(paths: &[PathBuf], limit: Option<u64>, reader: &str) -> Result<()> {
    let Some(limit) = limit.filter(|_| names_a_url(paths)) else {
        return Ok(());
    };
    let cfg = S3Config::from_env()?;
    let rt = runtime()?;
    let (mut total, mut urls) = (0u64, Vec::new());
    for p in paths {
        let Some(u) = p.to_str().filter(|s| s.starts_with(SCHEME)) else {
            continue;
        };
        let url = S3Url::parse(u)?;
        let store = cfg.store(&url.bucket)?;
        let listed = rt.block_on(fetch::list_alone(&store, &url))?;
        total += listed.iter().map(|m| m.size).sum::<u64>();
        urls.push(u);
    }
    if total > limit {
        return Err(Error::OverBudget(format!(
            "{}: {} take {} and --cache-limit is {}: their staged copies do not fit \
             ({reader})",
            urls.join(", "),
            if urls.len() == 1 {
                "its objects"
            } else {
                "their objects"
            },
            crate::size::human_bytes(total as f64),
            crate::size::human_bytes(limit as f64)
        )));
    }
    Ok(())
}

/// Opens `paths` as a dataset streamed from object storage when they are one `s3://` URL
/// whose objects do not fit `opts.cache_limit` (see `stream`); `None` when there is no
/// limit, no URL, or the objects fit it (they are then staged, [`resolve`]). URLs beside
/// other paths are streamed only when they fit, else refused.
pub fn open_within(
    paths: &[PathBuf],
    opts: &crate::dataset::OpenOptions,
) -> Result<Option<crate::dataset::Dataset>> {
    if opts.cache_limit.is_none() || !names_a_url(paths) {
        return Ok(None);
    }
    open_with(paths, opts, &S3Config::from_env()?, None)
}

/// As [`open_within`], with the store `cfg` and the cache `root` ([`cache_root`] when
/// `None`).
pub fn open_with(
    paths: &[PathBuf],
    opts: &crate::dataset::OpenOptions,
    cfg: &S3Config,
    root: Option<&Path>,
) -> Result<Option<crate::dataset::Dataset>> {
    let Some(limit) = opts.cache_limit else {
        return Ok(None);
    };
    let urls: Vec<&str> = paths
        .iter()
        .filter_map(|p| p.to_str().filter(|s| s.starts_with(SCHEME)))
        .collect();
    if urls.is_empty() {
        return Ok(None);
    }
    let rt = runtime()?;
    let mut total = 0u64;
    let mut listed = Vec::new();
    // The open's requests in flight, each with a connection and while it indexes an
    // object its copy's file, duplicate and ring: within what `ulimit -n` leaves, counted
    // before the listing opens any connection (they stay open for the open's requests).
    let in_flight = fetch::within_descriptors(stream::HEADS_IN_FLIGHT, 4, &urls.join(" "))?;
    for u in &urls {
        let url = S3Url::parse(u)?;
        let store = cfg.store(&url.bucket)?;
        let objects = rt.block_on(fetch::list(&store, &url, in_flight))?;
        total += objects.iter().map(|m| m.size).sum::<u64>();
        listed.push((url, store, objects));
    }
    if total <= limit {
        return Ok(None);
    }
    let [(url, store, objects)] = &mut listed[..] else {
        return Err(Error::Invalid(format!(
            "{}: {} of objects do not fit --cache-limit {}, and only one s3:// URL alone is \
             streamed",
            urls.join(" "),
            crate::size::human_bytes(total as f64),
            crate::size::human_bytes(limit as f64)
        )));
    };
    if paths.len() > 1 {
        return Err(Error::Invalid(format!(
            "{}: streamed from object storage (it does not fit --cache-limit), it is read alone, \
             not beside local paths",
            url.text
        )));
    }
    let root = match root {
        Some(r) => r.to_path_buf(),
        None => cache_root()?,
    };
    let dir = endpoint_cache(&root, cfg)?
        .join(".streamed")
        .join(&url.bucket);
    let objects = std::mem::take(objects);
    // The store and runtime that listed them open them: one client, its connections kept
    // (a pooled connection is driven by the runtime that made it, so the two go together;
    // the runtime is dropped, and its connections closed, before the read makes its own).
    let handles = (store.clone(), &rt, in_flight);
    stream::open(url, handles, &dir, objects, limit, opts).map(Some)
}

#[cfg(test)]
mod tests;
