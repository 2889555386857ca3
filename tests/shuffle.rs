//! `riffle shuffle`: permutations, the same output whatever the memory, headers, splits,
//! standard streams, and real faults (a full scratch disk, SIGKILL).

use std::io::Write;
use std::path::Path;
use std::process::{Output, Stdio};

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

/// The same full disk under a large input: the shuffle is refused before it reads, or the
/// pile write that fails stops the input's reads at once (what was read stays a small part
/// of the input), and nothing is left.
#[test]
fn a_full_scratch_disk_stops_reading_the_input_at_once() {
    use riffle::shuffle::{shuffle, Input, Output, ShuffleOptions};
    let sb = Sandbox::new();
    let Some(small) = crate::SmallDisk::mount(&sb, "4m") else {
        return;
    };
    let mnt = small.path().to_path_buf();
    let input = sb.data().join("in.jsonl");
    gen(&sb, &input, "lines", 2_000_000, 128, &[]);
    let size = std::fs::metadata(&input).unwrap().len();
    let out = sb.data().join("out.jsonl");
    let opts = ShuffleOptions {
        seed: 0,
        memory: 64 << 20,
        format: riffle::format::Format::Lines {
            sep: b'\n',
            skip: 0,
        },
        tmpdir: Some(mnt.clone()),
        split: None,
        throttled: false,
    };
    let mut read = 0;
    let e = shuffle(
        &[Input::File(input.clone())],
        &Output::File(out.clone()),
        &opts,
        &mut |b| read = b,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("No space left"), "{e}");
    // A file's size is known: the shuffle is refused before it reads (issue 30 D23); an
    // input whose size is not known stops at the pile write that fails.
    eprintln!("the full disk stopped the shuffle after {read} of {size} bytes");
    assert!(
        read < size / 4,
        "{read} of {size} input bytes were read before the full disk stopped the shuffle"
    );
    assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0, "piles left");
    assert!(!out.exists(), "a partial output was left");
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
    let tmp = sb.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let shuffle = || {
        let mut c = sb.cmd();
        c.arg("shuffle")
            .arg(&input)
            .arg("-o")
            .arg(&out)
            .args(["--memory", "4M", "--tmpdir"])
            .arg(&tmp);
        c
    };
    let mut child = shuffle().stderr(Stdio::null()).spawn().unwrap();
    // Mid-shuffle is when its scratch directory holds pile bytes: the piles are written
    // while the input is read, and the output only after every pile is.
    let scratch_bytes = || -> u64 {
        let dirs = std::fs::read_dir(&tmp).into_iter().flatten().flatten();
        let files = dirs.flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten());
        files
            .filter_map(|f| f.metadata().ok())
            .map(|m| m.len())
            .sum()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while scratch_bytes() == 0 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the shuffle exited before it wrote a pile"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "no pile was written in 60 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(!out.exists(), "a killed shuffle left its destination");
    let o = shuffle().output().unwrap();
    assert_ok(&o);
    assert_eq!(sorted_lines(&out), sorted_lines(&input));
    assert_eq!(
        std::fs::read_dir(&tmp).unwrap().count(),
        0,
        "the rerun left the killed run's piles (or its own)"
    );
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

pub(crate) fn shuffle_to(
    sb: &Sandbox,
    input: &Path,
    out: &Path,
    extra: &[&str],
) -> std::process::Output {
    sb.cmd()
        .arg("shuffle")
        .arg(input)
        .arg("-o")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

/// Shuffles `input` under each `--memory` of `mems` (the first in memory, the others
/// through piles) into `outNAME.EXT`, checking each report's record count and whether it
/// stayed in memory; returns the outputs, whose bytes must all be the same.
fn shuffle_at_memories(
    sb: &Sandbox,
    input: &Path,
    ext: &str,
    records: u64,
    mems: &[&str],
) -> Vec<std::path::PathBuf> {
    let mut outs = Vec::new();
    for (i, mem) in mems.iter().enumerate() {
        let out = sb.data().join(format!("out{i}.{ext}"));
        let o = shuffle_to(sb, input, &out, &["--seed", "3", "--memory", mem, "--json"]);
        assert_ok(&o);
        let rep: serde_json::Value = serde_json::from_slice(&o.stderr).unwrap();
        assert_eq!(rep["records"], records, "{rep}");
        assert_eq!(rep["in_memory"], i == 0, "{mem}: {rep}");
        outs.push(out);
    }
    let first = std::fs::read(&outs[0]).unwrap();
    for o in &outs[1..] {
        assert!(
            std::fs::read(o).unwrap() == first,
            "the output depends on --memory"
        );
    }
    outs
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
    let outs = shuffle_at_memories(&sb, &input, "tfrecord", 20_000, &["1G", "1M"]);
    let a = std::fs::read(&outs[0]).unwrap();
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

// Inputs that are not regular files (issue 13): pipes, FIFOs and devices are streamed like
// `-`, so they give the output the same bytes in a file give.

/// Makes a FIFO (mode 0600) at `path`.
pub(crate) fn make_fifo(path: &Path) {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::S_IRWXU).unwrap();
}

/// Feeds `bytes` into the FIFO at `path` from a thread, as `cat data > fifo` would. Its
/// open waits for a reader; [`release_fifo`] ends that wait if none came.
fn feed_fifo(path: &Path, bytes: Vec<u8>) -> std::thread::JoinHandle<std::io::Result<()>> {
    let path = path.to_path_buf();
    std::thread::spawn(move || std::fs::File::create(path)?.write_all(&bytes))
}

/// Opens and closes the FIFO's read end without blocking, so a writer still waiting for a
/// reader (the command under test never opened it) goes on, meets no reader and stops.
fn release_fifo(path: &Path, writer: std::thread::JoinHandle<std::io::Result<()>>) {
    use std::os::unix::fs::OpenOptionsExt;
    drop(
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path),
    );
    let _ = writer.join().unwrap();
}

/// Runs `cmd` (stdin closed unless `stdin` is given) and returns its output, failing if it
/// has not exited within `limit`: a command that blocks is killed, never waited on forever.
pub(crate) fn run_within(
    mut cmd: std::process::Command,
    stdin: Option<Vec<u8>>,
    limit: std::time::Duration,
) -> std::process::Output {
    use std::io::Read;
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let feeder = child.stdin.take().map(|mut s| {
        let bytes = stdin.unwrap_or_default();
        // A child that exits early closes the pipe: a write error is its business.
        std::thread::spawn(move || drop(s.write_all(&bytes)))
    });
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            r.read_to_end(&mut v).unwrap();
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!(
                "{cmd:?} had not exited after {limit:?} (killed); stderr:\n{}",
                text(&err.join().unwrap())
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    if let Some(f) = feeder {
        f.join().unwrap();
    }
    std::process::Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// A hang guard (the bugs these tests catch block for ever), generous for a loaded machine.
const LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// `riffle shuffle INPUTS -o OUT --seed 9` (a real, exiting process) and OUT's bytes.
fn shuffled(sb: &Sandbox, inputs: &[&std::ffi::OsStr], out: &Path) -> Vec<u8> {
    let mut c = sb.cmd();
    c.arg("shuffle")
        .args(inputs)
        .arg("-o")
        .arg(out)
        .args(["--seed", "9"]);
    let o = run_within(c, None, LIMIT);
    assert_ok(&o);
    std::fs::read(out).unwrap()
}

#[test]
fn a_fifo_shuffles_like_the_same_bytes_in_a_file() {
    let sb = Sandbox::new();
    let file = sb.data().join("in.jsonl");
    gen(&sb, &file, "lines", 20_000, 80, &["--size-jitter", "0.5"]);
    let bytes = std::fs::read(&file).unwrap();
    let want = shuffled(&sb, &[file.as_os_str()], &sb.data().join("want.jsonl"));
    assert_ne!(want, bytes, "not shuffled");

    let fifo = sb.data().join("fifo");
    make_fifo(&fifo);
    let writer = feed_fifo(&fifo, bytes.clone());
    let mut c = sb.cmd();
    let out = sb.data().join("from-fifo.jsonl");
    c.arg("shuffle")
        .arg(&fifo)
        .arg("-o")
        .arg(&out)
        .args(["--seed", "9"]);
    let o = run_within(c, None, LIMIT);
    release_fifo(&fifo, writer);
    assert_ok(&o);
    assert!(
        std::fs::read(&out).unwrap() == want,
        "a FIFO gives another output"
    );

    // A file then a FIFO: both are read whole, in the order given.
    let second = sb.data().join("second.jsonl");
    gen(&sb, &second, "lines", 5_000, 40, &[]);
    let want = shuffled(
        &sb,
        &[file.as_os_str(), second.as_os_str()],
        &sb.data().join("want2.jsonl"),
    );
    let writer = feed_fifo(&fifo, std::fs::read(&second).unwrap());
    let mut c = sb.cmd();
    let out = sb.data().join("file-then-fifo.jsonl");
    c.arg("shuffle")
        .arg(&file)
        .arg(&fifo)
        .arg("-o")
        .arg(&out)
        .args(["--seed", "9"]);
    let o = run_within(c, None, LIMIT);
    release_fifo(&fifo, writer);
    assert_ok(&o);
    assert!(
        std::fs::read(&out).unwrap() == want,
        "FILE FIFO differs from FILE FILE2"
    );

    // The same FIFO twice would wait forever for a second writer: refused up front.
    let mut c = sb.cmd();
    c.arg("shuffle")
        .arg(&fifo)
        .arg(&fifo)
        .arg("-o")
        .arg(sb.data().join("twice"));
    let o = run_within(c, None, LIMIT);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("same pipe"), "{}", text(&o.stderr));
}

#[test]
fn dev_stdin_and_process_substitution_shuffle_like_the_file() {
    let sb = Sandbox::new();
    let file = sb.data().join("in.txt");
    gen(&sb, &file, "lines", 10_000, 60, &[]);
    let bytes = std::fs::read(&file).unwrap();
    let want = shuffled(&sb, &[file.as_os_str()], &sb.data().join("want.txt"));

    let out = sb.data().join("stdin.txt");
    let mut c = sb.cmd();
    c.args(["shuffle", "/dev/stdin", "-o"])
        .arg(&out)
        .args(["--seed", "9"]);
    let o = run_within(c, Some(bytes.clone()), LIMIT);
    assert_ok(&o);
    assert!(std::fs::read(&out).unwrap() == want, "/dev/stdin differs");

    // `-` and /dev/stdin are the same pipe: the second would read nothing.
    let mut c = sb.cmd();
    c.args(["shuffle", "-", "/dev/stdin", "-o"])
        .arg(sb.data().join("twice"));
    let o = run_within(c, Some(bytes.clone()), LIMIT);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("same pipe"), "{}", text(&o.stderr));

    // What users type: `riffle shuffle <(cat FILE) -o OUT` (a /dev/fd/N pipe), when bash is
    // here to run it.
    if std::process::Command::new("bash")
        .arg("-c")
        .arg("true")
        .status()
        .is_err()
    {
        crate::skip_needed_in_ci("no bash for a process substitution");
        return;
    }
    let out = sb.data().join("substituted.txt");
    let mut c = std::process::Command::new("bash");
    c.env("XDG_CACHE_HOME", sb.cache())
        .env("RIFFLE", env!("CARGO_BIN_EXE_riffle"))
        .env("IN", &file)
        .env("OUT", &out)
        .args(["-c", r#""$RIFFLE" shuffle <(cat "$IN") -o "$OUT" --seed 9"#]);
    let o = run_within(c, None, LIMIT);
    assert_ok(&o);
    assert!(std::fs::read(&out).unwrap() == want, "<(cat FILE) differs");
}

#[test]
fn non_utf8_input_and_output_paths_work() {
    use std::os::unix::ffi::OsStrExt;
    let sb = Sandbox::new();
    let file = sb.data().join("in.txt");
    gen(&sb, &file, "lines", 2_000, 30, &[]);
    let want = shuffled(&sb, &[file.as_os_str()], &sb.data().join("want.txt"));
    let odd = sb.data().join(std::ffi::OsStr::from_bytes(b"\xff.txt"));
    std::fs::copy(&file, &odd).unwrap();
    let out = sb.data().join(std::ffi::OsStr::from_bytes(b"\xfe-out.txt"));
    assert!(shuffled(&sb, &[odd.as_os_str()], &out) == want);
}

/// The output is renamed into place when complete, so a FIFO or a directory named as the
/// output (or `/dev/stdout`, a link into /proc) is refused, never replaced: `-o -` streams.
#[test]
fn a_fifo_or_device_output_is_written_into_and_a_directory_refused() {
    let sb = Sandbox::new();
    let file = sb.data().join("in.txt");
    gen(&sb, &file, "lines", 2000, 20, &[]);
    let want = shuffled(&sb, &[file.as_os_str()], &sb.data().join("ref.txt"));
    // A FIFO: its reader gets the shuffled bytes, and the FIFO is still a FIFO after.
    let fifo = sb.data().join("out-fifo");
    make_fifo(&fifo);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    let mut c = sb.cmd();
    c.arg("shuffle")
        .arg(&file)
        .arg("-o")
        .arg(&fifo)
        .args(["--seed", "9"]);
    assert_ok(&run_within(c, None, LIMIT));
    assert_eq!(reader.join().unwrap(), want);
    use std::os::unix::fs::FileTypeExt;
    let still = std::fs::symlink_metadata(&fifo).unwrap().file_type();
    assert!(still.is_fifo(), "the FIFO named as the output was replaced");
    // A character device: /dev/null is written into, not replaced.
    let mut c = sb.cmd();
    c.arg("shuffle").arg(&file).args(["-o", "/dev/null"]);
    assert_ok(&run_within(c, None, LIMIT));
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    // A directory cannot be replaced.
    let dir = sb.data().join("out-dir");
    std::fs::create_dir(&dir).unwrap();
    let mut c = sb.cmd();
    c.arg("shuffle").arg(&file).arg("-o").arg(&dir);
    let o = run_within(c, None, LIMIT);
    crate::datasets::assert_bad(&o, &dir, None, "directory");
    assert!(text(&o.stderr).contains("-o -"), "{}", text(&o.stderr));
}

/// Runs `riffle ARGS` under a soft open-file limit of 256 (`ulimit -n 256`), counting the
/// process's open files every few milliseconds: its output and the most seen.
pub(crate) fn under_fd_limit_256(sb: &Sandbox, args: &[&std::ffi::OsStr]) -> (Output, usize) {
    let mut c = std::process::Command::new("sh");
    c.arg("-c")
        .arg("ulimit -n 256 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_riffle"))
        .args(args)
        .env("XDG_CACHE_HOME", sb.path().join("cache"))
        .env_remove("RIFFLE_IO")
        .env_remove("RIFFLE_DIRECT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    let fd_dir = format!("/proc/{}/fd", child.id());
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut most = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(d) = std::fs::read_dir(&fd_dir) {
                    most = most.max(d.count());
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            most
        })
    };
    let out = child.wait_with_output().unwrap();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    (out, sampler.join().unwrap())
}

/// Regression (issue 14, item 2): every pile held a file and a ring open while written,
/// so `ulimit -n 256` made a shuffle of many piles fail with EMFILE. Piles now share a few
/// group files and one ring: the limit changes neither the pile count nor the output, and
/// the run holds few files open.
#[test]
fn shuffle_under_ulimit_256_fits_its_piles_and_gives_the_same_output() {
    let sb = Sandbox::new();
    let input = sb.data().join("in.jsonl");
    gen(&sb, &input, "lines", 400_000, 100, &[]);
    let free = sb.data().join("free.jsonl");
    let o = sb
        .cmd()
        .arg("shuffle")
        .arg(&input)
        .arg("-o")
        .arg(&free)
        .args(["--seed", "3", "--memory", "1M", "--json"])
        .output()
        .unwrap();
    assert_ok(&o);
    let free_piles = serde_json::from_slice::<serde_json::Value>(&o.stderr).unwrap()["piles"]
        .as_u64()
        .unwrap();
    let capped = sb.data().join("capped.jsonl");
    let (o, most) = under_fd_limit_256(
        &sb,
        &[
            "shuffle".as_ref(),
            input.as_os_str(),
            "-o".as_ref(),
            capped.as_os_str(),
            "--seed".as_ref(),
            "3".as_ref(),
            "--memory".as_ref(),
            "1M".as_ref(),
            "--json".as_ref(),
        ],
    );
    assert_ok(&o);
    let piles = serde_json::from_slice::<serde_json::Value>(&o.stderr).unwrap()["piles"]
        .as_u64()
        .unwrap();
    assert_eq!(piles, free_piles, "the limit changed the pile count");
    assert!(piles >= 64, "{piles} piles: too few to tell");
    assert!(most <= 48, "{most} files open for {piles} piles");
    assert_eq!(
        std::fs::read(&free).unwrap(),
        std::fs::read(&capped).unwrap()
    );
}

/// Each record of a dataset through `riffle cat --framed`.
fn cat_records(sb: &Sandbox, dataset: &Path, extra: &[&str]) -> Vec<Vec<u8>> {
    let o = sb
        .cmd()
        .arg("cat")
        .arg(dataset)
        .arg("--framed")
        .args(extra)
        .output()
        .unwrap();
    assert_ok(&o);
    let (b, mut at, mut v) = (o.stdout, 0, Vec::new());
    while at < b.len() {
        let n = u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize;
        v.push(b[at + 8..at + 8 + n].to_vec());
        at += 8 + n;
    }
    v
}

/// WebDataset shards shuffle into one tar of whole samples (the same output whatever the
/// memory, piles or not), which riffle reads back as the same samples; `tar` lists it.
#[test]
fn tar_shards_shuffle_as_whole_samples_whatever_the_memory() {
    let sb = Sandbox::new();
    let dir = sb.data().join("shards");
    std::fs::create_dir(&dir).unwrap();
    // One shard: generated shards number their samples from 0, and two samples of one key
    // side by side would be one sample with two members of each name (refused).
    gen(
        &sb,
        &dir.join("s0.tar"),
        "tar",
        6_000,
        300,
        &["--size-jitter", "0.9"],
    );
    let outs = shuffle_at_memories(&sb, &dir.join("s0.tar"), "tar", 6_000, &["1G", "1M"]);
    let mut want = cat_records(&sb, &dir, &[]);
    let got = cat_records(&sb, &outs[0], &[]);
    assert_ne!(got, want, "not shuffled");
    let mut sorted = got.clone();
    sorted.sort();
    want.sort();
    assert_eq!(sorted, want, "other samples than the shards'");
    // A valid archive for tar itself: every member listed.
    let o = std::process::Command::new("tar")
        .arg("tf")
        .arg(&outs[0])
        .output();
    if let Ok(o) = o {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(
            o.stdout
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
                .count(),
            18_000
        );
    } else {
        eprintln!("tar is not installed: the archive's listing is not checked");
    }
}

/// A files tree shuffles into a tar whose members are the files, named by their path under
/// the tree, each file's bytes once.
#[test]
fn a_files_tree_shuffles_into_a_tar_of_its_files() {
    let sb = Sandbox::new();
    let tree = sb.data().join("tree");
    gen(
        &sb,
        &tree,
        "files",
        500,
        200,
        &["--size-jitter", "0.5", "--labels", "3"],
    );
    let out = sb.data().join("out.tar");
    let o = sb
        .cmd()
        .arg("shuffle")
        .arg(&tree)
        .args(["--format", "files", "-o"])
        .arg(&out)
        .args(["--memory", "1M", "--json"])
        .output()
        .unwrap();
    assert_ok(&o);
    let samples = cat_records(&sb, &out, &[]);
    assert_eq!(samples.len(), 500);
    let mut seen = std::collections::BTreeSet::new();
    for s in &samples {
        // One member: a ustar header naming LABEL/ID.bin, then the file's bytes.
        let name = String::from_utf8_lossy(&s[..100])
            .trim_end_matches('\0')
            .to_owned();
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&s[124..135]).trim_matches(|c: char| c == '\0' || c == ' '),
            8,
        )
        .unwrap();
        let body = std::fs::read(tree.join(&name)).unwrap();
        assert_eq!(&s[512..512 + size], &body[..], "{name}");
        assert!(seen.insert(name));
    }
}

/// Writes `bytes` to a shuffle's standard input in pieces of 1 to 13 bytes, so that the
/// pipe's reads split frames anywhere (headers, data and CRCs), and returns its outcome.
fn shuffle_from_trickle(sb: &Sandbox, bytes: &[u8], out: &Path) -> Output {
    let mut child = sb
        .cmd()
        .arg("shuffle")
        .arg("-")
        .arg("-o")
        .arg(out)
        .args(["--format", "tfrecord", "--seed", "4", "--memory", "1M"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let bytes = bytes.to_vec();
    let writer = std::thread::spawn(move || {
        let mut at = 0;
        for step in (1..=13).cycle() {
            if at == bytes.len() {
                break;
            }
            let end = (at + step).min(bytes.len());
            // A refused input may close the pipe early: the rest is not wanted.
            if stdin
                .write_all(&bytes[at..end])
                .and_then(|()| stdin.flush())
                .is_err()
            {
                break;
            }
            at = end;
        }
    });
    let o = child.wait_with_output().unwrap();
    writer.join().unwrap();
    o
}

/// TFRecord frames split across a pipe's reads at any byte are cut as in the file, and a
/// bad CRC is named at the same offset.
#[test]
fn tfrecords_trickled_through_a_pipe_shuffle_like_the_file() {
    let sb = Sandbox::new();
    let input = sb.data().join("in.tfrecord");
    gen(
        &sb,
        &input,
        "tfrecord",
        3_000,
        40,
        &["--size-jitter", "0.9"],
    );
    let bytes = std::fs::read(&input).unwrap();
    let want = sb.data().join("want.tfrecord");
    assert_ok(&shuffle_to(
        &sb,
        &input,
        &want,
        &["--seed", "4", "--memory", "1M"],
    ));
    let out = sb.data().join("piped.tfrecord");
    assert_ok(&shuffle_from_trickle(&sb, &bytes, &out));
    assert!(
        std::fs::read(&out).unwrap() == std::fs::read(&want).unwrap(),
        "a trickled pipe gives another output"
    );
    // The second frame's data CRC spoiled: its offset, from the pipe as from the file.
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let second = 16 + len;
    let len2 = u64::from_le_bytes(bytes[second..second + 8].try_into().unwrap()) as usize;
    let mut bad = bytes.clone();
    bad[second + 12 + len2] ^= 1;
    let o = shuffle_from_trickle(&sb, &bad, &sb.data().join("bad.tfrecord"));
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let at = format!("at byte {}", second + 12 + len2);
    assert!(
        err.contains("<stdin>") && err.contains(&at) && err.contains("data CRC"),
        "{err}"
    );
}
