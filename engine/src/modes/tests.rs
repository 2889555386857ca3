//! The order contract through the real LIRS pipeline: real files, real io_uring/pread.

use std::path::Path;
use std::sync::Arc;

use super::{read, Batch, Cursor, ReadOptions};
use crate::dataset::{Dataset, OpenOptions};
use crate::gen::{generate, GenFormat, GenSpec};
use crate::io::{BackendChoice, IoConfig};
use crate::order::{Grouping, Tail};

pub(crate) fn make(
    dir: &Path,
    format: GenFormat,
    records: u64,
    size: u64,
    jitter: f64,
) -> Arc<Dataset> {
    let name = match format {
        GenFormat::Fixed => "d.bin",
        GenFormat::Npy => "d.npy",
        GenFormat::Lines => "d.jsonl",
        GenFormat::TfRecord => "d.tfrecord",
        GenFormat::Files => "tree",
        GenFormat::Tar => "d.tar",
        GenFormat::Mds => "mds",
    };
    let path = dir.join(name);
    let spec = spec(format, records, size, jitter, 3);
    let cfg = IoConfig {
        depth: 4,
        slot_size: 1 << 20,
        ..IoConfig::default()
    };
    generate(&path, &spec, &cfg, &mut |_, _| {}).unwrap();
    let opts = OpenOptions {
        format: match format {
            GenFormat::Fixed => Some(crate::format::Format::Fixed { size, header: 0 }),
            GenFormat::Files => Some(crate::format::Format::Files),
            _ => None,
        },
        ..OpenOptions::default()
    };
    Arc::new(Dataset::open(&[path], &opts, &mut |_, _, _| {}).unwrap())
}

/// A generated dataset of unsorted labels (10 classes).
pub(crate) fn spec(format: GenFormat, records: u64, size: u64, jitter: f64, seed: u64) -> GenSpec {
    GenSpec {
        format,
        records,
        record_size: size,
        jitter,
        labels: 10,
        sorted: false,
        seed,
    }
}

/// The ids of one epoch's batches, in delivery order.
pub(crate) fn epoch_ids(batches: &[Batch], epoch: u64) -> Vec<u64> {
    batches
        .iter()
        .filter(|b| b.epoch == epoch)
        .flat_map(|b| b.ids.iter().copied())
        .collect()
}

/// A generated tar sample's `bin` member (the binary record), else the record itself.
fn binary(rec: &[u8]) -> &[u8] {
    if rec.len() >= 512 && &rec[257..262] == b"ustar" {
        let m = crate::format::tar::members(rec).unwrap();
        let bin = m.iter().find(|m| m.suffix == "bin").expect("a bin member");
        return &rec[bin.offset..bin.offset + bin.len];
    }
    rec
}

/// The id a generated record carries in its payload.
fn payload_id(rec: &[u8]) -> u64 {
    let rec = binary(rec);
    if rec.starts_with(b"{\"id\":") {
        let s = std::str::from_utf8(rec).unwrap();
        let digits: String = s["{\"id\":".len()..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        digits.parse().unwrap()
    } else {
        u64::from_le_bytes(rec[..8].try_into().unwrap())
    }
}

fn all(ds: &Arc<Dataset>, opts: ReadOptions) -> Vec<Batch> {
    read(ds.clone(), opts)
        .unwrap()
        .map(|b| b.unwrap())
        .collect()
}

/// Every record's payload carries its id; labelled batches (a files tree) carry, for each
/// record, the label its payload holds (bytes 8..12).
fn check_payloads(batches: &[Batch]) {
    for b in batches {
        assert_eq!(b.offsets.len(), b.ids.len() + 1);
        assert!(b.labels.is_empty() || b.labels.len() == b.ids.len());
        for (i, &id) in b.ids.iter().enumerate() {
            assert_eq!(payload_id(b.record(i)), id, "batch {} record {i}", b.index);
            if let Some(&label) = b.labels.get(i) {
                let want = u32::from_le_bytes(binary(b.record(i))[8..12].try_into().unwrap());
                assert_eq!(label, want, "batch {} record {i}: label", b.index);
            }
        }
    }
}

const FORMATS: [(GenFormat, f64); 7] = [
    (GenFormat::Fixed, 0.0),
    (GenFormat::Npy, 0.0),
    (GenFormat::Lines, 0.6),
    (GenFormat::TfRecord, 0.6),
    (GenFormat::Files, 0.6),
    (GenFormat::Tar, 0.6),
    (GenFormat::Mds, 0.0),
];

#[test]
fn every_epoch_is_an_exact_permutation_for_every_format_and_grouping() {
    let dir = tempfile::tempdir_in(".").unwrap();
    for (i, &(format, jitter)) in FORMATS.iter().enumerate() {
        let sub = dir.path().join(i.to_string());
        std::fs::create_dir(&sub).unwrap();
        let ds = make(&sub, format, 2000, 100, jitter);
        for grouping in [Grouping::Record, Grouping::Page { unit: 4096 }] {
            let mut o = ReadOptions::new(64);
            o.grouping = grouping;
            o.epochs = 2;
            let batches = all(&ds, o);
            check_payloads(&batches);
            assert_eq!(
                batches.iter().all(|b| !b.labels.is_empty()),
                format == GenFormat::Files,
                "{format:?}: labels only (and always) for a files tree"
            );
            for epoch in 0..2 {
                let mut ids = epoch_ids(&batches, epoch);
                let order = ids.clone();
                ids.sort_unstable();
                assert_eq!(
                    ids,
                    (0..2000).collect::<Vec<_>>(),
                    "{format:?} {grouping:?} epoch {epoch}"
                );
                assert_ne!(order, (0..2000).collect::<Vec<_>>(), "not shuffled");
            }
            let e0 = epoch_ids(&batches, 0);
            let e1 = epoch_ids(&batches, 1);
            assert_ne!(e0, e1, "epochs must differ");
        }
    }
}

#[test]
fn ranks_together_cover_the_epoch() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let ds = make(dir.path(), GenFormat::TfRecord, 1001, 60, 0.5);
    for world in [1u64, 3, 8] {
        for tail in [Tail::DropLast, Tail::Pad] {
            for grouping in [Grouping::Record, Grouping::Page { unit: 4096 }] {
                let mut seen = vec![0u32; 1001];
                let mut per_rank = None;
                let mut padded = 0;
                for rank in 0..world {
                    let mut o = ReadOptions::new(20);
                    o.rank = rank;
                    o.world = world;
                    o.tail = tail;
                    o.grouping = grouping;
                    let batches = all(&ds, o);
                    check_payloads(&batches);
                    assert_eq!(
                        *per_rank.get_or_insert(batches.len()),
                        batches.len(),
                        "same batch count"
                    );
                    for b in &batches {
                        assert_eq!(b.ids.len(), 20);
                        padded += b.padding;
                        for &id in &b.ids[..b.ids.len() - b.padding] {
                            seen[id as usize] += 1;
                        }
                    }
                }
                let once = seen.iter().filter(|&&c| c == 1).count();
                assert!(
                    seen.iter().all(|&c| c <= 1),
                    "a record twice ({world} {tail:?})"
                );
                match tail {
                    Tail::DropLast => assert_eq!(once as u64, 1001 / (20 * world) * 20 * world),
                    _ => {
                        assert_eq!(once, 1001, "world {world} pad");
                        assert_eq!(
                            padded as u64,
                            1001u64.div_ceil(20).div_ceil(world) * world * 20 - 1001
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn resuming_from_a_cursor_continues_exactly() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let ds = make(dir.path(), GenFormat::Lines, 3000, 80, 0.5);
    let mut o = ReadOptions::new(50);
    o.epochs = 3;
    o.grouping = Grouping::Page { unit: 4096 };
    let whole = all(&ds, o.clone());
    for stop in [0usize, 1, 59, 60, 61, 150] {
        let head: Vec<Batch> = whole[..stop].to_vec();
        let cursor = head
            .last()
            .map(|b| b.next_cursor())
            .unwrap_or(Cursor { epoch: 0, batch: 0 });
        let mut r = o.clone();
        r.resume = Some(cursor);
        let tail = all(&ds, r);
        let joined: Vec<(u64, u64, Vec<u64>)> = head
            .iter()
            .chain(&tail)
            .map(|b| (b.epoch, b.index, b.ids.clone()))
            .collect();
        let want: Vec<(u64, u64, Vec<u64>)> = whole
            .iter()
            .map(|b| (b.epoch, b.index, b.ids.clone()))
            .collect();
        assert_eq!(joined, want, "stopped after {stop} batches");
    }
}

#[test]
fn the_same_batches_whatever_the_queue_depth_memory_or_backend() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let ds = make(dir.path(), GenFormat::Npy, 5000, 256, 0.0);
    for grouping in [Grouping::Record, Grouping::Page { unit: 4096 }] {
        let mut base = ReadOptions::new(100);
        base.grouping = grouping;
        let reference: Vec<Vec<u64>> = all(&ds, base.clone()).into_iter().map(|b| b.ids).collect();
        // Submitted at each wait (a memory-speed device's choice) and without registered
        // buffers (a registration refused) as well as by default.
        let plain = crate::io::UringFeatures {
            fixed_buffers: false,
            ..Default::default()
        };
        let at_wait = crate::io::SUBMIT_AT_WAIT;
        for (depth, backend, memory, prefetch, submit_batch, uring) in [
            (1, BackendChoice::Uring, None, 1, 1, Default::default()),
            (
                128,
                BackendChoice::Uring,
                Some(8 << 20),
                8,
                1,
                Default::default(),
            ),
            (
                64,
                BackendChoice::Uring,
                None,
                4,
                at_wait,
                Default::default(),
            ),
            (64, BackendChoice::Uring, Some(4 << 20), 2, at_wait, plain),
            (16, BackendChoice::Pread, None, 2, 1, Default::default()),
            (
                64,
                BackendChoice::Pread,
                Some(4 << 20),
                3,
                1,
                Default::default(),
            ),
        ] {
            let mut o = base.clone();
            o.io = IoConfig {
                depth,
                backend,
                submit_batch,
                uring,
                ..IoConfig::default()
            };
            o.memory = memory;
            o.prefetch = prefetch;
            let got: Vec<Vec<u64>> = all(&ds, o).into_iter().map(|b| b.ids).collect();
            assert_eq!(
                got, reference,
                "{grouping:?} depth {depth} {backend:?} {memory:?} batch {submit_batch} {uring:?}"
            );
        }
    }
}

#[test]
fn page_grouping_reads_each_block_once_and_keeps_its_records_together() {
    let dir = tempfile::tempdir_in(".").unwrap();
    // 512-byte records: 8 per 4 KiB block.
    let ds = make(dir.path(), GenFormat::Fixed, 4096, 512, 0.0);
    let mut o = ReadOptions::new(64);
    o.grouping = Grouping::Page { unit: 4096 };
    let stream = read(ds.clone(), o).unwrap();
    let mut batches = Vec::new();
    let mut stream = stream;
    for b in stream.by_ref() {
        batches.push(b.unwrap());
    }
    let report = stream.report();
    check_payloads(&batches);
    assert!((report.records_per_unit - 8.0).abs() < 1e-9);
    assert!(
        (report.units_per_batch - 8.0).abs() < 1e-9,
        "{}",
        report.units_per_batch
    );
    // 512 units of 8 records in batches of 64: units never straddle (64 = 8 x 8).
    assert_eq!(report.read_ops, 512, "one read per block");
    for b in &batches {
        for chunk in b.ids.chunks(8) {
            assert!(
                chunk.windows(2).all(|w| w[1] == w[0] + 1) && chunk[0] % 8 == 0,
                "{chunk:?}"
            );
        }
    }
    assert!(report.table_bytes <= 512 * 4);
}

#[test]
fn a_memory_budget_too_small_is_refused() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let ds = make(dir.path(), GenFormat::Fixed, 1000, 4096, 0.0);
    let mut o = ReadOptions::new(100);
    o.memory = Some(64 << 10);
    let e = read(ds, o).err().expect("refused").to_string();
    assert!(e.contains("too small"), "{e}");
}

/// Two-pass and resident deliver exactly the LIRS batches (ids and bytes) for every
/// format, both groupings, ranks, tails, several epochs, and memory budgets that force many
/// piles and piles too big to load at once.
#[test]
fn two_pass_delivers_the_same_batches_as_lirs() {
    use super::{read_resident, read_two_pass};
    let dir = tempfile::tempdir_in(".").unwrap();
    for (i, &(format, jitter)) in FORMATS.iter().enumerate() {
        let sub = dir.path().join(i.to_string());
        std::fs::create_dir(&sub).unwrap();
        let ds = make(&sub, format, 1500, 100, jitter);
        for grouping in [Grouping::Record, Grouping::Page { unit: 4096 }] {
            for (world, tail, memory) in [
                (1, Tail::Partial, None),
                (3, Tail::Pad, Some(3 << 20)),
                (4, Tail::DropLast, Some(2_300_000)),
            ] {
                for rank in 0..world {
                    let mut o = ReadOptions::new(32);
                    o.grouping = grouping;
                    o.epochs = 2;
                    o.world = world;
                    o.rank = rank;
                    o.tail = tail;
                    let want: Vec<Batch> = all(&ds, o.clone());
                    let resident: Vec<Batch> = read_resident(ds.clone(), o.clone())
                        .unwrap()
                        .map(|b| b.unwrap())
                        .collect();
                    assert!(
                        resident == want,
                        "resident: {format:?} {grouping:?} world {world} rank {rank}"
                    );
                    o.memory = memory;
                    let scratch = sub.join("scratch");
                    let mut stream = read_two_pass(ds.clone(), o, scratch.clone()).unwrap();
                    let got: Vec<Batch> = stream.by_ref().map(|b| b.unwrap()).collect();
                    assert_eq!(
                        got.len(),
                        want.len(),
                        "{format:?} {grouping:?} world {world} rank {rank}"
                    );
                    for (g, w) in got.iter().zip(&want) {
                        assert_eq!(
                            g, w,
                            "{format:?} {grouping:?} world {world} rank {rank} batch {}",
                            w.index
                        );
                    }
                    assert_eq!(stream.report().mode, "two-pass");
                    // The location did not exist: it was made for the piles, and is gone
                    // with them.
                    assert!(!scratch.exists(), "pile files left behind");
                }
            }
        }
    }
}

/// A resident read loads the files once: over three epochs the device moves the files'
/// bytes (rounded to the alignment) in as many reads as over one, and the later epochs
/// read nothing, while every epoch is the LIRS epoch, resumed mid-epoch too.
#[test]
fn a_resident_read_reads_the_device_once_over_its_epochs() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let ds = make(dir.path(), GenFormat::Lines, 3000, 700, 0.5);
    let mut o = ReadOptions::new(64);
    let one = super::read_resident(ds.clone(), o.clone()).unwrap();
    let one_report = {
        let mut one = one;
        assert_eq!(one.by_ref().count(), 3000usize.div_ceil(64));
        one.report()
    };
    o.epochs = 3;
    let mut three = super::read_resident(ds.clone(), o.clone()).unwrap();
    let got: Vec<Batch> = three.by_ref().map(|b| b.unwrap()).collect();
    let r = three.report();
    // Once loaded, batches view the memory: no copy until a consumer reads one whole, and
    // a record read in place is the one the LIRS batch holds.
    let later: Vec<&Batch> = got.iter().filter(|b| b.epoch > 0).collect();
    assert!(!later.is_empty() && later.iter().all(|b| b.payload.is_view()));
    let lirs = all(&ds, o.clone());
    for (b, l) in later.iter().zip(lirs.iter().filter(|b| b.epoch > 0)) {
        assert!((0..b.ids.len()).all(|i| b.record(i) == l.record(i)));
    }
    assert_eq!(got, lirs, "the LIRS batches");
    check_payloads(&got);
    assert_eq!(r.mode, "resident");
    assert_eq!(r.epoch_seconds.len(), 3);
    assert_eq!(
        (r.device_bytes, r.read_ops),
        (one_report.device_bytes, one_report.read_ops),
        "epochs 2 and 3 read nothing from the device"
    );
    assert!(r.device_bytes >= ds.bytes() && r.device_bytes <= ds.bytes() + 4096);
    assert!(r.resident_bytes >= ds.bytes());
    // Resumed in the middle of epoch 1: the rest of it, then epoch 2, as LIRS has them.
    o.resume = Some(Cursor {
        epoch: 1,
        batch: 20,
    });
    let resumed: Vec<Vec<u64>> = super::read_resident(ds.clone(), o.clone())
        .unwrap()
        .map(|b| b.unwrap().ids)
        .collect();
    let want: Vec<Vec<u64>> = all(&ds, o).into_iter().map(|b| b.ids).collect();
    assert_eq!(resumed, want);
}

/// A dataset that nearly fits is partly resident: its first bytes held for every epoch,
/// the rest read from the device, each later epoch reading about the part not held; the
/// batches are LIRS's, lent or not, resumed too.
#[test]
fn a_partly_resident_read_holds_what_fits_and_reads_the_rest() {
    let dir = tempfile::tempdir_in(".").unwrap();
    // 6,000 records of 4 KiB: 23.4 MiB, within a 20 MiB budget after the rest's needs.
    let ds = make(dir.path(), GenFormat::Fixed, 6000, 4096, 0.0);
    let mut o = ReadOptions::new(64);
    o.memory = Some(20 << 20);
    o.epochs = 3;
    assert!(
        super::resident::needs(
            &ds,
            &super::lirs::units_for(&ds, &o),
            &o,
            &crate::resources::Limits::here(None)
        )
        .is_err(),
        "not whole"
    );
    let mut s = super::read_resident(ds.clone(), o.clone()).unwrap();
    let got: Vec<Batch> = s.by_ref().map(|b| b.unwrap()).collect();
    let r = s.report();
    assert_eq!(r.mode, "resident (partly)");
    assert_eq!(got, all(&ds, o.clone()), "the LIRS batches");
    check_payloads(&got);
    let held = r.resident_bytes.min(ds.bytes());
    assert!(held > 0 && held < ds.bytes(), "{held} of {}", ds.bytes());
    // The load reads the held part once; each epoch reads what is not held (whole 4 KiB
    // records, so exactly that), never the held part again.
    let rest = ds.bytes() - held;
    assert!(
        r.device_bytes <= held + 3 * rest + (64 << 20),
        "{} read",
        r.device_bytes
    );
    assert!(
        r.device_bytes >= held + 3 * rest - 3 * 4096,
        "{} read",
        r.device_bytes
    );
    // Resumed in epoch 1, lent to a lender: the same batches.
    o.resume = Some(Cursor { epoch: 1, batch: 7 });
    o.lender = Some(super::PayloadLender(Arc::new(
        super::payload::boxes::Boxes {
            room: 1 << 20,
            shrunk: Default::default(),
        },
    )));
    let resumed: Vec<Batch> = super::read_resident(ds.clone(), o.clone())
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    o.lender = None;
    assert_eq!(resumed, all(&ds, o));
}

/// Issue 33 deliverable 2: given a scratch, a partly resident read takes the part it does
/// not hold through two-pass piles: the held part and the rest are each read from the
/// device once (the first epoch), later epochs only roll the rest's piles, and the batches
/// are LIRS's: for ranks, page grouping, a resumed read and a lender too.
#[test]
fn a_partly_resident_read_with_a_scratch_rolls_the_rest_through_piles() {
    let dir = tempfile::tempdir_in(".").unwrap();
    // 6,000 records of 4 KiB (23.4 MiB) in a 20 MiB budget: about 17 MiB held.
    let ds = make(dir.path(), GenFormat::Fixed, 6000, 4096, 0.0);
    let scratch = dir.path().join("scratch");
    let read = |o: &ReadOptions| {
        let mut s = super::read_resident_in(ds.clone(), o.clone(), Some(scratch.clone())).unwrap();
        let got: Vec<Batch> = s.by_ref().map(|b| b.unwrap()).collect();
        (got, s.report())
    };
    let mut o = ReadOptions::new(64);
    o.memory = Some(20 << 20);
    o.epochs = 3;
    let (got, r) = read(&o);
    assert_eq!(r.mode, "resident (partly)");
    assert!(
        r.piles > 0 && r.pile_loads >= 3,
        "{} piles, {} loads",
        r.piles,
        r.pile_loads
    );
    assert_eq!(got, all(&ds, o.clone()), "the LIRS batches");
    check_payloads(&got);
    let held = r.resident_bytes.min(ds.bytes());
    assert!(
        held > ds.bytes() / 2 && held < ds.bytes(),
        "{held} of {}",
        ds.bytes()
    );
    // The dataset once: the held part by the load, the rest by the scatter (whole 4 KiB
    // records, read in aligned pieces of at most a few MiB past the held part's end).
    assert!(
        r.device_bytes >= ds.bytes() && r.device_bytes <= ds.bytes() + (4 << 20),
        "{} read of {}",
        r.device_bytes,
        ds.bytes()
    );
    // The piles hold the rest (and a frame head per held record), written in epochs 1
    // and 2 (for epochs 2 and 3).
    let rest = ds.bytes() - held;
    assert!(
        r.scratch_bytes >= 2 * rest && r.scratch_bytes <= 3 * (rest + 6000 * 64),
        "{} of scratch for a rest of {rest}",
        r.scratch_bytes
    );
    assert_eq!(r.epoch_seconds.len(), 3);
    assert!(!scratch.exists() || std::fs::read_dir(&scratch).unwrap().next().is_none());
    // Ranks, page grouping, a resumed read, a lender: the same batches as LIRS's.
    let mut o2 = o.clone();
    o2.world = 2;
    o2.rank = 1;
    o2.tail = Tail::Pad;
    o2.grouping = Grouping::Page { unit: 16384 };
    o2.resume = Some(Cursor { epoch: 1, batch: 5 });
    o2.lender = Some(super::PayloadLender(Arc::new(
        super::payload::boxes::Boxes {
            room: 1 << 20,
            shrunk: Default::default(),
        },
    )));
    let (got, r) = read(&o2);
    assert_eq!(r.mode, "resident (partly)");
    o2.lender = None;
    assert_eq!(got, all(&ds, o2));
}

/// Issue 33 deliverable 3: one copy shared by several reads (other seeds, ranks, a later
/// pass), started together: the device is read once for all of them (the copy's count and
/// the reports' sum), and each read gets exactly its LIRS batches. A read whose consumer
/// stops mid-load gives the load up, and the next read loads the copy again.
#[test]
fn reads_sharing_one_held_copy_read_the_device_once_and_get_their_batches() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let ds = make(dir.path(), GenFormat::Npy, 4000, 900, 0.0);
    let held = Arc::new(super::Held::new(&ds).unwrap());
    let opts: Vec<ReadOptions> = [(1, 0, 1), (2, 0, 2), (2, 1, 2), (9, 0, 1)]
        .into_iter()
        .map(|(seed, rank, world)| {
            let mut o = ReadOptions::new(50);
            o.seed = seed;
            o.rank = rank;
            o.world = world;
            o.epochs = 2;
            o
        })
        .collect();
    let got: Vec<(Vec<Batch>, u64)> = std::thread::scope(|s| {
        let hs: Vec<_> = (opts.iter())
            .map(|o| {
                let (ds, o, held) = (ds.clone(), o.clone(), held.clone());
                s.spawn(move || {
                    let mut st = super::read_held(ds, o, held).unwrap();
                    let b: Vec<Batch> = st.by_ref().map(|b| b.unwrap()).collect();
                    (b, st.report().device_bytes)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((b, _), o) in got.iter().zip(&opts) {
        assert_eq!(b, &all(&ds, o.clone()), "seed {} rank {}", o.seed, o.rank);
    }
    let read: u64 = got.iter().map(|g| g.1).sum();
    assert_eq!(held.counts().loads(), 1);
    assert_eq!(read, held.counts().device_bytes(), "one load, counted once");
    assert!(read >= ds.bytes() && read <= ds.bytes() + 4096, "{read}");
    // A later read finds it loaded: no I/O at all.
    let mut later = super::read_held(ds.clone(), opts[0].clone(), held.clone()).unwrap();
    assert_eq!(later.by_ref().count(), got[0].0.len());
    assert_eq!(later.report().device_bytes, 0);
    assert_eq!((held.counts().loads(), held.counts().readers()), (1, 0));
    // A copy made for other files is refused, not read.
    let od = dir.path().join("o");
    std::fs::create_dir_all(&od).unwrap();
    let other = make(&od, GenFormat::Npy, 10, 900, 0.0);
    let e = super::read_held(other, opts[0].clone(), held.clone())
        .err()
        .expect("refused");
    assert!(e.to_string().contains("is not that of this dataset"), "{e}");
    // A load given up (its consumer gone at once) leaves the copy empty; the next read
    // loads it.
    let fresh = Arc::new(super::Held::new(&ds).unwrap());
    let mut first = super::read_held(ds.clone(), opts[0].clone(), fresh.clone()).unwrap();
    let _ = first.next();
    drop(first);
    assert_ne!(fresh.state(), "loading");
    let again: Vec<Batch> = super::read_held(ds.clone(), opts[1].clone(), fresh.clone())
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    assert_eq!(again, all(&ds, opts[1].clone()));
    assert_eq!(fresh.state(), "loaded");
}

/// A resident read stopped by its consumer stops at its next batch, in memory as while
/// loading: finished after one batch of a read of 1,000 epochs, it has sent a handful.
#[test]
fn a_stopped_resident_read_stops_at_its_next_batch() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let ds = make(dir.path(), GenFormat::Fixed, 4000, 512, 0.0);
    let mut o = ReadOptions::new(16);
    o.epochs = 1000;
    let mut stream = super::read_resident(ds, o.clone()).unwrap();
    assert!(stream.next().unwrap().is_ok());
    let r = stream.finish();
    eprintln!("sent {} of {} batches", r.batches, 1000 * 250);
    assert!(
        r.batches <= 1 + o.prefetch as u64 + 2,
        "{} batches",
        r.batches
    );
    assert!(r.epoch_seconds.len() <= 1, "{:?}", r.epoch_seconds);
}

/// A budget too small to hold the files is refused before anything is read, with the
/// figures; a baseline is not read resident.
#[test]
fn a_resident_read_that_does_not_fit_is_refused_with_its_figures() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let ds = make(dir.path(), GenFormat::Fixed, 2000, 4096, 0.0);
    let mut o = ReadOptions::new(64);
    // Too little even to hold part of it: refused, saying why for whole and for part.
    o.memory = Some(4 << 20);
    let e = super::read_resident(ds.clone(), o.clone())
        .err()
        .expect("refused");
    assert_eq!(e.kind(), crate::ErrorKind::Exhausted);
    let e = e.to_string();
    assert!(
        e.contains("resident mode needs")
            && e.contains("7.8 MiB")
            && e.contains("--memory")
            && e.contains("partly: "),
        "{e}"
    );
    o.memory = None;
    o.baseline = Some(super::Baseline::Sequential);
    assert!(super::read_resident(ds, o).is_err());
}

#[test]
fn two_pass_resumes_like_lirs() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let ds = make(dir.path(), GenFormat::TfRecord, 2000, 60, 0.5);
    let mut o = ReadOptions::new(50);
    o.epochs = 2;
    o.resume = Some(Cursor {
        epoch: 0,
        batch: 33,
    });
    let want: Vec<Vec<u64>> = all(&ds, o.clone()).into_iter().map(|b| b.ids).collect();
    let got: Vec<Vec<u64>> = super::read_two_pass(ds, o, dir.path().join("s"))
        .unwrap()
        .map(|b| b.unwrap().ids)
        .collect();
    assert_eq!(got, want);
}

/// A two-pass read led by LIRS hands over to its pile pass wherever the lead stopped
/// (before its first batch, in the middle, after the last, where its table prefix ran out)
/// and the batches are those of LIRS and of two-pass alone, ids and bytes, under ranks,
/// tails, page grouping and a resume point.
#[test]
fn a_led_two_pass_read_hands_over_exactly() {
    use super::read_two_pass;
    use super::twopass::tests_hold;
    let dir = tempfile::tempdir_in(".").unwrap();
    let ds = make(dir.path(), GenFormat::Lines, 3000, 90, 0.6);
    // Seeds tell the holds apart: tests run in parallel.
    let mut seed = 9_000;
    for grouping in [Grouping::Record, Grouping::Page { unit: 4096 }] {
        for (world, rank, tail, resume) in [
            (1, 0, Tail::Partial, None),
            (3, 2, Tail::Pad, None),
            (2, 1, Tail::DropLast, Some(5)),
        ] {
            // (batches the lead claims at least, units its table may hold)
            for (hold, units) in [
                (0, u64::MAX),
                (1, u64::MAX),
                (6, u64::MAX),
                (1000, u64::MAX),
                (1000, 20),
            ] {
                seed += 1;
                let mut o = ReadOptions::new(23);
                o.seed = seed;
                o.grouping = grouping;
                o.epochs = 2;
                o.world = world;
                o.rank = rank;
                o.tail = tail;
                o.resume = resume.map(|batch| Cursor { epoch: 0, batch });
                let want = all(&ds, o.clone());
                let mut plain = o.clone();
                plain.lead = false;
                let alone: Vec<Batch> = read_two_pass(ds.clone(), plain, dir.path().join("s"))
                    .unwrap()
                    .map(|b| b.unwrap())
                    .collect();
                tests_hold::set(seed, hold, units);
                let mut stream = read_two_pass(ds.clone(), o, dir.path().join("s")).unwrap();
                let got: Vec<Batch> = stream.by_ref().map(|b| b.unwrap()).collect();
                let what = format!(
                    "{grouping:?} world {world} rank {rank} {tail:?} hold {hold} units {units}"
                );
                assert_eq!(got.len(), want.len(), "{what}");
                for ((g, w), a) in got.iter().zip(&want).zip(&alone) {
                    assert_eq!(g, w, "{what}: batch {} against lirs", w.index);
                    assert_eq!(g, a, "{what}: batch {} against two-pass alone", w.index);
                }
                check_payloads(&got);
                let r = stream.report();
                let first_epoch = want.iter().filter(|b| b.epoch == 0).count() as u64;
                if units == u64::MAX {
                    // The lead's table covers about a quarter of the epoch (a few of this
                    // rank's batches at least); it sends its batches up to there at most.
                    assert!(
                        r.lead_batches >= hold.min(2) && r.lead_batches < first_epoch,
                        "{what}: the lead sent {} batches",
                        r.lead_batches
                    );
                } else {
                    // 20 units cover 20 records (under a batch) or about 900 (pages): less than the epoch.
                    assert!(
                        r.lead_batches < first_epoch,
                        "{what}: {} batches",
                        r.lead_batches
                    );
                }
                assert_eq!(r.batches, want.len() as u64, "{what}");
                assert!(r.first_batch_seconds > 0.0, "{what}");
            }
        }
    }
}

/// One read of `stream` under `budget` (`what` names it in a failure): its batches are
/// `want` (LIRS's, unlimited) and its reported memory is within the budget. Returns the
/// report.
fn within_budget(
    mut stream: super::BatchStream,
    want: &[Vec<u64>],
    budget: u64,
    what: &str,
) -> super::ReadReport {
    let got: Vec<Vec<u64>> = stream.by_ref().map(|b| b.unwrap().ids).collect();
    assert_eq!(got, want, "{what}");
    let r = stream.report();
    assert!(
        r.memory_bytes <= budget,
        "{what}: memory {} over the budget {budget}",
        r.memory_bytes
    );
    r
}

/// A dataset far larger than the memory budget: many piles, same batches as LIRS.
#[test]
fn two_pass_with_many_piles_under_a_tight_budget() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let ds = make(dir.path(), GenFormat::Lines, 40_000, 200, 0.5);
    let mut o = ReadOptions::new(100);
    let want: Vec<Vec<u64>> = all(&ds, o.clone()).into_iter().map(|b| b.ids).collect();
    o.memory = Some(3 << 20);
    let stream = super::read_two_pass(ds, o, dir.path().join("s")).unwrap();
    let r = within_budget(stream, &want, 3 << 20, "--memory 3M");
    assert!(r.piles >= 8, "expected many piles, got {}", r.piles);
}

/// Budgets from 32 MiB to 256 MiB scatter with reads of a sixty-fourth of the budget:
/// more than the piles' share of a small budget, so the plan must fit the piles around
/// them. A dataset larger than each budget: the same batches as LIRS, many piles, and the
/// reported memory within the budget.
#[test]
fn two_pass_under_budgets_of_tens_of_mib_stays_within_them() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let ds = make(dir.path(), GenFormat::Fixed, 24_000, 4096, 0.0);
    let mut o = ReadOptions::new(256);
    o.seed = 3;
    let want: Vec<Vec<u64>> = all(&ds, o.clone()).into_iter().map(|b| b.ids).collect();
    for mib in [32u64, 48, 80] {
        o.memory = Some(mib << 20);
        let stream =
            super::read_two_pass(ds.clone(), o.clone(), dir.path().join(format!("s{mib}")))
                .unwrap();
        let r = within_budget(stream, &want, mib << 20, &format!("--memory {mib}M"));
        assert!(r.piles >= 2, "--memory {mib}M: {} piles", r.piles);
    }
}

/// The largest budget a field takes: the piles' memory reported is what the data needs,
/// not the budget, and the report's sum does not wrap.
#[test]
fn two_pass_under_the_largest_budget_reports_what_it_needs() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let ds = make(dir.path(), GenFormat::Fixed, 2_000, 4096, 0.0);
    let mut o = ReadOptions::new(64);
    let want: Vec<Vec<u64>> = all(&ds, o.clone()).into_iter().map(|b| b.ids).collect();
    o.memory = Some(u64::MAX);
    let stream = super::read_two_pass(ds, o, dir.path().join("s")).unwrap();
    let r = within_budget(stream, &want, u64::MAX, "--memory 2^64 - 1");
    // Two loaded piles of every frame, with their index, and the buffers around them.
    assert!(
        r.memory_bytes < 4 * 2_000 * 4096 + (64 << 20),
        "memory {} for 8 MB of records",
        r.memory_bytes
    );
}

/// A baseline under a budget smaller than its default reads in flight (1 MiB slots at the
/// default depth): smaller slots, the same order, memory within the budget (32 MiB was
/// refused before).
#[test]
fn baselines_fit_a_tight_budget_with_smaller_reads() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let ds = make(dir.path(), GenFormat::Fixed, 24_000, 4096, 0.0);
    use super::Baseline;
    for baseline in [Baseline::Sequential, Baseline::Bmf { block: 64 }] {
        let mut o = ReadOptions::new(256);
        o.baseline = Some(baseline);
        let want: Vec<Vec<u64>> = all(&ds, o.clone()).into_iter().map(|b| b.ids).collect();
        o.memory = Some(32 << 20);
        let stream = super::read(ds.clone(), o).unwrap();
        within_budget(stream, &want, 32 << 20, &format!("{baseline:?}"));
    }
}

/// Large batches under a tight budget: two-pass queues fewer batches ahead rather than
/// refusing (the default read-ahead alone would take most of the budget); the same batches
/// as LIRS, memory within the budget.
#[test]
fn two_pass_reads_ahead_less_when_large_batches_crowd_the_budget() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let ds = make(dir.path(), GenFormat::Fixed, 400, 256 << 10, 0.0);
    let mut o = ReadOptions::new(16);
    o.seed = 5;
    let want: Vec<Vec<u64>> = all(&ds, o.clone()).into_iter().map(|b| b.ids).collect();
    // Exactly the default read-ahead: nothing left for the piles unless it is cut.
    let budget = (o.prefetch as u64 + 1) * (16 * (256 << 10));
    o.memory = Some(budget);
    let stream = super::read_two_pass(ds, o.clone(), dir.path().join("s")).unwrap();
    let r = within_budget(stream, &want, budget, "batches of 4 MiB");
    assert!(
        r.prefetch_bytes < (o.prefetch as u64 + 1) * 16 * (256 << 10),
        "read-ahead {} not cut",
        r.prefetch_bytes
    );
}

/// The baselines: exact permutations, deterministic, and the orders they promise.
#[test]
fn baselines_are_deterministic_permutations_of_their_kind() {
    use super::Baseline;
    let dir = tempfile::tempdir_in(".").unwrap();
    let ds = make(dir.path(), GenFormat::Lines, 3000, 60, 0.5);
    for baseline in [
        Baseline::Sequential,
        Baseline::Bmf { block: 100 },
        Baseline::Buffer { size: 200 },
    ] {
        let mut o = ReadOptions::new(64);
        o.baseline = Some(baseline);
        o.epochs = 2;
        let mut stream = read(ds.clone(), o.clone()).unwrap();
        let batches: Vec<Batch> = stream.by_ref().map(|b| b.unwrap()).collect();
        assert_eq!(stream.report().mode, baseline.name());
        check_payloads(&batches);
        let again: Vec<Batch> = all(&ds, o);
        assert_eq!(batches, again, "{baseline:?} is not deterministic");
        for epoch in 0..2 {
            let order = epoch_ids(&batches, epoch);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(
                sorted,
                (0..3000).collect::<Vec<_>>(),
                "{baseline:?} epoch {epoch}"
            );
            match baseline {
                Baseline::Sequential => assert_eq!(order, sorted),
                Baseline::Bmf { block } => {
                    for run in order.chunks(block as usize) {
                        assert!(
                            run.windows(2).all(|w| w[1] == w[0] + 1),
                            "a block was broken up"
                        );
                        assert_eq!(run[0] % block, 0);
                    }
                }
                Baseline::Buffer { size } => {
                    // A record leaves the buffer no earlier than `size` places before its
                    // own id would arrive.
                    for (pos, &id) in order.iter().enumerate() {
                        assert!(id <= pos as u64 + size, "record {id} at {pos}");
                    }
                }
            }
        }
        let e0 = epoch_ids(&batches, 0);
        let e1 = epoch_ids(&batches, 1);
        assert_eq!(
            e0 == e1,
            baseline == Baseline::Sequential,
            "{baseline:?}: epochs"
        );
    }
}

mod roll;
mod share;
mod stop;

/// Issue 17: a global cursor (R records of the epoch consumed by all ranks together) taken
/// under one world and batch size resumes exactly under another, inside a round of the
/// new world's batches too: what the first world's ranks read before it and what the new
/// world's ranks read from it cover the epoch as the new tail rule says (exactly once with
/// a partial tail that divides; drop-last loses less than a new round; pad repeats only
/// its padding), and lirs and two-pass deliver the same batches from the cursor.
#[test]
fn a_global_cursor_resumes_exactly_under_any_world_and_batch_size() {
    use super::read_two_pass;
    let dir = tempfile::tempdir_in(".").unwrap();
    let ds = make(dir.path(), GenFormat::TfRecord, 2000, 60, 0.5);
    let n = 2000u64;
    // (world, batch, batches each rank read) before; (world, batch, tail) after.
    let cases = [
        ((2, 50, 7), (4, 50, Tail::Pad)),
        ((4, 25, 5), (3, 25, Tail::DropLast)),
        ((8, 16, 4), (1, 16, Tail::Partial)),
        ((2, 50, 7), (2, 64, Tail::Pad)),
        ((3, 40, 2), (5, 10, Tail::DropLast)),
        ((2, 50, 6), (4, 50, Tail::Partial)),
    ];
    for ((w1, b1, k), (w2, b2, tail)) in cases {
        let mut seen = vec![0u32; n as usize];
        for r in 0..w1 {
            let mut o = ReadOptions::new(b1);
            (o.world, o.rank, o.tail) = (w1, r, Tail::Pad);
            for b in all(&ds, o).iter().take(k as usize) {
                b.ids.iter().for_each(|&id| seen[id as usize] += 1);
            }
        }
        let at = k * w1 * b1;
        let mut padding = 0u64;
        for r in 0..w2 {
            let mut o = ReadOptions::new(b2);
            (o.world, o.rank, o.tail) = (w2, r, tail);
            o.resume = Some(Cursor { epoch: 0, batch: 0 });
            o.resume_start = Some(at);
            let lirs = all(&ds, o.clone());
            check_payloads(&lirs);
            let scratch = dir.path().join("scratch");
            let two: Vec<Batch> = read_two_pass(ds.clone(), o, scratch)
                .unwrap()
                .map(|b| b.unwrap())
                .collect();
            assert_eq!(
                lirs, two,
                "lirs and two-pass from 0+{at}, world {w2} rank {r}"
            );
            for b in &lirs {
                b.ids.iter().for_each(|&id| seen[id as usize] += 1);
                padding += b.padding as u64;
            }
        }
        let once = seen.iter().filter(|&&c| c == 1).count() as u64;
        let total: u64 = seen.iter().map(|&c| c as u64).sum();
        let round = w2 * b2;
        let case = format!("world {w1} batch {b1} -> world {w2} batch {b2} {tail:?} at 0+{at}");
        match tail {
            Tail::Partial => assert_eq!(once, n, "{case}"),
            Tail::DropLast => {
                assert!(seen.iter().all(|&c| c <= 1), "{case}");
                assert!(n - total < round, "{case}: {} dropped", n - total);
            }
            Tail::Pad => {
                assert!(seen.iter().all(|&c| c >= 1), "{case}");
                assert_eq!(total - n, padding, "{case}: only padding read twice");
            }
        }
        eprintln!(
            "{case}: {once} records once, {} twice (padding), {} not read (dropped tail)",
            seen.iter().filter(|&&c| c == 2).count(),
            seen.iter().filter(|&&c| c == 0).count()
        );
    }
}

/// Issue 17: a mixture of three sources weighted 0.7 / 0.2 / 0.1 over an epoch of 3,000
/// records, the third (100 records) upsampled 3x, the second (2,000) downsampled: each
/// epoch holds exactly 2,100 / 600 / 300 records of them, the third's every record three
/// times, the second's without repeats, a new sample each epoch; lirs and two-pass deliver
/// the same batches; each source's positions in the epoch are uniform (chi-square).
#[test]
fn a_weighted_mixture_has_exact_counts_and_the_same_batches_in_both_modes() {
    use crate::mix::MixSpec;
    let dir = tempfile::tempdir_in(".").unwrap();
    let mut paths = Vec::new();
    for (name, n) in [("web", 1000u64), ("code", 2000), ("books", 100)] {
        let p = dir.path().join(format!("{name}.npy"));
        generate(
            &p,
            &spec(GenFormat::Npy, n, 64, 0.0, 1),
            &IoConfig::default(),
            &mut |_, _| {},
        )
        .unwrap();
        paths.push(p);
    }
    let text = format!(
        "mix:web={}*0.7,code={}*0.2,books={}*0.1;size=3000",
        paths[0].display(),
        paths[1].display(),
        paths[2].display()
    );
    let spec = MixSpec::parse(&text).unwrap().unwrap();
    // The mixture hands each epoch's view to the modes (they know nothing of mixtures).
    let mix = Arc::new(crate::mix::open(&spec, &OpenOptions::default()).unwrap());
    assert_eq!(mix.counts, [2100, 600, 300]);
    let mut o = ReadOptions::new(100);
    o.epochs = 2;
    let lirs: Vec<Batch> = crate::mix::read(mix.clone(), o.clone(), None)
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    let scratch = Some(dir.path().join("scratch"));
    let two: Vec<Batch> = crate::mix::read(mix.clone(), o, scratch)
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    assert_eq!(lirs.len(), two.len());
    for (a, b) in lirs.iter().zip(&two) {
        assert_eq!(
            a, b,
            "lirs and two-pass, batch {} of epoch {}",
            a.index, a.epoch
        );
        assert_eq!(a.sources, b.sources);
    }
    let mut samples = Vec::new();
    for epoch in 0..2 {
        let batches: Vec<&Batch> = lirs.iter().filter(|b| b.epoch == epoch).collect();
        let mut times = vec![0u32; 3100];
        let mut positions: Vec<Vec<u64>> = vec![Vec::new(); 3];
        let mut pos = 0u64;
        for b in &batches {
            for (i, &id) in b.ids.iter().enumerate() {
                let s = b.sources[i] as usize;
                assert_eq!(s, mix.source_of(id));
                // The payload is the source's record (generated ids count from 0 per source).
                assert_eq!(payload_id(b.record(i)), id - mix.starts[s]);
                times[id as usize] += 1;
                positions[s].push(pos);
                pos += 1;
            }
        }
        assert_eq!(pos, 3000);
        assert_eq!(
            positions.iter().map(Vec::len).collect::<Vec<_>>(),
            [2100, 600, 300],
            "epoch {epoch}: exact counts"
        );
        let web = &times[..1000];
        assert!(web.iter().all(|&t| t == 2 || t == 3));
        assert_eq!(web.iter().filter(|&&t| t == 3).count(), 100);
        let code = &times[1000..3000];
        assert!(code.iter().all(|&t| t <= 1), "downsampled without repeats");
        assert!(
            times[3000..].iter().all(|&t| t == 3),
            "upsampled 3x exactly"
        );
        samples.push(code.to_vec());
        // Each source's positions spread evenly over the epoch: chi-square over 10 bins
        // below the 0.1% critical value for 9 degrees of freedom.
        for (s, p) in positions.iter().enumerate() {
            let mut bins = [0f64; 10];
            p.iter()
                .for_each(|&x| bins[(x * 10 / 3000) as usize] += 1.0);
            let want = p.len() as f64 / 10.0;
            let chi2: f64 = bins.iter().map(|b| (b - want).powi(2) / want).sum();
            eprintln!("epoch {epoch} source {s}: chi-square {chi2:.1} over 10 bins");
            assert!(chi2 < 27.88, "epoch {epoch} source {s}: chi-square {chi2}");
        }
    }
    assert_ne!(samples[0], samples[1], "each epoch draws a new sample");
}
