//! fio parity: the engine's raw random reads against `fio --ioengine=io_uring --direct=1`
//! on the same file, block size and queue depth, in one run, as a ratio.
//!
//! Runs alternate (fio first on even points, the engine first on odd ones; twice each with
//! `repeats = 2`), with the page cache dropped before each when root, so neither side gets
//! a systematic advantage from order or cache.

use std::path::{Path, PathBuf};
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
    let huge = fio::HugePages::reserve(64);
    let fio_mem = fio_mem(&huge);
    let backend = match opts.points.first() {
        Some(&p) => backend_name(&IoConfig::default(), p)?,
        None => String::new(),
    };
    let mut step = 1;
    let (rows, cold) = measure_points(
        file,
        opts.file_size,
        &opts.points,
        opts.seconds,
        opts.repeats,
        fio_mem,
        &mut |what| {
            progress(step, total, what);
            step += 1;
        },
    )?;
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

/// Measures `points` on `file` (of `file_size` bytes, written): fio and the engine (the
/// default `IoConfig`) alternately, fio first on even points and the engine first on odd
/// ones, flipped on every repeat, the page cache dropped before each run when root;
/// `progress(what)` before each run. Returns the rows and whether the cache was dropped
/// before every run.
pub fn measure_points(
    file: &Path,
    file_size: u64,
    points: &[ParityPoint],
    seconds: u64,
    repeats: usize,
    fio_mem: fio::FioMem,
    progress: &mut dyn FnMut(&str),
) -> Result<(Vec<ParityRow>, bool)> {
    let mut rows = Vec::new();
    let mut cold = true;
    for (i, &point) in points.iter().enumerate() {
        let (mut fio_runs, mut engine_runs) = (Vec::new(), Vec::new());
        for rep in 0..repeats {
            let fio_first = (i + rep) % 2 == 0;
            for side in 0..2 {
                let run_fio = (side == 0) == fio_first;
                let who = if run_fio { "fio" } else { "engine" };
                progress(&format!(
                    "{who} bs={} qd={}",
                    human_bytes(point.bs as f64),
                    point.qd
                ));
                cold &= report::drop_caches();
                if run_fio {
                    fio_runs.push(run_fio_side(file, file_size, point, seconds, fio_mem, &[])?);
                } else {
                    let seed = (i * 7 + rep) as u64;
                    let cfg = IoConfig::default();
                    engine_runs.push(run_engine(file, point, seconds, seed, &cfg)?);
                }
            }
        }
        rows.push(ParityRow::from_runs(point, &fio_runs, &engine_runs));
    }
    Ok((rows, cold))
}

/// One run of one side at one point.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct SideRun {
    /// Reads per second.
    pub iops: f64,
    /// p99 latency, us.
    pub p99_us: f64,
    /// CPU seconds (user + system) the side spent.
    pub cpu_seconds: f64,
    /// Reads it completed.
    pub reads: f64,
}

/// Summaries of a side's runs: mean IOPS, each run's IOPS, mean p99, CPU us per read (all
/// the runs' CPU over all their reads).
pub fn summarize(runs: &[SideRun]) -> (f64, Vec<f64>, f64, f64) {
    let iops: Vec<f64> = runs.iter().map(|r| r.iops).collect();
    let p99: Vec<f64> = runs.iter().map(|r| r.p99_us).collect();
    let cpu: f64 = runs.iter().map(|r| r.cpu_seconds).sum();
    let reads: f64 = runs.iter().map(|r| r.reads).sum();
    (mean(&iops), iops, mean(&p99), cpu * 1e6 / reads.max(1.0))
}

impl ParityRow {
    fn from_runs(point: ParityPoint, fio_runs: &[SideRun], engine_runs: &[SideRun]) -> Self {
        let (fio_iops, fio_runs, fio_p99_us, fio_cpu_us_per_read) = summarize(fio_runs);
        let (engine_iops, engine_runs, engine_p99_us, engine_cpu_us_per_read) =
            summarize(engine_runs);
        ParityRow {
            rw: point.rw(),
            bs: point.bs,
            qd: point.qd,
            fio_iops,
            engine_iops,
            fio_runs,
            engine_runs,
            ratio: engine_iops / fio_iops,
            fio_p99_us,
            engine_p99_us,
            fio_cpu_us_per_read,
            engine_cpu_us_per_read,
        }
    }
}

impl ParityPoint {
    /// fio's `--rw`: `randread` or `read` (sequential).
    pub fn rw(self) -> &'static str {
        if self.sequential {
            "read"
        } else {
            "randread"
        }
    }
}

/// fio at `point` for `seconds` with `extra` options (`--fixedbufs`, ...); its CPU is its
/// process's rusage (a child waited for), over the reads its IOPS and runtime give.
pub fn run_fio_side(
    file: &Path,
    file_size: u64,
    point: ParityPoint,
    seconds: u64,
    mem: fio::FioMem,
    extra: &[&str],
) -> Result<SideRun> {
    use nix::sys::resource::UsageWho::RUSAGE_CHILDREN;
    let (r, cpu) = crate::report::cpu_of(RUSAGE_CHILDREN, || {
        fio::run_with(
            file,
            point.rw(),
            point.bs,
            point.qd,
            Some(seconds),
            file_size,
            mem,
            extra,
        )
    });
    let r = r?;
    Ok(SideRun {
        iops: r.iops,
        p99_us: r.lat_p99_us,
        cpu_seconds: cpu,
        reads: r.iops * seconds as f64,
    })
}

/// The engine's timed reads (the probe's `read_point`) at `point` for `seconds` with
/// `cfg` (its depth and slot size are the point's); its CPU is this process's rusage
/// (every thread, io_uring's workers and SQPOLL thread included).
pub fn run_engine(
    file: &Path,
    point: ParityPoint,
    seconds: u64,
    seed: u64,
    cfg: &IoConfig,
) -> Result<SideRun> {
    use nix::sys::resource::UsageWho::RUSAGE_SELF;
    let spec = ReadSpec {
        bs: point.bs,
        qd: point.qd,
        duration: Duration::from_secs(seconds),
        region: 0,
        random: !point.sequential,
        seed,
    };
    let (p, cpu) = crate::report::cpu_of(RUSAGE_SELF, || read_point(file, &spec, cfg));
    let p = p?;
    Ok(SideRun {
        iops: p.iops,
        p99_us: p.lat_p99_us,
        cpu_seconds: cpu,
        reads: p.ops as f64,
    })
}

/// The backend `cfg` gives at `point` as reports name it: `io_uring (registered buffers,
/// fixed files)`.
pub fn backend_name(cfg: &IoConfig, point: ParityPoint) -> Result<String> {
    let b = io::open_backend(
        &IoConfig {
            depth: point.qd,
            slot_size: point.bs,
            ..cfg.clone()
        },
        4096,
    )?;
    Ok(format!("{} ({})", b.kind().name(), b.features()))
}

/// How fio's buffers are allocated given the huge pages reserved for it, if any.
pub fn fio_mem(huge: &Option<fio::HugePages>) -> fio::FioMem {
    if huge.is_some() {
        fio::FioMem::ShmHuge
    } else {
        fio::FioMem::Malloc
    }
}

pub use crate::report::cpu_seconds;

/// The mean of `v` (0 for none).
pub fn mean(v: &[f64]) -> f64 {
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
