//! node: `riffle serve` as the one feeder of a training node (issue 15), against an
//! in-process `riffle read` of the same epoch in the same run, alternated, cold cache.
//!
//! - **one-job**: 16 streams of one job (world 16, ranks 0..15, batch 256) on a `.npy` of
//!   4 KiB records (2 GiB; 512 MiB with `--quick`), LIRS and two-pass: the records/s of the
//!   16 streams together against one in-process read of the whole epoch (target >= 0.9),
//!   and the bytes the daemon read from storage (/proc/PID/io) against what one read of
//!   the epoch reads (the dataset with LIRS's alignment overhead; two-pass: the dataset and
//!   its piles once), target <= 1.1, with the largest scratch seen.
//! - **many-jobs**: 64 clients at once, each a job of its own, `--memory 1G`: the daemon's
//!   peak RSS (target <= 1 GiB + 128 MiB), every client's epoch whole.
//! - **attacks**: each attack of issue 15 against an honest client's stream: its
//!   batches/s after the attacker left against before (target >= 0.95), the daemon's CPU,
//!   its slots; SIGTERM after the socket file was removed (target <= 1 s, nothing left).
//! - **soak**: 64 connections for 5 minutes (1 with `--quick`), honest clients of several
//!   jobs among attackers ([`crate::soak`]): no honest record lost, repeated or corrupted;
//!   RSS and fds flat over the last 80%.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use riffle::serve::proto::{self, Kind};
use riffle::serve::{Client, OpenRequest};
use serde::Serialize;
use std::io::Write;

use crate::report;
use crate::scale::{gen, median, num, riffle_bin, run_riffle, Row};

/// Options of the suite.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// Where results go.
    pub out: PathBuf,
    /// Where the test data is made.
    pub data_dir: PathBuf,
    /// A smaller dataset.
    pub quick: bool,
    /// Keep the data for the next run.
    pub keep: bool,
    /// Runs per side (alternated).
    pub repeats: usize,
    /// How long the soak runs.
    pub soak_seconds: f64,
    /// The cases to run (all when empty): one-job (both modes), one-job-lirs,
    /// one-job-two-pass, many-jobs, soak, attacks.
    pub cases: Vec<String>,
}

impl NodeOptions {
    fn wants(&self, case: &str) -> bool {
        self.cases.is_empty()
            || self.cases.iter().any(|c| {
                c == case
                    || case
                        .strip_prefix(c.as_str())
                        .is_some_and(|r| r.starts_with('-'))
            })
    }
}

/// The suite's result.
#[derive(Clone, Debug, Serialize)]
pub struct NodeReport {
    /// The comparisons.
    pub rows: Vec<Row>,
    /// The soak, in full (its samples of RSS and fds).
    pub soak: crate::soak::SoakReport,
    /// Page cache dropped before each run.
    pub cold_cache: bool,
    /// Where written.
    pub report_dir: String,
}

/// A daemon for the suite, killed (SIGTERM, then SIGKILL) when dropped.
struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Daemon {
    fn start(socket: &Path, data: &Path, mode: &str) -> Result<Daemon> {
        Self::start_with(socket, data, mode, &["--memory", "2G"])
    }

    fn start_with(socket: &Path, data: &Path, mode: &str, extra: &[&str]) -> Result<Daemon> {
        Self::start_serving(socket, &[format!("train={}", data.display())], mode, extra)
    }

    /// A daemon serving `datasets` (`NAME=SPEC` each).
    fn start_serving(
        socket: &Path,
        datasets: &[String],
        mode: &str,
        extra: &[&str],
    ) -> Result<Daemon> {
        let _ = std::fs::remove_file(socket);
        let mut cmd = Command::new(riffle_bin()?);
        cmd.args(["serve", "--socket"]).arg(socket);
        for d in datasets {
            cmd.arg("--dataset").arg(d);
        }
        let child = cmd
            .args(["--mode", mode])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting riffle serve")?;
        let d = Daemon {
            child,
            socket: socket.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while UnixStream::connect(&d.socket).is_err() {
            if Instant::now() > deadline {
                bail!("riffle serve did not listen on {}", d.socket.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(d)
    }

    /// Peak resident memory (VmHWM), bytes.
    fn peak_rss(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb << 10)
    }

    fn read_bytes(&self) -> u64 {
        let s =
            std::fs::read_to_string(format!("/proc/{}/io", self.child.id())).unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix("read_bytes:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Bytes of the files under `dir` whose path contains `.riffle-scratch`.
fn scratch_bytes(dir: &Path, inside: bool) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| {
            let inside = inside
                || e.file_name()
                    .to_string_lossy()
                    .starts_with(".riffle-scratch");
            match e.file_type() {
                Ok(t) if t.is_dir() => scratch_bytes(&e.path(), inside),
                Ok(t) if t.is_file() && inside => e.metadata().map_or(0, |m| m.len()),
                _ => 0,
            }
        })
        .sum()
}

/// One epoch of a job of `world` ranks through the daemon, each rank on a thread of its
/// own: (records, wall seconds, bytes read by the daemon, largest scratch seen, CPU
/// seconds of the daemon and of the clients' threads).
fn one_job(d: &Daemon, world: u64, data_dir: &Path) -> Result<(u64, f64, u64, u64, f64)> {
    use nix::sys::resource::UsageWho::RUSAGE_SELF;
    report::drop_caches();
    let before = d.read_bytes();
    let cpu0 = cpu_seconds(d.child.id()) + report::cpu_seconds(RUSAGE_SELF);
    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (done, peak, dir) = (done.clone(), peak.clone(), data_dir.to_path_buf());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(scratch_bytes(&dir, false), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let started = Instant::now();
    let results: Vec<Result<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|rank| {
                s.spawn(move || -> Result<u64> {
                    let mut c = Client::connect(&d.socket)?;
                    let mut req = OpenRequest::new("train", 256);
                    req.seed = 7;
                    req.rank = rank;
                    req.world = world;
                    req.tail = "drop_last".into();
                    let mut st = c.open(req)?;
                    let mut n = 0;
                    while let Some(b) = st.next_batch()? {
                        n += b.ids().len() as u64;
                    }
                    Ok(n)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a client thread panicked"))
            })
            .collect()
    });
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(d.child.id()) + report::cpu_seconds(RUSAGE_SELF) - cpu0;
    if let Ok(st) = Client::connect(&d.socket).and_then(|mut c| c.stats()) {
        eprintln!(
            "one-job: {} batches, {} assembled in the rings, {} announced from the engine's thread",
            st["batches"], st["batches_in_place"], st["batches_announced_early"]
        );
    }
    done.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let mut records = 0;
    for r in results {
        records += r?;
    }
    Ok((
        records,
        seconds,
        d.read_bytes() - before,
        peak.load(Ordering::Relaxed),
        cpu,
    ))
}

/// 64 clients at once, each a job of its own (its own seed; world 1), LIRS, on a dataset
/// of 256 MiB (64 MiB quick) with `--memory 1G`: the daemon's peak RSS against the budget
/// plus 128 MiB; every client's epoch is checked whole, and the clients the budget made
/// wait or refused are counted.
fn many_jobs(socket: &Path, data_dir: &Path, quick: bool) -> Result<Row> {
    let size: u64 = if quick { 64 << 20 } else { 256 << 20 };
    let records = size / 4096;
    let data = data_dir.join(format!("node-small-{records}.npy"));
    gen(&data, "npy", records, "4096", &[])?;
    let d = Daemon::start_with(
        socket,
        &data,
        "lirs",
        &["--memory", "1G", "--admit-wait", "600"],
    )?;
    report::drop_caches();
    let started = Instant::now();
    let results: Vec<Result<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..64u64)
            .map(|i| {
                let d = &d;
                s.spawn(move || -> Result<u64> {
                    let mut c = Client::connect(&d.socket)?;
                    let mut req = OpenRequest::new("train", 256);
                    req.seed = i;
                    let mut st = c.open(req)?;
                    let mut n = 0;
                    while let Some(b) = st.next_batch()? {
                        n += b.ids().len() as u64;
                    }
                    Ok(n)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a client thread panicked"))
            })
            .collect()
    });
    let seconds = started.elapsed().as_secs_f64();
    let rss = d.peak_rss();
    drop(d);
    let mut busy = 0;
    for r in results {
        match r {
            Ok(n) if n == records => {}
            Ok(n) => bail!("many-jobs: a client got {n} of {records} records"),
            Err(e) if e.to_string().contains("busy") => busy += 1,
            Err(e) => return Err(e),
        }
    }
    let _ = std::fs::remove_file(&data);
    let limit = (1u64 << 30) + (128 << 20);
    Ok(Row {
        case: "64 clients of different jobs, lirs, --memory 1G: daemon peak RSS".into(),
        value: rss as f64,
        unit: "bytes".into(),
        reference: limit as f64,
        reference_is: "1 GiB + 128 MiB".into(),
        ratio: rss as f64 / limit as f64,
        target: "<= 1".into(),
        met: rss <= limit,
        records_per_cpu_s: None,
        notes: format!(
            "{} clients served whole epochs of {}, {busy} refused busy, {seconds:.1} s",
            64 - busy,
            riffle::size::human_bytes(size as f64)
        ),
    })
}

/// The soak (see [`crate::soak`]) against two daemons, one lirs and one two-pass, each
/// serving a `.npy` file (40,000 records of 512 B), a tree of 4,000 files and a mixture of
/// the file and a second one (20,000 draws an epoch): honest batches checked, RSS and fds over the last 80%.
fn soak(
    socket: &Path,
    data_dir: &Path,
    seconds: f64,
) -> Result<(Vec<Row>, crate::soak::SoakReport)> {
    let (records, files, draws) = (40_000u64, 4_000u64, 20_000u64);
    let data = data_dir.join(format!("node-soak-{records}.npy"));
    gen(&data, "npy", records, "512", &[])?;
    let tree = data_dir.join(format!("node-soak-tree-{files}"));
    gen(&tree, "files", files, "512", &[])?;
    // A mixture's sources share one format: the file and a second, smaller one.
    let other = data_dir.join("node-soak-other-10000.npy");
    gen(&other, "npy", 10_000, "300", &[])?;
    let specs = [
        format!("train={}", data.display()),
        format!("tree={}:files", tree.display()),
        format!(
            "mix=mix:a={}*0.7,b={}*0.3;size={draws}",
            data.display(),
            other.display()
        ),
    ];
    let extra = ["--max-clients", "80", "--idle-timeout", "5"];
    let socket2 = socket.with_extension("two-pass");
    let lirs = Daemon::start_serving(socket, &specs, "lirs", &extra)?;
    let two = Daemon::start_serving(&socket2, &specs, "two-pass", &extra)?;
    let mut targets = Vec::new();
    for (d, mode) in [(&lirs, "lirs"), (&two, "two-pass")] {
        for (name, n, mixture) in [
            ("train", records, None),
            ("tree", files, None),
            ("mix", draws, Some(vec![0, records])),
        ] {
            targets.push(crate::soak::Target {
                pid: d.child.id(),
                socket: d.socket.clone(),
                dataset: name.into(),
                label: format!("{mode} {name}"),
                records: n,
                mixture,
            });
        }
    }
    let r = crate::soak::run_targets(&targets, seconds);
    drop((lirs, two));
    let _ = std::fs::remove_file(&data);
    let _ = std::fs::remove_file(&other);
    let _ = std::fs::remove_dir_all(&tree);
    let attacks: Vec<String> = r.attacks.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let rows = vec![
        Row {
            case: format!(
                "soak {:.0} s, 64 connections to a lirs and a two-pass daemon (a file, a tree \
                 and a mixture each): honest records lost, repeated or corrupted",
                r.seconds
            ),
            value: r.violations.len() as f64,
            unit: "violations".into(),
            reference: 0.0,
            reference_is: "none".into(),
            ratio: r.violations.len() as f64,
            target: "0".into(),
            met: r.violations.is_empty(),
            records_per_cpu_s: None,
            notes: format!(
                "{} honest epochs ({} batches) checked among attacks: {}{}",
                r.honest_epochs,
                r.honest_batches,
                attacks.join(", "),
                r.violations
                    .first()
                    .map(|v| format!("; first: {v}"))
                    .unwrap_or_default()
            ),
        },
        Row {
            case: "soak: daemon RSS growth over the last 80%".into(),
            value: r.rss_growth as f64,
            unit: "bytes".into(),
            reference: (32u64 << 20) as f64,
            reference_is: "32 MiB".into(),
            ratio: r.rss_growth as f64 / (32u64 << 20) as f64,
            target: "<= 1".into(),
            met: r.rss_growth <= 32 << 20,
            records_per_cpu_s: None,
            notes: format!("open fds grew by {}", r.fd_growth),
        },
    ];
    Ok((rows, r))
}

/// CPU seconds (user + system) the process has used, from /proc/PID/stat.
fn cpu_seconds(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis: utime and stime are 14th and
    // 15th of the line, 12th and 13th after it.
    let after = s.rsplit_once(')').map_or("", |x| x.1);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// Each attack of issue 15 against a daemon serving an honest client that reads epoch
/// after epoch: the honest client's batches/s in the 4 s before the attack and the 4 s
/// after the attacker left (medians of half-second windows; target >= 0.95), the daemon's CPU in the second after against
/// the second before, and its slots; then SIGTERM after the socket file was removed.
fn attacks(socket: &Path, data_dir: &Path) -> Result<Vec<Row>> {
    let records = 200_000u64;
    let data = data_dir.join(format!("node-attack-{records}.npy"));
    gen(&data, "npy", records, "512", &[])?;
    let d = Daemon::start_with(socket, &data, "lirs", &["--max-clients", "8"])?;
    let stamps = Arc::new(std::sync::Mutex::new(Vec::<Instant>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let honest = {
        let (stamps, stop, sock) = (stamps.clone(), stop.clone(), d.socket.clone());
        std::thread::spawn(move || -> Result<u64> {
            let mut c = Client::connect(&sock)?;
            let mut req = OpenRequest::new("train", 256);
            req.epochs = 1000;
            let mut st = c.open(req)?;
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                match st.next_batch()? {
                    Some(b) => {
                        if b.ids().len() != 256 && b.header.index + 1 != records.div_ceil(256) {
                            bail!("a short batch inside the epoch");
                        }
                        n += 1;
                        stamps
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(Instant::now());
                    }
                    None => bail!("the honest stream ended early"),
                }
            }
            Ok(n)
        })
    };
    // Batches/s over [from, to): the median of its half-second windows, so that one
    // stall of the disk (which drifts by itself) does not pass for the attack's effect.
    let rate = |from: Instant, to: Instant| {
        let s = stamps.lock().unwrap_or_else(|p| p.into_inner());
        let step = Duration::from_millis(500);
        let mut rates = Vec::new();
        let mut t = from;
        while t + step <= to {
            let n = s.iter().filter(|x| **x >= t && **x < t + step).count();
            rates.push(n as f64 / step.as_secs_f64());
            t += step;
        }
        median(&rates)
    };
    let pid = d.child.id();
    let hello = || proto::json_frame(Kind::Hello, &serde_json::json!({"version": proto::VERSION}));
    let sock = d.socket.clone();
    let open_raw = move |req: serde_json::Value| -> Result<()> {
        let mut c = Client::connect(&sock)?;
        c.send(&proto::json_frame(Kind::Open, &req))?;
        c.set_read_timeout(Some(Duration::from_secs(5)))?;
        let (k, _) = c.frame()?;
        if k != Kind::Error {
            bail!("an impossible OPEN got {k:?}");
        }
        Ok(())
    };
    type Attack = Box<dyn Fn() -> Result<()>>;
    let sock = d.socket.clone();
    let sock2 = d.socket.clone();
    let sock3 = d.socket.clone();
    let sock4 = d.socket.clone();
    let o1 = open_raw.clone();
    let o2 = open_raw.clone();
    let o3 = open_raw.clone();
    let list: Vec<(&str, Attack)> = vec![
        (
            "OPEN world 2^63-1, tail pad",
            Box::new(move || {
                o1(
                    serde_json::json!({"dataset": "train", "batch_size": 32, "world": (1u64 << 63) - 1, "tail": "pad"}),
                )
            }),
        ),
        (
            "OPEN rank 2^63-1 of world 2^63",
            Box::new(move || {
                o2(
                    serde_json::json!({"dataset": "train", "batch_size": 32, "rank": (1u64 << 63) - 1, "world": 1u64 << 63}),
                )
            }),
        ),
        (
            "OPEN batch 32 x world 2^59+1",
            Box::new(move || {
                o3(
                    serde_json::json!({"dataset": "train", "batch_size": 32, "world": (1u64 << 59) + 1}),
                )
            }),
        ),
        (
            "HELLO trickled a byte a second, 3 s",
            Box::new(move || {
                let mut s = UnixStream::connect(&sock)?;
                for b in hello().iter().take(3) {
                    s.write_all(&[*b])?;
                    std::thread::sleep(Duration::from_secs(1));
                }
                Ok(())
            }),
        ),
        (
            "idle after HELLO, 3 s",
            Box::new(move || {
                let _c = Client::connect(&sock2)?;
                std::thread::sleep(Duration::from_secs(3));
                Ok(())
            }),
        ),
        (
            "3 streams that never read, 3 s",
            Box::new(move || {
                let mut cs = Vec::new();
                for i in 0..3u64 {
                    let mut c = Client::connect(&sock3)?;
                    c.send(&proto::json_frame(
                        Kind::Open,
                        &serde_json::json!({"dataset": "train", "batch_size": 256, "seed": i, "epochs": 5}),
                    ))?;
                    cs.push(c);
                }
                std::thread::sleep(Duration::from_secs(3));
                Ok(())
            }),
        ),
        (
            "garbage frames",
            Box::new(move || {
                for junk in [
                    vec![5u8, 0, 0, 0, 250, 1, 2, 3, 4],
                    vec![0xff, 0xff, 0xff, 0x7f, 1],
                ] {
                    let mut s = UnixStream::connect(&sock4)?;
                    s.set_read_timeout(Some(Duration::from_secs(5)))?;
                    s.write_all(&hello())?;
                    s.write_all(&junk)?;
                    let mut sink = Vec::new();
                    let _ = std::io::Read::read_to_end(&mut s, &mut sink);
                }
                Ok(())
            }),
        ),
    ];
    // The honest stream gets going first.
    std::thread::sleep(Duration::from_secs(3));
    let mut rows = Vec::new();
    for (name, attack) in list {
        let before_at = Instant::now();
        std::thread::sleep(Duration::from_secs(3));
        let cpu0 = cpu_seconds(pid);
        std::thread::sleep(Duration::from_secs(1));
        let cpu_before = cpu_seconds(pid) - cpu0;
        let before = rate(before_at, Instant::now());
        attack()?;
        let left = Instant::now();
        let cpu1 = cpu_seconds(pid);
        std::thread::sleep(Duration::from_secs(1));
        let cpu_after = cpu_seconds(pid) - cpu1;
        std::thread::sleep(Duration::from_secs(3));
        let after = rate(left, Instant::now());
        let s = Client::connect(&d.socket)?.stats()?;
        rows.push(Row {
            case: format!("attack: {name}"),
            value: after,
            unit: "honest batches/s after".into(),
            reference: before,
            reference_is: "before".into(),
            ratio: after / before,
            target: ">= 0.95".into(),
            met: after / before >= 0.95,
            records_per_cpu_s: None,
            notes: format!(
                "daemon CPU {:.2} s in the second after it left, {:.2} s in a second before; \
                 {} connections and {} streams open after (the honest one and this query)",
                cpu_after, cpu_before, s["clients"], s["streams_now"]
            ),
        });
    }
    stop.store(true, Ordering::Relaxed);
    let n = honest
        .join()
        .map_err(|_| anyhow::anyhow!("the honest client panicked"))??;
    // SIGTERM after the socket file was removed.
    std::fs::remove_file(&d.socket)?;
    let t = Instant::now();
    let _ = Command::new("kill").arg(pid.to_string()).status();
    let mut d = d;
    let mut gone = false;
    while t.elapsed() < Duration::from_secs(5) {
        if let Ok(Some(_)) = d.child.try_wait() {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = t.elapsed().as_secs_f64();
    let leftovers = scratch_bytes(data_dir, false);
    rows.push(Row {
        case: "SIGTERM after the socket file was removed".into(),
        value: took,
        unit: "s to exit".into(),
        reference: 1.0,
        reference_is: "1 s".into(),
        ratio: took,
        target: "<= 1".into(),
        met: gone && took <= 1.0 && leftovers == 0,
        records_per_cpu_s: None,
        notes: format!(
            "exited: {gone}; scratch left: {leftovers} bytes; the honest client read {n} batches \
             throughout, every one whole"
        ),
    });
    let _ = std::fs::remove_file(&data);
    Ok(rows)
}

/// Runs the suite.
pub fn run(opts: &NodeOptions, progress: &mut dyn FnMut(usize, usize, &str)) -> Result<NodeReport> {
    let dir = report::results_dir(&opts.out)?;
    let data_dir = opts.data_dir.join("riffle-node");
    std::fs::create_dir_all(&data_dir)?;
    let data_dir = data_dir.canonicalize()?;
    let size: u64 = if opts.quick { 512 << 20 } else { 2 << 30 };
    let records = size / 4096;
    let data = data_dir.join(format!("node-{records}.npy"));
    progress(0, 6, "one-job: writing the dataset");
    gen(&data, "npy", records, "4096", &[])?;
    let bytes = std::fs::metadata(&data)?.len();
    let cold_cache = report::drop_caches();
    let socket = data_dir.join("node.sock");
    let mut rows = Vec::new();
    let world = 16u64;
    for (i, mode) in ["lirs", "two-pass"].into_iter().enumerate() {
        if !opts.wants(&format!("one-job-{mode}")) {
            continue;
        }
        progress(1 + i, 6, &format!("one-job: {mode}, alternated runs"));
        let (mut reference, mut served, mut read, mut ref_read, mut scratch) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), 0u64);
        // Records and CPU seconds, served and in process.
        let (mut served_cpu, mut ref_cpu) = ((0.0, 0.0), (0.0, 0.0));
        let path = data.to_str().context("non-UTF-8 path")?;
        for _ in 0..opts.repeats {
            let r = run_riffle(
                &[
                    "read",
                    path,
                    "--mode",
                    mode,
                    "--batch-size",
                    "256",
                    "--json",
                ],
                None,
            )?;
            reference.push(num(&r.report, "records") / num(&r.report, "seconds"));
            ref_cpu.0 += num(&r.report, "records");
            ref_cpu.1 += r.cpu_seconds;
            // What one read of the epoch reads: the dataset (with LIRS's alignment
            // overhead), and two-pass's piles once.
            ref_read.push(num(&r.report, "device_bytes") + num(&r.report, "scratch_bytes"));
            let d = Daemon::start(&socket, &data, mode)?;
            let (n, secs, b, peak, cpu) = one_job(&d, world, &data_dir)?;
            served_cpu.0 += n as f64;
            served_cpu.1 += cpu;
            drop(d);
            if n != records / 256 / world * world * 256 {
                bail!("{mode}: the 16 streams got {n} records");
            }
            served.push(n as f64 / secs);
            read.push(b as f64);
            scratch = scratch.max(peak);
        }
        let (s, r) = (median(&served), median(&reference));
        rows.push(Row {
            case: format!("{world} streams of one job, {mode}"),
            value: s,
            unit: "records/s".into(),
            reference: r,
            reference_is: "one in-process `riffle read` of the epoch".into(),
            ratio: s / r,
            target: ">= 0.9".into(),
            met: s / r >= 0.9,
            records_per_cpu_s: Some(report::per_cpu_second(served_cpu.0, served_cpu.1)),
            notes: format!(
                "runs {} against {}; records per CPU-second {:.0} (the daemon and the \
                 clients' threads) against {:.0}",
                report::runs(&served),
                report::runs(&reference),
                report::per_cpu_second(served_cpu.0, served_cpu.1),
                report::per_cpu_second(ref_cpu.0, ref_cpu.1),
            ),
        });
        let (rd, one) = (median(&read), median(&ref_read));
        rows.push(Row {
            case: format!("{world} streams of one job, {mode}: bytes the daemon read"),
            value: rd,
            unit: "bytes".into(),
            reference: one,
            reference_is: "what one in-process read of the epoch reads".into(),
            ratio: rd / one,
            target: "<= 1.1".into(),
            met: rd / one <= 1.1,
            records_per_cpu_s: None,
            notes: format!(
                "/proc/PID/io read_bytes; {:.2} x the dataset's {}{}",
                rd / bytes as f64,
                riffle::size::human_bytes(bytes as f64),
                if mode == "two-pass" {
                    format!(
                        " (its piles are read once too); largest scratch {}",
                        riffle::size::human_bytes(scratch as f64)
                    )
                } else {
                    String::new()
                }
            ),
        });
    }
    if opts.wants("many-jobs") {
        progress(3, 6, "many-jobs: 64 clients of different jobs, --memory 1G");
        rows.push(many_jobs(&socket, &data_dir, opts.quick)?);
    }
    let mut soak_report = crate::soak::SoakReport::default();
    if opts.wants("soak") {
        progress(
            4,
            6,
            &format!("soak: 64 connections for {:.0} s", opts.soak_seconds),
        );
        let (soak_rows, soak) = soak(&socket, &data_dir, opts.soak_seconds)?;
        rows.extend(soak_rows);
        soak_report = soak;
    }
    if opts.wants("attacks") {
        progress(5, 6, "attacks, each against an honest client");
        rows.extend(attacks(&socket, &data_dir)?);
    }
    if !opts.keep {
        let _ = std::fs::remove_file(&data);
    }
    let _ = std::fs::remove_file(&socket);
    progress(6, 6, "done");
    let rep = NodeReport {
        rows,
        soak: soak_report,
        cold_cache,
        report_dir: dir.display().to_string(),
    };
    report::write_report(&dir, "node", &serde_json::to_value(&rep)?, &markdown(&rep))?;
    Ok(rep)
}

/// The Markdown summary.
pub fn markdown(r: &NodeReport) -> String {
    let mut s = format!(
        "# node: `riffle serve` feeding one training job\n\nCold cache: {}.\n\n",
        r.cold_cache
    );
    s.push_str("| case | measured | reference | ratio | target | met | notes |\n|---|---:|---:|---:|---|---|---|\n");
    for row in &r.rows {
        let show = |v: f64| {
            if row.unit == "bytes" {
                riffle::size::human_bytes(v)
            } else {
                format!("{v:.0} {}", row.unit)
            }
        };
        s.push_str(&format!(
            "| {} | {} | {} ({}) | {:.2} | {} | {} | {} |\n",
            row.case,
            show(row.value),
            show(row.reference),
            row.reference_is,
            row.ratio,
            row.target,
            if row.met { "yes" } else { "**no**" },
            row.notes
        ));
    }
    s
}
