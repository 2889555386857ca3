//! Datasets through the CLI: generation, indexing, reading back, and every kind of bad
//! input the brief lists, each with a clear error naming the file and byte offset.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use crate::{assert_ok, gen, text, Sandbox};

fn index_json(sb: &Sandbox, args: &[&std::ffi::OsStr]) -> Value {
    let o = sb
        .cmd()
        .arg("index")
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    assert_ok(&o);
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Reads records through `riffle cat --framed`.
fn cat(sb: &Sandbox, args: &[&std::ffi::OsStr]) -> Vec<Vec<u8>> {
    let o = sb
        .cmd()
        .arg("cat")
        .arg("--framed")
        .args(args)
        .output()
        .unwrap();
    assert_ok(&o);
    let mut out = Vec::new();
    let mut b = &o.stdout[..];
    while !b.is_empty() {
        let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        out.push(b[8..8 + n].to_vec());
        b = &b[8 + n..];
    }
    out
}

/// A failed command: exit 1, no panic, and stderr names `path` and `offset` (if given).
pub(crate) fn assert_bad(o: &Output, path: &Path, offset: Option<u64>, words: &str) {
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "expected exit 1; stderr:\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    let name = path.file_name().unwrap().to_string_lossy();
    assert!(err.contains(&*name), "error does not name {name}:\n{err}");
    if let Some(off) = offset {
        assert!(
            err.contains(&format!("at byte {off}")),
            "error does not give byte {off}:\n{err}"
        );
    }
    assert!(
        err.to_lowercase().contains(&words.to_lowercase()),
        "error does not say '{words}':\n{err}"
    );
}

fn index(sb: &Sandbox, p: &Path) -> Output {
    sb.cmd().arg("index").arg(p).output().unwrap()
}

fn id_of(rec: &[u8]) -> u64 {
    u64::from_le_bytes(rec[..8].try_into().unwrap())
}

#[test]
fn every_format_round_trips_ids_and_index_stays_within_8_bytes_per_record() {
    let sb = Sandbox::new();
    let d = sb.data();
    for (fmt, file, extra) in [
        ("npy", "a.npy", vec![]),
        ("fixed", "a.bin", vec![]),
        ("tfrecord", "a.tfrecord", vec!["--size-jitter", "0.5"]),
        ("lines", "a.jsonl", vec!["--size-jitter", "0.5"]),
    ] {
        let path = d.join(file);
        gen(&sb, &path, fmt, 5000, 64, &extra);
        let mut args: Vec<&std::ffi::OsStr> = vec![path.as_os_str()];
        if fmt == "fixed" {
            args.extend([
                std::ffi::OsStr::new("--format"),
                std::ffi::OsStr::new("fixed:64"),
            ]);
        }
        let ix = index_json(&sb, &args);
        assert_eq!(ix["records"], 5000, "{fmt}");
        assert!(
            ix["index_bytes_per_record"].as_f64().unwrap() <= 8.01,
            "{fmt}: {ix}"
        );
        let recs = cat(&sb, &args);
        assert_eq!(recs.len(), 5000);
        for (i, r) in recs.iter().enumerate() {
            if fmt == "lines" {
                let v: Value =
                    serde_json::from_slice(r).unwrap_or_else(|e| panic!("line {i}: {e}"));
                assert_eq!(v["id"], i as u64);
            } else {
                assert_eq!(id_of(r), i as u64, "{fmt}");
            }
        }
    }
}

#[test]
fn gen_is_deterministic_and_labels_can_be_sorted() {
    let sb = Sandbox::new();
    let (a, b) = (sb.data().join("a.tfrecord"), sb.data().join("b.tfrecord"));
    gen(
        &sb,
        &a,
        "tfrecord",
        1000,
        40,
        &[
            "--size-jitter",
            "0.3",
            "--seed",
            "7",
            "--labels",
            "4",
            "--sorted",
        ],
    );
    gen(
        &sb,
        &b,
        "tfrecord",
        1000,
        40,
        &[
            "--size-jitter",
            "0.3",
            "--seed",
            "7",
            "--labels",
            "4",
            "--sorted",
        ],
    );
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let labels: Vec<u32> = cat(&sb, &[a.as_os_str()])
        .iter()
        .map(|r| u32::from_le_bytes(r[8..12].try_into().unwrap()))
        .collect();
    assert!(labels.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!((labels[0], labels[999]), (0, 3));
}

#[test]
fn a_directory_is_one_dataset_in_name_order_and_globs_work() {
    let sb = Sandbox::new();
    let dir = sb.data().join("shards");
    std::fs::create_dir(&dir).unwrap();
    // Written out of order: ids must follow the file names, not creation order.
    for (name, seed) in [
        ("part-2.tfrecord", 2),
        ("part-0.tfrecord", 0),
        ("part-1.tfrecord", 1),
    ] {
        gen(
            &sb,
            &dir.join(name),
            "tfrecord",
            100 + seed,
            30,
            &["--seed", &seed.to_string()],
        );
    }
    let ix = index_json(&sb, &[dir.as_os_str()]);
    assert_eq!(ix["files"], 3);
    assert_eq!(ix["records"], 303);
    let recs = cat(
        &sb,
        &[
            dir.as_os_str(),
            std::ffi::OsStr::new("--ids"),
            std::ffi::OsStr::new("0,99,100,200,201,302"),
        ],
    );
    // Local ids restart in each file: part-0 has 100, part-1 101, part-2 102 records.
    assert_eq!(
        recs.iter().map(|r| id_of(r)).collect::<Vec<_>>(),
        vec![0, 99, 0, 100, 0, 101]
    );
    let pattern = dir.join("part-[01].tfrecord");
    let ix = index_json(&sb, &[pattern.as_os_str()]);
    assert_eq!(ix["records"], 201);
    // The sidecars written next to the shards are not data.
    assert!(dir.join("part-0.tfrecord.ridx").is_file());
}

#[test]
fn lines_keep_crlf_and_a_last_line_without_newline() {
    let sb = Sandbox::new();
    let p = sb.data().join("t.csv");
    std::fs::write(&p, b"h1,h2\r\n1,2\r\n\r\n3,4").unwrap();
    let recs = cat(&sb, &[p.as_os_str()]);
    assert_eq!(
        recs,
        vec![b"1,2\r".to_vec(), b"\r".to_vec(), b"3,4".to_vec()]
    );
}

#[test]
fn stale_and_corrupt_indexes_are_never_trusted() {
    let sb = Sandbox::new();
    let p = sb.data().join("s.jsonl");
    gen(&sb, &p, "lines", 2000, 80, &[]);
    let first = index_json(&sb, &[p.as_os_str()]);
    assert_eq!(first["indexes"]["built"], 1);
    let again = index_json(&sb, &[p.as_os_str()]);
    assert_eq!(again["indexes"]["loaded"], 1);

    // Corrupt the sidecar: rebuilt with a notice.
    let side = PathBuf::from(format!("{}.ridx", p.display()));
    let mut bytes = std::fs::read(&side).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&side, &bytes).unwrap();
    let o = sb.cmd().args(["index", "--json"]).arg(&p).output().unwrap();
    assert_ok(&o);
    assert!(
        text(&o.stderr).contains("checksum mismatch"),
        "{}",
        text(&o.stderr)
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["indexes"]["rebuilt"], 1);

    // Change the file after indexing: refused with --no-rebuild, rebuilt otherwise.
    let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
    std::io::Write::write_all(&mut f, b"{\"id\":2000}\n").unwrap();
    drop(f);
    let o = sb
        .cmd()
        .args(["index", "--no-rebuild"])
        .arg(&p)
        .output()
        .unwrap();
    assert_bad(&o, &p, None, "stale");
    let v = index_json(&sb, &[p.as_os_str()]);
    assert_eq!(v["records"], 2001);
    assert_eq!(v["indexes"]["rebuilt"], 1);
}

fn tfrecord_file(sb: &Sandbox, name: &str) -> (PathBuf, Vec<u8>) {
    let p = sb.data().join(name);
    gen(sb, &p, "tfrecord", 3, 20, &[]);
    let b = std::fs::read(&p).unwrap();
    (p, b)
}

#[test]
fn bad_tfrecords_name_the_file_and_offset() {
    let sb = Sandbox::new();
    // Each record: 12 header + 20 data + 4 crc = 36 bytes; record 1 starts at 36.
    let (p, b) = tfrecord_file(&sb, "trunc.tfrecord");
    std::fs::write(&p, &b[..36 + 20]).unwrap();
    assert_bad(&index(&sb, &p), &p, Some(36), "truncated");

    let (p, mut b) = tfrecord_file(&sb, "lencrc.tfrecord");
    b[36 + 9] ^= 0x55; // the stored length CRC of record 1
    std::fs::write(&p, &b).unwrap();
    assert_bad(&index(&sb, &p), &p, Some(44), "length CRC");

    let (p, mut b) = tfrecord_file(&sb, "datacrc.tfrecord");
    b[36 + 15] ^= 0x01; // a data byte of record 1
    std::fs::write(&p, &b).unwrap();
    assert_bad(&index(&sb, &p), &p, Some(36 + 32), "data CRC");

    // --no-verify trusts the data (documented trade-off), but truncation is still caught.
    let o = sb
        .cmd()
        .args(["index", "--no-verify"])
        .arg(&p)
        .output()
        .unwrap();
    assert_ok(&o);
    // The unchecked index it saved must not pass for a checked one later.
    assert_bad(&index(&sb, &p), &p, Some(36 + 32), "data CRC");
}

fn npy(sb: &Sandbox, name: &str) -> (PathBuf, Vec<u8>) {
    let p = sb.data().join(name);
    gen(sb, &p, "npy", 10, 16, &[]);
    let b = std::fs::read(&p).unwrap();
    (p, b)
}

fn replace(b: &mut [u8], from: &[u8], to: &[u8]) {
    assert_eq!(from.len(), to.len());
    let at = b
        .windows(from.len())
        .position(|w| w == from)
        .expect("pattern in header");
    b[at..at + to.len()].copy_from_slice(to);
}

#[test]
fn bad_npy_files_name_the_file_and_offset() {
    let sb = Sandbox::new();
    let (p, mut b) = npy(&sb, "magic.npy");
    b[1] = b'X';
    std::fs::write(&p, &b).unwrap();
    assert_bad(&index(&sb, &p), &p, Some(0), "magic");

    let (p, b) = npy(&sb, "header.npy");
    std::fs::write(&p, &b[..40]).unwrap();
    assert_bad(&index(&sb, &p), &p, None, "truncated .npy header");

    let (p, mut b) = npy(&sb, "fortran.npy");
    replace(&mut b, b"False", b"True ");
    std::fs::write(&p, &b).unwrap();
    assert_bad(&index(&sb, &p), &p, None, "Fortran");

    let (p, mut b) = npy(&sb, "object.npy");
    replace(&mut b, b"'|u1'", b"'|O' ");
    std::fs::write(&p, &b).unwrap();
    assert_bad(&index(&sb, &p), &p, None, "object dtype");

    let (p, b) = npy(&sb, "short.npy");
    let cut = b.len() - 5;
    std::fs::write(&p, &b[..cut]).unwrap();
    assert_bad(
        &index(&sb, &p),
        &p,
        Some(cut as u64),
        "shorter than its shape",
    );
}

#[test]
fn empty_missing_and_mixed_inputs_are_refused() {
    let sb = Sandbox::new();
    let empty = sb.data().join("empty.jsonl");
    std::fs::write(&empty, b"").unwrap();
    assert_bad(&index(&sb, &empty), &empty, Some(0), "empty file");

    let dir = sb.data().join("nothing");
    std::fs::create_dir(&dir).unwrap();
    assert_bad(&index(&sb, &dir), &dir, None, "no data files");

    let missing = sb.data().join("missing.npy");
    assert_bad(&index(&sb, &missing), &missing, None, "No such file");

    let mixed = sb.data().join("mixed");
    std::fs::create_dir(&mixed).unwrap();
    gen(&sb, &mixed.join("a.npy"), "npy", 3, 16, &[]);
    gen(&sb, &mixed.join("b.jsonl"), "lines", 3, 40, &[]);
    assert_bad(
        &index(&sb, &mixed),
        &mixed.join("b.jsonl"),
        None,
        "mixed formats",
    );

    let unknown = sb.data().join("data.weird");
    std::fs::write(&unknown, b"x").unwrap();
    assert_bad(&index(&sb, &unknown), &unknown, None, "--format");

    let partial = sb.data().join("p.bin");
    std::fs::write(&partial, vec![0u8; 250]).unwrap();
    let o = sb
        .cmd()
        .args(["index", "--format", "fixed:100"])
        .arg(&partial)
        .output()
        .unwrap();
    assert_bad(&o, &partial, Some(200), "partial record");
}

#[test]
fn a_record_longer_than_the_memory_budget_is_refused() {
    let sb = Sandbox::new();
    let p = sb.data().join("long.jsonl");
    let mut body = b"{\"a\":1}\n".repeat(3);
    let long_at = body.len();
    body.extend(std::iter::repeat_n(b'x', 5000));
    body.push(b'\n');
    std::fs::write(&p, &body).unwrap();
    let o = sb
        .cmd()
        .args(["index", "--memory", "4K"])
        .arg(&p)
        .output()
        .unwrap();
    assert_bad(&o, &p, Some(long_at as u64), "memory budget");
    assert_ok(
        &sb.cmd()
            .args(["index", "--memory", "8K"])
            .arg(&p)
            .output()
            .unwrap(),
    );
}

#[test]
fn separator_and_header_lines_can_be_set() {
    let sb = Sandbox::new();
    let p = sb.data().join("t.txt");
    std::fs::write(&p, b"header one\theader two\ta\tb b\t\tc").unwrap();
    let recs = cat(
        &sb,
        &[
            p.as_os_str(),
            "--sep".as_ref(),
            "\\t".as_ref(),
            "--skip".as_ref(),
            "2".as_ref(),
        ],
    );
    assert_eq!(
        recs,
        vec![b"a".to_vec(), b"b b".to_vec(), b"".to_vec(), b"c".to_vec()]
    );
    let npy = sb.data().join("n.npy");
    gen(&sb, &npy, "npy", 3, 16, &[]);
    let o = sb
        .cmd()
        .args(["index", "--sep", ","])
        .arg(&npy)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("lines format"));
}

// Offset-index identity and validation (issue 13). The sidecar layout these tests forge is
// the one `engine/src/dataset/index.rs` documents (version 2): the record count at byte 80,
// the N + 1 offsets from byte 96, and a CRC32C of everything before the last 4 bytes.

const SIDECAR_COUNT_AT: usize = 80;
const SIDECAR_OFFSETS_AT: usize = 96;

/// CRC32C (Castagnoli), bit by bit: independent of the engine's, so a forged sidecar is
/// checked against the format rather than against the code that reads it.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0x82f6_3b78 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

fn sidecar_of(p: &Path) -> PathBuf {
    PathBuf::from(format!("{}.ridx", p.display()))
}

/// Writes `good` (a sidecar's bytes) with `edit` applied to everything before its CRC and
/// the CRC recomputed, so only the checks after the checksum can refuse it.
fn forge(side: &Path, good: &[u8], edit: impl FnOnce(&mut Vec<u8>)) {
    let mut body = good[..good.len() - 4].to_vec();
    edit(&mut body);
    let crc = crc32c(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    std::fs::write(side, body).unwrap();
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// `riffle cat --framed` that also returns stderr (where the rebuild notice goes).
fn cat_with_stderr(sb: &Sandbox, p: &Path) -> (Vec<Vec<u8>>, String) {
    let o = sb.cmd().args(["cat", "--framed"]).arg(p).output().unwrap();
    assert_ok(&o);
    let mut out = Vec::new();
    let mut b = &o.stdout[..];
    while !b.is_empty() {
        let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        out.push(b[8..8 + n].to_vec());
        b = &b[8 + n..];
    }
    (out, text(&o.stderr))
}

/// The ids `riffle gen` put in the records of `p` (lines: JSON `id`; others: first 8 bytes).
fn ids_of(recs: &[Vec<u8>], lines: bool) -> Vec<u64> {
    recs.iter()
        .map(|r| {
            if lines {
                let v: Value = serde_json::from_slice(r)
                    .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(r)));
                v["id"].as_u64().unwrap()
            } else {
                id_of(r)
            }
        })
        .collect()
}

/// The forged sidecar of `p` is refused under --no-rebuild (naming the file, the sidecar
/// and `why`), and rebuilt with a notice otherwise, after which `cat` gives ids 0..n.
fn assert_not_trusted(sb: &Sandbox, p: &Path, n: u64, lines: bool, why: &str) {
    let side = sidecar_of(p);
    let side_name = side.file_name().unwrap().to_string_lossy().into_owned();
    let o = sb
        .cmd()
        .args(["index", "--no-rebuild"])
        .arg(p)
        .output()
        .unwrap();
    assert_bad(&o, p, None, why);
    let err = text(&o.stderr);
    assert!(
        err.contains(&side_name) && err.contains("--no-rebuild"),
        "{err}"
    );

    let (recs, err) = cat_with_stderr(sb, p);
    assert!(
        err.contains("rebuilt a stale index") && err.contains(&side_name) && err.contains(why),
        "no rebuild notice naming {side_name} and '{why}':\n{err}"
    );
    assert_eq!(ids_of(&recs, lines), (0..n).collect::<Vec<_>>());
    // The rebuilt sidecar is trusted again.
    let v = index_json(sb, &[p.as_os_str()]);
    assert_eq!(v["indexes"]["loaded"], 1, "{v}");
}

#[test]
fn a_same_size_rewrite_with_its_old_mtime_put_back_is_not_trusted() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let sb = Sandbox::new();
    let p = sb.data().join("r.jsonl");
    let old: &[u8] = b"{\"a\":1}\n{\"bb\":22}\n{\"ccc\":333}\n";
    let new: &[u8] = b"{\"ccc\":333}\n{\"bb\":22}\n{\"a\":1}\n";
    assert_eq!(old.len(), new.len());
    std::fs::write(&p, old).unwrap();
    assert_eq!(index_json(&sb, &[p.as_os_str()])["indexes"]["built"], 1);
    let before = std::fs::metadata(&p).unwrap();

    // What `dd conv=notrunc` + `touch -d @OLD` (or `rsync -t`, `cp -p` onto the same
    // inode) do: new bytes in place, same size, same inode, the old mtime to the
    // nanosecond. Only the ctime tells. On a filesystem with coarse timestamps the ctime
    // may not have moved yet: touch again until it has (a rewrite within one timestamp
    // tick of the indexing run is the documented blind spot).
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(new, 0).unwrap();
    let old_mtime = before.modified().unwrap();
    for _ in 0..300 {
        f.set_times(std::fs::FileTimes::new().set_modified(old_mtime))
            .unwrap();
        let m = std::fs::metadata(&p).unwrap();
        if (m.ctime(), m.ctime_nsec()) != (before.ctime(), before.ctime_nsec()) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    drop(f);
    let after = std::fs::metadata(&p).unwrap();
    assert_eq!(
        (
            after.len(),
            after.ino(),
            after.dev(),
            after.modified().unwrap()
        ),
        (before.len(), before.ino(), before.dev(), old_mtime)
    );

    let o = sb
        .cmd()
        .args(["index", "--no-rebuild"])
        .arg(&p)
        .output()
        .unwrap();
    assert_bad(&o, &p, None, "stale");
    assert!(text(&o.stderr).contains("ctime"), "{}", text(&o.stderr));

    let (recs, err) = cat_with_stderr(&sb, &p);
    assert_eq!(
        recs,
        vec![
            b"{\"ccc\":333}".to_vec(),
            b"{\"bb\":22}".to_vec(),
            b"{\"a\":1}".to_vec()
        ]
    );
    assert!(
        err.contains("rebuilt a stale index") && err.contains("r.jsonl.ridx"),
        "{err}"
    );
}

#[test]
fn a_crc_valid_sidecar_whose_record_count_wraps_is_not_trusted() {
    assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    let sb = Sandbox::new();
    let p = sb.data().join("w.jsonl");
    gen(&sb, &p, "lines", 50, 60, &["--size-jitter", "0.5"]);
    index_json(&sb, &[p.as_os_str()]);
    let good = std::fs::read(sidecar_of(&p)).unwrap();
    assert_eq!(u64_at(&good, SIDECAR_COUNT_AT), 50);
    // (N + 2^61 + 1) * 8 wraps to (N + 1) * 8: the length would match a wrapping check.
    forge(&sidecar_of(&p), &good, |b| {
        put_u64(b, SIDECAR_COUNT_AT, 50 + (1 << 61))
    });
    assert_not_trusted(&sb, &p, 50, true, "record count");
    // One offset too few for the count: refused too.
    forge(&sidecar_of(&p), &good, |b| put_u64(b, SIDECAR_COUNT_AT, 51));
    assert_not_trusted(&sb, &p, 50, true, "record count");
}

#[test]
fn crc_valid_sidecars_with_impossible_offsets_are_not_trusted() {
    let sb = Sandbox::new();
    let p = sb.data().join("o.jsonl");
    gen(&sb, &p, "lines", 40, 60, &["--size-jitter", "0.5"]);
    let size = std::fs::metadata(&p).unwrap().len();
    index_json(&sb, &[p.as_os_str()]);
    let good = std::fs::read(sidecar_of(&p)).unwrap();
    let entry = |i: usize| SIDECAR_OFFSETS_AT + 8 * i;
    assert_eq!(u64_at(&good, entry(40)), size);

    // Two records starting at the same byte (an empty frame: its length would underflow).
    forge(&sidecar_of(&p), &good, |b| {
        let v = u64_at(b, entry(10));
        put_u64(b, entry(11), v);
    });
    assert_not_trusted(&sb, &p, 40, true, &format!("at byte {}", entry(11)));
    // Two offsets swapped.
    forge(&sidecar_of(&p), &good, |b| {
        let (x, y) = (u64_at(b, entry(20)), u64_at(b, entry(21)));
        put_u64(b, entry(20), y);
        put_u64(b, entry(21), x);
    });
    assert_not_trusted(&sb, &p, 40, true, "corrupt index");
    // A record starting at the end of the file.
    forge(&sidecar_of(&p), &good, |b| put_u64(b, entry(39), size));
    assert_not_trusted(&sb, &p, 40, true, "not inside the");
    // A record starting past the end, and the sentinel past it too.
    forge(&sidecar_of(&p), &good, |b| {
        put_u64(b, entry(39), size + 100);
        put_u64(b, entry(40), size + 200);
    });
    assert_not_trusted(&sb, &p, 40, true, "not inside the");
    // The first record not at the start of a header-less file.
    forge(&sidecar_of(&p), &good, |b| put_u64(b, entry(0), 1));
    assert_not_trusted(&sb, &p, 40, true, "first offset");

    // TFRecord frames are at least 16 bytes (length, its CRC, the data's CRC).
    let t = sb.data().join("o.tfrecord");
    gen(&sb, &t, "tfrecord", 30, 40, &["--size-jitter", "0.5"]);
    index_json(&sb, &[t.as_os_str()]);
    let good = std::fs::read(sidecar_of(&t)).unwrap();
    forge(&sidecar_of(&t), &good, |b| {
        let v = u64_at(b, entry(5));
        put_u64(b, entry(6), v + 15);
    });
    assert_not_trusted(&sb, &t, 30, false, "less than a 16-byte frame");
}

#[test]
fn a_version_1_sidecar_is_rebuilt() {
    let sb = Sandbox::new();
    let p = sb.data().join("v.jsonl");
    gen(&sb, &p, "lines", 20, 60, &[]);
    index_json(&sb, &[p.as_os_str()]);
    let good = std::fs::read(sidecar_of(&p)).unwrap();
    forge(&sidecar_of(&p), &good, |b| {
        b[8..12].copy_from_slice(&1u32.to_le_bytes())
    });
    assert_not_trusted(&sb, &p, 20, true, "index version 1");
}

/// A FIFO is stat'ed, never opened (an open would wait for a writer): `index`, `cat` and
/// `read` refuse it at once, naming it and what it is. In a directory it is skipped, with a
/// notice naming it.
#[test]
fn a_fifo_is_refused_at_once_and_skipped_in_a_directory() {
    use crate::shuffle::{make_fifo, run_within};
    let sb = Sandbox::new();
    let fifo = sb.data().join("stream.jsonl");
    make_fifo(&fifo);
    // A hang guard: the bug blocked on the FIFO for ever.
    let limit = std::time::Duration::from_secs(60);
    for args in [
        &["index"][..],
        &["cat"],
        &["read", "--batch-size", "4", "--mode", "lirs"],
    ] {
        let mut c = sb.cmd();
        c.args(args).arg(&fifo);
        let started = std::time::Instant::now();
        let o = run_within(c, None, limit);
        assert_bad(&o, &fifo, None, "is a FIFO");
        assert!(
            text(&o.stderr).contains("riffle shuffle"),
            "{}",
            text(&o.stderr)
        );
        eprintln!("{args:?} refused a FIFO in {:?}", started.elapsed());
    }

    let dir = sb.data().join("dir");
    std::fs::create_dir(&dir).unwrap();
    gen(&sb, &dir.join("a.jsonl"), "lines", 10, 30, &[]);
    make_fifo(&dir.join("b.jsonl"));
    let mut c = sb.cmd();
    c.args(["index", "--json"]).arg(&dir);
    let o = run_within(c, None, limit);
    assert_ok(&o);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["files"], 1, "{v}");
    let err = text(&o.stderr);
    assert!(err.contains("skipping") && err.contains("b.jsonl"), "{err}");
}

/// Regression (issue 13): a structured dtype whose row size overflows 64 bits (a field of
/// 2^61 doubles is 2^64 bytes, wrapping to 0) was read as 8-byte rows. Every size the
/// header decides is checked; the error names the file and the byte of the header.
#[test]
fn npy_sizes_that_overflow_are_refused_naming_the_file_and_offset() {
    let sb = Sandbox::new();
    // The data is there for 8-byte rows, which is what the wrapped size said.
    let header = |descr: &str, shape: &str| {
        let dict = format!("{{'descr': {descr}, 'fortran_order': False, 'shape': {shape}, }}");
        let pad = (10 + dict.len() + 1).next_multiple_of(64) - (10 + dict.len() + 1);
        let dict = format!("{dict}{}\n", " ".repeat(pad));
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(dict.len() as u16).to_le_bytes());
        b.extend_from_slice(dict.as_bytes());
        let descr_at = b.windows(5).position(|w| w == b"descr").unwrap() as u64;
        b.extend_from_slice(&[7u8; 8 * 10]);
        (b, descr_at)
    };
    for (name, descr, words) in [
        (
            "wrap.npy",
            "[('a', '<f8'), ('b', '<f8', (2305843009213693952,))]",
            "too large",
        ),
        (
            "sum.npy",
            "[('a', '|V9223372036854775808'), ('b', '|V9223372036854775816')]",
            "too large",
        ),
        ("unicode.npy", "'<U4611686018427387906'", "too large"),
    ] {
        let p = sb.data().join(name);
        let (b, at) = header(descr, "(10,)");
        std::fs::write(&p, &b).unwrap();
        assert_bad(&index(&sb, &p), &p, Some(at), words);
        let o = sb
            .cmd()
            .args(["read", "--batch-size", "2", "--mode", "lirs"])
            .arg(&p)
            .output()
            .unwrap();
        assert_bad(&o, &p, Some(at), words);
    }
    // A header whose length runs past the end of the file.
    let (p, mut b) = npy(&sb, "long.npy");
    b[8..10].copy_from_slice(&60000u16.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    assert_bad(
        &index(&sb, &p),
        &p,
        Some(b.len() as u64),
        "declares 60010 bytes",
    );
}

/// Issue 13: one policy for empty (0-byte) files in a dataset of several: `read`, `index`
/// and `shuffle` all skip them with a one-line notice naming each (`read` and `index`
/// refused the whole directory). A dataset of nothing but empty files has no records.
#[test]
fn empty_files_are_skipped_with_a_notice_by_read_index_and_shuffle() {
    let sb = Sandbox::new();
    let dir = sb.data().join("shards");
    std::fs::create_dir(&dir).unwrap();
    gen(&sb, &dir.join("a.jsonl"), "lines", 30, 20, &[]);
    std::fs::write(dir.join("b.jsonl"), b"").unwrap();
    gen(&sb, &dir.join("c.jsonl"), "lines", 20, 20, &[]);
    std::fs::write(dir.join("d.jsonl"), b"").unwrap();
    let notices = |o: &Output| {
        let err = text(&o.stderr);
        for f in ["b.jsonl", "d.jsonl"] {
            let lines = err
                .lines()
                .filter(|l| l.contains("notice: skipping") && l.contains(f) && l.contains("empty"))
                .count();
            assert_eq!(lines, 1, "one notice naming {f}:\n{err}");
        }
    };
    let o = sb
        .cmd()
        .args(["index", "--json"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_ok(&o);
    notices(&o);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["files"].as_u64(), v["records"].as_u64()),
        (Some(2), Some(50)),
        "{v}"
    );

    let o = sb
        .cmd()
        .args(["read", "--batch-size", "10", "--mode", "lirs", "--json"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_ok(&o);
    notices(&o);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["records"], 50, "{v}");

    let out = sb.path().join("shuffled.jsonl");
    let o = sb
        .cmd()
        .arg("shuffle")
        .args(["a.jsonl", "b.jsonl", "c.jsonl", "d.jsonl"].map(|f| dir.join(f)))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert_ok(&o);
    notices(&o);
    assert_eq!(
        std::fs::read(&out)
            .unwrap()
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .count(),
        50
    );

    // Only empty files: no records, for every command.
    let none = sb.data().join("none");
    std::fs::create_dir(&none).unwrap();
    std::fs::write(none.join("x.jsonl"), b"").unwrap();
    std::fs::write(none.join("y.jsonl"), b"").unwrap();
    assert_bad(
        &index(&sb, &none),
        &none.join("x.jsonl"),
        Some(0),
        "no records",
    );
    let o = sb
        .cmd()
        .args(["read", "--batch-size", "10", "--mode", "lirs"])
        .arg(&none)
        .output()
        .unwrap();
    assert_bad(&o, &none.join("x.jsonl"), Some(0), "no records");
    let out = sb.path().join("nothing.jsonl");
    let o = sb
        .cmd()
        .arg("shuffle")
        .arg(none.join("x.jsonl"))
        .arg(none.join("y.jsonl"))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert_bad(&o, &none.join("x.jsonl"), Some(0), "no records");
    assert!(!out.exists(), "no output for no records");
}

/// Regression: `riffle gen` added record sizes in wrapping arithmetic (`--record-size
/// 18446744073709551615` wrote an empty file and exit 0) and summed every record's size
/// before noticing a file could never fit (`--records 18446744073709551615` ran for ever).
/// Both are refused at once now, and nothing is written.
#[test]
fn gen_sizes_past_2_pow_64_or_the_free_space_are_refused_at_once() {
    let sb = Sandbox::new();
    let out = sb.data().join("g.txt");
    for (records, size, words) in [
        ("18446744073709551615", "100", "more than 2^64 bytes"),
        ("10", "18446744073709551615", "more than 2^64 bytes"),
        ("100000000000000", "100", "free"),
    ] {
        let mut c = sb.cmd();
        c.arg("gen").arg(&out).args([
            "--format",
            "lines",
            "--records",
            records,
            "--record-size",
            size,
        ]);
        // A hang guard: the bug summed 2^64 record sizes for ever.
        let o = crate::shuffle::run_within(c, None, std::time::Duration::from_secs(60));
        assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
        assert!(text(&o.stderr).contains(words), "{}", text(&o.stderr));
        // Refused before writing: no file (a run that tried would have made it).
        assert!(!out.exists());
    }
}

/// A tired user's ImageFolder tree read without `--format files`: the error says what to
/// pass; with it, every file is a record.
#[test]
fn a_tree_of_class_directories_points_at_format_files() {
    let sb = Sandbox::new();
    let tree = sb.data().join("tree");
    gen(&sb, &tree, "files", 30, 100, &["--labels", "3"]);
    let o = sb.cmd().arg("cat").arg(&tree).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains("--format files") && err.contains("tree"),
        "{err}"
    );
    let recs = cat(
        &sb,
        &[tree.as_os_str(), "--format".as_ref(), "files".as_ref()],
    );
    assert_eq!(recs.len(), 30);
    assert!(recs.iter().enumerate().all(|(i, r)| id_of(r) == i as u64));
}

/// Regression (issue 30 D21): after a read of `many/`, `riffle index many/*` (the shell's
/// expansion names the `.ridx` sidecars too) took the sidecars as data (6,557 records
/// instead of 3,000) and wrote sidecars of sidecars. Named sidecars are left out, with a
/// notice; a user's own file that only ends in `.ridx` stays data.
#[test]
fn sidecars_named_by_a_shell_glob_are_not_data() {
    let sb = Sandbox::new();
    let dir = sb.data().join("many");
    std::fs::create_dir(&dir).unwrap();
    for (name, n) in [("a.jsonl", 400), ("b.jsonl", 300)] {
        gen(
            &sb,
            &dir.join(name),
            "lines",
            n,
            40,
            &["--size-jitter", "0.5"],
        );
    }
    let whole = index_json(&sb, &[dir.as_os_str()]);
    assert_eq!(whole["records"], 700);
    assert!(
        dir.join("a.jsonl.ridx").is_file(),
        "the first read writes sidecars"
    );
    let mut named: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    named.sort();
    assert!(named.len() >= 4, "data and sidecars: {named:?}");
    let args: Vec<&std::ffi::OsStr> = named.iter().map(|p| p.as_os_str()).collect();
    let ix = index_json(&sb, &args);
    assert_eq!(ix["records"], 700, "{ix}");
    assert_eq!(ix["files"], 2, "{ix}");
    let twice = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".ridx.ridx")
        })
        .count();
    assert_eq!(twice, 0, "sidecars of sidecars were written");
    // `riffle shuffle many/*` likewise shuffles the records only.
    let out = sb.data().join("shuffled.jsonl");
    let o = sb
        .cmd()
        .arg("shuffle")
        .args(&args)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert_ok(&o);
    let lines = std::fs::read(&out)
        .unwrap()
        .iter()
        .filter(|&&b| b == b'\n')
        .count();
    assert_eq!(lines, 700, "{}", text(&o.stderr));
    // A user's file whose name only ends in .ridx is data.
    let own = sb.data().join("mine.ridx");
    std::fs::write(&own, b"one\ntwo\n").unwrap();
    let ix = index_json(
        &sb,
        &[
            own.as_os_str(),
            std::ffi::OsStr::new("--format"),
            std::ffi::OsStr::new("lines"),
        ],
    );
    assert_eq!(ix["records"], 2, "{ix}");
}
