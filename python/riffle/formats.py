"""Decoding records of the formats riffle reads in place, without copies.

- `tar_members(record)`: a WebDataset sample (a `tar` dataset's record: the sample's bytes
  in its shard, headers included) as `{suffix: memoryview}`, e.g. `{"jpg": ..., "cls":
  ...}`, in member order.
"""

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
