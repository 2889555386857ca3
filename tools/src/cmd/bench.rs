//! `riffle bench SUITE`.

use std::path::PathBuf;

use anyhow::{bail, Result};
use riffle::size::parse_size;
use riffle_bench::fio_parity::ParityPoint;
use riffle_bench::ParityOptions;

use crate::out::{out, outln};
use crate::progress;

#[derive(clap::Args)]
pub struct Args {
    /// The suite to run: fio-parity, probe-check, lirs, planner (predictions against runs
    /// on the real device and emulated hdd), convergence (SGD on label-sorted data fed by
    /// each mode), au (accelerator utilisation with a simulated compute time per batch),
    /// modes (every mode x record size x device, with shuffle quality), peers (riffle through
    /// PyTorch against MosaicML Streaming, LitData, WebDataset and a map-style DataLoader,
    /// each on its own format, under a 1 GiB memory cgroup (--memory), 3 epochs a run (--epochs);
    /// object-store (riffle against Mosaic Streaming, LitData and WebDataset reading the same
    /// label-sorted records from a local S3 server, s3s-fs, straight and through an emulated
    /// remote link, with local caches of 100%, 25% and 10%; 2 epochs, --epochs; 1.6 GB, 160
    /// MB with --quick; in the peers' virtual environment; not in `all`); 1.6 GB of 4 KiB and of 100 KiB
    /// records, 0.4 GB with --quick; makes its own virtual environment on first use, a few
    /// GB; in `all` only once that exists), scale
    /// (100,000 files, a 20 GiB two-pass under `ulimit -n 256`, a 4 GB shuffle, 100 million
    /// tiny records; about 60 GB of data and 15 minutes, 7 GB with --quick; not in `all`),
    /// formats (the datasets users already have, read in place: an ImageFolder tree of
    /// 100,000 files of 16 KiB against fio on one file of the same size and a Python loop
    /// that opens and reads each file; WebDataset shards (2 x 10,000 samples of ~100 KiB)
    /// against fio, and two-pass against the I/O bound; an MDS dataset against the same
    /// records in .npy; about 8 GB and 10 minutes, a tenth with --quick),
    /// node (`riffle serve` feeding 16 streams of one job, LIRS and two-pass, against an
    /// in-process read; 64 clients of different jobs under --memory 1G; a soak of 64
    /// connections, honest and hostile, for --seconds (300; 60 with --quick); 2 GiB of
    /// data, about 10 minutes; not in `all`), fast-device (root: a loop device over a file
    /// in /dev/shm with ext4; the engine against fio at 512 B and 4 KiB, QD 1 and 64, each
    /// io_uring feature on both sides, lirs and two-pass over 512 B records; removed
    /// afterwards; about 5 GiB of memory and 2 minutes with --quick, 9 GiB and 12 minutes
    /// otherwise; not in `all`), or all.
    pub suite: String,
    /// A shorter run (fewer seconds per point, one run per side).
    #[arg(long)]
    pub quick: bool,
    /// Where results/<date>-<host>/ is written.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// Where test files are made (on the device to measure).
    #[arg(long, default_value = ".")]
    pub data_dir: PathBuf,
    /// Test file size for fio-parity.
    #[arg(long, default_value = "4G", value_parser = parse_size)]
    pub size: u64,
    /// Seconds per run (default: 3 with --quick, 10 otherwise).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// fio-parity points as [seq:]BLOCK:QD, comma separated; `seq:` makes a sequential
    /// read (default 4K:1,4K:32,4K:64,4K:128,16K:64,64K:64,seq:1M:8). fast-device: where
    /// fio and the engine are compared (default 512:1,512:64,4K:1,4K:64).
    #[arg(long, value_delimiter = ',', value_parser = parse_point)]
    pub points: Vec<ParityPoint>,
    /// Runs per side and point (default: 1 with --quick, 2 otherwise).
    #[arg(long)]
    pub repeats: Option<usize>,
    /// Keep the test file for the next run.
    #[arg(long)]
    pub keep: bool,
    /// planner, au, modes: the devices to run on, comma separated: real (no throttle) and
    /// emulated classes (hdd, sata-ssd; root). Default: real,hdd (modes: real,hdd,sata-ssd).
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<String>,
    /// scale: the cases to run, comma separated: many-files, two-pass-large, shuffle,
    /// tiny-records (default: all four). formats: files, tar, mds. node: one-job (or one-job-lirs,
    /// one-job-two-pass), many-jobs, soak, attacks (default: all). peers: 4k, 100k (both).
    /// object-store: the cache limits, in percent of the dataset (100, 25, 10: all three).
    #[arg(long, value_delimiter = ',')]
    pub cases: Vec<String>,
    /// peers: the memory cgroup each reader runs in, as a size, or `none` for the machine's
    /// memory (default 1G: smaller than the data).
    #[arg(long, value_name = "SIZE|none")]
    pub memory: Option<String>,
    /// peers: epochs per run; samples/s is over all of them (default 3; 1 with --quick).
    #[arg(long)]
    pub epochs: Option<u64>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let suite = args.suite.as_str();
    if suite != "all" {
        if let Some(why) = riffle_bench::needs::missing(suite) {
            bail!("the {suite} suite cannot run here: {why}");
        }
    }
    match suite {
        "fio-parity" => parity(&args),
        "probe-check" => probe_check(&args),
        "lirs" => lirs(&args),
        "planner" => planner(&args),
        "convergence" => convergence(&args),
        "au" => au(&args),
        "modes" => modes(&args),
        "peers" => peers(&args),
        "object-store" => object_store(&args),
        "scale" => scale(&args),
        "formats" => formats(&args),
        "node" => node(&args),
        "fast-device" => fast_device(&args),
        "all" => all(&args),
        other => {
            bail!(
                "unknown suite '{other}': the suites are fio-parity, probe-check, lirs, planner, \
                 convergence, au, modes, peers, object-store, scale, formats, node, fast-device \
                 and all"
            )
        }
    }
}

/// Every suite but scale and node, in turn. A suite this machine lacks a tool or package
/// for says so on its first line and is skipped; a suite that fails says why and the rest
/// still run. Exits non-zero only when a suite failed.
fn all(args: &Args) -> Result<()> {
    type Suite = fn(&Args) -> Result<()>;
    let suites: [(&str, Suite); 9] = [
        ("fio-parity", parity),
        ("probe-check", probe_check),
        ("lirs", lirs),
        ("planner", planner),
        ("convergence", convergence),
        ("au", au),
        ("modes", modes),
        ("peers", peers),
        ("formats", formats),
    ];
    let mut failed = Vec::new();
    for (name, run) in suites {
        if let Some(why) = riffle_bench::needs::missing_in_all(name) {
            if args.json {
                outln!("{}", serde_json::json!({ "suite": name, "skipped": why }))?;
            } else {
                outln!("## {name}: skipped: {why}\n")?;
            }
            continue;
        }
        if !args.json {
            outln!("## {name}\n")?;
        }
        if let Err(e) = run(args) {
            if args.json {
                outln!(
                    "{}",
                    serde_json::json!({ "suite": name, "failed": format!("{e:#}") })
                )?;
            } else {
                outln!("## {name}: failed: {e:#}\n")?;
            }
            failed.push(name);
        }
    }
    if !failed.is_empty() {
        bail!("suites failed: {}", failed.join(", "));
    }
    Ok(())
}

/// Runs a suite with a progress bar of `steps`, then prints its report: one JSON object
/// with --json, the Markdown summary otherwise.
fn suite<R: serde::Serialize>(
    args: &Args,
    steps: usize,
    run: impl FnOnce(&mut dyn FnMut(usize, usize, &str)) -> Result<R>,
    markdown: impl FnOnce(&R) -> String,
    report_dir: impl FnOnce(&R) -> &str,
) -> Result<()> {
    let bar = progress::steps(steps as u64, args.json);
    let rep = run(&mut |done, _, what| {
        bar.set_position(done as u64);
        bar.set_message(what.to_owned());
    })?;
    bar.finish_and_clear();
    let dir = std::path::PathBuf::from(report_dir(&rep));
    save_profiles(&args.data_dir, &dir);
    if args.json {
        outln!("{}", serde_json::to_string(&rep)?)?;
    } else {
        out!("{}", markdown(&rep))?;
        outln!("\nwritten to {}", dir.display())?;
    }
    Ok(())
}

/// Puts the cached probe profiles of the data directory's device (its own and any measured
/// under emulation) beside the results, as `profile-<name>.json`: the figures the results
/// are to be read against.
fn save_profiles(data_dir: &std::path::Path, dir: &std::path::Path) {
    let Ok(dev) = riffle::device::identify(data_dir) else {
        return;
    };
    let prefix = dev.dev.replace(':', "_");
    let cache = riffle::probe::cache_dir().join("profiles");
    let Ok(entries) = std::fs::read_dir(&cache) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && name.ends_with(".json") {
            let _ = std::fs::copy(e.path(), dir.join(format!("profile-{name}")));
        }
    }
}

fn lirs(args: &Args) -> Result<()> {
    let opts = riffle_bench::lirs::LirsOptions {
        out: args.out.clone(),
        data_dir: args.data_dir.clone(),
        file_size: if args.quick {
            args.size.min(1 << 30)
        } else {
            args.size
        },
        repeats: args.repeats.unwrap_or(if args.quick { 1 } else { 2 }),
        table_records: if args.quick { 10_000_000 } else { 100_000_000 },
        keep: args.keep,
    };
    suite(
        args,
        4 + 6 * opts.repeats,
        |p| riffle_bench::lirs::run(&opts, p),
        riffle_bench::lirs::markdown,
        |r| &r.report_dir,
    )
}

fn scale(args: &Args) -> Result<()> {
    let opts = riffle_bench::scale::ScaleOptions {
        out: args.out.clone(),
        data_dir: args.data_dir.clone(),
        quick: args.quick,
        keep: args.keep,
        repeats: args.repeats.unwrap_or(if args.quick { 1 } else { 2 }),
        cases: args.cases.clone(),
    };
    suite(
        args,
        5,
        |p| riffle_bench::scale::run(&opts, p),
        riffle_bench::scale::markdown,
        |r| &r.report_dir,
    )
}

fn formats(args: &Args) -> Result<()> {
    let opts = riffle_bench::formats::FormatsOptions {
        out: args.out.clone(),
        data_dir: args.data_dir.clone(),
        quick: args.quick,
        keep: args.keep,
        repeats: args.repeats.unwrap_or(if args.quick { 1 } else { 3 }),
        cases: args.cases.clone(),
    };
    suite(
        args,
        3,
        |p| riffle_bench::formats::run(&opts, p),
        riffle_bench::formats::markdown,
        |r| &r.report_dir,
    )
}

fn planner(args: &Args) -> Result<()> {
    let devices = devices(args, &["real", "hdd"])?;
    let opts = riffle_bench::planner::PlannerOptions {
        out: args.out.clone(),
        data_dir: args.data_dir.clone(),
        devices,
        quick: args.quick,
        epochs: 2,
        keep: args.keep,
    };
    suite(
        args,
        opts.devices.len() * 13,
        |p| riffle_bench::planner::run(&opts, p),
        riffle_bench::planner::markdown,
        |r| &r.report_dir,
    )
}

fn convergence(args: &Args) -> Result<()> {
    let mut opts = riffle_bench::convergence::ConvergenceOptions::new(
        args.quick,
        args.out.clone(),
        args.data_dir.clone(),
    );
    opts.keep = args.keep;
    suite(
        args,
        8,
        |p| riffle_bench::convergence::run(&opts, p),
        riffle_bench::convergence::markdown,
        |r| &r.report_dir,
    )
}

fn au(args: &Args) -> Result<()> {
    let opts = riffle_bench::au::AuOptions {
        out: args.out.clone(),
        data_dir: args.data_dir.clone(),
        devices: devices(args, &["real", "hdd"])?,
        quick: args.quick,
        epochs: 2,
        keep: args.keep,
    };
    let per_device = 4 * if args.quick { 3 } else { 6 };
    suite(
        args,
        opts.devices.len() * per_device,
        |p| riffle_bench::au::run(&opts, p),
        riffle_bench::au::markdown,
        |r| &r.report_dir,
    )
}

fn modes(args: &Args) -> Result<()> {
    let opts = riffle_bench::modes::ModesOptions {
        out: args.out.clone(),
        data_dir: args.data_dir.clone(),
        devices: devices(args, &["real", "hdd", "sata-ssd"])?,
        quick: args.quick,
        keep: args.keep,
    };
    suite(
        args,
        opts.devices.len() * 24,
        |p| riffle_bench::modes::run(&opts, p),
        riffle_bench::modes::markdown,
        |r| &r.report_dir,
    )
}

/// `--points`, `--repeats` and `--seconds` over a suite's defaults (fio-parity's and
/// fast-device's).
fn timed_points(
    args: &Args,
    points: &mut Vec<ParityPoint>,
    repeats: &mut usize,
    seconds: &mut u64,
) {
    if !args.points.is_empty() {
        *points = args.points.clone();
    }
    if let Some(r) = args.repeats {
        *repeats = r.max(1);
    }
    if let Some(s) = args.seconds {
        *seconds = s.max(1);
    }
}

fn fast_device(args: &Args) -> Result<()> {
    let mut opts = riffle_bench::fast_device::FastOptions::new(args.quick, args.out.clone());
    timed_points(args, &mut opts.points, &mut opts.repeats, &mut opts.seconds);
    suite(
        args,
        opts.steps(),
        |p| riffle_bench::fast_device::run(&opts, p),
        riffle_bench::fast_device::markdown,
        |r| &r.report_dir,
    )
}

fn node(args: &Args) -> Result<()> {
    let opts = riffle_bench::node::NodeOptions {
        out: args.out.clone(),
        data_dir: args.data_dir.clone(),
        quick: args.quick,
        keep: args.keep,
        repeats: args
            .repeats
            .unwrap_or(if args.quick { 1 } else { 3 })
            .max(1),
        soak_seconds: args
            .seconds
            .map_or(if args.quick { 60.0 } else { 300.0 }, |s| s as f64),
        cases: args.cases.clone(),
    };
    suite(
        args,
        6,
        |p| riffle_bench::node::run(&opts, p),
        riffle_bench::node::markdown,
        |r| &r.report_dir,
    )
}

fn peers(args: &Args) -> Result<()> {
    let all = if args.quick {
        vec![(100_000, 4096), (4_000, 100 * 1024)]
    } else {
        vec![(400_000, 4096), (16_000, 100 * 1024)]
    };
    // --cases 4k,100k: the record sizes to run (both by default).
    let datasets: Vec<(u64, u64)> = all
        .into_iter()
        .filter(|&(_, r)| {
            let name = if r == 4096 { "4k" } else { "100k" };
            args.cases.is_empty() || args.cases.iter().any(|c| c == name)
        })
        .collect();
    if datasets.is_empty() {
        bail!("peers: --cases takes 4k and 100k");
    }
    let opts = riffle_bench::peers::PeersOptions {
        out: args.out.clone(),
        data_dir: args.data_dir.clone(),
        datasets,
        memory: match args.memory.as_deref() {
            None => Some(1 << 30),
            Some("none") => None,
            Some(m) => Some(parse_size(m).map_err(|e| anyhow::anyhow!("--memory {m}: {e}"))?),
        },
        epochs: args.epochs.unwrap_or(if args.quick { 1 } else { 3 }).max(1),
        workers: 2,
        batch: 256,
        rounds: args.repeats.unwrap_or(if args.quick { 1 } else { 2 }),
        keep: args.keep,
        max_seconds: if args.quick { 30 } else { 60 },
    };
    suite(
        args,
        opts.datasets.len() * 10 * opts.rounds,
        |p| riffle_bench::peers::run(&opts, p),
        riffle_bench::peers::markdown,
        |r| &r.report_dir,
    )
}

fn object_store(args: &Args) -> Result<()> {
    // --cases 100,25,10: the cache limits to run, in percent of the dataset (all three by
    // default).
    let mut limits = Vec::new();
    for c in &args.cases {
        match c.trim_end_matches('%').parse::<f64>() {
            Ok(p) if p > 0.0 && p <= 100.0 => limits.push(p / 100.0),
            _ => bail!(
                "object-store: --cases takes cache limits in percent (100, 25, 10), not '{c}'"
            ),
        }
    }
    if limits.is_empty() {
        limits = vec![1.0, 0.25, 0.10];
    }
    let steps = 4 + 2 * limits.len() * 4;
    let opts = riffle_bench::object_store::ObjectStoreOptions {
        out: args.out.clone(),
        data_dir: args.data_dir.clone(),
        records: if args.quick { 40_000 } else { 400_000 },
        limits,
        links: vec![None, Some(riffle_bench::netem::Link::S3)],
        epochs: args.epochs.unwrap_or(2).max(1),
        batch: 256,
        workers: 2,
        max_seconds: if args.quick { 120 } else { 600 },
        keep: args.keep,
    };
    suite(
        args,
        steps,
        |p| riffle_bench::object_store::run(&opts, p),
        riffle_bench::object_store::markdown,
        |r| &r.report_dir,
    )
}

/// `--devices` (or the suite's default): `real` and emulated classes.
fn devices(args: &Args, default: &[&str]) -> Result<Vec<Option<riffle::emulate::DeviceClass>>> {
    let given: Vec<&str> = args.devices.iter().map(String::as_str).collect();
    let names = if given.is_empty() {
        default
    } else {
        &given[..]
    };
    names
        .iter()
        .map(|d| match *d {
            "real" => Ok(None),
            other => other
                .parse::<riffle::emulate::DeviceClass>()
                .map(Some)
                .map_err(|e| anyhow::anyhow!("--devices: {e}")),
        })
        .collect()
}

fn probe_check(args: &Args) -> Result<()> {
    suite(
        args,
        6,
        |p| riffle_bench::probe_check::run(args.quick, &args.data_dir, &args.out, p),
        riffle_bench::probe_check::markdown,
        |r| &r.report_dir,
    )
}

fn parity(args: &Args) -> Result<()> {
    let mut opts = ParityOptions::new(args.quick, args.out.clone(), args.data_dir.clone());
    opts.file_size = args.size;
    opts.keep_file = args.keep;
    timed_points(args, &mut opts.points, &mut opts.repeats, &mut opts.seconds);
    suite(
        args,
        opts.points.len() * 2 * opts.repeats + 1,
        |p| riffle_bench::fio_parity(&opts, p),
        riffle_bench::fio_parity::markdown,
        |r| &r.report_dir,
    )
}

fn parse_point(text: &str) -> Result<ParityPoint, String> {
    let (sequential, rest) = match text.strip_prefix("seq:") {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (bs, qd) = rest
        .split_once(':')
        .ok_or_else(|| format!("'{text}': expected [seq:]BLOCK:QD, like 4K:64 or seq:1M:8"))?;
    let bs = parse_size(bs)? as usize;
    let qd: usize = qd
        .parse()
        .map_err(|_| format!("'{text}': queue depth '{qd}' is not a number"))?;
    if bs == 0 || qd == 0 {
        return Err(format!(
            "'{text}': block size and queue depth must be positive"
        ));
    }
    Ok(ParityPoint { bs, qd, sequential })
}
