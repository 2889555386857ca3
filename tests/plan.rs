//! `riffle plan` and `riffle read --mode auto`: the planner's choice follows the device
//! profile, and auto runs what the plan says.

use std::path::Path;

use crate::{assert_ok, gen, text, Sandbox};

/// A quick, small probe of the sandbox's device, cached in the sandbox's cache.
pub(crate) fn probe_small(sb: &Sandbox) {
    let o = sb
        .cmd()
        .arg("probe")
        .arg(sb.data())
        .args([
            "--quick",
            "--region",
            "64M",
            "--point-time",
            "0.2",
            "--json",
        ])
        .output()
        .unwrap();
    assert_ok(&o);
}

/// Rewrites the cached quick profile's figures: random reads at `iops` (scaled down for
/// larger blocks as a disk would be), sequential reads and writes at `bps`.
pub(crate) fn fake_profile(sb: &Sandbox, iops: f64, bps: f64) {
    let dir = sb.cache().join("riffle/profiles");
    let path = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with("-quick.json"))
        .expect("a cached quick profile");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["seq_read_bps"] = bps.into();
    v["seq_write_bps"] = bps.into();
    for p in v["random"].as_array_mut().unwrap() {
        let bs = p["bs"].as_f64().unwrap();
        let i = iops.min(bps / bs);
        p["iops"] = i.into();
        p["bytes_per_s"] = (i * bs).into();
    }
    std::fs::write(&path, v.to_string()).unwrap();
}

fn plan_json(sb: &Sandbox, data: &Path, extra: &[&str]) -> serde_json::Value {
    let o = sb
        .cmd()
        .arg("plan")
        .arg(data)
        .args(["--batch-size", "64", "--json"])
        .args(extra)
        .output()
        .unwrap();
    assert_ok(&o);
    serde_json::from_slice(&o.stdout).unwrap()
}

fn candidate<'a>(plan: &'a serde_json::Value, mode: &str) -> &'a serde_json::Value {
    let g = plan["grouping"].as_str().unwrap();
    plan["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["mode"] == mode && c["grouping"] == g)
        .unwrap_or_else(|| panic!("no {mode} candidate in {plan}"))
}

#[test]
fn the_choice_follows_the_device_and_auto_runs_it() {
    let sb = Sandbox::new();
    let data = sb.data().join("mid.jsonl");
    gen(&sb, &data, "lines", 2000, 16_000, &[]);
    probe_small(&sb);

    // A disk: 600 random reads/s. 16 KB records are far cheaper in sequential passes.
    // 24 MiB cannot hold the 32 MB of records resident: the streaming choice is two-pass,
    // and auto runs the partly resident read with the rest through piles, which is
    // predicted faster still (issue 33).
    fake_profile(&sb, 600.0, 150e6);
    let p = plan_json(&sb, &data, &["--epochs", "2", "--memory", "24M"]);
    assert_eq!(p["streaming"], "two-pass", "{}", p["reason"]);
    assert_eq!(p["choice"], "resident", "{}", p["reason"]);
    let (lirs, two) = (candidate(&p, "lirs"), candidate(&p, "two-pass"));
    assert!(lirs["total_s"].as_f64().unwrap() > two["total_s"].as_f64().unwrap());
    assert!(p["reason"].as_str().unwrap().contains("two-pass"));
    assert!(p["page_gain"].is_string(), "{p}");
    // Sentences read as one line: no run of spaces left by a string broken over lines
    // without its continuation (the reason had two of 18).
    for said in [&p["reason"], &p["page_gain"]] {
        let said = said.as_str().unwrap();
        assert!(!said.contains("   "), "a run of spaces: {said:?}");
    }
    let o = sb
        .cmd()
        .arg("read")
        .arg(&data)
        .args([
            "--batch-size",
            "64",
            "--epochs",
            "2",
            "--memory",
            "24M",
            "--json",
        ])
        .output()
        .unwrap();
    assert_ok(&o);
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["mode"], "resident");
    assert_eq!(r["plan"]["choice"], "resident");
    assert_eq!(r["partly"]["rest"], "two-pass piles", "{r}");
    assert_eq!(r["records"], 4000);
    assert!(r["plan"]["predicted_total_s"].as_f64().unwrap() > 0.0);

    // A fast device that gives its bandwidth to random reads: LIRS reads the data once,
    // two-pass reads it twice and writes it once.
    fake_profile(&sb, 5e6, 3e9);
    let p = plan_json(&sb, &data, &["--memory", "24M"]);
    assert_eq!(p["choice"], "lirs", "{}", p["reason"]);
    let o = sb
        .cmd()
        .arg("read")
        .arg(&data)
        .args([
            "--batch-size",
            "64",
            "--mode",
            "auto",
            "--memory",
            "24M",
            "--json",
        ])
        .output()
        .unwrap();
    assert_ok(&o);
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["mode"], "lirs");
}

#[test]
fn a_budget_too_small_for_one_mode_picks_the_other_and_says_why() {
    let sb = Sandbox::new();
    let data = sb.data().join("mid.jsonl");
    gen(&sb, &data, "lines", 2000, 16_000, &[]);
    probe_small(&sb);
    // A fast device: LIRS is preferred when both fit.
    fake_profile(&sb, 5e6, 3e9);
    assert_eq!(
        plan_json(&sb, &data, &["--memory", "24M"])["choice"],
        "lirs"
    );
    // 6,000 KiB holds two-pass's scan buffers, batches and a few small piles (fewer piles
    // when the budget is tight, issue 14) but not LIRS's I/O buffers as well.
    let p = plan_json(&sb, &data, &["--memory", "6000K"]);
    let lirs = candidate(&p, "lirs");
    assert!(lirs["unfit"].is_string(), "{p}");
    assert!(candidate(&p, "two-pass")["unfit"].is_null(), "{p}");
    assert_eq!(p["choice"], "two-pass", "{}", p["reason"]);
    assert!(p["reason"].as_str().unwrap().contains("lirs cannot run"));
    // Neither fits: a clear error, exit 1.
    let o = sb
        .cmd()
        .arg("plan")
        .arg(&data)
        .args(["--batch-size", "64", "--memory", "2M"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("neither mode fits"),
        "{}",
        text(&o.stderr)
    );
}

/// Issue 33: a dataset that fits the memory budget is read resident when that is faster
/// (the default budget, or `--memory` that holds it); the plan and the read's report say
/// what it holds, its first and later epoch times and why it won; a budget that cannot
/// hold it makes auto choose a streaming mode and says why resident lost, and `--mode
/// resident` is refused with the figures.
#[test]
fn a_dataset_that_fits_the_budget_is_read_resident_and_the_plan_says_why() {
    let sb = Sandbox::new();
    let data = sb.data().join("mid.jsonl");
    gen(&sb, &data, "lines", 2000, 16_000, &[]);
    probe_small(&sb);
    fake_profile(&sb, 600.0, 150e6);
    for memory in [&[][..], &["--memory", "100M"][..]] {
        let p = plan_json(&sb, &data, &[&["--epochs", "3"][..], memory].concat());
        assert_eq!(p["choice"], "resident", "{}", p["reason"]);
        let res = candidate(&p, "resident");
        assert!(res["unfit"].is_null(), "{p}");
        assert!(res["memory_bytes"].as_u64().unwrap() >= 32_000_000, "{res}");
        let (first, later) = (
            res["first_epoch_s"].as_f64().unwrap(),
            res["later_epoch_s"].as_f64().unwrap(),
        );
        assert!(first > later, "the first epoch reads the files: {res}");
        let reason = p["reason"].as_str().unwrap();
        assert!(reason.contains("resident is predicted"), "{reason}");
        assert!(reason.contains("two-pass"), "what it beat: {reason}");
    }
    let o = sb
        .cmd()
        .arg("read")
        .arg(&data)
        .args(["--batch-size", "64", "--epochs", "3", "--json"])
        .output()
        .unwrap();
    assert_ok(&o);
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["mode"], "resident", "{}", r["plan"]["reason"]);
    assert_eq!(r["plan"]["choice"], "resident");
    assert_eq!(r["records"], 6000);
    assert!(r["resident_bytes"].as_u64().unwrap() >= 32_000_000, "{r}");
    let file = std::fs::metadata(&data).unwrap().len();
    let device = r["device_bytes"].as_u64().unwrap();
    assert!(
        device >= file && device <= file + 4096,
        "read once: {device} of {file}"
    );
    // 24 MiB cannot hold it whole: the resident candidate is the partly resident read
    // (what 24 MiB holds of it, the rest through two-pass piles in the scratch), which
    // auto picks when it is predicted faster than the streaming modes (issue 33: before,
    // only when no streaming mode fitted), and the reason says what it beat.
    let p = plan_json(&sb, &data, &["--epochs", "3", "--memory", "24M"]);
    assert_eq!(p["choice"], "resident", "{}", p["reason"]);
    let res = candidate(&p, "resident");
    assert!(res["unfit"].is_null(), "{p}");
    assert!(
        res["bound"]
            .as_str()
            .unwrap()
            .starts_with("partly resident, rest by two-pass"),
        "{p}"
    );
    let reason = p["reason"].as_str().unwrap();
    assert!(
        reason.contains("resident is predicted") && reason.contains("for two-pass"),
        "{reason}"
    );
    let two = candidate(&p, "two-pass")["total_s"].as_f64().unwrap();
    assert!(res["total_s"].as_f64().unwrap() < two, "{p}");
    let read = |memory: &str| {
        sb.cmd()
            .arg("read")
            .arg(&data)
            .args([
                "--batch-size",
                "64",
                "--mode",
                "resident",
                "--memory",
                memory,
            ])
            .arg("--json")
            .output()
            .unwrap()
    };
    let o = read("24M");
    assert_ok(&o);
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["mode"], "resident", "{r}");
    let held = r["resident_bytes"].as_u64().unwrap();
    assert!(held > 0 && held < 32_000_000, "partly: {held} held");
    assert_eq!(r["records"], 2000);
    // With room in the scratch, the part not held goes through two-pass piles: the file
    // is read once (the held part by the load, the rest by the scatter), and the plan
    // says so.
    assert!(r["scratch_bytes"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["partly"]["rest"], "two-pass piles", "{r}");
    assert_eq!(r["partly"]["held_bytes"].as_u64(), Some(held), "{r}");
    let device = r["device_bytes"].as_u64().unwrap();
    assert!(
        device >= file && device <= file + (4 << 20),
        "read once: {device} of {file}"
    );
    assert!(
        (res["bound"].as_str().unwrap()).starts_with("partly resident, rest by two-pass"),
        "{p}"
    );
    // Too little to hold even a part: refused, saying why for the whole and the part.
    let o = read("4M");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(
        err.contains("resident mode needs") && err.contains("partly: "),
        "{err}"
    );
}

#[test]
fn first_use_probes_the_device_once_and_caches_it() {
    let sb = Sandbox::new();
    let data = sb.data().join("tiny.jsonl");
    gen(&sb, &data, "lines", 2000, 100, &[]);
    let run = || {
        sb.cmd()
            .arg("plan")
            .arg(&data)
            .args(["--batch-size", "16"])
            .output()
            .unwrap()
    };
    let o = run();
    assert_ok(&o);
    assert!(
        text(&o.stderr).contains("quick probe"),
        "{}",
        text(&o.stderr)
    );
    assert!(text(&o.stdout).contains("auto runs"), "{}", text(&o.stdout));
    let o = run();
    assert_ok(&o);
    assert!(
        !text(&o.stderr).contains("quick probe"),
        "probed twice: {}",
        text(&o.stderr)
    );
}
