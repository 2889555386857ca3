//! `riffle gen`: synthetic datasets whose records carry their id and label.

use std::path::PathBuf;

use anyhow::Result;
use riffle::gen::{self, GenFormat, GenSpec};
use riffle::io::IoConfig;
use riffle::size::{human_bytes, parse_size};
use serde_json::json;

use crate::out::outln;
use crate::progress;

#[derive(clap::Args)]
pub struct Args {
    /// The file to write (written under a temporary name, renamed when complete); for
    /// `files` and `mds`, the directory to make (it must not exist).
    pub out: PathBuf,
    /// npy, fixed, lines (JSON lines), tfrecord, tar (a WebDataset shard of samples ID.bin,
    /// ID.cls, ID.json), mds (a MosaicML Streaming directory: index.json and shards of one
    /// column `x`), or files (a tree OUT/LABEL/ID.bin of one file per record, ImageFolder's
    /// layout; labels ascend with the id).
    #[arg(long)]
    pub format: GenFormat,
    /// Number of records.
    #[arg(long)]
    pub records: u64,
    /// Bytes per record (lines: without the newline); suffixes K, M accepted.
    #[arg(long, value_parser = parse_size)]
    pub record_size: u64,
    /// Spread record sizes uniformly over size x [1 - F, 1 + F] (lines and tfrecord).
    #[arg(long, default_value_t = 0.0)]
    pub size_jitter: f64,
    /// Number of label classes.
    #[arg(long, default_value_t = 10)]
    pub labels: u32,
    /// Labels ascending with the record id (label-sorted data, the hard case for shuffles).
    #[arg(long)]
    pub sorted: bool,
    /// Seed of sizes and labels.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args, throttled: bool) -> Result<()> {
    let spec = GenSpec {
        format: a.format,
        records: a.records,
        record_size: a.record_size,
        jitter: a.size_jitter,
        labels: a.labels,
        sorted: a.sorted,
        seed: a.seed,
    };
    let bar = progress::bytes(a.json);
    let cfg = IoConfig::sequential_write().under_throttle(throttled);
    let rep = gen::generate(&a.out, &spec, &cfg, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    let rate = rep.bytes as f64 / rep.seconds;
    if a.json {
        outln!(
            "{}",
            json!({"path": a.out, "records": a.records, "bytes": rep.bytes, "seconds": rep.seconds, "bytes_per_s": rate})
        )?;
    } else {
        outln!(
            "wrote {} records ({}) to {} in {:.2} s ({}/s)",
            a.records,
            human_bytes(rep.bytes as f64),
            a.out.display(),
            rep.seconds,
            human_bytes(rate)
        )?;
    }
    Ok(())
}
