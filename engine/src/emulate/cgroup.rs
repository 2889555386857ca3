//! The cgroup side of emulation: finding where a group for a controller goes (cgroup v1
//! or v2, from /proc/self/mountinfo and /proc/self/cgroup), making it, moving this process
//! in and out, and removing it, including groups left by owners that died.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// Numbers the groups this process makes.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// The cgroup controllers emulation uses.
#[derive(Clone, Copy, Debug)]
pub(super) enum Controller {
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

/// The cgroup interface a group is made with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Version {
    V1,
    V2,
}

/// Where a group for a controller goes.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Place {
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
pub(crate) struct Mount {
    /// The mounted directory of the filesystem (a cgroup path for cgroupfs).
    pub(crate) root: String,
    /// Where it is mounted.
    pub(crate) point: PathBuf,
    pub(crate) fstype: String,
    /// Super options (for cgroup v1, the controllers).
    pub(crate) options: Vec<String>,
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

pub(crate) fn parse_mountinfo(text: &str) -> Vec<Mount> {
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
pub(crate) fn parse_proc_cgroup(text: &str) -> Vec<(String, String, String)> {
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
pub(crate) fn member_dir(m: &Mount, path: &str) -> Option<PathBuf> {
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
pub(super) fn place(ctrl: Controller) -> Result<Place> {
    let read = |p: &str| fs::read_to_string(p).map_err(|e| Error::io(p, "read", None, e));
    let mountinfo = read("/proc/self/mountinfo")?;
    let place = place_in(ctrl, &mountinfo, &read("/proc/self/cgroup")?, &read_words)?;
    let probe_file = place.home.join("blkio.throttle.read_iops_device");
    if let (Controller::Io, Version::V1) = (ctrl, place.version) {
        if !probe_file.exists() {
            return Err(Error::Unsupported(format!(
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
            Error::Unsupported(format!(
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
        Error::Unsupported(format!(
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
pub(super) struct Group {
    pub(super) dir: PathBuf,
}

/// What removing a group takes: kept in [`LIVE`] from the moment the group exists, so that
/// the signal path ([`remove_all`]) can remove it while its owner is still running.
#[derive(Debug)]
struct Made {
    dir: PathBuf,
    home: PathBuf,
    /// A v2 `cgroup.subtree_control` and what undoes our change to it.
    undo: Option<(PathBuf, String)>,
}

/// Every group this process has made and not removed. The lock is held while a group is
/// removed (by its guard or by [`remove_all`]), so a removal is never cut short by the
/// other path: a signal waits for a guard's removal under way, then finds it done.
static LIVE: Mutex<Vec<Made>> = Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<Made>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Moves this process back out of every group it made and removes them, for the binary's
/// signal thread just before it exits (a guard's `Drop` never runs then). Returns how many
/// were removed; a failure is reported on stderr, best effort, naming the group.
pub(super) fn remove_all() -> usize {
    let mut live = live();
    let mut removed = 0;
    for mut made in live.drain(..).rev() {
        match made.remove() {
            Ok(()) => removed += 1,
            Err(e) => warn_left(&e, &made.dir),
        }
    }
    removed
}

/// Says, best effort (a closed stderr must not turn a cleanup into a panic), that a group
/// could not be removed and how to remove it.
fn warn_left(e: &Error, dir: &Path) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "riffle: warning: {e}; remove it by hand with rmdir {}",
        dir.display()
    );
}

impl Group {
    /// Makes a group for `ctrl`, writes `settings(version)` into it and moves this process
    /// in. On error everything done so far is undone (by `Drop`).
    pub(super) fn enter(
        ctrl: Controller,
        settings: &dyn Fn(Version) -> Vec<(&'static str, String)>,
    ) -> Result<Group> {
        let place = place(ctrl)?;
        remove_stale(&place.parent);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = place
            .parent
            .join(format!("riffle-emu-{}-{n}", std::process::id()));
        {
            // Made and recorded under the lock: a signal sees the group as soon as it exists.
            let mut live = live();
            fs::create_dir(&dir).map_err(|e| Error::io(&dir, "create cgroup", None, e))?;
            live.push(Made {
                dir: dir.clone(),
                home: place.home,
                undo: None,
            });
        }
        let group = Group { dir };
        if let Some(subtree) = place.enable {
            write(&subtree, &format!("+{}", ctrl.v2()))?;
            if let Some(made) = live().iter_mut().find(|m| m.dir == group.dir) {
                made.undo = Some((subtree, format!("-{}", ctrl.v2())));
            }
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
}

impl Made {
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
        let mut live = live();
        // Absent when the signal path removed it already.
        let Some(at) = live.iter().position(|m| m.dir == self.dir) else {
            return;
        };
        let mut made = live.remove(at);
        if let Err(e) = made.remove() {
            warn_left(&e, &self.dir);
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
}
