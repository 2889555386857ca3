//! A pass shared by the ranks of a job gives every rank exactly the batches it gets from a
//! read of its own (ids, bytes, indexes), in LIRS and two-pass; only the joined ranks'
//! batches are read; a rank that comes too late is refused; when every rank has left the
//! pass stops.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::make;
use crate::gen::GenFormat;
use crate::modes::{
    read, read_two_pass, Batch, Cursor, Joining, PayloadLender, ReadOptions, Refused, SharedPass,
};

/// Lends memory to ranks 1 and 3 only (as a daemon's rings lend regions): the pass
/// assembles their batches in it, the others' in its own memory.
fn lender(rank: u64) -> Option<PayloadLender> {
    (rank % 2 == 1).then(|| {
        PayloadLender(Arc::new(crate::modes::payload::boxes::Boxes {
            room: usize::MAX,
            shrunk: Default::default(),
        }))
    })
}
use crate::order::{Grouping, Tail};

fn opts(world: u64, tail: Tail, grouping: Grouping) -> ReadOptions {
    ReadOptions {
        seed: 11,
        epochs: 2,
        world,
        tail,
        grouping,
        ..ReadOptions::new(7)
    }
}

/// Starts a shared pass of `o` (two-pass when `scratch` is given) whose end records the
/// records it read into `read_records`.
fn spawn(
    ds: &Arc<crate::dataset::Dataset>,
    o: &ReadOptions,
    scratch: Option<std::path::PathBuf>,
    window: Duration,
    read_records: Arc<AtomicU64>,
) -> Arc<SharedPass> {
    let joining = Joining {
        window,
        streams: None,
        deadline: Duration::ZERO,
        before_start: scratch.is_none(),
    };
    spawn_joining(ds, o, scratch, joining, read_records)
}

/// [`spawn`], waiting for the job's streams as `joining` says.
fn spawn_joining(
    ds: &Arc<crate::dataset::Dataset>,
    o: &ReadOptions,
    scratch: Option<std::path::PathBuf>,
    joining: Joining,
    read_records: Arc<AtomicU64>,
) -> Arc<SharedPass> {
    let ds = ds.clone();
    SharedPass::spawn(
        o,
        joining,
        2,
        Box::new(move |all| match scratch {
            Some(dir) => read_two_pass(ds, all, dir),
            None => read(ds, all),
        }),
        Box::new(move |r| read_records.store(r.records, Ordering::SeqCst)),
    )
    .unwrap()
}

/// Waits (up to 20 s) for a pass's end to be reported; returns the records it read.
fn ended(done: &AtomicU64) -> u64 {
    let t = std::time::Instant::now();
    while done.load(Ordering::SeqCst) == u64::MAX && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    done.load(Ordering::SeqCst)
}

/// A job that says its streams: a rank that comes long after the pass started (in
/// two-pass, after its scatter; in LIRS, after any join window) still joins it, and the
/// one pass serves both ranks, each record read once.
#[test]
fn a_pass_waits_for_the_streams_its_job_says() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make(dir.path(), GenFormat::Lines, 1_000, 40, 0.5);
    for two_pass in [false, true] {
        let o = opts(2, Tail::DropLast, Grouping::Record);
        let done = Arc::new(AtomicU64::new(u64::MAX));
        let joining = Joining {
            window: Duration::ZERO,
            streams: Some(2),
            deadline: Duration::from_secs(120),
            before_start: !two_pass,
        };
        let scratch = two_pass.then(|| dir.path().to_path_buf());
        let pass = spawn_joining(&ds, &o, scratch, joining, done.clone());
        let a = pass.join(0, None, Some(2)).unwrap();
        let ha = std::thread::spawn(move || a.map(|b| b.unwrap()).collect::<Vec<_>>());
        // Long enough for a 40 KB scatter (or a LIRS pass) to be over had it not waited.
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(pass.ranks().streams(), (2, 1), "two-pass {two_pass}");
        let b = pass
            .join(1, None, Some(2))
            .expect("the second stream joins");
        let gb: Vec<_> = b.map(|b| b.unwrap()).collect();
        let ga = ha.join().unwrap();
        assert_eq!(ga, solo(&ds, &o, 0), "two-pass {two_pass}");
        assert_eq!(gb, solo(&ds, &o, 1), "two-pass {two_pass}");
        let total: u64 = ga.iter().chain(&gb).map(|b| b.ids.len() as u64).sum();
        assert_eq!(ended(&done), total, "one pass read them all once");
        assert_eq!(pass.ranks().streams(), (2, 2));
    }
}

/// The deadline ends the wait: the pass goes on with the streams present, and the
/// stream that never came is refused later as late.
#[test]
fn at_the_deadline_a_pass_goes_on_with_the_streams_present() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make(dir.path(), GenFormat::Lines, 1_000, 40, 0.5);
    for two_pass in [false, true] {
        let o = opts(3, Tail::DropLast, Grouping::Record);
        let done = Arc::new(AtomicU64::new(u64::MAX));
        let joining = Joining {
            window: Duration::ZERO,
            streams: Some(3),
            deadline: Duration::from_millis(300),
            before_start: !two_pass,
        };
        let scratch = two_pass.then(|| dir.path().to_path_buf());
        let pass = spawn_joining(&ds, &o, scratch, joining, done.clone());
        let a = pass.join(0, None, Some(3)).unwrap();
        let b = pass.join(2, None, None).unwrap();
        let (ga, gb) = std::thread::scope(|s| {
            let ha = s.spawn(move || a.map(|b| b.unwrap()).collect::<Vec<_>>());
            let hb = s.spawn(move || b.map(|b| b.unwrap()).collect::<Vec<_>>());
            (ha.join().unwrap(), hb.join().unwrap())
        });
        assert_eq!(ga, solo(&ds, &o, 0), "two-pass {two_pass}");
        assert_eq!(gb, solo(&ds, &o, 2), "two-pass {two_pass}");
        assert_eq!(pass.ranks().streams(), (3, 2));
        let late = pass.join(1, None, Some(3)).err();
        assert!(
            matches!(late, Some(Refused::Late | Refused::Ended)),
            "{late:?}"
        );
        ended(&done);
    }
}

/// Every stream of a waiting pass leaving ends the wait, and the pass, at once (not at
/// the deadline).
#[test]
fn a_waiting_pass_whose_streams_all_left_ends() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make(dir.path(), GenFormat::Lines, 1_000, 40, 0.5);
    for two_pass in [false, true] {
        let o = opts(4, Tail::DropLast, Grouping::Record);
        let done = Arc::new(AtomicU64::new(u64::MAX));
        let joining = Joining {
            window: Duration::ZERO,
            streams: Some(4),
            deadline: Duration::from_secs(3600),
            before_start: !two_pass,
        };
        let scratch = two_pass.then(|| dir.path().to_path_buf());
        let pass = spawn_joining(&ds, &o, scratch, joining, done.clone());
        drop(pass.join(0, None, Some(4)).unwrap());
        assert_ne!(
            ended(&done),
            u64::MAX,
            "two-pass {two_pass}: the pass ended"
        );
        assert_eq!(pass.join(1, None, Some(4)).err(), Some(Refused::Ended));
    }
}

fn solo(ds: &Arc<crate::dataset::Dataset>, o: &ReadOptions, rank: u64) -> Vec<Batch> {
    read(ds.clone(), ReadOptions { rank, ..o.clone() })
        .unwrap()
        .map(|b| b.unwrap())
        .collect()
}

/// A pass waits for the stream it was started for, however late that stream's join comes
/// after the pass's thread starts (a loaded machine): before, a job that said no streams
/// decided its first batches with no rank in (or a streamed read froze none), and the
/// stream was refused as late by its own pass.
#[test]
fn a_pass_waits_for_the_rank_it_was_started_for() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make(dir.path(), GenFormat::Lines, 1_000, 40, 0.5);
    for two_pass in [false, true] {
        let o = opts(2, Tail::DropLast, Grouping::Record);
        let joining = Joining {
            window: Duration::ZERO,
            streams: None,
            deadline: Duration::from_secs(120),
            before_start: !two_pass,
        };
        let scratch = two_pass.then(|| dir.path().to_path_buf());
        let done = Arc::new(AtomicU64::new(u64::MAX));
        let pass = spawn_joining(&ds, &o, scratch, joining, done);
        // The pass's thread runs first, as it may before the daemon's join.
        std::thread::sleep(Duration::from_millis(300));
        let b = (pass.join(1, None, None)).expect("the stream the pass was started for joins");
        let got: Vec<_> = b.map(|b| b.unwrap()).collect();
        assert_eq!(got, solo(&ds, &o, 1), "two-pass {two_pass}");
    }
}

#[test]
fn every_rank_gets_its_own_batches_from_one_pass() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make(dir.path(), GenFormat::Lines, 1_000, 40, 0.5);
    for two_pass in [false, true] {
        for (tail, grouping) in [
            (Tail::Pad, Grouping::Record),
            (Tail::DropLast, Grouping::Page { unit: 4096 }),
        ] {
            let mut o = opts(4, tail, grouping);
            o.memory = Some(4 << 20);
            let done = Arc::new(AtomicU64::new(u64::MAX));
            let scratch = two_pass.then(|| dir.path().to_path_buf());
            let pass = spawn(&ds, &o, scratch, Duration::from_secs(10), done.clone());
            let streams: Vec<_> = (0..4)
                .map(|r| pass.join(r, lender(r), None).expect("joins"))
                .collect();
            assert_eq!(
                pass.join(2, None, None).err(),
                Some(Refused::Taken),
                "a rank joins once"
            );
            assert!(
                pass.join(4, None, None).is_err(),
                "rank 4 is outside a world of 4"
            );
            // Each rank is consumed on a thread of its own, as a daemon's connections do.
            let got: Vec<Vec<Batch>> = std::thread::scope(|s| {
                let hs: Vec<_> = streams
                    .into_iter()
                    .map(|st| s.spawn(move || st.map(|b| b.unwrap()).collect::<Vec<_>>()))
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let mut total = 0;
            for (r, batches) in got.iter().enumerate() {
                let want = solo(&ds, &o, r as u64);
                assert!(!want.is_empty());
                assert_eq!(
                    batches, &want,
                    "rank {r}, two-pass {two_pass}, {tail:?} {grouping:?}"
                );
                total += want.iter().map(|b| b.ids.len() as u64).sum::<u64>();
            }
            // The pass's end is reported once every stream has its batches.
            let t = std::time::Instant::now();
            while done.load(Ordering::SeqCst) == u64::MAX && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(5));
            }
            assert_eq!(
                done.load(Ordering::SeqCst),
                total,
                "one pass read them all once"
            );
        }
    }
}

#[test]
fn only_the_joined_ranks_are_read_and_a_resume_is_in_rank_batches() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make(dir.path(), GenFormat::Lines, 1_200, 40, 0.5);
    let mut o = opts(4, Tail::DropLast, Grouping::Record);
    o.resume = Some(Cursor { epoch: 0, batch: 3 });
    let done = Arc::new(AtomicU64::new(u64::MAX));
    // A short window: ranks 1 and 3 never come.
    let pass = spawn(&ds, &o, None, Duration::from_millis(50), done.clone());
    let a = pass.join(0, None, None).unwrap();
    let b = pass.join(2, None, None).unwrap();
    let (ga, gb) = std::thread::scope(|s| {
        let ha = s.spawn(move || a.map(|b| b.unwrap()).collect::<Vec<_>>());
        let hb = s.spawn(move || b.map(|b| b.unwrap()).collect::<Vec<_>>());
        (ha.join().unwrap(), hb.join().unwrap())
    });
    assert_eq!(ga, solo(&ds, &o, 0));
    assert_eq!(gb, solo(&ds, &o, 2));
    assert_eq!(ga[0].index, 3, "the resume point is in the rank's batches");
    // The pass started without ranks 1 and 3: they are refused now (their batches were
    // skipped), and nothing of theirs was read.
    let late = pass.join(1, None, None).err();
    assert!(
        matches!(late, Some(Refused::Late | Refused::Ended)),
        "{late:?}"
    );
    let t = std::time::Instant::now();
    while done.load(Ordering::SeqCst) == u64::MAX && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mine: u64 = ga.iter().chain(&gb).map(|b| b.ids.len() as u64).sum();
    assert_eq!(done.load(Ordering::SeqCst), mine);
}

#[test]
fn a_pass_every_rank_left_stops() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make(dir.path(), GenFormat::Lines, 20_000, 40, 0.5);
    let mut o = opts(2, Tail::DropLast, Grouping::Record);
    o.epochs = 50;
    let done = Arc::new(AtomicU64::new(u64::MAX));
    let pass = spawn(&ds, &o, None, Duration::from_secs(5), done.clone());
    let mut a = pass.join(0, None, None).unwrap();
    let b = pass.join(1, None, None).unwrap();
    assert!(a.next().unwrap().is_ok());
    drop(b);
    // Rank 0 alone still gets its batches in order.
    let second = a.next().unwrap().unwrap();
    assert_eq!(second.index, 1);
    drop(a);
    let t = std::time::Instant::now();
    while done.load(Ordering::SeqCst) == u64::MAX && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let read = done.load(Ordering::SeqCst);
    assert!(read != u64::MAX, "the pass ended");
    assert!(
        read < 20_000,
        "the pass stopped long before its 50 epochs ({read} records read)"
    );
}

/// A pass that cannot start hands its error to every rank as it is: the same kind and
/// errno, not a string (a daemon answers each rank with the code of the error's kind).
#[test]
fn every_rank_gets_the_pass_error_with_its_kind_and_errno() {
    let dir = tempfile::tempdir().unwrap();
    let ds = make(dir.path(), GenFormat::Lines, 2_000, 40, 0.5);
    // Scratch under a regular file: the two-pass read cannot make its directory there.
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let o = opts(2, Tail::DropLast, Grouping::Record);
    let done = Arc::new(AtomicU64::new(u64::MAX));
    let pass = spawn(
        &ds,
        &o,
        Some(file.join("scratch")),
        Duration::from_secs(30),
        done,
    );
    let ranks = [
        pass.join(0, None, None).unwrap(),
        pass.join(1, None, None).unwrap(),
    ];
    for mut s in ranks {
        let e = s.next().expect("the pass's error").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Os, "{e}");
        assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR), "{e}");
        assert!(e.to_string().contains("a-file"), "{e}");
        assert!(s.next().is_none());
    }
}
