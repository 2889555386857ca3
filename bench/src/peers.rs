//! peers: riffle against the loaders users would pick instead, each reading its own format
//! with its own shuffle through a PyTorch DataLoader: PyTorch map-style over a memmapped
//! `.npy` (RandomSampler), MosaicML Streaming (`py1e`, its default, and `naive`), LitData
//! (`shuffle=True`) and WebDataset (shard shuffle and a 1,000-sample buffer).
//!
//! The peers live in a virtual environment of the suite's own (made on first use under the
//! cache directory, never in the user's interpreter). The same label-sorted records, 4 KiB
//! and 100 KiB, are written once per peer with the peer's own writer (`bench/peers.py
//! write`). Each reader then reads one epoch in a process of its own, from a cold cache,
//! inside a fresh memory cgroup of `--memory`'s size (1 GiB by default: smaller than the
//! data, page cache included; `none`: the machine's), whose `memory.peak` is the row's peak
//! memory; `--epochs` epochs per run (3 by default: from the second on the page cache helps
//! the peers, as memory helps riffle's resident mode). Readers are alternated,
//! the order reversed every other round; medians are reported. Shuffle quality is scored
//! the same way for everyone from the records' own ids and labels.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use riffle::emulate::MemoryLimit;
use riffle::gen::{GenFormat, GenSpec};
use serde::Serialize;

use crate::report;

/// What the suite's virtual environment holds: the versions it was measured with.
pub const REQUIREMENTS: &[&str] = &[
    "torch",
    "numpy",
    "mosaicml-streaming==0.13.0",
    "litdata==0.2.76",
    "webdataset==1.0.2",
];

/// Options of the suite.
#[derive(Clone, Debug)]
pub struct PeersOptions {
    /// Where results go.
    pub out: PathBuf,
    /// Where the datasets are made.
    pub data_dir: PathBuf,
    /// (records, record bytes) of each dataset.
    pub datasets: Vec<(u64, u64)>,
    /// The memory cgroup's limit; `None`: the machine's memory (the cgroup is still made, with
    /// the machine's size as its limit, so that its peak is measured the same way).
    pub memory: Option<u64>,
    /// Epochs per run: the samples/s is over all of them (from the second epoch on, the page
    /// cache, where it holds the data, helps the peers as memory helps riffle).
    pub epochs: u64,
    /// DataLoader workers, the same for every loader that uses them.
    pub workers: u32,
    /// Records per batch.
    pub batch: u32,
    /// Runs per reader (alternated, order reversed every other round).
    pub rounds: usize,
    /// Keep the datasets.
    pub keep: bool,
    /// A reader still short of its epoch after this long stops, and its rate so far is
    /// its figure (a map-style loader under the memory limit reads a few hundred records a
    /// second here: a whole epoch would take most of an hour).
    pub max_seconds: u64,
}

/// A reader of the table.
struct Reader {
    name: &'static str,
    /// `bench/peers.py read` KIND, or `None` for in-process `riffle read`.
    kind: Option<&'static str>,
    /// The peer format it reads (`None`: the `.npy` itself).
    format: Option<&'static str>,
    riffle: bool,
    full_shuffle: bool,
}

const READERS: &[Reader] = &[
    Reader {
        name: "riffle read (in process)",
        kind: None,
        format: None,
        riffle: true,
        full_shuffle: true,
    },
    Reader {
        name: "riffle.torch.loader, no workers (ring views)",
        kind: Some("riffle-views"),
        format: None,
        riffle: true,
        full_shuffle: true,
    },
    Reader {
        name: "riffle.torch.loader, workers (tickets, no copy)",
        kind: Some("riffle-tickets"),
        format: None,
        riffle: true,
        full_shuffle: true,
    },
    Reader {
        name: "DataLoader(RiffleDataset), workers (one copy)",
        kind: Some("riffle-dataloader"),
        format: None,
        riffle: true,
        full_shuffle: true,
    },
    Reader {
        name: "PyTorch map-style .npy memmap, RandomSampler",
        kind: Some("map"),
        format: None,
        riffle: false,
        full_shuffle: true,
    },
    Reader {
        name: "Mosaic Streaming, shuffle_algo=py1e (default)",
        kind: Some("mds-py1e"),
        format: Some("mds"),
        riffle: false,
        full_shuffle: false,
    },
    Reader {
        name: "Mosaic Streaming, shuffle_algo=naive",
        kind: Some("mds-naive"),
        format: Some("mds"),
        riffle: false,
        full_shuffle: true,
    },
    Reader {
        name: "LitData, shuffle=True",
        kind: Some("litdata"),
        format: Some("litdata"),
        riffle: false,
        full_shuffle: false,
    },
    Reader {
        name: "WebDataset, shard shuffle + shuffle(1000)",
        kind: Some("wds"),
        format: Some("wds"),
        riffle: false,
        full_shuffle: false,
    },
];

/// One reader's run.
#[derive(Clone, Debug, Serialize)]
pub struct PeerRun {
    /// Records delivered.
    pub records: u64,
    /// Seconds for all its epochs.
    pub seconds: f64,
    /// Seconds of each epoch.
    pub epoch_seconds: Vec<f64>,
    /// Seconds to the first batch.
    pub first_batch_s: Option<f64>,
    /// CPU seconds (user + system) over the epoch: the reader's process, its workers and
    /// the daemon (`bench/peers.py` counts them), or `riffle read`'s whole process.
    pub cpu_seconds: Option<f64>,
    /// The memory cgroup's peak (page cache included).
    pub peak_bytes: Option<u64>,
    /// The peak of the cgroup's anonymous and shared memory (page cache left out).
    pub anon_peak_bytes: Option<u64>,
    /// Distinct labels per batch (10 = shuffled; the data is label-sorted).
    pub labels_per_batch: Option<f64>,
    /// Correlation of delivery position with record id (0 = shuffled, 1 = in order).
    pub position_corr: Option<f64>,
    /// Every record delivered exactly once (not known for a partial run).
    pub exactly_once: Option<bool>,
    /// Stopped at the time limit before the end of its epoch: the rate and quality are of
    /// what it read.
    pub partial: bool,
    /// Why the run failed (a peer killed by the memory limit, say).
    pub error: Option<String>,
}

/// A reader's runs on one dataset, and their medians.
#[derive(Clone, Debug, Serialize)]
pub struct PeerRow {
    /// Who read.
    pub reader: String,
    /// Whether it delivers a full uniform shuffle.
    pub full_shuffle: bool,
    /// Part of riffle.
    pub riffle: bool,
    /// Reads through DataLoader worker processes.
    pub workers: bool,
    /// Median samples per second over the runs that finished.
    pub samples_per_s: Option<f64>,
    /// Median samples per CPU-second.
    pub samples_per_cpu_s: Option<f64>,
    /// The fastest riffle row through PyTorch over this one.
    pub riffle_speedup: Option<f64>,
    /// Median seconds to the first batch.
    pub first_batch_s: Option<f64>,
    /// Largest peak memory of the runs (the cgroup's, page cache included).
    pub peak_bytes: Option<u64>,
    /// Largest peak of anonymous and shared memory of the runs.
    pub anon_peak_bytes: Option<u64>,
    /// Median distinct labels per batch.
    pub labels_per_batch: Option<f64>,
    /// Median position correlation.
    pub position_corr: Option<f64>,
    /// Every run delivered every record exactly once.
    pub exactly_once: Option<bool>,
    /// The runs.
    pub runs: Vec<PeerRun>,
}

/// One dataset's table.
#[derive(Clone, Debug, Serialize)]
pub struct PeerTable {
    /// Records.
    pub records: u64,
    /// Bytes per record.
    pub record: u64,
    /// Seconds each peer's writer took (peer format, seconds, bytes written).
    pub writes: Vec<(String, f64, u64)>,
    /// The rows.
    pub rows: Vec<PeerRow>,
    /// The targets, checked: (what, ratio, met).
    pub targets: Vec<(String, Option<f64>, bool)>,
}

/// The suite's result.
#[derive(Clone, Debug, Serialize)]
pub struct PeersReport {
    /// The memory limit (`None`: the machine's).
    pub memory: Option<u64>,
    /// Epochs per run.
    pub epochs: u64,
    /// Records per batch.
    pub batch: u32,
    /// DataLoader workers.
    pub workers: u32,
    /// Runs per reader.
    pub rounds: usize,
    /// The time limit of a run (see [`PeersOptions::max_seconds`]).
    pub max_seconds: u64,
    /// Page cache dropped before each run.
    pub cold_cache: bool,
    /// The virtual environment the peers ran in, and what it holds.
    pub venv: String,
    /// Package versions, as the venv's pip reports them.
    pub versions: Vec<String>,
    /// One table per dataset.
    pub tables: Vec<PeerTable>,
    /// Where written.
    pub report_dir: String,
}

/// Where the suite's virtual environment lives: `RIFFLE_BENCH_VENV`, or `peers-venv` in
/// riffle's cache directory.
pub fn venv_dir() -> PathBuf {
    std::env::var_os("RIFFLE_BENCH_VENV")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| riffle::probe::cache_dir().join("peers-venv"))
}

/// The marker a finished install leaves, holding the requirements it installed.
fn marker(venv: &Path) -> PathBuf {
    venv.join("riffle-peers-requirements.txt")
}

/// Whether the virtual environment at `venv` is made and holds [`REQUIREMENTS`].
pub fn venv_ready(venv: &Path) -> bool {
    std::fs::read_to_string(marker(venv)).is_ok_and(|s| s == REQUIREMENTS.join("\n"))
}

fn run_checked(cmd: &mut Command, what: &str) -> Result<std::process::Output> {
    let out = cmd
        .output()
        .with_context(|| format!("{what}: cannot start"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(12).collect();
        bail!(
            "{what} failed ({}):\n{}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    Ok(out)
}

/// Makes the suite's virtual environment at `venv` unless it is ready; returns its python.
/// It sees the system's site packages, so a torch already installed there is used rather
/// than fetched again; everything else goes into the environment.
pub fn ensure_venv(venv: &Path, say: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let python = venv.join("bin/python");
    if venv_ready(venv) {
        return Ok(python);
    }
    say(&format!(
        "making the peers' virtual environment at {} with {} (a few GB where torch is not \
         installed yet; once)",
        venv.display(),
        REQUIREMENTS.join(", ")
    ));
    run_checked(
        Command::new("python3")
            .args(["-m", "venv", "--system-site-packages"])
            .arg(venv),
        &format!("python3 -m venv {}", venv.display()),
    )?;
    run_checked(
        Command::new(&python)
            .args(["-m", "pip", "install", "--disable-pip-version-check", "-q"])
            .args(REQUIREMENTS),
        &format!("pip install into {}", venv.display()),
    )?;
    std::fs::write(marker(venv), REQUIREMENTS.join("\n"))
        .with_context(|| marker(venv).display().to_string())?;
    Ok(python)
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("peers.py")
}

fn versions(python: &Path) -> Vec<String> {
    let names = [
        "torch",
        "numpy",
        "mosaicml-streaming",
        "litdata",
        "webdataset",
    ];
    let code = format!(
        "import importlib.metadata as m\nfor n in {names:?}:\n    print(n + '==' + m.version(n))"
    );
    Command::new(python)
        .args(["-c", &code])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// How long one reader may take before it is stopped and reported as hung.
const RUN_LIMIT: std::time::Duration = std::time::Duration::from_secs(20 * 60);

/// Anonymous plus shared memory charged to the cgroup at `dir` now: what the reader's
/// processes hold, page cache (the libraries' and the data's) left out.
fn anon_bytes(dir: &Path) -> Option<u64> {
    let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
    let get = |k: &str| {
        stat.lines().find_map(|l| {
            l.strip_prefix(k)?
                .strip_prefix(' ')?
                .trim()
                .parse::<u64>()
                .ok()
        })
    };
    // v1 says rss, v2 anon.
    Some(get("rss").or_else(|| get("anon"))? + get("shmem").unwrap_or(0))
}

/// Runs `cmd` inside a fresh memory cgroup of `memory` bytes from a cold cache: its JSON
/// line on stdout and the peaks of the cgroup (page cache included) and of its anonymous
/// and shared memory (sampled every 20 ms), or why it failed. A reader that runs past
/// [`RUN_LIMIT`] is killed with its whole process group and reported as hung.
fn measured(cmd: &mut Command, memory: Option<u64>, cold: &mut bool) -> Measured {
    *cold &= report::drop_caches();
    let limit = match MemoryLimit::enter(memory.unwrap_or_else(machine_memory)) {
        Ok(l) => l,
        Err(e) => return (Err(e.into()), None, None, None),
    };
    // The child's CPU, for a reader that does not count its own (`riffle read`).
    use nix::sys::resource::UsageWho::RUSAGE_CHILDREN;
    let cpu0 = report::cpu_seconds(RUSAGE_CHILDREN);
    let mut anon_peak = None;
    let run = crate::child::run(cmd, RUN_LIMIT, &mut || {
        anon_peak = anon_peak.max(anon_bytes(limit.cgroup()));
    });
    // cgroup v2 calls it memory.peak, v1 memory.max_usage_in_bytes.
    let peak = ["memory.peak", "memory.max_usage_in_bytes"]
        .iter()
        .find_map(|f| std::fs::read_to_string(limit.cgroup().join(f)).ok())
        .and_then(|s| s.trim().parse().ok());
    drop(limit);
    let cpu = report::cpu_seconds(RUSAGE_CHILDREN) - cpu0;
    let res = run.and_then(|(status, out, err)| crate::child::json_result(status, &out, &err));
    (res, peak, anon_peak, Some(cpu))
}

/// The machine's memory (MemTotal): the limit of a cgroup that limits nothing.
fn machine_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let kb = m.lines().find_map(|l| l.strip_prefix("MemTotal:"))?;
            kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok()
        })
        .map_or(u64::MAX >> 2, |kb| kb << 10)
}

/// A reader's JSON result (or why it failed), the cgroup's peak, the peak of its anonymous
/// and shared memory, and the CPU seconds of the process and the children it waited for.
type Measured = (
    Result<serde_json::Value>,
    Option<u64>,
    Option<u64>,
    Option<f64>,
);

fn as_run((v, peak, anon_peak, child_cpu): Measured, in_process: bool) -> PeerRun {
    match v {
        Ok(v) => PeerRun {
            records: v["records"].as_u64().unwrap_or(0),
            seconds: v["seconds"].as_f64().unwrap_or(0.0),
            epoch_seconds: (v["epoch_seconds"].as_array().into_iter().flatten())
                .filter_map(|x| x.as_f64())
                .collect(),
            first_batch_s: v[if in_process {
                "first_batch_seconds"
            } else {
                "first_batch_s"
            }]
            .as_f64(),
            cpu_seconds: v["cpu_seconds"].as_f64().or(child_cpu),
            peak_bytes: peak,
            anon_peak_bytes: anon_peak,
            labels_per_batch: v["labels_per_batch"].as_f64(),
            position_corr: v["position_corr"].as_f64(),
            exactly_once: v["exactly_once"].as_bool(),
            partial: v["partial"].as_bool().unwrap_or(false),
            error: None,
        },
        Err(e) => PeerRun {
            records: 0,
            seconds: 0.0,
            epoch_seconds: Vec::new(),
            first_batch_s: None,
            cpu_seconds: None,
            peak_bytes: peak,
            anon_peak_bytes: anon_peak,
            labels_per_batch: None,
            position_corr: None,
            exactly_once: None,
            partial: false,
            error: Some(format!("{e:#}")),
        },
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn row(r: &Reader, runs: Vec<PeerRun>) -> PeerRow {
    let ok: Vec<&PeerRun> = runs.iter().filter(|x| x.error.is_none()).collect();
    let med =
        |f: &dyn Fn(&PeerRun) -> Option<f64>| median(ok.iter().filter_map(|x| f(x)).collect());
    PeerRow {
        reader: r.name.into(),
        full_shuffle: r.full_shuffle,
        riffle: r.riffle,
        workers: r.kind.is_some_and(|k| k != "riffle-views"),
        samples_per_s: med(&|x| Some(x.records as f64 / x.seconds.max(1e-9))),
        samples_per_cpu_s: med(&|x| {
            x.cpu_seconds
                .filter(|&c| c > 0.0)
                .map(|c| x.records as f64 / c)
        }),
        riffle_speedup: None,
        first_batch_s: med(&|x| x.first_batch_s),
        peak_bytes: runs.iter().filter_map(|x| x.peak_bytes).max(),
        anon_peak_bytes: runs.iter().filter_map(|x| x.anon_peak_bytes).max(),
        labels_per_batch: med(&|x| x.labels_per_batch),
        position_corr: med(&|x| x.position_corr),
        exactly_once: if ok.is_empty() || ok.iter().any(|x| x.exactly_once.is_none()) {
            None
        } else {
            Some(ok.len() == runs.len() && ok.iter().all(|x| x.exactly_once == Some(true)))
        },
        runs,
    }
}

/// Fills in each row's speed-up and the table's targets: the fastest riffle row through
/// PyTorch against the fastest peer at any setting (>= 1x) and against every full-shuffle
/// peer setting (>= 5x); riffle's DataLoader-with-workers rows against the fastest peer
/// (>= 3x, issue 19's bar).
fn score(rows: &mut [PeerRow]) -> Vec<(String, Option<f64>, bool)> {
    let through_torch = |r: &PeerRow| r.riffle && !r.reader.starts_with("riffle read");
    let best = rows
        .iter()
        .filter(|r| through_torch(r))
        .filter_map(|r| r.samples_per_s)
        .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))));
    for r in rows.iter_mut() {
        r.riffle_speedup = best.zip(r.samples_per_s).map(|(b, x)| b / x.max(1e-9));
    }
    let peers: Vec<&PeerRow> = rows.iter().filter(|r| !r.riffle).collect();
    let fastest = peers
        .iter()
        .filter_map(|r| r.samples_per_s)
        .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))));
    let workers_best = rows
        .iter()
        .filter(|r| r.riffle && r.workers)
        .filter_map(|r| r.samples_per_s)
        .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))));
    let mut t = Vec::new();
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b.max(1e-9));
    let r = ratio(best, fastest);
    t.push((
        "riffle (fastest through PyTorch) / fastest peer at any setting >= 1.0".into(),
        r,
        r.is_some_and(|x| x >= 1.0),
    ));
    for p in peers.iter().filter(|p| p.full_shuffle) {
        let r = ratio(best, p.samples_per_s);
        t.push((
            format!("riffle / {} >= 5.0", p.reader),
            r,
            r.is_some_and(|x| x >= 5.0),
        ));
    }
    let r = ratio(workers_best, fastest);
    t.push((
        "riffle with DataLoader workers / fastest peer >= 3.0".into(),
        r,
        r.is_some_and(|x| x >= 3.0),
    ));
    t
}

/// Runs the suite.
pub fn run(
    opts: &PeersOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<PeersReport> {
    let venv = venv_dir();
    let python = ensure_venv(&venv, &mut |s| eprintln!("peers: {s}"))?;
    std::fs::create_dir_all(&opts.data_dir).with_context(|| opts.data_dir.display().to_string())?;
    let riffle = std::env::current_exe().context("the riffle binary")?;
    let steps = opts.datasets.len() * (1 + READERS.len() * opts.rounds);
    let mut step = 0;
    let mut cold = true;
    let mut made: Vec<PathBuf> = Vec::new();
    let result = (|| -> Result<Vec<PeerTable>> {
        let mut tables = Vec::new();
        for &(records, record) in &opts.datasets {
            progress(
                step,
                steps,
                &format!("writing {records} records of {record} B, each peer's way"),
            );
            step += 1;
            let npy = opts
                .data_dir
                .join(format!("riffle-peers-{records}x{record}.npy"));
            let spec = GenSpec {
                format: GenFormat::Npy,
                records,
                record_size: record,
                jitter: 0.0,
                labels: 10,
                sorted: true,
                seed: 0,
            };
            if !npy.exists() {
                made.push(npy.clone());
                riffle::gen::generate(
                    &npy,
                    &spec,
                    &riffle::io::IoConfig::sequential_write(),
                    &mut |_, _| {},
                )?;
            }
            let mut writes = Vec::new();
            for format in ["mds", "litdata", "wds"] {
                let dir = opts
                    .data_dir
                    .join(format!("riffle-peers-{records}x{record}.{format}"));
                let done = dir.join(".riffle-written");
                if !done.exists() {
                    let _ = std::fs::remove_dir_all(&dir);
                    made.push(dir.clone());
                    let t = Instant::now();
                    let out = run_checked(
                        Command::new(&python)
                            .arg(script())
                            .arg("write")
                            .arg(format)
                            .arg(&npy)
                            .arg(&dir),
                        &format!("writing {} with {format}'s writer", npy.display()),
                    )?;
                    let v: serde_json::Value = serde_json::from_slice(
                        out.stdout
                            .rsplit(|&b| b == b'\n')
                            .find(|l| l.starts_with(b"{"))
                            .unwrap_or(b"{}"),
                    )
                    .unwrap_or_default();
                    writes.push((
                        format.to_string(),
                        t.elapsed().as_secs_f64(),
                        v["bytes"].as_u64().unwrap_or(0),
                    ));
                    std::fs::write(&done, "")?;
                }
            }
            let mut runs: Vec<Vec<PeerRun>> = vec![Vec::new(); READERS.len()];
            for round in 0..opts.rounds {
                let mut order: Vec<usize> = (0..READERS.len()).collect();
                if round % 2 == 1 {
                    order.reverse();
                }
                for i in order {
                    let r = &READERS[i];
                    progress(
                        step,
                        steps,
                        &format!("{} ({records} x {record} B), round {}", r.name, round + 1),
                    );
                    step += 1;
                    let measured_run = match r.kind {
                        None => measured(
                            // No --memory: the budget is the machine's (or the cgroup's),
                            // as a user who passes nothing gets it.
                            Command::new(&riffle).arg("read").arg(&npy).args([
                                "--batch-size",
                                &opts.batch.to_string(),
                                "--seed",
                                "1",
                                "--epochs",
                                &opts.epochs.to_string(),
                                "--json",
                            ]),
                            opts.memory,
                            &mut cold,
                        ),
                        Some(kind) => {
                            let path = r
                                .format
                                .map(|f| {
                                    opts.data_dir
                                        .join(format!("riffle-peers-{records}x{record}.{f}"))
                                })
                                .unwrap_or_else(|| npy.clone());
                            measured(
                                Command::new(&python)
                                    .arg(script())
                                    .args(["read", kind])
                                    .arg(&path)
                                    .args([
                                        "--records",
                                        &records.to_string(),
                                        "--batch-size",
                                        &opts.batch.to_string(),
                                        "--workers",
                                        &opts.workers.to_string(),
                                        "--max-seconds",
                                        &opts.max_seconds.to_string(),
                                        "--epochs",
                                        &opts.epochs.to_string(),
                                        "--riffle",
                                    ])
                                    .arg(&riffle)
                                    .env("PYTHONUNBUFFERED", "1"),
                                opts.memory,
                                &mut cold,
                            )
                        }
                    };
                    runs[i].push(as_run(measured_run, r.kind.is_none()));
                }
            }
            let mut rows: Vec<PeerRow> = READERS
                .iter()
                .zip(runs)
                .map(|(r, runs)| row(r, runs))
                .collect();
            let targets = score(&mut rows);
            tables.push(PeerTable {
                records,
                record,
                writes,
                rows,
                targets,
            });
        }
        Ok(tables)
    })();
    if !opts.keep {
        for p in &made {
            let _ = std::fs::remove_file(p).or_else(|_| std::fs::remove_dir_all(p));
        }
    }
    let tables = result?;
    let dir = report::results_dir(&opts.out)?;
    let rep = PeersReport {
        memory: opts.memory,
        epochs: opts.epochs,
        batch: opts.batch,
        workers: opts.workers,
        rounds: opts.rounds,
        max_seconds: opts.max_seconds,
        cold_cache: cold,
        venv: venv.display().to_string(),
        versions: versions(&python),
        tables,
        report_dir: dir.display().to_string(),
    };
    report::write_report(&dir, "peers", &serde_json::to_value(&rep)?, &markdown(&rep))?;
    Ok(rep)
}

/// The epoch times of the run of median speed, e.g. "2.31 / 0.42 / 0.40".
fn epochs_of(runs: &[PeerRun]) -> String {
    let mut ok: Vec<&PeerRun> = runs.iter().filter(|r| r.error.is_none()).collect();
    ok.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    ok.get(ok.len() / 2).map_or(String::new(), |r| {
        let e: Vec<String> = r.epoch_seconds.iter().map(|s| format!("{s:.2}")).collect();
        e.join(" / ")
    })
}

fn opt(x: Option<f64>, digits: usize) -> String {
    x.map(|v| format!("{v:.digits$}")).unwrap_or_default()
}

/// The report as Markdown.
pub fn markdown(r: &PeersReport) -> String {
    let mut s = String::from("# peers: riffle against the loaders users pick instead\n\n");
    s.push_str(&format!(
        "{} {}: {} epoch(s) of label-sorted records per run (samples/s over all of them), \
         batches of {}, DataLoader workers {} wherever a loader uses them, each run in its \
         own memory cgroup of {} (page cache included), cold cache: {}; {} run(s) per \
         reader, alternated, medians; a reader still short of its epochs after {} s stops \
         there and its rate so far is its figure. Peers from {} ({}).\n\n",
        report::today(),
        report::hostname(),
        r.epochs,
        r.batch,
        r.workers,
        r.memory
            .map_or("the machine's memory (no limit)".into(), |m| {
                riffle::size::human_bytes(m as f64)
            }),
        r.cold_cache,
        r.rounds,
        r.max_seconds,
        r.venv,
        r.versions.join(", ")
    ));
    for t in &r.tables {
        s.push_str(&format!(
            "## {} records of {} ({})\n\n",
            t.records,
            riffle::size::human_bytes(t.record as f64),
            riffle::size::human_bytes((t.records * t.record) as f64)
        ));
        s.push_str("| reader | full shuffle | samples/s | per CPU-second | riffle speed-up | 1st batch (s) | epoch s (median run) | peak memory (anon + shm) | peak with page cache | labels/batch | position corr | every record once |\n|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|\n");
        for x in &t.rows {
            let err = x.runs.iter().find_map(|r| r.error.as_deref());
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                x.reader,
                if x.full_shuffle { "yes" } else { "no" },
                x.samples_per_s
                    .map(|v| format!("{v:.0}"))
                    .unwrap_or_else(|| format!("failed: {}", err.unwrap_or("?"))),
                opt(x.samples_per_cpu_s, 0),
                x.riffle_speedup
                    .map(|v| format!("{v:.2}x"))
                    .unwrap_or_default(),
                opt(x.first_batch_s, 2),
                epochs_of(&x.runs),
                x.anon_peak_bytes
                    .map(|b| riffle::size::human_bytes(b as f64))
                    .unwrap_or_default(),
                x.peak_bytes
                    .map(|b| riffle::size::human_bytes(b as f64))
                    .unwrap_or_default(),
                opt(x.labels_per_batch, 1),
                opt(x.position_corr, 3),
                if x.runs.iter().any(|r| r.partial) {
                    format!("not known: stopped after {} s", r.max_seconds)
                } else {
                    x.exactly_once.map(|b| b.to_string()).unwrap_or_default()
                },
            ));
        }
        s.push('\n');
        for (what, ratio, met) in &t.targets {
            s.push_str(&format!(
                "- {what}: {} {}\n",
                opt(*ratio, 2),
                if *met { "(met)" } else { "(not met)" }
            ));
        }
        if !t.writes.is_empty() {
            s.push_str("\nWriting each peer's format: ");
            s.push_str(
                &t.writes
                    .iter()
                    .map(|(f, secs, b)| {
                        format!("{f} {secs:.1} s ({})", riffle::size::human_bytes(*b as f64))
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            );
            s.push('\n');
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(reader: &str, riffle: bool, full: bool, sps: f64) -> PeerRow {
        PeerRow {
            reader: reader.into(),
            full_shuffle: full,
            riffle,
            workers: reader.contains("workers (") && !reader.contains("no workers"),
            samples_per_s: Some(sps),
            samples_per_cpu_s: None,
            riffle_speedup: None,
            first_batch_s: None,
            peak_bytes: None,
            anon_peak_bytes: None,
            labels_per_batch: None,
            position_corr: None,
            exactly_once: None,
            runs: Vec::new(),
        }
    }

    /// The targets compare the fastest riffle row through PyTorch (not the in-process one)
    /// with the fastest peer and with each full-shuffle peer, and riffle's worker rows with
    /// the fastest peer; a miss is reported as a miss.
    #[test]
    fn targets_are_scored_against_the_right_rows() {
        let mut rows = vec![
            r("riffle read (in process)", true, true, 1000.0),
            r(
                "riffle.torch.loader, no workers (ring views)",
                true,
                true,
                100.0,
            ),
            r(
                "DataLoader(RiffleDataset), workers (one copy)",
                true,
                true,
                50.0,
            ),
            r("fast peer", false, false, 40.0),
            r("full peer", false, true, 10.0),
        ];
        let t = score(&mut rows);
        assert_eq!(t[0].1, Some(2.5));
        assert!(t[0].2);
        assert_eq!(t[1].1, Some(10.0));
        assert!(t[1].2 && t[1].0.contains("full peer"));
        assert_eq!(t[2].1, Some(1.25));
        assert!(!t[2].2, "1.25x is below the 3x bar");
        assert_eq!(rows[4].riffle_speedup, Some(10.0));
        assert_eq!(rows[0].riffle_speedup, Some(0.1));
    }

    /// A venv path that cannot be made is a clear error naming it, not a traceback later.
    #[test]
    fn a_venv_that_cannot_be_made_is_named() {
        let venv = Path::new("/dev/null/riffle-venv");
        assert!(!venv_ready(venv));
        let err = ensure_venv(venv, &mut |_| {}).unwrap_err().to_string();
        assert!(err.contains("/dev/null/riffle-venv"), "{err}");
    }
}
