//! Timed random and sequential reads, the way fio measures them: a fixed block size, a fixed
//! number of requests kept in flight, uniformly random aligned offsets over a fully
//! written region, for a fixed time.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::io::{completion_error, open_backend, Access, DataFile, IoConfig, Op, OpKind};
use crate::{Error, Result};

/// One measured point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Block size in bytes.
    pub bs: usize,
    /// Requests kept in flight.
    pub qd: usize,
    /// Completed requests per second.
    pub iops: f64,
    /// Bytes per second.
    pub bytes_per_s: f64,
    /// Latency percentiles of single requests, in microseconds.
    pub lat_p50_us: f64,
    /// 99th percentile latency, in microseconds.
    pub lat_p99_us: f64,
    /// Worst latency, in microseconds.
    pub lat_max_us: f64,
    /// Requests completed.
    pub ops: u64,
    /// Measured time in seconds.
    pub seconds: f64,
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct ReadSpec {
    /// Block size (rounded up to the file's alignment).
    pub bs: usize,
    /// Queue depth.
    pub qd: usize,
    /// How long to run.
    pub duration: Duration,
    /// Bytes of the file to cover (0: the whole file).
    pub region: u64,
    /// Random offsets, or one sequential sweep repeated.
    pub random: bool,
    /// Seed for the offsets.
    pub seed: u64,
}

/// Runs `spec` on `path` with the backend chosen by `cfg` (its depth and slot size are
/// replaced by the spec's). Returns the point and the backend description.
pub fn read_point(path: &Path, spec: &ReadSpec, cfg: &IoConfig) -> Result<Point> {
    let file = Arc::new(DataFile::open(path, Access::Read, cfg.direct)?);
    let unit = file.alignment().io_unit();
    let bs = spec.bs.div_ceil(unit) * unit;
    let region = if spec.region == 0 {
        file.size()
    } else {
        spec.region.min(file.size())
    };
    let blocks = region / bs as u64;
    if blocks == 0 {
        return Err(Error::BadInput {
            path: path.into(),
            offset: None,
            what: format!(
                "file of {} bytes is smaller than one {bs}-byte block",
                file.size()
            ),
        });
    }
    let cfg = IoConfig {
        depth: spec.qd.max(1),
        slot_size: bs,
        ..cfg.clone()
    };
    let mut backend = open_backend(&cfg, unit)?;
    let key = backend.add_file(file.clone())?;
    let depth = backend.depth();
    let mut rng = SmallRng::seed_from_u64(spec.seed);
    let mut seq_next = 0u64;
    let mut next_offset = move || {
        if spec.random {
            rng.random_range(0..blocks) * bs as u64
        } else {
            let b = seq_next % blocks;
            seq_next += 1;
            b * bs as u64
        }
    };
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
    let mut issued_at = vec![Instant::now(); depth];
    let mut completions = Vec::with_capacity(depth);
    let started = Instant::now();
    let deadline = started + spec.duration;
    let mut ops = 0u64;
    let mut stopping = false;
    loop {
        if !stopping {
            let now = Instant::now();
            while backend.in_flight() < depth {
                let slot = backend.acquire().expect("free slot below depth");
                issued_at[slot.index()] = now;
                let offset = next_offset();
                backend.push(Op {
                    slot,
                    file: key,
                    offset,
                    len: bs,
                    at: 0,
                    kind: OpKind::Read,
                    tag: 0,
                })?;
            }
        }
        if backend.in_flight() == 0 {
            break;
        }
        backend.wait(1, &mut completions)?;
        let now = Instant::now();
        for c in completions.drain(..) {
            backend.release(c.op.slot);
            match c.result {
                Ok(n) if n == bs => {}
                Ok(n) => {
                    return Err(Error::BadInput {
                        path: path.into(),
                        offset: Some(c.op.offset + n as u64),
                        what: "short read inside the probe region; was the file truncated?".into(),
                    })
                }
                Err(errno) => return Err(completion_error(&file, &c.op, errno)),
            }
            ops += 1;
            let ns = now.duration_since(issued_at[c.op.slot.index()]).as_nanos() as u64;
            hist.saturating_record(ns.max(1));
        }
        if !stopping && now >= deadline {
            stopping = true;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    Ok(Point {
        bs,
        qd: depth,
        iops: ops as f64 / seconds,
        bytes_per_s: ops as f64 * bs as f64 / seconds,
        lat_p50_us: us(0.5),
        lat_p99_us: us(0.99),
        lat_max_us: hist.max() as f64 / 1000.0,
        ops,
        seconds,
    })
}
