//! Sorting by keys that are uniformly spread over their range, as the order contract's keys
//! are (they come from a keyed bijection): one counting pass into about one bucket per
//! item, then an insertion sort that only moves items within their bucket. Linear time,
//! against n log n for a comparison sort; the pile passes sort millions of keys per epoch.

/// Sorts `items` by `key` (ties in any order). `scratch` is working memory, kept by the
/// caller between calls.
pub fn sort_uniform<T: Copy + Default>(
    items: &mut Vec<T>,
    scratch: &mut Vec<T>,
    key: impl Fn(&T) -> u64,
) {
    let n = items.len();
    if n < 256 {
        items.sort_unstable_by_key(&key);
        return;
    }
    let lo = items.iter().map(&key).min().expect("items");
    let hi = items.iter().map(&key).max().expect("items");
    // Bucket = the top `bits` bits of (key - lo): below `buckets` since hi - lo is.
    let bits = n.next_power_of_two().trailing_zeros();
    let width = 64 - (hi - lo).leading_zeros();
    let shift = width.saturating_sub(bits);
    let buckets = 1usize << width.min(bits);
    let bucket = |t: &T| ((key(t) - lo) >> shift) as usize;
    let mut counts = vec![0u32; buckets + 1];
    for t in items.iter() {
        counts[bucket(t) + 1] += 1;
    }
    // Far from uniform (not expected of these keys): a comparison sort keeps the worst
    // case at n log n.
    if counts.iter().any(|&c| c > 64) {
        items.sort_unstable_by_key(&key);
        return;
    }
    for i in 1..counts.len() {
        counts[i] += counts[i - 1];
    }
    scratch.clear();
    scratch.resize(n, T::default());
    for &t in items.iter() {
        let b = bucket(&t);
        scratch[counts[b] as usize] = t;
        counts[b] += 1;
    }
    for i in 1..n {
        let t = scratch[i];
        let k = key(&t);
        let mut j = i;
        while j > 0 && key(&scratch[j - 1]) > k {
            scratch[j] = scratch[j - 1];
            j -= 1;
        }
        scratch[j] = t;
    }
    std::mem::swap(items, scratch);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::order::EpochKey;

    /// The bucket sort agrees with a comparison sort, for uniform keys, narrow key ranges
    /// and keys far from uniform (the fallback).
    #[test]
    fn frames_sort_by_key() {
        let key = EpochKey::new(9, 4);
        let cases: Vec<Vec<u64>> = vec![
            (0..100_000u64).map(|u| key.key(u)).collect(),
            (0..5000u64).map(|u| key.key(u) >> 40).collect(),
            (0..3000u64)
                .map(|u| if u % 2 == 0 { u } else { u64::MAX - u })
                .collect(),
            (0..300u64).map(|u| 7 + (key.key(u) & 1)).collect(),
            vec![5; 1000],
        ];
        for keys in cases {
            let mut frames: Vec<(u64, usize)> = keys.iter().copied().zip(0..).collect();
            let mut want = frames.clone();
            want.sort_by_key(|&(k, at)| (k, at));
            let mut scratch = Vec::new();
            sort_uniform(&mut frames, &mut scratch, |f| f.0);
            assert!(
                frames.windows(2).all(|w| w[0].0 <= w[1].0),
                "not in key order"
            );
            // The same frames (ties may come in any order).
            frames.sort_by_key(|&(k, at)| (k, at));
            assert_eq!(frames, want);
        }
    }
}
