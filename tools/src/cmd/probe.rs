//! `riffle probe PATH`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use riffle::probe::{self, ProbeOptions, Profile};
use riffle::size::{human_bytes, parse_size};

use crate::out::{out, outln};
use crate::progress;

#[derive(clap::Args)]
pub struct Args {
    /// A directory (the scratch file goes there) or a file (the scratch file goes next to
    /// it) on the device to measure; or `s3://bucket/prefix`: the object store its endpoint
    /// serves (AWS_ENDPOINT_URL and the usual AWS variables), measured by reading the
    /// largest object under the prefix (nothing is written to the bucket).
    pub path: PathBuf,
    /// A short probe: 7 points of 1.5 s instead of 20 of 4 s, a 1 GiB region instead of 4 GiB.
    #[arg(long)]
    pub quick: bool,
    /// Measure again even if a cached profile exists.
    #[arg(long)]
    pub refresh: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Size of the scratch region to write and read (default 1 GiB quick, 4 GiB full).
    /// A region smaller than the device's caches measures the caches.
    #[arg(long, value_parser = parse_size)]
    pub region: Option<u64>,
    /// Seconds per measured point (default 1.5 quick, 4 full).
    #[arg(long)]
    pub point_time: Option<f64>,
}

/// The cached profile for `path`, or a fresh probe (stored in the cache).
pub fn cached_or_probe(
    path: &std::path::Path,
    opts: &ProbeOptions,
    refresh: bool,
    json: bool,
) -> Result<(Profile, bool)> {
    let quick = opts.quick;
    let dir = probe::scratch_dir(path)?;
    let dev = riffle::device::identify(&dir)
        .with_context(|| format!("{}: cannot identify its device", dir.display()))?;
    if !refresh {
        if let Some((p, _)) = probe::load_cached(&dev, quick, riffle::emulate::active(&dev)) {
            return Ok((p, true));
        }
    }
    let plan = probe::ProbePlan::new(quick);
    let bar = progress::steps(plan.points.len() as u64 + 2, json);
    let profile = probe::probe(path, opts, &mut |done, _total, what| {
        bar.set_position(done as u64);
        bar.set_message(what.to_owned());
    })?;
    bar.finish_and_clear();
    if let Err(e) = probe::store(&profile) {
        eprintln!("riffle: warning: could not cache the profile: {e}");
    }
    Ok((profile, false))
}

pub fn run(args: Args) -> Result<()> {
    if let Some(url) = args
        .path
        .to_str()
        .filter(|_| riffle::remote::is_remote(&args.path))
    {
        return remote(url, &args);
    }
    let mut opts = ProbeOptions::new(args.quick);
    opts.region = args.region;
    if let Some(t) = args.point_time {
        if !(t > 0.0 && t < 3600.0) {
            anyhow::bail!("--point-time {t}: expected seconds between 0 and 3600");
        }
        opts.point_time = Some(std::time::Duration::from_secs_f64(t));
    }
    let (profile, cached) = cached_or_probe(&args.path, &opts, args.refresh, args.json)?;
    let cache = probe::cache_path(&profile.device, profile.quick, profile.emulated);
    let shown = Shown {
        cached,
        cache: &cache,
        seconds: profile.probe_seconds,
    };
    shown.print(args.json, serde_json::to_value(&profile)?, || {
        render(&profile)
    })
}

/// How a profile came (cached or just measured, and where it is kept), for [`Shown::print`].
struct Shown<'a> {
    cached: bool,
    cache: &'a std::path::Path,
    seconds: f64,
}

impl Shown<'_> {
    /// Prints a profile: one JSON object (`value` with where it is cached) or its table
    /// and a line saying whether it was measured now.
    fn print(
        &self,
        json: bool,
        mut value: serde_json::Value,
        table: impl Fn() -> String,
    ) -> Result<()> {
        if json {
            value["cached"] = self.cached.into();
            value["cache_path"] = self.cache.display().to_string().into();
            outln!("{value}")?;
            return Ok(());
        }
        out!("{}", table())?;
        if self.cached {
            outln!(
                "(cached profile {}; --refresh measures again)",
                self.cache.display()
            )?;
        } else {
            outln!(
                "measured in {:.1} s; cached in {}",
                self.seconds,
                self.cache.display()
            )?;
        }
        Ok(())
    }
}

/// The profile as a readable table.
pub fn render(p: &Profile) -> String {
    use std::fmt::Write;
    let d = &p.device;
    let mut s = String::new();
    let name = d.name.as_deref().unwrap_or("(no block device)");
    let model = d.model.as_deref().unwrap_or("unknown model");
    let rot = match d.rotational {
        Some(true) => "rotational",
        Some(false) => "non-rotational",
        None => "rotational: unknown",
    };
    let lbs = d
        .logical_block_size
        .map(|b| format!("{b} B"))
        .unwrap_or_else(|| "unknown".into());
    let _ = writeln!(
        s,
        "device      {} {name} ({model}), {rot}, {} filesystem, logical block {lbs}",
        d.dev, d.fs_type
    );
    if let Some(class) = p.emulated {
        let _ = writeln!(s, "emulating   {class}: {}", class.limits());
    }
    let direct = if p.direct {
        "O_DIRECT".to_owned()
    } else {
        format!(
            "buffered ({})",
            p.buffered_reason.as_deref().unwrap_or("no O_DIRECT")
        )
    };
    let _ = writeln!(
        s,
        "access      {direct}; alignment {} B memory, {} B offset (from {})",
        p.alignment.mem, p.alignment.offset, p.alignment.source
    );
    let _ = writeln!(s, "backend     {} ({})", p.backend, p.backend_features);
    let _ = writeln!(
        s,
        "region      {} {}",
        human_bytes(p.region_bytes as f64),
        if p.quick {
            "(quick probe)"
        } else {
            "(full probe)"
        }
    );
    let _ = writeln!(
        s,
        "sequential  read {}/s (1 MiB, QD 8, p99 {:.0} us), write {}/s",
        human_bytes(p.seq_read_bps),
        p.seq_read.lat_p99_us,
        human_bytes(p.seq_write_bps)
    );
    let _ = writeln!(s, "random read");
    let _ = writeln!(
        s,
        "  {:>8} {:>4} {:>10} {:>12} {:>10} {:>10}",
        "block", "QD", "IOPS", "bandwidth", "p50 us", "p99 us"
    );
    for pt in &p.random {
        let _ = writeln!(
            s,
            "  {:>8} {:>4} {:>10.0} {:>10}/s {:>10.1} {:>10.1}",
            human_bytes(pt.bs as f64),
            pt.qd,
            pt.iops,
            human_bytes(pt.bytes_per_s),
            pt.lat_p50_us,
            pt.lat_p99_us
        );
    }
    s
}

/// `riffle probe s3://...`: the object store as a device (time to the first byte, GETs by
/// size and requests in flight), cached per endpoint.
fn remote(url: &str, args: &Args) -> Result<()> {
    use riffle::remote::probe as rp;
    let cfg = riffle::remote::S3Config::from_env()?;
    let cached = (!args.refresh)
        .then(|| rp::load_cached(&cfg, args.quick))
        .flatten();
    let was_cached = cached.is_some();
    let profile = match cached {
        Some(p) => p,
        None => {
            let mut opts = rp::RemoteProbeOptions::new(args.quick);
            if let Some(t) = args.point_time {
                if !(t > 0.0 && t < 3600.0) {
                    anyhow::bail!("--point-time {t}: expected seconds between 0 and 3600");
                }
                opts.point_time = std::time::Duration::from_secs_f64(t);
            }
            let total = 1 + opts.sizes.len() * opts.in_flight.len();
            let bar = progress::steps(total as u64, args.json);
            let p = rp::probe_remote(url, &cfg, &opts, &mut |done, _, what| {
                bar.set_position(done as u64);
                bar.set_message(what.to_owned());
            })?;
            bar.finish_and_clear();
            if let Err(e) = rp::store(&cfg, &p) {
                eprintln!("riffle: warning: could not cache the profile: {e}");
            }
            p
        }
    };
    let cache = rp::cache_path(&cfg, profile.quick);
    let shown = Shown {
        cached: was_cached,
        cache: &cache,
        seconds: profile.probe_seconds,
    };
    shown.print(args.json, serde_json::to_value(&profile)?, || {
        render_remote(&profile)
    })
}

/// A remote profile as a readable table.
pub fn render_remote(p: &riffle::remote::probe::RemoteProfile) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "endpoint    {} (object store)", p.endpoint);
    let _ = writeln!(
        s,
        "object      {} ({}) {}",
        p.object,
        human_bytes(p.object_bytes as f64),
        if p.quick {
            "(quick probe)"
        } else {
            "(full probe)"
        }
    );
    let [p50, p99, max] = p.first_byte_s;
    let _ = writeln!(
        s,
        "first byte  p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        p50 * 1e3,
        p99 * 1e3,
        max * 1e3
    );
    let _ = writeln!(
        s,
        "best        {}/s ({} GETs of {})",
        human_bytes(p.best_bytes_per_s),
        p.best_at.1,
        human_bytes(p.best_at.0 as f64)
    );
    let _ = writeln!(s, "ranged GETs");
    let _ = writeln!(
        s,
        "  {:>8} {:>9} {:>10} {:>12}",
        "size", "in flight", "GETs/s", "bandwidth"
    );
    for pt in &p.points {
        let _ = writeln!(
            s,
            "  {:>8} {:>9} {:>10.1} {:>10}/s",
            human_bytes(pt.size as f64),
            pt.in_flight,
            pt.requests_per_s,
            human_bytes(pt.bytes_per_s)
        );
    }
    for why in &p.skipped {
        let _ = writeln!(s, "  skipped: {why}");
    }
    s
}
