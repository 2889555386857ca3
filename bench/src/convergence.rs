//! convergence: logistic regression trained by SGD on label-sorted data, fed by each mode;
//! epochs to a target loss and final test accuracy (the LIRS paper's Tables 3 and 6 in
//! small), with the loss curves as SVG.
//!
//! The task: a fixed-record dataset made by `riffle gen` with two labels, sorted by label
//! (the first half is label 0). Each record's features are derived from the id and label
//! that the record's payload carries: `FEATURES` Gaussian-like values hashed from the id,
//! shifted by `+-SHIFT` on every axis by the label, each axis then scaled by its own factor.
//! The model must learn that shift from the bytes it is fed; the Bayes-optimal model is
//! known (weights `2 x SHIFT / scale`, no bias),
//! and the target loss is its loss plus `TARGET_MARGIN`. The test set is made of other ids
//! (after the training set's), with alternating labels.
//!
//! Training is plain mini-batch SGD at a fixed learning rate, one step per delivered batch.
//! The training loss of an epoch is that of the model at the end of the epoch over the
//! whole training set: on sorted data the running loss of the batches seen (also reported)
//! flatters an order that feeds one label for long, since the model only has to predict
//! that label. Two-pass delivers the same batches as LIRS with record grouping, so its
//! curve must be bit for bit the same: the suite fails otherwise.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use riffle::dataset::Dataset;
use riffle::gen::{generate, GenFormat, GenSpec};
use riffle::io::IoConfig;
use riffle::modes::{read, read_two_pass, Baseline, ReadOptions};
use riffle::order::Grouping;
use serde::Serialize;

use crate::plot::{self, LineChart, Series};
use crate::report;

/// Features per record.
pub const FEATURES: usize = 16;
/// Per-axis class mean shift: the classes are N(-SHIFT, 1) and N(+SHIFT, 1) per axis, so
/// the Bayes accuracy is Phi(SHIFT x sqrt(FEATURES)) = Phi(1.2), about 88.5%.
pub const SHIFT: f64 = 0.3;
/// Axis `j` is scaled by `SCALE_RANGE^(-j / (FEATURES - 1))`: from 1 down to
/// 1 / SCALE_RANGE. The scales make the problem ill-conditioned, as real features are, so
/// plain SGD needs several epochs to learn the small axes and the orders differ in how many.
pub const SCALE_RANGE: f64 = 10.0;
/// The target loss is the Bayes-optimal model's training loss plus this.
pub const TARGET_MARGIN: f64 = 0.01;

/// Options of the suite.
#[derive(Clone, Debug)]
pub struct ConvergenceOptions {
    /// Where results go.
    pub out: PathBuf,
    /// Where the dataset and two-pass piles are made.
    pub data_dir: PathBuf,
    /// Training records.
    pub records: u64,
    /// Record size in bytes.
    pub record_size: u64,
    /// Test records.
    pub test_records: u64,
    /// Epochs per mode.
    pub epochs: u64,
    /// Records per batch (= SGD mini-batch).
    pub batch: u64,
    /// SGD learning rate.
    pub learning_rate: f64,
    /// Keep the dataset for the next run.
    pub keep: bool,
}

impl ConvergenceOptions {
    /// 200,000 records of 512 B, 5 epochs (`quick`: 50,000 records, 3 epochs).
    pub fn new(quick: bool, out: PathBuf, data_dir: PathBuf) -> Self {
        let records = if quick { 50_000 } else { 200_000 };
        ConvergenceOptions {
            out,
            data_dir,
            records,
            record_size: 512,
            test_records: 20_000,
            epochs: if quick { 3 } else { 5 },
            batch: 64,
            learning_rate: 0.05,
            keep: false,
        }
    }
}

/// One mode's training run.
#[derive(Clone, Debug, Serialize)]
pub struct ModeCurve {
    /// The mode as the table names it.
    pub mode: String,
    /// How it orders records.
    pub order: String,
    /// Training loss (whole training set) after epochs 0 (the initial model), 1, ...
    pub train_loss: Vec<f64>,
    /// Test accuracy after epochs 0, 1, ...
    pub test_accuracy: Vec<f64>,
    /// Test loss after epochs 0, 1, ...
    pub test_loss: Vec<f64>,
    /// Mean loss of the batches as they were trained on, per epoch (1, 2, ...).
    pub running_loss: Vec<f64>,
    /// The first epoch whose training loss is at or below the target.
    pub epochs_to_target: Option<u64>,
    /// Mean distinct labels per full batch (1 = every batch is of one label).
    pub labels_per_batch: f64,
    /// Seconds reading and training.
    pub seconds: f64,
}

impl ModeCurve {
    /// Training loss after the last epoch.
    pub fn final_loss(&self) -> f64 {
        *self.train_loss.last().expect("epoch 0 at least")
    }

    /// Test accuracy after the last epoch.
    pub fn final_accuracy(&self) -> f64 {
        *self.test_accuracy.last().expect("epoch 0 at least")
    }
}

/// The suite's result.
#[derive(Clone, Debug, Serialize)]
pub struct ConvergenceReport {
    /// Training records.
    pub records: u64,
    /// Record size.
    pub record_size: u64,
    /// Test records.
    pub test_records: u64,
    /// Features per record.
    pub features: usize,
    /// Per-axis class shift.
    pub shift: f64,
    /// Epochs per mode.
    pub epochs: u64,
    /// Batch size.
    pub batch: u64,
    /// Learning rate.
    pub learning_rate: f64,
    /// The Bayes-optimal model's training loss.
    pub bayes_loss: f64,
    /// The Bayes-optimal model's test accuracy.
    pub bayes_accuracy: f64,
    /// The loss to reach.
    pub target_loss: f64,
    /// One curve per mode.
    pub modes: Vec<ModeCurve>,
    /// Two-pass gave exactly the curve of LIRS with record grouping (checked: the run
    /// fails otherwise).
    pub two_pass_equals_lirs: bool,
    /// Where written.
    pub report_dir: String,
}

impl ConvergenceReport {
    /// The curve of `mode`.
    pub fn mode(&self, mode: &str) -> Option<&ModeCurve> {
        self.modes.iter().find(|m| m.mode == mode)
    }
}

/// splitmix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The scale of axis `j`.
pub fn scale(j: usize) -> f64 {
    SCALE_RANGE.powf(-(j as f64) / (FEATURES - 1) as f64)
}

/// The features of record `id` with `label`: per axis, the sum of four uniform 16-bit
/// pieces of one hash (mean 0, variance 1 after scaling: close to a Gaussian), shifted by
/// the label, times the axis's scale.
pub fn features(id: u64, label: u32) -> [f64; FEATURES] {
    let sign = if label == 0 { -1.0 } else { 1.0 };
    let mut x = [0.0; FEATURES];
    for (j, v) in x.iter_mut().enumerate() {
        let h = mix(id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ((j as u64 + 1) << 56));
        let sum: f64 = (0..4)
            .map(|k| ((h >> (16 * k)) & 0xffff) as f64 / 65536.0)
            .sum();
        // Four U(0,1): mean 2, variance 1/3.
        *v = ((sum - 2.0) * 3f64.sqrt() + sign * SHIFT) * scale(j);
    }
    x
}

/// The id and label a generated binary record starts with.
fn id_label(record: &[u8]) -> Result<(u64, u32)> {
    ensure!(record.len() >= 12, "record of {} bytes", record.len());
    let id = u64::from_le_bytes(record[..8].try_into().expect("8 bytes"));
    let label = u32::from_le_bytes(record[8..12].try_into().expect("4 bytes"));
    Ok((id, label))
}

/// Logistic regression: weights and bias.
#[derive(Clone, Debug, Default)]
struct Model {
    w: [f64; FEATURES],
    b: f64,
}

impl Model {
    fn logit(&self, x: &[f64; FEATURES]) -> f64 {
        self.b + self.w.iter().zip(x).map(|(w, x)| w * x).sum::<f64>()
    }

    /// The logistic loss of one example (numerically stable).
    fn loss(&self, x: &[f64; FEATURES], y: f64) -> f64 {
        let z = self.logit(x);
        // log(1 + exp(z)) - y z
        z.max(0.0) + (-z.abs()).exp().ln_1p() - y * z
    }

    /// (mean loss, accuracy) over a set.
    fn evaluate(&self, set: &[([f64; FEATURES], f64)]) -> (f64, f64) {
        let (mut loss, mut right) = (0.0, 0usize);
        for (x, y) in set {
            loss += self.loss(x, *y);
            right += usize::from((self.logit(x) > 0.0) == (*y > 0.5));
        }
        (loss / set.len() as f64, right as f64 / set.len() as f64)
    }

    /// One SGD step on a batch; returns the batch's mean loss before the step.
    fn step(&mut self, batch: &[([f64; FEATURES], f64)], lr: f64) -> f64 {
        let mut gw = [0.0; FEATURES];
        let (mut gb, mut loss) = (0.0, 0.0);
        for (x, y) in batch {
            let z = self.logit(x);
            let p = 1.0 / (1.0 + (-z).exp());
            loss += self.loss(x, *y);
            for (g, x) in gw.iter_mut().zip(x) {
                *g += (p - y) * x;
            }
            gb += p - y;
        }
        let scale = lr / batch.len() as f64;
        for (w, g) in self.w.iter_mut().zip(gw) {
            *w -= scale * g;
        }
        self.b -= scale * gb;
        loss / batch.len() as f64
    }
}

/// The modes compared: (name, order, how to read).
#[derive(Clone, Copy, Debug)]
enum Feed {
    Lirs(Grouping),
    TwoPass,
    Baseline(Baseline),
}

fn open(path: &Path, record: u64) -> Result<Arc<Dataset>> {
    Ok(Arc::new(crate::data::open_fixed(path, record)?))
}

struct Sets<'a> {
    spec: &'a GenSpec,
    train: &'a [([f64; FEATURES], f64)],
    test: &'a [([f64; FEATURES], f64)],
    target: f64,
}

/// Trains a fresh model on the batches `feed` delivers.
fn train(
    ds: &Arc<Dataset>,
    feed: Feed,
    opts: &ConvergenceOptions,
    sets: &Sets,
    scratch: &Path,
    (mode, order): (&str, String),
) -> Result<ModeCurve> {
    let started = Instant::now();
    let mut ro = ReadOptions {
        epochs: opts.epochs,
        ..ReadOptions::new(opts.batch)
    };
    let mut stream = match feed {
        Feed::Lirs(g) => {
            ro.grouping = g;
            read(ds.clone(), ro)?
        }
        Feed::TwoPass => read_two_pass(ds.clone(), ro, scratch.to_path_buf())?,
        Feed::Baseline(b) => {
            ro.baseline = Some(b);
            read(ds.clone(), ro)?
        }
    };
    let mut model = Model::default();
    let (loss0, acc0) = model.evaluate(sets.test);
    let mut curve = ModeCurve {
        mode: mode.into(),
        order,
        train_loss: vec![model.evaluate(sets.train).0],
        test_accuracy: vec![acc0],
        test_loss: vec![loss0],
        running_loss: Vec::new(),
        epochs_to_target: None,
        labels_per_batch: 0.0,
        seconds: 0.0,
    };
    let (mut epoch, mut running, mut steps) = (0u64, 0.0, 0u64);
    let (mut full_batches, mut labels_sum) = (0u64, 0u64);
    let mut examples = Vec::with_capacity(opts.batch as usize);
    let end_epoch = |model: &Model, curve: &mut ModeCurve, running: f64, steps: u64| {
        curve.running_loss.push(running / steps.max(1) as f64);
        curve.train_loss.push(model.evaluate(sets.train).0);
        let (loss, acc) = model.evaluate(sets.test);
        curve.test_loss.push(loss);
        curve.test_accuracy.push(acc);
    };
    for b in stream.by_ref() {
        let b = b?;
        if b.epoch != epoch {
            end_epoch(&model, &mut curve, running, steps);
            (epoch, running, steps) = (b.epoch, 0.0, 0);
        }
        examples.clear();
        let mut seen = [false; 2];
        for i in 0..b.ids.len() {
            let (id, label) = id_label(b.record(i))?;
            if id != b.ids[i] || label != sets.spec.label(id) || label > 1 {
                bail!(
                    "{mode}: record {} of batch {}:{} carries id {id} label {label}, \
                     expected id {}",
                    i,
                    b.epoch,
                    b.index,
                    b.ids[i]
                );
            }
            seen[label as usize] = true;
            examples.push((features(id, label), f64::from(label)));
        }
        if b.ids.len() as u64 == opts.batch {
            full_batches += 1;
            labels_sum += seen.iter().filter(|s| **s).count() as u64;
        }
        running += model.step(&examples, opts.learning_rate);
        steps += 1;
    }
    end_epoch(&model, &mut curve, running, steps);
    ensure!(
        curve.running_loss.len() as u64 == opts.epochs,
        "{mode}: {} epochs delivered, expected {}",
        curve.running_loss.len(),
        opts.epochs
    );
    curve.epochs_to_target = curve
        .train_loss
        .iter()
        .position(|l| *l <= sets.target)
        .map(|e| e as u64);
    curve.labels_per_batch = labels_sum as f64 / full_batches.max(1) as f64;
    curve.seconds = started.elapsed().as_secs_f64();
    Ok(curve)
}

/// Runs the suite.
pub fn run(
    opts: &ConvergenceOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<ConvergenceReport> {
    ensure!(
        opts.records >= 2 * opts.batch,
        "too few records for two labels"
    );
    std::fs::create_dir_all(&opts.data_dir).with_context(|| opts.data_dir.display().to_string())?;
    let spec = GenSpec {
        format: GenFormat::Fixed,
        records: opts.records,
        record_size: opts.record_size,
        jitter: 0.0,
        labels: 2,
        sorted: true,
        seed: 0,
    };
    let unit = 4096u64;
    let block = (opts.records / 100).max(1);
    let buffer = (opts.records / 100).max(1);
    let feeds: Vec<(&str, String, Feed)> = vec![
        (
            "lirs (record)",
            "full shuffle of records".into(),
            Feed::Lirs(Grouping::Record),
        ),
        (
            "two-pass",
            "full shuffle of records (same order as lirs)".into(),
            Feed::TwoPass,
        ),
        (
            "lirs (page)",
            format!(
                "shuffle of 4 KiB pages ({} records each)",
                unit / opts.record_size.max(1)
            ),
            Feed::Lirs(Grouping::Page { unit }),
        ),
        (
            "bmf",
            format!("shuffle of blocks of {block} records"),
            Feed::Baseline(Baseline::Bmf { block }),
        ),
        (
            "buffer",
            format!("shuffle buffer of {buffer} records (1%)"),
            Feed::Baseline(Baseline::Buffer { size: buffer }),
        ),
        (
            "sequential",
            "file order (label-sorted)".into(),
            Feed::Baseline(Baseline::Sequential),
        ),
    ];
    let total = feeds.len() + 2;
    let path = opts.data_dir.join(format!(
        "riffle-conv-{}x{}.bin",
        opts.records, opts.record_size
    ));
    let scratch = opts.data_dir.join("riffle-conv-scratch");
    progress(0, total, &format!("writing {}", path.display()));
    if std::fs::metadata(&path).map(|m| m.len()).ok() != Some(opts.records * opts.record_size) {
        generate(&path, &spec, &IoConfig::sequential_write(), &mut |_, _| {})?;
    }
    let result = (|| -> Result<ConvergenceReport> {
        let ds = open(&path, opts.record_size)?;
        let train_set: Vec<_> = (0..opts.records)
            .map(|id| {
                let l = spec.label(id);
                (features(id, l), f64::from(l))
            })
            .collect();
        let test_set: Vec<_> = (0..opts.test_records)
            .map(|i| {
                let l = (i % 2) as u32;
                (features(opts.records + i, l), f64::from(l))
            })
            .collect();
        let bayes = Model {
            w: std::array::from_fn(|j| 2.0 * SHIFT / scale(j)),
            b: 0.0,
        };
        let bayes_loss = bayes.evaluate(&train_set).0;
        let bayes_accuracy = bayes.evaluate(&test_set).1;
        let sets = Sets {
            spec: &spec,
            train: &train_set,
            test: &test_set,
            target: bayes_loss + TARGET_MARGIN,
        };
        let mut modes = Vec::new();
        for (i, (mode, order, feed)) in feeds.into_iter().enumerate() {
            progress(i + 1, total, mode);
            modes.push(train(&ds, feed, opts, &sets, &scratch, (mode, order))?);
        }
        let (lirs, two) = (&modes[0], &modes[1]);
        let same = lirs.train_loss == two.train_loss
            && lirs.test_accuracy == two.test_accuracy
            && lirs.running_loss == two.running_loss;
        ensure!(
            same,
            "two-pass and lirs (record) gave different curves: {:?} against {:?}",
            two.train_loss,
            lirs.train_loss
        );
        progress(total - 1, total, "report");
        let dir = report::results_dir(&opts.out)?;
        let rep = ConvergenceReport {
            records: opts.records,
            record_size: opts.record_size,
            test_records: opts.test_records,
            features: FEATURES,
            shift: SHIFT,
            epochs: opts.epochs,
            batch: opts.batch,
            learning_rate: opts.learning_rate,
            bayes_loss,
            bayes_accuracy,
            target_loss: sets.target,
            modes,
            two_pass_equals_lirs: same,
            report_dir: dir.display().to_string(),
        };
        plots(&dir, &rep)?;
        report::write_report(
            &dir,
            "convergence",
            &serde_json::to_value(&rep)?,
            &markdown(&rep),
        )?;
        Ok(rep)
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    if !opts.keep {
        let _ = std::fs::remove_file(&path);
    }
    result
}

/// `convergence-loss.svg`, `convergence-excess.svg` and `convergence-accuracy.svg`: one
/// series per mode. Two-pass is
/// left out: its curve is lirs (record)'s.
fn plots(dir: &Path, r: &ConvergenceReport) -> Result<()> {
    let series = |pick: fn(&ModeCurve) -> &Vec<f64>| {
        r.modes
            .iter()
            .filter(|m| m.mode != "two-pass")
            .map(|m| {
                let pts = pick(m)
                    .iter()
                    .enumerate()
                    .map(|(e, v)| (e as f64, *v))
                    .collect();
                Series::new(m.mode.as_str(), pts)
            })
            .collect::<Vec<_>>()
    };
    let mut loss = series(|m| &m.train_loss);
    loss.push(Series::new(
        "target",
        vec![(0.0, r.target_loss), (r.epochs as f64, r.target_loss)],
    ));
    plot::line_chart(
        &dir.join("convergence-loss.svg"),
        &LineChart {
            title: "Logistic regression on label-sorted data: training loss".into(),
            x_label: "epoch".into(),
            y_label: "training loss".into(),
            series: loss,
        },
    )?;
    // Near the target the shuffled orders' curves overlap on a linear axis; their distance
    // from the Bayes-optimal loss, on a log axis, tells them apart.
    let excess = r
        .modes
        .iter()
        .filter(|m| m.mode != "two-pass")
        .map(|m| {
            let pts = m
                .train_loss
                .iter()
                .enumerate()
                .map(|(e, l)| (e as f64, (l - r.bayes_loss).max(1e-5).log10()))
                .collect();
            Series::new(m.mode.as_str(), pts)
        })
        .chain(std::iter::once(Series::new(
            "target",
            vec![
                (0.0, TARGET_MARGIN.log10()),
                (r.epochs as f64, TARGET_MARGIN.log10()),
            ],
        )))
        .collect();
    plot::line_chart(
        &dir.join("convergence-excess.svg"),
        &LineChart {
            title: "Training loss above the Bayes-optimal model's".into(),
            x_label: "epoch".into(),
            y_label: "log10(loss - Bayes loss)".into(),
            series: excess,
        },
    )?;
    plot::line_chart(
        &dir.join("convergence-accuracy.svg"),
        &LineChart {
            title: "Logistic regression on label-sorted data: test accuracy".into(),
            x_label: "epoch".into(),
            y_label: "test accuracy".into(),
            series: series(|m| &m.test_accuracy),
        },
    )
}

/// The report as Markdown.
pub fn markdown(r: &ConvergenceReport) -> String {
    let mut s = String::from("# convergence: SGD on label-sorted data under each mode\n\n");
    s.push_str(&format!(
        "Logistic regression, {} features, plain SGD (learning rate {}, mini-batch = the \
         mode's batch of {}), {} epochs over {} label-sorted records of {} B (two labels, \
         the first half 0); test set of {} other records. Target: training loss <= {:.4} \
         (the Bayes-optimal model's {:.4} + {}); its test accuracy is {:.2}%.\n\n",
        r.features,
        r.learning_rate,
        r.batch,
        r.epochs,
        r.records,
        r.record_size,
        r.test_records,
        r.target_loss,
        r.bayes_loss,
        TARGET_MARGIN,
        100.0 * r.bayes_accuracy
    ));
    s.push_str(
        "| mode | order | epochs to target | final training loss | final test accuracy | \
         labels per batch | seconds |\n|---|---|---:|---:|---:|---:|---:|\n",
    );
    for m in &r.modes {
        s.push_str(&format!(
            "| {} | {} | {} | {:.4} | {:.2}% | {:.2} | {:.1} |\n",
            m.mode,
            m.order,
            m.epochs_to_target
                .map_or(format!("not in {}", r.epochs), |e| e.to_string()),
            m.final_loss(),
            100.0 * m.final_accuracy(),
            m.labels_per_batch,
            m.seconds
        ));
    }
    s.push_str(&format!(
        "\nTwo-pass gave exactly the curve of lirs (record), bit for bit: {}.\n\n",
        if r.two_pass_equals_lirs { "yes" } else { "NO" }
    ));
    s.push_str("Training loss after each epoch (epoch 0 is the initial model):\n\n");
    s.push_str("| mode |");
    for e in 0..=r.epochs {
        s.push_str(&format!(" {e} |"));
    }
    s.push_str("\n|---|");
    s.push_str(&"---:|".repeat(r.epochs as usize + 1));
    s.push('\n');
    for m in &r.modes {
        s.push_str(&format!("| {} |", m.mode));
        for l in &m.train_loss {
            s.push_str(&format!(" {l:.4} |"));
        }
        s.push('\n');
    }
    s.push_str(
        "\nPlots: convergence-loss.svg (training loss per epoch), convergence-excess.svg (its \
         distance from the Bayes-optimal loss, log scale), convergence-accuracy.svg (test \
         accuracy per epoch).\n",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_separate_the_labels() {
        let n = 20_000u64;
        let mean = |label| {
            (0..n)
                .map(|id| {
                    let x = features(id, label);
                    (0..FEATURES).map(|j| x[j] / scale(j)).sum::<f64>() / FEATURES as f64
                })
                .sum::<f64>()
                / n as f64
        };
        let (m0, m1) = (mean(0), mean(1));
        assert!((m0 + SHIFT).abs() < 0.02, "{m0}");
        assert!((m1 - SHIFT).abs() < 0.02, "{m1}");
        let var = (0..n)
            .map(|id| features(id, 0)[3] / scale(3) + SHIFT)
            .map(|x| x * x)
            .sum::<f64>()
            / n as f64;
        assert!((var - 1.0).abs() < 0.05, "{var}");
    }

    /// A tiny run of the whole suite: the report's shape, two-pass equal to lirs, and the
    /// full shuffle ending at a lower loss than file order on sorted data.
    #[test]
    fn tiny_suite() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let mut opts = ConvergenceOptions::new(true, dir.path().join("out"), dir.path().into());
        opts.records = 4096;
        opts.test_records = 2000;
        opts.epochs = 2;
        let r = run(&opts, &mut |_, _, _| {}).unwrap();
        let names: Vec<_> = r.modes.iter().map(|m| m.mode.as_str()).collect();
        assert_eq!(
            names,
            [
                "lirs (record)",
                "two-pass",
                "lirs (page)",
                "bmf",
                "buffer",
                "sequential"
            ]
        );
        for m in &r.modes {
            assert_eq!(m.train_loss.len(), 3, "{}", m.mode);
            assert_eq!(m.test_accuracy.len(), 3, "{}", m.mode);
            assert_eq!(m.running_loss.len(), 2, "{}", m.mode);
            assert!((m.train_loss[0] - std::f64::consts::LN_2).abs() < 1e-12);
        }
        assert!(r.two_pass_equals_lirs);
        let (lirs, two) = (
            r.mode("lirs (record)").unwrap(),
            r.mode("two-pass").unwrap(),
        );
        assert_eq!(lirs.train_loss, two.train_loss);
        let seq = r.mode("sequential").unwrap();
        assert!(
            lirs.final_loss() < seq.final_loss(),
            "shuffled {} against sorted {}",
            lirs.final_loss(),
            seq.final_loss()
        );
        assert!(lirs.labels_per_batch > 1.9, "{}", lirs.labels_per_batch);
        assert!(seq.labels_per_batch < 1.1, "{}", seq.labels_per_batch);
        let out = std::path::Path::new(&r.report_dir);
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("convergence.json")).unwrap())
                .unwrap();
        assert_eq!(json["modes"].as_array().unwrap().len(), 6);
        assert!(json["target_loss"].as_f64().unwrap() > json["bayes_loss"].as_f64().unwrap());
        let md = std::fs::read_to_string(out.join("convergence.md")).unwrap();
        assert!(md.contains("| sequential |"));
        for plot in ["loss", "excess", "accuracy"] {
            let svg = std::fs::read_to_string(out.join(format!("convergence-{plot}.svg")));
            let svg = svg.unwrap();
            assert!(
                svg.contains("lirs (page)") && svg.contains("sequential"),
                "{plot}"
            );
        }
        // The dataset and piles are gone.
        assert!(!dir.path().join("riffle-conv-scratch").exists());
        assert!(!dir.path().join("riffle-conv-4096x512.bin").exists());
    }
}
