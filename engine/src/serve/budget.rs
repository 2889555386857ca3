//! The daemon's budgets: `--memory` (the datasets' indexes, every stream's ring and every
//! engine pass's memory: tables, buffers, read-ahead, piles, a mixture's draws),
//! `--scratch-limit` (two-pass piles) and the open files (`ulimit -n`). Each request takes
//! from them, and gives back when its ring or pass goes.
//!
//! Admission tells the truth: a request that can never fit (it needs more than the most a
//! request of its kind may ever have, even with the daemon idle) is refused at once with
//! `too_large` and the numbers; one that would fit once others give back waits a bounded
//! time for room, then is refused with `busy` (wait and retry).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::open::Refusal;
use crate::dataset::Dataset;
use crate::modes::{self, ReadOptions};
use crate::size::human_bytes;

/// What a budget counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unit {
    /// Bytes (memory, scratch).
    Bytes,
    /// Open files.
    Files,
}

impl Unit {
    /// `n` in this unit, as a person reads it.
    pub(super) fn show(self, n: u64) -> String {
        match self {
            Unit::Bytes => human_bytes(n as f64),
            Unit::Files => format!("{n} open files"),
        }
    }
}

/// One of the daemon's budgets: how much is in use, and the total.
pub(super) struct Budget {
    total: u64,
    /// In use for good (the datasets' indexes, the daemon's own files).
    base: u64,
    /// How a user sets it (`--memory`), for messages.
    flag: &'static str,
    unit: Unit,
    used: Mutex<u64>,
    freed: Condvar,
    /// Gives back memory held for later (the daemon's idle resident copies) when a request
    /// does not fit: called with the bytes missing, says whether any were given back.
    reclaim: OnceLock<Reclaim>,
}

/// See [`Budget::on_short`].
pub(super) type Reclaim = Box<dyn Fn(u64) -> bool + Send + Sync>;

/// What is taken from a [`Budget`], given back when dropped.
pub(super) struct Grant {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Grant {
    /// Bytes (or files) held.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        let mut used = self.budget.lock();
        *used -= self.bytes;
        self.budget.freed.notify_all();
    }
}

/// Most a single engine pass is given: what two-pass takes by default.
pub(super) const PASS_MAX: u64 = 512 << 20;

/// How often a waiting request looks again (besides being woken when room is freed): the
/// daemon's shutdown is noticed within this.
const LOOK_AGAIN: Duration = Duration::from_millis(100);

/// What a request asks of a budget: what it is (for messages), the most a request of its
/// kind may ever have (and why, e.g. "a quarter of --memory"), and how much it takes
/// given what is free (`Ok(n)`, at most the bytes free) or the least it needs (`Err`).
pub(super) struct Ask<'a, F> {
    pub(super) what: &'a str,
    pub(super) most: (u64, &'a str),
    pub(super) fit: F,
}

impl Budget {
    /// A budget of `total` (set by `flag`), `base` of it in use for good.
    pub(super) fn new(total: u64, base: u64, flag: &'static str, unit: Unit) -> Arc<Budget> {
        Arc::new(Budget {
            total,
            base: base.min(total),
            flag,
            unit,
            used: Mutex::new(base.min(total)),
            freed: Condvar::new(),
            reclaim: OnceLock::new(),
        })
    }

    /// Sets what gives back memory held for later when a request does not fit (the
    /// daemon's idle resident copies, `held.rs`); called without the budget's lock.
    pub(super) fn on_short(&self, reclaim: Reclaim) {
        let _ = self.reclaim.set(reclaim);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        self.used.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The total.
    pub(super) fn total(&self) -> u64 {
        self.total
    }

    /// In use now.
    pub(super) fn used(&self) -> u64 {
        *self.lock()
    }

    /// The most any one request may have: the total less what is in use for good.
    pub(super) fn ceiling(&self) -> u64 {
        self.total - self.base
    }

    /// Takes what `ask` asks for. A request that needs more than it may ever have (its
    /// `most`, or the whole budget less what is in use for good) is refused at once with
    /// `too_large` and the numbers. Otherwise waits up to `wait` for room (woken as grants
    /// are given back; `stopping` ends the wait with `shutdown`), then is refused with
    /// `busy`: so much is needed, so much is free now.
    pub(super) fn take(
        self: &Arc<Self>,
        ask: Ask<'_, impl FnMut(u64) -> std::result::Result<u64, u64>>,
        wait: Duration,
        stopping: &AtomicBool,
    ) -> std::result::Result<Grant, Refusal> {
        let Ask {
            what,
            most: (most, why),
            mut fit,
        } = ask;
        let (ceiling, why) = if most < self.ceiling() {
            (most, why.to_string())
        } else {
            (self.ceiling(), self.whole())
        };
        // Even with nothing else running it would not fit: waiting cannot help.
        let least = match fit(ceiling) {
            Ok(n) if n <= ceiling => None,
            Ok(n) | Err(n) => Some(n),
        };
        if let Some(least) = least {
            return Err(self.too_large(what, least, ceiling, &why));
        }
        let started = Instant::now();
        let until = started + wait;
        // What `fit` said last, to ask again only when the free bytes changed.
        let mut last: Option<(u64, std::result::Result<u64, u64>)> = None;
        loop {
            let free = self.total - self.used();
            let said = match last {
                Some((f, r)) if f == free => r,
                _ => fit(free),
            };
            last = Some((free, said));
            let least = match said {
                Ok(n) if n <= free => {
                    let mut used = self.lock();
                    // Others may have taken some since: look again if it no longer fits.
                    if *used + n <= self.total {
                        *used += n;
                        return Ok(Grant {
                            budget: self.clone(),
                            bytes: n,
                        });
                    }
                    continue;
                }
                Ok(n) | Err(n) => n,
            };
            // Memory held for later goes before a request waits or is refused.
            if let Some(reclaim) = self.reclaim.get() {
                if reclaim(least.saturating_sub(free).max(1)) {
                    continue;
                }
            }
            if stopping.load(Ordering::SeqCst) {
                return Err(("shutdown", "the daemon is shutting down".into()));
            }
            let now = Instant::now();
            if now >= until {
                return Err(self.busy(what, least, free, now - started));
            }
            let used = self.lock();
            let _ = self
                .freed
                .wait_timeout(used, (until - now).min(LOOK_AGAIN))
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// "the daemon's --memory of 1 GiB, less 3 MiB its datasets' indexes hold for good".
    fn whole(&self) -> String {
        let held = match (self.base, self.unit) {
            (0, _) => String::new(),
            (b, Unit::Bytes) => format!(
                ", less the {} its datasets' indexes hold",
                human_bytes(b as f64)
            ),
            (b, Unit::Files) => format!(", less the {b} the daemon holds open itself"),
        };
        format!("{} {}{held}", self.flag, self.unit.show(self.total))
    }

    /// The refusal of a request that can never fit.
    pub(super) fn too_large(&self, what: &str, asked: u64, limit: u64, why: &str) -> Refusal {
        let u = self.unit;
        (
            "too_large",
            format!(
                "{what} needs {}, more than the {} it may ever have ({why}): asked {asked}, \
                 limit {limit}; this never fits however long it waits: ask for less (smaller \
                 batches), or start the daemon with more {}",
                u.show(asked),
                u.show(limit),
                self.flag
            ),
        )
    }

    /// The refusal of a request that fits once others give back.
    fn busy(&self, what: &str, least: u64, free: u64, waited: Duration) -> Refusal {
        let u = self.unit;
        (
            "busy",
            format!(
                "{what} needs {} and {} of the daemon's {} {} is free now, the rest held by \
                 other streams{}: try again later",
                u.show(least),
                u.show(free),
                self.flag,
                u.show(self.total),
                if waited >= Duration::from_millis(50) {
                    format!(" (waited {:.1} s for room)", waited.as_secs_f64())
                } else {
                    String::new()
                }
            ),
        )
    }
}

/// The daemon's budgets, as a pass's admission takes from them.
pub(super) struct Budgets<'a> {
    pub(super) memory: &'a Arc<Budget>,
    /// `--scratch-limit`, when set.
    pub(super) scratch: Option<&'a Arc<Budget>>,
    /// The scratch filesystems' real free space.
    pub(super) space: &'a Arc<super::space::ScratchSpace>,
    /// The open files (`ulimit -n`), less what connections and rings may hold.
    pub(super) files: &'a Arc<Budget>,
    /// `--max-clients`: a pass's fair share of the open files is this many'th.
    pub(super) clients: u64,
    pub(super) wait: Duration,
    pub(super) stopping: &'a AtomicBool,
}

/// What an engine pass holds of the daemon's budgets: memory, and two-pass's scratch
/// (`--scratch-limit`, and its reservation of the scratch filesystem's free space).
/// Given back when dropped.
pub(super) struct Admitted {
    _memory: Grant,
    _view: Option<Grant>,
    _files: Grant,
    scratch: ScratchHold,
    /// The scratch it holds for piles it may roll past its end (`rolled.rs`).
    rolled: Option<super::rolled::Holds>,
}

/// A pass's scratch: its share of `--scratch-limit` and its reservation of the
/// filesystem's free space. Piles rolled past the pass's end keep it (`rolled.rs`).
#[derive(Default)]
pub(super) struct ScratchHold {
    _grant: Option<Grant>,
    space: Option<super::space::Reservation>,
}

impl ScratchHold {
    /// Bytes reserved on the filesystem.
    pub(super) fn bytes(&self) -> u64 {
        self.space
            .as_ref()
            .map_or(0, super::space::Reservation::bytes)
    }

    /// The piles are written: other processes see them in the free space, not as a claim.
    pub(super) fn written(&mut self) {
        if let Some(s) = &mut self.space {
            s.written();
        }
    }
}

impl Admitted {
    /// The pass's scratch, taken out of the admission (it then holds none).
    pub(super) fn take_scratch(&mut self) -> ScratchHold {
        std::mem::take(&mut self.scratch)
    }

    /// Holds `holds` (its scratch, and kept piles' it took) until the pass ends.
    pub(super) fn hold_rolled(&mut self, holds: super::rolled::Holds) {
        self.rolled = Some(holds);
    }
}

/// The most memory one pass may have of a budget of `total`, and why.
pub(super) fn pass_most(total: u64) -> (u64, String) {
    let most = PASS_MAX.min(total / 4);
    let why = if most == PASS_MAX {
        format!("a read takes at most {}", human_bytes(PASS_MAX as f64))
    } else {
        format!(
            "a read takes at most a quarter of --memory {}",
            human_bytes(total as f64)
        )
    };
    (most, why)
}

/// Takes from the daemon's budgets the memory a pass of `opts` over `ds` needs (at most
/// [`PASS_MAX`], a quarter of `--memory`, or what is free) and sets `opts.memory` to it;
/// for two-pass, also the scratch its plan needs, from `--scratch-limit` and from the
/// free space of the filesystem under `scratch_dir` (a reservation, so concurrent passes
/// never plan for the same free bytes). `too_large` when it can never fit, `busy` when
/// it did not fit within `--admit-wait`.
///
/// `view` is what the OPEN took for a mixture epoch's draws before it drew them
/// ([`admit_view`]): part of the pass's memory, so only the rest is taken. `part` is
/// what a held copy of the files' first bytes holds apart from the pass (charged with the
/// copy): the pass's piles (`two_pass`) are then those of the rest. `kept`: scratch the
/// pass already holds (piles rolled for it by an earlier pass, which keep their
/// reservation): only the rest of its need is taken.
pub(super) fn admit_pass(
    b: &Budgets<'_>,
    ds: &Dataset,
    opts: &mut ReadOptions,
    (two_pass, part, kept): (Option<&std::path::Path>, u64, u64),
    view: Option<Grant>,
) -> std::result::Result<Admitted, Refusal> {
    // The open files first: a read given fewer files reads at a lower queue depth, and
    // needs less memory.
    let files = admit_files(b, ds, opts, two_pass.is_some())?;
    let o = opts.clone();
    let (most, why) = pass_most(b.memory.total());
    let v = view.as_ref().map_or(0, Grant::bytes);
    let memory = b.memory.take(
        Ask {
            what: "a read of this job",
            most: (most.saturating_sub(v), &why),
            fit: |free| match pass_needs(ds, &o, (two_pass.is_some(), part), most.min(free + v)) {
                Ok(n) => Ok(n.saturating_sub(v)),
                Err(n) => Err(n.saturating_sub(v)),
            },
        },
        b.wait,
        b.stopping,
    )?;
    // The engine counts the dataset's index in its ceiling; the daemon holds it once.
    opts.memory = Some(memory.bytes() + v + ds.index_bytes());
    let Some(dir) = two_pass else {
        return Ok(Admitted {
            _memory: memory,
            _view: view,
            _files: files,
            scratch: ScratchHold::default(),
            rolled: None,
        });
    };
    let units = modes::lirs::units_for(ds, opts);
    let need = scratch_need(ds, &units, opts, part)?.saturating_sub(kept);
    let scratch = match b.scratch {
        Some(sb) => Some(sb.take(
            Ask {
                what: "the scratch piles of this job",
                most: (u64::MAX, ""),
                fit: |free| if need <= free { Ok(need) } else { Err(need) },
            },
            b.wait,
            b.stopping,
        )?),
        None => None,
    };
    let space = b.space.reserve(dir, need, b.wait, b.stopping)?;
    Ok(Admitted {
        _memory: memory,
        _view: view,
        _files: files,
        scratch: ScratchHold {
            _grant: scratch,
            space: Some(space),
        },
        rolled: None,
    })
}

/// Descriptors a pass holds besides its random reader's dataset files: LIRS its I/O ring
/// and one more; two-pass also its scatter's reader and files, its pile files (the plan's
/// `open_files`), and the pile store's rings, lock and owner files.
fn pass_files(ds: &Dataset, opts: &ReadOptions, two_pass: bool) -> u64 {
    const LIRS: u64 = 2;
    if !two_pass {
        return LIRS;
    }
    let units = modes::lirs::units_for(ds, opts);
    let d = modes::demand(ds, &units, opts);
    let piles = crate::resources::two_pass(&d, &crate::resources::Limits::here(None))
        .map_or(16 + 2 * 16, |p| p.open_files);
    LIRS + 6 + piles
}

/// Takes the open files a pass of `opts` over `ds` holds from the daemon's budget: its own
/// (see [`pass_files`]) and its random reader's dataset files: at most what a reader
/// keeps open by default ([`crate::dataset::open_file_cap`]) and its fair share (the
/// budget over `--max-clients`), down to two (the queue depth then cut to fit: a file per
/// read in flight, and one more). Sets the read's
/// open-file cap and queue depth to what it was given.
fn admit_files(
    b: &Budgets<'_>,
    ds: &Dataset,
    opts: &mut ReadOptions,
    two_pass: bool,
) -> std::result::Result<Grant, Refusal> {
    let own = pass_files(ds, opts, two_pass);
    let data = ds.files().len() as u64;
    let depth = opts.io.depth.max(1) as u64;
    let fair = (b.files.ceiling() / b.clients.max(1)).saturating_sub(own);
    let least = own + data.min(2);
    let cap = crate::dataset::open_file_cap() as u64;
    let want = (own + data.min(cap).min(fair)).max(least);
    let grant = b.files.take(
        Ask {
            what: "the open files of a read of this job",
            most: (u64::MAX, ""),
            fit: |free| {
                if free >= least {
                    Ok(want.min(free))
                } else {
                    Err(least)
                }
            },
        },
        b.wait,
        b.stopping,
    )?;
    let reader = grant.bytes() - own;
    if reader < data {
        // A file per read in flight: the depth fits the files it may hold.
        let depth = usize::try_from(reader.saturating_sub(1).clamp(1, depth)).unwrap_or(1);
        opts.io.depth = depth;
        opts.open_files = Some(usize::try_from(reader).unwrap_or(usize::MAX));
    }
    Ok(grant)
}

/// Takes the memory a mixture epoch's draws will hold (8 bytes a record, and 4 for its
/// label) before the OPEN draws them to size its read: 160 MB for an epoch of 20 million,
/// and OPENs drawing theirs while waiting for admission held several times `--memory`.
/// `None` for a dataset.
pub(super) fn admit_view(
    b: &Budgets<'_>,
    src: &crate::source::Source,
) -> std::result::Result<Option<Grant>, Refusal> {
    let Some(m) = src.mixture() else {
        return Ok(None);
    };
    let per = 8 + if m.sources.labels().is_some() { 4 } else { 0 };
    let need = m.size().saturating_mul(per);
    let (most, why) = pass_most(b.memory.total());
    b.memory
        .take(
            Ask {
                what: "a mixture epoch's draws for this job",
                most: (most, &why),
                fit: |free| if need <= free { Ok(need) } else { Err(need) },
            },
            b.wait,
            b.stopping,
        )
        .map(Some)
}

/// The scratch bytes a two-pass read of `ds` with `opts` plans for (of the rest, when a
/// copy holds the files' first `part` bytes).
fn scratch_need(
    ds: &Dataset,
    units: &crate::order::Units,
    opts: &ReadOptions,
    part: u64,
) -> std::result::Result<u64, Refusal> {
    let need = match part {
        0 => modes::twopass::needs(ds, units, opts).map(|n| n.1),
        _ => modes::prefix_needs(ds, opts, part).map(|n| n.1),
    };
    need.map_err(|e| (super::codes::reply_code(&e), e.to_string()))
}

/// What a pass of `opts` over `ds` needs in memory when given at most `cap`, leaving out
/// the dataset's index (the daemon holds it once for all): `Ok(bytes)`, or `Err` with the
/// least it would need when `cap` is too small for it. `(two_pass, part)`: whether it
/// reads through piles, and what a held copy of the files' first bytes holds apart from
/// it (its piles are then the rest's).
pub(super) fn pass_needs(
    ds: &Dataset,
    opts: &ReadOptions,
    (two_pass, part): (bool, u64),
    cap: u64,
) -> std::result::Result<u64, u64> {
    let needs = |cap: u64| -> Option<u64> {
        let o = ReadOptions {
            memory: Some(cap),
            ..opts.clone()
        };
        let units = modes::lirs::units_for(ds, &o);
        let n = if two_pass && part > 0 {
            modes::prefix_needs(ds, &o, part).ok()?.0
        } else if two_pass {
            modes::twopass::needs(ds, &units, &o).ok()?.0
        } else {
            modes::lirs::memory_needs(ds, &units, &o).ok()?
        };
        Some(n.saturating_sub(ds.index_bytes()))
    };
    match needs(cap) {
        Some(n) => Ok(n.min(cap)),
        // Too little: the least that works, found by doubling (for the message).
        None => {
            let mut c = cap.max(1 << 20);
            while c < PASS_MAX * 4 {
                c *= 2;
                if let Some(n) = needs(c) {
                    return Err(n.min(c));
                }
            }
            Err(c)
        }
    }
}
