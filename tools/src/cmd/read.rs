//! `riffle read DATASET --batch-size B`: delivers shuffled batches and reports what it took.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use riffle::dataset::Dataset;
use riffle::io::IoConfig;
use riffle::modes::{self, Baseline, Cursor, ReadOptions, Resume};
use riffle::order::{Grouping, Split, Tail};
use riffle::size::{human_bytes, parse_size};
use serde_json::json;

use crate::progress;

/// The job's shape, shared by `riffle read` and `riffle plan`.
#[derive(clap::Args, Clone, Debug)]
pub struct JobArgs {
    /// Records per batch.
    #[arg(long)]
    pub batch_size: u64,
    /// Number of epochs to read (two-pass pays its scatter once).
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// Hard ceiling on engine-owned memory (tables, indexes, buffers, read-ahead).
    #[arg(long, value_parser = parse_size)]
    pub memory: Option<u64>,
    /// record (an exact uniform shuffle) or page (records starting in one aligned block
    /// move together: one read per block).
    #[arg(long, default_value = "record")]
    pub grouping: String,
    /// The block size of page grouping.
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    pub unit: u64,
    /// Reads in flight.
    #[arg(long, default_value_t = 64)]
    pub queue_depth: usize,
    /// two-pass: where the piles go (default: the directory of the first data file).
    ///
    /// The piles go in a private directory `.riffle-scratch-KIND-PID-RANDOM` there (made
    /// if the location is missing, and removed again), removed when the run ends, also on
    /// error, Ctrl-C or SIGTERM. One left by a killed run (SIGKILL, a crash) is removed by
    /// the next riffle command that uses the location, which says how much it reclaimed.
    #[arg(long)]
    pub scratch: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub data: super::dataset::DatasetArgs,
    #[command(flatten)]
    pub job: JobArgs,
    /// The first epoch (the order of epoch e is the same whichever run reads it).
    #[arg(long, default_value_t = 0)]
    pub epoch: u64,
    /// lirs (random reads straight from the device), two-pass (sequential scatter into
    /// piles, each pile ordered in memory: the same batches with sequential I/O), auto
    /// (the planner picks lirs or two-pass from the device's cached profile, probing it
    /// quickly on first use; see `riffle plan`), or a baseline for comparisons: buffer (a shuffle
    /// buffer of --buffer records over a sequential read), bmf (blocks of --block records,
    /// block order shuffled per epoch), sequential (no shuffle).
    #[arg(long, default_value = "auto")]
    pub mode: String,
    /// two-pass: do not lead with lirs. By default a two-pass read sends the first epoch's
    /// first batches by reading them at random (lirs) while the scatter runs, and the pile
    /// pass takes over where lirs stopped: the same batches, the first in a fraction of a
    /// second instead of after the whole scatter. It is off by itself on a device that
    /// seeks (per the cached probe profile); --json reports lead_batches and
    /// first_batch_seconds.
    #[arg(long)]
    pub no_lead: bool,
    /// buffer: the shuffle buffer's capacity in records.
    #[arg(long, default_value_t = 10_000)]
    pub buffer: u64,
    /// bmf: records per block (blocks are cut once; only their order changes per epoch).
    #[arg(long, default_value_t = 4096)]
    pub block: u64,
    /// Seed of the order.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// This rank (0-based), with --world.
    #[arg(long, default_value_t = 0)]
    pub rank: u64,
    /// Number of ranks sharing each epoch.
    #[arg(long, default_value_t = 1)]
    pub world: u64,
    /// Drop the records that do not fill a last round of batches.
    #[arg(long, conflicts_with = "pad")]
    pub drop_last: bool,
    /// Fill the last round of batches with records from the epoch's start (marked as
    /// padding).
    #[arg(long)]
    pub pad: bool,
    /// Batches read ahead of the consumer (at most 65536). Under a tight --memory fewer are:
    /// LIRS and two-pass cut the read-ahead to what the budget leaves room for (one at least).
    #[arg(long, default_value_t = 4, value_parser = parse_prefetch)]
    pub prefetch: usize,
    /// Resume mid-epoch from a cursor: EPOCH:BATCH@WORLD, EPOCH:BATCH or EPOCH+RECORDS.
    ///
    /// EPOCH:BATCH@WORLD starts at batch BATCH of every rank, taken under WORLD ranks (what
    /// `--json` prints as cursor.resume after the last batch); under another --world it is
    /// refused, with the global form to give instead. EPOCH:BATCH means the same under this
    /// run's --world.
    ///
    /// EPOCH+RECORDS starts after RECORDS of the epoch's sequence consumed by all ranks
    /// together (cursor.resume_global), under any --world and --batch-size: the rest of
    /// the epoch is cut into this run's batches from there (its tail rule applied to what
    /// remains), so the ranks before and after together read the epoch exactly once.
    ///
    /// A cursor past the end of its epoch is refused; its end (EPOCH:BATCHES) is not.
    #[arg(long, value_name = "CURSOR")]
    pub resume: Option<Resume>,
    /// Write one line per batch: its record ids in delivery order, space separated.
    #[arg(long)]
    pub ids_out: Option<PathBuf>,
    /// In --ids-out, write each record as ID:LABEL (a files dataset of class directories,
    /// ImageFolder's labels).
    #[arg(long, requires = "ids_out")]
    pub labels: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `--grouping` and `--unit` as a grouping.
pub fn parse_grouping(name: &str, unit: u64) -> Result<Grouping> {
    Ok(match name {
        "record" => Grouping::Record,
        "page" => {
            if unit == 0 {
                bail!("--unit must be positive");
            }
            Grouping::Page { unit }
        }
        other => bail!("unknown grouping '{other}': expected record or page"),
    })
}

/// Where two-pass piles go: `--scratch`, or the directory of the first data file.
pub fn scratch_dir(given: Option<&PathBuf>, ds: &Dataset) -> PathBuf {
    riffle::scratch::location(given.map(PathBuf::as_path), &ds.files()[0].path)
}

/// The planner's view of the device holding the dataset: its cached profile, or a quick
/// probe now (announced, then cached for later runs).
pub fn device_model(ds: &Dataset, json: bool) -> Result<(riffle::plan::DeviceModel, bool)> {
    let path = &ds.files()[0].path;
    if let Some(model) = riffle::plan::cached_device_model(path) {
        return Ok((model, false));
    }
    let dir = riffle::probe::scratch_dir(path)?;
    let dev = riffle::device::identify(&dir)
        .with_context(|| format!("{}: cannot identify its device", dir.display()))?;
    eprintln!(
        "riffle: no profile of device {} ({}) is cached yet: measuring it with a quick probe \
         (about 15 s, once; `riffle probe` shows or refreshes it)",
        dev.name.as_deref().unwrap_or("?"),
        dev.dev
    );
    // Nothing is cached (just looked): measure straight away.
    let opts = riffle::probe::ProbeOptions::new(true);
    let (profile, _) = super::probe::cached_or_probe(&dir, &opts, true, json)?;
    Ok((riffle::plan::DeviceModel::from_profile(&profile), true))
}

pub fn run(a: Args, throttled: bool) -> Result<()> {
    let mode = match a.mode.as_str() {
        "auto" => "auto",
        "lirs" => "lirs",
        "two-pass" => "two-pass",
        "buffer" => "buffer",
        "bmf" => "bmf",
        "sequential" => "sequential",
        other => bail!(
            "unknown mode '{other}': expected auto, lirs, two-pass, buffer, bmf or sequential"
        ),
    };
    let grouping = parse_grouping(&a.job.grouping, a.job.unit)?;
    let tail = match (a.drop_last, a.pad) {
        (true, _) => Tail::DropLast,
        (_, true) => Tail::Pad,
        _ => Tail::Partial,
    };
    if a.job.epochs == 0 {
        bail!("--epochs must be at least 1");
    }
    modes::epochs_from(a.epoch, a.job.epochs)
        .with_context(|| format!("--epoch {} --epochs {}", a.epoch, a.job.epochs))?;
    let opts = a.data.options(false, false, a.job.memory)?;
    // A mixture (`mix:NAME=PATH*WEIGHT,...`) opens as its sources side by side; a read of
    // it reads each epoch's draws, and the first epoch's view is what the run is sized by.
    let src = a.data.spec()?.open(&opts, &mut |_, _, _| {})?;
    let mixture = src.mixture().cloned();
    if mixture.is_some() && grouping != Grouping::Record {
        bail!("a mixture is read with --grouping record");
    }
    let ds = src.epoch_view(a.seed, a.epoch)?;
    let records = src.len();
    // The job's batches: the cursor given is resolved against them, and the one printed
    // at the end is taken under them.
    let split = Split::new(records, a.job.batch_size, a.rank, a.world, tail)?;
    let (resume, resume_start) = match a.resume {
        Some(r) => {
            let (c, start) = r.resolve_anywhere(&split)?;
            (Some(c), start)
        }
        None => (None, None),
    };
    let device = riffle::device::identify(&ds.files()[0].path).ok();
    let emulated = device.and_then(|d| riffle::emulate::active(&d));
    let mut read_opts = ReadOptions {
        seed: a.seed,
        first_epoch: a.epoch,
        epochs: a.job.epochs,
        batch: a.job.batch_size,
        rank: a.rank,
        world: a.world,
        tail,
        grouping,
        resume,
        resume_start,
        io: IoConfig {
            depth: a.job.queue_depth.max(1),
            throttled,
            ..IoConfig::default()
        },
        prefetch: a.prefetch,
        memory: a.job.memory,
        baseline: match mode {
            "buffer" => Some(Baseline::Buffer {
                size: a.buffer.max(1),
            }),
            "bmf" => Some(Baseline::Bmf {
                block: a.block.max(1),
            }),
            "sequential" => Some(Baseline::Sequential),
            _ => None,
        },
        lender: None,
        ranks: None,
        lead: !a.no_lead,
    };
    if a.labels && ds.labels().is_none() {
        bail!(
            "--labels: the dataset has no labels (labels come with --format files over a tree \
             of class directories)"
        );
    }
    let mut ids_out = match &a.ids_out {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("{}: cannot create", p.display()))?,
        )),
        None => None,
    };
    let scratch = scratch_dir(a.job.scratch.as_ref(), &ds);
    let mut plan = None;
    let mode = if mode == "auto" {
        let (dev, probed) = device_model(&ds, a.json)?;
        let free = riffle::probe::free_bytes(&scratch).ok();
        let p = riffle::plan::plan(&ds, &read_opts, &dev, free)?;
        let chosen = if p.choice == riffle::plan::Choice::TwoPass {
            "two-pass"
        } else {
            "lirs"
        };
        if !a.json {
            eprintln!(
                "auto: {chosen}{}: {}",
                if probed { " (device just probed)" } else { "" },
                p.reason
            );
        }
        read_opts.lead = p.lead;
        plan = Some(p);
        chosen
    } else {
        if mode == "two-pass" {
            // A device known to seek is not led (see `DeviceModel::leads`).
            let dev = riffle::plan::cached_device_model(&ds.files()[0].path);
            read_opts.lead = riffle::plan::lead_for(dev.as_ref(), &ds, &read_opts);
        }
        mode
    };
    if mixture.is_some() && !matches!(mode, "lirs" | "two-pass") {
        bail!("a mixture is read by lirs or two-pass (--mode {mode})");
    }
    // The split of the epoch a global cursor resumes in (what its batches are numbered by).
    let resumed_split = match resume {
        Some(c) => Some(read_opts.split_for(c.epoch, records)?),
        None => None,
    };
    if mode == "two-pass" {
        // A mixture's epoch is a view of its own size: checked as the first one.
        let first = src.epoch_view(read_opts.seed, read_opts.first_epoch)?;
        modes::twopass::check_scratch(&first, &read_opts, &scratch)?;
    }
    let stream = src.read(read_opts, (mode == "two-pass").then_some(scratch))?;
    let bar = progress::steps(0, a.json);
    let mut line = String::new();
    let mut stream = stream;
    // Hand-off latency: from the engine completing a batch (or this loop asking, if later:
    // a batch that waited for the consumer waited for it, not for the engine) to the loop
    // holding it. The daemon's clients measure the same from the batch's ready_ns.
    let mut handoff = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)
        .expect("histogram bounds");
    // Where a later run resumes: after the last batch delivered, else where this one began.
    let mut next = resume.unwrap_or(Cursor {
        epoch: a.epoch,
        batch: 0,
    });
    loop {
        let asked = modes::monotonic_ns();
        let Some(batch) = stream.next() else {
            break;
        };
        let b = batch?;
        let got = modes::monotonic_ns();
        handoff.saturating_record((got.saturating_sub(b.ready_ns.max(asked)) / 1000).max(1));
        next = b.next_cursor();
        if let Some(out) = ids_out.as_mut() {
            line.clear();
            for (i, id) in b.ids.iter().enumerate() {
                if i > 0 {
                    line.push(' ');
                }
                line.push_str(&id.to_string());
                if a.labels {
                    line.push(':');
                    line.push_str(&b.labels[i].to_string());
                }
            }
            line.push('\n');
            out.write_all(line.as_bytes())?;
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    if let Some(mut out) = ids_out {
        out.flush()?;
    }
    let r = stream.report();
    if let Some(m) = &mixture {
        if !a.json {
            let parts: Vec<String> = m
                .names
                .iter()
                .zip(&m.counts)
                .map(|(n, c)| format!("{n} {c}"))
                .collect();
            eprintln!(
                "mixture: each epoch {} records: {}",
                m.size(),
                parts.join(", ")
            );
        }
    }
    // In an epoch resumed inside a round of batches, this run's batches are numbered from
    // the resume point: its cursor is given in the global form only.
    let resumed_here =
        resumed_split.filter(|s| resume.is_some_and(|c| c.epoch == next.epoch) && s.start > 0);
    let global_form = next
        .global_form(resumed_here.as_ref().unwrap_or(&split))
        .context("the cursor after the last batch lies past its epoch")?;
    let rank_form = match resumed_here {
        Some(_) => global_form.clone(),
        None => next.rank_form(a.world),
    };
    let iops = r.read_ops as f64 / r.seconds;
    let rps = r.records as f64 / r.seconds;
    let bps = r.bytes as f64 / r.seconds;
    if a.json {
        let mut v = serde_json::to_value(&r)?;
        v["mode"] = mode.into();
        v["records_per_s"] = rps.into();
        v["bytes_per_s"] = bps.into();
        v["iops"] = iops.into();
        v["handoff_latency_us"] = json!({
            "p50": handoff.value_at_quantile(0.5),
            "p99": handoff.value_at_quantile(0.99),
            "max": handoff.max(),
        });
        v["dataset_records"] = records.into();
        v["seed"] = a.seed.into();
        v["epochs"] = a.job.epochs.into();
        v["emulated"] = serde_json::to_value(emulated)?;
        if let Some(m) = &mixture {
            v["mixture"] = json!({
                "records_per_epoch": m.size(),
                "sources": m.names.iter().enumerate().map(|(i, n)| json!({
                    "name": n,
                    "records": m.starts[i + 1] - m.starts[i],
                    "first_id": m.starts[i],
                    "per_epoch": m.counts[i],
                })).collect::<Vec<_>>(),
            });
        }
        v["cursor"] = json!({
            "epoch": next.epoch,
            "batch": next.batch,
            "world": a.world,
            "batch_size": a.job.batch_size,
            "resume": rank_form,
            "resume_global": global_form,
        });
        if let Some(p) = &plan {
            let c = p.chosen();
            v["plan"] = json!({
                "choice": p.choice.name(),
                "reason": p.reason,
                "predicted_first_epoch_s": c.first_epoch_s,
                "predicted_first_batch_s": c.first_batch_s,
                "lead": p.lead,
                "predicted_later_epoch_s": c.later_epoch_s,
                "predicted_total_s": c.total_s,
                "measured_total_s": r.seconds,
                "predicted_over_measured": c.total_s / r.seconds.max(1e-9),
                "page_gain": p.page_gain,
                "candidates": p.candidates,
            });
        }
        println!("{v}");
    } else {
        println!(
            "{mode} ({} grouping{}): {} batches, {} records, {} in {:.2} s",
            r.grouping,
            if r.grouping == "page" {
                format!(", {:.1} records per unit", r.records_per_unit)
            } else {
                String::new()
            },
            r.batches,
            r.records,
            human_bytes(r.bytes as f64),
            r.seconds
        );
        println!(
            "  {rps:.0} records/s, {}/s, {iops:.0} reads/s at QD {} ({}, {})",
            human_bytes(bps),
            r.queue_depth,
            r.backend,
            if r.direct { "O_DIRECT" } else { "buffered" }
        );
        println!(
            "  batch latency p50 {} us, p99 {} us, max {} us; hand-off to this loop p50 {} us, p99 {} us",
            r.batch_latency_us.p50,
            r.batch_latency_us.p99,
            r.batch_latency_us.max,
            handoff.value_at_quantile(0.5),
            handoff.value_at_quantile(0.99)
        );
        let held = if r.mode == "two-pass" {
            format!("piles {}", human_bytes(r.pile_bytes as f64))
        } else {
            format!("table {}", human_bytes(r.table_bytes as f64))
        };
        println!(
            "  memory {} ({held}, units {}, index {}, buffers {}, read-ahead {})",
            human_bytes(r.memory_bytes as f64),
            human_bytes(r.units_bytes as f64),
            human_bytes(r.index_bytes as f64),
            human_bytes(r.buffer_bytes as f64),
            human_bytes(r.prefetch_bytes as f64)
        );
        println!(
            "  resume after this run: --resume {rank_form} (any world: --resume {global_form})"
        );
    }
    Ok(())
}

fn parse_prefetch(s: &str) -> Result<usize, String> {
    let n: usize = s
        .parse()
        .map_err(|_| format!("'{s}': expected a number of batches"))?;
    if n > modes::MAX_PREFETCH {
        return Err(format!(
            "{n}: at most {} batches are read ahead",
            modes::MAX_PREFETCH
        ));
    }
    Ok(n)
}
