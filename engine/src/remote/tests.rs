use super::*;

#[test]
fn urls_split_into_bucket_literal_prefix_and_glob() {
    let u = S3Url::parse("s3://b/data/shard-*.tar").unwrap();
    assert_eq!((u.bucket.as_str(), u.key.as_str()), ("b", "data/"));
    assert!(u.pattern.as_ref().unwrap().matches("data/shard-001.tar"));
    let u = S3Url::parse("s3://b/one.jsonl").unwrap();
    assert_eq!((u.key.as_str(), u.pattern.is_none()), ("one.jsonl", true));
    let u = S3Url::parse("s3://b").unwrap();
    assert_eq!(u.key, "");
    let u = S3Url::parse("s3://b/*.jsonl").unwrap();
    assert_eq!(u.key, "");
    for bad in ["s3://", "s3:///k", "http://b/k", "s3://b/[x"] {
        let e = S3Url::parse(bad).unwrap_err().to_string();
        assert!(e.contains(bad), "{bad}: {e}");
    }
}

#[test]
fn only_loopback_http_is_allowed_without_asking() {
    for yes in [
        "http://127.0.0.1:9000",
        "http://localhost:1/",
        "http://[::1]:80",
    ] {
        assert!(is_loopback_http(yes), "{yes}");
    }
    for no in [
        "https://127.0.0.1:9000",
        "http://10.0.0.1:9000",
        "http://s3.example.com",
    ] {
        assert!(!is_loopback_http(no), "{no}");
    }
}

#[test]
fn keys_that_would_leave_the_cache_are_refused() {
    for bad in ["../x", "a/../../x", "a//b", "./a", "a/."] {
        let e = fetch::local_rel_for_test(bad).unwrap_err().to_string();
        assert!(e.contains("cannot be staged"), "{bad}: {e}");
    }
    assert_eq!(
        fetch::local_rel_for_test("a/b.tar").unwrap(),
        PathBuf::from("a/b.tar")
    );
}

/// A pseudo-random body of `n` bytes (each range of it differs from the others).
fn body(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn an_object_of_many_ranges_is_staged_whole_and_reused_while_its_etag_holds() {
    use crate::testing::s3::{S3Server, BUCKET};
    let Some(s3) = S3Server::start() else { return };
    let cache = tempfile::tempdir().unwrap();
    // Three ranged GETs and a short last one.
    let n = usize::try_from(2 * fetch::CHUNK + 12345).unwrap();
    let bytes = body(n, 3);
    s3.put("big/a.bin", &bytes);
    let url = format!("s3://{BUCKET}/big/a.bin");
    let staged = stage_in(&url, &s3.config(), cache.path()).unwrap();
    assert_eq!(staged.len(), 1);
    assert!(
        std::fs::read(&staged[0]).unwrap() == bytes,
        "the staged copy differs"
    );
    // Its identity holds: the copy is reused, not fetched again (the same inode).
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(&staged[0]).unwrap().ino();
    let again = stage_in(&url, &s3.config(), cache.path()).unwrap();
    assert_eq!(std::fs::metadata(&again[0]).unwrap().ino(), ino);
    // Named by its prefix (a listing, which s3s-fs gives without ETags), the same.
    let prefix = format!("s3://{BUCKET}/big/");
    let listed = stage_in(&prefix, &s3.config(), cache.path()).unwrap();
    assert_eq!(listed, staged);
    assert_eq!(std::fs::metadata(&listed[0]).unwrap().ino(), ino);
    // Replaced with as many bytes: the ETag differs, so it is fetched again.
    let other = body(n, 4);
    s3.put("big/a.bin", &other);
    for spec in [&url, &prefix] {
        let third = stage_in(spec, &s3.config(), cache.path()).unwrap();
        assert!(
            std::fs::read(&third[0]).unwrap() == other,
            "{spec}: a stale copy was kept"
        );
    }
}

#[test]
fn an_object_replaced_while_it_is_fetched_is_an_error_naming_it_and_the_range() {
    use crate::testing::s3::{S3Server, BUCKET};
    let Some(s3) = S3Server::start() else { return };
    let cache = tempfile::tempdir().unwrap();
    let n = usize::try_from(fetch::CHUNK + 100).unwrap();
    s3.put("r/a.bin", &body(n, 5));
    let url = S3Url::parse(&format!("s3://{BUCKET}/r/a.bin")).unwrap();
    let cfg = s3.config();
    let store = cfg.store(BUCKET).unwrap();
    let rt = runtime().unwrap();
    // Listed, then replaced before its GETs: the GETs see another ETag.
    let listed = rt.block_on(fetch::list(&store, &url)).unwrap();
    s3.put("r/a.bin", &body(n, 6));
    let dest = cache.path().join("a.bin");
    let e = rt
        .block_on(fetch::fetch(&store, &url.text, &listed[0], &dest))
        .unwrap_err()
        .to_string();
    assert!(e.contains(&url.text) && e.contains("replaced"), "{e}");
    assert!(
        e.contains("bytes 0..") || e.contains(&format!("bytes {}..", fetch::CHUNK)),
        "{e}"
    );
    assert!(!dest.exists(), "a copy of mixed objects was committed");
    // Removed after listing: an error naming it, never a copy.
    s3.put("r/b.bin", b"0123");
    let url = S3Url::parse(&format!("s3://{BUCKET}/r/b.bin")).unwrap();
    let listed = rt.block_on(fetch::list(&store, &url)).unwrap();
    s3.remove("r/b.bin");
    let dest = cache.path().join("b.bin");
    let e = rt
        .block_on(fetch::fetch(&store, &url.text, &listed[0], &dest))
        .unwrap_err();
    assert!(e.to_string().contains(&url.text), "{e}");
    assert!(!dest.exists());
}
