//! The daemon's one memory budget (`--memory`): the datasets' indexes, every stream's
//! ring and every engine pass's memory (tables, buffers, read-ahead, piles) are taken from
//! it, and given back when the ring or the pass goes. A request that does not fit waits a
//! bounded time for room, then is refused (`busy`, with the numbers).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::dataset::Dataset;
use crate::modes::{self, ReadOptions};
use crate::size::human_bytes;

/// Bytes of `--memory` in use, and the total.
pub(super) struct Budget {
    total: u64,
    used: Mutex<u64>,
    freed: Condvar,
}

/// Bytes taken from a [`Budget`], given back when dropped.
pub(super) struct Grant {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Grant {
    /// Bytes held.
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

impl Budget {
    /// A budget of `total` bytes, `base` of them in use for good (the datasets' indexes).
    pub(super) fn new(total: u64, base: u64) -> Arc<Budget> {
        Arc::new(Budget {
            total,
            used: Mutex::new(base.min(total)),
            freed: Condvar::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        self.used.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The total.
    pub(super) fn total(&self) -> u64 {
        self.total
    }

    /// Bytes in use now.
    pub(super) fn used(&self) -> u64 {
        *self.lock()
    }

    /// Takes what `fit` asks for: given the bytes free, `Ok(n)` (at most those) or `Err`
    /// with the least it needs. Waits up to `wait` for room (woken as grants are given
    /// back; `stopping` ends the wait), then returns the error: `what` needs so much, so
    /// much is free.
    pub(super) fn take(
        self: &Arc<Self>,
        what: &str,
        wait: Duration,
        stopping: &AtomicBool,
        mut fit: impl FnMut(u64) -> std::result::Result<u64, u64>,
    ) -> std::result::Result<Grant, String> {
        let until = Instant::now() + wait;
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
            let now = Instant::now();
            if now >= until || stopping.load(Ordering::SeqCst) || least > self.total {
                return Err(format!(
                    "{what} needs {} of the daemon's memory and {} of its --memory {} is free{}: \
                     try again later, or start the daemon with more --memory",
                    human_bytes(least as f64),
                    human_bytes(free as f64),
                    human_bytes(self.total as f64),
                    if wait.is_zero() {
                        String::new()
                    } else {
                        format!(" after waiting {:.0} s", wait.as_secs_f64())
                    }
                ));
            }
            let used = self.lock();
            let _ = self
                .freed
                .wait_timeout(used, (until - now).min(LOOK_AGAIN))
                .unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// What an engine pass holds of the daemon's budgets: memory, and two-pass's scratch
/// when `--scratch-limit` is set. Given back when dropped.
pub(super) struct Admitted {
    _memory: Grant,
    _scratch: Option<Grant>,
}

/// Takes from the daemon's budget the memory a pass of `opts` over `ds` needs (at most
/// [`PASS_MAX`], a quarter of `--memory`, or what is free) and sets `opts.memory` to it;
/// for two-pass, also the scratch its plan needs from `--scratch-limit`. Waits up to
/// `--admit-wait` for room, else says what it needed and what was free.
pub(super) fn admit_pass(
    budgets: (&Arc<Budget>, Option<&Arc<Budget>>),
    wait: Duration,
    stopping: &AtomicBool,
    ds: &Dataset,
    opts: &mut ReadOptions,
    two_pass: bool,
) -> std::result::Result<Admitted, String> {
    let (budget, scratch_budget) = budgets;
    let o = opts.clone();
    let memory = budget.take("a read of this job", wait, stopping, |free| {
        let cap = PASS_MAX.min(budget.total() / 4).min(free);
        pass_needs(ds, &o, two_pass, cap)
    })?;
    // The engine counts the dataset's index in its ceiling; the daemon holds it once.
    opts.memory = Some(memory.bytes() + ds.index_bytes());
    let scratch = match (scratch_budget, two_pass) {
        (Some(sb), true) => {
            let units = modes::lirs::units_for(ds, opts);
            let need = modes::twopass::needs(ds, &units, opts)
                .map_err(|e| e.to_string())?
                .1;
            Some(
                sb.take("the scratch piles of this job", wait, stopping, |free| {
                    if need <= free {
                        Ok(need)
                    } else {
                        Err(need)
                    }
                })
                .map_err(|m| {
                    m.replace("--memory", "--scratch-limit")
                        .replace("memory", "scratch")
                })?,
            )
        }
        _ => None,
    };
    Ok(Admitted {
        _memory: memory,
        _scratch: scratch,
    })
}

/// What a pass of `opts` over `ds` needs in memory when given at most `cap`, leaving out
/// the dataset's index (the daemon holds it once for all): `Ok(bytes)`, or `Err` with the
/// least it would need when `cap` is too small for it.
pub(super) fn pass_needs(
    ds: &Dataset,
    opts: &ReadOptions,
    two_pass: bool,
    cap: u64,
) -> std::result::Result<u64, u64> {
    let needs = |cap: u64| -> Option<u64> {
        let o = ReadOptions {
            memory: Some(cap),
            ..opts.clone()
        };
        let units = modes::lirs::units_for(ds, &o);
        let n = if two_pass {
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
