//! `riffle serve` as users (and misbehaving clients) meet it: the real daemon on a real
//! socket, the Rust client of the engine crate, raw frames for the faults.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use riffle::serve::proto::{self, Kind, OpenRequest, WireCursor};
use riffle::serve::Client;
use serde_json::Value;

use crate::{assert_ok, gen, text, Sandbox};

/// A running daemon, killed when dropped.
pub(crate) struct Daemon {
    pub(crate) child: Child,
    socket: PathBuf,
}

impl Daemon {
    pub(crate) fn start(
        sb: &Sandbox,
        socket: &Path,
        datasets: &[(&str, &Path)],
        extra: &[&str],
    ) -> Daemon {
        Self::start_from(sb.cmd(), socket, datasets, extra)
    }

    /// A daemon started by `c` (`riffle`, or a wrapper that then runs it) with the
    /// `serve` arguments.
    pub(crate) fn start_from(
        mut c: std::process::Command,
        socket: &Path,
        datasets: &[(&str, &Path)],
        extra: &[&str],
    ) -> Daemon {
        c.arg("serve").arg("--socket").arg(socket);
        for (name, path) in datasets {
            c.arg("--dataset").arg(format!("{name}={}", path.display()));
        }
        c.args(extra).stdout(Stdio::null()).stderr(Stdio::piped());
        // auto would probe the sandbox's device at start (tests/plan.rs covers auto).
        if !extra.contains(&"--mode") {
            c.args(["--mode", "lirs"]);
        }
        let child = c.spawn().unwrap();
        let mut d = Daemon {
            child,
            socket: socket.to_path_buf(),
        };
        d.wait_ready();
        d
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Some(st) = self.child.try_wait().unwrap() {
                let mut err = String::new();
                use std::io::Read;
                self.child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                panic!("riffle serve exited with {st}: {err}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("riffle serve did not listen on {}", self.socket.display());
    }

    pub(crate) fn client(&self) -> Client {
        Client::connect(&self.socket).unwrap()
    }

    /// A client, retrying while the daemon says `busy`: a connection that just ended (the
    /// readiness check, a stats query) frees its slot asynchronously.
    pub(crate) fn client_when_free(&self) -> Client {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match Client::connect(&self.socket) {
                Ok(c) => return c,
                Err(e) if Instant::now() < deadline && e.daemon_code() == Some("busy") => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    pub(crate) fn stats(&self) -> Value {
        self.client().stats().unwrap()
    }

    pub(crate) fn rss_bytes(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kb * 1024
    }

    /// Polls the stats until `pred` holds (the daemon notices departures asynchronously).
    pub(crate) fn wait_stats(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = self.stats();
            if pred(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "{what}: stats stay {s}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A generated `.npy` dataset (records carry their id and label) in the sandbox.
pub(crate) fn dataset(sb: &Sandbox, name: &str, records: u64, size: u64) -> PathBuf {
    let p = sb.data().join(name);
    gen(sb, &p, "npy", records, size, &[]);
    p
}

/// The batches of a job read in process (the reference the daemon must equal).
pub(crate) fn in_process(path: &Path, req: &OpenRequest) -> Vec<riffle::modes::Batch> {
    use riffle::dataset::{Dataset, OpenOptions};
    let ds = Dataset::open(&[path], &OpenOptions::default(), &mut |_, _, _| {}).unwrap();
    let mut o = riffle::modes::ReadOptions::new(req.batch_size);
    o.seed = req.seed;
    o.first_epoch = req.epoch;
    o.epochs = req.epochs;
    o.rank = req.rank;
    o.world = req.world;
    o.resume = req.resume.map(|c| riffle::modes::Cursor {
        epoch: c.epoch,
        batch: c.batch,
    });
    riffle::modes::read(ds.into(), o)
        .unwrap()
        .map(|b| b.unwrap())
        .collect()
}

/// What a stream delivered: (epoch, index, ids, offsets, payload) per batch.
pub(crate) type Got = Vec<(u64, u64, Vec<u64>, Vec<u64>, Vec<u8>)>;

pub(crate) fn read_all(client: &mut Client, req: OpenRequest) -> Got {
    let mut s = client.open(req).unwrap();
    let mut out = Vec::new();
    while let Some(b) = s.next_batch().unwrap() {
        out.push((
            b.header.epoch,
            b.header.index,
            b.ids().to_vec(),
            b.offsets().to_vec(),
            b.data().to_vec(),
        ));
    }
    out
}

pub(crate) fn same_batches(got: &Got, want: &[riffle::modes::Batch]) {
    assert_eq!(got.len(), want.len(), "batch count");
    for (g, w) in got.iter().zip(want) {
        assert_eq!((g.0, g.1), (w.epoch, w.index));
        assert_eq!(g.2, w.ids, "ids of batch {}", w.index);
        assert_eq!(g.3, w.offsets, "offsets of batch {}", w.index);
        assert!(g.4[..] == w.payload[..], "payload of batch {}", w.index);
    }
}

fn frame_raw(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut v = ((body.len() + 1) as u32).to_le_bytes().to_vec();
    v.push(kind);
    v.extend_from_slice(body);
    v
}

/// Reads frames from a raw socket until an ERROR; returns its JSON and checks the daemon
/// then closes the connection.
pub(crate) fn expect_fatal_error(sock: &mut UnixStream) -> Value {
    use std::io::Read;
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    // Read to the end; a reset after the last frame (unread input at the daemon's close)
    // counts as the end too.
    let mut all = Vec::new();
    let mut chunk = [0u8; 4096];
    while let Ok(n) = sock.read(&mut chunk) {
        if n == 0 {
            break;
        }
        all.extend_from_slice(&chunk[..n]);
    }
    let mut i = 0;
    while i + 5 <= all.len() {
        let n = u32::from_le_bytes(all[i..i + 4].try_into().unwrap()) as usize;
        if all[i + 4] == Kind::Error as u8 {
            let v: Value = serde_json::from_slice(&all[i + 5..i + 4 + n]).unwrap();
            assert_eq!(v["fatal"], true, "{v}");
            return v;
        }
        i += 4 + n;
    }
    panic!(
        "no ERROR frame before the daemon closed: {} bytes",
        all.len()
    );
}

pub(crate) fn hello() -> Vec<u8> {
    proto::json_frame(Kind::Hello, &serde_json::json!({"version": proto::VERSION}))
}

#[test]
fn serve_delivers_the_same_batches_as_an_in_process_read_over_shm_and_inline() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 3000, 200);
    let sock = sb.path().join("s.sock");
    let d = Daemon::start(&sb, &sock, &[("train", &data)], &[]);
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the socket is private by default");

    let mut req = OpenRequest::new("train", 128);
    req.seed = 5;
    req.epochs = 2;
    let want = in_process(&data, &req);
    let mut c = d.client();
    assert_eq!(c.datasets, vec!["train".to_string()]);
    same_batches(&read_all(&mut c, req.clone()), &want);
    req.transport = riffle::serve::Transport::Inline;
    same_batches(&read_all(&mut c, req.clone()), &want);

    // The stats count what went out.
    let s = c.stats().unwrap();
    let records: u64 = want.iter().map(|b| b.ids.len() as u64).sum();
    assert_eq!(s["records"], 2 * records, "{s}");
    assert_eq!(s["batches"], 2 * want.len() as u64);
    // Every shared-memory batch was assembled by the engine in the ring itself (the ring
    // has room for all the client may hold and the engine may have in flight); inline
    // batches never are.
    assert_eq!(s["batches_in_place"], want.len() as u64, "{s}");
    // Most were announced by the engine's thread itself as they completed (the first ones
    // may complete before OPENED is out, and the connection thread sends those).
    let early = s["batches_announced_early"].as_u64().unwrap();
    assert!(early > 0 && early <= want.len() as u64, "{s}");
    assert!(s["read_ops"].as_u64().unwrap() > 0, "{s}");
    assert!(s["batch_latency_us"]["p99"].as_u64().unwrap() > 0, "{s}");

    // A second daemon on the same socket is refused.
    let o = sb
        .cmd()
        .args(["serve", "--mode", "lirs", "--socket"])
        .arg(&sock)
        .arg("--dataset")
        .arg(format!("x={}", data.display()))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("already listening"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn four_ranks_together_receive_an_exact_permutation() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 4000, 64);
    let sock = sb.path().join("s.sock");
    let d = Daemon::start(&sb, &sock, &[("train", &data)], &[]);
    let all: Vec<Vec<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|rank| {
                let d = &d;
                s.spawn(move || {
                    let mut req = OpenRequest::new("train", 100);
                    req.seed = 11;
                    req.epoch = 3;
                    req.rank = rank;
                    req.world = 4;
                    let got = read_all(&mut d.client(), req);
                    assert_eq!(got.len(), 10, "every rank gets the same number of batches");
                    got.into_iter().flat_map(|b| b.2).collect::<Vec<u64>>()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut ids: Vec<u64> = all.concat();
    ids.sort_unstable();
    assert_eq!(ids, (0..4000).collect::<Vec<_>>());
}

/// Bytes the process has read from storage (direct reads included).
fn read_bytes(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    let line = s.lines().find(|l| l.starts_with("read_bytes:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn the_ranks_of_one_job_share_one_pass() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 20_000, 1024);
    let size = std::fs::metadata(&data).unwrap().len();
    for mode in ["lirs", "two-pass"] {
        let sock = sb.path().join(format!("{mode}.sock"));
        let scratch = sb.path().join("scratch");
        let d = Daemon::start(
            &sb,
            &sock,
            &[("train", &data)],
            &["--mode", mode, "--scratch", scratch.to_str().unwrap()],
        );
        let before = read_bytes(d.child.id());
        let req = |rank| {
            let mut r = OpenRequest::new("train", 100);
            r.seed = 5;
            r.rank = rank;
            r.world = 4;
            r
        };
        let got: Vec<Got> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|rank| {
                    let d = &d;
                    s.spawn(move || read_all(&mut d.client(), req(rank)))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, g) in got.iter().enumerate() {
            same_batches(g, &in_process(&data, &req(rank as u64)));
        }
        let s = d.stats();
        assert_eq!(s["jobs_total"], 1, "{mode}: one pass for the job: {s}");
        assert_eq!(s["streams_shared"], 4, "{s}");
        // One pass: the dataset read once (two-pass: and its piles once), not once per rank.
        let read = read_bytes(d.child.id()) - before;
        let bound = if mode == "lirs" {
            3 * size / 2
        } else {
            5 * size / 2
        };
        assert!(
            read <= bound,
            "{mode}: the daemon read {read} bytes for a job over a dataset of {size}"
        );
        // A fifth stream of the same job after the pass: a new pass, the same batches.
        let late = read_all(&mut d.client(), req(2));
        same_batches(&late, &in_process(&data, &req(2)));
        assert_eq!(d.stats()["jobs_total"], 2);
    }
}

#[test]
fn one_memory_budget_admits_streams_waits_and_refuses_with_the_numbers() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 50_000, 1000);
    let sock = sb.path().join("s.sock");
    // Room for a few streams (a 1 MiB ring and a pass of some MiB each), no more.
    let d = Daemon::start(
        &sb,
        &sock,
        &[("train", &data)],
        &[
            "--memory",
            "24M",
            "--max-clients",
            "24",
            "--admit-wait",
            "1",
        ],
    );
    let base = d.stats()["memory_used"].as_u64().unwrap();
    let mut open = Vec::new();
    // Streams held open (never read: OPEN sent, OPENED taken) until one is refused.
    let refused: Value = loop {
        let mut c = d.client();
        let mut req = OpenRequest::new("train", 64);
        req.seed = open.len() as u64;
        c.send(&proto::json_frame(Kind::Open, &req)).unwrap();
        let (k, body) = c.frame().unwrap();
        match k {
            Kind::Opened => open.push(c),
            Kind::Error => break serde_json::from_slice(&body).unwrap(),
            k => panic!("{k:?}"),
        }
        assert!(open.len() < 24, "24 streams fit in 24M");
    };
    assert!(
        !open.is_empty(),
        "not even one stream was admitted: {refused}"
    );
    assert_eq!(refused["code"], "busy", "{refused}");
    let msg = refused["message"].as_str().unwrap();
    assert!(msg.contains("needs") && msg.contains("free"), "{msg}");
    let s = d.stats();
    assert!(s["memory_used"].as_u64().unwrap() <= 24 << 20, "{s}");
    // A stream that closes gives its memory back: the next one is admitted.
    drop(open.pop());
    let mut c = d.client();
    let got = {
        let mut st = c.open(OpenRequest::new("train", 64)).unwrap();
        let mut n = 0;
        while let Some(b) = st.next_batch().unwrap() {
            n += b.ids().len();
        }
        n
    };
    assert_eq!(got, 50_000);
    drop(open);
    drop(c);
    d.wait_stats("memory given back", |s| {
        s["memory_used"].as_u64() == Some(base)
    });
}

#[test]
fn two_pass_streams_are_admitted_within_the_scratch_limit() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 50_000, 1000);
    let scratch = sb.path().join("scratch");
    let start = |limit: &str, name: &str| {
        Daemon::start(
            &sb,
            &sb.path().join(name),
            &[("train", &data)],
            &[
                "--mode",
                "two-pass",
                "--scratch",
                scratch.to_str().unwrap(),
                "--scratch-limit",
                limit,
                "--admit-wait",
                "0",
            ],
        )
    };
    // Piles of a 50 MB dataset never fit in 20 MB of scratch: refused at once as
    // `too_large` (not `busy`: waiting cannot help), with the numbers.
    let d = start("20M", "a.sock");
    let e = d
        .client()
        .open(OpenRequest::new("train", 64))
        .err()
        .unwrap();
    assert_eq!(e.daemon_code(), Some("too_large"), "{e}");
    assert!(e.to_string().contains("--scratch-limit"), "{e}");
    assert!(e.to_string().contains("limit 20971520"), "{e}");
    drop(d);
    // In 100 MB, one stream's piles fit and a second stream's wait for them.
    let d = start("100M", "b.sock");
    let mut c = d.client();
    let mut st = c.open(OpenRequest::new("train", 64)).unwrap();
    assert!(st.next_batch().unwrap().is_some());
    let planned = d.stats()["scratch_planned"].as_u64().unwrap();
    assert!(planned > 50_000_000 && planned <= 100 << 20, "{planned}");
    let mut req = OpenRequest::new("train", 64);
    req.seed = 1;
    let e = d.client().open(req).err().unwrap();
    assert_eq!(e.daemon_code(), Some("busy"), "{e}");
    let mut n = 1;
    while st.next_batch().unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, 50_000usize.div_ceil(64));
    drop(st);
    drop(c);
    // A job's first pass rolls nothing past its end (kept piles, and their eviction by
    // another job's admission: tests/serve/rolled.rs): its scratch is given back.
    let s = d.wait_stats("scratch given back", |s| s["scratch_planned"] == 0);
    assert_eq!(s["rolled"]["kept_now"], 0, "{s}");
}

#[test]
fn stall_telemetry_per_stream_and_job_and_every_few_seconds() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 20_000, 1000);
    let sock = sb.path().join("s.sock");
    let mut d = Daemon::start(
        &sb,
        &sock,
        &[("train", &data)],
        &[
            "--stats-every",
            "1",
            "--memory",
            "64M",
            "--max-clients",
            "64",
        ],
    );
    // Two ranks of one job; rank 1 holds its batches until the daemon has filled its ring,
    // so that the daemon's batches for it wait on it (back-pressure).
    let req = |rank| {
        let mut r = OpenRequest::new("train", 100);
        r.rank = rank;
        r.world = 2;
        r
    };
    let (mut c0, mut c1) = (d.client(), d.client());
    let mut s0 = c0.open(req(0)).unwrap();
    let mut s1 = c1.open(req(1)).unwrap();
    assert!(s0.next_batch().unwrap().is_some());
    assert!(s1.next_batch().unwrap().is_some());
    let id1 = s1.opened.stream.unwrap();
    let job = s1.opened.job.unwrap();
    // The batches rank 1's ring holds (it may hold `credits`), all of them announced.
    let fits = (s1.opened.ring_bytes / s1.opened.max_batch_bytes).min(s1.opened.credits as u64);
    let st = d.wait_stats("rank 1's ring filled", |st| {
        st["stream_waits"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["stream"] == id1 && w["batches"].as_u64().unwrap() >= fits)
    });
    let w1 = st["stream_waits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["stream"] == id1)
        .unwrap_or_else(|| panic!("stream {id1} in {st}"));
    assert_eq!(w1["job"], job);
    let jw = st["job_waits"].as_array().unwrap();
    assert!(jw.iter().any(|w| w["job"] == job), "{st}");
    let (mut n0, mut n1) = (1, 1);
    let mut seen = None;
    std::thread::scope(|s| {
        s.spawn(|| {
            while s0.next_batch().unwrap().is_some() {
                n0 += 1;
            }
        });
        while s1.next_batch().unwrap().is_some() {
            n1 += 1;
            if n1 == 20 {
                // Still open: the daemon's side of rank 1, whose batches waited on it
                // while it slept.
                seen = Some(d.stats());
            }
        }
    });
    assert_eq!((n0, n1), (100, 100));
    let st = seen.unwrap();
    let w1 = st["stream_waits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["stream"] == id1)
        .unwrap_or_else(|| panic!("stream {id1} in {st}"));
    // Its ring full, the daemon waited on rank 1 (each wait is counted when it ends).
    assert!(w1["client_wait_s"].as_f64().unwrap() > 0.0, "{w1}");
    assert!(w1["client_wait_us"]["max"].as_u64().unwrap() > 0, "{w1}");
    assert!(w1["batches"].as_u64().unwrap() >= 20, "{w1}");
    // The client's side: every batch's wait counted.
    let mine = s1.stats();
    assert_eq!(mine.batches, 100);
    assert!(mine.wait_max_us >= mine.wait_p50_us);
    drop(s0);
    drop(s1);
    // --stats-every 1: a JSON line a second on stderr, read as it comes.
    let err = d.child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut seen = String::new();
        for l in std::io::BufReader::new(err).lines() {
            let Ok(l) = l else { break };
            if let Some(json) = l.strip_prefix("riffle serve stats: ") {
                let _ = tx.send(Ok(json.to_owned()));
                return;
            }
            seen.push_str(&l);
            seen.push('\n');
        }
        let _ = tx.send(Err(seen));
    });
    let line = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(line)) => line,
        Ok(Err(seen)) => panic!("no stats line in {seen}"),
        Err(e) => panic!("no stats line in 60 s: {e}"),
    };
    let _ = d.child.kill();
    let v: Value = serde_json::from_str(&line).unwrap();
    assert!(
        v["job_waits"].is_array() && v["memory_limit"] == 64 << 20,
        "{v}"
    );
}

/// Issue 29 (deliverables 4 and 8): in a world-2 job, rank 1 (inline) stops reading. The
/// daemon's write to it has a deadline (`--idle-timeout`), so rank 1 is cut and leaves
/// the job, and rank 0 gets every one of its batches. The stall shows while it lasts
/// (rank 0's wait on the engine grows in the stats as it happens) and stays in the stats
/// after the job ended (`job_waits`, `live: false`, with its largest wait).
#[test]
fn a_rank_that_stops_reading_is_cut_its_job_goes_on_and_the_stall_shows() {
    use proto::Transport;
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 20_000, 4096);
    let sock = sb.path().join("s.sock");
    let d = Daemon::start(&sb, &sock, &[("train", &data)], &["--idle-timeout", "3"]);
    let req = |rank, transport| {
        let mut r = OpenRequest::new("train", 50);
        r.rank = rank;
        r.world = 2;
        r.transport = transport;
        r
    };
    let mut stuck = UnixStream::connect(&sock).unwrap();
    stuck.write_all(&hello()).unwrap();
    stuck
        .write_all(&proto::json_frame(Kind::Open, &req(1, Transport::Inline)))
        .unwrap();
    let mut reader = d.client();
    let mut s0 = reader.open(req(0, Transport::Shm)).unwrap();
    let id0 = s0.opened.stream.unwrap();
    let job = s0.opened.job.unwrap();
    let want = s0.opened.batches_per_epoch;
    let mut got = 0u64;
    let mut stalled_seen = 0.0f64;
    std::thread::scope(|sc| {
        let reading = sc.spawn(|| {
            while s0.next_batch().unwrap().is_some() {
                got += 1;
            }
        });
        // While rank 0 starves (the pass waits on rank 1 until its cut), its wait grows
        // in the stats as it happens.
        while !reading.is_finished() {
            let st = d.stats();
            if let Some(w) = st["stream_waits"]
                .as_array()
                .unwrap()
                .iter()
                .find(|w| w["stream"] == id0)
            {
                stalled_seen = stalled_seen.max(w["engine_wait_now_s"].as_f64().unwrap());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    assert_eq!(got, want, "rank 0 got {got} of its {want} batches");
    assert!(
        stalled_seen >= 0.5,
        "a stall of rank 0 (its pass waited on rank 1 until its cut) was never shown while \
         it lasted: the largest wait in progress seen was {stalled_seen} s"
    );
    // Rank 1 was cut: its connection ends (part of a frame may be out when its write's
    // deadline passed, so there is no ERROR frame to expect).
    stuck
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut rest = Vec::new();
    use std::io::Read;
    let _ = stuck.read_to_end(&mut rest);
    let st = d.wait_stats("the job ended", |s| {
        s["job_waits"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["job"] == job && w["live"] == false)
    });
    let jw = st["job_waits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["job"] == job)
        .unwrap()
        .clone();
    assert!(
        jw["engine_wait_us"]["max"].as_u64().unwrap() >= 500_000
            && jw["engine_wait_s"].as_f64().unwrap() >= 0.5,
        "the job's stall left the stats with it: {jw}"
    );
    assert_eq!(st["errors"]["panic"], Value::Null, "{st}");
}

#[test]
fn a_soak_of_honest_clients_among_attackers_loses_nothing_and_stays_flat() {
    // 20 s here (RIFFLE_SOAK_SECS to change it); `riffle bench node` runs it for 5 minutes.
    let secs: f64 = std::env::var("RIFFLE_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20.0);
    let sb = Sandbox::new();
    let records = 40_000;
    let data = dataset(&sb, "d.npy", records, 512);
    let sock = sb.path().join("s.sock");
    let d = Daemon::start(
        &sb,
        &sock,
        &[("train", &data)],
        &["--max-clients", "80", "--idle-timeout", "5"],
    );
    let r = riffle_bench::soak::run(d.child.id(), &sock, records, secs);
    eprintln!(
        "soak {:.0} s: {} honest epochs ({} batches) checked, attacks {:?}, RSS growth {} B, fd growth {}",
        r.seconds, r.honest_epochs, r.honest_batches, r.attacks, r.rss_growth, r.fd_growth
    );
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert!(r.honest_epochs >= 10, "{r:?}");
    for (kind, n) in &r.attacks {
        assert!(*n > 0, "no {kind} attack was made");
    }
    assert!(
        r.fd_growth <= 8,
        "fds grew by {}: {:?}",
        r.fd_growth,
        r.samples
    );
    assert!(
        r.rss_growth < 64 << 20,
        "RSS grew by {} bytes: {:?}",
        r.rss_growth,
        r.samples
    );
    // Once everyone has gone, every slot and byte is given back.
    d.wait_stats("all released", |s| {
        s["streams_now"] == 0 && s["ring_bytes"] == 0 && s["jobs_now"] == 0
    });
}

#[test]
fn sixty_four_clients_at_once() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 2000, 64);
    let sock = sb.path().join("s.sock");
    let d = Daemon::start(
        &sb,
        &sock,
        &[("train", &data)],
        &["--memory", "64M", "--queue-depth", "8"],
    );
    let barrier = std::sync::Barrier::new(64);
    std::thread::scope(|s| {
        for i in 0..64u64 {
            let (d, barrier) = (&d, &barrier);
            s.spawn(move || {
                let mut c = d.client_when_free();
                barrier.wait(); // all 64 connected before any reads
                let mut req = OpenRequest::new("train", 50);
                req.seed = i;
                let mut ids: Vec<u64> = read_all(&mut c, req)
                    .into_iter()
                    .flat_map(|b| b.2)
                    .collect();
                ids.sort_unstable();
                assert_eq!(ids, (0..2000).collect::<Vec<_>>(), "client {i}");
            });
        }
    });
    let s = d.stats();
    assert!(s["connections_total"].as_u64().unwrap() >= 64, "{s}");
    assert_eq!(s["streams_total"], 64);
    assert_eq!(s["records"], 64 * 2000);
    // One more than --max-clients is refused, with a reason.
    // (The readers' and the stats' connections end asynchronously: retry while busy.)
    let many: Vec<Client> = (0..64)
        .map(|_| {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                match Client::connect(&sock) {
                    Ok(c) => break c,
                    Err(e) if Instant::now() < deadline && e.daemon_code() == Some("busy") => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        })
        .collect();
    let mut extra = UnixStream::connect(&sock).unwrap();
    // The daemon may have answered and closed already.
    let _ = extra.write_all(&hello());
    let e = expect_fatal_error(&mut extra);
    assert_eq!(e["code"], "busy", "{e}");
    // The Rust client says `busy` every time, whether its HELLO went out before the daemon
    // closed or met the closed socket (it used to say "Broken pipe").
    for _ in 0..20 {
        match Client::connect(&sock) {
            Err(e) => assert_eq!(e.daemon_code(), Some("busy"), "{e}"),
            Ok(_) => panic!("a 65th client was served"),
        }
    }
    drop(many);
}

#[test]
fn an_unknown_dataset_is_a_clear_error_and_the_connection_stays_usable() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 500, 64);
    let sock = sb.path().join("s.sock");
    let d = Daemon::start(&sb, &sock, &[("train", &data), ("val", &data)], &[]);
    let mut c = d.client();
    let e = c
        .open(OpenRequest::new("/etc/passwd", 10))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("unknown dataset '/etc/passwd'") && e.contains("train, val"),
        "{e}"
    );
    // Bad parameters are errors too, not crashes.
    let mut bad = OpenRequest::new("train", 10);
    bad.rank = 4;
    bad.world = 4;
    let e = c.open(bad).err().unwrap().to_string();
    assert!(e.contains("rank 4"), "{e}");
    // A batch that could not fit a client's share of memory is refused up front.
    let e = c
        .open(OpenRequest::new("train", u64::MAX))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("ring share") && e.contains("(too_large)"), "{e}");
    assert_eq!(read_all(&mut c, OpenRequest::new("val", 100)).len(), 5);
}

#[test]
fn garbage_oversized_frames_and_bad_acks_get_an_error_and_leave_others_alone() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 20_000, 256);
    let sock = sb.path().join("s.sock");
    let d = Daemon::start(&sb, &sock, &[("train", &data)], &[]);
    // A well-behaved client streams throughout.
    std::thread::scope(|s| {
        let good = s.spawn(|| {
            let mut req = OpenRequest::new("train", 64);
            req.epochs = 2;
            let got = read_all(&mut d.client(), req);
            assert_eq!(got.len(), 2 * 20_000usize.div_ceil(64));
        });
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            (
                "random bytes",
                b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
                "oversize",
            ),
            ("zero length", vec![0, 0, 0, 0, 1], "protocol"),
            (
                "oversized frame",
                {
                    let mut v = ((2u32 << 20) + 1).to_le_bytes().to_vec();
                    v.push(1);
                    v.extend(vec![b'x'; 4096]);
                    v
                },
                "oversize",
            ),
            (
                "unknown kind",
                [hello(), frame_raw(99, b"{}")].concat(),
                "protocol",
            ),
            (
                "not JSON",
                frame_raw(Kind::Hello as u8, b"\xff\xfe{{"),
                "protocol",
            ),
            (
                "wrong version",
                proto::json_frame(Kind::Hello, &serde_json::json!({"version": 999})),
                "version",
            ),
            (
                "open before hello",
                proto::json_frame(Kind::Open, &OpenRequest::new("train", 8)),
                "protocol",
            ),
            (
                "bad open",
                [hello(), frame_raw(Kind::Open as u8, b"{\"dataset\": 3}")].concat(),
                "protocol",
            ),
            (
                "ack of a slot never sent",
                [
                    hello(),
                    proto::json_frame(Kind::Open, &OpenRequest::new("train", 8)),
                    frame_raw(Kind::Ack as u8, &12345u32.to_le_bytes()),
                ]
                .concat(),
                "protocol",
            ),
            (
                "ragged ack",
                [hello(), frame_raw(Kind::Ack as u8, &[1, 2, 3])].concat(),
                "protocol",
            ),
        ];
        for (what, bytes, code) in cases {
            let mut sock = UnixStream::connect(&d.socket).unwrap();
            sock.write_all(&bytes).unwrap();
            let e = expect_fatal_error(&mut sock);
            assert_eq!(e["code"], code, "{what}: {e}");
        }
        good.join().unwrap();
    });
    let s = d.stats();
    assert!(s["errors"]["protocol"].as_u64().unwrap() >= 6, "{s}");
    // Everything those clients held is released.
    d.wait_stats("streams released", |s| {
        s["streams_now"] == 0 && s["ring_bytes"] == 0
    });
}

#[test]
fn clients_that_never_ack_stall_only_themselves_and_memory_stays_bounded() {
    let sb = Sandbox::new();
    // 40 MB of records; each stalled stream may hold at most its ring (1 MiB here) and
    // its pass's memory, all within --memory.
    let data = dataset(&sb, "d.npy", 40_000, 1000);
    let sock = sb.path().join("s.sock");
    let d = Daemon::start(
        &sb,
        &sock,
        &[("train", &data)],
        &["--memory", "64M", "--max-clients", "64"],
    );
    let before = d.rss_bytes();
    let mut stalled = Vec::new();
    for _ in 0..8 {
        let mut c = d.client();
        let mut req = OpenRequest::new("train", 64);
        req.epochs = 5;
        c.send(&proto::json_frame(Kind::Open, &req)).unwrap();
        stalled.push(c);
    }
    // Each gets what fits its ring and its credits, then nothing more.
    let mut counts = Vec::new();
    for c in &mut stalled {
        let (k, _) = c.frame().unwrap();
        assert_eq!(k, Kind::Opened);
        let mut n = 0;
        c.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        while let Ok((k, _)) = c.frame() {
            assert_eq!(k, Kind::Batch);
            n += 1;
        }
        counts.push(n);
    }
    let ring = d.stats()["ring_share"].as_u64().unwrap();
    let per_batch = 64 * 1000 + 64 * 16;
    for n in &counts {
        assert!(
            *n >= 1 && *n as u64 <= ring / per_batch as u64 + 1,
            "{counts:?}"
        );
    }
    // Meanwhile another client reads a whole epoch.
    let got = read_all(&mut d.client(), OpenRequest::new("train", 64));
    assert_eq!(got.len(), 40_000usize.div_ceil(64));
    let s = d.stats();
    assert!(s["ring_bytes"].as_u64().unwrap() <= s["ring_bytes_limit"].as_u64().unwrap());
    assert!(s["memory_used"].as_u64().unwrap() <= 64 << 20, "{s}");
    let grown = d.rss_bytes().saturating_sub(before);
    assert!(
        grown < 64 << 20,
        "the daemon grew by {grown} bytes with 8 stalled clients"
    );
    drop(stalled);
    d.wait_stats("stalled streams released", |s| {
        s["streams_now"] == 0 && s["ring_bytes"] == 0
    });
}

#[test]
fn a_client_vanishing_mid_stream_or_mid_frame_is_cleaned_up() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 20_000, 512);
    let sock = sb.path().join("s.sock");
    let d = Daemon::start(&sb, &sock, &[("train", &data)], &[]);
    for half_frame in [false, true] {
        let mut c = d.client();
        c.send(&proto::json_frame(
            Kind::Open,
            &OpenRequest::new("train", 32),
        ))
        .unwrap();
        let (k, _) = c.frame().unwrap();
        assert_eq!(k, Kind::Opened);
        let (k, _) = c.frame().unwrap();
        assert_eq!(k, Kind::Batch);
        if half_frame {
            // Half an ACK, then gone.
            c.send(&frame_raw(Kind::Ack as u8, &0u32.to_le_bytes())[..6])
                .unwrap();
        }
        drop(c);
    }
    d.wait_stats("vanished clients released", |s| {
        s["streams_now"] == 0 && s["ring_bytes"] == 0 && s["clients"] == 1
    });
    assert_eq!(
        read_all(&mut d.client(), OpenRequest::new("train", 1000)).len(),
        20
    );
}

#[test]
fn a_daemon_killed_and_restarted_resumes_clients_with_nothing_lost_or_repeated() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 5000, 128);
    let sock = sb.path().join("s.sock");
    let mut req = OpenRequest::new("train", 100);
    req.seed = 9;
    req.epochs = 2;
    let want = in_process(&data, &req);
    let mut got: Vec<(u64, u64, Vec<u64>)> = Vec::new();
    let mut cursor: Option<WireCursor> = None;
    // Kill the daemon three times along the way.
    for kill_after in [17usize, 40, 30, usize::MAX] {
        let mut d = Daemon::start(&sb, &sock, &[("train", &data)], &[]);
        let mut c = d.client();
        let mut r = req.clone();
        r.resume = cursor;
        let mut s = c.open(r).unwrap();
        let mut n = 0;
        loop {
            if n == kill_after {
                d.child.kill().unwrap();
                d.child.wait().unwrap();
            }
            match s.next_batch() {
                Ok(Some(b)) => {
                    got.push((b.header.epoch, b.header.index, b.ids().to_vec()));
                    n += 1;
                }
                Ok(None) => break,
                Err(_) => {
                    assert!(n >= kill_after, "an error before the kill");
                    break;
                }
            }
        }
        cursor = Some(s.cursor());
        let finished = s.ended() && n < kill_after;
        drop(s);
        if finished {
            break;
        }
        assert!(
            sock.exists(),
            "SIGKILL leaves the socket file; the next start replaces it"
        );
    }
    let want: Vec<(u64, u64, Vec<u64>)> = want
        .into_iter()
        .map(|b| (b.epoch, b.index, b.ids))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn sigterm_tells_clients_and_removes_the_socket() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 20_000, 512);
    let sock = sb.path().join("s.sock");
    let mut d = Daemon::start(&sb, &sock, &[("train", &data)], &["--socket-mode", "660"]);
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);
    // One client mid-stream (not acking), one idle.
    let mut busy = d.client();
    busy.send(&proto::json_frame(
        Kind::Open,
        &OpenRequest::new("train", 16),
    ))
    .unwrap();
    assert_eq!(busy.frame().unwrap().0, Kind::Opened);
    let mut idle = d.client();
    let o = std::process::Command::new("kill")
        .args(["-TERM", &d.child.id().to_string()])
        .output()
        .unwrap();
    assert_ok(&o);
    let started = Instant::now();
    let status = loop {
        if let Some(st) = d.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    assert!(!sock.exists(), "the socket file is removed");
    for c in [&mut busy, &mut idle] {
        let e = loop {
            match c.frame() {
                Ok((Kind::Error, body)) => break serde_json::from_slice::<Value>(&body).unwrap(),
                Ok(_) => continue,
                Err(e) => panic!("closed without saying why: {e}"),
            }
        };
        assert_eq!(e["code"], "shutdown", "{e}");
    }
}

/// Regression (issue 15): the accept loop was woken by connecting to the daemon's own
/// socket path, so with the socket file removed, or taken by another daemon, SIGTERM was
/// ignored. Now it is woken through a pipe: the daemon ends within a second, and removes
/// the socket path only if it is still its own.
#[test]
fn sigterm_stops_the_daemon_whatever_happened_to_its_socket_path() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 2_000, 64);
    let sock = sb.path().join("s.sock");
    let term_and_wait = |d: &mut Daemon| {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(d.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        // Before the fix the daemon never noticed the signal: waiting long is no harm.
        let started = Instant::now();
        loop {
            if let Some(st) = d.child.try_wait().unwrap() {
                assert!(st.success(), "{st}");
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "no exit 60 s after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    // The socket file removed.
    let mut d = Daemon::start(&sb, &sock, &[("train", &data)], &[]);
    std::fs::remove_file(&sock).unwrap();
    term_and_wait(&mut d);
    // The path taken by another daemon after the first one's file was removed: the first
    // stops, and the second's socket is left in place, still served.
    let mut first = Daemon::start(&sb, &sock, &[("train", &data)], &[]);
    std::fs::remove_file(&sock).unwrap();
    let mut second = Daemon::start(&sb, &sock, &[("train", &data)], &[]);
    term_and_wait(&mut first);
    assert!(sock.exists(), "the other daemon's socket was removed");
    let mut c = second.client();
    c.send(&proto::json_frame(
        Kind::Open,
        &OpenRequest::new("train", 16),
    ))
    .unwrap();
    assert_eq!(c.frame().unwrap().0, Kind::Opened);
    drop(c);
    term_and_wait(&mut second);
    assert!(!sock.exists());
}

#[test]
fn two_pass_mode_serves_the_same_batches_and_cleans_its_scratch() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 3000, 100);
    let scratch = sb.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let sock = sb.path().join("s.sock");
    let d = Daemon::start(
        &sb,
        &sock,
        &[("train", &data)],
        &["--mode", "two-pass", "--scratch", scratch.to_str().unwrap()],
    );
    let mut req = OpenRequest::new("train", 100);
    req.seed = 2;
    req.epochs = 2;
    let want = in_process(&data, &req);
    let mut c = d.client();
    same_batches(&read_all(&mut c, req.clone()), &want);
    // Two-pass cuts its batches straight into the ring too.
    assert_eq!(c.stats().unwrap()["batches_in_place"], want.len() as u64);
    // A stream closed half-way leaves no piles behind.
    let mut s = c.open(req).unwrap();
    for _ in 0..5 {
        s.next_batch().unwrap().unwrap();
    }
    s.close().unwrap();
    // Nothing is left: a job's first pass rolls nothing past its end (a job opened epoch
    // by epoch: tests/serve/rolled.rs).
    assert_eq!(std::fs::read_dir(&scratch).unwrap().count(), 0);
    assert_eq!(c.stats().unwrap()["rolled"]["kept_now"], 0);
}

/// The bytes of the piles under `scratch` (every file below it).
pub(crate) fn pile_bytes(scratch: &Path) -> u64 {
    fn walk(dir: &Path) -> u64 {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return 0;
        };
        entries
            .flatten()
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => walk(&e.path()),
                Ok(m) => m.len(),
                Err(_) => 0,
            })
            .sum()
    }
    walk(scratch)
}

/// Polls until `done`, and returns the most pile bytes seen under `scratch` meanwhile: what
/// a scatter wrote before it stopped. The deadline only catches a hang: a scatter that goes
/// on to its end is caught by its bytes.
fn piles_until(what: &str, scratch: &Path, mut done: impl FnMut() -> bool) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut most = pile_bytes(scratch);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 300 s");
        most = most.max(pile_bytes(scratch));
        std::thread::sleep(Duration::from_millis(5));
    }
    most
}

/// Regression (issue 14): the connection thread waited for a two-pass stream's first
/// batch, which comes only after the whole scatter, so a CLOSE (or SIGTERM) during the
/// scatter was taken only when it ended, and the piles stayed until then. Closed as soon as
/// its scatter has written a pile, the stream's scratch goes before the scatter wrote half
/// of what a whole one writes (measured in the same test); a SIGTERM then ends the daemon
/// as early. Events, not durations: what the scatter wrote before it stopped.
#[test]
fn a_two_pass_stream_closed_during_its_scatter_goes_at_once() {
    let sb = Sandbox::new();
    // Half a gigabyte of small records: a scatter of some seconds in a debug build.
    let data = dataset(&sb, "d.npy", 4_000_000, 128);
    let scratch = sb.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let sock = sb.path().join("s.sock");
    let mut d = Daemon::start(
        &sb,
        &sock,
        &[("train", &data)],
        // Not led: the first batch waits for the whole scatter (the reference).
        &[
            "--mode",
            "two-pass",
            "--no-lead",
            "--scratch",
            scratch.to_str().unwrap(),
        ],
    );
    let piles_left = || std::fs::read_dir(&scratch).unwrap().count();
    let req = OpenRequest::new("train", 256);
    // The reference: the first batch comes once the whole dataset is scattered, every pile
    // written.
    let mut c = d.client();
    let mut s = c.open(req.clone()).unwrap();
    s.next_batch().unwrap().unwrap();
    let whole = pile_bytes(&scratch);
    s.close().unwrap();
    assert_eq!(piles_left(), 0);
    let data_bytes = std::fs::metadata(&data).unwrap().len();
    assert!(
        whole >= data_bytes * 9 / 10,
        "a whole scatter wrote {whole} bytes of piles for {data_bytes} bytes"
    );
    let started_scattering = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(300);
        while pile_bytes(&scratch) == 0 {
            assert!(
                Instant::now() < deadline,
                "{what}: no pile written in 300 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };

    // Closed once its scatter has written a pile.
    let s = c.open(req.clone()).unwrap();
    started_scattering("closed during the scatter");
    s.close().unwrap();
    let wrote = piles_until(
        "closed during the scatter: the scratch went",
        &scratch,
        || piles_left() == 0,
    );
    eprintln!("closed during the scatter: {wrote} bytes of piles; a whole scatter {whole}");
    assert!(
        wrote < whole / 2,
        "closed during the scatter, it wrote {wrote} bytes of piles; a whole scatter {whole}"
    );
    let st = d.wait_stats("the stream is closed", |s| s["streams_now"] == 0);
    assert_eq!(st["streams_total"], 2, "{st}");

    // SIGTERM once a scatter has written a pile.
    let mut c2 = d.client();
    c2.send(&proto::json_frame(Kind::Open, &req)).unwrap();
    assert_eq!(c2.frame().unwrap().0, Kind::Opened);
    started_scattering("SIGTERM during the scatter");
    let o = std::process::Command::new("kill")
        .args(["-TERM", &d.child.id().to_string()])
        .output()
        .unwrap();
    assert_ok(&o);
    let wrote = piles_until("SIGTERM: the daemon exited", &scratch, || {
        d.child.try_wait().unwrap().is_some()
    });
    eprintln!("SIGTERM during the scatter: {wrote} bytes of piles; a whole scatter {whole}");
    assert!(
        wrote < whole / 2,
        "SIGTERM during the scatter: it wrote {wrote} bytes of piles; a whole scatter {whole}"
    );
    assert_eq!(piles_left(), 0);

    // Led by LIRS (the default): the first batch comes before the scatter ends, the same
    // as a read in process, and a CLOSE right after it stops the lead and the scatter at
    // once: from the first batch to the scratch's removal, the piles never reach a whole
    // scatter's. (The lead and the scatter share the machine, so how far the scatter got
    // by the first batch varies: about half of it on an idle 2-core machine.)
    let sock = sb.path().join("led.sock");
    let d = Daemon::start(
        &sb,
        &sock,
        &[("train", &data)],
        &["--mode", "two-pass", "--scratch", scratch.to_str().unwrap()],
    );
    let mut c = d.client();
    let mut s = c.open(req.clone()).unwrap();
    let first: Vec<u64> = s.next_batch().unwrap().unwrap().ids().to_vec();
    let at_first = pile_bytes(&scratch);
    assert_eq!(first.len(), 256, "the lead's first batch");
    s.close().unwrap();
    let wrote = piles_until("led, closed after its first batch", &scratch, || {
        piles_left() == 0
    });
    eprintln!(
        "led: {at_first} bytes of piles at the first batch, {wrote} at most until the close \
         took them; a whole scatter {whole}"
    );
    assert!(
        at_first.max(wrote) < whole,
        "led: {at_first} bytes of piles at the first batch, {wrote} at most until the close \
         took them; a whole scatter {whole}"
    );
    drop(c);
    drop(d);
}

#[test]
fn auto_mode_plans_each_stream_from_the_device_profile() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 2000, 16_000);
    crate::plan::probe_small(&sb);
    // A disk: random reads of 16 KB records lose to sequential passes.
    crate::plan::fake_profile(&sb, 600.0, 150e6);
    let sock = sb.path().join("s.sock");
    // --memory 80M: held copies may take 59 MiB, less than the 64 MiB holding the records
    // resident takes, so the stream is read by the plan's streaming mode (issue 33).
    let flags = ["--mode", "auto", "--memory", "80M"];
    let d = Daemon::start(&sb, &sock, &[("train", &data)], &flags);
    let mut req = OpenRequest::new("train", 64);
    req.epochs = 2;
    let want = in_process(&data, &req);
    let mut c = d.client();
    {
        let s = c.open(req.clone()).unwrap();
        assert_eq!(s.opened.mode, "two-pass");
    }
    same_batches(&read_all(&mut c, req.clone()), &want);
    drop(c);
    drop(d);
    // A device whose random reads are as fast as its bandwidth: LIRS.
    crate::plan::fake_profile(&sb, 5e6, 3e9);
    let d = Daemon::start(&sb, &sock, &[("train", &data)], &flags);
    let mut c = d.client();
    {
        let s = c.open(req.clone()).unwrap();
        assert_eq!(s.opened.mode, "lirs");
    }
    drop(c);
    drop(d);
    // Memory that holds them: the planner's resident choice is held by the daemon (it was
    // read by the streaming mode before, issue 33), the same batches.
    let d = Daemon::start(&sb, &sock, &[("train", &data)], &["--mode", "auto"]);
    let mut c = d.client();
    {
        let s = c.open(req.clone()).unwrap();
        assert_eq!(s.opened.mode, "resident");
    }
    same_batches(&read_all(&mut c, req), &want);
    let s = c.stats().unwrap();
    assert_eq!(s["resident"]["held"][0]["dataset"], "train", "{s}");
}

#[test]
fn end_counts_every_batch_announced_even_those_cut_short_by_close() {
    // Batches are announced from the engine's thread as they complete; a CLOSE can land
    // while some are still queued for the connection thread. END must count what the
    // client was actually sent.
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 4000, 100);
    let sock = sb.path().join("s.sock");
    let d = Daemon::start(&sb, &sock, &[("train", &data)], &[]);
    let mut c = d.client();
    for round in 0..5 {
        let mut req = OpenRequest::new("train", 20);
        req.seed = round;
        c.send(&proto::json_frame(Kind::Open, &req)).unwrap();
        let (k, _) = c.frame().unwrap();
        assert_eq!(k, Kind::Opened);
        // Take a few batches without acking (the daemon sends up to its credits), then
        // close mid-stream.
        let mut got = 0u64;
        while got < 3 + round {
            let (k, _) = c.frame().unwrap();
            assert_eq!(k, Kind::Batch);
            got += 1;
        }
        c.send(&proto::frame(Kind::Close, &[])).unwrap();
        let end = loop {
            match c.frame().unwrap() {
                (Kind::Batch, _) => got += 1,
                (Kind::End, body) => break serde_json::from_slice::<Value>(&body).unwrap(),
                (k, _) => panic!("unexpected {k:?} after CLOSE"),
            }
        };
        assert_eq!(end["reason"], "closed");
        assert_eq!(
            end["batches"], got,
            "round {round}: END says {end}, the client got {got}"
        );
    }
    let s = c.stats().unwrap();
    assert_eq!(s["streams_now"], 0, "{s}");
}

/// Regression (issue 15): the HELLO limit was per read, so a HELLO trickled a byte at a
/// time held a slot for as long as the trickle lasted; after HELLO there was no limit at
/// all. Now the whole handshake has 10 s, and a client that leaves the daemon waiting on
/// it longer than --idle-timeout (no stream open, or a stream stalled on its acks) is told
/// `timeout` and its slot freed, while a client that reads goes on.
#[test]
fn slow_and_idle_clients_lose_their_slot_and_honest_ones_do_not() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 20_000, 64);
    let sock = sb.path().join("s.sock");
    let d = Daemon::start(
        &sb,
        &sock,
        &[("train", &data)],
        &["--idle-timeout", "1", "--max-clients", "8"],
    );
    // A HELLO trickled so that it would take 14 s: cut off 10 s after connecting.
    let trickler = {
        let sock = sock.clone();
        std::thread::spawn(move || {
            let mut s = UnixStream::connect(&sock).unwrap();
            let started = Instant::now();
            let bytes = hello();
            let gap = Duration::from_secs(14) / bytes.len() as u32;
            let mut written = 0;
            for b in &bytes {
                if s.write_all(&[*b]).is_err() {
                    break;
                }
                written += 1;
                std::thread::sleep(gap);
            }
            let e = expect_fatal_error(&mut s);
            (started.elapsed(), written < bytes.len(), e)
        })
    };
    // Greeted, then silent.
    let mut silent = UnixStream::connect(&sock).unwrap();
    silent.write_all(&hello()).unwrap();
    // A stream opened and never acknowledged.
    let mut stalled = d.client();
    stalled
        .send(&proto::json_frame(
            Kind::Open,
            &OpenRequest::new("train", 16),
        ))
        .unwrap();
    assert_eq!(stalled.frame().unwrap().0, Kind::Opened);
    // An honest client reads three epochs meanwhile (it acks as it reads).
    let mut honest = d.client();
    let mut req = OpenRequest::new("train", 64);
    req.epochs = 3;
    let got = read_all(&mut honest, req);
    assert_eq!(got.len() as u64, 3 * 20_000u64.div_ceil(64));
    drop(honest);
    let e = expect_fatal_error(&mut silent);
    assert_eq!(e["code"], "timeout", "{e}");
    let e = loop {
        match stalled.frame() {
            Ok((Kind::Error, body)) => break serde_json::from_slice::<Value>(&body).unwrap(),
            Ok(_) => continue,
            Err(e) => panic!("closed without saying why: {e}"),
        }
    };
    assert_eq!(e["code"], "timeout", "{e}");
    let (took, cut_short, e) = trickler.join().unwrap();
    assert_eq!(e["code"], "timeout", "{e}");
    // Cut off while it still trickled, and not before the 10 s the handshake has (a loaded
    // machine only makes either later).
    assert!(cut_short, "the trickled HELLO was read to its end");
    assert!(
        took >= Duration::from_secs(9),
        "the trickled HELLO was cut off after {took:?}, before its 10 s"
    );
    // Only the stats query's own connection is left.
    d.wait_stats("every slot freed", |s| s["clients"] == 1);
}

/// Issue 17: a global cursor taken by a Rust client (5 batches of 64: record 320) resumes
/// a stream of batches of 100 (inside one of its rounds) through `resume_global`: before and
/// after together are the epoch once; the resumed stream's cursor ends at the epoch's end.
#[test]
fn a_global_cursor_resumes_a_stream_of_another_batch_size() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 3000, 64);
    let sock = sb.path().join("s.sock");
    let d = Daemon::start(&sb, &sock, &[("train", &data)], &[]);
    let mut c = d.client();
    let mut seen = vec![0u32; 3000];
    let mut req = OpenRequest::new("train", 64);
    req.seed = 3;
    let mut s = c.open(req).unwrap();
    for _ in 0..5 {
        let b = s.next_batch().unwrap().unwrap();
        b.ids().iter().for_each(|&id| seen[id as usize] += 1);
    }
    let g = s.global_cursor();
    assert_eq!((g.epoch, g.records), (0, 320));
    drop(s);
    let mut req = OpenRequest::new("train", 100);
    req.seed = 3;
    req.resume_global = Some(g);
    let mut s = c.open(req).unwrap();
    assert_eq!(s.opened.start, 320);
    while let Some(b) = s.next_batch().unwrap() {
        b.ids().iter().for_each(|&id| seen[id as usize] += 1);
    }
    assert!(seen.iter().all(|&n| n == 1), "every record once");
    assert_eq!(s.global_cursor().records, 3000);
    // A cursor and a global cursor at once: refused.
    drop(s);
    let mut req = OpenRequest::new("train", 100);
    req.resume = Some(WireCursor { epoch: 0, batch: 1 });
    req.resume_global = Some(g);
    assert!(c.open(req).is_err());
}

/// The CPU time (user + system, in clock ticks) the process `pid` has used.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces), from field 3 on.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Regression (issue 29): a shared job whose only rank read a batch and left kept its pass
/// running with no member (memory held, a core busy); a two-pass one panicked its thread
/// in `modes/emit.rs` when the rank left (the pile pass stopped with the tail's padding
/// half kept), and the panic was not counted. Now, in both modes and again and again:
/// the job leaves the stats, its memory comes back, no panic, and the daemon idles.
#[test]
fn a_pass_whose_streams_have_all_gone_stops_and_frees_everything() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 3000, 100);
    let scratch = sb.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    for mode in ["lirs", "two-pass"] {
        let sock = sb.path().join(format!("{mode}.sock"));
        let d = Daemon::start(
            &sb,
            &sock,
            &[("train", &data)],
            &["--mode", mode, "--scratch", scratch.to_str().unwrap()],
        );
        let idle = d.stats();
        for round in 0..10 {
            let mut c = d.client();
            let mut req = OpenRequest::new("train", 7);
            req.seed = round;
            req.world = 2;
            req.tail = "pad".into();
            let mut s = c.open(req).unwrap();
            s.next_batch().unwrap().unwrap();
            // The only rank goes: its connection ends with its stream unclosed.
            drop(s);
            drop(c);
            let left = Instant::now();
            let s = d.wait_stats("the pass ends", |s| {
                s["jobs_now"] == 0
                    && s["streams_now"] == 0
                    && s["memory_used"] == idle["memory_used"]
            });
            eprintln!("{mode} round {round}: pass gone after {:?}", left.elapsed());
            assert_eq!(s["jobs"], serde_json::json!([]), "{s}");
            assert!(s["errors"].get("panic").is_none(), "{mode}: {s}");
        }
        // Nothing runs any more: a second of idleness costs the daemon next to no CPU
        // (a pass left running took 0.3-1 core).
        let pid = d.child.id();
        let before = cpu_ticks(pid);
        std::thread::sleep(Duration::from_secs(1));
        let used = cpu_ticks(pid) - before;
        assert!(
            used <= 5,
            "{mode}: {used} ticks of CPU in a second with no client"
        );
        assert_eq!(pile_bytes(&scratch), 0, "{mode}: scratch left behind");
    }
}

/// Regression (issue 29): an OPEN whose padded epoch is absurd (a world of 2^64-1, 1e9 or
/// 2^53 ranks; padding many times the records) was accepted, and its pass walked the
/// padded epoch for ever. Now it is `bad_request` at OPEN, with the reason, and the
/// connection stays usable.
#[test]
fn an_absurd_padded_epoch_is_refused_at_open() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 3000, 64);
    let sock = sb.path().join("s.sock");
    let d = Daemon::start(&sb, &sock, &[("train", &data)], &[]);
    let mut c = d.client();
    for (batch, world, why) in [
        (1, u64::MAX, "more ranks than a job can have"),
        (1, 1_000_000_000, "more ranks than a job can have"),
        (256, 1 << 53, "more ranks than a job can have"),
        (1, (1 << 20) + 1, "more ranks than a job can have"),
        (1, 1 << 20, "repeated records"),
        (4096, 256, "repeated records"),
    ] {
        let mut req = OpenRequest::new("train", batch);
        req.world = world;
        req.tail = "pad".into();
        let e = c.open(req).map(|_| ()).unwrap_err();
        assert_eq!(e.daemon_code(), Some("bad_request"), "{world}: {e}");
        assert!(e.to_string().contains(why), "{world}: {e}");
    }
    // A wide but real job is served.
    let mut req = OpenRequest::new("train", 4);
    req.world = 1024;
    req.tail = "pad".into();
    let mut s = c.open(req).unwrap();
    assert_eq!(s.next_batch().unwrap().unwrap().ids().len(), 4);
}

/// Runs `riffle serve` with `extra` and expects it to refuse to start: its stderr. A
/// daemon that starts instead is killed (the deadline only catches that).
fn refused_at_start(sb: &Sandbox, data: &Path, extra: &[&str]) -> String {
    use std::io::Read;
    let sock = sb.path().join("refused.sock");
    let mut c = sb.cmd();
    c.arg("serve").arg("--socket").arg(&sock);
    c.arg("--dataset").arg(format!("train={}", data.display()));
    c.args(["--mode", "lirs"]).args(extra);
    let mut child = c
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline || UnixStream::connect(&sock).is_ok() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("riffle serve {extra:?} started");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "{extra:?}: {status}");
    assert!(!err.contains("panicked"), "{extra:?}: {err}");
    err
}

/// Regression (issue 29): waits of 2^64-1 s were taken at start and then every
/// connection's thread panicked adding them to the clock; `--memory 0` and `1` were taken
/// though no stream could ever fit; a `--scratch` that is a regular file, /proc or /sys
/// was taken and every two-pass stream then failed. Each is now refused at start, saying
/// why (with the numbers for the memory).
#[test]
fn impossible_settings_are_refused_at_start() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 3000, 64);
    let max = u64::MAX.to_string();
    for flag in ["--idle-timeout", "--admit-wait", "--join-window"] {
        let err = refused_at_start(&sb, &data, &[flag, &max]);
        assert!(err.contains(flag) && err.contains("longer than"), "{err}");
    }
    for memory in ["0", "1", "64K"] {
        let err = refused_at_start(&sb, &data, &["--memory", memory]);
        assert!(
            err.contains("too little for any stream") && err.contains("or more"),
            "{err}"
        );
    }
    let file = sb.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    for (scratch, why) in [
        (file.to_str().unwrap(), "is not a directory"),
        ("/proc", "kernel filesystem"),
        ("/sys", "kernel filesystem"),
        ("/proc/self/nothing-here", "kernel filesystem"),
    ] {
        let err = refused_at_start(&sb, &data, &["--scratch", scratch]);
        assert!(
            err.contains("--scratch") && err.contains(why),
            "{scratch}: {err}"
        );
    }
    // A waits of a year, a small but workable memory and a scratch directory yet to be
    // made are fine.
    let sock = sb.path().join("ok.sock");
    let scratch = sb.path().join("not-yet/scratch");
    let d = Daemon::start(
        &sb,
        &sock,
        &[("train", &data)],
        &[
            "--idle-timeout",
            "31536000",
            "--memory",
            "16M",
            "--scratch",
            scratch.to_str().unwrap(),
        ],
    );
    let mut c = d.client();
    let mut s = c.open(OpenRequest::new("train", 16)).unwrap();
    assert_eq!(s.next_batch().unwrap().unwrap().ids().len(), 16);
}

/// Sends `sig` to the daemon and waits for it to exit: its stderr.
fn signal_and_wait(d: &mut Daemon, sigs: &[&str]) -> String {
    use std::io::Read;
    for sig in sigs {
        let o = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &d.child.id().to_string()])
            .output()
            .unwrap();
        assert_ok(&o);
    }
    // A daemon that did not stop is a failure, not a hung suite.
    let t = Instant::now();
    let status = loop {
        if let Some(st) = d.child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(30) {
            let _ = d.child.kill();
            panic!("the daemon did not stop within 30 s of {sigs:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    d.child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{status}: {err}");
    err
}

/// Regression (issue 29): SIGHUP stopped the daemon even under `nohup`. Now SIGHUP stops
/// it like SIGTERM (the terminal went away) unless it was ignored at start, as `nohup`
/// and service managers set it: then it stays ignored, and only SIGTERM stops it.
#[test]
fn sighup_stops_the_daemon_unless_ignored_at_start_as_under_nohup() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 3000, 64);
    // Not ignored: SIGHUP stops it cleanly. Unless the tests themselves run with SIGHUP
    // ignored (under nohup): the daemon inherits that, and only the second half applies.
    let ignored = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s
                .lines()
                .find_map(|l| l.strip_prefix("SigIgn:"))?
                .trim()
                .to_owned();
            u64::from_str_radix(&hex, 16).ok()
        })
        .is_some_and(|mask| mask & 1 != 0);
    if ignored {
        riffle::testing::skip(
            "SIGHUP is ignored by the tests' own process (nohup?): its first half cannot run",
        );
    } else {
        let sock = sb.path().join("hup.sock");
        let mut d = Daemon::start(&sb, &sock, &[("train", &data)], &[]);
        let err = signal_and_wait(&mut d, &["HUP"]);
        assert!(err.contains("SIGHUP, shutting down"), "{err}");
        assert!(!sock.exists());
    }
    // Ignored at start (a shell's `trap '' HUP`, as nohup does): SIGHUP is ignored, and
    // the SIGTERM sent after it is the one that stops the daemon.
    let sock = sb.path().join("nohup.sock");
    let riffle = sb.cmd();
    let mut c = std::process::Command::new("sh");
    c.args(["-c", "trap '' HUP; exec \"$0\" \"$@\""])
        .arg(riffle.get_program())
        .args(["serve", "--mode", "lirs", "--socket"])
        .arg(&sock)
        .arg("--dataset")
        .arg(format!("train={}", data.display()));
    for (k, v) in riffle.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let child = c
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut d = Daemon {
        child,
        socket: sock.clone(),
    };
    d.wait_ready();
    let before = d.stats();
    let err = signal_and_wait(&mut d, &["HUP", "TERM"]);
    assert!(!err.contains("SIGHUP"), "{err}");
    assert!(err.contains("SIGTERM, shutting down"), "{err}");
    assert!(before["clients"].is_u64());
}

/// Regression (issue 29): with a client that does not read (its socket full, the daemon
/// in a write to it), SIGTERM took 1.8-2 s. Now writes have a deadline and shutdown cuts
/// what is stuck: the daemon exits within a second, the reading client and one that
/// connects during the shutdown are told `shutdown`.
#[test]
fn sigterm_ends_the_daemon_within_a_second_whatever_clients_do() {
    use proto::Transport;
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 20_000, 4096);
    let sock = sb.path().join("s.sock");
    let mut d = Daemon::start(&sb, &sock, &[("train", &data)], &[]);
    // Inline batches to a client that never reads: the daemon's write blocks once the
    // socket's buffer is full.
    let mut stuck = d.client();
    let mut req = OpenRequest::new("train", 64);
    req.transport = Transport::Inline;
    stuck.send(&proto::json_frame(Kind::Open, &req)).unwrap();
    let mut reading = d.client();
    let mut s = reading.open(OpenRequest::new("train", 16)).unwrap();
    s.next_batch().unwrap().unwrap();
    // Until the daemon has sent the stuck client more than its socket holds.
    d.wait_stats("the stuck client's socket is full", |s| {
        s["batches"].as_u64().unwrap() >= 8
    });
    std::thread::sleep(Duration::from_millis(200));
    let pid = nix::unistd::Pid::from_raw(d.child.id() as i32);
    let started = Instant::now();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    // A client made now is told why, or finds no daemon at all, never a reset. (The
    // signal is taken asynchronously: a client that gets in before the daemon took it is
    // answered as usual.)
    match Client::connect(&sock) {
        Ok(mut late) => {
            if let Err(e) = late.stats() {
                assert_eq!(e.daemon_code(), Some("shutdown"), "{e}");
            }
        }
        Err(e) => assert!(
            e.daemon_code() == Some("shutdown")
                || matches!(e.to_string(), m if m.contains("No such file") || m.contains("refused")),
            "{e}"
        ),
    }
    let status = loop {
        if let Some(st) = d.child.try_wait().unwrap() {
            break st;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no exit");
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = started.elapsed();
    eprintln!("SIGTERM to exit with a client that does not read: {took:?}");
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(1), "SIGTERM took {took:?}");
    let e = loop {
        match s.next_batch() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended without an error"),
            Err(e) => break e,
        }
    };
    assert_eq!(e.daemon_code(), Some("shutdown"), "{e}");
}

/// Regression (issue 29): a world-2 `resume {0, 7}` past the end of the epoch was OPENED
/// and then failed with an `engine` error in a world of one's terms. It is `bad_request`
/// at OPEN, in the request's words.
#[test]
fn a_resume_past_the_end_of_a_ranks_epoch_is_a_bad_request_at_open() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 3000, 64);
    let sock = sb.path().join("s.sock");
    let d = Daemon::start(&sb, &sock, &[("train", &data)], &[]);
    let mut c = d.client();
    // 12 global batches of 256 (padded), 6 a rank.
    let mut req = OpenRequest::new("train", 256);
    req.world = 2;
    req.tail = "pad".into();
    req.resume = Some(WireCursor { epoch: 0, batch: 7 });
    let e = c.open(req.clone()).map(|_| ()).unwrap_err();
    assert_eq!(e.daemon_code(), Some("bad_request"), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("resume") && !msg.contains("--"), "{msg}");
    // The connection is still usable, and a resume inside the epoch is served.
    req.resume = Some(WireCursor { epoch: 0, batch: 5 });
    let mut s = c.open(req).unwrap();
    let b = s.next_batch().unwrap().unwrap();
    assert_eq!(b.header.index, 5);
}

mod join;
mod resident;
mod rolled;
