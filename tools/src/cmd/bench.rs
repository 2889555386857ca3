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
