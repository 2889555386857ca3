//! scale: riffle at the scale of users' datasets (issue 14), each case against its
//! reference in the same run, cold cache, with the `riffle` binary run as a user runs it.
//!
//! - **many-files**: N files of one 16 KiB record each (100,000; 10,000 with `--quick`)
//!   against one file of the same records, LIRS, on io_uring and on pread: records/s and
//!   their ratio (target >= 0.85), alternating one file / many files.
//! - **two-pass-large**: a `.npy` of 4 KiB records (20 GiB; 2 GiB quick) read in two-pass
//!   mode for five epochs (three rolling ones, then the last, which only reads) with
//!   `--memory 256M` under `ulimit -n 256`, `--repeats` runs alternated with probes: each
//!   epoch's time against size/sequential read + size/sequential write from `riffle probe`
//!   (the mean of the probes right before and after the run; later epochs: target <= 1.25;
//!   medians over runs), and the most fds the process had open (sampled from /proc, target
//!   <= 128).
//! - **shuffle**: `riffle shuffle` of a JSONL file (4 GB; 1 GB quick) with `--memory 1G`
//!   against 2·size/read + 2·size/write (target <= 1.5).
//! - **tiny-records**: 100 million records of 64 B (10 million quick) with `--memory 1G`,
//!   one epoch each of LIRS (page grouping) and two-pass: the memory the engine reports
//!   (epoch table included) against the budget, and the peak RSS.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::Value;

use crate::report;

/// Options of the suite.
#[derive(Clone, Debug)]
pub struct ScaleOptions {
    /// Where results go.
    pub out: PathBuf,
    /// Where the test data is made.
    pub data_dir: PathBuf,
    /// Smaller datasets, one run per side.
    pub quick: bool,
    /// Keep the data for the next run.
    pub keep: bool,
    /// Runs per side where runs alternate.
    pub repeats: usize,
    /// The cases to run (all when empty): many-files, two-pass-large, shuffle, tiny-records.
    pub cases: Vec<String>,
}

/// A run of the binary: its JSON report, wall time, the most fds it had open and its peak
/// resident memory (both sampled every 20 ms from /proc).
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    /// Wall seconds.
    pub seconds: f64,
    /// Most open fds seen.
    pub max_fds: u64,
    /// Peak RSS in bytes (VmHWM).
    pub peak_rss: u64,
    /// CPU seconds (user + system) the process used, every thread.
    pub cpu_seconds: f64,
    /// What the command printed with --json.
    pub report: Value,
}

/// One comparison.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Case and variant.
    pub case: String,
    /// The figure measured (median over runs).
    pub value: f64,
    /// Its unit.
    pub unit: String,
    /// The reference it is compared with.
    pub reference: f64,
    /// What the reference is.
    pub reference_is: String,
    /// value / reference.
    pub ratio: f64,
    /// The target the ratio is held to, as text (`>= 0.85`).
    pub target: String,
    /// Whether the ratio meets it.
    pub met: bool,
    /// Records per CPU-second of the runs measured (the riffle process's user + system
    /// time), where records are what the case counts.
    pub records_per_cpu_s: Option<f64>,
    /// Notes: fds, memory, runs.
    pub notes: String,
}

/// The suite's result.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleReport {
    /// The comparisons.
    pub rows: Vec<Row>,
    /// Every run, by case.
    pub runs: Vec<(String, Run)>,
    /// Sequential read and write bandwidth from the probe (bytes/s).
    pub seq_read_bps: f64,
    /// Sequential write bandwidth.
    pub seq_write_bps: f64,
    /// Page cache dropped before each run.
    pub cold_cache: bool,
    /// Where written.
    pub report_dir: String,
}

pub(crate) fn riffle_bin() -> Result<PathBuf> {
    std::env::current_exe().context("finding the riffle binary")
}

/// Runs `riffle ARGS` (under `ulimit -n` when given), sampling its fds and memory; fails
/// with its stderr if it fails.
pub(crate) fn run_riffle(args: &[&str], nofile: Option<u64>) -> Result<Run> {
    run_riffle_env(args, nofile, &[])
}

/// [`run_riffle`] with environment variables set for the child only.
fn run_riffle_env(args: &[&str], nofile: Option<u64>, env: &[(&str, &str)]) -> Result<Run> {
    let bin = riffle_bin()?;
    let mut cmd = match nofile {
        Some(n) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                .arg(&bin);
            c
        }
        None => Command::new(&bin),
    };
    cmd.args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    report::drop_caches();
    // The child's CPU: what the children waited for used, before and after it.
    use nix::sys::resource::UsageWho::RUSAGE_CHILDREN;
    let cpu0 = report::cpu_seconds(RUSAGE_CHILDREN);
    let started = Instant::now();
    let mut child = cmd.spawn().context("starting riffle")?;
    let pid = child.id();
    let out = std::thread::spawn({
        let mut so = child.stdout.take().expect("piped");
        move || {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut so, &mut v).map(|_| v)
        }
    });
    let err = std::thread::spawn({
        let mut se = child.stderr.take().expect("piped");
        move || {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut se, &mut v).map(|_| v)
        }
    });
    let (mut max_fds, mut peak_rss) = (0u64, 0u64);
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
            max_fds = max_fds.max(rd.count() as u64);
        }
        if let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            if let Some(kb) = st
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            {
                peak_rss = peak_rss.max(kb << 10);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = report::cpu_seconds(RUSAGE_CHILDREN) - cpu0;
    let stdout = out.join().expect("reader thread")?;
    let stderr = err.join().expect("reader thread")?;
    if !status.success() {
        bail!(
            "riffle {} failed ({status}): {}",
            args.join(" "),
            String::from_utf8_lossy(&stderr)
        );
    }
    let report = serde_json::from_slice(&stdout).unwrap_or(Value::Null);
    Ok(Run {
        seconds,
        max_fds,
        peak_rss,
        cpu_seconds,
        report,
    })
}

/// Sequential read and write bandwidth of the device holding `dir`, from `riffle probe
/// --quick --refresh` (bytes/s).
pub(crate) fn probe_seq(dir: &Path) -> Result<(f64, f64)> {
    let dir = dir.to_str().context("non-UTF-8 path")?;
    let p = run_riffle(&["probe", dir, "--quick", "--refresh", "--json"], None)?;
    Ok((
        num(&p.report, "seq_read_bps"),
        num(&p.report, "seq_write_bps"),
    ))
}

/// `riffle gen PATH --format F --records N --record-size S EXTRA...` unless PATH exists.
pub(crate) fn gen(
    path: &Path,
    format: &str,
    records: u64,
    size: &str,
    extra: &[&str],
) -> Result<()> {
    if path.exists() {
        return Ok(());
    }
    let p = path.to_str().context("non-UTF-8 data dir")?;
    let n = records.to_string();
    let mut args = vec![
        "gen",
        p,
        "--format",
        format,
        "--records",
        &n,
        "--record-size",
        size,
    ];
    args.extend(extra);
    run_riffle(&args, None).map(drop)
}

pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return 0.0;
    }
    if s.len() % 2 == 1 {
        s[s.len() / 2]
    } else {
        (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
    }
}

pub(crate) fn num(v: &Value, key: &str) -> f64 {
    v.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

/// Makes `one` (records of 16 KiB) and `dir` (each record in a file of its own) with the
/// same bytes, unless they are there already.
fn make_many_files(data: &Path, n: u64) -> Result<(PathBuf, PathBuf)> {
    let one = data.join(format!("scale-one-{n}.bin"));
    let dir = data.join(format!("scale-files-{n}"));
    let rec = 16u64 << 10;
    if std::fs::metadata(&one).map(|m| m.len()).ok() != Some(n * rec) {
        let _ = std::fs::remove_file(&one);
        gen(&one, "fixed", n, "16K", &[])?;
    }
    let complete = dir.join(".complete");
    if !complete.exists() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let bytes = std::fs::read(&one)?;
        for (i, r) in bytes.chunks(rec as usize).enumerate() {
            std::fs::write(dir.join(format!("{i:06}.bin")), r)?;
        }
        std::fs::write(&complete, b"")?;
    }
    Ok((one, dir))
}

/// Runs the suite.
pub fn run(
    opts: &ScaleOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<ScaleReport> {
    let dir = report::results_dir(&opts.out)?;
    std::fs::create_dir_all(&opts.data_dir)?;
    let data = std::fs::canonicalize(&opts.data_dir)?;
    let want = |c: &str| opts.cases.is_empty() || opts.cases.iter().any(|x| x == c);
    let mut rows = Vec::new();
    let mut runs: Vec<(String, Run)> = Vec::new();
    let cold_cache = report::drop_caches();
    let total = 5;
    let s = |p: &Path| p.to_str().map(str::to_owned).context("non-UTF-8 path");

    progress(0, total, "probing the device");
    let probe = run_riffle(
        &["probe", &s(&data)?, "--quick", "--refresh", "--json"],
        None,
    )?;
    let (rd, wr) = (
        num(&probe.report, "seq_read_bps"),
        num(&probe.report, "seq_write_bps"),
    );

    if want("many-files") {
        let n = if opts.quick { 10_000 } else { 100_000 };
        progress(1, total, &format!("many-files: making {n} files"));
        let (one, files) = make_many_files(&data, n)?;
        for backend in ["uring", "pread"] {
            let mut one_rps = Vec::new();
            let mut many_rps = Vec::new();
            let mut fds = 0;
            let (mut records, mut cpu) = (0.0, 0.0);
            for _ in 0..opts.repeats {
                for (which, path) in [("one file", &one), ("files", &files)] {
                    let r = run_riffle_env(
                        &[
                            "read",
                            &s(path)?,
                            "--format",
                            "fixed:16K",
                            "--mode",
                            "lirs",
                            "--batch-size",
                            "256",
                            "--json",
                        ],
                        None,
                        &[("RIFFLE_IO", backend)],
                    )?;
                    let rps = num(&r.report, "records") / num(&r.report, "seconds");
                    if which == "one file" {
                        one_rps.push(rps);
                    } else {
                        many_rps.push(rps);
                        fds = fds.max(r.max_fds);
                        records += num(&r.report, "records");
                        cpu += r.cpu_seconds;
                    }
                    runs.push((format!("many-files {backend} {which}"), r));
                }
            }
            let (m, o) = (median(&many_rps), median(&one_rps));
            rows.push(Row {
                case: format!("{n} files of 16 KiB, lirs, {backend}"),
                value: m,
                unit: "records/s".into(),
                reference: o,
                reference_is: "the same records in one file".into(),
                ratio: m / o,
                target: ">= 0.85".into(),
                met: m / o >= 0.85,
                records_per_cpu_s: Some(report::per_cpu_second(records, cpu)),
                notes: format!("at most {fds} fds open"),
            });
        }
        if !opts.keep {
            let _ = std::fs::remove_dir_all(&files);
            let _ = std::fs::remove_file(&one);
        }
    }

    if want("two-pass-large") {
        let size: u64 = if opts.quick { 2 << 30 } else { 20 << 30 };
        let records = size / 4096;
        let path = data.join(format!("scale-large-{records}.npy"));
        progress(2, total, "two-pass-large: writing the dataset");
        gen(&path, "npy", records, "4096", &[])?;
        let bytes = std::fs::metadata(&path)?.len() as f64;
        // The disk drifts: runs alternate with probes (probe, run, probe, run, probe), and
        // each run is held to the mean of the probes right before and right after it.
        let mut probe = |what: &str| {
            progress(2, total, &format!("two-pass-large: {what}"));
            probe_seq(&data)
        };
        let mut before = probe("probing before run 1")?;
        // Per run: its epochs' seconds, its bound, and the run.
        let mut done: Vec<(Vec<f64>, f64, String, Run)> = Vec::new();
        for k in 0..opts.repeats.max(1) {
            let r = run_riffle(
                &[
                    "read",
                    &s(&path)?,
                    "--mode",
                    "two-pass",
                    "--memory",
                    "256M",
                    "--epochs",
                    "5",
                    "--batch-size",
                    "256",
                    "--json",
                ],
                Some(256),
            )?;
            let after = probe(&format!(
                "run {} of {} done; probing after it",
                k + 1,
                opts.repeats.max(1)
            ))?;
            let (rd2, wr2) = ((before.0 + after.0) / 2.0, (before.1 + after.1) / 2.0);
            let probes = format!(
                "{:.2}/{:.2} -> {:.2}/{:.2}",
                before.0 / 1e9,
                before.1 / 1e9,
                after.0 / 1e9,
                after.1 / 1e9
            );
            let epochs: Vec<f64> = r
                .report
                .get("epoch_seconds")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default();
            done.push((epochs, bytes / rd2 + bytes / wr2, probes, r));
            before = after;
        }
        let piles = num(&done[0].3.report, "piles");
        let max_fds = done.iter().map(|d| d.3.max_fds).max().unwrap_or(0);
        let peak_rss = done.iter().map(|d| d.3.peak_rss).max().unwrap_or(0);
        let probes: Vec<&str> = done.iter().map(|d| d.2.as_str()).collect();
        let n_epochs = done.iter().map(|d| d.0.len()).min().unwrap_or(0);
        let bound = median(&done.iter().map(|d| d.1).collect::<Vec<_>>());
        for e in 0..n_epochs {
            let t = median(&done.iter().map(|d| d.0[e]).collect::<Vec<_>>());
            let ratio = median(&done.iter().map(|d| d.0[e] / d.1).collect::<Vec<_>>());
            let per_run: Vec<String> = done
                .iter()
                .map(|d| format!("{:.2}", d.0[e] / d.1))
                .collect();
            rows.push(Row {
                case: format!(
                    "two-pass {}, --memory 256M, ulimit -n 256: epoch {e}{}",
                    riffle::size::human_bytes(bytes),
                    if e == 0 {
                        " (scatter + rolling pass)"
                    } else if e + 1 == n_epochs {
                        " (the last: reads only)"
                    } else {
                        " (rolling)"
                    }
                ),
                value: t,
                unit: "s".into(),
                reference: bound,
                reference_is: "size/seq read + size/seq write".into(),
                ratio,
                target: if e == 0 {
                    "(reported)".into()
                } else {
                    "<= 1.25".into()
                },
                met: e == 0 || ratio <= 1.25,
                // Over whole runs: the scatter and every epoch.
                records_per_cpu_s: Some(report::per_cpu_second(
                    done.iter().map(|d| num(&d.3.report, "records")).sum(),
                    done.iter().map(|d| d.3.cpu_seconds).sum(),
                )),
                notes: format!(
                    "median of {} runs (each against the mean of the probes around it), \
                     per run {}; {piles} piles, at most {max_fds} fds open (target <= 128), peak RSS {}; \
                     sequential read/write GB/s {}",
                    done.len(),
                    per_run.join(", "),
                    riffle::size::human_bytes(peak_rss as f64),
                    probes.join("; "),
                ),
            });
        }
        for d in done {
            runs.push(("two-pass-large".into(), d.3));
        }
        if !opts.keep {
            let _ = std::fs::remove_file(&path);
        }
    }

    if want("shuffle") {
        let records: u64 = if opts.quick { 1_960_000 } else { 7_850_000 };
        let path = data.join(format!("scale-shuffle-{records}.jsonl"));
        let out = data.join("scale-shuffle.out");
        progress(3, total, "shuffle: writing the JSONL");
        gen(&path, "lines", records, "510", &["--size-jitter", "0.96"])?;
        let bytes = std::fs::metadata(&path)?.len() as f64;
        let bound = 2.0 * bytes / rd + 2.0 * bytes / wr;
        let mut t = Vec::new();
        let mut rss = 0;
        let mut cpu = 0.0;
        for _ in 0..opts.repeats {
            let r = run_riffle(
                &[
                    "shuffle",
                    &s(&path)?,
                    "-o",
                    &s(&out)?,
                    "--memory",
                    "1G",
                    "--json",
                ],
                None,
            )?;
            t.push(r.seconds);
            rss = rss.max(r.peak_rss);
            cpu += r.cpu_seconds;
            runs.push(("shuffle".into(), r));
        }
        let m = median(&t);
        rows.push(Row {
            case: format!(
                "shuffle {} JSONL, --memory 1G",
                riffle::size::human_bytes(bytes)
            ),
            value: m,
            unit: "s".into(),
            reference: bound,
            reference_is: "2·size/seq read + 2·size/seq write".into(),
            ratio: m / bound,
            target: "<= 1.5".into(),
            met: m / bound <= 1.5,
            records_per_cpu_s: Some(report::per_cpu_second(
                (records * opts.repeats as u64) as f64,
                cpu,
            )),
            notes: format!("peak RSS {}", riffle::size::human_bytes(rss as f64)),
        });
        let _ = std::fs::remove_file(&out);
        if !opts.keep {
            let _ = std::fs::remove_file(&path);
        }
    }

    if want("tiny-records") {
        let records: u64 = if opts.quick { 10_000_000 } else { 100_000_000 };
        let path = data.join(format!("scale-tiny-{records}.npy"));
        progress(4, total, "tiny-records: writing the dataset");
        gen(&path, "npy", records, "64", &[])?;
        let budget = 1u64 << 30;
        for (mode, extra) in [("lirs", vec!["--grouping", "page"]), ("two-pass", vec![])] {
            let mut args = vec![
                "read",
                path.to_str().context("non-UTF-8 path")?,
                "--mode",
                mode,
                "--memory",
                "1G",
                "--batch-size",
                "1024",
                "--json",
            ];
            args.extend(extra);
            let r = run_riffle(&args, None)?;
            let mem = num(&r.report, "memory_bytes");
            rows.push(Row {
                case: format!("{records} records of 64 B, --memory 1G, {mode}"),
                value: mem,
                unit: "bytes reported".into(),
                reference: budget as f64,
                reference_is: "the budget".into(),
                ratio: mem / budget as f64,
                target: "<= 1".into(),
                met: mem <= budget as f64,
                records_per_cpu_s: Some(report::per_cpu_second(
                    num(&r.report, "records"),
                    r.cpu_seconds,
                )),
                notes: format!(
                    "table {} B, {:.1} s, peak RSS {}",
                    num(&r.report, "table_bytes"),
                    r.seconds,
                    riffle::size::human_bytes(r.peak_rss as f64)
                ),
            });
            runs.push((format!("tiny-records {mode}"), r));
        }
        if !opts.keep {
            let _ = std::fs::remove_file(&path);
        }
    }
    progress(total, total, "done");
    let rep = ScaleReport {
        rows,
        runs,
        seq_read_bps: rd,
        seq_write_bps: wr,
        cold_cache,
        report_dir: dir.display().to_string(),
    };
    report::write_report(&dir, "scale", &serde_json::to_value(&rep)?, &markdown(&rep))?;
    Ok(rep)
}

/// The Markdown summary.
pub fn markdown(r: &ScaleReport) -> String {
    let mut s = String::from("# scale: riffle at users' scale\n\n");
    s.push_str(&format!(
        "Sequential read {}/s, write {}/s (`riffle probe --quick`, this run). Cold cache: {}.\n\n",
        riffle::size::human_bytes(r.seq_read_bps),
        riffle::size::human_bytes(r.seq_write_bps),
        r.cold_cache
    ));
    // Byte figures read better as sizes.
    let show = |v: f64, unit: &str| {
        if unit.contains("bytes") {
            format!("{} ({unit})", riffle::size::human_bytes(v))
        } else {
            format!("{v:.1} {unit}")
        }
    };
    s.push_str(&row_table(&r.rows, &show));
    s
}

/// The rows as a Markdown table (the scale and formats suites'): `show(value, unit)`
/// renders a figure; a reference is shown with "bytes" or no unit.
pub(crate) fn row_table(rows: &[Row], show: &dyn Fn(f64, &str) -> String) -> String {
    let mut s = String::from("| case | measured | reference | ratio | target | met | records per CPU-second | notes |\n|---|---:|---:|---:|---|---|---:|---|\n");
    for row in rows {
        let ref_unit = if row.unit.contains("bytes") {
            "bytes"
        } else {
            ""
        };
        s.push_str(&format!(
            "| {} | {} | {} ({}) | {:.2} | {} | {} | {} | {} |\n",
            row.case,
            show(row.value, &row.unit),
            show(row.reference, ref_unit),
            row.reference_is,
            row.ratio,
            row.target,
            if row.met { "yes" } else { "**no**" },
            row.records_per_cpu_s
                .map(|v| format!("{v:.0}"))
                .unwrap_or_else(|| "—".into()),
            row.notes
        ));
    }
    s
}
