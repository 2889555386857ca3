//! formats: reading the datasets users already have, without a conversion step (issue 16),
//! each case against its reference in the same run, cold cache, runs alternated.
//!
//! - **files**: N files of 16 KiB in an ImageFolder tree (100,000 in 100 class directories;
//!   10,000 with `--quick`), `riffle read --format files` (lirs), against fio's 16 KiB random
//!   reads at QD 64 over one file of the same total size (one pass, every block once, as an
//!   epoch reads every record once); target >= 0.8. Beside it, what an ImageFolder loader
//!   does before decoding: a Python loop that opens and reads each file in a shuffled order,
//!   under a 1 GiB memory cgroup (root), reported as a ratio. The listing (riffle's walk of
//!   the tree, Python's `os.walk`) is timed apart from the epoch.
//! - **tar**: two WebDataset shards of 10,000 samples each (`bin` of ~100 KiB, `cls`,
//!   `json`; 1,000 each with `--quick`): lirs samples/s against fio's random reads at the
//!   mean sample size (rounded up to 4 KiB) over one shard, QD 64 (target >= 0.85); and
//!   two-pass for three epochs, each later (rolling) epoch against size/sequential read +
//!   size/sequential write from `riffle probe` run right before (target <= 1.25).
//! - **mds**: the same records (100 KiB each) as an MDS dataset and as a `.npy`, lirs,
//!   alternated: samples/s within 10% of the `.npy`'s.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::fio::{self, FioMem};
use crate::report;
use crate::scale::{gen, median, num, probe_seq, run_riffle, Row, Run};

/// Options of the suite: the scale suite's (its cases here: files, tar, mds).
pub type FormatsOptions = crate::scale::ScaleOptions;

/// `riffle read PATH --mode lirs --batch-size BATCH --json EXTRA...` from a cold cache: its
/// records/s and the run.
fn cold_lirs(path: &Path, batch: &str, extra: &[&str], cold: &mut bool) -> Result<(f64, Run)> {
    *cold &= report::drop_caches();
    let p = path.to_str().context("non-UTF-8 path")?;
    let mut args = vec!["read", p, "--mode", "lirs", "--batch-size", batch, "--json"];
    args.extend_from_slice(extra);
    let r = run_riffle(&args, None)?;
    Ok((num(&r.report, "records") / num(&r.report, "seconds"), r))
}

/// The suite's result.
#[derive(Clone, Debug, Serialize)]
pub struct FormatsReport {
    /// The comparisons.
    pub rows: Vec<Row>,
    /// Every riffle run, by case.
    pub runs: Vec<(String, Run)>,
    /// Page cache dropped before each run.
    pub cold_cache: bool,
    /// Where written.
    pub report_dir: String,
}

/// The Python side of the files case: lists the tree as ImageFolder does (sorted class
/// directories, sorted walk; timed apart), shuffles the paths with a seeded generator, then
/// opens and reads each file once; prints one JSON line.
const PY_FILES: &str = r#"
import json, os, random, sys, time
root = sys.argv[1]
t = time.monotonic()
paths = []
for c in sorted(e.name for e in os.scandir(root) if e.is_dir()):
    for d, _, names in sorted(os.walk(os.path.join(root, c), followlinks=True)):
        paths.extend(os.path.join(d, n) for n in sorted(names))
listed = time.monotonic() - t
random.Random(1).shuffle(paths)
t = time.monotonic()
n = 0
for p in paths:
    with open(p, "rb") as f:
        n += len(f.read())
secs = time.monotonic() - t
print(json.dumps({"records": len(paths), "bytes": n, "seconds": secs, "list_seconds": listed}))
"#;

fn python_loop(root: &Path, cold: &mut bool) -> Result<serde_json::Value> {
    *cold &= report::drop_caches();
    // The cgroup holds this process while the child starts (children inherit it).
    let limit = riffle::emulate::MemoryLimit::enter(1 << 30).ok();
    let out = Command::new("python3")
        .args(["-c", PY_FILES])
        .arg(root)
        .output()
        .context("running python3")?;
    let limited = limit.is_some();
    drop(limit);
    if !out.status.success() {
        bail!(
            "the Python loop failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut v: serde_json::Value = serde_json::from_slice(
        out.stdout
            .rsplit(|&b| b == b'\n')
            .find(|l| l.starts_with(b"{"))
            .unwrap_or(b"{}"),
    )?;
    v["memory_cgroup_1g"] = limited.into();
    Ok(v)
}

/// Runs the suite.
pub fn run(
    opts: &FormatsOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<FormatsReport> {
    let dir = report::results_dir(&opts.out)?;
    std::fs::create_dir_all(&opts.data_dir)?;
    let data = std::fs::canonicalize(&opts.data_dir)?;
    let want = |c: &str| opts.cases.is_empty() || opts.cases.iter().any(|x| x == c);
    let mut rows = Vec::new();
    let mut runs: Vec<(String, Run)> = Vec::new();
    let mut cold = report::drop_caches();
    let total = 3;
    let s = |p: &Path| p.to_str().map(str::to_owned).context("non-UTF-8 path");

    if want("files") {
        let n: u64 = if opts.quick { 10_000 } else { 100_000 };
        let tree = data.join(format!("formats-files-{n}"));
        let one = data.join(format!("formats-files-{n}.bin"));
        progress(0, total, &format!("files: making {n} files of 16 KiB"));
        if !tree.exists() {
            gen(&tree, "files", n, "16K", &["--labels", "100"])?;
        }
        if !one.exists() {
            gen(&one, "fixed", n, "16K", &[])?;
        }
        let size = n * 16384;
        let (mut fio_iops, mut rps, mut walls, mut lists) = (vec![], vec![], vec![], vec![]);
        let (mut py_rps, mut py_list) = (vec![], vec![]);
        let (mut records, mut cpu) = (0.0, 0.0);
        let mut py_limited = true;
        let mut version = String::new();
        for k in 0..opts.repeats.max(1) {
            progress(
                0,
                total,
                &format!("files: round {} of {}", k + 1, opts.repeats),
            );
            cold &= report::drop_caches();
            let f = fio::run(&one, "randread", 16384, 64, None, size, FioMem::Malloc)?;
            fio_iops.push(f.iops);
            version = f.version;
            let (v, r) = cold_lirs(&tree, "256", &["--format", "files"], &mut cold)?;
            let secs = num(&r.report, "seconds");
            rps.push(v);
            walls.push(r.seconds);
            lists.push(r.seconds - secs);
            records += num(&r.report, "records");
            cpu += r.cpu_seconds;
            runs.push(("files".into(), r));
            let py = python_loop(&tree, &mut cold)?;
            py_rps.push(num(&py, "records") / num(&py, "seconds"));
            py_list.push(num(&py, "list_seconds"));
            py_limited &= py["memory_cgroup_1g"].as_bool().unwrap_or(false);
        }
        let (m, f, p) = (median(&rps), median(&fio_iops), median(&py_rps));
        rows.push(Row {
            case: format!("files: {n} files of 16 KiB in 100 class directories, lirs"),
            value: m,
            unit: "records/s".into(),
            reference: f,
            reference_is: format!("fio 16 KiB random reads, QD 64, one file of the same size ({version})"),
            ratio: m / f,
            target: ">= 0.8".into(),
            met: m / f >= 0.8,
            records_per_cpu_s: Some(report::per_cpu_second(records, cpu)),
            notes: format!(
                "riffle {} / fio {}; listing the tree {:.2} s (median; the epoch's time leaves it out)",
                report::runs(&rps),
                report::runs(&fio_iops),
                median(&lists)
            ),
        });
        rows.push(Row {
            case: "files: the same, riffle against a Python open-and-read loop in a shuffled order"
                .into(),
            value: m,
            unit: "records/s".into(),
            reference: p,
            reference_is: format!(
                "Python: open() and read() of each file{}",
                if py_limited {
                    ", 1 GiB memory cgroup"
                } else {
                    " (no cgroup: not root)"
                }
            ),
            ratio: m / p,
            target: "(reported)".into(),
            met: true,
            records_per_cpu_s: None,
            notes: format!(
                "Python {}; its os.walk listing {:.2} s",
                report::runs(&py_rps),
                median(&py_list)
            ),
        });
        if !opts.keep {
            let _ = std::fs::remove_dir_all(&tree);
            // The tree's listing sidecar, beside it.
            let _ = std::fs::remove_file(riffle::dataset::index::sidecar_paths(&tree).0);
            let _ = std::fs::remove_file(&one);
        }
    }
    if want("tar") {
        let per: u64 = if opts.quick { 1_000 } else { 10_000 };
        let shards: Vec<PathBuf> = (0..2)
            .map(|k| data.join(format!("formats-tar-{per}/shard-{k:02}.tar")))
            .collect();
        let dir = shards[0].parent().expect("a directory").to_path_buf();
        std::fs::create_dir_all(&dir)?;
        progress(1, total, "tar: writing two shards");
        for (k, p) in shards.iter().enumerate() {
            gen(
                p,
                "tar",
                per,
                "100K",
                &["--size-jitter", "0.2", "--seed", &k.to_string()],
            )?;
        }
        let bytes: u64 = shards
            .iter()
            .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
            .sum();
        let mean = bytes as f64 / (2 * per) as f64;
        let bs = ((mean / 4096.0).ceil() as usize) * 4096;
        let shard_bytes = std::fs::metadata(&shards[0])?.len() / bs as u64 * bs as u64;
        let (mut fio_iops, mut rps) = (vec![], vec![]);
        let (mut records, mut cpu) = (0.0, 0.0);
        for k in 0..opts.repeats.max(1) {
            progress(
                1,
                total,
                &format!("tar: lirs round {} of {}", k + 1, opts.repeats),
            );
            cold &= report::drop_caches();
            let f = fio::run(
                &shards[0],
                "randread",
                bs,
                64,
                None,
                shard_bytes,
                FioMem::Malloc,
            )?;
            fio_iops.push(f.iops);
            let (v, r) = cold_lirs(&dir, "64", &[], &mut cold)?;
            rps.push(v);
            records += num(&r.report, "records");
            cpu += r.cpu_seconds;
            runs.push(("tar lirs".into(), r));
        }
        let (m, f) = (median(&rps), median(&fio_iops));
        rows.push(Row {
            case: format!(
                "tar: 2 shards of {per} samples (bin ~100 KiB, cls, json; mean {:.1} KiB), lirs",
                mean / 1024.0
            ),
            value: m,
            unit: "samples/s".into(),
            reference: f,
            reference_is: format!("fio {} KiB random reads, QD 64, one shard", bs / 1024),
            ratio: m / f,
            target: ">= 0.85".into(),
            met: m / f >= 0.85,
            records_per_cpu_s: Some(report::per_cpu_second(records, cpu)),
            notes: format!(
                "riffle {} / fio {}",
                report::runs(&rps),
                report::runs(&fio_iops)
            ),
        });
        // Two-pass, three epochs: each later one against the I/O bound of a probe run just
        // before it (the disk drifts).
        let mut ratios: Vec<Vec<f64>> = vec![vec![]; 3];
        let mut bounds = vec![];
        for k in 0..opts.repeats.max(1) {
            progress(
                1,
                total,
                &format!("tar: two-pass round {} of {}", k + 1, opts.repeats),
            );
            let (rd, wr) = probe_seq(&data)?;
            let bound = bytes as f64 / rd + bytes as f64 / wr;
            bounds.push(bound);
            cold &= report::drop_caches();
            let r = run_riffle(
                &[
                    "read",
                    &s(&dir)?,
                    "--mode",
                    "two-pass",
                    "--epochs",
                    "3",
                    "--batch-size",
                    "64",
                    "--memory",
                    "512M",
                    "--json",
                ],
                None,
            )?;
            if let Some(eps) = r
                .report
                .get("epoch_seconds")
                .and_then(serde_json::Value::as_array)
            {
                for (e, t) in eps
                    .iter()
                    .filter_map(serde_json::Value::as_f64)
                    .enumerate()
                    .take(3)
                {
                    ratios[e].push(t / bound);
                }
            }
            runs.push(("tar two-pass".into(), r));
        }
        for (e, rs) in ratios.iter().enumerate().skip(1) {
            if rs.is_empty() {
                continue;
            }
            let ratio = median(rs);
            rows.push(Row {
                case: format!(
                    "tar: the same shards, two-pass, --memory 512M: epoch {e} ({})",
                    if e + 1 == ratios.len() {
                        "the last: reads only"
                    } else {
                        "rolling"
                    }
                ),
                value: ratio * median(&bounds),
                unit: "s".into(),
                reference: median(&bounds),
                reference_is: "size/seq read + size/seq write (riffle probe before each run)"
                    .into(),
                ratio,
                target: "<= 1.25".into(),
                met: ratio <= 1.25,
                records_per_cpu_s: None,
                notes: format!(
                    "per run {}",
                    rs.iter()
                        .map(|r| format!("{r:.2}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        if !opts.keep {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    if want("mds") {
        let n: u64 = if opts.quick { 2_000 } else { 20_000 };
        let mds = data.join(format!("formats-mds-{n}"));
        let npy = data.join(format!("formats-mds-{n}.npy"));
        progress(2, total, "mds: writing the records as MDS and as .npy");
        gen(&mds, "mds", n, "100K", &[])?;
        gen(&npy, "npy", n, "100K", &[])?;
        let (mut a, mut b) = (vec![], vec![]);
        let (mut records, mut cpu) = (0.0, 0.0);
        for k in 0..opts.repeats.max(1) {
            progress(
                2,
                total,
                &format!("mds: round {} of {}", k + 1, opts.repeats),
            );
            for (which, p) in [("npy", &npy), ("mds", &mds)] {
                let (v, r) = cold_lirs(p, "64", &[], &mut cold)?;
                if which == "mds" {
                    a.push(v);
                    records += num(&r.report, "records");
                    cpu += r.cpu_seconds;
                } else {
                    b.push(v);
                }
                runs.push((format!("mds {which}"), r));
            }
        }
        let (m, r) = (median(&a), median(&b));
        rows.push(Row {
            case: format!("mds: {n} samples of 100 KiB (one ndarray column), lirs"),
            value: m,
            unit: "samples/s".into(),
            reference: r,
            reference_is: "the same records in one .npy".into(),
            ratio: m / r,
            target: "0.9 to 1.1".into(),
            met: (0.9..=1.1).contains(&(m / r)),
            records_per_cpu_s: Some(report::per_cpu_second(records, cpu)),
            notes: format!("mds {} / npy {}", report::runs(&a), report::runs(&b)),
        });
        if !opts.keep {
            let _ = std::fs::remove_dir_all(&mds);
            let _ = std::fs::remove_file(&npy);
        }
    }
    progress(total, total, "done");
    let rep = FormatsReport {
        rows,
        runs,
        cold_cache: cold,
        report_dir: dir.display().to_string(),
    };
    report::write_report(
        &dir,
        "formats",
        &serde_json::to_value(&rep)?,
        &markdown(&rep),
    )?;
    Ok(rep)
}

/// The Markdown summary.
pub fn markdown(r: &FormatsReport) -> String {
    let mut s = String::from("# formats: the datasets users already have\n\n");
    s.push_str(&format!("Cold cache: {}.\n\n", r.cold_cache));
    let show = |v: f64, unit: &str| {
        let n = if v >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.2}")
        };
        if unit.is_empty() {
            n
        } else {
            format!("{n} {unit}")
        }
    };
    s.push_str(&crate::scale::row_table(&r.rows, &show));
    s
}
