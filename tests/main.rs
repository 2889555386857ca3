//! Integration tests: the `riffle` binary as a user runs it, on real files, with real
//! io_uring, real O_DIRECT and real faults (a seccomp filter that refuses io_uring).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub(crate) use riffle::testing::{skip, skip_needed_in_ci};

mod admission;
mod beneath;
mod budgets;
mod datasets;
mod door;
mod edges;
mod emulate;
mod limits;
mod plan;
mod read;
mod reruns;
mod s3;
mod s3_probe;
mod s3_throttle;
mod scratch;
mod serve;
mod shuffle;
mod signals;

fn riffle() -> Command {
    Command::new(env!("CARGO_BIN_EXE_riffle"))
}

/// A scratch directory on the repository's filesystem (a real disk, O_DIRECT capable), with
/// its own profile cache so tests never see the user's.
pub(crate) struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Self {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-scratch");
        std::fs::create_dir_all(&root).unwrap();
        Sandbox {
            dir: tempfile::tempdir_in(root).unwrap(),
        }
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
    fn cache(&self) -> PathBuf {
        self.path().join("cache")
    }
    fn data(&self) -> PathBuf {
        let d = self.path().join("data");
        std::fs::create_dir_all(&d).unwrap();
        d
    }
    fn cmd(&self) -> Command {
        let mut c = riffle();
        c.env("XDG_CACHE_HOME", self.cache())
            .env_remove("RIFFLE_IO")
            .env_remove("RIFFLE_DIRECT");
        c
    }
    /// `riffle bench ARGS` with its data and results in this sandbox.
    fn bench(&self, args: &[&str]) -> Command {
        let mut c = self.cmd();
        c.arg("bench")
            .args(args)
            .arg("--data-dir")
            .arg(self.data())
            .arg("--out")
            .arg(self.path().join("results"));
        c
    }
    /// A fast probe of `dir`, cached in this sandbox.
    fn seed_probe(&self, dir: &Path) -> Value {
        let out = self
            .cmd()
            .args([
                "probe",
                "--quick",
                "--json",
                "--region",
                "32M",
                "--point-time",
                "0.1",
            ])
            .arg(dir)
            .output()
            .unwrap();
        assert_ok(&out);
        serde_json::from_slice(&out.stdout).expect("probe --json prints one JSON object")
    }
}

pub(crate) fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `riffle gen OUT --format F --records N --record-size S EXTRA...` and checks it
/// worked.
pub(crate) fn gen(sb: &Sandbox, out: &Path, format: &str, records: u64, size: u64, extra: &[&str]) {
    let o = sb
        .cmd()
        .arg("gen")
        .arg(out)
        .args([
            "--format",
            format,
            "--records",
            &records.to_string(),
            "--record-size",
            &size.to_string(),
        ])
        .args(extra)
        .output()
        .unwrap();
    assert_ok(&o);
}

/// A real small disk: a size-limited tmpfs mounted in the sandbox for a test (removed when
/// dropped), or `None`, the test's skip counted, where mounting is not allowed (not root, or
/// a container without CAP_SYS_ADMIN).
pub(crate) struct SmallDisk(PathBuf);

impl SmallDisk {
    pub(crate) fn mount(sb: &Sandbox, size: &str) -> Option<SmallDisk> {
        let mnt = sb.path().join("small");
        std::fs::create_dir(&mnt).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&mnt)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            skip_needed_in_ci(
                "cannot mount a small tmpfs here (needs root) to fill a disk for real",
            );
            return None;
        }
        Some(SmallDisk(mnt))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazy: a process forked by a concurrent test may briefly hold the mount busy; -l
        // detaches it now and frees it when that process is gone.
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn help_lists_the_commands() {
    let out = riffle().arg("--help").output().unwrap();
    assert_ok(&out);
    let s = text(&out.stdout);
    for c in ["demo", "probe", "bench"] {
        assert!(s.contains(c), "--help does not mention {c}:\n{s}");
    }
}

#[test]
fn probe_json_caches_and_removes_its_scratch_file() {
    let sb = Sandbox::new();
    let data = sb.data();
    let p = sb.seed_probe(&data);
    assert_eq!(p["cached"], false);
    // The backend is io_uring where the kernel (and its seccomp policy) allows a ring, which
    // this process probes the same way riffle does; the pread pool otherwise.
    match riffle::io::uring::support() {
        Ok(_) => assert_eq!(p["backend"], "io_uring"),
        Err(why) => assert_eq!(p["backend"], "pread", "io_uring unavailable: {}", why.why()),
    }
    assert_eq!(p["direct"], true);
    assert!(p["seq_read_bps"].as_f64().unwrap() > 0.0);
    assert!(p["seq_write_bps"].as_f64().unwrap() > 0.0);
    let points = p["random"].as_array().unwrap();
    assert_eq!(points.len(), 7);
    for pt in points {
        assert!(pt["iops"].as_f64().unwrap() > 0.0, "{pt}");
        assert!(
            pt["lat_p99_us"].as_f64().unwrap() >= pt["lat_p50_us"].as_f64().unwrap(),
            "{pt}"
        );
    }
    assert!(p["device"]["dev"].as_str().unwrap().contains(':'));
    assert!(p["alignment"]["offset"].as_u64().unwrap().is_power_of_two());
    assert_eq!(
        std::fs::read_dir(&data).unwrap().count(),
        0,
        "the scratch file was left behind"
    );

    let again = sb.seed_probe(&data);
    assert_eq!(again["cached"], true);
    assert_eq!(again["measured_at"], p["measured_at"]);
    let table = sb
        .cmd()
        .args(["probe", "--quick"])
        .arg(&data)
        .output()
        .unwrap();
    assert_ok(&table);
    let t = text(&table.stdout);
    assert!(
        t.contains("random read") && t.contains("cached profile"),
        "{t}"
    );

    let fresh = sb
        .cmd()
        .args([
            "probe",
            "--quick",
            "--json",
            "--refresh",
            "--region",
            "32M",
            "--point-time",
            "0.1",
        ])
        .arg(&data)
        .output()
        .unwrap();
    assert_ok(&fresh);
    let fresh: Value = serde_json::from_slice(&fresh.stdout).unwrap();
    assert_eq!(fresh["cached"], false);
}

#[test]
fn probe_on_dev_shm_reports_buffered_reads() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        skip_needed_in_ci("this machine has no /dev/shm");
        return;
    }
    let sb = Sandbox::new();
    let dir = tempfile::tempdir_in(shm).unwrap();
    let p = sb.seed_probe(dir.path());
    assert_eq!(p["direct"], false);
    assert_eq!(p["device"]["fs_type"], "tmpfs");
    assert!(
        p["buffered_reason"].as_str().unwrap().contains("tmpfs"),
        "{p}"
    );
}

#[test]
fn demo_runs_and_says_which_path_it_took() {
    let sb = Sandbox::new();
    sb.seed_probe(&sb.data());
    let out = sb
        .cmd()
        .args([
            "demo",
            "--records",
            "3000",
            "--record-size",
            "1000",
            "--dir",
        ])
        .arg(sb.data())
        .output()
        .unwrap();
    assert_ok(&out);
    let s = text(&out.stdout);
    assert!(s.contains("io_uring, O_DIRECT"), "{s}");
    assert!(s.contains("every record arrived exactly once"), "{s}");
    assert_eq!(
        std::fs::read_dir(sb.data()).unwrap().count(),
        0,
        "the demo left files behind"
    );
}

#[test]
fn riffle_io_pread_forces_the_thread_pool() {
    let sb = Sandbox::new();
    sb.seed_probe(&sb.data());
    let out = sb
        .cmd()
        .env("RIFFLE_IO", "pread")
        .args(["demo", "--records", "2000", "--dir"])
        .arg(sb.data())
        .output()
        .unwrap();
    assert_ok(&out);
    assert!(
        text(&out.stdout).contains("(pread, O_DIRECT)"),
        "{}",
        text(&out.stdout)
    );
    let err = text(&out.stderr);
    assert_eq!(
        err.matches("RIFFLE_IO=pread").count(),
        1,
        "announced exactly once:\n{err}"
    );
}

#[test]
fn riffle_io_rejects_unknown_values() {
    let sb = Sandbox::new();
    sb.seed_probe(&sb.data());
    let out = sb
        .cmd()
        .env("RIFFLE_IO", "mmap")
        .args(["demo", "--records", "10", "--dir"])
        .arg(sb.data())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("RIFFLE_IO=mmap"),
        "{}",
        text(&out.stderr)
    );
}

/// io_uring refused by the kernel (as a container's seccomp policy or
/// `kernel.io_uring_disabled` would): the run falls back to the pread pool and says why.
#[test]
fn disabled_io_uring_falls_back_to_pread() {
    let sb = Sandbox::new();
    sb.seed_probe(&sb.data());
    let mut cmd = sb.cmd();
    cmd.args(["demo", "--records", "2000", "--dir"])
        .arg(sb.data());
    if !seccomp::deny_io_uring(&mut cmd) {
        skip("no seccomp filter for io_uring on this architecture");
        return;
    }
    let out = cmd.output().unwrap();
    assert_ok(&out);
    assert!(
        text(&out.stdout).contains("(pread, O_DIRECT)"),
        "{}",
        text(&out.stdout)
    );
    let err = text(&out.stderr);
    assert_eq!(
        err.matches("io_uring unavailable").count(),
        1,
        "announced exactly once:\n{err}"
    );
    assert!(err.contains("EPERM"), "{err}");
}

/// io_uring short of a resource (here EMFILE, as with too many open files): the run falls
/// back to the pread pool saying why, not as if the kernel lacked io_uring; asked for
/// explicitly (`RIFFLE_IO=uring`), it is an error naming the reason.
#[test]
fn io_uring_short_of_files_falls_back_and_says_why() {
    let sb = Sandbox::new();
    sb.seed_probe(&sb.data());
    let mut cmd = sb.cmd();
    cmd.args(["demo", "--records", "2000", "--dir"])
        .arg(sb.data());
    if !seccomp::fail_io_uring_setup(&mut cmd, libc::EMFILE) {
        skip("no seccomp filter for io_uring on this architecture");
        return;
    }
    let out = cmd.output().unwrap();
    assert_ok(&out);
    assert!(
        text(&out.stdout).contains("(pread, O_DIRECT)"),
        "{}",
        text(&out.stdout)
    );
    let err = text(&out.stderr);
    assert!(
        err.contains("io_uring could not be set up") && err.contains("EMFILE"),
        "{err}"
    );
    assert!(!err.contains("io_uring unavailable"), "{err}");

    let mut cmd = sb.cmd();
    cmd.env("RIFFLE_IO", "uring")
        .args(["demo", "--records", "2000", "--dir"])
        .arg(sb.data());
    seccomp::fail_io_uring_setup(&mut cmd, libc::EMFILE);
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("io_uring") && err.contains("EMFILE"), "{err}");
}

#[test]
fn errors_name_the_path_and_exit_non_zero() {
    let sb = Sandbox::new();
    let missing = sb.path().join("no-such-dir");
    let out = sb
        .cmd()
        .args(["probe", "--quick"])
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("no-such-dir") && err.contains("No such file"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    let out = sb.cmd().args(["bench", "no-such-suite"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("unknown suite"));

    let out = sb
        .cmd()
        .args(["probe", "--region", "12Q", "."])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error exits 2");
}

/// The peers suite makes its own virtual environment; one it cannot make (its path lies
/// under a regular file) is a one-line error naming the path, exit 1, and no report.
#[test]
fn peers_names_a_venv_it_cannot_make() {
    if !nix::unistd::geteuid().is_root() {
        skip_needed_in_ci("the peers suite needs root (memory cgroups), and this is not root");
        return;
    }
    let sb = Sandbox::new();
    let out = sb
        .bench(&["peers", "--quick"])
        .env("RIFFLE_BENCH_VENV", "/dev/null/riffle-venv")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("/dev/null/riffle-venv") && !err.contains("panicked"),
        "{err}"
    );
    assert!(!sb.path().join("results").exists(), "nothing was written");
}

#[test]
fn fio_parity_writes_a_report() {
    if Command::new("fio").arg("--version").output().is_err() {
        skip_needed_in_ci("fio is not installed (apt-get install -y fio)");
        return;
    }
    let sb = Sandbox::new();
    let out = sb
        .bench(&[
            "fio-parity",
            "--json",
            "--size",
            "64M",
            "--seconds",
            "1",
            "--points",
            "4K:8",
            "--repeats",
            "1",
        ])
        .output()
        .unwrap();
    assert_ok(&out);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = &r["rows"][0];
    assert_eq!(row["bs"], 4096);
    assert_eq!(row["qd"], 8);
    for side in ["fio_cpu_us_per_read", "engine_cpu_us_per_read"] {
        let us = row[side].as_f64().unwrap();
        assert!(us > 0.0 && us < 1e6, "{side}: {us}");
    }
    let (f, e) = (
        row["fio_iops"].as_f64().unwrap(),
        row["engine_iops"].as_f64().unwrap(),
    );
    assert!(f > 0.0 && e > 0.0);
    assert!((row["ratio"].as_f64().unwrap() - e / f).abs() < 1e-9);
    let dir = PathBuf::from(r["report_dir"].as_str().unwrap());
    assert!(dir.join("fio-parity.json").is_file() && dir.join("fio-parity.md").is_file());
    assert_eq!(
        std::fs::read_dir(sb.data()).unwrap().count(),
        0,
        "the test file was left behind"
    );
}

mod seccomp {
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    /// Makes `cmd`'s process get EPERM from io_uring_setup, through a seccomp filter
    /// installed between fork and exec. Returns false where no filter is written for the
    /// architecture.
    pub fn deny_io_uring(cmd: &mut Command) -> bool {
        fail_io_uring_setup(cmd, libc::EPERM)
    }

    /// Makes `cmd`'s process get `errno` from io_uring_setup, as [`deny_io_uring`] does.
    pub fn fail_io_uring_setup(cmd: &mut Command, errno: i32) -> bool {
        #[cfg(target_arch = "x86_64")]
        const ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
        #[cfg(target_arch = "aarch64")]
        const ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        return false;
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        {
            const IO_URING_SETUP: u32 = 425;
            fn stmt(code: u32, k: u32) -> libc::sock_filter {
                libc::sock_filter {
                    code: code as u16,
                    jt: 0,
                    jf: 0,
                    k,
                }
            }
            fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
                libc::sock_filter {
                    code: code as u16,
                    jt,
                    jf,
                    k,
                }
            }
            let ld = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
            let jeq = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
            let ret = libc::BPF_RET | libc::BPF_K;
            let filter = [
                stmt(ld, 4), // seccomp_data.arch
                jump(jeq, ARCH, 0, 3),
                stmt(ld, 0), // seccomp_data.nr
                jump(jeq, IO_URING_SETUP, 0, 1),
                stmt(ret, libc::SECCOMP_RET_ERRNO | errno as u32),
                stmt(ret, libc::SECCOMP_RET_ALLOW),
            ];
            // SAFETY: the closure runs in the child between fork and exec and only calls
            // prctl, which is async-signal-safe; the filter vector outlives the call.
            unsafe {
                cmd.pre_exec(move || {
                    let prog = libc::sock_fprog {
                        len: filter.len() as u16,
                        filter: filter.as_ptr() as *mut _,
                    };
                    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                        || libc::prctl(
                            libc::PR_SET_SECCOMP,
                            libc::SECCOMP_MODE_FILTER,
                            &prog as *const _,
                        ) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            true
        }
    }
}
