//! The settings users run: budgets of gigabytes over a dataset that fits in them. Every
//! mode reads the 700 MB dataset exactly (each record once, in the contract's order) at
//! `--memory` 1G, 4G and 16G, and `riffle shuffle` gives the same permutation at each
//! (issue 28: two-pass panicked at 4G, where a pile passed 4,096 chunks).

use std::path::Path;

use crate::{assert_ok, gen, Sandbox};

const RECORDS: u64 = 700_000;
const BUDGETS: [&str; 3] = ["1G", "4G", "16G"];

/// The ids `riffle read` delivered, in order, and its `--json` report.
fn read_all(sb: &Sandbox, data: &Path, mode: &str, memory: &str) -> (Vec<u64>, serde_json::Value) {
    let ids = sb.path().join(format!("ids-{mode}-{memory}.txt"));
    let o = sb
        .cmd()
        .arg("read")
        .arg(data)
        .args(["--mode", mode, "--memory", memory, "--batch-size", "256"])
        .args(["--grouping", "page", "--seed", "3", "--json", "--ids-out"])
        .arg(&ids)
        .output()
        .unwrap();
    assert_ok(&o);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let got = std::fs::read_to_string(&ids)
        .unwrap()
        .split_ascii_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    std::fs::remove_file(&ids).unwrap();
    (got, report)
}

#[test]
fn lirs_and_two_pass_read_700_mb_exactly_under_budgets_of_gigabytes() {
    let sb = Sandbox::new();
    let data = sb.data().join("d.npy");
    gen(&sb, &data, "npy", RECORDS, 1024, &[]);
    let mut reference: Option<Vec<u64>> = None;
    for memory in BUDGETS {
        for mode in ["lirs", "two-pass"] {
            let (ids, report) = read_all(&sb, &data, mode, memory);
            assert_eq!(ids.len() as u64, RECORDS, "{mode} at {memory}: {report}");
            let mut sorted = ids.clone();
            sorted.sort_unstable();
            assert!(
                sorted.iter().copied().eq(0..RECORDS),
                "{mode} at {memory}: not every record exactly once"
            );
            match &reference {
                None => reference = Some(ids),
                Some(r) => assert!(
                    *r == ids,
                    "{mode} at {memory}: another order than lirs at 1G"
                ),
            }
            // The run is sized by its resource plan, and says so.
            let plan = &report["resources"];
            assert_eq!(plan["mode"], mode, "{report}");
            assert_eq!(report["memory_bytes"], plan["memory_bytes"], "{report}");
            let budget = memory.trim_end_matches('G').parse::<u64>().unwrap() << 30;
            assert!(
                report["memory_bytes"].as_u64().unwrap() <= budget,
                "{report}"
            );
        }
    }
}

#[test]
fn shuffle_gives_one_permutation_under_budgets_of_gigabytes() {
    let sb = Sandbox::new();
    let input = sb.data().join("in.txt");
    gen(
        &sb,
        &input,
        "lines",
        RECORDS,
        1024,
        &["--size-jitter", "0.5"],
    );
    let mut first: Option<Vec<u8>> = None;
    for memory in BUDGETS {
        let out = sb.data().join(format!("out-{memory}.txt"));
        let o = crate::shuffle::shuffle_to(&sb, &input, &out, &["--seed", "9", "--memory", memory]);
        assert_ok(&o);
        let bytes = std::fs::read(&out).unwrap();
        std::fs::remove_file(&out).unwrap();
        match &first {
            None => {
                let mut a: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
                let input = std::fs::read(&input).unwrap();
                let mut b: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
                a.sort_unstable();
                b.sort_unstable();
                assert!(a == b, "{memory}: not a permutation of the input's lines");
                first = Some(bytes);
            }
            Some(f) => assert!(*f == bytes, "{memory}: another permutation than at 1G"),
        }
    }
}
