//! A Rust client of `riffle serve` for `bench/resident_node.py` (issue 33): reads 3 epochs
//! of dataset `train` in batches of BATCH with SEED from the daemon at SOCKET, without
//! touching the payload (as `riffle read` does not), and prints one JSON line: records,
//! seconds, and the records/s of the epochs after the first (from its first batch to the
//! last).
//!
//!     resident_client SOCKET SEED BATCH

use std::time::Instant;

use anyhow::{Context, Result};
use riffle::serve::{Client, OpenRequest};

fn main() -> Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let [_, sock, seed, batch] = &a[..] else {
        anyhow::bail!("usage: resident_client SOCKET SEED BATCH");
    };
    let mut c = Client::connect(std::path::Path::new(sock)).context("connect")?;
    let mut r = OpenRequest::new("train", batch.parse()?);
    r.seed = seed.parse()?;
    r.epochs = 3;
    let t0 = Instant::now();
    let mut s = c.open(r)?;
    let (mut records, mut later, mut first_later) = (0u64, 0u64, None);
    while let Some(b) = s.next_batch()? {
        let n = b.ids().len() as u64;
        records += n;
        if b.header.epoch >= 1 {
            match first_later {
                None => first_later = Some(Instant::now()),
                Some(_) => later += n,
            }
        }
    }
    let end = Instant::now();
    let from = first_later.context("no batch after the first epoch")?;
    println!(
        "{}",
        serde_json::json!({
            "seed": r_seed(seed),
            "records": records,
            "seconds": (end - t0).as_secs_f64(),
            "later_records_per_s": later as f64 / (end - from).as_secs_f64().max(1e-9),
        })
    );
    Ok(())
}

fn r_seed(s: &str) -> u64 {
    s.parse().unwrap_or(0)
}
