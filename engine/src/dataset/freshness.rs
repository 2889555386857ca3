//! Whether a tree's saved listing (see [`super::files`]) still says what the tree holds.
//!
//! Checked each time the listing is taken from its sidecar, before any record is read:
//!
//! - **Every file** is stat'ed at its path under the root: another file at a listed name
//!   (device and inode) or a file appended or truncated in place (its size) makes the
//!   listing stale, and the tree is walked again (issue 30 D16: such a file made every
//!   later read fail until its directory was touched).
//! - **Every directory** is stat'ed: one that changed (mtime or ctime) is listed again and
//!   its entries compared with the listing's. Entries that are never data (hidden names,
//!   such as riffle's own `.riffle-scratch-*` directories and temporary files, and
//!   sidecars) do not count, so a run whose scratch was inside the tree does not make the
//!   next run walk it again (D29). When only such entries changed, the listing holds and
//!   its sidecar is saved again with the directories' new times.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::files::{dir_id, DirId, Listing};
use super::skipped_name;

/// Checks `listing` (with the directories it walked) against the tree at `root`: `Err`
/// with why when it is stale, `Ok(Some(dirs))` when it holds but some directories have
/// new times (`dirs`: the identities to save), `Ok(None)` when nothing changed.
pub(super) fn check(
    listing: &Listing,
    dirs: &[DirId],
    root: &Path,
) -> Result<Option<Vec<DirId>>, String> {
    let mut changed = Vec::new();
    let mut now_dirs = dirs.to_vec();
    for (i, d) in dirs.iter().enumerate() {
        let rel = Path::new(OsStr::from_bytes(&d.0));
        let dir = root.join(rel);
        let now = std::fs::metadata(&dir)
            .map_err(|e| format!("{} cannot be read now: {e}", dir.display()))?;
        let id = dir_id(rel, &now);
        if (id.2, id.3) != (d.2, d.3) {
            return Err(format!(
                "{} is another directory since it was listed",
                dir.display()
            ));
        }
        if id != *d {
            changed.push(i);
            now_dirs[i] = id;
        }
    }
    if !changed.is_empty() {
        same_entries(listing, dirs, &changed, root)?;
    }
    for f in &listing.files {
        let rel = f.path.strip_prefix(root).unwrap_or(&f.path);
        let at = root.join(f.under.as_deref().unwrap_or(rel));
        let m = std::fs::symlink_metadata(&at)
            .map_err(|e| format!("{} cannot be read now: {e}", at.display()))?;
        if (m.dev(), m.ino()) != f.identity || !m.is_file() {
            return Err(format!(
                "{} is another file since it was listed",
                at.display()
            ));
        }
        if m.len() != f.size {
            return Err(format!(
                "{} changed in place since it was listed ({} bytes, was {})",
                at.display(),
                m.len(),
                f.size
            ));
        }
    }
    Ok((!changed.is_empty()).then_some(now_dirs))
}

/// Checks that each directory `dirs[changed[..]]` holds, of the entries that can be data,
/// the names the listing has in it (its files and its subdirectories), no more, no fewer.
fn same_entries(
    listing: &Listing,
    dirs: &[DirId],
    changed: &[usize],
    root: &Path,
) -> Result<(), String> {
    let mut want: HashMap<&[u8], HashSet<&[u8]>> = changed
        .iter()
        .map(|&i| (dirs[i].0.as_slice(), HashSet::new()))
        .collect();
    let files = listing
        .files
        .iter()
        .map(|f| f.path.strip_prefix(root).unwrap_or(&f.path));
    let subdirs = dirs
        .iter()
        .map(|d| Path::new(OsStr::from_bytes(&d.0)))
        .filter(|p| !p.as_os_str().is_empty());
    for p in files.chain(subdirs) {
        let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
            continue;
        };
        if let Some(set) = want.get_mut(parent.as_os_str().as_bytes()) {
            set.insert(name.as_bytes());
        }
    }
    for (rel, names) in want {
        let dir = root.join(OsStr::from_bytes(rel));
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| format!("{} cannot be listed now: {e}", dir.display()))?;
        let mut seen = 0usize;
        for entry in entries {
            let entry =
                entry.map_err(|e| format!("{} cannot be listed now: {e}", dir.display()))?;
            let name = entry.file_name();
            if skipped_name(&name) {
                continue;
            }
            if !names.contains(name.as_bytes()) {
                return Err(format!(
                    "{} is new since the tree was listed",
                    dir.join(&name).display()
                ));
            }
            seen += 1;
        }
        if seen != names.len() {
            return Err(format!(
                "{} has {} fewer entries since it was listed",
                dir.display(),
                names.len().saturating_sub(seen)
            ));
        }
    }
    Ok(())
}
