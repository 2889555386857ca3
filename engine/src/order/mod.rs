//! The order contract: which records form each batch of an epoch.
//!
//! The order of an epoch is a pure function of (dataset, seed, epoch, batch size, grouping,
//! unit). Records are grouped into shuffling units (a record, or with page grouping every
//! record that starts in one aligned block); each unit gets a key from a keyed bijective
//! hash of its id ([`EpochKey`]); the epoch's sequence is the units in key order, each
//! unit's records in file order; batches cut that sequence every B records, so a unit that
//! overflows a batch continues in the next. LIRS materialises the order as a table
//! ([`table::EpochTable`], the units sorted by key); a bounded-memory mode can realise the
//! same order from the keys alone (pile = top bits of the key, sort inside a pile).
//!
//! Ranks take global batches round robin ([`split::Split`]); the tail of an epoch is
//! dropped or padded only when asked.

pub mod sort;
pub mod split;
pub mod table;
pub mod units;

pub use sort::sort_uniform;
pub use split::{Split, Tail};
pub use table::EpochTable;
pub use units::{Grouping, RecordLayout, Units};

/// The per-epoch key of shuffling units: a keyed bijection of u64, so keys never tie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochKey {
    k1: u64,
    k2: u64,
}

/// The splitmix64 finaliser: a bijective 64-bit mixer.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl EpochKey {
    /// The key of `epoch` under `seed`.
    pub fn new(seed: u64, epoch: u64) -> Self {
        let k1 = mix(seed ^ 0x6a09_e667_f3bc_c908);
        let k2 = mix(k1 ^ mix(epoch.wrapping_add(0xbb67_ae85_84ca_a73b)));
        EpochKey { k1, k2 }
    }

    /// The key of unit `u`: mix(mix(u + k1) ^ k2), two rounds of a bijection, so distinct
    /// units never share a key and the order is a strict total order.
    #[inline]
    pub fn key(&self, unit: u64) -> u64 {
        mix(mix(unit.wrapping_add(self.k1)) ^ self.k2)
    }
}

/// A growable list of ids stored in 4 bytes each when every id fits in u32, 8 otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdVec {
    /// Ids below 2^32.
    U32(Vec<u32>),
    /// Any ids.
    U64(Vec<u64>),
}

impl IdVec {
    /// An empty list for ids up to `max_id`, with room for `cap`.
    pub fn with_capacity(max_id: u64, cap: usize) -> Self {
        if max_id <= u32::MAX as u64 {
            IdVec::U32(Vec::with_capacity(cap))
        } else {
            IdVec::U64(Vec::with_capacity(cap))
        }
    }

    /// A list of `len` zeros for ids up to `max_id`.
    pub fn zeros(max_id: u64, len: usize) -> Self {
        if max_id <= u32::MAX as u64 {
            IdVec::U32(vec![0; len])
        } else {
            IdVec::U64(vec![0; len])
        }
    }

    /// Appends an id.
    #[inline]
    pub fn push(&mut self, id: u64) {
        match self {
            IdVec::U32(v) => v.push(id as u32),
            IdVec::U64(v) => v.push(id),
        }
    }

    /// The id at `i`.
    #[inline]
    pub fn get(&self, i: usize) -> u64 {
        match self {
            IdVec::U32(v) => v[i] as u64,
            IdVec::U64(v) => v[i],
        }
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        match self {
            IdVec::U32(v) => v.len(),
            IdVec::U64(v) => v.len(),
        }
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of memory held.
    pub fn bytes(&self) -> u64 {
        match self {
            IdVec::U32(v) => v.capacity() as u64 * 4,
            IdVec::U64(v) => v.capacity() as u64 * 8,
        }
    }

    /// Bytes per id (4 or 8).
    pub fn width(&self) -> u64 {
        match self {
            IdVec::U32(_) => 4,
            IdVec::U64(_) => 8,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_differ_by_seed_and_epoch_and_never_tie() {
        let a = EpochKey::new(0, 0);
        assert_ne!(a, EpochKey::new(1, 0));
        assert_ne!(a, EpochKey::new(0, 1));
        let mut keys: Vec<u64> = (0..100_000).map(|u| a.key(u)).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), 100_000);
    }

    #[test]
    fn id_vec_picks_its_width() {
        assert_eq!(IdVec::with_capacity(10, 0).width(), 4);
        assert_eq!(IdVec::with_capacity(u32::MAX as u64 + 1, 0).width(), 8);
        let mut v = IdVec::with_capacity(1 << 40, 2);
        v.push(1 << 40);
        assert_eq!(v.get(0), 1 << 40);
    }
}
