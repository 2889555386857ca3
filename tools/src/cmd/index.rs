//! `riffle index DATASET`: builds or validates the offset index and reports on it.

use std::time::Instant;

use anyhow::Result;
use riffle::dataset::IndexOrigin;
use riffle::size::human_bytes;
use serde_json::json;

use super::dataset::DatasetArgs;
use crate::out::outln;
use crate::progress;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub data: DatasetArgs,
    /// Refuse a stale or corrupt index instead of rebuilding it.
    #[arg(long)]
    pub no_rebuild: bool,
    /// Skip TFRecord CRC checks while scanning (faster; corruption goes unnoticed).
    #[arg(long)]
    pub no_verify: bool,
    /// Fail if any record is longer than this memory budget.
    #[arg(long, value_parser = riffle::size::parse_budget)]
    pub memory: Option<u64>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<()> {
    let opts = a.data.options(a.no_rebuild, a.no_verify, a.memory)?;
    let bar = progress::bytes(a.json);
    let t = Instant::now();
    let src = a.data.spec()?.open(&opts, &mut |path, done, total| {
        bar.set_message(path.display().to_string());
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    // A mixture's indexes are its sources'.
    let ds = src.dataset();
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
        outln!(
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
        )?;
        return Ok(());
    }
    outln!(
        "dataset     {} file(s), {}, {}",
        ds.files().len(),
        ds.format(),
        human_bytes(ds.bytes() as f64)
    )?;
    outln!("records     {n}")?;
    outln!(
        "sizes       min {} B, mean {:.1} B, max {} B",
        stats.min,
        stats.total as f64 / n as f64,
        stats.max
    )?;
    if ds.format().needs_index() {
        outln!(
            "index       {} in memory ({per_record:.2} bytes/record); {loaded} loaded, {built} built, {rebuilt} rebuilt",
            human_bytes(ds.index_bytes() as f64)
        )?;
        if scanned > 0 {
            outln!(
                "scan        {} in {scan_secs:.2} s: {}/s",
                human_bytes(scanned as f64),
                human_bytes(scan_rate)
            )?;
        }
    } else {
        outln!("index       none needed: records are located by arithmetic")?;
    }
    Ok(())
}
