//! The per-device profile cache: `$XDG_CACHE_HOME/riffle/profiles/` (or
//! `~/.cache/riffle/profiles/`), one JSON file per device, probe kind and emulated class.

use std::path::PathBuf;

use super::{Profile, PROFILE_VERSION};
use crate::device::DeviceId;
use crate::emulate::DeviceClass;
use crate::{Error, Result};

/// The riffle cache directory.
pub fn cache_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("riffle");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(h).join(".cache/riffle");
    }
    std::env::temp_dir().join("riffle-cache")
}

/// Where the profile of `dev` is cached. Quick and full probes are kept apart, and so are
/// filesystems of one device (tmpfs has no device of its own) and profiles measured under
/// emulation (`<device>@hdd`), which must never stand for the device itself.
pub fn cache_path(dev: &DeviceId, quick: bool, emulated: Option<DeviceClass>) -> PathBuf {
    let kind = if quick { "quick" } else { "full" };
    let class = emulated.map(|c| format!("@{c}")).unwrap_or_default();
    let name = format!(
        "{}-{}{class}-{kind}.json",
        dev.dev.replace(':', "_"),
        dev.fs_type
    );
    cache_dir().join("profiles").join(name)
}

/// The cached profile of `dev` (as emulated as `emulated`, or its own when `None`), if
/// one exists and is current. A full profile also answers for a quick one.
///
/// A caller that runs under a throttle passes the class in force:
/// `load_cached(&dev, quick, riffle::emulate::active(&dev))`.
pub fn load_cached(
    dev: &DeviceId,
    quick: bool,
    emulated: Option<DeviceClass>,
) -> Option<(Profile, PathBuf)> {
    let kinds: &[bool] = if quick { &[true, false] } else { &[false] };
    kinds.iter().find_map(|&q| {
        let p = cache_path(dev, q, emulated);
        // Through the door: a FIFO or device at the name is passed over, never waited on.
        let text = crate::door::read_meta(&p, crate::door::cap::PROFILE, crate::door::Follow::No)
            .ok()??;
        let prof: Profile = serde_json::from_slice(&text).ok()?;
        (prof.version == PROFILE_VERSION && &prof.device == dev && prof.emulated == emulated)
            .then_some((prof, p))
    })
}

/// Writes `profile` to the cache (atomically: a temporary file renamed into place).
pub fn store(profile: &Profile) -> Result<PathBuf> {
    let path = cache_path(&profile.device, profile.quick, profile.emulated);
    let dir = path.parent().expect("cache path has a parent");
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "create directory", None, e))?;
    let text = serde_json::to_string_pretty(profile).expect("profile serialises");
    crate::scratch::write_atomic(&path, text.as_bytes())?;
    Ok(path)
}
