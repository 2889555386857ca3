//! fio parity: the engine's raw random reads against `fio --ioengine=io_uring --direct=1`
//! on the same file, block size and queue depth, in one run, as a ratio.
//!
//! Runs alternate (fio first on even points, the engine first on odd ones; twice each with
//! `repeats = 2`), with the page cache dropped before each when root, so neither side gets
//! a systematic advantage from order or cache.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use riffle::io::{self, DataFile, IoConfig};
use riffle::probe::{read_point, ReadSpec};
use riffle::size::human_bytes;
use serde::Serialize;

use crate::{fio, report};

/// Options of the suite.
#[derive(Clone, Debug)]
pub struct ParityOptions {
    /// Where `results/<date>-<host>/` goes.
    pub out: PathBuf,
    /// Where the test file is made.
    pub data_dir: PathBuf,
    /// Test file size.
    pub file_size: u64,
    /// Seconds per run.
    pub seconds: u64,
    /// Runs per side and point (averaged).
    pub repeats: usize,
    /// (block size, queue depth) points.
    pub points: Vec<(usize, usize)>,
    /// Keep the test file afterwards.
    pub keep_file: bool,
}

impl ParityOptions {
    /// The points: 4 KiB at QD 1, 32, 64, 128; 16 KiB and 64 KiB at QD 64.
    pub fn new(quick: bool, out: PathBuf, data_dir: PathBuf) -> Self {
        const K: usize = 1024;
        ParityOptions {
            out,
            data_dir,
            file_size: 4 << 30,
            seconds: if quick { 3 } else { 10 },
            repeats: if quick { 1 } else { 2 },
            points: vec![
                (4 * K, 1),
                (4 * K, 32),
                (4 * K, 64),
                (4 * K, 128),
                (16 * K, 64),
                (64 * K, 64),
            ],
            keep_file: false,
        }
    }
}

/// One point of the report.
#[derive(Clone, Debug, Serialize)]
pub struct ParityRow {
    /// Block size.
    pub bs: usize,
    /// Queue depth.
    pub qd: usize,
    /// fio's IOPS (mean over repeats).
    pub fio_iops: f64,
    /// The engine's IOPS (mean over repeats).
    pub engine_iops: f64,
    /// engine / fio.
    pub ratio: f64,
    /// fio p99 latency, us.
    pub fio_p99_us: f64,
    /// Engine p99 latency, us.
    pub engine_p99_us: f64,
}

/// The suite's result.
#[derive(Clone, Debug, Serialize)]
pub struct ParityReport {
    /// Rows by point.
    pub rows: Vec<ParityRow>,
    /// fio version.
    pub fio_version: String,
    /// The engine's backend and features.
    pub engine_backend: String,
    /// Whether the engine read with O_DIRECT.
    pub direct: bool,
    /// Whether the page cache was dropped before each run.
    pub cold_cache: bool,
    /// Test file and size.
    pub file: String,
    /// Test file size in bytes.
    pub file_size: u64,
    /// Seconds per run.
    pub seconds: u64,
    /// Runs per side and point.
    pub repeats: usize,
    /// The device.
    pub device: riffle::device::DeviceId,
    /// Where the report was written.
    pub report_dir: String,
}

/// Runs the suite; `progress(step, total, what)` before each run.
pub fn run(
    opts: &ParityOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<ParityReport> {
    let fio_version = fio::version()?;
    std::fs::create_dir_all(&opts.data_dir)
        .with_context(|| format!("{}", opts.data_dir.display()))?;
    let file = opts
        .data_dir
        .join(format!("riffle-parity-{}.dat", opts.file_size));
    let fresh = std::fs::metadata(&file)
        .map(|m| m.len() != opts.file_size)
        .unwrap_or(true);
    let total = opts.points.len() * 2 * opts.repeats + 1;
    progress(
        0,
        total,
        &format!("writing {} test file", human_bytes(opts.file_size as f64)),
    );
    if fresh {
        let cfg = IoConfig {
            depth: 8,
            slot_size: 1 << 20,
            ..IoConfig::default()
        };
        io::write_file(&file, opts.file_size, &cfg, io::pattern_filler(42))?;
    }
    let result = measure(opts, &file, fio_version, total, progress);
    if !opts.keep_file {
        let _ = std::fs::remove_file(&file);
    }
    result
}

fn measure(
    opts: &ParityOptions,
    file: &std::path::Path,
    fio_version: String,
    total: usize,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<ParityReport> {
    let df = DataFile::open(file, io::Access::Read, true)?;
    if !df.direct() {
        bail!("{}: O_DIRECT is not available here, so a parity run against fio --direct=1 means nothing", file.display());
    }
    let device = riffle::device::identify(file)?;
    let mut rows = Vec::new();
    let mut step = 1;
    let mut cold = true;
    let mut backend = String::new();
    for (i, &(bs, qd)) in opts.points.iter().enumerate() {
        let (mut fio_iops, mut eng_iops, mut fio_p99, mut eng_p99) = (0.0, 0.0, 0.0, 0.0);
        for rep in 0..opts.repeats {
            let fio_first = (i + rep) % 2 == 0;
            for side in 0..2 {
                let run_fio = (side == 0) == fio_first;
                let who = if run_fio { "fio" } else { "engine" };
                progress(
                    step,
                    total,
                    &format!("{who} bs={} qd={qd}", human_bytes(bs as f64)),
                );
                step += 1;
                cold &= report::drop_caches();
                if run_fio {
                    let r = fio::randread(file, bs, qd, opts.seconds, opts.file_size)?;
                    fio_iops += r.iops;
                    fio_p99 += r.lat_p99_us;
                } else {
                    let spec = ReadSpec {
                        bs,
                        qd,
                        duration: Duration::from_secs(opts.seconds),
                        region: 0,
                        random: true,
                        seed: (i * 7 + rep) as u64,
                    };
                    let cfg = IoConfig::default();
                    if backend.is_empty() {
                        let b = io::open_backend(
                            &IoConfig {
                                depth: qd,
                                slot_size: bs,
                                ..cfg.clone()
                            },
                            4096,
                        )?;
                        backend = format!("{} ({})", b.kind().name(), b.features());
                    }
                    let p = read_point(file, &spec, &cfg)?;
                    eng_iops += p.iops;
                    eng_p99 += p.lat_p99_us;
                }
            }
        }
        let n = opts.repeats as f64;
        rows.push(ParityRow {
            bs,
            qd,
            fio_iops: fio_iops / n,
            engine_iops: eng_iops / n,
            ratio: eng_iops / fio_iops,
            fio_p99_us: fio_p99 / n,
            engine_p99_us: eng_p99 / n,
        });
    }
    let dir = report::results_dir(&opts.out)?;
    let rep = ParityReport {
        rows,
        fio_version,
        engine_backend: backend,
        direct: true,
        cold_cache: cold,
        file: file.display().to_string(),
        file_size: opts.file_size,
        seconds: opts.seconds,
        repeats: opts.repeats,
        device,
        report_dir: dir.display().to_string(),
    };
    report::write_report(
        &dir,
        "fio-parity",
        &serde_json::to_value(&rep)?,
        &markdown(&rep),
    )?;
    Ok(rep)
}

/// The report as Markdown.
pub fn markdown(r: &ParityReport) -> String {
    let mut s = String::new();
    s.push_str("# fio parity: engine random reads vs fio io_uring\n\n");
    s.push_str(&format!(
        "{} on `{}` ({}, {}), file of {}, {} s per run, {} run(s) per side, cache {}.\n",
        r.fio_version,
        r.device.dev,
        r.device.name.as_deref().unwrap_or("?"),
        r.device.fs_type,
        human_bytes(r.file_size as f64),
        r.seconds,
        r.repeats,
        if r.cold_cache {
            "dropped before each run"
        } else {
            "NOT dropped (not root)"
        }
    ));
    s.push_str(&format!(
        "Engine backend: {}, O_DIRECT.\n\n",
        r.engine_backend
    ));
    s.push_str(
        "| block | QD | fio IOPS | engine IOPS | engine / fio | fio p99 us | engine p99 us |\n",
    );
    s.push_str("|---:|---:|---:|---:|---:|---:|---:|\n");
    for row in &r.rows {
        s.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {:.3} | {:.0} | {:.0} |\n",
            human_bytes(row.bs as f64),
            row.qd,
            row.fio_iops,
            row.engine_iops,
            row.ratio,
            row.fio_p99_us,
            row.engine_p99_us
        ));
    }
    s
}
