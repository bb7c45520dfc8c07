"""JSON Lines gzipped by other writers (Python's ``gzip``, the ``gzip`` tool, concatenated
streams): inflated once when first inspected, which leaves an access index in the inspection
cache, and read from the access point nearest each row after that (docs/formats.md).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from o41_testkit import LocalS3Server, collect, config_for, data_for, rows_of, upload
from o41_training_data import (
    CheckpointError,
    FileSource,
    MalformedShardError,
    ManifestSource,
    ProjectedField,
    ProjectionError,
    Shuffle,
    manifest_from_files,
    open_batch_stream,
    resume_batch_stream,
)

ROWS = 6_000
BATCH = 32
V = ProjectedField("v", "v", "i64")
IDS = ProjectedField("ids", "ids", "i32", length=64, pad=-1)


def records(n: int) -> list[dict[str, Any]]:
    """Rows of a few KiB each, so a shard holds several MiB of text and several access points."""
    rng = np.random.default_rng(7)
    return [{"v": i, "ids": rng.integers(0, 50_000, 200 + i % 300).tolist()} for i in range(n)]


def text_of(recs: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in recs)


def gzip_tool(text: bytes) -> bytes:
    return subprocess.run(["gzip", "-c", "-6"], input=text, capture_output=True, check=True).stdout


def concatenated(text: bytes) -> bytes:
    cut = len(text) // 3
    return gzip.compress(text[:cut], 6, mtime=0) + gzip.compress(text[cut:], 1, mtime=0)


WRITERS: dict[str, Callable[[bytes], bytes]] = {
    "python-level-1": lambda t: gzip.compress(t, 1, mtime=0),
    "python-level-6": lambda t: gzip.compress(t, 6, mtime=0),
    "python-level-9": lambda t: gzip.compress(t, 9, mtime=0),
    "gzip-tool": gzip_tool,
    "concatenated": concatenated,
}

RECORDS = records(ROWS)
TEXT = text_of(RECORDS)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("O41_INSPECT_CACHE", str(directory))
    return directory


def shard(tmp_path: Path, writer: str = "python-level-6") -> Path:
    path = tmp_path / f"{writer}.jsonl.gz"
    path.write_bytes(WRITERS[writer](TEXT))
    return path


def expected(rows: range) -> dict[str, np.ndarray]:
    ids = np.full((len(rows), IDS.length or 0), -1, dtype=np.int32)
    for k, i in enumerate(rows):
        first = RECORDS[i]["ids"][: ids.shape[1]]
        ids[k, : len(first)] = first
    return {"v": np.arange(rows.start, rows.stop, dtype=np.int64), "ids": ids}


def config(path: Path, **kwargs: Any):  # type: ignore[no-untyped-def]
    return config_for([FileSource(files=[str(path)])], [V, IDS], batch_size=BATCH, **kwargs)


def indexes(cache: Path) -> list[Path]:
    return sorted(cache.glob("*/*.gzindex"))


@pytest.mark.parametrize("writer", list(WRITERS))
def test_every_row_reads_as_the_writer_wrote_it_before_and_after_the_index(
    tmp_path: Path, cache: Path, writer: str
) -> None:
    path = shard(tmp_path, writer)
    whole = range(ROWS // BATCH * BATCH)
    for attempt in ("first open builds the index", "second open reads from it"):
        batches = collect(config(path, threads=2))
        assert rows_of(batches, "v").tolist() == list(whole), attempt
        np.testing.assert_array_equal(rows_of(batches, "ids"), expected(whole)["ids"], attempt)
        assert len(indexes(cache)) == 1, attempt


def rewrite_in_place(path: Path, at: int) -> None:
    """Damages one byte, keeping the file's size, inode and modification time."""
    stat = path.stat()
    with path.open("r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0xFF]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def checkpoint_at_row(path: Path, row: int):  # type: ignore[no-untyped-def]
    with open_batch_stream(config(path, threads=1)) as stream:
        for _ in range(row // BATCH):
            next(stream)
        return stream.checkpoint()


def test_a_deep_resume_inflates_from_the_nearest_point_not_from_the_start(
    tmp_path: Path, cache: Path
) -> None:
    path = shard(tmp_path)
    deep = ROWS * 9 // 10 // BATCH * BATCH
    checkpoint = checkpoint_at_row(path, deep)
    assert len(indexes(cache)) == 1
    size = path.stat().st_size
    with resume_batch_stream(checkpoint) as stream:
        batch = next(stream)
        np.testing.assert_array_equal(batch.arrays()["v"], expected(range(deep, deep + BATCH))["v"])
        read = stream.stats.sources[0].bytes_read
    assert read < size * 0.35, f"{read} of {size} bytes read to resume at row {deep}"

    # Damage in the last 64 KiB (the last member's end and trailer, which the file's identity
    # samples), keeping size, inode and modification time: the resume refuses the file by its
    # content.
    assert size > 1 << 20, "a file the identity samples (docs/storage.md)"
    rewrite_in_place(path, size - 100)
    with pytest.raises(CheckpointError, match=rf"{path.name} changed since the checkpoint was taken"):
        resume_batch_stream(checkpoint)
    rewrite_in_place(path, size - 100)  # undone
    # Damage between the identity's samples, well before the deep row, is not seen at resume,
    # which does not inflate those bytes; where they are inflated, damaged deflate data reads
    # as an error or as bytes that are not the records (the member's CRC-32 is only known at
    # its end), either naming the file.
    rewrite_in_place(path, size * 2 // 5)
    with pytest.raises((MalformedShardError, ProjectionError), match=path.name):
        collect(config(path, threads=1))


def test_without_the_cache_streams_are_read_forward_and_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("O41_INSPECT_CACHE", "off")
    path = shard(tmp_path, "concatenated")
    batches = collect(config(path, threads=2))
    assert rows_of(batches, "v").tolist() == list(range(ROWS // BATCH * BATCH))


def test_an_index_file_that_is_not_one_is_ignored_and_rewritten(tmp_path: Path, cache: Path) -> None:
    path = shard(tmp_path)
    collect(config(path), limit=1)
    (index,) = indexes(cache)
    good = index.read_bytes()
    whole = range(ROWS // BATCH * BATCH)
    last = range(whole.stop - BATCH, whole.stop)
    for junk in (b"", b"o41gzx01" + bytes(64), good[: len(good) // 2], good + b"x"):
        index.write_bytes(junk)
        batches = collect(config(path, threads=2))
        assert rows_of(batches, "v").tolist() == list(whole)
        np.testing.assert_array_equal(batches[-1]["ids"], expected(last)["ids"])
        assert index.read_bytes() == good, "rebuilt as it was"
    # A window whose bytes changed is found out when a reader needs it (its CRC-32): that
    # reader starts from the stream's start instead.
    index.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    batches = collect(config(path, threads=2))
    assert rows_of(batches, "v").tolist() == list(whole)
    np.testing.assert_array_equal(batches[-1]["ids"], expected(last)["ids"])


def test_an_index_whose_windows_vanish_mid_stream_falls_back_to_the_start(
    tmp_path: Path, cache: Path
) -> None:
    path = shard(tmp_path)
    collect(config(path), limit=1)
    deep = ROWS // 2 // BATCH * BATCH
    checkpoint = checkpoint_at_row(path, deep)
    with resume_batch_stream(checkpoint) as stream:
        for index in indexes(cache):
            index.unlink()
        got = [b.arrays()["v"].copy() for b in stream]
    assert np.concatenate(got).tolist() == list(range(deep, ROWS // BATCH * BATCH))


@pytest.mark.parametrize("stop", [1, 17, 40, 71])
def test_stop_and_resume_gives_the_same_continuation_on_two_threads(
    tmp_path: Path, cache: Path, stop: int
) -> None:
    path = shard(tmp_path, "gzip-tool")
    shuffled = config(path, threads=2, shuffle=Shuffle(buffer_rows=512), seed=5)
    whole = [b["v"] for b in collect(shuffled)]
    with open_batch_stream(shuffled) as stream:
        for _ in range(stop):
            next(stream)
        checkpoint = stream.checkpoint()
    with resume_batch_stream(checkpoint) as stream:
        rest = [b.arrays()["v"].copy() for b in stream]
    assert np.concatenate(rest).tolist() == np.concatenate(whole[stop:]).tolist()


def test_dolma_style_json_gz_names_are_gzipped_json_lines(tmp_path: Path, cache: Path) -> None:
    corpus = tmp_path / "dolma" / "v1_7"
    corpus.mkdir(parents=True)
    cut = len(TEXT) // 2
    split = TEXT.index(b"\n", cut) + 1
    (corpus / "c4-0000.json.gz").write_bytes(gzip.compress(TEXT[:split], 6, mtime=0))
    (corpus / "c4-0001.json.gz").write_bytes(gzip_tool(TEXT[split:]))
    files = sorted(str(p) for p in corpus.iterdir())
    whole = list(range(ROWS // BATCH * BATCH))
    assert (
        rows_of(collect(config_for([FileSource(files=files)], [V], batch_size=BATCH)), "v").tolist() == whole
    )
    manifest = manifest_from_files([corpus], tmp_path / "data-manifest-v1.json")
    assert [shard.rows for shard in manifest.splits["train"].shards] == [
        TEXT[:split].count(b"\n"),
        TEXT[split:].count(b"\n"),
    ]
    batches = collect(
        config_for([ManifestSource(str(tmp_path / "data-manifest-v1.json"), "train")], [V], batch_size=BATCH)
    )
    assert rows_of(batches, "v").tolist() == whole


def test_a_stream_in_s3_is_indexed_once_and_resumed_from_its_nearest_point(
    tmp_path: Path, cache: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str
) -> None:
    local = shard(tmp_path, "gzip-tool")
    remote = upload(boto3_client, local, f"{s3_prefix}gzip-tool.jsonl.gz")
    training_data = data_for(s3_server)
    whole = range(ROWS // BATCH * BATCH)
    with training_data.batch_stream(
        config_for([FileSource(files=[remote])], [V, IDS], batch_size=BATCH)
    ) as stream:
        got = [b.arrays()["v"].copy() for b in stream]
        checkpoint_rows = ROWS * 9 // 10 // BATCH * BATCH
    assert np.concatenate(got).tolist() == list(whole)
    assert len(indexes(cache)) == 1, "the index is keyed by the object's ETag"
    remote_config = config_for([FileSource(files=[remote])], [V, IDS], batch_size=BATCH, threads=1)
    with training_data.batch_stream(remote_config) as stream:
        for _ in range(checkpoint_rows // BATCH):
            next(stream)
        checkpoint = stream.checkpoint()
    with training_data.resume_batch_stream(checkpoint) as stream:
        batch = next(stream)
        deep = range(checkpoint_rows, checkpoint_rows + BATCH)
        np.testing.assert_array_equal(batch.arrays()["ids"], expected(deep)["ids"])
        read = stream.stats.sources[0].bytes_read
    assert read < local.stat().st_size * 0.5, f"{read} of {local.stat().st_size} bytes fetched to resume"


@pytest.mark.parametrize("forgery", ["point-row-shifted", "rows-lowered"])
def test_a_forged_access_index_is_a_miss_never_a_changed_row(
    tmp_path: Path, cache: Path, forgery: str
) -> None:
    # Issue 48, case 12: the index edited with its table checksum recomputed (a point's row
    # shifted by one, or the stream's rows lowered by 500) used to deliver 5 rows twice and 5
    # never, or end the stream early. An entry is sealed with this host's key: a forged one is a
    # miss, and the stream counts the shard itself.
    import zlib

    path = shard(tmp_path)
    whole = range(ROWS // BATCH * BATCH)
    collect(config(path, threads=2))
    (index,) = indexes(cache)
    data = bytearray(index.read_bytes())
    magic_and_header = 8 + 4 + int.from_bytes(data[8:12], "little")
    payload = magic_and_header
    count = int.from_bytes(data[payload + 16 : payload + 20], "little")
    assert count >= 2, "the stream has access points to forge"
    table = payload + 20
    if forgery == "point-row-shifted":
        row_at = table + 40 * 1 + 16  # the second point's row
        data[row_at : row_at + 8] = (int.from_bytes(data[row_at : row_at + 8], "little") + 1).to_bytes(
            8, "little"
        )
    else:
        rows = int.from_bytes(data[payload : payload + 8], "little")
        data[payload : payload + 8] = (rows - 500).to_bytes(8, "little")
    described = bytes(data[payload : table + 40 * count])
    data[table + 40 * count : table + 40 * count + 4] = zlib.crc32(described).to_bytes(4, "little")
    index.write_bytes(bytes(data))
    batches = collect(config(path, threads=2))
    assert rows_of(batches, "v").tolist() == list(whole)
    np.testing.assert_array_equal(rows_of(batches, "ids"), expected(whole)["ids"])
