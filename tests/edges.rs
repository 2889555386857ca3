//! Issue 30's tar and format edges, through the `riffle` binary: shuffles that would write
//! a tar riffle rejects (D8), a fixed header larger than the file (D31), mixtures nested
//! without end (D33) and names that are not UTF-8 (D17).

use std::process::Output;

use crate::{assert_ok, gen, text, Sandbox};

fn run(sb: &Sandbox, args: &[&std::ffi::OsStr]) -> Output {
    sb.cmd().args(args).output().unwrap()
}

fn os(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

fn failed(out: &Output) -> String {
    assert!(!out.status.success(), "succeeded: {}", text(&out.stdout));
    text(&out.stderr)
}

/// D8: two shards of the same keys shuffled into one tar wrote, with rc 0, an archive
/// riffle then rejected; now refused before anything is written, naming the key. So are
/// two files of a tree with one key (a/1.jpg, a/1.png).
#[test]
fn d8_a_tar_shuffle_refuses_samples_of_one_key() {
    let sb = Sandbox::new();
    let (a, b) = (sb.data().join("a.tar"), sb.data().join("b.tar"));
    gen(&sb, &a, "tar", 200, 300, &[]);
    gen(&sb, &b, "tar", 200, 300, &[]);
    let out = sb.data().join("out.tar");
    let o = run(
        &sb,
        &[
            os("shuffle"),
            a.as_os_str(),
            b.as_os_str(),
            os("-o"),
            out.as_os_str(),
        ],
    );
    let e = failed(&o);
    assert!(e.contains("same key") && e.contains("b.tar"), "{e}");
    assert!(!out.exists(), "nothing is written");
    // One shard alone shuffles, and riffle reads the result.
    assert_ok(&run(
        &sb,
        &[os("shuffle"), a.as_os_str(), os("-o"), out.as_os_str()],
    ));
    assert_ok(&run(
        &sb,
        &[os("read"), out.as_os_str(), os("--batch-size"), os("7")],
    ));

    let tree = sb.data().join("tree");
    std::fs::create_dir_all(tree.join("a")).unwrap();
    std::fs::write(tree.join("a/1.jpg"), b"jpeg").unwrap();
    std::fs::write(tree.join("a/1.png"), b"png").unwrap();
    std::fs::write(tree.join("a/2.jpg"), b"jpeg2").unwrap();
    let o = run(
        &sb,
        &[
            os("shuffle"),
            tree.as_os_str(),
            os("--format"),
            os("files"),
            os("-o"),
            out.as_os_str(),
        ],
    );
    let e = failed(&o);
    assert!(
        e.contains("a/1.jpg") && e.contains("a/1.png") && e.contains("same key"),
        "{e}"
    );
}

/// D31: a fixed header larger than the file: `shuffle` said "0 records", rc 0, and copied
/// the input; now the error `read` gives, from both.
#[test]
fn d31_a_header_larger_than_the_file_is_one_error_everywhere() {
    let sb = Sandbox::new();
    let f = sb.data().join("f.bin");
    std::fs::write(&f, [7u8; 50]).unwrap();
    let out = sb.data().join("out.bin");
    let fmt = os("fixed:4:100");
    let read = failed(&run(
        &sb,
        &[
            os("read"),
            f.as_os_str(),
            os("--format"),
            fmt,
            os("--batch-size"),
            os("4"),
        ],
    ));
    let shuffle = failed(&run(
        &sb,
        &[
            os("shuffle"),
            f.as_os_str(),
            os("--format"),
            fmt,
            os("-o"),
            out.as_os_str(),
        ],
    ));
    let want = "the input ends at byte 50, before its 100-byte header does";
    for e in [&read, &shuffle] {
        assert!(e.contains(want) && e.contains("f.bin"), "{e}");
    }
    assert!(!out.exists());
}

/// D17: a files tree's names that are not UTF-8 went into the tar as U+FFFD, so two files
/// got one member name and extraction kept one. Now GNU tar and Python's `tarfile` read
/// every name back byte for byte, each with its own bytes.
#[test]
fn d17_names_that_are_not_utf8_reach_the_tar_byte_for_byte() {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let sb = Sandbox::new();
    let tree = sb.data().join("tree");
    let c = tree.join("c");
    std::fs::create_dir_all(&c).unwrap();
    let names: [&[u8]; 3] = [b"\xff.bin", b"\xfe.bin", b"ok.bin"];
    for (i, n) in names.iter().enumerate() {
        std::fs::write(c.join(std::ffi::OsStr::from_bytes(n)), format!("file {i}")).unwrap();
    }
    let out = sb.data().join("out.tar");
    assert_ok(&run(
        &sb,
        &[
            os("shuffle"),
            tree.as_os_str(),
            os("--format"),
            os("files"),
            os("-o"),
            out.as_os_str(),
        ],
    ));
    let x = sb.path().join("x");
    std::fs::create_dir(&x).unwrap();
    let tar = std::process::Command::new("tar")
        .arg("-xf")
        .arg(&out)
        .arg("-C")
        .arg(&x)
        .output();
    match tar {
        Ok(o) => {
            assert_ok(&o);
            let mut got: Vec<Vec<u8>> = std::fs::read_dir(x.join("c"))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_vec())
                .collect();
            got.sort();
            let mut want: Vec<Vec<u8>> = names.iter().map(|n| n.to_vec()).collect();
            want.sort();
            assert_eq!(got, want, "GNU tar extracts every name");
            for (i, n) in names.iter().enumerate() {
                let p = x.join("c").join(std::ffi::OsStr::from_bytes(n));
                assert_eq!(std::fs::read(p).unwrap(), format!("file {i}").as_bytes());
            }
        }
        Err(e) => crate::skip_needed_in_ci(&format!("GNU tar cannot run: {e}")),
    }
    let py = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import os, sys, tarfile\n\
             with tarfile.open(sys.argv[1]) as t:\n\
             \x20   print(sorted(os.fsencode(m.name).hex() for m in t.getmembers()))",
        )
        .arg(&out)
        .output();
    match py {
        Ok(o) => {
            assert_ok(&o);
            let mut want: Vec<String> = names
                .iter()
                .map(|n| [b"c/".as_slice(), n].concat())
                .map(|n| n.iter().map(|b| format!("{b:02x}")).collect())
                .collect();
            want.sort();
            assert_eq!(
                text(&o.stdout).trim(),
                format!("{want:?}").replace('"', "'")
            );
        }
        Err(e) => crate::skip_needed_in_ci(&format!("python3 cannot run: {e}")),
    }
}
