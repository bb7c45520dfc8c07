"""A forged list-length record (an inspection-cache entry claiming records of 2^32 - 1 tokens)
is not taken for the shard's: lengths that disagree with the footer's counts are a cache miss,
and the shard is read honestly, instead of the packing plan aborting the process in the
allocator (the plan bound itself is checked before each document is placed: Rust's
`forged_inputs` tests)."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from o41_training_data import (
    BatchStreamConfig,
    FileSource,
    Packing,
    ProjectedField,
    Stage,
    open_batch_stream,
)

MAGIC = b"o41len01"


def forge(entry: Path, length: int) -> None:
    """Rewrites every length of a cache `.lengths` entry (magic, header, count, u32 lengths)."""
    data = entry.read_bytes()
    assert data.startswith(MAGIC)
    (header_len,) = struct.unpack_from("<I", data, len(MAGIC))
    at = len(MAGIC) + 4 + header_len
    (count,) = struct.unpack_from("<Q", data, at)
    entry.write_bytes(data[: at + 8] + struct.pack(f"<{count}I", *([length] * count)))


def test_a_forged_cache_length_is_a_miss_not_an_allocation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("O41_INSPECT_CACHE", str(tmp_path / "cache"))
    shard = tmp_path / "tokens.parquet"
    pq.write_table(pa.table({"tokens": pa.array([[1, 2, 3]] * 4, pa.list_(pa.int32()))}), shard)
    config = BatchStreamConfig(
        fields=[ProjectedField("tokens", "tokens", "i32", length=8)],
        stages=[
            Stage(
                sources=[FileSource([str(shard)])],
                batch_size=1,
                packing=Packing(field="tokens", seq_len=8, bins=2),
            )
        ],
        memory_limit_bytes=256 << 20,
    )
    with open_batch_stream(config) as stream:
        assert next(stream).arrays()["tokens"][0].tolist()[:3] == [1, 2, 3]
    [entry] = (tmp_path / "cache").glob("*/*.lengths")
    forge(entry, 2**32 - 1)
    # In a child under an address-space cap (the engine's declared bound, and room for the
    # interpreter and its libraries): an allocation past it would abort the child.
    child = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
        "from o41_training_data import *\n"
        "config = BatchStreamConfig(\n"
        "    fields=[ProjectedField('tokens', 'tokens', 'i32', length=8)],\n"
        "    stages=[Stage(sources=[FileSource([sys.argv[1]])], batch_size=1,\n"
        "                  packing=Packing(field='tokens', seq_len=8, bins=2))],\n"
        "    memory_limit_bytes=256 << 20)\n"
        "with open_batch_stream(config) as stream:\n"
        "    print(next(stream).arrays()['tokens'][0].tolist())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", child, str(shard)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["[1,", "2,", "3,", "1,", "2,", "3,", "0,", "0]"], result.stdout


@pytest.mark.parametrize("layout", ["packing", "windows"])
def test_a_forged_footer_index_of_lengths_is_not_taken_for_the_shards(tmp_path: Path, layout: str) -> None:
    import base64
    import zlib

    from o41_training_data import TokenWindows

    # The saver's footer index (`o41.list_lengths.<column>`: u32 lengths, raw deflate, base64)
    # claiming records of 2^32 - 1 tokens; the file's level counts say 3.
    deflate = zlib.compressobj(wbits=-15)
    packed = deflate.compress(struct.pack("<4I", *[2**32 - 1] * 4)) + deflate.flush()
    table = pa.table({"tokens": pa.array([[1, 2, 3]] * 4, pa.list_(pa.int32()))})
    table = table.replace_schema_metadata(
        {"o41.list_lengths.tokens": "1:" + base64.b64encode(packed).decode()}
    )
    shard = tmp_path / "forged.parquet"
    pq.write_table(table, shard)
    stage = (
        {"packing": Packing(field="tokens", seq_len=8, bins=2)}
        if layout == "packing"
        else {"windows": TokenWindows(field="tokens", seq_len=8)}
    )
    config = BatchStreamConfig(
        fields=[ProjectedField("tokens", "tokens", "i32", length=8 if layout == "packing" else 9)],
        stages=[Stage(sources=[FileSource([str(shard)])], batch_size=1, **stage)],
        memory_limit_bytes=256 << 20,
    )
    with open_batch_stream(config) as stream:
        first = next(stream).arrays()["tokens"][0].tolist()
    assert first == ([1, 2, 3, 1, 2, 3, 0, 0] if layout == "packing" else [1, 2, 3, 1, 2, 3, 1, 2, 3])


@pytest.mark.parametrize("layout", ["packing", "windows"])
def test_a_footer_forged_to_billions_of_values_fails_the_open_in_time(tmp_path: Path, layout: str) -> None:
    # Issue 48, case 16: the footer's own level count forged to agree with a footer index of 20
    # records of 2^32 - 1 tokens: stream windows visited every one of the ~10^10 windows the
    # lengths claim to find the most pieces of any (no output in 60 s). Counted from the
    # documents now, open fails closed on the memory the claimed records would need.
    import base64
    import zlib

    from o41_testkit.parquet_footer import integer_paths, patch_integers

    records = 20
    deflate = zlib.compressobj(wbits=-15)
    packed = deflate.compress(struct.pack(f"<{records}I", *[2**32 - 1] * records)) + deflate.flush()
    table = pa.table({"tokens": pa.array([[1, 2, 3]] * records, pa.list_(pa.int32()))})
    table = table.replace_schema_metadata(
        {"o41.list_lengths.tokens": "1:" + base64.b64encode(packed).decode()}
    )
    shard = tmp_path / "forged.parquet"
    pq.write_table(table, shard, write_statistics=False)
    raw = shard.read_bytes()
    num_values = (4, 0, 1, 0, 3, 5)  # row group 0, column 0, its metadata's num_values
    assert num_values in integer_paths(raw)
    shard.write_bytes(patch_integers(raw, {num_values: records * (2**32 - 1)}))
    assert pq.ParquetFile(shard).metadata.row_group(0).column(0).num_values == records * (2**32 - 1)
    stage = (
        "Packing(field='tokens', seq_len=8, bins=2)"
        if layout == "packing"
        else "TokenWindows(field='tokens', seq_len=8)"
    )
    key = "packing" if layout == "packing" else "windows"
    width = 8 if layout == "packing" else 9
    child = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
        "from o41_training_data import *\n"
        "config = BatchStreamConfig(\n"
        f"    fields=[ProjectedField('tokens', 'tokens', 'i32', length={width})],\n"
        f"    stages=[Stage(sources=[FileSource([sys.argv[1]])], batch_size=1, {key}={stage})],\n"
        "    memory_limit_bytes=256 << 20)\n"
        "try:\n"
        "    with open_batch_stream(config) as stream:\n"
        "        for batch in stream:\n"
        "            pass\n"
        "    print('read')\n"
        "except O41Error as error:\n"
        "    print('refused', type(error).__name__, error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", child, str(shard)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("refused"), result.stdout
