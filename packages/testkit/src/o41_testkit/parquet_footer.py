"""A Parquet footer's integer fields forged in place, for hostile-input tests.

The footer is Thrift's compact protocol, walked here to find each integer field by its path of field ids and
list indices (``(4, 0, 1, 0, 3, 5)``: row group 0, column 0, its metadata's ``num_values``),
then rewritten with the footer's length fixed. Nothing else of the file changes.
"""

from __future__ import annotations

import struct


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at ``at`` and where it ends."""
    shift = result = 0
    while True:
        b = data[at]
        at += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, at
        shift += 7


def _enc_varint(v: int) -> bytes:
    """An unsigned LEB128 varint."""
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _zigzag(v: int) -> int:
    """Thrift's zigzag encoding of a signed integer."""
    return (v << 1) ^ (v >> 63)


def _walk(
    data: bytes, at: int, path: tuple[object, ...], found: dict[tuple[object, ...], tuple[int, int]]
) -> int:
    """Walks the struct at ``at``, recording its integer fields by path; returns where it ends."""
    last = 0
    while True:
        head = data[at]
        at += 1
        if head == 0:
            return at
        kind = head & 0x0F
        delta = head >> 4
        if delta:
            fid = last + delta
        else:
            raw, at = _varint(data, at)
            fid = (raw >> 1) ^ -(raw & 1)
        last = fid
        at = _value(data, at, kind, (*path, fid), found)


def _value(
    data: bytes,
    at: int,
    kind: int,
    path: tuple[object, ...],
    found: dict[tuple[object, ...], tuple[int, int]],
) -> int:
    """Walks one value of Thrift compact type ``kind``."""
    if kind in (1, 2):  # bool true/false in a field header
        return at
    if kind == 3:  # byte
        return at + 1
    if kind in (4, 5, 6):  # i16 i32 i64
        start = at
        _, at = _varint(data, at)
        found[path] = (start, at)
        return at
    if kind == 7:  # double
        return at + 8
    if kind == 8:  # binary
        n, at = _varint(data, at)
        return at + n
    if kind in (9, 10):  # list, set
        head = data[at]
        at += 1
        n = head >> 4
        elem = head & 0x0F
        if n == 15:
            n, at = _varint(data, at)
        for k in range(n):
            if elem in (1, 2):
                at += 1
            else:
                at = _value(data, at, elem, (*path, k), found)
        return at
    if kind == 11:  # map
        n, at = _varint(data, at)
        if n == 0:
            return at
        kinds = data[at]
        at += 1
        for k in range(n):
            at = _value(data, at, kinds >> 4, (*path, k, "key"), found)
            at = _value(data, at, kinds & 0x0F, (*path, k, "value"), found)
        return at
    if kind == 12:
        return _walk(data, at, path, found)
    raise ValueError(f"kind {kind}")


def patch_integers(file_bytes: bytes, edits: dict[tuple[object, ...], int]) -> bytes:
    """``file_bytes`` with the footer's integer fields at the ``edits`` paths set to new values."""
    assert file_bytes[-4:] == b"PAR1"
    (length,) = struct.unpack("<I", file_bytes[-8:-4])
    footer_at = len(file_bytes) - 8 - length
    footer = file_bytes[footer_at:-8]
    found: dict[tuple[object, ...], tuple[int, int]] = {}
    _walk(footer, 0, (), found)
    pieces: list[bytes] = []
    at = 0
    for path, new in sorted(edits.items(), key=lambda e: found[e[0]][0]):
        start, end = found[path]
        pieces.append(footer[at:start])
        pieces.append(_enc_varint(_zigzag(new)))
        at = end
    pieces.append(footer[at:])
    patched = b"".join(pieces)
    return file_bytes[:footer_at] + patched + struct.pack("<I", len(patched)) + b"PAR1"


def integer_paths(file_bytes: bytes) -> dict[tuple[object, ...], tuple[int, int]]:
    """Every integer field of the footer: its path, and where its bytes are in the footer."""
    (length,) = struct.unpack("<I", file_bytes[-8:-4])
    footer = file_bytes[len(file_bytes) - 8 - length : -8]
    found: dict[tuple[object, ...], tuple[int, int]] = {}
    _walk(footer, 0, (), found)
    return found
