//! Datasets held resident by the daemon (issue 33 deliverable 3): one copy per dataset,
//! shared by every job, rank and worker, charged to `--memory`, evicted by the documented
//! rule, and never served after its files changed.

use std::path::Path;

use riffle::serve::proto::OpenRequest;
use serde_json::Value;

use super::{dataset, in_process, pile_bytes, read_all, read_bytes, same_batches, Daemon, Got};
use crate::Sandbox;

/// A request of batches of 100 over 2 epochs: `seed`, rank `rank` of `world` (the node
/// opening `world` streams of it).
fn req(name: &str, seed: u64, rank: u64, world: u64) -> OpenRequest {
    let mut r = OpenRequest::new(name, 100);
    r.seed = seed;
    r.epochs = 2;
    r.rank = rank;
    r.world = world;
    r.streams = (world > 1).then_some(world);
    r
}

/// The held copy of `name` in the stats, if any.
fn copy<'a>(s: &'a Value, name: &str) -> Option<&'a Value> {
    s["resident"]["held"]
        .as_array()?
        .iter()
        .find(|h| h["dataset"] == name)
}

/// Every batch of a stream of `r`, and the mode its OPENED names.
fn read_with_mode(c: &mut riffle::serve::Client, r: &OpenRequest) -> (Got, String) {
    let mut s = c.open(r.clone()).unwrap();
    let mode = s.opened.mode.clone();
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
    (out, mode)
}

/// Waits until no stream and no pass is left (a pass's device bytes are counted when it
/// ends).
fn idle(d: &Daemon) -> Value {
    d.wait_stats("passes end", |s| {
        s["streams_now"] == 0 && s["jobs_now"] == 0
    })
}

/// Two jobs of other seeds (two ranks each) and a stream of its own, all at once, over a
/// resident dataset: the device is read once in all (the daemon's own counter, the copy's
/// and the kernel's), and every stream gets exactly the batches an in-process lirs read
/// gives its seed and rank. A later job reads nothing. Before: `--mode resident` was
/// refused at start, and each pass read the dataset again.
#[test]
fn jobs_ranks_and_seeds_over_a_resident_dataset_read_the_device_once() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 20_000, 1000);
    let size = std::fs::metadata(&data).unwrap().len();
    let sock = sb.path().join("s.sock");
    let d = Daemon::start(
        &sb,
        &sock,
        &[("train", &data)],
        &["--mode", "resident", "--memory", "512M"],
    );
    let before = read_bytes(d.child.id());
    let reqs = [
        req("train", 5, 0, 2),
        req("train", 5, 1, 2),
        req("train", 7, 0, 2),
        req("train", 7, 1, 2),
        req("train", 9, 0, 1),
    ];
    let got: Vec<(Got, String)> = std::thread::scope(|s| {
        let hs: Vec<_> = (reqs.iter())
            .map(|r| {
                let d = &d;
                s.spawn(move || read_with_mode(&mut d.client_when_free(), r))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((g, mode), r) in got.iter().zip(&reqs) {
        assert_eq!(mode, "resident");
        same_batches(g, &in_process(&data, r));
    }
    let s = idle(&d);
    let h = copy(&s, "train").unwrap_or_else(|| panic!("a held copy: {s}"));
    assert_eq!(h["loads"], 1, "{s}");
    assert_eq!(h["state"], "loaded", "{s}");
    assert_eq!(h["users"], 0, "no pass uses it now: {s}");
    let counted = s["device_bytes"].as_u64().unwrap();
    assert_eq!(counted, h["device_bytes"].as_u64().unwrap(), "{s}");
    assert!(
        counted >= size && counted <= size + 4096,
        "the passes read {counted} bytes of a {size}-byte dataset: {s}"
    );
    let read = read_bytes(d.child.id()) - before;
    assert!(
        read <= size + size / 10,
        "the daemon read {read} bytes for 10 streams over a dataset of {size}"
    );
    assert!(h["bytes"].as_u64().unwrap() >= size, "charged: {s}");
    assert!(s["memory_used"].as_u64().unwrap() >= size, "{s}");
    // A later job, of another seed: from memory, no I/O.
    let r = req("train", 11, 0, 1);
    same_batches(
        &read_all(&mut d.client_when_free(), r.clone()),
        &in_process(&data, &r),
    );
    let s = idle(&d);
    assert_eq!(s["device_bytes"].as_u64().unwrap(), counted, "{s}");
    assert_eq!(copy(&s, "train").unwrap()["loads"], 1);
}

/// Two datasets whose copies do not fit the daemon's memory together: while a stream reads
/// the first one's copy, the second is read by lirs (the copy in use is not evicted, the
/// fallback is counted and says why); once no pass uses the first, the second's copy evicts
/// it. Before: `--mode resident` was refused at start.
#[test]
fn an_idle_copy_is_evicted_for_another_dataset_and_a_copy_in_use_never() {
    let sb = Sandbox::new();
    let a = dataset(&sb, "a.npy", 40_000, 1000);
    let b = dataset(&sb, "b.npy", 40_000, 1000);
    let sock = sb.path().join("s.sock");
    // 160 MiB: held copies may take about 117 MiB (less a read's 40 and a ring's 2.5), and
    // one takes 80 (40 MB of files and the 40 MiB of reads that load them).
    let d = Daemon::start(
        &sb,
        &sock,
        &[("a", &a), ("b", &b)],
        &["--mode", "resident", "--memory", "160M"],
    );
    let ra = req("a", 3, 0, 1);
    let want_a = in_process(&a, &ra);
    let mut ca = d.client_when_free();
    let mut sa = ca.open(ra.clone()).unwrap();
    assert_eq!(sa.opened.mode, "resident");
    let first = sa.next_batch().unwrap().unwrap();
    assert_eq!(first.ids(), &want_a[0].ids[..]);
    drop(first);
    let s = d.stats();
    assert_eq!(copy(&s, "a").unwrap()["users"], 1, "{s}");
    // b's copy does not fit beside a's, which a stream reads: b is read by lirs.
    let rb = req("b", 4, 0, 1);
    let want_b = in_process(&b, &rb);
    let mut cb = d.client_when_free();
    let (got, mode) = read_with_mode(&mut cb, &rb);
    assert_eq!(mode, "lirs");
    same_batches(&got, &want_b);
    let s = d.stats();
    assert!(
        copy(&s, "a").is_some(),
        "a copy in use is never evicted: {s}"
    );
    assert!(copy(&s, "b").is_none(), "{s}");
    assert_eq!(s["resident"]["evicted"], 0, "{s}");
    assert_eq!(s["resident"]["fallbacks"], 1, "{s}");
    let why = s["resident"]["last_fallback"].as_str().unwrap();
    assert!(
        why.contains("dataset 'b'") && why.contains("passes use them"),
        "{why}"
    );
    // The stream on a ends: its copy is idle, kept until b's admission needs the room.
    let mut rest = 1;
    while sa.next_batch().unwrap().is_some() {
        rest += 1;
    }
    assert_eq!(rest, want_a.len());
    drop(sa);
    drop(ca);
    let s = idle(&d);
    assert_eq!(copy(&s, "a").unwrap()["users"], 0, "{s}");
    let (got, mode) = read_with_mode(&mut cb, &rb);
    assert_eq!(mode, "resident");
    same_batches(&got, &want_b);
    let s = idle(&d);
    assert!(copy(&s, "a").is_none(), "the idle copy went: {s}");
    assert_eq!(copy(&s, "b").unwrap()["loads"], 1, "{s}");
    assert_eq!(s["resident"]["evicted"], 1, "{s}");
}

/// `path`'s records rewritten in place of the file (a new inode, the same size and shape):
/// every byte after the `.npy` header flipped.
fn rewrite_records(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let header = 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    for b in &mut bytes[header..] {
        *b ^= 0xa5;
    }
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, &bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A file changed after its copy was loaded is not served from the old copy: the next
/// stream gets the new records (a new copy, loaded once), the old copy is counted as
/// replaced. Before: `--mode resident` was refused at start.
#[test]
fn a_file_changed_after_its_copy_loaded_is_never_served_from_it() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 5_000, 512);
    let sock = sb.path().join("s.sock");
    let d = Daemon::start(
        &sb,
        &sock,
        &[("train", &data)],
        &["--mode", "resident", "--memory", "512M"],
    );
    let r = req("train", 6, 0, 1);
    let old = in_process(&data, &r);
    same_batches(&read_all(&mut d.client_when_free(), r.clone()), &old);
    assert_eq!(copy(&idle(&d), "train").unwrap()["loads"], 1);
    rewrite_records(&data);
    let new = in_process(&data, &r);
    assert!(
        new[0].payload[..] != old[0].payload[..],
        "the records changed"
    );
    same_batches(&read_all(&mut d.client_when_free(), r.clone()), &new);
    let s = idle(&d);
    assert_eq!(s["resident"]["replaced"], 1, "{s}");
    let held: Vec<&Value> = s["resident"]["held"].as_array().unwrap().iter().collect();
    assert_eq!(held.len(), 1, "the old copy went: {s}");
    assert_eq!(held[0]["loads"], 1, "{s}");
}

/// Issue 33 (a daemon's partly resident read): a dataset that never fits the copies' share
/// of `--memory` whole is held in part (its first bytes, loaded once), and each pass
/// reads only the rest from the device, through two-pass piles in the daemon's scratch
/// (charged like any pass's), which roll over the epochs of a stream. A stream of three
/// epochs reads the dataset once in all; a later job reads only the part not held. Every
/// stream gets the batches an in-process lirs read gives. Before: the stream was read by
/// lirs, each epoch of it from the device.
#[test]
fn a_dataset_that_never_fits_whole_is_held_in_part_and_passes_read_only_the_rest() {
    let sb = Sandbox::new();
    let data = dataset(&sb, "d.npy", 80_000, 1000);
    let size = std::fs::metadata(&data).unwrap().len();
    let scratch = sb.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let sock = sb.path().join("s.sock");
    // 64 MiB: the copies may take about 47 MiB (less a read's 16 and a ring's 1), less
    // than the 80 MB of files; a part of about 44 MB is held.
    let d = Daemon::start(
        &sb,
        &sock,
        &[("train", &data)],
        &[
            "--mode",
            "resident",
            "--memory",
            "64M",
            "--scratch",
            scratch.to_str().unwrap(),
        ],
    );
    let mut r = req("train", 5, 0, 1);
    r.epochs = 3;
    let mut c = d.client_when_free();
    let mut s = c.open(r.clone()).unwrap();
    assert_eq!(s.opened.mode, "resident");
    let (mut got, mut piles) = (Vec::new(), 0);
    while let Some(b) = s.next_batch().unwrap() {
        piles = piles.max(pile_bytes(&scratch));
        got.push((
            b.header.epoch,
            b.header.index,
            b.ids().to_vec(),
            b.offsets().to_vec(),
            b.data().to_vec(),
        ));
    }
    drop(s);
    same_batches(&got, &in_process(&data, &r));
    let st = idle(&d);
    let h = copy(&st, "train").unwrap_or_else(|| panic!("a copy held in part: {st}"));
    let part = h["part"]
        .as_u64()
        .unwrap_or_else(|| panic!("held in part: {st}"));
    assert!(
        part >= size / 4 && part < size,
        "{part} of {size} held: {st}"
    );
    assert_eq!(h["loads"], 1, "{st}");
    assert!(h["bytes"].as_u64().unwrap() >= part, "charged: {st}");
    let rest = size - part;
    // Rolling keeps two epochs' piles at its peak: of the rest, not of the files.
    assert!(
        piles > 0 && piles <= 2 * rest + rest / 4,
        "the piles took {piles} bytes of scratch for the {rest} not held"
    );
    // Three epochs, the dataset read once: the part loaded, the rest scattered, its piles
    // rolled.
    let once = st["device_bytes"].as_u64().unwrap();
    assert!(
        once >= size && once <= size + size / 10,
        "three epochs read {once} bytes of a {size}-byte dataset: {st}"
    );
    // The piles go: a job's first pass rolls nothing past its end.
    assert_eq!(std::fs::read_dir(&scratch).unwrap().count(), 0, "piles go");
    assert_eq!(st["rolled"]["kept_now"], 0, "{st}");
    // The job's next stream (epoch 3 alone, as riffle.torch opens it) starts where the first
    // ended: it reads the rest from the device and rolls past its end; the one after
    // (epoch 4) starts from those piles: nothing read from the device, epoch 4's batches.
    let mut next = r.clone();
    (next.epoch, next.epochs) = (3, 1);
    same_batches(
        &read_all(&mut d.client_when_free(), next.clone()),
        &in_process(&data, &next),
    );
    let st = idle(&d);
    let twice = st["device_bytes"].as_u64().unwrap();
    assert!(
        twice >= once + rest,
        "epoch 3 read {} of the rest",
        twice - once
    );
    assert_eq!(st["rolled"]["kept_now"], 1, "{st}");
    (next.epoch, next.epochs) = (4, 1);
    same_batches(
        &read_all(&mut d.client_when_free(), next.clone()),
        &in_process(&data, &next),
    );
    let st = idle(&d);
    assert_eq!(st["rolled"]["rolled_passes"], 1, "{st}");
    assert_eq!(
        st["device_bytes"], twice,
        "the rolled epoch read the device: {st}"
    );
    // A later job, of another seed, one epoch: only the rest from the device.
    let r = req("train", 8, 0, 1);
    let before = read_bytes(d.child.id());
    same_batches(
        &read_all(&mut d.client_when_free(), r.clone()),
        &in_process(&data, &r),
    );
    let st = idle(&d);
    let later = st["device_bytes"].as_u64().unwrap() - twice;
    assert!(
        later >= rest && later <= rest + rest / 10 + (1 << 20),
        "a later pass read {later} bytes, {rest} not held: {st}"
    );
    // The kernel's count has the piles' reads too (a pile past its memory share is read
    // once per key sub-range): less than a whole two-pass pass reads, the files and their
    // piles.
    let read = read_bytes(d.child.id()) - before;
    assert!(
        read < 2 * size,
        "the daemon read {read} bytes for {rest} not held"
    );
    assert_eq!(copy(&st, "train").unwrap()["loads"], 1, "{st}");
}
