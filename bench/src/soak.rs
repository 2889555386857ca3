//! A soak of `riffle serve`: for a bounded time, 64 connections at once, honest clients of
//! several jobs beside clients that vanish mid-stream, never read, trickle their
//! handshake, send garbage, ask for impossible splits or absurd worlds, or stall a rank of
//! a shared job. Every honest batch is checked (each epoch's ids exactly once, or for a
//! mixture the epoch's count of draws; every record's bytes carrying its id), and each
//! daemon's RSS and open fds are sampled each second.
//!
//! The daemons serve datasets made by `riffle gen` (a record's first 8 bytes are its id
//! within its source), with `--max-clients` above 64 (honest clients retry while a daemon
//! says `busy`); [`run_targets`] takes any number of (daemon, dataset) targets, so one soak
//! covers files, trees and mixtures under lirs and two-pass at once.

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

/// A dataset a daemon serves, for the soak's honest clients.
#[derive(Clone, Debug)]
pub struct Target {
    /// The daemon's pid (its RSS and fds are sampled).
    pub pid: u32,
    /// Its socket.
    pub socket: PathBuf,
    /// The dataset's name there.
    pub dataset: String,
    /// What it is, in violations (e.g. "two-pass tree").
    pub label: String,
    /// Records per epoch.
    pub records: u64,
    /// A mixture: where each source's ids start. An epoch then draws `records` records
    /// (checked for its count and each record's bytes, not as a permutation).
    pub mixture: Option<Vec<u64>>,
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

/// Reads one epoch of `req` from `t` on a fresh client; the ids it got, after checking each
/// record's bytes.
fn read_epoch(t: &Target, req: OpenRequest, until: Instant) -> Result<(Vec<u64>, u64), String> {
    let mut c = connect(&t.socket, until)?;
    let tag = format!(
        "{} seed {} rank {}/{}",
        t.label, req.seed, req.rank, req.world
    );
    let mut s = c.open(req).map_err(|e| format!("{tag}: open: {e}"))?;
    let mut ids = Vec::new();
    let mut batches = 0;
    while let Some(b) = s.next_batch().map_err(|e| format!("{tag}: {e}"))? {
        batches += 1;
        for (i, &id) in b.ids().iter().enumerate() {
            let local = match &t.mixture {
                Some(starts) => {
                    let src = b.sources().get(i).copied().unwrap_or(u32::MAX) as usize;
                    match starts.get(src) {
                        Some(&first) if first <= id => id - first,
                        _ => return Err(format!("{tag}: record {id} has no source ({src})")),
                    }
                }
                None => id,
            };
            let rec = b.record(i);
            let got = rec
                .get(..8)
                .map(|h| u64::from_le_bytes(h.try_into().expect("8 bytes")));
            if got != Some(local) {
                return Err(format!(
                    "{tag}: batch {} record {i} (id {id}) should carry {local}, carries {got:?}",
                    b.header.index
                ));
            }
        }
        ids.extend_from_slice(b.ids());
    }
    Ok((ids, batches))
}

/// Whether `ids` are one whole epoch of `t`.
fn whole_epoch(t: &Target, ids: Vec<u64>, what: &str) -> Option<String> {
    match t.mixture {
        None => exactly_once(ids, t.records, what),
        Some(_) if ids.len() as u64 == t.records => None,
        Some(_) => Some(format!(
            "{what}: {} draws for an epoch of {}",
            ids.len(),
            t.records
        )),
    }
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
    let t = Target {
        pid,
        socket: socket.to_path_buf(),
        dataset: "train".into(),
        label: "train".into(),
        records,
        mixture: None,
    };
    run_targets(&[t], seconds)
}

/// The kinds of attack, by index.
const KINDS: [&str; 7] = [
    "vanish",
    "never-read",
    "trickle",
    "garbage",
    "hostile-open",
    "stalled-rank",
    "huge-world",
];

/// Runs the soak for `seconds` against `targets` (at least one; their records a multiple
/// of 2 x 100): per target honest clients of a job of their own (8 over all targets, at
/// least one each) and an honest job of 2 ranks, epoch after epoch; attackers take the rest of 64 connections, spread over the
/// targets' daemons.
pub fn run_targets(targets: &[Target], seconds: f64) -> SoakReport {
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let epochs = Arc::new(AtomicU64::new(0));
    let batches = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let counts: Vec<Arc<AtomicU64>> = KINDS.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
    let samples = Arc::new(Mutex::new(Vec::new()));
    let mut pids: Vec<u32> = targets.iter().map(|t| t.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    let bad = |v: &Mutex<Vec<String>>, m: String| {
        let mut v = v.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() < 100 {
            v.push(m);
        }
    };
    // Honest clients of a job of their own per target (8 in all, at least 1 each).
    let solo = (8 / targets.len().max(1)).max(1);
    let honest = targets.len() * (solo + 2);
    std::thread::scope(|s| {
        for (ti, t) in targets.iter().enumerate() {
            let (violations, epochs, batches) = (&violations, &epochs, &batches);
            // Jobs of their own (world 1), epoch after epoch.
            for c in 0..solo {
                s.spawn(move || {
                    let mut seed = (ti * solo + c) as u64 * 10_000;
                    while Instant::now() < until {
                        seed += 1;
                        let mut req = OpenRequest::new(&t.dataset, 100);
                        req.seed = seed;
                        match read_epoch(t, req, until + Duration::from_secs(30)) {
                            Ok((ids, n)) => {
                                batches.fetch_add(n, Ordering::Relaxed);
                                match whole_epoch(t, ids, &format!("{} seed {seed}", t.label)) {
                                    Some(m) => bad(violations, m),
                                    None => {
                                        epochs.fetch_add(1, Ordering::Relaxed);
                                    }
                                }
                            }
                            Err(m) => bad(violations, m),
                        }
                    }
                });
            }
            // A job of 2 ranks (one shared pass), job after job.
            s.spawn(move || {
                let mut seed = 500_000 + ti as u64 * 10_000;
                while Instant::now() < until {
                    seed += 1;
                    let got: Vec<Result<(Vec<u64>, u64), String>> = std::thread::scope(|s2| {
                        let hs: Vec<_> = (0..2u64)
                            .map(|rank| {
                                s2.spawn(move || {
                                    let mut req = OpenRequest::new(&t.dataset, 100);
                                    req.seed = seed;
                                    req.rank = rank;
                                    req.world = 2;
                                    read_epoch(t, req, until + Duration::from_secs(30))
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
                                bad(violations, m);
                            }
                        }
                    }
                    if ok {
                        match whole_epoch(t, all, &format!("{} job seed {seed}", t.label)) {
                            Some(m) => bad(violations, m),
                            None => {
                                epochs.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            });
        }
        // Attackers: the rest of the 64 connections, over the targets in turn.
        for a in 0..64usize.saturating_sub(honest).max(KINDS.len()) {
            let kind = a % KINDS.len();
            let t = &targets[(a / KINDS.len()) % targets.len()];
            let (count, violations) = (counts[kind].clone(), &violations);
            s.spawn(move || {
                let mut i = 0u64;
                while Instant::now() < until {
                    i += 1;
                    count.fetch_add(1, Ordering::Relaxed);
                    if let Err(m) = attack(kind, t, a as u64 * 1_000_000 + i, until) {
                        bad(violations, m);
                    }
                }
            });
        }
        // The daemons' RSS and fds together, each second.
        {
            let (samples, done, pids) = (samples.clone(), done.clone(), &pids);
            s.spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    let (mut rss, mut fds) = (0, 0);
                    for &pid in pids {
                        let (r, f) = proc_rss_fds(pid);
                        rss += r;
                        fds += f;
                    }
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
        attacks: KINDS
            .iter()
            .zip(&counts)
            .map(|(k, c)| (k.to_string(), c.load(Ordering::Relaxed)))
            .collect(),
        rss_growth: to.1 as i64 - from.1 as i64,
        fd_growth: to.2 as i64 - from.2 as i64,
        samples,
    }
}

/// One attack of kind `kind` (an index into [`KINDS`]) on target `t`; an error when an
/// honest part of it (the reading rank beside a stalled one) did not get its batches.
fn attack(kind: usize, t: &Target, n: u64, until: Instant) -> Result<(), String> {
    let hello = proto::json_frame(Kind::Hello, &serde_json::json!({"version": proto::VERSION}));
    let socket = t.socket.as_path();
    let dataset = t.dataset.as_str();
    match kind {
        // Opens a stream, takes some of what the daemon sends, and is gone without a word.
        0 => {
            if let Ok(mut sock) = UnixStream::connect(socket) {
                let _ = sock.set_read_timeout(Some(Duration::from_millis(500)));
                let mut req = OpenRequest::new(dataset, 100);
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
                let mut req = OpenRequest::new(dataset, 100);
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
        4 => {
            if let Ok(mut c) = Client::connect(socket) {
                let mut req = OpenRequest::new(dataset, 32);
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
        // A job of 2 ranks whose rank 1 (inline) never reads: the daemon cuts it at its
        // --idle-timeout and rank 0 must still get every one of its batches.
        5 => {
            let mut req = OpenRequest::new(dataset, 100);
            req.seed = 900_000_000 + n;
            req.world = 2;
            let Ok(mut stuck) = UnixStream::connect(socket) else {
                std::thread::sleep(Duration::from_millis(50));
                return Ok(());
            };
            let mut r1 = req.clone();
            r1.rank = 1;
            r1.transport = riffle::serve::Transport::Inline;
            let _ = stuck.write_all(&hello);
            let _ = stuck.write_all(&proto::json_frame(Kind::Open, &r1));
            let mut c = match connect(socket, until) {
                Ok(c) => c,
                // Busy past the soak's end: nothing was promised.
                Err(_) if Instant::now() >= until => return Ok(()),
                Err(e) => return Err(format!("stalled-rank: rank 0: {e}")),
            };
            let tag = format!("stalled-rank {} seed {}: rank 0", t.label, req.seed);
            let mut st = c.open(req).map_err(|e| format!("{tag}: open: {e}"))?;
            let want = st.opened.batches_per_epoch;
            let mut got = 0;
            while st
                .next_batch()
                .map_err(|e| format!("{tag}: {e}"))?
                .is_some()
            {
                got += 1;
            }
            drop(stuck);
            if got != want {
                return Err(format!("{tag} got {got} of its {want} batches"));
            }
        }
        // Absurd worlds: batch 1 over 2^64-1, 10^9 or 2^53 x 256 ranks, padded; refused
        // at OPEN (a pass that pads such an epoch would run on with no member).
        _ => {
            if let Ok(mut c) = Client::connect(socket) {
                let mut req = OpenRequest::new(dataset, 1);
                req.world = [u64::MAX, 1_000_000_000, (1 << 53) * 256][(n % 3) as usize];
                req.rank = n % 7;
                req.tail = "pad".into();
                let world = req.world;
                if c.open(req).is_ok() {
                    return Err(format!(
                        "{}: an OPEN of a world of {world} was admitted",
                        t.label
                    ));
                }
            } else {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    Ok(())
}
