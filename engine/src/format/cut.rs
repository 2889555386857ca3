//! Whole records out of a stream of chunks: a [`Cutter`] feeds each chunk to the format's
//! [`Scanner`] (the one parser of the format, the one the index builder uses too) and hands
//! out every record the scanner has found a start and an end for, as a slice of the chunk
//! or, for a record that began in an earlier chunk, of a carry that joins its pieces. Only
//! the record in progress at a chunk's end is copied; any split of the input into chunks
//! (a pipe's short reads, 1 byte at a time) gives the same records.
//!
//! Records are cut between consecutive boundaries the scanner reports (see
//! [`Scanner::drain_offsets`]): a line without its separator, a TFRecord frame whole
//! (length, CRCs and data), a tar sample with its headers, a fixed-size record, or a whole
//! input (the `files` format). Nothing here does I/O.

use super::lines::LinesScanner;
use super::tar::TarScanner;
use super::tfrecord::TfRecordScanner;
use super::{Format, ScanError, Scanner};

/// Why a record could not be cut.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CutError {
    /// The scanner refused the input (a bad CRC, a truncated record, ...).
    Bad(ScanError),
    /// A record of `len` bytes or more starts at `offset`, more than the cutter's limit.
    TooLong {
        /// Where the record starts.
        offset: u64,
        /// Its length, or as much of it as was seen.
        len: u64,
    },
}

/// Cuts a stream into records with its format's scanner, carrying a record split across
/// chunks. Feed chunks in order with [`Cutter::feed`], read each batch to its end, then
/// call [`Cutter::finish`] and read that batch too.
pub struct Cutter {
    scanner: Box<dyn Scanner + Send>,
    /// Bytes after each record that are not part of it (a line's separator).
    sep: u64,
    /// The longest record handed out.
    max: u64,
    /// The bytes before the first record, kept for formats whose header a shuffle keeps.
    head: Option<Vec<u8>>,
    /// The bytes from `carry_at` that a record in progress (or a scanner's unfinished
    /// header) still needs: those of earlier chunks, then `joined` bytes of this one.
    carry: Vec<u8>,
    carry_at: u64,
    joined: usize,
    /// Offset of the chunk being cut, and the end of the bytes fed.
    at: u64,
    pos: u64,
    /// The buffer of a batch's boundaries, kept for the next.
    bounds: Vec<u64>,
    /// The start of the record in progress (None before the first, and past the end).
    cur: Option<u64>,
    /// An error of the scanner's, reported once the records before it are handed out.
    failed: Option<ScanError>,
    finished: bool,
}

impl Cutter {
    /// A cutter for `format` that refuses records longer than `max`. Lines keep their
    /// header lines as records (the caller sets `skip` lines apart); fixed-size records
    /// keep their header (see [`Cutter::head`]). NumPy and MDS are not cut from a stream.
    pub fn new(format: &Format, max: u64) -> Result<Cutter, String> {
        let (scanner, sep, head): (Box<dyn Scanner + Send>, u64, bool) = match *format {
            Format::Lines { sep, .. } => (Box::new(LinesScanner::new(sep, 0)), 1, false),
            Format::TfRecord { verify } => (Box::new(TfRecordScanner::new(verify)), 0, false),
            Format::Tar => (Box::new(TarScanner::new()), 0, false),
            Format::Fixed { size: 0, .. } => {
                return Err("fixed records must have a size above 0".into())
            }
            Format::Fixed { size, header } => (Box::new(FixedScanner::new(size, header)), 0, true),
            Format::Files => (Box::new(WholeScanner::default()), 0, false),
            Format::Npy | Format::Mds => {
                return Err(format!("{format} records are not cut from a stream"))
            }
        };
        Ok(Cutter {
            scanner,
            sep,
            max,
            head: head.then(Vec::new),
            carry: Vec::new(),
            carry_at: 0,
            joined: 0,
            at: 0,
            pos: 0,
            bounds: Vec::new(),
            cur: None,
            failed: None,
            finished: false,
        })
    }

    /// Bytes fed so far.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// The bytes before the first record: a fixed-size input's header (empty for other
    /// formats).
    pub fn head(&self) -> &[u8] {
        self.head.as_deref().unwrap_or_default()
    }

    /// Takes the next chunk of the input; its records are read from the batch returned.
    pub fn feed<'a>(&'a mut self, chunk: &'a [u8]) -> Cuts<'a> {
        debug_assert!(!self.finished, "fed after finish");
        self.at = self.pos;
        self.pos += chunk.len() as u64;
        Cuts::new(self, chunk)
    }

    /// The input ended: the batch returned holds its last records, or the error of an
    /// input that ends inside one.
    pub fn finish(&mut self) -> Cuts<'_> {
        self.at = self.pos;
        self.finished = true;
        if self.failed.is_none() {
            if let Err(e) = self.scanner.finish(self.pos) {
                self.failed = Some(e);
            }
        }
        Cuts::new(self, &[])
    }

    fn too_long(&self, offset: u64, len: u64) -> Result<(), CutError> {
        if len > self.max {
            return Err(CutError::TooLong { offset, len });
        }
        Ok(())
    }

    /// After the batch's last record: the scanner's error if it met one, else keeps in
    /// the carry what the record in progress (or the scanner) needs from this chunk.
    fn end_batch(&mut self, chunk: &[u8]) -> Result<(), CutError> {
        // A length the format tells ahead (a TFRecord's, a fixed size) is refused before
        // its bytes arrive, and before an error later in the same record.
        if let Some((offset, len)) = self.scanner.known_len() {
            self.too_long(offset, len)?;
        }
        if let Some(e) = self.failed.take() {
            return Err(CutError::Bad(e));
        }
        if self.cur.is_none() {
            if let Some(head) = &mut self.head {
                head.extend_from_slice(chunk);
            }
        }
        if self.scanner.ended() {
            self.cur = None;
            self.carry.clear();
            self.carry_at = self.pos;
            return Ok(());
        }
        let keep = match self.cur {
            Some(s) => s,
            None => self.scanner.pending_from(self.pos),
        };
        // Boundaries and the scanner's pending offset never go back, so `keep` is at or
        // past `carry_at` and at most `pos`.
        if keep >= self.at {
            self.carry.clear();
            let from = ((keep - self.at) as usize).min(chunk.len());
            self.carry.extend_from_slice(&chunk[from..]);
        } else {
            let keep = keep.max(self.carry_at);
            self.carry
                .drain(..((keep - self.carry_at) as usize).min(self.carry.len()));
            self.carry.extend_from_slice(&chunk[self.joined..]);
        }
        self.carry_at = self.pos - self.carry.len() as u64;
        self.too_long(self.carry_at, self.carry.len() as u64)
    }
}

/// How much of a chunk the scanner reads at a time before its records are handed out:
/// small enough that the bytes are still in the cache when the caller copies the records
/// (a chunk of direct reads is megabytes), and that the boundaries' buffer stays small.
const PIECE: usize = 32 << 10;

/// The records of one chunk (or of the input's end), in order. The chunk is scanned a
/// piece at a time as its records are taken. The state a record takes is copied here for
/// the batch (so that it stays in registers in the caller's loop) and given back to the
/// cutter at the batch's end.
pub struct Cuts<'a> {
    cut: &'a mut Cutter,
    chunk: &'a [u8],
    /// How much of the chunk the scanner has read.
    scanned: usize,
    /// The boundaries the scanner found for this batch, and how many were used.
    bounds: Vec<u64>,
    next: usize,
    /// The start of the record in progress.
    cur: Option<u64>,
    /// The chunk's offset, the separator's length (none after an unterminated last line),
    /// the longest record.
    at: u64,
    sep: u64,
    max: u64,
}

impl<'a> Cuts<'a> {
    fn new(cut: &'a mut Cutter, chunk: &'a [u8]) -> Self {
        let mut bounds = std::mem::take(&mut cut.bounds);
        bounds.clear();
        cut.scanner.drain_offsets(&mut bounds);
        cut.joined = 0;
        // Only `finish` reports the end of a last line without separator.
        let sep = if cut.finished && cut.scanner.last_unterminated() {
            0
        } else {
            cut.sep
        };
        Cuts {
            chunk,
            scanned: 0,
            bounds,
            next: 0,
            cur: cut.cur,
            at: cut.at,
            sep,
            max: cut.max,
            cut,
        }
    }

    /// The next record and its offset in the input; `None` once the batch is done. An
    /// error ends the input: the cutter must not be fed after it.
    #[inline]
    pub fn next_record(&mut self) -> Result<Option<(u64, &[u8])>, CutError> {
        // The common case: a record that lies in this chunk, under the limit.
        if let (Some(&b), Some(s)) = (self.bounds.get(self.next), self.cur) {
            let end = b.saturating_sub(self.sep).max(s);
            if s >= self.at && end - s <= self.max {
                self.next += 1;
                self.cur = Some(b);
                let rec = &self.chunk[(s - self.at) as usize..(end - self.at) as usize];
                return Ok(Some((s, rec)));
            }
        }
        self.next_slow()
    }

    /// Feeds the scanner the chunk's next piece and takes the boundaries it found there.
    fn scan_piece(&mut self) {
        let c = &mut *self.cut;
        let end = (self.scanned + PIECE).min(self.chunk.len());
        let piece = &self.chunk[self.scanned..end];
        if let Err(e) = c.scanner.feed(self.at + self.scanned as u64, piece) {
            c.failed = Some(e);
        }
        self.scanned = end;
        self.bounds.clear();
        self.next = 0;
        c.scanner.drain_offsets(&mut self.bounds);
    }

    /// The first boundary, a record begun in an earlier chunk, one too long, the chunk's
    /// next piece, or the end of the batch.
    #[inline(never)]
    fn next_slow(&mut self) -> Result<Option<(u64, &[u8])>, CutError> {
        loop {
            let Some(&b) = self.bounds.get(self.next) else {
                if self.scanned < self.chunk.len() && self.cut.failed.is_none() {
                    self.scan_piece();
                    continue;
                }
                let c = &mut *self.cut;
                c.cur = self.cur;
                c.bounds = std::mem::take(&mut self.bounds);
                c.end_batch(self.chunk)?;
                return Ok(None);
            };
            self.next += 1;
            let Some(s) = self.cur.replace(b) else {
                // The first boundary opens the first record: what came before is a header.
                if let Some(head) = &mut self.cut.head {
                    head.extend_from_slice(&self.chunk[..b.saturating_sub(self.at) as usize]);
                }
                continue;
            };
            let end = b.saturating_sub(self.sep).max(s);
            self.cut.too_long(s, end - s)?;
            if s >= self.at {
                let from = (s - self.at) as usize;
                return Ok(Some((s, &self.chunk[from..(end - self.at) as usize])));
            }
            // Begun in an earlier chunk: join its pieces in the carry.
            let c = &mut *self.cut;
            let need = end.saturating_sub(self.at) as usize;
            if need > c.joined {
                c.carry.extend_from_slice(&self.chunk[c.joined..need]);
                c.joined = need;
            }
            let from = (s - c.carry_at) as usize;
            return Ok(Some((s, &c.carry[from..(end - c.carry_at) as usize])));
        }
    }
}

/// Records of `size` bytes after `header` bytes. The boundary at `header` is reported once
/// the input reaches it, each next one as its record completes.
pub struct FixedScanner {
    size: u64,
    header: u64,
    /// The next boundary to report, and the last one reported.
    next: u64,
    last: Option<u64>,
    fed: u64,
    starts: Vec<u64>,
}

impl FixedScanner {
    /// A scanner of `size`-byte records (`size` > 0) after `header` bytes.
    pub fn new(size: u64, header: u64) -> Self {
        FixedScanner {
            size: size.max(1),
            header,
            next: header,
            last: None,
            fed: 0,
            starts: Vec::new(),
        }
    }

    /// The start of the record in progress, if one is begun and not complete.
    fn partial(&self) -> Option<u64> {
        self.last.filter(|&l| self.fed > l)
    }
}

impl Scanner for FixedScanner {
    fn feed(&mut self, offset: u64, chunk: &[u8]) -> Result<(), ScanError> {
        self.fed = offset + chunk.len() as u64;
        // A size near 2^64 saturates `next`, which the input never reaches.
        while self.next <= self.fed && self.last != Some(self.next) {
            self.starts.push(self.next);
            self.last = Some(self.next);
            self.next = self.next.saturating_add(self.size);
        }
        Ok(())
    }

    fn finish(&mut self, _size: u64) -> Result<(), ScanError> {
        if self.fed < self.header {
            return Err(ScanError {
                offset: self.fed,
                what: super::short_of_header(self.header, self.fed),
            });
        }
        match self.partial() {
            Some(at) => Err(ScanError {
                offset: at,
                what: format!(
                    "truncated: the input ends with a partial record of {} bytes (records are \
                     {} bytes)",
                    self.fed - at,
                    self.size
                ),
            }),
            None => Ok(()),
        }
    }

    fn take_offsets(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.starts)
    }

    fn drain_offsets(&mut self, out: &mut Vec<u64>) {
        out.append(&mut self.starts);
    }

    fn known_len(&self) -> Option<(u64, u64)> {
        self.partial().map(|at| (at, self.size))
    }
}

/// The whole input is one record (a `files` dataset's file).
pub struct WholeScanner {
    starts: Vec<u64>,
}

impl Default for WholeScanner {
    fn default() -> Self {
        WholeScanner { starts: vec![0] }
    }
}

impl Scanner for WholeScanner {
    fn feed(&mut self, _offset: u64, _chunk: &[u8]) -> Result<(), ScanError> {
        Ok(())
    }

    fn finish(&mut self, size: u64) -> Result<(), ScanError> {
        self.starts.push(size);
        Ok(())
    }

    fn take_offsets(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.starts)
    }

    fn drain_offsets(&mut self, out: &mut Vec<u64>) {
        out.append(&mut self.starts);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::tfrecord::encode;

    /// Every record (offset and bytes) of `data` fed in chunks of `step` bytes, or the
    /// first error.
    fn cut(
        format: &Format,
        max: u64,
        data: &[u8],
        step: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, CutError> {
        let mut c = Cutter::new(format, max).unwrap();
        let mut got = Vec::new();
        for chunk in data.chunks(step) {
            let mut cuts = c.feed(chunk);
            while let Some((at, r)) = cuts.next_record()? {
                got.push((at, r.to_vec()));
            }
        }
        let mut cuts = c.finish();
        while let Some((at, r)) = cuts.next_record()? {
            got.push((at, r.to_vec()));
        }
        Ok(got)
    }

    /// The same records (or the same error) whatever the chunk size, 1 to `data.len()`.
    fn same_any_chunking(
        format: &Format,
        max: u64,
        data: &[u8],
    ) -> Result<Vec<(u64, Vec<u8>)>, CutError> {
        let whole = cut(format, max, data, data.len().max(1));
        for step in 1..=data.len().max(1) {
            assert_eq!(
                cut(format, max, data, step),
                whole,
                "{format}, chunks of {step}"
            );
        }
        whole
    }

    fn tfrecords(records: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for r in records {
            encode(r, &mut out);
        }
        out
    }

    const LINES: Format = Format::Lines {
        sep: b'\n',
        skip: 0,
    };
    const TF: Format = Format::TfRecord { verify: true };

    #[test]
    fn lines_are_cut_alike_in_chunks_of_any_size() {
        let data = b"a\r\nbb\n\nccc\nlast without separator";
        let got = same_any_chunking(&LINES, 1 << 20, data).unwrap();
        let want: Vec<(u64, Vec<u8>)> = vec![
            (0, b"a\r".to_vec()),
            (3, b"bb".to_vec()),
            (6, b"".to_vec()),
            (7, b"ccc".to_vec()),
            (11, b"last without separator".to_vec()),
        ];
        assert_eq!(got, want);
        let got = same_any_chunking(&LINES, 1 << 20, b"x\ny\n").unwrap();
        assert_eq!(got, vec![(0, b"x".to_vec()), (2, b"y".to_vec())]);
        assert_eq!(cut(&LINES, 1 << 20, b"", 1).unwrap(), vec![]);
        let tabs = Format::Lines {
            sep: b'\t',
            skip: 1,
        };
        let got = same_any_chunking(&tabs, 1 << 20, b"h\tone\ttwo").unwrap();
        assert_eq!(
            got.len(),
            3,
            "skip is the caller's: header lines are records"
        );
    }

    /// A TFRecord's header, data and CRCs split across reads at every point (a pipe's
    /// short reads) give the same frames, and the same errors at the same offsets.
    #[test]
    fn tfrecord_frames_split_anywhere_are_cut_alike() {
        let data = tfrecords(&[b"hello", b"", b"world!!", &[7u8; 40]]);
        let got = same_any_chunking(&TF, 1 << 20, &data).unwrap();
        let starts: Vec<u64> = got.iter().map(|g| g.0).collect();
        assert_eq!(starts, vec![0, 21, 37, 60]);
        assert_eq!(&got[2].1[12..19], b"world!!");
        assert_eq!(got.iter().map(|g| g.1.len()).sum::<usize>(), data.len());

        let mut bad_len = data.clone();
        bad_len[21 + 9] ^= 0x55;
        let e = same_any_chunking(&TF, 1 << 20, &bad_len).unwrap_err();
        assert!(
            matches!(&e, CutError::Bad(e) if e.offset == 29 && e.what.contains("length CRC")),
            "{e:?}"
        );
        let mut bad_data = data.clone();
        bad_data[37 + 13] ^= 1;
        let e = same_any_chunking(&TF, 1 << 20, &bad_data).unwrap_err();
        assert!(
            matches!(&e, CutError::Bad(e) if e.offset == 37 + 19 && e.what.contains("data CRC")),
            "{e:?}"
        );
        for cut_at in [38, 50, 58] {
            let e = same_any_chunking(&TF, 1 << 20, &data[..cut_at]).unwrap_err();
            assert!(
                matches!(&e, CutError::Bad(e) if e.offset == 37 && e.what.contains("truncated")),
                "{cut_at}: {e:?}"
            );
        }
    }

    /// A record over the limit is refused at its start; a TFRecord's as soon as its length
    /// field is read, with the frame's length, even before a bad data CRC in it.
    #[test]
    fn records_over_the_limit_are_refused_at_their_start() {
        let data = tfrecords(&[b"ok", &[1u8; 100], b"ok"]);
        let e = same_any_chunking(&TF, 50, &data).unwrap_err();
        assert_eq!(
            e,
            CutError::TooLong {
                offset: 18,
                len: 116
            }
        );
        let mut bad = data.clone();
        bad[18 + 12 + 50] ^= 1;
        assert_eq!(
            same_any_chunking(&TF, 50, &bad).unwrap_err(),
            CutError::TooLong {
                offset: 18,
                len: 116
            }
        );
        // A line's length is known only at its separator, or once the carry outgrows the
        // limit: the offset is its start either way.
        let mut lines = b"short\n".to_vec();
        lines.extend([b'x'; 30]);
        lines.extend(b"\nend\n");
        for step in [1, 4, 100] {
            let e = cut(&LINES, 20, &lines, step).unwrap_err();
            assert!(
                matches!(e, CutError::TooLong { offset: 6, len } if len > 20),
                "{step}: {e:?}"
            );
        }
        let e = cut(&Format::Files, 10, &[0u8; 30], 7).unwrap_err();
        assert!(
            matches!(e, CutError::TooLong { offset: 0, len } if len > 10),
            "{e:?}"
        );
    }

    #[test]
    fn fixed_records_keep_their_header_and_refuse_a_partial_one() {
        let fixed = Format::Fixed { size: 4, header: 3 };
        let data = b"HDRaaaabbbbcccc";
        let mut c = Cutter::new(&fixed, 100).unwrap();
        for step in 1..=data.len() {
            let got = cut(&fixed, 100, data, step).unwrap();
            let want: Vec<(u64, Vec<u8>)> = vec![
                (3, b"aaaa".to_vec()),
                (7, b"bbbb".to_vec()),
                (11, b"cccc".to_vec()),
            ];
            assert_eq!(got, want, "chunks of {step}");
        }
        for chunk in data.chunks(2) {
            let mut cuts = c.feed(chunk);
            while cuts.next_record().unwrap().is_some() {}
        }
        while c.finish().next_record().unwrap().is_some() {}
        assert_eq!(c.head(), b"HDR");
        let e = same_any_chunking(&fixed, 100, &data[..13]).unwrap_err();
        assert!(
            matches!(&e, CutError::Bad(e) if e.offset == 11 && e.what.contains("partial record of 2 bytes")),
            "{e:?}"
        );
        // A header larger than the input: the error `read` gives (issue 30 D31).
        let e = same_any_chunking(&fixed, 100, b"HD").unwrap_err();
        assert!(
            matches!(&e, CutError::Bad(e) if e.offset == 2 && e.what == super::super::short_of_header(3, 2)),
            "{e:?}"
        );
        assert_eq!(same_any_chunking(&fixed, 100, b"HDR").unwrap(), vec![]);
        let e =
            same_any_chunking(&Format::Fixed { size: 8, header: 1 }, 4, b"h12345678").unwrap_err();
        assert_eq!(e, CutError::TooLong { offset: 1, len: 8 });
    }

    /// A chunk of many pieces (scanned a piece at a time) is cut as the same bytes in
    /// small chunks, records across the pieces' edges included, and a bad CRC deep in it
    /// is reported after the records before it.
    #[test]
    fn chunks_of_many_pieces_are_cut_alike() {
        let mut lines = Vec::new();
        let mut frames: Vec<Vec<u8>> = Vec::new();
        for i in 0..20_000usize {
            lines.extend(std::iter::repeat_n(b'a' + (i % 26) as u8, i % 97));
            lines.push(b'\n');
            frames.push(vec![i as u8; i % 301]);
        }
        let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
        let tf = tfrecords(&refs);
        assert!(lines.len() > 3 * PIECE && tf.len() > 3 * PIECE);
        for (format, data) in [(&LINES, &lines), (&TF, &tf)] {
            let whole = cut(format, 1 << 20, data, data.len()).unwrap();
            assert_eq!(whole.len(), 20_000);
            for step in [1000, PIECE - 1, PIECE + 7] {
                assert_eq!(
                    cut(format, 1 << 20, data, step).unwrap(),
                    whole,
                    "{format} {step}"
                );
            }
        }
        let mut bad = tf.clone();
        bad[2 * PIECE + 5] ^= 1;
        let mut c = Cutter::new(&TF, 1 << 20).unwrap();
        let mut cuts = c.feed(&bad);
        let mut before = 0u64;
        let e = loop {
            match cuts.next_record() {
                Ok(Some((at, r))) => before = at + r.len() as u64,
                Ok(None) => panic!("no error"),
                Err(e) => break e,
            }
        };
        assert!(
            matches!(&e, CutError::Bad(e) if e.offset >= before && e.what.contains("CRC")),
            "{e:?}"
        );
        assert!(
            before > 2 * PIECE as u64 - 400,
            "records before the error were not handed out"
        );
    }

    #[test]
    fn a_whole_input_is_one_record() {
        assert_eq!(
            same_any_chunking(&Format::Files, 100, b"abc").unwrap(),
            vec![(0, b"abc".to_vec())]
        );
        assert_eq!(
            cut(&Format::Files, 100, b"", 1).unwrap(),
            vec![(0, Vec::new())]
        );
        assert!(Cutter::new(&Format::Npy, 100).is_err());
    }
}
