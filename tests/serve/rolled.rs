//! Piles a two-pass pass rolled past its last epoch, kept for its job's next pass (issue
//! 33): riffle.torch opens a stream per epoch, and each epoch after the first is served
//! from the piles the pass before rolled, with no read of the dataset.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use riffle::serve::proto::OpenRequest;
use serde_json::Value;

use super::{dataset, in_process, pile_bytes, read_all, same_batches, signal_and_wait, Daemon};
use crate::Sandbox;

/// A `.npy` of `records` records of `size` bytes, and an empty scratch directory.
fn data_and_scratch(sb: &Sandbox, records: u64, size: u64) -> (PathBuf, PathBuf) {
    let data = dataset(sb, "d.npy", records, size);
    let scratch = sb.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    (data, scratch)
}

/// Epoch `epoch` of a job of `seed` opened alone (`epochs` 1), rank `rank` of `world`.
fn epoch_req(seed: u64, epoch: u64, rank: u64, world: u64) -> OpenRequest {
    let mut r = OpenRequest::new("train", 100);
    r.seed = seed;
    r.epoch = epoch;
    r.epochs = 1;
    r.rank = rank;
    r.world = world;
    r.streams = (world > 1).then_some(world);
    r
}

/// The stats once no pass runs and none is about to hand over piles.
fn settled(d: &Daemon) -> Value {
    d.wait_stats("passes end and hand over their piles", |s| {
        s["streams_now"] == 0 && s["jobs_now"] == 0 && s["rolled"]["pending"] == 0
    })
}

/// The piles kept for job `seed`.
fn kept_for(s: &Value, seed: u64) -> &Value {
    (s["rolled"]["kept"].as_array().into_iter().flatten())
        .find(|k| k["seed"] == seed)
        .unwrap_or_else(|| panic!("no piles kept for seed {seed}: {s}"))
}

fn rolled(s: &Value, what: &str) -> u64 {
    s["rolled"][what]
        .as_u64()
        .unwrap_or_else(|| panic!("rolled.{what}: {s}"))
}

/// Reads epoch `epoch` of job `seed` through `world` ranks at once (threads, a shared
/// pass when more than one), each rank checked against an in-process read of it.
fn read_epoch(d: &Daemon, data: &Path, seed: u64, epoch: u64, world: u64) {
    read_job(d, data, (seed, world, 100), epoch);
}

/// [`read_epoch`] of a job of (seed, world, batch size): the ids of all its ranks.
fn read_job(
    d: &Daemon,
    data: &Path,
    (seed, world, batch): (u64, u64, u64),
    epoch: u64,
) -> Vec<u64> {
    std::thread::scope(|s| {
        let ranks: Vec<_> = (0..world)
            .map(|rank| {
                s.spawn(move || {
                    let mut r = epoch_req(seed, epoch, rank, world);
                    r.batch_size = batch;
                    let got = read_all(&mut d.client_when_free(), r.clone());
                    same_batches(&got, &in_process(data, &r));
                    got.into_iter().flat_map(|b| b.2).collect::<Vec<u64>>()
                })
            })
            .collect();
        ranks.into_iter().flat_map(|r| r.join().unwrap()).collect()
    })
}

/// Entries of `scratch` (the daemon's scratch directories: passes' and kept piles').
fn entries(scratch: &Path) -> Vec<String> {
    std::fs::read_dir(scratch)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// A job read epoch by epoch (a stream each, as riffle.torch opens them), alone and as two
/// ranks sharing a pass: its first pass rolls nothing (a job of one epoch writes no piles
/// no one reads); the second, which starts where the first ended, rolls past its end; and
/// every epoch after is served from the piles the pass before rolled (the daemon's device
/// bytes do not move), with exactly the batches of an in-process read of that epoch. Kept piles show in the stats with their bytes and
/// scratch; piles of a file changed since are dropped, never served; a pass short of
/// scratch (`--scratch-limit`) drops kept piles before anyone waits; unused piles expire
/// after `--keep-rolled`; SIGTERM leaves the scratch empty. Before: every epoch's pass
/// scattered the dataset again (no `rolled` stats).
#[test]
fn a_job_read_epoch_by_epoch_is_served_from_the_piles_its_last_pass_rolled() {
    let sb = Sandbox::new();
    let (data, scratch) = data_and_scratch(&sb, 20_000, 1000);
    let size = std::fs::metadata(&data).unwrap().len();
    let sock = sb.path().join("s.sock");
    // A two-pass daemon of the dataset with its scratch in `scratch`, and `more` flags.
    let start = |more: &[&str]| {
        let args = [
            &["--mode", "two-pass", "--scratch", scratch.to_str().unwrap()],
            more,
        ];
        Daemon::start(&sb, &sock, &[("train", &data)], &args.concat())
    };
    let mut d = start(&[]);
    for world in [1, 2] {
        let seed = 5 + world;
        let before = settled(&d);
        let (passes, dev) = (rolled(&before, "rolled_passes"), &before["device_bytes"]);
        let dev = dev.as_u64().unwrap();
        // Epoch 0: a scatter of the whole dataset, nothing rolled (the job may have one
        // epoch).
        read_epoch(&d, &data, seed, 0, world);
        let s = settled(&d);
        let read0 = s["device_bytes"].as_u64().unwrap() - dev;
        assert!(read0 >= size, "epoch 0 read {read0} of {size}: {s}");
        assert_eq!(rolled(&s, "kept_now"), world - 1, "{s}");
        // Epoch 1, where epoch 0's pass ended: a scatter again, rolled into epoch 2's piles.
        read_epoch(&d, &data, seed, 1, world);
        let s = settled(&d);
        let read0 = s["device_bytes"].as_u64().unwrap() - dev;
        assert!(
            read0 >= 2 * size,
            "epochs 0 and 1 read {read0} of {size}: {s}"
        );
        assert_eq!(rolled(&s, "kept_now"), world, "{s}");
        let k = kept_for(&s, seed);
        let kept = k["bytes"].as_u64().unwrap();
        assert!(kept >= size, "{kept} bytes of piles kept for {size}: {s}");
        assert!(rolled(&s, "kept_bytes") >= kept, "{s}");
        assert_eq!(k["epoch"], 2, "{s}");
        assert!(k["scratch_reserved"].as_u64().unwrap() >= kept, "{s}");
        assert!(pile_bytes(&scratch) >= kept, "the piles are on disk");
        // Epochs 2 and 3: out of the kept piles, nothing of the dataset read.
        for epoch in [2, 3] {
            read_epoch(&d, &data, seed, epoch, world);
            let s = settled(&d);
            assert_eq!(
                s["device_bytes"].as_u64().unwrap() - dev,
                read0,
                "epoch {epoch} (world {world}) read the dataset: {s}"
            );
            assert_eq!(rolled(&s, "rolled_passes"), passes + epoch - 1, "{s}");
            assert_eq!(rolled(&s, "kept_now"), world, "{s}");
            assert_eq!(kept_for(&s, seed)["epoch"], epoch + 1, "{s}");
        }
    }
    // The second job's piles (epoch 4) are kept beside the first's.
    let s = settled(&d);
    assert_eq!(rolled(&s, "kept_now"), 2, "{s}");
    // The file changed (its mtime) since its piles were rolled: they are dropped, and the
    // pass reads the dataset again.
    let f = std::fs::File::options().write(true).open(&data).unwrap();
    let later = SystemTime::now() + Duration::from_secs(5);
    f.set_times(std::fs::FileTimes::new().set_modified(later))
        .unwrap();
    drop(f);
    let dev = s["device_bytes"].as_u64().unwrap();
    read_epoch(&d, &data, 7, 4, 2);
    let s = settled(&d);
    assert_eq!(rolled(&s, "stale"), 1, "{s}");
    assert_eq!(rolled(&s, "rolled_passes"), 4, "{s}");
    assert!(s["device_bytes"].as_u64().unwrap() - dev >= size, "{s}");
    // Stopped by SIGTERM, the daemon leaves nothing in the scratch (kept piles included).
    assert!(rolled(&s, "kept_now") >= 1, "{s}");
    let need = s["rolled"]["kept"][0]["scratch_reserved"].as_u64().unwrap();
    signal_and_wait(&mut d, &["TERM"]);
    assert_eq!(
        entries(&scratch),
        Vec::<String>::new(),
        "scratch left behind"
    );

    // Room for one pass's piles (`--scratch-limit`), kept piles expiring after a second:
    // a job of another seed is admitted at once by dropping the first job's kept piles.
    let limit = (need + need / 2).to_string();
    let d = start(&["--scratch-limit", &limit, "--admit-wait", "0"]);
    read_epoch(&d, &data, 1, 0, 1);
    read_epoch(&d, &data, 1, 1, 1);
    assert_eq!(rolled(&settled(&d), "kept_now"), 1);
    read_epoch(&d, &data, 2, 0, 1);
    let s = settled(&d);
    assert_eq!(rolled(&s, "evicted"), 1, "{s}");
    assert_eq!(rolled(&s, "kept_now"), 0, "{s}");
    read_epoch(&d, &data, 2, 1, 1);
    let s = settled(&d);
    assert_eq!(rolled(&s, "kept_now"), 1, "{s}");
    kept_for(&s, 2);
    drop(d);
    let d = start(&["--keep-rolled", "1"]);
    read_epoch(&d, &data, 1, 0, 1);
    read_epoch(&d, &data, 1, 1, 1);
    let s = d.wait_stats("kept piles expire", |s| {
        s["rolled"]["expired"] == 1 && s["rolled"]["kept_now"] == 0
    });
    assert_eq!(rolled(&s, "kept_total"), 1, "{s}");
    assert!(
        !entries(&scratch).iter().any(|e| e.contains("rolled")),
        "{:?}",
        entries(&scratch)
    );
}

/// Another process filling a shared scratch: takes every byte of the filesystem under
/// `dir` (a file `fill`), says so through `full`, and then, until `stop`, every byte it
/// frees.
fn fill(dir: &Path, full: std::sync::mpsc::Sender<()>, stop: &std::sync::atomic::AtomicBool) {
    use std::io::Write;
    let chunk = vec![7u8; 1 << 20];
    let mut f = std::fs::File::create(dir.join("fill")).unwrap();
    let mut size = chunk.len();
    let mut told = false;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        match f.write(&chunk[..size]) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                // Full: from here on a page at a time, as the scratch frees them.
                if size > 4096 {
                    size = 4096;
                } else if !told {
                    told = true;
                    full.send(()).unwrap();
                } else {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            Err(e) => panic!("filling the scratch: {e}"),
        }
    }
}

/// Scenario: the scratch filesystem fills (another process takes every byte it has, and
/// every byte it frees) while a pass rolls the next epoch's piles past its end. The epoch
/// still ends with exactly its batches; the half-written piles are not kept (none in the
/// stats, none on the disk) and the stats say why (`not_rolled`); once there is room again,
/// the next epoch is a fresh scatter with exactly its batches, and rolls again.
#[test]
fn a_scratch_that_fills_while_piles_roll_ends_the_epoch_whole_and_keeps_nothing() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let sb = Sandbox::new();
    let Some(disk) = crate::SmallDisk::mount(&sb, "96m") else {
        return;
    };
    let scratch = disk.path().to_path_buf();
    let data = dataset(&sb, "d.npy", 30_000, 1000);
    let size = std::fs::metadata(&data).unwrap().len();
    let sock = sb.path().join("s.sock");
    // Small piles (a small --memory): the re-scatter goes pile by pile with the batches
    // the client takes, not ahead of them; no lead, so its first batch comes once the
    // scatter is over and the roll has begun.
    let args = ["--mode", "two-pass", "--scratch", scratch.to_str().unwrap()];
    let d = Daemon::start(
        &sb,
        &sock,
        &[("train", &data)],
        &[&args[..], &["--memory", "48M", "--no-lead"]].concat(),
    );
    read_epoch(&d, &data, 3, 0, 1);
    // Epoch 1 rolls past its end: the disk fills once its rolled directory is there.
    let req = epoch_req(3, 1, 0, 1);
    let stop = AtomicBool::new(false);
    let (got, s) = std::thread::scope(|s| {
        let mut filler = None;
        let mut c = d.client_when_free();
        let mut st = c.open(req.clone()).unwrap();
        let mut got: super::Got = Vec::new();
        while let Some(b) = st.next_batch().unwrap() {
            got.push((
                b.header.epoch,
                b.header.index,
                b.ids().to_vec(),
                b.offsets().to_vec(),
                b.data().to_vec(),
            ));
            if filler.is_none() && entries(&scratch).iter().any(|e| e.contains("rolled")) {
                let (full, filled) = std::sync::mpsc::channel();
                let (scratch, stop) = (&scratch, &stop);
                filler = Some(s.spawn(move || fill(scratch, full, stop)));
                filled
                    .recv_timeout(Duration::from_secs(60))
                    .expect("the scratch filled");
            }
        }
        assert!(filler.is_some(), "the pass never rolled past its end");
        drop(st);
        // The pass is over (with the disk still full) before the filler stops.
        let s = settled(&d);
        stop.store(true, Ordering::SeqCst);
        (got, s)
    });
    same_batches(&got, &in_process(&data, &req));
    assert_eq!(rolled(&s, "not_rolled"), 1, "{s}");
    assert_eq!(rolled(&s, "kept_now"), 0, "{s}");
    let why = s["rolled"]["last_not_rolled"].as_str().unwrap_or_default();
    assert!(why.contains("No space left"), "{s}");
    assert_eq!(
        entries(&scratch),
        vec!["fill".to_string()],
        "half-written piles kept"
    );
    // Room again: epoch 2 is scattered afresh, and rolls.
    std::fs::remove_file(scratch.join("fill")).unwrap();
    let dev = s["device_bytes"].as_u64().unwrap();
    read_epoch(&d, &data, 3, 2, 1);
    let s = settled(&d);
    assert!(s["device_bytes"].as_u64().unwrap() - dev >= size, "{s}");
    assert_eq!(kept_for(&s, 3)["epoch"], 3, "{s}");
    assert_eq!(rolled(&s, "rolled_passes"), 0, "{s}");
}

/// Opens `req` through `c` and reads until the pass's rolled directory is in `scratch`:
/// the stream, still open, while the next epoch's piles are being rolled past its end
/// (with `--no-lead` and a small `--memory`, from its first batch on, pile by pile).
fn rolling<'c>(
    c: &'c mut riffle::serve::Client,
    req: OpenRequest,
    scratch: &Path,
) -> riffle::serve::Stream<'c> {
    let batches = 20_000u64.div_ceil(req.batch_size);
    let mut st = c.open(req).unwrap();
    for _ in 1..batches {
        st.next_batch().unwrap().unwrap();
        if entries(scratch).iter().any(|e| e.contains("rolled")) {
            return st;
        }
    }
    panic!("the pass rolled only once its batches were all read, or never");
}

/// The riffle scratch entries in `scratch` (directories and reservations).
fn scratch_left(scratch: &Path) -> Vec<String> {
    let mut e = entries(scratch);
    e.retain(|e| e.starts_with(".riffle-scratch"));
    e
}

/// Scenario: the daemon killed (SIGKILL) with piles kept for a job's next epoch, and while
/// a pass rolls them; stopped (SIGTERM) while a pass rolls them. A daemon started again
/// on the same scratch reclaims what the killed one left as it starts (nothing left once
/// it serves), never serves it (the next epoch is a fresh scatter with exactly its
/// batches), and a SIGTERM mid-roll leaves nothing.
#[test]
fn a_daemon_killed_or_stopped_with_piles_kept_or_rolling_leaves_none_served_or_behind() {
    let sb = Sandbox::new();
    let (data, scratch) = data_and_scratch(&sb, 20_000, 1000);
    let size = std::fs::metadata(&data).unwrap().len();
    let sock = sb.path().join("s.sock");
    let start = || {
        let args = [
            "--mode",
            "two-pass",
            "--scratch",
            scratch.to_str().unwrap(),
            "--memory",
            "48M",
            "--no-lead",
        ];
        Daemon::start(&sb, &sock, &[("train", &data)], &args)
    };
    // The first pass read by a daemon of `seed`'s `epoch`: a scatter, exactly its batches.
    let scattered = |d: &Daemon, epoch: u64| {
        let dev = settled(d)["device_bytes"].as_u64().unwrap();
        read_epoch(d, &data, 9, epoch, 1);
        let s = settled(d);
        assert!(
            s["device_bytes"].as_u64().unwrap() - dev >= size,
            "epoch {epoch}: {s}"
        );
        assert_eq!(rolled(&s, "rolled_passes"), 0, "{s}");
    };
    let mut d = start();
    read_epoch(&d, &data, 9, 0, 1);
    read_epoch(&d, &data, 9, 1, 1);
    assert_eq!(kept_for(&settled(&d), 9)["epoch"], 2);
    // Killed with epoch 2's piles kept.
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    assert!(scratch_left(&scratch).iter().any(|e| e.contains("rolled")));
    let mut d = start();
    assert_eq!(
        scratch_left(&scratch),
        Vec::<String>::new(),
        "not reclaimed at start"
    );
    scattered(&d, 2);
    // Epoch 3 follows epoch 2 on this daemon: killed while it rolls epoch 4's piles.
    let mut c = d.client_when_free();
    let st = rolling(&mut c, epoch_req(9, 3, 0, 1), &scratch);
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    drop(st);
    assert!(scratch_left(&scratch).iter().any(|e| e.contains("rolled")));
    let mut d = start();
    assert_eq!(
        scratch_left(&scratch),
        Vec::<String>::new(),
        "not reclaimed at start"
    );
    scattered(&d, 4);
    assert_eq!(scratch_left(&scratch), Vec::<String>::new());
    // Stopped by SIGTERM while epoch 5 rolls epoch 6's piles: nothing left.
    let mut c = d.client_when_free();
    let st = rolling(&mut c, epoch_req(9, 5, 0, 1), &scratch);
    signal_and_wait(&mut d, &["TERM"]);
    drop(st);
    assert_eq!(
        scratch_left(&scratch),
        Vec::<String>::new(),
        "SIGTERM mid-roll"
    );
}

/// Scenario: a job opened epoch by epoch whose client vanishes (its socket closed with
/// no CLOSE, as when the process dies): mid-epoch 1, while the pass rolls, nothing is kept
/// (counted in `not_rolled`) and the pass's scratch goes; after epoch 1, the piles kept
/// for epoch 2 hold their scratch (`--scratch-limit`'s ledger, the disk) until
/// `--keep-rolled`, then go: counted as expired, the ledger back to zero, the disk empty.
#[test]
fn piles_of_a_job_whose_client_vanished_go_with_their_scratch() {
    let sb = Sandbox::new();
    let (data, scratch) = data_and_scratch(&sb, 20_000, 1000);
    let args = [
        "--mode",
        "two-pass",
        "--scratch",
        scratch.to_str().unwrap(),
        "--memory",
        "48M",
        "--no-lead",
        "--scratch-limit",
        "1G",
        "--keep-rolled",
        "1",
    ];
    let d = Daemon::start(&sb, &sb.path().join("s.sock"), &[("train", &data)], &args);
    read_epoch(&d, &data, 4, 0, 1);
    let mut c = d.client_when_free();
    let st = rolling(&mut c, epoch_req(4, 1, 0, 1), &scratch);
    // Gone as a dead process goes: the socket closed, no CLOSE.
    std::mem::forget(st);
    drop(c);
    let s = settled(&d);
    assert_eq!(rolled(&s, "not_rolled"), 1, "{s}");
    assert_eq!(
        (rolled(&s, "kept_now"), &s["scratch_planned"]),
        (0, &0.into()),
        "{s}"
    );
    assert_eq!(scratch_left(&scratch), Vec::<String>::new());
    // Epoch 1 read to its end, then gone: epoch 2's piles kept, with their scratch.
    read_epoch(&d, &data, 4, 1, 1);
    let s = settled(&d);
    let kept = kept_for(&s, 4)["scratch_reserved"].as_u64().unwrap();
    assert_eq!(s["scratch_planned"].as_u64(), Some(kept), "{s}");
    assert!(pile_bytes(&scratch) >= rolled(&s, "kept_bytes"));
    let s = d.wait_stats("kept piles expire", |s| s["rolled"]["expired"] == 1);
    assert_eq!(
        (rolled(&s, "kept_now"), &s["scratch_planned"]),
        (0, &0.into()),
        "{s}"
    );
    assert_eq!(scratch_left(&scratch), Vec::<String>::new());
    assert_eq!(pile_bytes(&scratch), 0);
}

/// Scenario: jobs over one dataset that differ in seed, or share it and differ in world or
/// batch size, read epoch by epoch at once: each job's later epochs are served from its
/// own rolled piles (one taken per job and epoch, the dataset read no more), never from
/// another job's, and every rank of every job gets exactly the batches of an in-process
/// read (so every record once per epoch).
#[test]
fn jobs_read_at_once_each_take_only_the_piles_rolled_for_them() {
    let sb = Sandbox::new();
    let (data, scratch) = data_and_scratch(&sb, 6_000, 500);
    let args = ["--mode", "two-pass", "--scratch", scratch.to_str().unwrap()];
    let d = Daemon::start(&sb, &sb.path().join("s.sock"), &[("train", &data)], &args);
    // (seed, world, batch size)
    let jobs = [(1, 1, 100), (2, 1, 100), (1, 2, 100), (1, 1, 64)];
    let mut dev = 0;
    for epoch in 0..4 {
        std::thread::scope(|s| {
            for job in jobs {
                let data = &data;
                let d = &d;
                s.spawn(move || {
                    let mut ids = read_job(d, data, job, epoch);
                    ids.sort_unstable();
                    assert!(ids.iter().copied().eq(0..6_000), "{job:?} epoch {epoch}");
                });
            }
        });
        let s = settled(&d);
        let now = s["device_bytes"].as_u64().unwrap();
        if epoch >= 2 {
            assert_eq!(now, dev, "epoch {epoch} read the dataset: {s}");
            assert_eq!(rolled(&s, "rolled_passes"), 4 * (epoch - 1), "{s}");
            assert_eq!(rolled(&s, "kept_now"), 4, "{s}");
        }
        dev = now;
    }
}

/// Scenario: `--keep-rolled 0` turns rolling off (every epoch a scatter, nothing kept, no
/// piles left between passes); a huge `--keep-rolled` (10^12 s, and 2^64 - 1) keeps and
/// serves piles as the default does, with no overflow of the daemon's clock arithmetic as
/// it checks them (at every connection and tick), and a SIGTERM still leaves nothing.
#[test]
fn keep_rolled_zero_rolls_nothing_and_a_huge_one_keeps_without_overflow() {
    let sb = Sandbox::new();
    let (data, scratch) = data_and_scratch(&sb, 3_000, 500);
    let size = std::fs::metadata(&data).unwrap().len();
    let sock = sb.path().join("s.sock");
    for keep in ["0", "1000000000000", "18446744073709551615"] {
        let args = [
            "--mode",
            "two-pass",
            "--scratch",
            scratch.to_str().unwrap(),
            "--keep-rolled",
            keep,
        ];
        let mut d = Daemon::start(&sb, &sock, &[("train", &data)], &args);
        let mut dev = 0;
        for epoch in 0..3 {
            read_epoch(&d, &data, 2, epoch, 1);
            let s = settled(&d);
            let now = s["device_bytes"].as_u64().unwrap();
            let read = now - dev;
            dev = now;
            assert_eq!(s["rolled"]["keep_s"].to_string(), keep, "{s}");
            if keep == "0" {
                assert!(read >= size, "epoch {epoch} read {read} of {size}: {s}");
                assert_eq!(rolled(&s, "kept_total"), 0, "{s}");
                assert_eq!(scratch_left(&scratch), Vec::<String>::new());
            } else if epoch == 2 {
                assert_eq!(read, 0, "epoch 2 read the dataset: {s}");
                assert_eq!(rolled(&s, "rolled_passes"), 1, "{s}");
                assert_eq!(kept_for(&s, 2)["epoch"], 3, "{s}");
            }
        }
        // The expiry check runs at every connection (the stats above) and tick.
        assert_eq!(rolled(&settled(&d), "kept_now"), u64::from(keep != "0"));
        signal_and_wait(&mut d, &["TERM"]);
        assert_eq!(scratch_left(&scratch), Vec::<String>::new());
    }
}

/// Scenario: a scratch that holds one pass's piles and no more (a filesystem of exactly
/// the size the pass reserves, to the page), under a `--memory` smaller than one epoch's
/// piles: the pass that would roll past its end does not (the room check counts the
/// pass's own files beside its frames, a few pages over), says why in the stats and the
/// log, and the job never fails: every epoch exactly its batches, each scattered afresh.
#[test]
fn a_scratch_that_holds_one_epochs_piles_skips_rolling_with_a_reason_never_failing() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 20_000, 1000);
    let size = std::fs::metadata(&data).unwrap().len();
    let sock = sb.path().join("s.sock");
    let start = |scratch: &Path| {
        let args = [
            "--mode",
            "two-pass",
            "--scratch",
            scratch.to_str().unwrap(),
            "--memory",
            "16M",
        ];
        Daemon::start(&sb, &sock, &[("train", &data)], &args)
    };
    // What one pass reserves: its kept piles' scratch.
    let big = sb.path().join("scratch");
    std::fs::create_dir_all(&big).unwrap();
    let d = start(&big);
    read_epoch(&d, &data, 5, 0, 1);
    read_epoch(&d, &data, 5, 1, 1);
    let need = kept_for(&settled(&d), 5)["scratch_reserved"]
        .as_u64()
        .unwrap();
    assert!(need > size, "{need}");
    drop(d);
    let Some(disk) = crate::SmallDisk::mount(&sb, &format!("{}k", need.div_ceil(4096) * 4)) else {
        return;
    };
    let mut d = start(disk.path());
    let mut dev = 0;
    for epoch in 0..3 {
        read_epoch(&d, &data, 5, epoch, 1);
        let s = settled(&d);
        let now = s["device_bytes"].as_u64().unwrap();
        assert!(now - dev >= size, "epoch {epoch}: {s}");
        dev = now;
        assert_eq!(rolled(&s, "kept_now"), 0, "{s}");
        assert_eq!(rolled(&s, "not_rolled"), epoch, "{s}");
    }
    let s = settled(&d);
    let why = s["rolled"]["last_not_rolled"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        why.contains("is free") || why.contains("No space left"),
        "{s}"
    );
    let log = signal_and_wait(&mut d, &["TERM"]);
    assert!(log.contains("not rolled for a next pass"), "{log}");
    assert_eq!(scratch_left(disk.path()), Vec::<String>::new());
}

/// Scenario: a daemon short of open files (`ulimit -n`) with `--admit-wait 0`: a job's
/// next epoch refused `busy` while other jobs' passes hold the files keeps the piles
/// rolled for it, and its retry, once there is room, is served from them with no read of
/// the dataset. Before: the refused admission had taken them, and dropped them.
#[test]
fn a_next_epoch_refused_busy_keeps_its_rolled_piles_for_the_retry() {
    let sb = Sandbox::new();
    let (data, scratch) = data_and_scratch(&sb, 20_000, 1000);
    let args = [
        "--mode",
        "two-pass",
        "--scratch",
        scratch.to_str().unwrap(),
        "--max-clients",
        "12",
        "--admit-wait",
        "0",
    ];
    let mut cmd = sb.cmd();
    crate::limits::with_rlimit(&mut cmd, nix::sys::resource::Resource::RLIMIT_NOFILE, 160);
    let d = Daemon::start_from(cmd, &sb.path().join("s.sock"), &[("train", &data)], &args);
    read_epoch(&d, &data, 1, 0, 1);
    read_epoch(&d, &data, 1, 1, 1);
    assert_eq!(kept_for(&settled(&d), 1)["epoch"], 2);
    // Other jobs' passes take the open files until one is refused.
    let mut others: Vec<_> = (0..8).map(|_| d.client_when_free()).collect();
    let mut streams = Vec::new();
    for (c, seed) in others.iter_mut().zip(2..) {
        match c.open(epoch_req(seed, 0, 0, 1)) {
            Ok(st) => streams.push(st),
            Err(e) => {
                assert_eq!(e.daemon_code(), Some("busy"), "{e}");
                break;
            }
        }
    }
    assert!(streams.len() < 8, "no pass was refused");
    let e = (d.client_when_free().open(epoch_req(1, 2, 0, 1)))
        .err()
        .expect("refused");
    assert_eq!(e.daemon_code(), Some("busy"), "{e}");
    assert!(e.to_string().contains("open files"), "{e}");
    drop(streams);
    let s = settled(&d);
    assert_eq!(
        rolled(&s, "kept_now"),
        1,
        "the refused pass dropped the piles: {s}"
    );
    let dev = s["device_bytes"].as_u64().unwrap();
    read_epoch(&d, &data, 1, 2, 1);
    let s = settled(&d);
    assert_eq!(
        s["device_bytes"].as_u64(),
        Some(dev),
        "the retry read the dataset: {s}"
    );
    assert_eq!(rolled(&s, "rolled_passes"), 1, "{s}");
}
