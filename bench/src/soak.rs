//! A soak of `riffle serve`: for a bounded time, 64 connections at once, honest clients of
//! several jobs beside clients that vanish mid-stream, never read, trickle their
//! handshake, send garbage or ask for impossible splits. Every honest batch is checked
//! (each epoch's ids exactly once, every record's bytes carrying its id), and the daemon's
//! RSS and open fds are sampled each second.
//!
//! The daemon must serve a `.npy` of `records` records made by `riffle gen` (a record's
//! first 8 bytes are its id) as dataset `train`, with `--max-clients` above 64 (honest
//! clients retry while the daemon says `busy`).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use riffle::serve::proto::{self, Kind};
use riffle::serve::{Client, OpenRequest};
use serde::Serialize;

/// What the soak saw.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SoakReport {
    /// Seconds run.
    pub seconds: f64,
    /// Honest epochs read whole and checked.
    pub honest_epochs: u64,
    /// Honest batches checked.
    pub honest_batches: u64,
    /// Anything an honest client saw wrong (lost, repeated or corrupted records, errors).
    pub violations: Vec<String>,
    /// Attacks made, by kind.
    pub attacks: Vec<(String, u64)>,
    /// (seconds since start, RSS bytes, open fds) of the daemon, each second.
    pub samples: Vec<(f64, u64, u64)>,
    /// RSS growth over the last 80% of the run (last sample minus the sample at 20%;
    /// can be negative).
    pub rss_growth: i64,
    /// Open-fd growth over the same span.
    pub fd_growth: i64,
}

fn connect(socket: &Path, until: Instant) -> Result<Client, String> {
    loop {
        match Client::connect(socket) {
            Ok(c) => return Ok(c),
            Err(e) if e.daemon_code() == Some("busy") && Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => return Err(format!("connect: {e}")),
        }
    }
}

/// Reads one epoch of `req` on a fresh client; the ids it got, after checking each
/// record's bytes.
fn read_epoch(socket: &Path, req: OpenRequest, until: Instant) -> Result<(Vec<u64>, u64), String> {
    let mut c = connect(socket, until)?;
    let tag = format!("seed {} rank {}/{}", req.seed, req.rank, req.world);
    let mut s = c.open(req).map_err(|e| format!("{tag}: open: {e}"))?;
    let mut ids = Vec::new();
    let mut batches = 0;
    while let Some(b) = s.next_batch().map_err(|e| format!("{tag}: {e}"))? {
        batches += 1;
        for (i, &id) in b.ids().iter().enumerate() {
            let rec = b.record(i);
            let got = rec
                .get(..8)
                .map(|h| u64::from_le_bytes(h.try_into().expect("8 bytes")));
            if got != Some(id) {
                return Err(format!(
                    "{tag}: batch {} record {i} should carry id {id}, carries {got:?}",
                    b.header.index
                ));
            }
        }
        ids.extend_from_slice(b.ids());
    }
    Ok((ids, batches))
}

fn exactly_once(mut ids: Vec<u64>, records: u64, what: &str) -> Option<String> {
    ids.sort_unstable();
    if ids.len() as u64 == records && ids.iter().enumerate().all(|(i, &id)| i as u64 == id) {
        return None;
    }
    let dup = ids.windows(2).filter(|w| w[0] == w[1]).count();
    Some(format!(
        "{what}: {} ids for {records} records ({dup} repeated)",
        ids.len()
    ))
}

fn proc_rss_fds(pid: u32) -> (u64, u64) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb << 10);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    (rss, fds)
}

/// Runs the soak for `seconds` against the daemon `pid` listening on `socket`, whose
/// dataset `train` has `records` records (a multiple of 4 x 100).
pub fn run(pid: u32, socket: &Path, records: u64, seconds: f64) -> SoakReport {
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    let socket: PathBuf = socket.to_path_buf();
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let epochs = Arc::new(AtomicU64::new(0));
    let batches = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let kinds = ["vanish", "never-read", "trickle", "garbage", "hostile-open"];
    let counts: Vec<Arc<AtomicU64>> = kinds.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
    let samples = Arc::new(Mutex::new(Vec::new()));
    std::thread::scope(|s| {
        let bad = |v: &Arc<Mutex<Vec<String>>>, m: String| {
            let mut v = v.lock().unwrap_or_else(|p| p.into_inner());
            if v.len() < 100 {
                v.push(m);
            }
        };
        // 8 honest clients, each a job of its own (world 1), epoch after epoch.
        for c in 0..8u64 {
            let (socket, violations, epochs, batches) =
                (&socket, violations.clone(), epochs.clone(), batches.clone());
            s.spawn(move || {
                let mut seed = c * 1000;
                while Instant::now() < until {
                    seed += 1;
                    let mut req = OpenRequest::new("train", 100);
                    req.seed = seed;
                    match read_epoch(socket, req, until + Duration::from_secs(30)) {
                        Ok((ids, n)) => {
                            batches.fetch_add(n, Ordering::Relaxed);
                            match exactly_once(ids, records, &format!("seed {seed}")) {
                                Some(m) => bad(&violations, m),
                                None => {
                                    epochs.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        Err(m) => bad(&violations, m),
                    }
                }
            });
        }
        // 2 honest jobs of 4 ranks each (world 4: one shared pass per job), job after job.
        for j in 0..2u64 {
            let (socket, violations, epochs, batches) =
                (&socket, violations.clone(), epochs.clone(), batches.clone());
            s.spawn(move || {
                let mut seed = 500_000 + j * 1000;
                while Instant::now() < until {
                    seed += 1;
                    let got: Vec<Result<(Vec<u64>, u64), String>> = std::thread::scope(|s2| {
                        let hs: Vec<_> = (0..4u64)
                            .map(|rank| {
                                s2.spawn(move || {
                                    let mut req = OpenRequest::new("train", 100);
                                    req.seed = seed;
                                    req.rank = rank;
                                    req.world = 4;
                                    read_epoch(socket, req, until + Duration::from_secs(30))
                                })
                            })
                            .collect();
                        hs.into_iter()
                            .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
                            .collect()
                    });
                    let mut all = Vec::new();
                    let mut ok = true;
                    for g in got {
                        match g {
                            Ok((ids, n)) => {
                                batches.fetch_add(n, Ordering::Relaxed);
                                all.extend(ids);
                            }
                            Err(m) => {
                                ok = false;
                                bad(&violations, m);
                            }
                        }
                    }
                    if ok {
                        match exactly_once(all, records, &format!("job seed {seed}")) {
                            Some(m) => bad(&violations, m),
                            None => {
                                epochs.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            });
        }
        // 48 attackers: the rest of the 64 connections.
        for a in 0..48usize {
            let kind = a % kinds.len();
            let (socket, count) = (&socket, counts[kind].clone());
            s.spawn(move || {
                let mut i = 0u64;
                while Instant::now() < until {
                    i += 1;
                    count.fetch_add(1, Ordering::Relaxed);
                    attack(kind, socket, a as u64 * 1_000_000 + i, until);
                }
            });
        }
        // The daemon's RSS and fds, each second.
        {
            let (samples, done) = (samples.clone(), done.clone());
            s.spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    let (rss, fds) = proc_rss_fds(pid);
                    samples.lock().unwrap_or_else(|p| p.into_inner()).push((
                        started.elapsed().as_secs_f64(),
                        rss,
                        fds,
                    ));
                    std::thread::sleep(Duration::from_secs(1));
                }
            });
        }
        // Ends the sampler once the clients are done (the scope waits for them).
        s.spawn({
            let done = done.clone();
            move || {
                while Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(100));
                }
                // The clients finish the epoch they are in; give them time.
                std::thread::sleep(Duration::from_secs(2));
                done.store(true, Ordering::Relaxed);
            }
        });
    });
    let samples = Arc::try_unwrap(samples)
        .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()))
        .unwrap_or_default();
    let from = samples
        .iter()
        .find(|s| s.0 >= seconds * 0.2)
        .or(samples.first())
        .copied()
        .unwrap_or_default();
    let to = samples.last().copied().unwrap_or_default();
    let violations = violations.lock().unwrap_or_else(|p| p.into_inner()).clone();
    SoakReport {
        seconds: started.elapsed().as_secs_f64(),
        honest_epochs: epochs.load(Ordering::Relaxed),
        honest_batches: batches.load(Ordering::Relaxed),
        violations,
        attacks: kinds
            .iter()
            .zip(&counts)
            .map(|(k, c)| (k.to_string(), c.load(Ordering::Relaxed)))
            .collect(),
        rss_growth: to.1 as i64 - from.1 as i64,
        fd_growth: to.2 as i64 - from.2 as i64,
        samples,
    }
}

/// One attack of kind `kind` (an index into the soak's kinds).
fn attack(kind: usize, socket: &Path, n: u64, until: Instant) {
    let hello = proto::json_frame(Kind::Hello, &serde_json::json!({"version": proto::VERSION}));
    match kind {
        // Opens a stream, takes some of what the daemon sends, and is gone without a word.
        0 => {
            if let Ok(mut sock) = UnixStream::connect(socket) {
                let _ = sock.set_read_timeout(Some(Duration::from_millis(500)));
                let mut req = OpenRequest::new("train", 100);
                req.seed = n;
                let _ = sock.write_all(&hello);
                let _ = sock.write_all(&proto::json_frame(Kind::Open, &req));
                let mut x = vec![0u8; 1 + (n % 4096) as usize];
                let _ = sock.read(&mut x);
                let _ = sock.read(&mut x);
            } else {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // Opens a stream and never reads or acknowledges, for a few seconds.
        1 => {
            if let Ok(mut c) = Client::connect(socket) {
                let mut req = OpenRequest::new("train", 100);
                req.seed = n;
                req.epochs = 3;
                let _ = c.send(&proto::json_frame(Kind::Open, &req));
                let stay = Instant::now() + Duration::from_secs(3);
                while Instant::now() < stay.min(until) {
                    std::thread::sleep(Duration::from_millis(100));
                }
            } else {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // Trickles its HELLO a byte every 100 ms until the daemon hangs up (its handshake
        // deadline) or the soak ends.
        2 => {
            if let Ok(mut sock) = UnixStream::connect(socket) {
                let _ = sock.set_read_timeout(Some(Duration::from_millis(1)));
                for b in hello.iter().cycle() {
                    if Instant::now() >= until || sock.write_all(&[*b]).is_err() {
                        break;
                    }
                    let mut x = [0u8; 64];
                    if matches!(sock.read(&mut x), Ok(0)) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        // Garbage: a frame of an unknown kind, an oversized length, random bytes.
        3 => {
            if let Ok(mut sock) = UnixStream::connect(socket) {
                let _ = sock.set_read_timeout(Some(Duration::from_secs(2)));
                let junk: Vec<u8> = match n % 3 {
                    0 => vec![5, 0, 0, 0, 250, 1, 2, 3, 4],
                    1 => vec![0xff, 0xff, 0xff, 0x7f, 1],
                    _ => (0..256u64)
                        .map(|i| (i.wrapping_mul(n).wrapping_mul(2654435761) >> 7) as u8)
                        .collect(),
                };
                let _ = sock.write_all(&hello);
                let _ = sock.write_all(&junk);
                let mut sink = Vec::new();
                let _ = sock.read_to_end(&mut sink);
            }
        }
        // Impossible splits and overflowing arithmetic.
        _ => {
            if let Ok(mut c) = Client::connect(socket) {
                let mut req = OpenRequest::new("train", 32);
                match n % 3 {
                    0 => {
                        req.world = (1 << 63) - 1;
                        req.tail = "pad".into();
                    }
                    1 => {
                        req.rank = (1 << 63) - 1;
                        req.world = 1 << 63;
                    }
                    _ => {
                        req.world = (1 << 59) + 1;
                    }
                }
                let _ = c.open(req);
            } else {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}
