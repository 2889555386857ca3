//! Which parts of a split output riffle wrote (issue 30 D20): a rerun removes an earlier
//! run's parts beyond its own count, and only those.
//!
//! Each split run commits, with its parts, a manifest `.OUT.riffle-parts` beside them
//! (hidden: never data, never matched by a shell's `OUT.*`): a first line
//! `riffle split parts 1`, then a line `NUMBER DEVICE INODE SIZE` per part written. A
//! rerun removes part `NUMBER` of the earlier manifest when it is beyond the rerun's parts
//! and the file at its name is still that regular file (device, inode and size). Anything
//! else named like a part is left, with a notice: a user's file, a directory, a part
//! rewritten since, or parts of a run older than the manifest.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::output::existing_parts;
use crate::scratch::{self, TempFile};
use crate::{door, notice, Error, Result};

const HEAD: &str = "riffle split parts 1";

/// The manifest's path: `.OUT.riffle-parts` in OUT's directory.
fn manifest_path(base: &Path) -> Option<PathBuf> {
    let mut name = OsString::from(".");
    name.push(base.file_name()?);
    name.push(".riffle-parts");
    Some(scratch::parent_dir(base).join(name))
}

/// What an earlier split run left beyond this run's parts.
pub(super) struct Earlier {
    /// Its parts, still as it wrote them: removed once this run is committed.
    remove: Vec<PathBuf>,
    /// Names like parts that riffle did not write or that changed since: left.
    leave: Vec<PathBuf>,
}

impl Earlier {
    /// Finds, before anything is committed, the parts numbered `count` and up: those the
    /// earlier manifest lists and that are still the files it wrote, and the rest.
    pub(super) fn find(base: &Path, count: usize) -> Result<Earlier> {
        let mut listed = std::collections::HashMap::new();
        if let Some(manifest) = manifest_path(base) {
            // Through the door: a link, FIFO or device planted at the name is refused.
            if let Some(bytes) = door::read_meta(&manifest, door::cap::LISTING, door::Follow::No)? {
                listed = parse(&bytes).ok_or_else(|| Error::BadInput {
                    path: manifest.clone(),
                    offset: None,
                    what: format!(
                        "not a manifest of split parts (its first line is not `{HEAD}`, or a \
                         line is not four numbers); remove it to go on"
                    ),
                })?;
            }
        }
        let mut found = existing_parts(base)?;
        found.sort();
        let (mut remove, mut leave) = (Vec::new(), Vec::new());
        for (n, path) in found.into_iter().filter(|(n, _)| *n >= count) {
            let written = listed.get(&n).is_some_and(|&(dev, ino, size)| {
                std::fs::symlink_metadata(&path)
                    .is_ok_and(|m| m.is_file() && (m.dev(), m.ino(), m.len()) == (dev, ino, size))
            });
            if written {
                remove.push(path);
            } else {
                leave.push(path);
            }
        }
        Ok(Earlier { remove, leave })
    }

    /// Removes the earlier run's parts (this run's are committed), with a notice naming
    /// them and what was left. A part that cannot be removed now is named, not an error:
    /// the new parts are in place.
    pub(super) fn remove(self, base: &Path) {
        let mut removed = Vec::new();
        for p in &self.remove {
            match std::fs::remove_file(p) {
                Ok(()) => removed.push(p.clone()),
                Err(e) => {
                    notice::once(
                        &format!("stale-part:{}", p.display()),
                        &format!(
                            "could not remove {}, a part of an earlier run: {e}",
                            p.display()
                        ),
                    );
                }
            }
        }
        if let [first, .., last] | [first @ last] = removed.as_slice() {
            notice::once(
                &format!("stale-parts:{}", base.display()),
                &format!(
                    "removed {} part{} of an earlier run beyond this run's ({} .. {})",
                    removed.len(),
                    if removed.len() == 1 { "" } else { "s" },
                    first.display(),
                    last.display()
                ),
            );
            let _ = scratch::sync_dir(scratch::parent_dir(base));
        }
        if let [first, .., last] | [first @ last] = self.leave.as_slice() {
            notice::once(
                &format!("foreign-parts:{}", base.display()),
                &format!(
                    "left {} file(s) named like parts beyond this run's ({} .. {}): riffle did \
                     not write them, or they changed since; remove them yourself if they are \
                     not wanted",
                    self.leave.len(),
                    first.display(),
                    last.display()
                ),
            );
        }
    }
}

/// The manifest of this run's parts (`done`: each temporary file and its part's name, in
/// part order), to commit with them; `None` when OUT has no file name.
pub(super) fn manifest(
    base: &Path,
    done: &[(TempFile, PathBuf)],
) -> Result<Option<(TempFile, PathBuf)>> {
    use std::io::Write;
    let Some(path) = manifest_path(base) else {
        return Ok(None);
    };
    let mut text = format!("{HEAD}\n");
    for (temp, dest) in done {
        let m = temp
            .handle()?
            .metadata()
            .map_err(|e| Error::io(temp.path(), "stat", None, e))?;
        let Some(n) = number(base, dest) else {
            continue;
        };
        text.push_str(&format!("{n} {} {} {}\n", m.dev(), m.ino(), m.len()));
    }
    let temp = TempFile::beside(&path)?;
    temp.handle()?
        .write_all(text.as_bytes())
        .map_err(|e| Error::io(temp.path(), "write", None, e))?;
    Ok(Some((temp, path)))
}

/// The number of part `dest` of `base` (`OUT.007`: 7).
fn number(base: &Path, dest: &Path) -> Option<usize> {
    use std::os::unix::ffi::OsStrExt;
    let digits = dest
        .file_name()?
        .as_bytes()
        .strip_prefix(base.file_name()?.as_bytes())?
        .strip_prefix(b".")?;
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// Part number -> (device, inode, size), or `None` if it is not a manifest.
fn parse(bytes: &[u8]) -> Option<std::collections::HashMap<usize, (u64, u64, u64)>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut lines = text.lines();
    if lines.next()? != HEAD {
        return None;
    }
    let mut out = std::collections::HashMap::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let mut f = line.split(' ').map(str::parse::<u64>);
        let (n, dev, ino, size) = (
            f.next()?.ok()?,
            f.next()?.ok()?,
            f.next()?.ok()?,
            f.next()?.ok()?,
        );
        if f.next().is_some() {
            return None;
        }
        out.insert(usize::try_from(n).ok()?, (dev, ino, size));
    }
    Some(out)
}
