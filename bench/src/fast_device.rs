//! fast-device: the engine against fio on a memory-speed block device, where the device no
//! longer hides what the software costs.
//!
//! A [`LoopDevice`] over a file in /dev/shm (direct I/O, 512 B sectors) with ext4 on it. On
//! it, in one run: random reads of 512 B and 4 KiB at QD 1 and 64 by fio and the engine
//! alternately (IOPS, and CPU per read from each side's rusage); the io_uring features that
//! change them, each tried on its own on both sides (registered buffers and files, batched
//! submission, COOP_TASKRUN, SQPOLL); and LIRS (page and record grouping) and two-pass
//! epochs over 512 B records (records/s, records per CPU-second), the page-grouped one
//! against 8 x fio's 4 KiB QD 64 IOPS.
//!
//! Needs root. The device is removed afterwards on every path that unwinds (the guard's
//! drop); one left by a killed run is removed by the next run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use nix::sys::resource::UsageWho::RUSAGE_SELF;
use riffle::io::{self, DataFile, IoConfig, UringFeatures};
use riffle::modes::{read, read_two_pass, ReadOptions, ReadReport};
use riffle::order::Grouping;
use riffle::size::human_bytes;
use serde::Serialize;

use crate::fio_parity::{
    backend_name, cpu_seconds, fio_mem, measure_points, run_engine, run_fio_side, summarize,
    ParityPoint, ParityRow, SideRun,
};
use crate::loop_device::{LoopDevice, SHM};
use crate::{fio, report};

/// Why the suite cannot run here (fio, root, a tool or /dev/shm missing), on one line, or
/// `None` when it can.
pub fn missing() -> Option<String> {
    let mut why: Vec<String> = fio::version()
        .err()
        .map(|e| e.to_string())
        .into_iter()
        .collect();
    why.extend(crate::loop_device::missing());
    (!why.is_empty()).then(|| why.join("; "))
}

/// Options of the suite.
#[derive(Clone, Debug)]
pub struct FastOptions {
    /// Where `results/<date>-<host>/` goes.
    pub out: PathBuf,
    /// Seconds per timed run.
    pub seconds: u64,
    /// Runs per side and point (and per lirs case).
    pub repeats: usize,
    /// Where fio and the engine are compared.
    pub points: Vec<ParityPoint>,
    /// Where each io_uring feature is tried.
    pub feature_points: Vec<ParityPoint>,
    /// The random-read test file.
    pub test_file: u64,
    /// 512 B records of the lirs and two-pass dataset.
    pub records: u64,
}

/// The record size of the lirs and two-pass cases.
const RECORD: u64 = 512;

impl FastOptions {
    /// 512 B and 4 KiB at QD 1 and 64; features at 4 KiB QD 64 (and QD 1 unless quick);
    /// a 1 GiB test file; 1 GiB of records with `quick`, 2 GiB otherwise.
    pub fn new(quick: bool, out: PathBuf) -> Self {
        let p = |bs, qd| ParityPoint {
            bs,
            qd,
            sequential: false,
        };
        FastOptions {
            out,
            seconds: if quick { 3 } else { 10 },
            repeats: if quick { 1 } else { 2 },
            points: vec![p(512, 1), p(512, 64), p(4096, 1), p(4096, 64)],
            feature_points: if quick {
                vec![p(4096, 64)]
            } else {
                vec![p(4096, 1), p(4096, 64)]
            },
            test_file: 1 << 30,
            records: if quick { 2 << 20 } else { 4 << 20 },
        }
    }

    /// The device's size: the test file, the dataset, two epochs' piles of it (two-pass
    /// holds two sets while rolling) with their framing, and room for ext4.
    pub fn image_size(&self) -> u64 {
        let data = self.records * RECORD;
        let raw = self.test_file + data + data * 23 / 10 + (256 << 20);
        (raw + raw / 16).div_ceil(1 << 20) << 20
    }

    /// Progress steps of a run.
    pub fn steps(&self) -> usize {
        3 + self.points.len() * 2 * self.repeats
            + self.feature_points.len() * variants().len() * self.repeats
            + CASES.iter().map(|c| if c.4 { 2 } else { 1 }).sum::<usize>() * self.repeats
    }
}

/// One io_uring feature tried on one side.
#[derive(Clone, Debug)]
enum Variant {
    /// The engine with this configuration.
    Engine(&'static str, IoConfig),
    /// fio with these options.
    Fio(&'static str, &'static [&'static str]),
}

impl Variant {
    fn side(&self) -> &'static str {
        match self {
            Variant::Engine(..) => "engine",
            Variant::Fio(..) => "fio",
        }
    }

    fn knob(&self) -> &'static str {
        match self {
            Variant::Engine(k, _) | Variant::Fio(k, _) => k,
        }
    }
}

/// Each side's default, then each feature on its own: the engine's defaults turned off one
/// at a time (and SQPOLL and batched submission turned on), fio's off defaults turned on.
fn variants() -> Vec<Variant> {
    let d = IoConfig::default();
    let f = UringFeatures::default();
    let engine = |knob, uring, submit_batch| {
        Variant::Engine(
            knob,
            IoConfig {
                uring,
                submit_batch,
                ..d.clone()
            },
        )
    };
    vec![
        Variant::Engine("default", d.clone()),
        Variant::Fio("default", &[]),
        engine(
            "no registered buffers",
            UringFeatures {
                fixed_buffers: false,
                ..f
            },
            1,
        ),
        engine(
            "no registered files",
            UringFeatures {
                fixed_files: false,
                ..f
            },
            1,
        ),
        engine(
            "no registered buffers or files",
            UringFeatures {
                fixed_buffers: false,
                fixed_files: false,
                ..f
            },
            1,
        ),
        Variant::Fio(
            "registered buffers and files",
            &["--fixedbufs", "--registerfiles"],
        ),
        engine("submit batch 16", f, 16),
        engine("submit at each wait", f, io::SUBMIT_AT_WAIT),
        Variant::Fio("submit batch 16", &["--iodepth_batch_submit=16"]),
        engine(
            "no COOP_TASKRUN",
            UringFeatures {
                coop_taskrun: false,
                ..f
            },
            1,
        ),
        engine(
            "SQPOLL",
            UringFeatures {
                sqpoll_idle_ms: Some(100),
                ..f
            },
            1,
        ),
        Variant::Fio("SQPOLL", &["--sqthread_poll=1"]),
    ]
}

/// One side with one io_uring feature at one point.
#[derive(Clone, Debug, Serialize)]
pub struct FeatureRow {
    /// Block size.
    pub bs: usize,
    /// Queue depth.
    pub qd: usize,
    /// `engine` or `fio`.
    pub side: &'static str,
    /// The feature tried (`default`: the side as it runs by default).
    pub knob: &'static str,
    /// What the side ran with: the engine's backend features as the ring got them, or
    /// fio's options.
    pub ran_with: String,
    /// IOPS (mean over runs).
    pub iops: f64,
    /// Each run's IOPS.
    pub runs: Vec<f64>,
    /// p99 latency, us (mean over runs).
    pub p99_us: f64,
    /// CPU per read, us.
    pub cpu_us_per_read: f64,
    /// IOPS over the same side's default at the same point.
    pub iops_vs_default: f64,
    /// CPU per read over the same side's default at the same point.
    pub cpu_vs_default: f64,
}

/// One lirs or two-pass case over the 512 B records.
#[derive(Clone, Debug, Serialize)]
pub struct ModeRow {
    /// What was read.
    pub case: &'static str,
    /// Epochs per run.
    pub epochs: u64,
    /// Records per epoch.
    pub records: u64,
    /// Records per second over the run (mean over runs).
    pub records_per_s: f64,
    /// Each run's records per second.
    pub runs: Vec<f64>,
    /// CPU (this process's rusage, every thread) per record, us.
    pub cpu_us_per_record: f64,
    /// Records per CPU-second.
    pub records_per_cpu_s: f64,
    /// Reads per epoch (the last run).
    pub reads_per_epoch: f64,
    /// fio's 4 KiB QD 64 IOPS in runs alternated with this case's (the page-grouped case).
    pub fio_4k_qd64_iops: Option<f64>,
    /// Those runs.
    pub fio_runs: Vec<f64>,
    /// The last run's report.
    pub report: ReadReport,
}

/// The device the suite measured on.
#[derive(Clone, Debug, Serialize)]
pub struct FastDevice {
    /// The file in /dev/shm.
    pub image: String,
    /// Its size in bytes.
    pub image_bytes: u64,
    /// The loop device.
    pub loop_device: String,
    /// Whether the loop device does direct I/O on its file (sysfs `loop/dio`).
    pub loop_direct_io: Option<bool>,
    /// Its logical block size.
    pub logical_block_size: Option<usize>,
    /// Where ext4 was mounted.
    pub mount: String,
    /// The device as riffle identifies it.
    pub device: riffle::device::DeviceId,
}

/// The acceptance figures of issue 18.
#[derive(Clone, Debug, Serialize)]
pub struct Acceptance {
    /// Engine over fio IOPS at 4 KiB QD 64 (target >= 0.95).
    pub iops_ratio_4k_qd64: Option<f64>,
    /// Engine CPU per read at 4 KiB QD 64, us (target <= fio's).
    pub engine_cpu_us_4k_qd64: Option<f64>,
    /// fio CPU per read at 4 KiB QD 64, us.
    pub fio_cpu_us_4k_qd64: Option<f64>,
    /// Both targets met.
    pub met: Option<bool>,
    /// lirs page-grouped 512 B records/s over 8 x fio's 4 KiB QD 64 IOPS.
    pub lirs_page_vs_8x_fio_4k: Option<f64>,
}

/// The suite's result.
#[derive(Clone, Debug, Serialize)]
pub struct FastReport {
    /// Where and when.
    pub machine: report::Machine,
    /// The loop device.
    pub device: FastDevice,
    /// fio version.
    pub fio_version: String,
    /// How fio's buffers were allocated.
    pub fio_mem: fio::FioMem,
    /// The engine's backend and features by default.
    pub engine_backend: String,
    /// Random reads, engine against fio.
    pub rows: Vec<ParityRow>,
    /// Each io_uring feature on each side.
    pub features: Vec<FeatureRow>,
    /// lirs and two-pass over 512 B records.
    pub modes: Vec<ModeRow>,
    /// The targets.
    pub acceptance: Acceptance,
    /// Whether the page cache was dropped before each timed run.
    pub cold_cache: bool,
    /// Random-read test file size.
    pub test_file_bytes: u64,
    /// Seconds per timed run.
    pub seconds: u64,
    /// Runs per side and point.
    pub repeats: usize,
    /// Where the report was written.
    pub report_dir: String,
}

/// Runs the suite; `progress(step, total, what)` before each step.
pub fn run(opts: &FastOptions, progress: &mut dyn FnMut(usize, usize, &str)) -> Result<FastReport> {
    if let Some(why) = missing() {
        bail!("the fast-device suite cannot run here: {why}");
    }
    let fio_version = fio::version()?;
    let size = opts.image_size();
    let available = report::meminfo_kib("MemAvailable:").unwrap_or(u64::MAX / 1024) * 1024;
    let shm_free = free_bytes(Path::new(SHM)).unwrap_or(u64::MAX);
    if size + (1 << 30) > available || size > shm_free {
        bail!(
            "the fast device takes {} of memory in {SHM}, and this machine has {} available \
             ({} free in {SHM}); --quick takes less",
            human_bytes(size as f64),
            human_bytes(available as f64),
            human_bytes(shm_free as f64)
        );
    }
    let total = opts.steps();
    progress(
        0,
        total,
        &format!("making a {} loop device", human_bytes(size as f64)),
    );
    let dev = LoopDevice::create(size)?;
    let result = measure(opts, &dev, size, fio_version, total, progress);
    // Removed before the result is returned; a failure to remove is an error of the run,
    // unless the run failed first (then the guard's drop says what it could not undo).
    match result {
        Ok(rep) => dev.close().map(|()| rep),
        Err(e) => {
            drop(dev);
            Err(e)
        }
    }
}

/// Bytes free for an unprivileged writer in the file system holding `path`.
// fsblkcnt_t and c_ulong are u64 here but narrower on 32-bit targets.
#[allow(clippy::unnecessary_cast)]
fn free_bytes(path: &Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    Some((s.blocks_available() as u64).saturating_mul(s.fragment_size() as u64))
}

fn measure(
    opts: &FastOptions,
    dev: &LoopDevice,
    size: u64,
    fio_version: String,
    total: usize,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<FastReport> {
    let mut step = 1;
    let mut next = |what: &str| {
        progress(step, total, what);
        step += 1;
    };
    let mnt = dev.mount_point();
    let file = mnt.join("random-reads.dat");
    next(&format!(
        "writing a {} test file",
        human_bytes(opts.test_file as f64)
    ));
    io::write_file(
        &file,
        opts.test_file,
        &IoConfig::sequential_write(),
        io::pattern_filler(42),
    )?;
    if !DataFile::open(&file, io::Access::Read, true)?.direct() {
        bail!(
            "{}: O_DIRECT is not available on the loop device's ext4",
            file.display()
        );
    }
    next(&format!("writing {} records of {RECORD} B", opts.records));
    let data = mnt.join(format!("records-{RECORD}-{}.bin", opts.records));
    crate::data::make_fixed(&data, RECORD, opts.records)?;
    let huge = fio::HugePages::reserve(64);
    let mem = fio_mem(&huge);
    let engine_backend = match opts.points.first() {
        Some(&p) => backend_name(&IoConfig::default(), p)?,
        None => String::new(),
    };
    let (rows, mut cold) = measure_points(
        &file,
        opts.test_file,
        &opts.points,
        opts.seconds,
        opts.repeats,
        mem,
        &mut next,
    )?;
    let (features, cold_features) = measure_features(opts, &file, mem, &mut next)?;
    cold &= cold_features;
    let modes = measure_modes(opts, &data, &mnt.join("scratch"), &file, mem, &mut next)?;
    let point = |bs, qd| {
        rows.iter()
            .find(|r| r.bs == bs && r.qd == qd && r.rw == "randread")
    };
    let at = point(4096, 64);
    let lirs_page = modes.iter().find(|m| m.case == CASES[0].0);
    let acceptance = Acceptance {
        iops_ratio_4k_qd64: at.map(|r| r.ratio),
        engine_cpu_us_4k_qd64: at.map(|r| r.engine_cpu_us_per_read),
        fio_cpu_us_4k_qd64: at.map(|r| r.fio_cpu_us_per_read),
        met: at.map(|r| r.ratio >= 0.95 && r.engine_cpu_us_per_read <= r.fio_cpu_us_per_read),
        lirs_page_vs_8x_fio_4k: lirs_page.and_then(|m| {
            let fio = m.fio_4k_qd64_iops.or(at.map(|r| r.fio_iops))?;
            Some(m.records_per_s / (8.0 * fio))
        }),
    };
    let dir = report::results_dir(&opts.out)?;
    let rep = FastReport {
        machine: report::machine(),
        device: FastDevice {
            image: dev.image().display().to_string(),
            image_bytes: size,
            loop_device: dev.device().display().to_string(),
            loop_direct_io: dev.sysfs("loop/dio").map(|s| s == "1"),
            logical_block_size: dev
                .sysfs("queue/logical_block_size")
                .and_then(|s| s.parse().ok()),
            mount: mnt.display().to_string(),
            device: riffle::device::identify(&file)?,
        },
        fio_version,
        fio_mem: mem,
        engine_backend,
        rows,
        features,
        modes,
        acceptance,
        cold_cache: cold,
        test_file_bytes: opts.test_file,
        seconds: opts.seconds,
        repeats: opts.repeats,
        report_dir: dir.display().to_string(),
    };
    report::write_report(
        &dir,
        "fast-device",
        &serde_json::to_value(&rep)?,
        &markdown(&rep),
    )?;
    Ok(rep)
}

/// Every variant at every feature point, in turn (the order reversed on odd repeats so
/// neither end of the list is favoured by drift); returns the rows and whether the cache
/// was dropped before each run.
fn measure_features(
    opts: &FastOptions,
    file: &Path,
    mem: fio::FioMem,
    next: &mut dyn FnMut(&str),
) -> Result<(Vec<FeatureRow>, bool)> {
    let variants = variants();
    let mut rows = Vec::new();
    let mut cold = true;
    for &point in &opts.feature_points {
        let mut runs: Vec<Vec<SideRun>> = vec![Vec::new(); variants.len()];
        let mut ran_with = vec![String::new(); variants.len()];
        for rep in 0..opts.repeats {
            let mut order: Vec<usize> = (0..variants.len()).collect();
            if rep % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let v = &variants[i];
                next(&format!(
                    "{} {} bs={} qd={}",
                    v.side(),
                    v.knob(),
                    human_bytes(point.bs as f64),
                    point.qd
                ));
                cold &= report::drop_caches();
                let run = match v {
                    Variant::Engine(_, cfg) => {
                        // The backend's features say how it submits (unsaid: each at once).
                        ran_with[i] = backend_name(cfg, point)?;
                        run_engine(file, point, opts.seconds, (rep * 31 + i) as u64, cfg)?
                    }
                    Variant::Fio(_, extra) => {
                        ran_with[i] = if extra.is_empty() {
                            "fio's defaults".into()
                        } else {
                            extra.join(" ")
                        };
                        run_fio_side(file, opts.test_file, point, opts.seconds, mem, extra)?
                    }
                };
                runs[i].push(run);
            }
        }
        let summaries: Vec<_> = runs.iter().map(|r| summarize(r)).collect();
        let default_of = |side: &str| {
            variants
                .iter()
                .position(|v| v.side() == side && v.knob() == "default")
                .map(|i| &summaries[i])
        };
        for (i, v) in variants.iter().enumerate() {
            let (iops, runs, p99_us, cpu) = summaries[i].clone();
            let base = default_of(v.side()).expect("each side has a default");
            rows.push(FeatureRow {
                bs: point.bs,
                qd: point.qd,
                side: v.side(),
                knob: v.knob(),
                ran_with: ran_with[i].clone(),
                iops,
                runs,
                p99_us,
                cpu_us_per_read: cpu,
                iops_vs_default: iops / base.0,
                cpu_vs_default: cpu / base.3,
            });
        }
    }
    Ok((rows, cold))
}

/// The lirs and two-pass cases: name, grouping, two-pass, epochs per run, and whether its
/// runs alternate with fio's 4 KiB QD 64 (the page-grouped case is compared with 8 x fio's
/// IOPS, measured beside it so drift between the two does not enter the ratio). Page
/// grouping reads 8 records per read, so it runs several epochs to be timed over seconds.
const CASES: [(&str, Grouping, bool, u64, bool); 3] = [
    (
        "lirs, page grouping (4 KiB)",
        Grouping::Page { unit: 4096 },
        false,
        4,
        true,
    ),
    ("lirs, record grouping", Grouping::Record, false, 1, false),
    (
        "two-pass (the first epoch scatters, the second rolls)",
        Grouping::Record,
        true,
        2,
        false,
    ),
];

/// fio's point the page-grouped case is compared with.
const FIO_4K_QD64: ParityPoint = ParityPoint {
    bs: 4096,
    qd: 64,
    sequential: false,
};

/// Each case `repeats` times over the records at `data`, two-pass's piles in `scratch`;
/// the page-grouped case alternated with fio's 4 KiB QD 64 on `fio_file`.
fn measure_modes(
    opts: &FastOptions,
    data: &Path,
    scratch: &Path,
    fio_file: &Path,
    mem: fio::FioMem,
    next: &mut dyn FnMut(&str),
) -> Result<Vec<ModeRow>> {
    let ds = Arc::new(crate::data::open_fixed(data, RECORD)?);
    let mut rows = Vec::new();
    for (case, grouping, two_pass, epochs, with_fio) in CASES {
        let (mut runs, mut cpu, mut records, mut last) = (Vec::new(), 0.0, 0u64, None);
        let mut fio_runs = Vec::new();
        for rep in 0..opts.repeats {
            // fio before the engine on even repeats, after it on odd ones.
            for side in 0..2 {
                if (side == 0) == (rep % 2 == 0) {
                    if with_fio {
                        next(&format!("fio bs=4.0 KiB qd=64, beside {case}"));
                        report::drop_caches();
                        let r = run_fio_side(
                            fio_file,
                            opts.test_file,
                            FIO_4K_QD64,
                            opts.seconds,
                            mem,
                            &[],
                        )?;
                        fio_runs.push(r.iops);
                    }
                    continue;
                }
                next(case);
                report::drop_caches();
                let mut o = ReadOptions::new(256);
                o.grouping = grouping;
                o.epochs = epochs;
                let before = cpu_seconds(RUSAGE_SELF);
                let t = Instant::now();
                let mut stream = if two_pass {
                    read_two_pass(ds.clone(), o, scratch.to_path_buf())?
                } else {
                    read(ds.clone(), o)?
                };
                for b in stream.by_ref() {
                    b?;
                }
                let r = stream.report();
                // The run's threads are joined by the drop, so their CPU is in.
                drop(stream);
                cpu += cpu_seconds(RUSAGE_SELF) - before;
                let seconds = if r.seconds > 0.0 {
                    r.seconds
                } else {
                    t.elapsed().as_secs_f64()
                };
                runs.push(r.records as f64 / seconds);
                records += r.records;
                last = Some(r);
            }
        }
        let r = last.ok_or_else(|| anyhow!("no run of {case}"))?;
        rows.push(ModeRow {
            case,
            epochs,
            records: ds.len(),
            records_per_s: crate::fio_parity::mean(&runs),
            runs,
            cpu_us_per_record: cpu * 1e6 / records.max(1) as f64,
            records_per_cpu_s: records as f64 / cpu.max(1e-9),
            reads_per_epoch: r.read_ops as f64 / epochs as f64,
            fio_4k_qd64_iops: (!fio_runs.is_empty()).then(|| crate::fio_parity::mean(&fio_runs)),
            fio_runs,
            report: r,
        });
    }
    Ok(rows)
}

/// The report as Markdown.
pub fn markdown(r: &FastReport) -> String {
    let m = &r.machine;
    let d = &r.device;
    let mut s = String::from("# fast-device: the engine against fio on a memory-speed device\n\n");
    s.push_str(&format!(
        "{} on {} ({}, {} cores, {} of memory, Linux {}); {}.\n\n",
        m.date,
        m.host,
        m.cpu,
        m.cores,
        human_bytes(m.memory_bytes as f64),
        m.kernel,
        r.fio_version
    ));
    s.push_str(&format!(
        "Device: `{}` over a {} file in {SHM} (loop direct I/O {}, {} B sectors), ext4, \
         made for the run and removed after it. Random reads on a {} file; {} s per run, {} \
         run(s) per side, alternated. Engine: {}, O_DIRECT. fio buffers: {}.\n\n",
        d.loop_device,
        human_bytes(d.image_bytes as f64),
        match d.loop_direct_io {
            Some(true) => "on",
            Some(false) => "off",
            None => "?",
        },
        d.logical_block_size.map_or("?".into(), |b| b.to_string()),
        human_bytes(r.test_file_bytes as f64),
        r.seconds,
        r.repeats,
        r.engine_backend,
        match r.fio_mem {
            fio::FioMem::ShmHuge => "huge pages (--iomem=shmhuge)",
            fio::FioMem::Malloc => "malloc",
        }
    ));
    s.push_str(
        "CPU per read is each side's rusage (user + system) over its reads: fio's process as \
         a child waited for, the engine's as this process (every thread, io_uring's workers \
         and SQPOLL thread included). The loop driver's kernel workers are on neither side.\n\n",
    );
    let a = &r.acceptance;
    s.push_str("## Targets\n\n");
    match (
        a.iops_ratio_4k_qd64,
        a.engine_cpu_us_4k_qd64,
        a.fio_cpu_us_4k_qd64,
    ) {
        (Some(ratio), Some(e), Some(f)) => {
            s.push_str(&format!(
                "- 4 KiB QD 64: engine / fio IOPS {ratio:.3} (target >= 0.95): {}.\n",
                if ratio >= 0.95 { "met" } else { "NOT met" }
            ));
            s.push_str(&format!(
                "- CPU per read at 4 KiB QD 64: engine {e:.2} us, fio {f:.2} us (target: engine \
                 <= fio): {}.\n",
                if e <= f { "met" } else { "NOT met" }
            ));
        }
        _ => s.push_str("- 4 KiB QD 64 was not among the points measured.\n"),
    }
    if let Some(x) = a.lirs_page_vs_8x_fio_4k {
        s.push_str(&format!(
            "- lirs, 512 B records, page grouping: {x:.3} x (8 x fio's 4 KiB QD 64 IOPS).\n"
        ));
    }
    s.push_str("\n## Random reads\n\n");
    s.push_str("| block | QD | fio IOPS | engine IOPS | engine / fio | fio runs | engine runs | fio p99 us | engine p99 us | fio CPU us/read | engine CPU us/read |\n");
    s.push_str("|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|\n");
    for row in &r.rows {
        s.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {:.3} | {} | {} | {:.0} | {:.0} | {:.2} | {:.2} |\n",
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
    s.push_str("\n## io_uring features, one at a time\n\n");
    s.push_str(
        "The engine by default: registered buffers and files, COOP_TASKRUN, each request \
         submitted as it is queued (batch 1), no SQPOLL; each row turns one of these around. \
         fio by default has none of them; each row turns one on. `vs default` is against the \
         same side's default at the same point in the same run.\n\n",
    );
    s.push_str("| block | QD | side | feature | ran with | IOPS | vs default | CPU us/read | vs default | p99 us | runs |\n");
    s.push_str("|---:|---:|---|---|---|---:|---:|---:|---:|---:|---|\n");
    for f in &r.features {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.0} | {:.3} | {:.2} | {:.3} | {:.0} | {} |\n",
            human_bytes(f.bs as f64),
            f.qd,
            f.side,
            f.knob,
            f.ran_with,
            f.iops,
            f.iops_vs_default,
            f.cpu_us_per_read,
            f.cpu_vs_default,
            f.p99_us,
            report::runs(&f.runs)
        ));
    }
    s.push_str(&format!(
        "\n## lirs and two-pass, {RECORD} B records\n\nBatches of 256, QD 64, O_DIRECT, \
         default memory; records/s over each run's epochs.\n\n"
    ));
    s.push_str("| case | records | epochs | records/s | runs | epoch s (last run) | CPU us/record | records per CPU-second | reads/epoch | vs 8 x fio 4 KiB QD 64 |\n");
    s.push_str("|---|---:|---:|---:|---|---|---:|---:|---:|---:|\n");
    let fio_4k = r
        .rows
        .iter()
        .find(|x| x.bs == 4096 && x.qd == 64 && x.rw == "randread")
        .map(|x| x.fio_iops);
    for m in &r.modes {
        s.push_str(&format!(
            "| {} | {} | {} | {:.0} | {} | {} | {:.2} | {:.0} | {:.0} | {} |\n",
            m.case,
            m.records,
            m.epochs,
            m.records_per_s,
            report::runs(&m.runs),
            if m.report.epoch_seconds.is_empty() {
                "-".to_owned()
            } else {
                m.report
                    .epoch_seconds
                    .iter()
                    .map(|s| format!("{s:.2}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            },
            m.cpu_us_per_record,
            m.records_per_cpu_s,
            m.reads_per_epoch,
            m.fio_4k_qd64_iops
                .or(fio_4k)
                .map_or("-".into(), |f| format!(
                    "{:.3}",
                    m.records_per_s / (8.0 * f)
                ))
        ));
    }
    for m in r.modes.iter().filter(|m| !m.report.io_submit.is_empty()) {
        s.push_str(&format!(
            "\n{}: requests submitted {} ({}).\n",
            m.case, m.report.io_submit, m.report.io_features
        ));
    }
    for m in r.modes.iter().filter(|m| !m.fio_runs.is_empty()) {
        s.push_str(&format!(
            "\n{}: against fio's 4 KiB QD 64 in runs alternated with it ({} IOPS: {}); the \
             others against the random-read table's.\n",
            m.case,
            m.fio_4k_qd64_iops.map_or("-".into(), |f| format!("{f:.0}")),
            report::runs(&m.fio_runs)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device's size covers the test file, the dataset and two sets of piles.
    #[test]
    fn the_device_holds_a_run() {
        let o = FastOptions::new(true, PathBuf::from("results"));
        let data = o.records * RECORD;
        assert!(o.image_size() > o.test_file + 3 * data);
        assert_eq!(o.image_size() % (1 << 20), 0);
        assert!(o.steps() > o.points.len() * 2);
    }
}
