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
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::device::{self, DeviceId, Disk};
use crate::{Error, Result};

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
    Err(Error::Invalid(format!(
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
        Error::Invalid(format!(
            "{}: no block device holds it ({} filesystem, device {ma}:{mi}); device \
             emulation throttles a block device",
            at.display(),
            device::fs_type(at)
        ))
    })
}

/// The cgroup controllers emulation uses.
#[derive(Clone, Copy, Debug)]
enum Controller {
    Io,
    Memory,
}

impl Controller {
    fn v1(self) -> &'static str {
        match self {
            Controller::Io => "blkio",
            Controller::Memory => "memory",
        }
    }

    fn v2(self) -> &'static str {
        match self {
            Controller::Io => "io",
            Controller::Memory => "memory",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// Where a group for a controller goes.
#[derive(Debug, PartialEq, Eq)]
struct Place {
    version: Version,
    /// The directory the group is made in.
    parent: PathBuf,
    /// This process's group now: where it goes back to.
    home: PathBuf,
    /// A v2 `cgroup.subtree_control` that must enable the controller first.
    enable: Option<PathBuf>,
}

/// One mount from /proc/self/mountinfo.
#[derive(Debug)]
struct Mount {
    /// The mounted directory of the filesystem (a cgroup path for cgroupfs).
    root: String,
    /// Where it is mounted.
    point: PathBuf,
    fstype: String,
    /// Super options (for cgroup v1, the controllers).
    options: Vec<String>,
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) if b[i] == b'\\' => {
                out.push(d.iter().fold(0u8, |n, c| n.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-")?;
            Some(Mount {
                root: unescape(f.get(3)?),
                point: PathBuf::from(unescape(f.get(4)?)),
                fstype: (*f.get(sep + 1)?).to_owned(),
                options: f.get(sep + 3)?.split(',').map(str::to_owned).collect(),
            })
        })
        .collect()
}

/// /proc/self/cgroup as (hierarchy id, controllers, path).
fn parse_proc_cgroup(text: &str) -> Vec<(String, String, String)> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.splitn(3, ':');
            Some((
                f.next()?.to_owned(),
                f.next()?.to_owned(),
                f.next()?.to_owned(),
            ))
        })
        .collect()
}

/// The directory of cgroup `path` in the hierarchy mounted as `m` (whose mount may show
/// only a subtree).
fn member_dir(m: &Mount, path: &str) -> Option<PathBuf> {
    let rel = Path::new(path).strip_prefix(&m.root).ok()?;
    Some(m.point.join(rel))
}

fn read_words(p: &Path) -> Vec<String> {
    fs::read_to_string(p)
        .map(|s| s.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Finds where a group for `ctrl` goes: cgroup v1 if the controller's hierarchy is
/// mounted (then the controller is not on v2), else cgroup v2 if it offers it there.
fn place(ctrl: Controller) -> Result<Place> {
    let read = |p: &str| fs::read_to_string(p).map_err(|e| Error::io(p, "read", None, e));
    let mountinfo = read("/proc/self/mountinfo")?;
    let place = place_in(ctrl, &mountinfo, &read("/proc/self/cgroup")?, &read_words)?;
    let probe_file = place.home.join("blkio.throttle.read_iops_device");
    if let (Controller::Io, Version::V1) = (ctrl, place.version) {
        if !probe_file.exists() {
            return Err(Error::Invalid(format!(
                "{}: missing; this kernel's blkio controller has no throttle \
                 (CONFIG_BLK_DEV_THROTTLING)",
                probe_file.display()
            )));
        }
    }
    Ok(place)
}

/// [`place`] from the texts of /proc/self/mountinfo and /proc/self/cgroup, with `words`
/// reading a cgroup file's words.
fn place_in(
    ctrl: Controller,
    mountinfo: &str,
    proc_cgroup: &str,
    words: &dyn Fn(&Path) -> Vec<String>,
) -> Result<Place> {
    let mounts = parse_mountinfo(mountinfo);
    let groups = parse_proc_cgroup(proc_cgroup);
    let v1 = mounts
        .iter()
        .find(|m| m.fstype == "cgroup" && m.options.iter().any(|o| o == ctrl.v1()));
    if let Some(m) = v1 {
        let path = groups
            .iter()
            .find(|(_, c, _)| c.split(',').any(|c| c == ctrl.v1()))
            .map(|(_, _, p)| p.as_str());
        let home = path.and_then(|p| member_dir(m, p)).ok_or_else(|| {
            Error::Invalid(format!(
                "/proc/self/cgroup: this process's '{}' group is not visible under {}",
                ctrl.v1(),
                m.point.display()
            ))
        })?;
        return Ok(Place {
            version: Version::V1,
            parent: home.clone(),
            home,
            enable: None,
        });
    }
    let none = |v2: String| {
        Error::Invalid(format!(
            "no cgroup '{}' controller here: no cgroup v1 '{}' hierarchy is mounted (see \
             /proc/self/mountinfo) and {v2}",
            ctrl.v2(),
            ctrl.v1()
        ))
    };
    let Some(m) = mounts.iter().find(|m| m.fstype == "cgroup2") else {
        return Err(none("no cgroup v2 hierarchy is mounted".into()));
    };
    let home = groups
        .iter()
        .find(|(id, c, _)| id == "0" && c.is_empty())
        .and_then(|(_, _, p)| member_dir(m, p))
        .ok_or_else(|| {
            none(format!(
                "this process's group is not visible under {}",
                m.point.display()
            ))
        })?;
    let controllers = home.join("cgroup.controllers");
    let offered = words(&controllers);
    if !offered.iter().any(|c| c == ctrl.v2()) {
        return Err(none(format!(
            "{} offers only: {}",
            controllers.display(),
            if offered.is_empty() {
                "nothing".to_owned()
            } else {
                offered.join(" ")
            }
        )));
    }
    if home == m.point {
        // The root may hold processes and enable controllers at once.
        let subtree = home.join("cgroup.subtree_control");
        let enabled = words(&subtree).iter().any(|c| c == ctrl.v2());
        Ok(Place {
            version: Version::V2,
            parent: home.clone(),
            enable: (!enabled).then_some(subtree),
            home,
        })
    } else {
        // A non-root v2 group with processes cannot have children with controllers (the
        // no-internal-process rule), so the group is made beside it: its parent already
        // enables the controller, since this group is offered it.
        let parent = home.parent().unwrap_or(&home).to_path_buf();
        Ok(Place {
            version: Version::V2,
            parent,
            home,
            enable: None,
        })
    }
}

/// The pid in a `riffle-emu-<pid>-<n>` group name.
fn owner_pid(name: &str) -> Option<u32> {
    name.strip_prefix("riffle-emu-")?
        .split_once('-')?
        .0
        .parse()
        .ok()
}

/// Removes groups left in `parent` by riffle processes that died without dropping their
/// guard. A group that still holds processes (children of the dead owner) stays: the
/// kernel refuses to remove it.
fn remove_stale(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let Some(owner) = owner_pid(&e.file_name().to_string_lossy()) else {
            continue;
        };
        if !Path::new("/proc").join(owner.to_string()).exists() {
            let _ = fs::remove_dir(e.path());
        }
    }
}

/// A cgroup this process made and moved into; dropping it moves back and removes it.
#[derive(Debug)]
struct Group {
    dir: PathBuf,
    home: PathBuf,
    /// A v2 `cgroup.subtree_control` and what undoes our change to it.
    undo: Option<(PathBuf, String)>,
}

impl Group {
    /// Makes a group for `ctrl`, writes `settings(version)` into it and moves this process
    /// in. On error everything done so far is undone (by `Drop`).
    fn enter(
        ctrl: Controller,
        settings: &dyn Fn(Version) -> Vec<(&'static str, String)>,
    ) -> Result<Group> {
        let place = place(ctrl)?;
        remove_stale(&place.parent);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = place
            .parent
            .join(format!("riffle-emu-{}-{n}", std::process::id()));
        fs::create_dir(&dir).map_err(|e| Error::io(&dir, "create cgroup", None, e))?;
        let mut group = Group {
            dir,
            home: place.home,
            undo: None,
        };
        if let Some(subtree) = place.enable {
            write(&subtree, &format!("+{}", ctrl.v2()))?;
            group.undo = Some((subtree, format!("-{}", ctrl.v2())));
        }
        for (file, value) in settings(place.version) {
            write(&group.dir.join(file), &value)?;
        }
        write(
            &group.dir.join("cgroup.procs"),
            &std::process::id().to_string(),
        )?;
        Ok(group)
    }

    /// Moves every process still in the group back home (this one, and children started
    /// under it that still run), then removes the group.
    fn remove(&mut self) -> Result<()> {
        let home = self.home.join("cgroup.procs");
        let me = std::process::id().to_string();
        let mut pids = vec![me.clone()];
        pids.extend(
            read_words(&self.dir.join("cgroup.procs"))
                .into_iter()
                .filter(|p| *p != me),
        );
        for pid in pids {
            match fs::write(&home, &pid) {
                Ok(()) => {}
                // Gone meanwhile, or (this process) never moved in.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => return Err(Error::io(&home, "write", None, e)),
            }
        }
        // Exiting threads (io_uring workers) leave the group a moment after the process
        // has moved; until then rmdir says EBUSY.
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match fs::remove_dir(&self.dir) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => return Err(Error::io(&self.dir, "remove cgroup", None, e)),
            }
        }
        if let Some((subtree, value)) = self.undo.take() {
            // Best effort: other groups may still use the controller.
            let _ = fs::write(subtree, value);
        }
        Ok(())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            eprintln!(
                "riffle: warning: {e}; remove it by hand with rmdir {}",
                self.dir.display()
            );
        }
    }
}

fn write(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value).map_err(|e| Error::BadInput {
        path: path.into(),
        offset: None,
        what: format!("writing '{value}' failed: {e}"),
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

    const MOUNTINFO: &str = "\
24 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 29 0:26 / /sys/fs/cgroup/unified rw,relatime shared:5 - cgroup2 cgroup2 rw
31 29 0:27 / /sys/fs/cgroup/blkio rw,relatime shared:6 - cgroup cgroup rw,blkio
32 29 0:28 /lxc/c1 /sys/fs/cgroup/memory\\040x rw,relatime shared:7 - cgroup cgroup rw,memory
";

    #[test]
    fn parses_mountinfo_with_escapes_and_subtree_roots() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.len(), 4);
        assert_eq!(m[1].fstype, "cgroup2");
        assert_eq!(m[2].options, ["rw", "blkio"]);
        assert_eq!(m[3].point, Path::new("/sys/fs/cgroup/memory x"));
        assert_eq!(
            member_dir(&m[3], "/lxc/c1/job").unwrap(),
            Path::new("/sys/fs/cgroup/memory x/job")
        );
        assert_eq!(member_dir(&m[3], "/other"), None);
        assert_eq!(
            member_dir(&m[2], "/").unwrap(),
            Path::new("/sys/fs/cgroup/blkio")
        );
    }

    #[test]
    fn parses_proc_cgroup() {
        let g = parse_proc_cgroup("7:blkio:/\n4:memory:/a/b\n3:cpu,cpuacct:/\n0::/user.slice\n");
        assert_eq!(g[1], ("4".into(), "memory".into(), "/a/b".into()));
        assert_eq!(g[3], ("0".into(), String::new(), "/user.slice".into()));
    }

    const V2_ONLY: &str = "\
24 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 29 0:26 / /sys/fs/cgroup rw,relatime shared:5 - cgroup2 cgroup2 rw,nsdelegate
";

    /// Cgroup files as a map from path to contents, for [`place_in`].
    fn files(map: &[(&str, &str)]) -> impl Fn(&Path) -> Vec<String> {
        let map: Vec<(PathBuf, String)> = map
            .iter()
            .map(|(p, c)| (PathBuf::from(p), c.to_string()))
            .collect();
        move |p: &Path| {
            map.iter()
                .find(|(q, _)| q == p)
                .map(|(_, c)| c.split_whitespace().map(str::to_owned).collect())
                .unwrap_or_default()
        }
    }

    #[test]
    fn v1_groups_go_inside_the_current_group() {
        let cg = "7:blkio:/jobs/a\n4:memory:/lxc/c1/m\n0::/\n";
        let p = place_in(Controller::Io, MOUNTINFO, cg, &files(&[])).unwrap();
        assert_eq!(p.version, Version::V1);
        assert_eq!(p.home, Path::new("/sys/fs/cgroup/blkio/jobs/a"));
        assert_eq!(p.parent, p.home);
        let p = place_in(Controller::Memory, MOUNTINFO, cg, &files(&[])).unwrap();
        assert_eq!(p.home, Path::new("/sys/fs/cgroup/memory x/m"));
    }

    #[test]
    fn v2_groups_go_beside_a_non_root_group_or_under_the_root() {
        let cg = "0::/user.slice/session-1.scope\n";
        let scope = "/sys/fs/cgroup/user.slice/session-1.scope";
        let f = files(&[(&format!("{scope}/cgroup.controllers"), "cpu io memory pids")]);
        let p = place_in(Controller::Io, V2_ONLY, cg, &f).unwrap();
        assert_eq!(p.version, Version::V2);
        assert_eq!(p.home, Path::new(scope));
        assert_eq!(p.parent, Path::new("/sys/fs/cgroup/user.slice"));
        assert_eq!(p.enable, None);

        let f = files(&[
            ("/sys/fs/cgroup/cgroup.controllers", "cpu io memory"),
            ("/sys/fs/cgroup/cgroup.subtree_control", "memory"),
        ]);
        let p = place_in(Controller::Io, V2_ONLY, "0::/\n", &f).unwrap();
        assert_eq!(p.parent, Path::new("/sys/fs/cgroup"));
        assert_eq!(
            p.enable.as_deref(),
            Some(Path::new("/sys/fs/cgroup/cgroup.subtree_control"))
        );
        let p = place_in(Controller::Memory, V2_ONLY, "0::/\n", &f).unwrap();
        assert_eq!(p.enable, None, "memory is enabled already");
    }

    #[test]
    fn no_controller_is_a_clear_error() {
        // This machine's layout: blkio on v1 is not mounted here, v2 offers only hugetlb.
        let mounts = "30 29 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        let f = files(&[("/sys/fs/cgroup/unified/cgroup.controllers", "hugetlb")]);
        let err = place_in(Controller::Io, mounts, "0::/\n", &f)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("'blkio'")
                && err.contains("/sys/fs/cgroup/unified/cgroup.controllers offers only: hugetlb"),
            "{err}"
        );
        let err = place_in(Controller::Io, "", "", &f)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no cgroup v2 hierarchy is mounted"), "{err}");
    }

    #[test]
    fn group_names_carry_their_owner() {
        assert_eq!(owner_pid("riffle-emu-1234-0"), Some(1234));
        assert_eq!(owner_pid("riffle-emu-x-0"), None);
        assert_eq!(owner_pid("system.slice"), None);
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
            eprintln!("skipped: {} is on no block device", here.display());
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
