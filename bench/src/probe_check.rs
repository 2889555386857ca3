//! probe-check: is `riffle probe` measuring what fio measures? Runs a probe, then fio's
//! 4 KiB QD 128 random reads and 1 MiB QD 8 sequential reads on a file of the probe's region
//! size (before and after the probe, averaged), and reports the ratios and the probe's time.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use riffle::io::{self, IoConfig};
use riffle::probe::{self, ProbeOptions};
use riffle::size::human_bytes;
use serde::Serialize;

use crate::{fio, report};

/// The suite's result.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeCheck {
    /// Quick or full probe.
    pub quick: bool,
    /// Wall time of the probe.
    pub probe_seconds: f64,
    /// The probe's 4 KiB QD 128 IOPS.
    pub probe_4k_qd128_iops: f64,
    /// fio's (mean of the runs before and after the probe).
    pub fio_4k_qd128_iops: f64,
    /// probe / fio.
    pub iops_ratio: f64,
    /// The probe's sequential read, bytes/s.
    pub probe_seq_read_bps: f64,
    /// fio's 1 MiB QD 8 sequential read, bytes/s.
    pub fio_seq_read_bps: f64,
    /// probe / fio.
    pub seq_ratio: f64,
    /// The whole profile.
    pub profile: probe::Profile,
    /// Where the report was written.
    pub report_dir: String,
}

/// Runs the suite in `data_dir`, writing to `out`.
pub fn run(
    quick: bool,
    data_dir: &std::path::Path,
    out: &std::path::Path,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<ProbeCheck> {
    fio::version()?;
    std::fs::create_dir_all(data_dir).with_context(|| format!("{}", data_dir.display()))?;
    let plan = probe::ProbePlan::new(quick);
    let secs = plan.per_point.as_secs().max(2);
    let file: PathBuf = data_dir.join(format!("riffle-probe-check-{}.dat", plan.region));
    progress(0, 6, "writing the fio file");
    let cfg = IoConfig::sequential_write();
    io::write_file(&file, plan.region, &cfg, io::pattern_filler(3))?;
    let result = measure(quick, data_dir, &file, plan.region, secs, progress);
    let _ = std::fs::remove_file(&file);
    let (profile, took, fio_iops, fio_seq) = result?;
    let p4 = profile
        .random_point(4096, 128)
        .map(|p| p.iops)
        .unwrap_or(f64::NAN);
    let dir = report::results_dir(out)?;
    let check = ProbeCheck {
        quick,
        probe_seconds: took,
        probe_4k_qd128_iops: p4,
        fio_4k_qd128_iops: fio_iops,
        iops_ratio: p4 / fio_iops,
        probe_seq_read_bps: profile.seq_read_bps,
        fio_seq_read_bps: fio_seq,
        seq_ratio: profile.seq_read_bps / fio_seq,
        profile,
        report_dir: dir.display().to_string(),
    };
    let name = if quick {
        "probe-check-quick"
    } else {
        "probe-check"
    };
    report::write_report(
        &dir,
        name,
        &serde_json::to_value(&check)?,
        &markdown(&check),
    )?;
    // Both figures as ratios to fio, so that IOPS and bandwidth share an axis.
    crate::plot::compare(
        &dir.join(format!("{name}.svg")),
        "riffle probe against fio (1 = fio's figure)",
        "ratio to fio",
        "fio",
        &[(check.iops_ratio, 1.0), (check.seq_ratio, 1.0)],
    )?;
    Ok(check)
}

/// fio before the probe, the probe, fio after it: (profile, probe seconds, fio IOPS, fio
/// sequential bytes/s), fio's figures averaged over its two runs.
fn measure(
    quick: bool,
    data_dir: &std::path::Path,
    file: &std::path::Path,
    region: u64,
    secs: u64,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<(probe::Profile, f64, f64, f64)> {
    let _huge = fio::HugePages::reserve(64);
    let mem = if _huge.is_some() {
        fio::FioMem::ShmHuge
    } else {
        fio::FioMem::Malloc
    };
    let fio_runs = |step: usize, when: &str, progress: &mut dyn FnMut(usize, usize, &str)| {
        progress(step, 6, &format!("fio {when} the probe"));
        report::drop_caches();
        let iops = fio::run(file, "randread", 4096, 128, Some(secs), region, mem)?.iops;
        let seq = fio::run(file, "read", 1 << 20, 8, Some(secs), region, mem)?.bytes_per_s;
        anyhow::Ok((iops, seq))
    };
    let (i1, s1) = fio_runs(1, "before", progress)?;
    progress(3, 6, "riffle probe");
    report::drop_caches();
    let t = Instant::now();
    let profile = probe::probe(data_dir, &ProbeOptions::new(quick), &mut |_, _, _| {})?;
    let took = t.elapsed().as_secs_f64();
    let (i2, s2) = fio_runs(4, "after", progress)?;
    Ok((profile, took, (i1 + i2) / 2.0, (s1 + s2) / 2.0))
}

/// The report as Markdown.
pub fn markdown(c: &ProbeCheck) -> String {
    format!(
        "# probe check: `riffle probe{}` against fio\n\n\
         Probe took {:.1} s on `{}` ({}){}.\n\n\
         | figure | riffle probe | fio | probe / fio |\n|---|---:|---:|---:|\n\
         | 4 KiB random read, QD 128 (IOPS) | {:.0} | {:.0} | {:.3} |\n\
         | sequential read, 1 MiB QD 8 | {}/s | {}/s | {:.3} |\n",
        if c.quick { " --quick" } else { "" },
        c.probe_seconds,
        c.profile.device.dev,
        c.profile.device.name.as_deref().unwrap_or("?"),
        c.profile
            .emulated
            .map(|class| format!(", emulated as {class} ({})", class.limits()))
            .unwrap_or_default(),
        c.probe_4k_qd128_iops,
        c.fio_4k_qd128_iops,
        c.iops_ratio,
        human_bytes(c.probe_seq_read_bps),
        human_bytes(c.fio_seq_read_bps),
        c.seq_ratio
    )
}
