//! Test datasets the suites share: fixed-size records made once (kept when already the
//! right size) and opened as `fixed:SIZE`.

use std::path::Path;

use anyhow::Result;
use riffle::dataset::{Dataset, OpenOptions};
use riffle::format::Format;
use riffle::gen::{generate, GenFormat, GenSpec};
use riffle::io::IoConfig;

/// Writes `records` generated records of `record` bytes to `path`, unless a file of that
/// size is already there.
pub fn make_fixed(path: &Path, record: u64, records: u64) -> Result<()> {
    make(path, &fixed_spec(record, records, false))
}

/// Fixed records of `record` bytes with 10 labels, ascending with the id when `sorted`.
pub fn fixed_spec(record: u64, records: u64, sorted: bool) -> GenSpec {
    GenSpec {
        format: GenFormat::Fixed,
        records,
        record_size: record,
        jitter: 0.0,
        labels: 10,
        sorted,
        seed: 0,
    }
}

/// Writes the dataset `spec` describes to `path`, unless a file of its size is already
/// there (the name should tell the spec apart).
pub fn make(path: &Path, spec: &GenSpec) -> Result<()> {
    if std::fs::metadata(path)
        .map(|m| m.len() == spec.record_size * spec.records)
        .unwrap_or(false)
    {
        return Ok(());
    }
    generate(path, spec, &IoConfig::sequential_write(), &mut |_, _| {})?;
    Ok(())
}

/// Opens `path` as records of `record` bytes.
pub fn open_fixed(path: &Path, record: u64) -> Result<Dataset> {
    Ok(Dataset::open(
        &[path],
        &OpenOptions {
            format: Some(Format::Fixed {
                size: record,
                header: 0,
            }),
            ..OpenOptions::default()
        },
        &mut |_, _, _| {},
    )?)
}
