//! The `riffle` command-line tool: flag parsing, progress and output over the engine.
//!
//! Exit codes: 0 success, 1 a runtime error (bad input, I/O failure), 2 a usage error.

mod cmd;
mod progress;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    #[command(subcommand)]
    command: Command,
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
    /// Shuffle the lines of files too big for memory (in place of shuf or terashuf): the
    /// same output for the same seed whatever --memory is.
    Shuffle(cmd::shuffle::Args),
    /// Serve batches to training processes over a Unix socket: a long-running daemon with
    /// a shared-memory transport (see docs/protocol.md and the Python client in python/).
    ///
    /// SIGTERM (or SIGINT) stops it cleanly: clients are told, the socket file is removed.
    Serve(cmd::serve::Args),
    /// Run a benchmark suite and write a report (JSON + Markdown).
    Bench(cmd::bench::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(a) => cmd::demo::run(a),
        Command::Probe(a) => cmd::probe::run(a),
        Command::Gen(a) => cmd::gen::run(a),
        Command::Index(a) => cmd::index::run(a),
        Command::Cat(a) => cmd::cat::run(a),
        Command::Read(a) => cmd::read::run(a),
        Command::Shuffle(a) => cmd::shuffle::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Bench(a) => cmd::bench::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("riffle: error: {e:#}");
            ExitCode::from(1)
        }
    }
}
