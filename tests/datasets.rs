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
