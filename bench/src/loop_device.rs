//! A memory-speed block device for benchmarks: a file in /dev/shm, a loop device over it
//! with direct I/O, ext4 on that, mounted; removed on every path that unwinds.

use std::ffi::OsStr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

/// The tmpfs the device's file lives in.
pub const SHM: &str = "/dev/shm";
/// What every file and directory a device is made of is named after (then the owner's pid
/// and a counter).
const PREFIX: &str = "riffle-loop-";

/// The programs a device is made and removed with, and the Debian/Ubuntu package of each.
const TOOLS: [(&str, &str); 4] = [
    ("losetup", "mount"),
    ("mkfs.ext4", "e2fsprogs"),
    ("mount", "mount"),
    ("umount", "mount"),
];

/// Why a [`LoopDevice`] cannot be made here (not root, a tool or /dev/shm missing), each
/// reason with what to do, or none.
pub fn missing() -> Vec<String> {
    let mut why = Vec::new();
    if !nix::unistd::geteuid().is_root() {
        why.push(
            "it needs root (it makes a loop device, a file system on it and a mount); run it \
             with sudo"
                .to_owned(),
        );
    }
    for (name, package) in TOOLS {
        if tool(name).is_none() {
            why.push(format!(
                "{name} is not installed; install it with `apt-get install -y {package}`"
            ));
        }
    }
    if !Path::new(SHM).is_dir() {
        why.push(format!(
            "{SHM} is missing (the tmpfs the device's file goes in)"
        ));
    }
    why
}

/// Where `name` is installed: on `PATH`, or in the sbin directories a user's `PATH` may
/// leave out.
pub fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Runs `name` with `args`; its standard output, trimmed, or an error with its standard
/// error.
fn command<I, S>(name: &str, args: I) -> Result<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let path = tool(name).ok_or_else(|| anyhow!("{name} is not installed"))?;
    let args: Vec<S> = args.into_iter().collect();
    let shown = args
        .iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let out = std::process::Command::new(&path)
        .args(&args)
        .output()
        .with_context(|| format!("running {name} {shown}"))?;
    if !out.status.success() {
        bail!(
            "{name} {shown}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A memory-speed block device: a file in /dev/shm, a loop device over it with direct I/O
/// and 512 B sectors, ext4 on that, mounted on a new directory in the temp directory.
///
/// Each step is recorded as it succeeds, and dropping the guard undoes exactly those,
/// whether the run ended well, with an error (`?`) or a panic: unmount (lazily when a file
/// is still open under the mount, so the mount goes with the last file), detach the loop
/// device (marked to detach itself when still busy), remove the file and the mount point.
/// What cannot be undone is said on stderr. Names carry the owner's pid, and a device whose
/// owner is gone (a run killed before its drop) is removed by the next [`LoopDevice::create`].
#[derive(Debug)]
pub struct LoopDevice {
    image: PathBuf,
    image_made: bool,
    dev: Option<PathBuf>,
    mount: PathBuf,
    mount_made: bool,
    mounted: bool,
}

impl LoopDevice {
    /// A device of `size` bytes (the memory is taken as it is written).
    pub fn create(size: u64) -> Result<LoopDevice> {
        Self::create_in(Path::new(SHM), &std::env::temp_dir(), size)
    }

    fn create_in(shm: &Path, tmp: &Path, size: u64) -> Result<LoopDevice> {
        reclaim_stale(shm, tmp);
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        Self::make(shm.join(format!("{name}.img")), tmp.join(&name), size)
    }

    /// The device with its file at `image`, mounted at `mount` (made here).
    fn make(image: PathBuf, mount: PathBuf, size: u64) -> Result<LoopDevice> {
        let mut d = LoopDevice {
            image,
            image_made: false,
            dev: None,
            mount,
            mount_made: false,
            mounted: false,
        };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&d.image)
            .with_context(|| format!("{}: cannot create", d.image.display()))?;
        d.image_made = true;
        file.set_len(size)
            .with_context(|| format!("{}: cannot size", d.image.display()))?;
        drop(file);
        let dev = command(
            "losetup",
            [
                OsStr::new("--find"),
                OsStr::new("--show"),
                OsStr::new("--direct-io=on"),
                OsStr::new("--sector-size=512"),
                d.image.as_os_str(),
            ],
        )?;
        if !dev.starts_with("/dev/") {
            bail!("losetup named no device: '{dev}'");
        }
        let dev = PathBuf::from(dev);
        d.dev = Some(dev.clone());
        // Inode tables and journal written now, not by a kernel thread during the runs.
        command(
            "mkfs.ext4",
            [
                OsStr::new("-q"),
                OsStr::new("-F"),
                OsStr::new("-E"),
                OsStr::new("lazy_itable_init=0,lazy_journal_init=0,nodiscard"),
                dev.as_os_str(),
            ],
        )?;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&d.mount)
            .with_context(|| format!("{}: cannot create", d.mount.display()))?;
        d.mount_made = true;
        command("mount", [dev.as_os_str(), d.mount.as_os_str()])?;
        d.mounted = true;
        Ok(d)
    }

    /// The file in /dev/shm.
    pub fn image(&self) -> &Path {
        &self.image
    }

    /// The loop device (`/dev/loopN`).
    pub fn device(&self) -> &Path {
        self.dev
            .as_deref()
            .expect("a created device has its loop device")
    }

    /// Where its file system is mounted.
    pub fn mount_point(&self) -> &Path {
        &self.mount
    }

    /// A file of the loop device's sysfs directory (`loop/dio`, `queue/logical_block_size`).
    pub fn sysfs(&self, file: &str) -> Option<String> {
        let name = self
            .dev
            .as_ref()?
            .file_name()?
            .to_string_lossy()
            .into_owned();
        std::fs::read_to_string(format!("/sys/block/{name}/{file}"))
            .ok()
            .map(|s| s.trim().to_owned())
    }

    /// Removes everything now; an error says what could not be undone.
    pub fn close(mut self) -> Result<()> {
        let errors = self.remove();
        // Said here, so the drop does not try (and say) it again.
        (self.image_made, self.mount_made, self.mounted) = (false, false, false);
        if errors.is_empty() {
            Ok(())
        } else {
            bail!("removing the fast device: {}", errors.join("; "))
        }
    }

    /// Undoes what was made, last first; what failed, in words.
    fn remove(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        let mut lazy = false;
        if self.mounted {
            // Files on the mount can stay open for a moment after their last user is gone:
            // an io_uring ring with registered files puts them in a kernel worker after the
            // ring is closed (fio's, or the engine's). So a busy mount is tried again for
            // a while. A file still open after that (a failed run's) makes umount refuse
            // for good; a lazy unmount detaches the mount now and lets it go with its last
            // file.
            let deadline = Instant::now() + Duration::from_secs(2);
            let unmounted = loop {
                match command("umount", [&self.mount]) {
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    Err(e) => {
                        lazy = true;
                        eprintln!(
                            "riffle: {e:#}; unmounting lazily (the loop device goes when the \
                             last file open there is closed)"
                        );
                        break command("umount", [OsStr::new("-l"), self.mount.as_os_str()]);
                    }
                    ok => break ok,
                }
            };
            match unmounted {
                Ok(_) => self.mounted = false,
                Err(e) => errors.push(format!("{e:#}")),
            }
        }
        if self.mount_made && !self.mounted {
            match std::fs::remove_dir(&self.mount) {
                Ok(()) => self.mount_made = false,
                Err(e) => errors.push(format!("{}: {e}", self.mount.display())),
            }
        }
        if !self.mounted {
            if let Some(dev) = self.dev.take() {
                // A device still open (by udev probing it after the unmount, or by a file
                // left open under a lazy unmount) is marked to detach itself when its last
                // user goes. The first passes: wait for it, so that the device is gone when
                // this returns. The second waits for a file someone else holds: not here.
                match command("losetup", [OsStr::new("-d"), dev.as_os_str()]) {
                    Err(e) => errors.push(format!("{e:#}")),
                    Ok(_) if !lazy && !self.detached_within(&dev, Duration::from_secs(10)) => {
                        errors.push(format!(
                            "{} is still attached 10 s after losetup -d (it detaches itself \
                             when its last user goes)",
                            dev.display()
                        ))
                    }
                    Ok(_) => {}
                }
            }
        }
        if self.image_made {
            // A loop device still over it keeps its memory until it is detached.
            match std::fs::remove_file(&self.image) {
                Ok(()) => self.image_made = false,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => self.image_made = false,
                Err(e) => errors.push(format!("{}: {e}", self.image.display())),
            }
        }
        errors
    }
}

impl LoopDevice {
    /// Whether `dev` no longer has this device's file behind it within `limit`.
    fn detached_within(&self, dev: &Path, limit: Duration) -> bool {
        let Some(name) = dev.file_name() else {
            return true;
        };
        let backing = Path::new("/sys/block").join(name).join("loop/backing_file");
        let ours = self.image.to_string_lossy().into_owned();
        let deadline = Instant::now() + limit;
        loop {
            let attached = std::fs::read_to_string(&backing).is_ok_and(|b| b.starts_with(&ours));
            if !attached {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        for e in self.remove() {
            eprintln!("riffle: cleaning up the loop device: {e}");
        }
    }
}

/// Whether `path` is a mount point in this process's mount namespace.
fn is_mounted(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.to_string_lossy();
    info.lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|m| m == want))
}

/// The loop devices over `image` (`losetup -j`).
fn loops_over(image: &Path) -> Vec<PathBuf> {
    command(
        "losetup",
        [
            OsStr::new("--list"),
            OsStr::new("--noheadings"),
            OsStr::new("--output=NAME"),
            OsStr::new("--associated"),
            image.as_os_str(),
        ],
    )
    .map(|out| out.lines().map(|l| PathBuf::from(l.trim())).collect())
    .unwrap_or_default()
}

/// Removes the devices of runs that were killed before their guard's drop (the pid in the
/// name is gone): their mount, loop device, file and mount point.
fn reclaim_stale(shm: &Path, tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(shm) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".img").filter(|s| s.starts_with(PREFIX)) else {
            continue;
        };
        let Some(pid) = stem[PREFIX.len()..]
            .split('-')
            .next()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let mount = tmp.join(stem);
        eprintln!(
            "riffle: removing the loop device {} of process {pid}, which is gone",
            e.path().display()
        );
        let mut loops = loops_over(&e.path());
        // One guard per loop device over the file (normally one); the last removes the file.
        let first = loops.pop();
        for dev in loops {
            drop(LoopDevice {
                image: e.path(),
                image_made: false,
                dev: Some(dev),
                mount: mount.clone(),
                mount_made: false,
                mounted: false,
            });
        }
        drop(LoopDevice {
            image: e.path(),
            image_made: true,
            dev: first,
            mounted: is_mounted(&mount),
            mount_made: mount.is_dir(),
            mount,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Why the device tests cannot run here, or `None`.
    fn cannot_make_devices() -> Option<String> {
        if !nix::unistd::geteuid().is_root() {
            return Some("not root: making a loop device and mounting it needs root".into());
        }
        TOOLS
            .iter()
            .find(|(t, _)| tool(t).is_none())
            .map(|(t, p)| format!("{t} is not installed (apt-get install -y {p})"))
    }

    /// Whether a loop device is over `image` (`losetup -a` names it, `(deleted)` or not).
    fn attached(image: &Path) -> bool {
        let all = command("losetup", ["-a"]).unwrap_or_default();
        all.contains(&*image.to_string_lossy())
    }

    /// Whether every loop device over `image` is gone within two seconds (one marked to
    /// detach itself goes when its last user does, not at once).
    fn detached(image: &Path) -> bool {
        let deadline = Instant::now() + Duration::from_secs(2);
        while attached(image) {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Everything the device made is gone: mount, loop device, file, mount point.
    fn assert_gone(image: &Path, mount: &Path) {
        assert!(!is_mounted(mount), "{} is still mounted", mount.display());
        assert!(!mount.exists(), "{} is still there", mount.display());
        assert!(!image.exists(), "{} is still there", image.display());
        assert!(
            detached(image),
            "losetup -a still lists {}",
            image.display()
        );
    }

    const SMALL: u64 = 64 << 20;

    /// The device tests one at a time (`losetup --find` in two processes at once can race
    /// for the same free device), or `None`, the skip counted, when they cannot run.
    fn devices() -> Option<std::sync::MutexGuard<'static, ()>> {
        static DEVICES: std::sync::Mutex<()> = std::sync::Mutex::new(());
        if let Some(why) = cannot_make_devices() {
            riffle::testing::skip(&why);
            return None;
        }
        Some(DEVICES.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// An error returned with `?` while the device is in use removes all of it.
    #[test]
    fn an_error_removes_the_device() {
        let Some(_devices) = devices() else { return };
        let mut made = None;
        let result = (|| -> Result<()> {
            let d = LoopDevice::create(SMALL)?;
            made = Some((d.image().to_owned(), d.mount_point().to_owned()));
            assert!(is_mounted(d.mount_point()));
            assert!(attached(d.image()));
            std::fs::write(d.mount_point().join("x"), b"data")?;
            Err(anyhow!("a failure in the middle of a run"))
        })();
        assert!(result.is_err());
        let (image, mount) = made.expect("the device was made");
        assert_gone(&image, &mount);
    }

    /// A panic while the device is in use removes all of it as the stack unwinds.
    #[test]
    fn a_panic_removes_the_device() {
        let Some(_devices) = devices() else { return };
        let made = std::sync::Mutex::new(None);
        let result = std::panic::catch_unwind(|| {
            let d = LoopDevice::create(SMALL).unwrap();
            *made.lock().unwrap() = Some((d.image().to_owned(), d.mount_point().to_owned()));
            panic!("a panic in the middle of a run");
        });
        assert!(result.is_err());
        let (image, mount) = made.into_inner().unwrap().expect("the device was made");
        assert_gone(&image, &mount);
    }

    /// A file left open under the mount makes umount refuse: the mount is detached lazily
    /// at once, and the loop device goes when the file is closed.
    #[test]
    fn a_busy_mount_goes_with_its_last_file() {
        let Some(_devices) = devices() else { return };
        let d = LoopDevice::create(SMALL).unwrap();
        let (image, mount) = (d.image().to_owned(), d.mount_point().to_owned());
        let open = std::fs::File::create(mount.join("open")).unwrap();
        d.close().unwrap();
        assert!(!is_mounted(&mount), "the mount was not detached");
        assert!(!mount.exists());
        assert!(!image.exists());
        drop(open);
        assert!(
            detached(&image),
            "the loop device stayed after its last file was closed"
        );
    }

    /// A step that fails half way (mkfs.ext4 on a device too small for ext4) undoes the
    /// steps before it: the loop device is detached and the file removed.
    #[test]
    fn a_failed_mkfs_removes_the_loop_device() {
        let Some(_devices) = devices() else { return };
        let name = format!("{PREFIX}{}-too-small", std::process::id());
        let (image, mount) = (Path::new(SHM).join(&name), std::env::temp_dir().join(&name));
        let e = LoopDevice::make(image.clone(), mount.clone(), 4096).unwrap_err();
        assert!(format!("{e:#}").contains("mkfs.ext4"), "{e:#}");
        assert_gone(&image, &mount);
    }

    /// A device whose owner died without its drop (forgotten here, as a killed run leaves
    /// it: mounted, attached, its file in place) is removed by the next run.
    #[test]
    fn a_dead_runs_device_is_removed_by_the_next() {
        let Some(_devices) = devices() else { return };
        // A pid above any pid_max, so never a live process.
        let name = format!("{PREFIX}4294967295-{}", std::process::id());
        let (shm, tmp) = (Path::new(SHM), std::env::temp_dir());
        let d = LoopDevice::make(shm.join(format!("{name}.img")), tmp.join(&name), SMALL).unwrap();
        let (image, mount) = (d.image().to_owned(), d.mount_point().to_owned());
        std::mem::forget(d);
        assert!(is_mounted(&mount) && attached(&image));
        reclaim_stale(shm, &tmp);
        assert_gone(&image, &mount);
    }
}
