//! The streaming shuffle buffer against a reference model of its order, on real files.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::super::tests::{epoch_ids, spec};
use super::super::{read, Baseline, Batch, Cursor, ReadOptions};
use crate::dataset::{Dataset, OpenOptions};
use crate::gen::{generate, GenFormat};
use crate::io::IoConfig;
use crate::order::{EpochKey, Tail};

/// The reference model: the order a shuffle buffer of `size` records gives over a
/// sequential read of `n` records, computed over ids alone (this was the buffer
/// baseline's order before it streamed; the streamed order must stay exactly this).
fn shuffle_buffer_order(n: u64, size: u64, key: &EpochKey) -> Vec<u64> {
    use rand::{RngExt, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(key.key(u64::MAX));
    let size = size.clamp(1, n.max(1));
    let mut out = Vec::with_capacity(n as usize);
    let mut buf: Vec<u64> = (0..size.min(n)).collect();
    for id in size..n {
        let j = rng.random_range(0..buf.len());
        out.push(buf[j]);
        buf[j] = id;
    }
    while !buf.is_empty() {
        let j = rng.random_range(0..buf.len());
        out.push(buf.swap_remove(j));
    }
    out
}

fn gen(path: &Path, format: GenFormat, records: u64, size: u64, jitter: f64, seed: u64) {
    let spec = spec(format, records, size, jitter, seed);
    generate(path, &spec, &IoConfig::default(), &mut |_, _| {}).unwrap();
}

fn open(paths: &[&Path], format: Option<crate::format::Format>) -> Arc<Dataset> {
    let opts = OpenOptions {
        format,
        ..OpenOptions::default()
    };
    Arc::new(Dataset::open(paths, &opts, &mut |_, _, _| {}).unwrap())
}

/// Every record's bytes, from a plain file-order read.
fn records_of(ds: &Arc<Dataset>) -> HashMap<u64, Vec<u8>> {
    let mut o = ReadOptions::new(1000);
    o.baseline = Some(Baseline::Sequential);
    let mut out = HashMap::new();
    for b in read(ds.clone(), o).unwrap() {
        let b = b.unwrap();
        for (i, &id) in b.ids.iter().enumerate() {
            out.insert(id, b.record(i).to_vec());
        }
    }
    out
}

fn buffered(ds: &Arc<Dataset>, size: u64, o: &ReadOptions) -> Vec<Batch> {
    let mut o = o.clone();
    o.baseline = Some(Baseline::Buffer { size });
    read(ds.clone(), o).unwrap().map(|b| b.unwrap()).collect()
}

fn check_bytes(batches: &[Batch], records: &HashMap<u64, Vec<u8>>) {
    for b in batches {
        assert_eq!(b.offsets.len(), b.ids.len() + 1);
        for (i, id) in b.ids.iter().enumerate() {
            assert!(b.record(i) == records[id].as_slice(), "record {id}");
        }
    }
}

/// The streamed order is the reference order, for several seeds, epochs and buffer sizes
/// (1, larger than the dataset, ...), over two files of variable-length records read in
/// pieces small enough that records straddle reads, and with each record's own bytes.
#[test]
fn streamed_order_is_the_reference_order() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let (a, b) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
    gen(&a, GenFormat::Lines, 700, 120, 0.6, 1);
    gen(&b, GenFormat::Lines, 523, 300, 0.9, 2);
    let ds = open(&[&a, &b], None);
    let n = ds.len();
    assert_eq!(n, 1223);
    let records = records_of(&ds);
    for seed in [0u64, 7] {
        for size in [1u64, 2, 37, 500, n - 1, n, n + 5, 10 * n] {
            // No budget: 4 MiB reads (one per file); a budget: 48 KiB reads.
            for memory in [None, Some(64 << 20)] {
                let mut o = ReadOptions::new(50);
                o.seed = seed;
                o.first_epoch = 1;
                o.epochs = 3;
                o.memory = memory;
                let batches = buffered(&ds, size, &o);
                check_bytes(&batches, &records);
                for epoch in 1..4 {
                    let want = shuffle_buffer_order(n, size, &EpochKey::new(seed, epoch));
                    assert_eq!(
                        epoch_ids(&batches, epoch),
                        want,
                        "seed {seed} size {size} epoch {epoch} memory {memory:?}"
                    );
                }
            }
        }
    }
}

/// Fixed-size records behind a header (`.npy`), a buffer of one record: file order.
#[test]
fn a_buffer_of_one_record_is_file_order() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let p = dir.path().join("d.npy");
    gen(&p, GenFormat::Npy, 3000, 64, 0.0, 3);
    let ds = open(&[&p], None);
    let records = records_of(&ds);
    let batches = buffered(&ds, 1, &ReadOptions::new(64));
    check_bytes(&batches, &records);
    assert_eq!(epoch_ids(&batches, 0), (0..3000).collect::<Vec<_>>());
}

/// Ranks together deliver the epoch exactly once (padding aside), each rank the batches
/// the full order puts at its positions.
#[test]
fn ranks_split_the_buffer_order() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let p = dir.path().join("d.tfrecord");
    gen(&p, GenFormat::TfRecord, 1001, 80, 0.5, 4);
    let ds = open(&[&p], None);
    let records = records_of(&ds);
    let order = shuffle_buffer_order(1001, 100, &EpochKey::new(0, 0));
    for world in [2u64, 3] {
        for tail in [Tail::DropLast, Tail::Pad] {
            let mut seen = vec![0u32; 1001];
            for rank in 0..world {
                let mut o = ReadOptions::new(20);
                o.rank = rank;
                o.world = world;
                o.tail = tail;
                let batches = buffered(&ds, 100, &o);
                check_bytes(&batches, &records);
                for b in &batches {
                    assert_eq!(b.ids.len(), 20);
                    let g = b.index * world + rank;
                    for (i, &id) in b.ids.iter().enumerate() {
                        let p = (g * 20 + i as u64) as usize;
                        assert_eq!(id, order[p % 1001], "world {world} rank {rank}");
                        if i < b.ids.len() - b.padding {
                            seen[id as usize] += 1;
                        }
                    }
                    assert_eq!(b.padding > 0, (g + 1) * 20 > 1001);
                }
            }
            assert!(seen.iter().all(|&c| c <= 1), "a record twice");
            let once = seen.iter().filter(|&&c| c == 1).count() as u64;
            match tail {
                Tail::DropLast => assert_eq!(once, 1001 / (20 * world) * 20 * world),
                _ => assert_eq!(once, 1001),
            }
        }
    }
}

/// A run resumed from any batch's cursor delivers exactly the rest of the full run.
#[test]
fn resuming_gives_the_tail_of_a_full_run() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let p = dir.path().join("d.jsonl");
    gen(&p, GenFormat::Lines, 2000, 100, 0.5, 5);
    let ds = open(&[&p], None);
    let mut o = ReadOptions::new(64);
    o.epochs = 2;
    let whole = buffered(&ds, 300, &o);
    assert_eq!(whole.len(), 64);
    for stop in [1usize, 17, 31, 32, 33, 63] {
        let mut r = o.clone();
        r.resume = Some(whole[stop - 1].next_cursor());
        let tail = buffered(&ds, 300, &r);
        assert_eq!(tail, whole[stop..].to_vec(), "resumed after {stop} batches");
    }
    let mut r = o.clone();
    r.resume = Some(Cursor { epoch: 1, batch: 0 });
    assert_eq!(buffered(&ds, 300, &r), whole[32..].to_vec());
}

/// The report names the mode, counts the buffer's records and the sequential reads, and
/// `--memory` refuses a buffer that cannot fit and bounds one that can.
#[test]
fn memory_counts_the_buffer_and_is_enforced() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let p = dir.path().join("d.bin");
    gen(&p, GenFormat::Fixed, 20_000, 512, 0.0, 6);
    let ds = open(
        &[&p],
        Some(crate::format::Format::Fixed {
            size: 512,
            header: 0,
        }),
    );
    let report = |size: u64, memory: Option<u64>| {
        let mut o = ReadOptions::new(100);
        o.baseline = Some(Baseline::Buffer { size });
        o.memory = memory;
        let mut s = read(ds.clone(), o).unwrap();
        assert_eq!(
            s.by_ref().map(|b| b.unwrap().ids.len()).sum::<usize>(),
            20_000
        );
        s.report()
    };
    let small = report(100, None);
    let large = report(10_000, None);
    assert_eq!(small.mode, "buffer");
    let grew = large.memory_bytes - small.memory_bytes;
    assert!(
        (9_900 * 512..9_900 * (512 + 64)).contains(&grew),
        "10000 vs 100 records of 512 B: {grew} more bytes"
    );
    assert!(large.buffer_bytes >= 10_000 * 512);
    // One pass of large sequential reads, not a read per record.
    assert!(large.read_ops <= 4, "{} reads for 10 MB", large.read_ops);
    assert_eq!(large.device_bytes, 20_000 * 512);
    let tight = report(10_000, Some(6 << 20));
    assert!(tight.memory_bytes <= 6 << 20, "{}", tight.memory_bytes);
    let mut o = ReadOptions::new(100);
    o.baseline = Some(Baseline::Buffer { size: 10_000 });
    o.memory = Some(4 << 20);
    let e = read(ds.clone(), o).err().expect("refused").to_string();
    assert!(
        e.contains("too small for a shuffle buffer of 10000 records"),
        "{e}"
    );
}

/// Variable-length records under a budget: slots that grew for a long record give the
/// excess back once the slots are over their share, so the peak stays within the budget.
#[test]
fn a_budget_keeps_slots_from_creeping_up_to_the_longest_records() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let p = dir.path().join("d.jsonl");
    gen(&p, GenFormat::Lines, 40_000, 200, 0.9, 7);
    let ds = open(&[&p], None);
    let run = |memory: u64| {
        let mut o = ReadOptions::new(100);
        o.baseline = Some(Baseline::Buffer { size: 4_000 });
        o.epochs = 2;
        o.memory = Some(memory);
        let mut s = read(ds.clone(), o).unwrap();
        s.by_ref().for_each(|b| drop(b.unwrap()));
        s.report()
    };
    // A loose budget: slots keep the capacity of the longest record they have held.
    let loose = run(200 << 20);
    let limit = loose.memory_bytes - loose.memory_bytes / 10;
    let tight = run(limit);
    assert!(
        tight.memory_bytes <= limit,
        "{} over the budget {limit}",
        tight.memory_bytes
    );
}

/// Dropping the stream after one batch stops the reader (no hang, no leak of the thread).
#[test]
fn dropping_the_stream_early_stops_it() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let p = dir.path().join("d.jsonl");
    gen(&p, GenFormat::Lines, 20_000, 100, 0.5, 8);
    let ds = open(&[&p], None);
    let mut o = ReadOptions::new(10);
    o.baseline = Some(Baseline::Buffer { size: 50 });
    o.epochs = 50;
    o.prefetch = 1;
    let mut s = read(ds, o).unwrap();
    assert_eq!(s.next().unwrap().unwrap().index, 0);
    drop(s);
}
