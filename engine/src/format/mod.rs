//! Record formats: how records sit in a file's bytes. Nothing here does I/O: decoders take
//! bytes (a header, or chunks of a sequential scan fed in order) and say where records are.
//!
//! - `fixed:SIZE[:HEADER]`: records of SIZE bytes after a HEADER; located by arithmetic.
//! - `npy`: the NumPy format (versions 1, 2, 3); a record is one row of a C-order array.
//! - `lines`: records separated by a byte (default `\n`), the separator not part of the
//!   record, `\r` kept as data, a last line without separator still a record, optional
//!   header lines skipped (`csv` skips one).
//! - `tfrecord`: u64 length, masked CRC32C of the length, data, masked CRC32C of the data.
//! - `tar`: WebDataset shards; a record is a sample, the run of consecutive members that
//!   share a key (see [`tar`]).
//! - `mds`: MosaicML Streaming's MDS (`index.json` and `shard.NNNNN.mds`, uncompressed);
//!   a record is a sample's encoded bytes (see `crate::dataset::mds`).
//! - `files`: a record is a whole file (a directory tree of one file per sample, as
//!   ImageFolder keeps images, or a manifest listing the files); see `crate::dataset::files`.
//!
//! Variable-length formats (`lines`, `tfrecord`) need an offset index, built by one
//! sequential scan with [`Scanner`]; see `crate::dataset::index`. The same scanners cut a
//! stream into whole records for `riffle shuffle` ([`cut::Cutter`]): one parser per format.

pub mod cut;
pub mod lines;
pub mod npy;
pub mod tar;
pub mod tfrecord;

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::Serialize;

use crate::size::parse_size;

/// A record format.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Format {
    /// Fixed-size raw records after a header.
    Fixed {
        /// Bytes per record.
        size: u64,
        /// Bytes before the first record.
        header: u64,
    },
    /// A NumPy `.npy` array; a record is one row.
    Npy,
    /// Delimited lines.
    Lines {
        /// The separator byte.
        sep: u8,
        /// Header lines skipped at the top of each file.
        skip: u64,
    },
    /// TFRecord framing.
    TfRecord {
        /// Verify both CRCs while scanning.
        verify: bool,
    },
    /// Tar archives as WebDataset shards: a record is a sample (its members' bytes in the
    /// archive, headers included).
    Tar,
    /// MosaicML Streaming's MDS: a record is a sample, located by its shard's offsets.
    Mds,
    /// One record per file: a directory tree (labels from first-level directories) or a
    /// manifest of paths.
    Files,
}

impl Format {
    /// The format a file's extension implies, if any.
    pub fn from_extension(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        Some(match ext.as_str() {
            "npy" => Format::Npy,
            "jsonl" | "ndjson" | "txt" | "libsvm" | "svm" | "tsv" => Format::Lines {
                sep: b'\n',
                skip: 0,
            },
            "csv" => Format::Lines {
                sep: b'\n',
                skip: 1,
            },
            "tfrecord" | "tfrecords" => Format::TfRecord { verify: true },
            "tar" => Format::Tar,
            _ => return None,
        })
    }

    /// Whether records are located through an offset index.
    pub fn needs_index(&self) -> bool {
        matches!(
            self,
            Format::Lines { .. } | Format::TfRecord { .. } | Format::Tar
        )
    }

    /// A short name: `fixed`, `npy`, `lines`, `tfrecord`.
    pub fn name(&self) -> &'static str {
        match self {
            Format::Fixed { .. } => "fixed",
            Format::Npy => "npy",
            Format::Lines { .. } => "lines",
            Format::TfRecord { .. } => "tfrecord",
            Format::Tar => "tar",
            Format::Mds => "mds",
            Format::Files => "files",
        }
    }

    /// Whether two formats read files the same way (for "all files of one format").
    pub fn same_kind(&self, other: &Format) -> bool {
        self.name() == other.name()
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Format::Fixed { size, header: 0 } => write!(f, "fixed:{size}"),
            Format::Fixed { size, header } => write!(f, "fixed:{size}:{header}"),
            Format::Npy => write!(f, "npy"),
            Format::Lines {
                sep: b'\n',
                skip: 0,
            } => write!(f, "lines"),
            Format::Lines { sep, skip } => write!(f, "lines(sep={:?}, skip={skip})", *sep as char),
            Format::TfRecord { verify: true } => write!(f, "tfrecord"),
            Format::TfRecord { verify: false } => write!(f, "tfrecord(no CRC check)"),
            Format::Tar => write!(f, "tar"),
            Format::Mds => write!(f, "mds"),
            Format::Files => write!(f, "files"),
        }
    }
}

impl FromStr for Format {
    type Err = String;

    /// `npy`, `lines`, `jsonl`, `csv` (lines with one header line), `libsvm`, `tfrecord`,
    /// `fixed:SIZE[:HEADER_BYTES]` (sizes take suffixes: `fixed:4K`), `files` (or
    /// `imagefolder`: one record per file).
    fn from_str(s: &str) -> Result<Self, String> {
        let lower = s.to_ascii_lowercase();
        let mut parts = lower.split(':');
        let head = parts.next().unwrap_or_default();
        let fmt = match head {
            "npy" => Format::Npy,
            "lines" | "jsonl" | "ndjson" | "libsvm" | "svm" | "txt" | "text" => Format::Lines { sep: b'\n', skip: 0 },
            "csv" => Format::Lines { sep: b'\n', skip: 1 },
            "tfrecord" | "tfrecords" => Format::TfRecord { verify: true },
            "files" | "imagefolder" => Format::Files,
            "tar" | "webdataset" | "wds" => Format::Tar,
            "mds" | "mosaic" => Format::Mds,
            "fixed" => {
                let size = parts.next().ok_or_else(|| format!("'{s}': fixed needs a size, like fixed:4096 or fixed:4K"))?;
                let size = parse_size(size)?;
                if size == 0 {
                    return Err(format!("'{s}': the record size must be positive"));
                }
                let header = match parts.next() {
                    Some(h) => parse_size(h)?,
                    None => 0,
                };
                Format::Fixed { size, header }
            }
            _ => {
                return Err(format!(
                    "'{s}': unknown format (expected npy, lines, jsonl, csv, libsvm, tfrecord, tar, mds, files or fixed:SIZE[:HEADER])"
                ))
            }
        };
        if let Some(extra) = parts.next() {
            return Err(format!("'{s}': unexpected ':{extra}'"));
        }
        Ok(fmt)
    }
}

/// Where one record's payload is inside its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Byte offset of the payload.
    pub offset: u64,
    /// Payload length.
    pub len: u64,
}

/// A decoder fed a file's bytes in order, one chunk at a time, that finds the records.
pub trait Scanner {
    /// Takes the next chunk, which starts at byte `offset` of the file. Errors carry the
    /// byte offset where the input went wrong.
    fn feed(&mut self, offset: u64, chunk: &[u8]) -> Result<(), ScanError>;
    /// The file ended at `size`; checks that nothing is left half-read.
    fn finish(&mut self, size: u64) -> Result<(), ScanError>;
    /// Frame starts found so far, plus the end sentinel after `finish`.
    fn take_offsets(&mut self) -> Vec<u64>;
    /// Whether the last record has no terminator (lines only).
    fn last_unterminated(&self) -> bool {
        false
    }
    /// Moves the record boundaries found since the last call to the end of `out`, for a
    /// reader that cuts records as the chunks come: each is where a record starts and the
    /// one before ends. Every scanner but tar's reports a boundary as soon as the record
    /// before it is complete (its CRCs checked), and the end of the last record by
    /// `finish` at the latest; tar's reports a sample's start when its first member's
    /// header is read, and the end of the last sample once the archive ends.
    fn drain_offsets(&mut self, out: &mut Vec<u64>) {
        out.append(&mut self.take_offsets());
    }
    /// The start and length of a record begun and not yet complete, when the format tells
    /// its length ahead (a TFRecord's length field, a fixed size), so that a reader can
    /// refuse one too long for it before its bytes arrive.
    fn known_len(&self) -> Option<(u64, u64)> {
        None
    }
    /// Whether the records ended before the input did (a tar's end-of-archive block): the
    /// last boundary reported closes the last record, and the bytes after it are none.
    fn ended(&self) -> bool {
        false
    }
    /// The first offset a boundary not reported yet may lie at, given that `pos` bytes
    /// were fed: `pos`, except while a tar header chain (long name, PAX) is unfinished.
    fn pending_from(&self, pos: u64) -> u64 {
        pos
    }
}

/// The error for an input of `size` bytes shorter than its fixed `header`: one message for
/// every command (`read` sees it in the file's size, `shuffle` when its input ends).
pub fn short_of_header(header: u64, size: u64) -> String {
    format!(
        "the input ends at byte {size}, before its {header}-byte header does (a header \
         larger than the file: check --format fixed:SIZE:HEADER)"
    )
}

/// A decoding error at a byte offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanError {
    /// Where in the file.
    pub offset: u64,
    /// What was expected and what was found.
    pub what: String,
}

/// The payload span of record `i` of an indexed file, given its frame offsets (record
/// starts plus an end sentinel).
pub fn indexed_span(format: &Format, offsets: &[u64], last_unterminated: bool, i: usize) -> Span {
    let (start, next) = (offsets[i], offsets[i + 1]);
    match format {
        Format::Lines { .. } => {
            let last = i + 2 == offsets.len();
            let sep = if last && last_unterminated { 0 } else { 1 };
            Span {
                offset: start,
                len: next - start - sep,
            }
        }
        Format::TfRecord { .. } => Span {
            offset: start + 12,
            len: next - start - 16,
        },
        Format::Tar | Format::Mds => Span {
            offset: start,
            len: next - start,
        },
        _ => unreachable!("only lines, tfrecord, tar and mds are indexed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_formats() {
        assert_eq!("npy".parse::<Format>(), Ok(Format::Npy));
        assert_eq!(
            "fixed:4K".parse::<Format>(),
            Ok(Format::Fixed {
                size: 4096,
                header: 0
            })
        );
        assert_eq!(
            "fixed:100:16".parse::<Format>(),
            Ok(Format::Fixed {
                size: 100,
                header: 16
            })
        );
        assert_eq!(
            "csv".parse::<Format>(),
            Ok(Format::Lines {
                sep: b'\n',
                skip: 1
            })
        );
        assert_eq!("ImageFolder".parse::<Format>(), Ok(Format::Files));
        assert!("fixed".parse::<Format>().is_err());
        assert!("fixed:0".parse::<Format>().is_err());
        assert!("parquet"
            .parse::<Format>()
            .unwrap_err()
            .contains("unknown format"));
        assert_eq!(
            Format::from_extension(Path::new("a/b.TFRecord")),
            Some(Format::TfRecord { verify: true })
        );
        assert_eq!(Format::from_extension(Path::new("x.bin")), None);
    }
}
