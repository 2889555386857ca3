//! The streams of a job that arrive apart (issue 29 deliverable 1): an OPEN says how many
//! streams of its job its node opens (`streams`), and the job's pass waits for them up to
//! `--join-deadline`.

use std::time::Duration;

use riffle::serve::proto::OpenRequest;
use serde_json::Value;

use super::{dataset, in_process, read_bytes, same_batches, Daemon, Got};
use crate::Sandbox;

/// Rank `rank` of a world-`world` job of batches of 100, seed 5, that says `streams`.
fn req(rank: u64, world: u64, streams: Option<u64>) -> OpenRequest {
    let mut r = OpenRequest::new("train", 100);
    r.seed = 5;
    r.rank = rank;
    r.world = world;
    r.streams = streams;
    r
}

/// Reads `first` batches of a stream, calls `between` (the stream still open), then the
/// rest: every batch it delivered.
fn read_around(d: &Daemon, req: OpenRequest, first: usize, between: impl FnOnce()) -> Got {
    let mut c = d.client_when_free();
    let mut s = c.open(req).unwrap();
    let mut out = Vec::new();
    let mut between = Some(between);
    loop {
        if out.len() == first {
            if let Some(f) = between.take() {
                f();
            }
        }
        let Some(b) = s.next_batch().unwrap() else {
            break;
        };
        out.push((
            b.header.epoch,
            b.header.index,
            b.ids().to_vec(),
            b.offsets().to_vec(),
            b.data().to_vec(),
        ));
    }
    if let Some(f) = between.take() {
        f();
    }
    out
}

/// The live job `id` in the stats.
fn job(s: &Value, id: u64) -> &Value {
    s["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == id)
        .unwrap_or_else(|| panic!("job {id} in the stats: {s}"))
}

/// Four ranks of a two-pass job opening a second apart, each saying the node opens four:
/// one pass serves them all (one job, the dataset read about once), each rank its own
/// batches. Before `streams`, each rank after the first started a pass of its own.
#[test]
fn ranks_that_open_apart_share_the_pass_their_job_waits_for() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 20_000, 1024);
    let size = std::fs::metadata(&data).unwrap().len();
    let sock = sb.path().join("s.sock");
    let scratch = sb.path().join("scratch");
    let d = Daemon::start(
        &sb,
        &sock,
        &[("train", &data)],
        &["--mode", "two-pass", "--scratch", scratch.to_str().unwrap()],
    );
    let before = read_bytes(d.child.id());
    let got: Vec<Got> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|rank| {
                let d = &d;
                // Apart: each rank opens a second after the one before.
                std::thread::sleep(Duration::from_secs(if rank == 0 { 0 } else { 1 }));
                s.spawn(move || read_around(d, req(rank, 4, Some(4)), 0, || {}))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, g) in got.iter().enumerate() {
        same_batches(g, &in_process(&data, &req(rank as u64, 4, None)));
    }
    let s = d.stats();
    assert_eq!(s["jobs_total"], 1, "one pass for the job: {s}");
    assert_eq!(s["streams_shared"], 4, "{s}");
    assert_eq!(s["late_streams"], 0, "{s}");
    // One pass: the dataset read once and its piles once, not once per rank.
    let read = read_bytes(d.child.id()) - before;
    assert!(
        read < 3 * size,
        "the daemon read {read} bytes for a job over a dataset of {size}"
    );
}

/// A stream that comes after its job's pass began emitting is late: served by a new pass
/// (its batches exact), counted on the job it missed and in all, and the job's stats
/// show the streams it expected and those that joined.
#[test]
fn a_late_stream_gets_a_pass_of_its_own_and_is_counted() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 6_000, 256);
    let sock = sb.path().join("s.sock");
    let scratch = sb.path().join("scratch");
    let d = Daemon::start(
        &sb,
        &sock,
        &[("train", &data)],
        &["--mode", "two-pass", "--scratch", scratch.to_str().unwrap()],
    );
    // A world of 3 whose node says 2 streams: ranks 0 and 1 start the pass; rank 2,
    // opened once rank 0 has two batches (global batch 3: rank 2's first was decided),
    // is late.
    let (late, stats) = std::thread::scope(|s| {
        let d = &d;
        let (tx, rx) = std::sync::mpsc::channel();
        let one = s.spawn(move || read_around(d, req(1, 3, Some(2)), 0, || {}));
        let zero = s.spawn(move || {
            read_around(d, req(0, 3, Some(2)), 2, || {
                let late = read_around(d, req(2, 3, Some(2)), 0, || {});
                tx.send((late, d.stats())).unwrap();
            })
        });
        same_batches(&zero.join().unwrap(), &in_process(&data, &req(0, 3, None)));
        same_batches(&one.join().unwrap(), &in_process(&data, &req(1, 3, None)));
        rx.recv().unwrap()
    });
    same_batches(&late, &in_process(&data, &req(2, 3, None)));
    assert_eq!(stats["late_streams"], 1, "{stats}");
    let first = job(&stats, 1);
    assert_eq!(first["late_streams"], 1, "{stats}");
    assert_eq!(first["streams_expected"], 2, "{stats}");
    assert_eq!(first["streams_joined"], 2, "{stats}");
    let s = d.stats();
    assert_eq!(s["jobs_total"], 2, "{s}");
    assert_eq!(s["late_streams"], 1, "{s}");
}

/// The deadline ends the wait: a job that says 4 streams of which only 2 come goes on
/// with those 2 after `--join-deadline`, each getting its own batches; its stats say
/// 4 expected, 2 joined.
#[test]
fn at_the_join_deadline_the_pass_goes_on_with_the_streams_present() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 4_000, 256);
    let scratch = sb.path().join("scratch");
    for mode in ["lirs", "two-pass"] {
        let sock = sb.path().join(format!("{mode}.sock"));
        let d = Daemon::start(
            &sb,
            &sock,
            &[("train", &data)],
            &[
                "--mode",
                mode,
                "--scratch",
                scratch.to_str().unwrap(),
                "--join-deadline",
                "1",
            ],
        );
        let (zero, one) = std::thread::scope(|s| {
            let d = &d;
            let one = s.spawn(move || read_around(d, req(1, 4, Some(4)), 0, || {}));
            let zero = s.spawn(move || {
                read_around(d, req(0, 4, Some(4)), 1, || {
                    // Rank 1's OPEN may still be on its way under load: waited for.
                    let st = d.wait_stats("ranks 0 and 1 in job 1", |s| {
                        (s["jobs"].as_array().into_iter().flatten())
                            .any(|j| j["id"] == 1 && j["streams_joined"] == 2)
                    });
                    assert_eq!(job(&st, 1)["streams_expected"], 4, "{mode}: {st}");
                })
            });
            (zero.join().unwrap(), one.join().unwrap())
        });
        same_batches(&zero, &in_process(&data, &req(0, 4, None)));
        same_batches(&one, &in_process(&data, &req(1, 4, None)));
        assert_eq!(d.stats()["jobs_total"], 1, "{mode}");
        // Once the pass is over, rank 2 (which never joined it) is late; rank 0 again is
        // the job started again, not late. Both get their exact batches.
        d.wait_stats("the pass ended", |s| s["jobs_now"] == 0);
        let two = read_around(&d, req(2, 4, Some(4)), 0, || {});
        same_batches(&two, &in_process(&data, &req(2, 4, None)));
        let s = d.stats();
        assert_eq!(s["late_streams"], 1, "{mode}: {s}");
        d.wait_stats("the late pass ended", |s| s["jobs_now"] == 0);
        let again = read_around(&d, req(0, 4, Some(4)), 0, || {});
        same_batches(&again, &in_process(&data, &req(0, 4, None)));
        assert_eq!(d.stats()["late_streams"], 1, "{mode}");
    }
}

/// `streams` 0 is refused at OPEN, and a `--join-deadline` no deadline can hold at
/// start.
#[test]
fn streams_zero_and_an_absurd_join_deadline_are_refused() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 1_000, 64);
    let sock = sb.path().join("s.sock");
    let d = Daemon::start(&sb, &sock, &[("train", &data)], &[]);
    let e = d.client().open(req(0, 2, Some(0))).err().expect("refused");
    assert_eq!(e.daemon_code(), Some("bad_request"), "{e}");
    assert!(e.to_string().contains("streams 0"), "{e}");
    let out = sb
        .cmd()
        .args(["serve", "--socket"])
        .arg(sb.path().join("t.sock"))
        .arg("--dataset")
        .arg(format!("train={}", data.display()))
        .args(["--join-deadline", "18446744073709551615"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--join-deadline"), "{err}");
}
