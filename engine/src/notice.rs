//! One-time notices on stderr.
//!
//! Fallbacks (no io_uring, no O_DIRECT) are announced once per process on stderr, so a
//! user learns why a run is slower than expected without a flood of repeated lines. The
//! same facts are also recorded in run reports by the callers.

use std::collections::HashSet;
use std::sync::Mutex;

static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Prints `riffle: notice: {message}` on stderr the first time `key` is seen in this
/// process; returns whether it printed.
pub fn once(key: &str, message: &str) -> bool {
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    let set = seen.get_or_insert_with(HashSet::new);
    if set.insert(key.to_owned()) {
        eprintln!("riffle: notice: {message}");
        true
    } else {
        false
    }
}
