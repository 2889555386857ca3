//! Piles a two-pass pass rolled past its last epoch, kept for its job's next pass (issue
//! 33): riffle.torch opens a stream per epoch, and each epoch after the first is served
//! from the piles the pass before rolled, with no read of the dataset.

use std::path::Path;
use std::time::{Duration, SystemTime};

use riffle::serve::proto::OpenRequest;
use serde_json::Value;

use super::{dataset, in_process, pile_bytes, read_all, same_batches, signal_and_wait, Daemon};
use crate::Sandbox;

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
    std::thread::scope(|s| {
        for rank in 0..world {
            s.spawn(move || {
                let r = epoch_req(seed, epoch, rank, world);
                let got = read_all(&mut d.client_when_free(), r.clone());
                same_batches(&got, &in_process(data, &r));
            });
        }
    });
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
    let data = dataset(&sb, "d.npy", 20_000, 1000);
    let size = std::fs::metadata(&data).unwrap().len();
    let scratch = sb.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
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
