//! The pile store that two-pass and `shuffle` share: frames (`frame.rs`: a key, a length
//! that may pass 4 GiB, a body) scattered by key into piles, written with direct I/O
//! through one ring into a few group files, and read back pile by pile in key order, whole
//! or in key sub-ranges, through another (`store.rs`). A run's open files do not grow with
//! its pile count: a set of piles holds at most [`store::MAX_GROUPS`] files, fewer when the
//! open-file limit is low.

pub(crate) mod frame;
pub(crate) mod store;

pub(crate) use store::{Layout, PileBuf, PileReader, PileSet, PileWriter};

/// Open files kept for everything else a run holds (the dataset's files, rings, the
/// output, stdio) when sizing group files against the open-file limit.
const RESERVED_FDS: u64 = 48;

/// log2 of the most group files a set of piles may hold open under a soft open-file limit
/// of `limit` (`ulimit -n`): 16, or fewer so that two sets (one being read, the next being
/// written) fit beside the rest of a run.
pub(crate) fn bits_within(limit: u64) -> u32 {
    let groups = (limit.saturating_sub(RESERVED_FDS) / 2).max(1);
    (63 - groups.leading_zeros()).min(store::MAX_GROUPS.trailing_zeros())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_files_fit_the_open_file_limit() {
        assert_eq!(bits_within(256), 4, "16 group files: 32 for two sets");
        assert_eq!(bits_within(64), 3, "(64 - 48) / 2 = 8");
        assert_eq!(bits_within(1 << 20), 4);
        assert_eq!(bits_within(10), 0, "one group file at least");
    }
}
