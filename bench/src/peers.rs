//! peers: riffle against the page-cache ways of feeding shuffled records, under a memory
//! limit smaller than the dataset (the LIRS paper's memory-limited setup): a 3 GB `.npy` of
//! 4 KiB rows read under a 1 GiB memory cgroup by
//!
//! - riffle `lirs` (O_DIRECT random reads, no page cache) and `two-pass`;
//! - numpy memmap random gather, row by row, as a PyTorch map-style loader does
//!   (`bench/peers.py memmap`);
//! - a Python shuffle buffer over sequential memmap reads (`bench/peers.py buffer`; not a
//!   full shuffle, listed for speed only).
//!
//! Each runs from a cold cache for a fixed time (or an epoch) in one run of the suite;
//! riffle's speed-up is the ratio of records per second.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use riffle::dataset::{Dataset, OpenOptions};
use riffle::emulate::MemoryLimit;
use riffle::gen::{GenFormat, GenSpec};
use riffle::modes::{read, read_two_pass, ReadOptions};
use serde::Serialize;

use crate::report;

/// Options of the suite.
#[derive(Clone, Debug)]
pub struct PeersOptions {
    /// Where results go.
    pub out: PathBuf,
    /// Where the dataset is made.
    pub data_dir: PathBuf,
    /// Dataset size in bytes.
    pub size: u64,
    /// The memory limit.
    pub memory: u64,
    /// Seconds per reader.
    pub seconds: f64,
    /// Keep the dataset.
    pub keep: bool,
}

/// One reader's run.
#[derive(Clone, Debug, Serialize)]
pub struct PeerRun {
    /// Who read.
    pub reader: String,
    /// Whether it delivers a full uniform shuffle.
    pub full_shuffle: bool,
    /// Records delivered.
    pub records: u64,
    /// Seconds.
    pub seconds: f64,
    /// Records per second.
    pub records_per_s: f64,
    /// riffle lirs's records/s over this reader's.
    pub lirs_speedup: f64,
}

/// The suite's result.
#[derive(Clone, Debug, Serialize)]
pub struct PeersReport {
    /// Dataset bytes.
    pub size: u64,
    /// Row bytes.
    pub record: u64,
    /// The memory limit.
    pub memory: u64,
    /// Records per batch.
    pub batch: u64,
    /// The runs.
    pub runs: Vec<PeerRun>,
    /// The disk's read-ahead (`queue/read_ahead_kb`), which sets how much a page fault on a
    /// memmap may read.
    pub read_ahead_kb: Option<u64>,
    /// Page cache dropped before each run.
    pub cold_cache: bool,
    /// Where written.
    pub report_dir: String,
}

const RECORD: u64 = 4096;
const BATCH: u64 = 64;

fn riffle_run(
    ds: Arc<Dataset>,
    two_pass: bool,
    scratch: &Path,
    seconds: f64,
) -> Result<(u64, f64)> {
    let started = Instant::now();
    let mut s = if two_pass {
        read_two_pass(ds, ReadOptions::new(BATCH), scratch.to_path_buf())?
    } else {
        read(ds, ReadOptions::new(BATCH))?
    };
    let mut records = 0u64;
    for b in s.by_ref() {
        records += b?.ids.len() as u64;
        if started.elapsed() > Duration::from_secs_f64(seconds) {
            break;
        }
    }
    Ok((records, started.elapsed().as_secs_f64()))
}

fn python_run(args: &[&str]) -> Result<(u64, f64)> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(args)
        .output()
        .context("running python3 (the peers need python3 with numpy)")?;
    if !out.status.success() {
        bail!(
            "{} {}: {}",
            script.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok((
        v["records"].as_u64().unwrap_or(0),
        v["seconds"].as_f64().unwrap_or(0.0),
    ))
}

/// The read-ahead of the block device holding `dir` (or of its disk), in KiB.
fn read_ahead_kb(dir: &Path) -> Option<u64> {
    let name = riffle::device::identify(dir).ok()?.name?;
    let base = PathBuf::from("/sys/class/block").join(name);
    [
        base.join("queue/read_ahead_kb"),
        base.join("../queue/read_ahead_kb"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse().ok())
}

/// Runs the suite.
pub fn run(
    opts: &PeersOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<PeersReport> {
    std::fs::create_dir_all(&opts.data_dir).with_context(|| opts.data_dir.display().to_string())?;
    let records = opts.size / RECORD;
    let path = opts.data_dir.join(format!("riffle-peers-{records}.npy"));
    progress(0, 6, "writing the dataset");
    let spec = GenSpec {
        format: GenFormat::Npy,
        records,
        record_size: RECORD,
        jitter: 0.0,
        labels: 10,
        sorted: false,
        seed: 0,
    };
    if !path.exists() {
        riffle::gen::generate(
            &path,
            &spec,
            &riffle::io::IoConfig::sequential_write(),
            &mut |_, _| {},
        )?;
    }
    let result = (|| -> Result<PeersReport> {
        let ds = Arc::new(Dataset::open(
            &[&path],
            &OpenOptions::default(),
            &mut |_, _, _| {},
        )?);
        let limit = MemoryLimit::enter(opts.memory)?;
        let mut cold = true;
        let secs = format!("{}", opts.seconds);
        let p = path.display().to_string();
        let batch = BATCH.to_string();
        let mut runs: Vec<(String, bool, u64, f64)> = Vec::new();
        let readers: [(&str, bool); 4] = [
            ("riffle lirs", true),
            ("riffle two-pass", true),
            ("numpy memmap gather (PyTorch map-style)", true),
            ("python shuffle buffer (10k rows)", false),
        ];
        for (i, (name, full)) in readers.iter().enumerate() {
            progress(1 + i, 6, name);
            cold &= report::drop_caches();
            let (n, s) = match i {
                0 => riffle_run(ds.clone(), false, &opts.data_dir, opts.seconds)?,
                1 => riffle_run(ds.clone(), true, &opts.data_dir, opts.seconds)?,
                2 => python_run(&["memmap", &p, &secs, &batch, "1"])?,
                _ => python_run(&["buffer", &p, &secs, &batch, "1", "10000"])?,
            };
            runs.push((name.to_string(), *full, n, s));
        }
        drop(limit);
        // For context: the same gather with no memory limit (the page cache may grow).
        progress(5, 6, "numpy memmap gather, no limit");
        cold &= report::drop_caches();
        let (n, s) = python_run(&["memmap", &p, &secs, &batch, "1"])?;
        runs.push((
            "numpy memmap gather, no memory limit (context)".into(),
            true,
            n,
            s,
        ));
        let lirs_rate = runs[0].2 as f64 / runs[0].3.max(1e-9);
        let dir = report::results_dir(&opts.out)?;
        let rep = PeersReport {
            size: records * RECORD,
            record: RECORD,
            memory: opts.memory,
            batch: BATCH,
            runs: runs
                .into_iter()
                .map(|(reader, full_shuffle, records, seconds)| {
                    let rate = records as f64 / seconds.max(1e-9);
                    PeerRun {
                        reader,
                        full_shuffle,
                        records,
                        seconds,
                        records_per_s: rate,
                        lirs_speedup: lirs_rate / rate.max(1e-9),
                    }
                })
                .collect(),
            cold_cache: cold,
            read_ahead_kb: read_ahead_kb(&opts.data_dir),
            report_dir: dir.display().to_string(),
        };
        report::write_report(&dir, "peers", &serde_json::to_value(&rep)?, &markdown(&rep))?;
        Ok(rep)
    })();
    if !opts.keep {
        let _ = std::fs::remove_file(&path);
    }
    result
}

/// The report as Markdown.
pub fn markdown(r: &PeersReport) -> String {
    let mut s = String::new();
    s.push_str("# peers: riffle against the page-cache way, under a memory limit\n\n");
    s.push_str(&format!(
        "{} of {} B rows (`.npy`), read under a {} memory cgroup (page cache included), \
         batches of {}, cold cache: {}; each reader runs for the same time or one epoch. The \
         disk's read-ahead is {} KiB: what one memmap page fault may read.\n\n",
        riffle::size::human_bytes(r.size as f64),
        r.record,
        riffle::size::human_bytes(r.memory as f64),
        r.batch,
        r.cold_cache,
        r.read_ahead_kb
            .map(|k| k.to_string())
            .unwrap_or_else(|| "unknown".into())
    ));
    s.push_str("| reader | full shuffle | records | seconds | records/s | riffle lirs speed-up |\n|---|---|---:|---:|---:|---:|\n");
    for x in &r.runs {
        s.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.0} | {:.2}x |\n",
            x.reader,
            if x.full_shuffle { "yes" } else { "no" },
            x.records,
            x.seconds,
            x.records_per_s,
            x.lirs_speedup
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both Python peers read a small `.npy` and report what they delivered: the memmap
    /// gather every row once (an epoch), the shuffle buffer all but what it still holds.
    #[test]
    fn python_peers_read_an_npy() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let path = dir.path().join("p.npy");
        let spec = GenSpec {
            format: GenFormat::Npy,
            records: 3000,
            record_size: 256,
            jitter: 0.0,
            labels: 10,
            sorted: false,
            seed: 0,
        };
        riffle::gen::generate(
            &path,
            &spec,
            &riffle::io::IoConfig::default(),
            &mut |_, _| {},
        )
        .unwrap();
        let p = path.display().to_string();
        let (n, s) = python_run(&["memmap", &p, "60", "64", "1"]).unwrap();
        assert_eq!(n, 3000);
        assert!(s > 0.0);
        let (n, _) = python_run(&["buffer", &p, "60", "64", "1", "1000"]).unwrap();
        // 2000 rows leave the buffer; whole batches of 64 of them are counted.
        assert_eq!(n, 2000 / 64 * 64);
        assert!(python_run(&["bogus", &p, "1", "64", "1"]).is_err());
    }
}
