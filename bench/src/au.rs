//! au: accelerator utilisation, DLIO style. A training step is simulated by sleeping for a
//! fixed compute time per batch (the accelerator works; the CPU is free), while the mode
//! reads ahead. For each device, mode and compute time:
//!
//! T_total = T_pre + (T_load + T_comp - T_overlap) x epochs
//!
//! where T_pre is the time to the first batch (tables, the two-pass scatter), T_load an
//! epoch's load time with no compute, T_comp the compute time per epoch, and T_overlap what
//! the read-ahead hides; AU = T_comp x epochs / T_total.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use riffle::dataset::Dataset;
use riffle::emulate::DeviceClass;
use riffle::modes::{read, read_two_pass, Baseline, BatchStream, ReadOptions};
use serde::Serialize;

use crate::plot::{self, LineChart};
use crate::report;

/// Options of the suite.
#[derive(Clone, Debug)]
pub struct AuOptions {
    /// Where results go.
    pub out: PathBuf,
    /// Where the test files are made.
    pub data_dir: PathBuf,
    /// Devices: `None` is the real one.
    pub devices: Vec<Option<DeviceClass>>,
    /// Smaller datasets, fewer compute times.
    pub quick: bool,
    /// Epochs per run.
    pub epochs: u64,
    /// Keep the files.
    pub keep: bool,
}

/// One (device, mode, compute time) run.
#[derive(Clone, Debug, Serialize)]
pub struct AuRow {
    /// `real` or the emulated class.
    pub device: String,
    /// The mode.
    pub mode: String,
    /// Simulated compute per batch, microseconds.
    pub compute_us: f64,
    /// Time to the first batch, seconds.
    pub t_pre: f64,
    /// Load time per epoch with no compute (the same mode's run at compute 0), seconds.
    pub t_load: f64,
    /// Compute time per epoch (measured sleeps), seconds.
    pub t_comp: f64,
    /// What the read-ahead hid per epoch, seconds.
    pub t_overlap: f64,
    /// The whole run, seconds.
    pub t_total: f64,
    /// Accelerator utilisation: compute over total.
    pub au: f64,
}

/// The suite's result.
#[derive(Clone, Debug, Serialize)]
pub struct AuReport {
    /// Record size.
    pub record: u64,
    /// Records per batch.
    pub batch: u64,
    /// Epochs per run.
    pub epochs: u64,
    /// Rows.
    pub rows: Vec<AuRow>,
    /// Page cache dropped before each run.
    pub cold_cache: bool,
    /// Where written.
    pub report_dir: String,
}

const RECORD: u64 = 4096;
const BATCH: u64 = 64;
const MODES: [&str; 4] = ["lirs", "two-pass", "buffer", "sequential"];

fn stream(ds: Arc<Dataset>, mode: &str, opts: &ReadOptions, scratch: &Path) -> Result<BatchStream> {
    let mut o = opts.clone();
    o.baseline = match mode {
        "buffer" => Some(Baseline::Buffer { size: 2000 }),
        "sequential" => Some(Baseline::Sequential),
        _ => None,
    };
    Ok(if mode == "two-pass" {
        read_two_pass(ds, o, scratch.to_path_buf())?
    } else {
        read(ds, o)?
    })
}

/// Runs one mode with `compute` of sleep per batch: (time to first batch, total, compute).
fn run_one(
    ds: Arc<Dataset>,
    mode: &str,
    opts: &ReadOptions,
    scratch: &Path,
    compute: Duration,
) -> Result<(f64, f64, f64)> {
    let started = Instant::now();
    let mut first = None;
    let mut slept = Duration::ZERO;
    let mut s = stream(ds, mode, opts, scratch)?;
    for b in s.by_ref() {
        b?;
        first.get_or_insert_with(|| started.elapsed());
        if !compute.is_zero() {
            let t = Instant::now();
            std::thread::sleep(compute);
            slept += t.elapsed();
        }
    }
    Ok((
        first.unwrap_or_default().as_secs_f64(),
        started.elapsed().as_secs_f64(),
        slept.as_secs_f64(),
    ))
}

/// Runs the suite.
pub fn run(opts: &AuOptions, progress: &mut dyn FnMut(usize, usize, &str)) -> Result<AuReport> {
    std::fs::create_dir_all(&opts.data_dir).with_context(|| opts.data_dir.display().to_string())?;
    let computes_us: &[f64] = if opts.quick {
        &[0.0, 500.0, 2000.0]
    } else {
        &[0.0, 250.0, 500.0, 1000.0, 2000.0, 4000.0]
    };
    let total = opts.devices.len() * MODES.len() * computes_us.len();
    let mut step = 0;
    let mut rows = Vec::new();
    let mut cold = true;
    for &class in &opts.devices {
        let (name, throttle) = report::enter_device(class, &opts.data_dir)?;
        // Tens of seconds of random reads per epoch at most: an hdd gets a small dataset.
        let records = match (class, opts.quick) {
            (Some(DeviceClass::Hdd), true) => 1500,
            (Some(DeviceClass::Hdd), false) => 3000,
            (_, true) => 16_384,
            (_, false) => 65_536,
        };
        let path = opts
            .data_dir
            .join(format!("riffle-au-{name}-{RECORD}-{records}.bin"));
        crate::data::make_fixed(&path, RECORD, records)?;
        let result = (|| -> Result<()> {
            let ds = Arc::new(crate::data::open_fixed(&path, RECORD)?);
            let ro = ReadOptions {
                epochs: opts.epochs,
                // Writes (two-pass piles) take a backend the throttle charges.
                io: riffle::io::IoConfig {
                    throttled: throttle.is_some(),
                    ..Default::default()
                },
                ..ReadOptions::new(BATCH)
            };
            for mode in MODES {
                let mut t_load = 0.0;
                for &c in computes_us {
                    progress(step, total, &format!("{name}: {mode}, {c} us per batch"));
                    step += 1;
                    cold &= report::drop_caches();
                    let compute = Duration::from_secs_f64(c / 1e6);
                    let (t_pre, t_total, slept) =
                        run_one(ds.clone(), mode, &ro, &opts.data_dir, compute)?;
                    let e = opts.epochs as f64;
                    if c == 0.0 {
                        t_load = (t_total - t_pre) / e;
                    }
                    let t_comp = slept / e;
                    let t_overlap = t_load + t_comp - (t_total - t_pre) / e;
                    rows.push(AuRow {
                        device: name.clone(),
                        mode: mode.into(),
                        compute_us: c,
                        t_pre,
                        t_load,
                        t_comp,
                        t_overlap,
                        t_total,
                        au: if c == 0.0 { 0.0 } else { slept / t_total },
                    });
                }
            }
            Ok(())
        })();
        if !opts.keep {
            let _ = std::fs::remove_file(&path);
        }
        result?;
    }
    let dir = report::results_dir(&opts.out)?;
    let rep = AuReport {
        record: RECORD,
        batch: BATCH,
        epochs: opts.epochs,
        rows,
        cold_cache: cold,
        report_dir: dir.display().to_string(),
    };
    report::write_report(&dir, "au", &serde_json::to_value(&rep)?, &markdown(&rep))?;
    for d in plot::distinct(&rep.rows, |r| &r.device) {
        let series = plot::series_by(
            &MODES,
            &rep.rows,
            |r| &r.mode,
            |r| (r.device == d && r.compute_us > 0.0).then_some((r.compute_us, 100.0 * r.au)),
        );
        plot::line_chart(
            &dir.join(format!("au-{d}.svg")),
            &LineChart {
                title: format!(
                    "accelerator utilisation on {d} ({RECORD} B records, batches of {BATCH})"
                ),
                x_label: "simulated compute per batch (us)".into(),
                y_label: "AU (%)".into(),
                series,
            },
        )?;
    }
    Ok(rep)
}

/// The report as Markdown.
pub fn markdown(r: &AuReport) -> String {
    let mut s = String::new();
    s.push_str("# au: accelerator utilisation (DLIO style)\n\n");
    s.push_str(&format!(
        "{} B records, batches of {}, {} epochs, cold cache: {}. A training step is a sleep of \
         the given compute time per batch while the mode reads ahead. T_total = T_pre + \
         (T_load + T_comp - T_overlap) x epochs; AU = T_comp x epochs / T_total. Plots: \
         au-<device>.svg.\n\n",
        r.record, r.batch, r.epochs, r.cold_cache
    ));
    s.push_str(
        "| device | mode | compute/batch (us) | T_pre (s) | T_load/epoch (s) | T_comp/epoch (s) | \
         T_overlap/epoch (s) | T_total (s) | AU |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for x in &r.rows {
        s.push_str(&format!(
            "| {} | {} | {:.0} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} |\n",
            x.device,
            x.mode,
            x.compute_us,
            x.t_pre,
            x.t_load,
            x.t_comp,
            x.t_overlap,
            x.t_total,
            if x.compute_us == 0.0 {
                "—".to_string()
            } else {
                format!("{:.1}%", 100.0 * x.au)
            }
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny run on the real device: every row present, AU a fraction, each batch's compute
    /// really spent (a sleep lasts at least its time), the reports and chart written and the
    /// data removed.
    #[test]
    fn tiny_run_reports_every_mode() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let opts = AuOptions {
            out: dir.path().join("results"),
            data_dir: dir.path().join("data"),
            devices: vec![None],
            quick: true,
            epochs: 1,
            keep: false,
        };
        let rep = run(&opts, &mut |_, _, _| {}).unwrap();
        assert_eq!(rep.rows.len(), MODES.len() * 3);
        for m in MODES {
            let rows: Vec<&AuRow> = rep.rows.iter().filter(|r| r.mode == m).collect();
            assert!(rows.iter().all(|r| (0.0..=1.0).contains(&r.au)), "{rows:?}");
            let batches = (16_384f64 / BATCH as f64).ceil();
            for r in &rows {
                assert!(
                    r.t_comp >= batches * r.compute_us / 1e6,
                    "{m}: less compute than asked for: {r:?}"
                );
                assert!(r.t_total >= r.t_comp && r.t_pre <= r.t_total, "{r:?}");
            }
        }
        let d = std::path::Path::new(&rep.report_dir);
        assert!(std::fs::read_to_string(d.join("au.md"))
            .unwrap()
            .contains("| real | lirs |"));
        assert!(std::fs::read_to_string(d.join("au-real.svg"))
            .unwrap()
            .contains("two-pass"));
        assert_eq!(
            std::fs::read_dir(&opts.data_dir).unwrap().count(),
            0,
            "data left"
        );
    }
}
