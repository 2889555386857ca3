//! `riffle bench SUITE`.

use std::path::PathBuf;

use anyhow::{bail, Result};
use riffle::size::parse_size;
use riffle_bench::ParityOptions;

use crate::progress;

#[derive(clap::Args)]
pub struct Args {
    /// The suite to run: fio-parity (more suites arrive with the modes).
    pub suite: String,
    /// A shorter run (fewer seconds per point, one run per side).
    #[arg(long)]
    pub quick: bool,
    /// Where results/<date>-<host>/ is written.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// Where test files are made (on the device to measure).
    #[arg(long, default_value = ".")]
    pub data_dir: PathBuf,
    /// Test file size for fio-parity.
    #[arg(long, default_value = "4G", value_parser = parse_size)]
    pub size: u64,
    /// Seconds per run (default: 3 with --quick, 10 otherwise).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// fio-parity points as BLOCK:QD pairs, comma separated (default
    /// 4K:1,4K:32,4K:64,4K:128,16K:64,64K:64).
    #[arg(long, value_delimiter = ',', value_parser = parse_point)]
    pub points: Vec<(usize, usize)>,
    /// Runs per side and point (default: 1 with --quick, 2 otherwise).
    #[arg(long)]
    pub repeats: Option<usize>,
    /// Keep the test file for the next run.
    #[arg(long)]
    pub keep: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    match args.suite.as_str() {
        "fio-parity" | "all" => {
            let mut opts = ParityOptions::new(args.quick, args.out.clone(), args.data_dir.clone());
            opts.file_size = args.size;
            opts.keep_file = args.keep;
            if !args.points.is_empty() {
                opts.points = args.points.clone();
            }
            if let Some(r) = args.repeats {
                opts.repeats = r.max(1);
            }
            if let Some(s) = args.seconds {
                opts.seconds = s.max(1);
            }
            let bar = progress::steps((opts.points.len() * 2 * opts.repeats + 1) as u64, args.json);
            let rep = riffle_bench::fio_parity(&opts, &mut |done, _, what| {
                bar.set_position(done as u64);
                bar.set_message(what.to_owned());
            })?;
            bar.finish_and_clear();
            if args.json {
                println!("{}", serde_json::to_string(&rep)?);
            } else {
                print!("{}", riffle_bench::fio_parity::markdown(&rep));
                println!("\nwritten to {}/fio-parity.{{json,md}}", rep.report_dir);
            }
            Ok(())
        }
        other => bail!("unknown suite '{other}': the suites are fio-parity and all"),
    }
}

fn parse_point(text: &str) -> Result<(usize, usize), String> {
    let (bs, qd) = text
        .split_once(':')
        .ok_or_else(|| format!("'{text}': expected BLOCK:QD, like 4K:64"))?;
    let bs = parse_size(bs)? as usize;
    let qd: usize = qd
        .parse()
        .map_err(|_| format!("'{text}': queue depth '{qd}' is not a number"))?;
    if bs == 0 || qd == 0 {
        return Err(format!(
            "'{text}': block size and queue depth must be positive"
        ));
    }
    Ok((bs, qd))
}
