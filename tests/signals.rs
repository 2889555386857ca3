//! Signals, pipes and process limits, for real: a stdout whose reader has gone or whose
//! device is full, SIGINT/SIGTERM/SIGHUP sent to a running process, a closed stderr,
//! RLIMIT_FSIZE and RLIMIT_NPROC set on the child (`ulimit`, `prlimit`), an emulation
//! cgroup present when the signal comes; a probe region larger than the free space.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::{assert_ok, gen, skip, skip_needed_in_ci, text, Sandbox};

/// A shell sees 141 (128 + SIGPIPE) where coreutils are stopped by a closed pipe.
const CLOSED_STDOUT: i32 = 141;

/// Runs `cmd` with stdout a pipe whose reading end is closed before the child writes
/// anything (so every write to it fails with EPIPE, whatever the pipe buffer holds).
fn with_closed_stdout(mut cmd: Command) -> Output {
    // The reading end is closed before the child starts: closing it after the spawn raced
    // a fast child under load, whose output then fitted the pipe and ended with 0.
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    cmd.stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
        .wait_with_output()
        .unwrap()
}

/// Entries riffle made in `dir` (scratch directories, temporary files).
fn riffle_entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".riffle-"))
        .collect();
    v.sort();
    v
}

fn assert_quiet_141(what: &str, o: &Output) {
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(CLOSED_STDOUT), "{what}: {err}");
    assert!(
        err.is_empty(),
        "{what}: a closed stdout is not an error: {err}"
    );
}

/// `riffle read X | head -1`, `plan | head`, `cat | head` and a shuffle to stdout, each
/// also with `--json` where it has one: the run ends quietly with 141, no panic, no
/// scratch left (the shuffle's piles were live when the write failed).
#[test]
fn a_closed_stdout_ends_the_run_quietly_with_141() {
    let sb = Sandbox::new();
    let data = sb.data();
    sb.seed_probe(&data);
    let npy = data.join("d.npy");
    gen(&sb, &npy, "npy", 2000, 64, &[]);
    let lines = data.join("l.jsonl");
    gen(&sb, &lines, "lines", 20_000, 100, &[]);
    for json in [false, true] {
        let mut read = sb.cmd();
        read.arg("read")
            .arg(&npy)
            .args(["--batch-size", "4", "--mode", "lirs"]);
        let mut plan = sb.cmd();
        plan.arg("plan").arg(&npy).args(["--batch-size", "4"]);
        if json {
            read.arg("--json");
            plan.arg("--json");
        }
        assert_quiet_141(&format!("read json={json}"), &with_closed_stdout(read));
        assert_quiet_141(&format!("plan json={json}"), &with_closed_stdout(plan));
    }
    let mut cat = sb.cmd();
    cat.arg("cat").arg(&npy);
    assert_quiet_141("cat", &with_closed_stdout(cat));
    let mut index = sb.cmd();
    index.arg("index").arg(&npy);
    assert_quiet_141("index", &with_closed_stdout(index));
    let mut shuffle = sb.cmd();
    shuffle
        .arg("shuffle")
        .arg(&lines)
        .args(["-o", "-", "--memory", "1M", "--tmpdir"])
        .arg(&data);
    assert_quiet_141("shuffle -o -", &with_closed_stdout(shuffle));
    assert!(
        riffle_entries(&data).is_empty(),
        "{:?}",
        riffle_entries(&data)
    );
}

/// `riffle read X > /dev/full` (and `--json`, and `cat`): an error naming stdout, exit 1,
/// no panic.
#[test]
fn a_full_stdout_is_an_error_naming_stdout() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        skip("this machine has no /dev/full");
        return;
    };
    let sb = Sandbox::new();
    let npy = sb.data().join("d.npy");
    gen(&sb, &npy, "npy", 2000, 64, &[]);
    for args in [
        &["read", "--batch-size", "4", "--mode", "lirs"][..],
        &["read", "--batch-size", "4", "--mode", "lirs", "--json"][..],
        &["cat"][..],
    ] {
        let o = sb
            .cmd()
            .arg(args[0])
            .arg(&npy)
            .args(&args[1..])
            .stdout(full.try_clone().unwrap())
            .output()
            .unwrap();
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("stdout") && err.contains("No space left"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// Waits until `dir` holds a `files` tree being generated with at least `n` files in its
/// scratch; panics if the child ends first or it takes over 300 s.
fn wait_for_files(child: &mut Child, dir: &Path, n: usize) {
    let start = Instant::now();
    let count = || -> usize {
        let scratch = std::fs::read_dir(dir).unwrap().flatten().filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".riffle-scratch-gen-")
        });
        let classes = scratch.flat_map(|d| std::fs::read_dir(d.path().join("tree")).into_iter());
        classes
            .flatten()
            .flatten()
            .flat_map(|c| std::fs::read_dir(c.path()).into_iter().flatten())
            .count()
    };
    while start.elapsed() < Duration::from_secs(300) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "gen ended before it could be stopped"
        );
        if count() >= n {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("gen wrote fewer than {n} files in 300 s");
}

/// Waits for `child` to exit, up to `limit` (a guard against a hang, far above what a
/// stopped run takes): `None` if it still runs then (it is killed).
fn wait_at_most(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    None
}

fn signal(child: &Child, sig: Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
}

/// `gen --format files` with far more records than it can write before the signal:
/// SIGINT, SIGTERM and SIGHUP stop it at once (it used to go on creating files while the
/// signal thread tried to remove its scratch), with 128 + the signal, and nothing is left:
/// no scratch, no output. Stderr is a pipe closed before the signal for SIGHUP (a
/// terminal that went away): the signal thread's report must not kill it.
#[test]
fn gen_files_stops_on_a_signal_and_removes_its_scratch() {
    let sb = Sandbox::new();
    let dir = sb.data();
    for (sig, closed_stderr) in [
        (Signal::SIGINT, false),
        (Signal::SIGTERM, false),
        (Signal::SIGHUP, true),
    ] {
        let out = dir.join("tree");
        let mut child = sb
            .cmd()
            .arg("gen")
            .arg(&out)
            .args([
                "--format",
                "files",
                "--records",
                "5000000",
                "--record-size",
                "16",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        if closed_stderr {
            drop(stderr);
        }
        wait_for_files(&mut child, &dir, 200);
        signal(&child, sig);
        let status = wait_at_most(&mut child, Duration::from_secs(60));
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(128 + sig as i32),
            "{sig}: still running 60 s after the signal, or another status"
        );
        assert!(!out.exists(), "{sig}: a partial output");
        assert!(
            riffle_entries(&dir).is_empty(),
            "{sig}: {:?}",
            riffle_entries(&dir)
        );
    }
}

/// A `files` tree of more files than the filesystem has inodes free is refused before
/// anything is written, with the numbers (a tmpfs mounted with few inodes).
#[test]
fn gen_files_refuses_more_files_than_free_inodes() {
    let sb = Sandbox::new();
    let mnt = sb.path().join("few-inodes");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16m,nr_inodes=1000", "tmpfs"])
        .arg(&mnt)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        skip_needed_in_ci("cannot mount a tmpfs with few inodes here (needs root)");
        return;
    }
    let o = sb
        .cmd()
        .arg("gen")
        .arg(mnt.join("tree"))
        .args([
            "--format",
            "files",
            "--records",
            "5000",
            "--record-size",
            "16",
        ])
        .output()
        .unwrap();
    let left = std::fs::read_dir(&mnt).unwrap().count();
    let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("5000 files") && err.contains("room for"),
        "{err}"
    );
    assert_eq!(left, 0, "something was written before the refusal");
}

/// Runs `riffle ARGS` under `ulimit -f BLOCKS` (1 KiB blocks), the way a shell sets it.
fn under_file_size_limit(sb: &Sandbox, blocks: u64, args: &[&std::ffi::OsStr]) -> Output {
    Command::new("bash")
        .arg("-c")
        .arg(format!("ulimit -f {blocks} && exec \"$@\""))
        .arg("riffle")
        .arg(env!("CARGO_BIN_EXE_riffle"))
        .args(args)
        .env("XDG_CACHE_HOME", sb.cache())
        .env_remove("RIFFLE_IO")
        .env_remove("RIFFLE_DIRECT")
        .output()
        .unwrap()
}

/// Under `ulimit -f`, gen and shuffle used to die of SIGXFSZ (153, no message, temporary
/// files left): now the write fails with EFBIG, reported as an error naming the file,
/// exit 1, and the temporary files are removed. An index that cannot be saved is only
/// a notice (the run still reads).
#[test]
fn a_file_size_limit_is_an_error_naming_the_file_with_cleanup() {
    let sb = Sandbox::new();
    let data = sb.data();
    let input = data.join("in.jsonl");
    gen(&sb, &input, "lines", 20_000, 100, &[]);
    let npy = data.join("x.npy");
    let shuffled = data.join("s.jsonl");
    let os = |s: &'static str| std::ffi::OsStr::new(s);
    for (what, args) in [
        (
            "gen",
            vec![
                os("gen"),
                npy.as_os_str(),
                os("--format"),
                os("npy"),
                os("--records"),
                os("20000"),
                os("--record-size"),
                os("64"),
            ],
        ),
        (
            "shuffle",
            vec![
                os("shuffle"),
                input.as_os_str(),
                os("-o"),
                shuffled.as_os_str(),
                os("--memory"),
                os("1M"),
            ],
        ),
    ] {
        let o = under_file_size_limit(&sb, 100, &args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{what}: {err}");
        assert!(err.contains("File too large"), "{what}: {err}");
        // The file the write failed on: the output's temporary name, or a shuffle's pile.
        let named = if what == "gen" { "x.npy" } else { "group-" };
        assert!(err.contains(named), "{what}: {err}");
        assert!(
            !npy.exists() && !shuffled.exists(),
            "{what}: partial output"
        );
        assert!(
            riffle_entries(&data).is_empty(),
            "{what}: {:?}",
            riffle_entries(&data)
        );
    }
    let o = under_file_size_limit(&sb, 10, &[os("index"), input.as_os_str()]);
    assert_ok(&o);
    assert!(
        riffle_entries(&data).is_empty(),
        "index: {:?}",
        riffle_entries(&data)
    );
}

/// Runs `riffle ARGS` as an unprivileged user with at most `n` processes and threads
/// (RLIMIT_NPROC does not bind root), or `None` where that cannot be arranged.
fn with_thread_limit(sb: &Sandbox, n: u32, args: &[&std::ffi::OsStr]) -> Option<Output> {
    let o = Command::new("setpriv")
        .args(["--reuid", "54321", "--regid", "54321", "--clear-groups"])
        .arg("prlimit")
        .arg(format!("--nproc={n}"))
        .arg(env!("CARGO_BIN_EXE_riffle"))
        .args(args)
        .env("XDG_CACHE_HOME", sb.cache())
        .env("RIFFLE_IO", "pread")
        .output()
        .ok()?;
    Some(o)
}

/// A thread the system refuses (`ulimit -u`) is an error naming what could not start, or
/// work done on the thread at hand, never a panic: the pread pool used to panic in
/// `riffle-lirs` ("spawn pread worker"). Two-pass under io_uring may see requests
/// cancelled by the kernel for want of a worker thread: the message then says to look at
/// `ulimit -u`.
#[test]
fn a_thread_limit_is_an_error_not_a_panic() {
    if !nix::unistd::geteuid().is_root() {
        skip_needed_in_ci("RLIMIT_NPROC is tested as another user, which needs root");
        return;
    }
    let sb = Sandbox::new();
    let data = sb.data();
    let npy = data.join("d.npy");
    gen(&sb, &npy, "npy", 20_000, 64, &[]);
    // The unprivileged user reads the dataset and writes its scratch in the sandbox.
    for p in [sb.path(), &data] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    std::fs::set_permissions(&npy, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut refused = 0;
    for mode in ["lirs", "sequential", "two-pass"] {
        for n in 2..=8 {
            let mut args = vec![
                "read",
                npy.to_str().unwrap(),
                "--batch-size",
                "4",
                "--mode",
                mode,
            ];
            if mode == "two-pass" {
                // Small enough for several piles, so several threads.
                args.extend(["--memory", "600K", "--scratch", data.to_str().unwrap()]);
            }
            let args: Vec<_> = args.into_iter().map(std::ffi::OsStr::new).collect();
            let Some(o) = with_thread_limit(&sb, n, &args) else {
                skip("setpriv or prlimit (util-linux) is not installed");
                return;
            };
            let err = text(&o.stderr);
            assert!(!err.contains("panicked"), "{mode} nproc {n}: {err}");
            match o.status.code() {
                Some(0) => {}
                Some(1) => {
                    refused += 1;
                    assert!(
                        err.contains("cannot start")
                            || err.contains("ulimit -u")
                            || err.contains("Resource temporarily unavailable"),
                        "{mode} nproc {n}: {err}"
                    );
                }
                other => panic!("{mode} nproc {n}: exit {other:?}: {err}"),
            }
        }
    }
    assert!(
        refused > 0,
        "no run was short of threads: the test tests nothing"
    );
}

/// SIGINT under `--emulate hdd` removes the blkio/io cgroup the run made (it used to stay
/// behind), and exits 130.
#[test]
fn sigint_under_emulation_removes_the_cgroup() {
    if let Err(e) = riffle::emulate::supported() {
        skip(&e.to_string());
        return;
    }
    let sb = Sandbox::new();
    let npy = sb.data().join("d.npy");
    // 20,000 random 4 KiB reads at 600 a second: half a minute, far longer than the test
    // waits before the signal.
    gen(&sb, &npy, "npy", 20_000, 4096, &[]);
    let mut child = sb
        .cmd()
        .args([
            "read",
            "--emulate",
            "hdd",
            "--mode",
            "lirs",
            "--batch-size",
            "4",
        ])
        .arg(&npy)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let start = Instant::now();
    while crate::emulate::groups_of(pid).is_empty() {
        assert!(
            child.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(60),
            "the run made no cgroup"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    signal(&child, Signal::SIGINT);
    let o = child.wait_with_output().unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(err.contains("emulation cgroup"), "{err}");
    crate::emulate::assert_no_group_left(pid);
}

/// `probe --region 2^64-1` used to write a region of half the free space (9.1 GiB on the
/// machine of the report) without a word: a region asked for that the free space cannot
/// hold twice over is refused with the numbers, before anything is written.
#[test]
fn a_probe_region_beyond_the_free_space_is_refused() {
    let sb = Sandbox::new();
    let data = sb.data();
    let o = sb
        .cmd()
        .args(["probe", "--quick", "--region", &u64::MAX.to_string()])
        .arg(&data)
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("{} bytes", u64::MAX))
            && err.contains("free")
            && err.contains("at most --region"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(&data).unwrap().count(),
        0,
        "something was written"
    );
}

/// Regression (issue 30 D7): `(riffle read lines.jsonl --batch-size 100 --epochs 100000
/// --mode M 2>&1 | true) &`, then a signal. Stdout and stderr are one pipe whose reader has
/// gone, so the signal thread's report fails: the run must still end, with 128 + the
/// signal (or 141 for the closed pipe), never 101 or running on, and its scratch removed.
#[test]
fn a_signal_ends_a_run_whose_stdout_and_stderr_are_a_closed_pipe() {
    use std::os::unix::ffi::OsStrExt;
    let sb = Sandbox::new();
    let data = sb.data();
    sb.seed_probe(&data);
    let lines = data.join("lines.jsonl");
    gen(&sb, &lines, "lines", 20_000, 100, &[]);
    for mode in ["two-pass", "lirs"] {
        for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
            let (r, w) = nix::unistd::pipe().unwrap();
            drop(r);
            let mut child = sb
                .cmd()
                .arg("read")
                .arg(&lines)
                .args(["--batch-size", "100", "--epochs", "100000", "--mode", mode])
                .stdout(Stdio::from(w.try_clone().unwrap()))
                .stderr(Stdio::from(w))
                .spawn()
                .unwrap();
            // Running: it holds the data file open (and, in two-pass, made its scratch).
            let fds = format!("/proc/{}/fd", child.id());
            let start = Instant::now();
            loop {
                assert!(
                    child.try_wait().unwrap().is_none(),
                    "{mode} {sig}: ended before the signal"
                );
                let reading = std::fs::read_dir(&fds)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|e| {
                        std::fs::read_link(e.path())
                            .is_ok_and(|t| t.as_os_str().as_bytes().ends_with(b"lines.jsonl"))
                    });
                let scratch = riffle_entries(&data)
                    .iter()
                    .any(|n| n.starts_with(".riffle-scratch-two-pass-"));
                if reading && (mode != "two-pass" || scratch) {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(120),
                    "{mode}: never ran"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            signal(&child, sig);
            let code = wait_at_most(&mut child, Duration::from_secs(60)).and_then(|s| s.code());
            assert!(
                code == Some(128 + sig as i32) || code == Some(CLOSED_STDOUT),
                "{mode} {sig}: {code:?} (None: still running 60 s after the signal)"
            );
            assert!(
                riffle_entries(&data).is_empty(),
                "{mode} {sig}: {:?}",
                riffle_entries(&data)
            );
        }
    }
}
