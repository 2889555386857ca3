//! I/O core tests on real files: real io_uring, real O_DIRECT, real pread threads.
// Test data is made with casts that are meant to wrap (byte patterns from counters).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss
)]

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, RngExt, SeedableRng};

use super::uring::UringBackend;
use super::*;

mod faults;
mod limits;
mod submit;
pub(crate) use faults::with_short_transfers;
use faults::{close_gate, open_gate, taken_by_drop, within, WATCHED};
pub(super) use faults::{pread_gate, reaped_by_drop, wrap_backend};

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

/// Every io_uring feature set (each default turned off, SQPOLL on, batched submission)
/// returns the file's bytes, and the backend says which features it got.
#[test]
fn every_uring_feature_set_returns_the_same_bytes() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let (path, data) = random_file(dir.path(), "a.bin", 2_000_003, 3);
    let rs = ranges(data.len() as u64, 200, 4);
    let want = expect(&data, &rs);
    let all = UringFeatures::default();
    let sets = [
        ("", all, 1),
        (
            "plain buffers",
            UringFeatures {
                fixed_buffers: false,
                ..all
            },
            1,
        ),
        (
            "plain fds",
            UringFeatures {
                fixed_files: false,
                ..all
            },
            1,
        ),
        (
            "no COOP_TASKRUN",
            UringFeatures {
                coop_taskrun: false,
                ..all
            },
            1,
        ),
        (
            "SQPOLL",
            UringFeatures {
                sqpoll_idle_ms: Some(10),
                ..all
            },
            1,
        ),
        ("", all, 8),
    ];
    for (says, features, batch) in sets {
        let cfg = IoConfig {
            depth: 16,
            slot_size: 64 << 10,
            backend: BackendChoice::Uring,
            submit_batch: batch,
            uring: features,
            ..IoConfig::default()
        };
        let got = open_backend(&cfg, 4096).unwrap().features();
        if !got.contains(says) {
            // A kernel may refuse a flag (SQPOLL in a container); the ring is plain then.
            eprintln!("{features:?}: the kernel gave {got}; bytes checked all the same");
        }
        let (bytes, kind, _) = read_all(&path, &cfg, &rs);
        assert_eq!(kind, BackendKind::Uring);
        assert_eq!(bytes, want, "{features:?}, batch {batch}: bytes differ");
    }
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
        crate::testing::skip_needed_in_ci("/dev/shm does not exist on this machine");
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
            let slot = b.acquire().unwrap();
            b.push(Op {
                slot,
                file: key,
                offset,
                len,
                at: 0,
                kind: OpKind::Read,
                tag: 0,
            })
            .unwrap();
            b.wait(1, &mut out).unwrap();
            let c = out.pop().unwrap();
            b.release(c.op.slot);
            if ok {
                assert_eq!(c.result, Ok(unit), "{choice:?}");
            } else {
                assert_eq!(c.result, Err(libc::EINVAL), "{choice:?}");
            }
        }
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

// ---- Tests of the slot and request contract. ----

/// Short transfers happen (a signal, a full device, a filesystem that returns what it
/// has): every reader and writer goes on where the transfer stopped, into or from the rest
/// of the slot, on both backends, and the bytes are exactly the file's.
#[test]
fn short_transfers_continue_where_they_stopped() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let (path, data) = random_file(dir.path(), "short.bin", 3_000_001, 12);
    let data = Arc::new(data);
    let rs = ranges(data.len() as u64, 200, 13);
    let want = expect(&data, &rs);
    for backend in [BackendChoice::Uring, BackendChoice::Pread] {
        let cfg = IoConfig {
            depth: 8,
            slot_size: 256 << 10,
            backend,
            ..IoConfig::default()
        };
        // Each part on its own thread with a time limit: a reader that starts over after a
        // short transfer never finishes here, since every first transfer is short.
        let (p, c, r) = (path.clone(), cfg.clone(), rs.clone());
        let (got, retries) = within(60, move || {
            with_short_transfers(|| {
                let mut reader = RangeReader::open(&[&p], &c).unwrap();
                let mut got = vec![None; r.len()];
                reader
                    .read_ranges(r.iter().copied(), |i, b| got[i] = Some(b.to_vec()))
                    .unwrap();
                (got, reader.stats().retries)
            })
        });
        let got: Vec<_> = got.into_iter().map(Option::unwrap).collect();
        assert_eq!(got, want, "{backend:?}: reader bytes");
        assert!(retries > 0, "{backend:?}: no short read happened");

        let (p, c) = (path.clone(), cfg.clone());
        let scanned = within(60, move || {
            with_short_transfers(|| {
                let file = Arc::new(DataFile::open(&p, Access::Read, true).unwrap());
                let mut scanned = Vec::new();
                scan_file(&file, &c, |_, b| {
                    scanned.extend_from_slice(b);
                    Ok(())
                })
                .unwrap();
                scanned
            })
        });
        assert!(scanned == *data, "{backend:?}: scanned bytes differ");

        let out = dir.path().join(format!("short-{backend:?}.bin"));
        let (o, c, d) = (out.clone(), cfg.clone(), data.clone());
        within(60, move || {
            with_short_transfers(|| {
                write_file(&o, d.len() as u64, &c, |off, buf| {
                    buf.copy_from_slice(&d[off as usize..off as usize + buf.len()]);
                })
                .unwrap()
            })
        });
        assert!(
            std::fs::read(&out).unwrap() == *data,
            "{backend:?}: write_file"
        );

        let streamed = dir.path().join(format!("stream-{backend:?}.bin"));
        let (o, c, d) = (streamed.clone(), cfg.clone(), data.clone());
        within(60, move || {
            with_short_transfers(|| {
                let mut w = StreamWriter::create(&o, &c).unwrap();
                for piece in d.chunks(70_001) {
                    w.write(piece).unwrap();
                }
                w.finish().unwrap()
            })
        });
        assert!(
            std::fs::read(&streamed).unwrap() == *data,
            "{backend:?}: stream"
        );
    }
}

/// One request may fill consecutive slots (a pile is read that way, an extent of several
/// slots per read): the bytes land back to back, on both backends, with and without
/// registered buffers, and when every transfer stops short and goes on across a slot
/// boundary. The slots it covers are in flight until its completion: none can be lent.
#[test]
fn a_request_fills_consecutive_slots() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let (path, data) = random_file(dir.path(), "runs.bin", 1 << 20, 21);
    let plain = UringFeatures {
        fixed_buffers: false,
        ..UringFeatures::default()
    };
    for (backend, uring, short) in [
        (BackendChoice::Uring, UringFeatures::default(), false),
        (BackendChoice::Uring, plain, false),
        (BackendChoice::Pread, UringFeatures::default(), false),
        (BackendChoice::Uring, UringFeatures::default(), true),
        (BackendChoice::Pread, UringFeatures::default(), true),
    ] {
        let cfg = IoConfig {
            depth: 8,
            slot_size: 16 << 10,
            backend,
            uring,
            ..IoConfig::default()
        };
        let p = path.clone();
        let got = within(60, move || {
            let run = || {
                let mut b = open_backend(&cfg, 4096).unwrap();
                let file = Arc::new(DataFile::open(&p, Access::Read, true).unwrap());
                let key = b.add_file(file).unwrap();
                let slots: Vec<SlotId> = (0..6).map(|i| b.acquire_at(i).unwrap()).collect();
                // Three slots from 64 KiB in, two from 512 KiB, one from 0.
                let reads = [(0usize, 64u64 << 10, 3usize), (3, 512 << 10, 2), (5, 0, 1)];
                for (i, &(first, offset, n)) in reads.iter().enumerate() {
                    b.push(Op {
                        slot: slots[first],
                        file: key,
                        offset,
                        len: n * (16 << 10),
                        at: 0,
                        kind: OpKind::Read,
                        tag: i as u64,
                    })
                    .unwrap();
                }
                let inner = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    b.slot(slots[1]).len()
                }));
                assert!(
                    inner.is_err(),
                    "a slot covered by a request in flight is lent"
                );
                let unit = b.file(key).alignment().io_unit();
                let mut done = Vec::new();
                while b.in_flight() > 0 {
                    b.wait(1, &mut done).unwrap();
                    for c in done.drain(..) {
                        let n = c.result.unwrap();
                        let (_, _, slots) = reads[c.op.tag as usize];
                        if c.op.at + n < slots * (16 << 10) {
                            b.push(c.op.advance(n / unit * unit)).unwrap();
                        }
                    }
                }
                b.run(slots[0], 6).to_vec()
            };
            if short {
                with_short_transfers(run)
            } else {
                run()
            }
        });
        let mut want = data[64 << 10..112 << 10].to_vec();
        want.extend_from_slice(&data[512 << 10..544 << 10]);
        want.extend_from_slice(&data[..16 << 10]);
        assert!(
            got == want,
            "{backend:?}, {uring:?}, short {short}: bytes differ"
        );
    }
}

/// The backend's Drop waits for a request the kernel has not completed, however long that
/// takes: an io_uring read on an empty pipe completes only when the test writes to it, so
/// a Drop that freed the slot without waiting returns at once and fails here, and the
/// bytes the kernel wrote are in the slot the Drop reaped.
#[test]
fn dropping_a_uring_backend_waits_for_a_pending_read() {
    let (reader, mut writer) = std::io::pipe().unwrap();
    let pipe = File::from(OwnedFd::from(reader));
    let file = Arc::new(DataFile::create(pipe, Path::new("test-pipe"), false).unwrap());
    let mut b = UringBackend::new(2, 4096, 4096, 1).unwrap();
    let key = b.add_file(file).unwrap();
    let tag = WATCHED | 1;
    let slot = b.acquire().unwrap();
    b.push(Op {
        slot,
        file: key,
        offset: 0,
        len: 4096,
        at: 0,
        kind: OpKind::Read,
        tag,
    })
    .unwrap();
    let mut out = Vec::new();
    b.wait(0, &mut out).unwrap(); // submitted: the kernel has it
    assert!(out.is_empty(), "an empty pipe gave {:?}", out);
    assert_eq!(b.in_flight(), 1);
    let (tx, rx) = mpsc::channel();
    let dropper = std::thread::spawn(move || {
        drop(b);
        tx.send(()).unwrap();
    });
    assert_eq!(
        rx.recv_timeout(Duration::from_millis(200)),
        Err(mpsc::RecvTimeoutError::Timeout),
        "the backend was dropped while the kernel could still write into its slot"
    );
    let msg = b"written while the backend was being dropped";
    writer.write_all(msg).unwrap();
    rx.recv_timeout(Duration::from_secs(10))
        .expect("Drop returns once the read completed");
    dropper.join().unwrap();
    assert_eq!(taken_by_drop(tag).as_deref(), Some(&msg[..]));
}

/// The same for the pread pool: a job held at the gate keeps its worker (and so the Drop)
/// waiting until the gate opens, and the Drop reaps the bytes the worker read.
#[test]
fn dropping_a_pread_backend_waits_for_a_pending_read() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let (path, data) = random_file(dir.path(), "gated.bin", 64 << 10, 14);
    let file = Arc::new(DataFile::open(&path, Access::Read, true).unwrap());
    let unit = file.alignment().unit();
    let mut b = pread::PreadBackend::new(2, 4 * unit, unit, 2).unwrap();
    let key = b.add_file(file).unwrap();
    close_gate(&path);
    let tag = WATCHED | 2;
    let slot = b.acquire().unwrap();
    b.push(Op {
        slot,
        file: key,
        offset: unit as u64,
        len: unit,
        at: 0,
        kind: OpKind::Read,
        tag,
    })
    .unwrap();
    let (tx, rx) = mpsc::channel();
    let dropper = std::thread::spawn(move || {
        drop(b);
        tx.send(()).unwrap();
    });
    // Should this fail, the gate stays closed: the worker never writes into the freed slot.
    assert_eq!(
        rx.recv_timeout(Duration::from_millis(200)),
        Err(mpsc::RecvTimeoutError::Timeout),
        "the pool was dropped while a worker could still write into its slot"
    );
    open_gate(&path);
    rx.recv_timeout(Duration::from_secs(10))
        .expect("Drop returns once the read completed");
    dropper.join().unwrap();
    assert_eq!(taken_by_drop(tag).as_deref(), Some(&data[unit..2 * unit]));
}

/// A push the ring could not take (its queue full, and submitting failing) counts nothing
/// in flight: the slot is the caller's again, the backend still works, and Drop has
/// nothing to wait for.
#[test]
fn a_failed_push_gives_the_slot_back() {
    within(30, || {
        let dir = tempfile::tempdir_in(".").unwrap();
        let (path, data) = random_file(dir.path(), "push.bin", 64 << 10, 15);
        let file = Arc::new(DataFile::open(&path, Access::Read, true).unwrap());
        let unit = file.alignment().unit();
        let mut b = UringBackend::new(2, unit, unit, 1).unwrap();
        let key = b.add_file(file).unwrap();
        let slot = b.acquire().unwrap();
        let op = Op {
            slot,
            file: key,
            offset: 0,
            len: unit,
            at: 0,
            kind: OpKind::Read,
            tag: 0,
        };
        b.faults().sq_full = 1;
        b.faults().enter = 1;
        assert!(b.push(op).is_err());
        assert_eq!(b.in_flight(), 0);
        b.slot_mut(slot)[0] = 1; // held again, so reachable
        b.push(op).unwrap();
        let mut out = Vec::new();
        b.wait(1, &mut out).unwrap();
        assert_eq!(out[0].result, Ok(unit));
        assert_eq!(b.slot(slot)[..unit], data[..unit]);
        b.release(slot);
        let slot = b.acquire().unwrap();
        b.faults().sq_full = 1;
        b.faults().enter = 1;
        assert!(b.push(Op { slot, ..op }).is_err());
    });
}

/// A request that came back with EAGAIN is queued again by the next wait; if that wait
/// fails before the ring has it, the request stays in flight and the following wait
/// completes it (before: it was forgotten, so waits and Drop hung on it forever).
#[test]
fn a_failed_wait_keeps_requeued_requests() {
    within(30, || {
        let dir = tempfile::tempdir_in(".").unwrap();
        let (path, data) = random_file(dir.path(), "requeue.bin", 64 << 10, 16);
        let file = Arc::new(DataFile::open(&path, Access::Read, true).unwrap());
        let unit = file.alignment().unit();
        let mut b = UringBackend::new(2, unit, unit, 1).unwrap();
        let key = b.add_file(file).unwrap();
        let slot = b.acquire().unwrap();
        b.push(Op {
            slot,
            file: key,
            offset: unit as u64,
            len: unit,
            at: 0,
            kind: OpKind::Read,
            tag: 0,
        })
        .unwrap();
        let mut out = Vec::new();
        b.wait(0, &mut out).unwrap(); // submitted
        let deadline = Instant::now() + Duration::from_secs(10);
        while b.cq_ready() == 0 {
            assert!(Instant::now() < deadline, "the read never completed");
            std::thread::sleep(Duration::from_millis(1));
        }
        b.faults().eagain = 1; // the completion reads as EAGAIN: requeued
        b.faults().sq_full = 1; // and queuing it again fails
        b.faults().enter = 1;
        assert!(b.wait(1, &mut out).is_err());
        assert!(out.is_empty());
        assert_eq!((b.in_flight(), b.requeued()), (1, 1));
        b.wait(1, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].result, Ok(unit));
        assert_eq!(b.slot(slot)[..unit], data[unit..2 * unit]);
    });
}

/// Only a lasting lack of io_uring is kept for the process: a resource that ran short at
/// the first probe (EMFILE, ENFILE, ENOMEM) is tried again by the next backend.
#[test]
fn only_a_lasting_lack_of_io_uring_is_remembered() {
    use std::sync::OnceLock;
    use uring::{probe_cached, Unavailable};
    let fail = |errno| move || Err(std::io::Error::from_raw_os_error(errno));
    for errno in [libc::EMFILE, libc::ENFILE, libc::ENOMEM] {
        let cache = OnceLock::new();
        match probe_cached(&cache, fail(errno)) {
            Err(Unavailable::Transient(why)) => assert!(
                why.contains(if errno == libc::EMFILE {
                    "EMFILE"
                } else if errno == libc::ENFILE {
                    "ENFILE"
                } else {
                    "ENOMEM"
                }),
                "{why}"
            ),
            other => panic!("errno {errno}: {other:?}"),
        }
        assert!(cache.get().is_none(), "errno {errno} was remembered");
        let later = probe_cached(&cache, || io_uring::IoUring::new(2));
        assert!(later.is_ok(), "the next probe works: {:?}", later.err());
        assert!(probe_cached(&cache, || panic!("probed twice")).is_ok());
    }
    for (errno, name) in [
        (libc::ENOSYS, "ENOSYS"),
        (libc::EPERM, "EPERM"),
        (libc::EINVAL, "EINVAL"),
    ] {
        let cache = OnceLock::new();
        let first = probe_cached(&cache, fail(errno)).unwrap_err();
        assert!(
            matches!(&first, Unavailable::Unsupported(why) if why.contains(name)),
            "{first:?}"
        );
        let again = probe_cached(&cache, || panic!("probed twice")).unwrap_err();
        assert_eq!(again, first);
    }
}

/// Descriptors of this process open on files under `dir`.
fn fds_under(dir: &Path) -> usize {
    let dir = dir.canonicalize().unwrap();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(&dir)))
        .count()
}

/// A lazy reader holds no more files open than its cap (evicting the least recently used
/// file with nothing planned on it), opens files again when they come back, and returns
/// the same bytes as a reader that opened everything up front, on both backends.
#[test]
fn a_lazy_reader_keeps_its_cap_and_returns_the_same_bytes() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let n = 60;
    let files: Vec<_> = (0..n)
        .map(|i| random_file(dir.path(), &format!("f{i:03}"), 5000 + i * 731, i as u64))
        .collect();
    let mut rng = SmallRng::seed_from_u64(9);
    let reqs: Vec<(usize, u64, usize)> = (0..2000)
        .map(|_| {
            let f = rng.random_range(0..n);
            let len = files[f].1.len() as u64;
            let off = rng.random_range(0..len);
            (f, off, rng.random_range(1..3000))
        })
        .collect();
    let want: Vec<Vec<u8>> = reqs
        .iter()
        .map(|&(f, off, len)| {
            let d = &files[f].1;
            let end = (off as usize + len).min(d.len());
            d[off as usize..end].to_vec()
        })
        .collect();
    for backend in [BackendChoice::Uring, BackendChoice::Pread] {
        let cfg = IoConfig {
            depth: 4,
            slot_size: 64 << 10,
            backend,
            ..IoConfig::default()
        };
        let lazy = files
            .iter()
            .map(|(p, d)| LazyFile {
                path: p.clone(),
                size: d.len() as u64,
                ..LazyFile::default()
            })
            .collect();
        let cap = 8;
        let mut r = RangeReader::lazy(lazy, &cfg, cap).unwrap();
        let mut got = vec![None; reqs.len()];
        // The process's descriptors of this test's files, counted as the reads complete:
        // files open in the reader and files its opener threads opened ahead.
        let mut most = 0;
        r.read_ranges(reqs.iter().copied(), |i, b| {
            got[i] = Some(b.to_vec());
            if i % 50 == 0 {
                most = most.max(fds_under(dir.path()));
            }
        })
        .unwrap();
        let got: Vec<Vec<u8>> = got.into_iter().map(Option::unwrap).collect();
        assert!(got == want, "{backend:?}: other bytes than the files'");
        assert!(most > 0, "{backend:?}: no descriptor of the files seen");
        assert!(most <= cap, "{backend:?}: {most} files open, cap {cap}");
        assert!(
            r.opened_ahead() > 0,
            "{backend:?}: no file was opened ahead"
        );
        let (_, opens) = r.open_files();
        assert!(
            opens > n as u64,
            "{backend:?}: {opens} opens: nothing was evicted"
        );
    }
}

/// A file that changed or went away after the dataset was listed is an error naming it
/// when it is read, not a panic; the reader reads the other files afterwards.
#[test]
fn a_lazy_reader_names_a_file_gone_or_changed() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let (a, _) = random_file(dir.path(), "a", 10_000, 1);
    let (b, db) = random_file(dir.path(), "b", 10_000, 2);
    let (c, _) = random_file(dir.path(), "c", 10_000, 3);
    let lazy = [(&a, 10_000), (&b, 10_000), (&c, 10_000)]
        .iter()
        .map(|(p, s)| LazyFile {
            path: (*p).clone(),
            size: *s,
            ..LazyFile::default()
        })
        .collect();
    let mut r = RangeReader::lazy(lazy, &IoConfig::default(), 16).unwrap();
    std::fs::remove_file(&a).unwrap();
    std::fs::write(&c, b"shorter").unwrap();
    let e = r
        .read_ranges([(0, 0, 100)], |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains(&a.display().to_string()), "{e}");
    let e = r
        .read_ranges([(2, 0, 100)], |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&c.display().to_string()) && e.contains("changed"),
        "{e}"
    );
    let mut got = Vec::new();
    r.read_ranges([(1, 10, 50)], |_, bytes| got = bytes.to_vec())
        .unwrap();
    assert_eq!(got, db[10..60]);
}

/// Reads leave a file's access time alone where O_NOATIME is allowed (the file's owner):
/// a read-only pass over a dataset writes no inode back.
#[test]
fn reads_do_not_touch_the_access_time_of_files_one_owns() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir_in(".").unwrap();
    let (path, data) = random_file(dir.path(), "a", 20_000, 4);
    // An access time well before the modification time: relatime would update it.
    let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_times(std::fs::FileTimes::new().set_accessed(old))
        .unwrap();
    let mut r = RangeReader::open(&[&path], &IoConfig::default()).unwrap();
    let mut got = Vec::new();
    r.read_ranges([(0, 0, 20_000)], |_, b| got = b.to_vec())
        .unwrap();
    assert_eq!(got, data);
    drop(r);
    assert_eq!(
        std::fs::metadata(&path).unwrap().atime(),
        1_000_000,
        "the read set atime"
    );
}

/// Issue 28: emulation is passed down, not read from a global. Under a throttle
/// (`IoConfig::throttled`, set by whoever entered it) writes asked with `Auto` take the
/// pread pool, whose I/O the throttle charges; a backend asked for by name is kept, and
/// nothing changes without a throttle.
#[test]
fn a_throttled_config_writes_through_the_pool_unless_a_backend_was_named() {
    let throttled = |backend| IoConfig {
        backend,
        throttled: true,
        ..IoConfig::default()
    };
    assert_eq!(
        throttled(BackendChoice::Auto).write_backend(),
        BackendChoice::Pread
    );
    assert_eq!(
        throttled(BackendChoice::Uring).write_backend(),
        BackendChoice::Uring
    );
    assert_eq!(IoConfig::default().write_backend(), BackendChoice::Auto);
}
