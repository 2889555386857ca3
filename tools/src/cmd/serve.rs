//! `riffle serve --socket PATH --dataset NAME=PATH[:FORMAT] ...`: the batch-feeder daemon.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use nix::sys::signal::{SigSet, Signal};
use riffle::dataset::OpenOptions;
use riffle::format::Format;
use riffle::serve::{ServeConfig, ServeMode, Server};
use riffle::size::{human_bytes, parse_size};
use riffle::source::Source;

#[derive(clap::Args)]
pub struct Args {
    /// The Unix socket to listen on (a stale socket nobody listens on is replaced).
    #[arg(long)]
    pub socket: PathBuf,
    /// A dataset clients may ask for: NAME=PATH[:FORMAT] (PATH a file, directory or glob,
    /// or a weighted mixture 'mix:SRC=PATH*WEIGHT,...[;size=N]'; FORMAT as in `riffle read
    /// --format`). Repeat for several.
    #[arg(long = "dataset", required = true, value_parser = parse_dataset)]
    pub datasets: Vec<DatasetSpec>,
    /// The daemon's memory, all told: the datasets' indexes, every stream's ring (a few MiB
    /// of batches, at most this divided by --max-clients) and every engine pass (tables,
    /// buffers, read-ahead, two-pass piles, a mixture epoch's draws; one pass takes at most
    /// a quarter of it, or 512 MiB). An OPEN that can never fit gets `too_large` at once
    /// with the numbers; one that fits once others give back waits --admit-wait seconds
    /// for room, then gets `busy`. Less than one stream of the datasets needs is refused
    /// at start. Open files (ulimit -n) are a budget too: each pass holds its share of
    /// the dataset's files, its queue depth cut to fit.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub memory: u64,
    /// Connections served at once; more are refused with a "busy" error (so are
    /// connections that come when no file descriptor is left). Each may hold three open
    /// files (its socket and ring): more than ulimit -n leaves is refused at start.
    #[arg(long, default_value_t = 64)]
    pub max_clients: usize,
    /// lirs (random reads), two-pass (sequential, scratch piles per stream) or auto (the
    /// planner's choice per stream, from the datasets' device profiles; a device with no
    /// cached profile is probed quickly at start).
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

/// `NAME=PATH[:FORMAT]`: the format is the part after the first colon that parses as one
/// (formats themselves contain colons: `fixed:4K:16`).
fn parse_dataset(s: &str) -> Result<DatasetSpec, String> {
    let (name, rest) = s
        .split_once('=')
        .ok_or_else(|| format!("'{s}': expected NAME=PATH[:FORMAT]"))?;
    if name.is_empty() || rest.is_empty() {
        return Err(format!("'{s}': expected NAME=PATH[:FORMAT]"));
    }
    for (i, _) in rest.match_indices(':') {
        if i == 0 {
            continue;
        }
        if let Ok(f) = rest[i + 1..].parse::<Format>() {
            return Ok(DatasetSpec {
                name: name.into(),
                path: rest[..i].into(),
                format: Some(f),
                spec: spec_of(&rest[..i])?,
            });
        }
    }
    Ok(DatasetSpec {
        name: name.into(),
        path: rest.into(),
        format: None,
        spec: spec_of(rest)?,
    })
}

/// A path, or a mixture `mix:SRC=PATH*WEIGHT,...`.
fn spec_of(path: &str) -> Result<riffle::source::DatasetSpec, String> {
    riffle::source::DatasetSpec::parse(&[path]).map_err(|e| e.to_string())
}

/// The datasets the daemon serves, opened (their size statistics worked out now rather
/// than on the first client's open), each device profiled when the planner will want it,
/// and scratch left by an earlier daemon removed.
fn open_datasets(a: &Args, mode: ServeMode) -> Result<Vec<(String, Source)>> {
    let mut datasets: Vec<(String, Source)> = Vec::new();
    for d in &a.datasets {
        if datasets.iter().any(|(n, _)| n == &d.name) {
            bail!("dataset '{}' is configured twice", d.name);
        }
        let opts = OpenOptions {
            format: d.format.clone(),
            ..OpenOptions::default()
        };
        let src = (d.spec.open(&opts, &mut |_, _, _| {}))
            .with_context(|| format!("dataset '{}'", d.name))?;
        let _ = src.dataset().size_stats();
        if mode == ServeMode::Auto {
            // The planner reads the device's cached profile when a stream opens.
            super::read::device_model(src.dataset(), false)
                .with_context(|| format!("dataset '{}': profiling its device", d.name))?;
        }
        // Scratch of an earlier daemon that was killed (SIGKILL, a crash) goes now, not
        // when the first two-pass stream opens.
        if let Some(first) = src.dataset().files().first() {
            riffle::scratch::reclaim(&riffle::scratch::location(
                a.scratch.as_deref(),
                &first.path,
            ));
        }
        datasets.push((d.name.clone(), src));
    }
    Ok(datasets)
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

    let mode: ServeMode = a.mode.parse().map_err(anyhow::Error::msg)?;
    let datasets = open_datasets(&a, mode)?;
    let names: Vec<String> = datasets
        .iter()
        .map(|(n, d)| format!("{n} ({} records)", d.len()))
        .collect();
    let server = Server::bind(ServeConfig {
        socket: a.socket.clone(),
        socket_mode: a.socket_mode,
        throttled,
        datasets,
        memory: a.memory,
        max_clients: a.max_clients,
        mode,
        scratch: a.scratch,
        scratch_limit: a.scratch_limit,
        queue_depth: a.queue_depth,
        join_window: std::time::Duration::from_millis(a.join_window),
        join_deadline: std::time::Duration::from_secs(a.join_deadline),
        lead: !a.no_lead,
        admit_wait: std::time::Duration::from_secs(a.admit_wait),
        idle_timeout: (a.idle_timeout > 0).then(|| std::time::Duration::from_secs(a.idle_timeout)),
    })?;
    let stop = server.shutdown_handle();
    if a.stats_every > 0 {
        let (handle, every) = (stop.clone(), std::time::Duration::from_secs(a.stats_every));
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
    }
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
    eprintln!(
        "riffle serve: listening on {} (mode {:o}), {} ring memory per client; serving {}",
        a.socket.display(),
        a.socket_mode,
        human_bytes(server.ring_share() as f64),
        names.join(", ")
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
