//! The NumPy `.npy` header: magic, version, header length, and a Python dict literal with
//! `descr`, `fortran_order` and `shape`. A record is one row of a C-order array.
//!
//! Every size the header decides (dtype sizes, field counts, shape products, the data's
//! end) is computed with checked arithmetic: [`parse`] refuses a header whose sizes do not
//! fit in 64 bits, so the accessors of [`NpyHeader`] never overflow.

/// What a header says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyHeader {
    /// Format version (1, 2 or 3).
    pub version: (u8, u8),
    /// The dtype as written (`<f4`, `|u1`, or a structured list).
    pub descr: String,
    /// Bytes per element.
    pub itemsize: u64,
    /// The array's shape.
    pub shape: Vec<u64>,
    /// Where the data starts.
    pub data_offset: u64,
}

impl NpyHeader {
    /// Rows (records): the first dimension; a 0-d array is one record.
    pub fn rows(&self) -> u64 {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Bytes per row ([`parse`] checked that it fits).
    pub fn row_bytes(&self) -> u64 {
        row_bytes(&self.shape, self.itemsize).unwrap_or(u64::MAX)
    }

    /// Bytes of data the shape asks for ([`parse`] checked that it fits).
    pub fn data_bytes(&self) -> u64 {
        data_bytes(&self.shape, self.itemsize).unwrap_or(u64::MAX)
    }
}

/// Bytes per row of `shape` (every dimension but the first) of `itemsize`-byte items.
fn row_bytes(shape: &[u64], itemsize: u64) -> Option<u64> {
    shape
        .iter()
        .skip(1)
        .try_fold(itemsize, |acc, &d| acc.checked_mul(d))
}

/// Bytes of a whole array of `shape`: rows times [`row_bytes`], each checked on its own (a
/// row too large to address is refused even when there are no rows).
fn data_bytes(shape: &[u64], itemsize: u64) -> Option<u64> {
    let rows = shape.first().copied().unwrap_or(1);
    row_bytes(shape, itemsize)?.checked_mul(rows)
}

/// A header problem at a byte offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyError {
    /// Where.
    pub offset: u64,
    /// What.
    pub what: String,
}

fn err<T>(offset: u64, what: impl Into<String>) -> Result<T, NpyError> {
    Err(NpyError {
        offset,
        what: what.into(),
    })
}

/// How many bytes to read to be sure of having the whole header (the parser asks for more
/// with [`header_len`] when it is longer).
pub const PREFIX: usize = 12;

/// The total header length (magic through padding) from the first [`PREFIX`] bytes.
pub fn header_len(prefix: &[u8]) -> Result<u64, NpyError> {
    if prefix.len() < 10 {
        return err(
            0,
            format!(
                "not a .npy file: {} bytes, shorter than the 10-byte preamble",
                prefix.len()
            ),
        );
    }
    if &prefix[..6] != b"\x93NUMPY" {
        return err(0, "not a .npy file: bad magic (expected \\x93NUMPY)");
    }
    match prefix[6] {
        1 => Ok(10 + u16::from_le_bytes([prefix[8], prefix[9]]) as u64),
        2 | 3 => {
            if prefix.len() < 12 {
                return err(0, "truncated .npy preamble");
            }
            Ok(12 + u32::from_le_bytes(prefix[8..12].try_into().expect("4 bytes")) as u64)
        }
        v => err(
            6,
            format!(
                "unsupported .npy version {v}.{} (expected 1, 2 or 3)",
                prefix[7]
            ),
        ),
    }
}

/// Parses a whole header (`bytes` holds at least [`header_len`] bytes).
pub fn parse(bytes: &[u8]) -> Result<NpyHeader, NpyError> {
    let total = header_len(bytes)?;
    let start = if bytes[6] == 1 { 10 } else { 12 };
    if (bytes.len() as u64) < total {
        return err(
            bytes.len() as u64,
            format!(
                "truncated .npy header: it declares {total} bytes, the file has {}",
                bytes.len()
            ),
        );
    }
    let text = std::str::from_utf8(&bytes[start..total as usize]).map_err(|e| NpyError {
        offset: start as u64 + e.valid_up_to() as u64,
        what: "the header is not valid text".into(),
    })?;
    let at = |needle: &str| {
        text.find(needle)
            .map(|p| start as u64 + p as u64)
            .unwrap_or(start as u64)
    };
    let descr_src = dict_value(text, "descr").ok_or_else(|| NpyError {
        offset: start as u64,
        what: "the header has no 'descr'".into(),
    })?;
    let fortran = dict_value(text, "fortran_order").ok_or_else(|| NpyError {
        offset: start as u64,
        what: "the header has no 'fortran_order'".into(),
    })?;
    let shape_src = dict_value(text, "shape").ok_or_else(|| NpyError {
        offset: start as u64,
        what: "the header has no 'shape'".into(),
    })?;
    match fortran.trim() {
        "False" => {}
        "True" => return err(at("fortran_order"), "Fortran-order arrays are not supported: a row is not contiguous (save with np.ascontiguousarray)"),
        other => return err(at("fortran_order"), format!("fortran_order is '{other}', expected True or False")),
    }
    let itemsize = itemsize(descr_src.trim(), 0).map_err(|what| NpyError {
        offset: at("descr"),
        what,
    })?;
    let shape = parse_shape(shape_src.trim()).map_err(|what| NpyError {
        offset: at("shape"),
        what,
    })?;
    // Refuse shapes whose byte size does not fit in 64 bits (no real file holds them).
    let fits = data_bytes(&shape, itemsize).and_then(|b| b.checked_add(total));
    if fits.is_none() {
        return err(
            at("shape"),
            format!("shape {shape:?} of {itemsize}-byte items is too large to be stored"),
        );
    }
    Ok(NpyHeader {
        version: (bytes[6], bytes[7]),
        descr: descr_src.trim().to_owned(),
        itemsize,
        shape,
        data_offset: total,
    })
}

/// The source text of a key's value in a flat Python dict literal.
fn dict_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let body = text
        .trim()
        .strip_prefix('{')?
        .trim_end()
        .strip_suffix('}')?;
    split_top(body).into_iter().find_map(|entry| {
        let (k, v) = entry.split_once(':')?;
        (unquote(k)? == key).then_some(v)
    })
}

fn unquote(s: &str) -> Option<&str> {
    let s = s.trim();
    s.strip_prefix('\'')
        .and_then(|x| x.strip_suffix('\''))
        .or_else(|| s.strip_prefix('"').and_then(|x| x.strip_suffix('"')))
}

/// Structured dtypes nested deeper than this are refused (a header of nested lists would
/// otherwise recurse without bound).
const MAX_NESTING: usize = 32;

/// Bytes per element of a dtype descr: a string like `<f8`, or a structured list nested
/// `depth` levels inside another.
fn itemsize(descr: &str, depth: usize) -> Result<u64, String> {
    if let Some(s) = unquote(descr) {
        return simple_itemsize(s);
    }
    if descr.starts_with('[') {
        if depth >= MAX_NESTING {
            return Err(format!(
                "structured dtype nested more than {MAX_NESTING} levels deep"
            ));
        }
        return structured_itemsize(descr, depth + 1);
    }
    Err(format!("unsupported dtype descr {descr}"))
}

fn simple_itemsize(s: &str) -> Result<u64, String> {
    let body = s.trim_start_matches(['<', '>', '|', '=']);
    let mut chars = body.chars();
    let kind = chars.next().ok_or_else(|| format!("empty dtype '{s}'"))?;
    let digits: String = chars.take_while(|c| c.is_ascii_digit()).collect();
    let rest = &body[kind.len_utf8() + digits.len()..];
    match kind {
        'O' => Err(format!(
            "object dtype '{s}' is not supported: its rows are Python pointers, not data"
        )),
        'b' | 'i' | 'u' | 'f' | 'c' | 'S' | 'V' | 'a' | 'm' | 'M' => {
            if !(rest.is_empty() || kind == 'm' || kind == 'M') {
                return Err(format!("unsupported dtype '{s}'"));
            }
            dtype_size(s, &digits)
        }
        // Four bytes per UCS-4 character.
        'U' => dtype_size(s, &digits)?
            .checked_mul(4)
            .ok_or_else(|| too_large(s)),
        _ => Err(format!("unsupported dtype '{s}'")),
    }
}

/// The size digits of a simple dtype.
fn dtype_size(s: &str, digits: &str) -> Result<u64, String> {
    if digits.is_empty() {
        return Err(format!("dtype '{s}' has no size"));
    }
    digits.parse().map_err(|_| too_large(s))
}

fn too_large(what: &str) -> String {
    format!("dtype {what} is too large: its size does not fit in 64 bits")
}

/// A structured dtype: `[('name', '<f4'), ('v', '<i8', (3,)), ...]`, packed (NumPy writes
/// padding as explicit void fields).
fn structured_itemsize(descr: &str, depth: usize) -> Result<u64, String> {
    let inner = descr
        .trim()
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .ok_or("bad structured dtype")?;
    let mut total = 0u64;
    for f in split_top(inner) {
        let body = f.trim();
        let body = body
            .strip_prefix('(')
            .and_then(|s| s.strip_suffix(')'))
            .ok_or_else(|| format!("bad field {f}"))?;
        // name, descr[, shape]
        let parts: Vec<&str> = split_top(body);
        if parts.len() < 2 {
            return Err(format!("bad structured field {body}"));
        }
        let size = itemsize(parts[1].trim(), depth)?;
        let field = if parts.len() > 2 {
            parse_shape(parts[2].trim())?
                .iter()
                .try_fold(size, |acc, &d| acc.checked_mul(d))
        } else {
            Some(size)
        };
        let field = field.ok_or_else(|| too_large(&format!("field ({body})")))?;
        total = total.checked_add(field).ok_or_else(|| {
            format!("structured dtype is too large: its fields add up past 2^64 bytes at ({body})")
        })?;
    }
    if total == 0 {
        return Err("empty structured dtype".into());
    }
    Ok(total)
}

/// Splits on commas at nesting depth 0 (outside quotes and brackets).
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut last) = (0i32, 0usize);
    let mut quote: Option<char> = None;
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(' | '[' | '{') => depth += 1,
            (None, ')' | ']' | '}') => depth -= 1,
            (None, ',') if depth == 0 => {
                out.push(&s[last..i]);
                last = i + 1;
            }
            _ => {}
        }
    }
    if !s[last..].trim().is_empty() {
        out.push(&s[last..]);
    }
    out
}

fn parse_shape(s: &str) -> Result<Vec<u64>, String> {
    let inner = s
        .strip_prefix('(')
        .and_then(|x| x.strip_suffix(')'))
        .ok_or_else(|| format!("shape {s} is not a tuple"))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.trim_end_matches('L')
                .parse::<u64>()
                .map_err(|_| format!("shape {s} has a non-integer dimension '{p}'"))
        })
        .collect()
}

/// Writes a version 1 header for a C-order array of `descr` with `shape`, padded so the
/// data starts at a multiple of 64 bytes.
pub fn write_header(descr: &str, shape: &[u64]) -> Vec<u8> {
    let dims = match shape {
        [one] => format!("({one},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {dims}, }}");
    let unpadded = 10 + dict.len() + 1;
    dict.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let h = write_header("|u1", &[1000, 64]);
        assert_eq!(h.len() % 64, 0);
        let p = parse(&h).unwrap();
        assert_eq!(p.rows(), 1000);
        assert_eq!(p.row_bytes(), 64);
        assert_eq!(p.data_offset, h.len() as u64);
        let p = parse(&write_header("<f8", &[7])).unwrap();
        assert_eq!((p.rows(), p.row_bytes()), (7, 8));
    }

    #[test]
    fn dtypes() {
        assert_eq!(itemsize("'<f4'", 0), Ok(4));
        assert_eq!(itemsize("'<U3'", 0), Ok(12));
        assert_eq!(itemsize("'|S10'", 0), Ok(10));
        assert_eq!(itemsize("'<M8[ns]'", 0), Ok(8));
        assert_eq!(itemsize("[('a', '<f4'), ('b', '<i8', (3,))]", 0), Ok(28));
        assert!(itemsize("'|O'", 0).unwrap_err().contains("object"));
        assert!(itemsize("[('a', '|O')]", 0).is_err());
    }

    #[test]
    fn absurd_shapes_and_odd_dtypes_are_errors_not_panics() {
        let h = write_header("<f4", &[4_611_686_018_427_387_904, 4]);
        assert!(parse(&h).unwrap_err().what.contains("too large"));
        let h = write_header("\u{2039}\u{e9}", &[3]);
        assert!(parse(&h).is_err());
    }

    #[test]
    fn refuses_bad_headers() {
        assert!(header_len(b"\x93NUMPX\x01\x00\x10\x00")
            .unwrap_err()
            .what
            .contains("magic"));
        let mut h = write_header("<f4", &[3, 2]);
        let mut fortran = h.clone();
        let at = fortran.windows(5).position(|w| w == b"False").unwrap();
        fortran[at..at + 5].copy_from_slice(b"True ");
        let e = parse(&fortran).unwrap_err();
        assert!(e.what.contains("Fortran"));
        h.truncate(30);
        assert!(parse(&h).unwrap_err().what.contains("truncated"));
    }

    /// A version 1 header whose descr is given as source text (a structured list).
    fn raw_header(descr_src: &str, shape: &str) -> Vec<u8> {
        let dict =
            format!("{{'descr': {descr_src}, 'fortran_order': False, 'shape': {shape}, }}\n");
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
        out.extend_from_slice(dict.as_bytes());
        out
    }

    /// Regression (issue 13): a structured dtype whose row size overflows 64 bits was read
    /// as 8-byte rows (the field's 2^64 bytes wrapped to 0). Every size is checked, and the
    /// error points at the descr.
    #[test]
    fn sizes_that_overflow_are_refused_at_the_descr() {
        let descr_at = |h: &[u8]| h.windows(5).position(|w| w == b"descr").unwrap() as u64;
        for (descr, words) in [
            (
                "[('a', '<f8'), ('b', '<f8', (2305843009213693952,))]",
                "too large",
            ),
            ("[('a', '<f8', (4294967296, 4294967296))]", "too large"),
            (
                "[('a', '|V9223372036854775808'), ('b', '|V9223372036854775808')]",
                "add up past 2^64",
            ),
            ("'<U4611686018427387904'", "too large"),
            ("'<f99999999999999999999'", "too large"),
        ] {
            let h = raw_header(descr, "(3,)");
            let e = parse(&h).unwrap_err();
            assert!(e.what.contains(words), "{descr}: {}", e.what);
            assert_eq!(e.offset, descr_at(&h), "{descr}");
        }
        // A row too large to address is refused even with no rows (rows x row = 0).
        let h = raw_header("'<f8'", "(0, 4294967296, 4294967296)");
        assert!(parse(&h).unwrap_err().what.contains("too large"));
        // Nesting is bounded (no unbounded recursion on a hostile header).
        let deep = format!("{}'<f4'{}", "[('a', ".repeat(40), ")]".repeat(40));
        assert!(parse(&raw_header(&deep, "(3,)"))
            .unwrap_err()
            .what
            .contains("nested"));
        let ok = format!("{}'<f4'{}", "[('a', ".repeat(5), ")]".repeat(5));
        assert_eq!(parse(&raw_header(&ok, "(3, 2)")).unwrap().row_bytes(), 8);
    }
}
