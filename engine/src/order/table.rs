//! The per-epoch random-assignment table (the LIRS paper's, section 4.1): the units of an
//! epoch sorted by their keys. At most 4 bytes per unit when unit ids fit in u32, 8
//! otherwise; built by bucketing on the top bits of the key and sorting each small bucket,
//! on every core.

use super::{EpochKey, IdVec};

/// The units of one epoch in delivery order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochTable {
    order: IdVec,
}

/// Units per bucket the build aims for: small enough to sort in cache.
const BUCKET_TARGET: u64 = 1024;

impl EpochTable {
    /// Sorts units `0..n` by `key`.
    pub fn build(n: u64, key: &EpochKey) -> Self {
        let bits = if n <= BUCKET_TARGET {
            0
        } else {
            (n / BUCKET_TARGET)
                .next_power_of_two()
                .trailing_zeros()
                .min(24)
        };
        let bucket = |k: u64| {
            if bits == 0 {
                0
            } else {
                (k >> (64 - bits)) as usize
            }
        };
        let nb = 1usize << bits;
        let mut starts = vec![0usize; nb + 1];
        for u in 0..n {
            starts[bucket(key.key(u)) + 1] += 1;
        }
        for b in 0..nb {
            starts[b + 1] += starts[b];
        }
        let mut order = IdVec::zeros(n.saturating_sub(1), n as usize);
        let mut next = starts.clone();
        for u in 0..n {
            let b = bucket(key.key(u));
            match &mut order {
                IdVec::U32(v) => v[next[b]] = u as u32,
                IdVec::U64(v) => v[next[b]] = u,
            }
            next[b] += 1;
        }
        // Sort each bucket by key; buckets are independent, so split them over threads.
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(nb)
            .max(1);
        match &mut order {
            IdVec::U32(v) => sort_buckets(v, &starts, key, threads),
            IdVec::U64(v) => sort_buckets(v, &starts, key, threads),
        }
        EpochTable { order }
    }

    /// The first entries of the table of units `0..n` by `key`, at most `max` of them (all
    /// `n` when `max >= n`): the units whose keys fall below a threshold that `max` units
    /// are unlikely to pass, sorted by key, cut at `max`. Exactly `build(n, key)`'s first
    /// entries, in one pass over the keys and a sort of the few kept, in memory for those
    /// only: what a read needs to start an epoch before the whole table is worth building
    /// (the first batches of a two-pass read, taken with LIRS while the scatter runs).
    ///
    /// `cancelled` is asked every million units; when it says so, `None` is returned.
    pub fn prefix(n: u64, key: &EpochKey, max: u64, cancelled: &dyn Fn() -> bool) -> Option<Self> {
        if max >= n {
            return Some(Self::build(n, key));
        }
        // Keys are uniform over u64: the count below `t` is binomial, mean n·t/2^64 = max;
        // the few over are cut after the sort.
        let t = ((max as f64 / n as f64) * 2f64.powi(64)).min(u64::MAX as f64) as u64;
        let order = if n - 1 <= u32::MAX as u64 {
            IdVec::U32(prefix_of(n, key, t, max, cancelled)?)
        } else {
            IdVec::U64(prefix_of(n, key, t, max, cancelled)?)
        };
        Some(EpochTable { order })
    }

    /// Number of units.
    pub fn len(&self) -> u64 {
        self.order.len() as u64
    }

    /// Whether there are no units.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The unit at position `i` of the epoch.
    #[inline]
    pub fn unit_at(&self, i: u64) -> u64 {
        self.order.get(i as usize)
    }

    /// Bytes of memory the table holds.
    pub fn bytes(&self) -> u64 {
        self.order.bytes()
    }
}

trait Id: Copy + Send + Ord {
    fn wide(self) -> u64;
    /// An id known to fit.
    fn narrow(u: u64) -> Self;
}
impl Id for u32 {
    fn wide(self) -> u64 {
        self as u64
    }
    fn narrow(u: u64) -> Self {
        u as u32
    }
}
impl Id for u64 {
    fn wide(self) -> u64 {
        self
    }
    fn narrow(u: u64) -> Self {
        u
    }
}

/// The units of `0..n` whose keys are under `t`, sorted by key, at most `max`: kept in one
/// pass over the keys, spread into buckets of about [`BUCKET_TARGET`] by key (a counting
/// sort), each bucket sorted. Two ids of memory per unit kept; `cancelled` is asked every
/// million keys and every 256 buckets.
fn prefix_of<T: Id>(
    n: u64,
    key: &EpochKey,
    t: u64,
    max: u64,
    cancelled: &dyn Fn() -> bool,
) -> Option<Vec<T>> {
    let mut keep: Vec<T> = Vec::with_capacity(max as usize);
    for u in 0..n {
        if u % (1 << 20) == 0 && cancelled() {
            return None;
        }
        if key.key(u) < t {
            keep.push(T::narrow(u));
        }
    }
    let nb = (keep.len() as u64 / BUCKET_TARGET)
        .max(1)
        .next_power_of_two();
    let span = t / nb + 1;
    let bucket = |u: T| (key.key(u.wide()) / span) as usize;
    let mut starts = vec![0usize; nb as usize + 1];
    for &u in &keep {
        starts[bucket(u) + 1] += 1;
    }
    for b in 0..nb as usize {
        starts[b + 1] += starts[b];
    }
    let mut next = starts.clone();
    let mut order = keep.clone();
    for &u in &keep {
        let b = bucket(u);
        order[next[b]] = u;
        next[b] += 1;
    }
    drop(keep);
    let mut tmp: Vec<(u64, T)> = Vec::new();
    for (i, w) in starts.windows(2).enumerate() {
        if i % 256 == 0 && cancelled() {
            return None;
        }
        let part = &mut order[w[0]..w[1]];
        tmp.clear();
        tmp.extend(part.iter().map(|&u| (key.key(u.wide()), u)));
        tmp.sort_unstable_by_key(|&(k, _)| k);
        for (slot, &(_, u)) in part.iter_mut().zip(&tmp) {
            *slot = u;
        }
    }
    order.truncate(max as usize);
    Some(order)
}

fn sort_buckets<T: Id>(v: &mut [T], starts: &[usize], key: &EpochKey, threads: usize) {
    let nb = starts.len() - 1;
    let per = nb.div_ceil(threads);
    std::thread::scope(|s| {
        let mut rest = v;
        let mut consumed = 0usize;
        for t in 0..threads {
            let (b0, b1) = (t * per, ((t + 1) * per).min(nb));
            if b0 >= b1 {
                break;
            }
            let (mine, tail) = rest.split_at_mut(starts[b1] - consumed);
            rest = tail;
            let base = consumed;
            consumed = starts[b1];
            let bounds = &starts[b0..=b1];
            // A thread the system refuses (RLIMIT_NPROC, no memory) is no error: this
            // share is sorted here instead, the same result a little later.
            // The share is handed over once the thread exists, so a failed spawn has
            // not taken it.
            let (give, take) = std::sync::mpsc::sync_channel::<&mut [T]>(1);
            let spawned = std::thread::Builder::new()
                .name("riffle-sort".into())
                .spawn_scoped(s, move || {
                    if let Ok(mine) = take.recv() {
                        sort_share(mine, base, bounds, key)
                    }
                });
            match spawned {
                Ok(_) => {
                    // The thread holds the receiver until it has the share.
                    let _ = give.send(mine);
                }
                Err(_) => sort_share(mine, base, bounds, key),
            }
        }
    });
}

/// Sorts each bucket of `mine` (the buckets between `bounds`, `base` being where `mine`
/// starts in the whole table) by its key.
fn sort_share<T: Id>(mine: &mut [T], base: usize, bounds: &[usize], key: &EpochKey) {
    let mut tmp: Vec<(u64, T)> = Vec::new();
    for w in bounds.windows(2) {
        let bucket = &mut mine[w[0] - base..w[1] - base];
        tmp.clear();
        tmp.extend(bucket.iter().map(|&u| (key.key(u.wide()), u)));
        tmp.sort_unstable_by_key(|&(k, _)| k);
        for (slot, &(_, u)) in bucket.iter_mut().zip(&tmp) {
            *slot = u;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_the_argsort_of_the_keys() {
        for n in [0u64, 1, 5, 1000, 1025, 50_000] {
            let key = EpochKey::new(42, 3);
            let t = EpochTable::build(n, &key);
            let mut want: Vec<u64> = (0..n).collect();
            want.sort_by_key(|&u| key.key(u));
            let got: Vec<u64> = (0..n).map(|i| t.unit_at(i)).collect();
            assert_eq!(got, want, "n = {n}");
        }
    }

    /// Each record's position over many epochs is uniform: a chi-square test of the
    /// (record, position) counts, 10 records, 20 000 epochs, 81 degrees of freedom.
    #[test]
    fn positions_are_uniform_chi_square() {
        let n = 10u64;
        let epochs = 20_000u64;
        let mut counts = vec![[0u64; 10]; 10];
        for e in 0..epochs {
            let t = EpochTable::build(n, &EpochKey::new(7, e));
            for pos in 0..n {
                counts[t.unit_at(pos) as usize][pos as usize] += 1;
            }
        }
        let expected = epochs as f64 / n as f64;
        let chi2: f64 = counts
            .iter()
            .flatten()
            .map(|&c| (c as f64 - expected).powi(2) / expected)
            .sum();
        // The 0.999 quantile of chi-square with 81 degrees of freedom is about 124.8.
        assert!(
            chi2 < 124.8,
            "chi-square {chi2:.1} says the order is not uniform"
        );
        // And not suspiciously perfect either (the 0.001 quantile is about 47.1).
        assert!(
            chi2 > 47.1,
            "chi-square {chi2:.1} is too regular to be random"
        );
    }

    /// Adjacent records stay together no more often than chance: over many epochs, how
    /// often record i is followed directly by record i + 1 (chance: 1 / n).
    #[test]
    fn neighbours_do_not_stick_together() {
        let n = 1000u64;
        let mut follows = 0u64;
        let epochs = 200;
        for e in 0..epochs {
            let t = EpochTable::build(n, &EpochKey::new(1, e));
            for p in 1..n {
                if t.unit_at(p) == t.unit_at(p - 1) + 1 {
                    follows += 1;
                }
            }
        }
        let rate = follows as f64 / (epochs as f64 * (n - 1) as f64);
        assert!(
            (rate - 1.0 / n as f64).abs() < 0.5 / n as f64,
            "neighbour rate {rate}"
        );
    }

    #[test]
    fn a_prefix_is_the_start_of_the_whole_table() {
        for (n, max) in [
            (0u64, 0u64),
            (10, 3),
            (10, 10),
            (10, 20),
            (50_000, 1),
            (50_000, 700),
            (200_000, 10_000),
        ] {
            let key = EpochKey::new(9, 2);
            let full = EpochTable::build(n, &key);
            let p = EpochTable::prefix(n, &key, max, &|| false).unwrap();
            assert!(
                p.len() <= max.min(n),
                "n = {n}, max = {max}: {} entries",
                p.len()
            );
            // Close to the most asked for (the threshold aims six deviations under it).
            let floor = (max.min(n) as f64 - 7.0 * (max as f64).sqrt() - 1.0).max(0.0);
            assert!(
                p.len() as f64 >= floor,
                "n = {n}, max = {max}: only {}",
                p.len()
            );
            for i in 0..p.len() {
                assert_eq!(
                    p.unit_at(i),
                    full.unit_at(i),
                    "n = {n}, max = {max}, entry {i}"
                );
            }
        }
    }

    #[test]
    fn a_cancelled_prefix_is_none() {
        assert!(EpochTable::prefix(3 << 20, &EpochKey::new(1, 1), 10, &|| true).is_none());
    }

    #[test]
    fn four_bytes_per_unit() {
        let t = EpochTable::build(10_000, &EpochKey::new(0, 0));
        assert_eq!(t.bytes(), 40_000);
    }
}
