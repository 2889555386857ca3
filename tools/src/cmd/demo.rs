//! `riffle demo`: the whole engine end to end on a dataset it makes and removes.

use std::sync::Arc;
use std::time::Instant;

use crate::out::outln;
use anyhow::{bail, Context, Result};
use riffle::dataset::{Dataset, OpenOptions};
use riffle::gen::{self, GenFormat, GenSpec};
use riffle::io::IoConfig;
use riffle::modes::{self, ReadOptions};
use riffle::order::Grouping;
use riffle::size::{human_bytes, parse_size};

#[derive(clap::Args)]
pub struct Args {
    /// Number of records in the demo dataset.
    #[arg(long, default_value_t = 65536)]
    pub records: u64,
    /// Size of each record (suffixes K, M accepted; at least 12 bytes).
    #[arg(long, default_value = "1K", value_parser = parse_size)]
    pub record_size: u64,
    /// Seed of the shuffled order.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Records per batch.
    #[arg(long, default_value_t = 256)]
    pub batch_size: u64,
    /// Reads kept in flight.
    #[arg(long, default_value_t = 64)]
    pub queue_depth: usize,
    /// Where to make the temporary directory (default: the system temp dir).
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
}

pub fn run(args: Args, throttled: bool) -> Result<()> {
    if args.records == 0 || args.record_size < 12 {
        bail!("the demo needs at least one record of at least 12 bytes");
    }
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = riffle::scratch::ScratchDir::new_in(&base, "demo")
        .with_context(|| format!("{}: cannot make a temporary directory", base.display()))?;
    let path = dir.path().join("demo.npy");
    write_dataset(&path, &args, throttled)?;
    show_device(dir.path())?;

    let ds = Arc::new(Dataset::open(
        &[&path],
        &OpenOptions::default(),
        &mut |_, _, _| {},
    )?);
    for (grouping, what) in [
        (
            Grouping::Record,
            "record grouping (an exact uniform shuffle)",
        ),
        (
            Grouping::Page { unit: 4096 },
            "page grouping (records of one 4 KiB block together, one read per block)",
        ),
    ] {
        read_epoch(&ds, &args, grouping, what)?;
    }
    outln!("  checked: every record arrived exactly once and carries its own id")?;
    drop(ds);
    let shown = dir.path().display().to_string();
    dir.close()
        .with_context(|| format!("{shown}: could not remove"))?;
    outln!("  removed {shown}")?;
    Ok(())
}

/// Writes the demo dataset to `path`: label-sorted records, each carrying its id.
fn write_dataset(path: &std::path::Path, args: &Args, throttled: bool) -> Result<()> {
    let spec = GenSpec {
        format: GenFormat::Npy,
        records: args.records,
        record_size: args.record_size,
        jitter: 0.0,
        labels: 10,
        sorted: true,
        seed: args.seed,
    };
    let io = IoConfig::sequential_write().under_throttle(throttled);
    let w = gen::generate(path, &spec, &io, &mut |_, _| {})?;
    outln!(
        "riffle demo: {} label-sorted records of {} ({}) written to {} in {:.2} s",
        args.records,
        human_bytes(args.record_size as f64),
        human_bytes(w.bytes as f64),
        path.display(),
        w.seconds
    )?;
    Ok(())
}

/// Shows the device holding `dir`, from its cached profile or a quick probe.
fn show_device(dir: &std::path::Path) -> Result<()> {
    let t = Instant::now();
    let (profile, cached) =
        super::probe::cached_or_probe(dir, &riffle::probe::ProbeOptions::new(true), false, false)?;
    let how = if cached {
        "cached profile".to_owned()
    } else {
        format!("quick probe, {:.1} s", t.elapsed().as_secs_f64())
    };
    let p4 = profile
        .random_point(4096, 32)
        .map(|p| format!(", 4 KiB random reads at QD 32: {:.0} IOPS", p.iops));
    outln!(
        "  device {} ({}): sequential read {}/s, write {}/s{} [{how}]",
        profile.device.dev,
        profile
            .device
            .name
            .as_deref()
            .unwrap_or(&profile.device.fs_type),
        human_bytes(profile.seq_read_bps),
        human_bytes(profile.seq_write_bps),
        p4.unwrap_or_default()
    )?;
    Ok(())
}

/// Reads epoch 0 of `ds` with `grouping` (described by `what`), checks that every record
/// arrives once with its own id, and shows the read's figures.
fn read_epoch(ds: &Arc<Dataset>, args: &Args, grouping: Grouping, what: &str) -> Result<()> {
    let mut o = ReadOptions::new(args.batch_size);
    o.seed = args.seed;
    o.grouping = grouping;
    o.io = IoConfig {
        depth: args.queue_depth.max(1),
        ..IoConfig::default()
    };
    let mut stream = modes::read(ds.clone(), o)?;
    let mut seen = vec![false; args.records as usize];
    let mut labels_per_batch = 0.0;
    let mut batches = 0u64;
    for b in stream.by_ref() {
        let b = b?;
        let mut labels = std::collections::HashSet::new();
        for (i, &id) in b.ids.iter().enumerate() {
            let rec = b.record(i);
            let got = u64::from_le_bytes(rec[..8].try_into().expect("8 bytes"));
            if got != id || seen[id as usize] {
                bail!("record {id} came back wrong or twice (payload says {got})");
            }
            seen[id as usize] = true;
            labels.insert(u32::from_le_bytes(rec[8..12].try_into().expect("4 bytes")));
        }
        labels_per_batch += labels.len() as f64;
        batches += 1;
    }
    if seen.iter().any(|s| !s) {
        bail!("some records were never delivered");
    }
    let r = stream.report();
    outln!("  epoch 0, {what}:")?;
    outln!(
        "    {} batches in {:.2} s: {:.0} records/s, {:.0} reads/s at QD {} ({}, {}); {:.1} of 10 labels per batch",
        r.batches,
        r.seconds,
        r.records as f64 / r.seconds,
        r.read_ops as f64 / r.seconds,
        r.queue_depth,
        r.backend,
        if r.direct { "O_DIRECT" } else { "buffered" },
        labels_per_batch / batches as f64
    )?;
    Ok(())
}
