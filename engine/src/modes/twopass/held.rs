//! A partly resident read whose rest goes through two-pass piles: the files' first bytes
//! are loaded once and held (`partial::load`), and the units they hold whole go to the
//! piles as skip frames (a head, no bytes: the pile pass takes their records out of
//! memory, in the place their key gives them); the rest is scattered once from the device
//! and rolled over from epoch to epoch, like any two-pass read. A later epoch therefore
//! reads and writes only the part not held, sequentially, and the batches are two-pass's:
//! the order contract's.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::super::partial::{self, Held};
use super::super::resident::LoadCounts;
use super::super::{BatchStream, ReadOptions};
use crate::dataset::Dataset;
use crate::order::Units;
use crate::pipeline::Stop;
use crate::resources::{Limits, PartialPlan, ResourcePlan};
use crate::{Error, Result};

/// The held part as the pile pass reads it: which units it holds whole, and their records.
pub(in crate::modes) struct HeldPart<'a> {
    ds: &'a Dataset,
    mem: &'a Held,
    /// Units `0..units` are held whole (the held bytes are the files' first ones, and
    /// units are consecutive records in file order).
    units: u64,
}

impl<'a> HeldPart<'a> {
    fn new(ds: &'a Dataset, units: &Units, mem: &'a Held) -> HeldPart<'a> {
        // The first unit whose last record is not held (binary search: held records are a
        // prefix of the records).
        let whole = |u: u64| {
            let r = units.records(u);
            r.end == r.start || mem.range(&ds.locate(r.end - 1)).is_some()
        };
        let (mut lo, mut hi) = (0, units.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if whole(mid) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        HeldPart { ds, mem, units: lo }
    }

    /// Units `0..` this are held whole: the scatter writes them as skip frames unread.
    pub(super) fn units(&self) -> u64 {
        self.units
    }

    /// Record `id`'s bytes, if they are held.
    pub(super) fn record(&self, id: u64) -> Option<&[u8]> {
        let r = self.mem.range(&self.ds.locate(id))?;
        Some(&self.mem.bytes()[r])
    }
}

/// A dataset's first bytes held apart from any read, shared by the partly resident reads
/// of it (a daemon's passes of every job and epoch): empty until the first read that needs
/// it loads it (reads that come meanwhile wait for that load), then kept, so that a later
/// read scatters only the rest from the device. A load given up leaves it empty.
pub struct HeldPrefix {
    /// The size of each file of the dataset it is for.
    sizes: Vec<u64>,
    /// Bytes it holds once loaded: the files' first bytes, back to back in file order.
    bytes: u64,
    /// The sequential reads that load it: (in flight, bytes each).
    load: (usize, usize),
    mem: Mutex<Option<Arc<Held>>>,
    counts: LoadCounts,
}

impl HeldPrefix {
    /// Empty memory for the first `bytes` of `ds`'s files (at most all of them), loaded by
    /// `load` sequential reads in flight of `(depth, bytes)`; nothing is allocated until a
    /// read loads it.
    pub fn new(ds: &Dataset, bytes: u64, load: (usize, usize)) -> HeldPrefix {
        HeldPrefix {
            sizes: ds.files().iter().map(|f| f.size).collect(),
            bytes: bytes.min(ds.bytes()),
            load: (load.0.max(1), load.1.max(4096)),
            mem: Mutex::new(None),
            counts: LoadCounts::default(),
        }
    }

    /// Bytes it holds once loaded.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// `empty`, `loading` or `loaded`.
    pub fn state(&self) -> &'static str {
        match self.mem.try_lock() {
            Ok(m) if m.is_some() => "loaded",
            Ok(_) => "empty",
            Err(std::sync::TryLockError::Poisoned(_)) => "empty",
            Err(std::sync::TryLockError::WouldBlock) => "loading",
        }
    }

    /// What its loads read, and the reads using it now.
    pub fn counts(&self) -> &LoadCounts {
        &self.counts
    }

    /// The loaded part, or (nobody has loaded it) this read loads it, counted in `r`;
    /// `None` when the read stopped during its load.
    fn obtain(
        &self,
        ds: &Dataset,
        plan: &PartialPlan,
        opts: &ReadOptions,
        stop: &Stop,
        r: &mut super::super::ReadReport,
    ) -> Result<Option<Arc<Held>>> {
        // Held while loading: a read that comes meanwhile waits for the load.
        let mut mem = self.mem.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = &*mem {
            return Ok(Some(m.clone()));
        }
        let before = (r.read_ops, r.device_bytes);
        let plan = PartialPlan {
            held: self.bytes,
            load_depth: self.load.0,
            load_slot: self.load.1,
            ..*plan
        };
        let loaded = partial::load(ds, &plan, &opts.io, stop, r)?.map(Arc::new);
        if loaded.is_some() {
            self.counts.loaded();
            (self.counts).read(r.device_bytes - before.1, r.read_ops - before.0);
        }
        mem.clone_from(&loaded);
        Ok(loaded)
    }
}

/// Reads `opts.epochs` epochs of `ds` partly resident out of `prefix`, its first bytes
/// held apart from the read (loaded by this read if nobody has), the rest through two-pass
/// piles in `scratch`, sized within `opts.memory` (the read's own memory: the held part
/// is not in it). The batches are two-pass's. Refused when `prefix` was made for files of
/// other sizes, or when the rest's piles do not fit.
pub fn read_prefix_piled(
    ds: Arc<Dataset>,
    opts: ReadOptions,
    scratch: PathBuf,
    prefix: Arc<HeldPrefix>,
) -> Result<BatchStream> {
    super::super::resident::refuse_unreadable(&ds, &opts)?;
    let sizes: Vec<u64> = ds.files().iter().map(|f| f.size).collect();
    if sizes != prefix.sizes {
        return Err(Error::Invalid(format!(
            "the part held for {} file(s) of {} bytes is not of this dataset's {} file(s) \
             of {} bytes",
            prefix.sizes.len(),
            prefix.sizes.iter().sum::<u64>(),
            sizes.len(),
            ds.bytes()
        )));
    }
    opts.check(ds.len())?;
    let units = Units::new(&ds.layout(), opts.grouping);
    let d = super::super::demand(&ds, &units, &opts);
    let limits = Limits::here(Some(&scratch));
    let (plan, resources) =
        crate::resources::partial_piled_rest(&d, ds.bytes(), prefix.bytes(), &limits)?;
    read_partly_piled(ds, opts, scratch, plan, resources, Some(prefix))
}

/// The (memory, scratch) bytes a read of `ds` with `opts` out of a held prefix of `held`
/// bytes plans for ([`read_prefix_piled`]): the rest's two-pass piles. For admissions.
pub fn prefix_needs(ds: &Dataset, opts: &ReadOptions, held: u64) -> Result<(u64, u64)> {
    let units = Units::new(&ds.layout(), opts.grouping);
    let d = super::super::demand(ds, &units, opts);
    let (_, r) = crate::resources::partial_piled_rest(&d, ds.bytes(), held, &Limits::here(None))?;
    Ok((r.memory_bytes, r.scratch_bytes))
}

/// Reads `opts.epochs` epochs of `ds` partly resident, the rest through two-pass piles in
/// `scratch` (see the module documentation), with the sizes `plan` and its resources; the
/// held part out of `prefix` when given (loaded there if nobody has), else loaded for
/// this read alone.
pub(in crate::modes) fn read_partly_piled(
    ds: Arc<Dataset>,
    opts: ReadOptions,
    scratch: PathBuf,
    plan: PartialPlan,
    resources: ResourcePlan,
    prefix: Option<Arc<HeldPrefix>>,
) -> Result<BatchStream> {
    let Some((prefetch, piles)) = plan.piles else {
        return Err(Error::Internal(
            "a partly resident read through piles was given no pile plan".into(),
        ));
    };
    let units = Units::new(&ds.layout(), opts.grouping);
    // The held part loads first: no LIRS lead beside the scatter.
    let opts = ReadOptions {
        prefetch,
        lead: false,
        ..opts
    };
    let dir = crate::scratch::ScratchDir::new_in(&scratch, "two-pass")?;
    BatchStream::spawn("riffle-partial", prefetch, move |tx, stop, r| {
        r.resources = Some(resources);
        let t = Instant::now();
        let _reading = prefix.as_ref().map(Reading::new);
        let mem = match &prefix {
            Some(p) => p.obtain(&ds, &plan, &opts, stop, r)?,
            None => partial::load(&ds, &plan, &opts.io, stop, r)?.map(Arc::new),
        };
        let Some(mem) = mem else {
            return Ok(());
        };
        let (load_seconds, loaded) = (t.elapsed().as_secs_f64(), (r.read_ops, r.device_bytes));
        let part = HeldPart::new(&ds, &units, &mem);
        let done = super::run(
            &ds,
            &units,
            &opts,
            &piles,
            dir.path(),
            Some(&part),
            tx,
            stop,
            r,
        );
        r.mode = "resident (partly)".into();
        r.resident_bytes = mem.capacity() as u64;
        r.memory_bytes += r.resident_bytes;
        r.read_ops += loaded.0;
        r.device_bytes += loaded.1;
        r.seconds += load_seconds;
        if let Some(first) = r.epoch_seconds.first_mut() {
            *first += load_seconds;
        }
        done
    })
}

/// Counts a read of a [`HeldPrefix`] while it lasts.
struct Reading(Arc<HeldPrefix>);

impl Reading {
    fn new(p: &Arc<HeldPrefix>) -> Reading {
        p.counts.enter();
        Reading(p.clone())
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        self.0.counts.leave();
    }
}
