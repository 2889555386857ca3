//! Object storage as a device the probe measures: the time to a GET's first byte, and the
//! throughput of ranged GETs by request size (64 KiB to 64 MiB) and requests in flight (1 to
//! 256), read from an object the dataset already has (the probe writes nothing to the
//! bucket). Each response is drained as it streams in, so the probe holds a few buffers, not
//! `size x in flight` bytes. The profile is cached per endpoint, as a disk's is per device.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::stream::{FuturesUnordered, StreamExt};
use object_store::path::Path as Key;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore};
use serde::{Deserialize, Serialize};

use super::{fetch, S3Config, S3Url};
use crate::{Error, Result};

/// The version of the profile's format: a cached profile of another version is measured
/// again.
pub const REMOTE_PROFILE_VERSION: u32 = 1;

/// A point keeps at most this many bytes asked for at once (`size x in flight`): past it
/// the first wave alone would take most of a minute on a link of a few hundred MB/s.
pub const MAX_BYTES_IN_FLIGHT: u64 = 1 << 30;

/// One measured point: GETs of `size` bytes, `in_flight` at a time.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RemotePoint {
    /// Bytes per GET.
    pub size: u64,
    /// GETs in flight.
    pub in_flight: usize,
    /// GETs completed.
    pub requests: u64,
    /// Bytes received.
    pub bytes: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// Bytes per second.
    pub bytes_per_s: f64,
    /// GETs per second.
    pub requests_per_s: f64,
}

/// What the probe measured of an endpoint.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RemoteProfile {
    /// [`REMOTE_PROFILE_VERSION`].
    pub version: u32,
    /// The endpoint (`aws` for AWS itself).
    pub endpoint: String,
    /// The object read.
    pub object: String,
    /// Its size.
    pub object_bytes: u64,
    /// A quick probe (fewer, shorter points).
    pub quick: bool,
    /// Seconds to the first byte of a one-byte GET: median, 99th percentile and worst.
    pub first_byte_s: [f64; 3],
    /// The points, by size then requests in flight.
    pub points: Vec<RemotePoint>,
    /// Points not measured, and why (a size past the object).
    pub skipped: Vec<String>,
    /// The best throughput of any point, bytes/s: the sequential bandwidth the planner
    /// uses for the object store.
    pub best_bytes_per_s: f64,
    /// The point that reached it: (size, in flight).
    pub best_at: (u64, usize),
    /// When measured, seconds since the epoch.
    pub measured_at: u64,
    /// How long the probe took.
    pub probe_seconds: f64,
}

impl RemoteProfile {
    /// GETs per second of `size` bytes at `in_flight`, interpolated from the points (the
    /// nearest measured size at or above `size`, the nearest depth at or below).
    pub fn requests_per_s(&self, size: u64, in_flight: usize) -> f64 {
        let sizes: Vec<u64> = self.points.iter().map(|p| p.size).collect();
        let at = (sizes.iter().copied().filter(|&s| s >= size).min())
            .or_else(|| sizes.iter().copied().max());
        let Some(at) = at else { return 0.0 };
        let row = self.points.iter().filter(|p| p.size == at);
        let best = row
            .clone()
            .filter(|p| p.in_flight <= in_flight.max(1))
            .max_by_key(|p| p.in_flight)
            .or_else(|| row.min_by_key(|p| p.in_flight));
        best.map_or(0.0, |p| p.requests_per_s)
    }
}

/// How much to measure.
#[derive(Clone, Debug)]
pub struct RemoteProbeOptions {
    /// Fewer points, shorter.
    pub quick: bool,
    /// Seconds per point.
    pub point_time: Duration,
    /// Request sizes.
    pub sizes: Vec<u64>,
    /// Requests in flight.
    pub in_flight: Vec<usize>,
    /// One-byte GETs timed for the first-byte latency.
    pub first_byte_gets: usize,
}

impl RemoteProbeOptions {
    /// The full grid (64 KiB, 1 MiB, 8 MiB, 64 MiB x 1, 4, 16, 64, 256 in flight, 2 s each,
    /// but never more than [`MAX_BYTES_IN_FLIGHT`] at once), or a quick one (64 KiB, 8 MiB x
    /// 1, 16, 64; 1 s each).
    pub fn new(quick: bool) -> RemoteProbeOptions {
        if quick {
            RemoteProbeOptions {
                quick,
                point_time: Duration::from_secs(1),
                sizes: vec![64 << 10, 8 << 20],
                in_flight: vec![1, 16, 64],
                first_byte_gets: 16,
            }
        } else {
            RemoteProbeOptions {
                quick,
                point_time: Duration::from_secs(2),
                sizes: vec![64 << 10, 1 << 20, 8 << 20, 64 << 20],
                in_flight: vec![1, 4, 16, 64, 256],
                first_byte_gets: 64,
            }
        }
    }
}

/// The name this endpoint's profile is cached under.
fn endpoint_name(cfg: &S3Config) -> String {
    cfg.endpoint.clone().unwrap_or_else(|| "aws".into())
}

/// Where the profile of `cfg`'s endpoint is cached: `profiles/s3-<host>-<kind>.json` in
/// riffle's cache directory.
pub fn cache_path(cfg: &S3Config, quick: bool) -> PathBuf {
    let kind = if quick { "quick" } else { "full" };
    crate::probe::cache_dir()
        .join("profiles")
        .join(format!("s3-{}-{kind}.json", cfg.cache_dir()))
}

/// The cached profile of `cfg`'s endpoint, if one is current (a full one answers for a
/// quick one too).
pub fn load_cached(cfg: &S3Config, quick: bool) -> Option<RemoteProfile> {
    let kinds: &[bool] = if quick { &[true, false] } else { &[false] };
    kinds.iter().find_map(|&q| {
        let p = cache_path(cfg, q);
        let text = crate::door::read_meta(&p, crate::door::cap::PROFILE, crate::door::Follow::No)
            .ok()??;
        let prof: RemoteProfile = serde_json::from_slice(&text).ok()?;
        (prof.version == REMOTE_PROFILE_VERSION && prof.endpoint == endpoint_name(cfg))
            .then_some(prof)
    })
}

/// Writes `profile` to the cache for `cfg` (atomically).
pub fn store(cfg: &S3Config, profile: &RemoteProfile) -> Result<PathBuf> {
    let path = cache_path(cfg, profile.quick);
    let dir = path.parent().expect("cache path has a parent");
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "create directory", None, e))?;
    let text = serde_json::to_string_pretty(profile).expect("profile serialises");
    crate::scratch::write_atomic(&path, text.as_bytes())?;
    Ok(path)
}

/// Measures the endpoint `url` is on, reading its largest object. `progress(done, total,
/// what)` is told of each point.
pub fn probe_remote(
    url: &str,
    cfg: &S3Config,
    opts: &RemoteProbeOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<RemoteProfile> {
    let parsed = S3Url::parse(url)?;
    let store = cfg.store(&parsed.bucket)?;
    super::runtime()?.block_on(async {
        let objects = fetch::list_alone(&store, &parsed).await?;
        let Some(meta) = objects.into_iter().max_by_key(|m| m.size) else {
            return Err(Error::Invalid(format!("{url}: no object to measure")));
        };
        if meta.size == 0 {
            return Err(Error::Invalid(format!(
                "{url}: every object is empty; the probe reads one that has bytes"
            )));
        }
        measure(&store, &parsed.bucket, &meta, cfg, opts, progress).await
    })
}

async fn measure(
    store: &Arc<dyn ObjectStore>,
    bucket: &str,
    meta: &ObjectMeta,
    cfg: &S3Config,
    opts: &RemoteProbeOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<RemoteProfile> {
    let started = Instant::now();
    let object = format!("s3://{bucket}/{}", meta.location);
    let total = 1 + opts.sizes.len() * opts.in_flight.len();
    progress(0, total, "time to the first byte");
    let mut first = Vec::with_capacity(opts.first_byte_gets);
    for i in 0..opts.first_byte_gets.max(1) {
        let at = (i as u64 * 7919) % meta.size;
        let t = Instant::now();
        get(store, &meta.location, at, 1, &object).await?;
        first.push(t.elapsed().as_secs_f64());
    }
    first.sort_by(f64::total_cmp);
    let q = |f: f64| first[((first.len() - 1) as f64 * f).round() as usize];
    let (mut points, mut skipped) = (Vec::new(), Vec::new());
    let mut done = 1;
    for &size in &opts.sizes {
        for &n in &opts.in_flight {
            progress(done, total, &format!("GETs of {size} B, {n} in flight"));
            done += 1;
            if size > meta.size {
                skipped.push(format!(
                    "{size} B x {n}: the object is {} B (a larger object measures this size)",
                    meta.size
                ));
                continue;
            }
            if size.saturating_mul(n as u64) > MAX_BYTES_IN_FLIGHT {
                skipped.push(format!(
                    "{size} B x {n}: more than {} B asked for at once",
                    MAX_BYTES_IN_FLIGHT
                ));
                continue;
            }
            points.push(point(store, meta, &object, size, n, opts.point_time).await?);
        }
    }
    let best = points
        .iter()
        .max_by(|a, b| a.bytes_per_s.total_cmp(&b.bytes_per_s));
    Ok(RemoteProfile {
        version: REMOTE_PROFILE_VERSION,
        endpoint: endpoint_name(cfg),
        object,
        object_bytes: meta.size,
        quick: opts.quick,
        first_byte_s: [q(0.5), q(0.99), first[first.len() - 1]],
        best_bytes_per_s: best.map_or(0.0, |p| p.bytes_per_s),
        best_at: best.map_or((0, 0), |p| (p.size, p.in_flight)),
        points,
        skipped,
        measured_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        probe_seconds: started.elapsed().as_secs_f64(),
    })
}

/// GETs of `size` bytes at offsets spread over the object, `n` in flight, for `time`: the
/// last ones started before the time is up are waited for and counted.
async fn point(
    store: &Arc<dyn ObjectStore>,
    meta: &ObjectMeta,
    object: &str,
    size: u64,
    n: usize,
    time: Duration,
) -> Result<RemotePoint> {
    let slots = (meta.size / size).max(1);
    let started = Instant::now();
    let mut running = FuturesUnordered::new();
    let (mut issued, mut requests, mut bytes) = (0u64, 0u64, 0u64);
    let mut next = || {
        // A stride prime to most slot counts walks the whole object, not one end of it.
        let at = (issued.wrapping_mul(40_503) % slots) * size;
        issued += 1;
        get(store, &meta.location, at, size, object)
    };
    for _ in 0..n {
        running.push(next());
    }
    while let Some(got) = running.next().await {
        bytes += got?;
        requests += 1;
        if started.elapsed() < time {
            running.push(next());
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(RemotePoint {
        size,
        in_flight: n,
        requests,
        bytes,
        seconds,
        bytes_per_s: bytes as f64 / seconds.max(1e-9),
        requests_per_s: requests as f64 / seconds.max(1e-9),
    })
}

/// One ranged GET of `len` bytes at `at` (clipped at the object's end), drained as it
/// streams: the bytes received.
async fn get(
    store: &Arc<dyn ObjectStore>,
    key: &Key,
    at: u64,
    len: u64,
    object: &str,
) -> Result<u64> {
    let range = at..at + len;
    let named = |e| fetch::store_error(object, "GET", Some((range.start, range.end)), e);
    let opts = GetOptions {
        range: Some(GetRange::Bounded(range.clone())),
        ..Default::default()
    };
    let mut body = store
        .get_opts(key, opts)
        .await
        .map_err(named)?
        .into_stream();
    let mut got = 0u64;
    while let Some(chunk) = body.next().await {
        got += chunk.map_err(named)?.len() as u64;
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(size: u64, in_flight: usize, rps: f64) -> RemotePoint {
        RemotePoint {
            size,
            in_flight,
            requests: 1,
            bytes: size,
            seconds: 1.0,
            bytes_per_s: size as f64 * rps,
            requests_per_s: rps,
        }
    }

    /// The planner's question (GETs per second of a size at a depth) is answered from the
    /// nearest size at or above it and the nearest depth at or below.
    #[test]
    fn requests_per_second_come_from_the_nearest_point() {
        let prof = RemoteProfile {
            version: REMOTE_PROFILE_VERSION,
            endpoint: "x".into(),
            object: "s3://b/k".into(),
            object_bytes: 1 << 30,
            quick: true,
            first_byte_s: [0.01; 3],
            points: vec![
                p(64 << 10, 1, 50.0),
                p(64 << 10, 16, 700.0),
                p(8 << 20, 16, 9.0),
            ],
            skipped: Vec::new(),
            best_bytes_per_s: 0.0,
            best_at: (0, 0),
            measured_at: 0,
            probe_seconds: 0.0,
        };
        assert_eq!(prof.requests_per_s(4096, 1), 50.0);
        assert_eq!(prof.requests_per_s(4096, 64), 700.0);
        assert_eq!(prof.requests_per_s(1 << 20, 32), 9.0);
        assert_eq!(
            prof.requests_per_s(1 << 30, 32),
            9.0,
            "past the largest: the largest"
        );
        assert_eq!(prof.requests_per_s(4096, 0), 50.0);
    }
}
