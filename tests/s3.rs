//! `s3://` datasets against a real S3-compatible server (s3s-fs, a separate process serving
//! a directory over the S3 API; `scripts/s3-server` installs it): the same batches as the
//! same files read locally, and a missing or replaced object never a wrong batch.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{assert_ok, gen, skip_needed_in_ci, text, Sandbox};

const BUCKET: &str = "data";

/// An s3s-fs server on a free loopback port over a fresh directory, killed when dropped.
pub(crate) struct S3Server {
    child: Child,
    root: tempfile::TempDir,
    endpoint: String,
}

impl S3Server {
    /// Starts one (installing s3s-fs first when missing), or `None` with the skip counted
    /// when it cannot be installed here.
    pub(crate) fn start() -> Option<S3Server> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/s3-server");
        let bin = match Command::new(&script).stderr(Stdio::piped()).output() {
            Ok(o) if o.status.success() => PathBuf::from(text(&o.stdout).trim()),
            Ok(o) => {
                let why = text(&o.stderr);
                let last = why.lines().last().unwrap_or("no output");
                skip_needed_in_ci(&format!("s3s-fs cannot be installed ({last})"));
                return None;
            }
            Err(e) => {
                skip_needed_in_ci(&format!("cannot run {}: {e}", script.display()));
                return None;
            }
        };
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join(BUCKET)).unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new(&bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", "riffle", "--secret-key", "riffle-secret"])
            .arg(root.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // A deadline only to catch a server that never listens.
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("s3s-fs exited before listening: {status}");
            }
            assert!(Instant::now() < deadline, "s3s-fs never listened on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(S3Server {
            child,
            root,
            endpoint: format!("http://127.0.0.1:{port}"),
        })
    }

    /// Places `bytes` as object `key` of the bucket: s3s-fs stores an object as the file
    /// `ROOT/BUCKET/KEY`, and its ETag is the MD5 of what the file holds.
    pub(crate) fn put(&self, key: &str, bytes: &[u8]) {
        let p = self.root.path().join(BUCKET).join(key);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }

    /// A `riffle` command of `sb` pointed at this server, the standard AWS way, with its
    /// object cache in the sandbox.
    pub(crate) fn cmd(&self, sb: &Sandbox) -> Command {
        let mut c = sb.cmd();
        c.env("AWS_ENDPOINT_URL", &self.endpoint)
            .env("AWS_ACCESS_KEY_ID", "riffle")
            .env("AWS_SECRET_ACCESS_KEY", "riffle-secret")
            .env("AWS_REGION", "us-east-1")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_PROFILE")
            .env("RIFFLE_S3_CACHE", sb.path().join("s3-cache"));
        c
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The batches' ids of `riffle read SPEC ARGS` run by `c`.
fn ids(sb: &Sandbox, mut c: Command, spec: &str, args: &[&str]) -> Vec<String> {
    let out = sb.path().join("ids.txt");
    let o = c
        .arg("read")
        .arg(spec)
        .args(["--batch-size", "16", "--seed", "7"])
        .args(args)
        .arg("--ids-out")
        .arg(&out)
        .output()
        .unwrap();
    assert_ok(&o);
    let t = std::fs::read_to_string(&out).unwrap();
    t.lines().map(str::to_string).collect()
}

/// Generates `n` shards of `format` into `sb`'s data directory and uploads each as
/// `prefix/NAME`; returns the local directory.
fn shards(sb: &Sandbox, s3: &S3Server, format: &str, ext: &str, prefix: &str) -> PathBuf {
    let dir = sb.data().join(prefix);
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..3 {
        let p = dir.join(format!("shard-{i}.{ext}"));
        gen(sb, &p, format, 100 + 37 * i, 64, &["--seed", &i.to_string()]);
        s3.put(&format!("{prefix}/shard-{i}.{ext}"), &std::fs::read(&p).unwrap());
    }
    dir
}

#[test]
fn s3_jsonl_and_tar_shards_read_like_the_same_files_in_lirs_and_two_pass() {
    let Some(s3) = S3Server::start() else { return };
    let sb = Sandbox::new();
    for (format, ext) in [("lines", "jsonl"), ("tar", "tar")] {
        let local = shards(&sb, &s3, format, ext, format);
        for mode in ["lirs", "two-pass"] {
            let want = ids(&sb, sb.cmd(), local.to_str().unwrap(), &["--mode", mode]);
            assert!(want.len() > 10, "{format} {mode}: {want:?}");
            let prefix = format!("s3://{BUCKET}/{format}/");
            let glob = format!("s3://{BUCKET}/{format}/shard-*.{ext}");
            for spec in [&prefix, &glob] {
                let got = ids(&sb, s3.cmd(&sb), spec, &["--mode", mode]);
                assert_eq!(got, want, "{spec} in {mode} differs from {}", local.display());
            }
        }
    }
    // One object alone reads like its file.
    let one = sb.data().join("lines/shard-1.jsonl");
    let want = ids(&sb, sb.cmd(), one.to_str().unwrap(), &["--mode", "lirs"]);
    let got = ids(&sb, s3.cmd(&sb), &format!("s3://{BUCKET}/lines/shard-1.jsonl"), &["--mode", "lirs"]);
    assert_eq!(got, want);
}

#[test]
fn a_missing_object_or_prefix_is_an_error_naming_it() {
    let Some(s3) = S3Server::start() else { return };
    let sb = Sandbox::new();
    s3.put("a/x.jsonl", b"{\"id\": 0}\n");
    for spec in [
        format!("s3://{BUCKET}/a/nope.jsonl"),
        format!("s3://{BUCKET}/nothing/"),
        format!("s3://{BUCKET}/a/*.tar"),
        "s3://no-such-bucket/x.jsonl".to_string(),
    ] {
        let o = s3
            .cmd(&sb)
            .args(["read", &spec, "--batch-size", "1", "--mode", "lirs"])
            .output()
            .unwrap();
        assert!(!o.status.success(), "{spec} read");
        let err = text(&o.stderr);
        assert!(err.contains(&spec), "{spec}: the error does not name it:\n{err}");
        assert!(o.stdout.is_empty(), "{spec}: a batch was printed");
    }
}

#[test]
fn a_replaced_object_is_fetched_again_and_read_as_its_new_bytes() {
    let Some(s3) = S3Server::start() else { return };
    let sb = Sandbox::new();
    let dir = sb.data().join("r");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("x.jsonl");
    let url = format!("s3://{BUCKET}/r/x.jsonl");
    gen(&sb, &file, "lines", 50, 64, &["--seed", "1"]);
    s3.put("r/x.jsonl", &std::fs::read(&file).unwrap());
    let first = ids(&sb, s3.cmd(&sb), &url, &["--mode", "lirs"]);
    assert_eq!(first, ids(&sb, sb.cmd(), file.to_str().unwrap(), &["--mode", "lirs"]));
    // The same name, other records (another count, so a stale index would be wrong).
    gen(&sb, &file, "lines", 80, 64, &["--seed", "2"]);
    s3.put("r/x.jsonl", &std::fs::read(&file).unwrap());
    let second = ids(&sb, s3.cmd(&sb), &url, &["--mode", "lirs"]);
    assert_ne!(second, first, "the replaced object was read from its stale copy");
    assert_eq!(second, ids(&sb, sb.cmd(), file.to_str().unwrap(), &["--mode", "lirs"]));
}
