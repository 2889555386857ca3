//! The pile store's tests: piles written and read back on real files, both backends.

use super::reader::max_direct_slots;
use super::*;
use crate::io::BackendChoice;
use crate::pipeline::Stop;

/// Frames of every size, from empty to several extents long, under random keys.
fn frames(n: u64, seed: u64) -> Vec<(u64, Vec<u8>)> {
    let key = crate::order::EpochKey::new(seed, 0);
    (0..n)
        .map(|i| {
            let len = match i % 10 {
                0 => 0,
                1 => 9_000 + i as usize,
                _ => (i * 37 % 700) as usize,
            };
            (
                key.key(i),
                (0..len).map(|j| (i as usize + j) as u8).collect(),
            )
        })
        .collect()
}

fn written(
    layout: Layout,
    all: &[(u64, Vec<u8>)],
    backend: BackendChoice,
) -> (tempfile::TempDir, PileSet) {
    let dir = tempfile::tempdir_in(".").unwrap();
    let io = IoConfig {
        backend,
        ..IoConfig::default()
    };
    let mut w = PileWriter::new(dir.path(), layout, &io).unwrap();
    for (k, body) in all {
        // Bodies in two parts, as the two-pass scatter gives them.
        let (a, b) = body.split_at(body.len() / 3);
        w.frame(*k, &[a, b]).unwrap();
    }
    let set = w.finish().unwrap();
    (dir, set)
}

/// Every frame comes back from its pile, whole and in the order written, whether the
/// pile is read whole or in key sub-ranges, on both backends; frames span extents.
#[test]
fn piles_read_back_whole_and_in_key_sub_ranges() {
    let all = frames(3000, 7);
    // One extent per write, and extents of a group gathered into 1 MiB writes.
    let layouts = [
        Layout::new(5, 4096, 64 << 10),
        Layout::new(5, 4096, 4 << 20),
    ];
    assert_eq!((layouts[0].slot, layouts[1].slot), (8192, 1 << 20));
    assert_eq!(
        layouts[0].groups(),
        16.min(1 << super::super::bits_within(crate::io::open_file_limit()))
    );
    for (layout, backend) in [
        (layouts[0], BackendChoice::Uring),
        (layouts[0], BackendChoice::Pread),
        (layouts[1], BackendChoice::Uring),
        (layouts[1], BackendChoice::Pread),
    ] {
        for passes in [1u64, 3] {
            let (_dir, set) = written(layout, &all, backend);
            assert_eq!(set.len(), 32);
            let total: u64 = all
                .iter()
                .map(|(_, b)| (frame::head_len(b.len() as u64) + b.len()) as u64)
                .sum();
            assert_eq!(set.bytes(), total);
            let loads = set.into_loads(|_| passes);
            assert_eq!(loads.jobs.len() as u64, 32 * passes);
            let mut reader = PileReader::new(&IoConfig {
                backend,
                ..IoConfig::default()
            });
            let mut got: Vec<Vec<(u64, Vec<u8>)>> = vec![Vec::new(); 32];
            let (mut out, mut index) = (PileBuf::default(), Vec::new());
            for (i, load) in loads.jobs.into_iter().enumerate() {
                let pile = i / passes as usize;
                let (lo, hi) = (load.lo, load.hi);
                assert_eq!(load.whole, passes == 1);
                reader
                    .load(load, &mut out, &mut index, &Stop::default())
                    .unwrap();
                // Whole piles are read into the buffer's own ring, with no copy.
                assert_eq!(out.ring.is_some(), passes == 1);
                for &(k, at) in &index {
                    assert!((lo..hi).contains(&(k as u128)));
                    let f = frame::at(out.as_slice(), at);
                    assert_eq!(f.key, k);
                    got[pile].push((k, out.as_slice()[f.body..f.end].to_vec()));
                }
            }
            for (pile, frames) in got.iter().enumerate() {
                let mut want: Vec<_> = all
                    .iter()
                    .filter(|(k, _)| layout.pile_of(*k) == pile)
                    .cloned()
                    .collect();
                let mut frames = frames.clone();
                if passes > 1 {
                    // Sub-ranges give each frame once; across them the order is by range.
                    want.sort();
                    frames.sort();
                }
                assert!(
                    frames == want,
                    "{backend:?}, {passes} passes: pile {pile} differs"
                );
            }
        }
    }
}

/// Piles sharing one fill pool write extents of about twice their share (fixed buffers
/// of a share each wrote extents of exactly one share), every one but a pile's last a
/// whole number of chunks; and such piles read back whole into their own ring.
#[test]
fn a_shared_pool_writes_extents_of_twice_a_share() {
    let layout = Layout::new(5, 64 << 10, 4 << 20);
    assert_eq!((layout.extent, layout.chunk), (64 << 10, 8 << 10));
    let key = crate::order::EpochKey::new(9, 0);
    let all: Vec<(u64, Vec<u8>)> = (0..60_000u64)
        .map(|i| (key.key(i), vec![i as u8; 100 + (i % 200) as usize]))
        .collect();
    let (_dir, set) = written(layout, &all, BackendChoice::Auto);
    let mut lens: Vec<u64> = Vec::new();
    for p in &set.piles {
        let (last, rest) = p.extents.split_last().unwrap();
        assert!(last.len > 0);
        assert!(
            rest.iter().all(|e| e.len % (8 << 10) == 0),
            "a partial chunk"
        );
        lens.extend(rest.iter().map(|e| e.len));
    }
    lens.sort();
    let median = lens[lens.len() / 2];
    assert!(
        median >= 3 * layout.extent as u64 / 2,
        "median extent {median} bytes for a share of {}",
        layout.extent
    );
    assert!(lens.iter().all(|&l| l <= layout.slot as u64));
    let mut reader = PileReader::default();
    let (mut out, mut index) = (PileBuf::default(), Vec::new());
    let mut got = Vec::new();
    for load in set.into_loads(|_| 1).jobs {
        reader
            .load(load, &mut out, &mut index, &Stop::default())
            .unwrap();
        assert!(out.ring.is_some(), "a whole pile is read into its own ring");
        for &(k, at) in &index {
            let f = frame::at(out.as_slice(), at);
            got.push((k, out.as_slice()[f.body..f.end].to_vec()));
        }
    }
    let mut want = all;
    want.sort();
    got.sort();
    assert!(got == want, "frames differ");
}

/// Thousands of piles hold no more files than [`MAX_GROUPS`], while written and while
/// read: the open files of a run do not grow with its pile count.
#[test]
fn thousands_of_piles_share_a_few_files() {
    let all = frames(20_000, 11);
    let (dir, set) = written(Layout::new(12, 4096, 64 << 10), &all, BackendChoice::Auto);
    assert_eq!(set.len(), 4096);
    let files = std::fs::read_dir(
        dir.path()
            .read_dir()
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path(),
    )
    .unwrap()
    .count();
    assert!((1..=MAX_GROUPS).contains(&files), "{files} pile files");
    let mut distinct: Vec<_> = set.piles.iter().map(|p| Arc::as_ptr(&p.group)).collect();
    distinct.dedup();
    assert_eq!(distinct.len(), files);
    let mut n = 0;
    let mut reader = PileReader::default();
    let (mut out, mut index) = (PileBuf::default(), Vec::new());
    for load in set.into_loads(|_| 1).jobs {
        reader
            .load(load, &mut out, &mut index, &Stop::default())
            .unwrap();
        n += index.len();
    }
    assert_eq!(n, all.len());
}

/// Reads cut short (about half of each, ending off the alignment) go on where they
/// stopped: every frame comes back, whether the pile is read straight into the
/// buffer's own ring (whole) or copied out of the reader's (key sub-ranges).
#[test]
fn short_reads_go_on_where_they_stopped() {
    let all = frames(1500, 11);
    let mut want = all.clone();
    want.sort();
    for backend in [BackendChoice::Uring, BackendChoice::Pread] {
        for passes in [1u64, 2] {
            let (_dir, set) = written(Layout::new(3, 32 << 10, 256 << 10), &all, backend);
            let loads = set.into_loads(|_| passes);
            let mut got = crate::io::tests::with_short_transfers(|| {
                let mut reader = PileReader::new(&IoConfig {
                    backend,
                    ..IoConfig::default()
                });
                let (mut out, mut index) = (PileBuf::default(), Vec::new());
                let mut got = Vec::new();
                for load in loads.jobs {
                    reader
                        .load(load, &mut out, &mut index, &Stop::default())
                        .unwrap();
                    for &(k, at) in &index {
                        let f = frame::at(out.as_slice(), at);
                        got.push((k, out.as_slice()[f.body..f.end].to_vec()));
                    }
                }
                got
            });
            got.sort();
            assert!(got == want, "{backend:?}, {passes} passes: frames differ");
        }
    }
}

/// Piles of 4,097 to 16,384 chunks, and of more, on both backends. The first are read with
/// no copy into a ring of a slot per chunk (issue 28: a backend's slots were cut to 4,096
/// in silence, and such a pile's load panicked on slot 4,096); the second, more chunks than
/// a direct ring takes, are read through the reader's ring and copied. Every frame comes
/// back, in the order written.
#[test]
fn piles_past_4096_and_past_16384_chunks_load_on_both_backends() {
    for backend in [BackendChoice::Uring, BackendChoice::Pread] {
        let max = max_direct_slots(backend);
        assert_eq!(max, 16384);
        for (n, seed, direct) in [(12_000, 13, true), (40_000, 5, false)] {
            let all = frames(n, seed);
            let (_dir, set) = written(Layout::new(0, 4096, 64 << 10), &all, backend);
            let mut loads = set.into_loads(|_| 1).jobs;
            assert_eq!(loads.len(), 1);
            let load = loads.pop().unwrap();
            assert!(load.whole);
            let chunks = load
                .extents
                .iter()
                .map(|e| e.len.div_ceil(4096))
                .sum::<u64>() as usize;
            if direct {
                assert!((4097..=max).contains(&chunks), "{chunks} chunks");
            } else {
                assert!(chunks > max, "{chunks} chunks");
            }
            let mut reader = PileReader::new(&IoConfig {
                backend,
                ..IoConfig::default()
            });
            let (mut out, mut index) = (PileBuf::default(), Vec::new());
            reader
                .load(load, &mut out, &mut index, &Stop::default())
                .unwrap();
            match &out.ring {
                Some(ring) => {
                    assert!(direct, "{backend:?}: {chunks} chunks read with no copy");
                    assert!(ring.depth() >= chunks && ring.depth() <= max);
                    assert!(ring.max_in_flight() < ring.depth());
                }
                None => assert!(!direct, "{backend:?}: {chunks} chunks copied"),
            }
            let got: Vec<(u64, Vec<u8>)> = index
                .iter()
                .map(|&(k, at)| {
                    let f = frame::at(out.as_slice(), at);
                    (k, out.as_slice()[f.body..f.end].to_vec())
                })
                .collect();
            assert!(got == all, "{backend:?}, {chunks} chunks: frames differ");
        }
    }
}

/// A group file goes as soon as the last load of its piles is dropped, not at the end
/// of the pass: the scratch a pass holds shrinks as it goes. Whole piles (read into
/// the buffer's own ring, which holds the file for the load only) let go at once; key
/// sub-ranges (read through the reader's ring for the group) when the reader moves on.
#[test]
fn group_files_go_as_their_piles_are_read() {
    for passes in [1u64, 2] {
        let all = frames(2000, 3);
        let (dir, set) = written(Layout::new(4, 4096, 64 << 10), &all, BackendChoice::Auto);
        let groups = set.piles.iter().map(|p| p.group.file.path().to_path_buf());
        let mut groups: Vec<_> = groups.collect();
        groups.dedup();
        assert!(groups.len() > 1);
        let loads = set.into_loads(|_| passes);
        let mut jobs = loads.jobs.into_iter();
        let per_group = 16 / groups.len() * passes as usize;
        let mut reader = PileReader::default();
        let (mut out, mut index) = (PileBuf::default(), Vec::new());
        for _ in 0..per_group {
            assert!(groups[0].exists());
            reader
                .load(jobs.next().unwrap(), &mut out, &mut index, &Stop::default())
                .unwrap();
        }
        assert_eq!(groups[0].exists(), passes > 1, "{passes} passes");
        assert!(groups[1].exists());
        reader
            .load(jobs.next().unwrap(), &mut out, &mut index, &Stop::default())
            .unwrap();
        assert!(!groups[0].exists(), "read group file still there");
        drop(jobs);
        drop(reader);
        drop(loads.dir);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}

/// A group file cut short (the scratch changed under the run) is an error naming the
/// file, never a panic or a wrong pile; so is a stopped run.
#[test]
fn a_cut_group_file_and_a_stop_are_errors() {
    let all = frames(500, 5);
    let (_dir, set) = written(Layout::new(0, 4096, 64 << 10), &all, BackendChoice::Auto);
    let path = set.piles[0].group.file.path().to_path_buf();
    let size = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(size - 5000).unwrap();
    let mut loads = set.into_loads(|_| 1);
    let load = loads.jobs.pop().unwrap();
    let (mut out, mut index) = (PileBuf::default(), Vec::new());
    let e = PileReader::default()
        .load(load, &mut out, &mut index, &Stop::default())
        .unwrap_err();
    assert!(!e.is_cancelled(), "{e}");
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");

    let (_dir, set) = written(Layout::new(0, 4096, 64 << 10), &all, BackendChoice::Auto);
    let stop = Stop::default();
    stop.set();
    let load = set.into_loads(|_| 1).jobs.pop().unwrap();
    let e = PileReader::default()
        .load(load, &mut out, &mut index, &stop)
        .unwrap_err();
    // A stop is told apart from a failure by its kind, and keeps its words.
    assert_eq!(e.kind(), crate::ErrorKind::Cancelled, "{e}");
    assert!(e.to_string().contains("stopped"), "{e}");
}
