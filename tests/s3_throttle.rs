//! `s3://` reads over a throttled connection: a proxy between riffle and the real server
//! (s3s-fs) that caps each connection's bandwidth and answers some requests with 503
//! SlowDown, S3's throttling reply. A read the retries outlast gives the same batches as
//! an unthrottled read; throttling that outlasts `RIFFLE_S3_RETRY_SECONDS` is an error
//! naming the object and the byte range, with no batch out.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use riffle::testing::s3::{S3Server, BUCKET};

use super::{assert_ok, gen, text, Sandbox};

/// Which requests are answered 503 SlowDown, given their number (from 0, as they arrive)
/// and head (lower-cased).
type SlowDown = dyn Fn(usize, &str) -> bool + Send + Sync;

/// A throttling HTTP proxy on a loopback port in front of a server on `upstream`: one
/// request a connection (it adds `connection: close`), each response sent at most `rate`
/// bytes a second, and the requests `slow_down` picks answered 503 SlowDown instead.
struct Throttle {
    port: u16,
    stop: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
    slowed: Arc<AtomicUsize>,
    /// GETs of objects (not listings) in flight now, and the most at once.
    live: Arc<(AtomicUsize, AtomicUsize)>,
    acceptor: Option<JoinHandle<()>>,
}

impl Throttle {
    fn start(upstream: u16, rate: u64, slow_down: Box<SlowDown>) -> Throttle {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicUsize::new(0));
        let slowed = Arc::new(AtomicUsize::new(0));
        let live = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
        let slow_down: Arc<SlowDown> = Arc::from(slow_down);
        let (s, r, sl, lv) = (stop.clone(), requests.clone(), slowed.clone(), live.clone());
        let acceptor = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let (r, sl, sd, lv) =
                            (r.clone(), sl.clone(), slow_down.clone(), lv.clone());
                        std::thread::spawn(move || {
                            // A connection the client dropped is its business.
                            let _ = serve(conn, upstream, rate, (&r, &sl, &lv), &*sd);
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            }
        });
        Throttle {
            port,
            stop,
            requests,
            slowed,
            live,
            acceptor: Some(acceptor),
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

/// One connection: its request's head, then 503 SlowDown or the server's response at
/// `rate`.
fn serve(
    conn: TcpStream,
    upstream: u16,
    rate: u64,
    (requests, slowed, live): (&AtomicUsize, &AtomicUsize, &(AtomicUsize, AtomicUsize)),
    slow_down: &SlowDown,
) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    let mut r = BufReader::new(conn);
    let mut head = Vec::new();
    let mut line = String::new();
    // The request's head; riffle's GETs and LISTs have no body.
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        if line == "\r\n" {
            break;
        }
        if !line.to_ascii_lowercase().starts_with("connection:") {
            head.extend_from_slice(line.as_bytes());
        }
    }
    head.extend_from_slice(b"connection: close\r\n\r\n");
    let mut client = r.into_inner();
    let n = requests.fetch_add(1, Ordering::SeqCst);
    if slow_down(n, &String::from_utf8_lossy(&head).to_ascii_lowercase()) {
        slowed.fetch_add(1, Ordering::SeqCst);
        let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>\
                    <Message>Please reduce your request rate.</Message></Error>";
        let reply = format!(
            "HTTP/1.1 503 Slow Down\r\ncontent-type: application/xml\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        );
        client.write_all(reply.as_bytes())?;
        return client.shutdown(Shutdown::Write);
    }
    let first = String::from_utf8_lossy(&head)
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    let object_get = first.starts_with("GET ") && !first.contains("list-type");
    if object_get {
        let now = live.0.fetch_add(1, Ordering::SeqCst) + 1;
        live.1.fetch_max(now, Ordering::SeqCst);
    }
    let relayed = relay(&head, client, upstream, rate);
    if object_get {
        live.0.fetch_sub(1, Ordering::SeqCst);
    }
    relayed
}

/// Sends the request `head` to the server on `upstream` and its response to `client`, at
/// most `rate` bytes a second.
fn relay(head: &[u8], mut client: TcpStream, upstream: u16, rate: u64) -> std::io::Result<()> {
    let mut up = TcpStream::connect(("127.0.0.1", upstream))?;
    up.write_all(head)?;
    let start = Instant::now();
    let mut sent = 0u64;
    let mut buf = vec![0u8; 16 << 10];
    // The response ends at its head plus its content-length, when it says one (the server
    // may keep its side open a while after): the connection is over then.
    let mut head_bytes = Vec::new();
    let mut whole: Option<u64> = None;
    while whole.is_none_or(|w| sent < w) {
        let n = up.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if whole.is_none() && head_bytes.len() < 64 << 10 {
            head_bytes.extend_from_slice(&buf[..n]);
            whole = response_length(&head_bytes);
        }
        // Paced before it is sent: the last byte out ends the relay.
        let due = Duration::from_secs_f64((sent + n as u64) as f64 / rate as f64);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        client.write_all(&buf[..n])?;
        sent += n as u64;
    }
    client.shutdown(Shutdown::Write)
}

/// The length of an HTTP response (its head and its content-length's body) whose first
/// bytes are `bytes`, once its head is whole and says a content-length.
fn response_length(bytes: &[u8]) -> Option<u64> {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&bytes[..end]).to_ascii_lowercase();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(end as u64 + len)
}

/// A `riffle` command of `sb` pointed at `endpoint` (the server's keys), its object cache
/// in the sandbox.
fn cmd(sb: &Sandbox, s3: &S3Server, endpoint: &str) -> Command {
    let mut c = sb.cmd();
    s3.env(&mut c);
    c.env("AWS_ENDPOINT_URL", endpoint)
        .env("RIFFLE_S3_CACHE", sb.path().join("s3-cache"));
    c
}

/// `riffle read SPEC --ids-out FILE ARGS` by `c`: its output and the ids file, when
/// written.
fn read(
    sb: &Sandbox,
    mut c: Command,
    spec: &str,
    args: &[&str],
) -> (std::process::Output, Option<String>) {
    let out = sb.path().join("ids.txt");
    let _ = std::fs::remove_file(&out);
    let o = c
        .arg("read")
        .arg(spec)
        .args(["--batch-size", "16", "--seed", "7"])
        .args(args)
        .arg("--ids-out")
        .arg(&out)
        .output()
        .unwrap();
    (o, std::fs::read_to_string(&out).ok())
}

/// Four JSONL shards of about 3 MB in `sb`'s data directory `t`, each uploaded as
/// `t/NAME`; returns the directory and their bytes.
fn dataset(sb: &Sandbox, s3: &S3Server) -> (std::path::PathBuf, u64) {
    let dir = sb.data().join("t");
    std::fs::create_dir_all(&dir).unwrap();
    let mut total = 0;
    for i in 0..4 {
        let p = dir.join(format!("shard-{i}.jsonl"));
        gen(sb, &p, "lines", 1500, 2000, &["--seed", &i.to_string()]);
        let bytes = std::fs::read(&p).unwrap();
        total += bytes.len() as u64;
        s3.put(&format!("t/shard-{i}.jsonl"), &bytes);
    }
    (dir, total)
}

/// The two reads of the dataset, each as (the `s3://` read's words, the same job's on the
/// local files): staged (lirs), and streamed two-pass past a cache limit (one rank of four,
/// two epochs), whose batches are the local lirs read's.
fn reads(total: u64) -> [(Vec<String>, Vec<String>); 2] {
    let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let job = [
        "--world",
        "2",
        "--rank",
        "1",
        "--drop-last",
        "--epochs",
        "2",
    ];
    let limit = (total * 3 / 4).to_string();
    [
        (words(&["--mode", "lirs"]), words(&["--mode", "lirs"])),
        (
            words(&[&job[..], &["--cache-limit", &limit]].concat()),
            words(&[&job[..], &["--mode", "lirs"]].concat()),
        ),
    ]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn a_throttled_connection_with_slow_downs_resumes_with_the_same_batches() {
    let Some(s3) = S3Server::start() else { return };
    let sb = Sandbox::new();
    let (dir, total) = dataset(&sb, &s3);
    let spec = format!("s3://{BUCKET}/t/");
    for (args, local) in reads(total) {
        let (args, local) = (strs(&args), strs(&local));
        let (o, want) = read(&sb, sb.cmd(), dir.to_str().unwrap(), &local);
        assert_ok(&o);
        let want = want.unwrap();
        assert!(want.lines().count() > 50, "{args:?}: {want}");
        // 2 MB/s a connection, and every third request slowed down.
        let t = Throttle::start(s3.port(), 2 << 20, Box::new(|n, _| n % 3 == 1));
        let (o, got) = read(&sb, cmd(&sb, &s3, &t.endpoint()), &spec, &args);
        assert_ok(&o);
        let (slowed, requests) = (
            t.slowed.load(Ordering::SeqCst),
            t.requests.load(Ordering::SeqCst),
        );
        assert!(
            slowed > 0 && requests > slowed,
            "{slowed} of {requests} slowed"
        );
        assert_eq!(
            got.unwrap(),
            want,
            "{args:?}: throttled, the batches differ"
        );
    }
}

#[test]
fn throttling_past_the_retry_time_is_an_error_naming_the_object_and_range_with_no_batch() {
    let Some(s3) = S3Server::start() else { return };
    let sb = Sandbox::new();
    let (_, total) = dataset(&sb, &s3);
    let spec = format!("s3://{BUCKET}/t/");
    for (args, _) in reads(total) {
        let args = strs(&args);
        // The listing, the HEADs and the first ranged GET pass; every later ranged GET is
        // slowed down.
        let ranged = AtomicUsize::new(0);
        let after_one = move |_: usize, head: &str| {
            head.contains("\r\nrange:") && ranged.fetch_add(1, Ordering::SeqCst) >= 1
        };
        let t = Throttle::start(s3.port(), 2 << 20, Box::new(after_one));
        let mut c = cmd(&sb, &s3, &t.endpoint());
        c.env("RIFFLE_S3_RETRY_SECONDS", "1");
        let (o, ids) = read(&sb, c, &spec, &args);
        assert!(!o.status.success(), "{args:?}: the read succeeded");
        assert!(o.stdout.is_empty(), "{args:?}: a batch was printed");
        assert_eq!(ids, None, "{args:?}: ids were written");
        let err = text(&o.stderr);
        assert!(
            err.contains(&format!("s3://{BUCKET}/t/shard-")) && err.contains("bytes "),
            "{args:?}: the error does not name the object and range:\n{err}"
        );
        assert!(
            err.contains("503") || err.contains("SlowDown"),
            "{args:?}: the error does not say the store slowed it down:\n{err}"
        );
        assert!(
            t.slowed.load(Ordering::SeqCst) > 1,
            "{args:?}: never slowed"
        );
    }
}

/// Staging many small objects fetches several at once (a GET each would otherwise wait on
/// the one before it): through a slow proxy, more than one connection is open at a time,
/// and never more than the ranged GETs staging keeps in flight (and the listing's).
#[test]
fn staging_small_objects_fetches_several_at_once() {
    let Some(s3) = S3Server::start() else { return };
    let sb = Sandbox::new();
    let dir = sb.data().join("small");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..12 {
        let p = dir.join(format!("s-{i:02}.jsonl"));
        gen(&sb, &p, "lines", 200, 500, &["--seed", &i.to_string()]);
        s3.put(
            &format!("small/s-{i:02}.jsonl"),
            &std::fs::read(&p).unwrap(),
        );
    }
    let (o, want) = read(&sb, sb.cmd(), dir.to_str().unwrap(), &["--mode", "lirs"]);
    assert_ok(&o);
    // 200 KB/s a connection: each object's GET takes about half a second.
    let t = Throttle::start(s3.port(), 200 << 10, Box::new(|_, _| false));
    let spec = format!("s3://{BUCKET}/small/");
    let (o, got) = read(
        &sb,
        cmd(&sb, &s3, &t.endpoint()),
        &spec,
        &["--mode", "lirs"],
    );
    assert_ok(&o);
    assert_eq!(got, want, "staged, the batches differ");
    let most = t.live.1.load(Ordering::SeqCst);
    let bound = riffle::remote::STAGE_IN_FLIGHT + 1;
    // One after another (the code before): 1. Several at once: up to all 12.
    assert!(
        most >= 2 && most <= bound,
        "{most} GETs at once (at least 2, at most {bound})"
    );
}

/// SIGTERM while a client's stream waits on a store that answers every GET with 503
/// SlowDown (the retries would go on for minutes): the client is told `shutdown`, the
/// daemon exits at once and removes its socket. Before, the connection's thread stopped
/// its stream before telling its client, and stopping waited for the GETs' retries: the
/// daemon cut the connection unsaid after its grace, and exited only when they ended.
#[test]
fn sigterm_tells_a_client_whose_stream_waits_on_a_throttling_store() {
    use crate::serve::Daemon;
    use riffle::serve::proto::{self, Kind, OpenRequest};
    let Some(s3) = S3Server::start() else { return };
    let sb = Sandbox::new();
    let (_, total) = dataset(&sb, &s3);
    let slow = Arc::new(AtomicBool::new(false));
    let s = slow.clone();
    // Object GETs slowed down once the daemon has opened the dataset; listings never.
    let t = Throttle::start(
        s3.port(),
        64 << 20,
        Box::new(move |_, head| {
            s.load(Ordering::SeqCst) && head.starts_with("get ") && !head.contains("list-type")
        }),
    );
    let mut c = cmd(&sb, &s3, &t.endpoint());
    c.env("RIFFLE_S3_RETRY_SECONDS", "600");
    let sock = sb.path().join("s.sock");
    let url = std::path::PathBuf::from(format!("s3://{BUCKET}/t/"));
    let limit = (total * 3 / 4).to_string();
    let extra = ["--mode", "two-pass", "--cache-limit", &limit];
    let mut d = Daemon::start_from(c, &sock, &[("train", &url)], &extra);
    slow.store(true, Ordering::SeqCst);
    let mut client = d.client();
    client
        .send(&proto::json_frame(
            Kind::Open,
            &OpenRequest::new("train", 16),
        ))
        .unwrap();
    assert_eq!(client.frame().unwrap().0, Kind::Opened);
    // The stream's scatter is waiting on its GETs' retries.
    let waited = Instant::now();
    while t.slowed.load(Ordering::SeqCst) < 2 {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "no GET slowed down"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(st) = d.child.try_wait().unwrap() {
            break st;
        }
        // Only a hang: the retries would last ten minutes.
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    assert!(!sock.exists(), "the socket file is removed");
    let e = loop {
        match client.frame() {
            Ok((Kind::Error, body)) => {
                break serde_json::from_slice::<serde_json::Value>(&body).unwrap()
            }
            Ok(_) => continue,
            Err(e) => panic!("closed without saying why: {e}"),
        }
    };
    assert_eq!(e["code"], "shutdown", "{e}");
}

/// An MDS dataset of `shards` shards in `sb`'s data directory `name`: `riffle gen`'s one
/// shard of `records` records of `size` bytes, its samples cut into `shards` shards laid
/// out as MDS lays them (a count, the offsets, the shard's config, the samples), and an
/// `index.json` listing them; each file uploaded as `name/FILE`. Returns the directory and
/// the bytes uploaded.
fn mds_shards(
    sb: &Sandbox,
    s3: &S3Server,
    name: &str,
    (records, size): (u64, u64),
    shards: usize,
) -> (std::path::PathBuf, u64) {
    let one = sb.data().join(format!("{name}-one"));
    gen(sb, &one, "mds", records, size, &["--seed", "4"]);
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(one.join("index.json")).unwrap()).unwrap();
    let shard = std::fs::read(one.join("shard.00000.mds")).unwrap();
    let u32_at = |i: usize| u32::from_le_bytes(shard[i..i + 4].try_into().unwrap()) as usize;
    let n = u32_at(0);
    let offsets: Vec<usize> = (0..=n).map(|i| u32_at(4 + 4 * i)).collect();
    let samples: Vec<&[u8]> = offsets.windows(2).map(|w| &shard[w[0]..w[1]]).collect();
    let dir = sb.data().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let mut listed = Vec::new();
    let mut total = 0;
    for (k, part) in samples.chunks(n.div_ceil(shards)).enumerate() {
        let mut entry = index["shards"][0].clone();
        entry["samples"] = part.len().into();
        let config = serde_json::to_vec(&entry).unwrap();
        let mut at = 4 + 4 * (part.len() + 1) + config.len();
        let mut file = (part.len() as u32).to_le_bytes().to_vec();
        for s in part.iter().chain([&&[][..]]) {
            file.extend_from_slice(&(at as u32).to_le_bytes());
            at += s.len();
        }
        file.extend_from_slice(&config);
        part.iter().for_each(|s| file.extend_from_slice(s));
        let basename = format!("shard.{k:05}.mds");
        entry["raw_data"] = serde_json::json!({"basename": basename, "bytes": file.len()});
        listed.push(entry);
        std::fs::write(dir.join(&basename), &file).unwrap();
    }
    let index = serde_json::json!({"shards": listed, "version": 2});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let bytes = std::fs::read(&p).unwrap();
        total += bytes.len() as u64;
        let file = p.file_name().unwrap().to_str().unwrap();
        s3.put(&format!("{name}/{file}"), &bytes);
    }
    (dir, total)
}

/// Opening a streamed MDS dataset gets each shard's header once (one ranged GET, sized
/// from `index.json`), several at once; an open on a warm cache gets nothing (the index
/// and the headers come from the cache while their ETags and sizes hold), and the read
/// gives the local directory's batches.
#[test]
fn a_streamed_mds_open_gets_each_header_once_several_at_once_and_nothing_when_warm() {
    let Some(s3) = S3Server::start() else { return };
    let sb = Sandbox::new();
    let shards = 12;
    let (dir, total) = mds_shards(&sb, &s3, "m", (4000, 500), shards);
    let spec = format!("s3://{BUCKET}/m/");
    let limit = (total / 2).to_string();
    let plan = |t: &Throttle| -> serde_json::Value {
        let o = cmd(&sb, &s3, &t.endpoint())
            .args(["plan", &spec, "--batch-size", "16", "--json"])
            .args(["--cache-limit", &limit])
            .output()
            .unwrap();
        assert_ok(&o);
        serde_json::from_slice(&o.stdout).unwrap()
    };
    // 200 KB/s a connection.
    let t = Throttle::start(s3.port(), 200 << 10, Box::new(|_, _| false));
    let cold = plan(&t);
    let o = &cold["open"];
    // Before: two GETs a shard (its count, then its offsets), one shard after another.
    assert_eq!(
        (o["gets"].as_u64(), o["layouts_fetched"].as_u64()),
        (Some(1 + shards as u64), Some(shards as u64)),
        "{o}"
    );
    let most = t.live.1.load(Ordering::SeqCst);
    assert!(
        (2..=32).contains(&most),
        "{most} header GETs at once (at least 2, at most 32)"
    );
    // The same endpoint (the cache is kept per endpoint host and port), counted afresh.
    t.live.1.store(0, Ordering::SeqCst);
    let o = &plan(&t)["open"];
    assert_eq!(
        (
            o["gets"].as_u64(),
            o["bytes"].as_u64(),
            o["layouts_cached"].as_u64(),
            o["layouts_fetched"].as_u64()
        ),
        (Some(0), Some(0), Some(shards as u64), Some(0)),
        "{o}"
    );
    assert_eq!(
        t.live.1.load(Ordering::SeqCst),
        0,
        "a warm open got objects"
    );
    let (o, want) = read(&sb, sb.cmd(), dir.to_str().unwrap(), &["--mode", "lirs"]);
    assert_ok(&o);
    let (o, got) = read(
        &sb,
        cmd(&sb, &s3, &t.endpoint()),
        &spec,
        &["--cache-limit", &limit],
    );
    assert_ok(&o);
    assert!(want.as_ref().is_some_and(|w| w.lines().count() > 100));
    assert_eq!(
        got, want,
        "streamed, the batches differ from the local directory's"
    );
}

/// Opening a streamed dataset of small objects (their layouts not cached) indexes several
/// at once, as many as fit the cache limit together: through a slow proxy, more than one
/// GET is in flight at a time (one after another before).
#[test]
fn a_streamed_open_indexes_several_small_objects_at_once() {
    let Some(s3) = S3Server::start() else { return };
    let sb = Sandbox::new();
    let dir = sb.data().join("few");
    std::fs::create_dir_all(&dir).unwrap();
    let mut total = 0;
    for i in 0..8 {
        let p = dir.join(format!("s-{i}.jsonl"));
        gen(&sb, &p, "lines", 200, 500, &["--seed", &i.to_string()]);
        let bytes = std::fs::read(&p).unwrap();
        total += bytes.len() as u64;
        s3.put(&format!("few/s-{i}.jsonl"), &bytes);
    }
    // 200 KB/s a connection: each object's GET takes about half a second.
    let t = Throttle::start(s3.port(), 200 << 10, Box::new(|_, _| false));
    let o = cmd(&sb, &s3, &t.endpoint())
        .args(["plan", &format!("s3://{BUCKET}/few/"), "--batch-size", "16"])
        .args(["--cache-limit", &(total / 2).to_string(), "--json"])
        .output()
        .unwrap();
    assert_ok(&o);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["open"]["layouts_fetched"].as_u64(), Some(8), "{v}");
    let most = t.live.1.load(Ordering::SeqCst);
    // Half the dataset holds four of the eight at once.
    assert!(
        (2..=4).contains(&most),
        "{most} objects fetched at once to be indexed (at least 2, at most 4)"
    );
}
