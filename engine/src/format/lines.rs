//! Delimited lines: the scanner records where each line starts.

use super::{ScanError, Scanner};

/// Finds line starts; `skip` header lines at the top are not records.
pub struct LinesScanner {
    sep: u8,
    skip: u64,
    skipped: u64,
    starts: Vec<u64>,
    /// The last start found, once `starts` may have been drained.
    last: Option<u64>,
    unterminated: bool,
}

impl LinesScanner {
    /// A scanner for lines separated by `sep`, skipping `skip` header lines.
    pub fn new(sep: u8, skip: u64) -> Self {
        let starts = if skip == 0 { vec![0] } else { Vec::new() };
        LinesScanner {
            sep,
            skip,
            skipped: 0,
            starts,
            last: None,
            unterminated: false,
        }
    }
}

impl Scanner for LinesScanner {
    fn feed(&mut self, offset: u64, chunk: &[u8]) -> Result<(), ScanError> {
        let mut seps = memchr::memchr_iter(self.sep, chunk);
        while self.skipped < self.skip {
            let Some(p) = seps.next() else {
                return Ok(());
            };
            self.skipped += 1;
            if self.skipped == self.skip {
                self.starts.push(offset + p as u64 + 1);
            }
        }
        // Past the header lines, every separator ends a line.
        let after = offset + 1;
        for p in seps {
            self.starts.push(after + p as u64);
        }
        Ok(())
    }

    fn finish(&mut self, size: u64) -> Result<(), ScanError> {
        if self.skipped < self.skip {
            return Err(ScanError {
                offset: size,
                what: format!(
                    "expected {} header line(s), found {}",
                    self.skip, self.skipped
                ),
            });
        }
        // The last start is either the end of the file (the file ended with a separator:
        // it becomes the end sentinel) or the start of a final line without separator.
        if self.starts.last().copied().or(self.last) != Some(size) {
            self.starts.push(size);
            self.unterminated = true;
        }
        Ok(())
    }

    fn take_offsets(&mut self) -> Vec<u64> {
        self.last = self.starts.last().copied().or(self.last);
        std::mem::take(&mut self.starts)
    }

    fn drain_offsets(&mut self, out: &mut Vec<u64>) {
        self.last = self.starts.last().copied().or(self.last);
        out.append(&mut self.starts);
    }

    fn last_unterminated(&self) -> bool {
        self.unterminated
    }
}

#[cfg(test)]
mod tests {
    use super::super::{indexed_span, Format};
    use super::*;

    fn lines(data: &[u8], skip: u64, chunk: usize) -> Vec<Vec<u8>> {
        let mut s = LinesScanner::new(b'\n', skip);
        for (i, c) in data.chunks(chunk.max(1)).enumerate() {
            s.feed((i * chunk) as u64, c).unwrap();
        }
        s.finish(data.len() as u64).unwrap();
        let unterminated = s.last_unterminated();
        let offs = s.take_offsets();
        let f = Format::Lines { sep: b'\n', skip };
        (0..offs.len() - 1)
            .map(|i| {
                let sp = indexed_span(&f, &offs, unterminated, i);
                data[sp.offset as usize..(sp.offset + sp.len) as usize].to_vec()
            })
            .collect()
    }

    #[test]
    fn splits_lines_any_chunking() {
        let data = b"a\r\nbb\n\nccc";
        for chunk in [1, 2, 3, 100] {
            assert_eq!(
                lines(data, 0, chunk),
                vec![
                    b"a\r".to_vec(),
                    b"bb".to_vec(),
                    b"".to_vec(),
                    b"ccc".to_vec()
                ]
            );
            assert_eq!(
                lines(b"x\ny\n", 0, chunk),
                vec![b"x".to_vec(), b"y".to_vec()]
            );
            assert_eq!(
                lines(b"h1,h2\n1,2\n3,4\n", 1, chunk),
                vec![b"1,2".to_vec(), b"3,4".to_vec()]
            );
        }
    }

    #[test]
    fn missing_header_is_an_error() {
        let mut s = LinesScanner::new(b'\n', 2);
        s.feed(0, b"only one line\n").unwrap();
        assert!(s.finish(14).is_err());
    }
}
