//! I/O core tests on real files: real io_uring, real O_DIRECT, real pread threads.

use std::path::Path;
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, RngExt, SeedableRng};

use super::*;

fn random_file(dir: &Path, name: &str, len: usize, seed: u64) -> (std::path::PathBuf, Vec<u8>) {
    let mut data = vec![0u8; len];
    SmallRng::seed_from_u64(seed).fill_bytes(&mut data);
    let p = dir.join(name);
    std::fs::write(&p, &data).unwrap();
    (p, data)
}

fn read_all(
    path: &Path,
    cfg: &IoConfig,
    ranges: &[(usize, u64, usize)],
) -> (Vec<Vec<u8>>, BackendKind, bool) {
    let mut r = RangeReader::open(&[path], cfg).unwrap();
    let mut out = vec![None; ranges.len()];
    r.read_ranges(ranges.iter().copied(), |i, b| {
        assert!(out[i].is_none(), "request {i} delivered twice");
        out[i] = Some(b.to_vec());
    })
    .unwrap();
    (
        out.into_iter()
            .map(|o| o.expect("every request delivered"))
            .collect(),
        r.backend_kind(),
        r.direct(),
    )
}

fn expect(data: &[u8], ranges: &[(usize, u64, usize)]) -> Vec<Vec<u8>> {
    ranges
        .iter()
        .map(|&(_, off, len)| {
            let s = (off as usize).min(data.len());
            let e = (off as usize + len).min(data.len());
            data[s..e].to_vec()
        })
        .collect()
}

/// Random ranges of any alignment, some long enough to span several slots, some crossing
/// or beyond the end of the file.
fn ranges(file_len: u64, n: usize, seed: u64) -> Vec<(usize, u64, usize)> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let off = rng.random_range(0..file_len + 100);
            let len = match i % 4 {
                0 => rng.random_range(1..64),
                1 => rng.random_range(1..20_000),
                2 => rng.random_range(100_000..600_000),
                _ => (file_len - off.min(file_len)) as usize + rng.random_range(0..5000),
            };
            (0, off, len)
        })
        .collect()
}

#[test]
fn uring_and_pread_return_identical_bytes() {
    let dir = tempfile::tempdir_in(".").unwrap();
    // Not a multiple of any alignment, so the tail is a partial block.
    let (path, data) = random_file(dir.path(), "a.bin", 3_000_001, 1);
    let rs = ranges(data.len() as u64, 400, 2);
    let want = expect(&data, &rs);
    let small = IoConfig {
        depth: 16,
        slot_size: 64 << 10,
        ..IoConfig::default()
    };
    let uring = IoConfig {
        backend: BackendChoice::Uring,
        ..small.clone()
    };
    let pread = IoConfig {
        backend: BackendChoice::Pread,
        ..small.clone()
    };
    let (got_u, kind_u, direct_u) = read_all(&path, &uring, &rs);
    let (got_p, kind_p, _) = read_all(&path, &pread, &rs);
    assert_eq!(kind_u, BackendKind::Uring);
    assert_eq!(kind_p, BackendKind::Pread);
    assert!(
        direct_u,
        "the test file system is expected to allow O_DIRECT"
    );
    assert_eq!(got_u, want, "io_uring bytes differ from the file");
    assert_eq!(got_p, want, "pread bytes differ from the file");
}

#[test]
fn misaligned_ranges_are_handled() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let (path, data) = random_file(dir.path(), "m.bin", 1 << 20, 3);
    let rs: Vec<_> = [
        (1u64, 1usize),
        (511, 2),
        (4095, 4098),
        (12_345, 67_891),
        (0, 1 << 20),
    ]
    .iter()
    .map(|&(o, l)| (0, o, l))
    .collect();
    let (got, _, _) = read_all(&path, &IoConfig::default(), &rs);
    assert_eq!(got, expect(&data, &rs));
}

#[test]
fn reads_crossing_eof_return_exactly_the_files_bytes() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let (path, data) = random_file(dir.path(), "e.bin", 10_007, 4);
    let rs = vec![
        (0, 10_000, 100),
        (0, 0, 1 << 20),
        (0, 10_007, 5),
        (0, 50_000, 10),
        (0, 10_006, 1),
    ];
    let (got, _, _) = read_all(&path, &IoConfig::default(), &rs);
    assert_eq!(got[0], data[10_000..].to_vec());
    assert_eq!(got[1], data);
    assert!(got[2].is_empty() && got[3].is_empty());
    assert_eq!(got[4], vec![data[10_006]]);
}

#[test]
fn empty_file_reads_nothing() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let (path, _) = random_file(dir.path(), "z.bin", 0, 5);
    let (got, _, _) = read_all(&path, &IoConfig::default(), &[(0, 0, 10)]);
    assert_eq!(got, vec![Vec::<u8>::new()]);
}

#[test]
fn dev_shm_falls_back_to_buffered_reads() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("skipped: /dev/shm does not exist on this machine");
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let (path, data) = random_file(dir.path(), "s.bin", 100_003, 6);
    let f = DataFile::open(&path, Access::Read, true).unwrap();
    assert!(!f.direct());
    assert!(
        f.buffered_reason().unwrap().contains("tmpfs"),
        "{:?}",
        f.buffered_reason()
    );
    let rs = ranges(data.len() as u64, 50, 7);
    let (got, _, direct) = read_all(&path, &IoConfig::default(), &rs);
    assert!(!direct);
    assert_eq!(got, expect(&data, &rs));
}

#[test]
fn direct_write_then_read_back() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let path = dir.path().join("w.bin");
    let size = 5_000_003u64;
    for backend in [BackendChoice::Uring, BackendChoice::Pread] {
        let cfg = IoConfig {
            depth: 4,
            slot_size: 1 << 20,
            backend,
            ..IoConfig::default()
        };
        let mut fill = pattern_filler(9);
        let rep = write_file(&path, size, &cfg, &mut fill).unwrap();
        assert!(rep.direct);
        let written = std::fs::read(&path).unwrap();
        assert_eq!(written.len() as u64, size);
        let mut expected = vec![0u8; size as usize];
        let mut fill = pattern_filler(9);
        for (i, chunk) in expected.chunks_mut(1 << 20).enumerate() {
            fill((i << 20) as u64, chunk);
        }
        assert_eq!(written, expected, "{backend:?}");
    }
}

/// The kernel, not the engine, enforces O_DIRECT alignment: a misaligned request on the raw
/// backend fails with EINVAL, which is why the reader rounds every range to whole extents.
#[test]
fn raw_misaligned_direct_read_fails() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let (path, _) = random_file(dir.path(), "r.bin", 1 << 20, 8);
    let file = Arc::new(DataFile::open(&path, Access::Read, true).unwrap());
    assert!(file.direct());
    let unit = file.alignment().unit();
    for choice in [BackendChoice::Uring, BackendChoice::Pread] {
        let cfg = IoConfig {
            depth: 2,
            slot_size: 4 * unit,
            backend: choice,
            ..IoConfig::default()
        };
        let mut b = open_backend(&cfg, unit).unwrap();
        let key = b.add_file(file.clone()).unwrap();
        let mut out = Vec::new();
        for (offset, len, ok) in [(0u64, unit, true), (1, unit, false)] {
            let slot = b.slab_mut().acquire().unwrap();
            b.push(Op {
                slot,
                file: key,
                offset,
                len,
                kind: OpKind::Read,
                tag: 0,
            })
            .unwrap();
            b.wait(1, &mut out).unwrap();
            let c = out.pop().unwrap();
            b.slab_mut().release(c.op.slot);
            if ok {
                assert_eq!(c.result, Ok(unit), "{choice:?}");
            } else {
                assert_eq!(c.result, Err(libc::EINVAL), "{choice:?}");
            }
        }
    }
}

#[test]
fn dropping_a_backend_with_requests_in_flight_waits_for_them() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let (path, _) = random_file(dir.path(), "d.bin", 4 << 20, 10);
    let file = Arc::new(DataFile::open(&path, Access::Read, true).unwrap());
    for choice in [BackendChoice::Uring, BackendChoice::Pread] {
        let cfg = IoConfig {
            depth: 32,
            slot_size: 128 << 10,
            backend: choice,
            ..IoConfig::default()
        };
        let mut b = open_backend(&cfg, file.alignment().unit()).unwrap();
        let key = b.add_file(file.clone()).unwrap();
        for i in 0..32u64 {
            let slot = b.slab_mut().acquire().unwrap();
            b.push(Op {
                slot,
                file: key,
                offset: i * (128 << 10),
                len: 128 << 10,
                kind: OpKind::Read,
                tag: i,
            })
            .unwrap();
        }
        assert_eq!(b.in_flight(), 32);
        drop(b); // must not free slots the kernel is writing into (checked under ASan/valgrind)
    }
}

/// A file that shrinks under a reader: the reads past the new end fail clearly, and the
/// reader is still usable afterwards (no slot is left held after an error).
#[test]
fn a_shrunk_file_fails_clearly_and_the_reader_survives() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let (path, data) = random_file(dir.path(), "shrink.bin", 1 << 20, 11);
    let cfg = IoConfig {
        depth: 8,
        slot_size: 64 << 10,
        ..IoConfig::default()
    };
    let mut r = RangeReader::open(&[&path], &cfg).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(100_000)
        .unwrap();
    let ranges: Vec<_> = (0..16u64).map(|i| (0, i * 60_000, 4096)).collect();
    let e = r
        .read_ranges(ranges.iter().copied(), |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("shrink.bin") && e.contains("changed while being read"),
        "{e}"
    );
    for _ in 0..3 {
        let mut got = Vec::new();
        r.read_ranges((0..16u64).map(|i| (0, i * 4096, 100)), |i, b| {
            got.push((i, b.to_vec()))
        })
        .unwrap();
        got.sort();
        for (i, b) in got {
            assert_eq!(b, data[i * 4096..i * 4096 + 100].to_vec());
        }
    }
}
