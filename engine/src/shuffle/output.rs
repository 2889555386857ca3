//! Where a shuffle's records go: standard output, one file, or numbered parts.
//!
//! Files are written under private temporary names ([`TempFile`]) and committed together
//! when the last record is out: all synced, all renamed, the directory synced. A split
//! output is a set: parts `OUT.000`, `OUT.001`, ... of an earlier run beyond the new count
//! are removed (with a notice), so `OUT.*` never mixes two runs. Only parts riffle wrote
//! are removed (issue 30 D20): each split run commits, with its parts, a manifest
//! `.OUT.riffle-parts` of each part's number, device, inode and size, and a rerun removes
//! an earlier part only while it is still that file. Anything else named like a part (a
//! user's own `OUT.009`, a directory `OUT.010`) is left where it is, with a notice. What
//! to remove is decided, and every target checked, before anything is committed. Nothing
//! appears under a final name before the whole output is complete; on error or
//! interruption nothing does.

use std::ffi::OsString;
use std::io::{BufWriter, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::parts;
use super::{Input, Output, SplitBy};
use crate::door;
use crate::io::{IoConfig, StreamWriter};
use crate::scratch::{self, TempFile};
use crate::{Error, Result};

/// Where an output's bytes go: a stream (stdout, or an existing FIFO or device such as
/// /dev/null, opened as it is) through a buffer, files through direct writes.
enum Sink {
    Stream(BufWriter<Box<dyn Write>>),
    File(StreamWriter, TempFile),
}

/// Writes records to stdout or to files under temporary names, committed when complete.
pub(super) struct OutputWriter {
    target: Output,
    split: Option<SplitBy>,
    sep: Option<u8>,
    /// Bytes that end every output file (a tar's end-of-archive blocks).
    trailer: Vec<u8>,
    /// The open output: its final path (`<stdout>` for stdout) and where bytes go.
    current: Option<(PathBuf, Sink)>,
    /// Finished parts, waiting for the commit.
    done: Vec<(TempFile, PathBuf)>,
    records: u64,
    bytes: u64,
    index: usize,
    /// Under an I/O throttle (`IoConfig::throttled`).
    throttled: bool,
}

impl OutputWriter {
    pub(super) fn new(
        target: &Output,
        split: Option<SplitBy>,
        sep: Option<u8>,
        trailer: Vec<u8>,
        throttled: bool,
    ) -> Result<Self> {
        let mut w = OutputWriter {
            target: target.clone(),
            split,
            sep,
            trailer,
            current: None,
            done: Vec::new(),
            records: 0,
            bytes: 0,
            index: 0,
            throttled,
        };
        w.open_next()?;
        Ok(w)
    }

    fn name(&self) -> Option<PathBuf> {
        match (&self.target, self.split) {
            (Output::File(p), None) => Some(p.clone()),
            (Output::File(p), Some(_)) => Some(part_name(p, self.index)),
            (Output::Stdout, _) => None,
        }
    }

    fn open_next(&mut self) -> Result<()> {
        let open = match self.name() {
            None => (
                PathBuf::from("<stdout>"),
                Sink::Stream(BufWriter::with_capacity(
                    1 << 20,
                    Box::new(std::io::stdout()),
                )),
            ),
            // Through the door: a FIFO or character device is written into, as a shell
            // redirection would; a block device, directory or socket is refused; a file
            // (or nothing) is replaced by a temporary file when the output is complete.
            Some(path) => match door::output_target(&path)? {
                door::OutputTarget::Stream(f) => (
                    path,
                    Sink::Stream(BufWriter::with_capacity(1 << 20, Box::new(f))),
                ),
                door::OutputTarget::Replace => self.temp_sink(path)?,
            },
        };
        self.current = Some(open);
        self.index += 1;
        self.records = 0;
        self.bytes = 0;
        Ok(())
    }

    fn temp_sink(&self, final_path: PathBuf) -> Result<(PathBuf, Sink)> {
        let temp = TempFile::beside(&final_path)?;
        let cfg = IoConfig {
            depth: 4,
            slot_size: 1 << 20,
            throttled: self.throttled,
            ..IoConfig::default()
        };
        let w = StreamWriter::for_temp(&temp, &cfg)?;
        Ok((final_path, Sink::File(w, temp)))
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let (path, sink) = self.current.as_mut().expect("an open output");
        match sink {
            Sink::Stream(w) => w
                .write_all(bytes)
                .map_err(|e| Error::io(&*path, "write", None, e)),
            Sink::File(w, _) => w.write(bytes),
        }
    }

    pub(super) fn header(&mut self, h: &[u8]) -> Result<()> {
        self.write(h)
    }

    pub(super) fn record(&mut self, rec: &[u8]) -> Result<()> {
        let full = match self.split {
            Some(SplitBy::Lines(n)) => self.records >= n,
            Some(SplitBy::Bytes(n)) => self.bytes >= n,
            None => false,
        };
        if full {
            self.close_current()?;
            self.open_next()?;
        }
        self.write(rec)?;
        if let Some(sep) = self.sep {
            self.write(&[sep])?;
        }
        self.records += 1;
        self.bytes += rec.len() as u64 + self.sep.is_some() as u64;
        Ok(())
    }

    fn close_current(&mut self) -> Result<()> {
        if self.current.is_some() && !self.trailer.is_empty() {
            let t = std::mem::take(&mut self.trailer);
            let written = self.write(&t);
            self.trailer = t;
            written?;
        }
        if let Some((path, sink)) = self.current.take() {
            match sink {
                Sink::Stream(mut w) => w.flush().map_err(|e| Error::io(&path, "write", None, e))?,
                Sink::File(w, temp) => {
                    w.finish()?;
                    self.done.push((temp, path));
                }
            }
        }
        Ok(())
    }

    /// Closes everything, commits the files as one set and removes parts of an earlier
    /// split run beyond this one's. Returns the outputs' names.
    pub(super) fn finish(mut self) -> Result<Vec<String>> {
        self.close_current()?;
        let mut done = std::mem::take(&mut self.done);
        let mut names: Vec<String> = done.iter().map(|(_, p)| p.display().to_string()).collect();
        match (&self.target, self.split) {
            (Output::File(base), Some(_)) => {
                // Decided before anything is committed: the earlier run's parts to remove
                // (its manifest is about to be replaced), and what is left alone.
                let earlier = parts::Earlier::find(base, self.index)?;
                done.extend(parts::manifest(base, &done)?);
                scratch::commit_all(done)?;
                earlier.remove(base);
            }
            (Output::Stdout, _) => {
                scratch::commit_all(done)?;
                names.push("<stdout>".into());
            }
            _ => scratch::commit_all(done)?,
        }
        Ok(names)
    }
}

/// Whether `path` exists and is a FIFO or a character device (following links: `>(cmd)`
/// and /dev/stdout on a pipe are links to one).
pub(super) fn is_stream(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo() || m.file_type().is_char_device())
}

/// Refuses an output that is one of the inputs (same device and inode, through any link):
/// the file named, or for a split output every part `OUT.NNN` already there, since any of
/// them may be replaced. Checked before anything is read or written.
pub(super) fn refuse_inputs(
    target: &Output,
    split: Option<SplitBy>,
    inputs: &[Input],
) -> Result<()> {
    let Output::File(base) = target else {
        return Ok(());
    };
    let inputs: Vec<PathBuf> = inputs
        .iter()
        .filter_map(|i| match i {
            Input::File(p) => Some(p.clone()),
            Input::Stdin => None,
        })
        .collect();
    let outputs = match split {
        None => vec![base.clone()],
        Some(_) => existing_parts(base)?.into_iter().map(|(_, p)| p).collect(),
    };
    door::refuse_inputs(&outputs, &inputs)
}

/// `OUT.000`, `OUT.001`, ... (three digits, more past 999).
pub(super) fn part_name(base: &Path, index: usize) -> PathBuf {
    let mut s = base.as_os_str().to_owned();
    s.push(format!(".{index:03}"));
    PathBuf::from(s)
}

/// The parts `BASE.NNN` in `base`'s directory, with their numbers: only names this writer
/// would make (`OUT.007`, not `OUT.0007`).
pub(super) fn existing_parts(base: &Path) -> Result<Vec<(usize, PathBuf)>> {
    let dir = scratch::parent_dir(base);
    let Some(stem) = base.file_name() else {
        return Ok(Vec::new());
    };
    let mut prefix = OsString::from(stem);
    prefix.push(".");
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(dir, "list", None, e)),
    };
    let mut parts = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(digits) = name.as_bytes().strip_prefix(prefix.as_bytes()) else {
            continue;
        };
        let Some(n) = std::str::from_utf8(digits)
            .ok()
            .filter(|d| d.len() >= 3 && d.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|d| d.parse::<usize>().ok())
        else {
            continue;
        };
        if part_name(base, n).file_name() == Some(name.as_os_str()) {
            parts.push((n, entry.path()));
        }
    }
    Ok(parts)
}
