//! The per-device profile cache: `$XDG_CACHE_HOME/riffle/profiles/` (or
//! `~/.cache/riffle/profiles/`), one JSON file per device and probe kind.

use std::path::{Path, PathBuf};

use super::{Profile, PROFILE_VERSION};
use crate::device::DeviceId;
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
/// filesystems of one device (tmpfs has no device of its own).
pub fn cache_path(dev: &DeviceId, quick: bool) -> PathBuf {
    let kind = if quick { "quick" } else { "full" };
    let name = format!("{}-{}-{kind}.json", dev.dev.replace(':', "_"), dev.fs_type);
    cache_dir().join("profiles").join(name)
}

/// The cached profile of the device holding `dir`, if one exists and is current. A full
/// profile also answers for a quick one.
pub fn load_cached(dev: &DeviceId, quick: bool) -> Option<(Profile, PathBuf)> {
    let kinds: &[bool] = if quick { &[true, false] } else { &[false] };
    kinds.iter().find_map(|&q| {
        let p = cache_path(dev, q);
        let text = std::fs::read_to_string(&p).ok()?;
        let prof: Profile = serde_json::from_str(&text).ok()?;
        (prof.version == PROFILE_VERSION && &prof.device == dev).then_some((prof, p))
    })
}

/// Writes `profile` to the cache (atomically: a temporary file renamed into place).
pub fn store(profile: &Profile) -> Result<PathBuf> {
    let path = cache_path(&profile.device, profile.quick);
    let dir = path.parent().expect("cache path has a parent");
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "create directory", None, e))?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let text = serde_json::to_string_pretty(profile).expect("profile serialises");
    std::fs::write(&tmp, text).map_err(|e| Error::io(&tmp, "write", None, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(Path::new(&path), "rename", None, e))?;
    Ok(path)
}
