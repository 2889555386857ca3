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
    /// The points to measure.
    pub points: Vec<ParityPoint>,
    /// Keep the test file afterwards.
    pub keep_file: bool,
}

impl ParityOptions {
    /// Random reads of 4 KiB at QD 1, 32, 64, 128, of 16 KiB and 64 KiB at QD 64, and a
    /// sequential read of 1 MiB at QD 8 (the probe's sequential figure).
    pub fn new(quick: bool, out: PathBuf, data_dir: PathBuf) -> Self {
        const K: usize = 1024;
        let r = |bs, qd| ParityPoint {
            bs,
            qd,
            sequential: false,
        };
        ParityOptions {
            out,
            data_dir,
            file_size: 4 << 30,
            seconds: if quick { 3 } else { 10 },
            repeats: if quick { 1 } else { 2 },
            points: vec![
                r(4 * K, 1),
                r(4 * K, 32),
                r(4 * K, 64),
                r(4 * K, 128),
                r(16 * K, 64),
                r(64 * K, 64),
                ParityPoint {
                    bs: 1024 * K,
                    qd: 8,
                    sequential: true,
                },
            ],
            keep_file: false,
        }
    }
}

/// One point to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ParityPoint {
    /// Block size.
    pub bs: usize,
    /// Queue depth.
    pub qd: usize,
    /// Sequential (fio `--rw=read`) instead of random (`--rw=randread`).
    pub sequential: bool,
}

/// One point of the report.
#[derive(Clone, Debug, Serialize)]
pub struct ParityRow {
    /// `randread` or `read` (sequential).
    pub rw: &'static str,
    /// Block size.
    pub bs: usize,
    /// Queue depth.
    pub qd: usize,
    /// fio's IOPS (mean over repeats).
    pub fio_iops: f64,
    /// The engine's IOPS (mean over repeats).
    pub engine_iops: f64,
    /// fio's IOPS in each run, to show the device's run-to-run spread.
    pub fio_runs: Vec<f64>,
    /// The engine's IOPS in each run.
    pub engine_runs: Vec<f64>,
    /// engine / fio.
    pub ratio: f64,
    /// fio p99 latency, us.
    pub fio_p99_us: f64,
    /// Engine p99 latency, us.
    pub engine_p99_us: f64,
    /// CPU (user + system) fio spent per read, us: its process's rusage over its reads
    /// (IOPS x seconds).
    pub fio_cpu_us_per_read: f64,
    /// CPU the engine spent per read, us: this process's rusage (every thread, io_uring's
    /// workers included) over its reads.
    pub engine_cpu_us_per_read: f64,
}

/// CPU seconds (user + system) of this process, or of its children waited for.
fn cpu_seconds(who: nix::sys::resource::UsageWho) -> f64 {
    let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    nix::sys::resource::getrusage(who)
        .map(|u| tv(u.user_time()) + tv(u.system_time()))
        .unwrap_or(0.0)
}

/// The suite's result.
#[derive(Clone, Debug, Serialize)]
pub struct ParityReport {
    /// Rows by point.
    pub rows: Vec<ParityRow>,
    /// fio version.
    pub fio_version: String,
    /// How fio's buffers were allocated.
    pub fio_mem: fio::FioMem,
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
    /// The class the device was emulated as (`riffle bench --emulate`), if any: then both
    /// sides ran under that throttle.
    pub emulated: Option<riffle::emulate::DeviceClass>,
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
        let cfg = IoConfig::sequential_write();
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
    // fio's buffers on huge pages when this machine allows, so the reference is not held
    // back by split requests (see fio::HugePages).
    let _huge = fio::HugePages::reserve(64);
    let fio_mem = if _huge.is_some() {
        fio::FioMem::ShmHuge
    } else {
        fio::FioMem::Malloc
    };
    let mut rows = Vec::new();
    let mut step = 1;
    let mut cold = true;
    let mut backend = String::new();
    for (i, &ParityPoint { bs, qd, sequential }) in opts.points.iter().enumerate() {
        let rw = if sequential { "read" } else { "randread" };
        let (mut fio_p99, mut eng_p99) = (0.0, 0.0);
        let (mut fio_runs, mut engine_runs) = (Vec::new(), Vec::new());
        // CPU seconds and reads, per side, over the repeats.
        let (mut fio_cpu, mut fio_reads, mut eng_cpu, mut eng_reads) = (0.0, 0.0, 0.0, 0.0);
        use nix::sys::resource::UsageWho::{RUSAGE_CHILDREN, RUSAGE_SELF};
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
                    let before = cpu_seconds(RUSAGE_CHILDREN);
                    let r = fio::run(
                        file,
                        rw,
                        bs,
                        qd,
                        Some(opts.seconds),
                        opts.file_size,
                        fio_mem,
                    )?;
                    fio_cpu += cpu_seconds(RUSAGE_CHILDREN) - before;
                    fio_reads += r.iops * opts.seconds as f64;
                    fio_runs.push(r.iops);
                    fio_p99 += r.lat_p99_us;
                } else {
                    let spec = ReadSpec {
                        bs,
                        qd,
                        duration: Duration::from_secs(opts.seconds),
                        region: 0,
                        random: !sequential,
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
                    let before = cpu_seconds(RUSAGE_SELF);
                    let p = read_point(file, &spec, &cfg)?;
                    eng_cpu += cpu_seconds(RUSAGE_SELF) - before;
                    eng_reads += p.ops as f64;
                    engine_runs.push(p.iops);
                    eng_p99 += p.lat_p99_us;
                }
            }
        }
        let n = opts.repeats as f64;
        let (fio_iops, engine_iops) = (mean(&fio_runs), mean(&engine_runs));
        rows.push(ParityRow {
            rw,
            bs,
            qd,
            fio_iops,
            engine_iops,
            fio_runs,
            engine_runs,
            ratio: engine_iops / fio_iops,
            fio_p99_us: fio_p99 / n,
            engine_p99_us: eng_p99 / n,
            fio_cpu_us_per_read: fio_cpu * 1e6 / fio_reads.max(1.0),
            engine_cpu_us_per_read: eng_cpu * 1e6 / eng_reads.max(1.0),
        });
    }
    let dir = report::results_dir(&opts.out)?;
    let rep = ParityReport {
        rows,
        fio_version,
        fio_mem,
        engine_backend: backend,
        direct: true,
        cold_cache: cold,
        file: file.display().to_string(),
        file_size: opts.file_size,
        seconds: opts.seconds,
        repeats: opts.repeats,
        emulated: riffle::emulate::active(&device),
        device,
        report_dir: dir.display().to_string(),
    };
    report::write_report(
        &dir,
        "fio-parity",
        &serde_json::to_value(&rep)?,
        &markdown(&rep),
    )?;
    let cases: Vec<(f64, f64)> = rep
        .rows
        .iter()
        .map(|r| (r.engine_iops, r.fio_iops))
        .collect();
    crate::plot::compare(
        &dir.join("fio-parity.svg"),
        "engine random reads against fio, same file, block size and queue depth",
        "IOPS",
        "fio",
        &cases,
    )?;
    Ok(rep)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
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
    if let Some(class) = r.emulated {
        s.push_str(&format!(
            "Both sides ran with the device emulated as {class}: {}.\n",
            class.limits()
        ));
    }
    s.push_str(&format!(
        "Engine backend: {}, O_DIRECT. fio buffers: {}.\n\n",
        r.engine_backend,
        match r.fio_mem {
            fio::FioMem::ShmHuge => "huge pages (--iomem=shmhuge)",
            fio::FioMem::Malloc => "malloc (no huge pages could be reserved)",
        }
    ));
    s.push_str("| rw | block | QD | fio IOPS | engine IOPS | engine / fio | fio runs | engine runs | fio p99 us | engine p99 us | fio CPU us/read | engine CPU us/read |\n");
    s.push_str("|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|\n");
    for row in &r.rows {
        s.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.3} | {} | {} | {:.0} | {:.0} | {:.2} | {:.2} |\n",
            row.rw,
            human_bytes(row.bs as f64),
            row.qd,
            row.fio_iops,
            row.engine_iops,
            row.ratio,
            report::runs(&row.fio_runs),
            report::runs(&row.engine_runs),
            row.fio_p99_us,
            row.engine_p99_us,
            row.fio_cpu_us_per_read,
            row.engine_cpu_us_per_read
        ));
    }
    s
}
