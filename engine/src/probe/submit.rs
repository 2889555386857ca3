//! How a read submits its requests on a device: each at once, or all queued ones with the
//! next wait (one `io_uring_enter` per wait instead of one per request).
//!
//! Measured (docs/issue34.md): on a memory-speed device (a loop device over /dev/shm, 8 us
//! at QD 1) submitting at each wait cuts the CPU per 4 KiB read by about a third, the
//! system call per request being most of it; on the virtio disk (26-42 us at QD 1, and it
//! completes requests in bursts of ~50) it holds a burst's refills back while the burst is
//! handled and loses 12-16% of the records/s. So the choice follows the device: from its
//! cached profile's QD 1 latency when there is one, else from sysfs (a RAM disk, pmem, zram
//! or a loop device whose backing file lies in memory), else each at once.

use std::path::Path;

use serde::Serialize;

use crate::device::{self, DeviceId};
use crate::io::{SUBMIT_AT_WAIT, SUBMIT_AUTO};

/// A device whose 4 KiB reads take less than this at QD 1 (p50, from its cached profile) is
/// memory-speed: its requests are submitted at each wait. Between the two devices measured:
/// 8 us (memory-speed, a gain) and 26-42 us (the virtio disk, a loss).
pub const AT_WAIT_BELOW_US: f64 = 15.0;

/// How a read's requests are submitted, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SubmitChoice {
    /// [`crate::io::IoConfig::submit_batch`]: 1, a batch, or [`SUBMIT_AT_WAIT`].
    pub batch: usize,
    /// Why, for reports (`riffle read --json`: `io_submit`).
    pub why: String,
}

impl SubmitChoice {
    /// The batch as a person reads it.
    pub fn shown(&self) -> String {
        match self.batch {
            SUBMIT_AT_WAIT => "at each wait".into(),
            1 => "each at once".into(),
            n => format!("{n} at a time"),
        }
    }
}

/// The choice for a read of files on the device holding `path`, unless `asked` (the
/// caller's [`crate::io::IoConfig::submit_batch`]) is not [`SUBMIT_AUTO`]. `RIFFLE_URING`'s
/// `batch=N` or `batch=wait` overrides both.
pub fn submit_choice(path: &Path, asked: usize) -> SubmitChoice {
    if let Some(choice) = from_env(&std::env::var("RIFFLE_URING").unwrap_or_default()) {
        return choice;
    }
    if asked != SUBMIT_AUTO {
        return SubmitChoice {
            batch: asked,
            why: "as asked".into(),
        };
    }
    let Ok(dev) = device::identify(path) else {
        return at_once("the device could not be identified");
    };
    let emulated = crate::emulate::active(&dev);
    if let Some((profile, _)) = super::load_cached(&dev, true, emulated) {
        if let Some(p) = profile.random_point(4096, 1) {
            let lat = p.lat_p50_us;
            return if lat < AT_WAIT_BELOW_US {
                SubmitChoice {
                    batch: SUBMIT_AT_WAIT,
                    why: format!(
                        "the device answers a 4 KiB read in {lat:.1} us at QD 1 (its cached \
                         profile; below {AT_WAIT_BELOW_US} us)"
                    ),
                }
            } else {
                at_once(&format!(
                    "the device answers a 4 KiB read in {lat:.1} us at QD 1 (its cached \
                     profile; {AT_WAIT_BELOW_US} us or more)"
                ))
            };
        }
    }
    if emulated.is_some() {
        return at_once("an emulated device class");
    }
    match memory_backed(&dev) {
        Some(what) => SubmitChoice {
            batch: SUBMIT_AT_WAIT,
            why: format!("a memory-speed device: {what} (sysfs; no cached profile)"),
        },
        None => at_once("no cached profile, and sysfs names no memory-backed device"),
    }
}

fn at_once(why: &str) -> SubmitChoice {
    SubmitChoice {
        batch: 1,
        why: why.into(),
    }
}

/// `batch=N` or `batch=wait` among the comma-separated knobs of `RIFFLE_URING`.
fn from_env(knobs: &str) -> Option<SubmitChoice> {
    let v = knobs
        .split(',')
        .find_map(|k| k.trim().strip_prefix("batch="))?;
    let batch = match v {
        "wait" => SUBMIT_AT_WAIT,
        n => n.parse::<usize>().ok().filter(|&n| n > 0)?,
    };
    Some(SubmitChoice {
        batch,
        why: format!("RIFFLE_URING=batch={v}"),
    })
}

/// What makes the disk of `dev` memory-backed, if it is: a RAM disk (`ram*`, brd), pmem,
/// zram, or a loop device whose backing file is on a memory filesystem.
fn memory_backed(dev: &DeviceId) -> Option<String> {
    let name = dev.name.as_deref()?;
    if ["ram", "pmem", "zram"].iter().any(|p| name.starts_with(p)) {
        return Some(format!("{name} is a memory block device"));
    }
    if !name.starts_with("loop") {
        return None;
    }
    let backing = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    let backing = Path::new(backing.trim());
    // A deleted backing file reads "(deleted)" after its name: its directory still says.
    let dir = backing.parent()?;
    let fs = device::fs_type(dir);
    device::is_memory_fs(&fs).then(|| format!("{name} over {} on {fs}", backing.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_names_a_batch_or_the_wait() {
        assert_eq!(
            from_env("nofixedbufs,batch=wait").unwrap().batch,
            SUBMIT_AT_WAIT
        );
        assert_eq!(from_env("batch=16").unwrap().batch, 16);
        assert_eq!(from_env("batch=1,nofixedfiles").unwrap().batch, 1);
        assert_eq!(from_env("nofixedbufs"), None);
        assert_eq!(from_env("batch=0"), None);
        assert_eq!(from_env("batch=lots"), None);
    }

    #[test]
    fn a_chosen_batch_is_kept_and_a_disk_file_is_read_each_at_once_or_by_its_profile() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        if std::env::var("RIFFLE_URING").is_ok_and(|k| k.contains("batch=")) {
            crate::testing::skip("RIFFLE_URING sets a batch, which overrides every choice");
            return;
        }
        assert_eq!(submit_choice(dir, 16).batch, 16);
        assert_eq!(submit_choice(dir, SUBMIT_AT_WAIT).batch, SUBMIT_AT_WAIT);
        let auto = submit_choice(dir, SUBMIT_AUTO);
        assert!(auto.batch == 1 || auto.batch == SUBMIT_AT_WAIT, "{auto:?}");
        assert!(!auto.why.is_empty());
    }
}
