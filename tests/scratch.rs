//! Files riffle creates: private temporary names that a planted link cannot redirect, a
//! scratch lifecycle that survives SIGINT, SIGTERM and SIGKILL (reclaimed by the next run),
//! split outputs committed as a set.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::{assert_ok, gen, text, Sandbox};

/// Entries of `dir` that riffle made (scratch directories, temporary files).
fn riffle_entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".riffle-") && !n.ends_with("riffle-tmp-planted"))
        .collect();
    v.sort();
    v
}

/// Waits (up to 300 s) until riffle has written pile bytes in its scratch in `dir`; false
/// if the child ended first.
fn wait_for_scratch(child: &mut Child, dir: &Path) -> bool {
    let start = Instant::now();
    let pile_bytes = || -> u64 {
        let scratch = std::fs::read_dir(dir).unwrap().flatten().filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".riffle-scratch-")
        });
        let files = scratch.flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten());
        files
            .flatten()
            .filter_map(|f| f.metadata().ok())
            .map(|m| m.len())
            .sum()
    };
    while start.elapsed() < Duration::from_secs(300) {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        if pile_bytes() > 0 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no pile was written in {} within 300 s", dir.display());
}

fn signal(child: &Child, sig: Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
}

fn sorted_lines(p: &Path) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = std::fs::read(p)
        .unwrap()
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    v.sort();
    v
}

/// A symlink at the first temporary name each command tries (fixed through
/// `RIFFLE_TEST_TEMP_SUFFIX`) points at a file that must not change; the command picks
/// another name, and its output is a regular file with the usual permissions.
#[test]
fn planted_links_at_temporary_names_are_never_followed() {
    let sb = Sandbox::new();
    let data = sb.data();
    let victim = sb.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let plant = |dir: &Path, name: &str| {
        let link = dir.join(format!(".{name}.riffle-tmp-planted"));
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        link
    };
    let run = |c: &mut Command| {
        let o = c
            .env("RIFFLE_TEST_TEMP_SUFFIX", "planted")
            .output()
            .unwrap();
        assert_ok(&o);
    };
    // gen
    let input = data.join("in.jsonl");
    let l1 = plant(&data, "in.jsonl");
    run(sb.cmd().arg("gen").arg(&input).args([
        "--format",
        "lines",
        "--records",
        "20000",
        "--record-size",
        "50",
    ]));
    // index (the sidecar)
    let l2 = plant(&data, "in.jsonl.ridx");
    run(sb.cmd().arg("index").arg(&input));
    // shuffle, in memory and through piles
    let out = data.join("out.jsonl");
    let l3 = plant(&data, "out.jsonl");
    run(sb.cmd().arg("shuffle").arg(&input).arg("-o").arg(&out));
    run(sb
        .cmd()
        .arg("shuffle")
        .arg(&input)
        .arg("-o")
        .arg(&out)
        .args(["--memory", "1M"]));
    // probe's scratch region
    let pdir = sb.path().join("probe");
    std::fs::create_dir(&pdir).unwrap();
    let l4 = plant(&pdir, "riffle-probe");
    run(sb
        .cmd()
        .args([
            "probe",
            "--quick",
            "--region",
            "16M",
            "--point-time",
            "0.05",
            "--refresh",
        ])
        .arg(&pdir));
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        b"precious",
        "a link was followed"
    );
    for l in [&l1, &l2, &l3, &l4] {
        let m = std::fs::symlink_metadata(l).unwrap();
        assert!(m.file_type().is_symlink(), "{} was replaced", l.display());
    }
    for f in [&input, &out, &data.join("in.jsonl.ridx")] {
        let m = std::fs::symlink_metadata(f).unwrap();
        assert!(
            m.file_type().is_file(),
            "{} is not a regular file",
            f.display()
        );
    }
    // Outputs are not left private (mode 0600) once committed: the umask decides.
    let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode & 0o044, 0o044 & !umask(), "output mode {mode:o}");
    assert_eq!(sorted_lines(&out), sorted_lines(&input));
    assert!(
        riffle_entries(&data).is_empty(),
        "{:?}",
        riffle_entries(&data)
    );
    assert!(
        riffle_entries(&pdir).is_empty(),
        "{:?}",
        riffle_entries(&pdir)
    );
}

fn umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .map(|v| u32::from_str_radix(v.trim(), 8).unwrap())
        .unwrap()
}

/// The commands a user interrupts: a shuffle through piles (output beside the input), and
/// a two-pass read with its piles in a `--scratch` that did not exist.
fn interruptible(sb: &Sandbox, input: &Path, out: &Path, scratch: &Path, which: &str) -> Command {
    let mut c = sb.cmd();
    match which {
        "shuffle" => {
            c.arg("shuffle")
                .arg(input)
                .arg("-o")
                .arg(out)
                .args(["--memory", "4M"]);
        }
        "two-pass" => {
            c.arg("read")
                .arg(input)
                .args([
                    "--mode",
                    "two-pass",
                    "--batch-size",
                    "64",
                    "--epochs",
                    "3",
                    "--memory",
                    "64M",
                    "--scratch",
                ])
                .arg(scratch);
        }
        _ => unreachable!(),
    }
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    c
}

fn scratch_location(data: &Path, scratch: &Path, which: &str) -> PathBuf {
    if which == "shuffle" {
        data.to_path_buf()
    } else {
        scratch.to_path_buf()
    }
}

/// A JSONL input big enough to interrupt mid-run (in the sandbox's data directory), and
/// where its output goes.
fn big_input(sb: &Sandbox) -> (PathBuf, PathBuf, PathBuf) {
    let data = sb.data();
    let input = data.join("in.jsonl");
    gen(
        sb,
        &input,
        "lines",
        1_500_000,
        100,
        &["--size-jitter", "0.5"],
    );
    let out = data.join("out.jsonl");
    (data, input, out)
}

/// Starts `which` and returns it once it has scratch in its location (made on demand
/// for a two-pass read's `--scratch`: waited for first).
fn start_until_scratch(
    sb: &Sandbox,
    (data, input, out): &(PathBuf, PathBuf, PathBuf),
    scratch: &Path,
    which: &str,
) -> Child {
    let watch = scratch_location(data, scratch, which);
    let mut child = interruptible(sb, input, out, scratch, which)
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !watch.exists() && started.elapsed() < Duration::from_secs(300) {
        std::thread::sleep(Duration::from_millis(10));
    }
    if !wait_for_scratch(&mut child, &watch) {
        panic!("{which} finished before it could be stopped: make the input bigger");
    }
    child
}

#[test]
fn sigint_and_sigterm_remove_the_scratch_and_exit_130_and_143() {
    let sb = Sandbox::new();
    let job = big_input(&sb);
    let (data, _, out) = job.clone();
    let scratch = sb.path().join("scratch-not-yet");
    for (which, sig, code) in [
        ("shuffle", Signal::SIGINT, 130),
        ("two-pass", Signal::SIGTERM, 143),
        ("two-pass", Signal::SIGINT, 130),
    ] {
        let child = start_until_scratch(&sb, &job, &scratch, which);
        signal(&child, sig);
        let o = child.wait_with_output().unwrap();
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{which}: {err}");
        assert!(err.contains("removed"), "{which}: {err}");
        assert!(!err.contains("panicked"), "{which}: {err}");
        assert!(!out.exists(), "{which}: a partial output");
        assert!(
            riffle_entries(&data).is_empty(),
            "{which}: {:?}",
            riffle_entries(&data)
        );
        assert!(
            !scratch.exists(),
            "{which}: the --scratch it made is left behind"
        );
    }
}

#[test]
fn sigkill_leaves_scratch_that_the_next_run_reclaims() {
    let sb = Sandbox::new();
    let job = big_input(&sb);
    let (data, input, out) = job.clone();
    let scratch = sb.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    for which in ["shuffle", "two-pass"] {
        let watch = scratch_location(&data, &scratch, which);
        let mut child = start_until_scratch(&sb, &job, &scratch, which);
        child.kill().unwrap();
        child.wait().unwrap();
        let left = riffle_entries(&watch);
        assert!(
            !left.is_empty(),
            "{which}: SIGKILL left nothing to reclaim?"
        );
        // The rerun removes what the dead run left, says so, and leaves nothing itself.
        let o = interruptible(&sb, &input, &out, &scratch, which)
            .output()
            .unwrap();
        assert_ok(&o);
        let err = text(&o.stderr);
        assert!(
            err.contains("left in") && err.contains("reclaimed"),
            "{which}: no notice of the reclaimed scratch: {err}"
        );
        assert!(
            riffle_entries(&data).is_empty(),
            "{which}: {:?}",
            riffle_entries(&data)
        );
        assert!(
            riffle_entries(&scratch).is_empty(),
            "{which}: {:?}",
            riffle_entries(&scratch)
        );
    }
    assert_eq!(sorted_lines(&out), sorted_lines(&input));
}

/// A live run's scratch is never taken by another run's reclaim: two shuffles into the
/// same directory at once both succeed.
#[test]
fn concurrent_runs_do_not_reclaim_each_others_scratch() {
    let sb = Sandbox::new();
    let data = sb.data();
    let input = data.join("in.jsonl");
    gen(&sb, &input, "lines", 400_000, 100, &[]);
    let runs: Vec<Child> = (0..3)
        .map(|i| {
            sb.cmd()
                .arg("shuffle")
                .arg(&input)
                .arg("-o")
                .arg(data.join(format!("out{i}.jsonl")))
                .args(["--memory", "2M"])
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (i, c) in runs.into_iter().enumerate() {
        let o = c.wait_with_output().unwrap();
        assert_ok(&o);
        assert!(
            !text(&o.stderr).contains("reclaimed"),
            "{}",
            text(&o.stderr)
        );
        assert_eq!(
            sorted_lines(&data.join(format!("out{i}.jsonl"))),
            sorted_lines(&input)
        );
    }
    assert!(
        riffle_entries(&data).is_empty(),
        "{:?}",
        riffle_entries(&data)
    );
}

#[test]
fn a_split_rerun_with_fewer_parts_leaves_exactly_the_new_parts() {
    let sb = Sandbox::new();
    let data = sb.data();
    let input = data.join("in.jsonl");
    gen(&sb, &input, "lines", 10_000, 40, &[]);
    let base = data.join("p.jsonl");
    let parts = |n: &str| {
        let o = sb
            .cmd()
            .arg("shuffle")
            .arg(&input)
            .arg("-o")
            .arg(&base)
            .args(["--split-lines", n])
            .output()
            .unwrap();
        assert_ok(&o);
        let mut names: Vec<String> = std::fs::read_dir(&data)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("p.jsonl"))
            .collect();
        names.sort();
        (names, text(&o.stderr))
    };
    let (first, _) = parts("1000");
    assert_eq!(first.len(), 10);
    // Not riffle's: a name that only looks like a part stays.
    std::fs::write(data.join("p.jsonl.0099"), b"mine\n").unwrap();
    let (second, err) = parts("4000");
    assert_eq!(
        second,
        ["p.jsonl.000", "p.jsonl.001", "p.jsonl.002", "p.jsonl.0099"],
        "{err}"
    );
    assert!(err.contains("removed 7 parts of an earlier run"), "{err}");
    let mut all = Vec::new();
    for p in &second[..3] {
        all.extend(sorted_lines(&data.join(p)));
    }
    all.sort();
    assert_eq!(all, sorted_lines(&input));
}
