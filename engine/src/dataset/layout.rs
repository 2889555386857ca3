//! A file's records, worked out when its dataset is opened: the layout of fixed-size
//! records or of a `.npy` array's rows (from the file's size and header, no scan), or the
//! offset index of variable-length records (loaded or built by a scan).

use std::path::Path;
use std::sync::Arc;

use super::{index, DatasetFile, Layout, OpenOptions};
use crate::format::{npy, Format};
use crate::io::{self, Access, DataFile};
use crate::{Error, Result};

pub(super) fn open_file(
    path: &Path,
    format: &Format,
    opts: &OpenOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<DatasetFile> {
    let bad = |offset: Option<u64>, what: String| Error::BadInput {
        path: path.into(),
        offset,
        what,
    };
    // Formats indexed by a scan need the file open; fixed records and `.npy` need only its
    // size (the header is read by path), so a dataset of 100,000 such files is listed with
    // a stat each, and the reader opens them when it reads them.
    let file = match format {
        Format::Fixed { .. } | Format::Npy | Format::Files | Format::Mds => None,
        _ => Some(Arc::new(DataFile::open(
            path,
            Access::Read,
            opts.scan_io.direct,
        )?)),
    };
    let size = match &file {
        Some(f) => f.size(),
        None => {
            let meta = std::fs::metadata(path).map_err(|e| Error::io(path, "stat", None, e))?;
            if !meta.file_type().is_file() {
                return Err(bad(
                    None,
                    format!(
                        "is {}, not a regular file: random access needs a file",
                        io::file_type_name(&meta.file_type())
                    ),
                ));
            }
            meta.len()
        }
    };
    if size == 0 {
        return Err(bad(Some(0), "empty file: no records".into()));
    }
    let (layout, records, origin) = match format {
        Format::Fixed {
            size: rsize,
            header,
        } => {
            let (layout, records) = fixed_records(path, size, *rsize, *header)?;
            (layout, records, None)
        }
        Format::Npy => {
            let (layout, records) = npy_records(path, size)?;
            (layout, records, None)
        }
        Format::Files | Format::Mds => {
            unreachable!("files and mds datasets are listed by their own modules")
        }
        Format::Lines { .. } | Format::TfRecord { .. } | Format::Tar => {
            let (ix, origin) = index::load_or_build(
                file.as_ref().expect("indexed formats are opened"),
                format,
                (opts.stale, opts.save_index, opts.index_room.as_deref()),
                &opts.scan_io,
                progress,
            )?;
            let n = ix.len();
            (Layout::Indexed(ix), n, Some(origin))
        }
    };
    if records == 0 {
        return Err(bad(None, "the file holds no records".into()));
    }
    Ok(DatasetFile {
        path: path.into(),
        size,
        records,
        layout,
        index_origin: origin,
        beneath: None,
        under: None,
        identity: None,
    })
}

/// The layout and record count of a file of `size` bytes holding records of `rsize` bytes
/// after a `header`.
fn fixed_records(path: &Path, size: u64, rsize: u64, header: u64) -> Result<(Layout, u64)> {
    let bad = |offset: Option<u64>, what: String| Error::BadInput {
        path: path.into(),
        offset,
        what,
    };
    if size < header {
        return Err(bad(
            Some(size),
            crate::format::short_of_header(header, size),
        ));
    }
    let body = size - header;
    let tail = body % rsize;
    if tail != 0 {
        return Err(bad(
            Some(size - tail),
            format!("a partial record: the last {tail} bytes do not fill a {rsize}-byte record"),
        ));
    }
    Ok((
        Layout::Fixed {
            header,
            size: rsize,
        },
        body / rsize,
    ))
}

/// The layout and record count of the `.npy` file at `path`, `size` bytes: its rows.
fn npy_records(path: &Path, size: u64) -> Result<(Layout, u64)> {
    let bad = |offset: Option<u64>, what: String| Error::BadInput {
        path: path.into(),
        offset,
        what,
    };
    let h = read_npy_header(path, size)?;
    let need = h.data_offset + h.data_bytes();
    if size < need {
        return Err(bad(
            Some(size),
            format!(
                "data shorter than its shape {:?} says: {} bytes of data expected from byte {}, the file ends at {size}",
                h.shape,
                h.data_bytes(),
                h.data_offset
            ),
        ));
    }
    if h.row_bytes() == 0 {
        return Err(bad(
            Some(0),
            format!("rows of shape {:?} hold no bytes", h.shape),
        ));
    }
    Ok((
        Layout::Fixed {
            header: h.data_offset,
            size: h.row_bytes(),
        },
        h.rows(),
    ))
}

fn read_npy_header(path: &Path, size: u64) -> Result<npy::NpyHeader> {
    use std::os::unix::fs::FileExt;
    let bad = |e: npy::NpyError| Error::BadInput {
        path: path.into(),
        offset: Some(e.offset),
        what: e.what,
    };
    let f = crate::door::open_data(path, false).map_err(|e| Error::io(path, "open", None, e))?;
    let mut prefix = vec![0u8; (npy::PREFIX as u64).min(size) as usize];
    f.read_exact_at(&mut prefix, 0)
        .map_err(|e| Error::io(path, "read", Some(0), e))?;
    let total = npy::header_len(&prefix).map_err(bad)?;
    let mut header = vec![0u8; total.min(size) as usize];
    f.read_exact_at(&mut header, 0)
        .map_err(|e| Error::io(path, "read", Some(0), e))?;
    npy::parse(&header).map_err(bad)
}
