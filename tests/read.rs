//! `riffle read` as a user runs it: the ids it writes, its JSON, its errors.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{assert_ok, gen, text, Sandbox};

/// A generated dataset; variable-length formats get sizes spread by half.
fn make(sb: &Sandbox, out: &Path, format: &str, records: u64, size: u64) {
    let variable = format == "lines" || format == "tfrecord";
    gen(
        sb,
        out,
        format,
        records,
        size,
        &["--size-jitter", if variable { "0.5" } else { "0" }],
    );
}

/// Runs `riffle read` with `--ids-out` and returns the batches' ids.
fn read_ids(sb: &Sandbox, data: &Path, args: &[&str], env: &[(&str, &str)]) -> Vec<Vec<u64>> {
    let out = sb.path().join(format!("ids-{}.txt", rand_suffix()));
    let mut c = sb.cmd();
    c.arg("read")
        .arg(data)
        .args(args)
        .arg("--ids-out")
        .arg(&out);
    // auto would probe each sandbox's device first (tests/plan.rs covers it).
    if !args.contains(&"--mode") {
        c.args(["--mode", "lirs"]);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    assert_ok(&o);
    let t = std::fs::read_to_string(&out).unwrap();
    t.lines()
        .map(|l| l.split(' ').map(|x| x.parse().unwrap()).collect())
        .collect()
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[test]
fn ids_out_is_a_permutation_and_depends_only_on_the_seed() {
    let sb = Sandbox::new();
    let data = sb.data().join("d.tfrecord");
    make(&sb, &data, "tfrecord", 3000, 100);
    let a = read_ids(&sb, &data, &["--batch-size", "128"], &[]);
    assert_eq!(a.len(), 3000usize.div_ceil(128));
    assert!(a[..a.len() - 1].iter().all(|b| b.len() == 128));
    let mut all: Vec<u64> = a.concat();
    all.sort_unstable();
    assert_eq!(all, (0..3000).collect::<Vec<_>>());
    let same = read_ids(
        &sb,
        &data,
        &[
            "--batch-size",
            "128",
            "--queue-depth",
            "3",
            "--memory",
            "4M",
        ],
        &[("RIFFLE_IO", "pread")],
    );
    assert_eq!(
        a, same,
        "queue depth, memory and backend must not change the order"
    );
    let other = read_ids(&sb, &data, &["--batch-size", "128", "--seed", "1"], &[]);
    assert_ne!(a, other);
    let two_pass = read_ids(
        &sb,
        &data,
        &["--batch-size", "128", "--mode", "two-pass"],
        &[],
    );
    assert_eq!(a, two_pass, "two-pass must deliver the lirs order");
    let page = read_ids(
        &sb,
        &data,
        &["--batch-size", "128", "--grouping", "page"],
        &[],
    );
    let page_two_pass = read_ids(
        &sb,
        &data,
        &[
            "--batch-size",
            "128",
            "--grouping",
            "page",
            "--mode",
            "two-pass",
        ],
        &[],
    );
    assert_eq!(page, page_two_pass, "and with page grouping");
    let mut p = page.concat();
    p.sort_unstable();
    assert_eq!(p, (0..3000).collect::<Vec<_>>());
}

#[test]
fn resume_continues_where_a_run_stopped() {
    let sb = Sandbox::new();
    let data = sb.data().join("d.npy");
    make(&sb, &data, "npy", 2000, 64);
    let whole = read_ids(&sb, &data, &["--batch-size", "100", "--epochs", "2"], &[]);
    assert_eq!(whole.len(), 40);
    let rest = read_ids(
        &sb,
        &data,
        &["--batch-size", "100", "--epochs", "2", "--resume", "0:15"],
        &[],
    );
    assert_eq!(rest, whole[15..].to_vec());
    let second = read_ids(&sb, &data, &["--batch-size", "100", "--epoch", "1"], &[]);
    assert_eq!(
        second,
        whole[20..].to_vec(),
        "epoch 1 is the same whichever run reads it"
    );
}

#[test]
fn json_reports_what_ran() {
    let sb = Sandbox::new();
    let data = sb.data().join("d.jsonl");
    make(&sb, &data, "lines", 1000, 200);
    let o = sb
        .cmd()
        .arg("read")
        .arg(&data)
        .args([
            "--batch-size",
            "64",
            "--json",
            "--grouping",
            "page",
            "--mode",
            "lirs",
        ])
        .output()
        .unwrap();
    assert_ok(&o);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    for k in [
        "mode",
        "grouping",
        "records",
        "batches",
        "bytes",
        "seconds",
        "records_per_s",
        "bytes_per_s",
        "read_ops",
        "iops",
        "batch_latency_us",
        "memory_bytes",
        "table_bytes",
        "backend",
        "direct",
    ] {
        assert!(!v[k].is_null(), "--json lacks {k}: {v}");
    }
    assert_eq!(v["mode"], "lirs");
    assert_eq!(v["grouping"], "page");
    assert_eq!(v["records"], 1000);
    assert_eq!(v["batches"], 16);
    assert!(
        v["read_ops"].as_u64().unwrap() < 1000,
        "page grouping reads fewer times than records"
    );
    for p in ["p50", "p99", "max"] {
        assert!(v["batch_latency_us"][p].as_f64().unwrap() > 0.0);
    }
    // Hand-off to the consumer loop, beside it (at least 1 us: the histogram's floor).
    let h = &v["handoff_latency_us"];
    assert!(
        h["max"].as_u64().unwrap() >= h["p99"].as_u64().unwrap(),
        "{h}"
    );
    assert!(
        h["p99"].as_u64().unwrap() >= h["p50"].as_u64().unwrap(),
        "{h}"
    );
    assert!(h["p50"].as_u64().unwrap() >= 1, "{h}");
}

#[test]
fn ranks_need_an_explicit_tail_and_split_the_epoch() {
    let sb = Sandbox::new();
    let data = sb.data().join("d.bin");
    make(&sb, &data, "fixed", 1003, 32);
    let o = sb
        .cmd()
        .arg("read")
        .arg(&data)
        .args([
            "--format",
            "fixed:32",
            "--batch-size",
            "10",
            "--world",
            "4",
            "--mode",
            "lirs",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("--drop-last or --pad"),
        "{}",
        text(&o.stderr)
    );
    let mut seen = Vec::new();
    for rank in 0..4 {
        let r = rank.to_string();
        let b = read_ids(
            &sb,
            &data,
            &[
                "--format",
                "fixed:32",
                "--batch-size",
                "10",
                "--world",
                "4",
                "--rank",
                &r,
                "--drop-last",
            ],
            &[],
        );
        assert_eq!(b.len(), 25);
        seen.extend(b.concat());
    }
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 1000);
}

#[test]
fn bad_arguments_are_refused_clearly() {
    let sb = Sandbox::new();
    let data = sb.data().join("d.npy");
    make(&sb, &data, "npy", 10, 16);
    for (args, words) in [
        (
            vec!["--batch-size", "4", "--mode", "bmf", "--world", "3"],
            "--drop-last or --pad",
        ),
        (vec!["--batch-size", "4", "--mode", "magic"], "unknown mode"),
        (vec!["--batch-size", "0"], "batch size"),
        (
            vec!["--batch-size", "4", "--rank", "2", "--world", "2"],
            "rank 2",
        ),
        (
            vec!["--batch-size", "4", "--grouping", "blocks"],
            "unknown grouping",
        ),
        (
            vec!["--batch-size", "4", "--resume", "5:0"],
            "outside the epochs",
        ),
    ] {
        let o = sb
            .cmd()
            .arg("read")
            .arg(&data)
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(
            text(&o.stderr).contains(words),
            "{args:?}: {}",
            text(&o.stderr)
        );
    }
}

/// Two-pass with its piles on a real full disk: a 4 MiB tmpfs mounted for the test, a
/// dataset more than twice that size.
#[test]
fn two_pass_on_a_full_scratch_disk_fails_cleanly() {
    let sb = Sandbox::new();
    let Some(small) = crate::SmallDisk::mount(&sb, "4m") else {
        return;
    };
    let mnt = small.path().to_path_buf();
    let data = sb.data().join("d.jsonl");
    make(&sb, &data, "lines", 100_000, 100);
    let before = std::fs::read(&data).unwrap();
    assert!(
        before.len() > 8 << 20,
        "the dataset must outgrow the scratch disk"
    );
    let o = sb
        .cmd()
        .arg("read")
        .arg(&data)
        .args(["--batch-size", "64", "--mode", "two-pass", "--scratch"])
        .arg(&mnt)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(err.contains("No space left"), "{err}");
    assert!(
        err.contains(&mnt.display().to_string()),
        "the error does not name the scratch path: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&mnt)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "piles left on the full disk: {left:?}");
    assert_eq!(std::fs::read(&data).unwrap(), before, "the dataset changed");

    // A dataset whose piles fit once, read for several epochs under a tight budget (many
    // piles): the next epoch's piles are written while this epoch's are consumed, on the
    // re-scatter thread. Whether the disk overflows depends on the filesystem's rounding;
    // if it does, the failure must be just as clean.
    let small = sb.data().join("e.jsonl");
    make(&sb, &small, "lines", 32_000, 100);
    let before = std::fs::read(&small).unwrap();
    let o = sb
        .cmd()
        .arg("read")
        .arg(&small)
        .args(["--batch-size", "64", "--mode", "two-pass", "--epochs", "3"])
        .args(["--memory", "2M", "--scratch"])
        .arg(&mnt)
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    match o.status.code() {
        Some(0) => eprintln!("rolling epochs fit on the small disk this time"),
        Some(1) => assert!(err.contains("No space left"), "{err}"),
        other => panic!("exit {other:?}: {err}"),
    }
    assert_eq!(
        std::fs::read_dir(&mnt).unwrap().count(),
        0,
        "piles left behind"
    );
    assert_eq!(
        std::fs::read(&small).unwrap(),
        before,
        "the dataset changed"
    );
}

/// Regression (issue 14): a pile write that failed was only recorded, and the scatter read
/// the rest of the dataset before the error surfaced. On a real full disk (a 4 MiB tmpfs)
/// the error now stops the reads at once: what was read stays a small part of a dataset
/// 60 times the disk, and the piles are gone. (The report of the failed read counts it.)
#[test]
fn a_full_scratch_disk_stops_the_scatter_reading_at_once() {
    use riffle::dataset::{Dataset, OpenOptions};
    let sb = Sandbox::new();
    let Some(small) = crate::SmallDisk::mount(&sb, "4m") else {
        return;
    };
    let mnt = small.path().to_path_buf();
    let data = sb.data().join("d.npy");
    make(&sb, &data, "npy", 2_000_000, 128);
    let ds = Dataset::open(&[&data], &OpenOptions::default(), &mut |_, _, _| {}).unwrap();
    let size = ds.size_stats().total;
    let mut s =
        riffle::modes::read_two_pass(ds.into(), riffle::modes::ReadOptions::new(256), mnt.clone())
            .unwrap();
    // The lead's first batches may come first (the scatter starts after the lead's first
    // batch); then the full disk's error.
    let mut led = 0;
    let err = loop {
        match s.next() {
            Some(Ok(_)) if led < 1000 => led += 1,
            Some(Err(e)) => break e.to_string(),
            other => panic!(
                "expected the full disk's error, got {:?} after {led} batches",
                other.map(|b| b.map(|b| b.index))
            ),
        }
    };
    assert!(err.contains("No space left"), "{err}");
    // The report of a failed read counts what it did up to the error.
    let read = s.report().device_bytes;
    assert!(
        read > 0,
        "the report does not count the reads before the error"
    );
    eprintln!("the full disk stopped the scatter after {read} of {size} bytes");
    assert!(
        read < size / 4,
        "the scatter read {read} of {size} bytes before the full disk stopped it"
    );
    assert!(s.next().is_none(), "the stream goes on after its error");
    drop(s);
    assert_eq!(
        std::fs::read_dir(&mnt).unwrap().count(),
        0,
        "piles left behind"
    );
}

/// `--mode buffer` through the CLI: an exact permutation, not file order, deterministic,
/// ranks that split it, resume, and a report of a sequential read with the buffer counted.
#[test]
fn buffer_mode_streams_a_shuffle_buffer() {
    let sb = Sandbox::new();
    let data = sb.data().join("d.tfrecord");
    make(&sb, &data, "tfrecord", 3000, 100);
    let args = ["--batch-size", "100", "--mode", "buffer", "--buffer", "500"];
    let a = read_ids(&sb, &data, &args, &[]);
    assert_eq!(a.len(), 30);
    let order = a.concat();
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..3000).collect::<Vec<_>>());
    assert_ne!(order, sorted, "not shuffled");
    assert_eq!(a, read_ids(&sb, &data, &args, &[("RIFFLE_IO", "pread")]));
    let rest = read_ids(
        &sb,
        &data,
        &[&args[..], &["--resume", "0:12"]].concat(),
        &[],
    );
    assert_eq!(rest, a[12..].to_vec());
    let mut ranks = Vec::new();
    for rank in ["0", "1"] {
        let r = read_ids(
            &sb,
            &data,
            &[&args[..], &["--world", "2", "--rank", rank, "--drop-last"]].concat(),
            &[],
        );
        assert_eq!(r.len(), 15);
        ranks.push(r);
    }
    let dealt: Vec<Vec<u64>> = (0..30).map(|g| ranks[g % 2][g / 2].clone()).collect();
    assert_eq!(dealt, a, "ranks are dealt the single-rank batches in turn");

    let o = sb
        .cmd()
        .arg("read")
        .arg(&data)
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    assert_ok(&o);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["mode"], "buffer");
    assert_eq!(v["records"], 3000);
    assert!(v["read_ops"].as_u64().unwrap() <= 2, "{v}");
    assert!(v["memory_bytes"].as_u64().unwrap() >= 500 * 50, "{v}");
    let o = sb
        .cmd()
        .arg("read")
        .arg(&data)
        .args([
            "--batch-size",
            "100",
            "--mode",
            "buffer",
            "--buffer",
            "3000",
        ])
        .args(["--memory", "200K"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("too small for a shuffle buffer"),
        "{}",
        text(&o.stderr)
    );
}

/// `riffle read` expected to fail: exit 1, no panic, and each of `words` in its stderr.
fn read_refused(sb: &Sandbox, data: &Path, args: &[&str], words: &[&str]) -> String {
    let o = sb
        .cmd()
        .arg("read")
        .arg(data)
        .args(args)
        .args(["--mode", "lirs"])
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{args:?}: stdout {}\n{err}",
        text(&o.stdout)
    );
    assert!(!err.contains("panicked"), "{err}");
    for w in words {
        assert!(err.contains(w), "{args:?}: no '{w}' in:\n{err}");
    }
    err
}

/// `riffle read --json` with `args` (LIRS), parsed.
fn read_json(sb: &Sandbox, data: &Path, args: &[&str]) -> Value {
    let o = sb
        .cmd()
        .arg("read")
        .arg(data)
        .args(args)
        .args(["--mode", "lirs", "--json"])
        .output()
        .unwrap();
    assert_ok(&o);
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Regression (issue 13): `--epoch 18446744073709551615 --epochs 2` wrapped to an empty
/// range, read 0 records and exited 0.
#[test]
fn epoch_ranges_past_the_last_epoch_are_refused() {
    let sb = Sandbox::new();
    let data = sb.data().join("d.npy");
    make(&sb, &data, "npy", 100, 16);
    for (epoch, epochs) in [
        ("18446744073709551615", "2"),
        ("18446744073709551615", "1"),
        ("5", "18446744073709551615"),
    ] {
        read_refused(
            &sb,
            &data,
            &["--batch-size", "10", "--epoch", epoch, "--epochs", epochs],
            &["past the last epoch", epoch],
        );
    }
    let v = read_json(
        &sb,
        &data,
        &["--batch-size", "10", "--epoch", "18446744073709551614"],
    );
    assert_eq!(v["records"], 100, "the last epoch there is still reads");
}

/// Regression (issue 13): a `--resume` cursor past the end of its epoch read 0 records and
/// exited 0. It is refused, naming the epoch's batch count for this rank; the end itself
/// (what the last batch's cursor says) is fine.
#[test]
fn resume_past_the_end_of_the_epoch_is_refused() {
    let sb = Sandbox::new();
    let data = sb.data().join("d.npy");
    make(&sb, &data, "npy", 10_000, 16);
    let w2 = ["--batch-size", "100", "--world", "2", "--rank", "1"];
    for cursor in [
        "0:51",
        "0:18446744073709551615",
        "0+10100",
        "0:51@2",
        "0:51@2x100",
    ] {
        read_refused(
            &sb,
            &data,
            &[&w2[..], &["--resume", cursor]].concat(),
            &["past the end of epoch 0", "50 batches"],
        );
    }
    let v = read_json(
        &sb,
        &data,
        &[&w2[..], &["--resume", "0:50", "--epochs", "2"]].concat(),
    );
    assert_eq!(v["records"], 5000, "0:50 ends epoch 0: epoch 1 follows");
    // The tail rule decides where the epoch ends: 99 of 100 batches kept over 3 ranks with
    // --drop-last (33 each), 102 with --pad (34 each).
    for (tail, past, words) in [
        ("--drop-last", "0:34", "33 batches"),
        ("--drop-last", "0+9901", "0+9900 is its end"),
        ("--pad", "0:35", "34 batches"),
        ("--pad", "0+10500", "0+10000 is its end"),
    ] {
        let args = [
            "--batch-size",
            "100",
            "--world",
            "3",
            tail,
            "--resume",
            past,
        ];
        read_refused(&sb, &data, &args, &["past the end of epoch 0", words]);
    }
}

/// Regression (issue 13): a cursor taken under world 2 and given under world 4 skipped
/// 2,000 of 10,000 records. `--json` prints the cursor with the world it was taken under
/// and its global form; the per-rank form under another world is refused with the global
/// form spelled out, and the global form resumes exactly, at a round's start or inside one:
/// the ranks of both worlds together read the epoch exactly once.
#[test]
fn a_cursor_resumes_exactly_under_another_world_only_in_its_global_form() {
    let sb = Sandbox::new();
    let data = sb.data().join("d.tfrecord");
    make(&sb, &data, "tfrecord", 10_000, 40);
    // Under world 2, every rank consumed 20 batches of 100: records 0..4,000 of the epoch.
    let mut seen = vec![0u32; 10_000];
    for rank in ["0", "1"] {
        let args = ["--batch-size", "100", "--world", "2", "--rank", rank];
        let batches = read_ids(&sb, &data, &args, &[]);
        assert_eq!(batches.len(), 50);
        for id in batches[..20].concat() {
            seen[id as usize] += 1;
        }
        let v = read_json(&sb, &data, &[&args[..], &["--resume", "0:20"]].concat());
        assert_eq!(v["records"], 3000);
        assert_eq!(v["cursor"]["resume"], "0:50@2x100", "{v}");
        assert_eq!(v["cursor"]["resume_global"], "0+10000", "{v}");
    }
    let w4 = |rank: &'static str| ["--batch-size", "100", "--world", "4", "--rank", rank];
    read_refused(
        &sb,
        &data,
        &[&w4("0")[..], &["--resume", "0:20@2x100"]].concat(),
        &[
            "taken under world 2 and batch size 100, at record 4,000 of epoch 0",
            "--resume 0+4000",
        ],
    );
    read_refused(
        &sb,
        &data,
        &[&w4("0")[..], &["--resume", "0:21@2x100"]].concat(),
        &["--resume 0+4200"],
    );
    // A global cursor inside one of world 4's rounds (world 2 read 21 batches a rank):
    // the rest of the epoch is cut into world 4's batches from record 4,200, and both
    // worlds together read every record once.
    let mut seen21 = vec![0u32; 10_000];
    for rank in ["0", "1"] {
        let args = ["--batch-size", "100", "--world", "2", "--rank", rank];
        for id in read_ids(&sb, &data, &args, &[])[..21].concat() {
            seen21[id as usize] += 1;
        }
    }
    // 5,800 records remain: 14.5 rounds of 400, so world 4 needs a tail rule; with --pad
    // the last round is filled from the epoch's start (200 records read twice).
    for rank in ["0", "1", "2", "3"] {
        let args = [&w4(rank)[..], &["--pad", "--resume", "0+4200"]].concat();
        for id in read_ids(&sb, &data, &args, &[]).concat() {
            seen21[id as usize] += 1;
        }
        let v = read_json(&sb, &data, &args);
        assert_eq!(v["cursor"]["resume_global"], "0+10000", "{v}");
        assert_eq!(v["cursor"]["resume"], "0+10000", "{v}");
    }
    assert!(
        seen21.iter().all(|&c| c >= 1),
        "every record at least once from a cursor inside a round"
    );
    assert_eq!(
        seen21.iter().map(|&c| c as u64).sum::<u64>(),
        10_200,
        "only the padding read twice"
    );
    for rank in ["0", "1", "2", "3"] {
        let rest = read_ids(
            &sb,
            &data,
            &[&w4(rank)[..], &["--resume", "0+4000"]].concat(),
            &[],
        );
        assert_eq!(rest.len(), 15, "batches 10..25 of rank {rank}");
        for id in rest.concat() {
            seen[id as usize] += 1;
        }
    }
    assert!(
        seen.iter().all(|&c| c == 1),
        "every record once over both worlds"
    );
    // The same world as the cursor's is taken as it is.
    let v = read_json(
        &sb,
        &data,
        &[&w4("3")[..], &["--resume", "0:20@4x100"]].concat(),
    );
    assert_eq!(
        (v["records"].as_u64(), v["cursor"]["resume"].as_str()),
        (Some(500), Some("0:25@4x100"))
    );
}

/// Regression (issue 30, D6): `--resume 0:30@1` (taken with `--batch-size 100`) given with
/// `--batch-size 200` read 4,000 records (2,000 skipped), with 50 read 8,500 (1,500
/// repeated), rc 0. A cursor now carries its batch size (`E:B@WxS`); one from another
/// batch size, or the old form without one, is refused with the exact global form, which
/// then resumes at the same record.
#[test]
fn a_cursor_from_another_batch_size_is_refused_with_the_global_form() {
    let sb = Sandbox::new();
    let data = sb.data().join("d.npy");
    make(&sb, &data, "npy", 10_000, 16);
    let whole = read_ids(&sb, &data, &["--batch-size", "100"], &[]).concat();
    let v = read_json(&sb, &data, &["--batch-size", "100", "--resume", "0:30"]);
    assert_eq!(v["records"], 7000);
    assert_eq!(
        (
            v["cursor"]["resume"].as_str(),
            v["cursor"]["batch_size"].as_u64()
        ),
        (Some("0:100@1x100"), Some(100)),
        "{v}"
    );
    for size in ["200", "50"] {
        read_refused(
            &sb,
            &data,
            &["--batch-size", size, "--resume", "0:30@1x100"],
            &[
                "taken under world 1 and batch size 100, at record 3,000 of epoch 0",
                "give --resume 0+3000",
            ],
        );
        // Without its batch size, the cursor is read as this run's and both forms given.
        let words = if size == "200" {
            ["0:30@1x200", "give --resume 0+6000"]
        } else {
            ["0:30@1x50", "give --resume 0+1500"]
        };
        let mut w = vec!["does not say the batch size"];
        w.extend(words);
        read_refused(
            &sb,
            &data,
            &["--batch-size", size, "--resume", "0:30@1"],
            &w,
        );
        // The global form resumes exactly at record 3,000 under either batch size.
        let rest = read_ids(
            &sb,
            &data,
            &["--batch-size", size, "--resume", "0+3000"],
            &[],
        );
        assert_eq!(rest.concat(), whole[3000..].to_vec(), "--batch-size {size}");
    }
    // The same shape is taken as it is.
    let v = read_json(
        &sb,
        &data,
        &["--batch-size", "100", "--resume", "0:30@1x100"],
    );
    assert_eq!(v["records"], 7000);
}

/// Regression (issue 30, D19): `--world 3 --pad` printed "any world: --resume 0+10200" (the
/// padded length), which world 1 then refused as past the end. What a run prints as
/// resumable, in `--json` and in the text report, counts records, and another world takes
/// it as printed.
#[test]
fn the_global_cursor_of_a_padded_run_is_taken_as_printed_by_any_world() {
    let sb = Sandbox::new();
    let data = sb.data().join("d.npy");
    make(&sb, &data, "npy", 10_000, 16);
    let w3 = [
        "--batch-size",
        "100",
        "--world",
        "3",
        "--rank",
        "1",
        "--pad",
    ];
    let v = read_json(&sb, &data, &w3);
    assert_eq!(v["cursor"]["resume_global"], "0+10000", "{v}");
    let o = sb
        .cmd()
        .arg("read")
        .arg(&data)
        .args(w3)
        .args(["--mode", "lirs"])
        .output()
        .unwrap();
    assert_ok(&o);
    let out = text(&o.stdout);
    assert!(
        out.contains("--resume 0:34@3x100 (any world or batch size: --resume 0+10000)"),
        "{out}"
    );
    for other in [
        &["--batch-size", "100"][..],
        &["--batch-size", "64", "--world", "2", "--drop-last"],
        &["--batch-size", "100", "--world", "3", "--pad"],
    ] {
        let v = read_json(
            &sb,
            &data,
            &[other, &["--resume", "0+10000", "--epochs", "2"]].concat(),
        );
        assert_eq!(v["cursor"]["epoch"], 1, "{other:?}: {v}");
        assert!(
            v["records"].as_u64().unwrap() > 0,
            "{other:?}: epoch 1 read"
        );
    }
}

/// Regression (issue 30, D36): `--resume 0+5 --epoch 1` was refused as "resume cursor 0:0
/// is outside the epochs", the cursor it resolved to; the message names what was given.
#[test]
fn a_cursor_outside_the_epochs_read_is_named_as_given() {
    let sb = Sandbox::new();
    let data = sb.data().join("d.npy");
    make(&sb, &data, "npy", 100, 16);
    let err = read_refused(
        &sb,
        &data,
        &["--batch-size", "10", "--resume", "0+5", "--epoch", "1"],
        &["--resume 0+5 is in epoch 0, outside the epochs this run reads (--epoch 1 --epochs 1: epoch 1)"],
    );
    assert!(!err.contains("0:0"), "{err}");
}

/// Regression (issue 13): two-pass pile frames stored record lengths as u32, so a record of
/// 4 GiB or more failed after the scatter with "pile ends inside a frame". A sparse file of
/// one 4 GiB + 16 byte record, two epochs (the second re-scattered from the first's
/// piles): about 9 GiB of memory, 4 GiB of scratch and 30 s, so ignored by default
/// (`cargo test -p riffle-tools --test integration -- --ignored over_4_gib`).
#[test]
#[ignore = "heavy: a 4 GiB record needs about 9 GiB of memory, 4 GiB of scratch and 45 s; run with --ignored"]
fn two_pass_reads_a_record_over_4_gib() {
    let sb = Sandbox::new();
    let data = sb.data().join("huge.bin");
    let size = (4u64 << 30) + 16;
    let f = std::fs::File::create(&data).unwrap();
    f.set_len(size).unwrap();
    {
        use std::os::unix::fs::FileExt;
        f.write_all_at(b"first", 0).unwrap();
        f.write_all_at(b"last!", size - 5).unwrap();
    }
    drop(f);
    let o = sb
        .cmd()
        .arg("read")
        .arg(&data)
        .args(["--format", &format!("fixed:{size}"), "--batch-size", "1"])
        .args([
            "--mode", "two-pass", "--memory", "64G", "--epochs", "2", "--json",
        ])
        .output()
        .unwrap();
    assert_ok(&o);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["records"].as_u64(), v["bytes"].as_u64()),
        (Some(2), Some(2 * size)),
        "{v}"
    );
}

/// Regression (issue 14, item 5): two-pass of 100,000 records of 100 B was refused at
/// `--memory 2M` (page grouping) and `1M` (record grouping) although 1.6 MB remained:
/// the plan fell back to 4,096 piles whose writer buffers took it all. It now picks a pile
/// count whose writers leave room for the pile, delivers the lirs order, and a budget that
/// is really too small is refused naming the pile writers' buffers.
#[test]
fn two_pass_under_a_small_budget_takes_fewer_piles_instead_of_refusing() {
    let sb = Sandbox::new();
    let data = sb.data().join("small.npy");
    make(&sb, &data, "npy", 100_000, 100);
    for (grouping, memory) in [("page", "2M"), ("record", "1M")] {
        let base = ["--batch-size", "256", "--grouping", grouping];
        let lirs = read_ids(&sb, &data, &base, &[]);
        let mut args = base.to_vec();
        args.extend(["--mode", "two-pass", "--memory", memory]);
        let two_pass = read_ids(&sb, &data, &args, &[]);
        assert_eq!(lirs, two_pass, "{grouping} at {memory}");
    }
    let o = sb
        .cmd()
        .arg("read")
        .arg(&data)
        .args([
            "--batch-size",
            "256",
            "--mode",
            "two-pass",
            "--memory",
            "300K",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(err.contains("pile writers' buffers take"), "{err}");
    assert!(err.contains("at least"), "{err}");
}

/// Regression (issue 14, item 2): two-pass held a file and a ring open per pile, so
/// `ulimit -n 256` failed with EMFILE. Piles now share a few group files and one ring per
/// pile writer: the run holds few files open and the batches are still the lirs order.
#[test]
fn two_pass_under_ulimit_256_fits_its_piles_and_keeps_the_lirs_order() {
    let sb = Sandbox::new();
    let data = sb.data().join("mid.npy");
    make(&sb, &data, "npy", 400_000, 100);
    let lirs = read_ids(&sb, &data, &["--batch-size", "256"], &[]);
    let ids = sb.path().join("capped-ids.txt");
    let (o, most) = crate::shuffle::under_fd_limit_256(
        &sb,
        &[
            "read".as_ref(),
            data.as_os_str(),
            "--batch-size".as_ref(),
            "256".as_ref(),
            "--mode".as_ref(),
            "two-pass".as_ref(),
            "--memory".as_ref(),
            "2M".as_ref(),
            "--json".as_ref(),
            "--ids-out".as_ref(),
            ids.as_os_str(),
        ],
    );
    assert_ok(&o);
    let piles = serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["piles"]
        .as_u64()
        .unwrap();
    assert!(piles >= 16, "{piles} piles: too few to tell");
    assert!(most <= 48, "{most} files open for {piles} piles");
    let capped: Vec<Vec<u64>> = std::fs::read_to_string(&ids)
        .unwrap()
        .lines()
        .map(|l| l.split(' ').map(|x| x.parse().unwrap()).collect())
        .collect();
    assert_eq!(lirs, capped);
}

/// `n` records of 4 KiB in one file, and the same records each in a file of its own in a
/// directory: (the file, the directory, the records' bytes).
fn one_file_and_a_file_per_record(sb: &Sandbox, n: u64) -> (PathBuf, PathBuf, Vec<u8>) {
    let one = sb.data().join("one.bin");
    gen(sb, &one, "fixed", n, 4096, &[]);
    let bytes = std::fs::read(&one).unwrap();
    let dir = sb.data().join("files");
    std::fs::create_dir(&dir).unwrap();
    for (i, r) in bytes.chunks(4096).enumerate() {
        std::fs::write(dir.join(format!("{i:05}.bin")), r).unwrap();
    }
    (one, dir, bytes)
}

/// Regression (issue 14): io_uring refused more than 1,024 files in one ring ("more than
/// 1024 files in one ring") while pread read them, so the backends disagreed. Files past
/// the registered table now use their plain fds: 1,500 files of one record each read as
/// the same records in one file, in the same order, on both backends.
#[test]
fn more_files_than_the_registered_table_read_like_one_file_on_both_backends() {
    let sb = Sandbox::new();
    let n = 1_500u64;
    let (one, dir, bytes) = one_file_and_a_file_per_record(&sb, n);
    let args = ["--format", "fixed:4K", "--batch-size", "64", "--seed", "3"];
    let want = read_ids(&sb, &one, &args, &[("RIFFLE_IO", "uring")]);
    for io in ["uring", "pread"] {
        let got = read_ids(&sb, &dir, &args, &[("RIFFLE_IO", io)]);
        assert_eq!(got, want, "{io}: another order than one file's");
        let o = sb
            .cmd()
            .arg("cat")
            .arg(&dir)
            .args(["--format", "fixed:4K"])
            .env("RIFFLE_IO", io)
            .output()
            .unwrap();
        assert_ok(&o);
        assert!(o.stdout == bytes, "{io}: other bytes than the one file's");
    }
}

/// Regression: `--prefetch 18446744073709551615` panicked ("bounded channel capacity is
/// too large") after the planner's arithmetic had wrapped. It is a usage error now, and
/// the library refuses it too.
#[test]
fn a_read_ahead_past_the_limit_is_refused_not_a_panic() {
    let sb = Sandbox::new();
    let data = sb.data().join("d.npy");
    make(&sb, &data, "npy", 1000, 16);
    let o = sb
        .cmd()
        .arg("read")
        .arg(&data)
        .args(["--batch-size", "10", "--prefetch", "18446744073709551615"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("at most 65536"),
        "{}",
        text(&o.stderr)
    );
    let ds = riffle::dataset::Dataset::open(
        &[&data],
        &riffle::dataset::OpenOptions::default(),
        &mut |_, _, _| {},
    )
    .unwrap();
    let mut opts = riffle::modes::ReadOptions::new(10);
    opts.prefetch = usize::MAX;
    let e = riffle::modes::read(ds.into(), opts).err().expect("refused");
    assert!(e.to_string().contains("read-ahead"), "{e}");
}

/// Issue 14 item 1: every file of a dataset was opened up front, so a dataset of more
/// files than `ulimit -n` failed with EMFILE (100,000 files passed the hard limit here).
/// Files are now opened when first read, at most a quarter of the soft limit at once: 600
/// files under `ulimit -n 256` read as the same batches as one file with the same records,
/// with far fewer fds open than files.
#[test]
fn more_files_than_the_open_file_limit_read_like_one_file() {
    let sb = Sandbox::new();
    let n = 600u64;
    let (one, dir, _) = one_file_and_a_file_per_record(&sb, n);
    let args = ["--format", "fixed:4K", "--batch-size", "32", "--seed", "5"];
    let want = read_ids(&sb, &one, &args, &[]);
    for mode in ["lirs", "two-pass", "buffer"] {
        let ids = sb.path().join(format!("ids-{mode}.txt"));
        let mut cmd: Vec<&std::ffi::OsStr> = vec!["read".as_ref(), dir.as_os_str()];
        cmd.extend(args.iter().map(std::ffi::OsStr::new));
        cmd.extend([
            "--mode".as_ref(),
            mode.as_ref(),
            "--ids-out".as_ref(),
            ids.as_os_str(),
        ]);
        let (o, most) = crate::shuffle::under_fd_limit_256(&sb, &cmd);
        assert_ok(&o);
        assert!(most < 128, "{mode}: {most} fds open for {n} files");
        if mode == "buffer" {
            continue; // its own order; what matters is that it ran under the limit
        }
        let got: Vec<Vec<u64>> = std::fs::read_to_string(&ids)
            .unwrap()
            .lines()
            .map(|l| l.split(' ').map(|x| x.parse().unwrap()).collect())
            .collect();
        assert_eq!(got, want, "{mode}: another order than one file's");
    }
}

/// Issue 17: a weighted mixture through the CLI: the same batches from lirs and two-pass
/// (ids of the sources side by side), exact counts per source each epoch, and the
/// composition in `--json`.
#[test]
fn a_mixture_reads_the_same_in_both_modes_with_exact_counts() {
    let sb = Sandbox::new();
    let mut paths = Vec::new();
    for (name, n) in [("a", 300u64), ("b", 50)] {
        let p = sb.data().join(format!("{name}.npy"));
        make(&sb, &p, "npy", n, 32);
        paths.push(p);
    }
    let spec = format!(
        "mix:a={}*0.5,b={}*0.5;size=400",
        paths[0].display(),
        paths[1].display()
    );
    let args = ["--batch-size", "40", "--epochs", "2"];
    let lirs = read_ids(
        &sb,
        Path::new(&spec),
        &[&args[..], &["--mode", "lirs"]].concat(),
        &[],
    );
    let two = read_ids(
        &sb,
        Path::new(&spec),
        &[&args[..], &["--mode", "two-pass"]].concat(),
        &[],
    );
    assert_eq!(lirs, two, "lirs and two-pass");
    // No --mode and no --memory: the machine's budget would hold the view resident, which a
    // mixture is not (auto picked it and the read was refused).
    let auto = read_ids(&sb, Path::new(&spec), &args, &[]);
    assert_eq!(lirs, auto, "lirs and auto");
    assert_eq!(lirs.len(), 20);
    for epoch in lirs.chunks(10) {
        let ids: Vec<u64> = epoch.concat();
        assert_eq!(
            ids.iter().filter(|&&i| i < 300).count(),
            200,
            "a: 200 of 300"
        );
        assert_eq!(
            ids.iter().filter(|&&i| i >= 300).count(),
            200,
            "b: 50 records x 4"
        );
        for b in 300..350 {
            assert_eq!(ids.iter().filter(|&&i| i == b).count(), 4);
        }
    }
    let v = read_json(&sb, Path::new(&spec), &args);
    assert_eq!(v["mixture"]["records_per_epoch"], 400, "{v}");
    assert_eq!(v["mixture"]["sources"][1]["per_epoch"], 200, "{v}");
    assert_eq!(v["records"], 800);
}

/// Regression (issue 29 deliverable 2): `--workers N --worker K` reads as DataLoader worker
/// K of the rank, which splits the rank's batches: over one rank, tail partial, worker K
/// gets the batches I with I % N == K of the read without workers, so the workers' batches
/// taken in turn are that read's, every record once, the last batch short. A worker
/// outside --workers is refused.
#[test]
fn workers_of_one_rank_split_its_batches_exactly_once() {
    let sb = Sandbox::new();
    let data = sb.data().join("d.bin");
    make(&sb, &data, "fixed", 1003, 32);
    let base = ["--format", "fixed:32", "--batch-size", "10", "--seed", "4"];
    let alone = read_ids(&sb, &data, &base, &[]);
    assert_eq!(alone.len(), 101);
    let workers: Vec<Vec<Vec<u64>>> = (0..2)
        .map(|k| {
            let k = k.to_string();
            let args = [&base[..], &["--workers", "2", "--worker", &k]].concat();
            read_ids(&sb, &data, &args, &[])
        })
        .collect();
    assert_eq!((workers[0].len(), workers[1].len()), (51, 50));
    let in_turn: Vec<Vec<u64>> = (0..101).map(|i| workers[i % 2][i / 2].clone()).collect();
    assert_eq!(in_turn, alone);
    assert_eq!(in_turn.last().unwrap().len(), 3);
    let mut ids = in_turn.concat();
    ids.sort_unstable();
    assert_eq!(ids, (0..1003).collect::<Vec<u64>>());
    let args = [&base[..], &["--workers", "2", "--worker", "2"]].concat();
    read_refused(&sb, &data, &args, &["--worker 2", "--workers 2"]);
}
