//! `riffle cat DATASET`: writes records' payloads, read through the engine, to stdout or a
//! file; for inspecting a dataset and for checking the engine against other readers.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use riffle::io::IoConfig;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub data: super::dataset::DatasetArgs,
    /// Record ids to print (comma separated; ranges like 10..20 allowed). Default: all.
    #[arg(long, value_delimiter = ',')]
    pub ids: Vec<String>,
    /// Prefix each record with its length as a u64, little endian (for programs).
    #[arg(long)]
    pub framed: bool,
    /// Put a newline after each record (for text).
    #[arg(long, conflicts_with = "framed")]
    pub newline: bool,
    /// Write here instead of stdout.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

fn parse_ids(specs: &[String], n: u64) -> Result<Vec<u64>> {
    if specs.is_empty() {
        return Ok((0..n).collect());
    }
    let mut ids = Vec::new();
    for s in specs {
        if let Some((a, b)) = s.split_once("..") {
            let a: u64 = a.parse().with_context(|| format!("bad id range '{s}'"))?;
            let b: u64 = b.parse().with_context(|| format!("bad id range '{s}'"))?;
            ids.extend(a..b);
        } else {
            ids.push(s.parse().with_context(|| format!("bad record id '{s}'"))?);
        }
    }
    if let Some(bad) = ids.iter().find(|&&i| i >= n) {
        bail!("record id {bad} is out of range: the dataset has {n} records");
    }
    Ok(ids)
}

pub fn run(a: Args) -> Result<()> {
    let opts = a.data.options(false, false, None)?;
    // A mixture's records are its sources side by side (the ids its batches carry).
    let src = a.data.spec()?.open(&opts, &mut |_, _, _| {})?;
    let ds = src.dataset();
    let ids = parse_ids(&a.ids, ds.len())?;
    let mut reader = ds.reader(&IoConfig::default())?;
    let mut out: Box<dyn Write> = match &a.output {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("{}: cannot create", p.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(crate::out::Stdout::lock())),
    };
    // Records complete in any order; write them in the order asked, a window at a time.
    const WINDOW: usize = 4096;
    for window in ids.chunks(WINDOW) {
        let mut got: Vec<Option<Vec<u8>>> = vec![None; window.len()];
        ds.read_records(&mut reader, window, |i, bytes| {
            got[i] = Some(bytes.to_vec())
        })?;
        for rec in got {
            let rec = rec.expect("every record delivered");
            if a.framed {
                out.write_all(&(rec.len() as u64).to_le_bytes())?;
            }
            out.write_all(&rec)?;
            if a.newline {
                out.write_all(b"\n")?;
            }
        }
    }
    out.flush()?;
    Ok(())
}
