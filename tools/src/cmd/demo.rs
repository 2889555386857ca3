//! `riffle demo`: the whole engine end to end on a dataset it makes and removes.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use riffle::io::{self, IoConfig, RangeReader};
use riffle::size::{human_bytes, parse_size};

#[derive(clap::Args)]
pub struct Args {
    /// Number of records in the demo dataset.
    #[arg(long, default_value_t = 32768)]
    pub records: u64,
    /// Size of each record (suffixes K, M accepted).
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    pub record_size: u64,
    /// Seed of the shuffled order.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Reads kept in flight.
    #[arg(long, default_value_t = 64)]
    pub queue_depth: usize,
    /// Where to make the temporary directory (default: the system temp dir).
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
}

/// Stamps each record's id (u64, little endian) at its first byte, over the pattern.
fn stamp_ids(record_size: u64) -> impl FnMut(u64, &mut [u8]) {
    let mut pattern = io::pattern_filler(7);
    move |offset, buf| {
        pattern(offset, buf);
        let end = offset + buf.len() as u64;
        for id in offset / record_size..=(end - 1) / record_size {
            for (k, b) in id.to_le_bytes().iter().enumerate() {
                let pos = id * record_size + k as u64;
                if (offset..end).contains(&pos) {
                    buf[(pos - offset) as usize] = *b;
                }
            }
        }
    }
}

pub fn run(args: Args) -> Result<()> {
    if args.records == 0 || args.record_size < 8 {
        bail!("the demo needs at least one record of at least 8 bytes");
    }
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::Builder::new()
        .prefix("riffle-demo-")
        .tempdir_in(&base)
        .with_context(|| format!("{}: cannot make a temporary directory", base.display()))?;
    let path = dir.path().join("demo.fixed");
    let size = args.records * args.record_size;
    println!(
        "riffle demo: {} records of {} ({}) in {}",
        args.records,
        human_bytes(args.record_size as f64),
        human_bytes(size as f64),
        dir.path().display()
    );

    let wcfg = IoConfig {
        depth: 8,
        slot_size: 1 << 20,
        ..IoConfig::default()
    };
    let w = io::write_file(&path, size, &wcfg, stamp_ids(args.record_size))?;
    println!(
        "  wrote the dataset in {:.2} s ({}/s, {}, {})",
        w.seconds,
        human_bytes(size as f64 / w.seconds),
        if w.direct { "O_DIRECT" } else { "buffered" },
        w.backend.name()
    );

    let t = Instant::now();
    let (profile, cached) = super::probe::cached_or_probe(
        dir.path(),
        &riffle::probe::ProbeOptions::new(true),
        false,
        false,
    )?;
    let how = if cached {
        "cached profile".to_owned()
    } else {
        format!("quick probe, {:.1} s", t.elapsed().as_secs_f64())
    };
    let rs_point = profile
        .random
        .iter()
        .filter(|p| p.bs >= args.record_size as usize)
        .min_by_key(|p| (p.bs, p.qd.abs_diff(args.queue_depth)));
    println!(
        "  device {} ({}): sequential read {}/s, write {}/s{} [{how}]",
        profile.device.dev,
        profile
            .device
            .name
            .as_deref()
            .unwrap_or(&profile.device.fs_type),
        human_bytes(profile.seq_read_bps),
        human_bytes(profile.seq_write_bps),
        rs_point
            .map(|p| format!(
                ", {} random reads at QD {}: {:.0} IOPS",
                human_bytes(p.bs as f64),
                p.qd,
                p.iops
            ))
            .unwrap_or_default()
    );

    // One epoch in a shuffled order: every record read once, straight from the device.
    let mut order: Vec<u64> = (0..args.records).collect();
    order.shuffle(&mut SmallRng::seed_from_u64(args.seed));
    let rcfg = IoConfig {
        depth: args.queue_depth,
        slot_size: (args.record_size as usize).max(4096),
        ..IoConfig::default()
    };
    let mut reader = RangeReader::open(&[&path], &rcfg)?;
    let mut seen = vec![false; args.records as usize];
    let mut bad = None;
    let rs = args.record_size;
    let t = Instant::now();
    reader.read_ranges(
        order.iter().map(|&id| (0, id * rs, rs as usize)),
        |i, bytes| {
            let id = order[i];
            let got = bytes
                .get(..8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
            if got != Some(id) || seen[id as usize] {
                bad.get_or_insert((id, got));
            }
            seen[id as usize] = true;
        },
    )?;
    let secs = t.elapsed().as_secs_f64();
    if let Some((id, got)) = bad {
        bail!("record {id} came back wrong (found id {got:?})");
    }
    if seen.iter().any(|s| !s) {
        bail!("some records were never delivered");
    }
    let st = reader.stats();
    println!(
        "  epoch 0 (seed {}): {} records in shuffled order in {:.2} s: {:.0} records/s, {}/s, {:.0} IOPS at QD {} ({}, {})",
        args.seed,
        args.records,
        secs,
        args.records as f64 / secs,
        human_bytes(st.delivered_bytes as f64 / secs),
        st.read_ops as f64 / secs,
        args.queue_depth,
        reader.backend_kind().name(),
        if reader.direct() { "O_DIRECT" } else { "buffered" }
    );
    println!("  checked: every record arrived exactly once and carries its own id");
    drop(reader);
    let shown = dir.path().display().to_string();
    dir.close()
        .with_context(|| format!("{shown}: could not remove"))?;
    println!("  removed {shown}");
    Ok(())
}
