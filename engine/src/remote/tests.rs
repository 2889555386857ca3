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
    let listed = rt.block_on(fetch::list(&store, &url, 16)).unwrap();
    s3.put("r/a.bin", &body(n, 6));
    let dest = cache.path().join("a.bin");
    let e = rt
        .block_on(fetch::fetch(&store, &url.text, &listed[0], &dest, 16))
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
    let listed = rt.block_on(fetch::list(&store, &url, 16)).unwrap();
    s3.remove("r/b.bin");
    let dest = cache.path().join("b.bin");
    let e = rt
        .block_on(fetch::fetch(&store, &url.text, &listed[0], &dest, 16))
        .unwrap_err();
    assert!(e.to_string().contains(&url.text), "{e}");
    assert!(!dest.exists());
}

/// `n` JSON lines of about `len` bytes, their text depending on `seed`.
fn jsonl(n: usize, len: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..n {
        let pad = "x".repeat(len.saturating_sub(40) + (i * 7 + seed as usize) % 13);
        out.extend_from_slice(
            format!("{{\"id\": {i}, \"seed\": {seed}, \"p\": \"{pad}\"}}\n").as_bytes(),
        );
    }
    out
}

/// A streamed read over `s3` of `s3://BUCKET/e/` (two objects), world 4 with this reader
/// rank 1, two epochs, one batch read ahead: the stream, once its first batch (so its
/// first scatter) is in.
fn streamed_read(
    s3: &crate::testing::s3::S3Server,
    cache: &Path,
) -> (crate::modes::BatchStream, crate::modes::Batch) {
    use crate::dataset::OpenOptions;
    use crate::modes::ReadOptions;
    let bucket = crate::testing::s3::BUCKET;
    let total = 2 * jsonl(10000, 400, 0).len() as u64;
    let mut cfg = s3.config();
    cfg.retry_timeout = Some(Duration::from_secs(2));
    let opts = OpenOptions {
        cache_limit: Some(total * 3 / 4),
        ..OpenOptions::default()
    };
    let url = PathBuf::from(format!("s3://{bucket}/e/"));
    let ds = open_with(&[url], &opts, &cfg, Some(cache))
        .unwrap()
        .expect("streamed: it does not fit the limit");
    let mut ro =
        ReadOptions::new(8)
            .with_epochs(0, 2)
            .with_rank(1, 4, crate::order::Tail::DropLast);
    ro.prefetch = 1;
    let mut stream = crate::modes::read_two_pass(Arc::new(ds), ro, cache.join("piles")).unwrap();
    let first = stream.next().expect("a first batch").unwrap();
    assert_eq!(first.epoch, 0);
    (stream, first)
}

/// What the rest of `stream` gives: the epochs of its batches, and its error.
fn rest(stream: crate::modes::BatchStream) -> (Vec<u64>, Option<String>) {
    let mut epochs = Vec::new();
    for b in stream {
        match b {
            Ok(b) => epochs.push(b.epoch),
            Err(e) => return (epochs, Some(e.to_string())),
        }
    }
    (epochs, None)
}

#[test]
fn a_streamed_read_names_an_object_replaced_between_epochs_never_reading_its_new_bytes() {
    let Some(s3) = crate::testing::s3::S3Server::start() else {
        return;
    };
    let cache = tempfile::tempdir().unwrap();
    s3.put("e/a.jsonl", &jsonl(10000, 400, 0));
    s3.put("e/b.jsonl", &jsonl(10000, 400, 0));
    let (stream, _) = streamed_read(&s3, cache.path());
    // Epoch 0 is scattered (its first batch is out); epoch 1 is not, and cannot be until
    // this consumer takes epoch 0's batches.
    s3.put("e/b.jsonl", &jsonl(10000, 400, 9));
    let (epochs, err) = rest(stream);
    assert!(
        epochs.iter().all(|&e| e == 0),
        "a batch of epoch 1: {epochs:?}"
    );
    let err = err.expect("the replaced object is an error");
    assert!(
        err.contains("s3://data/e/b.jsonl") && err.contains("bytes ") && err.contains("replaced"),
        "{err}"
    );
}

#[test]
fn a_streamed_read_whose_server_stops_mid_read_ends_with_an_error_naming_the_range() {
    let Some(mut s3) = crate::testing::s3::S3Server::start() else {
        return;
    };
    let cache = tempfile::tempdir().unwrap();
    s3.put("e/a.jsonl", &jsonl(10000, 400, 0));
    s3.put("e/b.jsonl", &jsonl(10000, 400, 1));
    let (stream, _) = streamed_read(&s3, cache.path());
    s3.stop();
    let (epochs, err) = rest(stream);
    assert!(
        epochs.iter().all(|&e| e == 0),
        "a batch of epoch 1: {epochs:?}"
    );
    let err = err.expect("a stopped server is an error, not a hang");
    assert!(
        err.contains("s3://data/e/a.jsonl") && err.contains("bytes 0.."),
        "{err}"
    );
}
