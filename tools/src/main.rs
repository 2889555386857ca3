//! The `riffle` command-line tool: flag parsing, progress and output over the engine.
//!
//! Exit codes: 0 success, 1 a runtime error (bad input, I/O failure, a full stdout), 2 a
//! usage error; 128 + the signal when stopped by SIGINT (130), SIGTERM (143) or SIGHUP
//! (129); 141 (128 + SIGPIPE, what a shell sees of coreutils in the same place) when stdout
//! is a pipe whose reader has gone (`riffle read X | head -1`): the run ends quietly, its
//! scratch removed, as `seq` or `cat` end.

mod cmd;
mod out;
mod progress;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Parser, Subcommand};
use riffle::emulate::{DeviceClass, Throttle};

/// riffle feeds shuffled training data from local storage as fast as the device allows.
///
/// It reads with O_DIRECT through io_uring (a pread thread pool where io_uring is not
/// available, buffered reads where O_DIRECT is refused), and measures the device it runs on.
#[derive(Parser)]
#[command(
    name = "riffle",
    version,
    propagate_version = true,
    max_term_width = 100
)]
struct Cli {
    /// Run the command under a kernel I/O throttle that makes the device holding its data
    /// behave like CLASS: hdd (600 random-read IOPS, 150 MB/s), sata-ssd (90k IOPS,
    /// 550 MB/s read, 500 MB/s write) or nvme (no throttle: the device's own speed).
    ///
    /// The throttle is a cgroup (v1 blkio or v2 io.max) on the whole disk holding the
    /// command's data (probe's PATH, the dataset, bench's --data-dir, gen's OUT), made for
    /// this run and removed afterwards, also on error; it needs root. Children (fio) are
    /// throttled too. A probe under emulation is cached as a profile of that class, apart
    /// from the device's own.
    #[arg(long, global = true, value_name = "CLASS", value_parser = class_parser())]
    emulate: Option<DeviceClass>,
    #[command(subcommand)]
    command: Command,
}

fn class_parser() -> impl TypedValueParser<Value = DeviceClass> {
    PossibleValuesParser::new(DeviceClass::NAMES)
        .map(|s| s.parse().expect("one of DeviceClass::NAMES"))
}

#[derive(Subcommand)]
enum Command {
    /// Make a small dataset in a temporary directory, probe the device quickly, read one
    /// shuffled epoch, print what happened and clean up.
    Demo(cmd::demo::Args),
    /// Measure the device holding PATH the way fio does (random-read IOPS, bandwidth and
    /// latency by block size and queue depth; sequential read and write bandwidth).
    ///
    /// The profile is cached per device and reused unless --refresh is given.
    Probe(cmd::probe::Args),
    /// Write a synthetic dataset whose records carry their id and a label.
    Gen(cmd::gen::Args),
    /// Build or check the offset index of a dataset and report its records.
    ///
    /// Variable-length formats (lines, TFRecord) are scanned once and their record offsets
    /// saved beside the data (DATA.ridx); a stale or corrupt index is rebuilt, or refused
    /// with --no-rebuild.
    Index(cmd::index::Args),
    /// Write records of a dataset, read through the engine, to stdout or a file.
    Cat(cmd::cat::Args),
    /// Read shuffled batches of a dataset (every epoch an exact permutation, the same
    /// batches for the same seed whatever the queue depth, memory or backend).
    Read(cmd::read::Args),
    /// Predict every mode's epoch time, memory and scratch space for a job on this device,
    /// and say which mode `auto` would run and why.
    ///
    /// Uses the device's cached profile (a quick probe is run and cached on first use).
    Plan(cmd::plan::Args),
    /// Shuffle the lines of files too big for memory (in place of shuf or terashuf): the
    /// same output for the same seed whatever --memory is.
    Shuffle(cmd::shuffle::Args),
    /// Serve batches to training processes over a Unix socket: a long-running daemon with
    /// a shared-memory transport (see docs/protocol.md and the Python client in python/).
    ///
    /// SIGTERM (or SIGINT) stops it cleanly: clients are told, the socket file is removed.
    /// So does SIGHUP, unless it was ignored at start (as under nohup): then it is ignored.
    Serve(cmd::serve::Args),
    /// Run a benchmark suite and write a report (JSON + Markdown).
    Bench(cmd::bench::Args),
}

impl Command {
    /// Where the command's data lives: the device `--emulate` throttles.
    fn data_path(&self) -> PathBuf {
        let given = |p: &PathBuf| (!cmd::shuffle::is_dash(p)).then(|| p.clone());
        match self {
            Command::Demo(a) => a.dir.clone().unwrap_or_else(std::env::temp_dir),
            Command::Probe(a) => a.path.clone(),
            Command::Gen(a) => a.out.clone(),
            Command::Index(a) => a.data.dataset[0].clone(),
            Command::Cat(a) => a.data.dataset[0].clone(),
            Command::Read(a) => a.data.dataset[0].clone(),
            Command::Plan(a) => a.data.dataset[0].clone(),
            Command::Shuffle(a) => a
                .tmpdir
                .clone()
                .or_else(|| given(&a.output))
                .or_else(|| given(&a.inputs[0]))
                .unwrap_or_else(|| PathBuf::from(".")),
            Command::Serve(a) => a
                .datasets
                .first()
                .map(|d| d.path.clone())
                .unwrap_or_else(|| PathBuf::from(".")),
            Command::Bench(a) => a.data_dir.clone(),
        }
    }
}

/// Raises the soft limit on open files to the hard limit: a dataset of many files, and
/// the piles of a large two-pass run, need more than the usual soft 1024. Silent when it
/// works; a failure only leaves the limit as it was.
fn raise_open_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

/// Exit status of a run whose stdout was closed by its reader: 128 + SIGPIPE.
const CLOSED_STDOUT: u8 = 141;

/// Set by the signal thread when it takes a signal: the run is being stopped, and the
/// main thread must not exit with the run's own (cancelled) result before the signal
/// thread has removed the scratch and exited with the signal's status.
static SIGNALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes a line to stderr, best effort: a closed stderr must not turn a report into a
/// panic (`eprintln!` panics when the write fails).
fn say(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = std::io::stderr().write_fmt(args);
}

/// Makes a write past RLIMIT_FSIZE (`ulimit -f`) fail with EFBIG, reported as an error
/// naming the file and cleaned up after like any other, instead of killing the process
/// with SIGXFSZ (rc 153, no message, temporary files left). Children inherit the ignored
/// disposition.
fn ignore_sigxfsz() -> anyhow::Result<()> {
    use anyhow::Context;
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: SIG_IGN installs no handler, so no code runs in signal context; the call
    // happens before any other thread exists.
    unsafe { signal(Signal::SIGXFSZ, SigHandler::SigIgn) }
        .context("ignoring SIGXFSZ")
        .map(drop)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    raise_open_file_limit();
    if let Err(e) = ignore_sigxfsz() {
        say(format_args!("riffle: error: {e:#}\n"));
        return ExitCode::from(1);
    }
    // `serve` stops gracefully on its own signal thread; every other command is stopped by
    // this one, which removes the scratch the run has live first.
    if !matches!(cli.command, Command::Serve(_)) {
        if let Err(e) = stop_on_signals() {
            say(format_args!("riffle: error: {e:#}\n"));
            return ExitCode::from(1);
        }
    }
    let result = run(cli);
    if SIGNALLED.load(std::sync::atomic::Ordering::Acquire) {
        // The run ended because the signal thread is removing what it had live (its
        // result is "interrupted"): that thread exits the process when done.
        loop {
            std::thread::park();
        }
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => match out::stdout_failure(&e) {
            // The reader of stdout has gone: not a failure (scratch was dropped as the
            // error came up).
            Some(true) => ExitCode::from(CLOSED_STDOUT),
            _ => {
                say(format_args!("riffle: error: {e:#}{}\n", hint(&e)));
                ExitCode::from(1)
            }
        },
    }
}

/// What to add to an error whose words alone mislead: io_uring fails a request it had
/// to hand to a kernel worker with ECANCELED when it cannot start that worker (the
/// process's thread limit, `ulimit -u`, reached), and "Operation canceled" says nothing of
/// that.
fn hint(e: &anyhow::Error) -> &'static str {
    let cancelled = e.chain().any(|c| {
        c.downcast_ref::<riffle::Error>()
            .and_then(riffle::Error::raw_os_error)
            .is_some_and(|n| n == nix::errno::Errno::ECANCELED as i32)
    });
    if cancelled {
        " (io_uring cancels a request when the kernel cannot start a worker thread for it: \
         is the limit on processes and threads, `ulimit -u`, too low?)"
    } else {
        ""
    }
}

/// Blocks SIGINT, SIGTERM and SIGHUP in this thread before any other starts (every thread
/// inherits the mask; children get a clean one from `Command`), and takes them on one
/// thread: it removes every temporary file, scratch directory and emulation cgroup the run
/// has live, says so (best effort: a closed stderr does not stop it), and exits with 128 +
/// the signal (130 for Ctrl-C, 143 for SIGTERM).
fn stop_on_signals() -> anyhow::Result<()> {
    use anyhow::Context;
    use nix::sys::signal::{SigSet, Signal};
    let mut signals = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        signals.add(s);
    }
    signals.thread_block().context("blocking SIGINT")?;
    std::thread::Builder::new()
        .name("riffle-signals".into())
        .spawn(move || {
            // sigwait fails only with EINVAL (an invalid set): wait again rather than end
            // the thread, which would leave the signals blocked and the run unstoppable.
            let sig = loop {
                if let Ok(sig) = signals.wait() {
                    break sig;
                }
            };
            SIGNALLED.store(true, std::sync::atomic::Ordering::Release);
            let (entries, bytes) = riffle::scratch::remove_live();
            let groups = riffle::emulate::remove_all();
            let groups = match groups {
                0 => String::new(),
                n => format!("; removed {n} emulation cgroup(s)"),
            };
            if entries > 0 {
                say(format_args!(
                    "\nriffle: {sig}: stopped; removed {entries} temporary file(s) and scratch \
                     director(ies) of this run ({}){groups}\n",
                    riffle::size::human_bytes(bytes as f64)
                ));
            } else {
                say(format_args!("\nriffle: {sig}: stopped{groups}\n"));
            }
            std::process::exit(128 + sig as i32);
        })
        .context("starting the signal thread")?;
    Ok(())
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // The guard lives until the command has returned, whatever it returned: dropping it
    // moves the process back and removes the cgroup.
    let throttle = match cli.emulate {
        Some(class) => {
            let t = Throttle::enter(class, &cli.command.data_path())?;
            say(format_args!("riffle: {t}\n"));
            Some(t)
        }
        None => None,
    };
    // Commands that write pass this down in their I/O configuration (`IoConfig::throttled`),
    // so writes take a backend the throttle charges.
    let throttled = throttle.is_some();
    match cli.command {
        Command::Demo(a) => cmd::demo::run(a, throttled),
        Command::Probe(a) => cmd::probe::run(a),
        Command::Gen(a) => cmd::gen::run(a, throttled),
        Command::Index(a) => cmd::index::run(a),
        Command::Cat(a) => cmd::cat::run(a),
        Command::Read(a) => cmd::read::run(a, throttled),
        Command::Plan(a) => cmd::plan::run(a),
        Command::Shuffle(a) => cmd::shuffle::run(a, throttled),
        Command::Serve(a) => cmd::serve::run(a, throttled),
        Command::Bench(a) => cmd::bench::run(a),
    }
}
