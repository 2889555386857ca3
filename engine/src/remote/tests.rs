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
    for yes in ["http://127.0.0.1:9000", "http://localhost:1/", "http://[::1]:80"] {
        assert!(is_loopback_http(yes), "{yes}");
    }
    for no in ["https://127.0.0.1:9000", "http://10.0.0.1:9000", "http://s3.example.com"] {
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
