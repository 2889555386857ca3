//! A reader run as a child process of its own: its stdout and stderr collected, a callback
//! every 20 ms while it runs (to sample memory or disk), killed with its whole process
//! group past a time limit, and its last JSON line taken as its result.

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Runs `cmd` in a process group of its own to its end, calling `tick` every 20 ms; past
/// `limit` the group is killed and the run is an error saying it hung. Whatever the child
/// left behind in its group (DataLoader workers) goes with it. Returns its status, stdout
/// and stderr.
pub fn run(
    cmd: &mut Command,
    limit: Duration,
    tick: &mut dyn FnMut(),
) -> Result<(ExitStatus, String, String)> {
    use std::os::unix::process::CommandExt;
    let mut child = cmd
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start the reader")?;
    let pipe = |p: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut p) = p {
                let _ = p.read_to_string(&mut s);
            }
            s
        })
    };
    let out = pipe(child.stdout.take().map(|p| Box::new(p) as _));
    let err = pipe(child.stderr.take().map(|p| Box::new(p) as _));
    let group = nix::unistd::Pid::from_raw(child.id() as i32);
    let started = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        tick();
        if started.elapsed() > limit {
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
            bail!("hung: stopped after {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    Ok((
        status,
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    ))
}

/// A finished run's result: its last JSON line on stdout, or why it failed (its last line
/// on stderr and its status).
pub fn json_result(status: ExitStatus, out: &str, err: &str) -> Result<serde_json::Value> {
    if !status.success() {
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        bail!("{} ({status})", last.trim());
    }
    let line = out.lines().rev().find(|l| l.starts_with('{')).unwrap_or("");
    serde_json::from_str(line).with_context(|| format!("no JSON result in {out:?}"))
}
