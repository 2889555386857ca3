//! The one door (issue 30, D1-D5, D11, D26, D27, D37): metadata riffle reads is never a FIFO,
//! a device or a planted link; outputs are committed through private temporary files, a
//! FIFO or character device is written into and never replaced, a block device is refused,
//! and an output that is an input is refused before anything is written.

use std::io::{Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{assert_ok, skip_needed_in_ci, text, Sandbox};

/// Runs `cmd` (stdin fed from `input`), killing it after `secs`: a run that hangs (on a
/// FIFO, say) fails the test instead of hanging it.
fn run_for(mut cmd: Command, input: Option<Vec<u8>>, secs: u64) -> Output {
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let feeder = input.map(|bytes| {
        let mut stdin = child.stdin.take().unwrap();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&bytes);
        })
    });
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("riffle did not finish within {secs} s (it hangs)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if let Some(f) = feeder {
        let _ = f.join();
    }
    Output {
        status,
        stdout: reader.join().unwrap(),
        stderr: err_reader.join().unwrap(),
    }
}

/// A pid that no process has now (a child that has been reaped).
fn dead_pid() -> u32 {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

fn mkfifo(p: &Path) {
    nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
}

/// A FIFO made at `p`, opened for reading without blocking: a writer's open does not wait,
/// and what riffle writes (less than a pipe's buffer) waits in it until [`drain`]. If riffle
/// replaced the FIFO, the test sees nothing rather than hanging on a reader.
fn fifo_with_reader(p: &Path) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    mkfifo(p);
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(p)
        .unwrap()
}

/// What is waiting in a FIFO opened by [`fifo_with_reader`], once its writer is gone.
fn drain(mut f: std::fs::File) -> Vec<u8> {
    let mut v = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match f.read(&mut buf) {
            Ok(0) => return v,
            Ok(n) => v.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return v,
            Err(e) => panic!("{e}"),
        }
    }
}

fn lines(n: u64) -> Vec<u8> {
    (0..n)
        .map(|i| format!("{i}\n"))
        .collect::<String>()
        .into_bytes()
}

fn sorted(bytes: &[u8]) -> Vec<&[u8]> {
    let mut v: Vec<&[u8]> = bytes
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    v.sort();
    v
}

fn failed_with(out: &Output, needle: &str) -> String {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(needle), "wanted {needle:?} in:\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// D1: a stale-looking scratch directory whose `owner` is a FIFO (the next run hung on it
/// forever) or a link to /dev/stdin (the reclaim ate the run's own input).
#[test]
fn d1_reclaim_never_reads_a_planted_owner() {
    let sb = Sandbox::new();
    let dir = sb.data();
    let input = dir.join("in.txt");
    std::fs::write(&input, lines(1000)).unwrap();
    let planted = dir.join(format!(".riffle-scratch-p-{}-x", dead_pid()));
    std::fs::create_dir(&planted).unwrap();
    mkfifo(&planted.join("owner"));
    let mut c = sb.cmd();
    c.arg("shuffle")
        .arg(&input)
        .arg("-o")
        .arg(dir.join("out.txt"));
    let out = run_for(c, None, 30);
    assert_ok(&out);
    let got = std::fs::read(dir.join("out.txt")).unwrap();
    assert_eq!(sorted(&got), sorted(&lines(1000)));

    let other = dir.join(format!(".riffle-scratch-p-{}-y", dead_pid()));
    std::fs::create_dir(&other).unwrap();
    std::os::unix::fs::symlink("/dev/stdin", other.join("owner")).unwrap();
    let mut c = sb.cmd();
    c.args(["shuffle", "-", "--memory", "1M", "-o"])
        .arg(dir.join("out2.txt"));
    let out = run_for(c, Some(lines(300_000)), 120);
    assert_ok(&out);
    let got = std::fs::read(dir.join("out2.txt")).unwrap();
    assert_eq!(
        sorted(&got).len(),
        300_000,
        "every record of stdin shuffled: {}",
        text(&out.stderr)
    );
}

/// D2: a FIFO or a link at an index or listing sidecar's name is refused and the index
/// rebuilt (it hung, or read /dev/zero without end).
#[test]
fn d2_sidecars_that_are_not_regular_files_are_rebuilt() {
    let sb = Sandbox::new();
    let dir = sb.data();
    let f = dir.join("f.jsonl");
    let body: String = (0..500).map(|i| format!("{{\"i\":{i}}}\n")).collect();
    std::fs::write(&f, &body).unwrap();
    mkfifo(&dir.join("f.jsonl.ridx"));
    let mut c = sb.cmd();
    c.arg("read")
        .arg(&f)
        .args(["--batch-size", "10", "--mode", "sequential"]);
    let out = run_for(c, None, 30);
    assert_ok(&out);
    assert!(text(&out.stderr).contains("FIFO"), "{}", text(&out.stderr));

    // A link at the sidecar's name (to a file that would decode, even): not followed.
    let g = dir.join("g.jsonl");
    std::fs::write(&g, &body).unwrap();
    let real = dir.join("elsewhere");
    std::fs::write(&real, b"not an index").unwrap();
    std::os::unix::fs::symlink(&real, dir.join("g.jsonl.ridx")).unwrap();
    let mut c = sb.cmd();
    c.arg("read")
        .arg(&g)
        .args(["--batch-size", "10", "--mode", "sequential"]);
    let out = run_for(c, None, 30);
    assert_ok(&out);
    assert!(
        text(&out.stderr).contains("symbolic link"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read(&real).unwrap(), b"not an index");

    // A files tree whose listing sidecar is a FIFO.
    let imgs = dir.join("imgs");
    std::fs::create_dir_all(imgs.join("cat")).unwrap();
    for i in 0..5 {
        std::fs::write(imgs.join(format!("cat/{i}.jpg")), vec![i as u8; 100]).unwrap();
    }
    mkfifo(&dir.join("imgs.ridx"));
    let mut c = sb.cmd();
    c.arg("read").arg(&imgs).args([
        "--format",
        "files",
        "--batch-size",
        "2",
        "--mode",
        "sequential",
    ]);
    let out = run_for(c, None, 30);
    assert_ok(&out);
}

/// D3: `cat -o` of its own input is refused and the input kept; a symlink or hard link at
/// the output keeps its target; a FIFO output is written into.
#[test]
fn d3_cat_output_goes_through_the_door() {
    let sb = Sandbox::new();
    let dir = sb.data();
    let c_txt = dir.join("c.txt");
    std::fs::write(&c_txt, lines(100)).unwrap();
    let out = sb
        .cmd()
        .arg("cat")
        .arg(&c_txt)
        .arg("-o")
        .arg(&c_txt)
        .output()
        .unwrap();
    failed_with(&out, "is the input");
    assert_eq!(std::fs::read(&c_txt).unwrap(), lines(100));

    // Through a hard link too.
    let hard = dir.join("hard.txt");
    std::fs::hard_link(&c_txt, &hard).unwrap();
    let out = sb
        .cmd()
        .arg("cat")
        .arg(&c_txt)
        .arg("-o")
        .arg(&hard)
        .output()
        .unwrap();
    failed_with(&out, "is the input");
    assert_eq!(std::fs::read(&c_txt).unwrap(), lines(100));

    // A link at the output is replaced; its target is not written.
    let precious = dir.join("precious");
    std::fs::write(&precious, b"precious").unwrap();
    let link = dir.join("link.out");
    std::os::unix::fs::symlink(&precious, &link).unwrap();
    let out = sb
        .cmd()
        .arg("cat")
        .arg(&c_txt)
        .args(["--ids", "0..3", "--newline", "-o"])
        .arg(&link)
        .output()
        .unwrap();
    assert_ok(&out);
    assert_eq!(std::fs::read(&precious).unwrap(), b"precious");
    assert!(std::fs::symlink_metadata(&link).unwrap().is_file());
    assert_eq!(std::fs::read(&link).unwrap(), b"0\n1\n2\n");
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".riffle-tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // A FIFO output is written into and stays a FIFO.
    let fifo = dir.join("pipe");
    let reader = fifo_with_reader(&fifo);
    let mut c = sb.cmd();
    c.arg("cat")
        .arg(&c_txt)
        .args(["--ids", "5", "--newline", "-o"])
        .arg(&fifo);
    assert_ok(&run_for(c, None, 30));
    assert_eq!(drain(reader), b"5\n");
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
}

/// D4: `--ids-out` naming the dataset is refused (it truncated the dataset to 0); a link
/// there keeps its target.
#[test]
fn d4_ids_out_goes_through_the_door() {
    let sb = Sandbox::new();
    let dir = sb.data();
    let src = dir.join("src2.txt");
    std::fs::write(&src, lines(100)).unwrap();
    let out = sb
        .cmd()
        .arg("read")
        .arg(&src)
        .args(["--batch-size", "10", "--mode", "sequential", "--ids-out"])
        .arg(&src)
        .output()
        .unwrap();
    failed_with(&out, "is the input");
    assert_eq!(std::fs::read(&src).unwrap(), lines(100));

    let precious = dir.join("precious");
    std::fs::write(&precious, b"precious").unwrap();
    let link = dir.join("ids.txt");
    std::os::unix::fs::symlink(&precious, &link).unwrap();
    let out = sb
        .cmd()
        .arg("read")
        .arg(&src)
        .args(["--batch-size", "10", "--mode", "sequential", "--ids-out"])
        .arg(&link)
        .output()
        .unwrap();
    assert_ok(&out);
    assert_eq!(std::fs::read(&precious).unwrap(), b"precious");
    let ids = std::fs::read_to_string(&link).unwrap();
    assert_eq!(ids.lines().count(), 10, "{ids}");

    // `-` is refused, not a file named "-" made in the working directory.
    let out = sb
        .cmd()
        .current_dir(&dir)
        .arg("read")
        .arg(&src)
        .args([
            "--batch-size",
            "10",
            "--mode",
            "sequential",
            "--ids-out",
            "-",
        ])
        .output()
        .unwrap();
    failed_with(&out, "--ids-out -");
    assert!(!dir.join("-").exists(), "a file named '-' was made");
}

/// D5: gen and shuffle write into a FIFO at `-o` (they renamed a file over it); as root, a
/// character device stays one and a block device is refused.
#[test]
fn d5_streams_at_the_output_are_written_into_never_replaced() {
    let sb = Sandbox::new();
    let dir = sb.data();
    let input = dir.join("in.txt");
    std::fs::write(&input, lines(50)).unwrap();
    for (i, what) in ["gen", "shuffle"].into_iter().enumerate() {
        let fifo = dir.join(format!("fifo{i}"));
        let reader = fifo_with_reader(&fifo);
        let mut c = sb.cmd();
        match what {
            "gen" => c.arg("gen").arg(&fifo).args([
                "--format",
                "lines",
                "--records",
                "20",
                "--record-size",
                "40",
            ]),
            _ => c.arg("shuffle").arg(&input).arg("-o").arg(&fifo),
        };
        let out = run_for(c, None, 30);
        assert_ok(&out);
        let got = drain(reader);
        assert!(!got.is_empty(), "{what}: nothing reached the FIFO");
        assert!(
            std::fs::symlink_metadata(&fifo)
                .unwrap()
                .file_type()
                .is_fifo(),
            "{what} replaced the FIFO"
        );
    }
    if !nix::unistd::geteuid().is_root() {
        skip_needed_in_ci("device nodes need root (mknod)");
        return;
    }
    let null = dir.join("null");
    let block = dir.join("block");
    let mknod = |p: &Path, kind, major, minor| {
        nix::sys::stat::mknod(
            p,
            kind,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            nix::sys::stat::makedev(major, minor),
        )
        .unwrap()
    };
    mknod(&null, nix::sys::stat::SFlag::S_IFCHR, 1, 3);
    mknod(&block, nix::sys::stat::SFlag::S_IFBLK, 7, 0);
    let out = sb
        .cmd()
        .arg("gen")
        .arg(&null)
        .args([
            "--format",
            "lines",
            "--records",
            "20",
            "--record-size",
            "40",
        ])
        .output()
        .unwrap();
    assert_ok(&out);
    assert!(std::fs::symlink_metadata(&null)
        .unwrap()
        .file_type()
        .is_char_device());
    for args in [
        vec!["gen".to_owned(), block.display().to_string()],
        vec![
            "shuffle".to_owned(),
            input.display().to_string(),
            "-o".to_owned(),
            block.display().to_string(),
        ],
    ] {
        let mut c = sb.cmd();
        c.args(&args);
        if args[0] == "gen" {
            c.args([
                "--format",
                "lines",
                "--records",
                "20",
                "--record-size",
                "40",
            ]);
        }
        let out = c.output().unwrap();
        failed_with(&out, "block device");
        assert!(std::fs::symlink_metadata(&block)
            .unwrap()
            .file_type()
            .is_block_device());
    }
}

/// D11, D37: `cat --ids` ranges are checked against the dataset before anything is
/// allocated (a huge range panicked or tried to allocate terabytes), and a range that ends
/// before it starts is refused (it printed nothing, rc 0).
#[test]
fn d11_d37_cat_id_ranges_are_checked_first() {
    let sb = Sandbox::new();
    let f = sb.data().join("c.txt");
    std::fs::write(&f, lines(10)).unwrap();
    for (ids, needle) in [
        ("0..18446744073709551615", "out of range"),
        ("0..1000000000000", "out of range"),
        ("5..2", "ends before it starts"),
        ("10", "out of range"),
    ] {
        let mut c = sb.cmd();
        c.arg("cat").arg(&f).args(["--ids", ids]);
        failed_with(&run_for(c, None, 30), needle);
    }
    let out = sb
        .cmd()
        .arg("cat")
        .arg(&f)
        .args(["--ids", "8..10,0", "--newline"])
        .output()
        .unwrap();
    assert_ok(&out);
    assert_eq!(out.stdout, b"8\n9\n0\n");
}

/// D27: a split part that is an input is refused before anything is written (it was
/// overwritten); D26: an output named with 240 bytes gets a temporary name within NAME_MAX.
#[test]
fn d27_split_parts_that_are_inputs_are_refused_and_d26_long_names_work() {
    let sb = Sandbox::new();
    let dir = sb.data();
    let part = dir.join("s.txt.000");
    std::fs::write(&part, lines(100)).unwrap();
    let out = sb
        .cmd()
        .arg("shuffle")
        .arg(&part)
        .arg("-o")
        .arg(dir.join("s.txt"))
        .args(["--split-lines", "10"])
        .output()
        .unwrap();
    failed_with(&out, "is the input");
    assert_eq!(std::fs::read(&part).unwrap(), lines(100));

    let long = dir.join("x".repeat(240));
    let out = sb
        .cmd()
        .arg("shuffle")
        .arg(&part)
        .arg("-o")
        .arg(&long)
        .output()
        .unwrap();
    assert_ok(&out);
    assert_eq!(sorted(&std::fs::read(&long).unwrap()), sorted(&lines(100)));
}

/// D3: SIGINT during `cat -o` leaves nothing at the output's name (it left a partial file)
/// and no temporary file.
#[test]
fn d3_interrupted_cat_leaves_no_partial_output() {
    let sb = Sandbox::new();
    let dir = sb.data();
    let big = dir.join("big.txt");
    std::fs::write(&big, lines(3_000_000)).unwrap();
    let out = dir.join("big.out");
    let mut child = sb
        .cmd()
        .arg("cat")
        .arg(&big)
        .args(["--newline", "-o"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Signalled once the output exists under any name (final or temporary).
    let started = Instant::now();
    let writing = || {
        std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().contains("big.out"))
    };
    while !writing() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "cat finished before it could be stopped: make the input bigger"
        );
        assert!(started.elapsed() < Duration::from_secs(300), "no output");
        std::thread::sleep(Duration::from_millis(5));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", text(&o.stderr));
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "big.txt" && n != "big.txt.ridx")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
