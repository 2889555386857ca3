//! planner: the planner's predictions against measured runs, on the real device and under
//! emulated device classes, for 512 B, 4 KiB, 16 KiB and 256 KiB records.
//!
//! For each device and record size: a fixed-record dataset is made, the plan is built from
//! a quick probe of the device made at the start of the run (under the throttle when
//! emulated), and `lirs` and `two-pass` each read `epochs` epochs from a cold cache. The
//! report says whether `auto`'s choice is the faster mode (or within 10% of it) and how far
//! each prediction is from its measurement (target: within 30%).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use riffle::dataset::Dataset;
use riffle::emulate::DeviceClass;
use riffle::modes::{read, read_two_pass, ReadOptions, ReadReport};
use riffle::plan::{DeviceModel, Plan};
use serde::Serialize;

use crate::plot::{self, LineChart, Series};
use crate::report;

/// Options of the suite.
#[derive(Clone, Debug)]
pub struct PlannerOptions {
    /// Where results go.
    pub out: PathBuf,
    /// Where the test files are made.
    pub data_dir: PathBuf,
    /// Devices: `None` is the real one.
    pub devices: Vec<Option<DeviceClass>>,
    /// Smaller datasets.
    pub quick: bool,
    /// Epochs per run.
    pub epochs: u64,
    /// Keep the files.
    pub keep: bool,
}

/// One mode's run against its prediction.
#[derive(Clone, Debug, Serialize)]
pub struct ModeRun {
    /// `lirs` or `two-pass`.
    pub mode: String,
    /// Predicted seconds for all epochs.
    pub predicted_s: f64,
    /// Measured seconds.
    pub measured_s: f64,
    /// predicted / measured.
    pub ratio: f64,
    /// Predicted first epoch.
    pub predicted_first_s: f64,
    /// Measured epochs (two-pass reports each).
    pub measured_epochs_s: Vec<f64>,
    /// The run's report.
    pub report: ReadReport,
}

/// One device and record size.
#[derive(Clone, Debug, Serialize)]
pub struct PlannerRow {
    /// `real` or the emulated class.
    pub device: String,
    /// Record size.
    pub record: u64,
    /// Records in the dataset.
    pub records: u64,
    /// What auto chose.
    pub choice: String,
    /// The faster mode measured.
    pub fastest: String,
    /// measured(choice) / measured(fastest): 1.0 when auto chose the faster.
    pub choice_over_fastest: f64,
    /// Whether auto's choice is within 10% of the fastest.
    pub choice_ok: bool,
    /// Both runs.
    pub runs: Vec<ModeRun>,
    /// The plan.
    pub plan: Plan,
}

/// The suite's result.
#[derive(Clone, Debug, Serialize)]
pub struct PlannerReport {
    /// Rows.
    pub rows: Vec<PlannerRow>,
    /// Epochs per run.
    pub epochs: u64,
    /// Page cache dropped before each run.
    pub cold_cache: bool,
    /// Where written.
    pub report_dir: String,
}

/// Records per dataset for a device and record size: the random-read runs take seconds, not
/// minutes, under a 600-IOPS disk.
fn records_for(class: Option<DeviceClass>, record: u64, quick: bool) -> u64 {
    let n = match class {
        Some(DeviceClass::Hdd) => match record {
            r if r >= 256 << 10 => 1500,
            r if r >= 16 << 10 => 5000,
            r if r >= 4 << 10 => 20_000,
            _ => 5000,
        },
        Some(DeviceClass::SataSsd) => ((512u64 << 20) / record).min(400_000),
        _ => ((1u64 << 30) / record).min(600_000),
    };
    if quick {
        (n / 4).max(200)
    } else {
        n
    }
}

fn run_mode(
    ds: Arc<Dataset>,
    opts: &ReadOptions,
    mode: &str,
    scratch: &Path,
) -> Result<ReadReport> {
    let mut stream = if mode == "two-pass" {
        read_two_pass(ds, opts.clone(), scratch.to_path_buf())?
    } else {
        read(ds, opts.clone())?
    };
    for b in stream.by_ref() {
        b?;
    }
    Ok(stream.report())
}

/// The device under `dir` measured now with a quick probe (and cached for the CLI): the
/// predictions are checked against the device as it is during this run.
fn device_model(dir: &Path) -> Result<DeviceModel> {
    let p = riffle::probe::probe(
        dir,
        &riffle::probe::ProbeOptions::new(true),
        &mut |_, _, _| {},
    )?;
    riffle::probe::store(&p)?;
    Ok(DeviceModel::from_profile(&p))
}

/// Runs the suite.
pub fn run(
    opts: &PlannerOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<PlannerReport> {
    std::fs::create_dir_all(&opts.data_dir).with_context(|| opts.data_dir.display().to_string())?;
    let sizes = [512u64, 4096, 16384, 256 << 10];
    let total = opts.devices.len() * (1 + sizes.len() * 3);
    let mut step = 0;
    let mut rows = Vec::new();
    let mut cold = true;
    for &class in &opts.devices {
        let (name, throttle) = report::enter_device(class, &opts.data_dir)?;
        progress(step, total, &format!("{name}: device profile"));
        step += 1;
        let dev = device_model(&opts.data_dir)?;
        for &record in &sizes {
            let records = records_for(class, record, opts.quick);
            let path = opts
                .data_dir
                .join(format!("riffle-planner-{name}-{record}-{records}.bin"));
            progress(
                step,
                total,
                &format!("{name}: writing {records} x {record} B"),
            );
            step += 1;
            crate::data::make_fixed(&path, record, records)?;
            let result = (|| -> Result<PlannerRow> {
                let ds = Arc::new(crate::data::open_fixed(&path, record)?);
                let ro = ReadOptions {
                    epochs: opts.epochs,
                    // Writes (two-pass piles) take a backend the throttle charges.
                    io: riffle::io::IoConfig {
                        throttled: throttle.is_some(),
                        ..Default::default()
                    },
                    ..ReadOptions::new(64)
                };
                let free = riffle::probe::free_bytes(&opts.data_dir).ok();
                let plan = riffle::plan::plan(&ds, &ro, &dev, free)?;
                let mut runs = Vec::new();
                for mode in ["lirs", "two-pass"] {
                    progress(step, total, &format!("{name}: {record} B records, {mode}"));
                    step += 1;
                    cold &= report::drop_caches();
                    let r = run_mode(ds.clone(), &ro, mode, &opts.data_dir)?;
                    let c = plan
                        .candidate(mode, "record")
                        .expect("a candidate per mode");
                    runs.push(ModeRun {
                        mode: mode.into(),
                        predicted_s: c.total_s,
                        measured_s: r.seconds,
                        ratio: c.total_s / r.seconds.max(1e-9),
                        predicted_first_s: c.first_epoch_s,
                        measured_epochs_s: r.epoch_seconds.clone(),
                        report: r,
                    });
                }
                let fastest = runs
                    .iter()
                    .min_by(|a, b| a.measured_s.total_cmp(&b.measured_s))
                    .expect("runs");
                let chosen = runs
                    .iter()
                    .find(|r| r.mode == plan.choice.name())
                    .expect("chosen run");
                let over = chosen.measured_s / fastest.measured_s.max(1e-9);
                Ok(PlannerRow {
                    device: name.clone(),
                    record,
                    records,
                    choice: plan.choice.name().into(),
                    fastest: fastest.mode.clone(),
                    choice_over_fastest: over,
                    choice_ok: over <= 1.10,
                    runs,
                    plan,
                })
            })();
            if !opts.keep {
                let _ = std::fs::remove_file(&path);
            }
            rows.push(result?);
        }
    }
    let dir = report::results_dir(&opts.out)?;
    let rep = PlannerReport {
        rows,
        epochs: opts.epochs,
        cold_cache: cold,
        report_dir: dir.display().to_string(),
    };
    plot::line_chart(&dir.join("planner.svg"), &chart(&rep))?;
    report::write_report(
        &dir,
        "planner",
        &serde_json::to_value(&rep)?,
        &markdown(&rep),
    )?;
    Ok(rep)
}

/// `planner.svg`: predicted and measured seconds per mode across the cases (x: the case's
/// number in the table, in order; y: log10 of seconds, as cases span orders of magnitude).
fn chart(r: &PlannerReport) -> LineChart {
    let mut series = Vec::new();
    for mode in ["lirs", "two-pass"] {
        for (what, pick) in [
            (
                "predicted",
                (|m: &ModeRun| m.predicted_s) as fn(&ModeRun) -> f64,
            ),
            ("measured", |m: &ModeRun| m.measured_s),
        ] {
            let points = r
                .rows
                .iter()
                .enumerate()
                .filter_map(|(i, row)| {
                    let m = row.runs.iter().find(|m| m.mode == mode)?;
                    Some(((i + 1) as f64, pick(m).max(1e-6).log10()))
                })
                .collect();
            series.push(Series::new(format!("{mode} {what}"), points));
        }
    }
    LineChart {
        title: "planner: predicted and measured seconds per case".into(),
        x_label: "case (row of the table)".into(),
        y_label: "log10(seconds)".into(),
        series,
    }
}

/// The report as Markdown.
pub fn markdown(r: &PlannerReport) -> String {
    let mut s = String::new();
    s.push_str("# planner: predictions against runs\n\n");
    s.push_str(&format!(
        "Each run reads {} epoch(s) of fixed-size records, batches of 64, cold cache: {}. \
         Targets: auto's choice measured within 10% of the faster mode; every prediction \
         within 30% of its run.\n\n",
        r.epochs, r.cold_cache
    ));
    s.push_str(
        "| case | device | record | records | lirs predicted / measured (s) | two-pass predicted / measured (s) | auto | fastest | auto / fastest | ok |\n\
         |---:|---|---:|---:|---:|---:|---|---|---:|---|\n",
    );
    for (i, row) in r.rows.iter().enumerate() {
        let cell = |m: &str| {
            row.runs
                .iter()
                .find(|x| x.mode == m)
                .map(|x| {
                    format!(
                        "{:.2} / {:.2} ({:.2})",
                        x.predicted_s, x.measured_s, x.ratio
                    )
                })
                .unwrap_or_default()
        };
        let ok_pred = row.runs.iter().all(|x| (0.7..=1.3).contains(&x.ratio));
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {} |\n",
            i + 1,
            row.device,
            riffle::size::human_bytes(row.record as f64),
            row.records,
            cell("lirs"),
            cell("two-pass"),
            row.choice,
            row.fastest,
            row.choice_over_fastest,
            match (row.choice_ok, ok_pred) {
                (true, true) => "yes",
                (true, false) => "choice yes, prediction off",
                (false, true) => "choice no",
                (false, false) => "no",
            }
        ));
    }
    let preds: Vec<f64> = r
        .rows
        .iter()
        .flat_map(|x| x.runs.iter().map(|m| m.ratio))
        .collect();
    let within = preds.iter().filter(|x| (0.7..=1.3).contains(*x)).count();
    let choices = r.rows.iter().filter(|x| x.choice_ok).count();
    s.push_str(&format!(
        "\nauto chose the faster mode (or one within 10%) in {choices} of {} cases; {within} of {} \
         predictions are within 30% (ratio = predicted / measured). planner.svg plots \
         predicted and measured seconds by case.\n",
        r.rows.len(),
        preds.len()
    ));
    s
}
