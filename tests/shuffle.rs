//! `riffle shuffle`: permutations, the same output whatever the memory, headers, splits,
//! standard streams, and real faults (a full scratch disk, SIGKILL).

use std::io::Write;
use std::path::Path;
use std::process::Stdio;

use crate::{assert_ok, gen, text, Sandbox};

fn sorted_lines(p: &Path) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = std::fs::read(p)
        .unwrap()
        .split(|&b| b == b'\n')
        .map(<[u8]>::to_vec)
        .collect();
    if v.last().is_some_and(Vec::is_empty) {
        v.pop();
    }
    v.sort();
    v
}

#[test]
fn same_output_whatever_the_memory_and_a_permutation() {
    let sb = Sandbox::new();
    let input = sb.data().join("in.jsonl");
    gen(&sb, &input, "lines", 60_000, 120, &["--size-jitter", "0.8"]);
    let mut outs = Vec::new();
    for (i, mem) in ["1G", "2M", "1M"].iter().enumerate() {
        let out = sb.data().join(format!("out{i}.jsonl"));
        let o = sb
            .cmd()
            .arg("shuffle")
            .arg(&input)
            .arg("-o")
            .arg(&out)
            .args(["--seed", "5", "--memory", mem, "--json"])
            .output()
            .unwrap();
        assert_ok(&o);
        let rep: serde_json::Value = serde_json::from_slice(&o.stderr).unwrap();
        assert_eq!(rep["in_memory"], i == 0, "{mem}: {rep}");
        outs.push(std::fs::read(&out).unwrap());
    }
    assert!(
        outs.iter().all(|o| *o == outs[0]),
        "the output depends on --memory"
    );
    let out0 = sb.data().join("out0.jsonl");
    assert_eq!(sorted_lines(&out0), sorted_lines(&input));
    assert_ne!(
        std::fs::read(&out0).unwrap(),
        std::fs::read(&input).unwrap()
    );
    let other = sb.data().join("seed6.jsonl");
    assert_ok(
        &sb.cmd()
            .arg("shuffle")
            .arg(&input)
            .arg("-o")
            .arg(&other)
            .args(["--seed", "6"])
            .output()
            .unwrap(),
    );
    assert_ne!(std::fs::read(&other).unwrap(), outs[0]);
    // No temporary files are left anywhere.
    let names: Vec<String> = std::fs::read_dir(sb.data())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
}

#[test]
fn stdin_stdout_headers_and_splits() {
    let sb = Sandbox::new();
    let mut child = sb
        .cmd()
        .args(["shuffle", "-", "-o", "-", "--skip", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = b"name,value\n".to_vec();
    for i in 0..1000 {
        input.extend_from_slice(format!("row{i},{i}\n").as_bytes());
    }
    input.extend_from_slice(b"last,without-newline");
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_ok(&out);
    let s = text(&out.stdout);
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(lines[0], "name,value", "the header stays on top");
    assert_eq!(lines.len(), 1002);
    assert!(lines.contains(&"last,without-newline"));

    let src = sb.data().join("s.txt");
    std::fs::write(
        &src,
        (0..1000).map(|i| format!("{i}\n")).collect::<String>(),
    )
    .unwrap();
    let out = sb.data().join("part");
    assert_ok(
        &sb.cmd()
            .arg("shuffle")
            .arg(&src)
            .arg("-o")
            .arg(&out)
            .args(["--split-lines", "300"])
            .output()
            .unwrap(),
    );
    let counts: Vec<usize> = (0..4)
        .map(|i| {
            std::fs::read_to_string(sb.data().join(format!("part.{i:03}")))
                .unwrap()
                .lines()
                .count()
        })
        .collect();
    assert_eq!(counts, vec![300, 300, 300, 100]);
}

#[test]
fn a_record_longer_than_the_budget_is_refused() {
    let sb = Sandbox::new();
    let p = sb.data().join("long.txt");
    let mut body = b"short\n".to_vec();
    body.extend(std::iter::repeat_n(b'x', 3 << 20));
    std::fs::write(&p, &body).unwrap();
    let out = sb.data().join("o.txt");
    let o = sb
        .cmd()
        .arg("shuffle")
        .arg(&p)
        .arg("-o")
        .arg(&out)
        .args(["--memory", "2M"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains("long.txt") && err.contains("at byte 6") && err.contains("memory budget"),
        "{err}"
    );
    assert!(!out.exists());
}

/// A real full disk: piles go to a 4 MiB tmpfs mounted for the test.
#[test]
fn a_full_scratch_disk_fails_cleanly() {
    let sb = Sandbox::new();
    let Some(small) = crate::SmallDisk::mount(&sb, "4m") else {
        return;
    };
    let mnt = small.path().to_path_buf();
    let input = sb.data().join("in.jsonl");
    gen(&sb, &input, "lines", 100_000, 100, &[]);
    let before = std::fs::read(&input).unwrap();
    let out = sb.data().join("out.jsonl");
    let o = sb
        .cmd()
        .arg("shuffle")
        .arg(&input)
        .arg("-o")
        .arg(&out)
        .args(["--memory", "2M", "--tmpdir"])
        .arg(&mnt)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(err.contains("No space left"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        std::fs::read_dir(&mnt).unwrap().count(),
        0,
        "temporary piles left on the full disk"
    );
    assert!(!out.exists(), "a partial output was left");
    assert_eq!(std::fs::read(&input).unwrap(), before, "the input changed");
}

#[test]
fn sigkill_mid_shuffle_leaves_no_output_and_a_rerun_works() {
    let sb = Sandbox::new();
    let input = sb.data().join("in.jsonl");
    gen(
        &sb,
        &input,
        "lines",
        600_000,
        200,
        &["--size-jitter", "0.5"],
    );
    let out = sb.data().join("out.jsonl");
    let mut child = sb
        .cmd()
        .arg("shuffle")
        .arg(&input)
        .arg("-o")
        .arg(&out)
        .args(["--memory", "4M"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(150));
    if child.try_wait().unwrap().is_some() {
        eprintln!("skipped: the shuffle finished before it could be killed; nothing to check");
        return;
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(!out.exists(), "a killed shuffle left its destination");
    let o = sb
        .cmd()
        .arg("shuffle")
        .arg(&input)
        .arg("-o")
        .arg(&out)
        .args(["--memory", "4M"])
        .output()
        .unwrap();
    assert_ok(&o);
    assert_eq!(sorted_lines(&out), sorted_lines(&input));
}

/// The records of a TFRecord file, as whole frames, sorted.
fn sorted_frames(p: &Path) -> Vec<Vec<u8>> {
    let b = std::fs::read(p).unwrap();
    let mut at = 0;
    let mut v = Vec::new();
    while at < b.len() {
        let len = u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize;
        v.push(b[at..at + 16 + len].to_vec());
        at += 16 + len;
    }
    assert_eq!(at, b.len(), "{}: a partial frame at the end", p.display());
    v.sort();
    v
}

fn shuffle_to(sb: &Sandbox, input: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    sb.cmd()
        .arg("shuffle")
        .arg(input)
        .arg("-o")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn tfrecords_shuffle_as_whole_frames_whatever_the_memory() {
    let sb = Sandbox::new();
    let input = sb.data().join("in.tfrecord");
    gen(
        &sb,
        &input,
        "tfrecord",
        20_000,
        300,
        &["--size-jitter", "0.9"],
    );
    let mut outs = Vec::new();
    for (i, mem) in ["1G", "1M"].iter().enumerate() {
        let out = sb.data().join(format!("out{i}.tfrecord"));
        let o = shuffle_to(
            &sb,
            &input,
            &out,
            &["--seed", "3", "--memory", mem, "--json"],
        );
        assert_ok(&o);
        let rep: serde_json::Value = serde_json::from_slice(&o.stderr).unwrap();
        assert_eq!(rep["records"], 20_000, "{rep}");
        assert_eq!(rep["in_memory"], i == 0, "{mem}: {rep}");
        outs.push(out);
    }
    let (a, b) = (
        std::fs::read(&outs[0]).unwrap(),
        std::fs::read(&outs[1]).unwrap(),
    );
    assert!(a == b, "the output depends on --memory");
    assert_ne!(a, std::fs::read(&input).unwrap(), "not shuffled");
    assert_eq!(sorted_frames(&outs[0]), sorted_frames(&input));
    // The output is a valid TFRecord file: the engine indexes it with both CRCs checked.
    let o = sb
        .cmd()
        .arg("index")
        .arg(&outs[0])
        .arg("--json")
        .output()
        .unwrap();
    assert_ok(&o);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["records"], 20_000);
}

#[test]
fn corrupt_tfrecords_are_refused_with_file_and_offset() {
    let sb = Sandbox::new();
    let input = sb.data().join("bad.tfrecord");
    gen(&sb, &input, "tfrecord", 3, 20, &[]);
    let good = std::fs::read(&input).unwrap();
    // Each frame is 12 + 20 + 4 = 36 bytes.
    type Spoil = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: [(&str, Spoil, u64); 3] = [
        ("length CRC", Box::new(|b| b[36 + 9] ^= 0x55), 44),
        ("data CRC", Box::new(|b| b[36 + 15] ^= 1), 36 + 32),
        ("truncated", Box::new(|b| b.truncate(36 + 20)), 36),
    ];
    for (words, spoil, offset) in cases {
        let mut b = good.clone();
        spoil(&mut b);
        std::fs::write(&input, &b).unwrap();
        let out = sb.data().join("out.tfrecord");
        let o = shuffle_to(&sb, &input, &out, &["--memory", "1M"]);
        crate::datasets::assert_bad(&o, &input, Some(offset), words);
        assert!(!out.exists(), "{words}: an output was left behind");
    }
}

#[test]
fn fixed_records_shuffle_with_the_header_kept() {
    let sb = Sandbox::new();
    let input = sb.data().join("in.bin");
    let header = b"HEADER--".to_vec();
    let mut bytes = header.clone();
    let records: Vec<[u8; 24]> = (0..40_000u32)
        .map(|i| {
            let mut r = [0u8; 24];
            r[..4].copy_from_slice(&i.to_le_bytes());
            r[4..].fill((i % 251) as u8);
            r
        })
        .collect();
    for r in &records {
        bytes.extend_from_slice(r);
    }
    std::fs::write(&input, &bytes).unwrap();
    let mut outs = Vec::new();
    for mem in ["1G", "1M"] {
        let out = sb.data().join(format!("out-{mem}.bin"));
        let o = shuffle_to(
            &sb,
            &input,
            &out,
            &["--format", "fixed:24:8", "--memory", mem],
        );
        assert_ok(&o);
        outs.push(std::fs::read(&out).unwrap());
    }
    assert!(outs[0] == outs[1], "the output depends on --memory");
    let out = &outs[0];
    assert_eq!(&out[..8], &header[..], "the header is not kept at the top");
    assert_eq!(out.len(), bytes.len());
    let mut got: Vec<&[u8]> = out[8..].chunks(24).collect();
    assert_ne!(
        got.iter().map(|r| r[0]).collect::<Vec<_>>()[..100],
        (0..100u8).collect::<Vec<_>>()[..]
    );
    got.sort();
    let mut want: Vec<&[u8]> = records.iter().map(|r| &r[..]).collect();
    want.sort();
    assert_eq!(got, want);

    // A partial last record is an error naming its offset, with no output.
    std::fs::write(&input, &bytes[..bytes.len() - 5]).unwrap();
    let out = sb.data().join("partial.bin");
    let o = shuffle_to(&sb, &input, &out, &["--format", "fixed:24:8"]);
    let last = 8 + 24 * (records.len() as u64 - 1);
    crate::datasets::assert_bad(&o, &input, Some(last), "partial record");
    assert!(!out.exists());
    // NumPy files are pointed elsewhere, not shuffled as lines.
    let npy = sb.data().join("a.npy");
    gen(&sb, &npy, "npy", 10, 16, &[]);
    let o = shuffle_to(&sb, &npy, &sb.data().join("a-out.npy"), &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("riffle read"),
        "{}",
        text(&o.stderr)
    );
}
