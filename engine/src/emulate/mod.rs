//! Device emulation: the current process runs under a kernel I/O throttle that makes the
//! device holding a path behave like a slower class of device, so benches and tests see
//! how riffle fares on hardware this machine does not have.
//!
//! The throttle is a cgroup: cgroup v1 `blkio` (`blkio.throttle.{read,write}_{iops,bps}_device`)
//! where that hierarchy is mounted, else cgroup v2 `io.max` where the `io` controller is
//! available. [`Throttle::enter`] makes a fresh group `riffle-emu-<pid>-<n>`, writes the
//! class's limits for the whole disk behind the path (the kernel takes no rules for a
//! partition), and moves the whole process into it: every thread, io_uring worker and
//! child started meanwhile (fio, helpers) is throttled. Dropping the guard moves the
//! process (and any child still running) back to the group it came from and removes the
//! group, on every exit path that unwinds. A group whose owner died without dropping its
//! guard (killed by a signal) is removed by the next `enter`. [`MemoryLimit`] does the same
//! with the memory controller.
//!
//! Limits are upper bounds: a device is never made faster, so `nvme` (no limits) runs at
//! the device's own speed and needs no cgroup. Under cgroup v1 only direct I/O and reads
//! are throttled; buffered writes reach the device from the kernel's flusher threads,
//! outside the group (riffle's own writes are direct).
//!
//! Creating cgroups needs root. Guards nest (each group is made inside the current one on
//! v1), and are dropped in reverse order.

use std::fmt;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::device::{self, DeviceId, Disk};
use crate::{Error, Result};

pub(crate) mod cgroup;

use cgroup::{place, Controller, Group, Version};

/// A class of device to emulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceClass {
    /// A hard disk: 600 random-read IOPS and 150 MB/s (the LIRS paper's Table 2).
    Hdd,
    /// A SATA SSD: 90k random-read IOPS, 550 MB/s read, 500 MB/s write.
    SataSsd,
    /// An NVMe SSD: no throttle (the device's own speed).
    Nvme,
}

impl DeviceClass {
    /// Every class, in the order the CLI lists them.
    pub const ALL: [DeviceClass; 3] = [DeviceClass::Hdd, DeviceClass::SataSsd, DeviceClass::Nvme];

    /// The names `--emulate` takes: `hdd`, `sata-ssd`, `nvme`.
    pub const NAMES: [&'static str; 3] = ["hdd", "sata-ssd", "nvme"];

    /// The class's name as `--emulate` takes it.
    pub fn name(self) -> &'static str {
        match self {
            DeviceClass::Hdd => Self::NAMES[0],
            DeviceClass::SataSsd => Self::NAMES[1],
            DeviceClass::Nvme => Self::NAMES[2],
        }
    }

    /// The limits the throttle sets for this class.
    pub fn limits(self) -> Limits {
        const MB: u64 = 1_000_000;
        match self {
            // A disk seeks for writes as for reads, so random writes are held to the same
            // rate as random reads.
            DeviceClass::Hdd => Limits {
                read_iops: Some(600),
                read_bps: Some(150 * MB),
                write_iops: Some(600),
                write_bps: Some(150 * MB),
            },
            DeviceClass::SataSsd => Limits {
                read_iops: Some(90_000),
                read_bps: Some(550 * MB),
                write_iops: None,
                write_bps: Some(500 * MB),
            },
            DeviceClass::Nvme => Limits::default(),
        }
    }
}

impl fmt::Display for DeviceClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DeviceClass {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        DeviceClass::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "unknown device class '{s}': expected {}",
                    DeviceClass::NAMES.join(", ")
                ))
            })
    }
}

/// Throttle limits on one device; `None` is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Read requests per second.
    pub read_iops: Option<u64>,
    /// Read bytes per second.
    pub read_bps: Option<u64>,
    /// Write requests per second.
    pub write_iops: Option<u64>,
    /// Write bytes per second.
    pub write_bps: Option<u64>,
}

impl Limits {
    /// Whether nothing is limited (no cgroup is needed).
    pub fn is_unlimited(&self) -> bool {
        *self == Limits::default()
    }

    /// The files to write in a fresh group and their contents, for the disk `dev`
    /// (`MAJ:MIN`).
    fn settings(&self, version: Version, dev: &str) -> Vec<(&'static str, String)> {
        match version {
            Version::V1 => [
                ("blkio.throttle.read_iops_device", self.read_iops),
                ("blkio.throttle.read_bps_device", self.read_bps),
                ("blkio.throttle.write_iops_device", self.write_iops),
                ("blkio.throttle.write_bps_device", self.write_bps),
            ]
            .into_iter()
            .filter_map(|(file, v)| Some((file, format!("{dev} {}", v?))))
            .collect(),
            Version::V2 => {
                let v = |x: Option<u64>| x.map_or("max".to_owned(), |x| x.to_string());
                vec![(
                    "io.max",
                    format!(
                        "{dev} rbps={} wbps={} riops={} wiops={}",
                        v(self.read_bps),
                        v(self.write_bps),
                        v(self.read_iops),
                        v(self.write_iops)
                    ),
                )]
            }
        }
    }
}

impl fmt::Display for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_unlimited() {
            return f.write_str("no throttle (the device's own speed)");
        }
        let side = |iops: Option<u64>, bps: Option<u64>| {
            let parts: Vec<String> = [
                iops.map(|n| format!("{n} IOPS")),
                bps.map(|b| format!("{:.0} MB/s", b as f64 / 1e6)),
            ]
            .into_iter()
            .flatten()
            .collect();
            if parts.is_empty() {
                "unlimited".to_owned()
            } else {
                parts.join(" and ")
            }
        };
        write!(
            f,
            "reads at most {}, writes at most {}",
            side(self.read_iops, self.read_bps),
            side(self.write_iops, self.write_bps)
        )
    }
}

/// The classes in force in this process, by disk name: a throttle is process-wide, so
/// anything measured on that disk while it holds (a probe) belongs to the class.
static ACTIVE: Mutex<Vec<(u64, DeviceClass, String)>> = Mutex::new(Vec::new());
static NEXT: AtomicU64 = AtomicU64::new(0);

/// The class the device `dev` is emulated as in this process right now, if any. A probe
/// records it in its profile, and the profile cache keeps such profiles apart from the
/// device's own.
pub fn active(dev: &DeviceId) -> Option<DeviceClass> {
    let name = dev.name.as_deref()?;
    let active = ACTIVE.lock().unwrap_or_else(|p| p.into_inner());
    active
        .iter()
        .rev()
        .find(|(_, _, disk)| disk == name)
        .map(|&(_, class, _)| class)
}

/// Removes every cgroup this process made for emulation (throttles and memory limits),
/// moving the process back out first, and returns how many were removed. For the signal
/// handler of the binary, just before it exits: the guards' `Drop` never runs then, and a
/// group left behind would keep the device throttled for nobody. A guard dropped later
/// finds its group gone and does nothing.
pub fn remove_all() -> usize {
    cgroup::remove_all()
}

/// Whether any throttle is in force in this process.
pub fn any_active() -> bool {
    !ACTIVE.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
}

/// An I/O throttle on one disk that this process (and its children) run under until the
/// guard is dropped.
#[derive(Debug)]
pub struct Throttle {
    class: DeviceClass,
    disk: Disk,
    token: u64,
    group: Option<Group>,
}

impl Throttle {
    /// Throttles the disk holding `path` (or, when `path` does not exist yet, its nearest
    /// existing ancestor) to `class` for this process and every child it starts.
    ///
    /// Needs root unless the class has no limits. Errors name what failed: not root, no
    /// block device behind the path, no cgroup I/O controller, or the cgroup file that
    /// refused a write (anything created by then is removed).
    pub fn enter(class: DeviceClass, path: &Path) -> Result<Throttle> {
        let limits = class.limits();
        if !limits.is_unlimited() {
            require_root(&format!("emulating a device as {class}"))?;
        }
        let disk = disk_of(path)?;
        let group = if limits.is_unlimited() {
            None
        } else {
            let dev = format!("{}:{}", disk.major, disk.minor);
            Some(Group::enter(Controller::Io, &|v| limits.settings(v, &dev))?)
        };
        let token = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut active = ACTIVE.lock().unwrap_or_else(|p| p.into_inner());
        active.push((token, class, disk.name.clone()));
        Ok(Throttle {
            class,
            disk,
            token,
            group,
        })
    }

    /// The emulated class.
    pub fn class(&self) -> DeviceClass {
        self.class
    }

    /// The throttled disk.
    pub fn disk(&self) -> &Disk {
        &self.disk
    }

    /// The cgroup directory, when the class needs one.
    pub fn cgroup(&self) -> Option<&Path> {
        self.group.as_ref().map(|g| g.dir.as_path())
    }
}

impl fmt::Display for Throttle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "emulating {} on {}: {}",
            self.class,
            self.disk,
            self.class.limits()
        )?;
        if let Some(dir) = self.cgroup() {
            write!(f, " (cgroup {})", dir.display())?;
        }
        Ok(())
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        let mut active = ACTIVE.lock().unwrap_or_else(|p| p.into_inner());
        active.retain(|(t, _, _)| *t != self.token);
        // The group (a field) is removed after this, by its own Drop.
    }
}

/// A memory ceiling (cgroup v1 `memory.limit_in_bytes`, v2 `memory.max`) on this process
/// and its children until the guard is dropped: the page cache the process fills counts
/// against it, as in the LIRS paper's memory-limited runs. Memory charged before `enter`
/// stays with the group it was charged to.
#[derive(Debug)]
pub struct MemoryLimit {
    bytes: u64,
    group: Group,
}

impl MemoryLimit {
    /// Limits this process and its children to `bytes` (at least 1 MiB). Needs root.
    pub fn enter(bytes: u64) -> Result<MemoryLimit> {
        if bytes < 1 << 20 {
            return Err(Error::Invalid(format!(
                "a memory limit of {bytes} bytes is too small: at least 1 MiB"
            )));
        }
        require_root("a memory limit")?;
        let group = Group::enter(Controller::Memory, &|v| match v {
            Version::V1 => vec![("memory.limit_in_bytes", bytes.to_string())],
            Version::V2 => vec![("memory.max", bytes.to_string())],
        })?;
        Ok(MemoryLimit { bytes, group })
    }

    /// The limit in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The cgroup directory.
    pub fn cgroup(&self) -> &Path {
        &self.group.dir
    }
}

/// Whether a throttle can be entered here: `Ok`, or the error [`Throttle::enter`] would
/// give for a throttled class (not root; no cgroup I/O controller). Benches and tests use
/// it to skip with the reason.
pub fn supported() -> Result<()> {
    require_root("device emulation")?;
    place(Controller::Io).map(drop)
}

fn require_root(what: &str) -> Result<()> {
    let uid = nix::unistd::geteuid();
    if uid.is_root() {
        return Ok(());
    }
    Err(Error::Unsupported(format!(
        "{what} needs root (this process runs as uid {uid}): it creates a cgroup under \
         /sys/fs/cgroup and moves itself into it; run it as root, for example with sudo"
    )))
}

/// The whole disk holding `path`, or its nearest existing ancestor: a path about to be
/// created (an output file, a data directory) lands on its parent's device.
fn disk_of(path: &Path) -> Result<Disk> {
    let mut at = path;
    let meta = loop {
        match fs::metadata(at) {
            Ok(m) => break m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                at = match at.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ if at != Path::new(".") && at.is_relative() => Path::new("."),
                    _ => return Err(Error::io(path, "stat", None, e)),
                }
            }
            Err(e) => return Err(Error::io(at, "stat", None, e)),
        }
    };
    device::whole_disk(meta.dev()).ok_or_else(|| {
        let (ma, mi) = device::major_minor(meta.dev());
        Error::Unsupported(format!(
            "{}: no block device holds it ({} filesystem, device {ma}:{mi}); device \
             emulation throttles a block device",
            at.display(),
            device::fs_type(at)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_names_round_trip() {
        for c in DeviceClass::ALL {
            assert_eq!(c.name().parse::<DeviceClass>().unwrap(), c);
            assert_eq!(serde_json::to_value(c).unwrap(), c.name());
            assert_eq!(c.to_string(), c.name());
        }
        let err = "ssd".parse::<DeviceClass>().unwrap_err().to_string();
        assert!(
            err.contains("'ssd'") && err.contains("hdd, sata-ssd, nvme"),
            "{err}"
        );
    }

    #[test]
    fn classes_are_ordered_by_speed() {
        let hdd = DeviceClass::Hdd.limits();
        let ssd = DeviceClass::SataSsd.limits();
        assert_eq!(hdd.read_iops, Some(600));
        assert_eq!(hdd.read_bps, Some(150_000_000));
        assert!(ssd.read_iops.unwrap() > 100 * hdd.read_iops.unwrap());
        assert!(ssd.read_bps > hdd.read_bps && ssd.write_bps > hdd.write_bps);
        assert!(DeviceClass::Nvme.limits().is_unlimited());
        assert!(!hdd.is_unlimited());
    }

    #[test]
    fn settings_for_each_cgroup_version() {
        let l = DeviceClass::SataSsd.limits();
        assert_eq!(
            l.settings(Version::V1, "254:0"),
            vec![
                ("blkio.throttle.read_iops_device", "254:0 90000".to_owned()),
                (
                    "blkio.throttle.read_bps_device",
                    "254:0 550000000".to_owned()
                ),
                (
                    "blkio.throttle.write_bps_device",
                    "254:0 500000000".to_owned()
                ),
            ]
        );
        assert_eq!(
            l.settings(Version::V2, "8:0"),
            vec![(
                "io.max",
                "8:0 rbps=550000000 wbps=500000000 riops=90000 wiops=max".to_owned()
            )]
        );
        assert_eq!(
            DeviceClass::Hdd.limits().to_string(),
            "reads at most 600 IOPS and 150 MB/s, writes at most 600 IOPS and 150 MB/s"
        );
    }

    #[test]
    fn nothing_is_active_without_a_throttle() {
        let id = device::identify(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
        assert_eq!(active(&id), None);
    }

    #[test]
    fn a_path_to_be_created_resolves_to_its_parents_disk() {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let Some(disk) = device::whole_disk(fs::metadata(here).unwrap().dev()) else {
            crate::testing::skip(&format!("{} is on no block device", here.display()));
            return;
        };
        assert_eq!(disk_of(&here.join("no/such/file")).unwrap(), disk);
        let err = disk_of(Path::new("/proc/self")).unwrap_err().to_string();
        assert!(
            err.contains("no block device") && err.contains("proc"),
            "{err}"
        );
    }
}
