//! `riffle serve --socket PATH --dataset NAME=PATH[:FORMAT] ...`: the batch-feeder daemon.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use nix::sys::signal::{SigSet, Signal};
use riffle::dataset::OpenOptions;
use riffle::format::Format;
use riffle::serve::{OnOpen, ServeConfig, ServeMode, Server};

use super::serve_user::Place;
use riffle::size::{human_bytes, parse_size};
use riffle::source::{PathSpec, Source};

#[derive(clap::Args)]
pub struct Args {
    /// The Unix socket to listen on (a stale socket nobody listens on is replaced).
    #[arg(long, required_unless_present = "user", conflicts_with = "user")]
    pub socket: Option<PathBuf>,
    /// A dataset clients may ask for: NAME=PATH[:FORMAT] (PATH a file, directory or glob,
    /// or a weighted mixture 'mix:SRC=PATH*WEIGHT,...[;size=N]'; FORMAT as in `riffle read
    /// --format`). Repeat for several. Optional with --user or --open-paths.
    #[arg(long = "dataset", value_parser = parse_dataset)]
    pub datasets: Vec<DatasetSpec>,
    /// Run as this user's node daemon, the one riffle.torch finds (and starts) when given
    /// a dataset path: its socket is RUNTIME_DIR/riffle.sock (mode 0600, and only this
    /// user's processes are served, checked with SO_PEERCRED), it opens the datasets its
    /// clients name by absolute path (as this user: only what you could read), exits after
    /// --exit-idle seconds with no client (default 300), removing its socket and scratch,
    /// and a second one for the same directory refuses to start (exit status 3).
    #[arg(long)]
    pub user: bool,
    /// --user: the daemon's private directory (default $RIFFLE_RUNTIME_DIR, else
    /// $XDG_RUNTIME_DIR/riffle, else ${TMPDIR:-/tmp}/riffle-UID), made mode 0700 if
    /// missing; one that is a link, another user's, or open to others is refused.
    #[arg(long, requires = "user")]
    pub runtime_dir: Option<PathBuf>,
    /// --user: start in the background and return once the daemon listens, printing its
    /// socket (its log is RUNTIME_DIR/daemon.log); exit status 3 when one already runs.
    #[arg(long, requires = "user")]
    pub detach: bool,
    /// --user: say whether the daemon runs, and what it serves (pid, version, clients,
    /// streams, datasets, memory; one JSON object with --json), then exit: 0 when it runs,
    /// 1 when not.
    #[arg(long, requires = "user", conflicts_with_all = ["detach", "stop"])]
    pub status: bool,
    /// --user: stop the running daemon (SIGTERM: its clients are told, its socket and
    /// scratch removed) and wait until it is gone.
    #[arg(long, requires = "user", conflicts_with = "detach")]
    pub stop: bool,
    /// --status: one JSON object.
    #[arg(long, requires = "status")]
    pub json: bool,
    /// The daemon says "ready" on stdout once it listens (how --detach waits for it).
    #[arg(long, hide = true)]
    pub notify_ready: bool,
    /// An OPEN may name a dataset by absolute path or s3:// URL (or a mixture of such)
    /// besides the --dataset names: opened on first use, as the daemon's user (an s3://
    /// one with the daemon's AWS environment and --cache-limit), kept while streams use
    /// it and opened again when its files (or objects) change. Implied by --user.
    #[arg(long)]
    pub open_paths: bool,
    /// s3:// datasets (given with --dataset, or named by an OPEN with --open-paths): the
    /// local disk each may use (see `riffle read --cache-limit`): staged whole when it
    /// fits, else streamed through two-pass piles (--mode two-pass or auto) kept within it.
    #[arg(long, value_parser = riffle::size::parse_size)]
    pub cache_limit: Option<u64>,
    /// Exit after this many seconds with no client connected, removing the socket and
    /// scratch (0: never). Default 300 with --user, else 0.
    #[arg(long)]
    pub exit_idle: Option<u64>,
    /// The daemon's memory, all told: the datasets' indexes, every stream's ring (a few MiB
    /// of batches, at most this divided by --max-clients) and every engine pass (tables,
    /// buffers, read-ahead, two-pass piles, a mixture epoch's draws; one pass takes at most
    /// a quarter of it, or 512 MiB). An OPEN that can never fit gets `too_large` at once
    /// with the numbers; one that fits once others give back waits --admit-wait seconds
    /// for room, then gets `busy`. Less than one stream of the datasets needs is refused
    /// at start. Open files (ulimit -n) are a budget too: each pass holds its share of
    /// the dataset's files, its queue depth cut to fit.
    /// Default: the machine's budget (a quarter of the available memory, or 3/4 of the
    /// memory cgroup's limit, or half of what `ulimit -v` leaves, whichever is least; the
    /// log's first line says what it came to), 1G when none of them can be read.
    #[arg(long, value_parser = parse_size)]
    pub memory: Option<u64>,
    /// Connections served at once; more are refused with a "busy" error (so are
    /// connections that come when no file descriptor is left). Each may hold three open
    /// files (its socket and ring): more than ulimit -n leaves is refused at start.
    /// Default 64; with --user, fewer when ulimit -n is low (32 kept for reading, then at
    /// most half of the rest for connections), as the log's first line says.
    #[arg(long)]
    pub max_clients: Option<usize>,
    /// lirs (random reads), two-pass (sequential, scratch piles per stream), resident
    /// (each dataset held in memory, one copy shared by every job, rank and worker reading
    /// it, charged to --memory while held; a dataset that never fits whole is held in part,
    /// its rest read through two-pass piles in the scratch by each pass; one that does not
    /// fit at all is read by lirs) or
    /// auto (the planner's choice per stream, resident among them, from the datasets'
    /// device profiles; a device with no cached profile is probed quickly at start). A
    /// held copy no stream uses is kept for the next job, and dropped (least recently
    /// used first) when another admission needs its memory; all copies together take at
    /// most --memory less one read's and one ring's share (see docs/protocol.md).
    #[arg(long, default_value = "auto")]
    pub mode: String,
    /// two-pass: where the piles go (default: the directory of each dataset's first file).
    ///
    /// The piles go in a private directory `.riffle-scratch-KIND-PID-RANDOM` there (made
    /// if the location is missing, and removed again), removed when the run ends, also on
    /// error, Ctrl-C or SIGTERM. One left by a killed run (SIGKILL, a crash) is removed by
    /// the next riffle command that uses the location, which says how much it reclaimed.
    /// A location that is not a writable directory (nor made in one), or is on /proc or
    /// /sys, is refused at start.
    #[arg(long)]
    pub scratch: Option<PathBuf>,
    /// two-pass: the most scratch all streams' piles together may take; a pass is
    /// admitted with the scratch its plan needs (`too_large` when that is more than the
    /// limit), waits --admit-wait for room, then gets `busy` with the numbers. Passes
    /// also reserve their piles' bytes against the scratch filesystem's free space, so
    /// concurrent passes never plan for the same free bytes. `auto` plans within both
    /// (lirs when two-pass's piles do not fit). Default: no limit besides the free space.
    #[arg(long, value_parser = parse_size)]
    pub scratch_limit: Option<u64>,
    /// Reads in flight per stream.
    #[arg(long, default_value_t = 64)]
    pub queue_depth: usize,
    /// Seconds a client may leave the daemon waiting on it (connected with no stream
    /// open, with a stream stalled until it acknowledges a batch, or not reading what the
    /// daemon writes to it) before it is closed with a `timeout` error and its slot freed;
    /// 0 for no limit, at most a year. The handshake (HELLO) always has 10 s in all.
    #[arg(long, default_value_t = 600)]
    pub idle_timeout: u64,
    /// Milliseconds a new LIRS job (or a two-pass job led by LIRS) waits for the other
    /// ranks of its world before its shared pass starts. Streams that OPEN the same job
    /// (dataset, seed, epochs, batch size, grouping, world > 1, tail, resume point) share
    /// one pass, which reads only the batches of the ranks that joined; a rank that comes
    /// after the pass decided its first batch starts a new pass of the job (two-pass jobs
    /// that are not led take ranks during the whole scatter). At most a year.
    #[arg(long, default_value_t = 500)]
    pub join_window: u64,
    /// Seconds a job's shared pass waits, from its start, for the streams its clients say
    /// this node will open (the OPEN field `streams`; riffle.torch sends torchrun's
    /// LOCAL_WORLD_SIZE times the DataLoader's workers) before it decides its first batch:
    /// LIRS before it starts, two-pass while its scatter runs. It goes on earlier once that
    /// many have joined, or the whole world, or when every stream that joined has left; at
    /// the deadline it goes on with the streams present. A stream of the job that comes
    /// after the pass began emitting (late) gets a pass of its own, which reads the dataset
    /// again; stats count it (`late_streams`) and the log says so. Jobs whose clients do
    /// not say `streams` wait as --join-window says. Keep it below the clients' receive
    /// timeout (600 s in the Python client): the first stream waits this long at most for
    /// its first batch. At most a year.
    #[arg(long, default_value_t = 60)]
    pub join_deadline: u64,
    /// Two-pass streams do not lead with lirs: their first batch waits for the whole
    /// scatter. By default a two-pass stream's first batches are read at random while
    /// its scatter runs (not on a device that seeks, per its probe profile); see `riffle
    /// read --no-lead`.
    #[arg(long)]
    pub no_lead: bool,
    /// Seconds an OPEN waits for room in --memory (and scratch, and open files) before it
    /// is refused with `busy` (at most a year). A request that can never fit is refused
    /// at once with `too_large`.
    #[arg(long, default_value_t = 10)]
    pub admit_wait: u64,
    /// two-pass (and a dataset held in part): a pass over local files of a job opened epoch
    /// by epoch (riffle.torch opens a stream per epoch; a job's first pass never rolls)
    /// rolls its piles into the next epoch's while it emits its last epoch, and the daemon
    /// keeps them this many seconds for the job's next pass, which then starts at its pile
    /// pass with no read of the dataset. Kept piles hold their
    /// scratch until taken, expired, dropped for another pass's scratch (before anyone
    /// waits), or the daemon stops; piles of files changed since are never served. 0: off.
    #[arg(long, default_value_t = riffle::serve::DEFAULT_KEEP_SECS, value_name = "SECS")]
    pub keep_rolled: u64,
    /// Every SECONDS, one JSON line on stderr: streams, batches, records/s, memory, and the
    /// waits per job (the time the daemon waited for the engine while clients had room,
    /// the data stall; and the time batches waited for clients, the back-pressure). 0: off.
    #[arg(long, default_value_t = 0)]
    pub stats_every: u64,
    /// Permission bits of the socket, in octal.
    #[arg(long, default_value = "600", value_parser = parse_mode)]
    pub socket_mode: u32,
}

#[derive(Clone, Debug)]
pub struct DatasetSpec {
    name: String,
    /// Where the dataset is (the device `--emulate` throttles).
    pub path: PathBuf,
    format: Option<Format>,
    /// What PATH names: paths, or a mixture.
    spec: riffle::source::DatasetSpec,
}

/// `NAME=PATH[:FORMAT]` ([`PathSpec`]).
fn parse_dataset(s: &str) -> Result<DatasetSpec, String> {
    let (name, rest) = s
        .split_once('=')
        .ok_or_else(|| format!("'{s}': expected NAME=PATH[:FORMAT]"))?;
    if name.is_empty() || rest.is_empty() {
        return Err(format!("'{s}': expected NAME=PATH[:FORMAT]"));
    }
    let p = PathSpec::parse(rest)?;
    Ok(DatasetSpec {
        name: name.into(),
        path: p.path,
        format: p.format,
        spec: p.spec,
    })
}

/// The datasets the daemon serves, opened (their size statistics worked out now rather
/// than on the first client's open), each device profiled when the planner will want it,
/// and scratch left by an earlier daemon removed.
fn open_datasets(a: &Args, mode: ServeMode) -> Result<Vec<(String, Source)>> {
    let prepare = on_open(mode, a.scratch.clone());
    let mut datasets: Vec<(String, Source)> = Vec::new();
    for d in &a.datasets {
        if datasets.iter().any(|(n, _)| n == &d.name) {
            bail!("dataset '{}' is configured twice", d.name);
        }
        let opts = OpenOptions {
            format: d.format.clone(),
            cache_limit: a.cache_limit,
            ..OpenOptions::default()
        };
        let src = (d.spec.open(&opts, &mut |_, _, _| {}))
            .with_context(|| format!("dataset '{}'", d.name))?;
        prepare(&src).with_context(|| format!("dataset '{}'", d.name))?;
        datasets.push((d.name.clone(), src));
    }
    Ok(datasets)
}

/// The daemon's memory, connections and idle time: as given, or the defaults (see their
/// flags).
fn sized(a: &Args) -> (u64, usize, u64) {
    // The machine's budget unless given: a quarter of the available memory, less under a
    // cgroup or address-space limit (1 GiB when nothing can be read).
    let memory = a
        .memory
        .unwrap_or_else(|| riffle::resources::memory::here().map_or(1 << 30, |m| m.bytes));
    let exit_idle = a.exit_idle.unwrap_or(if a.user { 300 } else { 0 });
    // A daemon a training script started for itself fits the open files it inherited
    // rather than refusing to start: of what is left after 32 for one read of its own (a
    // two-pass read of one file holds about 30), half for connections (three each).
    let max_clients = match (a.max_clients, a.user) {
        (Some(n), _) => n,
        (None, true) => {
            let fit = riffle::io::open_file_limit().saturating_sub(32) / 2 / 3;
            usize::try_from(fit.clamp(1, 64)).unwrap_or(64)
        }
        (None, false) => 64,
    };
    (memory, max_clients, exit_idle)
}

/// Takes the stop signals on a thread of its own: the first stops the daemon gracefully,
/// a second ends it at once (its scratch removed first).
fn signal_thread(signals: SigSet, stop: riffle::serve::Shutdown) -> Result<()> {
    std::thread::Builder::new()
        .name("riffle-signals".into())
        .spawn(move || {
            // The first signal stops the daemon gracefully (clients are told, the socket
            // removed); a second one while that is under way ends it at once, its
            // scratch removed first.
            let mut first = true;
            while let Ok(sig) = signals.wait() {
                if first {
                    eprintln!("riffle serve: {sig}, shutting down");
                    stop.shutdown();
                    first = false;
                } else {
                    let (_, bytes) = riffle::scratch::remove_live();
                    eprintln!(
                        "riffle serve: {sig} again, exiting now (removed {} of scratch)",
                        human_bytes(bytes as f64)
                    );
                    std::process::exit(128 + sig as i32);
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}

/// Every `every` seconds, one JSON line of the daemon's stats on stderr.
fn stats_thread(handle: riffle::serve::Shutdown, every: u64) -> Result<()> {
    let every = std::time::Duration::from_secs(every);
    std::thread::Builder::new()
        .name("riffle-stats".into())
        .spawn(move || loop {
            std::thread::sleep(every);
            let s = handle.stats();
            let line = serde_json::json!({
                "uptime_s": s["uptime_s"],
                "clients": s["clients"],
                "streams_now": s["streams_now"],
                "jobs_now": s["jobs_now"],
                "late_streams": s["late_streams"],
                // Per job: the streams it expects, those that joined, the late ones.
                "jobs": s["jobs"],
                "batches": s["batches"],
                "records_per_s": s["records_per_s"],
                "memory_used": s["memory_used"],
                "memory_limit": s["memory_limit"],
                "job_waits": s["job_waits"],
            });
            eprintln!("riffle serve stats: {line}");
        })?;
    Ok(())
}

/// What the daemon does to each dataset before serving it, one it was started with or one
/// opened by path: work out its size statistics now rather than at the first OPEN, profile
/// its device for the planner (mode auto: the planner reads the cached profile when a
/// stream opens; a quick probe, once per device), and reclaim the scratch a killed daemon
/// (SIGKILL, a crash) left beside it, now rather than when the first two-pass stream opens.
fn on_open(mode: ServeMode, scratch: Option<PathBuf>) -> OnOpen {
    std::sync::Arc::new(move |src: &Source| {
        let _ = src.dataset().size_stats();
        // A dataset streamed from object storage: no device to profile, its piles in its
        // cache.
        if let Some(objects) = src.dataset().remote() {
            riffle::scratch::reclaim(&scratch.clone().unwrap_or_else(|| objects.scratch_home()));
            return Ok(());
        }
        if mode == ServeMode::Auto {
            super::read::device_model(src.dataset(), false)
                .map_err(|e| riffle::Error::Invalid(format!("profiling its device: {e:#}")))?;
        }
        if let Some(first) = src.dataset().files().first() {
            riffle::scratch::reclaim(&riffle::scratch::location(scratch.as_deref(), &first.path));
        }
        Ok(())
    })
}

fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("'{s}': expected octal permission bits like 600 or 660"))
}

/// Whether `sig` was ignored when the process started (`nohup` ignores SIGHUP): the
/// `SigIgn` mask of /proc/self/status, bit `sig - 1`. Unknown (no /proc): not ignored.
fn ignored_at_start(sig: Signal) -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (sig as i32 - 1)) != 0)
}

pub fn run(a: Args, throttled: bool) -> Result<()> {
    // Block the stop signals in this thread before any other starts, so every thread
    // inherits the mask and only the waiter below ever takes them. SIGHUP (the terminal
    // went away) stops the daemon like SIGTERM, unless it was ignored when the daemon
    // started (`nohup`, a service manager): then it stays ignored, as asked.
    let mut signals = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT] {
        signals.add(s);
    }
    if !ignored_at_start(Signal::SIGHUP) {
        signals.add(Signal::SIGHUP);
    }
    signals.thread_block().context("blocking SIGTERM")?;

    let place = Place::of(a.socket.as_deref(), a.user, a.runtime_dir.as_deref())?;
    if a.detach {
        return super::serve_user::detach(&place);
    }
    if a.status {
        return super::serve_user::status(&place, a.json);
    }
    if a.stop {
        return super::serve_user::stop(&place);
    }
    place.hold()?;
    let mode: ServeMode = a.mode.parse().map_err(anyhow::Error::msg)?;
    let open_paths = a.open_paths || a.user;
    if a.datasets.is_empty() && !open_paths {
        bail!("no dataset to serve: give --dataset NAME=PATH, or --open-paths (or --user)");
    }
    let (memory, max_clients, exit_idle) = sized(&a);
    let datasets = open_datasets(&a, mode)?;
    let names: Vec<String> = datasets
        .iter()
        .map(|(n, d)| format!("{n} ({} records)", d.len()))
        .collect();
    let server = Server::bind(ServeConfig {
        socket: place.socket.clone(),
        socket_mode: a.socket_mode,
        throttled,
        datasets,
        memory,
        max_clients,
        mode,
        scratch: a.scratch.clone(),
        scratch_limit: a.scratch_limit,
        queue_depth: a.queue_depth,
        join_window: std::time::Duration::from_millis(a.join_window),
        join_deadline: std::time::Duration::from_secs(a.join_deadline),
        lead: !a.no_lead,
        admit_wait: std::time::Duration::from_secs(a.admit_wait),
        idle_timeout: (a.idle_timeout > 0).then(|| std::time::Duration::from_secs(a.idle_timeout)),
        open_paths,
        cache_limit: a.cache_limit,
        on_open: open_paths.then(|| on_open(mode, a.scratch.clone())),
        owner_only: a.user,
        exit_idle: (exit_idle > 0).then(|| std::time::Duration::from_secs(exit_idle)),
        start_lock: place.start_lock(),
        keep_rolled: std::time::Duration::from_secs(a.keep_rolled),
    })?;
    if a.notify_ready {
        use std::io::Write;
        let mut out = std::io::stdout();
        let _ = writeln!(out, "ready").and_then(|()| out.flush());
    }
    let stop = server.shutdown_handle();
    if a.stats_every > 0 {
        stats_thread(stop.clone(), a.stats_every)?;
    }
    signal_thread(signals, stop)?;
    eprintln!(
        "riffle serve: listening on {} (mode {:o}), {} memory, {} clients at most, {} ring \
         memory per client; serving {}{}{}",
        place.socket.display(),
        a.socket_mode,
        human_bytes(memory as f64),
        max_clients,
        human_bytes(server.ring_share() as f64),
        if names.is_empty() {
            "no dataset yet".into()
        } else {
            names.join(", ")
        },
        if open_paths {
            ", and datasets named by path"
        } else {
            ""
        },
        match exit_idle {
            0 => String::new(),
            n => format!("; exits after {n} s with no client"),
        }
    );
    let result = server.run();
    // Streams still winding down have their scratch removed now: the process is ending.
    let (entries, bytes) = riffle::scratch::remove_live();
    if entries > 0 {
        eprintln!(
            "riffle serve: removed the scratch of {entries} stream(s) ({})",
            human_bytes(bytes as f64)
        );
    }
    result?;
    eprintln!("riffle serve: stopped");
    if let Some(dir) = &place.dir {
        // The log's last word: gone for idleness or a signal, nothing left behind.
        eprintln!("riffle serve: {} left clean", dir.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dataset_specs_split_name_path_and_format() {
        let d = parse_dataset("train=/data/t.bin:fixed:4K:16").unwrap();
        assert_eq!(d.name, "train");
        assert_eq!(d.path, PathBuf::from("/data/t.bin"));
        assert!(matches!(d.format, Some(Format::Fixed { .. })));
        let d = parse_dataset("val=/data/v.npy").unwrap();
        assert_eq!(
            (d.path, d.format.is_none()),
            (PathBuf::from("/data/v.npy"), true)
        );
        let d = parse_dataset("x=/a:b/c.jsonl:lines").unwrap();
        assert_eq!(d.path, PathBuf::from("/a:b/c.jsonl"));
        assert!(parse_dataset("noequals").is_err());
        assert!(parse_dataset("=x").is_err());
    }
}
