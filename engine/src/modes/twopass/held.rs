//! A partly resident read whose rest goes through two-pass piles: the files' first bytes
//! are loaded once and held (`partial::load`), and the units they hold whole go to the
//! piles as skip frames (a head, no bytes: the pile pass takes their records out of
//! memory, in the place their key gives them); the rest is scattered once from the device
//! and rolled over from epoch to epoch, like any two-pass read. A later epoch therefore
//! reads and writes only the part not held, sequentially, and the batches are two-pass's:
//! the order contract's.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::super::partial::{self, Held};
use super::super::{BatchStream, ReadOptions};
use crate::dataset::Dataset;
use crate::order::Units;
use crate::resources::{PartialPlan, ResourcePlan};
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

/// Reads `opts.epochs` epochs of `ds` partly resident, the rest through two-pass piles in
/// `scratch` (see the module documentation), with the sizes `plan` and its resources.
pub(in crate::modes) fn read_partly_piled(
    ds: Arc<Dataset>,
    opts: ReadOptions,
    scratch: PathBuf,
    plan: PartialPlan,
    resources: ResourcePlan,
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
        let Some(mem) = partial::load(&ds, &plan, &opts.io, stop, r)? else {
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
