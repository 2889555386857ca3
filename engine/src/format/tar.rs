//! Tar archives read as WebDataset shards: a record is a *sample*, the run of consecutive
//! regular members whose names share a key (the path up to the first dot of its last
//! component: `d/000123.jpg` and `d/000123.cls` are the members `jpg` and `cls` of sample
//! `d/000123`), as WebDataset groups them. A member whose last component has no dot before
//! any other character is no sample's and is skipped, as WebDataset skips it. Directories,
//! links and other non-regular members before the first sample or after the last are
//! skipped too; one between samples, whose bytes would ride in a sample's record (and
//! come out of `riffle cat` or a shuffled tar as a link to extract), is refused at its
//! offset.
//!
//! A sample's record is its bytes in the archive, headers included, from the first header
//! of its first member (a GNU long-name or PAX header before it counts) to the end of its
//! last member's padded data: one contiguous read. [`members`] splits a record into its
//! members. The scanner checks every header's checksum and refuses, with the byte offset,
//! a bad header, a long name or PAX header over 1 MiB, a sample with two members of one
//! suffix, and an archive that ends inside a member. The archive ends at its first zero
//! block (as Python's `tarfile` reads it). Gzip-compressed shards are refused by the
//! dataset (they cannot be read in place).

use super::{ScanError, Scanner};

/// A tar block.
pub const BLOCK: u64 = 512;

/// The most a GNU long name or a PAX header may hold.
const MAX_META: u64 = 1 << 20;

/// Bytes a member's data takes, padded to whole blocks (saturating: a size near 2^64 from
/// a hostile header becomes "past any file", refused when the archive ends).
fn padded(size: u64) -> u64 {
    size.div_ceil(BLOCK).saturating_mul(BLOCK)
}

/// One parsed header.
#[derive(Debug)]
struct Header {
    name: Vec<u8>,
    size: u64,
    kind: u8,
}

fn octal(field: &[u8]) -> Option<u64> {
    // GNU base-256 for sizes past 8 GiB: the first byte's top bit set.
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        let mut v: u64 = (field[0] & 0x7f) as u64;
        for &b in &field[1..] {
            v = v.checked_mul(256)?.checked_add(b as u64)?;
        }
        return Some(v);
    }
    let s: Vec<u8> = field
        .iter()
        .copied()
        .skip_while(|&b| b == b' ')
        .take_while(|&b| b != 0 && b != b' ')
        .collect();
    if s.is_empty() {
        return Some(0);
    }
    let s = std::str::from_utf8(&s).ok()?;
    u64::from_str_radix(s, 8).ok()
}

fn cstr(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..end]
}

/// Parses the header block `b` at byte `at`: `None` for a zero block (the archive's end).
fn header(b: &[u8], at: u64) -> Result<Option<Header>, ScanError> {
    if b.iter().all(|&x| x == 0) {
        return Ok(None);
    }
    let bad = |what: String| ScanError { offset: at, what };
    let stored = octal(&b[148..156])
        .ok_or_else(|| bad("a tar header with an unreadable checksum field".into()))?;
    let sum: u64 = b
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            if (148..156).contains(&i) {
                b' ' as u64
            } else {
                x as u64
            }
        })
        .sum();
    if sum != stored {
        return Err(bad(format!(
            "not a valid tar header: checksum {stored} stored, {sum} computed (a .tar.gz, or not a tar archive?)"
        )));
    }
    let size = octal(&b[124..136])
        .ok_or_else(|| bad("a tar header with an unreadable size field".into()))?;
    let mut name = Vec::new();
    // ustar: a prefix joined with '/'.
    if &b[257..262] == b"ustar" {
        let prefix = cstr(&b[345..500]);
        if !prefix.is_empty() {
            name.extend_from_slice(prefix);
            name.push(b'/');
        }
    }
    name.extend_from_slice(cstr(&b[..100]));
    Ok(Some(Header {
        name,
        size,
        kind: b[156],
    }))
}

/// Whether a member of this type flag holds a regular file.
fn regular(kind: u8) -> bool {
    matches!(kind, b'0' | 0 | b'7')
}

/// One PAX record: `LEN KEY=VALUE\n`, LEN counting the whole record, its own digits too.
fn pax_record(key: &[u8], value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = body + 1;
    while body + len.to_string().len() != len {
        len = body + len.to_string().len();
    }
    let mut r = format!("{len} ").into_bytes();
    r.extend_from_slice(key);
    r.push(b'=');
    r.extend_from_slice(value);
    r.push(b'\n');
    r
}

/// What a non-regular member of this type flag is, for errors.
fn member_kind(kind: u8) -> &'static str {
    match kind {
        b'1' => "a hard link",
        b'2' => "a symbolic link",
        b'3' => "a character device",
        b'4' => "a block device",
        b'5' => "a directory",
        b'6' => "a FIFO",
        _ => "a non-regular",
    }
}

/// The name a PAX header's records give (`path=`), if any.
fn pax_path(data: &[u8]) -> Option<Vec<u8>> {
    let mut rest = data;
    while !rest.is_empty() {
        let sp = rest.iter().position(|&b| b == b' ')?;
        let len: usize = std::str::from_utf8(&rest[..sp]).ok()?.parse().ok()?;
        if len <= sp || len > rest.len() {
            return None;
        }
        let rec = &rest[sp + 1..len];
        let rec = rec.strip_suffix(b"\n").unwrap_or(rec);
        if let Some(v) = rec.strip_prefix(b"path=") {
            return Some(v.to_vec());
        }
        rest = &rest[len..];
    }
    None
}

/// WebDataset's key and suffix of a member name: `dir/abc.x.jpg` -> (`dir/abc`, `x.jpg`).
/// Bytes, not text: a name that is not UTF-8 keeps its own key.
pub fn key_suffix(name: &[u8]) -> Option<(&[u8], &[u8])> {
    let base = name.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    let dot = name[base..].iter().position(|&b| b == b'.')?;
    if dot == 0 {
        return None;
    }
    Some((&name[..base + dot], &name[base + dot + 1..]))
}

/// A name as errors show it.
fn shown(name: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(name)
}

/// A member of a sample: its suffix (`jpg`), and where its data is in the record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The name after the key's dot.
    pub suffix: String,
    /// Byte offset of its data in the record.
    pub offset: usize,
    /// Its length.
    pub len: usize,
}

/// The members of one sample's record (its bytes from the archive), in order. Errors name
/// the byte offset in the record.
pub fn members(record: &[u8]) -> Result<Vec<Member>, ScanError> {
    let mut out = Vec::new();
    each_member(record, |name, offset, len| {
        if let Some((_, suffix)) = key_suffix(name) {
            out.push(Member {
                suffix: shown(suffix).into_owned(),
                offset,
                len,
            });
        }
        true
    })?;
    Ok(out)
}

/// The key of one sample's record: its first keyed member's.
pub fn sample_key(record: &[u8]) -> Result<Option<Vec<u8>>, ScanError> {
    let mut key = None;
    each_member(record, |name, _, _| {
        key = key_suffix(name).map(|(k, _)| k.to_vec());
        key.is_none()
    })?;
    Ok(key)
}

/// Calls `f(name, data offset, data length)` for each regular member of a record, in
/// order, while it returns true.
fn each_member(
    record: &[u8],
    mut f: impl FnMut(&[u8], usize, usize) -> bool,
) -> Result<(), ScanError> {
    let mut at = 0usize;
    let mut long: Option<Vec<u8>> = None;
    while at + BLOCK as usize <= record.len() {
        let Some(h) = header(&record[at..at + BLOCK as usize], at as u64)? else {
            break;
        };
        let data = at + BLOCK as usize;
        let end = data
            .checked_add(h.size as usize)
            .filter(|&e| e <= record.len())
            .ok_or_else(|| ScanError {
                offset: at as u64,
                what: format!("a member of {} bytes runs past the sample's end", h.size),
            })?;
        match h.kind {
            b'L' => long = Some(cstr(&record[data..end]).to_vec()),
            b'x' => long = pax_path(&record[data..end]).or(long),
            // As the scanner: a link name or global header leaves a long name pending.
            b'g' | b'K' => {}
            k if regular(k) => {
                let name = long.take().unwrap_or(h.name);
                if !f(&name, data, h.size as usize) {
                    return Ok(());
                }
            }
            _ => long = None,
        }
        at = data.saturating_add(padded(h.size) as usize);
    }
    Ok(())
}

enum State {
    /// Collecting the header block at `start`.
    Header {
        start: u64,
        have: usize,
        buf: Box<[u8; 512]>,
    },
    /// Inside a member's padded data; `keep` collects a long name or PAX header. The
    /// member's header is at `header` and says `size` bytes.
    Data {
        left: u64,
        keep: Option<(u8, u64, Vec<u8>)>,
        header: u64,
        size: u64,
    },
    /// Past the end-of-archive block.
    End,
}

/// Finds sample starts in a tar archive.
pub struct TarScanner {
    state: State,
    starts: Vec<u64>,
    /// The end of the last sample's last member.
    end: u64,
    /// Where the current member's header chain (long name, PAX) began.
    chain: Option<u64>,
    /// The name a long-name or PAX header gave the next member.
    pending: Option<Vec<u8>>,
    /// The current sample's key and its members' suffixes.
    key: Option<Vec<u8>>,
    suffixes: Vec<Vec<u8>>,
    /// A non-regular member met after a sample began (its header's offset, what it is,
    /// its name): refused if a sample's member follows it, whose record would carry it.
    stray: Option<(u64, &'static str, Vec<u8>)>,
    /// Whether the archive was finished, and whether [`Scanner::drain_offsets`] reported
    /// the last sample's end.
    finished: bool,
    end_reported: bool,
}

impl Default for TarScanner {
    fn default() -> Self {
        Self::new()
    }
}

impl TarScanner {
    /// A scanner at the start of an archive.
    pub fn new() -> Self {
        TarScanner {
            state: State::Header {
                start: 0,
                have: 0,
                buf: Box::new([0; 512]),
            },
            starts: Vec::new(),
            end: 0,
            chain: None,
            pending: None,
            key: None,
            suffixes: Vec::new(),
            stray: None,
            finished: false,
            end_reported: false,
        }
    }

    /// Sample starts found since the last call (a streaming reader of the archive).
    pub fn take_starts(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.starts)
    }

    /// Whether the end-of-archive block was met.
    pub fn ended(&self) -> bool {
        matches!(self.state, State::End)
    }

    /// The first offset the scanner may still need bytes from (a header, or a long-name
    /// or PAX header chain, begun and not finished), given that `pos` bytes were fed; `pos`
    /// when it needs none.
    pub fn pending_from(&self, pos: u64) -> u64 {
        match &self.state {
            State::Header { start, .. } => self.chain.unwrap_or(*start).min(pos),
            State::Data { .. } => self.chain.unwrap_or(pos).min(pos),
            State::End => pos,
        }
    }

    /// The end of the last sample's last member so far.
    pub fn end(&self) -> u64 {
        self.end
    }

    fn on_header(&mut self, start: u64, buf: &[u8]) -> Result<(), ScanError> {
        let Some(h) = header(buf, start)? else {
            self.state = State::End;
            return Ok(());
        };
        let chain = *self.chain.get_or_insert(start);
        let after = start + BLOCK;
        let keep = match h.kind {
            b'L' | b'x' => {
                if h.size > MAX_META {
                    return Err(ScanError {
                        offset: start,
                        what: format!(
                            "a long-name or PAX header of {} bytes (at most {MAX_META})",
                            h.size
                        ),
                    });
                }
                Some((h.kind, h.size, Vec::with_capacity(h.size as usize)))
            }
            b'g' | b'K' => None,
            k if regular(k) => {
                let name = self.pending.take().unwrap_or(h.name);
                self.chain = None;
                if let Some((key, suffix)) = key_suffix(&name) {
                    if let Some((at, what, stray)) = self.stray.take() {
                        return Err(ScanError {
                            offset: at,
                            what: format!(
                                "{what} member {} among the samples: a sample's record \
                                 would carry it (riffle reads samples of regular members); \
                                 refused: rebuild the shard without it",
                                shown(&stray)
                            ),
                        });
                    }
                    if self.key.as_deref() == Some(key) {
                        if self.suffixes.iter().any(|s| s == suffix) {
                            return Err(ScanError {
                                offset: start,
                                what: format!(
                                    "sample {} has two members named {}",
                                    shown(key),
                                    shown(&name)
                                ),
                            });
                        }
                    } else {
                        self.starts.push(chain);
                        self.key = Some(key.to_vec());
                        self.suffixes.clear();
                    }
                    self.suffixes.push(suffix.to_vec());
                    self.end = after.saturating_add(padded(h.size));
                }
                None
            }
            k => {
                // Before the first sample (a leading directory entry) or after the last,
                // no record holds it; between samples, one would.
                if self.key.is_some() && self.stray.is_none() {
                    let name = self.pending.take().unwrap_or(h.name);
                    self.stray = Some((chain, member_kind(k), name));
                }
                self.chain = None;
                self.pending = None;
                None
            }
        };
        if h.size == 0 {
            if let Some((kind, _, _)) = keep {
                // An empty long name or PAX header: nothing to keep.
                if kind == b'L' {
                    self.pending = None;
                }
            }
        }
        self.state = if h.size == 0 {
            State::Header {
                start: after,
                have: 0,
                buf: Box::new([0; 512]),
            }
        } else {
            State::Data {
                left: padded(h.size),
                keep,
                header: start,
                size: h.size,
            }
        };
        Ok(())
    }
}

impl Scanner for TarScanner {
    fn feed(&mut self, offset: u64, chunk: &[u8]) -> Result<(), ScanError> {
        let mut i = 0usize;
        while i < chunk.len() {
            match &mut self.state {
                State::End => return Ok(()),
                State::Header { start, have, buf } => {
                    let n = (512 - *have).min(chunk.len() - i);
                    buf[*have..*have + n].copy_from_slice(&chunk[i..i + n]);
                    *have += n;
                    i += n;
                    if *have == 512 {
                        let (start, buf) = (*start, std::mem::replace(buf, Box::new([0; 512])));
                        self.on_header(start, &buf[..])?;
                    }
                }
                State::Data { left, keep, .. } => {
                    let n = (*left).min((chunk.len() - i) as u64) as usize;
                    if let Some((_, size, data)) = keep {
                        let want = (*size as usize).saturating_sub(data.len()).min(n);
                        data.extend_from_slice(&chunk[i..i + want]);
                    }
                    *left -= n as u64;
                    i += n;
                    if *left == 0 {
                        if let Some((kind, _, data)) = keep.take() {
                            self.pending = match kind {
                                b'L' => Some(cstr(&data).to_vec()),
                                _ => pax_path(&data).or(self.pending.take()),
                            };
                        }
                        self.state = State::Header {
                            start: offset + i as u64,
                            have: 0,
                            buf: Box::new([0; 512]),
                        };
                    }
                }
            }
        }
        Ok(())
    }

    fn finish(&mut self, size: u64) -> Result<(), ScanError> {
        match &self.state {
            State::End | State::Header { have: 0, .. } => {
                self.finished = true;
                Ok(())
            }
            State::Header { start, .. } => Err(ScanError {
                offset: *start,
                what: format!("the archive ends inside a header (at byte {size})"),
            }),
            // Said at the member's header, whose size field is the likely culprit, not
            // at the end of the file (issue 30 D36).
            State::Data {
                header, size: len, ..
            } => Err(ScanError {
                offset: *header,
                what: format!(
                    "the archive ends inside a member's data: this header says {len} bytes \
                     and the archive has {} after it",
                    size.saturating_sub(header + BLOCK)
                ),
            }),
        }
    }

    fn take_offsets(&mut self) -> Vec<u64> {
        let mut v = std::mem::take(&mut self.starts);
        if !v.is_empty() {
            v.push(self.end);
        }
        v
    }

    fn drain_offsets(&mut self, out: &mut Vec<u64>) {
        out.append(&mut self.starts);
        // A sample ends where the next starts, the last one where its last member does.
        if (self.finished || self.ended()) && self.key.is_some() && !self.end_reported {
            out.push(self.end);
            self.end_reported = true;
        }
    }

    fn ended(&self) -> bool {
        TarScanner::ended(self)
    }

    fn pending_from(&self, pos: u64) -> u64 {
        TarScanner::pending_from(self, pos)
    }
}

/// Appends one member (a ustar header, then its data padded) to `out`; names longer than
/// 100 bytes get a GNU long-name header first, and names that are not UTF-8 a PAX header
/// (`hdrcharset=BINARY`, `path=` the name's bytes, as GNU tar writes them), so they reach
/// the archive byte for byte. For `riffle gen`, `riffle shuffle` of a files tree, and
/// tests.
pub fn append(out: &mut Vec<u8>, name: impl AsRef<[u8]>, data: &[u8]) {
    let name = name.as_ref();
    fn block(name: &[u8], size: u64, kind: u8) -> [u8; 512] {
        let mut b = [0u8; 512];
        let n = name.len().min(100);
        b[..n].copy_from_slice(&name[..n]);
        b[100..108].copy_from_slice(b"0000644\0");
        b[108..116].copy_from_slice(b"0000000\0");
        b[116..124].copy_from_slice(b"0000000\0");
        b[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
        b[136..148].copy_from_slice(b"00000000000\0");
        b[156] = kind;
        b[257..263].copy_from_slice(b"ustar\0");
        b[263..265].copy_from_slice(b"00");
        b[148..156].copy_from_slice(b"        ");
        let sum: u64 = b.iter().map(|&x| x as u64).sum();
        b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        b
    }
    let pad = |out: &mut Vec<u8>| out.resize(out.len().div_ceil(512) * 512, 0);
    if std::str::from_utf8(name).is_err() {
        let mut pax = pax_record(b"hdrcharset", b"BINARY");
        pax.extend_from_slice(&pax_record(b"path", name));
        out.extend_from_slice(&block(b"././@PaxHeader", pax.len() as u64, b'x'));
        out.extend_from_slice(&pax);
        pad(out);
    } else if name.len() > 100 {
        let mut long = name.to_vec();
        long.push(0);
        out.extend_from_slice(&block(b"././@LongLink", long.len() as u64, b'L'));
        out.extend_from_slice(&long);
        pad(out);
    }
    out.extend_from_slice(&block(name, data.len() as u64, b'0'));
    out.extend_from_slice(data);
    pad(out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn archive(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (n, d) in members {
            append(&mut out, n, d);
        }
        out.extend_from_slice(&[0u8; 1024]);
        out
    }

    fn scan(bytes: &[u8], chunk: usize) -> Result<Vec<u64>, ScanError> {
        let mut s = TarScanner::new();
        for (k, c) in bytes.chunks(chunk).enumerate() {
            s.feed((k * chunk) as u64, c)?;
        }
        s.finish(bytes.len() as u64)?;
        Ok(s.take_offsets())
    }

    /// A size field that says more than the archive holds is reported at its header, not
    /// at the end of the file (issue 30 D36).
    #[test]
    fn an_oversized_size_field_is_reported_at_its_header() {
        let mut a = Vec::new();
        append(&mut a, "s/000.jpg", b"jpeg0");
        let second = a.len() as u64;
        append(&mut a, "s/001.jpg", &[7u8; 600]);
        // The second header says 10 MB (octal), with its checksum fixed.
        let h = second as usize;
        a[h + 124..h + 136].copy_from_slice(format!("{:011o}\0", 10_000_000).as_bytes());
        a[h + 148..h + 156].copy_from_slice(b"        ");
        let sum: u64 = a[h..h + 512].iter().map(|&x| x as u64).sum();
        a[h + 148..h + 156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        for chunk in [7, 512, 1 << 20] {
            let e = scan(&a, chunk).unwrap_err();
            assert_eq!(e.offset, second, "{}", e.what);
            assert!(e.what.contains("says 10000000 bytes"), "{}", e.what);
        }
    }

    #[test]
    fn samples_group_consecutive_members_of_one_key() {
        let long = format!("{}/x.jpg", "d".repeat(150));
        let a = archive(&[
            ("s/000.jpg", b"jpeg0"),
            ("s/000.cls", b"3"),
            ("s/001.jpg", &[7u8; 700]),
            ("s/001.json", b"{}"),
            ("noext", b"skipped"),
            (&long, b"L"),
            (&format!("{}/x.cls", "d".repeat(150)), b"9"),
        ]);
        for chunk in [1, 7, 512, 1000, 1 << 20] {
            let offs = scan(&a, chunk).unwrap();
            assert_eq!(offs.len(), 4, "three samples and the end, chunk {chunk}");
            let rec = |i: usize| &a[offs[i] as usize..offs[i + 1] as usize];
            let m = members(rec(0)).unwrap();
            assert_eq!(
                m.iter().map(|m| m.suffix.as_str()).collect::<Vec<_>>(),
                ["jpg", "cls"]
            );
            assert_eq!(&rec(0)[m[0].offset..m[0].offset + m[0].len], b"jpeg0");
            let m = members(rec(1)).unwrap();
            assert_eq!(m[0].len, 700);
            let m = members(rec(2)).unwrap();
            assert_eq!(
                m.iter().map(|m| m.suffix.as_str()).collect::<Vec<_>>(),
                ["jpg", "cls"]
            );
            assert_eq!(&rec(2)[m[1].offset..m[1].offset + 1], b"9");
        }
    }

    /// Scans `bytes` fed in pieces of the sizes `pieces` cycles through.
    fn scan_pieces(bytes: &[u8], pieces: &[usize]) -> Result<Vec<u64>, ScanError> {
        let mut s = TarScanner::new();
        let mut at = 0;
        for piece in pieces.iter().cycle() {
            if at >= bytes.len() {
                break;
            }
            let end = (at + piece).min(bytes.len());
            s.feed(at as u64, &bytes[at..end])?;
            at = end;
        }
        s.finish(bytes.len() as u64)?;
        Ok(s.take_offsets())
    }

    /// What a successful scan promises whatever the input: sample starts strictly
    /// increasing and inside the input, and every record splits into its members, at
    /// least one, each inside the record.
    fn check_scan(bytes: &[u8], offsets: &[u64]) -> Result<(), TestCaseError> {
        prop_assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{offsets:?}");
        prop_assert!(offsets.last().is_none_or(|&e| e <= bytes.len() as u64));
        for w in offsets.windows(2) {
            let rec = &bytes[w[0] as usize..w[1] as usize];
            let ms = members(rec).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            prop_assert!(!ms.is_empty(), "a sample of no members at {}", w[0]);
            prop_assert!(ms.iter().all(|m| m.offset + m.len <= rec.len()));
        }
        Ok(())
    }

    /// Samples as written: a key's members (suffix, data), whether the key is long (a GNU
    /// long-name header), and whether a member that is no sample's (no dot in its name)
    /// follows the sample.
    type Written = Vec<(Vec<(&'static str, Vec<u8>)>, bool, bool)>;

    /// Samples to write (see `Written`).
    fn samples() -> impl Strategy<Value = Written> {
        let member = (
            proptest::sample::select(vec!["jpg", "cls", "json", "txt.gz", "x.y"]),
            proptest::collection::vec(any::<u8>(), 0..1100),
        );
        proptest::collection::vec(
            (
                proptest::collection::vec(member, 1..4),
                any::<bool>(), // a long (GNU long-name) key
                any::<bool>(), // a member that is no sample's after it
            ),
            0..6,
        )
    }

    proptest::proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// A valid archive's samples are found as written, whatever pieces it is fed in:
        /// one record per key, whose members are the ones written, in order, with their
        /// bytes (long names and members that are no sample's included).
        #[test]
        fn valid_archives_give_their_samples_whatever_the_chunking(
            written in samples(),
            pieces in proptest::collection::vec(1usize..2000, 1..6),
        ) {
            let mut a = Vec::new();
            let mut want = Vec::new();
            for (i, (ms, long, junk)) in written.iter().enumerate() {
                let dir = if *long { "d".repeat(120) } else { "d".into() };
                let mut seen = Vec::new();
                for (suffix, data) in ms {
                    if seen.contains(suffix) {
                        continue; // Two members of one suffix are refused (tested below).
                    }
                    seen.push(*suffix);
                    append(&mut a, format!("{dir}/{i:06}.{suffix}"), data);
                    want.push((i, suffix.to_string(), data.clone()));
                }
                if *junk {
                    append(&mut a, format!("{dir}/README{i}"), b"not a sample");
                }
            }
            a.extend_from_slice(&[0u8; 1024]);
            let offsets = scan_pieces(&a, &pieces).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            prop_assert_eq!(&offsets, &scan(&a, a.len().max(1)).unwrap());
            check_scan(&a, &offsets)?;
            prop_assert_eq!(offsets.len(), if written.is_empty() { 0 } else { written.len() + 1 });
            let mut got = Vec::new();
            for (i, w) in offsets.windows(2).enumerate() {
                let rec = &a[w[0] as usize..w[1] as usize];
                for m in members(rec).unwrap() {
                    got.push((i, m.suffix, rec[m.offset..m.offset + m.len].to_vec()));
                }
            }
            prop_assert_eq!(got, want);
        }

        /// Arbitrary bytes, and valid archives with bytes changed, inserted, removed or
        /// cut, or a size field near 2^64: refused or read, never a panic; the result does
        /// not depend on the chunking; and what is read keeps the scanner's promises.
        #[test]
        fn no_input_makes_it_panic(
            written in samples(),
            noise in proptest::collection::vec(any::<u8>(), 0..3000),
            edits in proptest::collection::vec((any::<proptest::sample::Index>(), 0u8..5, any::<u8>()), 0..5),
            pieces in proptest::collection::vec(1usize..1200, 1..6),
        ) {
            let mut a = Vec::new();
            for (i, (ms, _, _)) in written.iter().enumerate() {
                for (suffix, data) in ms {
                    append(&mut a, format!("{i}.{suffix}"), data);
                }
            }
            if a.is_empty() {
                a = noise;
            } else {
                a.extend_from_slice(&[0u8; 1024]);
            }
            for (i, op, v) in edits {
                if a.is_empty() {
                    break;
                }
                let i = i.index(a.len());
                match op {
                    0 => a[i] = v,
                    1 => a.insert(i, v),
                    2 => { a.remove(i); }
                    3 => a.truncate(i),
                    _ if a.len() >= 512 => {
                        // A base-256 size field near 2^64 in the header at the block
                        // boundary at or before `i`, checksum fixed up.
                        let h = i / 512 * 512;
                        let h = if h + 512 <= a.len() { h } else { 0 };
                        a[h + 124] = 0x80;
                        a[h + 125..h + 136].iter_mut().for_each(|b| *b = v | 0xf0);
                        a[h + 148..h + 156].copy_from_slice(b"        ");
                        let sum: u64 = a[h..h + 512].iter().map(|&x| x as u64).sum();
                        a[h + 148..h + 156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
                    }
                    _ => {}
                }
            }
            let got = scan_pieces(&a, &pieces);
            prop_assert_eq!(&got, &scan(&a, a.len().max(1)));
            if let Ok(offsets) = got {
                check_scan(&a, &offsets)?;
            }
            let _ = members(&a);
        }
    }

    /// Regression (issue 28): `members` forgot a GNU long name when a `K` (long link
    /// name) or `g` (global PAX) header came between it and its member, while the
    /// scanner kept it; the record's member then got its 100-byte name cut short, and a
    /// sample the scanner found split into no members at all.
    #[test]
    fn members_keep_a_long_name_across_link_and_global_headers() {
        let name = format!("{}/000001.jpg", "d".repeat(120));
        for kind in [b'K', b'g'] {
            let mut full = Vec::new();
            append(&mut full, &name, b"data");
            // The long-name header, then a `kind` header of no data, then the member.
            let mut a = full[..1024].to_vec();
            let mut extra = full[1024..1536].to_vec();
            extra[156] = kind;
            extra[124..136].copy_from_slice(b"00000000000\0");
            extra[148..156].copy_from_slice(b"        ");
            let sum: u64 = extra.iter().map(|&x| x as u64).sum();
            extra[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
            a.extend_from_slice(&extra);
            a.extend_from_slice(&full[1024..]);
            a.extend_from_slice(&[0u8; 1024]);
            let offs = scan(&a, 4096).unwrap();
            assert_eq!(offs.len(), 2, "one sample");
            let m = members(&a[offs[0] as usize..offs[1] as usize]).unwrap();
            assert_eq!(m.len(), 1, "{}", kind as char);
            assert_eq!(m[0].suffix, "jpg");
        }
    }

    /// Issue 30 D17: names that are not UTF-8 were written as U+FFFD, so two files got
    /// one member name. Now a PAX `path` record carries the bytes, and the scanner keys
    /// samples by bytes: two such names stay two samples, each name exact.
    #[test]
    fn names_that_are_not_utf8_reach_the_archive_byte_for_byte() {
        let (a, b) = (b"d/\xff.jpg".as_slice(), b"d/\xfe.jpg".as_slice());
        let mut t = Vec::new();
        append(&mut t, a, b"one");
        append(&mut t, b, b"two");
        t.extend_from_slice(&[0u8; 1024]);
        let offs = scan(&t, 4096).unwrap();
        assert_eq!(offs.len(), 3, "two samples");
        let first = &t[offs[0] as usize..offs[1] as usize];
        assert_eq!(sample_key(first).unwrap().unwrap(), b"d/\xff");
        let mut names = Vec::new();
        each_member(first, |n, at, len| {
            names.push((n.to_vec(), first[at..at + len].to_vec()));
            true
        })
        .unwrap();
        assert_eq!(names, [(a.to_vec(), b"one".to_vec())]);
        assert_eq!(pax_record(b"path", b"abc"), b"12 path=abc\n");
        assert_eq!(
            pax_record(b"k", &[b'v'; 95]).len(),
            102,
            "the length counts its digits"
        );
    }

    /// One header block of `kind` and no data (a link, a directory...), named `name`.
    fn special(name: &str, kind: u8) -> Vec<u8> {
        let mut b = Vec::new();
        append(&mut b, name, b"");
        b[156] = kind;
        b[148..156].copy_from_slice(b"        ");
        let sum: u64 = b.iter().map(|&x| x as u64).sum();
        b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        b
    }

    /// Issue 30 D30: a link, directory or device member between samples was glued into
    /// the sample before it; now refused at its offset. Before the first sample and after
    /// the last, no record holds it: skipped as before.
    #[test]
    fn non_regular_members_between_samples_are_refused() {
        for (kind, what) in [
            (b'2', "a symbolic link"),
            (b'1', "a hard link"),
            (b'5', "a directory"),
            (b'3', "a character device"),
        ] {
            let mut a = special("d/", b'5');
            append(&mut a, "d/0.jpg", b"x");
            let at = a.len() as u64;
            a.extend_from_slice(&special("d/evil", kind));
            append(&mut a, "d/1.jpg", b"y");
            a.extend_from_slice(&special("d/tail/", b'5'));
            a.extend_from_slice(&[0u8; 1024]);
            let e = scan(&a, 4096).unwrap_err();
            assert_eq!(e.offset, at, "{what}");
            assert!(
                e.what.contains(what) && e.what.contains("d/evil"),
                "{}",
                e.what
            );
            // The same member after the last sample, or before the first: no record's.
            let mut ok = special("d/", b'5');
            append(&mut ok, "d/0.jpg", b"x");
            append(&mut ok, "d/1.jpg", b"y");
            ok.extend_from_slice(&special("d/evil", kind));
            ok.extend_from_slice(&[0u8; 1024]);
            let offs = scan(&ok, 4096).unwrap();
            assert_eq!(offs.len(), 3, "two samples");
            assert_eq!(offs[0], 512, "the leading directory is in no record");
            assert_eq!(
                offs[2],
                512 + 2 * 1024,
                "the trailing member is in no record"
            );
        }
    }

    #[test]
    fn bad_archives_are_refused_at_their_offset() {
        let mut a = archive(&[("a.jpg", b"x"), ("b.jpg", b"y")]);
        a[512 + 512 + 3] ^= 1; // the second header's name
        let e = scan(&a, 4096).unwrap_err();
        assert_eq!(e.offset, 1024);
        assert!(e.what.contains("checksum"), "{}", e.what);
        let a = archive(&[("a.jpg", &[1u8; 2000])]);
        let e = scan(&a[..1500], 4096).unwrap_err();
        assert!(e.what.contains("ends inside"), "{}", e.what);
        let a = archive(&[("a.jpg", b"x"), ("a.jpg", b"y")]);
        assert!(scan(&a, 4096).unwrap_err().what.contains("two members"));
        // gzip magic
        let e = scan(&[0x1f, 0x8b, 8, 0].repeat(200), 4096).unwrap_err();
        assert_eq!(e.offset, 0);
        for cut in (0..a.len()).step_by(97) {
            let _ = members(&a[..cut]);
        }
    }
}
