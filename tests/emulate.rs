//! `--emulate`: commands under a real kernel I/O throttle (cgroup v1 blkio or v2 io.max).
//! These need root and a cgroup I/O controller; where either is missing they skip, counted
//! (`riffle::testing::skip`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use super::{assert_ok, gen, skip, text, Sandbox};

/// Why emulation cannot run here, given by the test that skips.
fn unsupported() -> Option<String> {
    riffle::emulate::supported().err().map(|e| e.to_string())
}

/// Runs `cmd` and returns its output and pid (the pid names its cgroups).
fn run(mut cmd: Command) -> (Output, u32) {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    (child.wait_with_output().unwrap(), pid)
}

/// The `riffle-emu-<pid>-*` cgroups left anywhere under /sys/fs/cgroup.
pub(crate) fn groups_of(pid: u32) -> Vec<PathBuf> {
    fn walk(dir: &Path, prefix: &str, depth: usize, found: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let Ok(kind) = e.file_type() else { continue };
            if !kind.is_dir() {
                continue;
            }
            if e.file_name().to_string_lossy().starts_with(prefix) {
                found.push(e.path());
            }
            if depth > 0 {
                walk(&e.path(), prefix, depth - 1, found);
            }
        }
    }
    let mut found = Vec::new();
    walk(
        Path::new("/sys/fs/cgroup"),
        &format!("riffle-emu-{pid}-"),
        4,
        &mut found,
    );
    found
}

pub(crate) fn assert_no_group_left(pid: u32) {
    let left = groups_of(pid);
    assert!(left.is_empty(), "cgroups left behind: {left:?}");
}

/// The quick probe under `hdd` runs at about 600 random-read IOPS at any queue depth, is
/// cached as an `hdd` profile apart from the device's own, and leaves no cgroup behind.
#[test]
fn probe_under_hdd_emulation_measures_an_hdd() {
    if let Some(why) = unsupported() {
        skip(&why);
        return;
    }
    let sb = Sandbox::new();
    let data = sb.data();
    let probe = |extra: &[&str]| {
        let mut c = sb.cmd();
        c.args(["probe", "--quick", "--json", "--region", "32M"])
            .args(extra)
            .arg(&data);
        let (out, pid) = run(c);
        assert_ok(&out);
        assert_no_group_left(pid);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        (v, text(&out.stderr))
    };
    let started = std::time::Instant::now();
    let (p, err) = probe(&["--emulate", "hdd", "--point-time", "0.5"]);
    let took = started.elapsed().as_secs_f64();
    assert!(err.contains("emulating hdd on"), "{err}");
    assert_eq!(p["emulated"], "hdd");
    assert_eq!(p["cached"], false);
    assert!(p["cache_path"].as_str().unwrap().contains("@hdd"), "{p}");
    for qd in [32, 128] {
        let pt = p["random"]
            .as_array()
            .unwrap()
            .iter()
            .find(|pt| pt["bs"] == 4096 && pt["qd"] == qd)
            .unwrap();
        let iops = pt["iops"].as_f64().unwrap();
        eprintln!("hdd: 4K QD {qd}: {iops:.0} IOPS");
        // The kernel throttle lets a burst through at the start of each short point (up to
        // a quarter over the limit in 0.5 s), so the band is wide; unthrottled, this disk
        // does 15k-80k IOPS, so it still tells a throttled device from a free one.
        assert!(
            (300.0..1200.0).contains(&iops),
            "4K QD {qd}: {iops:.0} IOPS under hdd emulation (600 expected)"
        );
    }
    let seq = p["seq_read_bps"].as_f64().unwrap();
    assert!(
        seq < 300e6,
        "sequential read {seq:.0} B/s under hdd emulation (150 MB/s expected)"
    );
    eprintln!("hdd probe took {took:.1} s");
    assert_eq!(
        std::fs::read_dir(&data).unwrap().count(),
        0,
        "the scratch file was left behind"
    );

    // The next emulated probe reuses the hdd profile; a plain probe neither sees it nor
    // replaces it.
    let (again, _) = probe(&["--emulate", "hdd"]);
    assert_eq!(again["cached"], true);
    assert_eq!(again["measured_at"], p["measured_at"]);
    let (own, _) = probe(&["--point-time", "0.1"]);
    assert_eq!(own["cached"], false);
    assert_eq!(own["emulated"], Value::Null);
    assert_ne!(own["cache_path"], p["cache_path"]);
    let (again, _) = probe(&["--emulate", "hdd"]);
    assert_eq!(again["measured_at"], p["measured_at"]);
}

/// A command that fails after the throttle was entered still removes its cgroup; a
/// command that succeeds says in its report which class it ran as.
#[test]
fn reads_under_emulation_clean_up_on_success_and_on_error() {
    if let Some(why) = unsupported() {
        skip(&why);
        return;
    }
    let sb = Sandbox::new();
    let bad = sb.data().join("bad.npy");
    std::fs::write(&bad, b"not an npy file").unwrap();
    let mut c = sb.cmd();
    c.args([
        "read",
        "--emulate",
        "hdd",
        "--batch-size",
        "4",
        "--mode",
        "lirs",
    ])
    .arg(&bad);
    let (out, pid) = run(c);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("emulating hdd on"), "{err}");
    assert!(
        err.contains("bad.npy") && !err.contains("panicked"),
        "{err}"
    );
    assert_no_group_left(pid);

    // Groups of owners that died (killed before their guard dropped) are removed by the
    // next run; those of live owners stay.
    let made = err
        .split("(cgroup ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .map(PathBuf::from)
        .expect("the notice names the cgroup");
    let parent = made.parent().unwrap();
    let mut dead = Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let stale = parent.join(format!("riffle-emu-{dead_pid}-0"));
    let live = parent.join(format!("riffle-emu-{}-999", std::process::id()));
    std::fs::create_dir(&stale).unwrap();
    std::fs::create_dir(&live).unwrap();

    let good = sb.data().join("good.npy");
    gen(&sb, &good, "npy", 300, 64, &[]);
    let mut c = sb.cmd();
    c.args([
        "read",
        "--emulate",
        "sata-ssd",
        "--batch-size",
        "32",
        "--mode",
        "lirs",
        "--json",
    ])
    .arg(&good);
    let (out, pid) = run(c);
    assert_ok(&out);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["emulated"], "sata-ssd");
    assert_eq!(r["records"], 300);
    assert_no_group_left(pid);
    let live_kept = live.is_dir();
    std::fs::remove_dir(&live).unwrap();
    assert!(live_kept, "the group of a live owner was removed");
    if stale.is_dir() {
        std::fs::remove_dir(&stale).unwrap();
        panic!("the group of a dead owner was left");
    }

    // No block device, no throttle: said before anything is created.
    if Path::new("/dev/shm").is_dir() {
        let mut c = sb.cmd();
        c.args(["probe", "--emulate", "hdd", "/dev/shm"]);
        let (out, pid) = run(c);
        assert_eq!(out.status.code(), Some(1));
        let err = text(&out.stderr);
        assert!(
            err.contains("/dev/shm") && err.contains("no block device"),
            "{err}"
        );
        assert_no_group_left(pid);
    }
}

/// Without root, emulation says it needs root and how to get it, and does nothing else.
#[test]
fn emulation_without_root_says_it_needs_root() {
    let sb = Sandbox::new();
    let args = ["probe", "--quick", "--emulate", "hdd", "/"];
    let out = if is_root() {
        // Drop to nobody. The binary must be reachable for that user.
        let drop = |rest: &[&str]| {
            let mut c = Command::new("setpriv");
            c.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
                .arg(env!("CARGO_BIN_EXE_riffle"))
                .args(rest)
                .env("XDG_CACHE_HOME", sb.cache());
            c.output()
        };
        match drop(&["--version"]) {
            Ok(o) if o.status.success() => drop(&args).unwrap(),
            Ok(o) => {
                skip(&format!(
                    "cannot run riffle as nobody through setpriv: {}",
                    text(&o.stderr).trim()
                ));
                return;
            }
            Err(e) => {
                skip(&format!("setpriv is not available to drop root: {e}"));
                return;
            }
        }
    } else {
        sb.cmd().args(args).output().unwrap()
    };
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("needs root") && err.contains("sudo") && err.contains("uid"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.stdout.is_empty());

    // An unknown class is a usage error that lists the classes.
    let out = sb
        .cmd()
        .args(["probe", "--emulate", "ssd", "/"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("hdd") && err.contains("sata-ssd") && err.contains("nvme"),
        "{err}"
    );
}

/// Whether this process runs as root (the owner of /proc/self is its effective uid).
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}
