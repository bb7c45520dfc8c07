"""Checkpoints: the document, resume, refusals, elastic resume and the public test helper."""

from __future__ import annotations

import json
import pickle
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from o41_testkit import ShardWriter, config_for
from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    FileSource,
    ManifestSource,
    ProjectedField,
    Shuffle,
    Stage,
    StreamClosedError,
    open_batch_stream,
    resume_batch_stream,
)
from o41_training_data.testing import assert_resumable

V = ProjectedField("v", "v", "i64")
ROW_ID = ProjectedField("id", "@row_id", "i64")


def two_sources(shard: ShardWriter, **kwargs) -> BatchStreamConfig:
    a = [shard("parquet", [{"v": i} for i in range(k * 50, k * 50 + 50)]) for k in range(3)]
    b = [shard("jsonl.gz", [{"v": 10_000 + i} for i in range(40)])]
    sources = [FileSource(files=a, weight=3.0), FileSource(files=b, weight=1.0)]
    kwargs.setdefault("shuffle", Shuffle(buffer_rows=32, unit_rows=2))
    return config_for(sources, [V, ROW_ID], batch_size=4, **kwargs)


def ids(batches) -> list[list[int]]:
    return [b.arrays()["v"].tolist() for b in batches]


def test_resume_continues_exactly_after_the_last_delivered_batch(shard: ShardWriter) -> None:
    config = two_sources(shard, infinite=True)
    with open_batch_stream(config) as stream:
        reference = [next(stream).arrays()["v"].tolist() for _ in range(30)]
    with open_batch_stream(config) as stream:
        for _ in range(11):
            next(stream)
        text = stream.checkpoint().to_json()
    checkpoint = Checkpoint.from_json(text)
    assert (checkpoint.batches_yielded, checkpoint.rows_yielded, checkpoint.stage) == (11, 44, 0)
    with resume_batch_stream(checkpoint) as resumed:
        assert [next(resumed).arrays()["v"].tolist() for _ in range(19)] == reference[11:]
        assert resumed.stats.batches_yielded == 30


def test_the_public_helper_checks_every_stop_point(shard: ShardWriter) -> None:
    assert_resumable(two_sources(shard, infinite=True), batches=15)
    assert_resumable(two_sources(shard, infinite=False), batches=60)  # runs to the finite end


def test_document_has_version_counters_and_no_growth_with_the_window(shard: ShardWriter) -> None:
    sizes = []
    for buffer_rows in (8, 100_000):
        config = two_sources(shard, infinite=True, shuffle=Shuffle(buffer_rows=buffer_rows))
        with open_batch_stream(config) as stream:
            for _ in range(5):
                next(stream)
            document = json.loads(stream.checkpoint().to_json())
        sizes.append(len(json.dumps(document["cursor"])))
        assert document["version"] == 1
        assert {"stage", "batches_yielded", "rows_yielded", "epochs", "resolved", "fingerprint"} <= set(
            document
        )
        shards = document["resolved"]["stages"][0]["sources"][0]["shards"]
        assert [s["rows"] for s in shards] == [50, 50, 50]
    assert sizes[0] == sizes[1]


def test_epochs_count_completed_passes(shard: ShardWriter) -> None:
    path = shard("parquet", [{"v": i} for i in range(10)])
    config = config_for([FileSource(files=[path])], [V], batch_size=5, infinite=True)
    with open_batch_stream(config) as stream:
        for _ in range(5):
            next(stream)
        assert stream.checkpoint().epochs == [2]  # 25 rows of a 10-row source


def test_batch_checkpoint_is_the_position_after_that_batch(shard: ShardWriter) -> None:
    config = two_sources(shard, infinite=True)
    with open_batch_stream(config) as stream:
        batches = [next(stream) for _ in range(6)]
        assert batches[2].checkpoint() != stream.checkpoint()
        assert batches[5].checkpoint() == stream.checkpoint()
        early = batches[2].checkpoint()
    with resume_batch_stream(early) as resumed:
        assert next(resumed).arrays()["v"].tolist() == batches[3].arrays()["v"].tolist()


def test_pickles_through_its_json(shard: ShardWriter) -> None:
    with open_batch_stream(two_sources(shard)) as stream:
        next(stream)
        checkpoint = stream.checkpoint()
    assert pickle.loads(pickle.dumps(checkpoint)) == checkpoint


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda text: text[:-10], "not valid JSON"),
        (lambda text: json.dumps({**json.loads(text), "version": 99}), "version 99"),
        # Another release's document is refused for its version even where it does not parse.
        (lambda text: json.dumps({**json.loads(text), "version": 5, "cursor": "x"}), "version 5 is not"),
        (lambda text: json.dumps({**json.loads(text), "version": "1"}), 'version "1" is not'),
        (
            lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "version"}),
            "no version",
        ),
        (lambda text: text.replace('"seed":', '"seed":1'), "fingerprint"),
        (lambda text: json.dumps({**json.loads(text), "cursor": "x"}), "malformed"),
    ],
)
def test_corrupt_documents_are_refused(shard: ShardWriter, mutate, message: str) -> None:
    with open_batch_stream(two_sources(shard)) as stream:
        next(stream)
        text = stream.checkpoint().to_json()
    with pytest.raises(CheckpointError, match=message):
        Checkpoint.from_json(mutate(text))


def test_another_ranks_checkpoint_is_refused(shard: ShardWriter) -> None:
    with open_batch_stream(two_sources(shard, rank=1, world_size=2)) as stream:
        next(stream)
        checkpoint = stream.checkpoint()
    assert (checkpoint.rank, checkpoint.world_size) == (1, 2)
    with pytest.raises(CheckpointError, match="belongs to rank 1 of 2"):
        resume_batch_stream(checkpoint, rank=0, world_size=2)
    resume_batch_stream(checkpoint, rank=1, world_size=2).close()


def test_a_changed_file_list_is_refused(shard: ShardWriter, tmp_path) -> None:
    path = shard("jsonl", [{"v": i} for i in range(20)], name="data")
    config = config_for([FileSource(files=[path])], [V], batch_size=2)
    with open_batch_stream(config) as stream:
        next(stream)
        checkpoint = stream.checkpoint()
    shard("jsonl", [{"v": i} for i in range(25)], name="data")  # the shard was rewritten
    with pytest.raises(
        CheckpointError, match=r"data\.jsonl is \d+ bytes, but the checkpoint's stream read it"
    ):
        resume_batch_stream(checkpoint)
    other = config_for([FileSource(files=[path, shard("jsonl", [{"v": 1}])])], [V], batch_size=2)
    with pytest.raises(CheckpointError, match="file list"):
        resume_batch_stream(checkpoint, config=other)


def test_elastic_resume_continues_the_global_sequence_on_another_world(shard: ShardWriter) -> None:
    config = two_sources(shard, infinite=True)
    with open_batch_stream(config) as single:
        reference = {b.batch_index: b.arrays()["v"].tolist() for b in (next(single) for _ in range(40))}
    checkpoints = []
    for rank in range(2):
        with open_batch_stream(two_sources(shard, infinite=True, rank=rank, world_size=2)) as stream:
            for _ in range(5):
                next(stream)
            checkpoints.append(stream.checkpoint())
    assert checkpoints[0].next_batch == checkpoints[1].next_batch == 10
    for new_rank in range(3):
        moved = checkpoints[new_rank % 2].for_world(rank=new_rank, world_size=3)
        with resume_batch_stream(moved, rank=new_rank, world_size=3) as resumed:
            for _ in range(6):
                batch = next(resumed)
                # Rounds of the new world start at the checkpoint's next batch.
                assert (batch.batch_index - 10) % 3 == new_rank
                assert batch.arrays()["v"].tolist() == reference[batch.batch_index]
    with pytest.raises(Exception, match="not below world_size"):
        checkpoints[0].for_world(rank=3, world_size=3)


def test_resume_far_into_an_infinite_stage_needs_no_replay(shard: ShardWriter) -> None:
    config = two_sources(shard, infinite=True)
    with open_batch_stream(config) as stream:
        next(stream)
        document = json.loads(stream.checkpoint().to_json())
    document["cursor"]["next_batch"] = 10_000_000
    deep = Checkpoint.from_json(json.dumps(document))
    with resume_batch_stream(deep) as resumed:
        first = [next(resumed) for _ in range(3)]
        assert [b.batch_index for b in first] == [10_000_000, 10_000_001, 10_000_002]
        again = first[0].checkpoint()
    with resume_batch_stream(again) as resumed:
        assert ids([next(resumed), next(resumed)]) == ids(first[1:])


@pytest.mark.parametrize("encoding", ["jsonl", "jsonl.gz", "msgpack"])
def test_ranks_each_read_only_their_own_rows(shard: ShardWriter, encoding: str) -> None:
    # Self-describing encodings only: a Parquet column has one type for every row.
    world, bs = 4, 2
    # Rows of other ranks' batches carry a string: decoding any of them would fail.
    records = [{"v": i if (i // bs) % world == 0 else "not a number"} for i in range(64)]
    path = shard(encoding, records)
    config = config_for([FileSource(files=[path])], [V], batch_size=bs, rank=0, world_size=world)
    with open_batch_stream(config) as stream:
        got = [v for b in stream for v in b.arrays()["v"].tolist()]
    assert got == [i for i in range(64) if (i // bs) % world == 0]


def test_advance_switches_at_the_next_batch_boundary(shard: ShardWriter) -> None:
    easy = shard("parquet", [{"v": i} for i in range(100)])
    hard = shard("msgpack", [{"v": 1000 + i} for i in range(100)])
    fields = [V, ProjectedField("stg", "@stage", "i64")]
    config = BatchStreamConfig(
        fields=fields,
        stages=[
            Stage(
                sources=[FileSource(files=[easy])],
                batch_size=4,
                shuffle=Shuffle(buffer_rows=16, unit_rows=1),
                infinite=True,
            ),
            Stage(sources=[FileSource(files=[hard])], batch_size=4),
        ],
        prefetch_batches=8,
    )
    with open_batch_stream(config) as stream:
        before = [next(stream) for _ in range(2)]  # 8 rows: half of the first 16-row window
        stream.advance(0)  # same stage: no-op
        stream.advance(1)
        stream.advance(1)
        after = list(stream)
        assert stream.stage == 1
    assert all(b.stage == 0 for b in before)
    assert all(b.stage == 1 for b in after)
    drained = [v for b in after for v, s in zip(b.arrays()["v"], b.arrays()["stg"], strict=True) if s == 0]
    # The 8 rows left in the open window come first, then the new stage from its start.
    assert sorted(drained + [v for b in before for v in b.arrays()["v"]]) == list(range(16))
    assert [v for b in after for v in b.arrays()["v"]][:8] == drained
    assert [v for b in after for v in b.arrays()["v"]][8:] == list(
        range(1000, 1100)
    )  # 108 rows: 27 full batches
    assert [b.batch_index for b in after] == list(range(2, 2 + len(after)))


def test_a_finite_stage_ends_the_stream_instead_of_advancing(shard: ShardWriter) -> None:
    first = shard("jsonl", [{"v": i} for i in range(8)])
    second = shard("jsonl", [{"v": 100 + i} for i in range(8)])
    config = BatchStreamConfig(
        fields=[V],
        stages=[
            Stage(sources=[FileSource(files=[first])], batch_size=4),
            Stage(sources=[FileSource(files=[second])], batch_size=4),
        ],
    )
    with open_batch_stream(config) as stream:
        assert len(list(stream)) == 2
        assert stream.stage == 0


def test_advance_to_a_missing_stage_and_after_close(shard: ShardWriter) -> None:
    from o41_training_data import ConfigError

    path = shard("jsonl", [{"v": i} for i in range(8)])
    stream = open_batch_stream(config_for([FileSource(files=[path])], [V], batch_size=2))
    with pytest.raises(ConfigError, match="no stage 3"):
        stream.advance(3)
    stream.close()
    with pytest.raises(StreamClosedError):
        stream.advance(0)
    with pytest.raises(StreamClosedError):
        stream.checkpoint()


def test_row_identity_is_stable_and_auditable(shard: ShardWriter) -> None:
    a = shard("parquet", [{"v": i} for i in range(6)])
    b = shard("jsonl", [{"v": 100 + i} for i in range(4)])
    fields = [V] + [ProjectedField(n, f"@{n}", "i64") for n in ("row_id", "source", "shard", "row", "epoch")]
    config = config_for([FileSource(files=[a, b])], fields, batch_size=5, infinite=True)
    with open_batch_stream(config) as stream:
        rows = [next(stream).arrays() for _ in range(4)]
    v = np.concatenate([r["v"] for r in rows])
    shard_ = np.concatenate([r["shard"] for r in rows])
    row = np.concatenate([r["row"] for r in rows])
    epoch = np.concatenate([r["epoch"] for r in rows])
    row_id = np.concatenate([r["row_id"] for r in rows])
    assert np.array_equal(v, np.where(shard_ == 0, row, 100 + row))
    assert np.array_equal(epoch, np.arange(20) // 10)
    assert np.array_equal(row_id, np.where(shard_ == 0, row, 6 + row))  # index in the listed order
    assert np.all(np.concatenate([r["source"] for r in rows]) == 0)


def test_a_share_switches_stage_only_after_owed_batches(shard: ShardWriter) -> None:
    easy = shard("parquet", [{"v": i} for i in range(200)])
    hard = shard("jsonl", [{"v": 1000 + i} for i in range(200)])
    config = BatchStreamConfig(
        fields=[V],
        stages=[
            Stage(sources=[FileSource(files=[easy])], batch_size=4, infinite=True),
            Stage(sources=[FileSource(files=[hard])], batch_size=4, infinite=True),
        ],
    )
    with open_batch_stream(config) as whole:
        reference = [next(whole) for _ in range(5)]
        whole.advance(1)
        reference += [next(whole) for _ in range(6)]
    expected = [b.arrays()["v"].tolist() for b in reference[1::2]]
    with open_batch_stream(config, share=(1, 2)) as odd:
        got = [next(odd).arrays()["v"].tolist()]
        odd.advance(1, at=5)  # the switch is at global batch 5 (world size 1); batch 3 is still owed
        got += [next(odd).arrays()["v"].tolist() for _ in range(len(expected) - 1)]
    assert got == expected
    assert got[1][0] < 1000
    assert got[2][0] >= 1000


def test_reading_and_writing_a_large_checkpoint_lets_other_threads_run(tmp_path) -> None:
    """`from_json` and `to_json` release the GIL: a Python thread runs while they work."""
    # A manifest of many shards (only the first exists; open reads no other) makes a checkpoint
    # large enough for each call to take milliseconds.
    pq.write_table(pa.table({"v": pa.array(range(100), pa.int64())}), tmp_path / "s0.parquet")
    entries = [{"location": "s0.parquet", "rows": 100, "bytes": (tmp_path / "s0.parquet").stat().st_size}]
    entries += [{"location": f"absent/s{k}.parquet", "rows": 100, "bytes": 1000} for k in range(1, 20_000)]
    for entry in entries:
        entry["checksum"] = "none:0"
    document = {"format": "o41-data-manifest", "version": 1, "data_format": "parquet"}
    document["splits"] = {"train": {"shards": entries}}
    (tmp_path / "manifest.json").write_text(json.dumps(document))
    config = config_for([ManifestSource(str(tmp_path / "manifest.json"), "train")], [V], batch_size=4)
    with open_batch_stream(config) as stream:
        checkpoint = stream.checkpoint()
    text = checkpoint.to_json()

    ticks = 0
    stop = threading.Event()

    def tick() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.0001)

    # No forced switches: the ticker runs only while the main thread has released the GIL.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60)
    ticker = threading.Thread(target=tick)
    ran_during = {}
    try:
        ticker.start()
        calls = {"from_json": lambda: Checkpoint.from_json(text), "to_json": checkpoint.to_json}
        for name, call in calls.items():
            ran_during[name] = False
            for _ in range(20):
                before = ticks
                call()
                if ticks > before:
                    ran_during[name] = True
                    break
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        ticker.join()
    assert ran_during == {"from_json": True, "to_json": True}
