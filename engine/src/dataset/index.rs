//! The offset index of a variable-length file (the LIRS paper's location generator): the
//! start of every record, found by one sequential scan, kept in memory as one u64 per
//! record, and saved beside the data so later runs need not scan again.
//!
//! The sidecar (`DATA.ridx`, or in the cache directory when the data's directory is not
//! writable), all integers little endian:
//!
//! ```text
//!  0  8  magic "RIFFLIDX"
//!  8  4  version (1)
//! 12  4  format: 1 lines, 2 tfrecord
//! 16  8  format parameter: lines: separator byte | header lines << 8; tfrecord: 0
//! 24  8  source size in bytes
//! 32  8  source mtime, seconds
//! 40  8  source mtime, nanoseconds
//! 48  8  source inode
//! 56  8  record count N
//! 64  8  flags: bit 0 = the last line has no separator
//! 72  8 x (N + 1)  record starts, then the end of the last record's frame
//!  .. 4  CRC32C of every byte before it
//! ```
//!
//! An index whose source size, mtime or inode differs from the file's, or whose checksum
//! fails, is never used: it is rebuilt (with a notice) or refused.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::lines::LinesScanner;
use crate::format::tfrecord::TfRecordScanner;
use crate::format::{Format, Scanner};
use crate::io::{self, DataFile, IoConfig, ScanReport};
use crate::{notice, Error, Result};

const MAGIC: &[u8; 8] = b"RIFFLIDX";
const VERSION: u32 = 1;
const HEADER: usize = 72;

/// Record starts of one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffsetIndex {
    /// Frame starts, plus the end sentinel: N + 1 entries.
    pub offsets: Vec<u64>,
    /// Whether the last line lacks a separator.
    pub last_unterminated: bool,
}

impl OffsetIndex {
    /// Records indexed.
    pub fn len(&self) -> u64 {
        self.offsets.len().saturating_sub(1) as u64
    }

    /// Whether there are no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of memory the index holds.
    pub fn memory_bytes(&self) -> u64 {
        (self.offsets.capacity() * 8) as u64
    }
}

/// How the index of a file was obtained.
#[derive(Clone, Debug, PartialEq)]
pub enum IndexOrigin {
    /// A valid sidecar was loaded.
    Loaded(PathBuf),
    /// There was none; one was built.
    Built {
        /// The scan that built it.
        scan: ScanSummary,
        /// Where it was saved, if it could be.
        saved: Option<PathBuf>,
    },
    /// The sidecar was stale or corrupt; it was rebuilt.
    Rebuilt {
        /// Why the old one was not used.
        why: String,
        /// The scan that built it.
        scan: ScanSummary,
        /// Where it was saved, if it could be.
        saved: Option<PathBuf>,
    },
}

/// How a scan went, for reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScanSummary {
    /// Bytes scanned.
    pub bytes: u64,
    /// Seconds.
    pub seconds: f64,
}

impl From<ScanReport> for ScanSummary {
    fn from(r: ScanReport) -> Self {
        ScanSummary {
            bytes: r.bytes,
            seconds: r.seconds,
        }
    }
}

/// What to do with a stale or corrupt index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StalePolicy {
    /// Rebuild it and say so.
    #[default]
    Rebuild,
    /// Refuse with an error (`--no-rebuild`).
    Refuse,
}

/// The identity of a source file that an index records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Source {
    size: u64,
    mtime: i64,
    mtime_nsec: u64,
    inode: u64,
}

impl Source {
    fn of(path: &Path) -> Result<Source> {
        let m = std::fs::metadata(path).map_err(|e| Error::io(path, "stat", None, e))?;
        Ok(Self::from_meta(&m))
    }

    fn from_meta(m: &std::fs::Metadata) -> Source {
        Source {
            size: m.len(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec() as u64,
            inode: m.ino(),
        }
    }
}

fn format_tag(format: &Format) -> (u32, u64) {
    match format {
        Format::Lines { sep, skip } => (1, *sep as u64 | (skip << 8)),
        // Whether CRCs were checked is part of the index: an unchecked index must not pass
        // for a checked one.
        Format::TfRecord { verify } => (2, *verify as u64),
        _ => unreachable!("only lines and tfrecord are indexed"),
    }
}

/// Where the sidecar of `data` lives: next to it, or in the cache when that directory is
/// not writable.
pub fn sidecar_paths(data: &Path) -> (PathBuf, PathBuf) {
    let mut beside = data.as_os_str().to_owned();
    beside.push(".ridx");
    let abs = std::fs::canonicalize(data).unwrap_or_else(|_| data.to_path_buf());
    let hash = crc32c::crc32c(abs.as_os_str().as_encoded_bytes());
    let name = format!(
        "{}-{hash:08x}.ridx",
        abs.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    );
    (
        PathBuf::from(beside),
        crate::probe::cache_dir().join("index").join(name),
    )
}

/// Loads the index of `file` or builds it with one sequential scan.
pub fn load_or_build(
    file: &Arc<DataFile>,
    format: &Format,
    policy: StalePolicy,
    io_cfg: &IoConfig,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(OffsetIndex, IndexOrigin)> {
    let path = file.path();
    // The identity of the file actually open (not whatever the path names by now).
    let meta = file
        .file()
        .metadata()
        .map_err(|e| Error::io(path, "stat", None, e))?;
    let source = Source::from_meta(&meta);
    let (beside, cached) = sidecar_paths(path);
    let mut stale = None;
    for candidate in [&beside, &cached] {
        match std::fs::read(candidate) {
            Ok(bytes) => match decode(&bytes, format, &source) {
                Ok(index) => return Ok((index, IndexOrigin::Loaded(candidate.clone()))),
                Err(why) => stale = Some(format!("{}: {why}", candidate.display())),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => stale = Some(format!("{}: cannot read: {e}", candidate.display())),
        }
    }
    if let (Some(why), StalePolicy::Refuse) = (&stale, policy) {
        return Err(Error::BadInput {
            path: path.into(),
            offset: None,
            what: format!(
                "its index is not usable ({why}) and rebuilding was not allowed (--no-rebuild)"
            ),
        });
    }
    let (index, scan) = build(file, format, io_cfg, progress)?;
    if source != Source::of(path)? {
        return Err(Error::BadInput {
            path: path.into(),
            offset: None,
            what: "the file changed while it was being indexed".into(),
        });
    }
    let bytes = encode(&index, format, &source);
    let saved = [&beside, &cached]
        .into_iter()
        .find_map(|p| store(p, &bytes).ok().map(|()| p.clone()));
    if saved.is_none() {
        notice::once(
            &format!("index-unsaved:{}", path.display()),
            &format!("could not save the index of {} beside it or in the cache; it will be rebuilt next time", path.display()),
        );
    }
    let origin = match stale {
        Some(why) => {
            notice::once(
                &format!("index-rebuilt:{}", path.display()),
                &format!("rebuilt a stale index ({why})"),
            );
            IndexOrigin::Rebuilt { why, scan, saved }
        }
        None => IndexOrigin::Built { scan, saved },
    };
    Ok((index, origin))
}

/// Scans `file` once and returns its record starts.
pub fn build(
    file: &Arc<DataFile>,
    format: &Format,
    io_cfg: &IoConfig,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(OffsetIndex, ScanSummary)> {
    let mut scanner: Box<dyn Scanner> = match format {
        Format::Lines { sep, skip } => Box::new(LinesScanner::new(*sep, *skip)),
        Format::TfRecord { verify } => Box::new(TfRecordScanner::new(*verify)),
        _ => unreachable!("only lines and tfrecord are indexed"),
    };
    let size = file.size();
    let bad = |e: crate::format::ScanError| Error::BadInput {
        path: file.path().into(),
        offset: Some(e.offset),
        what: e.what,
    };
    let report = io::scan_file(file, io_cfg, |offset, chunk| {
        scanner.feed(offset, chunk).map_err(bad)?;
        progress(offset + chunk.len() as u64, size);
        Ok(())
    })?;
    scanner.finish(size).map_err(bad)?;
    let mut offsets = scanner.take_offsets();
    offsets.shrink_to_fit();
    Ok((
        OffsetIndex {
            offsets,
            last_unterminated: scanner.last_unterminated(),
        },
        report.into(),
    ))
}

fn encode(index: &OffsetIndex, format: &Format, src: &Source) -> Vec<u8> {
    let (tag, param) = format_tag(format);
    let mut out = Vec::with_capacity(HEADER + index.offsets.len() * 8 + 4);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&tag.to_le_bytes());
    for v in [
        param,
        src.size,
        src.mtime as u64,
        src.mtime_nsec,
        src.inode,
        index.len(),
        index.last_unterminated as u64,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for o in &index.offsets {
        out.extend_from_slice(&o.to_le_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn decode(bytes: &[u8], format: &Format, src: &Source) -> std::result::Result<OffsetIndex, String> {
    if bytes.len() < HEADER + 4 || &bytes[..8] != MAGIC {
        return Err("not a riffle index (bad magic or too short)".into());
    }
    let (body, tail) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body) != u32::from_le_bytes(tail.try_into().expect("4 bytes")) {
        return Err("checksum mismatch (corrupt index)".into());
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
    if u32_at(8) != VERSION {
        return Err(format!(
            "index version {} (this riffle writes {VERSION})",
            u32_at(8)
        ));
    }
    let (tag, param) = format_tag(format);
    let stored = u64_at(16);
    // A CRC-checked TFRecord index also serves an open that does not check.
    let compatible = stored == param || (tag == 2 && stored == 1 && param == 0);
    if u32_at(12) != tag || !compatible {
        return Err(if tag == 2 {
            "built without CRC checks, and checks are wanted".into()
        } else {
            "built for another format or separator".into()
        });
    }
    let recorded = Source {
        size: u64_at(24),
        mtime: u64_at(32) as i64,
        mtime_nsec: u64_at(40),
        inode: u64_at(48),
    };
    if recorded.size != src.size {
        return Err(format!(
            "stale: the file is {} bytes, the index was built for {}",
            src.size, recorded.size
        ));
    }
    if recorded != *src {
        return Err("stale: the file was modified or replaced after it was indexed".into());
    }
    let n = u64_at(56) as usize;
    if body.len() != HEADER + (n + 1) * 8 {
        return Err("length does not match its record count (corrupt index)".into());
    }
    let offsets: Vec<u64> = body[HEADER..]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    if offsets.windows(2).any(|w| w[0] > w[1]) || offsets.last() != Some(&src.size) {
        return Err("offsets out of order or past the end of the file (corrupt index)".into());
    }
    Ok(OffsetIndex {
        offsets,
        last_unterminated: u64_at(64) & 1 == 1,
    })
}

fn store(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}-{seq}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let result = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
