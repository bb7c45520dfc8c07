"""Hostile inputs, configs and checkpoints: each gives a named error from the hierarchy, and none
aborts, hangs or over-allocates the process.

Cases that used to kill the interpreter run in a child process whose address space is capped at
2 GiB, so an allocation past that fails there, not in the test runner, and the test sees it.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import msgpack
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from o41_testkit import ShardWriter, collect, config_for
from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    ConfigError,
    FileSource,
    MalformedShardError,
    ProjectedField,
    ProjectionError,
    Shuffle,
    Stage,
    StorageError,
    open_batch_stream,
    resume_batch_stream,
)

V = ProjectedField("v", "v", "i64")
CAP_BYTES = 2 << 30


def in_child(code: str, timeout: float = 120) -> str:
    """Runs ``code`` in a fresh interpreter capped at 2 GiB of address space; returns its stdout.

    The code prints its outcome; the test fails if the child dies (abort, signal) or hangs.
    """
    prelude = textwrap.dedent(
        f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, ({CAP_BYTES}, {CAP_BYTES}))
        from o41_training_data import *
        def outcome(call):
            try:
                call()
            except O41Error as err:
                print(type(err).__name__, err.option, err.path, "|", err, flush=True)
            else:
                print("no error", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "RAYON_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, f"the child died ({done.returncode}): {done.stderr[-2000:]}"
    return done.stdout.strip()


def stream_call(
    path: Path,
    field: str = 'ProjectedField("v", "v", "i64")',
    stage: str = "batch_size=10",
    settings: str = "",
) -> str:
    """Child code that opens and drains a stream of one stage over ``path`` and prints the outcome."""
    return f"""
        config = BatchStreamConfig(
            fields=[{field}],
            stages=[Stage(sources=[FileSource(files=[{str(path)!r}])], {stage})],
            {settings}
        )
        def run():
            with open_batch_stream(config) as stream:
                for _ in stream:
                    pass
        outcome(run)
    """


def test_a_frame_length_past_the_end_of_the_file_is_refused_before_allocating(tmp_path: Path) -> None:
    path = tmp_path / "huge-prefix.msgpack"
    path.write_bytes(struct.pack("<I", 0xFFFFFFFF) + b"\x81\xa1v\x01" * 11_500)  # 46 KB
    out = in_child(stream_call(path))
    assert out.startswith("MalformedShardError None"), out
    assert "huge-prefix.msgpack" in out
    assert "claims 4294967295 bytes" in out


def test_an_endless_input_is_refused_as_not_a_regular_file(tmp_path: Path) -> None:
    endless = tmp_path / "zero.jsonl"
    endless.symlink_to("/dev/zero")
    out = in_child(stream_call(endless))
    assert out.startswith("StorageError None"), out
    assert "zero.jsonl" in out
    assert "not a regular file" in out


def test_a_line_inflating_past_the_memory_share_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bomb.jsonl.gz"
    # 1 GiB of spaces without a newline compresses to about 1 MB.
    with gzip.open(path, "wb", compresslevel=9) as out:
        block = b" " * (1 << 20)
        for _ in range(1024):
            out.write(block)
    out = in_child(stream_call(path, settings="memory_limit_bytes=512 << 20,"))
    assert out.startswith("MalformedShardError None"), out
    assert "bomb.jsonl.gz" in out
    assert "a line is longer than" in out


@pytest.mark.parametrize(
    ("field", "stage", "option"),
    [
        ('ProjectedField("v", "v", "i64", shape=(10**6, 10**6))', "batch_size=10", "memory_limit_bytes"),
        ('ProjectedField("v", "v", "i64", length=10**9)', "batch_size=10", "memory_limit_bytes"),
        ('ProjectedField("v", "v", "i64", shape=(2**40, 2**40))', "batch_size=10", "fields[0].shape"),
        (
            'ProjectedField("v", "v", "i64")',
            "batch_size=10, shuffle=Shuffle(buffer_rows=2**62), infinite=True",
            "memory_limit_bytes",
        ),
        ('ProjectedField("v", "v", "i64")', "batch_size=2**62", "memory_limit_bytes"),
        ('ProjectedField("v", "v", "i64")', "batch_size=2**62, infinite=True", "memory_limit_bytes"),
    ],
    ids=["shape-1e12", "length-1e9", "shape-overflow", "shuffle-2^62", "batch-2^62", "batch-2^62-infinite"],
)
def test_configs_too_large_to_allocate_are_refused_by_the_bound(
    shard: ShardWriter, field: str, stage: str, option: str
) -> None:
    path = Path(shard("jsonl", [{"v": i} for i in range(100)]))
    out = in_child(stream_call(path, field, stage))
    assert out.startswith(f"ConfigError {option} None"), out


@pytest.mark.parametrize("share", [(0, 0), (3, 2), (2, 2)])
def test_a_share_that_yields_nothing_or_overlaps_is_refused(
    shard: ShardWriter, share: tuple[int, int]
) -> None:
    path = shard("jsonl", [{"v": i} for i in range(10)])
    with pytest.raises(ConfigError, match=r"share") as info:
        open_batch_stream(config_for([FileSource(files=[path])], [V]), share=share)
    assert info.value.option == "share"


def test_a_float_beyond_f32_is_refused_not_made_infinite(shard: ShardWriter, tmp_path: Path) -> None:
    for encoding in ("jsonl", "parquet"):
        path = shard(encoding, [{"x": 1.5}, {"x": 1e300}])
        with pytest.raises(ProjectionError, match=r"1e\+?300.*f32") as info:
            collect(config_for([FileSource(files=[path])], [ProjectedField("x", "x", "f32")], batch_size=2))
        assert (info.value.row, info.value.field) == (1, "x")
    ok = shard("jsonl", [{"x": 3.0e38}, {"x": -1e-50}])
    batches = collect(config_for([FileSource(files=[ok])], [ProjectedField("x", "x", "f32")], batch_size=2))
    assert batches[0]["x"].tolist()[0] == pytest.approx(3.0e38)


@pytest.mark.parametrize("next_batch", [2**62 + 1, 2**63 - 1, 2**63, 2**64 - 1])
def test_a_checkpoint_past_any_reachable_position_is_refused(shard: ShardWriter, next_batch: int) -> None:
    path = shard("jsonl", [{"v": i} for i in range(50)])
    config = config_for([FileSource(files=[path])], [V], batch_size=2, infinite=True)
    with open_batch_stream(config) as stream:
        next(stream)
        document = json.loads(stream.checkpoint().to_json())
    document["cursor"]["next_batch"] = next_batch  # the fingerprint covers the resolved config only
    checkpoint = Checkpoint.from_json(json.dumps(document))
    with pytest.raises(CheckpointError, match="beyond any position"):
        resume_batch_stream(checkpoint)


def test_a_checkpoint_past_the_end_of_a_finite_stage_is_refused(shard: ShardWriter) -> None:
    path = shard("jsonl", [{"v": i} for i in range(50)])
    with open_batch_stream(config_for([FileSource(files=[path])], [V], batch_size=2)) as stream:
        next(stream)
        document = json.loads(stream.checkpoint().to_json())
    document["cursor"]["next_batch"] = 26  # 25 batches in the stage
    with pytest.raises(CheckpointError, match="past the end of finite stage 0"):
        resume_batch_stream(Checkpoint.from_json(json.dumps(document)))
    document["batches_yielded"] = 2**63
    document["cursor"]["next_batch"] = 1
    with pytest.raises(CheckpointError, match="counters"):
        resume_batch_stream(Checkpoint.from_json(json.dumps(document)))


@pytest.mark.parametrize(
    ("build", "option"),
    [
        (
            lambda s: BatchStreamConfig(fields=[V], stages=[Stage(sources=s, batch_size=-3)]),
            "stages[0].batch_size",
        ),
        (
            lambda s: BatchStreamConfig(
                fields=[V],
                stages=[Stage(sources=[FileSource(s[0].files, weight=float("nan"))], batch_size=2)],
            ),
            "stages[0].sources[0].weight",
        ),
        (
            lambda s: BatchStreamConfig(fields=[V], stages=[Stage(sources=s, batch_size=2)], seed=2**64),
            "seed",
        ),
        (
            lambda s: BatchStreamConfig(
                fields=[ProjectedField("v", "v", "i64", length=-1)], stages=[Stage(sources=s, batch_size=2)]
            ),
            "fields[0].shape",
        ),
        (
            lambda s: BatchStreamConfig(
                fields=[V], stages=[Stage(sources=s, batch_size=2)], memory_limit_bytes=-1
            ),
            "memory_limit_bytes",
        ),
        (
            lambda s: BatchStreamConfig(fields=[V], stages=[Stage(sources=s, batch_size="8")]),
            "stages[0].batch_size",
        ),
        (
            lambda s: BatchStreamConfig(
                fields=[V], stages=[Stage(sources=s, batch_size=2, shuffle=Shuffle(buffer_rows=0))]
            ),
            "stages[0].shuffle.buffer_rows",
        ),
        (
            lambda s: BatchStreamConfig(
                fields=[ProjectedField("v", "v", "f32", pad=float("inf"))],
                stages=[Stage(sources=s, batch_size=2)],
            ),
            "fields[0].pad",
        ),
    ],
    ids=[
        "batch-negative",
        "weight-nan",
        "seed-2^64",
        "length-negative",
        "memory-negative",
        "batch-string",
        "buffer-zero",
        "pad-inf",
    ],
)
def test_config_values_of_the_wrong_type_or_sign_name_the_option(
    shard: ShardWriter, build, option: str
) -> None:
    sources = [FileSource(files=[shard("jsonl", [{"v": 1}])])]
    with pytest.raises(ConfigError) as info:
        build(sources)
    assert info.value.option == option
    assert option in str(info.value)


def test_a_frame_that_is_not_a_map_is_refused_where_it_is_counted(tmp_path: Path) -> None:
    path = tmp_path / "bare.msgpack"
    with path.open("wb") as out:
        for value in [{"v": i} for i in range(12)] + [7]:  # the last frame falls in a partial batch
            frame = msgpack.packb(value)
            out.write(struct.pack("<I", len(frame)) + frame)
    with pytest.raises(MalformedShardError, match="must be a map") as info:
        open_batch_stream(config_for([FileSource(files=[str(path)])], [V], batch_size=5))
    assert info.value.row == 12


def test_an_empty_parquet_shard_beside_others_is_skipped(shard: ShardWriter, tmp_path: Path) -> None:
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({}), empty)
    full = shard("parquet", [{"v": i} for i in range(6)])
    batches = collect(config_for([FileSource(files=[str(empty), full])], [V], batch_size=2))
    assert [b["v"].tolist() for b in batches] == [[0, 1], [2, 3], [4, 5]]


def test_a_directory_or_pipe_is_not_a_shard(tmp_path: Path) -> None:
    pipe = tmp_path / "pipe.jsonl"
    os.mkfifo(pipe)
    with pytest.raises(StorageError, match="not a regular file"):
        open_batch_stream(config_for([FileSource(files=[str(pipe)])], [V]))
    directory = tmp_path / "dir.jsonl"
    directory.mkdir()
    with pytest.raises(StorageError, match="not a regular file"):
        open_batch_stream(config_for([FileSource(files=[str(directory)])], [V]))


# -- Local shards are pinned like remote objects: size, modification time and inode.


def fixed_width_shard(path: Path, base: int, rows: int = 2000) -> Path:
    """JSON Lines whose every line has the same length, so a rewrite keeps size and row count."""
    path.write_text("".join(f'{{"v": {base + i}}}\n' for i in range(rows)))
    return path


def rewrite_in_place(path: Path, base: int, rows: int = 2000) -> None:
    size = path.stat().st_size
    stat = path.stat()
    with path.open("r+") as out:
        out.write("".join(f'{{"v": {base + i}}}\n' for i in range(rows)))
    assert path.stat().st_size == size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_a_local_shard_rewritten_while_streaming_fails_closed(tmp_path: Path) -> None:
    # Larger than what the pipeline reads ahead (two groups of 4,096 rows), so reading goes on
    # after the rewrite.
    path = fixed_width_shard(tmp_path / "data.jsonl", 100_000, rows=60_000)
    config = config_for([FileSource(files=[str(path)])], [V], batch_size=10, threads=1, prefetch_batches=1)
    with open_batch_stream(config) as stream:
        first = next(stream).arrays()["v"].tolist()
        assert first[0] == 100_000
        rewrite_in_place(path, 500_000, rows=60_000)

        def drain() -> None:
            for batch in stream:
                assert batch.arrays()["v"].max() < 500_000, "a row of the new version was delivered"

        with pytest.raises(StorageError, match=r"data\.jsonl.*changed since the stream opened it") as info:
            drain()
    assert info.value.path == str(path)


def test_a_checkpoint_of_a_rewritten_local_shard_is_refused(tmp_path: Path) -> None:
    path = fixed_width_shard(tmp_path / "data.jsonl", 100_000)
    config = config_for([FileSource(files=[str(path)])], [V], batch_size=10)
    with open_batch_stream(config) as stream:
        next(stream)
        checkpoint = stream.checkpoint()
    rewrite_in_place(path, 500_000)
    with pytest.raises(CheckpointError, match=r"data\.jsonl changed since the checkpoint was taken"):
        resume_batch_stream(checkpoint)


def test_a_copy_that_keeps_the_modification_time_resumes(tmp_path: Path) -> None:
    import shutil

    path = fixed_width_shard(tmp_path / "data.jsonl", 100_000)
    config = config_for([FileSource(files=[str(path)])], [V], batch_size=10)
    with open_batch_stream(config) as stream:
        next(stream)
        checkpoint = stream.checkpoint()
        expected = next(stream).arrays()["v"].tolist()
    # A restarted job copies its shards to local disk again: another inode, same bytes and times.
    copy = tmp_path / "copy.jsonl"
    shutil.copy2(path, copy)
    copy.replace(path)
    with resume_batch_stream(checkpoint) as resumed:
        assert next(resumed).arrays()["v"].tolist() == expected


# -- Errors surface in order: every batch before the one with the bad row is delivered first.


def bad_row_shard(tmp_path: Path, encoding: str, rows: int, bad: int) -> str:
    path = tmp_path / f"bad-{encoding.replace('.', '-')}"
    if encoding == "parquet":
        values = [None if i == bad else i for i in range(rows)]  # a null where an i64 is declared
        pq.write_table(pa.table({"v": pa.array(values, pa.int64())}), path, row_group_size=256)
    else:
        lines = [f'{{"v": {i}}}' if i != bad else '{"v": ' for i in range(rows)]
        text = ("\n".join(lines) + "\n").encode()
        path.write_bytes(gzip.compress(text) if encoding == "jsonl.gz" else text)
    return str(path)


def drain_rows(stream, into: list) -> None:
    """Appends each batch's ``row`` column to ``into`` until the stream ends or raises."""
    for batch in stream:
        into.append(batch.arrays()["row"].tolist())


@pytest.mark.parametrize("encoding", ["jsonl", "jsonl.gz", "parquet"])
@pytest.mark.parametrize(("rows", "bad"), [(1000, 500), (10_000, 5_000)])
def test_every_batch_before_a_bad_row_is_delivered_first(
    tmp_path: Path, encoding: str, rows: int, bad: int
) -> None:
    path = bad_row_shard(tmp_path, encoding, rows, bad)
    fields = [V, ProjectedField("row", "@row", "i64")]
    config = config_for([FileSource(files=[path], encoding=encoding)], fields, batch_size=10)
    delivered: list[list[int]] = []
    with open_batch_stream(config) as stream, pytest.raises((MalformedShardError, ProjectionError)) as info:
        drain_rows(stream, delivered)
    assert [row for rows in delivered for row in rows] == list(range(bad - bad % 10)), "error came early"
    assert info.value.row == bad
    assert info.value.path == path


def test_a_shuffled_stream_delivers_every_batch_without_the_bad_row(tmp_path: Path) -> None:
    import dataclasses

    path = bad_row_shard(tmp_path, "jsonl", 2000, 777)
    fields = [ProjectedField("row", "@row", "i64")]
    config = config_for(
        [FileSource(files=[path], encoding="jsonl")],
        fields,
        batch_size=8,
        shuffle=Shuffle(buffer_rows=512, unit_rows=2),
        seed=3,
    )
    # The rows of every batch, from a stream that reads no record values at all.
    plan: list[list[int]] = []
    with open_batch_stream(config) as reference:
        drain_rows(reference, plan)
    failing = next(k for k, rows in enumerate(plan) if 777 in rows)
    got: list[list[int]] = []
    with (
        open_batch_stream(dataclasses.replace(config, fields=[V, *fields])) as stream,
        pytest.raises(MalformedShardError, match="row 777"),
    ):
        drain_rows(stream, got)
    assert got == plan[:failing]
    assert failing > 0


# -- The saver and storage settings raise only the documented hierarchy, naming what is at fault.


def saved(tmp_path: Path, data_format: str = "parquet"):
    from o41_training_data import TrainingData

    saver = TrainingData().dataset_saver(tmp_path / "data" / "data-manifest-v1.json", data_format)
    shards = [
        saver.save("train", None, [{"v": k * 10 + i} for i in range(10)], shard_id=str(k)) for k in range(2)
    ]
    return saver, shards


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda text: text[: len(text) // 2], "not a completion descriptor"),
        (lambda text: json.dumps({**json.loads(text), "rows": "ten"}), "field 'rows'"),
        (lambda text: json.dumps({**json.loads(text), "unknown": 1}), "fields are not a saved shard's"),
        (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "checksum"}), "fields"),
        (
            lambda text: json.dumps({**json.loads(text), "location": "train/_/shard-9.parquet"}),
            "not the shard",
        ),
        (lambda text: "[1, 2]", "not a JSON object"),
    ],
)
def test_a_truncated_or_altered_descriptor_is_refused_naming_it(tmp_path: Path, mutate, message: str) -> None:
    saver, shards = saved(tmp_path)
    descriptor = tmp_path / "data" / (shards[1].location + ".done.json")
    descriptor.write_text(mutate(descriptor.read_text()))
    with pytest.raises(MalformedShardError, match=message) as info:
        saver.commit_manifest()
    assert info.value.path == str(descriptor)
    assert not (tmp_path / "data" / "data-manifest-v1.json").exists()


def test_a_saver_of_another_format_cannot_publish_beside_existing_shards(tmp_path: Path) -> None:
    from o41_training_data import TrainingData

    saved(tmp_path, "parquet")
    other = TrainingData().dataset_saver(tmp_path / "data" / "data-manifest-v1.json", "msgpack")
    other.save("train", None, [{"v": 1}], shard_id="2")
    with pytest.raises(ConfigError, match=r"another format than this saver's 'msgpack'") as info:
        other.commit_manifest()
    assert info.value.option is None or "data_format" in str(info.value)
    assert not (tmp_path / "data" / "data-manifest-v1.json").exists()


def test_an_empty_shard_beside_others_is_skipped_by_streams(tmp_path: Path) -> None:
    from o41_training_data import ManifestSource

    saver, _ = saved(tmp_path)
    saver.save("train", None, [], shard_id="empty")
    saver.commit_manifest()
    source = ManifestSource(manifest_uri=str(tmp_path / "data" / "data-manifest-v1.json"), split="train")
    batches = collect(BatchStreamConfig(fields=[V], stages=[Stage(sources=[source], batch_size=5)]))
    assert sorted(v for b in batches for v in b["v"].tolist()) == list(range(20))


def test_credentials_in_the_endpoint_url_are_refused_without_repeating_them() -> None:
    from o41_training_data import TrainingData

    with pytest.raises(ConfigError, match="carries credentials") as info:
        TrainingData(
            s3_base_url="http://AKIDSECRET:hunter2@127.0.0.1:9/", access_key_id="a", secret_access_key="b"
        )
    assert "hunter2" not in str(info.value)
    assert info.value.option == "s3_base_url"


# A pyarrow-written shard (`ids`: 64 lists of four int32, dictionary-encoded version 2 pages,
# uncompressed) with byte 345, inside a data page's RLE-encoded indices, set to 0xff, so that
# parquet-rs's bit reader asserts ("Num of bytes exceed MAX_VLQ_BYTE_LEN") instead of returning
# an error. Every declared size still holds, so the engine's own page-header checks pass it on.
# (The fixture before it forged a page header, which those checks now refuse first.)
DECODER_PANICS = Path(__file__).parent / "data" / "parquet-decoder-panics.parquet"


@pytest.mark.parametrize("read", ["iter_shard", "stream"])
def test_a_page_the_decoder_asserts_on_is_a_malformed_shard_and_prints_no_panic(read: str) -> None:
    call = {
        "iter_shard": f"outcome(lambda: list(iter_shard('parquet', {str(DECODER_PANICS)!r})))",
        "stream": stream_call(DECODER_PANICS, field='ProjectedField("ids", "ids", "i32", length=4, pad=-1)'),
    }[read]
    prelude = "from o41_training_data import *\n" + textwrap.dedent(
        """
        def outcome(call):
            try:
                call()
            except O41Error as err:
                print(type(err).__name__, "|", err, flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(call)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "RUST_BACKTRACE": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    kind, message = done.stdout.strip().split(" | ", 1)
    assert kind == "MalformedShardError"
    # The assertion's message and place are in the error; if the decoder stops asserting on this
    # page, the last check fails, and this test needs a page it does assert on.
    assert message.startswith(f"{DECODER_PANICS}, row 0: malformed parquet shard: the Parquet decoder failed")
    assert "(at parquet-" in message, message
    # Not on stderr: no "thread ... panicked at" line, no backtrace.
    assert "panicked" not in done.stderr, done.stderr
    assert "backtrace" not in done.stderr, done.stderr
