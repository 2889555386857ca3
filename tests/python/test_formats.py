"""Records read back through the engine (`riffle cat`) equal what independent readers
return: numpy's np.load for .npy, and a TFRecord reader written here from the format's
definition (it checks both masked CRC32Cs itself)."""

import os
import pathlib
import struct
import subprocess

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RIFFLE = os.environ.get("RIFFLE_BIN", str(ROOT / "target" / "debug" / "riffle"))


def run(*args, check=True):
    p = subprocess.run([RIFFLE, *map(str, args)], capture_output=True)
    if check and p.returncode != 0:
        raise AssertionError(f"riffle {args} failed ({p.returncode}): {p.stderr.decode()}")
    return p


def cat(*args):
    """All records of a dataset, through `riffle cat --framed`."""
    out = run("cat", "--framed", *args).stdout
    records, i = [], 0
    while i < len(out):
        (n,) = struct.unpack_from("<Q", out, i)
        records.append(out[i + 8 : i + 8 + n])
        i += 8 + n
    return records


# CRC32C (Castagnoli), reflected polynomial 0x82F63B78, table driven.
_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked(data: bytes) -> int:
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def read_tfrecords(path):
    data = pathlib.Path(path).read_bytes()
    out, i = [], 0
    while i < len(data):
        header = data[i : i + 8]
        (n,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack_from("<I", data, i + 8)
        assert masked(header) == len_crc, f"length CRC at {i}"
        payload = data[i + 12 : i + 12 + n]
        (data_crc,) = struct.unpack_from("<I", data, i + 12 + n)
        assert masked(payload) == data_crc, f"data CRC at {i}"
        out.append(payload)
        i += 16 + n
    return out


def write_tfrecords(path, records):
    with open(path, "wb") as f:
        for r in records:
            header = struct.pack("<Q", len(r))
            f.write(header + struct.pack("<I", masked(header)) + r + struct.pack("<I", masked(r)))


def test_crc32c_check_value():
    assert crc32c(b"123456789") == 0xE3069283


ARRAYS = {
    "float32_2d": lambda rng: rng.standard_normal((1000, 7)).astype(np.float32),
    "int64_1d": lambda rng: rng.integers(-(2**40), 2**40, size=513),
    "uint8_3d": lambda rng: rng.integers(0, 255, size=(100, 3, 4), dtype=np.uint8),
    "big_endian": lambda rng: rng.standard_normal((64, 5)).astype(">f8"),
    "structured": lambda rng: np.array(
        [(i, i * 0.5, (i, i + 1, i + 2)) for i in range(300)],
        dtype=[("a", "<i4"), ("b", "<f8"), ("c", "<i2", (3,))],
    ),
    "unicode": lambda rng: np.array([f"row{i}" for i in range(50)], dtype="<U7"),
}


@pytest.mark.parametrize("name", sorted(ARRAYS))
@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_records_equal_np_load(tmp_path, name, version):
    arr = ARRAYS[name](np.random.default_rng(0))
    path = tmp_path / f"{name}.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array(f, arr, version=version)
    loaded = np.load(path)
    records = cat(path)
    assert len(records) == loaded.shape[0]
    for i, rec in enumerate(records):
        assert rec == loaded[i : i + 1].tobytes(), f"row {i}"


def test_npy_selected_ids_in_the_order_asked(tmp_path):
    arr = np.arange(10_000 * 3, dtype=np.int32).reshape(10_000, 3)
    path = tmp_path / "a.npy"
    np.save(path, arr)
    ids = [9999, 0, 4242, 17, 17]
    records = cat(path, "--ids", ",".join(map(str, ids)))
    assert records == [arr[i].tobytes() for i in ids]


def test_fortran_and_object_arrays_are_refused(tmp_path):
    f = tmp_path / "f.npy"
    np.save(f, np.asfortranarray(np.zeros((4, 3), dtype=np.float32)))
    p = run("index", f, check=False)
    assert p.returncode == 1 and b"Fortran" in p.stderr and b"f.npy" in p.stderr
    o = tmp_path / "o.npy"
    np.save(o, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    p = run("index", o, check=False)
    assert p.returncode == 1 and b"object dtype" in p.stderr


def test_generated_tfrecords_equal_an_independent_reader(tmp_path):
    path = tmp_path / "g.tfrecord"
    run("gen", path, "--format", "tfrecord", "--records", 3000, "--record-size", 120, "--size-jitter", "0.8")
    ours = cat(path)
    theirs = read_tfrecords(path)
    assert ours == theirs
    ids = [struct.unpack_from("<Q", r)[0] for r in ours]
    assert ids == list(range(3000))


def test_foreign_tfrecords_are_read_exactly(tmp_path):
    rng = np.random.default_rng(1)
    records = [rng.bytes(int(n)) for n in rng.integers(0, 5000, size=400)]
    records[7] = b""
    path = tmp_path / "w.tfrecord"
    write_tfrecords(path, records)
    assert cat(path) == records


def _imagefolder_reference(root):
    """(path, class index) of every sample as torchvision's ImageFolder lists them, or, where
    torchvision is not installed, as its documented rule does (classes: the sorted
    first-level directories; samples: class by class, os.walk sorted, names sorted)."""
    try:
        from torchvision.datasets import ImageFolder
    except Exception as e:  # not installed, or built for another torch
        print(f"torchvision cannot be imported ({e!r}): checking against ImageFolder's rule "
              "written here")
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        out = []
        for i, c in enumerate(classes):
            for d, _, names in sorted(os.walk(os.path.join(root, c), followlinks=True)):
                out.extend((os.path.join(d, n), i) for n in sorted(names))
        return out
    # Every file counts as a sample (riffle reads any file; ImageFolder filters by extension).
    return ImageFolder(str(root), loader=lambda p: p, is_valid_file=lambda p: True,
                       allow_empty=True).samples


def test_an_imagefolder_tree_reads_back_as_imagefolder_lists_it(tmp_path):
    """An ImageFolder tree of PNGs written with Pillow (nested directories, classes of
    different sizes, a loose file at the root that belongs to no class): riffle reads every
    file once, byte for byte, with ImageFolder's label, through `riffle cat`, `riffle read
    --ids-out --labels` and the daemon's `batch.labels`."""
    Image = pytest.importorskip("PIL.Image", reason="Pillow is not installed; no images to write")
    rng = np.random.default_rng(3)
    root = tmp_path / "tree"
    layout = {"zebra": 7, "ant": 5, "mole/deep": 4, "mole": 3, "bee": 0}
    for d, n in layout.items():
        (root / d).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            px = rng.integers(0, 255, (8 + i, 10, 3), dtype=np.uint8)
            Image.fromarray(px).save(root / d / f"img{i:02d}.png")
    (root / "README.txt").write_text("not a sample")
    want = _imagefolder_reference(root)
    assert len(want) == 19
    # riffle cat: records in ImageFolder's order, each file's bytes.
    got = cat(root, "--format", "files")
    assert got == [pathlib.Path(p).read_bytes() for p, _ in want]
    # riffle read: every record once, with ImageFolder's labels, in both modes.
    for mode in ["lirs", "two-pass"]:
        ids_out = tmp_path / f"ids-{mode}.txt"
        run("read", root, "--format", "files", "--batch-size", "4", "--mode", mode,
            "--ids-out", ids_out, "--labels")
        pairs = [tuple(map(int, t.split(":"))) for line in ids_out.read_text().split() for t in [line]]
        assert sorted(i for i, _ in pairs) == list(range(len(want)))
        assert all(label == want[i][1] for i, label in pairs), mode
    # The daemon: batch.labels, and each record's bytes.
    from test_serve import Daemon
    import riffle
    d = Daemon({"train": f"{root}:files"})
    try:
        seen = {}
        with riffle.Client(d.socket) as c:
            for b in c.stream("train", 5, seed=2):
                assert b.labels is not None and len(b.labels) == len(b.ids)
                for i, rid in enumerate(b.ids):
                    seen[int(rid)] = (int(b.labels[i]), b.record(i).tobytes())
        assert sorted(seen) == list(range(len(want)))
        for rid, (label, data) in seen.items():
            assert label == want[rid][1] and data == pathlib.Path(want[rid][0]).read_bytes()
    finally:
        d.stop()


def _write_shards(out, samples):
    """WebDataset shards of `samples` ({"__key__", suffix: bytes}) written by WebDataset's
    own ShardWriter, or, where webdataset is not installed, by Python's tarfile (which
    ShardWriter uses underneath) in the same layout. Returns the writer's name."""
    try:
        import webdataset as wds
    except ImportError:
        import io
        import tarfile
        print("webdataset is not installed: shards written with tarfile in its layout")
        for s in range(0, len(samples), 7):
            with tarfile.open(out / f"shard-{s // 7:06d}.tar", "w") as t:
                for smp in samples[s : s + 7]:
                    for suffix, data in smp.items():
                        if suffix == "__key__":
                            continue
                        info = tarfile.TarInfo(f"{smp['__key__']}.{suffix}")
                        info.size = len(data)
                        t.addfile(info, io.BytesIO(data))
        return "tarfile"
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxcount=7, verbose=0) as w:
        for smp in samples:
            w.write(smp)
    return "webdataset"


def _read_shards(out):
    """Every sample of the shards as {"__key__": key, suffix: bytes}: WebDataset's own
    reader where installed, else tarfile grouping consecutive members by key."""
    shards = sorted(str(p) for p in out.glob("shard-*.tar"))
    try:
        import webdataset as wds
    except ImportError:
        import tarfile
        got = []
        for sh in shards:
            with tarfile.open(sh) as t:
                for m in t.getmembers():
                    base = m.name.rfind("/") + 1
                    dot = m.name.find(".", base)
                    key, suffix = m.name[:dot], m.name[dot + 1 :]
                    if not got or got[-1]["__key__"] != key:
                        got.append({"__key__": key})
                    got[-1][suffix] = t.extractfile(m).read()
        return got
    ds = wds.WebDataset(shards, shardshuffle=False, empty_check=False)
    return [{k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"} for s in ds]


def test_webdataset_shards_read_back_as_webdataset_reads_them(tmp_path):
    """Shards written by WebDataset's ShardWriter (several shards; jpg, cls and json
    members; keys past tar's 100-byte name field, which take PAX headers): riffle reads
    every sample once, each member byte for byte what WebDataset reads, through `riffle
    cat` (records are the samples' tar bytes) and the daemon's `batch.sample(i)`."""
    import riffle
    from test_serve import Daemon
    rng = np.random.default_rng(5)
    samples = []
    for i in range(40):
        key = f"s{i:04d}" if i % 9 else f"{'long-directory-name/' * 6}s{i:04d}"
        samples.append({"__key__": key, "jpg": rng.bytes(int(rng.integers(1, 3000))),
                        "cls": str(i % 4).encode(), "json": f'{{"i": {i}}}'.encode()})
    out = tmp_path / "shards"
    out.mkdir()
    writer = _write_shards(out, samples)
    want = _read_shards(out)
    assert len(want) == 40, writer
    # riffle cat: each record is one sample; its members are what WebDataset read.
    recs = cat(out)
    assert len(recs) == 40
    for r, w in zip(recs, want):
        got = {k: bytes(v) for k, v in riffle.tar_members(r).items()}
        assert got == {k: v for k, v in w.items() if k != "__key__"}
    # Through the daemon: shuffled, every sample once, members as views.
    d = Daemon({"train": str(out)})
    try:
        seen = {}
        with riffle.Client(d.socket) as c:
            for b in c.stream("train", 6, seed=3):
                for i, rid in enumerate(b.ids):
                    m = b.sample(i)
                    assert isinstance(m["jpg"], memoryview)
                    seen[int(rid)] = {k: bytes(v) for k, v in m.items()}
        assert sorted(seen) == list(range(40))
        for rid, m in seen.items():
            assert m == {k: v for k, v in want[rid].items() if k != "__key__"}
    finally:
        d.stop()


def test_bad_tar_shards_are_refused_with_file_and_offset(tmp_path):
    """A gzip-compressed shard is refused by name; a corrupt header by file and offset."""
    import gzip
    import tarfile
    import io
    good = tmp_path / "a.tar"
    with tarfile.open(good, "w") as t:
        for n in ["x.jpg", "x.cls", "y.jpg"]:
            info = tarfile.TarInfo(n)
            info.size = 600
            t.addfile(info, io.BytesIO(b"z" * 600))
    gz = tmp_path / "a.tar.gz"
    gz.write_bytes(gzip.compress(good.read_bytes()))
    p = run("cat", gz, check=False)
    assert p.returncode != 0 and b"gzip" in p.stderr and b"a.tar.gz" in p.stderr, p.stderr
    bad = tmp_path / "bad" / "b.tar"
    bad.parent.mkdir()
    raw = bytearray(good.read_bytes())
    raw[1536 + 2] ^= 0x20  # the second member's header (after x.jpg's 512 + 1024)
    bad.write_bytes(bytes(raw))
    p = run("cat", bad, check=False)
    assert p.returncode != 0 and b"b.tar" in p.stderr and b"1536" in p.stderr, p.stderr


_MDS_COLUMNS = {"img": "bytes", "caption": "str", "n": "int", "emb": "ndarray:float32:4",
                "tokens": "ndarray", "u": "uint16", "f": "float64", "meta": "json"}


def _mds_samples(n):
    rng = np.random.default_rng(9)
    return [{"img": rng.bytes(int(rng.integers(1, 900))), "caption": "é" * (i % 5) + str(i), "n": i - 7,
             "emb": rng.random(4, dtype=np.float32), "tokens": rng.integers(0, 9, (i % 3 + 1, 2)).astype(np.int16),
             "u": i % 60000, "f": i / 3, "meta": {"i": i, "tags": ["a"] * (i % 2)}} for i in range(n)]


def _write_mds(out, samples):
    """An MDS dataset of `samples` by MosaicML Streaming's own MDSWriter (several shards),
    or, where mosaicml-streaming is not installed, by the stand-in below (its published
    layout, plain columns only). Returns a reader: sample i as MDS decodes it."""
    try:
        from streaming import MDSWriter
        from streaming.base.format.mds.reader import MDSReader
    except ImportError:
        print("mosaicml-streaming is not installed: the MDS stand-in writer is used")
        return _standin_mds(out, samples)
    import json
    with MDSWriter(out=str(out), columns=_MDS_COLUMNS, size_limit=1 << 14) as w:
        for s in samples:
            w.write(s)
    shards = json.load(open(out / "index.json"))["shards"]
    readers = [MDSReader.from_json(str(out), None, sh) for sh in shards]
    flat = [(r, j) for r in readers for j in range(r.samples)]
    return lambda i: flat[i][0].get_item(flat[i][1])


def _standin_mds(out, samples):
    import json
    names = sorted(_MDS_COLUMNS)
    enc = lambda k, v: {"bytes": lambda: v, "str": lambda: v.encode(), "int": lambda: np.int64(v).tobytes(),
                        "uint16": lambda: np.uint16(v).tobytes(), "float64": lambda: np.float64(v).tobytes(),
                        "json": lambda: json.dumps(v).encode(), "ndarray:float32:4": lambda: v.tobytes(),
                        "ndarray": lambda: bytes([17, (v.ndim << 2)]) + np.array(v.shape, np.uint8).tobytes() + v.tobytes(),
                        }[_MDS_COLUMNS[k]]()
    sizes = [{"emb": 16, "n": 8, "u": 2, "f": 8}.get(k) for k in names]
    blobs = []
    for s in samples:
        parts = [enc(k, s[k]) for k in names]
        head = b"".join(np.uint32(len(p)).tobytes() for p, z in zip(parts, sizes) if z is None)
        blobs.append(head + b"".join(parts))
    cfg = {"column_encodings": [_MDS_COLUMNS[k] for k in names], "column_names": names, "column_sizes": sizes,
           "compression": None, "format": "mds", "hashes": [], "size_limit": None, "version": 2}
    body = json.dumps(cfg).encode()
    at = 4 + 4 * (len(blobs) + 1) + len(body)
    offs = [at]
    for b in blobs:
        offs.append(offs[-1] + len(b))
    (out / "shard.00000.mds").write_bytes(np.uint32(len(blobs)).tobytes() + np.array(offs, np.uint32).tobytes()
                                          + body + b"".join(blobs))
    shard = dict(cfg, raw_data={"basename": "shard.00000.mds", "bytes": offs[-1], "hashes": {}},
                 samples=len(blobs), zip_data=None)
    (out / "index.json").write_text(json.dumps({"shards": [shard], "version": 2}))
    return lambda i: samples[i]


def _same(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b)) and np.asarray(a).dtype == np.asarray(b).dtype
    if isinstance(a, memoryview):
        a = bytes(a)
    return a == b


def test_mds_datasets_read_back_as_mosaic_streaming_reads_them(tmp_path):
    """An MDS dataset written by MosaicML Streaming's MDSWriter (several uncompressed
    shards; bytes, str, int, static and dynamic ndarray, scalar and json columns): riffle
    reads every sample once, and each column decodes to what MDS's own reader gives, from
    `riffle cat` and from the daemon's `batch.sample(i)`; a compressed dataset is refused
    naming the compression."""
    import json
    import riffle
    from test_serve import Daemon
    samples = _mds_samples(60)
    out = tmp_path / "mds"
    out.mkdir()
    ref = _write_mds(out, samples)
    columns = None
    d = Daemon({"train": str(out)})
    try:
        seen = set()
        with riffle.Client(d.socket) as c:
            s = c.stream("train", 7, seed=4)
            for b in s:
                columns = s.opened["columns"]
                for i, rid in enumerate(b.ids):
                    got, want = b.sample(i), ref(int(rid))
                    assert set(got) == set(want)
                    assert all(_same(got[k], want[k]) for k in want), (rid, got, want)
                    seen.add(int(rid))
        assert seen == set(range(60))
    finally:
        d.stop()
    recs = cat(out)
    assert len(recs) == 60
    assert all(_same(riffle.mds_sample(r, columns)["img"], ref(i)["img"]) for i, r in enumerate(recs))
    # A compressed dataset cannot be read in place: refused, naming the compression.
    index = json.loads((out / "index.json").read_text())
    index["shards"][-1]["compression"] = "zstd"
    (out / "index.json").write_text(json.dumps(index))
    p = run("cat", out, check=False)
    assert p.returncode != 0 and b"zstd" in p.stderr and b"index.json" in p.stderr, p.stderr


def test_symlinked_class_directories_list_as_imagefolder_lists_them(tmp_path):
    """Issue 30 D18: class directories that are links to one directory were deduplicated (7
    records where ImageFolder gives 10, later labels shifted). Links inside the tree are
    followed as ImageFolder follows them; a link out of the tree is the one documented
    difference (docs/trees.md): ImageFolder reads it, riffle leaves it out."""
    root = tmp_path / "tree"
    for c, n in [("a", 3), ("c", 4)]:
        (root / c).mkdir(parents=True)
        for i in range(n):
            (root / c / f"{i}.bin").write_bytes(f"{c}{i}".encode())
    (root / "b").symlink_to("a")
    (root / "c" / "9.bin").symlink_to("../a/0.bin")
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"outside")
    (root / "c" / "out.bin").symlink_to(secret)
    want = [(p, label) for p, label in _imagefolder_reference(root)
            if os.path.realpath(p).startswith(str(root.resolve()) + os.sep)]
    assert len(want) == 11, want
    assert [label for _, label in want] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2]
    got = cat(root, "--format", "files")
    assert got == [pathlib.Path(p).read_bytes() for p, _ in want]
    ids_out = tmp_path / "ids.txt"
    run("read", root, "--format", "files", "--batch-size", "4", "--ids-out", ids_out,
        "--labels")
    pairs = [tuple(map(int, t.split(":"))) for t in ids_out.read_text().split()]
    assert sorted(i for i, _ in pairs) == list(range(len(want)))
    assert all(label == want[i][1] for i, label in pairs)
