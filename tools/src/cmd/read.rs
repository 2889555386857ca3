//! `riffle read DATASET --batch-size B`: delivers shuffled batches and reports what it took.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use riffle::dataset::Dataset;
use riffle::io::IoConfig;
use riffle::modes::{self, Cursor, Mode, ReadReport, Resume};
use riffle::order::Tail;
use riffle::request::{parse_grouping, ReadJob, ReadRequest};
use riffle::size::{human_bytes, parse_size};
use riffle::source::Source;
use serde_json::json;

use crate::out::outln;
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
    ///
    /// Without it the run plans within a default budget: the least of a quarter of the
    /// available RAM, 3/4 of this process's memory cgroup limit (v1 or v2) and half of what
    /// `ulimit -v` leaves; two-pass takes at most 512 MiB of piles within it. Resident mode
    /// (chosen by auto, or --mode resident) may hold the dataset within a larger default:
    /// the least of half of the available RAM, 3/4 of the cgroup limit and half of what
    /// `ulimit -v` leaves; the memory is taken only when that mode runs. --memory caps
    /// every mode, resident included.
    #[arg(long, value_parser = riffle::size::parse_budget)]
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
    /// piles, each pile ordered in memory: the same batches with sequential I/O), resident
    /// (the files read once, sequentially, into memory, every later epoch a permutation of
    /// that memory with no I/O: the same batches; when the files do not fit the memory
    /// budget, their first bytes are held and the rest goes through two-pass piles in
    /// --scratch, rolled from epoch to epoch, or is read at random when the scratch has no
    /// room; refused with the figures when the budget holds under a sixteenth), auto (the planner picks lirs, two-pass or resident
    /// from the device's cached profile, probing it quickly on first use; see `riffle
    /// plan`), or a baseline for comparisons: buffer (a shuffle
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
    /// Read as one of --workers DataLoader workers of this rank (0-based): the workers of
    /// a rank split its batches, worker K taking the rank's batches I with I % N == K,
    /// and the tail rule (partial, --pad, --drop-last) is the ranks'. Printed cursors
    /// count the batches of a world of --world x --workers streams.
    #[arg(long, default_value_t = 0, requires = "workers")]
    pub worker: u64,
    /// DataLoader workers of each rank (see --worker).
    #[arg(long, default_value_t = 1)]
    pub workers: u64,
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
    /// Resume mid-epoch from a cursor: EPOCH:BATCH@WORLDxBATCH_SIZE, EPOCH:BATCH or
    /// EPOCH+RECORDS.
    ///
    /// EPOCH:BATCH@WORLDxBATCH_SIZE starts at batch BATCH of every rank, taken under WORLD
    /// ranks and batches of BATCH_SIZE (what `--json` prints as cursor.resume after the
    /// last batch); under another --world or --batch-size it is refused, with the global
    /// form to give instead. EPOCH:BATCH means the same under this run's --world and
    /// --batch-size. The older EPOCH:BATCH@WORLD does not say its batch size: it is
    /// refused (but for batch 0), with the global form it means under this --batch-size.
    ///
    /// EPOCH+RECORDS starts after RECORDS of the epoch's sequence consumed by all ranks
    /// together (cursor.resume_global; padding is not counted), under any --world and
    /// --batch-size: the rest of the epoch is cut into this run's batches from there (its
    /// tail rule applied to what remains), so the ranks before and after together read
    /// the epoch exactly once.
    ///
    /// A cursor past the end of its epoch is refused; its end (EPOCH:BATCHES) is not.
    #[arg(long, value_name = "CURSOR")]
    pub resume: Option<Resume>,
    /// Write one line per batch: its record ids in delivery order, space separated, to this
    /// file (written under a temporary name, renamed when the run completes; a FIFO is
    /// written into as batches come). Not `-`: standard output carries the report.
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

impl JobArgs {
    /// The job's shape as a request: these flags over the request's defaults.
    pub fn request(&self) -> Result<ReadRequest> {
        Ok(ReadRequest {
            epochs: self.epochs,
            memory: self.memory,
            grouping: parse_grouping(&self.grouping, self.unit).map_err(anyhow::Error::msg)?,
            io: IoConfig {
                depth: self.queue_depth.max(1),
                ..IoConfig::default()
            },
            scratch: self.scratch.clone(),
            ..ReadRequest::new(self.batch_size)
        })
    }
}

impl Args {
    /// The flags as a request: parsed here, once (a bad mode or grouping is a runtime
    /// error, exit code 1, like every refusal of what the flags ask).
    fn request(&self, throttled: bool) -> Result<ReadRequest> {
        let job = self.job.request()?;
        if self.workers > 1 && self.rank >= self.world {
            anyhow::bail!(
                "--rank {} is not in a world of {} (ranks are numbered from 0)",
                self.rank,
                self.world
            );
        }
        if self.workers == 0 || self.worker >= self.workers {
            anyhow::bail!(
                "--worker {} is not one of --workers {} (workers are numbered from 0)",
                self.worker,
                self.workers
            );
        }
        // Worker K of rank R is stream K * world + R of world x workers (as riffle.torch
        // numbers a DataLoader's workers).
        let world = self.world.checked_mul(self.workers);
        let rank = world
            .and(self.worker.checked_mul(self.world))
            .and_then(|k| k.checked_add(self.rank));
        let (Some(world), Some(rank)) = (world, rank) else {
            anyhow::bail!(
                "--world {} x --workers {} streams is more than a job can have",
                self.world,
                self.workers
            );
        };
        Ok(ReadRequest {
            mode: self.mode.parse().map_err(anyhow::Error::msg)?,
            first_epoch: self.epoch,
            seed: self.seed,
            rank,
            world,
            workers: self.workers,
            tail: match (self.drop_last, self.pad) {
                (true, _) => Tail::DropLast,
                (_, true) => Tail::Pad,
                _ => Tail::Partial,
            },
            resume: self.resume,
            io: IoConfig {
                throttled,
                ..job.io
            },
            prefetch: self.prefetch,
            lead: !self.no_lead,
            buffer: self.buffer,
            block: self.block,
            ..job
        })
    }
}

/// The planner's view of the device holding the dataset: its cached profile, or a quick
/// probe now (announced, then cached for later runs); where the probe cannot write its
/// region (a read-only filesystem, a directory this user may not write), a default profile
/// of the device's kind, with a notice.
pub fn device_model(ds: &Dataset, json: bool) -> Result<(riffle::plan::DeviceModel, bool)> {
    let path = &ds.files()[0].path;
    if let Some(model) = riffle::plan::cached_device_model(path) {
        return Ok((model, false));
    }
    let dir = riffle::probe::scratch_dir(path)?;
    let dev = riffle::device::identify(&dir)
        .with_context(|| format!("{}: cannot identify its device", dir.display()))?;
    let fallback = |why: &dyn std::fmt::Display| {
        let rotational = dev.rotational.unwrap_or(false);
        eprintln!(
            "riffle: notice: no profile of device {} ({}) is cached and it cannot be probed \
             here ({why}): planning with a default {} profile; `riffle probe DIR` on a \
             writable directory of that device measures it",
            dev.name.as_deref().unwrap_or("?"),
            dev.dev,
            if rotational { "hdd" } else { "sata-ssd" },
        );
        (riffle::plan::DeviceModel::fallback(rotational), false)
    };
    if let Err(e) = nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK) {
        return Ok(fallback(&format!(
            "{}: {}",
            dir.display(),
            std::io::Error::from(e)
        )));
    }
    // A staged copy of objects: the probe's scratch region is local disk like the copy's,
    // so it takes no more than the --cache-limit leaves beside the copy.
    let mut opts = riffle::probe::ProbeOptions::new(true);
    opts.at_most = ds.staged_room();
    if let Some(room) = opts.at_most.filter(|&r| r < riffle::probe::MIN_REGION) {
        return Ok(fallback(&format!(
            "--cache-limit leaves {} beside the staged copy in {} and the probe needs a \
             scratch region of {} there",
            riffle::size::human_bytes(room as f64),
            dir.display(),
            riffle::size::human_bytes(riffle::probe::MIN_REGION as f64),
        )));
    }
    eprintln!(
        "riffle: no profile of device {} ({}) is cached yet: measuring it with a quick probe \
         (about 15 s, once; `riffle probe` shows or refreshes it)",
        dev.name.as_deref().unwrap_or("?"),
        dev.dev
    );
    // Nothing is cached (just looked): measure straight away.
    match super::probe::cached_or_probe(&dir, &opts, true, json) {
        Ok((profile, _)) => Ok((riffle::plan::DeviceModel::from_profile(&profile), true)),
        // Writable by its mode bits, refused all the same (a read-only bind mount, an
        // immutable directory, a full disk).
        Err(e) if cannot_write(&e) => Ok(fallback(&e)),
        Err(e) => Err(e),
    }
}

/// Whether `e` says the probe could not create or write its region.
fn cannot_write(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<riffle::Error>())
        .filter_map(riffle::Error::raw_os_error)
        .any(|n| {
            use nix::errno::Errno;
            [Errno::EROFS, Errno::EACCES, Errno::EPERM, Errno::ENOSPC].contains(&Errno::from_raw(n))
        })
}

pub fn run(a: Args, throttled: bool) -> Result<()> {
    let req = a.request(throttled)?;
    let opts = a.data.options(false, false, a.job.memory)?;
    // The open (an s3:// dataset's listing and layouts, or its staging) is timed apart from
    // the read: `open_seconds` and `first_batch_since_open_seconds` in the JSON report.
    let began = std::time::Instant::now();
    // A mixture (`mix:NAME=PATH*WEIGHT,...`) opens as its sources side by side; a read of
    // it reads each epoch's draws, and the first epoch's view is what the run is sized by.
    let src = a.data.spec()?.open(&opts, &mut |_, _, _| {})?;
    let open_seconds = began.elapsed().as_secs_f64();
    let mut job = req.prepare(&src)?;
    let emulated = riffle::device::identify(job.device_path())
        .ok()
        .and_then(|d| riffle::emulate::active(&d));
    if a.labels && job.first.labels().is_none() {
        bail!(
            "--labels: the dataset has no labels (labels come with --format files over a tree \
             of class directories)"
        );
    }
    // Through the door: refused if it is one of the dataset's files; written under a
    // temporary name and renamed over the path when the run completes (a FIFO or device
    // is written into).
    let mut ids_out = match &a.ids_out {
        // Not a file named "-" in the working directory (what it made): standard output
        // carries the run's report.
        Some(p) if p.as_os_str() == "-" => bail!(
            "--ids-out -: the ids go to a file (standard output carries the run's report); \
             give a path, or a FIFO for a program to read them as they come"
        ),
        Some(p) => Some(riffle::scratch::OutFile::create(
            p,
            &super::cat::input_paths(&a.data.dataset, src.dataset()),
        )?),
        None => None,
    };
    // The mode is chosen and the piles' scratch checked and reserved as one step among the
    // runs sharing the scratch location (ranks of one job): each sees what the others
    // reserved. The reservation is held until the run ends.
    let model = match job.mode {
        Mode::Auto => Some(device_model(&job.first, a.json)?),
        _ => None,
    };
    let scratch = job.scratch.clone();
    let _reserved = riffle::scratch::reserve(&scratch, |others| {
        choose_mode(&mut job, model, others, a.json)?;
        match job.mode {
            Mode::TwoPass => {
                modes::twopass::check_scratch(&job.first, &job.opts, &job.scratch, others).map(Some)
            }
            // Partly resident with the rest through piles, when they fit beside the others.
            Mode::Resident => Ok(modes::piled_rest_scratch(
                &job.first,
                &job.opts,
                &job.scratch,
                others,
            )),
            _ => Ok(None),
        }
    })?;
    let stream = job.read_alone(&src)?;
    let mut done = deliver(stream, &job, ids_out.as_mut(), a.labels, a.json, began)?;
    done.open_seconds = open_seconds;
    if let Some(out) = ids_out {
        out.finish()?;
    }
    let forms = cursor_forms(&job, done.next)?;
    if a.json {
        let v = json_report(&a, &job, &src, &done, &forms, emulated)?;
        outln!("{v}")?;
    } else {
        print_report(&job, &src, &done, &forms)?;
    }
    Ok(())
}

/// Resolves the job's mode: for `auto`, the planner's choice on the device's `model` (its
/// profile, and whether it was just probed), with the scratch free space less what other
/// runs there reserved (`others`), announced unless the output is JSON; a two-pass read on
/// a device known to seek is not led (see `DeviceModel::leads`).
fn choose_mode(
    job: &mut ReadJob,
    model: Option<(riffle::plan::DeviceModel, bool)>,
    others: (u64, u64),
    json: bool,
) -> riffle::Result<()> {
    match (job.mode, model) {
        (Mode::Auto, Some((dev, probed))) => {
            job.choose_beside(Some(&dev), others)?;
            if let (false, Some(p)) = (json, &job.plan) {
                eprintln!(
                    "auto: {}{}: {}",
                    job.mode,
                    if probed { " (device just probed)" } else { "" },
                    p.reason
                );
            }
        }
        (Mode::TwoPass, _) => {
            let dev = riffle::plan::cached_device_model(job.device_path());
            job.choose(dev.as_ref())?;
        }
        _ => job.choose(None)?,
    }
    Ok(())
}

/// What a read did, for its report.
struct Done {
    report: ReadReport,
    /// Hand-off latency to the consumer's loop, microseconds.
    handoff: Histogram<u64>,
    /// Where a later run resumes.
    next: Cursor,
    /// Seconds the dataset's open took.
    open_seconds: f64,
    /// Seconds from the open's start to the first batch delivered, if one was.
    first_batch_since_open: Option<f64>,
}

/// Takes every batch of `stream`, writing its ids (with labels, if asked) to `ids_out`.
fn deliver(
    mut stream: modes::BatchStream,
    job: &ReadJob,
    mut ids_out: Option<&mut impl Write>,
    labels: bool,
    json: bool,
    began: std::time::Instant,
) -> Result<Done> {
    let bar = progress::steps(0, json);
    let mut line = String::new();
    let mut first_batch = None;
    // Hand-off latency: from the engine completing a batch (or this loop asking, if later:
    // a batch that waited for the consumer waited for it, not for the engine) to the loop
    // holding it. The daemon's clients measure the same from the batch's ready_ns.
    let mut handoff =
        Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds");
    // Where a later run resumes: after the last batch delivered, else where this one began.
    let mut next = job.opts.resume.unwrap_or(Cursor {
        epoch: job.opts.first_epoch,
        batch: 0,
    });
    loop {
        let asked = modes::monotonic_ns();
        let Some(batch) = stream.next() else {
            break;
        };
        let b = batch?;
        let got = modes::monotonic_ns();
        first_batch.get_or_insert_with(|| began.elapsed().as_secs_f64());
        handoff.saturating_record((got.saturating_sub(b.ready_ns.max(asked)) / 1000).max(1));
        next = b.next_cursor();
        if let Some(out) = ids_out.as_mut() {
            line.clear();
            for (i, id) in b.ids.iter().enumerate() {
                if i > 0 {
                    line.push(' ');
                }
                line.push_str(&id.to_string());
                if labels {
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
    Ok(Done {
        report: stream.report(),
        handoff,
        next,
        open_seconds: 0.0,
        first_batch_since_open: first_batch,
    })
}

/// The cursor after the last batch in its two forms: (`E:B@WxS`, `E+R`). In an epoch resumed
/// inside a round of batches, this run's batches are numbered from the resume point: its
/// cursor is given in the global form only.
fn cursor_forms(job: &ReadJob, next: Cursor) -> Result<(String, String)> {
    let first_epoch = job.opts.resume.map_or(job.opts.first_epoch, |c| c.epoch);
    let resumed_here = job.first_split.start > 0 && next.epoch == first_epoch;
    let split = if resumed_here {
        &job.first_split
    } else {
        &job.split
    };
    let global_form = next
        .global_form(split)
        .context("the cursor after the last batch lies past its epoch")?;
    let rank_form = if resumed_here {
        global_form.clone()
    } else {
        next.rank_form(job.opts.world, job.opts.batch)
    };
    Ok((rank_form, global_form))
}

/// The report as one JSON object.
fn json_report(
    a: &Args,
    job: &ReadJob,
    src: &Source,
    done: &Done,
    (rank_form, global_form): &(String, String),
    emulated: Option<riffle::emulate::DeviceClass>,
) -> Result<serde_json::Value> {
    let (r, next, handoff) = (&done.report, done.next, &done.handoff);
    let mut v = serde_json::to_value(r)?;
    v["mode"] = job.mode.name().into();
    if let Some((held, rest)) = partly(r, src) {
        v["partly"] = json!({"held_bytes": held, "rest": rest});
    }
    v["records_per_s"] = (r.records as f64 / r.seconds).into();
    v["bytes_per_s"] = (r.bytes as f64 / r.seconds).into();
    v["iops"] = (r.read_ops as f64 / r.seconds).into();
    v["handoff_latency_us"] = json!({
        "p50": handoff.value_at_quantile(0.5),
        "p99": handoff.value_at_quantile(0.99),
        "max": handoff.max(),
    });
    v["dataset_records"] = src.len().into();
    v["seed"] = a.seed.into();
    v["epochs"] = a.job.epochs.into();
    v["emulated"] = serde_json::to_value(emulated)?;
    // Outside `seconds` (the read's): the dataset's open, and the first batch counted from it.
    v["open_seconds"] = done.open_seconds.into();
    v["first_batch_since_open_seconds"] = serde_json::to_value(done.first_batch_since_open)?;
    // A streamed dataset: what its open asked the store for (beside `objects`, the read's).
    if let Some(o) = src.dataset().remote() {
        v["open"] = serde_json::to_value(o.opened())?;
    }
    if let Some(m) = src.mixture() {
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
        "world": job.opts.world,
        "batch_size": a.job.batch_size,
        "resume": rank_form,
        "resume_global": global_form,
    });
    if let Some(p) = &job.plan {
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
    Ok(v)
}

/// A partly resident read's held bytes (of the files) and how it read the rest.
fn partly(r: &riffle::modes::ReadReport, src: &Source) -> Option<(u64, &'static str)> {
    r.mode.starts_with("resident (partly)").then(|| {
        let held = r.resident_bytes.min(src.dataset().bytes());
        (
            held,
            if r.piles > 0 {
                "two-pass piles"
            } else {
                "random reads"
            },
        )
    })
}

/// The report as text.
fn print_report(
    job: &ReadJob,
    src: &Source,
    done: &Done,
    (rank_form, global_form): &(String, String),
) -> Result<()> {
    let (r, handoff) = (&done.report, &done.handoff);
    if let Some(m) = src.mixture() {
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
    let iops = r.read_ops as f64 / r.seconds;
    let rps = r.records as f64 / r.seconds;
    let bps = r.bytes as f64 / r.seconds;
    outln!(
        "{} ({} grouping{}): {} batches, {} records, {} in {:.2} s",
        job.mode,
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
    )?;
    outln!(
        "  {rps:.0} records/s, {}/s, {iops:.0} reads/s at QD {} ({}, {})",
        human_bytes(bps),
        r.queue_depth,
        r.backend,
        if r.direct { "O_DIRECT" } else { "buffered" }
    )?;
    outln!(
        "  batch latency p50 {} us, p99 {} us, max {} us; hand-off to this loop p50 {} us, p99 {} us",
        r.batch_latency_us.p50,
        r.batch_latency_us.p99,
        r.batch_latency_us.max,
        handoff.value_at_quantile(0.5),
        handoff.value_at_quantile(0.99)
    )?;
    let held = if job.mode == Mode::TwoPass {
        format!("piles {}", human_bytes(r.pile_bytes as f64))
    } else if job.mode == Mode::Resident {
        format!(
            "resident {}, table {}",
            human_bytes(r.resident_bytes as f64),
            human_bytes(r.table_bytes as f64)
        )
    } else {
        format!("table {}", human_bytes(r.table_bytes as f64))
    };
    outln!(
        "  memory {} ({held}, units {}, index {}, buffers {}, read-ahead {})",
        human_bytes(r.memory_bytes as f64),
        human_bytes(r.units_bytes as f64),
        human_bytes(r.index_bytes as f64),
        human_bytes(r.buffer_bytes as f64),
        human_bytes(r.prefetch_bytes as f64)
    )?;
    if let Some((held, rest)) = partly(r, src) {
        let how = if r.piles > 0 {
            format!(
                "through {rest} ({} piles, {} written to scratch)",
                r.piles,
                human_bytes(r.scratch_bytes as f64)
            )
        } else {
            format!("with {rest} (no room for piles in the scratch)")
        };
        outln!(
            "  partly resident: {} of the files' {} held; the rest read {how}",
            human_bytes(held as f64),
            human_bytes(src.dataset().bytes() as f64),
        )?;
    }
    outln!(
        "  resume after this run: --resume {rank_form} (any world or batch size: --resume {global_form})"
    )?;
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
