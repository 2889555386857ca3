//! `riffle plan DATASET --batch-size B`: every mode's predicted epoch times, memory and
//! scratch space on this device, the mode `auto` would run, and why.

use crate::out::outln;
use anyhow::Result;
use riffle::modes::Mode;
use riffle::size::human_bytes;
use serde_json::{json, Value};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub data: super::dataset::DatasetArgs,
    #[command(flatten)]
    pub job: super::read::JobArgs,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Also list every figure the run would use (buffers, slots, queue depth, table, piles,
    /// open files, scratch), each with its reason.
    #[arg(long)]
    pub explain: bool,
    /// The mode whose figures --explain lists: auto (the planner's choice), lirs, two-pass
    /// or resident.
    #[arg(long, default_value = "auto")]
    pub mode: String,
    /// s3:// datasets under --cache-limit: the ranks the job's epochs are split over, each
    /// node's streamed piles holding about 1/WORLD of the records (one rank a node).
    #[arg(long, default_value_t = 1)]
    pub world: u64,
}

pub fn run(a: Args) -> Result<()> {
    let explained = Mode::parse_among(&a.mode, &Mode::PLANNED).map_err(anyhow::Error::msg)?;
    let opts = a.data.options(false, false, a.job.memory)?;
    let src = a.data.spec()?.open(&opts, &mut |_, _, _| {})?;
    // A mixture is planned by its first epoch's view (what that epoch reads).
    let job = a.job.request()?.prepare(&src)?;
    let Some(objects) = objects_first(&a, &job)? else {
        return Ok(());
    };
    let (dev, _) = super::read::device_model(&job.first, a.json)?;
    let free = riffle::probe::free_bytes(&job.scratch).ok();
    let plan = riffle::plan::plan(&job.first, &job.opts, &dev, free)?;
    let explained = match explained {
        Mode::Auto => plan.choice.into(),
        m => m,
    };
    if a.json {
        let mut v = serde_json::to_value(&plan)?;
        if !objects.is_null() {
            v["object_storage"] = objects;
        }
        outln!("{v}")?;
        return Ok(());
    }
    print_object_storage(&objects)?;
    let w = &plan.workload;
    outln!(
        "dataset   {} records, {} ({} mean, {} max)",
        w.records,
        human_bytes(w.bytes as f64),
        human_bytes(w.bytes as f64 / w.records.max(1) as f64),
        human_bytes(w.max_record as f64)
    )?;
    outln!(
        "device    {}sequential read {}/s, write {}/s, 4 KiB random reads {:.0}/s at QD {}",
        plan.device
            .emulated
            .as_ref()
            .map(|c| format!("emulated {c}: "))
            .unwrap_or_default(),
        human_bytes(plan.device.seq_read_bps),
        human_bytes(plan.device.seq_write_bps),
        plan.device.iops(4096, w.queue_depth),
        w.queue_depth
    )?;
    outln!(
        "job       batches of {}, {} epoch(s), memory {}, scratch free {}",
        w.batch,
        w.epochs,
        match (w.memory, riffle::resources::memory::here()) {
            (Some(m), _) => human_bytes(m as f64),
            (None, Some(m)) => format!(
                "{} by default ({}; resident {}: {})",
                human_bytes(m.bytes as f64),
                m.from.source(),
                human_bytes(m.resident as f64),
                m.resident_from.source()
            ),
            (None, None) => "unlimited".into(),
        },
        w.scratch_free
            .map(|m| human_bytes(m as f64))
            .unwrap_or_else(|| "unknown".into())
    )?;
    outln!()?;
    outln!(
        "{:<11} {:<10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10}  note",
        "mode",
        "grouping",
        "1st batch",
        "first s",
        "later s",
        "total s",
        "bound",
        "memory",
        "scratch"
    )?;
    for c in &plan.candidates {
        let note = match (&c.unfit, c.contract) {
            (Some(why), _) => format!("cannot run: {why}"),
            (None, false) => "baseline: not the contract's order".into(),
            (None, true) if c.mode == plan.choice.name() && c.grouping == plan.grouping => {
                "<- auto".into()
            }
            _ => String::new(),
        };
        outln!(
            "{:<11} {:<10} {:>9.3} {:>9.2} {:>9.2} {:>9.2} {:>9} {:>10} {:>10}  {note}",
            c.mode,
            c.grouping,
            c.first_batch_s,
            c.first_epoch_s,
            c.later_epoch_s,
            c.total_s,
            c.bound,
            human_bytes(c.memory_bytes as f64),
            human_bytes(c.scratch_bytes as f64),
        )?;
    }
    outln!()?;
    outln!("auto runs {}: {}", plan.choice, plan.reason)?;
    if let Some(g) = &plan.page_gain {
        outln!("{g}")?;
    }
    if a.explain {
        explain(&plan, explained.name())?;
    }
    outln!(
        "{}",
        if plan.lead {
            "two-pass leads with lirs: its first batches are read at random while the scatter \
             runs, so its first batch comes in about lirs's time (1st batch)"
        } else {
            "two-pass does not lead with lirs here: random reads on this device would slow \
             the scatter more than they give; its first batch waits for the scatter"
        }
    )?;
    Ok(())
}

/// Prints every figure `mode`'s run would use, and why.
fn explain(plan: &riffle::plan::Plan, mode: &str) -> Result<()> {
    let Some(r) = plan.resources_of(mode) else {
        let why = plan
            .candidate(mode, &plan.grouping)
            .and_then(|c| c.unfit.clone())
            .unwrap_or_else(|| "it does not fit".into());
        anyhow::bail!("{mode} cannot run here: {why}");
    };
    outln!()?;
    outln!(
        "resources of {mode}: memory {}, scratch {}, open files {}",
        human_bytes(r.memory_bytes as f64),
        human_bytes(r.scratch_bytes as f64),
        r.open_files
    )?;
    for f in &r.figures {
        outln!("  {:<16} {:>10}  {}", f.name, f.shown(), f.reason)?;
    }
    outln!()?;
    Ok(())
}

/// The choices for an `s3://` dataset under `--cache-limit` `limit`, over `epochs` (one
/// node of `world` ranks reading): the
/// staged copy (GETs the first epoch only, local disk the dataset) and the streamed
/// two-pass read (every epoch's GETs, local disk its piles), with the one that runs.
fn object_storage(
    job: &riffle::request::ReadJob,
    limit: u64,
    epochs: u64,
    world: u64,
) -> Result<Value> {
    let ds = &job.first;
    let total = ds.bytes();
    let opts = riffle::modes::ReadOptions {
        world: world.max(1),
        ..job.opts.clone()
    };
    let f = riffle::modes::twopass::streamed_figures(ds, &opts, limit)?;
    let range = riffle::remote::STAGE_RANGE;
    let stage_gets: u64 = ds.files().iter().map(|f| f.size.div_ceil(range)).sum();
    let staged = total <= limit;
    // The largest object is fetched alone once to find its layout; an MDS shard's header
    // is enough (its index.json gives the rest).
    let largest = match ds.format() {
        riffle::format::Format::Mds => 0,
        _ => ds.files().iter().map(|f| f.size).max().unwrap_or(0),
    };
    // The endpoint's cached probe, if it was measured (`riffle probe s3://...`): the time
    // the GETs take at its best throughput.
    let cfg = riffle::remote::S3Config::from_env()?;
    let predicted = match riffle::remote::probe::load_cached(&cfg, true) {
        Some(p) if p.best_bytes_per_s > 0.0 => json!({
            "best_get_bytes_per_s": p.best_bytes_per_s,
            "first_byte_s": p.first_byte_s[0],
            "staged_fetch_s": total as f64 / p.best_bytes_per_s,
            "streamed_fetch_s_per_epoch": f.bytes_per_epoch as f64 / p.best_bytes_per_s,
        }),
        _ => Value::Null,
    };
    Ok(json!({
        "predicted": predicted,
        "cache_limit": limit,
        "dataset_bytes": total,
        "objects": ds.files().len(),
        "epochs": epochs,
        "world": world,
        "choice": if staged { "staged" } else { "streamed two-pass" },
        // What opening it for this plan asked the store for (streamed only: a staged
        // copy's open is its first epoch's GETs).
        "open": ds.remote().map(|r| r.opened()),
        "staged": {
            "fits": staged,
            "gets_first_epoch": stage_gets,
            "bytes_first_epoch": total,
            "gets_later_epoch": 0,
            "bytes_later_epoch": 0,
            "local_disk": total,
            "memory": riffle::remote::STAGE_IN_FLIGHT as u64 * range,
        },
        "streamed_two_pass": {
            "fits": f.unfit.is_none() && f.local_disk.max(largest) <= limit,
            "unfit": f.unfit,
            // Each round reads the node's objects once (`twopass::rounds`).
            "rounds": f.rounds,
            "gets_per_epoch": f.gets_per_epoch,
            "bytes_per_epoch": f.bytes_per_epoch,
            "local_disk": f.local_disk.max(largest),
            "memory": f.memory,
        },
    }))
}

/// Prints [`object_storage`]'s figures as a table (nothing for `Value::Null`), followed
/// by a line saying the local plan follows when the dataset was staged.
fn print_object_storage(v: &Value) -> Result<()> {
    if v.is_null() {
        return Ok(());
    }
    let h = |v: &Value| human_bytes(v.as_u64().unwrap_or(0) as f64);
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    outln!(
        "objects   {} object(s), {}; --cache-limit {} on each of {} node(s)",
        v["objects"],
        h(&v["dataset_bytes"]),
        h(&v["cache_limit"]),
        v["world"]
    )?;
    outln!()?;
    outln!(
        "{:<18} {:>12} {:>12} {:>12} {:>12} {:>10} {:>10}  note",
        "choice",
        "GETs ep 1",
        "bytes ep 1",
        "GETs ep 2+",
        "bytes ep 2+",
        "local disk",
        "memory"
    )?;
    let s = &v["staged"];
    let t = &v["streamed_two_pass"];
    let note = |name: &str, fits: &Value, what: &str| match (fits.as_bool(), v["choice"] == name) {
        (Some(false), _) => format!("cannot run: {what} does not fit --cache-limit"),
        (_, true) => "<- runs".to_string(),
        _ => String::new(),
    };
    outln!(
        "{:<18} {:>12} {:>12} {:>12} {:>12} {:>10} {:>10}  {}",
        "staged",
        n(&s["gets_first_epoch"]),
        h(&s["bytes_first_epoch"]),
        n(&s["gets_later_epoch"]),
        h(&s["bytes_later_epoch"]),
        h(&s["local_disk"]),
        h(&s["memory"]),
        note("staged", &s["fits"], "the copy"),
    )?;
    outln!(
        "{:<18} {:>12} {:>12} {:>12} {:>12} {:>10} {:>10}  {}",
        "streamed two-pass",
        n(&t["gets_per_epoch"]),
        h(&t["bytes_per_epoch"]),
        n(&t["gets_per_epoch"]),
        h(&t["bytes_per_epoch"]),
        h(&t["local_disk"]),
        h(&t["memory"]),
        note("streamed two-pass", &t["fits"], "a round of its piles"),
    )?;
    match (t["rounds"].as_u64(), t["unfit"].as_str()) {
        (_, Some(why)) => outln!("\nstreamed two-pass cannot run: {why}")?,
        (Some(1), _) => outln!("\nstreamed two-pass: one round (one epoch's piles fit)")?,
        (Some(r), _) => outln!(
            "\nstreamed two-pass: {r} rounds per epoch, each a sequential read of the node's \
             objects scattering one key range of the piles (the GETs and bytes above are all \
             {r}), so the piles fit --cache-limit in exact order"
        )?,
        _ => {}
    }
    let o = &v["open"];
    if !o.is_null() {
        outln!(
            "\nopening it: {} listing(s), {} GET(s) of {} to find layouts; {} layout(s) from \
             the local cache, {} fetched (once per object identity)",
            n(&o["lists"]),
            n(&o["gets"]),
            h(&o["bytes"]),
            n(&o["layouts_cached"]),
            n(&o["layouts_fetched"])
        )?;
    }
    let p = &v["predicted"];
    match p["best_get_bytes_per_s"].as_f64() {
        Some(best) => outln!(
            "\nfrom the endpoint's probe (GETs at best {}/s, first byte {:.1} ms): staged fetches \
             for {:.1} s once; streamed two-pass fetches for {:.1} s every epoch, beside its \
             piles' local writes and reads",
            human_bytes(best),
            p["first_byte_s"].as_f64().unwrap_or(0.0) * 1e3,
            p["staged_fetch_s"].as_f64().unwrap_or(0.0),
            p["streamed_fetch_s_per_epoch"].as_f64().unwrap_or(0.0)
        )?,
        None => outln!(
            "\n(no probe of this endpoint is cached: `riffle probe s3://...` measures it, and \
             the times of the GETs are then predicted here)"
        )?,
    }
    outln!()?;
    if v["choice"] == "staged" {
        outln!("the staged copy is read by the local modes:")?;
        outln!()?;
    }
    Ok(())
}

/// An s3:// dataset under --cache-limit: its choices ([`object_storage`]), printed at once
/// and `None` (nothing more to plan) when it is streamed, which has no local device to plan
/// on; else the figures to show beside the local plan (`Value::Null` for other datasets).
fn objects_first(a: &Args, job: &riffle::request::ReadJob) -> Result<Option<Value>> {
    let remote = a.data.dataset.iter().any(|p| riffle::remote::is_remote(p));
    let v = match a.data.cache_limit.filter(|_| remote) {
        Some(limit) => object_storage(job, limit, a.job.epochs, a.world)?,
        None => Value::Null,
    };
    if job.first.remote().is_none() {
        return Ok(Some(v));
    }
    match a.json {
        true => outln!("{v}")?,
        false => print_object_storage(&v)?,
    }
    Ok(None)
}
