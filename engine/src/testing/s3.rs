//! A real S3-compatible server for tests: s3s-fs (a separate process serving a directory
//! over the S3 API), installed by `scripts/s3-server` when missing, on a free loopback
//! port over a fresh directory, killed and removed when dropped.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::remote::S3Config;

/// The bucket every server starts with.
pub const BUCKET: &str = "data";
const ACCESS_KEY: &str = "riffle";
const SECRET_KEY: &str = "riffle-secret";

/// A running s3s-fs.
#[derive(Debug)]
pub struct S3Server {
    bin: PathBuf,
    child: Child,
    root: tempfile::TempDir,
    port: u16,
    endpoint: String,
}

/// The server's binary, installed first when missing, or why it cannot be.
fn binary() -> std::result::Result<PathBuf, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/s3-server");
    match Command::new(&script).stderr(Stdio::piped()).output() {
        Ok(o) if o.status.success() => Ok(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())),
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr).into_owned();
            let last = err.lines().last().unwrap_or("no output").to_string();
            Err(format!("s3s-fs cannot be installed ({last})"))
        }
        Err(e) => Err(format!("cannot run {}: {e}", script.display())),
    }
}

impl S3Server {
    /// Starts one, or `None` with the skip counted ([`super::skip_needed_in_ci`]) when
    /// s3s-fs cannot be installed here.
    pub fn start() -> Option<S3Server> {
        let bin = match binary() {
            Ok(b) => b,
            Err(why) => {
                super::skip_needed_in_ci(&why);
                return None;
            }
        };
        let root = tempfile::tempdir().expect("a temporary directory for the server");
        std::fs::create_dir(root.path().join(BUCKET)).expect("the bucket's directory");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let child = spawn(&bin, root.path(), port);
        Some(S3Server {
            bin,
            child,
            root,
            port,
            endpoint: format!("http://127.0.0.1:{port}"),
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server (its objects stay), freeing its port.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same port over the same objects.
    pub fn restart(&mut self) {
        self.stop();
        self.child = spawn(&self.bin, self.root.path(), self.port);
    }

    /// Places `bytes` as object `key` of [`BUCKET`]: s3s-fs stores an object as the file
    /// `ROOT/BUCKET/KEY` and gives the MD5 of what it holds as its ETag.
    pub fn put(&self, key: &str, bytes: &[u8]) {
        let p = self.root.path().join(BUCKET).join(key);
        std::fs::create_dir_all(p.parent().expect("a key's directory")).expect("mkdir");
        std::fs::write(&p, bytes).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }

    /// Removes object `key` of [`BUCKET`].
    pub fn remove(&self, key: &str) {
        let p = self.root.path().join(BUCKET).join(key);
        std::fs::remove_file(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }

    /// The endpoint and credentials, named.
    pub fn config(&self) -> S3Config {
        S3Config {
            endpoint: Some(self.endpoint.clone()),
            credentials: Some((ACCESS_KEY.into(), SECRET_KEY.into())),
            session_token: None,
            region: Some("us-east-1".into()),
            retry_timeout: None,
        }
    }

    /// Points `c` (a `riffle` command) at this server the standard AWS way, with no
    /// profile (the profile files named are ones that do not exist, not the user's).
    pub fn env(&self, c: &mut Command) {
        let none = self.root.path().join("no-aws-profile");
        c.env("AWS_ENDPOINT_URL", &self.endpoint)
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_SHARED_CREDENTIALS_FILE", &none)
            .env("AWS_CONFIG_FILE", &none);
        for k in [
            "AWS_SESSION_TOKEN",
            "AWS_PROFILE",
            "AWS_DEFAULT_PROFILE",
            "AWS_ENDPOINT_URL_S3",
        ] {
            c.env_remove(k);
        }
    }

    /// Writes an AWS credentials file and config file into `dir` giving this server's
    /// keys and endpoint as profile `name` (`[default]` when it is `default`); returns
    /// their paths, for `AWS_SHARED_CREDENTIALS_FILE` and `AWS_CONFIG_FILE`.
    pub fn profile_files(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let creds = dir.join("credentials");
        let config = dir.join("config");
        let header = match name {
            "default" => "[default]".to_string(),
            n => format!("[profile {n}]"),
        };
        let write = |p: &Path, text: String| {
            std::fs::write(p, text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        };
        write(
            &creds,
            format!(
                "# riffle's test server\n[{name}]\naws_access_key_id = {ACCESS_KEY}\n\
                 aws_secret_access_key = {SECRET_KEY}\n"
            ),
        );
        write(
            &config,
            format!(
                "{header}\nregion = us-east-1\nservices = here\n\n[services here]\ns3 =\n  \
                 endpoint_url = {}\n",
                self.endpoint
            ),
        );
        (creds, config)
    }
}

/// Starts s3s-fs over `root` on `port` and waits until it listens.
fn spawn(bin: &Path, root: &Path, port: u16) -> Child {
    let mut child = Command::new(bin)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
        .arg(root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    // A deadline only to catch a server that never listens.
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("s3s-fs exited before listening on {port}: {status}");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("s3s-fs never listened on port {port}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
