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

/// Runs `fio --ioengine=io_uring --direct=1 --rw=randread` on `file` for `seconds`.
pub fn randread(file: &Path, bs: usize, qd: usize, seconds: u64, size: u64) -> Result<FioResult> {
    run(file, "randread", bs, qd, seconds, size)
}

/// Runs one fio job: `rw` is fio's `--rw` (`randread`, `read`, ...), O_DIRECT, io_uring.
pub fn run(
    file: &Path,
    rw: &str,
    bs: usize,
    qd: usize,
    seconds: u64,
    size: u64,
) -> Result<FioResult> {
    let version = version()?;
    let out = Command::new("fio")
        .args([
            "--name=riffle-reference",
            &format!("--filename={}", file.display()),
            &format!("--rw={rw}"),
            &format!("--bs={bs}"),
            &format!("--iodepth={qd}"),
            "--ioengine=io_uring",
            "--direct=1",
            &format!("--size={size}"),
            &format!("--runtime={seconds}"),
            "--time_based",
            "--norandommap",
            "--randrepeat=0",
            "--numjobs=1",
            "--output-format=json",
        ])
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
