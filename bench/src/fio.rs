//! Running fio as the reference.

use std::path::Path;
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;

/// fio's figures for one random-read job.
#[derive(Clone, Debug, Serialize)]
pub struct FioResult {
    /// Reads per second.
    pub iops: f64,
    /// Bytes per second.
    pub bytes_per_s: f64,
    /// Completion latency p50, microseconds.
    pub lat_p50_us: f64,
    /// Completion latency p99, microseconds.
    pub lat_p99_us: f64,
    /// fio's version string.
    pub version: String,
}

/// fio's version, or an error that says how to install it.
pub fn version() -> Result<String> {
    let out = Command::new("fio").arg("--version").output().map_err(|_| {
        anyhow!("fio is not installed; install it with `apt-get install -y fio` (Debian/Ubuntu) or your distribution's package")
    })?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Huge pages reserved for fio's buffers while this lives (the previous reservation is
/// restored on drop). The engine keeps its large buffers on transparent huge pages so a
/// large direct read is one DMA segment; fio gets the same with `--iomem=shmhuge`, which
/// needs reserved huge pages. Without them fio's buffers sit on scattered 4 KiB pages,
/// large requests are split at the device's segment limit, and fio under-reports the
/// device (measured here: 1.1 vs 3.2 GiB/s for 1 MiB sequential reads).
pub struct HugePages {
    previous: u64,
}

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

impl HugePages {
    /// Reserves at least `pages` huge pages; `None` when that is not possible (not root,
    /// no memory), in which case fio runs with ordinary buffers.
    pub fn reserve(pages: u64) -> Option<HugePages> {
        let read = || -> Option<u64> {
            std::fs::read_to_string(NR_HUGEPAGES)
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let previous = read()?;
        if previous >= pages {
            return Some(HugePages { previous });
        }
        std::fs::write(NR_HUGEPAGES, pages.to_string()).ok()?;
        let guard = HugePages { previous };
        (read()? >= pages).then_some(guard)
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        let _ = std::fs::write(NR_HUGEPAGES, self.previous.to_string());
    }
}

/// How fio allocates its buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FioMem {
    /// `--iomem=malloc`, fio's default.
    Malloc,
    /// `--iomem=shmhuge`: huge-page buffers (needs [`HugePages`]).
    ShmHuge,
}

/// Runs one fio job: `rw` is fio's `--rw` (`randread`, `read`, ...), O_DIRECT, io_uring.
///
/// With `seconds`, the job runs that long with uniformly random offsets drawn with
/// replacement (`--time_based --norandommap`), as raw IOPS are measured. Without, it makes
/// exactly one pass over `size` bytes touching every block once in random order (fio's
/// random map), which is what one LIRS epoch does: no block is read twice, so no cache
/// below the guest can serve a repeat.
pub fn run(
    file: &Path,
    rw: &str,
    bs: usize,
    qd: usize,
    seconds: Option<u64>,
    size: u64,
    mem: FioMem,
) -> Result<FioResult> {
    run_with(file, rw, bs, qd, seconds, size, mem, &[])
}

/// [`run`] with more of fio's options (`--fixedbufs`, `--sqthread_poll=1`, ...).
#[allow(clippy::too_many_arguments)]
pub fn run_with(
    file: &Path,
    rw: &str,
    bs: usize,
    qd: usize,
    seconds: Option<u64>,
    size: u64,
    mem: FioMem,
    extra: &[&str],
) -> Result<FioResult> {
    let version = version()?;
    let iomem = match mem {
        FioMem::Malloc => "--iomem=malloc",
        FioMem::ShmHuge => "--iomem=shmhuge",
    };
    let timing: Vec<String> = match seconds {
        Some(t) => vec![
            format!("--runtime={t}"),
            "--time_based".into(),
            "--norandommap".into(),
        ],
        None => Vec::new(),
    };
    let out = Command::new("fio")
        .arg(iomem)
        .args(&timing)
        .args([
            "--name=riffle-reference",
            &format!("--filename={}", file.display()),
            &format!("--rw={rw}"),
            &format!("--bs={bs}"),
            &format!("--iodepth={qd}"),
            "--ioengine=io_uring",
            "--direct=1",
            &format!("--size={size}"),
            "--randrepeat=0",
            "--numjobs=1",
            "--output-format=json",
        ])
        .args(extra)
        .output()
        .context("running fio")?;
    if !out.status.success() {
        bail!(
            "fio failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // fio may print notes before the JSON object.
    let start = text
        .find('{')
        .ok_or_else(|| anyhow!("fio printed no JSON: {text}"))?;
    let v: serde_json::Value =
        serde_json::from_str(&text[start..]).context("parsing fio's JSON")?;
    let read = &v["jobs"][0]["read"];
    let pct = |k: &str| {
        read["clat_ns"]["percentile"][k]
            .as_f64()
            .unwrap_or(f64::NAN)
            / 1000.0
    };
    Ok(FioResult {
        iops: read["iops"]
            .as_f64()
            .ok_or_else(|| anyhow!("fio JSON has no read.iops"))?,
        bytes_per_s: read["bw_bytes"].as_f64().unwrap_or(f64::NAN),
        lat_p50_us: pct("50.000000"),
        lat_p99_us: pct("99.000000"),
        version,
    })
}
