//! Counted skips for tests that cannot run here: shared by the engine's unit tests, the
//! bench's and the integration tests. Not part of the API.
//!
//! A test that finds a capability missing calls [`skip`] or [`skip_needed_in_ci`] and
//! returns. Either prints `SKIPPED <test>: <reason>` and appends the same line to the file
//! named by `RIFFLE_SKIP_LOG` when it is set, so that `scripts/test` counts and lists the
//! skips after the run instead of letting them pass as silent successes. Under
//! `RIFFLE_REQUIRE_ALL=1` (set by `.ci/run`, which installs what such tests need),
//! [`skip_needed_in_ci`] fails the test instead.

use std::io::Write;

pub mod s3;

/// Records that the calling test skipped, with the reason: for a capability that depends on
/// the machine (architecture, filesystem, kernel policy, cgroups), which CI cannot promise.
pub fn skip(why: &str) {
    let line = format!("SKIPPED {}: {why}", test_name());
    eprintln!("{line}");
    if let Some(log) = std::env::var_os("RIFFLE_SKIP_LOG") {
        // O_APPEND and one write per line: lines from concurrent tests and test binaries
        // do not interleave.
        let appended = crate::door::open_append(std::path::Path::new(&log))
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = appended {
            panic!("cannot record the skip in RIFFLE_SKIP_LOG={log:?}: {e}");
        }
    }
}

/// As [`skip`], for a capability `.ci/run` provides (a tool it installs, root, /dev/shm,
/// python3): under `RIFFLE_REQUIRE_ALL=1` its absence fails the test.
#[track_caller]
pub fn skip_needed_in_ci(why: &str) {
    if std::env::var_os("RIFFLE_REQUIRE_ALL").is_some_and(|v| v == "1") {
        panic!(
            "{}: {why}; CI provides this (RIFFLE_REQUIRE_ALL=1)",
            test_name()
        );
    }
    skip(why);
}

/// The running test, as libtest names its thread (`module::test`), after the test binary's
/// name without cargo's hash (`integration`, `riffle`).
fn test_name() -> String {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|s| match s.rsplit_once('-') {
            Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_owned(),
            _ => s,
        })
        .unwrap_or_default();
    format!("{binary} {test}")
}
