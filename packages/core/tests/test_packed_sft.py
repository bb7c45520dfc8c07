"""Packed SFT as TRL users expect it: whole documents only (``Packing(overflow="drop")`` leaves a
document longer than a window out, counted and resumed exactly; ``"error"`` refuses it), bool
masks beside the tokens, and ``@labels``: the ids shifted by one with the ignore index where a
token has no successor in its document or is not trained on."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from o41_testkit.corpora import token_corpus as corpus
from o41_training_data import (
    BatchStreamConfig,
    ConfigError,
    FileSource,
    Packing,
    ProjectedField,
    ProjectionError,
    Shuffle,
    Stage,
    TokenWindows,
    open_batch_stream,
)
from o41_training_data.testing import assert_resumable

Docs = list[list[int]]
IGNORE = -100


def trained(token: int) -> int:
    """The mask the corpora here carry: every token but those divisible by 4 is trained on."""
    return int(token % 4 != 0)


def write_sft(path: Path, docs: Docs) -> Path:
    masks = [[trained(t) for t in doc] for doc in docs]
    table = pa.table(
        {
            "input_ids": pa.array(docs, pa.list_(pa.int32())),
            "loss_mask": pa.array(masks, pa.list_(pa.uint8())),
        }
    )
    pq.write_table(table, path, row_group_size=3)
    return path


def sft_config(
    path: Path, seq_len: int, *, overflow: str = "split", labels: str = "@labels:loss_mask", **stage: object
) -> BatchStreamConfig:
    return BatchStreamConfig(
        fields=[
            ProjectedField("input_ids", "input_ids", "i32", length=seq_len),
            ProjectedField("loss_mask", "loss_mask", "bool", length=seq_len),
            ProjectedField("labels", labels, "i64", length=seq_len, pad=IGNORE),
            ProjectedField("segment_ids", "@segment_ids", "i32", length=seq_len),
            ProjectedField("positions", "@positions", "i32", length=seq_len),
        ],
        stages=[
            Stage(
                sources=[FileSource(files=[str(path)])],
                batch_size=stage.pop("batch_size", 1),  # type: ignore[arg-type]
                packing=Packing(field="input_ids", seq_len=seq_len, bins=3, overflow=overflow),  # type: ignore[arg-type]
                **stage,  # type: ignore[arg-type]
            )
        ],
        threads=2,
    )


def rows(config: BatchStreamConfig) -> list[dict[str, np.ndarray]]:
    with open_batch_stream(config) as stream:
        return [{k: v[r].copy() for k, v in b.arrays().items()} for b in stream for r in range(b.num_rows)]


def check_labels(row: dict[str, np.ndarray], masked: bool = True) -> None:
    """Every label is the next token of the same piece of a document where that token is
    trained on, and the ignore index everywhere else."""
    ids, labels, segments = row["input_ids"], row["labels"], row["segment_ids"]
    for t in range(len(ids)):
        successor = t + 1 < len(ids) and segments[t] > 0 and segments[t + 1] == segments[t]
        if successor and (not masked or trained(int(ids[t + 1]))):
            assert labels[t] == ids[t + 1], (t, row)
        else:
            assert labels[t] == IGNORE, (t, row)


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(0, 20), min_size=1, max_size=25), seq_len=st.integers(4, 12))
def test_labels_are_the_next_token_of_the_same_document(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[int], seq_len: int
) -> None:
    docs = corpus(lengths)
    if not any(docs):
        return
    path = write_sft(tmp_path_factory.mktemp("sft") / "sft.parquet", docs)
    for masked in (True, False):
        config = sft_config(path, seq_len, labels="@labels:loss_mask" if masked else "@labels")
        delivered = rows(config)
        for row in delivered:
            check_labels(row, masked)
            assert row["loss_mask"].dtype == np.uint8
            used = row["segment_ids"] > 0
            np.testing.assert_array_equal(
                row["loss_mask"][used], [trained(int(t)) for t in row["input_ids"][used]]
            )


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(0, 20), min_size=1, max_size=25), seq_len=st.integers(4, 12))
def test_drop_delivers_exactly_the_documents_that_fit_each_whole(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[int], seq_len: int
) -> None:
    docs = corpus(lengths)
    if not any(len(d) <= seq_len and d for d in docs):
        return
    path = write_sft(tmp_path_factory.mktemp("sft") / "sft.parquet", docs)
    config = sft_config(path, seq_len, overflow="drop")
    with open_batch_stream(config) as stream:
        delivered = [{k: v[0].copy() for k, v in b.arrays().items()} for b in stream]
        assert stream.stats.sources[0].dropped_rows == sum(n > seq_len for n in lengths)
    whole = [
        row["input_ids"][row["segment_ids"] == s].tolist()
        for row in delivered
        for s in range(1, int(row["segment_ids"].max()) + 1)
    ]
    assert sorted(whole) == sorted(d for d in docs if 0 < len(d) <= seq_len)


def test_overflow_drop_leaves_long_documents_out_counted_and_resumed(tmp_path: Path) -> None:
    lengths = [5, 17, 3, 8, 9, 30, 2, 8, 6, 11, 4, 7, 1, 5]
    seq_len = 8
    docs = corpus(lengths)
    path = write_sft(tmp_path / "sft.parquet", docs)
    config = sft_config(path, seq_len, overflow="drop")
    with open_batch_stream(config) as stream:
        delivered = [{k: v[0].copy() for k, v in b.arrays().items()} for b in stream]
        stats = stream.stats
    long_docs = sum(n > seq_len for n in lengths)
    assert stats.sources[0].dropped_rows == long_docs == 4
    documents = []
    for row in delivered:
        for s in range(1, int(row["segment_ids"].max()) + 1):
            at = np.flatnonzero(row["segment_ids"] == s)
            assert row["positions"][at[0]] == 0, "every document starts its segment"
            documents.append(row["input_ids"][at].tolist())
        check_labels(row)
    assert sorted(documents) == sorted(d for d in docs if 0 < len(d) <= seq_len)
    # Split (the default) keeps the long ones, cut into windows.
    split = rows(sft_config(path, seq_len))
    assert sum(int((r["segment_ids"] > 0).sum()) for r in split) == sum(lengths)
    shuffled = sft_config(
        path,
        seq_len,
        overflow="drop",
        shuffle=Shuffle(buffer_rows=4, unit_rows=1),
        batch_size=2,
        infinite=True,
    )
    assert_resumable(shuffled, batches=8)
    ranks = [
        rows(replace(shuffled, rank=r, world_size=2, stages=[replace(shuffled.stages[0], infinite=False)]))
        for r in range(2)
    ]
    for rank in ranks:
        for row in rank:
            check_labels(row)


def test_overflow_error_names_the_shard_and_document(tmp_path: Path) -> None:
    path = write_sft(tmp_path / "sft.parquet", corpus([3, 4, 12, 2]))
    with pytest.raises(
        ProjectionError, match=r"sft\.parquet.*document 2 holds 12 tokens, more than a window's 8"
    ) as refused:
        rows(sft_config(path, 8, overflow="error"))
    assert refused.value.row == 2


def test_drop_applies_to_eos_documents_of_token_streams_too(tmp_path: Path) -> None:
    ids = np.array([5, 6, 0, 7, 8, 9, 10, 11, 12, 0, 13, 0], dtype=np.uint16)
    np.save(tmp_path / "t.npy", ids)
    config = BatchStreamConfig(
        fields=[
            ProjectedField("ids", "tokens", "i32", length=4),
            ProjectedField("labels", "@labels", "i32", length=4, pad=-1),
        ],
        stages=[
            Stage(
                sources=[FileSource(files=[str(tmp_path / "t.npy")])],
                batch_size=1,
                packing=Packing("tokens", 4, eos_id=0, overflow="drop"),
            )
        ],
    )
    with open_batch_stream(config) as stream:
        got = sorted(b.arrays()["ids"][0].tolist() for b in stream)
        assert stream.stats.sources[0].dropped_rows == 1
    # The 7-token document is left out; the others fill a window each (3 + 2 > 4), padded with 0.
    assert got == [[5, 6, 0, 0], [13, 0, 0, 0]]
    with open_batch_stream(config) as stream:
        labels = sorted(b.arrays()["labels"][0].tolist() for b in stream)
    assert labels == [[0, -1, -1, -1], [6, 0, -1, -1]]


def test_labels_in_stream_windows_shift_within_the_window(tmp_path: Path) -> None:
    path = write_sft(tmp_path / "sft.parquet", corpus([5, 9, 3]))
    config = BatchStreamConfig(
        fields=[
            ProjectedField("input_ids", "input_ids", "i32", length=5),
            ProjectedField("labels", "@labels", "i64", length=5, pad=IGNORE),
            ProjectedField("segment_ids", "@segment_ids", "i32", length=5),
        ],
        stages=[
            Stage(sources=[FileSource(files=[str(path)])], batch_size=1, windows=TokenWindows("input_ids", 4))
        ],
    )
    for row in rows(config):
        check_labels(row, masked=False)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pad": 0}, r"fields\[2\]\.pad.*ignore index.*pad=-100"),
        ({"source": "@labels:nope"}, r"fields\[2\]\.source.*'nope'"),
        ({"source": "@labels:input_ids"}, r"fields\[2\]\.source"),
        ({"dtype": "f32"}, r"fields\[2\].*dtype i32 or i64"),
        ({"length": 3}, r"fields\[2\].*length 8"),
    ],
)
def test_labels_declarations_are_checked(tmp_path: Path, change: dict[str, object], message: str) -> None:
    path = write_sft(tmp_path / "sft.parquet", corpus([3]))
    config = sft_config(path, 8)
    fields = list(config.fields)
    shape = {"shape": None} if "length" in change else {}
    fields[2] = replace(fields[2], **change, **shape)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=message):
        open_batch_stream(replace(config, fields=fields))


def test_labels_need_a_token_stage(tmp_path: Path) -> None:
    path = write_sft(tmp_path / "sft.parquet", corpus([3]))
    config = BatchStreamConfig(
        fields=[
            ProjectedField("labels", "@labels", "i64", length=4, pad=IGNORE),
            ProjectedField("i", "input_ids", "i32", length=4),
        ],
        stages=[Stage(sources=[FileSource(files=[str(path)])], batch_size=1)],
    )
    with pytest.raises(ConfigError, match=r"'@labels' is filled by stages that pack or window tokens"):
        open_batch_stream(config)


def test_the_token_fields_overflow_points_at_packing_overflow(tmp_path: Path) -> None:
    path = write_sft(tmp_path / "sft.parquet", corpus([3]))
    config = sft_config(path, 8)
    fields = list(config.fields)
    fields[0] = replace(fields[0], overflow="drop")
    with pytest.raises(ConfigError, match=r"packing\.overflow \('split', 'drop', 'error'\)"):
        open_batch_stream(replace(config, fields=fields))


def test_a_bool_mask_holds_only_zeros_and_ones(tmp_path: Path) -> None:
    docs = corpus([3, 4])
    table = pa.table(
        {
            "input_ids": pa.array(docs, pa.list_(pa.int32())),
            "loss_mask": pa.array([[1, 2, 0], [0, 1, 1, 1]], pa.list_(pa.uint8())),
        }
    )
    pq.write_table(table, tmp_path / "bad.parquet")
    with pytest.raises(ProjectionError, match=r"loss_mask.*value 2 does not fit dtype bool"):
        rows(sft_config(tmp_path / "bad.parquet", 8))
