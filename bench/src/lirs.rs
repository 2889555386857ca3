//! lirs: LIRS mode against fio on the same file, cold cache, in one run.
//!
//! - 16 KiB and 4 KiB records, record grouping: records/s against fio's QD 64 IOPS at the
//!   record size (target >= 0.90).
//!
//! fio makes one pass over the file touching each block once in random order, as an epoch
//! does (see [`fio::run`]); with replacement, repeats can be served by caches below the
//! guest and flatter fio.
//! - 512 B records, page grouping (4 KiB units, 8 records per read): records/s against 8 x
//!   fio's 4 KiB QD 64 IOPS (target >= 0.95, issue 34).
//! - 4 KiB records held resident (issue 33): the later epochs, from memory, against fio's 4
//!   KiB IOPS (target >= 10), records per CPU-second over whole runs (the load included).
//! - Building the epoch table of 100 million records (target < 10 s).
//!
//! Every case reports records per CPU-second beside records/s, and the regression check
//! ([`LirsReport::regressions`]) names each case below its target.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use riffle::modes::{read, ReadOptions, ReadReport};
use riffle::order::{EpochKey, EpochTable, Grouping};
use serde::Serialize;

use crate::{fio, report};

/// Options of the suite.
#[derive(Clone, Debug)]
pub struct LirsOptions {
    /// Where results go.
    pub out: PathBuf,
    /// Where the test files are made.
    pub data_dir: PathBuf,
    /// Size of each test file.
    pub file_size: u64,
    /// Runs per side.
    pub repeats: usize,
    /// Records for the table-build timing.
    pub table_records: u64,
    /// Keep the files.
    pub keep: bool,
}

/// One comparison.
#[derive(Clone, Debug, Serialize)]
pub struct LirsRow {
    /// What was measured.
    pub case: String,
    /// Engine records per second (mean over runs).
    pub records_per_s: f64,
    /// Engine runs.
    pub runs: Vec<f64>,
    /// Engine records per CPU-second (this process's user + system time over its runs,
    /// io_uring's workers included).
    pub records_per_cpu_s: f64,
    /// fio IOPS (mean over runs).
    pub fio_iops: f64,
    /// fio runs.
    pub fio_runs: Vec<f64>,
    /// Records per fio read that the target allows (1, or 8 for page grouping of 512 B).
    pub records_per_read: f64,
    /// records/s / (records_per_read x fio IOPS).
    pub ratio: f64,
    /// The least `ratio` that passes the regression check.
    pub target: f64,
    /// The last engine run's report.
    pub report: ReadReport,
}

/// The suite's result.
#[derive(Clone, Debug, Serialize)]
pub struct LirsReport {
    /// The comparisons.
    pub rows: Vec<LirsRow>,
    /// Seconds to build one epoch table of `table_records` records.
    pub table_seconds: f64,
    /// Records in that table.
    pub table_records: u64,
    /// Table bytes.
    pub table_bytes: u64,
    /// fio buffers.
    pub fio_mem: fio::FioMem,
    /// Page cache dropped before each run.
    pub cold_cache: bool,
    /// Where written.
    pub report_dir: String,
    /// The regression check: each case whose ratio is below its target, with both.
    pub regressions: Vec<String>,
}

/// The cases whose ratio is below their target, said with both.
fn regressions(rows: &[LirsRow]) -> Vec<String> {
    (rows.iter())
        .filter(|r| r.ratio.partial_cmp(&r.target).is_none_or(|o| o.is_lt()))
        .map(|r| format!("{}: {:.3} x fio, target {:.2}", r.case, r.ratio, r.target))
        .collect()
}

fn epoch(path: &Path, record: u64, grouping: Grouping) -> Result<ReadReport> {
    let ds = crate::data::open_fixed(path, record)?;
    let mut o = ReadOptions::new(256);
    o.grouping = grouping;
    let mut stream = read(Arc::new(ds), o)?;
    for b in stream.by_ref() {
        b?;
    }
    Ok(stream.report())
}

/// Epochs of the resident row: the first loads the file, the later ones are measured.
const RESIDENT_EPOCHS: u64 = 3;

/// The resident row (issue 33): the 4 KiB records' file held in memory (`--mode resident`,
/// within the machine's default budget), read `RESIDENT_EPOCHS` epochs per run, its later
/// epochs' records/s against fio's 4 KiB IOPS (`fio_row`'s), target 10 x; records per
/// CPU-second over whole runs (the load included).
fn resident_row(path: &Path, fio_row: &LirsRow, repeats: usize) -> Result<LirsRow> {
    use nix::sys::resource::UsageWho::RUSAGE_SELF;
    let (mut runs, mut records, mut cpu, mut last) = (Vec::new(), 0.0, 0.0, None);
    for _ in 0..repeats {
        report::drop_caches();
        let (r, used) = report::cpu_of(RUSAGE_SELF, || -> Result<ReadReport> {
            let ds = Arc::new(crate::data::open_fixed(path, 4096)?);
            let mut o = ReadOptions::new(256);
            o.epochs = RESIDENT_EPOCHS;
            let mut stream = riffle::modes::read_resident(ds, o)?;
            for b in stream.by_ref() {
                b?;
            }
            Ok(stream.report())
        });
        let r = r?;
        cpu += used;
        records += r.records as f64;
        let later = &r.epoch_seconds[1.min(r.epoch_seconds.len())..];
        let secs = later.iter().sum::<f64>();
        runs.push(r.records as f64 / RESIDENT_EPOCHS as f64 * later.len() as f64 / secs);
        last = Some(r);
    }
    let rps = runs.iter().sum::<f64>() / runs.len().max(1) as f64;
    Ok(LirsRow {
        case: format!("4 KiB records, resident (epochs 2-{RESIDENT_EPOCHS}, in memory)"),
        records_per_s: rps,
        runs,
        records_per_cpu_s: report::per_cpu_second(records, cpu),
        fio_iops: fio_row.fio_iops,
        fio_runs: fio_row.fio_runs.clone(),
        records_per_read: 1.0,
        ratio: rps / fio_row.fio_iops,
        target: 10.0,
        report: last.context("no resident run")?,
    })
}

/// Runs the suite.
pub fn run(opts: &LirsOptions, progress: &mut dyn FnMut(usize, usize, &str)) -> Result<LirsReport> {
    fio::version()?;
    std::fs::create_dir_all(&opts.data_dir).with_context(|| opts.data_dir.display().to_string())?;
    let cases = [
        (
            "16 KiB records, record grouping",
            16384u64,
            Grouping::Record,
            16384usize,
            1.0,
            0.90,
        ),
        (
            "4 KiB records, record grouping",
            4096,
            Grouping::Record,
            4096,
            1.0,
            0.90,
        ),
        (
            "512 B records, page grouping (4 KiB)",
            512,
            Grouping::Page { unit: 4096 },
            4096,
            8.0,
            0.95,
        ),
    ];
    let total = cases.len() + cases.len() * opts.repeats * 2 + 2;
    let mut step = 0;
    let mut files = Vec::new();
    for (_, record, ..) in &cases {
        let p = opts
            .data_dir
            .join(format!("riffle-lirs-{record}-{}.bin", opts.file_size));
        progress(step, total, &format!("writing {}", p.display()));
        step += 1;
        crate::data::make_fixed(&p, *record, opts.file_size / *record)?;
        files.push(p);
    }
    let result = (|| -> Result<LirsReport> {
        let huge = fio::HugePages::reserve(64);
        let mem = if huge.is_some() {
            fio::FioMem::ShmHuge
        } else {
            fio::FioMem::Malloc
        };
        let mut cold = true;
        let mut rows = Vec::new();
        for (i, (case, record, grouping, fio_bs, per_read, target)) in cases.iter().enumerate() {
            let (mut runs, mut fio_runs, mut last) = (Vec::new(), Vec::new(), None);
            let (mut records, mut cpu) = (0.0, 0.0);
            for rep in 0..opts.repeats {
                for side in 0..2 {
                    let fio_side = (side == 0) == ((i + rep) % 2 == 0);
                    progress(
                        step,
                        total,
                        &format!("{} {case}", if fio_side { "fio" } else { "lirs" }),
                    );
                    step += 1;
                    cold &= report::drop_caches();
                    if fio_side {
                        let r = fio::run(
                            &files[i],
                            "randread",
                            *fio_bs,
                            64,
                            None,
                            opts.file_size,
                            mem,
                        )?;
                        fio_runs.push(r.iops);
                    } else {
                        use nix::sys::resource::UsageWho::RUSAGE_SELF;
                        let (r, used) =
                            report::cpu_of(RUSAGE_SELF, || epoch(&files[i], *record, *grouping));
                        let r = r?;
                        cpu += used;
                        records += r.records as f64;
                        runs.push(r.records as f64 / r.seconds);
                        last = Some(r);
                    }
                }
            }
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
            let (rps, iops) = (mean(&runs), mean(&fio_runs));
            rows.push(LirsRow {
                case: case.to_string(),
                records_per_s: rps,
                runs,
                records_per_cpu_s: report::per_cpu_second(records, cpu),
                fio_iops: iops,
                fio_runs,
                records_per_read: *per_read,
                ratio: rps / (per_read * iops),
                target: *target,
                report: last.expect("at least one run"),
            });
        }
        // Resident beside the others: the 4 KiB file held in memory.
        progress(step, total, "resident 4 KiB records");
        step += 1;
        rows.push(resident_row(&files[1], &rows[1], opts.repeats)?);
        progress(step, total, "epoch table");
        let t = Instant::now();
        let table = EpochTable::build(opts.table_records, &EpochKey::new(0, 0));
        let table_seconds = t.elapsed().as_secs_f64();
        let dir = report::results_dir(&opts.out)?;
        let rep = LirsReport {
            table_seconds,
            table_records: opts.table_records,
            table_bytes: table.bytes(),
            fio_mem: mem,
            cold_cache: cold,
            report_dir: dir.display().to_string(),
            regressions: regressions(&rows),
            rows,
        };
        report::write_report(&dir, "lirs", &serde_json::to_value(&rep)?, &markdown(&rep))?;
        let cases: Vec<(f64, f64)> = rep
            .rows
            .iter()
            .map(|r| (r.records_per_s, r.records_per_read * r.fio_iops))
            .collect();
        crate::plot::compare(
            &dir.join("lirs.svg"),
            "LIRS epochs against fio's one-pass random reads",
            "records/s",
            "fio (records per read x IOPS)",
            &cases,
        )?;
        Ok(rep)
    })();
    if !opts.keep {
        for f in &files {
            let _ = std::fs::remove_file(f);
        }
    }
    result
}

/// The report as Markdown.
pub fn markdown(r: &LirsReport) -> String {
    let mut s = String::from("# lirs: LIRS mode against fio on the same file\n\n");
    s.push_str(&format!(
        "Cache {}; fio buffers {:?}; batches of 256, QD 64, O_DIRECT.\n\n",
        if r.cold_cache {
            "dropped before each run"
        } else {
            "NOT dropped (not root)"
        },
        r.fio_mem
    ));
    s.push_str("| case | lirs records/s | records per CPU-second | fio IOPS | target | ratio | lirs runs | fio runs | batch p99 us | memory |\n");
    s.push_str("|---|---:|---:|---:|---|---:|---|---|---:|---:|\n");
    for row in &r.rows {
        s.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.0} | >= {:.2} x {} x fio | {:.3} | {} | {} | {:.0} | {} |\n",
            row.case,
            row.records_per_s,
            row.records_per_cpu_s,
            row.fio_iops,
            row.target,
            row.records_per_read,
            row.ratio,
            report::runs(&row.runs),
            report::runs(&row.fio_runs),
            row.report.batch_latency_us.p99,
            riffle::size::human_bytes(row.report.memory_bytes as f64)
        ));
    }
    s.push_str(&format!(
        "\nEpoch table of {} records: built in {:.2} s, {} ({:.1} bytes/record).\n",
        r.table_records,
        r.table_seconds,
        riffle::size::human_bytes(r.table_bytes as f64),
        r.table_bytes as f64 / r.table_records as f64
    ));
    if r.regressions.is_empty() {
        s.push_str("\nRegression check: every case at or above its target.\n");
    } else {
        s.push_str("\nRegression check FAILED (below target):\n\n");
        for x in &r.regressions {
            s.push_str(&format!("- {x}\n"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(case: &str, ratio: f64, target: f64) -> LirsRow {
        LirsRow {
            case: case.into(),
            records_per_s: 0.0,
            runs: Vec::new(),
            records_per_cpu_s: 0.0,
            fio_iops: 0.0,
            fio_runs: Vec::new(),
            records_per_read: 1.0,
            ratio,
            target,
            report: ReadReport::default(),
        }
    }

    #[test]
    fn the_regression_check_names_each_case_below_its_target_and_no_other() {
        let rows = [
            row("page", 0.94, 0.95),
            row("record 16 KiB", 0.95, 0.90),
            row("at target", 0.95, 0.95),
            row("no fio figure", f64::NAN, 0.90),
        ];
        assert_eq!(
            regressions(&rows),
            [
                "page: 0.940 x fio, target 0.95",
                "no fio figure: NaN x fio, target 0.90"
            ]
        );
    }
}
