//! What a suite needs beyond riffle itself, checked before it starts, so a machine without
//! it gets one line saying what is missing and how to get it instead of a failure halfway.

use std::process::Command;

/// Why `suite` cannot run on this machine (a tool or Python package it needs is missing),
/// or `None` when it can. Suites not named here need nothing else.
pub fn missing(suite: &str) -> Option<String> {
    match suite {
        "fio-parity" | "probe-check" | "lirs" | "formats" => {
            crate::fio::version().err().map(|e| e.to_string())
        }
        "object-store" => python_module("venv").or_else(|| python_module("ensurepip")),
        "peers" => python_module("venv")
            .or_else(|| python_module("ensurepip"))
            .or_else(|| {
                (!nix::unistd::geteuid().is_root()).then(|| {
                    "it needs root (a memory cgroup per run, and dropping the page cache); run it \
                 with sudo"
                        .to_owned()
                })
            }),
        "fast-device" => crate::fast_device::missing(),
        _ => None,
    }
}

/// Why `suite` is left out of `riffle bench all` here: what [`missing`] says, or, for
/// peers, that its virtual environment is not made yet (`all` never downloads gigabytes;
/// `riffle bench peers` does, once, saying so first).
pub fn missing_in_all(suite: &str) -> Option<String> {
    missing(suite).or_else(|| {
        let venv = crate::peers::venv_dir();
        (suite == "peers" && !crate::peers::venv_ready(&venv)).then(|| {
            format!(
                "its virtual environment ({}) is not made yet: `riffle bench peers` makes it \
                 (torch, MosaicML Streaming, LitData, WebDataset: a few GB, once)",
                venv.display()
            )
        })
    })
}

/// Why `python3 -c "import MODULE"` fails here, or `None` when it works.
pub fn python_module(module: &str) -> Option<String> {
    python_module_with("python3", module)
}

fn python_module_with(python: &str, module: &str) -> Option<String> {
    let out = match Command::new(python)
        .args(["-c", &format!("import {module}")])
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            return Some(format!(
                "{python} is not installed ({e}); install it with `apt-get install -y python3` \
                 and then `pip install {module}`"
            ))
        }
    };
    if out.status.success() {
        return None;
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    Some(format!(
        "{python} cannot import {module} ({}); install it with `pip install {module}`",
        last.trim()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A module that exists is found; one that does not is named with the reason and the
    /// install command; an interpreter that does not exist says so.
    #[test]
    fn python_modules_are_checked() {
        if Command::new("python3").arg("--version").output().is_err() {
            riffle::testing::skip_needed_in_ci("python3 is not installed here");
            return;
        }
        assert_eq!(python_module("json"), None);
        let why = python_module("riffle_no_such_module").expect("missing");
        assert!(why.contains("ModuleNotFoundError"), "{why}");
        assert!(why.contains("pip install riffle_no_such_module"), "{why}");
        let why = python_module_with("riffle-no-such-python", "json").expect("missing");
        assert!(
            why.contains("riffle-no-such-python is not installed"),
            "{why}"
        );
        assert_eq!(missing("scale"), None);
    }
}
