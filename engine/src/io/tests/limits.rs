//! Slots apart from requests in flight, the backends' limits, and the refusals past them.

use super::*;

/// A backend of more slots than requests in flight, on both backends: every slot is
/// pushed at once (more requests than the ring has entries or the pool threads), the
/// backend keeps at most its in-flight count at the kernel, and every slot gets its bytes.
/// With more slots than io_uring registers, the ring says it uses plain memory.
#[test]
fn a_backend_with_more_slots_than_requests_in_flight() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let slots = URING_MAX_REG_BUFFERS + 1;
    let (path, data) = random_file(dir.path(), "many.bin", slots * 4096, 41);
    for backend in [BackendChoice::Uring, BackendChoice::Pread] {
        let cfg = IoConfig {
            depth: slots,
            slot_size: 4096,
            in_flight: 3,
            backend,
            ..IoConfig::default()
        };
        let p = path.clone();
        let (got, features, depth, max) = within(120, move || {
            let mut b = open_backend(&cfg, 4096).unwrap();
            let file = Arc::new(DataFile::open(&p, Access::Read, true).unwrap());
            let key = b.add_file(file).unwrap();
            let held: Vec<SlotId> = (0..slots).map(|i| b.acquire_at(i).unwrap()).collect();
            // Every slot pushed before any wait: far more than the three in flight.
            for (i, &slot) in held.iter().enumerate().rev() {
                b.push(Op {
                    slot,
                    file: key,
                    offset: (i * 4096) as u64,
                    len: 4096,
                    at: 0,
                    kind: OpKind::Read,
                    tag: i as u64,
                })
                .unwrap();
            }
            assert_eq!(b.in_flight(), slots, "a push past the ring is counted");
            let (mut done, mut seen) = (Vec::new(), vec![false; slots]);
            while b.in_flight() > 0 {
                b.wait(1, &mut done).unwrap();
                for c in done.drain(..) {
                    assert_eq!(c.result, Ok(4096), "slot {}", c.op.slot.index());
                    assert!(!std::mem::replace(&mut seen[c.op.tag as usize], true));
                }
            }
            assert!(seen.iter().all(|&s| s), "a completion went missing");
            (
                b.run(held[0], slots).to_vec(),
                b.features(),
                b.depth(),
                b.max_in_flight(),
            )
        });
        assert_eq!((depth, max), (slots, 3), "{backend:?}");
        assert!(got == data, "{backend:?}: bytes differ");
        if backend == BackendChoice::Uring {
            assert!(
                features.contains("plain buffers (more slots than can be registered)"),
                "{features}"
            );
        }
    }
}

/// What each backend can give, asked without setting one up.
#[test]
fn backend_limits_say_what_a_backend_can_give() {
    let pread = backend_limits(BackendChoice::Pread);
    assert_eq!(pread.kind, BackendKind::Pread);
    assert_eq!(pread.max_in_flight, pread::MAX_THREADS);
    assert_eq!(pread.max_slots, MAX_SLOTS);
    assert_eq!(pread.max_registered_slots, 0);
    let uring = backend_limits(BackendChoice::Uring);
    assert_eq!(uring.kind, BackendKind::Uring);
    assert_eq!(uring.max_in_flight, URING_MAX_ENTRIES);
    assert_eq!(uring.max_registered_slots, URING_MAX_REG_BUFFERS);
    assert_eq!(uring.memlock, pread.memlock);
    // This machine has io_uring (the other tests use it), so Auto resolves to it unless
    // RIFFLE_IO says otherwise.
    if std::env::var("RIFFLE_IO").is_err() {
        assert_eq!(backend_limits(BackendChoice::Auto), uring);
    }
}

/// Slot counts, in-flight counts and sizes past the limits are refused with
/// `Error::Exhausted` naming what and how much, never cut down.
#[test]
fn impossible_sizes_are_refused_not_clamped() {
    let exhausted = |cfg: IoConfig| match open_backend(&cfg, 4096) {
        Err(Error::Exhausted {
            resource,
            asked,
            limit,
        }) => (resource, asked, limit),
        Err(e) => panic!("{cfg:?}: {e}"),
        Ok(b) => panic!("{cfg:?}: opened with {} slots", b.depth()),
    };
    for backend in [BackendChoice::Uring, BackendChoice::Pread] {
        let base = IoConfig {
            slot_size: 4096,
            backend,
            ..IoConfig::default()
        };
        let too_many = IoConfig {
            depth: MAX_SLOTS + 1,
            ..base.clone()
        };
        assert_eq!(
            exhausted(too_many),
            ("I/O slots", MAX_SLOTS as u64 + 1, MAX_SLOTS as u64)
        );
        let overflow = IoConfig {
            depth: 1 << 20,
            slot_size: 1 << 44,
            ..base.clone()
        };
        let (resource, asked, limit) = exhausted(overflow);
        assert_eq!((resource, asked), ("bytes of I/O slots", u64::MAX));
        assert_eq!(limit, isize::MAX as u64);
        let huge_slot = IoConfig {
            slot_size: usize::MAX - 5,
            ..base.clone()
        };
        assert_eq!(exhausted(huge_slot).0, "bytes per I/O slot");
        let limit = backend_limits(backend).max_in_flight;
        let in_flight = IoConfig {
            depth: limit + 10,
            in_flight: limit + 1,
            ..base.clone()
        };
        assert_eq!(
            exhausted(in_flight),
            ("I/O requests in flight", limit as u64 + 1, limit as u64)
        );
        let e = Error::Exhausted {
            resource: "I/O slots",
            asked: 20000,
            limit: 16384,
        };
        assert_eq!(
            e.to_string(),
            "not enough I/O slots: 20000 asked, 16384 available"
        );
    }
    // The constructors a caller may use directly refuse the same way.
    let e = UringBackend::new(MAX_SLOTS + 1, 4096, 4096, 1)
        .err()
        .unwrap();
    assert!(matches!(e, Error::Exhausted { .. }), "{e}");
    let e = pread::PreadBackend::new(1 << 20, 1 << 44, 4096, 1)
        .err()
        .unwrap();
    assert!(matches!(e, Error::Exhausted { .. }), "{e}");
}

/// Slots past the old silent cap of 4,096 are what was asked, on both backends.
#[test]
fn more_than_4096_slots_are_given_not_clamped() {
    for backend in [BackendChoice::Uring, BackendChoice::Pread] {
        let cfg = IoConfig {
            depth: 5000,
            slot_size: 4096,
            in_flight: 16,
            backend,
            ..IoConfig::default()
        };
        let mut b = open_backend(&cfg, 4096).unwrap();
        assert_eq!((b.depth(), b.max_in_flight()), (5000, 16), "{backend:?}");
        assert!(b.acquire_at(4999).is_some(), "{backend:?}: the last slot");
        if backend == BackendChoice::Uring {
            // Registered unless the locked-memory limit refused them; never turned down
            // for the count.
            let f = b.features();
            assert!(
                f.starts_with("registered buffers") || f.contains("registration refused"),
                "{f}"
            );
        }
    }
}
