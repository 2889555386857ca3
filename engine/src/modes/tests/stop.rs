//! A stopped stream stops its I/O promptly: dropped (or finished) by its consumer while
//! the two-pass scatter runs, during a pile pass, after LIRS's first batch, or while a
//! shuffle buffer fills, the engine issues no more reads, reaps those in flight and
//! removes its piles before the drop returns. "Promptly" is judged by what the stream read
//! and wrote before it stopped (far below the dataset, or a whole pile pass), never by a
//! duration, so a slow or loaded machine does not make it flaky; the times are printed.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::make;
use crate::dataset::Dataset;
use crate::gen::GenFormat;
use crate::modes::{read, read_two_pass, Baseline, BatchStream, ReadOptions};

/// Bytes of the pile files under `dir`, at any depth.
fn pile_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => pile_bytes(&e.path()),
            Ok(t) if t.is_file() && e.file_name().to_string_lossy().starts_with("group-") => {
                e.metadata().map_or(0, |m| m.len())
            }
            _ => 0,
        })
        .sum()
}

/// Stops `stream` and returns how long that took, and its report.
fn timed_finish(stream: BatchStream) -> (Duration, crate::modes::ReadReport) {
    let t = Instant::now();
    let report = stream.finish();
    (t.elapsed(), report)
}

fn print_stop(what: &str, took: Duration, full_scatter: Duration) {
    eprintln!("{what}: stopped in {took:?} (a whole scatter: {full_scatter:?})");
}

#[test]
fn a_dropped_stream_stops_its_reads_and_removes_its_piles_at_once() {
    let dir = tempfile::tempdir_in(".").unwrap();
    // Half a gigabyte of small records: a scatter of some seconds in a debug build.
    let ds: Arc<Dataset> = make(dir.path(), GenFormat::Npy, 4_000_000, 128, 0.0);
    let size = ds.size_stats().total;
    let scratch = dir.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let mut opts = ReadOptions::new(256);
    // Two epochs: the pile pass re-scatters into the next epoch's piles on a third
    // thread, which must hear the stop too.
    opts.epochs = 2;
    // Not led: the first batch waits for the whole scatter (the reference), and a stream
    // dropped before it is dropped in the scatter. The led read is stopped below.
    opts.lead = false;

    // The reference: a whole scatter, timed to the first batch (which needs every pile).
    let t = Instant::now();
    let mut s = read_two_pass(ds.clone(), opts.clone(), scratch.clone()).unwrap();
    let first = s.next().unwrap().unwrap();
    let full_scatter = t.elapsed();
    assert_eq!(first.index, 0);
    // Dropped in the pile pass (loader, emitter and re-scatter threads all busy).
    let (took, report) = timed_finish(s);
    print_stop("two-pass, in the pile pass", took, full_scatter);
    // The pass stopped before it re-scattered the dataset into the next epoch's piles: a
    // whole pass would have written two epochs' piles, over twice the dataset with their
    // frames' heads.
    eprintln!(
        "two-pass, in the pile pass: {} bytes of piles for {size} bytes",
        report.scratch_bytes
    );
    assert!(
        report.scratch_bytes < size * 2,
        "the pile pass wrote {} bytes of piles for {size} bytes before it stopped",
        report.scratch_bytes
    );
    assert_eq!(
        std::fs::read_dir(&scratch).unwrap().count(),
        0,
        "piles left behind"
    );

    // Dropped in the scatter, as soon as piles are being written.
    let s = read_two_pass(ds.clone(), opts.clone(), scratch.clone()).unwrap();
    let t = Instant::now();
    while pile_bytes(&scratch) == 0 {
        // A hang guard only.
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "the scatter wrote no pile"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let (took, report) = timed_finish(s);
    print_stop("two-pass, in the scatter", took, full_scatter);
    eprintln!(
        "two-pass, in the scatter: {} of {size} bytes read, {} bytes of piles",
        report.device_bytes, report.scratch_bytes
    );
    assert!(
        report.device_bytes < size / 2,
        "the scatter read {} of {size} bytes before it stopped",
        report.device_bytes
    );
    assert!(
        report.scratch_bytes < size / 2,
        "the scatter wrote {} bytes of piles before it stopped",
        report.scratch_bytes
    );
    assert_eq!(report.batches, 0);
    assert_eq!(
        std::fs::read_dir(&scratch).unwrap().count(),
        0,
        "piles left behind"
    );

    // Led by LIRS: dropped after the lead's first batch, while the scatter runs beside it.
    let mut led = opts.clone();
    led.lead = true;
    let t = Instant::now();
    let mut s = read_two_pass(ds.clone(), led, scratch.clone()).unwrap();
    s.next().unwrap().unwrap();
    let first_led = t.elapsed();
    eprintln!("two-pass led: first batch after {first_led:?} (not led: {full_scatter:?})");
    // The first batch came before the scatter ended: what the stream read, stopped right
    // after it, stays far below the dataset (checked below).
    let (took, report) = timed_finish(s);
    print_stop("two-pass led, in the scatter", took, full_scatter);
    assert!(
        report.device_bytes < size / 2,
        "the led scatter read {} of {size} bytes before it stopped",
        report.device_bytes
    );
    assert_eq!(
        std::fs::read_dir(&scratch).unwrap().count(),
        0,
        "piles left behind"
    );

    // LIRS, dropped after its first batch.
    let mut s = read(ds.clone(), opts.clone()).unwrap();
    s.next().unwrap().unwrap();
    let (took, report) = timed_finish(s);
    print_stop("lirs", took, full_scatter);
    assert!(
        report.device_bytes < size / 10,
        "LIRS read {} of {size} bytes",
        report.device_bytes
    );

    // A shuffle buffer as large as the dataset sends nothing until it is full: dropped
    // while it fills.
    let mut o = opts.clone();
    o.baseline = Some(Baseline::Buffer { size: ds.len() });
    let s = read(ds.clone(), o).unwrap();
    // A moment into its read: the scatter (reads and writes) is no yardstick for a mode
    // that only reads when the disk's writes are slow.
    std::thread::sleep((full_scatter / 10).min(Duration::from_millis(100)));
    let (took, report) = timed_finish(s);
    print_stop("shuffle buffer", took, full_scatter);
    assert!(
        report.device_bytes < size / 2,
        "the buffer read {} of {size} bytes before it stopped",
        report.device_bytes
    );
}
