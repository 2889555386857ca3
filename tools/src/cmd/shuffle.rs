//! `riffle shuffle INPUT... -o OUTPUT`: a seeded, memory-bounded shuffle of lines,
//! TFRecord frames or fixed-size records.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use riffle::format::Format;
use riffle::shuffle::{self, Input, Output, ShuffleOptions, SplitBy};
use riffle::size::{human_bytes, parse_size};

use crate::progress;

#[derive(clap::Args)]
pub struct Args {
    /// Input files, merged in the order given (`-` is standard input; `s3://BUCKET/KEY`,
    /// a prefix or a glob of keys is staged into the local cache first). Pipes, FIFOs and
    /// devices (`<(cmd)`, /dev/stdin) are streamed like standard input.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// The output file (`-` is standard output). Written under a temporary name and
    /// renamed when complete.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Memory budget for the records held at once, index included; larger inputs are
    /// shuffled through temporary piles (two passes of sequential I/O).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub memory: u64,
    /// Seed: the same seed and input give the same output whatever --memory is.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write numbered outputs OUTPUT.000, OUTPUT.001, ... of at most N lines (records) each.
    #[arg(long, conflicts_with = "split_bytes")]
    pub split_lines: Option<u64>,
    /// Write numbered outputs, starting a new one after S bytes (suffixes K, M, G).
    #[arg(long, value_parser = parse_size)]
    pub split_bytes: Option<u64>,
    /// Lines: header lines at the top of each input; the first input's are kept at the
    /// top of the (first) output (csv: 1 unless given).
    #[arg(long)]
    pub skip: Option<u64>,
    /// Lines: the record separator (one ASCII character, or an escape: \t, \0, \r, \x1e).
    #[arg(long, value_parser = super::dataset::parse_sep)]
    pub sep: Option<u8>,
    /// Where temporary piles go, for inputs larger than --memory (default: the output's
    /// directory; for `-o -`, a FIFO or a device, the first input file's directory, or the
    /// system temp directory when every input is a stream).
    ///
    /// The piles go in a private directory `.riffle-scratch-KIND-PID-RANDOM` there (made
    /// if the location is missing, and removed again), removed when the run ends, also on
    /// error, Ctrl-C or SIGTERM. One left by a killed run (SIGKILL, a crash) is removed by
    /// the next riffle command that uses the location, which says how much it reclaimed.
    #[arg(long)]
    pub tmpdir: Option<PathBuf>,
    /// s3:// inputs: the local disk their staged copies may take; inputs past it are
    /// refused before any is fetched (shuffle reads the copies, and writes its output
    /// locally).
    #[arg(long, value_parser = parse_size)]
    pub cache_limit: Option<u64>,
    /// Record format: lines (also jsonl, csv, libsvm), tfrecord (whole frames are moved and
    /// both CRCs checked, so the output is TFRecord), or fixed:SIZE[:HEADER] (records of
    /// SIZE bytes after HEADER bytes at the top of each input; the first input's header is
    /// kept at the top of the output), tar (WebDataset shards: whole samples are moved, the
    /// output is one tar), or files (a directory tree or manifest of one file per record:
    /// the output is a tar whose members are the files, named by their path under the tree).
    /// Default: told from the first input's extension, else lines.
    #[arg(long)]
    pub format: Option<Format>,
    /// Print a JSON report on stderr.
    #[arg(long)]
    pub json: bool,
}

/// Whether a path argument is `-`, standard input or output.
pub fn is_dash(p: &Path) -> bool {
    p.as_os_str() == "-"
}

/// Why an `s3://` input must fit `--cache-limit` whole.
const STAGED: &str = "riffle shuffle reads staged copies; riffle read streams them";

pub fn run(a: Args, throttled: bool) -> Result<()> {
    let staged = riffle::remote::resolve_within(&a.inputs, a.cache_limit, STAGED)?; // s3://
    let inputs: Vec<Input> = staged
        .iter()
        .map(|i| {
            if is_dash(i) {
                Input::Stdin
            } else {
                Input::File(i.clone())
            }
        })
        .collect();
    if inputs.iter().filter(|i| matches!(i, Input::Stdin)).count() > 1 {
        bail!("standard input can be given only once");
    }
    let output = if is_dash(&a.output) {
        Output::Stdout
    } else {
        Output::File(a.output.clone())
    };
    let split = match (a.split_lines, a.split_bytes) {
        (Some(0), _) | (_, Some(0)) => bail!("split sizes must be positive"),
        (Some(n), _) => Some(SplitBy::Lines(n)),
        (_, Some(b)) => Some(SplitBy::Bytes(b)),
        _ => None,
    };
    if split.is_some() && matches!(output, Output::Stdout) {
        bail!("--split-lines/--split-bytes need an output file name, not standard output");
    }
    // A file output is written under a temporary name and renamed over its name when
    // complete; a FIFO or device (`>(cmd)`, /dev/null) is written into as it is. A link
    // to an open descriptor (/dev/stdout when stdout is a file) would have the link itself
    // replaced, and a directory cannot be replaced: both are refused.
    if let Output::File(o) = &output {
        let what = match std::fs::metadata(o) {
            Ok(m) if m.is_dir() => Some("a directory"),
            Ok(m) if m.is_file() && std::fs::read_link(o).is_ok_and(|t| t.starts_with("/proc")) => {
                Some("a link to an open file descriptor")
            }
            _ => None,
        };
        if let Some(what) = what {
            bail!(
                "{}: is {what}; the output is written to a file renamed into place when \
                 complete (for standard output, use `-o -`)",
                o.display()
            );
        }
    }
    if let Output::File(o) = &output {
        for i in &inputs {
            if let Input::File(p) = i {
                if std::fs::canonicalize(p)
                    .ok()
                    .is_some_and(|c| std::fs::canonicalize(o).ok() == Some(c))
                {
                    bail!("{}: the output would overwrite an input", o.display());
                }
            }
        }
    }
    let format = a
        .format
        .clone()
        .or_else(|| match &inputs[0] {
            Input::File(p) => Format::from_extension(p),
            Input::Stdin => None,
        })
        .unwrap_or(Format::Lines {
            sep: b'\n',
            skip: 0,
        });
    let format = match format {
        Format::Lines { sep, skip } => Format::Lines {
            sep: a.sep.unwrap_or(sep),
            skip: a.skip.unwrap_or(skip),
        },
        other if a.sep.is_some() || a.skip.is_some() => {
            bail!("--sep and --skip apply to lines, not {}", other.name())
        }
        other => other,
    };
    let opts = ShuffleOptions {
        seed: a.seed,
        memory: a.memory,
        format,
        tmpdir: a.tmpdir.clone(),
        split,
        throttled,
    };
    let bar = progress::bytes(false);
    bar.set_length(shuffle::total_input_estimate(&inputs));
    let rep = shuffle::shuffle(&inputs, &output, &opts, &mut |done| bar.set_position(done))?;
    bar.finish_and_clear();
    if a.json {
        eprintln!("{}", serde_json::to_string(&rep)?);
    } else if !matches!(output, Output::Stdout) {
        eprintln!(
            "shuffled {} records ({}) in {:.2} s, {}{}",
            rep.records,
            human_bytes(rep.bytes as f64),
            rep.seconds,
            if rep.in_memory {
                "in memory".to_owned()
            } else {
                format!(
                    "through {} piles ({} of scratch)",
                    rep.piles,
                    human_bytes(rep.scratch_bytes as f64)
                )
            },
            if rep.outputs.len() > 1 {
                format!(", {} output files", rep.outputs.len())
            } else {
                String::new()
            }
        );
    }
    Ok(())
}
