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
//! Hidden entries (a name starting with `.`) and riffle's own sidecars are skipped, FIFOs,
//! sockets and devices are skipped with a notice, and empty files too (a record of no
//! bytes).
//!
//! **A tree never leads out of its root.** A symbolic link in the tree is followed where
//! it resolves inside the tree, file or directory, as ImageFolder follows links
//! (`os.walk(followlinks=True)`): a directory reached by two links is walked twice, its
//! files are records of both paths and labels (a link back up to a directory above it is
//! not walked: a cycle). The record keeps the link's path (its name, order and label) and
//! the path it resolved to under the root, with no link on the way; the reader opens that
//! path beneath the root (`door::Root::open_beneath`: `openat2` with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS`) and checks the file is still the one listed (device, inode,
//! size). A link that leads out of the tree is left out, with one notice naming the first
//! (files kept elsewhere are listed in a manifest, whose paths are the user's own). A link
//! or `..` planted in the tree after it was listed, or a file swapped at a listed name, is
//! refused with its path when read, never served.
//!
//! A tree's listing (every file's path and size, the classes and labels) is saved as a
//! sidecar, `ROOT.ridx` beside the tree (or in the cache directory when that is not
//! writable), with the identity (mtime, ctime, inode, device) of every directory walked. A
//! later run takes it while it is current ([`super::freshness`]): every listed file has
//! its device, inode and size, and every directory that changed holds the same data
//! entries (a hidden entry, such as riffle's own scratch, does not count). Otherwise the
//! tree is walked again: a file appended or truncated in place, or another file at a
//! listed name, makes the next open list the tree again, while a run that has the tree
//! open refuses such a file when it reads it. All integers little endian:
//!
//! ```text
//!  0  8  magic "RIFFLFLS"
//!  8  4  version (2)
//! 12  4  flags: bit 0 = labelled
//! 16  8  directories D, then classes C, then files N (8 bytes each)
//! 40  .. D x (u32 length, path relative to ROOT, mtime s, mtime ns, ctime s, ctime ns,
//!          inode, device: 8 bytes each)
//!     .. C x (u32 length, name)
//!     .. N x (u32 length, path relative to ROOT as listed, u64 size, u32 label,
//!             u32 length, its path under ROOT with no link when a link led elsewhere
//!             (empty: the path as listed), inode, device: 8 bytes each)
//!     4  CRC32C of every byte before it
//! ```

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::skipped_name;
use crate::{io, notice, Error, Result};

/// What a `files` dataset lists.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// Each record's file, in record order.
    pub files: Vec<Listed>,
    /// Each record's label (the index of its class in `classes`), when the layout gives
    /// labels.
    pub labels: Option<Vec<u32>>,
    /// Class names in label order.
    pub classes: Vec<String>,
}

/// One file of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Listed {
    /// Its path as listed (through the links the walk followed, as ImageFolder names it).
    pub path: PathBuf,
    /// Its size when listed.
    pub size: u64,
    /// For a file of a tree: its path under the root with no link on the way (what a link
    /// inside the tree resolved to), by which it is opened beneath the root.
    pub under: Option<PathBuf>,
    /// Its (device, inode) when listed.
    pub identity: (u64, u64),
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
                Ok(Some(bytes)) => {
                    let fresh = decode(&bytes, path).and_then(|(listing, dirs)| {
                        super::freshness::check(&listing, &dirs, path).map(|now| (listing, now))
                    });
                    match fresh {
                        Ok((listing, None)) => return Ok(listing),
                        Ok((listing, Some(dirs))) => {
                            // Only entries that are never data changed (riffle's scratch,
                            // hidden files): the listing holds; its directories' new times
                            // are saved so the next run need not look again.
                            let bytes = encode(&listing, &dirs, path);
                            let _ = crate::scratch::write_atomic(candidate, &bytes);
                            return Ok(listing);
                        }
                        Err(why) => stale = Some(format!("{}: {why}", candidate.display())),
                    }
                }
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
/// directory relative to ROOT (as named, through links), its name, and the file.
struct Found {
    class: Option<String>,
    dir: Vec<u8>,
    name: Vec<u8>,
    file: Listed,
}

/// A directory's identity: its path relative to ROOT, mtime and ctime (s, ns), inode,
/// device.
pub(super) type DirId = (Vec<u8>, [i64; 4], u64, u64);

pub(super) fn dir_id(rel: &Path, m: &std::fs::Metadata) -> DirId {
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

/// A directory the walk has yet to list: its path as named (through links), its path
/// relative to ROOT as named, its path under ROOT with no link, its class, and the
/// (device, inode) of it and every directory above it (a link back up is not walked).
struct ToWalk {
    dir: PathBuf,
    rel: PathBuf,
    under: PathBuf,
    class: Option<String>,
    above: Vec<(u64, u64)>,
}

/// Directory visits a walk makes at most: links inside a tree may reach a directory by
/// many paths (each walked, as ImageFolder does), and a lattice of them would multiply.
const MAX_DIR_VISITS: usize = 1 << 22;

/// Where a symbolic link in a tree leads.
enum Link {
    /// Nowhere (dangling, or a loop of links): no file to read.
    Dangling,
    /// Out of the tree (its resolved path).
    Out(PathBuf),
    /// Inside the tree: what it resolves to, and its path under ROOT with no link.
    In(std::fs::Metadata, PathBuf),
}

fn follow(link: &Path, real_root: &Path) -> Link {
    let Ok(real) = std::fs::canonicalize(link) else {
        return Link::Dangling;
    };
    let Ok(under) = real.strip_prefix(real_root) else {
        return Link::Out(real);
    };
    match std::fs::metadata(&real) {
        Ok(m) => Link::In(m, under.to_path_buf()),
        Err(_) => Link::Dangling,
    }
}

/// What a directory entry at `path` is, and its path under ROOT with no link (`under` is
/// its directory's): `None` for a dangling link, or a link out of the tree (noted in
/// `out`, with where it leads).
fn resolve(
    entry: &std::fs::DirEntry,
    path: &Path,
    under: &Path,
    real_root: &Path,
    out: &mut Vec<(PathBuf, PathBuf)>,
) -> Result<Option<(std::fs::Metadata, PathBuf)>> {
    // d_type says most; a link (or an unknown type) is resolved.
    let ft = entry
        .file_type()
        .map_err(|e| Error::io(path, "stat", None, e))?;
    if !ft.is_symlink() {
        let m = entry
            .metadata()
            .map_err(|e| Error::io(path, "stat", None, e))?;
        return Ok(Some((m, under.join(entry.file_name()))));
    }
    Ok(match follow(path, real_root) {
        Link::In(m, under) => Some((m, under)),
        Link::Dangling => None, // no file to read
        Link::Out(to) => {
            out.push((path.to_path_buf(), to));
            None
        }
    })
}

/// Walks the tree at `root`. A symbolic link is followed where it leads inside the tree
/// (a directory reached again by another path is walked again, as ImageFolder's
/// `os.walk(followlinks=True)` does; a link back up to a directory above it is not), and
/// left out with a notice where it leads out of the tree: a tree's files are read beneath
/// its root.
fn walk_tree(root: &Path) -> Result<Walked> {
    use std::os::unix::ffi::OsStrExt;
    let mut found = Vec::new();
    let mut dirs = Vec::new();
    let mut classes = Vec::new();
    let root_meta = std::fs::metadata(root).map_err(|e| Error::io(root, "stat", None, e))?;
    let real_root = std::fs::canonicalize(root).map_err(|e| Error::io(root, "resolve", None, e))?;
    dirs.push(dir_id(Path::new(""), &root_meta));
    let mut stack = vec![ToWalk {
        dir: root.to_path_buf(),
        rel: PathBuf::new(),
        under: PathBuf::new(),
        class: None,
        above: vec![(root_meta.dev(), root_meta.ino())],
    }];
    let (mut empty, mut visits) = (Vec::new(), 0usize);
    let mut out: Vec<(PathBuf, PathBuf)> = Vec::new();
    while let Some(w) = stack.pop() {
        visits += 1;
        if visits > MAX_DIR_VISITS {
            return Err(Error::BadInput {
                path: root.into(),
                offset: None,
                what: format!(
                    "its links reach more than {MAX_DIR_VISITS} directories: refused rather \
                     than walked without end"
                ),
            });
        }
        let entries =
            std::fs::read_dir(&w.dir).map_err(|e| Error::io(&w.dir, "list directory", None, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&w.dir, "list directory", None, e))?;
            let name = entry.file_name();
            if skipped_name(&name) {
                continue;
            }
            let path = entry.path();
            let Some((meta, under)) = resolve(&entry, &path, &w.under, &real_root, &mut out)?
            else {
                continue;
            };
            if meta.is_dir() {
                let id = (meta.dev(), meta.ino());
                if w.above.contains(&id) {
                    continue; // a link back up the tree: a cycle
                }
                let sub = w.rel.join(&name);
                dirs.push(dir_id(&sub, &meta));
                let class = w.class.clone().or_else(|| {
                    let c = name.to_string_lossy().into_owned();
                    classes.push(c.clone());
                    Some(c)
                });
                let mut above = w.above.clone();
                above.push(id);
                stack.push(ToWalk {
                    dir: path,
                    rel: sub,
                    under,
                    class,
                    above,
                });
            } else if meta.is_file() {
                if meta.len() == 0 {
                    empty.push(path);
                    continue;
                }
                found.push(Found {
                    class: w.class.clone(),
                    dir: w.rel.as_os_str().as_bytes().to_vec(),
                    name: name.as_bytes().to_vec(),
                    file: Listed {
                        path,
                        size: meta.len(),
                        under: Some(under),
                        identity: (meta.dev(), meta.ino()),
                    },
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
    if let Some((first, to)) = out.first() {
        notice::once(
            &format!("links-out:{}", root.display()),
            &format!(
                "skipping {} symbolic link(s) in {} that lead out of the tree (the first: {} \
                 -> {}): a tree's files are read beneath its root (list files kept elsewhere \
                 in a manifest)",
                out.len(),
                root.display(),
                first.display(),
                to.display()
            ),
        );
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
        files: found.into_iter().map(|f| f.file).collect(),
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
const VERSION: u32 = 2;

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
    for (i, f) in l.files.iter().enumerate() {
        let rel = f.path.strip_prefix(root).unwrap_or(&f.path);
        bytes(&mut b, rel.as_os_str().as_bytes());
        b.extend_from_slice(&f.size.to_le_bytes());
        let label = l.labels.as_ref().map_or(0, |v| v[i]);
        b.extend_from_slice(&label.to_le_bytes());
        // Where a link led: its path under ROOT (none when it is the path as listed).
        let under = f
            .under
            .as_deref()
            .filter(|u| *u != rel)
            .unwrap_or(Path::new(""));
        bytes(&mut b, under.as_os_str().as_bytes());
        b.extend_from_slice(&f.identity.1.to_le_bytes());
        b.extend_from_slice(&f.identity.0.to_le_bytes());
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

/// The listing a sidecar holds and the directories it walked, if it is intact (whether it
/// is current is [`super::freshness::check`]'s question).
fn decode(all: &[u8], root: &Path) -> std::result::Result<(Listing, Vec<DirId>), String> {
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
    let mut dirs = Vec::with_capacity(nd as usize);
    for _ in 0..nd {
        let rel = r.str()?.to_vec();
        let mut times = [0i64; 4];
        for t in &mut times {
            *t = r.u64()? as i64;
        }
        dirs.push((rel, times, r.u64()?, r.u64()?));
    }
    let mut classes = Vec::with_capacity(nc as usize);
    for _ in 0..nc {
        classes.push(String::from_utf8_lossy(r.str()?).into_owned());
    }
    let mut files = Vec::with_capacity(nf as usize);
    let mut labels = Vec::with_capacity(if labelled { nf as usize } else { 0 });
    for _ in 0..nf {
        let rel = Path::new(std::ffi::OsStr::from_bytes(r.str()?));
        let size = r.u64()?;
        let label = r.u32()?;
        let under = Path::new(std::ffi::OsStr::from_bytes(r.str()?));
        let (ino, dev) = (r.u64()?, r.u64()?);
        if size == 0 || (labelled && label as usize >= classes.len()) {
            return Err("an impossible entry (corrupt listing)".into());
        }
        let under = if under.as_os_str().is_empty() {
            rel
        } else {
            under
        };
        files.push(Listed {
            path: root.join(rel),
            size,
            under: Some(under.to_path_buf()),
            identity: (dev, ino),
        });
        if labelled {
            labels.push(label);
        }
    }
    if !r.0.is_empty() || files.is_empty() {
        return Err("its length does not match its counts (corrupt listing)".into());
    }
    let listing = Listing {
        files,
        labels: labelled.then_some(labels),
        classes,
    };
    Ok((listing, dirs))
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
        files.push(Listed {
            path: full,
            size: meta.len(),
            under: None,
            identity: (meta.dev(), meta.ino()),
        });
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
            .map(|f| f.path.strip_prefix(root).unwrap().display().to_string())
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
            l.files.iter().map(|f| f.size).collect::<Vec<_>>(),
            [6, 4, 3, 5]
        );
        assert_eq!(dirs.len(), 6, "root, a, b, b/x, b/x-y, c");
        // A flat directory has no labels.
        let (flat, _) = walk(&root.join("b/x")).unwrap();
        assert_eq!(flat.labels, None);
    }

    /// Links inside the tree are followed as ImageFolder follows them (issue 30 D18: a
    /// class directory linked to another is a class of its own, its files records of it),
    /// each record keeping the path it resolved to under the root; a link out of the tree
    /// is left out; the sidecar gives the same listing back.
    #[test]
    fn links_inside_the_tree_are_followed_and_links_out_left_out() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let root = dir.path().join("t");
        for i in 0..3 {
            file(&root.join(format!("a/{i}")), 10 + i);
        }
        for i in 0..4 {
            file(&root.join(format!("c/{i}")), 20 + i);
        }
        file(&dir.path().join("secret/s"), 7);
        let link = |to: &str, at: &str| std::os::unix::fs::symlink(to, root.join(at)).unwrap();
        link("a", "b");
        link("../a/0", "c/9");
        link(dir.path().join("secret").to_str().unwrap(), "d");
        link("../../secret/s", "c/out");
        let (l, _) = walk(&root).unwrap();
        assert_eq!(l.classes, ["a", "b", "c"]);
        assert_eq!(
            names(&l, &root),
            ["a/0", "a/1", "a/2", "b/0", "b/1", "b/2", "c/0", "c/1", "c/2", "c/3", "c/9"]
        );
        assert_eq!(l.labels, Some(vec![0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2]));
        let under: Vec<_> = l.files.iter().map(|f| f.under.clone().unwrap()).collect();
        assert_eq!(under[3], Path::new("a/0"), "b/0 is read as a/0");
        assert_eq!(under[10], Path::new("a/0"), "c/9 is read as a/0");
        assert_eq!(l.files[10].identity, l.files[0].identity);
        assert_eq!(l.files[10].size, 10);
        // Written and read back: the same listing.
        list(&root).unwrap();
        let again = list(&root).unwrap();
        assert_eq!(again.files, l.files);
    }

    /// The sidecar is used while the tree is as listed, rebuilt when a file changed in
    /// place (issue 30 D16) or a directory gained a file, or when it is corrupt, and gives
    /// the walk's listing; a hidden entry (riffle's scratch) is no change (D29).
    #[test]
    fn the_listing_sidecar_is_used_until_the_tree_changes() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let root = dir.path().join("t");
        for i in 0..20 {
            file(&root.join(format!("c{}/{i:02}", i % 3)), 10 + i);
        }
        let first = list(&root).unwrap();
        let side = super::super::index::sidecar_paths(&root).0;
        assert!(side.exists());
        // Unchanged: the sidecar answers, with the walk's listing.
        let (saved, dirs) = decode(&std::fs::read(&side).unwrap(), &root).unwrap();
        assert_eq!(saved.files, first.files);
        assert_eq!(
            super::super::freshness::check(&saved, &dirs, &root),
            Ok(None)
        );
        // A scratch directory made and left in the tree, a hidden file: no change.
        std::fs::create_dir(root.join(".riffle-scratch-two-pass-1-x")).unwrap();
        file(&root.join("c2/.tmp"), 3);
        let now = super::super::freshness::check(&saved, &dirs, &root).unwrap();
        assert!(
            now.is_some(),
            "the directories' new times are given to save"
        );
        assert_eq!(list(&root).unwrap().files, first.files);
        // Rewritten in place with another size: walked again, the new size listed.
        file(&root.join("c0/00"), 99);
        let why = super::super::freshness::check(&saved, &dirs, &root).unwrap_err();
        assert!(
            why.contains("changed in place") && why.contains("00"),
            "{why}"
        );
        let again = list(&root).unwrap();
        assert_eq!(again.files.len(), first.files.len());
        assert_eq!(again.files[0].size, 99);
        assert_eq!(
            (again.labels.clone(), again.classes.clone()),
            (first.labels.clone(), first.classes.clone())
        );
        // A new file changes its directory: walked again.
        file(&root.join("c1/zz"), 5);
        let grown = list(&root).unwrap();
        assert_eq!(grown.files.len(), 21);
        assert_eq!(grown.files[0].size, 99);
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
