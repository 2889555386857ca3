//! A read as a caller asks for it, and the one translation of it into [`ReadOptions`]
//! that `riffle read`, `riffle plan` and the daemon's OPEN share.
//!
//! Each edge parses what its user typed (flags, the OPEN request's fields) into a
//! [`ReadRequest`] of typed values; [`ReadRequest::prepare`] checks it against the source
//! it reads and builds the options, the job's splits and the scratch location;
//! [`ReadJob::choose`] resolves `auto` to the planner's choice and decides whether a
//! two-pass read leads with LIRS. Nothing past this point sees a mode, tail or grouping
//! as a string.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dataset::Dataset;
use crate::io::IoConfig;
use crate::modes::{epochs_from, BatchStream, Mode, ReadOptions, Resume};
use crate::order::{Grouping, Split, Tail};
use crate::plan::{DeviceModel, Plan};
use crate::source::Source;
use crate::{Error, Result};

/// What to read, as typed values. Messages about it name the CLI's flags (`--epochs`);
/// the daemon words them as its request's fields.
#[derive(Clone, Debug)]
pub struct ReadRequest {
    /// How to read (`auto` until [`ReadJob::choose`] resolves it).
    pub mode: Mode,
    /// Records per batch.
    pub batch: u64,
    /// The first epoch.
    pub first_epoch: u64,
    /// Epochs to read (at least one).
    pub epochs: u64,
    /// Seed of the order.
    pub seed: u64,
    /// This stream: a rank, or one of a rank's workers (see [`ReadOptions::workers`]).
    pub rank: u64,
    /// Streams in all: ranks x workers.
    pub world: u64,
    /// Streams (DataLoader workers) of each rank, which split the rank's batches.
    pub workers: u64,
    /// What becomes of the records that do not fill a last round of batches.
    pub tail: Tail,
    /// How records are grouped into shuffling units.
    pub grouping: Grouping,
    /// Where to start again, resolved against the job's batches.
    pub resume: Option<Resume>,
    /// I/O (queue depth = `io.depth`).
    pub io: IoConfig,
    /// Batches read ahead of the consumer.
    pub prefetch: usize,
    /// Hard ceiling on engine-owned memory, if any.
    pub memory: Option<u64>,
    /// Two-pass: lead with LIRS (unless the device seeks: see [`ReadJob::choose`]).
    pub lead: bool,
    /// [`Mode::Buffer`]: the shuffle buffer's capacity in records.
    pub buffer: u64,
    /// [`Mode::Bmf`]: records per block.
    pub block: u64,
    /// Two-pass: where the piles go (`None`: the directory of the first data file).
    pub scratch: Option<PathBuf>,
}

impl ReadRequest {
    /// One epoch of `batch`-record batches from epoch 0, `auto`, seed 0, one rank,
    /// record grouping, the defaults of `riffle read`.
    pub fn new(batch: u64) -> ReadRequest {
        let o = ReadOptions::new(batch);
        ReadRequest {
            mode: Mode::Auto,
            batch,
            first_epoch: o.first_epoch,
            epochs: o.epochs,
            seed: o.seed,
            rank: o.rank,
            world: o.world,
            workers: o.workers,
            tail: o.tail,
            grouping: o.grouping,
            resume: None,
            io: o.io,
            prefetch: o.prefetch,
            memory: o.memory,
            lead: o.lead,
            buffer: 10_000,
            block: 4096,
            scratch: None,
        }
    }

    /// Checks the request against `src` before anything is read (the epochs, what a
    /// mixture may be read with, the split of batches over ranks, the resume cursor) and
    /// translates it. The mode is as asked until [`ReadJob::choose`].
    pub fn prepare(&self, src: &Source) -> Result<ReadJob> {
        if self.epochs == 0 {
            return Err(Error::Invalid("--epochs must be at least 1".into()));
        }
        let epochs = epochs_from(self.first_epoch, self.epochs).map_err(|e| {
            Error::Invalid(format!(
                "--epoch {} --epochs {}: {e}",
                self.first_epoch, self.epochs
            ))
        })?;
        // Said here, in the cursor's form as given: once resolved, a global cursor inside a
        // round of batches is the resolved batch 0 of its epoch, which is not what was given.
        if let Some(r) = self.resume.filter(|r| !epochs.contains(&r.epoch())) {
            return Err(Error::Invalid(format!(
                "--resume {r} is in epoch {}, outside the epochs this run reads \
                 (--epoch {} --epochs {}: {})",
                r.epoch(),
                self.first_epoch,
                self.epochs,
                match epochs.end - epochs.start {
                    1 => format!("epoch {}", epochs.start),
                    _ => format!("epochs {} to {}", epochs.start, epochs.end - 1),
                }
            )));
        }
        if src.mixture().is_some() {
            if self.grouping != Grouping::Record {
                return Err(Error::Invalid(
                    "a mixture is read with --grouping record".into(),
                ));
            }
            if self.mode.is_baseline() || self.mode == Mode::Resident {
                return Err(Error::Invalid(format!(
                    "a mixture is read by lirs or two-pass (--mode {})",
                    self.mode
                )));
            }
        }
        // A mixture's epoch is a view of its draws: the first one sizes the read.
        let first = src.epoch_view(self.seed, self.first_epoch)?;
        // The job's batches: a cursor given is resolved against them.
        let split = Split::streams(
            first.len(),
            self.batch,
            self.rank,
            self.world,
            self.workers,
            self.tail,
            0,
        )?;
        let (resume, start) = match self.resume {
            Some(r) => {
                let (c, start) = r.resolve_anywhere(&split)?;
                (Some(c), start)
            }
            None => (None, None),
        };
        let opts = ReadOptions {
            seed: self.seed,
            grouping: self.grouping,
            io: self.io.clone(),
            prefetch: self.prefetch,
            memory: self.memory,
            baseline: self.mode.baseline(self.buffer, self.block),
            lead: self.lead,
            workers: self.workers,
            ..ReadOptions::new(self.batch)
        }
        .with_epochs(self.first_epoch, self.epochs)
        .with_rank(self.rank, self.world, self.tail)
        .with_resume(resume, start);
        opts.epoch_range()?;
        let first_split =
            opts.split_for(resume.map_or(self.first_epoch, |c| c.epoch), first.len())?;
        // A dataset streamed from object storage: two-pass only, its piles in its cache.
        let (mode, scratch) = match (first.remote(), self.mode) {
            (None, mode) => (
                mode,
                crate::scratch::location(self.scratch.as_deref(), &first.files()[0].path),
            ),
            (Some(o), Mode::Auto | Mode::TwoPass) => (
                Mode::TwoPass,
                self.scratch.clone().unwrap_or_else(|| o.scratch_home()),
            ),
            (Some(_), other) => {
                first.refuse_if_streamed(other.name())?;
                (other, self.scratch.clone().unwrap_or_default())
            }
        };
        Ok(ReadJob {
            mode,
            opts,
            first,
            split,
            first_split,
            scratch,
            plan: None,
        })
    }
}

/// A request checked against its source: the options to read it with and what the
/// callers report of it.
pub struct ReadJob {
    /// The mode: as asked, then (after [`ReadJob::choose`]) the one that runs, never `auto`.
    pub mode: Mode,
    /// The options.
    pub opts: ReadOptions,
    /// What the first epoch reads (the dataset, or a mixture's view of that epoch's draws):
    /// the planner and the budgets size the read by it.
    pub first: Arc<Dataset>,
    /// The job's batches in a whole epoch: a cursor given is resolved against them, and
    /// one printed after the read is taken under them.
    pub split: Split,
    /// The batches of the first epoch read: resumed from a global cursor inside a round
    /// of batches (then numbered from there), or `split`.
    pub first_split: Split,
    /// Where two-pass piles go (a private directory is made there).
    pub scratch: PathBuf,
    /// The planner's plan, when it chose the mode.
    pub plan: Option<Plan>,
}

impl ReadJob {
    /// Resolves the mode with the planner's view of the dataset's device, if there is
    /// one: `auto` becomes the planner's choice (LIRS, not led, without a device model),
    /// and a two-pass read leads with LIRS as asked unless the device seeks. Fails only
    /// when the planner does, leaving the job as it was.
    pub fn choose(&mut self, model: Option<&DeviceModel>) -> Result<()> {
        self.choose_beside(model, (0, 0))
    }

    /// [`ReadJob::choose`] beside other runs in the scratch location that reserved `others`
    /// (bytes, files) of it and have not written them yet (`scratch::reserved_by_others`):
    /// `auto` plans with the free space less those.
    pub fn choose_beside(&mut self, model: Option<&DeviceModel>, others: (u64, u64)) -> Result<()> {
        let free = crate::probe::free_bytes(&self.scratch)
            .ok()
            .map(|f| f.saturating_sub(others.0));
        // A staged copy's --cache-limit bounds the piles beside it.
        let free = match (free, self.first.staged_room()) {
            (Some(f), Some(r)) => Some(f.min(r)),
            (f, r) => f.or(r),
        };
        self.choose_within(model, free)
    }

    /// [`ReadJob::choose`] with `scratch_free` the scratch two-pass may have (a daemon's
    /// `--scratch-limit`, or its filesystem's free space less what is spoken for): `auto`
    /// picks LIRS when two-pass's piles do not fit it.
    pub fn choose_within(
        &mut self,
        model: Option<&DeviceModel>,
        scratch_free: Option<u64>,
    ) -> Result<()> {
        match (self.mode, model) {
            (Mode::Auto, None) => {
                self.mode = Mode::Lirs;
                self.opts.lead = false;
            }
            (Mode::Auto, Some(model)) => {
                let p = crate::plan::plan(&self.first, &self.opts, model, scratch_free)?;
                self.mode = p.choice.into();
                self.opts.lead = p.lead;
                self.plan = Some(p);
            }
            (Mode::TwoPass, model) => {
                self.opts.lead = crate::plan::lead_for(model, &self.first, &self.opts);
            }
            _ => {}
        }
        Ok(())
    }

    /// Where the piles go if the mode reads through them (two-pass), else `None`.
    pub fn piles(&self) -> Option<PathBuf> {
        (self.mode == Mode::TwoPass).then(|| self.scratch.clone())
    }

    /// Starts reading `src` (the source the job was prepared against) with the options. A
    /// partly resident read reads the part it does not hold as LIRS reads (a daemon's
    /// scratch is for the passes its budget admitted).
    pub fn read(&self, src: &Source) -> Result<BatchStream> {
        match self.mode {
            Mode::Resident => src.read_resident(self.opts.clone(), None),
            _ => src.read(self.opts.clone(), self.piles()),
        }
    }

    /// [`ReadJob::read`] for a run of its own (`riffle read`): a partly resident read may
    /// put the part it does not hold through two-pass piles in the job's scratch, when
    /// they fit its free space.
    pub fn read_alone(&self, src: &Source) -> Result<BatchStream> {
        match self.mode {
            Mode::Resident => src.read_resident(self.opts.clone(), Some(self.scratch.clone())),
            _ => self.read(src),
        }
    }

    /// The device the planner would model: the dataset's first file's.
    pub fn device_path(&self) -> &Path {
        &self.first.files()[0].path
    }
}

/// `record`, or `page` with blocks of `unit` bytes: a grouping as users name it.
pub fn parse_grouping(name: &str, unit: u64) -> std::result::Result<Grouping, String> {
    match name {
        "record" => Ok(Grouping::Record),
        "page" if unit == 0 => Err("--unit must be positive".into()),
        "page" => Ok(Grouping::Page { unit }),
        other => Err(format!(
            "unknown grouping '{other}': expected record or page"
        )),
    }
}

#[cfg(test)]
mod tests;
