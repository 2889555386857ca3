//! Where results go and small helpers shared by the suites.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

/// Today's date in UTC as `YYYY-MM-DD`.
pub fn today() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The machine's host name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "host".into())
}

/// The machine a report was measured on.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Machine {
    /// The date of the run (UTC), `YYYY-MM-DD`.
    pub date: String,
    /// Host name.
    pub host: String,
    /// Kernel release.
    pub kernel: String,
    /// CPU model.
    pub cpu: String,
    /// CPUs this process may run on.
    pub cores: usize,
    /// Physical memory in bytes.
    pub memory_bytes: u64,
}

/// The machine this runs on, today.
pub fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
        .map(|(_, m)| m.trim().to_owned())
        .unwrap_or_else(|| "?".into());
    Machine {
        date: today(),
        host: hostname(),
        kernel: nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_else(|_| "?".into()),
        cpu,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        memory_bytes: meminfo_kib("MemTotal:").unwrap_or(0) * 1024,
    }
}

/// A `/proc/meminfo` field in KiB (`MemTotal:`, `MemAvailable:`).
pub fn meminfo_kib(field: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `out/<date>-<host>/`, created.
pub fn results_dir(out: &Path) -> Result<PathBuf> {
    let dir = out.join(format!("{}-{}", today(), hostname()));
    std::fs::create_dir_all(&dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    Ok(dir)
}

/// Drops the page cache (root only); returns whether it did.
pub fn drop_caches() -> bool {
    // Dirty pages must reach the device first, or dropping the cache keeps them.
    let _ = std::process::Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// Per-run figures as Markdown shows them: whole numbers, space separated.
pub fn runs(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.0}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A device a suite measures: its name in reports (`real`, or the emulated class) and the
/// throttle that emulates it, held until the guard is dropped.
pub fn enter_device(
    class: Option<riffle::emulate::DeviceClass>,
    data_dir: &Path,
) -> Result<(String, Option<riffle::emulate::Throttle>)> {
    Ok(match class {
        None => ("real".into(), None),
        Some(c) => (
            c.to_string(),
            Some(riffle::emulate::Throttle::enter(c, data_dir)?),
        ),
    })
}

/// Writes `name.json` and `name.md` into `dir`.
pub fn write_report(
    dir: &Path,
    name: &str,
    json: &serde_json::Value,
    markdown: &str,
) -> Result<()> {
    let j = dir.join(format!("{name}.json"));
    std::fs::write(&j, serde_json::to_string_pretty(json)?)
        .with_context(|| format!("{}", j.display()))?;
    let m = dir.join(format!("{name}.md"));
    std::fs::write(&m, markdown).with_context(|| format!("{}", m.display()))?;
    Ok(())
}

/// CPU seconds (user + system) of this process, or of its children waited for.
pub fn cpu_seconds(who: nix::sys::resource::UsageWho) -> f64 {
    let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    nix::sys::resource::getrusage(who)
        .map(|u| tv(u.user_time()) + tv(u.system_time()))
        .unwrap_or(0.0)
}

/// `f()` and the CPU seconds `who` used while it ran (this process's, every thread; or
/// the children it waited for meanwhile).
pub fn cpu_of<T>(who: nix::sys::resource::UsageWho, f: impl FnOnce() -> T) -> (T, f64) {
    let before = cpu_seconds(who);
    let out = f();
    (out, cpu_seconds(who) - before)
}

/// Records per CPU-second: `records` over `cpu` seconds (0 when no CPU was measured).
pub fn per_cpu_second(records: f64, cpu: f64) -> f64 {
    if cpu > 0.0 {
        records / cpu
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn date_shape() {
        let d = super::today();
        assert_eq!(d.len(), 10);
        assert!(d.starts_with("20"));
    }
}
