//! What an OPEN asks for, made a read: its fields parsed into a [`ReadRequest`] (the one
//! translation into engine options, shared with `riffle read`), the mode resolved from
//! the cached profile of the dataset's device, the largest batch the stream may carry,
//! its ring, and the key of the job its ranks share.

use std::sync::Arc;

use super::budget::{Ask, Grant};
use super::held::HeldCopy;
use super::job::JobKey;
use super::proto::{OpenRequest, Opened, Transport};
use super::ring::ALIGN;
use super::shm::SharedRing;
use super::state::{ServeConfig, ServeMode, Shared};
use crate::dataset::Dataset;
use crate::io::IoConfig;
use crate::modes::Mode;
use crate::request::{ReadJob, ReadRequest};
use crate::size::human_bytes;
use crate::source::Source;

/// Why an OPEN is refused: the error code, and the message.
pub(super) type Refusal = (&'static str, String);

/// Most batches a stream sends before it needs an ack.
pub(super) const MAX_CREDITS: u32 = 16;

impl From<ServeMode> for Mode {
    fn from(m: ServeMode) -> Mode {
        match m {
            ServeMode::Lirs => Mode::Lirs,
            ServeMode::TwoPass => Mode::TwoPass,
            ServeMode::Auto => Mode::Auto,
            ServeMode::Resident => Mode::Resident,
        }
    }
}

impl TryFrom<Mode> for ServeMode {
    type Error = String;
    /// The daemon serves the contract's modes, resident and `auto`, not the baselines.
    fn try_from(m: Mode) -> Result<ServeMode, String> {
        match m {
            Mode::Lirs => Ok(ServeMode::Lirs),
            Mode::TwoPass => Ok(ServeMode::TwoPass),
            Mode::Auto => Ok(ServeMode::Auto),
            Mode::Resident => Ok(ServeMode::Resident),
            other => Err(format!(
                "the daemon serves the order contract: mode {other} is a baseline"
            )),
        }
    }
}

impl std::str::FromStr for ServeMode {
    type Err = String;
    /// `auto`, `lirs`, `two-pass` or `resident`.
    fn from_str(s: &str) -> Result<ServeMode, String> {
        Mode::parse_among(s, &Mode::PLANNED)?.try_into()
    }
}

/// A message of the engine's, which names the CLI's flags, in the words of the request
/// a client sends: its fields.
fn wire_words(message: &str) -> String {
    message
        .replace(
            "choose --drop-last or --pad",
            "set tail to drop_last or pad",
        )
        .replace("--resume ", "resume ")
        .replace("--grouping ", "grouping ")
        .replace("--epochs ", "epochs ")
        .replace("--epoch ", "epoch ")
}

/// What an OPEN asks for, read as the daemon reads: its mode, queue depth and lead.
fn request(req: &OpenRequest, cfg: &ServeConfig) -> Result<ReadRequest, String> {
    Ok(ReadRequest {
        mode: cfg.mode.into(),
        first_epoch: req.epoch,
        epochs: req.epochs,
        seed: req.seed,
        rank: req.rank,
        world: req.world,
        workers: req.workers,
        tail: req.parse_tail()?,
        grouping: req.parse_grouping()?,
        resume: req.parse_resume()?,
        io: IoConfig {
            depth: cfg.queue_depth.max(1),
            throttled: cfg.throttled,
            ..IoConfig::default()
        },
        // The ring is the read-ahead the client sees; the engine keeps four more (two left
        // the pile pass's bursts at pile boundaries waiting on the channel).
        prefetch: 4,
        memory: None,
        lead: cfg.lead,
        scratch: cfg.scratch.clone(),
        ..ReadRequest::new(req.batch_size)
    })
}

/// The read an OPEN asks of `src`, checked (`bad_request` otherwise) and its mode
/// resolved: for `auto`, the planner's choice from the cached profile of the dataset's
/// device (`riffle serve --mode auto` probes it at start when none is cached), LIRS when
/// there is no profile or no plan; a two-pass read leads unless the profile says the
/// device seeks. `auto` plans within the scratch two-pass could ever have here: the
/// `--scratch-limit`, and the filesystem's free space when none of the daemon's passes
/// holds any (so the ranks of a job choose alike, whatever other jobs hold).
///
/// A resident read (`--mode resident`, or the planner's choice) reads the dataset's held
/// copy, returned beside the job (`held.rs`); when it cannot be held, the streaming mode
/// the plan names (LIRS without a plan), as the log and the stats say.
pub(super) fn prepare(
    req: &OpenRequest,
    src: &Source,
    shared: &Shared,
) -> Result<(ReadJob, Option<Arc<HeldCopy>>), Refusal> {
    let cfg = &shared.cfg;
    let bad = |m: String| ("bad_request", wire_words(&m));
    if req.world > MAX_WORLD {
        return Err(bad(format!(
            "world {} is more ranks than a job can have (at most {MAX_WORLD})",
            req.world
        )));
    }
    if req.streams == Some(0) {
        return Err(bad(
            "streams 0: a node that opens a stream of the job opens at least 1 (leave \
             streams out when it is not known)"
                .into(),
        ));
    }
    let mut job = (request(req, cfg).map_err(bad)?)
        .prepare(src)
        .map_err(|e| (super::codes::reply_code(&e), wire_words(&e.to_string())))?;
    let model = crate::plan::cached_device_model(job.device_path());
    // A staged copy of objects leaves its piles only the room its --cache-limit leaves.
    let free = [
        shared.space.ceiling(&job.scratch),
        shared.scratch_budget.as_ref().map(|b| b.ceiling()),
        job.first.staged_room(),
    ]
    .into_iter()
    .flatten()
    .min();
    if job.choose_within(model.as_ref(), free).is_err() {
        // No plan: read as without a profile.
        job.mode = Mode::Lirs;
        job.opts.lead = false;
    }
    // The daemon loads a held part once for every pass of the dataset: resident wins when
    // its epochs without the load beat the streaming choice.
    if (job.plan.as_ref()).is_some_and(crate::plan::Plan::resident_wins_loaded) {
        job.mode = Mode::Resident;
    }
    if job.mode == Mode::TwoPass {
        // The daemon staged the copy (it fit the limit), so the daemon reads it within
        // the limit: in place, by LIRS, when two-pass piles do not fit beside it.
        if let Err(e) = crate::modes::twopass::check_staged_room(&job.first, &job.opts) {
            eprintln!("riffle serve: dataset '{}': read by lirs: {e}", req.dataset);
            job.mode = Mode::Lirs;
            job.opts.lead = false;
        }
    }
    if job.mode != Mode::Resident {
        return Ok((job, None));
    }
    // Files that never fit whole are held in part when the rest's piles fit the scratch.
    let rest = |held: u64| -> Result<(), String> {
        let need = (crate::modes::prefix_needs(&job.first, &job.opts, held))
            .map_err(|e| format!("the rest's two-pass: {e}"))?
            .1;
        match free {
            Some(f) if need > f => Err(format!(
                "the rest's piles need {} of scratch, {} is free",
                human_bytes(need as f64),
                human_bytes(f as f64)
            )),
            _ => Ok(()),
        }
    };
    let held = match src {
        Source::Dataset(ds) => (shared.residents).acquire(&req.dataset, ds, shared, &rest),
        Source::Mixture(_) => Err("a mixture (a new view of its sources each epoch) is read \
                                   by lirs or two-pass"
            .into()),
    };
    match held {
        Ok(h) => Ok((job, Some(h))),
        Err(why) => {
            // The streaming mode the plan would run without it.
            job.mode = (job.plan.as_ref().and_then(|p| p.streaming)).map_or(Mode::Lirs, Mode::from);
            (shared.residents).fell_back(&req.dataset, job.mode.name(), &why);
            Ok((job, None))
        }
    }
}

/// The most ranks a job may have. A pass walks (and decides) every global batch of its
/// epoch, its ranks' or not, so a world far beyond any real job's made a pass of one
/// member walk 2^64 batches long after its client had gone.
pub(super) const MAX_WORLD: u64 = 1 << 20;

/// Padding an epoch may add: up to this many times its records, or [`PAD_FLOOR`]
/// positions whatever the records (a small dataset over a few ranks pads more than it
/// has).
const PAD_RATIO: u64 = 16;
const PAD_FLOOR: u64 = 1 << 16;

/// Refuses an epoch whose padding (`tail pad`: the last round of batches filled from the
/// epoch's start) repeats its records many times over: every padded position is walked
/// by the pass, most of them for no rank, and nobody trains on an epoch that is mostly
/// repeats.
pub(super) fn sane_padding(split: &crate::order::Split) -> Result<(), Refusal> {
    let padded = split.global_batches.saturating_mul(split.batch);
    let padding = padded.saturating_sub(split.records);
    let allowed = split.records.saturating_mul(PAD_RATIO).max(PAD_FLOOR);
    if padding > allowed {
        return Err((
            "bad_request",
            format!(
                "batches of {} over {} ranks pad an epoch of {} records with {padding} repeated \
             records (at most {allowed}: {PAD_RATIO} times the records, or {PAD_FLOOR}): \
             choose a smaller batch size or world, or tail partial or drop_last",
                split.batch,
                split.ranks(),
                split.records
            ),
        ));
    }
    Ok(())
}

/// The most bytes a batch of `batch` records of `ds` may take in a ring: room for several
/// of them is made within a client's `share`. Refused (`too_large`) when one alone is
/// more than the share: up front rather than failing mid-stream, and so a request can
/// never make the daemon assemble batches larger than a client's share of the memory.
pub(super) fn largest_batch(batch: u64, ds: &Dataset, share: u64) -> Result<u64, Refusal> {
    let max_record = ds.size_stats().max;
    let largest = batch
        .saturating_mul(max_record)
        // ids, offsets, labels and sources: 24 bytes a record.
        .saturating_add(batch.saturating_mul(24))
        .saturating_add(8 + 2 * ALIGN);
    if largest > share {
        return Err((
            "too_large",
            format!(
                "batches of {batch} records may need {largest} bytes (the longest record is \
                 {max_record} bytes), more than each client's ring share of {share} bytes \
                 (--memory / --max-clients): asked {largest}, limit {share}; ask for smaller \
                 batches, or start the daemon with more --memory"
            ),
        ));
    }
    Ok(largest)
}

/// A stream's ring (shared memory), its credits, and the memory it holds; no ring and
/// four credits inline.
pub(super) type Ring = (Option<Arc<SharedRing>>, u32, Option<Grant>);

/// Bytes of batches a ring holds by default: the read-ahead a client sees (the engine
/// keeps its own besides). 64 clients' rings at their whole share (16 MiB at the
/// defaults) left no room in `--memory` for their passes: 22 of 64 jobs of 1 MB batches
/// were refused.
const RING_TARGET: u64 = 4 << 20;

/// Batches of the largest size a ring holds at the least by default: the one the client
/// reads, the one it holds next, and two being assembled in place.
const RING_MIN_BATCHES: u64 = 4;

/// The ring a stream of batches of at most `largest` bytes asks for: room for the batches
/// the client may hold (its credits) and those the engine assembles in the ring or has
/// queued, up to [`RING_TARGET`] bytes, but never fewer than [`RING_MIN_BATCHES`].
fn ring_wanted(largest: u64) -> u64 {
    let all = largest.saturating_mul(MAX_CREDITS as u64 + 8);
    all.min(RING_TARGET)
        .max(largest.saturating_mul(RING_MIN_BATCHES))
}

/// Makes the ring of a stream of batches of at most `largest` bytes ([`ring_wanted`], at
/// most the client's share); less when the daemon's memory is short, down to one largest
/// batch.
pub(super) fn ring(shared: &Shared, req: &OpenRequest, largest: u64) -> Result<Ring, Refusal> {
    if req.transport == Transport::Inline {
        return Ok((None, 4, None));
    }
    let want = req.ring_bytes.unwrap_or_else(|| ring_wanted(largest));
    let want = want.min(shared.ring_share()).max(largest).div_ceil(4096) * 4096;
    let least = largest.div_ceil(4096) * 4096;
    let grant = (shared.budget).take(
        Ask {
            what: "this stream's ring",
            most: (u64::MAX, ""),
            fit: |free| {
                let fits = want.min(free / 4096 * 4096);
                if fits >= least {
                    Ok(fits)
                } else {
                    Err(least)
                }
            },
        },
        shared.cfg.admit_wait,
        &shared.stopping,
    )?;
    let ring = SharedRing::new(&format!("riffle-{}", req.dataset), grant.bytes())
        .map_err(|e| ("shm", e.to_string()))?;
    Ok((Some(ring), MAX_CREDITS, Some(grant)))
}

/// What makes the streams of `req` ranks of one job, read by `job`.
pub(super) fn job_key(req: &OpenRequest, job: &ReadJob) -> JobKey {
    let o = &job.opts;
    JobKey {
        dataset: req.dataset.clone(),
        seed: o.seed,
        first_epoch: o.first_epoch,
        epochs: o.epochs,
        batch: o.batch,
        world: o.world,
        workers: o.workers,
        tail: o.tail,
        grouping: o.grouping,
        resume: o.resume.map(|c| (c.epoch, c.batch)),
        resume_start: o.resume_start,
        mode: job.mode,
        piled: false,
    }
}

/// OPENED for a stream of `job` over `src`: the stream's shape and the cursor arithmetic
/// the client needs. How it travels (ring, credits) and which pass serves it are the
/// caller's to fill in.
pub(super) fn opened(req: &OpenRequest, src: &Source, job: &ReadJob, largest: u64) -> Opened {
    let (ds, split, first) = (&job.first, &job.split, &job.first_split);
    Opened {
        records: ds.len(),
        batches_per_epoch: split.batches(),
        transport: req.transport,
        ring_bytes: 0,
        credits: 0,
        max_batch_bytes: largest,
        mode: job.mode.name().into(),
        pass: String::new(),
        job: None,
        stream: None,
        format: ds.format().name().into(),
        columns: ds.columns().to_vec(),
        classes: ds.classes().to_vec(),
        sources: src.mixture().map(|m| m.names.clone()).unwrap_or_default(),
        start: first.start,
        start_end: first.cursor_end(),
        round: split.round(),
        epoch_end: split.cursor_end(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemon_serves_the_contract_modes_by_name() {
        for m in Mode::CONTRACT {
            let served: ServeMode = m.name().parse().unwrap();
            assert_eq!(Mode::from(served), m);
        }
        assert_eq!("resident".parse::<ServeMode>(), Ok(ServeMode::Resident));
        assert_eq!(
            "bmf".parse::<ServeMode>(),
            Err("unknown mode 'bmf': expected auto, lirs, two-pass or resident".into())
        );
        assert!(ServeMode::try_from(Mode::Sequential).is_err());
    }

    /// Padding many times the records is refused with the numbers; a small dataset over a
    /// few ranks, or padding of a fraction of the records, is not.
    #[test]
    fn absurd_padding_is_refused_with_its_numbers() {
        use crate::order::{Split, Tail};
        let ok = |records, batch, world| {
            sane_padding(&Split::new(records, batch, 0, world, Tail::Pad).unwrap())
        };
        assert_eq!(ok(10, 32, 8), Ok(()));
        assert_eq!(ok(1_000_000, 256, 1024), Ok(()));
        let e = ok(10, 1, MAX_WORLD).unwrap_err().1;
        assert!(
            e.contains("pad an epoch of 10 records with 1048566 repeated records"),
            "{e}"
        );
        assert!(ok(1000, 4096, 64).is_err());
        // Other tails never pad.
        let dropped = Split::new(1000, 7, 0, 64, Tail::DropLast).unwrap();
        assert_eq!(sane_padding(&dropped), Ok(()));
    }

    #[test]
    fn engine_messages_name_the_request_fields() {
        assert_eq!(
            wire_words("10 records do not split evenly ...: choose --drop-last or --pad"),
            "10 records do not split evenly ...: set tail to drop_last or pad"
        );
        assert_eq!(
            wire_words("--epochs must be at least 1"),
            "epochs must be at least 1"
        );
        assert_eq!(
            wire_words("--resume 0+5: record 5 is past the end"),
            "resume 0+5: record 5 is past the end"
        );
        assert_eq!(
            wire_words("--epoch 3 --epochs 2: run past"),
            "epoch 3 epochs 2: run past"
        );
    }
}
