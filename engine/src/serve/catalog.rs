//! The datasets a daemon serves: those it was started with (`--dataset NAME=SPEC`), and,
//! when it opens paths (`riffle serve --user`, `--open-paths`), those its clients name by
//! path in an OPEN, opened on first use and kept for the next stream.
//!
//! A dataset opened by path is named by the words of the OPEN (`/data/train.npy`,
//! `/data/t.bin:fixed:4K`, `mix:a=/x*1,b=/y*2`, `s3://bucket/prefix/`), which must name
//! absolute paths or `s3://` URLs: the daemon's working directory is not the client's. An
//! `s3://` dataset is opened with the daemon's environment (its endpoint and credentials,
//! `S3Config::from_env`) and `--cache-limit`: staged whole when it fits, else streamed. It is opened as the daemon's user, so
//! it reads only what that user could: `--user` serves only its own user (`SO_PEERCRED`,
//! see `server.rs`); an operator's `--open-paths` daemon reads as itself for whoever can
//! reach its socket. Its index is charged to `--memory` while it is kept. Kept datasets
//! are checked against their files before a new stream uses them (at most once a second):
//! a file replaced, grown, shrunk or touched since it was opened, or a directory named
//! whose entries changed, opens the dataset again, so a rewritten file is never read
//! through a stale index. An `s3://` URL's objects are listed again instead, at most every
//! [`LIST_AGAIN`]: an object added, removed or replaced (its key, size or ETag) opens the
//! dataset again. A stream that starts before that listing sees it reads the old index,
//! and every streamed GET is conditional on the ETag listed at open, so a replaced object
//! gives that stream an error naming it, never a wrong batch (a staged copy is the old
//! object's bytes, read whole). At most [`MAX_KEPT`] are kept; past that, the least recently
//! used one no stream holds goes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::budget::{Ask, Grant};
use super::codes::reply_code;
use super::open::Refusal;
use super::state::Shared;
use crate::dataset::OpenOptions;
use crate::source::{PathSpec, Source};

/// Datasets opened by path kept at once.
pub(super) const MAX_KEPT: usize = 64;

/// How often a kept dataset's files are looked at again.
const LOOK_AGAIN: Duration = Duration::from_secs(1);

/// How often a kept dataset's `s3://` URLs are listed again (a listing is a request to
/// the store, not a local `stat`).
const LIST_AGAIN: Duration = Duration::from_secs(5);

/// What a file was when its dataset was opened: (device, inode, size, mtime in ns).
pub(super) type Stamp = (u64, u64, u64, i128);

/// A hook run on every dataset opened by path before it is served (the command profiles
/// its device for the planner and reclaims scratch a killed daemon left beside it).
pub type OnOpen = Arc<dyn Fn(&Source) -> crate::Result<()> + Send + Sync>;

struct Kept {
    name: String,
    src: Source,
    stamps: Vec<(PathBuf, Stamp)>,
    /// Each `s3://` URL named, and its objects' identity ([`crate::remote::identity`]).
    objects: Vec<(String, u64)>,
    checked: Instant,
    listed: Instant,
    used: Instant,
    /// Its index's bytes, taken from `--memory`.
    _index: Grant,
}

/// The datasets served: fixed at start, and those opened by path.
pub(super) struct Catalog {
    fixed: Vec<(String, Source)>,
    /// Whether OPENs may name paths.
    open_paths: bool,
    on_open: Option<OnOpen>,
    kept: Mutex<Vec<Kept>>,
    /// Held while a dataset is opened by path, so two streams of a new dataset open it
    /// once.
    opening: Mutex<()>,
}

impl Catalog {
    pub(super) fn new(
        fixed: Vec<(String, Source)>,
        open_paths: bool,
        on_open: Option<OnOpen>,
    ) -> Catalog {
        Catalog {
            fixed,
            open_paths,
            on_open,
            kept: Mutex::new(Vec::new()),
            opening: Mutex::new(()),
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Vec<Kept>> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every dataset served now, by name.
    pub(super) fn all(&self) -> Vec<(String, Source)> {
        let mut v = self.fixed.clone();
        v.extend(self.kept().iter().map(|k| (k.name.clone(), k.src.clone())));
        v
    }

    /// The dataset an OPEN names: one started with, or (when paths may be named) the one
    /// the path names, opened now if it is new or changed. `unknown_dataset` names what
    /// is served; a path that cannot be opened is refused with the engine's reason.
    pub(super) fn get(&self, name: &str, shared: &Shared) -> Result<Source, Refusal> {
        if let Some((_, src)) = self.fixed.iter().find(|(n, _)| n == name) {
            return Ok(src.clone());
        }
        let by_path = ["/", "mix:", crate::remote::SCHEME]
            .iter()
            .any(|p| name.starts_with(p));
        if !self.open_paths || !by_path {
            let names: Vec<String> = self.all().into_iter().map(|(n, _)| n).collect();
            let hint = if self.open_paths {
                " (or an absolute path or s3:// URL of a dataset)"
            } else {
                ""
            };
            return Err((
                "unknown_dataset",
                format!(
                    "unknown dataset '{name}': this daemon serves {}{hint}",
                    if names.is_empty() {
                        "none yet".into()
                    } else {
                        names.join(", ")
                    }
                ),
            ));
        }
        if let Some(src) = self.current(name) {
            return Ok(src);
        }
        let _one = self.opening.lock().unwrap_or_else(|p| p.into_inner());
        // Another stream may have opened it while this one waited.
        if let Some(src) = self.current(name) {
            return Ok(src);
        }
        self.open(name, shared)
    }

    /// A kept dataset of this name whose files (and objects) are as they were when it was
    /// opened; one whose files changed is dropped (its streams keep what they hold).
    fn current(&self, name: &str) -> Option<Source> {
        let (src, stamps, objects) = {
            let mut kept = self.kept();
            let k = kept.iter_mut().find(|k| k.name == name)?;
            k.used = Instant::now();
            let list = !k.objects.is_empty() && k.listed.elapsed() >= LIST_AGAIN;
            if k.checked.elapsed() < LOOK_AGAIN && !list {
                return Some(k.src.clone());
            }
            let objects = if list { k.objects.clone() } else { Vec::new() };
            (k.src.clone(), k.stamps.clone(), objects)
        };
        let same = stamps.iter().all(|(p, s)| stamp(p).ok() == Some(*s))
            && objects
                .iter()
                .all(|(u, id)| crate::remote::identity(u).ok() == Some(*id));
        let mut kept = self.kept();
        if same {
            if let Some(k) = kept.iter_mut().find(|k| k.name == name) {
                k.checked = Instant::now();
                if !objects.is_empty() {
                    k.listed = k.checked;
                }
            }
            return Some(src);
        }
        kept.retain(|k| k.name != name);
        None
    }

    /// Opens the dataset `name` names and keeps it, its index charged to `--memory`.
    fn open(&self, name: &str, shared: &Shared) -> Result<Source, Refusal> {
        let bad = |m: String| ("bad_request", m);
        let spec = PathSpec::parse(name).map_err(|e| bad(format!("dataset '{name}': {e}")))?;
        let remote = crate::remote::is_remote;
        if let Some(p) = spec
            .paths()
            .into_iter()
            .find(|p| !p.is_absolute() && !remote(p))
        {
            return Err(bad(format!(
                "dataset '{name}': {} is a relative path; a daemon opens absolute paths and \
                 s3:// URLs only (its working directory is not the client's)",
                p.display()
            )));
        }
        let opts = OpenOptions {
            format: spec.format.clone(),
            cache_limit: shared.cfg.cache_limit,
            ..OpenOptions::default()
        };
        let engine = |e: crate::Error| (reply_code(&e), format!("dataset '{name}': {e}"));
        // The objects' identity is taken before they are opened: one replaced in between
        // is then seen at the next listing.
        let mut objects = Vec::new();
        for p in spec.paths().into_iter().filter(|p| remote(p)) {
            let url = p.to_string_lossy().into_owned();
            let id = crate::remote::identity(&url).map_err(engine)?;
            objects.push((url, id));
        }
        let src = spec.spec.open(&opts, &mut |_, _, _| {}).map_err(engine)?;
        if let Some(hook) = &self.on_open {
            hook(&src).map_err(engine)?;
        }
        // The paths named (a directory's entries change its mtime: a file added or
        // removed), and every local file read (a streamed dataset's files are its
        // objects, whose identity is listed instead).
        let mut stamps: Vec<(PathBuf, Stamp)> = spec
            .paths()
            .into_iter()
            .filter(|p| !remote(p))
            .filter_map(|p| Some((p.to_path_buf(), stamp(p).ok()?)))
            .collect();
        for f in src.dataset().files().iter().filter(|f| !remote(&f.path)) {
            let s = stamp(&f.path).map_err(|e| {
                (
                    "engine",
                    format!("dataset '{name}': {}: {e}", f.path.display()),
                )
            })?;
            stamps.push((f.path.clone(), s));
        }
        let index = src.dataset().index_bytes();
        self.make_room();
        let ask = Ask {
            what: &format!("the index of dataset '{name}'"),
            most: (u64::MAX, ""),
            fit: |_| Ok(index),
        };
        let grant = shared
            .budget
            .take(ask, shared.cfg.admit_wait, &shared.stopping)?;
        let mut kept = self.kept();
        if kept.len() >= MAX_KEPT {
            return Err((
                "busy",
                format!(
                    "the daemon keeps {MAX_KEPT} datasets opened by path and streams use \
                     every one: try again when a job ends"
                ),
            ));
        }
        let now = Instant::now();
        kept.push(Kept {
            name: name.to_string(),
            src: src.clone(),
            stamps,
            objects,
            checked: now,
            listed: now,
            used: now,
            _index: grant,
        });
        Ok(src)
    }

    /// Below [`MAX_KEPT`]: drops the least recently used kept dataset no stream holds.
    fn make_room(&self) {
        let mut kept = self.kept();
        if kept.len() < MAX_KEPT {
            return;
        }
        let idle = kept
            .iter()
            .enumerate()
            .filter(|(_, k)| !in_use(&k.src))
            .min_by_key(|(_, k)| k.used)
            .map(|(i, _)| i);
        if let Some(i) = idle {
            kept.remove(i);
        }
    }
}

/// Whether a stream (or a pass) holds the source besides the catalog.
fn in_use(src: &Source) -> bool {
    match src {
        Source::Dataset(d) => Arc::strong_count(d) > 1,
        Source::Mixture(m) => Arc::strong_count(m) > 1 || Arc::strong_count(&m.sources) > 1,
    }
}

/// The file at `path` as it is now.
pub(super) fn stamp(path: &Path) -> std::io::Result<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    let mtime = i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec());
    Ok((m.dev(), m.ino(), m.size(), mtime))
}
