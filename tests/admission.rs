//! `riffle serve`'s admission, on the real daemon and real sockets (issue 29 deliverables 5
//! and 6): a request that never fits is `too_large` with the numbers, one that must wait is
//! `busy`; `auto` plans within the scratch limit; concurrent two-pass passes never
//! overcommit the scratch filesystem; mixtures are admitted at what their passes hold; the
//! open files are the daemon's budget.

use riffle::serve::proto::{self, Kind, OpenRequest};
use serde_json::Value;

use crate::serve::{dataset, Daemon};
use crate::Sandbox;

/// OPENs `req` on a new connection and returns the connection with its reply: OPENED (the
/// stream left open, unread) or the ERROR's JSON.
fn open_raw(d: &Daemon, req: &OpenRequest) -> (riffle::serve::Client, Result<Value, Value>) {
    let mut c = d.client_when_free();
    c.send(&proto::json_frame(Kind::Open, req)).unwrap();
    let (k, body) = c.frame().unwrap();
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    match k {
        Kind::Opened => (c, Ok(v)),
        Kind::Error => (c, Err(v)),
        k => panic!("{k:?}"),
    }
}

/// A pass that needs more than a quarter of `--memory` never fits: `too_large` at once with
/// the numbers, though `--admit-wait` is long (it said `busy`, "try again later", and
/// "after waiting 5 s" without waiting). A request that fits once others give back is
/// `busy`, and its message claims no wait that did not happen.
#[test]
fn a_request_that_never_fits_is_too_large_and_one_that_must_wait_is_busy() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 20_000, 1000);
    let sock = sb.path().join("s.sock");
    let d = Daemon::start(
        &sb,
        &sock,
        &[("train", &data)],
        &[
            "--memory",
            "64M",
            "--max-clients",
            "4",
            "--admit-wait",
            "30",
        ],
    );
    // Batches of 8 MB: a ring of 16 MiB holds them, but a pass reads several ahead, more
    // than the 16 MiB a read may have of 64M.
    let (_c, got) = open_raw(&d, &OpenRequest::new("train", 8192));
    let e = got.expect_err("a pass of 8 MB batches in 64M");
    assert_eq!(e["code"], "too_large", "{e}");
    assert_eq!(e["fatal"], false, "{e}");
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("asked ") && msg.contains("limit 16777216"),
        "{msg}"
    );
    assert!(msg.contains("a quarter of --memory"), "{msg}");
    assert!(
        !msg.contains("wait") || msg.contains("however long it waits"),
        "{msg}"
    );
    // Streams of small batches held open until the next must wait for them: `busy`.
    let d = Daemon::start(
        &sb,
        &sb.path().join("b.sock"),
        &[("train", &data)],
        &[
            "--memory",
            "24M",
            "--max-clients",
            "24",
            "--admit-wait",
            "0",
        ],
    );
    let mut open = Vec::new();
    let refused = loop {
        let mut req = OpenRequest::new("train", 64);
        req.seed = open.len() as u64;
        match open_raw(&d, &req) {
            (c, Ok(_)) => open.push(c),
            (_, Err(e)) => break e,
        }
        assert!(open.len() < 24, "24 streams fit in 24M");
    };
    assert!(!open.is_empty(), "{refused}");
    assert_eq!(refused["code"], "busy", "{refused}");
    let msg = refused["message"].as_str().unwrap();
    assert!(
        msg.contains("try again later") && msg.contains("free now"),
        "{msg}"
    );
    assert!(!msg.contains("waiting") && !msg.contains("waited"), "{msg}");
    let s = d.stats();
    assert_eq!(s["errors"]["busy"], 1, "{s}");
}

/// `--mode auto` plans within `--scratch-limit`: on a device where two-pass wins, a limit
/// its piles do not fit makes it LIRS, and the stream is served (it was two-pass, then
/// `busy` for every stream).
#[test]
fn auto_plans_lirs_when_two_pass_piles_do_not_fit_the_scratch_limit() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 2000, 16_000);
    crate::plan::probe_small(&sb);
    // A disk: random reads of 16 KB records lose to sequential passes.
    crate::plan::fake_profile(&sb, 600.0, 150e6);
    let mut req = OpenRequest::new("train", 64);
    req.epochs = 2;
    // --memory 80M: held copies may take 59 MiB, less than the 64 MiB holding the records
    // resident takes, so the stream is read by the plan's streaming mode (issue 33).
    let start = |name: &str, limit: &str| {
        Daemon::start(
            &sb,
            &sb.path().join(name),
            &[("train", &data)],
            &[
                "--mode",
                "auto",
                "--scratch-limit",
                limit,
                "--admit-wait",
                "0",
                "--memory",
                "80M",
            ],
        )
    };
    // Room for the piles: two-pass, as the profile says.
    let d = start("a.sock", "1G");
    let mut c = d.client();
    assert_eq!(c.open(req.clone()).unwrap().opened.mode, "two-pass");
    drop(c);
    drop(d);
    // 1 MB of scratch for 32 MB of piles: LIRS, and every batch arrives.
    let d = start("b.sock", "1M");
    let mut c = d.client();
    let mut s = c.open(req.clone()).unwrap();
    assert_eq!(s.opened.mode, "lirs");
    let mut n = 0;
    while let Some(b) = s.next_batch().unwrap() {
        n += b.ids().len();
    }
    assert_eq!(n, 4000);
}

/// Two concurrent two-pass streams on a scratch filesystem with room for one's piles (a
/// real small tmpfs, no `--scratch-limit`): the second waits for the first's reservation,
/// or is `busy`, instead of both failing with ENOSPC mid-epoch.
#[test]
fn concurrent_two_pass_passes_never_overcommit_the_scratch_filesystem() {
    let sb = Sandbox::new();
    let Some(small) = crate::SmallDisk::mount(&sb, "110m") else {
        return;
    };
    let data = dataset(&sb, "d.npy", 50_000, 1000);
    let d = Daemon::start(
        &sb,
        &sb.path().join("s.sock"),
        &[("train", &data)],
        &[
            "--mode",
            "two-pass",
            "--scratch",
            small.path().to_str().unwrap(),
            "--admit-wait",
            "0",
        ],
    );
    let mut a = d.client();
    let mut sa = a.open(OpenRequest::new("train", 64)).unwrap();
    // Its scatter is under way (the first batch comes after it).
    assert!(sa.next_batch().unwrap().is_some());
    let mut req = OpenRequest::new("train", 64);
    req.seed = 1;
    let mut b = d.client();
    let e = b
        .open(req)
        .err()
        .expect("no room for a second pass's piles");
    assert_eq!(e.daemon_code(), Some("busy"), "{e}");
    assert!(e.to_string().contains("scratch"), "{e}");
    // The first stream reads to its end, with no ENOSPC.
    let mut n = 1;
    while sa.next_batch().unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, 50_000usize.div_ceil(64));
    drop(sa);
    drop(a);
    // Its piles gone, the second pass is admitted and reads everything.
    let mut req = OpenRequest::new("train", 64);
    req.seed = 1;
    let got = loop {
        match b.open(req.clone()) {
            Ok(mut s) => {
                let mut n = 0;
                while let Some(x) = s.next_batch().unwrap() {
                    n += x.ids().len();
                }
                break n;
            }
            Err(e) if e.daemon_code() == Some("busy") => {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(got, 50_000);
}

/// The daemon's two-pass passes and `riffle read` runs sharing one scratch directory see
/// each other's reservations: an admitted pass claims its piles in the directory itself
/// (`.riffle-scratch-reserve-PID-*`, as a CLI run does), so a CLI two-pass run started
/// beside it does not plan for the same free bytes: one that fits the disk alone but not
/// beside the pass is refused up front; the claim goes with the pass.
#[test]
fn a_daemons_pass_and_a_cli_run_sharing_scratch_see_each_others_reservations() {
    let sb = Sandbox::new();
    let Some(small) = crate::SmallDisk::mount(&sb, "110m") else {
        return;
    };
    let data = dataset(&sb, "d.npy", 60_000, 1000);
    // A run whose piles fit the disk alone, not beside the daemon's pass.
    let other = dataset(&sb, "e.npy", 20_000, 1000);
    let d = Daemon::start(
        &sb,
        &sb.path().join("s.sock"),
        &[("train", &data)],
        &[
            "--mode",
            "two-pass",
            "--scratch",
            small.path().to_str().unwrap(),
        ],
    );
    let pid = d.child.id();
    let mut a = d.client();
    let mut sa = a.open(OpenRequest::new("train", 64)).unwrap();
    let claim = std::fs::read_dir(small.path())
        .unwrap()
        .flatten()
        .find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!(".riffle-scratch-reserve-{pid}-"))
        })
        .unwrap_or_else(|| {
            panic!(
                "no claim of the daemon's pass in {}",
                small.path().display()
            )
        });
    let reserved = std::fs::read_to_string(claim.path().join("reserved")).unwrap();
    let bytes: u64 = reserved
        .lines()
        .find_map(|l| l.strip_prefix("bytes "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!(bytes >= 60_000 * 1000, "{reserved}");
    // A CLI two-pass run beside it is refused up front, naming the reservation (it would
    // have planned for the free bytes the daemon's pass is about to write).
    let out = sb
        .cmd()
        .args(["read"])
        .arg(&other)
        .args(["--batch-size", "64", "--mode", "two-pass", "--scratch"])
        .arg(small.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("other runs there have reserved"),
        "{err}"
    );
    let mut n = 0;
    while sa.next_batch().unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, 60_000usize.div_ceil(64));
    drop(sa);
    drop(a);
    // The claim goes with its pass.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while claim.path().exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the claim outlived its pass"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Ten streams of a mixture of different seeds under `--memory`: each pass holds its
/// epoch's draws (8 bytes a record: 32 MB for 4 million) beside its buffers, and is
/// admitted at that, so those that do not fit are refused (`busy`) and the daemon stays
/// within its memory. It admitted each at its buffers alone, and 10 streams (each draws
/// held twice: by the OPEN and by its pass) took several times `--memory`.
#[test]
fn mixture_streams_are_admitted_at_what_their_passes_hold() {
    let sb = Sandbox::new();
    let a = dataset(&sb, "a.npy", 20_000, 64);
    let b = dataset(&sb, "b.npy", 10_000, 64);
    let spec = format!(
        "mix:a={}*0.7,b={}*0.3;size=4000000",
        a.display(),
        b.display()
    );
    let memory: u64 = 192 << 20;
    let d = Daemon::start(
        &sb,
        &sb.path().join("s.sock"),
        &[("mix", std::path::Path::new(&spec))],
        &["--memory", "192M", "--admit-wait", "0"],
    );
    let mut held = Vec::new();
    let mut busy = 0;
    for seed in 0..10 {
        let mut req = OpenRequest::new("mix", 256);
        req.seed = seed;
        match open_raw(&d, &req) {
            (c, Ok(_)) => held.push(c),
            (_, Err(e)) => {
                assert_eq!(e["code"], "busy", "{e}");
                busy += 1;
            }
        }
    }
    let s = d.stats();
    let used = s["memory_used"].as_u64().unwrap();
    assert!(used <= memory, "{s}");
    let rss = d.rss_bytes();
    assert!(
        rss <= memory + (128 << 20),
        "RSS {} MiB with {} streams admitted, {busy} busy, memory_used {} MiB",
        rss >> 20,
        held.len(),
        used >> 20
    );
    assert!(busy > 0, "all 10 admitted in {} MiB: {s}", memory >> 20);
    // Room given back, a stream is admitted and served.
    drop(held);
    let mut c = d.client_when_free();
    let mut req = OpenRequest::new("mix", 2048);
    req.seed = 3;
    let got = loop {
        match c.open(req.clone()) {
            Ok(mut st) => {
                let mut n = 0;
                for _ in 0..8 {
                    n += st.next_batch().unwrap().expect("a batch").ids().len();
                }
                break n;
            }
            Err(e) if e.daemon_code() == Some("busy") => {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(got, 8 * 2048);
}

/// `riffle serve` under `prlimit --nofile=N:N` (soft and hard: riffle raises the soft one
/// to the hard), or `None` with the skip counted where `prlimit` is missing.
fn daemon_with_nofile(
    sb: &Sandbox,
    nofile: u64,
    datasets: &[(&str, &std::path::Path)],
    extra: &[&str],
) -> Option<Daemon> {
    if std::process::Command::new("prlimit")
        .arg("--version")
        .output()
        .is_err()
    {
        crate::skip("prlimit (util-linux) is not installed: cannot set the daemon's ulimit -n");
        return None;
    }
    let mut c = std::process::Command::new("prlimit");
    c.arg(format!("--nofile={nofile}:{nofile}"))
        .arg(env!("CARGO_BIN_EXE_riffle"))
        .env("XDG_CACHE_HOME", sb.cache())
        .env_remove("RIFFLE_IO")
        .env_remove("RIFFLE_DIRECT");
    Some(Daemon::start_from(
        c,
        &sb.path().join("s.sock"),
        datasets,
        extra,
    ))
}

/// 64 streams of a tree of one file per record, all at once, under `ulimit -n 1024`: the
/// open files are the daemon's budget, each pass's reader holds its share (its queue depth
/// cut to fit), and every stream gets every record. Each reader held up to a file per read
/// in flight and more, and most streams failed with EMFILE.
#[test]
fn sixty_four_streams_of_a_file_tree_run_under_ulimit_n_1024() {
    let sb = Sandbox::new();
    let tree = sb.data().join("tree");
    crate::gen(&sb, &tree, "files", 2000, 256, &[]);
    let spec = format!("{}:files", tree.display());
    let Some(d) = daemon_with_nofile(
        &sb,
        1024,
        &[("t", std::path::Path::new(&spec))],
        &["--max-clients", "80"],
    ) else {
        return;
    };
    let sock = sb.path().join("s.sock");
    let got: Vec<Result<usize, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..64u64)
            .map(|seed| {
                let sock = sock.clone();
                s.spawn(move || {
                    let mut c = riffle::serve::Client::connect(&sock).map_err(|e| e.to_string())?;
                    let mut req = OpenRequest::new("t", 64);
                    req.seed = seed;
                    let mut st = c.open(req).map_err(|e| e.to_string())?;
                    let mut n = 0;
                    while let Some(b) = st.next_batch().map_err(|e| e.to_string())? {
                        n += b.ids().len();
                    }
                    Ok(n)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let bad: Vec<_> = got.iter().filter(|r| *r != &Ok(2000)).collect();
    assert!(
        bad.is_empty(),
        "{} of 64 streams failed: {:?}",
        bad.len(),
        &bad[..bad.len().min(3)]
    );
    let s = d.stats();
    assert!(s["errors"].as_object().unwrap().is_empty(), "{s}");
}

/// When `accept` itself fails for want of descriptors (the daemon's limit lowered under it
/// to what it holds), the connection is told `busy` and closed, through a descriptor kept
/// in reserve; it waited in the backlog with nothing said, and a new client blocked for
/// ever.
#[test]
fn a_connection_past_the_descriptors_is_told_busy_not_left_hanging() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 1000, 100);
    let d = Daemon::start(&sb, &sb.path().join("s.sock"), &[("train", &data)], &[]);
    let pid = d.child.id();
    // The lowest descriptor number free in the daemon: a limit there leaves none for a new
    // connection (the limit bounds the numbers, not their count).
    // Taken once the daemon's descriptors are steady (the readiness check's connection
    // closes asynchronously: a number freed after the listing would let accept through).
    let fds = || -> std::collections::HashSet<u64> {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect()
    };
    let mut held = fds();
    for _ in 0..100 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let now = fds();
        if now == held {
            break;
        }
        held = now;
    }
    let free = (0..).find(|n| !held.contains(n)).unwrap();
    let lowered = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--nofile={free}:")])
        .status();
    if !lowered.is_ok_and(|s| s.success()) {
        crate::skip("prlimit --pid cannot lower the daemon's ulimit -n here");
        return;
    }
    for _ in 0..3 {
        let mut sock = std::os::unix::net::UnixStream::connect(sb.path().join("s.sock")).unwrap();
        let _ = std::io::Write::write_all(&mut sock, &crate::serve::hello());
        let e = crate::serve::expect_fatal_error(&mut sock);
        assert_eq!(e["code"], "busy", "{e}");
        assert!(
            e["message"].as_str().unwrap().contains("file descriptor"),
            "{e}"
        );
    }
    // Descriptors back: clients are served again.
    let raised = std::process::Command::new("prlimit")
        .args([
            "--pid",
            &pid.to_string(),
            &format!("--nofile={}:", free + 64),
        ])
        .status()
        .unwrap();
    assert!(raised.success());
    let mut c = d.client_when_free();
    let mut st = c.open(OpenRequest::new("train", 100)).unwrap();
    let mut n = 0;
    while let Some(b) = st.next_batch().unwrap() {
        n += b.ids().len();
    }
    assert_eq!(n, 1000);
}

/// 64 jobs of 1 MB batches at the default `--memory` and `--max-clients`: each ring is
/// sized to what its stream needs (a few MiB of batches), not the client's whole share,
/// so every job's ring and pass fit. Each ring took its 16 MiB share and 22 of 64 were
/// refused `busy`.
#[test]
fn sixty_four_jobs_fit_the_default_budget() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 20_000, 4096);
    let d = Daemon::start(
        &sb,
        &sb.path().join("s.sock"),
        &[("train", &data)],
        &["--admit-wait", "1"],
    );
    let sock = sb.path().join("s.sock");
    // Each stream is held open (its ring and pass held) until every job has been admitted
    // or refused: the gate opens when all 64 have said.
    let gate = std::sync::RwLock::new(());
    let closed = gate.write().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let outcomes: Vec<Result<(), String>> = std::thread::scope(|s| {
        for seed in 0..64u64 {
            let (sock, tx, gate) = (sock.clone(), tx.clone(), &gate);
            s.spawn(move || {
                let opened = (|| {
                    let mut c = riffle::serve::Client::connect(&sock).map_err(|e| e.to_string())?;
                    let mut req = OpenRequest::new("train", 256);
                    req.seed = seed;
                    let mut st = c.open(req).map_err(|e| e.to_string())?;
                    let b = st.next_batch().map_err(|e| e.to_string())?;
                    let n = b.expect("a batch").ids().len();
                    tx.send(if n == 256 {
                        Ok(())
                    } else {
                        Err(format!("{n} ids"))
                    })
                    .unwrap();
                    drop(gate.read().unwrap());
                    Ok::<(), String>(())
                })();
                if let Err(e) = opened {
                    tx.send(Err(e)).unwrap();
                }
            });
        }
        let got: Vec<_> = rx.iter().take(64).collect();
        drop(closed);
        got
    });
    let refused: Vec<_> = outcomes.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        refused.is_empty(),
        "{} of 64 jobs refused: {:?}",
        refused.len(),
        &refused[..refused.len().min(2)]
    );
    let s = d.wait_stats("the jobs gone", |s| s["streams_now"] == 0);
    assert!(s["memory_used"].as_u64().unwrap() <= 1 << 30, "{s}");
}
