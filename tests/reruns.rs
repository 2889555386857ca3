//! What one run leaves for the next (issue 30 D16, D20, D28, D29): a `files` tree changed
//! in place after it was listed, a split output rerun over a user's own files, a shuffle
//! output inside its input tree, two-pass scratch inside a tree. Real trees, the real
//! binary, run twice.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use crate::{assert_ok, gen, text, Sandbox};

/// A labelled tree of 30 files of 100 bytes (three classes), listed once by a read.
fn listed_tree(sb: &Sandbox) -> PathBuf {
    let tree = sb.data().join("tree");
    gen(sb, &tree, "files", 30, 100, &["--labels", "3"]);
    assert_ok(&read(sb, &tree, &[]));
    tree
}

fn read(sb: &Sandbox, tree: &Path, extra: &[&str]) -> Output {
    sb.cmd()
        .arg("read")
        .arg(tree)
        .args(["--format", "files", "--batch-size", "4", "--json"])
        .args(extra)
        .output()
        .unwrap()
}

/// The first file of the tree (in name order) of its first class directory.
fn a_file_of(tree: &Path) -> PathBuf {
    let mut classes: Vec<PathBuf> = std::fs::read_dir(tree)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    classes.sort();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&classes[0])
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files[0].clone()
}

fn index_json(sb: &Sandbox, tree: &Path) -> Value {
    let o = sb
        .cmd()
        .arg("index")
        .arg(tree)
        .args(["--format", "files", "--json"])
        .output()
        .unwrap();
    assert_ok(&o);
    serde_json::from_slice(&o.stdout).unwrap()
}

/// D16: a file of a listed tree appended to, then truncated, in place (its directory
/// untouched) made every later read fail ("changed since the dataset was opened") and
/// `index` report the old sizes with rc 0. The next open lists the tree again: reads work,
/// `index` reports the new sizes.
#[test]
fn a_file_changed_in_place_makes_the_tree_be_listed_again() {
    let sb = Sandbox::new();
    let tree = listed_tree(&sb);
    let f = a_file_of(&tree);
    let dir_times = |p: &Path| {
        let m = std::fs::metadata(p.parent().unwrap()).unwrap();
        (
            m.modified().unwrap(),
            std::os::unix::fs::MetadataExt::ctime_nsec(&m),
        )
    };
    let before = dir_times(&f);
    for (size, what) in [(250usize, "appended"), (40, "truncated")] {
        std::fs::write(&f, vec![b'x'; size]).unwrap();
        assert_eq!(dir_times(&f), before, "its directory is untouched");
        for run in 0..2 {
            let o = read(&sb, &tree, &[]);
            assert_ok(&o);
            let err = text(&o.stderr);
            assert!(!err.contains("changed since"), "{what}, run {run}: {err}");
            if run == 0 {
                assert!(err.contains("changed in place"), "{what}: {err}");
            }
        }
        let j = index_json(&sb, &tree);
        assert_eq!(j["records"], 30, "{what}: {j}");
        assert_eq!(j["bytes"], 29 * 100 + size as u64, "{what}: {j}");
    }
}

/// D29: two-pass with its scratch inside the tree (`--scratch TREE`) made the next run
/// list the tree again (the scratch changed the root's times). Riffle's scratch is neither
/// a change nor data: the next run takes the listing as it is, with the same records.
#[test]
fn scratch_inside_a_tree_is_no_change_to_it() {
    let sb = Sandbox::new();
    let tree = listed_tree(&sb);
    let scratch_in =
        |t: &Path| ["--mode", "two-pass", "--scratch", t.to_str().unwrap()].map(String::from);
    for run in 0..3 {
        let args = scratch_in(&tree);
        let o = read(
            &sb,
            &tree,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        assert_ok(&o);
        let err = text(&o.stderr);
        assert!(!err.contains("walked the tree again"), "run {run}: {err}");
        let j: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(j["dataset_records"], 30, "run {run}: {j}");
    }
    // A class directory's hidden file is no change either; a new file is.
    std::fs::write(a_file_of(&tree).with_file_name(".DS_Store"), b"junk").unwrap();
    assert!(!text(&read(&sb, &tree, &[]).stderr).contains("walked the tree again"));
    std::fs::write(a_file_of(&tree).with_file_name("new.bin"), b"a new record").unwrap();
    let o = read(&sb, &tree, &[]);
    assert!(
        text(&o.stderr).contains("walked the tree again"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(index_json(&sb, &tree)["records"], 31);
}

/// D28: `shuffle TREE --format files -o TREE/CLASS/out.tar` put its tar in the tree, and
/// the next run (or any read) took it for a record. Decided: an output inside an input
/// tree is refused before anything is written, naming both; outside the tree it works.
#[test]
fn a_shuffle_output_inside_its_input_tree_is_refused() {
    let sb = Sandbox::new();
    let tree = listed_tree(&sb);
    let class = a_file_of(&tree).parent().unwrap().to_path_buf();
    for out in [class.join("out.tar"), tree.join("out.tar")] {
        for split in [&[][..], &["--split-lines", "10"][..]] {
            let o = sb
                .cmd()
                .arg("shuffle")
                .arg(&tree)
                .args(["--format", "files", "-o"])
                .arg(&out)
                .args(split)
                .output()
                .unwrap();
            assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
            let err = text(&o.stderr);
            assert!(
                err.contains("inside the input tree") && err.contains("out.tar"),
                "{err}"
            );
        }
    }
    let leftovers: Vec<_> = std::fs::read_dir(&class)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains("out.tar"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert_eq!(index_json(&sb, &tree)["records"], 30);
    let o = sb
        .cmd()
        .arg("shuffle")
        .arg(&tree)
        .args(["--format", "files", "-o"])
        .arg(sb.path().join("out.tar"))
        .output()
        .unwrap();
    assert_ok(&o);
}

/// D20: a split rerun removed a user's own `OUT.009`, then failed on a directory
/// `OUT.010` with rc 1 after its new parts were committed. A rerun removes only the parts
/// riffle wrote (and that are still those files), leaves the rest with a notice, rc 0.
#[test]
fn a_split_rerun_removes_only_the_parts_riffle_wrote() {
    let sb = Sandbox::new();
    let data = sb.data();
    let input = data.join("in.txt");
    std::fs::write(
        &input,
        (0..1100).map(|i| format!("{i}\n")).collect::<String>(),
    )
    .unwrap();
    let base = data.join("p.txt");
    let split = |n: &str| {
        sb.cmd()
            .arg("shuffle")
            .arg(&input)
            .arg("-o")
            .arg(&base)
            .args(["--split-lines", n])
            .output()
            .unwrap()
    };
    let part = |n: usize| data.join(format!("p.txt.{n:03}"));
    assert_ok(&split("100"));
    assert!(part(10).is_file() && !part(11).exists());
    // The user's own file where part 9 was, a directory where part 10 was, part 8
    // rewritten since (another size).
    std::fs::remove_file(part(9)).unwrap();
    std::fs::write(part(9), b"mine\n").unwrap();
    std::fs::remove_file(part(10)).unwrap();
    std::fs::create_dir(part(10)).unwrap();
    std::fs::write(part(8), b"edited\n").unwrap();
    let o = split("400");
    assert_ok(&o);
    let err = text(&o.stderr);
    assert!(err.contains("removed 5 parts of an earlier run"), "{err}");
    assert!(err.contains("left 3 file(s)"), "{err}");
    for n in 3..8 {
        assert!(!part(n).exists(), "part {n} of the earlier run is left");
    }
    assert_eq!(std::fs::read(part(9)).unwrap(), b"mine\n");
    assert!(part(10).is_dir());
    assert_eq!(std::fs::read(part(8)).unwrap(), b"edited\n");
    let mut all: Vec<u64> = (0..3)
        .flat_map(|n| {
            text(&std::fs::read(part(n)).unwrap())
                .lines()
                .map(|l| l.parse().unwrap())
                .collect::<Vec<u64>>()
        })
        .collect();
    all.sort();
    assert_eq!(all, (0..1100).collect::<Vec<u64>>());
    // Run again with as many parts: nothing of the earlier run is beyond them.
    let o = split("400");
    assert_ok(&o);
    assert!(!text(&o.stderr).contains("removed"), "{}", text(&o.stderr));
}
