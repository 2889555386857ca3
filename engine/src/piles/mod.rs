//! What piles (two-pass and `shuffle`) share. For now: how many piles a run may open at
//! once. Each pile writer holds its file and its ring open while it is written, so the
//! pile count is capped by the soft open-file limit; a pile over its memory share is read
//! back in key sub-ranges, so fewer piles cost passes, never correctness.

/// Open files a pile writer may hold: its file, its ring, and one to spare.
pub(crate) const FDS_PER_PILE: u64 = 3;

/// Open files kept for everything else a run holds (the dataset's files, the reader's and
/// the scatter's rings, the output, stdio).
const RESERVED_FDS: u64 = 96;

/// The most pile bits (`1 << bits` piles) a run may use: `ceiling`, or fewer so that the
/// pile writers fit the soft open-file limit (`ulimit -n`).
pub(crate) fn max_pile_bits(ceiling: u32) -> u32 {
    match open_file_limit() {
        Some(limit) => bits_within(limit, ceiling),
        None => ceiling,
    }
}

fn bits_within(limit: u64, ceiling: u32) -> u32 {
    let piles = (limit.saturating_sub(RESERVED_FDS) / FDS_PER_PILE).max(1);
    (63 - piles.leading_zeros()).min(ceiling)
}

/// The soft limit on open files, from `/proc/self/limits` (None when unlimited or unknown).
fn open_file_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_limits(&text)
}

fn parse_limits(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pile_count_fits_the_open_file_limit() {
        assert_eq!(bits_within(256, 12), 5, "(256 - 96) / 3 = 53 piles: 32");
        assert_eq!(bits_within(1024, 12), 8);
        assert_eq!(bits_within(1 << 20, 12), 12);
        assert_eq!(bits_within(10, 12), 0, "one pile at least");
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            256                  524288               files     \n";
        assert_eq!(parse_limits(limits), Some(256));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_limits(unlimited), None);
    }
}
