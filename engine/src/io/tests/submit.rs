//! Submission at each wait (`SUBMIT_AT_WAIT`) with registered buffers: what reaches the
//! kernel when, and slots reused by many reads in flight.

use super::*;

/// Requests pushed with submission at each wait stay in the submission queue until the
/// caller waits, and that wait submits them all (one io_uring_enter); each completion's
/// registered slot holds exactly its 4 KiB of the file, though every slot is reused by
/// dozens of reads with up to 64 in flight.
#[test]
fn requests_submitted_at_each_wait_go_with_the_wait_into_reused_registered_slots() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let (path, data) = random_file(dir.path(), "w.bin", 4 << 20, 51);
    let sizes = uring::Sizes {
        slots: 64,
        slot_size: 4096,
        align: 4096,
        in_flight: 0,
        submit_batch: SUBMIT_AT_WAIT,
    };
    let got = within(120, move || {
        let mut b = UringBackend::with_sizes(sizes, UringFeatures::default()).unwrap();
        let features = b.features();
        assert!(features.contains("submitted at each wait"), "{features}");
        if !features.contains("registered buffers") {
            return Err(features);
        }
        let file = Arc::new(DataFile::open(&path, Access::Read, true).unwrap());
        let key = b.add_file(file).unwrap();
        let mut rng = SmallRng::seed_from_u64(52);
        let mut uses = [0u32; 64];
        let mut out = Vec::new();
        let (mut issued, mut queued) = (0u64, 0usize);
        while issued < 4000 || b.in_flight() > 0 {
            while issued < 4000 {
                let Some(slot) = b.acquire() else { break };
                let block = rng.random_range(0..(4u64 << 20) / 4096);
                b.push(Op {
                    slot,
                    file: key,
                    offset: block * 4096,
                    len: 4096,
                    at: 0,
                    kind: OpKind::Read,
                    tag: block,
                })
                .unwrap();
                issued += 1;
                queued += 1;
                uses[slot.index()] += 1;
                // Nothing goes to the kernel before the wait.
                assert_eq!(b.sq_queued(), queued, "a push submitted");
            }
            b.wait(1, &mut out).unwrap();
            queued = 0;
            assert_eq!(b.sq_queued(), 0, "the wait left requests queued");
            for c in out.drain(..) {
                assert_eq!(c.result, Ok(4096));
                let at = c.op.tag as usize * 4096;
                assert!(
                    b.slot(c.op.slot) == &data[at..at + 4096],
                    "slot {} holds another block's bytes",
                    c.op.slot.index()
                );
                b.release(c.op.slot);
            }
        }
        Ok(uses)
    });
    let reuse = match got {
        Ok(got) => got,
        Err(features) => {
            crate::testing::skip(&format!(
                "the kernel refused registered buffers: {features}"
            ));
            return;
        }
    };
    assert!(reuse.iter().all(|&n| n >= 20), "slots reused: {reuse:?}");
}

/// Each request at once (the default everywhere but a memory-speed device): the kernel has
/// every request as soon as a second one is in flight, and a wait asks for one.
#[test]
fn requests_submitted_each_at_once_reach_the_kernel_at_the_push() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let (path, _) = random_file(dir.path(), "o.bin", 1 << 20, 53);
    within(60, move || {
        let mut b = UringBackend::new(16, 4096, 4096, SUBMIT_AUTO).unwrap();
        assert!(!b.features().contains("submitted"), "{}", b.features());
        let file = Arc::new(DataFile::open(&path, Access::Read, true).unwrap());
        let key = b.add_file(file).unwrap();
        for i in 0..8u64 {
            let slot = b.acquire().unwrap();
            b.push(Op {
                slot,
                file: key,
                offset: i * 4096,
                len: 4096,
                at: 0,
                kind: OpKind::Read,
                tag: i,
            })
            .unwrap();
            // The first waits for the caller's wait (submitted with it in one call).
            assert_eq!(b.sq_queued(), usize::from(i == 0), "push {i}");
        }
        let mut out = Vec::new();
        while b.in_flight() > 0 {
            b.wait(1, &mut out).unwrap();
        }
        assert_eq!(out.len(), 8);
        for c in out {
            b.release(c.op.slot);
        }
    });
}
