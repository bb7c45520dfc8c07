"""The seekable jsonl.gz layout (docs/formats.md): what the dataset saver writes is plain gzip to
every other reader, and the engine reads any row by decompressing only the member holding it.

The layout is parsed and written here from its documentation alone, independently of the engine,
so these tests also check that the documentation is enough to produce it.
"""

from __future__ import annotations

import gzip
import json
import shutil
import struct
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from o41_testkit import collect, config_for, rows_of
from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    FileSource,
    MalformedShardError,
    ProjectedField,
    Stage,
    TrainingData,
    iter_shard,
    open_batch_stream,
    resume_batch_stream,
)
from test_hostile import in_child, stream_call

V = ProjectedField("v", "v", "i64")
TOKENS = ProjectedField("t", "tokens", "i32", length=3)
MEMBER_HEADER = bytes([0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 0xFF])
INDEX_HEADER = bytes([0x1F, 0x8B, 8, 4, 0, 0, 0, 0, 0, 0xFF])
EMPTY_BODY = bytes([3, 0]) + bytes(8)


def records(n: int) -> list[dict[str, Any]]:
    return [{"v": i, "tokens": [i, i + 1, i + 2], "text": f"row {i}", "ok": i % 3 == 0} for i in range(n)]


# -- the layout, from docs/formats.md ----------------------------------------------------------


@dataclass(frozen=True)
class Member:
    offset: int
    compressed: int
    size: int
    rows: int


def varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def parse_layout(data: bytes) -> tuple[int, list[Member]]:
    """The longest line and the members of a seekable shard, read from its last bytes."""
    locator, body = data[-18:-10], data[-10:]
    assert body == EMPTY_BODY
    assert locator[:4] == b"oL\x04\x00"
    (total,) = struct.unpack("<I", locator[4:])
    member = data[-total:]
    assert member[:10] == INDEX_HEADER
    (xlen,) = struct.unpack("<H", member[10:12])
    assert 12 + xlen + 10 == total
    extra = member[12 : 12 + xlen]
    assert extra[:2] == b"oI"
    (length,) = struct.unpack("<H", extra[2:4])
    index = extra[4 : 4 + length]
    assert extra[4 + length :] == locator  # the locator is the last subfield
    assert index[0] == 1  # version
    longest, at = read_varint(index, 1)
    count, at = read_varint(index, at)
    members, offset = [], 0
    for _ in range(count):
        compressed, at = read_varint(index, at)
        size, at = read_varint(index, at)
        rows, at = read_varint(index, at)
        members.append(Member(offset, compressed, size, rows))
        offset += compressed
    assert at == len(index)
    assert offset == len(data) - total
    return longest, members


def gzip_member(lines: bytes) -> bytes:
    """One data member as the layout writes it: fixed header, raw deflate, CRC-32, ISIZE."""
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
    body = deflate.compress(lines) + deflate.flush()
    return MEMBER_HEADER + body + struct.pack("<II", zlib.crc32(lines), len(lines) & 0xFFFFFFFF)


def index_member(entries: list[tuple[int, int, int]], longest: int) -> bytes:
    """The final empty member carrying (compressed, size, lines) per member."""
    data = bytes([1]) + varint(longest) + varint(len(entries))
    for entry in entries:
        data += b"".join(varint(v) for v in entry)
    return index_member_of(data)


def index_member_of(data: bytes) -> bytes:
    """The final empty member around index data."""
    xlen = 4 + len(data) + 8
    total = 10 + 2 + xlen + 10
    return (
        INDEX_HEADER
        + struct.pack("<H", xlen)
        + b"oI"
        + struct.pack("<H", len(data))
        + data
        + b"oL\x04\x00"
        + struct.pack("<I", total)
        + EMPTY_BODY
    )


def write_layout(path: Path, members: list[list[bytes]], rows: list[int] | None = None) -> Path:
    """Writes lines grouped in ``members`` in the seekable layout; ``rows`` overrides the counts
    the index gives (to make it lie)."""
    out, entries, longest = b"", [], 0
    for k, lines in enumerate(members):
        text = b"".join(lines)
        member = gzip_member(text)
        entries.append((len(member), len(text), len(lines) if rows is None else rows[k]))
        longest = max([longest, *map(len, lines)])
        out += member
    path.write_bytes(out + index_member(entries, longest))
    return path


def lines_of(recs: list[dict[str, Any]]) -> list[bytes]:
    return [(json.dumps(r) + "\n").encode() for r in recs]


def zlib_members(data: bytes) -> bytes:
    """Decompresses member after member with zlib alone, as C readers of concatenated gzip do."""
    out = b""
    while data:
        member = zlib.decompressobj(31)
        out += member.decompress(data)
        assert member.eof
        data = member.unused_data
    return out


# -- what the saver writes -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A jsonl.gz shard of 5,000 records written by the dataset saver."""
    root = tmp_path_factory.mktemp("saved")
    saver = TrainingData().dataset_saver(root / "data-manifest-v1.json", data_format="jsonl.gz")
    shard = saver.save("train", None, records(5000), shard_id="0")
    saver.commit_manifest()
    return root / shard.location


def test_the_saver_writes_plain_gzip_lines_for_any_reader(saved: Path) -> None:
    expected = records(5000)
    gunzip = shutil.which("gzip")
    assert gunzip is not None
    out = subprocess.run([gunzip, "-dc", str(saved)], check=True, capture_output=True).stdout
    assert [json.loads(line) for line in out.splitlines()] == expected
    with gzip.open(saved, "rb") as f:
        assert [json.loads(line) for line in f] == expected
    assert [json.loads(line) for line in zlib_members(saved.read_bytes()).splitlines()] == expected
    assert list(iter_shard("jsonl.gz", str(saved))) == expected


def test_the_saved_shard_has_a_member_index_that_tiles_it(saved: Path) -> None:
    data = saved.read_bytes()
    longest, members = parse_layout(data)
    assert len(members) > 1
    assert sum(m.rows for m in members) == 5000
    assert all(m.rows <= 1024 for m in members)
    assert longest == max(len(line) for line in gzip.decompress(data).splitlines(keepends=True))
    first = 0
    for m in members:
        piece = data[m.offset : m.offset + m.compressed]
        assert piece[:10] == MEMBER_HEADER  # no mtime, no name: the same records, the same bytes
        text = gzip.decompress(piece)
        assert len(text) == m.size
        assert [json.loads(line)["v"] for line in text.splitlines()] == list(range(first, first + m.rows))
        first += m.rows


def test_the_same_records_give_the_same_bytes(saved: Path, tmp_path: Path) -> None:
    saver = TrainingData().dataset_saver(tmp_path / "data-manifest-v1.json", data_format="jsonl.gz")
    again = saver.save("train", None, records(5000), shard_id="0")
    assert (tmp_path / again.location).read_bytes() == saved.read_bytes()


def test_a_stream_of_the_saved_shard_reads_every_row(saved: Path) -> None:
    batches = collect(config_for([FileSource(files=[str(saved)])], [V, TOKENS], batch_size=50, threads=2))
    assert rows_of(batches, "v").tolist() == list(range(5000))
    assert rows_of(batches, "t")[4321].tolist() == [4321, 4322, 4323]


# -- seeking decompresses one member ---------------------------------------------------------------


def corrupt(data: bytearray, member: Member) -> None:
    """Flips the deflate bytes in the middle of ``member`` (its header stays a gzip header)."""
    for at in range(member.offset + 20, member.offset + member.compressed - 20):
        data[at] ^= 0x5A


def resume_at_row(path: Path, row: int, batch_size: int) -> Checkpoint:
    """A checkpoint whose next batch starts at ``row`` of the single-shard stage."""
    config = BatchStreamConfig(
        fields=[V], stages=[Stage(sources=[FileSource(files=[str(path)])], batch_size=batch_size)], threads=1
    )
    with open_batch_stream(config) as stream:
        document = json.loads(stream.checkpoint().to_json())
    document["cursor"]["next_batch"] = row // batch_size
    document["batches_yielded"] = row // batch_size
    document["rows_yielded"] = row
    return Checkpoint.from_json(json.dumps(document))


def test_a_resume_reads_only_the_member_holding_its_row(saved: Path, tmp_path: Path) -> None:
    data = bytearray(saved.read_bytes())
    _, members = parse_layout(bytes(data))
    assert len(members) >= 4
    for member in members[1::2]:  # every other member; the first stays, for the check at open
        corrupt(data, member)
    path = tmp_path / "every-other-member-corrupt.jsonl.gz"
    path.write_bytes(bytes(data))
    with pytest.raises((zlib.error, OSError, EOFError)):
        gzip.decompress(bytes(data))  # a plain reader cannot get past member 1

    # Rows of member 2 read, though members 1 and 3 around them are damaged.
    start = members[0].rows + members[1].rows
    with resume_batch_stream(resume_at_row(path, start, batch_size=members[2].rows)) as stream:
        batch = next(stream)
        assert batch.arrays()["v"].tolist() == list(range(start, start + members[2].rows))

    # Rows of member 1 fail closed, naming the shard and a row of that member.
    first = members[0].rows
    checkpoint = resume_at_row(path, first, batch_size=members[1].rows)
    with (
        pytest.raises(MalformedShardError, match=path.name) as caught,
        resume_batch_stream(checkpoint) as stream,
    ):
        next(stream)
    assert caught.value.row is not None
    assert first <= caught.value.row < first + members[1].rows


def test_open_reads_the_tail_and_the_first_record_only(saved: Path, tmp_path: Path) -> None:
    data = bytearray(saved.read_bytes())
    _, members = parse_layout(bytes(data))
    for member in members[1:]:
        corrupt(data, member)
    path = tmp_path / "all-but-the-first-corrupt.jsonl.gz"
    path.write_bytes(bytes(data))
    config = config_for([FileSource(files=[str(path)])], [V], batch_size=members[0].rows, threads=1)
    with open_batch_stream(config) as stream:
        first = next(stream)
        assert first.arrays()["v"].tolist() == list(range(members[0].rows))
        with pytest.raises(MalformedShardError, match=path.name):
            next(stream)


# -- the index is checked against the members as they are read --------------------------------------


def test_a_member_holding_more_lines_than_its_entry_fails_closed(tmp_path: Path) -> None:
    lines = lines_of(records(30))
    path = write_layout(tmp_path / "lying.jsonl.gz", [lines[:10], lines[10:20], lines[20:]], rows=[10, 9, 11])
    assert gzip.decompress(path.read_bytes()) == b"".join(lines)  # fine for a plain reader
    with pytest.raises(MalformedShardError, match="lying.jsonl.gz") as caught:
        collect(config_for([FileSource(files=[str(path)])], [V], batch_size=5))
    assert caught.value.row is not None
    assert 10 <= caught.value.row < 20


def test_a_member_holding_fewer_lines_than_its_entry_fails_closed(tmp_path: Path) -> None:
    lines = lines_of(records(30))
    path = write_layout(tmp_path / "short.jsonl.gz", [lines[:10], lines[10:20], lines[20:]], rows=[10, 11, 9])
    with pytest.raises(MalformedShardError, match="short.jsonl.gz") as caught:
        collect(config_for([FileSource(files=[str(path)])], [V], batch_size=5))
    assert caught.value.row is not None
    assert 10 <= caught.value.row <= 21


def test_a_layout_written_from_the_documentation_reads(tmp_path: Path) -> None:
    recs = records(100)
    lines = lines_of(recs)
    path = write_layout(tmp_path / "by-the-docs.jsonl.gz", [lines[i : i + 7] for i in range(0, 100, 7)])
    batches = collect(config_for([FileSource(files=[str(path)])], [V], batch_size=8))
    assert rows_of(batches, "v").tolist() == list(range(96))
    assert list(iter_shard("jsonl.gz", str(path))) == recs


def test_an_index_whose_members_do_not_reach_it_fails_closed(tmp_path: Path) -> None:
    lines = lines_of(records(20))
    good = write_layout(tmp_path / "good.jsonl.gz", [lines[:10], lines[10:]]).read_bytes()
    _, members = parse_layout(good)
    entries = [(m.compressed, m.size, m.rows) for m in members]
    cases = {
        "past-the-end": [(entries[0][0] + 10_000, *entries[0][1:]), entries[1]],
        "overlapping": [(entries[0][0] - 7, *entries[0][1:]), entries[1]],
        "huge-count": [entries[0], (entries[1][0], entries[1][1], 2**60)],
    }
    body = good[: members[-1].offset + members[-1].compressed]
    for name, bad in cases.items():
        path = tmp_path / f"{name}.jsonl.gz"
        path.write_bytes(body + index_member(bad, 40))
        with pytest.raises(MalformedShardError, match=f"{name}.jsonl.gz"):
            collect(config_for([FileSource(files=[str(path)])], [V], batch_size=5))


@pytest.mark.parametrize(
    ("name", "index"),
    [
        # (longest line, [(compressed, size, lines), ...]); the member data is 20 real records.
        ("huge-member-count", "count"),
        ("huge-size", (40, [(None, 2**40, 10), (None, None, 10)])),
        ("huge-lines", (40, [(None, None, 2**62), (None, None, 10)])),
        ("huge-longest-line", (2**62, [(None, None, 10), (None, None, 10)])),
        ("past-the-end", (40, [(2**63, None, 10), (None, None, 10)])),
        ("overlapping", (40, [(None, None, 10), (-30, None, 10)])),
    ],
)
def test_a_hostile_index_is_refused_without_allocating(tmp_path: Path, name: str, index: Any) -> None:
    """Each number of the index sized against the file before anything is allocated from it: the
    stream runs in a child capped at 2 GiB, so an allocation from a hostile number would kill it."""
    lines = lines_of(records(20))
    good = write_layout(tmp_path / "good.jsonl.gz", [lines[:10], lines[10:]]).read_bytes()
    _, members = parse_layout(good)
    body = good[: members[-1].offset + members[-1].compressed]
    if index == "count":
        # 2^60 members claimed in a few bytes of entries.
        member = index_member_of(bytes([1]) + varint(40) + varint(2**60) + varint(members[0].compressed))
    else:
        longest, entries = index
        real = [(m.compressed, m.size, m.rows) for m in members]
        fixed = []
        for (compressed, size, rows), (c0, s0, r0) in zip(entries, real, strict=True):
            compressed = c0 + compressed if compressed is not None and compressed < 0 else compressed
            fixed.append((compressed or c0, size or s0, rows or r0))
        member = index_member(fixed, longest)
    path = tmp_path / f"{name}.jsonl.gz"
    path.write_bytes(body + member)
    out = in_child(stream_call(path))
    assert out.startswith("MalformedShardError"), out
    assert f"{name}.jsonl.gz" in out


# -- files without the index -------------------------------------------------------------------------


def test_gzip_files_of_other_writers_still_read(tmp_path: Path) -> None:
    recs = records(300)
    text = b"".join(lines_of(recs))
    single = tmp_path / "python.jsonl.gz"
    single.write_bytes(gzip.compress(text, mtime=0))
    multi = tmp_path / "concatenated.jsonl.gz"
    multi.write_bytes(gzip.compress(text[:4000], mtime=0) + gzip.compress(text[4000:], mtime=0))
    for path in (single, multi):
        batches = collect(config_for([FileSource(files=[str(path)])], [V], batch_size=16))
        assert rows_of(batches, "v").tolist() == list(range(288))
        assert list(iter_shard("jsonl.gz", str(path))) == recs
