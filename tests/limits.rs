//! Limits are planned, not hit (issue 30 deliverable 4): a run with no `--memory` sizes
//! itself within its memory cgroup and `ulimit -v`, a low `ulimit -n` is planned for, and
//! scratch space is checked and reserved before a run starts. Every limit here is a real
//! one set on a real `riffle` process: an rlimit set between fork and exec, a memory cgroup
//! made for the test, a small tmpfs.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::{assert_ok, gen, skip_needed_in_ci, text, Sandbox};

/// Sets `resource`'s soft and hard limit to `value` on `cmd`'s process before it runs.
pub(crate) fn with_rlimit(cmd: &mut Command, resource: nix::sys::resource::Resource, value: u64) {
    // SAFETY: the closure runs in the child between fork and exec and only calls
    // setrlimit, which is async-signal-safe; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::resource::setrlimit(resource, value, value).map_err(std::io::Error::from)
        });
    }
}

/// A `riffle read --json` report.
fn report(o: &Output) -> Value {
    assert_ok(o);
    serde_json::from_slice(&o.stdout).expect("read --json prints one JSON object")
}

/// A dataset whose two-pass read sizes itself past 300 MB with no budget (2M lines of 150
/// bytes: about 540 MiB of piles and buffers by default).
fn lines_of_300_mb(sb: &Sandbox) -> PathBuf {
    let data = sb.data().join("big.jsonl");
    gen(sb, &data, "lines", 2_000_000, 150, &[]);
    data
}

/// Under `ulimit -v` (about 286 MiB) a two-pass read given no `--memory` plans within what
/// the address space leaves: it ran out of address space allocating its slots ("could not
/// allocate 189136896 bytes of I/O slots") before.
#[test]
fn the_default_budget_fits_ulimit_v() {
    let sb = Sandbox::new();
    let data = lines_of_300_mb(&sb);
    let limit = 300_000_000u64;
    let mut cmd = sb.cmd();
    cmd.arg("read")
        .arg(&data)
        .args(["--batch-size", "100", "--mode", "two-pass", "--json"]);
    with_rlimit(&mut cmd, nix::sys::resource::Resource::RLIMIT_AS, limit);
    let r = report(&cmd.output().unwrap());
    assert_eq!(r["records"], 2_000_000, "{r}");
    let memory = r["resources"]["memory_bytes"].as_u64().unwrap();
    assert!(
        memory < limit / 2,
        "planned {memory} bytes under ulimit -v {limit}"
    );
}

/// A memory cgroup this test makes (v1 `memory.limit_in_bytes` inside this process's
/// group, or v2 `memory.max` where the controller is enabled), removed when dropped; `None`
/// (skip counted) where that cannot be done here.
struct MemoryCgroup {
    dir: PathBuf,
}

impl MemoryCgroup {
    fn make(limit: u64) -> Option<MemoryCgroup> {
        if !nix::unistd::geteuid().is_root() {
            skip_needed_in_ci("making a memory cgroup needs root");
            return None;
        }
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (parent, file) = if v1.join("memory.limit_in_bytes").exists() {
            let path = own
                .lines()
                .find_map(|l| {
                    let mut f = l.splitn(3, ':');
                    let (_, c, p) = (f.next()?, f.next()?, f.next()?);
                    c.split(',').any(|c| c == "memory").then(|| p.to_owned())
                })
                .unwrap_or_default();
            (
                v1.join(path.trim_start_matches('/')),
                "memory.limit_in_bytes",
            )
        } else {
            let root = Path::new("/sys/fs/cgroup");
            let controllers =
                std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
            if !controllers.split_whitespace().any(|c| c == "memory") {
                skip_needed_in_ci("no cgroup memory controller (v1 or v2) is available here");
                return None;
            }
            (root.to_path_buf(), "memory.max")
        };
        // One group per test: the tests of this process run at once (named by the process
        // alone, the second group of two tests at once was refused as existing).
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = parent.join(format!("riffle-test-limits-{}-{n}", std::process::id()));
        if let Err(e) = std::fs::create_dir(&dir) {
            skip_needed_in_ci(&format!("cannot make {}: {e}", dir.display()));
            return None;
        }
        let group = MemoryCgroup { dir };
        std::fs::write(group.dir.join(file), limit.to_string()).unwrap();
        Some(group)
    }

    /// `riffle ARGS` run inside the group (the shell joins it, then execs riffle).
    fn riffle(&self, sb: &Sandbox) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg("echo $$ > \"$0\" && exec \"$@\"")
            .arg(self.dir.join("cgroup.procs"))
            .arg(env!("CARGO_BIN_EXE_riffle"))
            .env("XDG_CACHE_HOME", sb.cache());
        c
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// In a 300 MB memory cgroup a read given no `--memory` plans within 3/4 of the limit and
/// completes: it sized two-pass at 570 MB, was OOM-killed and left its scratch before.
#[test]
fn the_default_budget_fits_the_memory_cgroup() {
    let limit = 300_000_000u64;
    let Some(group) = MemoryCgroup::make(limit) else {
        return;
    };
    let sb = Sandbox::new();
    let data = lines_of_300_mb(&sb);
    let o = group
        .riffle(&sb)
        .arg("read")
        .arg(&data)
        .args(["--batch-size", "100", "--mode", "two-pass", "--json"])
        .output()
        .unwrap();
    let r = report(&o);
    assert_eq!(r["records"], 2_000_000, "{r}");
    let memory = r["resources"]["memory_bytes"].as_u64().unwrap();
    assert!(
        memory <= limit / 4 * 3,
        "planned {memory} bytes in a {limit}-byte cgroup"
    );
}

/// Issue 33: resident mode's default budget (half the available RAM) is capped by the
/// cgroup too: in a 300 MB group, 300 MB of records are not held whole (the partly
/// resident read holds what the group's budget leaves, and finishes within the group), and
/// `auto` reads them partly resident too (the rest through piles: predicted faster than
/// two-pass), within it.
#[test]
fn the_resident_default_budget_fits_the_memory_cgroup() {
    let limit = 300_000_000u64;
    let Some(group) = MemoryCgroup::make(limit) else {
        return;
    };
    let sb = Sandbox::new();
    let data = lines_of_300_mb(&sb);
    let o = group
        .riffle(&sb)
        .arg("read")
        .arg(&data)
        .args(["--batch-size", "100", "--mode", "resident", "--json"])
        .output()
        .unwrap();
    let r = report(&o);
    assert_eq!(r["records"], 2_000_000, "{r}");
    let held = r["resident_bytes"].as_u64().unwrap();
    assert!(
        held > 0 && held < 225_000_000,
        "held {held} in a 300 MB group"
    );
    let figure = &r["resources"]["figures"][0];
    assert_eq!(figure["name"], "resident");
    assert!(
        figure["reason"].as_str().unwrap().contains("first"),
        "{figure}"
    );
    sb.seed_probe(&sb.data());
    let o = group
        .riffle(&sb)
        .arg("read")
        .arg(&data)
        .args(["--batch-size", "100", "--json"])
        .output()
        .unwrap();
    let r = report(&o);
    assert_eq!(r["records"], 2_000_000, "{r}");
    // Not whole: partly, the rest through piles, which auto picks when it is predicted
    // faster than the streaming modes (before: only --mode resident ran it), within the
    // group.
    assert_eq!(r["mode"], "resident", "{}", r["plan"]["reason"]);
    assert_eq!(r["partly"]["rest"], "two-pass piles", "{r}");
    assert!(r["resident_bytes"].as_u64().unwrap() < 225_000_000, "{r}");
    let reason = r["plan"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("resident is predicted") && reason.contains("for two-pass"),
        "{reason}"
    );
}

/// A mixture epoch of 10^9 draws (8 GB) with no `--memory` is refused naming the default
/// budget it does not fit, instead of allocated (under `ulimit -v` 4 GB, so whatever the
/// machine's RAM; it aborted on the allocation before).
#[test]
fn a_huge_mixture_epoch_is_refused_within_the_default_budget() {
    let sb = Sandbox::new();
    let (a, b) = (sb.data().join("a.jsonl"), sb.data().join("b.jsonl"));
    gen(&sb, &a, "lines", 1000, 50, &[]);
    gen(&sb, &b, "lines", 1000, 50, &[]);
    let spec = format!(
        "mix:a={}*0.5,b={}*0.5;size=1000000000",
        a.display(),
        b.display()
    );
    let mut cmd = sb.cmd();
    cmd.args(["read", &spec, "--batch-size", "100", "--mode", "lirs"]);
    with_rlimit(&mut cmd, nix::sys::resource::Resource::RLIMIT_AS, 4 << 30);
    let o = cmd.output().unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("draws take 7.5 GiB") && err.contains("ulimit -v"),
        "{err}"
    );
}

/// Under `ulimit -n 64`, trees of 1,500 and 20,000 files read in lirs, two-pass, sequential
/// and bmf (a reader keeps a quarter of the limit open, and the queue depth is planned
/// below it): each failed with EMFILE before. Under `ulimit -n 20` the run is refused
/// before it starts, saying to raise `ulimit -n`.
#[test]
fn trees_of_thousands_of_files_read_in_every_mode_under_ulimit_n_64() {
    let sb = Sandbox::new();
    for files in [1_500u64, 20_000] {
        let tree = sb.data().join(format!("tree-{files}"));
        gen(&sb, &tree, "files", files, 100, &[]);
        for mode in ["lirs", "two-pass", "sequential", "bmf"] {
            let mut cmd = sb.cmd();
            cmd.arg("read").arg(&tree).args([
                "--format",
                "files",
                "--batch-size",
                "100",
                "--epochs",
                "2",
                "--mode",
                mode,
                "--json",
            ]);
            with_rlimit(&mut cmd, nix::sys::resource::Resource::RLIMIT_NOFILE, 64);
            let r = report(&cmd.output().unwrap());
            assert_eq!(r["records"], 2 * files, "{mode}, {files} files: {r}");
            let planned = r["resources"]["open_files"].as_u64().unwrap();
            assert!(planned <= 64, "{mode}, {files} files: {planned} planned");
        }
        let mut cmd = sb.cmd();
        cmd.arg("read").arg(&tree).args([
            "--format",
            "files",
            "--batch-size",
            "100",
            "--mode",
            "lirs",
        ]);
        with_rlimit(&mut cmd, nix::sys::resource::Resource::RLIMIT_NOFILE, 20);
        let o = cmd.output().unwrap();
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.contains("raise ulimit -n") && !err.contains("Too many open files"),
            "{err}"
        );
    }
}

/// Under `ulimit -n 32`, a tree of 20 files reads in lirs and two-pass with the batches of
/// a read under no such limit (a reader keeps 8 of its files open, the scatter 5). Both
/// were refused before ("32 asked", "50 asked, 32 available"): a reader kept 16 open at
/// the least, and the scatter 16. Under `ulimit -n 16` both are still refused before they
/// start, saying to raise it.
#[test]
fn a_tree_of_twenty_files_reads_under_ulimit_n_32_with_the_batches_of_an_unlimited_read() {
    let sb = Sandbox::new();
    let tree = sb.data().join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    for i in 0..20 {
        gen(
            &sb,
            &tree.join(format!("f{i:02}.jsonl")),
            "jsonl",
            500,
            120,
            &["--seed", &i.to_string()],
        );
    }
    let read = |mode: &str, nofile: Option<u64>, tag: &str| {
        let ids = sb.data().join(format!("ids-{mode}-{tag}.txt"));
        let mut c = sb.cmd();
        c.arg("read")
            .arg(&tree)
            .args(["--mode", mode, "--batch-size", "64", "--epochs", "2"]);
        c.args(["--seed", "3", "--json", "--ids-out"]).arg(&ids);
        if let Some(n) = nofile {
            with_rlimit(&mut c, nix::sys::resource::Resource::RLIMIT_NOFILE, n);
        }
        (c.output().unwrap(), ids)
    };
    for mode in ["lirs", "two-pass"] {
        let (free, free_ids) = read(mode, None, "free");
        let r = report(&free);
        assert_eq!(r["records"], 2 * 20 * 500, "{mode}: {r}");
        let (tight, tight_ids) = read(mode, Some(32), "32");
        let r = report(&tight);
        assert_eq!(r["records"], 2 * 20 * 500, "{mode}: {r}");
        let planned = r["resources"]["open_files"].as_u64().unwrap();
        assert!(planned <= 32, "{mode}: {planned} open files planned: {r}");
        let ids = |p: &Path| std::fs::read_to_string(p).unwrap();
        assert_eq!(
            ids(&free_ids),
            ids(&tight_ids),
            "{mode}: other batches under ulimit -n 32"
        );
        let (refused, _) = read(mode, Some(16), "16");
        let err = text(&refused.stderr);
        assert_eq!(refused.status.code(), Some(1), "{mode}: {err}");
        assert!(
            err.contains("raise ulimit -n") && !err.contains("Too many open files"),
            "{mode}: {err}"
        );
    }
}

/// Three ranks of a job started at once with `auto` on one small scratch disk, where one
/// rank's piles fit and two do not: each decides seeing what the others reserved, so at
/// most one reads through piles and every rank completes. All three chose two-pass and
/// failed with ENOSPC before (each checked the free space alone).
#[test]
fn ranks_sharing_a_small_scratch_reserve_it_and_all_complete() {
    let sb = Sandbox::new();
    // 60 MB: one rank's piles (42 MB under --memory 24M, below) fit, two do not.
    let Some(disk) = crate::SmallDisk::mount(&sb, "60M") else {
        return;
    };
    let data = sb.data().join("d.jsonl");
    gen(&sb, &data, "lines", 210_000, 150, &[]);
    sb.seed_probe(&sb.data());
    let ranks: Vec<_> = (0..3)
        .map(|rank| {
            sb.cmd()
                .arg("read")
                .arg(&data)
                // A budget that cannot hold the records resident: each rank chooses
                // between lirs and two-pass, seeing what the others reserved.
                .args([
                    "--batch-size",
                    "100",
                    "--world",
                    "3",
                    "--json",
                    "--memory",
                    "24M",
                ])
                .args(["--rank", &rank.to_string(), "--scratch"])
                .arg(disk.path())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut piles = 0;
    for child in ranks {
        let r = report(&child.wait_with_output().unwrap());
        if r["mode"] == "two-pass" {
            piles += 1;
        }
    }
    assert!(
        piles <= 1,
        "{piles} ranks read through piles on a disk that holds one's"
    );
    let left: Vec<_> = std::fs::read_dir(disk.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "scratch left: {left:?}");
}

/// On a read-only filesystem with no cached profile, `read` (auto) and `plan` plan with a
/// default profile and say so: the probe could not write its region and both failed
/// ("Read-only file system") before. The filesystem is a tmpfs this test mounts and
/// remounts read-only.
#[test]
fn a_read_only_filesystem_plans_with_a_default_profile() {
    let sb = Sandbox::new();
    let Some(disk) = crate::SmallDisk::mount(&sb, "16M") else {
        return;
    };
    // Written on the sandbox's disk and copied: a ring of riffle's writes may hold the
    // file open for a moment after the process ends, and a remount waits for no one.
    let made = sb.data().join("d.jsonl");
    gen(&sb, &made, "lines", 1000, 50, &[]);
    let data = disk.path().join("d.jsonl");
    std::fs::copy(&made, &data).unwrap();
    let ro = Command::new("mount")
        .args(["-o", "remount,ro"])
        .arg(disk.path())
        .output()
        .unwrap();
    assert!(
        ro.status.success(),
        "remount read-only: {}",
        text(&ro.stderr)
    );
    for args in [&["read", "--json"][..], &["plan", "--json"]] {
        let o = sb
            .cmd()
            .arg(args[0])
            .arg(&data)
            .args(["--batch-size", "10"])
            .args(&args[1..])
            .output()
            .unwrap();
        assert_ok(&o);
        let err = text(&o.stderr);
        assert!(
            err.contains("cannot be probed") && err.contains("default sata-ssd profile"),
            "{}: {err}",
            args[0]
        );
    }
    let r: Value = serde_json::from_slice(
        &sb.cmd()
            .args(["read", "--json", "--batch-size", "10"])
            .arg(&data)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(r["records"], 1000, "{r}");
    // No room for piles beside a dataset on a read-only filesystem, whatever statvfs says
    // is free: auto reads it without piles, by lirs or resident (it planned two-pass there
    // and failed making its scratch, "Read-only file system", before), and two-pass is
    // refused up front.
    assert!(r["mode"] == "lirs" || r["mode"] == "resident", "{r}");
    let o = sb
        .cmd()
        .args(["read", "--mode", "two-pass", "--batch-size", "10"])
        .arg(&data)
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert!(
        !o.status.success() && err.contains("0 B is free") && err.contains("--scratch"),
        "{err}"
    );
}

/// A shuffle whose piles cannot fit its `--tmpdir` is refused before it reads anything,
/// saying what it needs and what is free; it failed with ENOSPC after reading most of its
/// input before.
#[test]
fn a_shuffle_too_big_for_its_scratch_is_refused_up_front() {
    let sb = Sandbox::new();
    let Some(disk) = crate::SmallDisk::mount(&sb, "20M") else {
        return;
    };
    let input = sb.data().join("in.jsonl");
    gen(&sb, &input, "lines", 210_000, 150, &[]);
    let out = sb.data().join("out.jsonl");
    let o = crate::shuffle::shuffle_to(
        &sb,
        &input,
        &out,
        &["--memory", "8M", "--tmpdir", disk.path().to_str().unwrap()],
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("shuffle needs at least 30.") && err.contains("20.0 MiB is free"),
        "{err}"
    );
    assert!(!out.exists());
    let left: Vec<_> = std::fs::read_dir(disk.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "scratch left: {left:?}");
}

/// A two-pass run SIGKILLed mid-scatter and not yet reaped by its parent (a zombie, as a
/// killed rank is until its launcher waits) leaves scratch that a run started at once
/// reclaims: the dead pid still answered signal 0, and only a run started later took it.
#[test]
fn a_killed_run_not_yet_reaped_is_reclaimed_at_once() {
    let sb = Sandbox::new();
    let big = sb.data().join("big.npy");
    gen(&sb, &big, "npy", 3_000_000, 100, &[]);
    let small = sb.data().join("small.npy");
    gen(&sb, &small, "npy", 1000, 100, &[]);
    let scratch = sb.path().join("scratch");
    let mut victim = sb
        .cmd()
        .arg("read")
        .arg(&big)
        .args(["--batch-size", "100", "--mode", "two-pass", "--scratch"])
        .arg(&scratch)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let piles = |pid: u32| {
        std::fs::read_dir(&scratch).ok().is_some_and(|rd| {
            rd.flatten().any(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with(&format!(".riffle-scratch-two-pass-{pid}-"))
            })
        })
    };
    // A deadline only catches a hang.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !piles(victim.id()) {
        assert!(std::time::Instant::now() < deadline, "no piles appeared");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Not reaped: the victim is a zombie while the next run starts. SIGKILL is delivered
    // asynchronously: under load the victim still ran (and held its lock) when the next
    // run looked, so wait until the kernel says it is a zombie.
    let state = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, r)| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(false)
    };
    while !state(victim.id()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the victim never died"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let o = sb
        .cmd()
        .arg("read")
        .arg(&small)
        .args(["--batch-size", "100", "--mode", "two-pass", "--scratch"])
        .arg(&scratch)
        .output()
        .unwrap();
    let pid = victim.id();
    assert_ok(&o);
    let err = text(&o.stderr);
    assert!(!piles(pid), "the killed run's piles were left: {err}");
    assert!(err.contains("reclaimed"), "{err}");
    victim.wait().unwrap();
}

/// A dataset of 20,000 empty files beside two real ones, as a directory of lines files and
/// as a files tree, says so in one notice per run, not one line per file (20,000 lines
/// before); a few empty files are still named one by one.
#[test]
fn thousands_of_empty_files_get_one_summary_notice() {
    let sb = Sandbox::new();
    let lines = sb.data().join("lines");
    let tree = sb.data().join("tree");
    for d in [&lines, &tree.join("a"), &tree.join("b")] {
        std::fs::create_dir_all(d).unwrap();
    }
    for i in 0..20_000 {
        std::fs::File::create(lines.join(format!("e{i:05}.jsonl"))).unwrap();
        std::fs::File::create(tree.join("b").join(format!("e{i:05}.bin"))).unwrap();
    }
    std::fs::write(lines.join("z.jsonl"), "{\"x\":1}\n{\"x\":2}\n").unwrap();
    std::fs::write(tree.join("a/one.bin"), "x").unwrap();
    for (dir, format) in [(&lines, "lines"), (&tree, "files")] {
        let o = sb
            .cmd()
            .arg("read")
            .arg(dir)
            .args(["--format", format, "--batch-size", "1", "--mode", "lirs"])
            .output()
            .unwrap();
        assert_ok(&o);
        let err = text(&o.stderr);
        let empties = err.lines().filter(|l| l.contains("empty")).count();
        assert_eq!(empties, 1, "{format}: {}", &err[..err.len().min(2000)]);
        assert!(
            err.contains("skipping 20000 empty files"),
            "{format}: {err}"
        );
    }
    let few = sb.data().join("few");
    std::fs::create_dir(&few).unwrap();
    std::fs::File::create(few.join("a.jsonl")).unwrap();
    std::fs::write(few.join("b.jsonl"), "{}\n").unwrap();
    let o = sb
        .cmd()
        .arg("read")
        .arg(&few)
        .args(["--batch-size", "1", "--mode", "lirs"])
        .output()
        .unwrap();
    assert_ok(&o);
    assert!(
        text(&o.stderr).contains("a.jsonl: it is empty"),
        "{}",
        text(&o.stderr)
    );
}

/// `--memory 0` is refused as a budget that holds nothing, a usage error, not blamed on
/// the dataset's first record (issue 30 D36).
#[test]
fn a_memory_budget_of_zero_is_refused_as_such() {
    let sb = Sandbox::new();
    let data = sb.data().join("d.jsonl");
    gen(&sb, &data, "lines", 100, 150, &[]);
    for cmd in ["read", "index"] {
        let mut c = sb.cmd();
        c.arg(cmd).arg(&data).args(["--memory", "0"]);
        if cmd == "read" {
            c.args(["--batch-size", "10"]);
        }
        let o = c.output().unwrap();
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {err}");
        assert!(
            err.contains("0 bytes holds nothing") && !err.contains("record of"),
            "{cmd}: {err}"
        );
    }
}

/// Under a locked-memory limit too small for its slots (and, as root, without
/// CAP_IPC_LOCK, which lifts the limit), a read's ring cannot register its buffers: it
/// reads through plain memory, says so in its report, and delivers the same batches as
/// with registered buffers, submitted at each wait or each at once; the pread pool reads
/// them too, and its report says it submits each at once (issue 34).
#[test]
fn a_refused_buffer_registration_reads_the_same_batches_through_plain_memory() {
    let root = nix::unistd::Uid::effective().is_root();
    if root && Command::new("setpriv").arg("--help").output().is_err() {
        crate::skip("setpriv (util-linux) is not installed: root cannot drop CAP_IPC_LOCK");
        return;
    }
    let sb = Sandbox::new();
    let data = sb.data().join("small.fixed");
    gen(&sb, &data, "fixed", 20_000, 512, &[]);
    let read = |limited: bool, batch: &str, io: &str| -> (Vec<String>, String) {
        let ids = sb.path().join(format!("ids-{limited}-{batch}-{io}.txt"));
        let mut c = if limited && root {
            let mut c = Command::new("setpriv");
            c.args(["--bounding-set=-ipc_lock", "--inh-caps=-ipc_lock"])
                .arg(env!("CARGO_BIN_EXE_riffle"));
            c
        } else {
            Command::new(env!("CARGO_BIN_EXE_riffle"))
        };
        c.env("XDG_CACHE_HOME", sb.cache())
            .env("RIFFLE_URING", format!("batch={batch}"))
            .env("RIFFLE_IO", io)
            .arg("read")
            .arg(&data)
            .args([
                "--format",
                "fixed:512",
                "--mode",
                "lirs",
                "--grouping",
                "page",
            ])
            .args([
                "--unit",
                "4096",
                "--queue-depth",
                "64",
                "--batch-size",
                "256",
            ])
            .args(["--json", "--ids-out"])
            .arg(&ids);
        if limited {
            // The ring's own pages fit in 64 KiB; 64 slots of 16 KiB do not.
            with_rlimit(
                &mut c,
                nix::sys::resource::Resource::RLIMIT_MEMLOCK,
                64 << 10,
            );
        }
        let r = report(&c.output().unwrap());
        if io == "pread" {
            // The pool submits nothing in batches, whatever was chosen for the device.
            assert_eq!(r["backend"], "pread", "{r}");
            assert_eq!(r["io_submit"], "each at once: the pread thread pool", "{r}");
        } else {
            assert_eq!(r["backend"], "io_uring", "{r}");
        }
        let ids = std::fs::read_to_string(&ids).unwrap();
        (
            ids.lines().map(str::to_owned).collect(),
            r["io_features"]
                .as_str()
                .expect("read --json names the backend's features (io_features)")
                .to_owned(),
        )
    };
    let (want, features) = read(false, "wait", "auto");
    assert_eq!(want.len(), 20_000 / 256 + 1);
    if !features.contains("registered buffers") {
        crate::skip(&format!(
            "this kernel gives no registered buffers: {features}"
        ));
        return;
    }
    assert!(features.contains("submitted at each wait"), "{features}");
    for batch in ["wait", "1"] {
        let (got, features) = read(true, batch, "auto");
        assert!(
            features.contains("plain buffers (registration refused: see ulimit -l)"),
            "batch={batch}: {features}"
        );
        assert!(
            got == want,
            "batch={batch}: other batches than with registered buffers"
        );
    }
    let (got, _) = read(false, "wait", "pread");
    assert!(got == want, "other batches through the pread pool");
}
