"""Provenance (docs/order.md, "Provenance"): the rows of any global batch, from counts alone,
checked against the rows real streams deliver, on every rank, from configs and checkpoints."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from o41_testkit import write_shard
from o41_testkit.corpora import token_config, token_corpus, write_token_lists
from o41_training_data import (
    BatchStreamConfig,
    ConfigError,
    FileSource,
    Packing,
    ProjectedField,
    Ramp,
    Shuffle,
    Stage,
    TracedRow,
    open_batch_stream,
    read_traced_rows,
    resume_batch_stream,
    trace_batches,
)
from o41_training_data._cli import main

V = ProjectedField("v", "v", "i64")


def two_sources(tmp_path: Path, **stage: object) -> list[FileSource]:
    a = write_shard(tmp_path / "a.jsonl", "jsonl", [{"v": i} for i in range(90)])
    b1 = write_shard(tmp_path / "b1.parquet", "parquet", [{"v": 1000 + i} for i in range(50)])
    b2 = write_shard(tmp_path / "b2.msgpack", "msgpack", [{"v": 2000 + i} for i in range(40)])
    return [FileSource([str(a)], weight=2.0), FileSource([str(b1), str(b2)])]


def config_of(tmp_path: Path, world_size: int = 1, **stage: object) -> BatchStreamConfig:
    return BatchStreamConfig(
        fields=[V],
        stages=[
            Stage(
                sources=two_sources(tmp_path),
                batch_size=6,
                shuffle=Shuffle(buffer_rows=24, unit_rows=2),
                infinite=True,
                **stage,  # type: ignore[arg-type]
            )
        ],
        seed=11,
        threads=1,
        world_size=world_size,
    )


def delivered(config: BatchStreamConfig, batches: int) -> dict[tuple[int, int], list[int]]:
    """(global batch, rank) -> the values delivered, for every rank of the config's world."""
    out: dict[tuple[int, int], list[int]] = {}
    for rank in range(config.world_size):
        with open_batch_stream(dataclasses.replace(config, rank=rank)) as stream:
            for _ in range(batches):
                batch = next(stream)
                out[(batch.batch_index, rank)] = batch.arrays()["v"].tolist()
    return out


def traced_values(rows: list[TracedRow]) -> dict[tuple[int, int], list[int]]:
    records = read_traced_rows(rows)
    out: dict[tuple[int, int], list[int]] = {}
    for row, record in zip(rows, records, strict=True):
        assert record is not None
        out.setdefault((row.global_batch, row.rank), []).append(record["v"])
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_a_trace_names_exactly_the_rows_every_rank_receives(tmp_path: Path, world_size: int) -> None:
    config = config_of(tmp_path, world_size)
    got = delivered(config, 12)
    rows = trace_batches(config, range(0, 12 * world_size))
    assert traced_values(rows) == got
    # The same global batches for another world size; only the receiving ranks change.
    other = trace_batches(config, range(0, 12 * world_size), world_size=5)
    assert [(r.global_batch, r.path, r.row) for r in other] == [(r.global_batch, r.path, r.row) for r in rows]
    assert {r.rank for r in other} == set(range(5))
    assert {(Path(r.path).name, r.source, r.shard) for r in rows} <= {
        ("a.jsonl", 0, 0),
        ("b1.parquet", 1, 0),
        ("b2.msgpack", 1, 1),
    }


def test_a_ramped_stage_shares_every_batch_and_the_trace_says_who_gets_what(tmp_path: Path) -> None:
    config = config_of(tmp_path, 2, ramp=Ramp(start=2, increment=2, rows=30))
    got = delivered(config, 10)
    assert traced_values(trace_batches(config, range(0, 10))) == got


def test_a_checkpoint_traces_its_own_document_after_a_stage_switch(tmp_path: Path) -> None:
    first = two_sources(tmp_path)
    later = write_shard(tmp_path / "c.jsonl", "jsonl", [{"v": 5000 + i} for i in range(80)])
    config = BatchStreamConfig(
        fields=[V],
        stages=[
            Stage(sources=first, batch_size=4, infinite=True, shuffle=Shuffle(buffer_rows=16)),
            Stage(sources=[FileSource([str(later)])], batch_size=4, infinite=True),
        ],
        seed=2,
        threads=1,
    )
    with open_batch_stream(config) as stream:
        for _ in range(5):
            next(stream)
        stream.advance(1)
        batch = next(stream)
        checkpoint = batch.checkpoint()
        expected = {(batch.batch_index, 0): batch.arrays()["v"].tolist()}
        for _ in range(6):
            b = next(stream)
            expected[(b.batch_index, 0)] = b.arrays()["v"].tolist()
    start = checkpoint.position.segment.start_batch
    assert start == 5
    rows = trace_batches(checkpoint, range(start, start + 7))
    assert traced_values(rows) == expected
    # Rows drained from stage 0's shuffle window name stage 0 and its shards; the rest, stage 1.
    assert {(r.stage, Path(r.path).name == "c.jsonl") for r in rows} == {(0, False), (1, True)}
    with pytest.raises(ConfigError, match=r"global_batch.*before the segment this position is in"):
        trace_batches(checkpoint, 3)
    # The resumed stream delivers what the trace says.
    with resume_batch_stream(checkpoint) as resumed:
        b = next(resumed)
        assert traced_values(trace_batches(checkpoint, b.batch_index)) == {
            (b.batch_index, 0): b.arrays()["v"].tolist()
        }


def test_a_finite_stage_and_bad_arguments_are_refused_by_name(tmp_path: Path) -> None:
    config = dataclasses.replace(
        config_of(tmp_path), stages=[Stage(sources=two_sources(tmp_path), batch_size=6)]
    )
    last = (90 + 50 + 40) // 6 - 1
    assert trace_batches(config, last)[-1].global_batch == last
    with pytest.raises(ConfigError, match=r"global_batch.*ends before global batch 30"):
        trace_batches(config, last + 1)
    for bad in (-1, range(3, 3), range(0, 8, 2), "3", True):
        with pytest.raises(ConfigError, match="invalid global_batches"):
            trace_batches(config, bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="world_size"):
        trace_batches(config, 0, world_size=0)


def test_validation_padding_rows_are_flagged(tmp_path: Path) -> None:
    path = write_shard(tmp_path / "v.jsonl", "jsonl", [{"v": i} for i in range(10)])
    config = BatchStreamConfig(
        fields=[V], stages=[Stage(sources=[FileSource([str(path)])], batch_size=4)], validation_pass=True
    )
    rows = trace_batches(config, range(0, 3))
    assert [r.padding for r in rows] == [False] * 10 + [True] * 2
    assert read_traced_rows(rows)[-2:] == [None, None]
    assert [r["v"] for r in read_traced_rows(rows)[:10] if r is not None] == list(range(10))


def delivered_documents(batch_row: dict, segment_field: str = "segment_ids") -> list[list[int]]:
    """The token runs of one delivered window, segment by segment."""
    segments = batch_row[segment_field]
    return [batch_row["tokens"][segments == s].tolist() for s in range(1, int(segments.max()) + 1)]


@pytest.mark.parametrize("overflow", ["split", "drop"])
def test_a_traced_window_names_the_documents_it_holds(tmp_path: Path, overflow: str) -> None:
    docs = token_corpus([5, 9, 3, 12, 1, 7, 4, 8] * 3)
    path = write_token_lists(tmp_path / "t.parquet", docs)
    config = token_config(
        FileSource([str(path)]),
        packing=Packing(field="tokens", seq_len=8, bins=3, overflow=overflow),  # type: ignore[arg-type]
        shuffle=Shuffle(buffer_rows=6, unit_rows=1),
    )
    traced = trace_batches(config, range(0, 6))
    assert all(r.window for r in traced)
    with open_batch_stream(config) as stream:
        batches = [next(stream).arrays() for _ in range(6)]
    for row, batch in zip(traced, batches, strict=True):
        runs = delivered_documents({k: v[0] for k, v in batch.items()})
        # Each traced document is the record and token range the window's segment holds.
        assert [docs[d.record][d.start : d.end] for d in row.documents if d.record is not None] == runs
        assert [d.position for d in row.documents] == [
            int(batch["positions"][0][batch["segment_ids"][0] == s][0]) for s in range(1, len(runs) + 1)
        ]
    records = read_traced_rows(traced)
    assert records[0] == {
        "window": traced[0].row,
        "documents": [dataclasses.asdict(d) for d in traced[0].documents],
    }
    # From a checkpoint too (the traced shards' boundaries are read, as open reads them).
    with open_batch_stream(config) as stream:
        next(stream)
        checkpoint = stream.checkpoint()
    assert trace_batches(checkpoint, range(1, 6)) == traced[1:]


def test_a_traced_window_of_a_flat_token_stream_counts_from_the_streams_start(tmp_path: Path) -> None:
    import numpy as np

    ids = np.array([5, 6, 0, 7, 8, 9, 0, 10, 0], dtype=np.uint16)
    np.save(tmp_path / "t.npy", ids)
    config = token_config(
        FileSource([str(tmp_path / "t.npy")]), seq_len=4, packing=Packing("tokens", 4, eos_id=0)
    )
    traced = trace_batches(config, range(0, 3))
    spans = sorted((d.start, d.end) for row in traced for d in row.documents)
    assert all(d.record is None for row in traced for d in row.documents)
    assert spans == [(0, 3), (3, 7), (7, 9)]


def test_o41_trace_prints_one_json_line_per_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = config_of(tmp_path, 2)
    file = tmp_path / "stream.json"
    file.write_text(config.to_json())
    assert main(["trace", str(file), "--global-batch", "4", "--to", "5", "--rows"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = trace_batches(config, range(4, 6))
    assert [{k: v for k, v in line.items() if k != "record"} for line in lines] == [
        json.loads(json.dumps(dataclasses.asdict(r))) for r in expected
    ]
    assert [line["record"]["v"] for line in lines] == [r["v"] for r in read_traced_rows(expected) if r]
    # From a checkpoint file, nothing but the document is needed.
    with open_batch_stream(dataclasses.replace(config, rank=1)) as stream:
        checkpoint = next(stream).checkpoint()
    saved = tmp_path / "rank1.json"
    saved.write_text(checkpoint.to_json())
    assert main(["trace", str(saved), "--global-batch", "5"]) == 0
    from_checkpoint = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert from_checkpoint == [
        json.loads(json.dumps(dataclasses.asdict(r))) for r in trace_batches(config, 5)
    ]
    assert main(["trace", str(file), "--global-batch", "5", "--to", "4"]) == 2
