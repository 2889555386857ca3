//! TFRecord framing: `u64 length`, `u32 masked CRC32C(length)`, `data`, `u32 masked
//! CRC32C(data)`, all little endian. The scanner walks the frames across chunk boundaries
//! and verifies both CRCs (unless told not to).

use super::{ScanError, Scanner};

/// The masked CRC32C TFRecord stores.
pub fn masked_crc(data: &[u8]) -> u32 {
    mask(crc32c::crc32c(data))
}

fn mask(crc: u32) -> u32 {
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Frames one record.
pub fn encode(data: &[u8], out: &mut Vec<u8>) {
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
}

enum State {
    /// Collecting the 12-byte header of the frame that starts at `start`.
    Header {
        start: u64,
        have: usize,
        buf: [u8; 12],
    },
    /// Inside the data of the frame at `start` (`len` bytes in all, length and CRCs
    /// included, saturating); `left` bytes of data to go.
    Data {
        start: u64,
        len: u64,
        left: u64,
        crc: u32,
    },
    /// Collecting the 4-byte data CRC.
    Footer {
        start: u64,
        len: u64,
        have: usize,
        buf: [u8; 4],
        crc: u32,
    },
}

/// The length of the frame at the front of `rest`, if it is all there and, when `verify`,
/// both its CRCs match. A frame that fails is left to the state machine, which reports it.
#[inline]
fn whole_frame(verify: bool, rest: &[u8]) -> Option<usize> {
    let (head, body) = rest.split_first_chunk::<12>()?;
    let len = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    let stored = u32::from_le_bytes(head[8..].try_into().expect("4 bytes"));
    if verify && masked_crc(&head[..8]) != stored {
        return None;
    }
    let len = usize::try_from(len).ok().filter(|&l| l <= body.len())?;
    let (data, footer) = body.split_at(len);
    let (crc, _) = footer.split_first_chunk::<4>()?;
    if verify && masked_crc(data) != u32::from_le_bytes(*crc) {
        return None;
    }
    Some(16 + len)
}

#[cold]
fn length_crc_error(start: u64, len: u64, stored: u32, field: &[u8]) -> ScanError {
    ScanError {
        offset: start + 8,
        what: format!(
            "TFRecord length CRC mismatch (length field says {len} bytes; stored CRC \
             {stored:#010x}, computed {:#010x})",
            masked_crc(field)
        ),
    }
}

#[cold]
fn data_crc_error(at: u64, start: u64, stored: u32, computed: u32) -> ScanError {
    ScanError {
        offset: at,
        what: format!(
            "TFRecord data CRC mismatch in the record that starts at byte {start} (stored \
             {stored:#010x}, computed {computed:#010x})"
        ),
    }
}

/// Finds frame starts, checking lengths and CRCs. A frame's end (the next one's start) is
/// reported once its data CRC is checked: the first start, 0, at once.
pub struct TfRecordScanner {
    verify: bool,
    state: State,
    starts: Vec<u64>,
}

impl TfRecordScanner {
    /// A scanner; `verify` checks both CRCs of every record.
    pub fn new(verify: bool) -> Self {
        TfRecordScanner {
            verify,
            state: State::Header {
                start: 0,
                have: 0,
                buf: [0; 12],
            },
            starts: vec![0],
        }
    }
}

impl Scanner for TfRecordScanner {
    fn feed(&mut self, offset: u64, chunk: &[u8]) -> Result<(), ScanError> {
        let mut i = 0usize;
        while i < chunk.len() {
            if let State::Header { start, have: 0, .. } = &mut self.state {
                // Frames wholly in the chunk are checked in place, without the copies of
                // the state machine below, which takes the frame split by the chunk's end.
                if let Some(n) = whole_frame(self.verify, &chunk[i..]) {
                    *start += n as u64;
                    self.starts.push(*start);
                    i += n;
                    continue;
                }
            }
            match &mut self.state {
                State::Header { start, have, buf } => {
                    let n = (12 - *have).min(chunk.len() - i);
                    buf[*have..*have + n].copy_from_slice(&chunk[i..i + n]);
                    *have += n;
                    i += n;
                    if *have == 12 {
                        let start = *start;
                        let len = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
                        let stored = u32::from_le_bytes(buf[8..].try_into().expect("4 bytes"));
                        if self.verify && masked_crc(&buf[..8]) != stored {
                            return Err(length_crc_error(start, len, stored, &buf[..8]));
                        }
                        self.state = State::Data {
                            start,
                            len: len.saturating_add(16),
                            left: len,
                            crc: 0,
                        };
                    }
                }
                State::Data {
                    start,
                    len,
                    left,
                    crc,
                } => {
                    let n = (*left).min((chunk.len() - i) as u64) as usize;
                    if self.verify {
                        *crc = crc32c::crc32c_append(*crc, &chunk[i..i + n]);
                    }
                    *left -= n as u64;
                    i += n;
                    if *left == 0 {
                        self.state = State::Footer {
                            start: *start,
                            len: *len,
                            have: 0,
                            buf: [0; 4],
                            crc: *crc,
                        };
                    }
                }
                State::Footer {
                    start,
                    have,
                    buf,
                    crc,
                    ..
                } => {
                    let n = (4 - *have).min(chunk.len() - i);
                    buf[*have..*have + n].copy_from_slice(&chunk[i..i + n]);
                    *have += n;
                    i += n;
                    if *have == 4 {
                        let stored = u32::from_le_bytes(*buf);
                        if self.verify && mask(*crc) != stored {
                            let at = offset + i as u64 - 4;
                            return Err(data_crc_error(at, *start, stored, mask(*crc)));
                        }
                        let next = offset + i as u64;
                        self.starts.push(next);
                        self.state = State::Header {
                            start: next,
                            have: 0,
                            buf: [0; 12],
                        };
                    }
                }
            }
        }
        Ok(())
    }

    fn finish(&mut self, size: u64) -> Result<(), ScanError> {
        match &self.state {
            // The last frame's end was reported when its CRC was checked.
            State::Header { have: 0, .. } => Ok(()),
            State::Header { start, have, .. } => Err(ScanError {
                offset: *start,
                what: format!("truncated TFRecord: a 12-byte header starts here but the file ends after {have} byte(s)"),
            }),
            State::Data { start, left, .. } => Err(ScanError {
                offset: *start,
                what: format!("truncated TFRecord: its data runs {} byte(s) past the end of the file (at {size})", left + 4),
            }),
            State::Footer { start, have, .. } => Err(ScanError {
                offset: *start,
                what: format!("truncated TFRecord: its data CRC is cut off ({have} of 4 bytes present)"),
            }),
        }
    }

    fn take_offsets(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.starts)
    }

    fn drain_offsets(&mut self, out: &mut Vec<u64>) {
        out.append(&mut self.starts);
    }

    fn known_len(&self) -> Option<(u64, u64)> {
        match self.state {
            State::Header { .. } => None,
            State::Data { start, len, .. } | State::Footer { start, len, .. } => Some((start, len)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(records: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for r in records {
            encode(r, &mut out);
        }
        out
    }

    fn scan(data: &[u8], chunk: usize) -> Result<Vec<u64>, ScanError> {
        let mut s = TfRecordScanner::new(true);
        for (i, c) in data.chunks(chunk).enumerate() {
            s.feed((i * chunk) as u64, c)?;
        }
        s.finish(data.len() as u64)?;
        Ok(s.take_offsets())
    }

    #[test]
    fn frames_any_chunking() {
        let data = file(&[b"hello", b"", b"world!!"]);
        for chunk in [1, 3, 7, 1000] {
            assert_eq!(
                scan(&data, chunk).unwrap(),
                vec![0, 21, 37, data.len() as u64]
            );
        }
    }

    #[test]
    fn known_crc() {
        // The masked CRC of an 8-byte zero length, as TensorFlow writes it for b"".
        assert_eq!(
            masked_crc(&0u64.to_le_bytes()),
            mask(crc32c::crc32c(&[0; 8]))
        );
        // CRC32C check value ("123456789" -> 0xe3069283).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn detects_corruption_and_truncation() {
        let data = file(&[b"hello", b"world"]);
        let mut bad_len = data.clone();
        bad_len[8] ^= 1;
        assert_eq!(scan(&bad_len, 5).unwrap_err().offset, 8);
        let mut bad_data = data.clone();
        bad_data[21 + 12] ^= 1; // first data byte of the second record
        let e = scan(&bad_data, 5).unwrap_err();
        assert!(
            e.what.contains("data CRC") && e.what.contains("byte 21"),
            "{e:?}"
        );
        let e = scan(&data[..data.len() - 2], 4).unwrap_err();
        assert_eq!(e.offset, 21);
        assert!(e.what.contains("truncated"));
        let e = scan(&data[..35], 4).unwrap_err();
        assert!(e.what.contains("past the end"), "{e:?}");
        let e = scan(&data[..25], 4).unwrap_err();
        assert!(e.what.contains("12-byte header"), "{e:?}");
    }

    /// Frames wholly in a chunk take the fast path, split ones the state machine: both
    /// give the same starts and the same errors at the same offsets.
    #[test]
    fn whole_and_split_frames_agree() {
        let data = file(&[b"hello", b"", &[9u8; 300], b"world"]);
        let mut spoiled = vec![data.clone()];
        for at in [3, 9, 21 + 12, 37 + 100, 37 + 313, data.len() - 1] {
            let mut b = data.clone();
            b[at] ^= 0x10;
            spoiled.push(b);
        }
        spoiled.push(data[..data.len() - 3].to_vec());
        for d in &spoiled {
            let whole = scan(d, d.len());
            for chunk in 1..=40 {
                assert_eq!(scan(d, chunk), whole, "chunks of {chunk}");
            }
        }
        assert_eq!(scan(&data, data.len()).unwrap().len(), 5);
    }
}
