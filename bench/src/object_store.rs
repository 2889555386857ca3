//! object-store: riffle against the streaming loaders, all reading the same label-sorted
//! records from one S3-compatible server (s3s-fs on loopback, the objects PUT through the
//! API): Mosaic Streaming (`remote=`, its MDS shards, which riffle reads too), LitData
//! (`s3://`, its chunks) and WebDataset (`pipe:` URLs over its tar shards). Each reads two
//! epochs with a local cache limit of 100%, 25% and 10% of the dataset, straight to the
//! server and through an emulated remote link ([`crate::netem::Link::S3`]: the kernel here
//! has no `netem`). Every run goes through a proxy that counts the GETs and bytes it
//! carries; each reader's cache starts empty and the page cache cold.
//!
//! Rows report samples/s over both epochs (riffle: its whole process, listing and staging
//! included; a peer: from its first batch asked, its open left out), each reader's open
//! seconds and seconds to its first batch (both counted from its open's start), each
//! epoch's seconds, labels per batch and
//! position correlation (the shuffle's quality: 10 labels and 0 for a full shuffle), GETs
//! and bytes fetched, and the local disk's peak.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use riffle::gen::{GenFormat, GenSpec};
use riffle::testing::s3::{S3Server, BUCKET};
use serde::Serialize;

use crate::netem::{Link, Proxy};
use crate::report;

/// Options of the suite.
#[derive(Clone, Debug)]
pub struct ObjectStoreOptions {
    /// Where results go.
    pub out: PathBuf,
    /// Where the datasets and caches are made.
    pub data_dir: PathBuf,
    /// Records of 4 KiB.
    pub records: u64,
    /// Local cache limits, as shares of the dataset.
    pub limits: Vec<f64>,
    /// Links: `None` straight to the server, or an emulated one.
    pub links: Vec<Option<Link>>,
    /// Epochs per run.
    pub epochs: u64,
    /// Records per batch.
    pub batch: u32,
    /// DataLoader workers of the peers.
    pub workers: u32,
    /// A run still going after this long is stopped and its rate so far reported.
    pub max_seconds: u64,
    /// Keep the datasets.
    pub keep: bool,
}

/// One run.
#[derive(Clone, Debug, Serialize)]
pub struct OsRun {
    /// Who read.
    pub reader: String,
    /// The link (`none` or `s3`).
    pub link: String,
    /// The cache limit's share of the dataset as stored in the reader's format.
    pub limit_share: f64,
    /// The cache limit, bytes.
    pub limit_bytes: u64,
    /// Records delivered over the epochs.
    pub records: u64,
    /// Seconds over the epochs.
    pub seconds: f64,
    /// Seconds of each epoch.
    pub epoch_seconds: Vec<f64>,
    /// Seconds the reader's open took (riffle: listing and layouts, `open_seconds` of
    /// `riffle read --json`; a peer: its dataset and DataLoader made).
    pub open_seconds: Option<f64>,
    /// Seconds from the open's start to the first batch.
    pub first_batch_seconds: Option<f64>,
    /// Samples per second over the epochs.
    pub samples_per_s: Option<f64>,
    /// Distinct labels per batch (10: shuffled).
    pub labels_per_batch: Option<f64>,
    /// Correlation of delivery position with id (0: shuffled).
    pub position_corr: Option<f64>,
    /// Every record exactly once per epoch.
    pub exactly_once: Option<bool>,
    /// GETs the proxy carried.
    pub gets: u64,
    /// Bytes the proxy carried back.
    pub bytes_fetched: u64,
    /// The local cache's peak on disk.
    pub disk_peak_bytes: Option<u64>,
    /// Why it failed.
    pub error: Option<String>,
}

/// The suite's result.
#[derive(Clone, Debug, Serialize)]
pub struct ObjectStoreReport {
    /// Records and their bytes.
    pub records: u64,
    /// The dataset's bytes (the npy's payload).
    pub dataset_bytes: u64,
    /// Epochs per run.
    pub epochs: u64,
    /// Records per batch.
    pub batch: u32,
    /// The runs.
    pub runs: Vec<OsRun>,
    /// Bytes of each format on the server.
    pub uploaded: Vec<(String, u64)>,
    /// Where written.
    pub report_dir: String,
}

/// The readers: (name, the format's directory on the server, `object_store.py` kind or
/// `None` for `riffle read`).
const READERS: &[(&str, &str, Option<&str>)] = &[
    ("riffle read (MDS shards)", "mds", None),
    ("Mosaic Streaming (py1e)", "mds", Some("mds")),
    ("LitData (shuffle=True)", "litdata", Some("litdata")),
    (
        "WebDataset (shard shuffle + 1,000 buffer)",
        "wds",
        Some("wds"),
    ),
];

/// Bytes per shard (chunk) every format is written in: small enough that a cache of a
/// tenth of the quick dataset holds the four shards Mosaic asks for at least, and that
/// riffle's streamed read, which fetches the largest object alone once to index it, fits
/// that cache too.
const SHARD: u64 = 2 << 20;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("object_store.py")
}

fn peers_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("peers.py")
}

/// The size of everything under `dir`, in allocated blocks.
fn du(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total += m.blocks() * 512,
                Err(_) => {}
            }
        }
    }
    total
}

/// Runs `cmd` to its end (or `limit`), sampling `cache`'s size as it runs: its last JSON
/// line, and the peak.
fn run_sampled(
    cmd: &mut Command,
    cache: &Path,
    limit: Duration,
) -> (Result<serde_json::Value>, u64) {
    let mut peak = 0;
    let res = crate::child::run(cmd, limit, &mut || peak = peak.max(du(cache)))
        .and_then(|(status, out, err)| crate::child::json_result(status, &out, &err));
    (res, peak.max(du(cache)))
}

/// Scores `riffle read --ids-out` batches of label-sorted data: (labels per batch, position
/// correlation, every record once per epoch).
fn score_ids(path: &Path, spec: &GenSpec, epochs: u64) -> Result<(f64, f64, bool)> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let (mut labels, mut batches) = (0usize, 0usize);
    let mut order: Vec<u64> = Vec::new();
    for line in text.lines() {
        let ids: Vec<u64> = line.split(' ').filter_map(|x| x.parse().ok()).collect();
        let mut l: Vec<u32> = ids.iter().map(|&id| spec.label(id)).collect();
        l.sort_unstable();
        l.dedup();
        labels += l.len();
        batches += 1;
        order.extend(ids);
    }
    let n = spec.records;
    let mut once = order.len() as u64 == n * epochs;
    for e in 0..epochs as usize {
        let mut seen = vec![false; n as usize];
        for &id in order.iter().skip(e * n as usize).take(n as usize) {
            once &= (id < n) && !std::mem::replace(&mut seen[id as usize], true);
        }
    }
    let first: Vec<f64> = order.iter().take(n as usize).map(|&x| x as f64).collect();
    Ok((labels as f64 / batches.max(1) as f64, corr(&first), once))
}

/// Pearson correlation of position with value.
fn corr(v: &[f64]) -> f64 {
    let n = v.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mx = (n - 1.0) / 2.0;
    let my = v.iter().sum::<f64>() / n;
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (i, &y) in v.iter().enumerate() {
        let (dx, dy) = (i as f64 - mx, y - my);
        sxy += dx * dy;
        sxx += dx * dx;
        syy += dy * dy;
    }
    sxy / (sxx * syy).sqrt().max(1e-12)
}

/// Runs the suite.
pub fn run(
    opts: &ObjectStoreOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<ObjectStoreReport> {
    let python = crate::peers::ensure_venv(&crate::peers::venv_dir(), &mut |s| {
        eprintln!("object-store: {s}")
    })?;
    let riffle = std::env::current_exe().context("the riffle binary")?;
    let Some(server) = S3Server::start() else {
        bail!("no S3-compatible server here: scripts/s3-server installs s3s-fs");
    };
    std::fs::create_dir_all(&opts.data_dir).with_context(|| opts.data_dir.display().to_string())?;
    let spec = GenSpec {
        format: GenFormat::Npy,
        records: opts.records,
        record_size: 4096,
        jitter: 0.0,
        labels: 10,
        sorted: true,
        seed: 0,
    };
    let base = opts
        .data_dir
        .join(format!("riffle-os-{}x4096", opts.records));
    let npy = base.with_extension("npy");
    let steps = 4 + opts.links.len() * opts.limits.len() * READERS.len();
    let mut step = 0;
    progress(step, steps, "writing the records, each peer's way");
    if !npy.exists() {
        riffle::gen::generate(
            &npy,
            &spec,
            &riffle::io::IoConfig::sequential_write(),
            &mut |_, _| {},
        )?;
    }
    let dataset_bytes = opts.records * 4096;
    let mut uploaded = Vec::new();
    for format in ["mds", "litdata", "wds"] {
        step += 1;
        progress(step, steps, &format!("writing and uploading {format}"));
        let dir = base.with_extension(format);
        if !dir.join(".riffle-written").exists() {
            let _ = std::fs::remove_dir_all(&dir);
            let o = Command::new(&python)
                .arg(peers_script())
                .args(["write", format])
                .arg(&npy)
                .arg(&dir)
                .env("RIFFLE_PEERS_SHARD", SHARD.to_string())
                .output()?;
            if !o.status.success() {
                bail!("writing {format}: {}", String::from_utf8_lossy(&o.stderr));
            }
            std::fs::write(dir.join(".riffle-written"), "")?;
        }
        let mut c = Command::new(&python);
        server.env(&mut c);
        let o = c
            .arg(script())
            .arg("upload")
            .arg(&dir)
            .arg(format!("s3://{BUCKET}/{format}"))
            .output()?;
        if !o.status.success() {
            bail!("uploading {format}: {}", String::from_utf8_lossy(&o.stderr));
        }
        let v: serde_json::Value = serde_json::from_slice(
            o.stdout
                .split(|&b| b == b'\n')
                .find(|l| l.starts_with(b"{"))
                .unwrap_or(b"{}"),
        )
        .unwrap_or_default();
        uploaded.push((format.to_string(), v["bytes"].as_u64().unwrap_or(0)));
    }
    let upstream: std::net::SocketAddr = format!("127.0.0.1:{}", server.port()).parse()?;
    let mut runs = Vec::new();
    for link in &opts.links {
        let proxy = Proxy::start(
            upstream,
            link.unwrap_or(Link {
                delay: Duration::ZERO,
                rate: None,
            }),
        )?;
        let endpoint = format!("http://{}", proxy.addr());
        let link_name = if link.is_some() { "s3" } else { "none" };
        for &share in &opts.limits {
            for (name, format, kind) in READERS {
                // A share of the format's bytes on the server (tar's headers make it
                // larger than the records).
                let stored =
                    (uploaded.iter().find(|(f, _)| f == format)).map_or(dataset_bytes, |u| u.1);
                let limit = (stored as f64 * share) as u64;
                step += 1;
                progress(
                    step,
                    steps,
                    &format!("{name}, cache {:.0}%, link {link_name}", share * 100.0),
                );
                let cache = opts.data_dir.join("riffle-os-cache");
                let _ = std::fs::remove_dir_all(&cache);
                std::fs::create_dir_all(&cache)?;
                let ids = opts.data_dir.join("riffle-os-ids.txt");
                let mut c = match kind {
                    None => {
                        let mut c = Command::new(&riffle);
                        c.arg("read")
                            .arg(format!("s3://{BUCKET}/{format}/"))
                            .args(["--batch-size", &opts.batch.to_string(), "--seed", "1"])
                            .args(["--epochs", &opts.epochs.to_string()])
                            .args(["--cache-limit", &limit.to_string()])
                            .arg("--ids-out")
                            .arg(&ids)
                            .arg("--json")
                            .env("RIFFLE_S3_CACHE", &cache);
                        c
                    }
                    Some(k) => {
                        let mut c = Command::new(&python);
                        c.arg(script())
                            .args(["read", k])
                            .arg(format!("s3://{BUCKET}/{format}"))
                            .arg("--cache")
                            .arg(&cache)
                            .args(["--cache-limit", &limit.to_string()])
                            .args(["--records", &opts.records.to_string()])
                            .args(["--batch-size", &opts.batch.to_string()])
                            .args(["--workers", &opts.workers.to_string()])
                            .args(["--epochs", &opts.epochs.to_string()])
                            .args(["--max-seconds", &opts.max_seconds.to_string()])
                            .env("PYTHONUNBUFFERED", "1");
                        c
                    }
                };
                server.env(&mut c);
                c.env("AWS_ENDPOINT_URL", &endpoint)
                    .env("AWS_ALLOW_HTTP", "true");
                report::drop_caches();
                let before = proxy.counters().read();
                let t = Instant::now();
                let (res, peak) =
                    run_sampled(&mut c, &cache, Duration::from_secs(opts.max_seconds + 120));
                let wall = t.elapsed().as_secs_f64();
                let after = proxy.counters().read();
                let mut r = OsRun {
                    reader: name.to_string(),
                    link: link_name.into(),
                    limit_share: share,
                    limit_bytes: limit,
                    records: 0,
                    seconds: wall,
                    epoch_seconds: Vec::new(),
                    open_seconds: None,
                    first_batch_seconds: None,
                    samples_per_s: None,
                    labels_per_batch: None,
                    position_corr: None,
                    exactly_once: None,
                    gets: after.0 - before.0,
                    bytes_fetched: after.2 - before.2,
                    disk_peak_bytes: Some(peak),
                    error: None,
                };
                match res {
                    Err(e) => r.error = Some(format!("{e:#}")),
                    Ok(v) => {
                        r.records = v["records"].as_u64().unwrap_or(0);
                        // riffle's whole process (listing and staging the objects come
                        // before its read starts); a peer's epochs from its first batch
                        // asked (its interpreter and torch starting are left out).
                        r.seconds = match kind {
                            None => wall,
                            Some(_) => v["seconds"].as_f64().unwrap_or(wall),
                        };
                        r.epoch_seconds = (v["epoch_seconds"].as_array().into_iter().flatten())
                            .filter_map(|x| x.as_f64())
                            .collect();
                        r.samples_per_s = Some(r.records as f64 / r.seconds.max(1e-9));
                        r.open_seconds = v["open_seconds"].as_f64();
                        r.first_batch_seconds = v["first_batch_since_open_seconds"].as_f64();
                        if let Some(p) = v["disk_peak_bytes"].as_u64() {
                            r.disk_peak_bytes = Some(p.max(peak));
                        }
                        if kind.is_none() {
                            let (l, c, once) = score_ids(&ids, &spec, opts.epochs)?;
                            (r.labels_per_batch, r.position_corr, r.exactly_once) =
                                (Some(l), Some(c), Some(once));
                        } else {
                            r.labels_per_batch = v["labels_per_batch"].as_f64();
                            r.position_corr = v["position_corr"].as_f64();
                            r.exactly_once = v["exactly_once"].as_bool();
                        }
                    }
                }
                let _ = std::fs::remove_dir_all(&cache);
                let _ = std::fs::remove_file(&ids);
                runs.push(r);
            }
        }
    }
    if !opts.keep {
        let _ = std::fs::remove_file(&npy);
        for f in ["mds", "litdata", "wds"] {
            let _ = std::fs::remove_dir_all(base.with_extension(f));
        }
    }
    let dir = report::results_dir(&opts.out)?;
    let rep = ObjectStoreReport {
        records: opts.records,
        dataset_bytes,
        epochs: opts.epochs,
        batch: opts.batch,
        runs,
        uploaded,
        report_dir: dir.display().to_string(),
    };
    report::write_report(
        &dir,
        "object-store",
        &serde_json::to_value(&rep)?,
        &markdown(&rep),
    )?;
    Ok(rep)
}

fn human(b: u64) -> String {
    riffle::size::human_bytes(b as f64)
}

/// The report as Markdown.
pub fn markdown(r: &ObjectStoreReport) -> String {
    let mut s =
        String::from("# object-store: riffle against the streaming loaders on one S3 server\n\n");
    s.push_str(&format!(
        "{} {}: {} label-sorted records of 4 KiB ({}), {} epoch(s) per run, batches of {}, \
         each reader's local cache empty and the page cache cold at its start; GETs and bytes \
         counted by the proxy every run goes through (link `s3`: {} ms each way, {} MB/s per \
         connection). On the server: {}.\n\n",
        report::today(),
        report::hostname(),
        r.records,
        human(r.dataset_bytes),
        r.epochs,
        r.batch,
        Link::S3.delay.as_millis(),
        Link::S3.rate.unwrap_or(0) / 1_000_000,
        r.uploaded
            .iter()
            .map(|(f, b)| format!("{f} {}", human(*b)))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    s.push_str(
        "samples/s: records over seconds, riffle's seconds its whole process (its open \
         included), a peer's from its first batch asked (its open, the dataset and DataLoader \
         made, left out). open s: each reader's open (riffle: the listing and the layouts; a \
         peer: its dataset and DataLoader made). first batch s: from the open's start to the \
         first batch.\n\n",
    );
    s.push_str("| link | cache | reader | samples/s | open s | first batch s | epoch s | labels/batch | position corr | every record once | GETs | fetched | disk peak |\n|---|---:|---|---:|---:|---:|---|---:|---:|---|---:|---:|---:|\n");
    for x in &r.runs {
        s.push_str(&format!(
            "| {} | {:.0}% ({}) | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            x.link,
            x.limit_share * 100.0,
            human(x.limit_bytes),
            x.reader,
            match (&x.error, x.samples_per_s) {
                (Some(e), _) => format!("failed: {}", e.chars().take(160).collect::<String>()),
                (None, v) => v.map(|v| format!("{v:.0}")).unwrap_or_default(),
            },
            x.open_seconds
                .map(|v| format!("{v:.2}"))
                .unwrap_or_default(),
            x.first_batch_seconds
                .map(|v| format!("{v:.2}"))
                .unwrap_or_default(),
            x.epoch_seconds
                .iter()
                .map(|e| format!("{e:.1}"))
                .collect::<Vec<_>>()
                .join(" / "),
            x.labels_per_batch
                .map(|v| format!("{v:.1}"))
                .unwrap_or_default(),
            x.position_corr
                .map(|v| format!("{v:.3}"))
                .unwrap_or_default(),
            x.exactly_once.map(|b| b.to_string()).unwrap_or_default(),
            x.gets,
            human(x.bytes_fetched),
            x.disk_peak_bytes.map(human).unwrap_or_default(),
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full shuffle of label-sorted ids scores about 10 labels a batch and no
    /// correlation; ids in order score 1 label and a correlation of 1; a repeat is caught.
    #[test]
    fn riffle_batches_are_scored_from_their_ids() {
        let dir = tempfile::tempdir().unwrap();
        let spec = GenSpec {
            format: GenFormat::Npy,
            records: 100,
            record_size: 4096,
            jitter: 0.0,
            labels: 10,
            sorted: true,
            seed: 0,
        };
        let p = dir.path().join("ids");
        let lines: Vec<String> = (0..10)
            .map(|b| {
                (0..10)
                    .map(|i| (i * 10 + b).to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        std::fs::write(&p, lines.join("\n")).unwrap();
        let (l, _, once) = score_ids(&p, &spec, 1).unwrap();
        assert_eq!((l, once), (10.0, true));
        let ordered: Vec<String> = (0..10)
            .map(|b| {
                (0..10)
                    .map(|i| (b * 10 + i).to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        std::fs::write(&p, ordered.join("\n")).unwrap();
        let (l, c, once) = score_ids(&p, &spec, 1).unwrap();
        assert_eq!((l, once), (1.0, true));
        assert!((c - 1.0).abs() < 1e-9);
        std::fs::write(&p, "0 0\n").unwrap();
        assert!(!score_ids(&p, &spec, 1).unwrap().2);
    }
}
