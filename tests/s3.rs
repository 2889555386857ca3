//! `s3://` datasets against a real S3-compatible server (s3s-fs, a separate process serving
//! a directory over the S3 API; `scripts/s3-server` installs it): the same batches as the
//! same files read locally, and a missing or replaced object never a wrong batch.

use std::path::{Path, PathBuf};
use std::process::Command;

use riffle::testing::s3::{S3Server, BUCKET};

use super::{assert_ok, gen, text, Sandbox};

/// A server with the object cache of `sb`'s commands in the sandbox.
struct Server(S3Server);

impl Server {
    fn start() -> Option<Server> {
        S3Server::start().map(Server)
    }
    fn put(&self, key: &str, bytes: &[u8]) {
        self.0.put(key, bytes)
    }
    /// A `riffle` command of `sb` pointed at this server, its object cache in the sandbox.
    fn cmd(&self, sb: &Sandbox) -> Command {
        Server::cmd_for(&self.0, sb)
    }
    fn cmd_for(s3: &S3Server, sb: &Sandbox) -> Command {
        let mut c = sb.cmd();
        s3.env(&mut c);
        c.env("RIFFLE_S3_CACHE", sb.path().join("s3-cache"));
        c
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
/// The ids of `spec` (local files) read by lirs with `args`, checked to be more than
/// `least` and the same as two-pass's.
fn local_ids(sb: &Sandbox, spec: &str, args: &[&str], least: usize) -> Vec<String> {
    let lirs = ids(sb, sb.cmd(), spec, &[args, &["--mode", "lirs"]].concat());
    let two_pass = ids(
        sb,
        sb.cmd(),
        spec,
        &[args, &["--mode", "two-pass"]].concat(),
    );
    assert!(
        lirs.len() > least && lirs == two_pass,
        "{spec} {args:?}: lirs and two-pass differ"
    );
    lirs
}

fn shards(sb: &Sandbox, s3: &Server, format: &str, ext: &str, prefix: &str) -> PathBuf {
    let dir = sb.data().join(prefix);
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..3 {
        let p = dir.join(format!("shard-{i}.{ext}"));
        gen(
            sb,
            &p,
            format,
            100 + 37 * i,
            64,
            &["--seed", &i.to_string()],
        );
        s3.put(
            &format!("{prefix}/shard-{i}.{ext}"),
            &std::fs::read(&p).unwrap(),
        );
    }
    dir
}

#[test]
fn s3_jsonl_tar_and_fixed_shards_read_like_the_same_files_in_lirs_and_two_pass() {
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    for (format, ext, extra) in [
        ("lines", "jsonl", &[][..]),
        ("tar", "tar", &[][..]),
        ("fixed", "bin", &["--format", "fixed:64"][..]),
    ] {
        let local = shards(&sb, &s3, format, ext, format);
        for mode in ["lirs", "two-pass"] {
            let args = [&["--mode", mode][..], extra].concat();
            let want = ids(&sb, sb.cmd(), local.to_str().unwrap(), &args);
            assert!(want.len() > 10, "{format} {mode}: {want:?}");
            let prefix = format!("s3://{BUCKET}/{format}/");
            let glob = format!("s3://{BUCKET}/{format}/shard-*.{ext}");
            for spec in [&prefix, &glob] {
                let got = ids(&sb, s3.cmd(&sb), spec, &args);
                assert_eq!(
                    got,
                    want,
                    "{spec} in {mode} differs from {}",
                    local.display()
                );
            }
        }
    }
    // One object alone reads like its file.
    let one = sb.data().join("lines/shard-1.jsonl");
    let want = ids(&sb, sb.cmd(), one.to_str().unwrap(), &["--mode", "lirs"]);
    let got = ids(
        &sb,
        s3.cmd(&sb),
        &format!("s3://{BUCKET}/lines/shard-1.jsonl"),
        &["--mode", "lirs"],
    );
    assert_eq!(got, want);
}

#[test]
fn a_staged_mds_prefix_reads_like_the_same_local_directory() {
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let local = sb.data().join("mds");
    gen(&sb, &local, "mds", 3000, 500, &["--seed", "5"]);
    let total = upload(&s3, &local, "mds").to_string();
    let url = format!("s3://{BUCKET}/mds/");
    let want = ids(&sb, sb.cmd(), local.to_str().unwrap(), &["--mode", "lirs"]);
    assert!(want.len() > 100, "{want:?}");
    // Staged whole (no limit), and within a --cache-limit of its size (the bench's 100%,
    // the mode left to the planner): its index.json is the dataset's, as in the local
    // directory, not a data file of unknown format.
    for args in [
        &["--mode", "lirs"][..],
        &["--mode", "two-pass"],
        &["--cache-limit", &total],
        &["--cache-limit", &total, "--mode", "lirs"],
    ] {
        let got = ids(&sb, s3.cmd(&sb), &url, args);
        assert_eq!(got, want, "{url} {args:?} differs from {}", local.display());
    }
}

#[test]
fn a_missing_object_or_prefix_is_an_error_naming_it() {
    let Some(s3) = Server::start() else { return };
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
        assert!(
            err.contains(&spec),
            "{spec}: the error does not name it:\n{err}"
        );
        assert!(o.stdout.is_empty(), "{spec}: a batch was printed");
    }
}

#[test]
fn a_replaced_object_is_fetched_again_and_read_as_its_new_bytes() {
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let dir = sb.data().join("r");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("x.jsonl");
    let url = format!("s3://{BUCKET}/r/x.jsonl");
    gen(&sb, &file, "lines", 50, 64, &["--seed", "1"]);
    s3.put("r/x.jsonl", &std::fs::read(&file).unwrap());
    let first = ids(&sb, s3.cmd(&sb), &url, &["--mode", "lirs"]);
    assert_eq!(
        first,
        ids(&sb, sb.cmd(), file.to_str().unwrap(), &["--mode", "lirs"])
    );
    // The same name, other records (another count, so a stale index would be wrong).
    gen(&sb, &file, "lines", 80, 64, &["--seed", "2"]);
    s3.put("r/x.jsonl", &std::fs::read(&file).unwrap());
    let second = ids(&sb, s3.cmd(&sb), &url, &["--mode", "lirs"]);
    assert_ne!(
        second, first,
        "the replaced object was read from its stale copy"
    );
    let local = ids(&sb, sb.cmd(), file.to_str().unwrap(), &["--mode", "lirs"]);
    assert_eq!(second, local);
    // Named by its prefix, it is read as the same new bytes.
    let prefix = format!("s3://{BUCKET}/r/");
    assert_eq!(ids(&sb, s3.cmd(&sb), &prefix, &["--mode", "lirs"]), local);
}

#[test]
fn shuffle_takes_an_object_like_its_file() {
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let file = sb.data().join("x.jsonl");
    gen(&sb, &file, "lines", 300, 40, &[]);
    s3.put("s/x.jsonl", &std::fs::read(&file).unwrap());
    let shuffled = |mut c: Command, input: &str, out: &str| {
        let out = sb.path().join(out);
        let o = c
            .args(["shuffle", input, "--seed", "3", "-o"])
            .arg(&out)
            .output()
            .unwrap();
        assert_ok(&o);
        std::fs::read(out).unwrap()
    };
    let local = shuffled(sb.cmd(), file.to_str().unwrap(), "local.jsonl");
    // Under a --cache-limit its staged copy does not fit: refused, naming both, nothing
    // fetched.
    let o = s3
        .cmd(&sb)
        .args([
            "shuffle",
            &format!("s3://{BUCKET}/s/x.jsonl"),
            "--cache-limit",
            "1K",
            "-o",
        ])
        .arg(sb.path().join("never.jsonl"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains("s3://data/s/x.jsonl") && err.contains("--cache-limit"),
        "{err}"
    );
    assert!(!sb.path().join("s3-cache").exists(), "an object was staged");
    let remote = shuffled(
        s3.cmd(&sb),
        &format!("s3://{BUCKET}/s/x.jsonl"),
        "remote.jsonl",
    );
    assert!(
        local.len() > 1000 && remote == local,
        "the shuffled object differs"
    );
}

/// A mixture with an `s3://` source stages it (all its URLs within --cache-limit together)
/// and reads like the mixture of the same local files; past the limit it is refused, naming
/// the URL, before anything is fetched (it was opened as a local path: "No such file").
#[test]
fn a_mixture_stages_its_s3_sources_and_reads_like_the_same_local_files() {
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let dir = shards(&sb, &s3, "lines", "jsonl", "mx");
    let b = sb.data().join("b.jsonl");
    gen(&sb, &b, "lines", 50, 64, &["--seed", "9"]);
    let spec = |a: &str| format!("mix:a={a}*0.5,b={}*0.5;size=400", b.display());
    let args = ["--epochs", "2"];
    let local = local_ids(&sb, &spec(dir.to_str().unwrap()), &args, 40);
    let url = format!("s3://{BUCKET}/mx/");
    let o = s3
        .cmd(&sb)
        .args([
            "read",
            &spec(&url),
            "--batch-size",
            "16",
            "--cache-limit",
            "2K",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(err.contains(&url) && err.contains("--cache-limit"), "{err}");
    assert!(!sb.path().join("s3-cache").exists(), "an object was staged");
    let remote = ids(
        &sb,
        s3.cmd(&sb),
        &spec(&url),
        &[&args[..], &["--cache-limit", "1M"]].concat(),
    );
    assert_eq!(
        local, remote,
        "the mixture's staged source reads as its local files"
    );
}

/// Staging into a cache whose filesystem has less free than the objects take is refused
/// before any GET, naming the figures and the ways out (it stopped part way at "No space
/// left on device"); under a --cache-limit below what is free the same read streams.
#[test]
fn staging_into_a_cache_too_small_is_refused_before_any_get_and_a_lower_limit_streams() {
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let Some(small) = crate::SmallDisk::mount(&sb, "4M") else {
        return;
    };
    let dir = sb.data().join("big");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..3 {
        let p = dir.join(format!("shard-{i}.jsonl"));
        gen(&sb, &p, "lines", 3000, 1000, &["--seed", &i.to_string()]);
        s3.put(&format!("big/shard-{i}.jsonl"), &std::fs::read(&p).unwrap());
    }
    let url = format!("s3://{BUCKET}/big/");
    let cache = small.path().join("cache");
    let o = s3
        .cmd(&sb)
        .env("RIFFLE_S3_CACHE", &cache)
        .args(["read", &url, "--batch-size", "16", "--cache-limit", "1G"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains(&url) && err.contains("free") && err.contains("--cache-limit"),
        "{err}"
    );
    let left: Vec<_> = walk(&cache);
    assert!(left.is_empty(), "files left in the cache: {left:?}");
    let mut c = s3.cmd(&sb);
    c.env("RIFFLE_S3_CACHE", &cache);
    let streamed = ids(&sb, c, &url, &["--cache-limit", "3M", "--mode", "two-pass"]);
    let local = local_ids(&sb, dir.to_str().unwrap(), &[], 100);
    assert_eq!(streamed, local, "the streamed read's batches");
}

/// A staged copy read with the planner's choice on a device no profile is cached for: the
/// quick probe's scratch region is local disk beside the copy, so it takes no more than the
/// --cache-limit leaves there (it took up to half the free space, 1 GiB at most, past the
/// limit), and where that is below the probe's least region the planner uses a default
/// profile and says why.
#[test]
fn the_probe_of_a_staged_copys_device_stays_within_the_cache_limit() {
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let Some(small) = crate::SmallDisk::mount(&sb, "96M") else {
        return;
    };
    let dir = sb.data().join("staged");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..3 {
        let p = dir.join(format!("shard-{i}.jsonl"));
        gen(&sb, &p, "lines", 1000, 1000, &["--seed", &i.to_string()]);
        s3.put(
            &format!("staged/shard-{i}.jsonl"),
            &std::fs::read(&p).unwrap(),
        );
    }
    let url = format!("s3://{BUCKET}/staged/");
    let mut c = s3.cmd(&sb);
    c.env("RIFFLE_S3_CACHE", small.path().join("cache"));
    let o = c
        .args([
            "read",
            &url,
            "--batch-size",
            "16",
            "--seed",
            "7",
            "--cache-limit",
            "8M",
        ])
        .args(["--json"])
        .output()
        .unwrap();
    assert_ok(&o);
    let err = text(&o.stderr);
    assert!(
        err.contains("--cache-limit leaves") && err.contains("default"),
        "no notice of the default profile: {err}"
    );
    // No profile was measured there (a quick probe would have written 40 MiB, half the
    // tmpfs's free space, into a cache limited to 8 MiB).
    let profiles: Vec<_> = walk(&sb.cache().join("riffle/profiles"));
    assert!(profiles.is_empty(), "a profile was measured: {profiles:?}");
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(report["records"].as_u64().unwrap() >= 3000, "{report}");
}

/// A staged copy's index sidecar is local disk in the cache like the copy: saved only
/// where --cache-limit leaves room for it beside the copy (it was saved past the limit, 4.9
/// MB under a 4.1 MiB limit here), and the read is the same either way.
#[test]
fn a_staged_copys_index_sidecar_is_saved_only_within_the_cache_limit() {
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let file = sb.data().join("many.jsonl");
    gen(&sb, &file, "lines", 100_000, 40, &[]);
    let copy = std::fs::metadata(&file).unwrap().len();
    s3.put("side/many.jsonl", &std::fs::read(&file).unwrap());
    let url = format!("s3://{BUCKET}/side/many.jsonl");
    let local = ids(&sb, sb.cmd(), file.to_str().unwrap(), &["--mode", "lirs"]);
    // Room for the copy and a tenth of its index (8 bytes a record).
    let tight = copy + 80_000;
    for (limit, saved) in [(tight, false), (copy + 2_000_000, true)] {
        let cache = sb.path().join(format!("cache-{limit}"));
        let mut c = s3.cmd(&sb);
        c.env("RIFFLE_S3_CACHE", &cache);
        let limit_arg = format!("{limit}");
        let got = ids(
            &sb,
            c,
            &url,
            &["--mode", "lirs", "--cache-limit", &limit_arg],
        );
        assert_eq!(got, local, "limit {limit}: the staged read's batches");
        let files = walk(&cache);
        let on_disk: u64 = files
            .iter()
            .map(|f| std::fs::metadata(f).unwrap().len())
            .sum();
        let sidecar = files
            .iter()
            .any(|f| f.extension().is_some_and(|e| e == "ridx"));
        assert!(
            on_disk <= limit,
            "limit {limit}: {on_disk} bytes in the cache: {files:?}"
        );
        assert_eq!(sidecar, saved, "limit {limit}: {files:?}");
    }
}

/// Staging 100 objects under `ulimit -n 32`: the GETs in flight are as many as the free
/// descriptors allow (it failed part way with "Too many open files" before), a streamed
/// read of them fits it too, and under `ulimit -n 14` the read is refused before any fetch,
/// saying to raise it.
#[test]
fn staging_many_objects_under_a_low_ulimit_n_fetches_within_it_or_says_to_raise_it() {
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let dir = sb.data().join("many");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..100 {
        let p = dir.join(format!("s{i:03}.jsonl"));
        gen(&sb, &p, "lines", 300, 50, &["--seed", &i.to_string()]);
        s3.put(&format!("many/s{i:03}.jsonl"), &std::fs::read(&p).unwrap());
    }
    let url = format!("s3://{BUCKET}/many/");
    let local = ids(&sb, sb.cmd(), dir.to_str().unwrap(), &["--mode", "lirs"]);
    let limited = |n: u64| {
        let mut c = s3.cmd(&sb);
        c.env("RIFFLE_S3_CACHE", sb.path().join(format!("cache-{n}")));
        crate::limits::with_rlimit(&mut c, nix::sys::resource::Resource::RLIMIT_NOFILE, n);
        c
    };
    let got = ids(&sb, limited(32), &url, &["--mode", "lirs"]);
    assert_eq!(got, local, "the staged read's batches under ulimit -n 32");
    // Streamed past --cache-limit: its plan counted the objects as open files (50 asked
    // under a limit of 32) and was refused.
    let args = ["--mode", "two-pass", "--cache-limit", "1M"];
    let got = ids(&sb, limited(32), &url, &args);
    assert_eq!(got, local, "the streamed read's batches under ulimit -n 32");
    let o = limited(14)
        .args(["read", &url, "--batch-size", "16"])
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("raise ulimit -n") && err.contains(&url) && !err.contains("Too many open"),
        "{err}"
    );
    assert!(
        walk(&sb.path().join("cache-14")).is_empty(),
        "a fetch began"
    );
}

/// A shared cache root (`RIFFLE_S3_CACHE` in a sticky directory all may write) where a
/// neighbour made the endpoint's directory first and planted a copy with the object's
/// identity beside it: refused, naming the owner (the planted records were read as the
/// object's before). A root of one's own gets an endpoint directory only its user may
/// enter, and reads the object.
#[test]
fn a_cache_directory_another_user_made_is_refused_and_never_read() {
    use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
    let Some(s3) = Server::start() else { return };
    if !nix::unistd::geteuid().is_root() {
        riffle::testing::skip_needed_in_ci("not root: cannot make a directory as another user");
        return;
    }
    let sb = Sandbox::new();
    let file = sb.data().join("x.jsonl");
    gen(&sb, &file, "lines", 300, 64, &[]);
    let bytes = std::fs::read(&file).unwrap();
    s3.put("n/x.jsonl", &bytes);
    let url = format!("s3://{BUCKET}/n/x.jsonl");
    // Stage once into a cache of one's own, to learn the names and identity riffle keeps.
    let own = sb.path().join("own");
    let mut c = s3.cmd(&sb);
    c.env("RIFFLE_S3_CACHE", &own);
    let want = ids(&sb, c, &url, &["--mode", "lirs"]);
    let endpoint = std::fs::read_dir(&own)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mode = std::fs::metadata(&endpoint).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o700, "{}", endpoint.display());
    // A neighbour (uid 65534) plants the same tree, with other records of the same size.
    let shared = sb.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let theirs = shared.join(endpoint.file_name().unwrap());
    let copy = theirs.join(BUCKET).join("n");
    std::fs::create_dir_all(&copy).unwrap();
    let planted = String::from_utf8(bytes.clone())
        .unwrap()
        .replace("\"id\":", "\"id\":9");
    let planted = &planted.as_bytes()[..bytes.len()];
    std::fs::write(copy.join("x.jsonl"), planted).unwrap();
    let identity = endpoint.join(BUCKET).join("n/.x.jsonl.riffle-object");
    std::fs::copy(&identity, copy.join(".x.jsonl.riffle-object")).unwrap();
    for d in [theirs.clone(), theirs.join(BUCKET), copy.clone()] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        chown(&d, Some(65534), Some(65534)).unwrap();
    }
    for f in ["x.jsonl", ".x.jsonl.riffle-object"] {
        chown(copy.join(f), Some(65534), Some(65534)).unwrap();
    }
    for mode in ["lirs", "two-pass"] {
        let o = s3
            .cmd(&sb)
            .env("RIFFLE_S3_CACHE", &shared)
            .args(["read", &url, "--batch-size", "16", "--mode", mode])
            .output()
            .unwrap();
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{mode}: {err}");
        assert!(
            err.contains("belongs to uid 65534") && err.contains("RIFFLE_S3_CACHE"),
            "{mode}: {err}"
        );
    }
    // Streamed (past --cache-limit): its layouts live in the same directory.
    let o = s3
        .cmd(&sb)
        .env("RIFFLE_S3_CACHE", &shared)
        .args(["read", &url, "--batch-size", "16", "--cache-limit", "8K"])
        .output()
        .unwrap();
    assert!(
        text(&o.stderr).contains("belongs to uid 65534"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(std::fs::read(copy.join("x.jsonl")).unwrap(), planted);
    assert!(!want.is_empty());
}

/// Every file under `dir` (none when it does not exist).
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A `riffle` command of `sb` with no AWS variable but `vars`: the endpoint, keys and
/// region come from the profile files alone.
fn profile_cmd(sb: &Sandbox, vars: &[(&str, &std::path::Path)]) -> Command {
    let mut c = sb.cmd();
    for k in [
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_ENDPOINT",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_CONFIG_FILE",
    ] {
        c.env_remove(k);
    }
    c.env("RIFFLE_S3_CACHE", sb.path().join("s3-cache"));
    for (k, v) in vars {
        c.env(k, v);
    }
    c
}

#[test]
fn an_aws_profile_alone_names_the_endpoint_and_keys_and_a_missing_or_bad_one_is_an_error() {
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let file = sb.data().join("x.jsonl");
    gen(&sb, &file, "lines", 120, 64, &[]);
    s3.put("prof/x.jsonl", &std::fs::read(&file).unwrap());
    let want = ids(&sb, sb.cmd(), file.to_str().unwrap(), &["--mode", "lirs"]);
    let url = format!("s3://{BUCKET}/prof/x.jsonl");
    let lirs = ["--mode", "lirs"];
    // A named profile in files the variables name.
    let named = sb.path().join("named");
    std::fs::create_dir_all(&named).unwrap();
    let (creds, config) = s3.0.profile_files(&named, "team");
    let team = Path::new("team");
    let files = [
        ("AWS_SHARED_CREDENTIALS_FILE", creds.as_path()),
        ("AWS_CONFIG_FILE", config.as_path()),
    ];
    let c = profile_cmd(&sb, &[&files[..], &[("AWS_PROFILE", team)]].concat());
    assert_eq!(ids(&sb, c, &url, &lirs), want, "read through profile team");
    // The default profile in ~/.aws, nothing named.
    let home = sb.path().join("home");
    std::fs::create_dir_all(home.join(".aws")).unwrap();
    s3.0.profile_files(&home.join(".aws"), "default");
    let c = profile_cmd(&sb, &[("HOME", home.as_path())]);
    assert_eq!(ids(&sb, c, &url, &lirs), want, "read through ~/.aws");
    let refused = |mut c: Command, says: &[&str]| {
        let o = c
            .args(["read", &url, "--batch-size", "16", "--mode", "lirs"])
            .output()
            .unwrap();
        assert!(!o.status.success(), "{says:?}: the read succeeded");
        assert!(o.stdout.is_empty(), "{says:?}: a batch was printed");
        let err = text(&o.stderr);
        for s in says {
            assert!(err.contains(s), "the error does not say {s:?}:\n{err}");
        }
    };
    // AWS_PROFILE names a profile neither file has: an error naming it and the files.
    let nope = Path::new("nope");
    refused(
        profile_cmd(&sb, &[&files[..], &[("AWS_PROFILE", nope)]].concat()),
        &["`nope`", creds.to_str().unwrap(), config.to_str().unwrap()],
    );
    // A malformed config file: an error naming it and the line.
    std::fs::write(
        &config,
        "[profile team]\nregion = us-east-1\nendpoint_url\n",
    )
    .unwrap();
    refused(
        profile_cmd(&sb, &[&files[..], &[("AWS_PROFILE", team)]].concat()),
        &[&format!("{}: line 3", config.display())],
    );
}

/// Answers the next `n` requests on `listener` with 503 Slow Down, as a throttling or
/// failing server does, closing each connection; stops early if `child` exits (a client
/// that gave up instead of retrying).
fn answer_503(listener: &std::net::TcpListener, n: usize, child: &mut std::process::Child) {
    use std::io::{BufRead, BufReader, Write};
    listener.set_nonblocking(true).unwrap();
    // A deadline only to catch a hang.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut answered = 0;
    while answered < n {
        let conn = match listener.accept() {
            Ok((conn, _)) => conn,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if child.try_wait().unwrap().is_some() {
                    return;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "riffle never came back"
                );
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
            Err(e) => panic!("accept: {e}"),
        };
        conn.set_nonblocking(false).unwrap();
        let mut r = BufReader::new(conn);
        let mut line = String::new();
        // The request's head; a GET, HEAD or LIST has no body.
        while r.read_line(&mut line).unwrap() > 0 && line != "\r\n" {
            line.clear();
        }
        let body = "<Error><Code>SlowDown</Code></Error>";
        let head = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let mut conn = r.into_inner();
        conn.write_all(head.as_bytes()).unwrap();
        conn.write_all(body.as_bytes()).unwrap();
        answered += 1;
    }
}

#[test]
fn a_503_storm_then_a_stopped_and_restarted_server_resumes_with_the_same_batches() {
    let Some(mut s3) = S3Server::start() else {
        return;
    };
    let sb = Sandbox::new();
    let file = sb.data().join("x.jsonl");
    gen(&sb, &file, "lines", 200, 64, &[]);
    s3.put("storm/x.jsonl", &std::fs::read(&file).unwrap());
    let want = ids(&sb, sb.cmd(), file.to_str().unwrap(), &["--mode", "lirs"]);
    // The server goes away; its port answers 503 to riffle's first requests.
    s3.stop();
    let listener = std::net::TcpListener::bind(("127.0.0.1", s3.port())).unwrap();
    let mut c = Server::cmd_for(&s3, &sb);
    let out = sb.path().join("storm-ids.txt");
    let mut child = c
        .args([
            "read",
            &format!("s3://{BUCKET}/storm/"),
            "--batch-size",
            "16",
        ])
        .args(["--seed", "7", "--mode", "lirs", "--ids-out"])
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    answer_503(&listener, 3, &mut child);
    // Then nothing listens (connections refused) until the server is back.
    drop(listener);
    s3.restart();
    let o = child.wait_with_output().unwrap();
    assert_ok(&o);
    let got: Vec<String> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(got, want, "the resumed read differs from the file's");
}

/// `n` JSONL shards of `records` records of 1,000 bytes in `sb`'s data directory `name`,
/// each uploaded as `name/shard-I.jsonl`: the directory and the bytes uploaded.
fn jsonl_shards(sb: &Sandbox, s3: &Server, name: &str, n: u64, records: u64) -> (PathBuf, u64) {
    let local = sb.data().join(name);
    std::fs::create_dir_all(&local).unwrap();
    for i in 0..n {
        let p = local.join(format!("shard-{i}.jsonl"));
        gen(sb, &p, "lines", records, 1000, &["--seed", &i.to_string()]);
    }
    let total = upload(s3, &local, name);
    (local, total)
}

/// Uploads every file under `dir` as `prefix/RELATIVE_PATH`; returns their bytes.
fn upload(s3: &Server, dir: &std::path::Path, prefix: &str) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let bytes = std::fs::read(&p).unwrap();
        total += bytes.len() as u64;
        let name = p.file_name().unwrap().to_str().unwrap();
        s3.put(&format!("{prefix}/{name}"), &bytes);
    }
    total
}

/// The batches' ids and the JSON report of `riffle read SPEC ARGS --json` run by `c`.
fn ids_and_report(
    sb: &Sandbox,
    mut c: Command,
    spec: &str,
    args: &[&str],
) -> (Vec<String>, serde_json::Value) {
    let out = sb.path().join("ids-json.txt");
    let o = c
        .arg("read")
        .arg(spec)
        .args(["--batch-size", "16", "--seed", "7", "--json"])
        .args(args)
        .arg("--ids-out")
        .arg(&out)
        .output()
        .unwrap();
    assert_ok(&o);
    let t = std::fs::read_to_string(&out).unwrap();
    let report = serde_json::from_slice(&o.stdout).unwrap();
    (t.lines().map(str::to_string).collect(), report)
}

/// A streamed read's report: it ran two-pass from the store, its local disk stayed within
/// `limit`, and every object of `sizes` was fetched in each of `epochs`, no byte of it
/// more than once a round (`rounds` per epoch, each a sequential read of the objects).
/// Returns the rounds.
fn check_streamed(r: &serde_json::Value, limit: u64, sizes: &[(String, u64)], epochs: u64) -> u64 {
    assert_eq!(
        (r["mode"].as_str(), r["backend"].as_str()),
        (Some("two-pass"), Some("s3"))
    );
    assert_eq!(r["cache_limit"].as_u64(), Some(limit));
    let peak = r["peak_local_bytes"].as_u64().unwrap();
    assert!(
        peak > 0 && peak <= limit,
        "peak local disk {peak} past the limit {limit}"
    );
    let rounds = r["rounds"].as_u64().unwrap();
    let objects = r["objects"].as_array().unwrap();
    assert_eq!(
        objects.len() as u64,
        sizes.len() as u64 * epochs,
        "{objects:?}"
    );
    for o in objects {
        let name = o["object"].as_str().unwrap();
        let size = sizes.iter().find(|(n, _)| n == name).expect(name).1;
        let bytes = o["bytes"].as_u64().unwrap();
        assert!(
            bytes > 0 && bytes <= size * rounds,
            "{name} in epoch {}: {bytes} bytes fetched of {size} in {rounds} round(s)",
            o["epoch"]
        );
    }
    rounds
}

/// Every file under `dir` as the object `s3://BUCKET/prefix/NAME`, with its size.
fn objects_of(dir: &std::path::Path, prefix: &str, only: &str) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_str().unwrap().ends_with(only))
        .map(|p| {
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            (
                format!("s3://{BUCKET}/{prefix}/{name}"),
                p.metadata().unwrap().len(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn s3_tar_mds_and_jsonl_streamed_past_the_cache_limit_read_like_the_same_files() {
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let args = [
        "--world",
        "4",
        "--rank",
        "1",
        "--drop-last",
        "--epochs",
        "2",
    ];
    for (format, ext) in [("lines", "jsonl"), ("tar", "tar"), ("mds", "mds")] {
        let local = sb.data().join(format);
        if format == "mds" {
            gen(&sb, &local, "mds", 6000, 2000, &["--seed", "3"]);
        } else {
            std::fs::create_dir_all(&local).unwrap();
            for i in 0..2 {
                let p = local.join(format!("shard-{i}.{ext}"));
                gen(&sb, &p, format, 3000, 2000, &["--seed", &i.to_string()]);
            }
        }
        let total = upload(&s3, &local, format);
        let spec = local.to_str().unwrap();
        let lirs = local_ids(&sb, spec, &args, 50);
        let limit = total * 3 / 4;
        let l = limit.to_string();
        let (got, report) = ids_and_report(
            &sb,
            s3.cmd(&sb),
            &format!("s3://{BUCKET}/{format}/"),
            &[&args[..], &["--cache-limit", &l]].concat(),
        );
        assert_eq!(
            got, lirs,
            "{format}: streamed two-pass differs from the files read locally"
        );
        let rounds = check_streamed(&report, limit, &objects_of(&local, format, ext), 2);
        assert_eq!(
            rounds, 1,
            "{format}: a node's piles within the limit take one round"
        );
    }
}

#[test]
fn a_streamed_read_within_a_quarter_of_the_dataset_holds_it_and_gets_each_object_once_an_epoch() {
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let (local, total) = jsonl_shards(&sb, &s3, "q", 4, 8000);
    // One node of eight: its piles hold an eighth of the records, and the rest of the
    // quarter is the piles' own slack.
    let args = [
        "--world",
        "8",
        "--rank",
        "3",
        "--drop-last",
        "--epochs",
        "2",
    ];
    let want = ids(
        &sb,
        sb.cmd(),
        local.to_str().unwrap(),
        &[&args[..], &["--mode", "lirs"]].concat(),
    );
    let limit = total / 4;
    let l = limit.to_string();
    let url = format!("s3://{BUCKET}/q/");
    let (got, report) = ids_and_report(
        &sb,
        s3.cmd(&sb),
        &url,
        &[&args[..], &["--cache-limit", &l]].concat(),
    );
    assert_eq!(got, want);
    let rounds = check_streamed(&report, limit, &objects_of(&local, "q", "jsonl"), 2);
    assert_eq!(
        rounds, 1,
        "the node's piles fit: one round, each object once an epoch"
    );
    // A limit the node's piles do not fit at once, under a --memory that does not hold
    // what the disk does not: the epoch is read in rounds, each a sequential read of the
    // objects scattering one key range of the piles, in the same order.
    let tight = total * 5 / 32;
    let (got, report) = ids_and_report(
        &sb,
        s3.cmd(&sb),
        &url,
        &[
            &args[..],
            &["--cache-limit", &tight.to_string(), "--memory", "4M"],
        ]
        .concat(),
    );
    assert_eq!(got, want, "read in rounds, the order differs");
    let rounds = check_streamed(&report, tight, &objects_of(&local, "q", "jsonl"), 2);
    assert!(rounds >= 2, "{rounds} round(s) within {tight} bytes");
    // A limit no round fits (the objects indexed alone, or the piles' own slack) is
    // refused, naming it.
    let o = s3
        .cmd(&sb)
        .args(["read", &url, "--batch-size", "16", "--cache-limit", "150K"])
        .args(args)
        .output()
        .unwrap();
    assert!(!o.status.success(), "a read past its cache limit succeeded");
    let err = text(&o.stderr);
    assert!(err.contains("--cache-limit 150"), "{err}");
    // Streamed, it is read by two-pass only: lirs and cat would read it at random.
    for words in [
        &["read", "--batch-size", "16", "--mode", "lirs"][..],
        &["cat", "--ids", "0"],
    ] {
        let o = s3
            .cmd(&sb)
            .args(&words[..1])
            .arg(&url)
            .args(&words[1..])
            .args(["--cache-limit", &l])
            .output()
            .unwrap();
        assert!(!o.status.success(), "{words:?}");
        let err = text(&o.stderr);
        assert!(err.contains("only two-pass reads"), "{words:?}: {err}");
    }
}

#[test]
fn a_node_a_little_past_its_cache_limit_holds_the_overflow_in_memory_and_gets_each_object_once() {
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let (local, total) = jsonl_shards(&sb, &s3, "o", 4, 8000);
    let sizes = objects_of(&local, "o", "jsonl");
    let args = [
        "--world",
        "8",
        "--rank",
        "5",
        "--drop-last",
        "--epochs",
        "2",
    ];
    let want = ids(
        &sb,
        sb.cmd(),
        local.to_str().unwrap(),
        &[&args[..], &["--mode", "lirs"]].concat(),
    );
    let url = format!("s3://{BUCKET}/o/");
    // Within a quarter the node's piles fit the disk: its need is the frames it wrote an
    // epoch.
    let quarter = total / 4;
    let (got, fit) = ids_and_report(
        &sb,
        s3.cmd(&sb),
        &url,
        &[&args[..], &["--cache-limit", &quarter.to_string()]].concat(),
    );
    assert_eq!(got, want);
    assert_eq!(check_streamed(&fit, quarter, &sizes, 2), 1);
    assert!(fit.get("overflow_in_memory_bytes").is_none(), "{fit}");
    let need = fit["scratch_bytes"].as_u64().unwrap() / 2;
    // A tenth under it: the lowest key range is held in memory, not read in a second
    // round; the same batches, the disk within the limit, each object fetched with the
    // same GETs as when everything fit, no byte twice.
    let limit = need * 9 / 10;
    let (got, r) = ids_and_report(
        &sb,
        s3.cmd(&sb),
        &url,
        &[&args[..], &["--cache-limit", &limit.to_string()]].concat(),
    );
    assert_eq!(got, want, "the overflow held in memory, the order differs");
    assert_eq!(check_streamed(&r, limit, &sizes, 2), 1, "{r}");
    let held = r["overflow_in_memory_bytes"].as_u64().unwrap_or(0);
    assert!(
        held >= need / 20,
        "{held} bytes held in memory of a need of {need}: {r}"
    );
    // The memory the read reports counts it (within the loaded piles' share).
    assert!(
        held <= r["pile_bytes"].as_u64().unwrap() && held < r["memory_bytes"].as_u64().unwrap(),
        "{r}"
    );
    let gets = |r: &serde_json::Value| -> Vec<(String, u64, u64)> {
        let mut v: Vec<_> = r["objects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                (
                    o["object"].as_str().unwrap().to_string(),
                    o["epoch"].as_u64().unwrap(),
                    o["gets"].as_u64().unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(gets(&r), gets(&fit), "each object read once an epoch");
    // The planner says the same: one round, the objects once an epoch.
    let o = s3
        .cmd(&sb)
        .args(["plan", &url, "--batch-size", "16", "--json"])
        .args(["--world", "8", "--cache-limit", &limit.to_string()])
        .output()
        .unwrap();
    assert_ok(&o);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let t = &v["streamed_two_pass"];
    assert_eq!(t["rounds"].as_u64(), Some(1), "{v}");
    assert!(t["bytes_per_epoch"].as_u64().unwrap() <= total, "{v}");
}

#[test]
fn one_node_streamed_within_a_quarter_and_a_tenth_reads_in_rounds_in_the_same_order() {
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let local = sb.data().join("r");
    gen(&sb, &local, "mds", 12000, 2000, &["--seed", "9"]);
    let total = upload(&s3, &local, "r");
    let url = format!("s3://{BUCKET}/r/");
    let spec = local.to_str().unwrap();
    for (share, epochs) in [(4, "2"), (10, "1")] {
        let args = ["--epochs", epochs];
        let lirs = local_ids(&sb, spec, &args, 500);
        // One node holds the whole dataset: its piles take R rounds within the limit (under
        // a --memory that does not hold what the disk does not, `rounds`).
        let limit = total / share;
        let (got, report) = ids_and_report(
            &sb,
            s3.cmd(&sb),
            &url,
            &[
                &args[..],
                &["--cache-limit", &limit.to_string(), "--memory", "32M"],
            ]
            .concat(),
        );
        assert_eq!(got, lirs, "1/{share}: read in rounds, the order differs");
        let n: u64 = epochs.parse().unwrap();
        let rounds = check_streamed(&report, limit, &objects_of(&local, "r", "mds"), n);
        assert!(rounds >= 2, "1/{share}: {rounds} round(s)");
        // Each object is read once a round: a GET (or more) in each.
        for o in report["objects"].as_array().unwrap() {
            let gets = o["gets"].as_u64().unwrap();
            assert!(gets >= rounds, "1/{share}: {o} in {rounds} rounds");
        }
        // The planner says the same rounds, and GETs and bytes for all of them.
        let o = s3
            .cmd(&sb)
            .args([
                "plan",
                &url,
                "--batch-size",
                "16",
                "--json",
                "--memory",
                "32M",
            ])
            .args(["--cache-limit", &limit.to_string()])
            .output()
            .unwrap();
        assert_ok(&o);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let t = &v["streamed_two_pass"];
        // The plan cuts its first epoch's rounds (of its own seed: the cut may differ
        // by one where a key bucket falls).
        let planned = t["rounds"].as_u64().unwrap();
        assert!(
            planned >= 2 && planned.abs_diff(rounds) <= 1,
            "{rounds}: {v}"
        );
        let shards: u64 = objects_of(&local, "r", "mds").iter().map(|o| o.1).sum();
        assert!(
            t["bytes_per_epoch"].as_u64().unwrap() >= planned * shards * 9 / 10,
            "{v}"
        );
    }
    // A limit that leaves no room beside the piles' own slack: no number of rounds fits,
    // refused before any pile is written, naming the figures.
    let o = s3
        .cmd(&sb)
        .args(["read", &url, "--batch-size", "16", "--cache-limit", "150K"])
        .output()
        .unwrap();
    assert!(!o.status.success(), "a read no round fits succeeded");
    let err = text(&o.stderr);
    assert!(
        err.contains("--cache-limit leaves") && err.contains("a round of") && err.contains("slack"),
        "{err}"
    );
}

#[test]
fn plan_of_an_s3_dataset_past_its_cache_limit_shows_staged_against_streamed_two_pass() {
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let (_, total) = jsonl_shards(&sb, &s3, "p", 3, 2000);
    let url = format!("s3://{BUCKET}/p/");
    let plan = |limit: u64, json: bool| {
        let mut c = s3.cmd(&sb);
        c.args([
            "plan",
            &url,
            "--batch-size",
            "16",
            "--epochs",
            "2",
            "--world",
            "4",
        ])
        .args(["--cache-limit", &limit.to_string()]);
        if json {
            c.arg("--json");
        }
        let o = c.output().unwrap();
        assert_ok(&o);
        o.stdout
    };
    let v: serde_json::Value = serde_json::from_slice(&plan(total / 2, true)).unwrap();
    assert_eq!(v["choice"], "streamed two-pass", "{v}");
    let (s, t) = (&v["staged"], &v["streamed_two_pass"]);
    assert_eq!(
        (s["fits"].as_bool(), t["fits"].as_bool()),
        (Some(false), Some(true)),
        "{v}"
    );
    // Objects smaller than a scatter read: one GET each an epoch, all their bytes.
    assert_eq!(t["gets_per_epoch"], 3, "{v}");
    assert!(t["bytes_per_epoch"].as_u64().unwrap() <= total, "{v}");
    assert!(t["local_disk"].as_u64().unwrap() <= total / 2, "{v}");
    assert_eq!(
        (s["gets_later_epoch"].as_u64(), s["local_disk"].as_u64()),
        (Some(0), Some(total))
    );
    // Its open fetched each object once to index it (a cold layout cache)...
    assert_eq!(
        (v["open"]["gets"].as_u64(), v["open"]["bytes"].as_u64()),
        (Some(3), Some(total)),
        "{v}"
    );
    // ... and the next finds their layouts in the cache.
    let text = String::from_utf8(plan(total / 2, false)).unwrap();
    assert!(
        text.contains("streamed two-pass") && text.contains("<- runs") && text.contains("staged"),
        "{text}"
    );
    assert!(
        text.contains(
            "opening it: 1 listing(s), 0 GET(s) of 0 B to find layouts; 3 layout(s) \
             from the local cache, 0 fetched"
        ),
        "{text}"
    );
    // Fitting the limit, the objects are staged, and the local modes' plan follows.
    let text = String::from_utf8(plan(total * 2, false)).unwrap();
    assert!(
        text.contains("the staged copy is read by the local modes"),
        "{text}"
    );
}

/// `nodes` daemons standing for `nodes` nodes, each serving two ranks of a world of
/// `2 x nodes` over the shards `s3://BUCKET/prefix/` (the files of `local`, of `records`
/// records) streamed two-pass within `--cache-limit` `limit` on each, over `epochs`: each
/// rank gets the local files' batches, every record comes once an epoch, and each node's
/// counters show its local disk within the limit and each object fetched at most once an
/// epoch (no byte of it twice).
fn nodes_stream_their_ranks(
    s3: &Server,
    sb: &Sandbox,
    (local, prefix, ext): (&Path, &str, &str),
    records: u64,
    nodes: u64,
    limit: u64,
    epochs: u64,
) {
    use crate::serve::{in_process, read_all, same_batches, Daemon};
    use riffle::serve::proto::OpenRequest;
    let l = limit.to_string();
    let url = PathBuf::from(format!("s3://{BUCKET}/{prefix}/"));
    let daemons: Vec<Daemon> = (0..nodes)
        .map(|n| {
            let sock = sb.path().join(format!("node-{n}.sock"));
            let extra = ["--mode", "two-pass", "--cache-limit", &l];
            Daemon::start_from(s3.cmd(sb), &sock, &[("train", &url)], &extra)
        })
        .collect();
    let world = 2 * nodes;
    let req = |rank: u64| {
        let mut r = OpenRequest::new("train", 50);
        r.seed = 4;
        r.epochs = epochs;
        r.rank = rank;
        r.world = world;
        // Each node serves two ranks: its pass waits for both.
        r.streams = Some(2);
        r
    };
    let got = std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|rank| {
                let node = &daemons[(rank / 2) as usize];
                s.spawn(move || read_all(&mut node.client(), req(rank)))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    let mut ids = vec![Vec::new(); epochs as usize];
    for (rank, g) in got.iter().enumerate() {
        // Ids, offsets and payload bytes: the local files' batches of that rank.
        same_batches(g, &in_process(local, &req(rank as u64)));
        for b in g {
            ids[b.0 as usize].extend(b.2.iter().copied());
        }
    }
    for (epoch, mut e) in ids.into_iter().enumerate() {
        e.sort_unstable();
        assert_eq!(
            e,
            (0..records).collect::<Vec<u64>>(),
            "epoch {epoch}: every record once"
        );
    }
    let sizes = objects_of(local, prefix, ext);
    for (n, d) in daemons.iter().enumerate() {
        let st = d.wait_stats("the pass's report", |s| {
            s["streamed"]["last_pass_objects"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
        });
        let peak = st["streamed"]["peak_local_bytes"].as_u64().unwrap();
        assert!(
            peak > 0 && peak <= limit,
            "node {n}: peak local disk {peak} past the limit {limit}"
        );
        let objects = st["streamed"]["last_pass_objects"].as_array().unwrap();
        assert_eq!(
            objects.len() as u64,
            sizes.len() as u64 * epochs,
            "node {n}: {objects:?}"
        );
        for o in objects {
            let name = o["object"].as_str().unwrap();
            let size = sizes.iter().find(|(s, _)| s == name).expect(name).1;
            let bytes = o["bytes"].as_u64().unwrap();
            assert!(
                bytes > 0 && bytes <= size,
                "node {n}: {name} in epoch {}: {bytes} bytes fetched of {size}",
                o["epoch"]
            );
        }
    }
}

#[test]
fn two_daemons_standing_for_two_nodes_stream_each_its_ranks_records_within_the_cache_limit() {
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let (local, total) = jsonl_shards(&sb, &s3, "n", 2, 3000);
    // Below the dataset (so streamed), above a node's half of it and the piles' slack:
    // a node that kept every record would pass it.
    let limit = total * 4 / 5;
    nodes_stream_their_ranks(&s3, &sb, (&local, "n", "jsonl"), 6000, 2, limit, 2);
}

#[test]
fn four_daemons_standing_for_four_nodes_stream_their_ranks_within_a_quarter_of_the_dataset() {
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let local = sb.data().join("n4");
    std::fs::create_dir_all(&local).unwrap();
    // Tar shards (WebDataset), 3,584 bytes a sample (three members). Measured at a limit
    // of 40%: each node's peak is 13,411,296 bytes of 43,012,096 (31.2%): its quarter of
    // the samples, 100 bytes of frame each (11,052,000) and 2 x 1,179,648 of write buffers.
    for i in 0..4 {
        let p = local.join(format!("shard-{i}.tar"));
        gen(&sb, &p, "tar", 3000, 1000, &["--seed", &i.to_string()]);
    }
    let total = upload(&s3, &local, "n4");
    nodes_stream_their_ranks(&s3, &sb, (&local, "n4", "tar"), 12000, 4, total / 4, 2);
}

#[test]
fn a_staged_copy_under_a_cache_limit_leaves_two_pass_only_the_room_beside_it() {
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let (local, total) = jsonl_shards(&sb, &s3, "st", 2, 2000);
    // The copy fits; its piles beside it would not.
    let limit = (total * 6 / 5).to_string();
    let url = format!("s3://{BUCKET}/st/");
    let o = s3
        .cmd(&sb)
        .args(["read", &url, "--batch-size", "16", "--mode", "two-pass"])
        .args(["--cache-limit", &limit])
        .output()
        .unwrap();
    assert!(!o.status.success(), "two-pass piles passed the cache limit");
    let err = text(&o.stderr);
    assert!(
        err.contains("beside the staged copy") && err.contains("--cache-limit"),
        "{err}"
    );
    // lirs reads the copy in place, as the files.
    let args = ["--mode", "lirs", "--cache-limit", &limit];
    let want = ids(&sb, sb.cmd(), local.to_str().unwrap(), &["--mode", "lirs"]);
    assert_eq!(ids(&sb, s3.cmd(&sb), &url, &args), want);
}

/// A local read never reads the AWS environment's profile files: an unreadable credentials
/// file (a directory here) fails only what names `s3://`, naming the file. A local read run
/// as another user whose HOME held root's `~/.aws` failed with "Permission denied" before.
#[test]
fn a_local_read_never_reads_the_aws_profile_files() {
    let sb = Sandbox::new();
    let data = sb.data().join("d.npy");
    gen(&sb, &data, "npy", 100, 16, &[]);
    let bad = sb.path().join("not-a-file");
    std::fs::create_dir_all(&bad).unwrap();
    let run = |args: &[&str]| {
        sb.cmd()
            .env("AWS_SHARED_CREDENTIALS_FILE", &bad)
            .env("AWS_CONFIG_FILE", &bad)
            .args(args)
            .output()
            .unwrap()
    };
    let path = data.to_str().unwrap();
    for args in [
        &["read", path, "--batch-size", "10"][..],
        &["read", path, "--batch-size", "10", "--cache-limit", "1M"],
        &["plan", path, "--batch-size", "10"],
    ] {
        let o = run(args);
        assert_ok(&o);
    }
    let o = run(&["read", &format!("s3://{BUCKET}/x/"), "--batch-size", "10"]);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(err.contains("not-a-file"), "{err}");
}

#[test]
fn an_open_paths_daemon_serves_an_s3_url_named_by_path_within_its_cache_limit() {
    use crate::serve::{in_process, read_all, same_batches, Daemon};
    use riffle::serve::proto::OpenRequest;
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let (local, total) = jsonl_shards(&sb, &s3, "op", 2, 3000);
    let url = format!("s3://{BUCKET}/op/");
    // Below the dataset (so streamed), above the half of it rank 0 of 2 keeps.
    let limit = (total * 4 / 5).to_string();
    let sock = sb.path().join("paths.sock");
    let extra = [
        "--open-paths",
        "--mode",
        "two-pass",
        "--cache-limit",
        &limit,
    ];
    let d = Daemon::start_from(s3.cmd(&sb), &sock, &[], &extra);
    // Ranks 0 and 1 of a world of 4: the node keeps half the records.
    let req = |rank: u64| {
        let mut r = OpenRequest::new(&url, 50);
        r.seed = 4;
        r.rank = rank;
        r.world = 4;
        r.streams = Some(2);
        r
    };
    let (d, local) = (&d, &local);
    let both = || {
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|rank| s.spawn(move || read_all(&mut d.client(), req(rank))))
                .collect();
            for (rank, h) in hs.into_iter().enumerate() {
                let got = h.join().unwrap();
                assert!(got.len() > 5, "rank {rank}: {} batches", got.len());
                same_batches(&got, &in_process(local, &req(rank as u64)));
            }
        })
    };
    both();
    let st = d.stats();
    assert!(
        st["streamed"]["peak_local_bytes"]
            .as_u64()
            .is_some_and(|p| p > 0 && p <= total * 4 / 5),
        "not streamed within the limit: {}",
        st["streamed"]
    );

    // An object replaced: the next listing sees it, and the dataset is opened again (still
    // past the limit: streamed).
    let p = local.join("shard-1.jsonl");
    gen(&sb, &p, "lines", 3000, 1000, &["--seed", "9"]);
    s3.put("op/shard-1.jsonl", &std::fs::read(&p).unwrap());
    std::thread::sleep(std::time::Duration::from_secs(6));
    both();

    // A limit smaller than one object: the client is told, the limit named.
    let sock = sb.path().join("small.sock");
    let extra = [
        "--open-paths",
        "--mode",
        "two-pass",
        "--cache-limit",
        "4096",
    ];
    let small = Daemon::start_from(s3.cmd(&sb), &sock, &[], &extra);
    let err = match small.client().open(req(0)) {
        Ok(_) => panic!("{url} opened within a 4 KiB cache limit"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(&url) && err.contains("--cache-limit 4.0 KiB"),
        "{err}"
    );
}

#[test]
fn a_streamed_reads_report_counts_the_gets_of_its_open_on_a_cold_and_a_warm_layout_cache() {
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let (_, total) = jsonl_shards(&sb, &s3, "oc", 2, 3000);
    let limit = (total * 3 / 4).to_string();
    let args = [
        "--world",
        "4",
        "--rank",
        "1",
        "--drop-last",
        "--cache-limit",
        &limit,
    ];
    let url = format!("s3://{BUCKET}/oc/");
    let (cold_ids, cold) = ids_and_report(&sb, s3.cmd(&sb), &url, &args);
    let o = &cold["open"];
    // Cold: each object fetched whole once (one ranged GET each, below 8 MiB) to be indexed.
    assert_eq!(
        (o["lists"].as_u64(), o["gets"].as_u64(), o["bytes"].as_u64()),
        (Some(1), Some(2), Some(total)),
        "{o}"
    );
    assert_eq!(
        (o["layouts_cached"].as_u64(), o["layouts_fetched"].as_u64()),
        (Some(0), Some(2)),
        "{o}"
    );
    // Warm: the layouts come from the local cache; only the listing asks the store.
    let (warm_ids, warm) = ids_and_report(&sb, s3.cmd(&sb), &url, &args);
    let o = &warm["open"];
    assert_eq!(
        (o["lists"].as_u64(), o["gets"].as_u64(), o["bytes"].as_u64()),
        (Some(1), Some(0), Some(0)),
        "{o}"
    );
    assert_eq!(
        (o["layouts_cached"].as_u64(), o["layouts_fetched"].as_u64()),
        (Some(2), Some(0)),
        "{o}"
    );
    assert_eq!(warm_ids, cold_ids);
    // The open is timed apart from the read, and the first batch counted from its start.
    for r in [&cold, &warm] {
        let open = r["open_seconds"].as_f64().unwrap();
        let first = r["first_batch_since_open_seconds"].as_f64().unwrap();
        assert!(open > 0.0 && first >= open, "{r}");
    }
    // The read's own GETs are counted apart, as before.
    assert!(!warm["objects"].as_array().unwrap().is_empty());
}

/// The most local disk `dir` takes while `f` runs, sampled every few milliseconds (a
/// sample can miss a peak, never invent one): the charge the engine reports is checked
/// against what the filesystem holds.
fn disk_peak<T>(dir: &Path, f: impl FnOnce() -> T) -> (T, u64) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    fn used(p: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => used(&e.path()),
                Ok(m) => m.blocks() * 512,
                Err(_) => 0,
            })
            .sum()
    }
    let (stop, peak) = (AtomicBool::new(false), AtomicU64::new(0));
    let v = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(used(dir), Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        });
        // The sampler stops however `f` ends.
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = Stop(&stop);
        f()
    });
    (v, peak.into_inner())
}

/// Ranks of worlds of two and three served by one `--open-paths` daemon from an `s3://`
/// URL streamed within its `--cache-limit` (one rank of two, as a node of a two-node job
/// runs it; both ranks of two; one rank of three), and the same jobs read in process: each
/// rank gets its local files' batches, the ranks served get each of their records once
/// an epoch, and neither the charge reported nor the disk the cache takes passes the
/// limit. Records of 64 bytes too, whose cached layouts (8 bytes a record) were local
/// disk the limit did not count: the cache took 2.27 MB under a limit of 2.08 MB.
#[test]
fn ranks_of_worlds_of_two_and_three_stream_from_a_daemon_by_path_within_its_cache_limit() {
    use crate::serve::{in_process, same_batches, Daemon};
    use riffle::serve::proto::OpenRequest;
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let mut n = 0;
    // Records that divide into whole rounds of batches of 50 over two and three ranks.
    for (name, size, per_shard) in [("big", 1000u64, 3000u64), ("small", 64, 18000)] {
        let local = sb.data().join(name);
        std::fs::create_dir_all(&local).unwrap();
        for i in 0..2 {
            let p = local.join(format!("shard-{i}.jsonl"));
            gen(
                &sb,
                &p,
                "lines",
                per_shard,
                size,
                &["--seed", &i.to_string()],
            );
        }
        let (total, records) = (upload(&s3, &local, name), 2 * per_shard);
        let url = format!("s3://{BUCKET}/{name}/");
        let limit = total * 4 / 5;
        let l = limit.to_string();
        for (world, ranks, streams) in [
            (2u64, &[0u64][..], None),
            (2, &[0, 1], Some(2)),
            (3, &[0], Some(1)),
        ] {
            n += 1;
            let what = format!("{name}: ranks {ranks:?} of {world}");
            let cache = sb.path().join(format!("cache-{n}"));
            let mut c = s3.cmd(&sb);
            c.env("RIFFLE_S3_CACHE", &cache);
            let sock = sb.path().join(format!("w{n}.sock"));
            let extra = ["--open-paths", "--mode", "two-pass", "--cache-limit", &l];
            let d = Daemon::start_from(c, &sock, &[], &extra);
            let req = |rank: u64| {
                let mut r = OpenRequest::new(&url, 50);
                r.seed = 4;
                r.epochs = 2;
                r.rank = rank;
                r.world = world;
                r.streams = streams;
                r
            };
            let (d, req) = (&d, &req);
            let (got, disk) = disk_peak(&cache, || {
                std::thread::scope(|s| {
                    let hs: Vec<_> = (ranks.iter())
                        .map(|&rank| {
                            s.spawn(move || crate::serve::read_all(&mut d.client(), req(rank)))
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| h.join().unwrap())
                        .collect::<Vec<_>>()
                })
            });
            let mut ids = vec![Vec::new(); 2];
            for (g, &rank) in got.iter().zip(ranks) {
                same_batches(g, &in_process(&local, &req(rank)));
                for b in g {
                    ids[b.0 as usize].extend(b.2.iter().copied());
                }
            }
            for (epoch, mut e) in ids.into_iter().enumerate() {
                e.sort_unstable();
                let once = e.len();
                e.dedup();
                assert_eq!(
                    (once, e.len() as u64),
                    (e.len(), records * ranks.len() as u64 / world),
                    "{what}, epoch {epoch}: each of the ranks' records once"
                );
            }
            let st = d.wait_stats("the pass's report", |s| {
                s["streamed"]["peak_local_bytes"].is_u64()
            });
            let peak = st["streamed"]["peak_local_bytes"].as_u64().unwrap();
            assert!(
                peak > 0 && peak <= limit,
                "{what}: peak {peak} past the limit {limit}"
            );
            assert!(
                disk <= limit,
                "{what}: the cache took {disk} bytes past the limit {limit} (charged {peak})"
            );
        }
        // The same jobs in process.
        for (world, rank) in [(2u64, 1u64), (3, 0)] {
            n += 1;
            let what = format!("{name}: riffle read, rank {rank} of {world}");
            let cache = sb.path().join(format!("cache-{n}"));
            let mut c = s3.cmd(&sb);
            c.env("RIFFLE_S3_CACHE", &cache);
            let (w, r) = (world.to_string(), rank.to_string());
            let job = ["--world", &w, "--rank", &r, "--epochs", "2", "--drop-last"];
            let args = [&job[..], &["--mode", "two-pass", "--cache-limit", &l]].concat();
            let ((got, report), disk) = disk_peak(&cache, || ids_and_report(&sb, c, &url, &args));
            let want = ids(
                &sb,
                sb.cmd(),
                local.to_str().unwrap(),
                &[&job[..], &["--mode", "lirs"]].concat(),
            );
            assert_eq!(got, want, "{what}");
            let peak = report["peak_local_bytes"].as_u64().unwrap();
            assert!(
                peak > 0 && peak <= limit,
                "{what}: peak {peak} past the limit {limit}"
            );
            assert!(
                disk <= limit,
                "{what}: the cache took {disk} bytes past the limit {limit} (charged {peak})"
            );
        }
    }
}

/// A dataset by path that fits `--cache-limit` is staged whole (the daemon's choice), and
/// a two-pass read's piles have only the room beside the copy: when they do not fit it
/// the daemon reads the copy in place (LIRS, no piles), else through piles, within the
/// limit either way. Before, a daemon of `--mode two-pass` wrote piles of every record
/// beside the copy (one rank of two kept them all): 22.9 MB of local disk under a limit
/// of 9.0 MB.
#[test]
fn a_daemon_by_path_leaves_a_staged_copys_piles_only_the_room_beside_it() {
    use crate::serve::{in_process, same_batches, Daemon, Got};
    use riffle::serve::proto::OpenRequest;
    let Some(s3) = Server::start() else { return };
    let sb = Sandbox::new();
    let (local, total) = jsonl_shards(&sb, &s3, "sc", 2, 3000);
    let url = format!("s3://{BUCKET}/sc/");
    let req = || {
        let mut r = OpenRequest::new(&url, 50);
        r.seed = 4;
        r.epochs = 2;
        r.world = 2;
        r
    };
    // The copy fits both; the piles of every record fit beside it only in the second.
    for (limit, mode) in [(total * 3 / 2, "lirs"), (total * 4, "two-pass")] {
        let cache = sb.path().join(format!("cache-{mode}"));
        let mut c = s3.cmd(&sb);
        c.env("RIFFLE_S3_CACHE", &cache);
        let sock = sb.path().join(format!("{mode}.sock"));
        let l = limit.to_string();
        let extra = ["--open-paths", "--mode", "two-pass", "--cache-limit", &l];
        let d = Daemon::start_from(c, &sock, &[], &extra);
        let ((got, ran), disk) = disk_peak(&cache, || {
            let mut client = d.client();
            let mut s = client.open(req()).unwrap();
            let ran = s.opened.mode.clone();
            let mut got: Got = Vec::new();
            while let Some(b) = s.next_batch().unwrap() {
                let h = &b.header;
                let (ids, offsets) = (b.ids().to_vec(), b.offsets().to_vec());
                got.push((h.epoch, h.index, ids, offsets, b.data().to_vec()));
            }
            (got, ran)
        });
        same_batches(&got, &in_process(&local, &req()));
        assert_eq!(ran, mode, "a limit of {limit} for {total} bytes");
        assert!(
            disk <= limit,
            "{mode}: the cache took {disk} bytes past the limit {limit}"
        );
    }
}
