//! Piles rolled past a read's last epoch and handed to the next read (a daemon's next pass
//! of the same job): the same batches as a read of that epoch, and no scatter.

use std::sync::{Arc, Mutex};

use super::super::{read_two_pass, Batch, ReadOptions, Roll, RolledPiles};
use super::{all, make};
use crate::gen::GenFormat;

type Outcome = Arc<Mutex<Option<Result<RolledPiles, String>>>>;

/// A hand-off that keeps what the read rolled past its end in `out`.
fn keeping(start: Option<RolledPiles>) -> (Arc<Roll>, Outcome) {
    let out: Outcome = Arc::default();
    let o = out.clone();
    let keep: super::super::KeepRolled = Box::new(move |p| *o.lock().unwrap() = Some(p));
    (Roll::new(start, Some(keep)), out)
}

/// Epoch 0 of a two-pass read rolls its piles into epoch 1's and hands them on; a read of
/// epoch 1 given them reads nothing of the dataset, delivers exactly the batches of a
/// read of epoch 1 (and of LIRS), and rolls again for epoch 2. Piles for another epoch, or
/// a stopped read, are never used or handed on; nothing is left in the scratch.
#[test]
fn piles_rolled_past_a_reads_end_serve_the_next_epoch_without_reading_the_dataset() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let ds = make(dir.path(), GenFormat::Fixed, 3000, 4096, 0.0);
    let scratch = dir.path().join("scratch");
    let mut o = ReadOptions::new(48);
    o.memory = Some(24 << 20);
    let run = |o: &ReadOptions| {
        let mut s = read_two_pass(ds.clone(), o.clone(), scratch.clone()).unwrap();
        let got: Vec<Batch> = s.by_ref().map(|b| b.unwrap()).collect();
        (got, s.finish())
    };
    // Epoch 0, rolling past its end.
    let (roll, out) = keeping(None);
    o.roll = Some(roll);
    let (got, r) = run(&o);
    o.roll = None;
    assert_eq!(got, all(&ds, o.clone()));
    assert!(r.device_bytes >= ds.bytes(), "{}", r.device_bytes);
    assert!(!r.rolled_in);
    let kept = out.lock().unwrap().take().expect("told").expect("rolled");
    assert_eq!(kept.epoch(), 1);
    assert_eq!(r.rolled_out_bytes, kept.bytes());
    assert!(kept.bytes() >= ds.bytes(), "{}", kept.bytes());
    assert!(kept.path().exists());
    // Epoch 1 out of them: nothing of the dataset read, the batches of a read of epoch 1.
    let e1 = o.clone().with_epochs(1, 1);
    let (roll, out) = keeping(Some(kept));
    let (got, r) = run(&ReadOptions {
        roll: Some(roll),
        ..e1.clone()
    });
    assert!(r.rolled_in);
    assert_eq!(r.device_bytes, 0, "the rolled epoch read the dataset");
    assert_eq!(got, all(&ds, e1.clone()), "epoch 1's batches");
    assert_eq!(got, run(&e1).0);
    // And rolled again, for epoch 2.
    let kept = out.lock().unwrap().take().expect("told").expect("rolled");
    assert_eq!(kept.epoch(), 2);
    // Piles for epoch 2 given to a read of epoch 3 are not used: it scatters.
    let e3 = o.clone().with_epochs(3, 1);
    let (roll, out) = keeping(Some(kept));
    let (got, r) = run(&ReadOptions {
        roll: Some(roll),
        ..e3.clone()
    });
    assert!(!r.rolled_in);
    assert!(r.device_bytes >= ds.bytes());
    assert_eq!(got, all(&ds, e3));
    drop(out.lock().unwrap().take().expect("told").expect("rolled"));
    // A read stopped part-way hands nothing on, and says why.
    let (roll, out) = keeping(None);
    let mut s = read_two_pass(
        ds.clone(),
        ReadOptions {
            roll: Some(roll),
            ..o.clone()
        },
        scratch.clone(),
    )
    .unwrap();
    let _ = s.next();
    drop(s);
    let why = out.lock().unwrap().take().expect("told").unwrap_err();
    assert!(why.contains("ended before"), "{why}");
    assert!(
        std::fs::read_dir(&scratch).unwrap().next().is_none(),
        "scratch left behind"
    );
}
