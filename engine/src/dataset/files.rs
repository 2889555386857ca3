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
//!
//! A tree's listing (every file's path and size, the classes and labels) is saved as a
//! sidecar, `ROOT.ridx` beside the tree (or in the cache directory when that is not
//! writable), with the identity (mtime, ctime, inode, device) of every directory walked:
//! a later run stats the directories only, not every file, and walks again when any
//! directory changed (a file added, removed or renamed changes its directory). A file
//! rewritten in place with another size is caught when it is read (the reader refuses a
//! file of another size than listed). All integers little endian:
//!
//! ```text
//!  0  8  magic "RIFFLFLS"
//!  8  4  version (1)
//! 12  4  flags: bit 0 = labelled
//! 16  8  directories D, then classes C, then files N (8 bytes each)
//! 40  .. D x (u32 length, path relative to ROOT, mtime s, mtime ns, ctime s, ctime ns,
//!          inode, device: 8 bytes each)
//!     .. C x (u32 length, name)
//!     .. N x (u32 length, path relative to ROOT, u64 size, u32 label)
//!     4  CRC32C of every byte before it
//! ```

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::skipped_name;
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

/// Lists the dataset at `path`: a directory tree (from its sidecar when that is current),
/// or a manifest of paths.
pub(crate) fn list(path: &Path) -> Result<Listing> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, "open", None, e))?;
    if meta.is_dir() {
        let (beside, cached) = super::index::sidecar_paths(path);
        let mut stale = None;
        for candidate in [&beside, &cached] {
            // Through the door: a FIFO, device or link planted at the sidecar's name is
            // refused (and the tree walked again), never waited on or read without end.
            match crate::door::read_meta(
                candidate,
                crate::door::cap::LISTING,
                crate::door::Follow::No,
            ) {
                Ok(Some(bytes)) => match decode(&bytes, path) {
                    Ok(listing) => return Ok(listing),
                    Err(why) => stale = Some(format!("{}: {why}", candidate.display())),
                },
                Ok(None) => {}
                Err(e) => stale = Some(format!("cannot read: {e}")),
            }
        }
        let (listing, dirs) = walk(path)?;
        let bytes = encode(&listing, &dirs, path);
        let saved = [&beside, &cached].into_iter().any(|p| {
            p.parent()
                .is_none_or(|d| std::fs::create_dir_all(d).is_ok())
                && crate::scratch::write_atomic(p, &bytes).is_ok()
        });
        if !saved {
            notice::once(
                &format!("listing-unsaved:{}", path.display()),
                &format!(
                    "could not save the listing of {} beside it or in the cache; it will be walked again next time",
                    path.display()
                ),
            );
        }
        if let Some(why) = stale {
            notice::once(
                &format!("listing-rebuilt:{}", path.display()),
                &format!("walked the tree again: its listing was stale ({why})"),
            );
        }
        Ok(listing)
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

/// A file found by the walk: its first-level directory (None: directly in ROOT), its
/// directory relative to ROOT, its name, and its size.
struct Found {
    class: Option<String>,
    dir: Vec<u8>,
    name: Vec<u8>,
    path: PathBuf,
    size: u64,
}

/// A directory's identity: its path relative to ROOT, mtime and ctime (s, ns), inode,
/// device.
type DirId = (Vec<u8>, [i64; 4], u64, u64);

fn dir_id(rel: &Path, m: &std::fs::Metadata) -> DirId {
    use std::os::unix::ffi::OsStrExt;
    (
        rel.as_os_str().as_bytes().to_vec(),
        [m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()],
        m.ino(),
        m.dev(),
    )
}

/// What a walk of a tree found: its files (non-empty, regular), the identity of every
/// directory, the classes (first-level directories, unsorted), and the empty files skipped.
struct Walked {
    found: Vec<Found>,
    dirs: Vec<DirId>,
    classes: Vec<String>,
    empty: u64,
}

/// Walks the tree at `root`, following directory links once.
fn walk_tree(root: &Path) -> Result<Walked> {
    use std::os::unix::ffi::OsStrExt;
    let mut found = Vec::new();
    let mut dirs = Vec::new();
    let mut classes = Vec::new();
    let mut seen_dirs = HashSet::new();
    let root_meta = std::fs::metadata(root).map_err(|e| Error::io(root, "stat", None, e))?;
    seen_dirs.insert((root_meta.dev(), root_meta.ino()));
    dirs.push(dir_id(Path::new(""), &root_meta));
    // (directory, its path relative to ROOT, its class)
    let mut stack = vec![(root.to_path_buf(), PathBuf::new(), None::<String>)];
    let mut empty = Vec::new();
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
                dirs.push(dir_id(&sub, &meta));
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
                    empty.push(path);
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
    empty.sort();
    super::notice_empty(&empty.iter().map(PathBuf::as_path).collect::<Vec<_>>());
    Ok(Walked {
        found,
        dirs,
        classes,
        empty: empty.len() as u64,
    })
}

/// Lists the tree at `root`: its files in ImageFolder's order, labelled by class when it
/// has class directories, and the identity of every directory walked.
fn walk(root: &Path) -> Result<(Listing, Vec<DirId>)> {
    let Walked {
        mut found,
        dirs,
        mut classes,
        empty,
    } = walk_tree(root)?;
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
    let listing = Listing {
        files: found.into_iter().map(|f| (f.path, f.size)).collect(),
        labels,
        classes,
    };
    Ok((listing, dirs))
}

const MAGIC: &[u8; 8] = b"RIFFLFLS";

/// Whether `head` starts a listing sidecar.
pub(crate) fn is_magic(head: &[u8; 8]) -> bool {
    head == MAGIC
}
const VERSION: u32 = 1;

fn encode(l: &Listing, dirs: &[DirId], root: &Path) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut b = Vec::with_capacity(64 + l.files.len() * 48);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&(l.labels.is_some() as u32).to_le_bytes());
    for n in [dirs.len(), l.classes.len(), l.files.len()] {
        b.extend_from_slice(&(n as u64).to_le_bytes());
    }
    let bytes = |b: &mut Vec<u8>, s: &[u8]| {
        b.extend_from_slice(&(s.len() as u32).to_le_bytes());
        b.extend_from_slice(s);
    };
    for (rel, times, ino, dev) in dirs {
        bytes(&mut b, rel);
        for t in times {
            b.extend_from_slice(&t.to_le_bytes());
        }
        b.extend_from_slice(&ino.to_le_bytes());
        b.extend_from_slice(&dev.to_le_bytes());
    }
    for c in &l.classes {
        bytes(&mut b, c.as_bytes());
    }
    for (i, (path, size)) in l.files.iter().enumerate() {
        let rel = path.strip_prefix(root).unwrap_or(path);
        bytes(&mut b, rel.as_os_str().as_bytes());
        b.extend_from_slice(&size.to_le_bytes());
        let label = l.labels.as_ref().map_or(0, |v| v[i]);
        b.extend_from_slice(&label.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// A cursor over a sidecar's bytes; every read is bounds-checked.
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        if n > self.0.len() {
            return Err("it ends early (corrupt listing)".into());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn str(&mut self) -> std::result::Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

/// The listing a sidecar holds, if it is intact and every directory it walked is as it was.
fn decode(all: &[u8], root: &Path) -> std::result::Result<Listing, String> {
    use std::os::unix::ffi::OsStrExt;
    if all.len() < 44 || &all[..8] != MAGIC {
        return Err("not a riffle listing".into());
    }
    let (body, crc) = all.split_at(all.len() - 4);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err("its checksum does not match (corrupt listing)".into());
    }
    let mut r = Bytes(&body[8..]);
    let version = r.u32()?;
    if version != VERSION {
        return Err(format!("version {version}, this riffle writes {VERSION}"));
    }
    let labelled = r.u32()? & 1 == 1;
    let (nd, nc, nf) = (r.u64()?, r.u64()?, r.u64()?);
    // Each entry takes at least 4 bytes: counts past what the bytes hold are corrupt.
    if [nd, nc, nf].iter().any(|&n| n > body.len() as u64 / 4) {
        return Err("its counts are impossible (corrupt listing)".into());
    }
    for _ in 0..nd {
        let rel = Path::new(std::ffi::OsStr::from_bytes(r.str()?)).to_path_buf();
        let mut times = [0i64; 4];
        for t in &mut times {
            *t = r.u64()? as i64;
        }
        let (ino, dev) = (r.u64()?, r.u64()?);
        let dir = root.join(&rel);
        let now = std::fs::metadata(&dir)
            .map_err(|e| format!("{} cannot be read now: {e}", dir.display()))?;
        if dir_id(&rel, &now) != (rel.as_os_str().as_bytes().to_vec(), times, ino, dev) {
            return Err(format!("{} changed since it was listed", dir.display()));
        }
    }
    let mut classes = Vec::with_capacity(nc as usize);
    for _ in 0..nc {
        classes.push(String::from_utf8_lossy(r.str()?).into_owned());
    }
    let mut files = Vec::with_capacity(nf as usize);
    let mut labels = Vec::with_capacity(if labelled { nf as usize } else { 0 });
    for _ in 0..nf {
        let rel = std::ffi::OsStr::from_bytes(r.str()?);
        let size = r.u64()?;
        let label = r.u32()?;
        if size == 0 || (labelled && label as usize >= classes.len()) {
            return Err("an impossible entry (corrupt listing)".into());
        }
        files.push((root.join(rel), size));
        if labelled {
            labels.push(label);
        }
    }
    if !r.0.is_empty() || files.is_empty() {
        return Err("its length does not match its counts (corrupt listing)".into());
    }
    Ok(Listing {
        files,
        labels: labelled.then_some(labels),
        classes,
    })
}

fn manifest(path: &Path) -> Result<Listing> {
    use std::os::unix::ffi::OsStrExt;
    // A manifest the user named: a link is followed, but it must be a regular file.
    let text = crate::door::read_meta(path, crate::door::cap::LISTING, crate::door::Follow::Yes)?
        .ok_or_else(|| Error::io(path, "read", None, std::io::ErrorKind::NotFound.into()))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn file(p: &Path, n: usize) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, vec![7u8; n]).unwrap();
    }

    fn names(l: &Listing, root: &Path) -> Vec<String> {
        l.files
            .iter()
            .map(|(p, _)| p.strip_prefix(root).unwrap().display().to_string())
            .collect()
    }

    /// ImageFolder's rule: classes are the sorted first-level directories (an empty one
    /// included), samples class by class in sorted walk order; files loose in the root,
    /// hidden entries, empty files and a link back up the tree are left out.
    #[test]
    fn a_tree_lists_as_imagefolder_does() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let root = dir.path().join("t");
        file(&root.join("b/x/1"), 3);
        file(&root.join("b/2"), 4);
        file(&root.join("b/x-y/3"), 5);
        file(&root.join("a/9"), 6);
        file(&root.join("a/.hidden"), 6);
        file(&root.join("a/empty"), 0);
        file(&root.join("loose"), 2);
        std::fs::create_dir_all(root.join("c")).unwrap();
        std::os::unix::fs::symlink(&root, root.join("b/up")).unwrap();
        let (l, dirs) = walk(&root).unwrap();
        assert_eq!(l.classes, ["a", "b", "c"]);
        // os.walk sorted by directory path: b, b/x, b/x-y.
        assert_eq!(names(&l, &root), ["a/9", "b/2", "b/x/1", "b/x-y/3"]);
        assert_eq!(l.labels, Some(vec![0, 1, 1, 1]));
        assert_eq!(
            l.files.iter().map(|f| f.1).collect::<Vec<_>>(),
            [6, 4, 3, 5]
        );
        assert_eq!(dirs.len(), 6, "root, a, b, b/x, b/x-y, c");
        // A flat directory has no labels.
        let (flat, _) = walk(&root.join("b/x")).unwrap();
        assert_eq!(flat.labels, None);
    }

    /// The sidecar is used while no directory changed (a file rewritten in place with
    /// another size is not seen: the reader catches that), rebuilt when one did or when it
    /// is corrupt, and gives the walk's listing.
    #[test]
    fn the_listing_sidecar_is_used_until_a_directory_changes() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let root = dir.path().join("t");
        for i in 0..20 {
            file(&root.join(format!("c{}/{i:02}", i % 3)), 10 + i);
        }
        let first = list(&root).unwrap();
        let side = super::super::index::sidecar_paths(&root).0;
        assert!(side.exists());
        // Same-directory rewrite: the sidecar still answers (the old size proves it).
        file(&root.join("c0/00"), 99);
        let again = list(&root).unwrap();
        assert_eq!(again.files, first.files);
        assert_eq!(
            (again.labels.clone(), again.classes.clone()),
            (first.labels.clone(), first.classes.clone())
        );
        // A new file changes its directory: walked again.
        file(&root.join("c1/zz"), 5);
        let grown = list(&root).unwrap();
        assert_eq!(grown.files.len(), 21);
        assert_eq!(grown.files[0].1, 99);
        // A corrupt sidecar (one bit) is not used.
        let mut bytes = std::fs::read(&side).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 1;
        std::fs::write(&side, &bytes).unwrap();
        assert!(decode(&bytes, &root).unwrap_err().contains("checksum"));
        let rebuilt = list(&root).unwrap();
        assert_eq!(rebuilt.files, grown.files);
        // Cut anywhere, it is refused, never a panic.
        let good = std::fs::read(&side).unwrap();
        for cut in (0..good.len()).step_by(7) {
            assert!(decode(&good[..cut], &root).is_err());
        }
    }

    /// A manifest: paths relative to it, comments and blank lines skipped, labels by the
    /// first directory; a line naming no file is an error at its byte offset.
    #[test]
    fn a_manifest_lists_its_lines() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let d = dir.path();
        file(&d.join("dog/1.jpg"), 3);
        file(&d.join("cat/2.jpg"), 4);
        std::fs::write(
            d.join("m.txt"),
            "# samples\ndog/1.jpg\n\ncat/2.jpg\r\ndog/1.jpg\n",
        )
        .unwrap();
        let l = list(&d.join("m.txt")).unwrap();
        assert_eq!(l.files.len(), 3);
        assert_eq!(l.classes, ["cat", "dog"]);
        assert_eq!(l.labels, Some(vec![1, 0, 1]));
        std::fs::write(d.join("bad.txt"), "dog/1.jpg\nnope.jpg\n").unwrap();
        let e = list(&d.join("bad.txt")).unwrap_err().to_string();
        assert!(
            e.contains("bad.txt") && e.contains("10") && e.contains("nope.jpg"),
            "{e}"
        );
    }
}
