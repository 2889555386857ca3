//! The body of a two-pass pile frame (the pile store frames it; see `piles::frame`): its
//! format, written by the scatter with [`Body::encode`], and its two readers, the pile
//! pass ([`emit_frames`]) and the re-scatter ([`rescatter`]).

use super::super::emit::Emitter;
use super::held::HeldPart;
use crate::order::{EpochKey, Units};
use crate::piles::{frame, PileWriter};
use crate::pipeline::Stop;
use crate::resources::piles::{FRAME_HEAD, MAX_FRAME_RECORDS};
use crate::{Error, Result};

// The resource plan sizes frames with these: they must be this file's frame format.
const _: () = assert!(FRAME_HEAD == (frame::HEAD + BODY_HEAD) as u64);

/// Bytes of a two-pass frame body's head: the unit id (u64) and a u32 word holding the
/// record count, with [`WIDE`] set when the record lengths that follow are u64 rather than
/// u32. Then come the lengths (little-endian, like the rest) and the records' bytes.
const BODY_HEAD: usize = 8 + 4;

/// Set in a body's count word when its record lengths are u64: a unit holding a record of
/// 4 GiB or more. Other frames keep u32 lengths, so piles of small records stay small.
const WIDE: u32 = 1 << 31;

const _: () = assert!(MAX_FRAME_RECORDS == WIDE as u64 - 1);

/// A two-pass frame's body head, parsed: the scatter writes it with [`Body::encode`], the
/// pile pass and the re-scatter read it with [`Body::parse`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Body {
    unit: u64,
    /// Records in the frame.
    n: usize,
    /// Whether the lengths are u64.
    wide: bool,
}

impl Body {
    /// Appends the body head of `unit` and its records' lengths to `out` (the caller
    /// appends the records' bytes); returns the whole body's length. The unit has at most
    /// [`MAX_FRAME_RECORDS`] records (`PilePlan::new` checks it before any I/O).
    pub(super) fn encode(
        out: &mut Vec<u8>,
        unit: u64,
        lens: impl Iterator<Item = u64> + Clone,
    ) -> u64 {
        let (n, longest, total) = lens
            .clone()
            .fold((0u64, 0u64, 0u64), |(n, m, t), l| (n + 1, m.max(l), t + l));
        debug_assert!(n <= MAX_FRAME_RECORDS, "a unit of {n} records");
        let wide = longest > u32::MAX as u64;
        let start = out.len();
        out.extend_from_slice(&unit.to_le_bytes());
        out.extend_from_slice(&(n as u32 | if wide { WIDE } else { 0 }).to_le_bytes());
        for l in lens {
            if wide {
                out.extend_from_slice(&l.to_le_bytes());
            } else {
                out.extend_from_slice(&(l as u32).to_le_bytes());
            }
        }
        (out.len() - start) as u64 + total
    }

    /// The head of a body, or `None` when it is too short to hold its lengths.
    #[inline]
    fn parse(body: &[u8]) -> Option<Body> {
        let word = u32::from_le_bytes(body.get(8..12)?.try_into().expect("4 bytes"));
        let b = Body {
            unit: u64::from_le_bytes(body[..8].try_into().expect("8 bytes")),
            n: (word & !WIDE) as usize,
            wide: word & WIDE != 0,
        };
        (body.len() >= BODY_HEAD + b.lens_bytes()).then_some(b)
    }

    /// Bytes of the lengths after the head.
    #[inline]
    fn lens_bytes(&self) -> usize {
        self.n * if self.wide { 8 } else { 4 }
    }

    /// Length `i` from the body's lengths.
    #[inline]
    fn len(&self, lens: &[u8], i: usize) -> usize {
        if self.wide {
            u64::from_le_bytes(lens[i * 8..i * 8 + 8].try_into().expect("8 bytes")) as usize
        } else {
            u32::from_le_bytes(lens[i * 4..i * 4 + 4].try_into().expect("4 bytes")) as usize
        }
    }
}

/// The count word of a skip frame: a unit this node does not read this epoch (a streamed
/// read keeps only its streams' units, `scan::wanted_units`), or one held in memory (a
/// partly resident read's, `held`). Its body is the head alone,
/// which no frame of records can be (a count this large has lengths after it).
const SKIPPED: u32 = u32::MAX;

/// Appends the body of the skip frame of `unit` to `out`.
pub(super) fn encode_skip(out: &mut Vec<u8>, unit: u64) {
    out.extend_from_slice(&unit.to_le_bytes());
    out.extend_from_slice(&SKIPPED.to_le_bytes());
}

/// The unit of a skip frame's body, if it is one.
fn skipped(body: &[u8]) -> Option<u64> {
    (body.len() == BODY_HEAD && body[8..12] == SKIPPED.to_le_bytes())
        .then(|| u64::from_le_bytes(body[..8].try_into().expect("8 bytes")))
}

/// A frame whose body does not hold what its head says (the scratch was changed).
fn damaged(what: &str) -> Error {
    Error::Internal(format!(
        "a two-pass pile frame is damaged ({what}); was the scratch directory changed?"
    ))
}

/// Re-scatters a loaded pile's frames, in the order they lie in memory (sequential, so
/// cheap), into the next epoch's piles under their new keys. Gives up (`Ok`, the next
/// piles left partial) once `stop` is set, checked every megabyte.
pub(super) fn rescatter(
    data: &[u8],
    sink: &mut PileWriter,
    key: &EpochKey,
    stop: &Stop,
) -> Result<()> {
    const CHECK_EVERY: usize = 1 << 20;
    let mut at = 0;
    let mut check_at = 0;
    while at < data.len() {
        if at >= check_at {
            if stop.is_set() {
                return Ok(());
            }
            check_at = at + CHECK_EVERY;
        }
        let f = match frame::parse(data, at) {
            frame::Parsed::Whole(f) => f,
            _ => {
                return Err(damaged(&format!(
                    "a loaded pile ends inside a frame at byte {at}"
                )))
            }
        };
        let body = &data[f.body..f.end];
        // A skip frame (a unit held in memory) keeps its place under its new key too.
        let unit = match skipped(body) {
            Some(u) => u,
            None => {
                Body::parse(body)
                    .ok_or_else(|| damaged("a body shorter than its head"))?
                    .unit
            }
        };
        sink.frame(key.key(unit), &[body])?;
        at = f.end;
    }
    Ok(())
}

/// Emits the records of a pile's frames in key order (`frames` from the loader, so every
/// one is whole).
pub(super) fn emit_frames(
    data: &[u8],
    frames: &[(u64, usize)],
    units: &Units,
    held: Option<&HeldPart<'_>>,
    em: &mut Emitter<'_>,
) -> Result<()> {
    // Frames are visited in key order, all over the pile: ask for the next ones' lines
    // early so their cache misses overlap this one's copying.
    const AHEAD: usize = 8;
    for (i, &(_, at)) in frames.iter().enumerate() {
        if let Some(&(_, ahead)) = frames.get(i + AHEAD) {
            // Its first kilobyte: the hardware prefetcher follows on within longer frames.
            for line in (ahead..data.len().min(ahead + 1024)).step_by(64) {
                crate::io::prefetch(&data[line..]);
            }
        }
        let f = frame::at(data, at);
        let body = &data[f.body..f.end];
        if let Some(unit) = skipped(body) {
            if unit >= units.len() {
                return Err(damaged(&format!("unit {unit} of {}", units.len())));
            }
            if let Some(h) = held {
                // Held in memory: its records in their place, out of the held part.
                for id in units.records(unit) {
                    let rec = h.record(id).ok_or_else(|| {
                        damaged(&format!("a skip frame of unit {unit}, which is not held"))
                    })?;
                    em.push(id, rec);
                }
                if em.stopped {
                    return Ok(());
                }
                continue;
            }
            for id in units.records(unit) {
                if em.pass(id) {
                    return Err(Error::Internal(format!(
                        "record {id} is in this read's batches but its unit was left out of \
                         the piles"
                    )));
                }
            }
            continue;
        }
        let b = Body::parse(body).ok_or_else(|| damaged("a body shorter than its head"))?;
        if b.unit >= units.len() {
            return Err(damaged(&format!("unit {} of {}", b.unit, units.len())));
        }
        let records = units.records(b.unit);
        if records.end - records.start != b.n as u64 {
            return Err(damaged(&format!("unit {} with {} records", b.unit, b.n)));
        }
        let lens = &body[BODY_HEAD..BODY_HEAD + b.lens_bytes()];
        let mut off = BODY_HEAD + lens.len();
        for (i, id) in records.enumerate() {
            let len = b.len(lens, i);
            let Some(rec) = off.checked_add(len).and_then(|end| body.get(off..end)) else {
                return Err(damaged("record lengths past the frame's end"));
            };
            em.push(id, rec);
            off += len;
        }
        if em.stopped {
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
