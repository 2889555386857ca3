//! The `files` format's listing: a dataset that is one file per record.
//!
//! - A **directory tree** (ImageFolder's layout: `ROOT/CLASS/.../SAMPLE`). Every regular file
//!   under ROOT is a record; its label is the index of its first-level directory among
//!   ROOT's first-level directories in sorted order (torchvision's `ImageFolder` rule, so
//!   labels agree with it). When ROOT has subdirectories, files directly in ROOT belong to
//!   no class and are left out (with a notice), as ImageFolder leaves them; a flat
//!   directory of files is a dataset without labels. Records are in ImageFolder's order:
//!   class by class, then by directory path, then by file name (bytewise).
//! - A **manifest**: a text file of paths, one per line (blank lines and lines starting
//!   with `#` skipped), relative paths taken from the manifest's directory. A record per
//!   line, in the manifest's order. Labels by the same rule when every path is relative
//!   and inside a directory (`CLASS/.../SAMPLE`); otherwise none.
//!
//! Hidden entries (a name starting with `.`) and riffle's own sidecars are skipped,
//! directory links are followed once (a link cycle is not walked twice), FIFOs, sockets
//! and devices are skipped with a notice, and empty files too (a record of no bytes).

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::{io, notice, Error, Result};

/// What a `files` dataset lists.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// Each record's file and its size, in record order.
    pub files: Vec<(PathBuf, u64)>,
    /// Each record's label (the index of its class in `classes`), when the layout gives
    /// labels.
    pub labels: Option<Vec<u32>>,
    /// Class names in label order.
    pub classes: Vec<String>,
}

/// Lists the dataset at `path`: a directory tree, or a manifest of paths.
pub(crate) fn list(path: &Path) -> Result<Listing> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, "open", None, e))?;
    if meta.is_dir() {
        walk(path)
    } else if meta.is_file() {
        manifest(path)
    } else {
        Err(Error::BadInput {
            path: path.into(),
            offset: None,
            what: format!(
                "is {}; a files dataset is a directory tree or a manifest (a text file of paths)",
                io::file_type_name(&meta.file_type())
            ),
        })
    }
}

fn skipped_name(name: &std::ffi::OsStr) -> bool {
    let name = name.to_string_lossy();
    name.starts_with('.') || name.ends_with(".ridx") || name.contains(".ridx.tmp")
}

/// A file found by the walk: its first-level directory (None: directly in ROOT), its
/// directory relative to ROOT, its name, and its size.
struct Found {
    class: Option<String>,
    dir: Vec<u8>,
    name: Vec<u8>,
    path: PathBuf,
    size: u64,
}

fn walk(root: &Path) -> Result<Listing> {
    use std::os::unix::ffi::OsStrExt;
    let mut found = Vec::new();
    let mut classes = Vec::new();
    let mut seen_dirs = HashSet::new();
    let root_meta = std::fs::metadata(root).map_err(|e| Error::io(root, "stat", None, e))?;
    seen_dirs.insert((root_meta.dev(), root_meta.ino()));
    // (directory, its path relative to ROOT, its class)
    let mut stack = vec![(root.to_path_buf(), PathBuf::new(), None::<String>)];
    let mut empty = 0u64;
    while let Some((dir, rel, class)) = stack.pop() {
        let entries =
            std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, "list directory", None, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&dir, "list directory", None, e))?;
            let name = entry.file_name();
            if skipped_name(&name) {
                continue;
            }
            let path = entry.path();
            // d_type says most; a link (or an unknown type) is stat'ed through.
            let ft = entry
                .file_type()
                .map_err(|e| Error::io(&path, "stat", None, e))?;
            let meta = if ft.is_symlink() {
                match std::fs::metadata(&path) {
                    Ok(m) => m,
                    Err(_) => continue, // a dangling link: no file to read
                }
            } else {
                entry
                    .metadata()
                    .map_err(|e| Error::io(&path, "stat", None, e))?
            };
            if meta.is_dir() {
                if !seen_dirs.insert((meta.dev(), meta.ino())) {
                    continue; // a link back into the tree
                }
                let sub = rel.join(&name);
                let class = match &class {
                    Some(c) => Some(c.clone()),
                    None => {
                        let c = name.to_string_lossy().into_owned();
                        classes.push(c.clone());
                        Some(c)
                    }
                };
                stack.push((path, sub, class));
            } else if meta.is_file() {
                if meta.len() == 0 {
                    empty += 1;
                    notice::once(
                        &format!("empty:{}", path.display()),
                        &format!(
                            "skipping {}: it is empty (0 bytes, no record)",
                            path.display()
                        ),
                    );
                    continue;
                }
                found.push(Found {
                    class: class.clone(),
                    dir: rel.as_os_str().as_bytes().to_vec(),
                    name: name.as_bytes().to_vec(),
                    path,
                    size: meta.len(),
                });
            } else {
                notice::once(
                    &format!("not-regular:{}", path.display()),
                    &format!(
                        "skipping {}: it is {}, not a regular file",
                        path.display(),
                        io::file_type_name(&meta.file_type())
                    ),
                );
            }
        }
    }
    classes.sort();
    let labelled = !classes.is_empty();
    if labelled {
        let loose = found.iter().filter(|f| f.class.is_none()).count();
        if loose > 0 {
            notice::once(
                &format!("loose:{}", root.display()),
                &format!(
                    "skipping {loose} file(s) directly in {}: with class directories beside them \
                     they belong to no class (ImageFolder's rule)",
                    root.display()
                ),
            );
            found.retain(|f| f.class.is_some());
        }
    }
    // ImageFolder's order: class, then directory path, then name, bytewise.
    found.sort_unstable_by(|a, b| (&a.class, &a.dir, &a.name).cmp(&(&b.class, &b.dir, &b.name)));
    if found.is_empty() {
        return Err(Error::BadInput {
            path: root.into(),
            offset: None,
            what: if empty > 0 {
                format!("no records: the tree's {empty} file(s) are all empty")
            } else {
                "no records: the tree holds no files".into()
            },
        });
    }
    let labels = labelled.then(|| {
        found
            .iter()
            .map(|f| {
                let c = f.class.as_deref().expect("labelled files have a class");
                classes
                    .binary_search_by(|x| x.as_str().cmp(c))
                    .expect("a listed class") as u32
            })
            .collect()
    });
    Ok(Listing {
        files: found.into_iter().map(|f| (f.path, f.size)).collect(),
        labels,
        classes,
    })
}

fn manifest(path: &Path) -> Result<Listing> {
    use std::os::unix::ffi::OsStrExt;
    let text = std::fs::read(path).map_err(|e| Error::io(path, "read", None, e))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let bad = |offset: usize, what: String| Error::BadInput {
        path: path.into(),
        offset: Some(offset as u64),
        what,
    };
    let mut files = Vec::new();
    let mut firsts: Vec<Option<String>> = Vec::new();
    let mut at = 0usize;
    for line in text.split(|&b| b == b'\n') {
        let start = at;
        at += line.len() + 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) || line.starts_with(b"#") {
            continue;
        }
        if line.contains(&0) {
            return Err(bad(
                start,
                "a NUL byte in a path: is this a manifest (a text file of paths, one per line)?"
                    .into(),
            ));
        }
        let rel = Path::new(std::ffi::OsStr::from_bytes(line));
        let full = if rel.is_absolute() {
            rel.to_path_buf()
        } else {
            base.join(rel)
        };
        let meta = std::fs::metadata(&full).map_err(|e| {
            bad(
                start,
                format!("line names {}, which cannot be opened: {e}", full.display()),
            )
        })?;
        if !meta.is_file() {
            return Err(bad(
                start,
                format!(
                    "line names {}, which is {}, not a regular file",
                    full.display(),
                    io::file_type_name(&meta.file_type())
                ),
            ));
        }
        if meta.len() == 0 {
            return Err(bad(
                start,
                format!(
                    "line names {}, an empty file (a record of no bytes)",
                    full.display()
                ),
            ));
        }
        let mut comps = rel.components();
        let first = match (rel.is_absolute(), comps.next(), comps.next()) {
            (false, Some(std::path::Component::Normal(c)), Some(_)) => {
                Some(c.to_string_lossy().into_owned())
            }
            _ => None,
        };
        firsts.push(first);
        files.push((full, meta.len()));
    }
    if files.is_empty() {
        return Err(bad(0, "the manifest lists no files".into()));
    }
    let (labels, classes) = if firsts.iter().all(Option::is_some) {
        let mut classes: Vec<String> = firsts.iter().flatten().cloned().collect();
        classes.sort();
        classes.dedup();
        let labels = firsts
            .iter()
            .flatten()
            .map(|c| classes.binary_search(c).expect("a listed class") as u32)
            .collect();
        (Some(labels), classes)
    } else {
        (None, Vec::new())
    };
    Ok(Listing {
        files,
        labels,
        classes,
    })
}
