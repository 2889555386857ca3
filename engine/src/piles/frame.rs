//! The pile frame: what the store knows of a record it holds. A frame is its key (u64), its
//! body's length, and the body, all little-endian:
//!
//! ```text
//! key: u64 | word: u32 | [len: u64 if word == WIDE] | body: len bytes
//! ```
//!
//! `word` is the body's length when it is below [`WIDE`]; a body of 2 GiB or more sets
//! `word` to [`WIDE`] and gives its length as a u64 next, so small frames stay small and no
//! length is ever cut. The body is the mode's own (`shuffle`: the record's bytes;
//! two-pass: the unit id, its record lengths and bytes); the store only keys, orders and
//! filters frames.

/// Bytes of a frame's head when its body is under 2 GiB.
pub(crate) const HEAD: usize = 12;

/// The head word of a frame whose body length follows as a u64.
const WIDE: u32 = u32::MAX;

/// Bytes of the head of a frame with a body of `len` bytes.
#[cfg(test)]
pub(crate) fn head_len(len: u64) -> usize {
    if len < WIDE as u64 {
        HEAD
    } else {
        HEAD + 8
    }
}

/// The head of a frame under `key` with a body of `len` bytes: the bytes to write before
/// the body, and how many of them there are.
#[inline]
pub(crate) fn head(key: u64, len: u64) -> ([u8; HEAD + 8], usize) {
    let mut h = [0u8; HEAD + 8];
    h[..8].copy_from_slice(&key.to_le_bytes());
    if len < WIDE as u64 {
        h[8..12].copy_from_slice(&(len as u32).to_le_bytes());
        (h, HEAD)
    } else {
        h[8..12].copy_from_slice(&WIDE.to_le_bytes());
        h[12..20].copy_from_slice(&len.to_le_bytes());
        (h, HEAD + 8)
    }
}

/// A whole frame found in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    /// Its key.
    pub key: u64,
    /// Where its body starts.
    pub body: usize,
    /// Where the next frame starts (the body's end).
    pub end: usize,
}

/// What `data[at..]` starts with: a whole frame, or how far it is from one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// A whole frame.
    Whole(Frame),
    /// `data` ends inside the frame.
    Partial,
    /// The frame's length runs past what any buffer could hold (a damaged pile).
    Damaged,
}

/// The frame starting at `at` in `data`.
#[inline]
pub(crate) fn parse(data: &[u8], at: usize) -> Parsed {
    let Some(h) = data.get(at..).filter(|r| r.len() >= HEAD) else {
        return Parsed::Partial;
    };
    let key = u64::from_le_bytes(h[..8].try_into().expect("8 bytes"));
    let word = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
    let (len, body) = if word == WIDE {
        match h.get(12..20) {
            Some(l) => (u64::from_le_bytes(l.try_into().expect("8 bytes")), at + 20),
            None => return Parsed::Partial,
        }
    } else {
        (word as u64, at + HEAD)
    };
    let Some(end) = usize::try_from(len)
        .ok()
        .and_then(|l| body.checked_add(l))
        .filter(|&e| e <= isize::MAX as usize)
    else {
        return Parsed::Damaged;
    };
    if end > data.len() {
        return Parsed::Partial;
    }
    Parsed::Whole(Frame { key, body, end })
}

/// The whole frame at `at` (the caller knows one is there: an index entry).
#[inline]
pub(crate) fn at(data: &[u8], at: usize) -> Frame {
    match parse(data, at) {
        Parsed::Whole(f) => f,
        other => panic!("no whole frame at byte {at} of a loaded pile: {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_and_wide_heads_parse_back() {
        for len in [0u64, 1, 4095, WIDE as u64 - 1, WIDE as u64, 5 << 30] {
            let (h, n) = head(0xABCD, len);
            assert_eq!(n, head_len(len));
            let mut data = h[..n].to_vec();
            if len < 1 << 20 {
                data.resize(n + len as usize, 7);
                assert_eq!(
                    parse(&data, 0),
                    Parsed::Whole(Frame {
                        key: 0xABCD,
                        body: n,
                        end: n + len as usize
                    })
                );
                assert_eq!(parse(&data[..data.len() - 1], 0), Parsed::Partial);
            } else {
                // The body is not there: a head that announces it is a partial frame.
                assert_eq!(parse(&data, 0), Parsed::Partial);
            }
        }
        let (h, n) = head(1, u64::MAX);
        assert_eq!(parse(&h[..n], 0), Parsed::Damaged);
    }
}
