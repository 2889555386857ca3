//! MosaicML Streaming's MDS datasets, read in place: a directory with `index.json` and
//! `shard.NNNNN.mds` files. A record is a sample: its encoded bytes in its shard, which
//! the shard's own offset table locates (that table is the index: nothing is built or
//! saved). Decoding a sample's columns is the client's (`riffle.formats.mds_sample`).
//!
//! A shard is `u32 samples`, `samples + 1` u32 offsets from the file's start, the shard's
//! JSON config, then the samples back to back (MDS's published layout, version 2). A
//! sample is one u32 length per variable-size column, then every column's bytes, columns
//! in the order `index.json` lists them.
//!
//! Refused with the file and what is wrong: an index of another format or version, a
//! compressed shard (naming its compression: it cannot be read in place), a shard name
//! that is not a plain file name in the directory, columns that differ between shards, a
//! shard whose header disagrees with `index.json` or with its own size.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::index::OffsetIndex;
use crate::{Error, Result};

/// One column of an MDS dataset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsColumn {
    /// Its name.
    pub name: String,
    /// MDS's encoding (`bytes`, `str`, `int`, `ndarray:uint8:4096`, ...).
    pub encoding: String,
    /// Its fixed size in bytes, when it has one.
    pub size: Option<u64>,
}

/// One shard: its path, its size, and its samples' offsets (plus the end).
#[derive(Debug)]
pub(crate) struct Shard {
    pub path: PathBuf,
    pub size: u64,
    pub index: OffsetIndex,
}

/// Where a dataset's `index.json` is, if `path` names an MDS dataset (the directory
/// holding it, or the file itself).
pub(crate) fn index_of(path: &Path) -> Option<PathBuf> {
    if path.file_name().is_some_and(|n| n == "index.json") && path.is_file() {
        return Some(path.to_path_buf());
    }
    let p = path.join("index.json");
    (path.is_dir() && p.is_file()).then_some(p)
}

/// The largest `index.json` read.
pub(crate) const INDEX_MAX: u64 = 256 << 20;

/// The MDS dataset whose `index.json` is `index`: its shards and columns.
pub(crate) fn open(index: &Path) -> Result<(Vec<Shard>, Vec<MdsColumn>)> {
    let bad = |what: String| Error::BadInput {
        path: index.into(),
        offset: None,
        what,
    };
    let meta = std::fs::metadata(index).map_err(|e| Error::io(index, "stat", None, e))?;
    if meta.len() > INDEX_MAX {
        return Err(bad(format!("{} bytes: too large for an index", meta.len())));
    }
    // Through the door: not waited on if a FIFO, refused unless a regular file.
    let text = crate::door::read_meta(index, INDEX_MAX, crate::door::Follow::Yes)?
        .ok_or_else(|| Error::io(index, "read", None, std::io::ErrorKind::NotFound.into()))?;
    let json: Value = serde_json::from_slice(&text).map_err(|e| Error::BadInput {
        path: index.into(),
        offset: Some(
            text.split_inclusive(|&b| b == b'\n')
                .take(e.line().saturating_sub(1))
                .map(|l| l.len() as u64)
                .sum::<u64>()
                + e.column().saturating_sub(1) as u64,
        ),
        what: format!("not valid JSON: {e}"),
    })?;
    if json.get("version").and_then(Value::as_u64) != Some(2) {
        return Err(bad(
            "not an MDS index of version 2 (no \"version\": 2)".into()
        ));
    }
    let shards = json
        .get("shards")
        .and_then(Value::as_array)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad("no \"shards\" listed".into()))?;
    let dir = index.parent().unwrap_or(Path::new("."));
    let mut columns: Option<Vec<MdsColumn>> = None;
    let mut out = Vec::with_capacity(shards.len());
    for (k, s) in shards.iter().enumerate() {
        let field = |name: &str| s.get(name).filter(|v| !v.is_null());
        let format = field("format").and_then(Value::as_str).unwrap_or("");
        if format != "mds" {
            return Err(bad(format!(
                "shard {k} is in format {format:?}; riffle reads MDS shards (\"mds\")"
            )));
        }
        if let Some(c) = field("compression") {
            return Err(bad(format!(
                "shard {k} is compressed ({}): riffle reads MDS shards in place, at random, \
                 which a compressed shard does not allow; write the dataset with \
                 compression=None",
                c.as_str().unwrap_or("?")
            )));
        }
        let basename = field("raw_data")
            .and_then(|r| r.get("basename"))
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("shard {k} has no raw_data.basename")))?;
        if basename.is_empty() || basename.contains('/') || basename == "." || basename == ".." {
            return Err(bad(format!(
                "shard {k}'s file {basename:?} is not a plain file name in the dataset's directory"
            )));
        }
        let samples = field("samples")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad(format!("shard {k} has no sample count")))?;
        let cols = shard_columns(s).map_err(|w| bad(format!("shard {k}: {w}")))?;
        match &columns {
            None => columns = Some(cols),
            Some(c) if *c != cols => {
                return Err(bad(format!(
                    "shard {k}'s columns differ from shard 0's: one dataset, one set of columns"
                )))
            }
            Some(_) => {}
        }
        let path = dir.join(basename);
        let (size, index) = read_offsets(&path, samples)?;
        if samples > 0 {
            out.push(Shard { path, size, index });
        }
    }
    if out.is_empty() {
        return Err(bad("every shard is empty: no samples".into()));
    }
    Ok((out, columns.unwrap_or_default()))
}

fn shard_columns(s: &Value) -> std::result::Result<Vec<MdsColumn>, String> {
    let list = |name: &str| {
        s.get(name)
            .and_then(Value::as_array)
            .ok_or_else(|| format!("no {name}"))
    };
    let (names, encs, sizes) = (
        list("column_names")?,
        list("column_encodings")?,
        list("column_sizes")?,
    );
    if names.len() != encs.len() || names.len() != sizes.len() || names.is_empty() {
        return Err("column_names, column_encodings and column_sizes differ in length".into());
    }
    names
        .iter()
        .zip(encs)
        .zip(sizes)
        .map(|((n, e), z)| {
            Ok(MdsColumn {
                name: n
                    .as_str()
                    .ok_or("a column name is not a string")?
                    .to_owned(),
                encoding: e
                    .as_str()
                    .ok_or("a column encoding is not a string")?
                    .to_owned(),
                size: match z {
                    Value::Null => None,
                    v => Some(v.as_u64().ok_or("a column size is not a number")?),
                },
            })
        })
        .collect()
}

/// A shard's size and its samples' offsets (plus the end), checked against its size and
/// against the sample count `index.json` gives.
fn read_offsets(path: &Path, samples: u64) -> Result<(u64, OffsetIndex)> {
    let bad = |offset: u64, what: String| Error::BadInput {
        path: path.into(),
        offset: Some(offset),
        what,
    };
    let f = crate::door::open_data(path, false).map_err(|e| Error::io(path, "open", None, e))?;
    let meta = f.metadata().map_err(|e| Error::io(path, "stat", None, e))?;
    if !meta.is_file() {
        return Err(bad(
            0,
            format!(
                "is {}, not a regular file: a shard is read in place",
                crate::door::file_type_name(&meta.file_type())
            ),
        ));
    }
    let size = meta.len();
    // Counts from a hostile index.json must not overflow or allocate past the file.
    let head = samples
        .checked_add(1)
        .and_then(|n| n.checked_mul(4))
        .and_then(|n| n.checked_add(4))
        .unwrap_or(u64::MAX);
    if size < head {
        return Err(bad(
            size,
            format!("the shard ends before its header ({head} bytes for {samples} samples)"),
        ));
    }
    let mut buf = vec![0u8; head as usize];
    f.read_exact_at(&mut buf, 0)
        .map_err(|e| Error::io(path, "read", Some(0), e))?;
    let n = u32::from_le_bytes(buf[..4].try_into().expect("4 bytes")) as u64;
    if n != samples {
        return Err(bad(
            0,
            format!("the shard says it holds {n} samples, index.json says {samples}"),
        ));
    }
    let offsets: Vec<u64> = buf[4..]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")) as u64)
        .collect();
    for (i, w) in offsets.windows(2).enumerate() {
        if w[1] < w[0] {
            return Err(bad(
                4 + 4 * (i as u64 + 1),
                format!(
                    "sample {} starts at {}, before sample {i} ({})",
                    i + 1,
                    w[1],
                    w[0]
                ),
            ));
        }
    }
    if offsets[0] < head || offsets[samples as usize] > size {
        return Err(bad(
            4,
            format!(
                "its samples lie at {}..{}, outside the shard's data ({head}..{size})",
                offsets[0], offsets[samples as usize]
            ),
        ));
    }
    Ok((
        size,
        OffsetIndex {
            offsets,
            last_unterminated: false,
        },
    ))
}

/// Writes an MDS dataset of one column, `x`, to the new directory `out`: each record's
/// bytes, as `ndarray:uint8:SIZE` when every record is SIZE bytes (a sample is then the
/// record itself), else `bytes`. Shards of up to `shard_bytes`. For `riffle gen`.
pub(crate) fn write(
    out: &Path,
    records: u64,
    shard_bytes: u64,
    fixed: Option<u64>,
    record: &mut dyn FnMut(u64, &mut Vec<u8>),
    progress: &mut dyn FnMut(u64),
) -> Result<u64> {
    let encoding = match fixed {
        Some(n) => format!("ndarray:uint8:{n}"),
        None => "bytes".into(),
    };
    let config = |samples: u64| {
        serde_json::json!({
            "column_encodings": [encoding],
            "column_names": ["x"],
            "column_sizes": [fixed],
            "compression": null,
            "format": "mds",
            "hashes": [],
            "size_limit": shard_bytes,
            "version": 2,
            "samples": samples,
        })
    };
    let mut shards = Vec::new();
    let mut id = 0u64;
    let mut total = 0u64;
    let mut rec = Vec::new();
    while id < records {
        let mut samples: Vec<Vec<u8>> = Vec::new();
        let mut bytes = 0u64;
        while id < records && (samples.is_empty() || bytes < shard_bytes) {
            record(id, &mut rec);
            let mut s = Vec::with_capacity(rec.len() + 4);
            if fixed.is_none() {
                s.extend_from_slice(&(rec.len() as u32).to_le_bytes());
            }
            s.extend_from_slice(&rec);
            bytes += s.len() as u64;
            samples.push(s);
            id += 1;
        }
        let name = format!("shard.{:05}.mds", shards.len());
        let n = samples.len() as u64;
        let cfg = serde_json::to_vec(&config(n)).expect("JSON");
        let mut at = 4 + 4 * (n + 1) + cfg.len() as u64;
        let mut file = Vec::with_capacity((at + bytes) as usize);
        file.extend_from_slice(&(n as u32).to_le_bytes());
        for s in &samples {
            file.extend_from_slice(&(at as u32).to_le_bytes());
            at += s.len() as u64;
        }
        if at > u32::MAX as u64 {
            return Err(Error::Invalid(
                "an MDS shard must stay under 4 GiB (u32 offsets)".into(),
            ));
        }
        file.extend_from_slice(&(at as u32).to_le_bytes());
        file.extend_from_slice(&cfg);
        for s in &samples {
            file.extend_from_slice(s);
        }
        let p = out.join(&name);
        crate::door::write_new(&p, &file)?;
        total += file.len() as u64;
        let mut c = config(n);
        c["raw_data"] = serde_json::json!({"basename": name, "bytes": file.len(), "hashes": {}});
        c["zip_data"] = Value::Null;
        shards.push(c);
        progress(id);
    }
    let index =
        serde_json::to_vec(&serde_json::json!({"shards": shards, "version": 2})).expect("JSON");
    let p = out.join("index.json");
    crate::door::write_new(&p, &index)?;
    Ok(total + index.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dataset(dir: &Path) -> PathBuf {
        write(
            dir,
            50,
            1000,
            Some(64),
            &mut |id, out| {
                out.clear();
                out.extend_from_slice(&[id as u8; 64]);
            },
            &mut |_| {},
        )
        .unwrap();
        dir.join("index.json")
    }

    fn edited(index: &Path, edit: impl FnOnce(&mut Value)) -> String {
        let mut v: Value = serde_json::from_slice(&std::fs::read(index).unwrap()).unwrap();
        edit(&mut v);
        std::fs::write(index, serde_json::to_vec(&v).unwrap()).unwrap();
        match open(index) {
            Ok(_) => "opened".into(),
            Err(e) => e.to_string(),
        }
    }

    /// What `riffle gen` writes opens, with one sample per record; a hostile or damaged
    /// index is refused with the reason, never followed outside the directory, never a
    /// panic or an allocation its numbers ask for.
    #[test]
    fn written_datasets_open_and_bad_indexes_are_refused() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let index = dataset(dir.path());
        let (shards, cols) = open(&index).unwrap();
        assert_eq!(shards.iter().map(|s| s.index.len()).sum::<u64>(), 50);
        assert!(shards.len() > 1, "several shards of at most 1000 bytes");
        assert_eq!(cols[0].encoding, "ndarray:uint8:64");
        let good = std::fs::read(&index).unwrap();
        let restore = || std::fs::write(&index, &good).unwrap();
        let e = edited(&index, |v| {
            v["shards"][0]["raw_data"]["basename"] = "../../etc/passwd".into()
        });
        assert!(e.contains("not a plain file name"), "{e}");
        restore();
        let e = edited(&index, |v| v["shards"][0]["samples"] = u64::MAX.into());
        assert!(e.contains("ends before its header"), "{e}");
        restore();
        let e = edited(&index, |v| v["shards"][1]["compression"] = "zstd:7".into());
        assert!(e.contains("zstd:7"), "{e}");
        restore();
        let e = edited(&index, |v| {
            v["shards"][1]["column_names"] = serde_json::json!(["y"])
        });
        assert!(e.contains("columns differ"), "{e}");
        restore();
        std::fs::write(&index, b"{\"version\": 2, \"shards\": [").unwrap();
        assert!(open(&index)
            .unwrap_err()
            .to_string()
            .contains("not valid JSON"));
        restore();
        // A shard whose offsets run backwards.
        let shard = shards[0].path.clone();
        let mut b = std::fs::read(&shard).unwrap();
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        std::fs::write(&shard, &b).unwrap();
        let e = open(&index).unwrap_err().to_string();
        assert!(
            e.contains("before sample 0") || e.contains("outside"),
            "{e}"
        );
    }

    /// The file an error names, if it names one.
    fn named(e: &Error) -> Option<&Path> {
        match e {
            Error::BadInput { path, .. } | Error::Io { path, .. } => Some(path),
            _ => None,
        }
    }

    /// What an opened dataset promises whatever its files said: every shard's offsets
    /// are in order, after its header and inside the file.
    fn check_open(shards: &[Shard]) -> Result<(), proptest::prelude::TestCaseError> {
        for sh in shards {
            let o = &sh.index.offsets;
            let head = 4 + 4 * o.len() as u64;
            proptest::prop_assert!(o.windows(2).all(|w| w[0] <= w[1]), "{o:?}");
            proptest::prop_assert!(o[0] >= head && *o.last().unwrap() <= sh.size, "{o:?}");
        }
        Ok(())
    }

    /// A dataset `riffle gen` could write: `records` records of fixed or varying sizes in
    /// shards of up to `shard_bytes`.
    fn written(dir: &Path, records: u64, shard_bytes: u64, fixed: bool) -> PathBuf {
        write(
            dir,
            records,
            shard_bytes,
            fixed.then_some(16),
            &mut |id, out| {
                out.clear();
                let n = if fixed { 16 } else { (id * 7 % 40) as usize };
                out.extend((0..n).map(|i| (id as usize + i) as u8));
            },
            &mut |_| {},
        )
        .unwrap();
        dir.join("index.json")
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// A written dataset opens with its samples; its index.json with bytes changed,
        /// inserted, removed or cut, or with a field of a shard set to another value, and
        /// its shards' offset tables with bytes changed, open or are refused with an error
        /// naming index.json or the shard, never a panic; what opens keeps the offsets'
        /// invariants; a shard whose sample count is changed is always refused.
        #[test]
        fn damaged_indexes_and_offset_tables_are_refused_naming_the_file(
            records in 1u64..40,
            shard_bytes in 20u64..600,
            fixed in proptest::prelude::any::<bool>(),
            text_edits in proptest::collection::vec(
                (proptest::prelude::any::<proptest::sample::Index>(), 0u8..4, proptest::prelude::any::<u8>()), 0..4),
            field in (proptest::prelude::any::<proptest::sample::Index>(), 0usize..6, proptest::prelude::any::<u64>()),
            table in (proptest::prelude::any::<proptest::sample::Index>(), proptest::prelude::any::<proptest::sample::Index>(), 1u8..=255),
        ) {
            let dir = tempfile::tempdir_in(".").unwrap();
            let index = written(dir.path(), records, shard_bytes, fixed);
            let (shards, _) = open(&index).unwrap();
            proptest::prop_assert_eq!(shards.iter().map(|s| s.index.len()).sum::<u64>(), records);
            check_open(&shards)?;
            let good = std::fs::read(&index).unwrap();
            let in_dir = |e: &Error| named(e).is_some_and(|p| p == index || p.parent() == Some(dir.path()));

            // The text of index.json.
            let mut text = good.clone();
            for (i, op, v) in &text_edits {
                let i = i.index(text.len().max(1)).min(text.len());
                match op {
                    0 if i < text.len() => text[i] = *v,
                    1 => text.insert(i, *v),
                    2 if i < text.len() => { text.remove(i); }
                    _ => text.truncate(i),
                }
            }
            std::fs::write(&index, &text).unwrap();
            match open(&index) {
                Ok((shards, _)) => check_open(&shards)?,
                Err(e) => proptest::prop_assert!(in_dir(&e), "{e}"),
            }

            // One field of one shard, set to a number, a string or null.
            let mut v: Value = serde_json::from_slice(&good).unwrap();
            let n = v["shards"].as_array().unwrap().len();
            let (k, f, x) = field;
            let k = k.index(n);
            let value = match x % 3 {
                0 => Value::from(x / 3),
                1 => Value::from(format!("{}", x % 1000)),
                _ => Value::Null,
            };
            let s = &mut v["shards"][k];
            match f {
                0 => s["samples"] = value,
                1 => s["raw_data"]["basename"] = value,
                2 => s["column_sizes"] = value,
                3 => s["compression"] = value,
                4 => s["format"] = value,
                _ => v["version"] = value,
            }
            std::fs::write(&index, serde_json::to_vec(&v).unwrap()).unwrap();
            match open(&index) {
                Ok((shards, _)) => check_open(&shards)?,
                Err(e) => proptest::prop_assert!(in_dir(&e), "{e}"),
            }
            std::fs::write(&index, &good).unwrap();

            // A byte of one shard's offset table (its count, or an offset).
            let (k, i, x) = table;
            let shard = &shards[k.index(shards.len())];
            let mut b = std::fs::read(&shard.path).unwrap();
            let at = i.index(4 + 4 * shard.index.offsets.len());
            b[at] ^= x;
            std::fs::write(&shard.path, &b).unwrap();
            match open(&index) {
                Ok((shards, _)) => {
                    proptest::prop_assert!(at >= 4, "a changed sample count passed");
                    check_open(&shards)?;
                }
                Err(e) => proptest::prop_assert_eq!(named(&e), Some(shard.path.as_path()), "{}", e),
            }
        }
    }
}
