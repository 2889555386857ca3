//! The async half of [`crate::remote`]: listing, identity checks and ranged GETs into the
//! local cache. Nothing here is reached except through `block_on` in `remote/mod.rs`.

use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::stream::{self, StreamExt, TryStreamExt};
use object_store::path::Path as Key;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore};
use serde::{Deserialize, Serialize};

use super::S3Url;
use crate::door::{self, Follow};
use crate::scratch::{self, TempFile};
use crate::{Error, Result};

/// Bytes per ranged GET.
pub const CHUNK: u64 = 8 << 20;
/// Ranged GETs in flight per object.
pub const IN_FLIGHT: usize = 16;

/// Descriptors kept aside from a fetch's budget: the standard streams, the runtime's, a
/// listing's connection and the few a read opens beside its fetches.
const SPARE_DESCRIPTORS: u64 = 8;

/// How many of `want` requests in flight, each holding `per` descriptors (its connection,
/// a copy's file and its duplicate), fit what `ulimit -n` leaves free now; an error naming
/// `what` and the limit when not even one does (the fetch failed part way with "Too many
/// open files" before). The sockets open now are taken for the store's idle connections,
/// which the requests reuse before they open any.
pub(crate) fn within_descriptors(want: usize, per: u64, what: &str) -> Result<usize> {
    let limit = crate::io::open_file_limit();
    let (mut open, mut sockets) = (0u64, 0u64);
    match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => {
            for e in dir.flatten() {
                open += 1;
                let link = std::fs::read_link(e.path()).unwrap_or_default();
                sockets += u64::from(link.to_string_lossy().starts_with("socket:"));
            }
        }
        Err(_) => open = SPARE_DESCRIPTORS,
    }
    let free = limit.saturating_sub(open).saturating_sub(SPARE_DESCRIPTORS);
    // n requests take n * (per - 1) descriptors of their own, and a connection each past
    // the idle ones.
    let per = per.max(1);
    let fit = (1..=want as u64)
        .take_while(|&n| n * (per - 1) + n.saturating_sub(sockets) <= free)
        .last()
        .unwrap_or(0) as usize;
    if fit == 0 {
        return Err(Error::OverBudget(format!(
            "{what}: ulimit -n {limit} leaves {} descriptors free ({open} open) and a request \
             to the store needs {per}, beside {SPARE_DESCRIPTORS} kept spare: raise ulimit -n",
            limit.saturating_sub(open),
        )));
    }
    Ok(fit)
}

/// What the cache records beside a staged object: its identity when it was fetched.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Identity {
    pub etag: Option<String>,
    pub size: u64,
}

impl Identity {
    fn of(meta: &ObjectMeta) -> Identity {
        Identity {
            etag: meta.e_tag.clone(),
            size: meta.size,
        }
    }
}

pub(super) fn url_of(bucket: &str, key: &str) -> String {
    format!("s3://{bucket}/{key}")
}

/// An `object_store` error about `url`, as the engine's error: not found keeps its kind.
pub(super) fn store_error(
    url: &str,
    op: &'static str,
    range: Option<(u64, u64)>,
    e: object_store::Error,
) -> Error {
    let (kind, what) = match &e {
        object_store::Error::NotFound { .. } => (
            ErrorKind::NotFound,
            "no such object (removed since it was listed?)".to_string(),
        ),
        object_store::Error::Precondition { .. } => (
            ErrorKind::Other,
            "the object was replaced since it was listed (its ETag changed)".to_string(),
        ),
        _ => (ErrorKind::Other, e.to_string()),
    };
    let what = match range {
        Some((a, b)) => format!("bytes {a}..{b}: {what}"),
        None => what,
    };
    Error::Io {
        path: PathBuf::from(url),
        op,
        offset: range.map(|r| r.0),
        err: std::io::Error::new(kind, what),
    }
}

/// The key as a relative local path, refused when it could leave the cache or name a
/// directory (`..`, `.`, an empty component).
pub(super) fn local_rel(url: &str, key: &str) -> Result<PathBuf> {
    let ok = !key.is_empty()
        && key
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'));
    if !ok {
        return Err(Error::Invalid(format!(
            "{url}: a key with an empty, '.' or '..' component cannot be staged in the local cache"
        )));
    }
    Ok(PathBuf::from(key))
}

/// The objects `url` names, in key order, by a caller that makes no other request: HEADs
/// (for a listing without ETags) within what `ulimit -n` leaves.
pub(super) async fn list_alone(
    store: &Arc<dyn ObjectStore>,
    url: &S3Url,
) -> Result<Vec<ObjectMeta>> {
    list(store, url, within_descriptors(IN_FLIGHT, 1, &url.text)?).await
}

/// The objects `url` names, in key order; HEADs `in_flight` at a time.
pub(super) async fn list(
    store: &Arc<dyn ObjectStore>,
    url: &S3Url,
    in_flight: usize,
) -> Result<Vec<ObjectMeta>> {
    let parse = |k: &str| {
        Key::parse(k).map_err(|e| Error::Invalid(format!("'{}': a bad key: {e}", url.text)))
    };
    if url.pattern.is_none() && !url.key.is_empty() && !url.key.ends_with('/') {
        match store.head(&parse(&url.key)?).await {
            Ok(meta) => return Ok(vec![meta]),
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(store_error(&url.text, "HEAD", None, e)),
        }
    }
    let prefix = url.key.trim_end_matches('/');
    let prefix = if prefix.is_empty() {
        None
    } else {
        Some(parse(prefix)?)
    };
    let listed: Vec<ObjectMeta> = store
        .list(prefix.as_ref())
        .try_collect()
        .await
        .map_err(|e| store_error(&url.text, "LIST", None, e))?;
    let opts = glob::MatchOptions {
        require_literal_separator: true,
        ..Default::default()
    };
    let mut found: Vec<ObjectMeta> = listed
        .into_iter()
        .filter(|m| {
            let key = m.location.as_ref();
            // Hidden names are left out, as in a local directory.
            let hidden = m.location.filename().is_some_and(|n| n.starts_with('.'));
            !hidden
                && url
                    .pattern
                    .as_ref()
                    .is_none_or(|p| p.matches_with(key, opts))
        })
        .collect();
    found.sort_by(|a, b| a.location.as_ref().cmp(b.location.as_ref()));
    // A listing without ETags (some S3-compatible servers leave them out): each object's
    // HEAD gives its identity, `in_flight` at a time (the caller's budget of descriptors:
    // the connections stay open for the requests after).
    if found.iter().any(|m| m.e_tag.is_none()) {
        found = stream::iter(found.into_iter().map(|m| async move {
            if m.e_tag.is_some() {
                return Ok(m);
            }
            let url = url_of(&url.bucket, m.location.as_ref());
            store
                .head(&m.location)
                .await
                .map_err(|e| store_error(&url, "HEAD", None, e))
        }))
        .buffered(in_flight.max(1))
        .try_collect()
        .await?;
    }
    if found.is_empty() {
        return Err(Error::Io {
            path: PathBuf::from(&url.text),
            op: "LIST",
            offset: None,
            err: std::io::Error::new(ErrorKind::NotFound, "no such object, prefix or match"),
        });
    }
    Ok(found)
}

/// The sidecar recording a staged copy's identity: `.NAME.riffle-object` beside it.
pub(super) fn sidecar(dest: &Path) -> PathBuf {
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    scratch::parent_dir(dest).join(format!(".{name}.riffle-object"))
}

/// Whether `dest` is a complete copy of the object `meta` describes.
fn is_fresh(dest: &Path, meta: &ObjectMeta) -> Result<bool> {
    let Some(bytes) = door::read_meta(&sidecar(dest), 4096, Follow::No)? else {
        return Ok(false);
    };
    let Ok(had) = serde_json::from_slice::<Identity>(&bytes) else {
        return Ok(false);
    };
    let local = std::fs::symlink_metadata(dest);
    Ok(had == Identity::of(meta)
        && meta.e_tag.is_some()
        && local.is_ok_and(|m| m.is_file() && m.len() == meta.size))
}

/// Refuses to stage `bytes` more into `dir` when its filesystem has less free (a copy
/// that would stop at "No space left" part way, after minutes of GETs), before any GET,
/// naming the figures and the ways out. The nearest existing directory at or above `dir`
/// is asked (the cache is made by the fetch).
fn room_for(url: &S3Url, dir: &Path, bytes: u64) -> Result<()> {
    let Some(at) = dir.ancestors().find(|a| a.is_dir()) else {
        return Ok(());
    };
    let free = crate::probe::free_bytes(at)?;
    if bytes <= free {
        return Ok(());
    }
    Err(Error::OverBudget(format!(
        "{}: staging it needs {} more of local disk and {} has {} free: free some, point \
         RIFFLE_S3_CACHE at a larger filesystem, or give a --cache-limit below what is free \
         (riffle read then streams it)",
        url.text,
        crate::size::human_bytes(bytes as f64),
        at.display(),
        crate::size::human_bytes(free as f64)
    )))
}

/// Fetches the object `meta` describes into `dest` with ranged GETs, `in_flight` at a time (at
/// most [`IN_FLIGHT`]), each conditional on the listed ETag (and checked against it, for a server that
/// ignores `If-Match`); commits the copy, then its identity.
pub(super) async fn fetch(
    store: &Arc<dyn ObjectStore>,
    url: &str,
    meta: &ObjectMeta,
    dest: &Path,
    in_flight: usize,
) -> Result<()> {
    let parent = scratch::parent_dir(dest);
    std::fs::create_dir_all(parent)
        .map_err(|e| Error::io(parent, "create the cache directory", None, e))?;
    let tmp = TempFile::beside(dest)?;
    let file = tmp.handle()?;
    let ranges: Vec<(u64, u64)> = (0..meta.size.div_ceil(CHUNK))
        .map(|i| (i * CHUNK, ((i + 1) * CHUNK).min(meta.size)))
        .collect();
    let want = meta.e_tag.clone();
    let gets = ranges.into_iter().map(|(a, b)| {
        let want = want.clone();
        let file = &file;
        let tmp = &tmp;
        async move {
            let opts = GetOptions {
                range: Some(GetRange::Bounded(a..b)),
                if_match: want.clone(),
                ..Default::default()
            };
            let got = store
                .get_opts(&meta.location, opts)
                .await
                .map_err(|e| store_error(url, "ranged GET", Some((a, b)), e))?;
            if want.is_some() && got.meta.e_tag != want {
                let e = object_store::Error::Precondition {
                    path: url.to_string(),
                    source: "ETag differs".into(),
                };
                return Err(store_error(url, "ranged GET", Some((a, b)), e));
            }
            let bytes = got
                .bytes()
                .await
                .map_err(|e| store_error(url, "ranged GET", Some((a, b)), e))?;
            if bytes.len() as u64 != b - a {
                return Err(Error::BadInput {
                    path: PathBuf::from(url),
                    offset: Some(a),
                    what: format!(
                        "a ranged GET of bytes {a}..{b} returned {} bytes",
                        bytes.len()
                    ),
                });
            }
            file.write_all_at(&bytes, a)
                .map_err(|e| Error::io(tmp.path(), "write", Some(a), e))
        }
    });
    stream::iter(gets)
        .buffer_unordered(in_flight.clamp(1, IN_FLIGHT))
        .try_collect::<Vec<()>>()
        .await?;
    drop(file);
    tmp.commit(dest)?;
    let id = serde_json::to_vec(&Identity::of(meta))
        .map_err(|e| Error::Internal(format!("{url}: cannot record its identity: {e}")))?;
    scratch::write_atomic(&sidecar(dest), &id)
}

/// Stages every object `url` names under `dir` (the bucket's cache directory), fetching
/// only those whose copy is missing or stale, and returns the local paths in key order.
pub(super) async fn stage(
    store: &Arc<dyn ObjectStore>,
    url: &S3Url,
    dir: &Path,
) -> Result<Vec<PathBuf>> {
    // A connection each, and a copy's two descriptors: within what `ulimit -n` leaves,
    // counted before the listing opens any connection.
    let gets = within_descriptors(IN_FLIGHT, 3, &url.text)?;
    let objects = list(store, url, gets).await?;
    let stale: Vec<bool> = objects
        .iter()
        .map(|m| {
            let key = m.location.as_ref();
            let dest = dir.join(local_rel(&url_of(&url.bucket, key), key)?);
            Ok(!is_fresh(&dest, m)?)
        })
        .collect::<Result<_>>()?;
    let (n, bytes) = objects
        .iter()
        .zip(&stale)
        .filter(|(_, s)| **s)
        .fold((0, 0), |(n, b), (m, _)| (n + 1, b + m.size));
    if n > 0 {
        room_for(url, dir, bytes)?;
        crate::notice::once(
            &format!("s3-stage {}", url.text),
            &format!(
                "fetching {n} object(s), {} from {} into {}",
                crate::size::human_bytes(bytes as f64),
                url.text,
                dir.display()
            ),
        );
    }
    // Several objects at once, so that small objects (a GET each) do not wait on each
    // other's first byte: as many as keep about `gets` ranged GETs in flight in all.
    let widest = (objects.iter().zip(&stale))
        .filter(|(_, s)| **s)
        .map(|(m, _)| m.size.div_ceil(CHUNK).clamp(1, gets as u64))
        .max()
        .unwrap_or(1);
    let at_once = (gets as u64 / widest).max(1) as usize;
    let each = (gets / at_once).max(1);
    stream::iter(objects.iter().zip(stale))
        .map(|(meta, stale)| async move {
            let key = meta.location.as_ref();
            let object = url_of(&url.bucket, key);
            let dest = dir.join(local_rel(&object, key)?);
            if stale {
                if scratch::stopping() {
                    return Err(Error::Cancelled {
                        reason: "stopped while staging objects",
                    });
                }
                fetch(store, &object, meta, &dest, each).await?;
            }
            Ok(dest)
        })
        .buffered(at_once)
        .try_collect()
        .await
}

#[cfg(test)]
pub(super) fn local_rel_for_test(key: &str) -> Result<PathBuf> {
    local_rel(&format!("s3://b/{key}"), key)
}
