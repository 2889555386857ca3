//! modes: every mode x record size x device, on label-sorted fixed records: epoch time,
//! records/s, IOPS, batch latency, engine memory, and the quality of the shuffle
//!
//! - position correlation: Pearson's r between a record's place in the file and its place
//!   in the epoch (0 for a good shuffle, 1 for file order);
//! - labels per batch: distinct labels in a batch of label-sorted data (10 labels; a
//!   uniform shuffle of 64 records gives about 10, file order 1);
//! - neighbours together: how often records i and i + 1 of the file land in one batch
//!   (batch / records for a uniform shuffle, about 1 for file order).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use riffle::emulate::DeviceClass;
use riffle::modes::{read, read_two_pass, Baseline, ReadOptions, ReadReport};
use riffle::order::Grouping;
use serde::Serialize;

use crate::plot::{self, LineChart};
use crate::report;

/// Options of the suite.
#[derive(Clone, Debug)]
pub struct ModesOptions {
    /// Where results go.
    pub out: PathBuf,
    /// Where the test files are made.
    pub data_dir: PathBuf,
    /// Devices: `None` is the real one.
    pub devices: Vec<Option<DeviceClass>>,
    /// Smaller datasets.
    pub quick: bool,
    /// Keep the files.
    pub keep: bool,
}

/// One run.
#[derive(Clone, Debug, Serialize)]
pub struct ModesRow {
    /// `real` or the emulated class.
    pub device: String,
    /// Record size.
    pub record: u64,
    /// Records in the dataset.
    pub records: u64,
    /// The mode (`lirs-page` is LIRS with 4 KiB page grouping).
    pub mode: String,
    /// Epoch time, seconds.
    pub seconds: f64,
    /// Records per second.
    pub records_per_s: f64,
    /// Records per CPU-second (this process's user + system time over the epoch, the
    /// engine's threads and io_uring's workers included).
    pub records_per_cpu_s: f64,
    /// Reads per second.
    pub iops: f64,
    /// Batch latency p50, microseconds.
    pub p50_us: f64,
    /// Batch latency p99, microseconds.
    pub p99_us: f64,
    /// Engine memory, bytes.
    pub memory_bytes: u64,
    /// Pearson's r of file position against epoch position.
    pub position_correlation: f64,
    /// Mean distinct labels per batch.
    pub labels_per_batch: f64,
    /// Share of file neighbours delivered in one batch.
    pub neighbours_together: f64,
    /// How close to fio on the same file: reads/s over fio's one-pass random-read IOPS at
    /// the mode's read size and QD 64 (lirs, lirs-page), or bytes/s over fio's sequential
    /// read (two-pass, buffer, bmf's block runs, sequential). `None` without fio.
    pub vs_fio: Option<f64>,
}

/// The suite's result.
#[derive(Clone, Debug, Serialize)]
pub struct ModesReport {
    /// Records per batch.
    pub batch: u64,
    /// Rows.
    pub rows: Vec<ModesRow>,
    /// Page cache dropped before each run.
    pub cold_cache: bool,
    /// Why there is no fio column, if there is none.
    pub fio_missing: Option<String>,
    /// Where written.
    pub report_dir: String,
}

const BATCH: u64 = 64;
/// One epoch each, on a cold cache: for `resident` that is its first epoch, the load (its
/// later epochs come from memory: `riffle read --epochs N --mode resident` shows them).
const MODES: [&str; 7] = [
    "lirs",
    "lirs-page",
    "two-pass",
    "resident",
    "buffer",
    "bmf",
    "sequential",
];

fn records_for(class: Option<DeviceClass>, record: u64, quick: bool) -> u64 {
    let n = match class {
        // An epoch of random reads at 600 IOPS: seconds, not minutes.
        Some(DeviceClass::Hdd) => 3000,
        Some(DeviceClass::SataSsd) => ((256u64 << 20) / record).min(200_000),
        _ => ((512u64 << 20) / record).min(400_000),
    };
    if quick {
        (n / 4).max(1000)
    } else {
        n
    }
}

/// Reads one epoch in `mode`; returns the report and the ids in delivery order by batch.
fn one_epoch(
    ds: Arc<riffle::dataset::Dataset>,
    mode: &str,
    scratch: &std::path::Path,
    throttled: bool,
) -> Result<(ReadReport, Vec<Vec<u64>>)> {
    let mut o = ReadOptions::new(BATCH);
    o.seed = 1;
    // Writes (two-pass piles) take a backend the throttle charges.
    o.io.throttled = throttled;
    match mode {
        "lirs-page" => o.grouping = Grouping::Page { unit: 4096 },
        "buffer" => o.baseline = Some(Baseline::Buffer { size: 1000 }),
        "bmf" => o.baseline = Some(Baseline::Bmf { block: 256 }),
        "sequential" => o.baseline = Some(Baseline::Sequential),
        _ => {}
    }
    let mut s = match mode {
        "two-pass" => read_two_pass(ds, o, scratch.to_path_buf())?,
        "resident" => riffle::modes::read_resident(ds, o)?,
        _ => read(ds, o)?,
    };
    let mut batches = Vec::new();
    for b in s.by_ref() {
        batches.push(b?.ids);
    }
    Ok((s.report(), batches))
}

/// (position correlation, labels per batch, neighbours together) of one epoch.
pub fn quality(batches: &[Vec<u64>], n: u64, label: impl Fn(u64) -> u32) -> (f64, f64, f64) {
    let mut batch_of = vec![u32::MAX; n as usize];
    let (mut sx, mut sy, mut sxx, mut syy, mut sxy, mut k) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    let mut pos = 0f64;
    let mut labels = 0usize;
    for (b, ids) in batches.iter().enumerate() {
        let mut seen: Vec<u32> = ids.iter().map(|&i| label(i)).collect();
        seen.sort_unstable();
        seen.dedup();
        labels += seen.len();
        for &id in ids {
            batch_of[id as usize] = b as u32;
            let x = id as f64;
            sx += x;
            sy += pos;
            sxx += x * x;
            syy += pos * pos;
            sxy += x * pos;
            k += 1.0;
            pos += 1.0;
        }
    }
    let cov = sxy / k - (sx / k) * (sy / k);
    let var = |s2: f64, s: f64| (s2 / k - (s / k) * (s / k)).max(0.0).sqrt();
    let r = cov / (var(sxx, sx) * var(syy, sy)).max(1e-12);
    let together = (0..n.saturating_sub(1) as usize)
        .filter(|&i| batch_of[i] != u32::MAX && batch_of[i] == batch_of[i + 1])
        .count() as f64
        / (n.max(2) - 1) as f64;
    (r, labels as f64 / batches.len().max(1) as f64, together)
}

/// Runs the suite.
pub fn run(
    opts: &ModesOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<ModesReport> {
    std::fs::create_dir_all(&opts.data_dir).with_context(|| opts.data_dir.display().to_string())?;
    let sizes = [512u64, 4096, 16384, 256 << 10];
    let total = opts.devices.len() * sizes.len() * MODES.len();
    let mut step = 0;
    let mut rows = Vec::new();
    let mut cold = true;
    let fio_missing = crate::fio::version().err().map(|e| e.to_string());
    let huge = crate::fio::HugePages::reserve(64);
    let mem = if huge.is_some() {
        crate::fio::FioMem::ShmHuge
    } else {
        crate::fio::FioMem::Malloc
    };
    for &class in &opts.devices {
        let (name, throttle) = report::enter_device(class, &opts.data_dir)?;
        for record in sizes {
            let records = records_for(class, record, opts.quick);
            let spec = crate::data::fixed_spec(record, records, true);
            let path = opts
                .data_dir
                .join(format!("riffle-modes-sorted-{record}-{records}.bin"));
            crate::data::make(&path, &spec)?;
            let result = (|| -> Result<()> {
                let ds = Arc::new(crate::data::open_fixed(&path, record)?);
                // fio on the same file, same run: one pass of random reads of a record
                // (and of a page), and a sequential read.
                let size = record * records;
                let mut fio = |rw: &str, bs: u64, qd: usize| -> Result<Option<f64>> {
                    if fio_missing.is_some() {
                        return Ok(None);
                    }
                    cold &= report::drop_caches();
                    let r = crate::fio::run(&path, rw, bs as usize, qd, None, size, mem)?;
                    Ok(Some(if rw == "read" { r.bytes_per_s } else { r.iops }))
                };
                progress(step, total, &format!("{name}: {record} B records, fio"));
                let fio_record = fio("randread", record.max(512), 64)?;
                let fio_page = if record >= 4096 {
                    fio_record
                } else {
                    fio("randread", 4096, 64)?
                };
                // 1 MiB reads, or smaller on a small file (fio needs a block within it).
                let seq_bs = ((size / 4).clamp(4096, 1 << 20) / 4096) * 4096;
                let fio_seq = fio("read", seq_bs, 8)?;
                for mode in MODES {
                    progress(step, total, &format!("{name}: {record} B records, {mode}"));
                    step += 1;
                    cold &= report::drop_caches();
                    use nix::sys::resource::UsageWho::RUSAGE_SELF;
                    let (epoch, cpu) = report::cpu_of(RUSAGE_SELF, || {
                        one_epoch(ds.clone(), mode, &opts.data_dir, throttle.is_some())
                    });
                    let (r, batches) = epoch?;
                    let (corr, labels, together) = quality(&batches, records, |id| spec.label(id));
                    rows.push(ModesRow {
                        device: name.clone(),
                        record,
                        records,
                        mode: mode.into(),
                        seconds: r.seconds,
                        records_per_s: r.records as f64 / r.seconds.max(1e-9),
                        records_per_cpu_s: report::per_cpu_second(r.records as f64, cpu),
                        iops: r.read_ops as f64 / r.seconds.max(1e-9),
                        p50_us: r.batch_latency_us.p50,
                        p99_us: r.batch_latency_us.p99,
                        memory_bytes: r.memory_bytes,
                        position_correlation: corr,
                        labels_per_batch: labels,
                        neighbours_together: together,
                        vs_fio: match mode {
                            "lirs" => fio_record
                                .map(|f| r.read_ops as f64 / r.seconds.max(1e-9) / f.max(1e-9)),
                            "lirs-page" => fio_page
                                .map(|f| r.read_ops as f64 / r.seconds.max(1e-9) / f.max(1e-9)),
                            _ => {
                                fio_seq.map(|f| r.bytes as f64 / r.seconds.max(1e-9) / f.max(1e-9))
                            }
                        },
                    });
                }
                Ok(())
            })();
            if !opts.keep {
                let _ = std::fs::remove_file(&path);
            }
            result?;
        }
    }
    let dir = report::results_dir(&opts.out)?;
    let rep = ModesReport {
        batch: BATCH,
        rows,
        cold_cache: cold,
        fio_missing,
        report_dir: dir.display().to_string(),
    };
    report::write_report(&dir, "modes", &serde_json::to_value(&rep)?, &markdown(&rep))?;
    for d in plot::distinct(&rep.rows, |r| &r.device) {
        let series = plot::series_by(
            &MODES,
            &rep.rows,
            |r| &r.mode,
            |r| {
                (r.device == d)
                    .then(|| ((r.record as f64).log2(), r.records_per_s.max(1.0).log10()))
            },
        );
        plot::line_chart(
            &dir.join(format!("modes-{d}.svg")),
            &LineChart {
                title: format!("records/s by record size on {d} (one cold epoch)"),
                x_label: "log2 record size (9 = 512 B, 18 = 256 KiB)".into(),
                y_label: "log10 records/s".into(),
                series,
            },
        )?;
    }
    Ok(rep)
}

/// The report as Markdown.
pub fn markdown(r: &ModesReport) -> String {
    let mut s = String::new();
    s.push_str("# modes: every mode, record size and device\n\n");
    s.push_str(&format!(
        "One cold epoch (cold cache: {}) of label-sorted fixed records (10 labels), batches of \
         {}. Quality: r = correlation of file position and epoch position (0 = shuffled); \
         labels = distinct labels per batch (about 10 shuffled, 1 in file order); together = \
         share of file neighbours in one batch (about batch / records shuffled). vs fio: reads/s over \
         fio's one-pass random-read IOPS at the mode's read size, QD 64 (lirs: a record; \
         lirs-page: 4 KiB or a record if larger), or bytes/s over fio's sequential read \
         (1 MiB or less on a small file, QD 8) for the others (bmf reads runs of blocks; two-pass also writes its \
         piles). Plots: modes-<device>.svg.{}\n\n",
        r.cold_cache,
        r.batch,
        r.fio_missing
            .as_ref()
            .map(|e| format!(" No fio column: {e}."))
            .unwrap_or_default()
    ));
    s.push_str(
        "| device | record | mode | epoch s | records/s | per CPU-second | IOPS | vs fio | p50 us | p99 us | memory | r | labels | together |\n\
         |---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for x in &r.rows {
        s.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.0} | {:.0} | {:.0} | {} | {:.0} | {:.0} | {} | {:.3} | {:.2} | {:.4} |\n",
            x.device,
            riffle::size::human_bytes(x.record as f64),
            x.mode,
            x.seconds,
            x.records_per_s,
            x.records_per_cpu_s,
            x.iops,
            x.vs_fio
                .map(|v| format!("{v:.2}"))
                .unwrap_or_else(|| "—".into()),
            x.p50_us,
            x.p99_us,
            riffle::size::human_bytes(x.memory_bytes as f64),
            x.position_correlation,
            x.labels_per_batch,
            x.neighbours_together
        ));
    }
    // Which mode wins per device and size (contract modes only: they give the same batches).
    s.push_str(
        "\nFastest mode of the order contract (lirs, lirs-page, two-pass, resident) per device and size:\n\n",
    );
    let mut keys: Vec<(String, u64)> = r
        .rows
        .iter()
        .map(|x| (x.device.clone(), x.record))
        .collect();
    keys.dedup();
    for (d, rec) in keys {
        if let Some(best) = r
            .rows
            .iter()
            .filter(|x| {
                x.device == d
                    && x.record == rec
                    && matches!(
                        x.mode.as_str(),
                        "lirs" | "lirs-page" | "two-pass" | "resident"
                    )
            })
            .min_by(|a, b| a.seconds.total_cmp(&b.seconds))
        {
            s.push_str(&format!(
                "- {d}, {}: {} ({:.2} s)\n",
                riffle::size::human_bytes(rec as f64),
                best.mode,
                best.seconds
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The quality measures tell file order from a shuffle.
    #[test]
    fn quality_tells_file_order_from_a_shuffle() {
        let n = 6400u64;
        let spec = crate::data::fixed_spec(64, n, true);
        let sorted: Vec<Vec<u64>> = (0..n)
            .collect::<Vec<_>>()
            .chunks(64)
            .map(<[u64]>::to_vec)
            .collect();
        let (r, labels, together) = quality(&sorted, n, |i| spec.label(i));
        assert!((r - 1.0).abs() < 1e-9, "{r}");
        assert!(labels < 1.1, "{labels}");
        assert!(together > 0.98, "{together}");
        let key = riffle::order::EpochKey::new(3, 0);
        let mut ids: Vec<u64> = (0..n).collect();
        ids.sort_by_key(|&i| key.key(i));
        let shuffled: Vec<Vec<u64>> = ids.chunks(64).map(<[u64]>::to_vec).collect();
        let (r, labels, together) = quality(&shuffled, n, |i| spec.label(i));
        assert!(r.abs() < 0.05, "{r}");
        assert!(labels > 9.0, "{labels}");
        assert!(together < 0.05, "{together}");
    }
}
