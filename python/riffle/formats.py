"""Decoding records of the formats riffle reads in place, without copies.

- `tar_members(record)`: a WebDataset sample (a `tar` dataset's record: the sample's bytes
  in its shard, headers included) as `{suffix: memoryview}`, e.g. `{"jpg": ..., "cls":
  ...}`, in member order.
- `mds_sample(record, columns)`: a MosaicML Streaming MDS sample (an `mds` dataset's
  record) as `{column: value}`, decoded as MDS's plain encodings are: `bytes` and the image
  encodings (`jpeg`, `png`, `pil`, lists of them) as memoryviews of the raw bytes, `str`,
  `int`, the numpy scalars (`uint8` ... `float64`), `str_int`, `str_float`, `str_decimal`,
  `json`, and `ndarray` (static or dynamic dtype and shape) as a numpy array viewing the
  record. `pkl` is never unpickled (it would run code from the file): its bytes are given.
"""

import json as _json
from decimal import Decimal as _Decimal

import numpy as _np

_BLOCK = 512


def _octal(field):
    if field[0] & 0x80:  # GNU base-256 (sizes past 8 GiB)
        v = field[0] & 0x7F
        for b in field[1:]:
            v = v * 256 + b
        return v
    s = bytes(field).split(b"\0", 1)[0].strip()
    return int(s, 8) if s else 0


def _cstr(b):
    return bytes(b).split(b"\0", 1)[0]


def _pax_path(data):
    rest = bytes(data)
    while rest:
        sp = rest.find(b" ")
        if sp <= 0:
            return None
        n = int(rest[:sp])
        rec = rest[sp + 1 : n].rstrip(b"\n")
        if rec.startswith(b"path="):
            return rec[5:].decode("utf-8", "replace")
        rest = rest[n:]
    return None


def tar_members(record):
    """`{suffix: memoryview}` of a tar sample's regular members (the name after the first
    dot of the last path component, as WebDataset keys them). Views of `record`: valid as
    long as it is. Raises ValueError on a bad header, naming its offset in the record."""
    mv = memoryview(record).cast("B")
    out = {}
    at, long = 0, None
    while at + _BLOCK <= len(mv):
        h = mv[at : at + _BLOCK]
        if not any(h):
            break
        stored = _octal(h[148:156])
        if sum(h) - sum(h[148:156]) + 8 * 32 != stored:
            raise ValueError(f"bad tar header checksum at byte {at} of the sample")
        size = _octal(h[124:136])
        kind = h[156]
        data = at + _BLOCK
        if data + size > len(mv):
            raise ValueError(f"a member at byte {at} runs past the sample's end")
        if kind == ord("L"):
            long = _cstr(mv[data : data + size]).decode("utf-8", "replace")
        elif kind == ord("x"):
            long = _pax_path(mv[data : data + size]) or long
        elif kind in (0, ord("0"), ord("7")):
            if long is not None:
                name, long = long, None
            else:
                name = _cstr(h[:100]).decode("utf-8", "replace")
                if bytes(h[257:262]) == b"ustar" and h[345]:
                    name = _cstr(h[345:500]).decode("utf-8", "replace") + "/" + name
            base = name.rfind("/") + 1
            dot = name.find(".", base)
            if dot > base:
                out[name[dot + 1 :]] = mv[data : data + size]
        else:
            long = None
        at = data + (size + _BLOCK - 1) // _BLOCK * _BLOCK
    return out


_MDS_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32",
               33: "int32", 34: "float32", 64: "uint64", 65: "int64", 66: "float64"}
_MDS_SCALARS = {"uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
                "float16", "float32", "float64"}


def _ndarray(enc, mv):
    args = enc.split(":")[1:]
    dtype = args[0] if args else None
    shape = tuple(int(x) for x in args[1].split(",")) if len(args) > 1 else None
    at = 0
    if dtype is None:
        dtype = _MDS_DTYPES[mv[0]]
        at = 1
    if shape is None:
        byte = mv[at]
        at += 1
        ndim, sdt = byte >> 2, ("uint8", "uint16", "uint32", "uint64")[byte & 3]
        n = ndim * (1 << (byte & 3))
        shape = tuple(int(x) for x in _np.frombuffer(mv[at : at + n], sdt))
        at += n
    return _np.frombuffer(mv[at:], dtype).reshape(shape)


def _mds_decode(enc, mv):
    name = enc.split(":")[0]
    if name == "ndarray":
        return _ndarray(enc, mv)
    if name in _MDS_SCALARS:
        return _np.frombuffer(mv, name)[0]
    if name == "int":
        return int(_np.frombuffer(mv, "<i8")[0])
    if name == "str":
        return bytes(mv).decode("utf-8")
    if name == "str_int":
        return int(bytes(mv).decode("utf-8"))
    if name == "str_float":
        return float(bytes(mv).decode("utf-8"))
    if name == "str_decimal":
        return _Decimal(bytes(mv).decode("utf-8"))
    if name == "json":
        return _json.loads(bytes(mv).decode("utf-8"))
    # bytes, jpeg, png, pil, list[...], jpeg_array, pkl: the raw bytes, not decoded here.
    return mv


def mds_sample(record, columns):
    """`{column: value}` of an MDS sample (`columns`: the stream's `opened["columns"]`,
    dicts of name, encoding and size, in the sample's order)."""
    mv = memoryview(record).cast("B")
    sizes, at = [], 0
    for c in columns:
        if c.get("size") is not None:
            sizes.append(int(c["size"]))
        else:
            sizes.append(int.from_bytes(mv[at : at + 4], "little"))
            at += 4
    out = {}
    for c, n in zip(columns, sizes):
        if at + n > len(mv):
            raise ValueError(f"column {c['name']} runs past the sample's end ({at + n} > {len(mv)})")
        out[c["name"]] = _mds_decode(c["encoding"], mv[at : at + n])
        at += n
    return out
