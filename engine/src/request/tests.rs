//! The translation of a request: the options it builds, what it refuses, how the mode is
//! resolved, and that a prepared job reads what the engine reads with the same options.

use std::path::Path;

use super::*;
use crate::dataset::OpenOptions;
use crate::format::Format;
use crate::modes::{Baseline, Cursor};
use crate::source::DatasetSpec;

/// A fixed-size-record file of `records` 16-byte records, opened as a source.
fn source(dir: &Path, name: &str, records: u64) -> Source {
    let path = dir.join(name);
    let bytes: Vec<u8> = (0..records * 16).map(|i| (i / 16) as u8).collect();
    std::fs::write(&path, bytes).unwrap();
    open(&path.display().to_string())
}

fn open(spec: &str) -> Source {
    let opts = OpenOptions {
        format: Some(Format::Fixed {
            size: 16,
            header: 0,
        }),
        ..OpenOptions::default()
    };
    DatasetSpec::parse(&[spec])
        .unwrap()
        .open(&opts, &mut |_, _, _| {})
        .unwrap()
}

fn refusal(req: &ReadRequest, src: &Source) -> String {
    match req.prepare(src) {
        Ok(_) => panic!("{req:?} was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_request_becomes_the_options_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path(), "d.bin", 100);
    let req = ReadRequest {
        mode: Mode::Bmf,
        seed: 7,
        first_epoch: 2,
        epochs: 3,
        rank: 1,
        world: 2,
        tail: Tail::DropLast,
        block: 8,
        prefetch: 9,
        memory: Some(1 << 30),
        resume: Some(Resume::Rank {
            epoch: 3,
            batch: 4,
            world: Some(2),
            size: Some(10),
        }),
        ..ReadRequest::new(10)
    };
    let job = req.prepare(&src).unwrap();
    let o = &job.opts;
    assert_eq!(
        (o.seed, o.first_epoch, o.epochs, o.batch, o.rank, o.world),
        (7, 2, 3, 10, 1, 2)
    );
    assert_eq!((o.tail, o.grouping), (Tail::DropLast, Grouping::Record));
    assert_eq!((o.prefetch, o.memory), (9, Some(1 << 30)));
    assert_eq!(o.baseline, Some(Baseline::Bmf { block: 8 }));
    assert_eq!(o.resume, Some(Cursor { epoch: 3, batch: 4 }));
    assert_eq!(o.resume_start, None);
    // 100 records in rounds of 2 x 10: five batches a rank, none dropped.
    assert_eq!((job.split.batches(), job.first_split), (5, job.split));
    assert_eq!(job.scratch, dir.path());
    assert_eq!(job.piles(), None);
}

#[test]
fn a_global_cursor_inside_a_round_cuts_the_rest_of_its_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path(), "d.bin", 100);
    let req = ReadRequest {
        world: 2,
        tail: Tail::Pad,
        resume: Some(Resume::Global {
            epoch: 0,
            records: 30,
        }),
        ..ReadRequest::new(8)
    };
    let job = req.prepare(&src).unwrap();
    assert_eq!(job.opts.resume, Some(Cursor { epoch: 0, batch: 0 }));
    assert_eq!(job.opts.resume_start, Some(30));
    assert_eq!(job.first_split.start, 30);
    assert_eq!(job.split.start, 0);
}

#[test]
fn requests_that_cannot_be_read_are_refused_before_anything_is() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path(), "d.bin", 10);
    let base = ReadRequest::new(4);
    for (req, words) in [
        (
            ReadRequest {
                epochs: 0,
                ..base.clone()
            },
            "--epochs must be at least 1",
        ),
        (
            ReadRequest {
                first_epoch: u64::MAX,
                ..base.clone()
            },
            "run past the last epoch",
        ),
        (ReadRequest::new(0), "batch size"),
        (
            ReadRequest {
                world: 3,
                mode: Mode::Bmf,
                ..base.clone()
            },
            "--drop-last or --pad",
        ),
        (
            ReadRequest {
                resume: Some("5:0".parse().unwrap()),
                ..base.clone()
            },
            "outside the epochs",
        ),
        (
            ReadRequest {
                resume: Some("0:9".parse().unwrap()),
                ..base.clone()
            },
            "past the end of epoch 0",
        ),
    ] {
        let got = refusal(&req, &src);
        assert!(got.contains(words), "{req:?}: {got}");
    }
}

/// Regression (issue 30, D36): `--resume 0+5 --epoch 1` was refused as "resume cursor
/// 0:0 is outside the epochs", the cursor it had been resolved to, not the one given.
#[test]
fn a_cursor_outside_the_epochs_is_named_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path(), "d.bin", 10);
    for (resume, epochs, words) in [
        ("0+5", 1, "--resume 0+5 is in epoch 0, outside the epochs this run reads (--epoch 1 --epochs 1: epoch 1)"),
        ("7:2@1x4", 3, "--resume 7:2@1x4 is in epoch 7, outside the epochs this run reads (--epoch 1 --epochs 3: epochs 1 to 3)"),
    ] {
        let req = ReadRequest {
            first_epoch: 1,
            epochs,
            resume: Some(resume.parse().unwrap()),
            ..ReadRequest::new(4)
        };
        let got = refusal(&req, &src);
        assert!(got.contains(words) && !got.contains("0:0"), "{got}");
    }
}

#[test]
fn a_mixture_is_read_by_the_contract_with_record_grouping() {
    let dir = tempfile::tempdir().unwrap();
    source(dir.path(), "a.bin", 10);
    source(dir.path(), "b.bin", 20);
    let (a, b) = (dir.path().join("a.bin"), dir.path().join("b.bin"));
    let mix = open(&format!("mix:a={}*1,b={}*1", a.display(), b.display()));
    let page = ReadRequest {
        grouping: Grouping::Page { unit: 4096 },
        ..ReadRequest::new(4)
    };
    assert!(refusal(&page, &mix).contains("--grouping record"));
    let buffer = ReadRequest {
        mode: Mode::Buffer,
        ..ReadRequest::new(4)
    };
    assert!(refusal(&buffer, &mix).contains("lirs or two-pass (--mode buffer)"));
    let job = ReadRequest::new(4).prepare(&mix).unwrap();
    assert_eq!(job.first.len(), mix.len());
}

#[test]
fn auto_without_a_device_model_reads_lirs_and_other_modes_stay() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path(), "d.bin", 10);
    let mut job = ReadRequest::new(4).prepare(&src).unwrap();
    job.choose(None).unwrap();
    assert_eq!(
        (job.mode, job.opts.lead, job.plan.is_none()),
        (Mode::Lirs, false, true)
    );
    let two = ReadRequest {
        mode: Mode::TwoPass,
        ..ReadRequest::new(4)
    };
    let mut job = two.prepare(&src).unwrap();
    job.choose(None).unwrap();
    // No model says the device seeks: the lead stays as asked.
    assert_eq!((job.mode, job.opts.lead), (Mode::TwoPass, true));
    assert_eq!(job.piles().as_deref(), Some(dir.path()));
}

#[test]
fn a_prepared_job_reads_what_its_options_read() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path(), "d.bin", 50);
    for mode in [Mode::Lirs, Mode::TwoPass, Mode::Buffer] {
        let req = ReadRequest {
            mode,
            seed: 3,
            epochs: 2,
            buffer: 16,
            ..ReadRequest::new(6)
        };
        let mut job = req.prepare(&src).unwrap();
        job.choose(None).unwrap();
        let ids = |s: BatchStream| -> Vec<Vec<u64>> { s.map(|b| b.unwrap().ids).collect() };
        let got = ids(job.read(&src).unwrap());
        let want = ids(src.read(job.opts.clone(), job.piles()).unwrap());
        assert_eq!(got.len(), 18, "{mode}");
        assert_eq!(got, want, "{mode}");
    }
}

#[test]
fn groupings_parse_from_their_names() {
    assert_eq!(parse_grouping("record", 0), Ok(Grouping::Record));
    assert_eq!(
        parse_grouping("page", 512),
        Ok(Grouping::Page { unit: 512 })
    );
    assert_eq!(
        parse_grouping("page", 0),
        Err("--unit must be positive".into())
    );
    assert_eq!(
        parse_grouping("blocks", 4096),
        Err("unknown grouping 'blocks': expected record or page".into())
    );
}
