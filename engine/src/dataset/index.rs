//! The offset index of a variable-length file (the LIRS paper's location generator): the
//! start of every record, found by one sequential scan, kept in memory as one u64 per
//! record, and saved beside the data so later runs need not scan again.
//!
//! The sidecar (`DATA.ridx`, or in the cache directory when the data's directory is not
//! writable), all integers little endian:
//!
//! ```text
//!  0  8  magic "RIFFLIDX"
//!  8  4  version (2)
//! 12  4  format: 1 lines, 2 tfrecord, 3 tar
//! 16  8  format parameter: lines: separator byte | header lines << 8; tfrecord: 1 if
//!        CRCs were checked; tar: 1 (the scanner's rules: 0 from before links between
//!        samples were refused, rebuilt)
//! 24  8  source size in bytes
//! 32  8  source mtime, seconds (signed)
//! 40  8  source mtime, nanoseconds
//! 48  8  source ctime, seconds (signed)
//! 56  8  source ctime, nanoseconds
//! 64  8  source inode
//! 72  8  source device (st_dev)
//! 80  8  record count N
//! 88  8  flags: bit 0 = the last line has no separator; other bits 0
//! 96  8 x (N + 1)  record starts, then the end of the last record's frame (the size)
//!  .. 4  CRC32C of every byte before it
//! ```
//!
//! The source's identity is its size, mtime, ctime, inode and device. The ctime is what
//! catches a file rewritten in place with its old size and mtime put back (`touch -d`,
//! `rsync -t`, `cp -p` onto a reused inode): the kernel sets it on every write and every
//! timestamp change, and nothing short of the clock can set it back. (A same-size rewrite
//! within the filesystem's timestamp granularity of the indexing run itself leaves every
//! field equal and is not caught.)
//!
//! A sidecar is never used unless its checksum holds, its identity matches the file,
//! its length is exactly its header plus N + 1 offsets, and its offsets are a possible
//! index of a file of that size: the first is where the records start (0, or past the
//! header lines), each is after the one before (by at least a frame's 16 bytes for
//! TFRecord), record starts lie inside the file and the last entry is its size. Otherwise
//! it is rebuilt (with a notice naming the sidecar and why) or refused (`--no-rebuild`).
//! Version 1 sidecars (no ctime or device) are rebuilt the same way.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::format::lines::LinesScanner;
use crate::format::tfrecord::TfRecordScanner;
use crate::format::{Format, Scanner};
use crate::io::{self, DataFile, IoConfig, ScanReport};
use crate::{notice, Error, Result};

const MAGIC: &[u8; 8] = b"RIFFLIDX";

/// Whether `head` starts an index sidecar.
pub(crate) fn is_magic(head: &[u8; 8]) -> bool {
    head == MAGIC
}
const VERSION: u32 = 2;
/// The tar scanner's rules an index was built with (the format parameter of a tar index).
const TAR_SCAN: u64 = 1;
const HEADER: usize = 96;
/// A TFRecord frame's bytes around its data: length, length CRC, data CRC.
const TFRECORD_FRAMING: u64 = 16;

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

/// The identity of a source file that an index records. Timestamps are (seconds,
/// nanoseconds) as `stat` gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Source {
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    inode: u64,
    device: u64,
}

impl Source {
    fn of(path: &Path) -> Result<Source> {
        let m = std::fs::metadata(path).map_err(|e| Error::io(path, "stat", None, e))?;
        Ok(Self::from_meta(&m))
    }

    fn from_meta(m: &std::fs::Metadata) -> Source {
        Source {
            size: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
            inode: m.ino(),
            device: m.dev(),
        }
    }

    /// The names of the fields in which `self` (what an index recorded) differs from
    /// `now` (the file), e.g. "ctime, inode".
    fn differences(&self, now: &Source) -> String {
        [
            ("size", self.size != now.size),
            ("mtime", self.mtime != now.mtime),
            ("ctime", self.ctime != now.ctime),
            ("inode", self.inode != now.inode),
            ("device", self.device != now.device),
        ]
        .iter()
        .filter(|(_, differs)| *differs)
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(", ")
    }
}

fn format_tag(format: &Format) -> (u32, u64) {
    match format {
        Format::Lines { sep, skip } => (1, *sep as u64 | (skip << 8)),
        // Whether CRCs were checked is part of the index: an unchecked index must not pass
        // for a checked one.
        Format::TfRecord { verify } => (2, *verify as u64),
        // 1: scanned with samples keyed by bytes and non-regular members between samples
        // refused (issue 30 D17, D30); an index of 0 may hold a sample that carries a link.
        Format::Tar => (3, TAR_SCAN),
        _ => unreachable!("only lines, tfrecord and tar are indexed"),
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

/// Loads the index of `file` or builds it with one sequential scan, saved as a sidecar
/// when `save`. With a `room` (a staged copy's, see `OpenOptions::index_room`), the sidecar
/// is kept beside the file only, and takes its bytes from the room: found, it is charged;
/// built, it is saved only when the room holds it.
pub fn load_or_build(
    file: &Arc<DataFile>,
    format: &Format,
    (policy, save, room): (StalePolicy, bool, Option<&AtomicU64>),
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
    // No index of this file is larger than its header, an offset for each byte (and
    // the end) and its checksum: a larger sidecar is not this file's.
    let cap = (HEADER as u64).saturating_add(source.size.saturating_add(4).saturating_mul(8));
    // A staged copy's sidecar is beside it, in the cache its limit counts, or nowhere.
    let candidates = match room {
        Some(_) => vec![&beside],
        None => vec![&beside, &cached],
    };
    for candidate in candidates.iter().copied() {
        // Through the door: a FIFO, device or link planted at the name is refused (and
        // the index rebuilt), never waited on or read without end.
        match crate::door::read_meta(candidate, cap, crate::door::Follow::No) {
            Ok(Some(bytes)) => match decode(&bytes, format, &source) {
                Ok(index) => {
                    // It takes local disk, whoever saved it.
                    if let Some(r) = room {
                        take_at_most(r, bytes.len() as u64);
                    }
                    return Ok((index, IndexOrigin::Loaded(candidate.clone())));
                }
                Err(why) => stale = Some(format!("{}: {why}", candidate.display())),
            },
            Ok(None) => {}
            Err(e) => stale = Some(format!("cannot read: {e}")),
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
    // Encoded only to be saved (a copy fetched to find its layout is not).
    let saved = save
        .then(|| save_sidecar(path, &encode(&index, format, &source), &candidates, room))
        .flatten();
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

/// Saves the sidecar `bytes` of `path`'s index at the first of `candidates` that takes it,
/// its bytes taken from `room` first (a staged copy's); says why when it is not saved.
fn save_sidecar(
    path: &Path,
    bytes: &[u8],
    candidates: &[&PathBuf],
    room: Option<&AtomicU64>,
) -> Option<PathBuf> {
    let len = bytes.len() as u64;
    if let Some(r) = room.filter(|r| !take(r, len)) {
        notice::once(
            &format!("index-unsaved:{}", path.display()),
            &format!(
                "the index of {} ({}) is not saved beside it: --cache-limit leaves {} there; \
                 it is built again at each open",
                path.display(),
                crate::size::human_bytes(len as f64),
                crate::size::human_bytes(r.load(Ordering::Relaxed) as f64),
            ),
        );
        return None;
    }
    let saved = (candidates.iter()).find_map(|p| store(p, bytes).ok().map(|()| (*p).clone()));
    if saved.is_none() {
        if let Some(r) = room {
            r.fetch_add(len, Ordering::Relaxed);
        }
        notice::once(
            &format!("index-unsaved:{}", path.display()),
            &format!("could not save the index of {} beside it or in the cache; it will be rebuilt next time", path.display()),
        );
    }
    saved
}

/// Takes `n` from `room` when it holds them; false (nothing taken) when not.
fn take(room: &AtomicU64, n: u64) -> bool {
    room.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| r.checked_sub(n))
        .is_ok()
}

/// Takes `n` from `room`, or all it holds.
fn take_at_most(room: &AtomicU64, n: u64) {
    let _ = room.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
        Some(r.saturating_sub(n))
    });
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
        Format::Tar => Box::new(crate::format::tar::TarScanner::new()),
        _ => unreachable!("only lines, tfrecord and tar are indexed"),
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
        src.mtime.0 as u64,
        src.mtime.1 as u64,
        src.ctime.0 as u64,
        src.ctime.1 as u64,
        src.inode,
        src.device,
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

/// Reads a sidecar. `Err` says why it cannot be used, for the notice or error that names
/// it; nothing in `bytes` can make this panic or wrap.
fn decode(bytes: &[u8], format: &Format, src: &Source) -> std::result::Result<OffsetIndex, String> {
    if bytes.len() < 16 || &bytes[..8] != MAGIC {
        return Err("not a riffle index (bad magic or too short)".into());
    }
    let (body, tail) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body) != u32::from_le_bytes(tail.try_into().expect("4 bytes")) {
        return Err("checksum mismatch (corrupt index)".into());
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
    let version = u32_at(8);
    if version != VERSION {
        return Err(format!(
            "index version {version}, from another riffle (this one writes version {VERSION})"
        ));
    }
    if body.len() < HEADER {
        return Err(format!(
            "{} bytes, too short for its {HEADER}-byte header (corrupt index)",
            bytes.len()
        ));
    }
    let (tag, param) = format_tag(format);
    let stored = u64_at(16);
    // A CRC-checked TFRecord index also serves an open that does not check.
    let compatible = stored == param || (tag == 2 && stored == 1 && param == 0);
    if u32_at(12) != tag || !compatible {
        return Err(if tag == 2 {
            "built without CRC checks, and checks are wanted".into()
        } else if tag == 3 && u32_at(12) == 3 {
            "built by an earlier tar scanner (links between samples were not refused)".into()
        } else {
            "built for another format or separator".into()
        });
    }
    let recorded = Source {
        size: u64_at(24),
        mtime: (u64_at(32) as i64, u64_at(40) as i64),
        ctime: (u64_at(48) as i64, u64_at(56) as i64),
        inode: u64_at(64),
        device: u64_at(72),
    };
    if recorded.size != src.size {
        return Err(format!(
            "stale: the file is {} bytes, the index was built for {}",
            src.size, recorded.size
        ));
    }
    if recorded != *src {
        return Err(format!(
            "stale: the file's {} changed since it was indexed (modified or replaced)",
            recorded.differences(src)
        ));
    }
    // The count must say exactly how many offsets follow (N + 1 of 8 bytes), worked out
    // without wrapping: a count of N + 2^61 must not pass for N.
    let n = u64_at(80);
    let offset_bytes = (body.len() - HEADER) as u64;
    if n.checked_add(1).and_then(|e| e.checked_mul(8)) != Some(offset_bytes) {
        return Err(format!(
            "a record count of {n} (at byte 80) does not match its {offset_bytes} bytes of offsets (corrupt index)"
        ));
    }
    let flags = u64_at(88);
    let last_unterminated = flags & 1 == 1;
    if flags & !1 != 0 || (last_unterminated && (tag != 1 || n == 0)) {
        return Err(format!(
            "flags {flags:#x} (at byte 88) are not possible for this index (corrupt index)"
        ));
    }
    let offsets: Vec<u64> = body[HEADER..]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    check_offsets(&offsets, format, src.size)?;
    Ok(OffsetIndex {
        offsets,
        last_unterminated,
    })
}

/// Whether `offsets` (N record starts and the end sentinel) could be the index of a file
/// of `size` bytes in `format`: what `indexed_span` relies on to never underflow and
/// what keeps every span inside the file.
fn check_offsets(offsets: &[u64], format: &Format, size: u64) -> std::result::Result<(), String> {
    let at = |i: usize| HEADER + 8 * i;
    // The first record starts at 0, or past the header lines (each ends with a
    // separator, so at least one byte per line); frames are at least a separator or a
    // TFRecord frame's framing long.
    let (first_min, first_max, gap) = match format {
        Format::Lines { skip: 0, .. } => (0, 0, 1),
        Format::Lines { skip, .. } => (*skip, u64::MAX, 1),
        Format::TfRecord { .. } => (0, 0, TFRECORD_FRAMING),
        // A sample may follow members that are no sample's; each is a header at least.
        Format::Tar => (0, u64::MAX, crate::format::tar::BLOCK),
        _ => unreachable!("only lines, tfrecord and tar are indexed"),
    };
    let first = offsets[0];
    if first < first_min || first > first_max {
        return Err(format!(
            "its first offset (at byte {}) is {first}, where no record can start (corrupt index)",
            at(0)
        ));
    }
    let n = offsets.len() - 1;
    for (i, w) in offsets.windows(2).enumerate() {
        let (start, next) = (w[0], w[1]);
        if start >= size {
            return Err(format!(
                "offset {i} (at byte {}) is {start}, not inside the {size}-byte file (corrupt index)",
                at(i)
            ));
        }
        if !matches!(start.checked_add(gap), Some(min) if next >= min) {
            let what = if gap == 1 {
                format!("not after offset {i} ({start})")
            } else {
                format!("less than a {gap}-byte frame after offset {i} ({start})")
            };
            return Err(format!(
                "offset {} (at byte {}) is {next}, {what} (corrupt index)",
                i + 1,
                at(i + 1)
            ));
        }
    }
    // A tar archive's end-of-archive blocks follow its last sample.
    let end_ok = match format {
        Format::Tar => offsets[n] <= size,
        _ => offsets[n] == size,
    };
    if !end_ok {
        return Err(format!(
            "its last offset (at byte {}) is {}, not the file's size {size} (corrupt index)",
            at(n),
            offsets[n]
        ));
    }
    Ok(())
}

fn store(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "create directory", None, e))?;
    }
    // A private temporary file beside it, renamed over it: never through a planted link.
    crate::scratch::write_atomic(path, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINES: Format = Format::Lines {
        sep: b'\n',
        skip: 0,
    };

    fn source(size: u64) -> Source {
        Source {
            size,
            mtime: (1_700_000_000, 123_456_789),
            ctime: (1_700_000_001, 987_654_321),
            inode: 42,
            device: 0x803,
        }
    }

    /// The records "a\n", "bb\n", "c" (no separator): 6 bytes.
    fn index() -> OffsetIndex {
        OffsetIndex {
            offsets: vec![0, 2, 5, 6],
            last_unterminated: true,
        }
    }

    /// `bytes` with `edit` applied before the CRC and the CRC recomputed.
    fn forged(bytes: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut body = bytes[..bytes.len() - 4].to_vec();
        edit(&mut body);
        let crc = crc32c::crc32c(&body);
        body.extend_from_slice(&crc.to_le_bytes());
        body
    }

    fn put(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }

    #[test]
    fn round_trips() {
        let bytes = encode(&index(), &LINES, &source(6));
        assert_eq!(bytes.len(), HEADER + 4 * 8 + 4);
        assert_eq!(decode(&bytes, &LINES, &source(6)), Ok(index()));
    }

    #[test]
    fn every_identity_field_counts() {
        let bytes = encode(&index(), &LINES, &source(6));
        type Change = fn(&mut Source);
        let cases: [(&str, Change); 5] = [
            ("mtime", |s| s.mtime.1 += 1),
            ("ctime", |s| s.ctime.1 += 1),
            ("ctime", |s| s.ctime.0 += 1),
            ("inode", |s| s.inode += 1),
            ("device", |s| s.device += 1),
        ];
        for (field, change) in cases {
            let mut now = source(6);
            change(&mut now);
            let why = decode(&bytes, &LINES, &now).unwrap_err();
            assert!(why.starts_with("stale") && why.contains(field), "{why}");
        }
    }

    #[test]
    fn a_record_count_that_wraps_is_corrupt() {
        let bytes = encode(&index(), &LINES, &source(6));
        for n in [3 + (1u64 << 61), u64::MAX, u64::MAX / 8, 2, 4] {
            let b = forged(&bytes, |b| put(b, 80, n));
            let why = decode(&b, &LINES, &source(6)).unwrap_err();
            assert!(why.contains("record count"), "{n}: {why}");
        }
    }

    #[test]
    fn impossible_offsets_are_corrupt() {
        let bytes = encode(&index(), &LINES, &source(6));
        for (offsets, why) in [
            ([1, 2, 5, 6], "first offset"),
            ([0, 2, 2, 6], "not after offset 1"),
            ([0, 5, 2, 6], "not after offset 1"),
            ([0, 2, 6, 6], "not inside the 6-byte file"),
            ([0, 2, 7, 8], "not inside the 6-byte file"),
            ([0, 2, 5, 7], "not the file's size"),
            ([0, 2, 5, u64::MAX], "not the file's size"),
        ] {
            let b = forged(&bytes, |b| {
                for (i, o) in offsets.iter().enumerate() {
                    put(b, HEADER + 8 * i, *o);
                }
            });
            let got = decode(&b, &LINES, &source(6)).unwrap_err();
            assert!(got.contains(why), "{offsets:?}: {got}");
        }
    }

    #[test]
    fn format_invariants_hold() {
        // Header lines: the first record starts at least one byte per header line in.
        let csv = Format::Lines {
            sep: b'\n',
            skip: 2,
        };
        assert!(check_offsets(&[1, 6], &csv, 6).is_err());
        assert!(check_offsets(&[2, 6], &csv, 6).is_ok());
        // A file of nothing but header lines has no records, only the sentinel.
        assert!(check_offsets(&[6], &csv, 6).is_ok());
        // TFRecord frames are at least 16 bytes and start at 0.
        let tf = Format::TfRecord { verify: true };
        assert!(check_offsets(&[0, 16, 40], &tf, 40).is_ok());
        assert!(check_offsets(&[0, 15, 40], &tf, 40).is_err());
        assert!(check_offsets(&[4, 20, 40], &tf, 40).is_err());
        assert!(check_offsets(&[u64::MAX - 4, u64::MAX], &tf, u64::MAX).is_err());
    }

    #[test]
    fn flags_must_be_possible() {
        let bytes = encode(&index(), &LINES, &source(6));
        let b = forged(&bytes, |b| put(b, 88, 2));
        let why = decode(&b, &LINES, &source(6)).unwrap_err();
        assert!(why.contains("flags"), "{why}");
        let tf = Format::TfRecord { verify: true };
        let ix = OffsetIndex {
            offsets: vec![0, 16],
            last_unterminated: false,
        };
        let bytes = encode(&ix, &tf, &source(16));
        assert_eq!(decode(&bytes, &tf, &source(16)), Ok(ix));
        let b = forged(&bytes, |b| put(b, 88, 1));
        assert!(decode(&b, &tf, &source(16)).unwrap_err().contains("flags"));
    }

    #[test]
    fn a_tar_index_of_the_earlier_scanner_is_rebuilt() {
        let tar = OffsetIndex {
            offsets: vec![0, 1024, 2048],
            last_unterminated: false,
        };
        let bytes = encode(&tar, &Format::Tar, &source(2048));
        decode(&bytes, &Format::Tar, &source(2048)).unwrap();
        let b = forged(&bytes, |b| b[16..24].copy_from_slice(&0u64.to_le_bytes()));
        let why = decode(&b, &Format::Tar, &source(2048)).unwrap_err();
        assert!(why.contains("earlier tar scanner"), "{why}");
    }

    #[test]
    fn an_old_version_is_named() {
        let bytes = encode(&index(), &LINES, &source(6));
        let b = forged(&bytes, |b| b[8..12].copy_from_slice(&1u32.to_le_bytes()));
        let why = decode(&b, &LINES, &source(6)).unwrap_err();
        assert!(why.contains("index version 1"), "{why}");
    }

    #[test]
    fn no_cut_or_header_change_passes_and_nothing_panics() {
        let good = encode(&index(), &LINES, &source(6));
        // Every prefix, with a valid checksum where there is room for one.
        for cut in 0..good.len() {
            let b = if cut >= 16 {
                forged(&good[..cut], |_| {})
            } else {
                good[..cut].to_vec()
            };
            assert!(decode(&b, &LINES, &source(6)).is_err(), "cut at {cut}");
        }
        // Any byte of the header changed, checksum recomputed: every field is checked, but
        // for the last-line flag, which only the data's last byte could contradict.
        for at in 8..HEADER {
            for bit in [0x01, 0x80] {
                if (at, bit) == (88, 0x01) {
                    continue;
                }
                let b = forged(&good, |b| b[at] ^= bit);
                assert!(
                    decode(&b, &LINES, &source(6)).is_err(),
                    "byte {at} ^ {bit:#x}"
                );
            }
        }
        // A changed offset is refused unless it still cuts the file into possible records
        // (which only a scan could tell from the real ones).
        for at in HEADER..good.len() - 4 {
            for bit in 0..8 {
                let b = forged(&good, |b| b[at] ^= 1 << bit);
                if let Ok(ix) = decode(&b, &LINES, &source(6)) {
                    assert!(ix.offsets.windows(2).all(|w| w[0] < w[1] && w[0] < 6));
                }
            }
        }
    }

    /// A format the sidecar serves, and a possible index of a file in it: offsets that
    /// keep its invariants (first start, least gap, last entry), and the file's size.
    fn indexed() -> impl proptest::strategy::Strategy<Value = (Format, OffsetIndex, u64)> {
        use proptest::prelude::*;
        (
            0u8..4,
            proptest::collection::vec(0u64..5000, 0..40),
            0u64..3,
            any::<bool>(),
            0u64..2000,
        )
            .prop_map(|(f, gaps, skip, unterminated, tail)| {
                let (format, gap) = match f {
                    0 => (LINES, 1),
                    1 => (Format::Lines { sep: b',', skip }, 1),
                    2 => (Format::TfRecord { verify: skip == 1 }, TFRECORD_FRAMING),
                    _ => (Format::Tar, crate::format::tar::BLOCK),
                };
                let first = match format {
                    Format::Lines { skip, .. } => skip * 3,
                    Format::Tar => tail,
                    _ => 0,
                };
                let mut offsets = vec![first];
                for g in &gaps {
                    offsets.push(offsets.last().unwrap() + gap + g);
                }
                let last = *offsets.last().unwrap();
                // A tar archive's end-of-archive blocks follow its last sample.
                let size = if matches!(format, Format::Tar) {
                    last + tail
                } else {
                    last
                };
                let last_unterminated = unterminated && f < 2 && !gaps.is_empty();
                (
                    format,
                    OffsetIndex {
                        offsets,
                        last_unterminated,
                    },
                    size,
                )
            })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Every possible index round-trips; any change to its bytes that does not also
        /// recompute the checksum (a byte changed, inserted or removed, the file cut or
        /// extended) is refused; a change that does recompute it is refused or still
        /// keeps the index's invariants; and nothing panics.
        #[test]
        fn sidecars_round_trip_and_damaged_ones_are_refused(
            (format, ix, size) in indexed(),
            edits in proptest::collection::vec(
                (proptest::prelude::any::<proptest::sample::Index>(), 0u8..5, 1u8..=255), 1..4),
        ) {
            let src = source(size);
            let good = encode(&ix, &format, &src);
            proptest::prop_assert_eq!(decode(&good, &format, &src), Ok(ix.clone()));
            let mut bad = good.clone();
            for (i, op, v) in &edits {
                let i = i.index(bad.len().max(1));
                match op {
                    0 if i < bad.len() => bad[i] ^= v,
                    1 => bad.insert(i.min(bad.len()), *v),
                    2 if i < bad.len() => { bad.remove(i); }
                    3 => bad.truncate(i),
                    _ => bad.extend_from_slice(&[*v; 8]),
                }
            }
            if bad != good {
                let why = decode(&bad, &format, &src).unwrap_err();
                proptest::prop_assert!(
                    why.contains("checksum") || why.contains("not a riffle index"),
                    "{}", why
                );
            }
            // The same edits inside the checksum.
            if bad.len() >= 20 {
                let forged = forged(&bad, |_| {});
                if let Ok(got) = decode(&forged, &format, &src) {
                    proptest::prop_assert!(check_offsets(&got.offsets, &format, size).is_ok());
                    proptest::prop_assert_eq!(got.len() as usize + 1, got.offsets.len());
                }
            }
        }

        /// Bytes that were never an index are refused, never a panic.
        #[test]
        fn arbitrary_bytes_are_refused(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
            magic in proptest::prelude::any::<bool>(),
        ) {
            let mut b = bytes;
            if magic && b.len() >= 16 {
                b[..8].copy_from_slice(MAGIC);
                b[8..12].copy_from_slice(&VERSION.to_le_bytes());
                b = forged(&b, |_| {});
            }
            proptest::prop_assert!(decode(&b, &LINES, &source(6)).is_err());
        }
    }
}
