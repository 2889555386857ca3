//! `riffle serve --user`: this user's node daemon, in its private directory
//! ([`riffle::serve::user`]), started in the background with `--detach` (as riffle.torch
//! starts it), one per directory.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use riffle::serve::user;

use crate::out::outln;

/// Exit status of a daemon that did not start because another serves its directory.
pub const ALREADY_RUNNING: i32 = 3;

/// How long `--detach` waits for the daemon to listen (it opens no dataset before it does).
const START_WAIT: Duration = Duration::from_secs(60);

/// Where a daemon lives: its socket, and for `--user` its directory and starters' lock.
pub struct Place {
    pub socket: PathBuf,
    pub dir: Option<PathBuf>,
}

impl Place {
    /// The socket `--socket` names, or the user daemon's directory made ready.
    pub fn of(socket: Option<&Path>, user: bool, runtime_dir: Option<&Path>) -> Result<Place> {
        if !user {
            let socket = socket.context("--socket is required without --user")?;
            return Ok(Place {
                socket: socket.to_path_buf(),
                dir: None,
            });
        }
        let dir = runtime_dir.map_or_else(user::default_dir, Path::to_path_buf);
        user::prepare_dir(&dir)?;
        Ok(Place {
            socket: dir.join(user::SOCKET),
            dir: Some(dir),
        })
    }

    /// The starters' lock (`--user`).
    pub fn start_lock(&self) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(user::START_LOCK))
    }

    /// Takes the daemon's lock of its directory (`--user`), kept for the process's life;
    /// when another daemon holds it, says so and exits with [`ALREADY_RUNNING`].
    pub fn hold(&self) -> Result<()> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        match user::take_life_lock(dir)? {
            // Held until the process exits.
            Some(lock) => std::mem::forget(lock),
            None => already_running(dir),
        }
        Ok(())
    }
}

/// Says which daemon serves `dir` and exits with [`ALREADY_RUNNING`].
fn already_running(dir: &Path) -> ! {
    eprintln!(
        "riffle serve: another daemon ({}) already serves {}",
        user::holder(dir).unwrap_or_else(|| "pid unknown".into()),
        dir.display()
    );
    std::process::exit(ALREADY_RUNNING);
}

/// `--detach`: starts this command again without `--detach`, in a process group of its
/// own, its stderr the directory's log; returns once it says it listens (printing the
/// socket), or fails with its log's last lines. Exits with [`ALREADY_RUNNING`] when
/// another daemon serves the directory.
pub fn detach(place: &Place) -> Result<()> {
    let dir = place.dir.as_ref().context("--detach goes with --user")?;
    let log_path = dir.join(user::LOG);
    // The log is begun anew only when no daemon runs (its log is its own); one that
    // starts meanwhile keeps it, and the one started here adds why it left.
    let free = user::take_life_lock(dir)?;
    if free.is_none() {
        already_running(dir);
    }
    let log = riffle::door::open_private_log(&log_path)
        .with_context(|| format!("{}: cannot open the daemon's log", log_path.display()))?;
    drop(free);
    let exe = std::env::current_exe().context("finding the riffle command")?;
    let args = std::env::args_os().skip(1).filter(|a| a != "--detach");
    let mut child = Command::new(exe)
        .args(args)
        .arg("--notify-ready")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("starting the daemon")?;
    let out = child.stdout.take().context("the daemon's stdout")?;
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    match rx.recv_timeout(START_WAIT) {
        Ok(line) if line.trim() == "ready" => {
            outln!("{}", place.socket.display())?;
            return Ok(());
        }
        Ok(_) => {}
        Err(_) => {
            let _ = child.kill();
        }
    }
    let status = child.wait().context("waiting for the daemon")?;
    if status.code() == Some(ALREADY_RUNNING) {
        // Another started between the look above and the daemon's own.
        already_running(dir);
    }
    bail!(
        "the daemon did not start ({status}); the end of {}:\n{}",
        log_path.display(),
        tail(&log_path)
    )
}

/// The last lines of a log (at most 4 KiB).
fn tail(path: &Path) -> String {
    let text = riffle::door::read_meta(path, 1 << 20, riffle::door::Follow::No)
        .ok()
        .flatten()
        .unwrap_or_default();
    String::from_utf8_lossy(&text[text.len().saturating_sub(4096)..]).into_owned()
}

/// `--status`: whether the daemon runs, and what it serves. Exits 1 when it does not run.
pub fn status(place: &Place, json: bool) -> Result<()> {
    let dir = place.dir.as_ref().context("--status goes with --user")?;
    let stats = riffle::serve::Client::connect(&place.socket).and_then(|mut c| c.stats());
    let holder = user::holder(dir);
    let Ok(s) = stats else {
        if json {
            let _ = outln!("{}", serde_json::json!({"running": false, "dir": dir}));
        } else {
            let _ = outln!(
                "no riffle node daemon answers at {}",
                place.socket.display()
            );
        }
        std::process::exit(1);
    };
    let datasets: Vec<&str> = s["datasets"]
        .as_array()
        .map(|d| d.iter().filter_map(|d| d["name"].as_str()).collect())
        .unwrap_or_default();
    if json {
        let v = serde_json::json!({
            "running": true,
            "dir": dir,
            "socket": place.socket,
            "daemon": holder,
            "uptime_s": s["uptime_s"],
            "clients": s["clients"],
            "streams_now": s["streams_now"],
            "jobs_now": s["jobs_now"],
            "memory_used": s["memory_used"],
            "memory_limit": s["memory_limit"],
            "datasets": datasets,
            "resident": s["resident"],
            "device_bytes": s["device_bytes"],
        });
        outln!("{v}")?;
        return Ok(());
    }
    let bytes = |k: &str| riffle::size::human_bytes(s[k].as_f64().unwrap_or(0.0));
    outln!(
        "riffle node daemon ({}) at {}: up {:.0} s, {} client(s) besides this one, {} \
         stream(s), {} job(s), memory {} of {}",
        holder.unwrap_or_else(|| "pid unknown".into()),
        place.socket.display(),
        s["uptime_s"].as_f64().unwrap_or(0.0),
        s["clients"].as_u64().unwrap_or(1).saturating_sub(1),
        s["streams_now"],
        s["jobs_now"],
        bytes("memory_used"),
        bytes("memory_limit"),
    )?;
    for d in datasets {
        outln!("  {d}")?;
    }
    for h in s["resident"]["held"].as_array().into_iter().flatten() {
        outln!(
            "  held resident: {} ({}, {}, {} pass(es) using it)",
            h["dataset"].as_str().unwrap_or("?"),
            riffle::size::human_bytes(h["bytes"].as_f64().unwrap_or(0.0)),
            h["state"].as_str().unwrap_or("?"),
            h["users"]
        )?;
    }
    Ok(())
}

/// `--stop`: SIGTERM to the daemon holding the directory's lock (a process of this user),
/// then waits until it has let the lock go.
pub fn stop(place: &Place) -> Result<()> {
    let dir = place.dir.as_ref().context("--stop goes with --user")?;
    let Some(pid) = lock_holder_pid(dir) else {
        outln!("no riffle node daemon runs for {}", dir.display())?;
        return Ok(());
    };
    let me = nix::unistd::geteuid().as_raw();
    let owner = std::fs::metadata(format!("/proc/{pid}")).map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid()
    });
    if owner.ok() != Some(me) {
        bail!(
            "the lock of {} names pid {pid}, not a process of yours",
            dir.display()
        );
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .with_context(|| format!("stopping pid {pid}"))?;
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while lock_holder_pid(dir).is_some() {
        if std::time::Instant::now() > until {
            bail!("pid {pid} did not stop within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    outln!(
        "stopped the riffle node daemon (pid {pid}) of {}",
        dir.display()
    )?;
    Ok(())
}

/// The pid of the daemon holding `dir`'s lock now, if one does.
fn lock_holder_pid(dir: &Path) -> Option<i32> {
    match user::take_life_lock_probe(dir) {
        Ok(true) => None,
        _ => user::holder_pid(dir),
    }
}
