//! `riffle probe`: measures the device holding a path the way fio does, and caches the
//! result per device so the planner need not measure again.
//!
//! The probe writes a scratch file (its sequential write bandwidth is the write figure),
//! then reads it back at random offsets at each block size and queue depth, and
//! sequentially with large requests. The scratch file is removed afterwards, on error too.

mod cache;
mod measure;
mod submit;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

pub use cache::{cache_dir, cache_path, load_cached, store};
pub use measure::{read_point, Point, ReadSpec};
pub use submit::{submit_choice, SubmitChoice, AT_WAIT_BELOW_US};

use crate::device::{self, DeviceId};
use crate::emulate::{self, DeviceClass};
use crate::io::{self, align::Alignment, Access, DataFile, IoConfig};
use crate::{Error, Result};

/// Bumped when the profile's meaning changes; older cached profiles are re-measured.
pub const PROFILE_VERSION: u32 = 2;

/// What a probe measured about one device.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Profile {
    /// [`PROFILE_VERSION`] when written.
    pub version: u32,
    /// Which device.
    pub device: DeviceId,
    /// Direct-I/O alignment of files on it.
    pub alignment: ProfileAlignment,
    /// `io_uring` or `pread`.
    pub backend: String,
    /// Backend features in use (registered buffers, fixed files, ...).
    pub backend_features: String,
    /// Whether the reads bypassed the page cache.
    pub direct: bool,
    /// Why not, when they did not.
    pub buffered_reason: Option<String>,
    /// A quick probe (fewer points, shorter runs).
    pub quick: bool,
    /// Seconds since the epoch when measured.
    pub measured_at: u64,
    /// Size of the scratch region read.
    pub region_bytes: u64,
    /// Sequential read bandwidth, bytes/s (1 MiB requests).
    pub seq_read_bps: f64,
    /// Sequential write bandwidth, bytes/s (1 MiB requests, fdatasync included).
    pub seq_write_bps: f64,
    /// Random-read points by block size and queue depth.
    pub random: Vec<Point>,
    /// The sequential-read point (for its latency).
    pub seq_read: Point,
    /// How long the probe took.
    pub probe_seconds: f64,
    /// The class the device was emulated as while it was measured (see
    /// [`crate::emulate`]); such a profile describes that class, not the device.
    #[serde(default)]
    pub emulated: Option<DeviceClass>,
}

/// The alignment part of a profile.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProfileAlignment {
    /// Buffer alignment.
    pub mem: usize,
    /// Offset/length alignment.
    pub offset: usize,
    /// Where it came from.
    pub source: String,
}

impl From<Alignment> for ProfileAlignment {
    fn from(a: Alignment) -> Self {
        ProfileAlignment {
            mem: a.mem,
            offset: a.offset,
            source: a.source.into(),
        }
    }
}

impl Profile {
    /// The measured random-read point closest to (bs, qd), if any.
    pub fn random_point(&self, bs: usize, qd: usize) -> Option<&Point> {
        self.random.iter().find(|p| p.bs == bs && p.qd == qd)
    }
}

/// The least scratch region a probe measures in (and it takes at most half the free space).
pub const MIN_REGION: u64 = 16 << 20;

/// How to probe.
#[derive(Clone, Debug)]
pub struct ProbeOptions {
    /// Short probe: fewer points, shorter runs, smaller region.
    pub quick: bool,
    /// I/O configuration (backend choice, direct).
    pub io: IoConfig,
    /// Scratch region size, instead of the plan's (1 GiB quick, 4 GiB full).
    pub region: Option<u64>,
    /// The plan's region cut to at most this (the room a staged copy's `--cache-limit`
    /// leaves beside it), as it is cut to half the free space.
    pub at_most: Option<u64>,
    /// Time per random-read point, instead of the plan's (1.5 s quick, 4 s full).
    pub point_time: Option<Duration>,
}

impl ProbeOptions {
    /// A quick or full probe with the default backend choice.
    pub fn new(quick: bool) -> Self {
        ProbeOptions {
            quick,
            io: IoConfig::default(),
            region: None,
            at_most: None,
            point_time: None,
        }
    }
}

/// The plan of a probe: the region and the points.
pub struct ProbePlan {
    /// Scratch region size.
    pub region: u64,
    /// (block size, queue depth) random-read points.
    pub points: Vec<(usize, usize)>,
    /// Time per random point.
    pub per_point: Duration,
    /// Time for the sequential read.
    pub seq_time: Duration,
}

impl ProbePlan {
    /// The plan for a quick or a full probe.
    pub fn new(quick: bool) -> Self {
        const K: usize = 1024;
        if quick {
            ProbePlan {
                region: 1 << 30,
                points: vec![
                    (4 * K, 1),
                    (4 * K, 32),
                    (4 * K, 128),
                    (16 * K, 64),
                    (64 * K, 32),
                    (256 * K, 8),
                    (1024 * K, 8),
                ],
                per_point: Duration::from_millis(1500),
                seq_time: Duration::from_secs(2),
            }
        } else {
            let mut points = Vec::new();
            for bs in [4 * K, 16 * K, 64 * K, 256 * K, 1024 * K] {
                for qd in [1, 8, 32, 128] {
                    points.push((bs, qd));
                }
            }
            ProbePlan {
                region: 4 << 30,
                points,
                per_point: Duration::from_secs(4),
                seq_time: Duration::from_secs(5),
            }
        }
    }
}

/// Where the probe puts its scratch file: in `path` when it is a directory, next to it
/// otherwise.
pub fn scratch_dir(path: &Path) -> Result<PathBuf> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, "stat", None, e))?;
    if meta.is_dir() {
        Ok(path.to_path_buf())
    } else {
        Ok(path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf())
    }
}

/// Measures the device holding `path`. `progress(done, total, what)` is called before each
/// step.
pub fn probe(
    path: &Path,
    opts: &ProbeOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<Profile> {
    let started = std::time::Instant::now();
    let dir = scratch_dir(path)?;
    let device = device::identify(&dir).map_err(|e| Error::io(&dir, "stat", None, e))?;
    // A throttle in force on this device makes the profile one of its class.
    let emulated = emulate::active(&device);
    let mut plan = ProbePlan::new(opts.quick);
    // A region asked for, or the plan's cut to the room a caller leaves.
    plan.region = (opts.region.unwrap_or(plan.region)).min(opts.at_most.unwrap_or(u64::MAX));
    if let Some(t) = opts.point_time {
        plan.per_point = t;
        plan.seq_time = t;
    }
    let total = plan.points.len() + 2;
    let free = free_bytes(&dir)?;
    // Leave room: never take more than half of what is free. The plan's own region is cut
    // down to that; a region the caller asked for is theirs to change, so it is refused.
    if let Some(asked) = opts.region.filter(|&r| r > free / 2) {
        return Err(Error::OverBudget(format!(
            "{}: a region of {asked} bytes ({}) asked for, and {} free: the probe takes at \
             most half of the free space, so at most --region {}",
            dir.display(),
            crate::size::human_bytes(asked as f64),
            crate::size::human_bytes(free as f64),
            crate::size::human_bytes((free / 2) as f64),
        )));
    }
    let region = plan.region.min(free / 2) / (1 << 20) * (1 << 20);
    if region < MIN_REGION {
        return Err(Error::OverBudget(format!(
            "{}: {} free and a region of {} asked for; the probe needs a scratch region of at least 16 MiB and twice that free",
            dir.display(),
            crate::size::human_bytes(free as f64),
            crate::size::human_bytes(plan.region as f64),
        )));
    }

    progress(0, total, "sequential write");
    let wcfg = IoConfig {
        depth: 8,
        slot_size: 1 << 20,
        throttled: opts.io.throttled || emulated.is_some(),
        ..opts.io.clone()
    };
    // A private file, never followed through a planted link, removed on every exit.
    let scratch = crate::scratch::TempFile::scratch_in(&dir, "probe")?;
    let write = io::write_temp(&scratch, region, &wcfg, io::pattern_filler(0x5eed))?;
    let file = DataFile::open(scratch.path(), Access::Read, opts.io.direct)?;

    progress(1, total, "sequential read");
    let seq = read_point(
        scratch.path(),
        &ReadSpec {
            bs: 1 << 20,
            qd: 8,
            duration: plan.seq_time,
            region,
            random: false,
            seed: 0,
        },
        &opts.io,
    )?;
    let mut random = Vec::new();
    for (i, &(bs, qd)) in plan.points.iter().enumerate() {
        progress(
            2 + i,
            total,
            &format!(
                "random read bs={} qd={qd}",
                crate::size::human_bytes(bs as f64)
            ),
        );
        let spec = ReadSpec {
            bs,
            qd,
            duration: plan.per_point,
            region,
            random: true,
            seed: i as u64,
        };
        random.push(read_point(scratch.path(), &spec, &opts.io)?);
    }
    // Describe the backend as the deepest point used it.
    let max_qd = plan.points.iter().map(|p| p.1).max().unwrap_or(1);
    let backend = io::open_backend(
        &IoConfig {
            depth: max_qd,
            slot_size: 4096,
            ..opts.io.clone()
        },
        4096,
    )?;
    Ok(Profile {
        version: PROFILE_VERSION,
        device,
        alignment: file.alignment().into(),
        backend: backend.kind().name().into(),
        backend_features: backend.features(),
        direct: file.direct(),
        buffered_reason: file.buffered_reason().map(str::to_owned),
        quick: opts.quick,
        measured_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        region_bytes: region,
        seq_read_bps: seq.bytes_per_s,
        seq_write_bps: region as f64 / write.seconds,
        random,
        seq_read: seq,
        probe_seconds: started.elapsed().as_secs_f64(),
        emulated,
    })
}

/// Free bytes on the filesystem holding `dir` that this process may write: none on a
/// read-only mount or in a directory it may not write (a dataset on a read-only share has
/// no room for two-pass piles beside it, and the planner must see that).
pub fn free_bytes(dir: &Path) -> Result<u64> {
    free_space(dir).map(|(bytes, _)| bytes)
}

/// Free bytes and free inodes of the filesystem holding `dir` (for the resource plan's
/// scratch check: a tree of many small files runs out of inodes before bytes); both 0
/// where this process may not write (see [`free_bytes`]).
pub fn free_space(dir: &Path) -> Result<(u64, u64)> {
    let st = nix::sys::statvfs::statvfs(dir)
        .map_err(|e| Error::io(dir, "statvfs", None, std::io::Error::from(e)))?;
    let read_only = st.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY)
        || nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_err();
    if read_only {
        return Ok((0, 0));
    }
    Ok((
        st.blocks_available() as u64 * st.fragment_size() as u64,
        st.files_available() as u64,
    ))
}
