//! `riffle probe s3://...`: the object store measured as a device (first byte, GETs by size
//! and requests in flight) against a real S3-compatible server, and cached per endpoint.

use riffle::testing::s3::S3Server;

use super::{assert_ok, Sandbox};

fn json(o: &std::process::Output) -> serde_json::Value {
    assert_ok(o);
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn probe_of_an_object_store_measures_its_gets_and_caches_the_profile() {
    let Some(s3) = S3Server::start() else { return };
    let sb = Sandbox::new();
    // The largest object is the one read: 4 MiB of it, so 8 MiB GETs cannot be measured.
    s3.put("probe/small", &[1u8; 1000]);
    s3.put("probe/large", &vec![7u8; 4 << 20]);
    let probe = |extra: &[&str]| {
        let mut c = sb.cmd();
        s3.env(&mut c);
        c.args(["probe", "s3://data/probe/", "--quick", "--json"])
            .args(["--point-time", "0.2"])
            .args(extra)
            .output()
            .unwrap()
    };
    let v = json(&probe(&[]));
    assert_eq!(v["cached"], false);
    assert!(
        v["object"].as_str().unwrap().ends_with("probe/large"),
        "{v}"
    );
    assert_eq!(v["object_bytes"], 4 << 20);
    let first = v["first_byte_s"][0].as_f64().unwrap();
    assert!(first > 0.0 && first < 10.0, "{first}");
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 3, "64 KiB at 1, 16, 64 in flight: {v}");
    for p in points {
        let (size, reqs, bytes) = (
            p["size"].as_u64().unwrap(),
            p["requests"].as_u64().unwrap(),
            p["bytes"].as_u64().unwrap(),
        );
        assert_eq!(size, 64 << 10);
        assert!(
            reqs >= p["in_flight"].as_u64().unwrap(),
            "every GET started is counted: {p}"
        );
        assert_eq!(bytes, reqs * size, "whole ranges came back: {p}");
    }
    assert_eq!(
        v["skipped"].as_array().unwrap().len(),
        3,
        "8 MiB GETs past the object"
    );
    assert!(v["best_bytes_per_s"].as_f64().unwrap() > 0.0);
    // Cached per endpoint: the second call measures nothing.
    let again = json(&probe(&[]));
    assert_eq!(again["cached"], true);
    assert_eq!(again["measured_at"], v["measured_at"]);
    // Nothing to read: a clear error naming the URL, no profile.
    let mut c = sb.cmd();
    s3.env(&mut c);
    let o = c
        .args(["probe", "s3://data/nothing-here/", "--quick", "--refresh"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("s3://data/nothing-here/") && err.contains("no such object"),
        "{err}"
    );
}
