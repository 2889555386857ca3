//! `riffle index DATASET`: builds or validates the offset index and reports on it.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use riffle::dataset::{Dataset, IndexOrigin, OpenOptions, StalePolicy};
use riffle::format::Format;
use riffle::size::{human_bytes, parse_size};
use serde_json::json;

use crate::progress;

#[derive(clap::Args)]
pub struct Args {
    /// A file, a directory of files of one format, or globs.
    #[arg(required = true)]
    pub dataset: Vec<PathBuf>,
    /// npy, lines, jsonl, csv (one header line), libsvm, tfrecord or fixed:SIZE[:HEADER];
    /// optional where the extension tells.
    #[arg(long)]
    pub format: Option<Format>,
    /// Refuse a stale or corrupt index instead of rebuilding it.
    #[arg(long)]
    pub no_rebuild: bool,
    /// Skip TFRecord CRC checks while scanning (faster; corruption goes unnoticed).
    #[arg(long)]
    pub no_verify: bool,
    /// Fail if any record is longer than this memory budget.
    #[arg(long, value_parser = parse_size)]
    pub memory: Option<u64>,
    #[command(flatten)]
    pub lines: LinesFlags,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Flags that adjust the lines format, shared by the commands that open datasets.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct LinesFlags {
    /// Lines: the separator byte (one ASCII character, or an escape: \t, \0, \r, \x1e).
    #[arg(long, value_parser = parse_sep)]
    pub sep: Option<u8>,
    /// Lines: header lines to skip at the top of each file (csv skips 1 by default).
    #[arg(long)]
    pub skip: Option<u64>,
}

/// Parses a separator: one ASCII character or an escape.
pub fn parse_sep(s: &str) -> Result<u8, String> {
    match s {
        "\\n" => Ok(b'\n'),
        "\\t" => Ok(b'\t'),
        "\\0" => Ok(0),
        "\\r" => Ok(b'\r'),
        _ if s.starts_with("\\x") && s.len() == 4 => {
            u8::from_str_radix(&s[2..], 16).map_err(|_| format!("'{s}': bad hex escape"))
        }
        _ if s.len() == 1 && s.is_ascii() => Ok(s.as_bytes()[0]),
        _ => Err(format!(
            "'{s}': the separator must be one ASCII character or an escape like \\t"
        )),
    }
}

impl LinesFlags {
    /// Applies the flags to `format` (given, or told from the first file's extension).
    pub fn apply(&self, format: Option<Format>, paths: &[PathBuf]) -> Result<Option<Format>> {
        if self.sep.is_none() && self.skip.is_none() {
            return Ok(format);
        }
        let base = match format {
            Some(f) => f,
            None => {
                let files = riffle::dataset::resolve(paths)?;
                Format::from_extension(&files[0]).unwrap_or(Format::Lines {
                    sep: b'\n',
                    skip: 0,
                })
            }
        };
        match base {
            Format::Lines { sep, skip } => Ok(Some(Format::Lines {
                sep: self.sep.unwrap_or(sep),
                skip: self.skip.unwrap_or(skip),
            })),
            other => anyhow::bail!(
                "--sep and --skip apply to the lines format, not {}",
                other.name()
            ),
        }
    }
}

/// Dataset options from the common flags.
pub fn open_options(
    format: Option<Format>,
    no_rebuild: bool,
    no_verify: bool,
    memory: Option<u64>,
) -> OpenOptions {
    let format = match (format, no_verify) {
        (Some(Format::TfRecord { .. }), true) => Some(Format::TfRecord { verify: false }),
        (f, _) => f,
    };
    OpenOptions {
        format,
        stale: if no_rebuild {
            StalePolicy::Refuse
        } else {
            StalePolicy::Rebuild
        },
        max_record: memory,
        ..OpenOptions::default()
    }
}

pub fn run(a: Args) -> Result<()> {
    let format = a.lines.apply(a.format.clone(), &a.dataset)?;
    let mut opts = open_options(format, a.no_rebuild, a.no_verify, a.memory);
    if a.no_verify && opts.format.is_none() {
        // Tell the format from the extension, then turn verification off.
        let files = riffle::dataset::resolve(&a.dataset)?;
        if let Some(Format::TfRecord { .. }) = Format::from_extension(&files[0]) {
            opts.format = Some(Format::TfRecord { verify: false });
        }
    }
    let bar = progress::bytes(a.json);
    let t = Instant::now();
    let ds = Dataset::open(&a.dataset, &opts, &mut |path, done, total| {
        bar.set_message(path.display().to_string());
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    let seconds = t.elapsed().as_secs_f64();
    let stats = ds.size_stats();
    let (mut built, mut loaded, mut rebuilt, mut scanned, mut scan_secs) = (0, 0, 0, 0u64, 0.0);
    for f in ds.files() {
        match &f.index_origin {
            Some(IndexOrigin::Loaded(_)) => loaded += 1,
            Some(IndexOrigin::Built { scan, .. }) => {
                built += 1;
                scanned += scan.bytes;
                scan_secs += scan.seconds;
            }
            Some(IndexOrigin::Rebuilt { scan, .. }) => {
                rebuilt += 1;
                scanned += scan.bytes;
                scan_secs += scan.seconds;
            }
            None => {}
        }
    }
    let n = ds.len();
    let per_record = ds.index_bytes() as f64 / n as f64;
    let scan_rate = if scan_secs > 0.0 {
        scanned as f64 / scan_secs
    } else {
        0.0
    };
    if a.json {
        println!(
            "{}",
            json!({
                "format": ds.format().to_string(),
                "files": ds.files().len(),
                "records": n,
                "bytes": ds.bytes(),
                "record_bytes": {"min": stats.min, "mean": stats.total as f64 / n as f64, "max": stats.max},
                "index_bytes": ds.index_bytes(),
                "index_bytes_per_record": per_record,
                "indexes": {"loaded": loaded, "built": built, "rebuilt": rebuilt},
                "scan_bytes": scanned,
                "scan_seconds": scan_secs,
                "scan_bytes_per_s": scan_rate,
                "seconds": seconds,
            })
        );
        return Ok(());
    }
    println!(
        "dataset     {} file(s), {}, {}",
        ds.files().len(),
        ds.format(),
        human_bytes(ds.bytes() as f64)
    );
    println!("records     {n}");
    println!(
        "sizes       min {} B, mean {:.1} B, max {} B",
        stats.min,
        stats.total as f64 / n as f64,
        stats.max
    );
    if ds.format().needs_index() {
        println!(
            "index       {} in memory ({per_record:.2} bytes/record); {loaded} loaded, {built} built, {rebuilt} rebuilt",
            human_bytes(ds.index_bytes() as f64)
        );
        if scanned > 0 {
            println!(
                "scan        {} in {scan_secs:.2} s: {}/s",
                human_bytes(scanned as f64),
                human_bytes(scan_rate)
            );
        }
    } else {
        println!("index       none needed: records are located by arithmetic");
    }
    Ok(())
}
