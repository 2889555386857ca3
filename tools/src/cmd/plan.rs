//! `riffle plan DATASET --batch-size B`: every mode's predicted epoch times, memory and
//! scratch space on this device, the mode `auto` would run, and why.

use crate::out::outln;
use anyhow::Result;
use riffle::modes::Mode;
use riffle::size::human_bytes;

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
}

pub fn run(a: Args) -> Result<()> {
    let explained = Mode::parse_among(&a.mode, &Mode::PLANNED).map_err(anyhow::Error::msg)?;
    let opts = a.data.options(false, false, a.job.memory)?;
    let src = a.data.spec()?.open(&opts, &mut |_, _, _| {})?;
    // A mixture is planned by its first epoch's view (what that epoch reads).
    let job = a.job.request()?.prepare(&src)?;
    let (dev, _) = super::read::device_model(&job.first, a.json)?;
    let free = riffle::probe::free_bytes(&job.scratch).ok();
    let plan = riffle::plan::plan(&job.first, &job.opts, &dev, free)?;
    let explained = match explained {
        Mode::Auto => plan.choice.into(),
        m => m,
    };
    if a.json {
        outln!("{}", serde_json::to_string(&plan)?)?;
        return Ok(());
    }
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
