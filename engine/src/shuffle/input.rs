//! Where a shuffle's records come from: each input classified before any is read (a
//! regular file, or a stream read in order), then read in chunks (direct reads through the
//! I/O core for a file, plain reads for a stream) and cut into records by the format's
//! scanner ([`Cutter`]), the same parser the index builder uses.

use std::io::Read;
use std::os::fd::AsFd;
use std::path::Path;

use super::Input;
use crate::format::cut::{CutError, Cuts, Cutter};
use crate::format::Format;
use crate::{Error, Result};

/// How an input is read, decided by `stat` (symlinks followed) before it is opened.
#[derive(Debug)]
pub(super) enum Source<'a> {
    /// A regular file of `size` bytes: large direct reads through the I/O core.
    File { path: &'a Path, size: u64 },
    /// Plain reads in order, no size known: standard input (`path` None), or a path that
    /// is not a regular file. Opened once, when its turn comes: opening a FIFO waits for
    /// a writer, as `cat` does, and a second open would wait for another (or, through
    /// `/dev/fd/N`, meet the end of a pipe already drained).
    Stream { path: Option<&'a Path> },
}

impl Source<'_> {
    pub(super) fn size(&self) -> u64 {
        match self {
            Source::File { size, .. } => *size,
            Source::Stream { .. } => 0,
        }
    }

    /// The input as errors name it.
    pub(super) fn name(&self) -> String {
        match self {
            Source::File { path, .. } | Source::Stream { path: Some(path) } => {
                path.display().to_string()
            }
            Source::Stream { path: None } => "<stdin>".to_owned(),
        }
    }
}

/// Classifies every input, refusing what cannot be read (missing paths, directories,
/// sockets) and a pipe or FIFO given twice, counting standard input: a pipe is read to
/// its end once, so its second mention would read nothing, or wait forever for a writer.
pub(super) fn classify(inputs: &[Input]) -> Result<Vec<Source<'_>>> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut pipes: Vec<((u64, u64), String)> = Vec::new();
    let mut sources = Vec::with_capacity(inputs.len());
    for input in inputs {
        let (source, meta) = match input {
            Input::Stdin => {
                let meta = std::io::stdin()
                    .as_fd()
                    .try_clone_to_owned()
                    .map(std::fs::File::from)
                    .and_then(|f| f.metadata())
                    .ok();
                (Source::Stream { path: None }, meta)
            }
            Input::File(p) => {
                let meta = std::fs::metadata(p).map_err(|e| Error::io(p, "open", None, e))?;
                let t = meta.file_type();
                let refuse = |why: &str| Error::BadInput {
                    path: p.clone(),
                    offset: None,
                    what: format!("is {}, {why}", crate::io::file_type_name(&t)),
                };
                let source = if t.is_file() {
                    Source::File {
                        path: p,
                        size: meta.len(),
                    }
                } else if t.is_dir() {
                    return Err(refuse("expected a file, a pipe or a device to read"));
                } else if t.is_socket() {
                    return Err(refuse("which cannot be opened for reading"));
                } else {
                    Source::Stream { path: Some(p) }
                };
                (source, Some(meta))
            }
        };
        if let Some(m) = meta.filter(|m| m.file_type().is_fifo()) {
            let name = source.name();
            if let Some((_, first)) = pipes.iter().find(|(id, _)| *id == (m.dev(), m.ino())) {
                return Err(Error::Invalid(format!(
                    "{first} and {name} are the same pipe, which can be read only once"
                )));
            }
            pipes.push(((m.dev(), m.ino()), name));
        }
        sources.push(source);
    }
    Ok(sources)
}

/// Calls `f(offset, record)` for every record of an input, cut by `format`'s scanner (for
/// lines, the separator stripped, and a last record without separator still counts).
/// Regular files are read with large direct reads through the I/O core (smaller ones for
/// `small_reads`); streams with plain reads. A record longer than `max` is an error.
/// Returns the input's header bytes (fixed records).
pub(super) fn for_each_record(
    source: &Source,
    format: &Format,
    max: u64,
    small_reads: bool,
    mut f: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<Vec<u8>> {
    let name = source.name();
    let mut cut = Cutter::new(format, max).map_err(Error::Invalid)?;
    let mut feed = |cut: &mut Cutter, chunk: &[u8]| each(cut.feed(chunk), &name, max, &mut f);
    match *source {
        // One small file, one record (a files dataset): a plain read, not a ring set up and
        // torn down for each of many thousands of files.
        Source::File { path: p, size } if matches!(format, Format::Files) && size <= 8 << 20 => {
            let bytes = read_small(p, size)?;
            feed(&mut cut, &bytes)?;
        }
        Source::File { path: p, .. } => {
            let file =
                std::sync::Arc::new(crate::io::DataFile::open(p, crate::io::Access::Read, true)?);
            let cfg = if small_reads {
                crate::io::IoConfig {
                    depth: 4,
                    slot_size: 1 << 20,
                    ..crate::io::IoConfig::default()
                }
            } else {
                crate::io::scan_config()
            };
            crate::io::scan_file(&file, &cfg, |_, chunk| feed(&mut cut, chunk))?;
        }
        Source::Stream { path } => {
            let mut reader: Box<dyn Read> = match path {
                None => Box::new(std::io::stdin().lock()),
                Some(p) => Box::new(
                    crate::door::open_stream(p).map_err(|e| Error::io(p, "open", None, e))?,
                ),
            };
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = match reader.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(Error::io(&name, "read", Some(cut.pos()), e)),
                };
                feed(&mut cut, &buf[..n])?;
            }
        }
    }
    each(cut.finish(), &name, max, &mut f)?;
    Ok(cut.head().to_vec())
}

/// A small regular file's bytes, through the door (not waiting on a FIFO swapped in since it
/// was classified), refused unless it is still a regular file of `size` bytes.
fn read_small(p: &Path, size: u64) -> Result<Vec<u8>> {
    let f = crate::door::open_data(p, false).map_err(|e| Error::io(p, "open", None, e))?;
    let meta = f.metadata().map_err(|e| Error::io(p, "stat", None, e))?;
    if !meta.is_file() || meta.len() != size {
        return Err(Error::BadInput {
            path: p.into(),
            offset: None,
            what: "changed since the inputs were listed: refused, not read".into(),
        });
    }
    let mut bytes = Vec::with_capacity(size as usize);
    f.take(size)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(p, "read", Some(bytes.len() as u64), e))?;
    Ok(bytes)
}

/// Hands each record of a batch to `f`; a cutting error names the input and byte offset.
#[inline]
fn each(
    mut cuts: Cuts<'_>,
    name: &str,
    max: u64,
    f: &mut impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    loop {
        match cuts.next_record() {
            Ok(Some((at, rec))) => f(at, rec)?,
            Ok(None) => return Ok(()),
            Err(e) => return Err(cut_error(e, name, max)),
        }
    }
}

#[cold]
fn cut_error(e: CutError, name: &str, max: u64) -> Error {
    let (offset, what) = match e {
        CutError::Bad(e) => (e.offset, e.what),
        CutError::TooLong { offset, len } => (
            offset,
            format!(
                "a record of {len} bytes or more starts here, more than the memory budget \
                 allows ({max} bytes per record)"
            ),
        ),
    };
    Error::BadInput {
        path: name.into(),
        offset: Some(offset),
        what,
    }
}
