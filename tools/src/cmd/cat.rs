//! `riffle cat DATASET`: writes records' payloads, read through the engine, to stdout or a
//! file; for inspecting a dataset and for checking the engine against other readers.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use riffle::io::IoConfig;
use riffle::scratch::OutFile;

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

/// The ids asked for, as ranges, each checked against the dataset's `n` records before
/// anything is allocated: ids are produced a window at a time, so `0..N` of a billion
/// records costs no more memory than one window.
fn parse_ids(specs: &[String], n: u64) -> Result<Vec<std::ops::Range<u64>>> {
    if specs.is_empty() {
        return Ok(std::iter::once(0..n).collect());
    }
    let mut ranges = Vec::with_capacity(specs.len());
    for s in specs {
        let r = if let Some((a, b)) = s.split_once("..") {
            let a: u64 = a.parse().with_context(|| format!("bad id range '{s}'"))?;
            let b: u64 = b.parse().with_context(|| format!("bad id range '{s}'"))?;
            if b < a {
                bail!("bad id range '{s}': it ends before it starts (ranges are START..END, END excluded)");
            }
            if b > n {
                bail!("id range '{s}' is out of range: the dataset has {n} records (ids 0..{n})");
            }
            a..b
        } else {
            let id: u64 = s.parse().with_context(|| format!("bad record id '{s}'"))?;
            if id >= n {
                bail!("record id {id} is out of range: the dataset has {n} records");
            }
            id..id + 1
        };
        ranges.push(r);
    }
    Ok(ranges)
}

/// Every file a command reads that an output must not be: the paths named and the
/// dataset's files (a manifest's or a tree's included).
pub fn input_paths(named: &[PathBuf], ds: &riffle::dataset::Dataset) -> Vec<PathBuf> {
    named
        .iter()
        .cloned()
        .chain(ds.files().iter().map(|f| f.path.clone()))
        .collect()
}

/// Where records go: standard output, or a file through the door (a FIFO or device
/// written into; anything else under a temporary name, renamed over `-o` when complete).
enum Sink {
    Stdout(std::io::BufWriter<crate::out::Stdout>),
    File(OutFile),
}

impl Sink {
    fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        match self {
            Sink::Stdout(w) => w.write_all(bytes).context("<stdout>: write")?,
            Sink::File(f) => f.write_all(bytes)?,
        }
        Ok(())
    }

    fn finish(self) -> Result<()> {
        match self {
            Sink::Stdout(mut w) => w.flush().context("<stdout>: write")?,
            Sink::File(f) => f.finish()?,
        }
        Ok(())
    }
}

pub fn run(a: Args) -> Result<()> {
    let opts = a.data.options(false, false, None)?;
    // A mixture's records are its sources side by side (the ids its batches carry).
    let src = a.data.spec()?.open(&opts, &mut |_, _, _| {})?;
    // Records by id are read at random: not from a dataset streamed from object storage.
    src.dataset().refuse_if_streamed("cat")?;
    let ds = src.dataset();
    let ranges = parse_ids(&a.ids, ds.len())?;
    let mut reader = ds.reader(&IoConfig::default())?;
    let mut out = match &a.output {
        Some(p) => Sink::File(OutFile::create(p, &input_paths(&a.data.dataset, ds))?),
        None => Sink::Stdout(std::io::BufWriter::new(crate::out::Stdout::lock())),
    };
    // Records complete in any order; write them in the order asked, a window at a time.
    const WINDOW: usize = 4096;
    let mut ids = ranges.into_iter().flatten().peekable();
    let mut window = Vec::with_capacity(WINDOW);
    while ids.peek().is_some() {
        window.clear();
        window.extend(ids.by_ref().take(WINDOW));
        let mut got: Vec<Option<Vec<u8>>> = vec![None; window.len()];
        ds.read_records(&mut reader, &window, |i, bytes| {
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
    out.finish()
}
