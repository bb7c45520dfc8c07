"""Token corpora: documents packed into windows, stream windows, `.bin` and Parquet token shards.

Every token written here is unique (a running counter), except eos ids, so a delivered token
names the document and position it came from and the properties can be checked exactly.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from o41_testkit import LocalS3Server, data_for, upload
from o41_training_data import (
    BatchStreamConfig,
    ConfigError,
    FileSource,
    MalformedShardError,
    ManifestSource,
    Packing,
    ProjectedField,
    ProjectionError,
    Shuffle,
    Stage,
    TokenWindows,
    TrainingData,
    open_batch_stream,
    resume_batch_stream,
)
from o41_training_data.testing import assert_resumable

EOS = 0

Docs = list[list[int]]


def corpus(lengths: list[int], first: int = 1) -> Docs:
    """Documents of the given lengths holding unique ids from ``first`` on."""
    docs, next_id = [], first
    for n in lengths:
        docs.append(list(range(next_id, next_id + n)))
        next_id += n
    return docs


def write_bin(path: Path, docs: Docs, dtype: str = "uint16", eos: int | None = EOS) -> Path:
    """A ``.bin`` shard: each document followed by ``eos``, and its ``meta.json``."""
    stream = [t for doc in docs for t in ([*doc, eos] if eos is not None else doc)]
    np.asarray(stream, dtype=np.dtype(dtype).newbyteorder("<")).tofile(path)
    meta = {"dtype": dtype, "eos_id": eos}
    (path.parent / "meta.json").write_text(json.dumps(meta))
    return path


def write_lists(path: Path, docs: Docs, writer: str = "pyarrow") -> Path:
    """A Parquet shard of one record per document, its tokens in a list column ``tokens``.

    ``writer``: ``pyarrow``, ``polars``, or ``duckdb-V1`` / ``duckdb-V2`` (DuckDB's
    ``PARQUET_VERSION``; V2 delta-encodes the ids).
    """
    table = pa.table({"tokens": pa.array(docs, pa.list_(pa.int32())), "n": [len(d) for d in docs]})
    if writer == "polars":
        pl.DataFrame({"tokens": docs, "n": [len(d) for d in docs]}).write_parquet(path, row_group_size=7)
    elif writer.startswith("duckdb-"):
        version = writer.removeprefix("duckdb-")
        with duckdb.connect() as db:
            db.register("lists", table)
            db.execute(
                f"COPY lists TO '{path}' "
                f"(FORMAT parquet, COMPRESSION 'zstd', ROW_GROUP_SIZE 7, PARQUET_VERSION {version})"
            )
    else:
        pq.write_table(table, path, row_group_size=7)
    return path


def fields(length: int, dtype: str = "i32") -> list[ProjectedField]:
    return [
        ProjectedField(name="tokens", source="tokens", dtype=dtype, length=length),  # type: ignore[arg-type]
        ProjectedField(name="segment_ids", source="@segment_ids", dtype="i32", length=length),
        ProjectedField(name="positions", source="@positions", dtype="i32", length=length),
    ]


def packed(
    files: list[Path], seq_len: int, bins: int = 8, batch_size: int = 1, **stage: object
) -> BatchStreamConfig:
    return BatchStreamConfig(
        fields=fields(seq_len),
        stages=[
            Stage(
                sources=[FileSource(files=[str(f) for f in files])],
                batch_size=batch_size,
                packing=Packing(field="tokens", seq_len=seq_len, bins=bins),
                **stage,  # type: ignore[arg-type]
            )
        ],
        threads=2,
    )


def rows(config: BatchStreamConfig, limit: int | None = None) -> list[dict[str, np.ndarray]]:
    with open_batch_stream(config) as stream:
        return drain(stream, limit)


def drain(stream: Iterable[Any], limit: int | None = None) -> list[dict[str, np.ndarray]]:
    """The rows of ``stream``'s batches (its first ``limit`` batches), each a dict of copies."""
    out = []
    for i, batch in enumerate(stream):
        if limit is not None and i >= limit:
            break
        arrays = batch.arrays()
        out.extend({k: v[r].copy() for k, v in arrays.items()} for r in range(batch.num_rows))
    return out


def check_packed(delivered: list[dict[str, np.ndarray]], docs: Docs, seq_len: int, eos: bool) -> None:
    """Every document token exactly once, documents split only to fit, ids and positions
    consistent, padding exactly where the segment id is 0.

    With ``eos`` every document ends in an eos id. A document of a whole number of windows
    leaves a tail of its eos alone, which names no document: those tails are counted by the
    position they carry.
    """
    where = {t: (d, p) for d, doc in enumerate(docs) for p, t in enumerate(doc)}
    seen: Counter[tuple[int, int]] = Counter()
    pieces: Counter[int] = Counter()
    lone_eos: Counter[int] = Counter()
    for row in delivered:
        tokens, segments, positions = row["tokens"], row["segment_ids"], row["positions"]
        assert len(tokens) == seq_len
        used = int(np.count_nonzero(segments))
        # Documents fill the window from its start; the rest is padding (pad 0 everywhere).
        assert (segments[:used] > 0).all()
        assert (segments[used:] == 0).all()
        assert (tokens[used:] == 0).all()
        assert (positions[used:] == 0).all()
        # Segment ids count the window's documents 1, 2, ... in order.
        runs = np.split(np.arange(used), np.flatnonzero(np.diff(segments[:used])) + 1) if used else []
        assert [int(segments[r[0]]) for r in runs] == list(range(1, len(runs) + 1))
        for run in runs:
            if eos and len(run) == 1 and int(tokens[run[0]]) == EOS:
                lone_eos[int(positions[run[0]])] += 1
                continue
            doc = None
            for k, i in enumerate(run):
                token, position = int(tokens[i]), int(positions[i])
                if eos and k == len(run) - 1 and token == EOS and position > 0 and doc is not None:
                    assert position == len(docs[doc]), "eos ends its document"
                    seen[(doc, position)] += 1
                    continue
                d, p = where[token]
                assert p == position, "the position is the token's place in its document"
                assert doc in (None, d), "a segment holds one document"
                doc = d
                seen[(d, p)] += 1
            assert doc is not None
            pieces[doc] += 1
    expected_seen: Counter[tuple[int, int]] = Counter()
    expected_lone: Counter[int] = Counter()
    for d, doc in enumerate(docs):
        n = len(doc)
        expected_seen.update((d, p) for p in range(n))
        whole = n + 1 if eos else n
        lone = eos and n % seq_len == 0
        if eos and not lone:
            expected_seen[(d, n)] += 1
        if lone:
            expected_lone[n] += 1
        # Split only to fit: a document of w windows or less is at most w pieces, each a full
        # window but the last.
        assert pieces[d] == -(-whole // seq_len) - int(lone), f"document {d} ({whole} tokens)"
    assert seen == expected_seen, "every token of the corpus exactly once per epoch"
    assert lone_eos == expected_lone


lengths_strategy = st.lists(st.integers(0, 40), min_size=1, max_size=30)


@given(lengths=lengths_strategy, seq_len=st.integers(4, 24), bins=st.integers(1, 6))
def test_bin_packing_keeps_documents_whole_and_every_token_once(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[int], seq_len: int, bins: int
) -> None:
    docs = corpus(lengths)
    path = write_bin(tmp_path_factory.mktemp("bin") / "corpus.bin", docs)
    check_packed(rows(packed([path], seq_len, bins)), docs, seq_len, eos=True)


@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=30).filter(any),
    seq_len=st.integers(4, 24),
    bins=st.integers(1, 6),
)
def test_parquet_records_pack_as_documents(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[int], seq_len: int, bins: int
) -> None:
    docs = corpus(lengths)
    path = write_lists(tmp_path_factory.mktemp("pq") / "corpus.parquet", docs)
    check_packed(rows(packed([path], seq_len, bins)), docs, seq_len, eos=False)


def lengths_config(path: Path, seq_len: int, bins: int, layout: str, most: int) -> BatchStreamConfig:
    """Tokens, segment ids and a ``@segment_lengths`` row of ``most`` elements (pad -1)."""
    windowed = layout.startswith("windows")
    width = seq_len + 1 if windowed else seq_len
    stage_layout: dict[str, object] = (
        {"windows": TokenWindows("tokens", seq_len, eos_id=EOS if layout.endswith("eos") else None)}
        if windowed
        else {"packing": Packing(field="tokens", seq_len=seq_len, bins=bins)}
    )
    return BatchStreamConfig(
        fields=[
            *fields(width)[:2],
            ProjectedField(name="lengths", source="@segment_lengths", dtype="i32", length=most, pad=-1),
        ],
        stages=[Stage(sources=[FileSource(files=[str(path)])], batch_size=1, **stage_layout)],  # type: ignore[arg-type]
    )


@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=30).filter(any),
    seq_len=st.integers(4, 24),
    bins=st.integers(1, 6),
    layout=st.sampled_from(["bin", "parquet", "windows", "windows, bin eos"]),
)
def test_segment_lengths_are_the_segments_of_each_window(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[int], seq_len: int, bins: int, layout: str
) -> None:
    docs = corpus(lengths)
    folder = tmp_path_factory.mktemp("lengths")
    path = write_bin(folder / "c.bin", docs) if "bin" in layout else write_lists(folder / "c.parquet", docs)
    # A row as long as the window holds every segment it can have.
    delivered = rows(lengths_config(path, seq_len, bins, layout, most=seq_len + 1))
    runs = []
    for row in delivered:
        used = int(np.count_nonzero(row["segment_ids"]))
        ids = row["segment_ids"][:used]
        runs.append(np.diff(np.flatnonzero(np.diff(ids, prepend=-1, append=-1))).tolist())
        assert row["lengths"][: len(runs[-1])].tolist() == runs[-1]
        assert (row["lengths"][len(runs[-1]) :] == -1).all()
    # The shortest row that holds the most segments of any window opens; one shorter is refused
    # at open, naming the field and the shard. Token stats report that length up front.
    most = max(len(r) for r in runs)
    with open_batch_stream(lengths_config(path, seq_len, bins, layout, most=seq_len + 1)) as stream:
        (stats,) = stream.token_stats
    assert stats is not None
    assert stats.most_segments == most
    assert len(rows(lengths_config(path, seq_len, bins, layout, most=most))) == len(delivered)
    if most > 1:
        with pytest.raises(ConfigError, match=rf"c\.(bin|parquet): a window holds {most} segments") as info:
            open_batch_stream(lengths_config(path, seq_len, bins, layout, most=most - 1))
        assert info.value.option == "fields[2].length"


def test_segment_lengths_are_checked_like_the_other_window_columns(tmp_path: Path) -> None:
    path = write_lists(tmp_path / "lists.parquet", corpus([3, 4]))
    records = BatchStreamConfig(
        fields=[ProjectedField(name="lengths", source="@segment_lengths", dtype="i32", length=4)],
        stages=[Stage(sources=[FileSource(files=[str(path)])], batch_size=1)],
    )
    with pytest.raises(ConfigError, match=r"fields\[0\]\.source.*stages\[0\]"):
        open_batch_stream(records)
    for dtype in ("f32", "bool"):
        config = lengths_config(path, 8, 2, "parquet", most=2)
        wrong = ProjectedField(name="lengths", source="@segment_lengths", dtype=dtype, length=2)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=r"fields\[2\].*segment lengths"):
            open_batch_stream(replace(config, fields=[*config.fields[:2], wrong]))


@pytest.mark.parametrize("writer", ["polars", "duckdb-V1", "duckdb-V2"])
def test_token_lists_from_other_writers_pack_as_pyarrow_written_ones_do(tmp_path: Path, writer: str) -> None:
    # Open plans from each writer's repetition and definition levels, and the reader takes the
    # ids from its encodings: the windows are the same whoever wrote the shard.
    docs = corpus([(37 * i) % 300 for i in range(200)])
    expected = rows(packed([write_lists(tmp_path / "pyarrow.parquet", docs)], 128, bins=4))
    check_packed(expected, docs, 128, eos=False)
    got = rows(packed([write_lists(tmp_path / f"{writer}.parquet", docs, writer=writer)], 128, bins=4))
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_parquet_written_by_polars_and_split_at_eos_reads_as_one_stream(tmp_path: Path) -> None:
    docs = corpus([5, 9, 3, 12])
    # Records that are not documents: the stream cut at eos ids makes the documents.
    stream = [t for doc in docs for t in [*doc, EOS]]
    records = [stream[i : i + 4] for i in range(0, len(stream), 4)]
    path = tmp_path / "lists.parquet"
    pl.DataFrame({"tokens": records}).write_parquet(path)
    config = BatchStreamConfig(
        fields=fields(8),
        stages=[
            Stage(
                sources=[FileSource(files=[str(path)])],
                batch_size=1,
                packing=Packing(field="tokens", seq_len=8, bins=2, eos_id=EOS),
            )
        ],
    )
    check_packed(rows(config), docs, 8, eos=True)


def test_saver_written_token_records_pack_through_a_manifest(tmp_path: Path) -> None:
    docs = corpus([3, 17, 6, 1, 9, 4])
    saver = TrainingData().dataset_saver(tmp_path / "data" / "data-manifest-v1.json")
    saver.save("train", None, [{"tokens": d} for d in docs[:3]], shard_id="0")
    saver.save("train", None, [{"tokens": d} for d in docs[3:]], shard_id="1")
    saver.commit_manifest()
    config = BatchStreamConfig(
        fields=fields(8, dtype="i64"),
        stages=[
            Stage(
                sources=[ManifestSource(manifest_uri=str(saver.manifest_uri), split="train")],
                batch_size=1,
                packing=Packing(field="tokens", seq_len=8, bins=4),
            )
        ],
    )
    check_packed(rows(config), docs, 8, eos=False)


@pytest.mark.parametrize("layout", ["packing", "windows cut at eos"])
def test_token_windows_resume_and_change_rank_count_with_the_same_rows(tmp_path: Path, layout: str) -> None:
    docs = corpus([13, 2, 7, 30, 5, 5, 9, 1, 22, 4, 8, 3] * 3)
    path = write_bin(tmp_path / "corpus.bin", docs)
    config = packed(
        [path], 16, bins=3, batch_size=2, shuffle=Shuffle(buffer_rows=6, unit_rows=1), infinite=True
    )
    if layout == "windows cut at eos":
        # Every window column, segment lengths included, is a function of the window alone.
        stage = replace(config.stages[0], packing=None, windows=TokenWindows("tokens", 15, eos_id=EOS))
        lengths = ProjectedField(name="lengths", source="@segment_lengths", dtype="i32", length=16)
        config = replace(config, fields=[*fields(16), lengths], stages=[stage])
    assert_resumable(config, batches=12)
    single = rows(config, limit=12)

    def rank(r: int) -> list[dict[str, np.ndarray]]:
        return rows(replace(config, rank=r, world_size=2), limit=6)

    ranks = [rank(0), rank(1)]
    # Rank r holds global batches r, r + 2, ...: interleaved they are the single-rank run.
    together = [row for g in range(12) for row in ranks[g % 2][(g // 2) * 2 : (g // 2) * 2 + 2]]
    assert len(together) == len(single) == 24
    for a, b in zip(together, single, strict=True):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
    # A checkpoint of the two-rank run resumes on one rank exactly where the ranks stopped.
    with open_batch_stream(replace(config, rank=0, world_size=2)) as stream:
        for _ in range(3):
            next(stream)
        checkpoint = stream.checkpoint().for_world(rank=0, world_size=1)
    with resume_batch_stream(checkpoint, rank=0, world_size=1) as resumed:
        batch = next(resumed)
        np.testing.assert_array_equal(batch.arrays()["tokens"][0], single[12]["tokens"])


def test_stream_windows_see_every_transition_once(tmp_path: Path) -> None:
    ids = np.arange(1, 100, dtype=np.uint32)
    path = tmp_path / "stream.bin"
    ids.tofile(path)
    (tmp_path / "meta.json").write_text(json.dumps({"dtype": "uint32"}))
    config = BatchStreamConfig(
        fields=fields(11),
        stages=[
            Stage(sources=[FileSource(files=[str(path)])], batch_size=1, windows=TokenWindows("tokens", 10))
        ],
    )
    delivered = rows(config)
    assert len(delivered) == 10  # 98 transitions, 10 per window
    transitions = Counter()
    for w, row in enumerate(delivered):
        n = int(np.count_nonzero(row["segment_ids"]))
        assert row["tokens"][0] == 1 + 10 * w
        assert row["positions"][:n].tolist() == list(range(10 * w, 10 * w + n))
        transitions.update(zip(row["tokens"][: n - 1].tolist(), row["tokens"][1:n].tolist(), strict=True))
    assert transitions == Counter((t, t + 1) for t in range(1, 99))


def test_token_stats_report_the_padding_of_the_delivered_windows(tmp_path: Path) -> None:
    docs = corpus([5, 30, 12, 7, 3, 19, 26, 2])
    path = write_bin(tmp_path / "corpus.bin", docs)
    config = packed([path], 16, bins=4)
    delivered = rows(config)
    with open_batch_stream(config) as stream:
        (stats,) = stream.token_stats
        assert stream.memory_bound.token_plans > 0
    assert stats is not None
    padding = sum(int((r["segment_ids"] == 0).sum()) for r in delivered)
    assert stats.windows == len(delivered)
    assert stats.tokens == sum(len(d) + 1 for d in docs)
    assert stats.padding_fraction == pytest.approx(padding / (len(delivered) * 16))


# -- Refusals: each names the file, field or option at fault.


def test_a_bin_shard_without_meta_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "corpus.bin"
    np.arange(10, dtype=np.uint16).tofile(path)
    with pytest.raises(MalformedShardError, match=r"meta\.json"):
        open_batch_stream(packed([path], 8))


def test_a_bin_shard_of_part_of_an_id_is_refused(tmp_path: Path) -> None:
    path = write_bin(tmp_path / "corpus.bin", corpus([4]), dtype="uint32")
    with path.open("ab") as out:
        out.write(b"\x01")
    with pytest.raises(MalformedShardError, match=r"corpus\.bin.*whole number of 4-byte"):
        open_batch_stream(packed([path], 8))


def test_a_meta_json_with_another_dtype_is_refused(tmp_path: Path) -> None:
    path = write_bin(tmp_path / "corpus.bin", corpus([4]))
    (tmp_path / "meta.json").write_text(json.dumps({"dtype": "float32", "eos_id": 0}))
    with pytest.raises(MalformedShardError, match=r"meta\.json.*float32"):
        open_batch_stream(packed([path], 8))


def test_packing_a_bin_without_an_eos_id_is_refused(tmp_path: Path) -> None:
    path = write_bin(tmp_path / "corpus.bin", corpus([4]), eos=None)
    with pytest.raises(ConfigError, match=r"packing\.eos_id"):
        open_batch_stream(packed([path], 8))


def test_an_id_beyond_the_declared_dtype_is_a_projection_error(tmp_path: Path) -> None:
    path = write_bin(tmp_path / "corpus.bin", [[2**31 + 5, 1]], dtype="uint32")
    with pytest.raises(ProjectionError, match=r"corpus\.bin.*2147483653"):
        rows(packed([path], 8))


def test_a_record_encoding_in_a_token_stage_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text('{"tokens": [1, 2]}\n')
    with pytest.raises(ConfigError, match=r"stages\[0\]\.sources\[0\]\.encoding"):
        open_batch_stream(packed([path], 8))


def test_token_fields_must_match_the_window(tmp_path: Path) -> None:
    path = write_bin(tmp_path / "corpus.bin", corpus([4]))
    wrong = BatchStreamConfig(
        fields=[*fields(8)[:2], ProjectedField(name="positions", source="@positions", dtype="i32", length=9)],
        stages=packed([path], 8).stages,
    )
    with pytest.raises(ConfigError, match=r"fields\[2\].*length 8"):
        open_batch_stream(wrong)
    windows = BatchStreamConfig(
        fields=fields(8),
        stages=[
            Stage(sources=[FileSource(files=[str(path)])], batch_size=1, windows=TokenWindows("tokens", 8))
        ],
    )
    with pytest.raises(ConfigError, match=r"fields\[0\].*length 9"):
        open_batch_stream(windows)


def test_segment_ids_need_a_token_stage(tmp_path: Path) -> None:
    path = write_lists(tmp_path / "lists.parquet", corpus([3]))
    config = BatchStreamConfig(
        fields=fields(4), stages=[Stage(sources=[FileSource(files=[str(path)])], batch_size=1)]
    )
    with pytest.raises(ConfigError, match=r"fields\[1\]\.source.*stages\[0\]"):
        open_batch_stream(config)


def test_a_token_stage_reads_other_record_fields_only_as_aligned_rows(tmp_path: Path) -> None:
    path = write_lists(tmp_path / "lists.parquet", corpus([3]))
    config = BatchStreamConfig(
        fields=[*fields(4), ProjectedField(name="n", source="n", dtype="i32")],
        stages=packed([path], 4).stages,
    )
    with pytest.raises(ConfigError, match=r"fields\[3\].*'n' is read beside the tokens.*length 4"):
        open_batch_stream(config)


def write_aligned(path: Path, docs: Docs, broken: int | None = None) -> Path:
    """Token lists with two aligned lists: a uint8 mask (1 on ids divisible by 3) and labels
    (id + 1000, int64). Record ``broken``'s mask is one element short."""
    masks = [[int(t % 3 == 0) for t in doc] for doc in docs]
    if broken is not None:
        masks[broken] = masks[broken][:-1]
    table = pa.table(
        {
            "tokens": pa.array(docs, pa.list_(pa.int32())),
            "mask": pa.array(masks, pa.list_(pa.uint8())),
            "labels": pa.array([[t + 1000 for t in doc] for doc in docs], pa.list_(pa.int64())),
        }
    )
    pq.write_table(table, path, row_group_size=5)
    return path


def aligned_config(path: Path, seq_len: int, **stage: object) -> BatchStreamConfig:
    config = packed([path], seq_len, bins=3, batch_size=2, **stage)
    return replace(
        config,
        fields=[
            *config.fields,
            ProjectedField(name="mask", source="mask", dtype="i32", length=seq_len),
            ProjectedField(name="labels", source="labels", dtype="i64", length=seq_len, pad=-100),
        ],
    )


def test_aligned_fields_are_packed_with_their_tokens(tmp_path: Path) -> None:
    docs = corpus([13, 2, 7, 30, 5, 5, 9, 1, 22, 4, 8, 3])
    path = write_aligned(tmp_path / "sft.parquet", docs)
    seq_len = 16
    delivered = rows(aligned_config(path, seq_len))
    check_packed(delivered, docs, seq_len, eos=False)
    for row in delivered:
        used = row["segment_ids"] > 0
        tokens = row["tokens"]
        # Each element is its own token's: cut and padded where the tokens are.
        np.testing.assert_array_equal(row["mask"][used], (tokens[used] % 3 == 0).astype(np.int32))
        np.testing.assert_array_equal(row["labels"][used], tokens[used] + 1000)
        assert (row["mask"][~used] == 0).all()
        assert (row["labels"][~used] == -100).all()
    # The mask summed over an epoch is the corpus's.
    assert sum(int(r["mask"].sum()) for r in delivered) == sum(t % 3 == 0 for doc in docs for t in doc)


def test_aligned_fields_resume_and_split_over_ranks_with_their_tokens(tmp_path: Path) -> None:
    docs = corpus([13, 2, 7, 30, 5, 5, 9, 1, 22, 4, 8, 3] * 2)
    path = write_aligned(tmp_path / "sft.parquet", docs)
    config = aligned_config(path, 16, shuffle=Shuffle(buffer_rows=6, unit_rows=1), infinite=True)
    assert_resumable(config, batches=10)
    single = rows(config, limit=10)
    ranks = [rows(replace(config, rank=r, world_size=2), limit=5) for r in range(2)]
    together = [row for g in range(10) for row in ranks[g % 2][(g // 2) * 2 : (g // 2) * 2 + 2]]
    assert len(together) == len(single) == 20
    for a, b in zip(together, single, strict=True):
        for name in ("tokens", "mask", "labels"):
            np.testing.assert_array_equal(a[name], b[name])


def test_an_aligned_list_of_another_length_fails_naming_record_and_field(tmp_path: Path) -> None:
    docs = corpus([4, 6, 3])
    path = write_aligned(tmp_path / "sft.parquet", docs, broken=1)
    with pytest.raises(
        ProjectionError, match=r"mask.*holds 5 values where the record's token list holds 6"
    ) as info:
        rows(aligned_config(path, 8))
    assert info.value.row == 1
    assert info.value.field == "mask"


def test_aligned_fields_need_parquet_token_shards(tmp_path: Path) -> None:
    path = write_bin(tmp_path / "corpus.bin", corpus([3, 4]))
    config = aligned_config(path, 8)
    config = replace(config, stages=[replace(config.stages[0], packing=Packing("tokens", 8, eos_id=EOS))])
    with pytest.raises(ConfigError, match="'mask' would be read beside the tokens.*Parquet"):
        open_batch_stream(config)


@given(
    option=st.sampled_from(["seq_len", "bins"]),
    value=st.one_of(
        st.integers(max_value=0), st.integers(min_value=2**30 + 1), st.text(max_size=3), st.none()
    ),
)
def test_packing_options_are_checked_with_their_path(option: str, value: object) -> None:
    kwargs: dict[str, object] = {"field": "tokens", "seq_len": 8, "bins": 8, option: value}
    with pytest.raises(ConfigError, match=rf"stages\[0\]\.packing\.{option}"):
        BatchStreamConfig(
            fields=fields(8),
            stages=[Stage(sources=[FileSource(files=["a.bin"])], batch_size=1, packing=Packing(**kwargs))],  # type: ignore[arg-type]
        )


@pytest.mark.parametrize("value", [-1, "0", 1.5])
def test_a_window_eos_id_is_checked_with_its_path(value: object) -> None:
    with pytest.raises(ConfigError, match=r"stages\[0\]\.windows\.eos_id"):
        BatchStreamConfig(
            fields=fields(9),
            stages=[
                Stage(
                    sources=[FileSource(files=["a.bin"])],
                    batch_size=1,
                    windows=TokenWindows("tokens", 8, eos_id=value),  # type: ignore[arg-type]
                )
            ],
        )


def test_eos_cut_windows_count_their_document_starts_against_the_memory_limit(tmp_path: Path) -> None:
    path = write_bin(tmp_path / "corpus.bin", corpus([1] * 100_000), dtype="uint32")
    config = BatchStreamConfig(
        fields=fields(9),
        stages=[
            Stage(
                sources=[FileSource(files=[str(path)])],
                batch_size=1,
                windows=TokenWindows("tokens", 8, eos_id=EOS),
            )
        ],
    )
    with open_batch_stream(config) as stream:
        bound = stream.memory_bound
    assert bound.token_plans >= 8 * 100_000  # a start for each of the 100,000 documents
    tight = replace(config, memory_limit_bytes=bound.total - bound.token_plans + 100_000)
    # Refused while planned, or by the bound that counts the starts; either way at open.
    with pytest.raises(ConfigError, match=r"window plan needs more than|token plans 800\d\d\d\b") as info:
        open_batch_stream(tight)
    assert info.value.option == "memory_limit_bytes"


def test_window_columns_are_not_counted_as_decoded_rows(tmp_path: Path) -> None:
    # Read jobs decode the tokens alone; the planner writes the window columns into batches,
    # where the bound counts them.
    path = write_lists(tmp_path / "lists.parquet", corpus([5, 9, 3]))
    with open_batch_stream(packed([path], 8)) as stream:
        three = stream.memory_bound
    tokens_only = replace(packed([path], 8), fields=fields(8)[:1])
    with open_batch_stream(tokens_only) as stream:
        one = stream.memory_bound
    assert three.decode_units == one.decode_units > 0
    assert three.batches > one.batches


def test_a_plan_beyond_the_memory_limit_is_refused_while_it_is_planned(tmp_path: Path) -> None:
    path = write_bin(tmp_path / "corpus.bin", corpus([1] * 100_000), dtype="uint32")
    config = packed([path], 8)
    with open_batch_stream(config) as stream:
        bound = stream.memory_bound
    assert bound.token_plans > 2_400_000  # 24 bytes for each of the 100,000 documents
    # Room for everything but the plan.
    tight = replace(config, memory_limit_bytes=bound.total - bound.token_plans + 100_000)
    with pytest.raises(ConfigError, match=r"memory_limit_bytes.*corpus\.bin.*window plan"):
        open_batch_stream(tight)


def test_bin_and_parquet_token_shards_read_from_s3_as_from_local_disk(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str
) -> None:
    docs = corpus([13, 2, 7, 30, 5, 5, 9, 1, 22])
    local_bin = write_bin(tmp_path / "corpus.bin", docs)
    local_parquet = write_lists(tmp_path / "lists.parquet", docs)
    remote = [
        upload(boto3_client, local_bin, f"{s3_prefix}corpus.bin"),
        upload(boto3_client, local_parquet, f"{s3_prefix}lists.parquet"),
    ]
    upload(boto3_client, tmp_path / "meta.json", f"{s3_prefix}meta.json")
    training_data = data_for(s3_server)
    for local_path, uri in zip([local_bin, local_parquet], remote, strict=True):
        expected = rows(packed([local_path], 8, bins=2))
        config = packed([Path("placeholder")], 8, bins=2)
        config = replace(config, stages=[replace(config.stages[0], sources=[FileSource(files=[uri])])])
        got = []
        with training_data.batch_stream(config) as stream:
            for batch in stream:
                got.extend({k: v[r].copy() for k, v in batch.arrays().items()} for r in range(batch.num_rows))
        assert len(got) == len(expected) > 0
        for a, b in zip(got, expected, strict=True):
            for name in a:
                np.testing.assert_array_equal(a[name], b[name])


def test_a_saver_written_token_shard_on_s3_opens_from_its_footer(
    tmp_path: Path,
    s3_server: LocalS3Server,
    boto3_client: Any,
    s3_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("O41_INSPECT_CACHE", "off")
    docs = corpus([40 + (53 * i) % 700 for i in range(2400)])
    saver = TrainingData().dataset_saver(tmp_path / "saved" / "data-manifest-v1.json")
    saver.save("train", None, [{"tokens": d} for d in docs], shard_id="0")
    saver.commit_manifest()
    (local,) = (tmp_path / "saved").rglob("*.parquet")
    uri = upload(boto3_client, local, f"{s3_prefix}saved.parquet")
    config = packed([local], 128)
    expected = rows(config)
    config = replace(config, stages=[replace(config.stages[0], sources=[FileSource(files=[uri])])])
    with data_for(s3_server).batch_stream(config) as stream:
        # The one ranged request for the file's last 256 KiB (its footer), none for the pages.
        assert token_column_bytes(local) > 4 * 256 * 1024
        assert stream.stats.open.bytes_read <= 256 * 1024
        got = drain(stream)
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected, strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_stream_windows_read_a_parquet_column_of_lists_as_one_stream(tmp_path: Path) -> None:
    docs = corpus([5, 0, 9, 3, 14, 1])  # records of ids 1..32, one of them empty
    path = write_lists(tmp_path / "lists.parquet", docs, writer="polars")
    config = BatchStreamConfig(
        fields=fields(8, dtype="i64"),
        stages=[
            Stage(sources=[FileSource(files=[str(path)])], batch_size=1, windows=TokenWindows("tokens", 7))
        ],
    )
    windows = [row["tokens"][: int(np.count_nonzero(row["segment_ids"]))].tolist() for row in rows(config)]
    # Windows cross record boundaries: the records' lists are one stream of 32 ids.
    assert windows == [list(range(1 + 7 * w, min(9 + 7 * w, 33))) for w in range(5)]


@given(
    lengths=st.lists(st.integers(0, 20), min_size=1, max_size=30),
    seq_len=st.integers(1, 12),
    shard=st.sampled_from(["pyarrow records", "polars records", "bin, eos", "parquet chunks, eos"]),
)
def test_stream_windows_mark_the_documents_they_hold(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[int], seq_len: int, shard: str
) -> None:
    # A window cut anywhere, with segment ids and positions that still name documents: a
    # document starting inside the window opens a new segment at position 0; the one the window
    # starts in continues its positions. Documents are records, or with eos_id the spans ending
    # at it, whatever the records (here chunks of 4 ids cut through documents).
    docs = corpus(lengths)
    eos = shard.endswith("eos")
    spans = [[*doc, EOS] for doc in docs] if eos else docs
    stream = [t for span in spans for t in span]
    assume(stream)  # a shard of no tokens is a source of no rows, refused at open
    document = [d for d, span in enumerate(spans) for _ in span]
    position = [p for span in spans for p in range(len(span))]
    folder = tmp_path_factory.mktemp("windows")
    if shard == "bin, eos":
        path = write_bin(folder / "stream.bin", docs)
    elif shard == "parquet chunks, eos":
        path = folder / "chunks.parquet"
        chunks = [stream[i : i + 4] for i in range(0, len(stream), 4)]
        pq.write_table(pa.table({"tokens": pa.array(chunks, pa.list_(pa.int32()))}), path)
    else:
        assume(sum(lengths) > 0)
        path = write_lists(folder / "lists.parquet", docs, writer=shard.split()[0])
    windows = TokenWindows("tokens", seq_len, eos_id=EOS if eos else None)
    config = BatchStreamConfig(
        fields=fields(seq_len + 1),
        stages=[Stage(sources=[FileSource(files=[str(path)])], batch_size=1, windows=windows)],
    )
    delivered = rows(config)
    assert len(delivered) == max(1, -(-(len(stream) - 1) // seq_len))
    for w, row in enumerate(delivered):
        held = slice(w * seq_len, w * seq_len + seq_len + 1)
        used = int(np.count_nonzero(row["segment_ids"]))
        assert row["tokens"][:used].tolist() == stream[held]
        assert (row["segment_ids"][used:] == 0).all()
        # Segment k + 1 is the window's k-th document, in order.
        number = {d: k + 1 for k, d in enumerate(dict.fromkeys(document[held]))}
        assert row["segment_ids"][:used].tolist() == [number[d] for d in document[held]]
        assert row["positions"][:used].tolist() == position[held]


def test_a_bin_shard_in_a_stage_of_records_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = write_bin(tmp_path / "corpus.bin", corpus([4]))
    config = BatchStreamConfig(
        fields=[ProjectedField(name="t", source="tokens", dtype="i32", length=4)],
        stages=[Stage(sources=[FileSource(files=[str(path)])], batch_size=1)],
    )
    with pytest.raises(ConfigError, match=r"corpus\.bin.*packing or windows") as info:
        open_batch_stream(config)
    assert info.value.option == "stages[0].sources[0].files[0]"


def test_a_second_open_plans_parquet_packing_from_cached_lengths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "inspect-cache"
    monkeypatch.setenv("O41_INSPECT_CACHE", str(cache))
    docs = corpus([5 + (37 * i) % 200 for i in range(1000)])
    path = write_lists(tmp_path / "corpus.parquet", docs)
    config = packed([path], 64)
    first = rows(config)
    assert len(list(cache.glob("*/*.lengths"))) == 1
    second = rows(config)
    assert all(all(np.array_equal(a[k], b[k]) for k in a) for a, b in zip(first, second, strict=True))
    check_packed(second, docs, 64, eos=False)
    # The last row groups' pages zeroed in place, the footer, size, time and inode kept: an
    # open that decoded the token column would fail; this one plans from the cached lengths
    # (open reads the first record only), and the read fails.
    before = path.stat()
    footer = int.from_bytes(path.read_bytes()[-8:-4], "little")
    with path.open("r+b") as file:
        file.seek(before.st_size - 8 - footer - 4000)
        file.write(bytes(4000))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    with open_batch_stream(config) as stream, pytest.raises(MalformedShardError, match=r"corpus\.parquet"):
        for _ in stream:
            pass
    monkeypatch.setenv("O41_INSPECT_CACHE", "off")
    with pytest.raises(MalformedShardError, match=r"corpus\.parquet"):
        open_batch_stream(config)


def test_cached_lengths_the_shard_does_not_hold_fail_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "inspect-cache"
    monkeypatch.setenv("O41_INSPECT_CACHE", str(cache))

    def plain(docs: Docs) -> bytes:
        # No statistics, dictionary or compression: records of other lengths with the same ids
        # make a file of the same size.
        out = tmp_path / "plain.parquet"
        table = pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))})
        pq.write_table(
            table, out, row_group_size=7, write_statistics=False, compression="none", use_dictionary=False
        )
        return out.read_bytes()

    path = tmp_path / "corpus.parquet"
    path.write_bytes(plain(corpus([6] * 40)))
    config = packed([path], 16, batch_size=4)
    rows(config)
    assert len(list(cache.glob("*/*.lengths"))) == 1
    # The file rewritten behind the cache's back with its size, time and inode kept: the first
    # record one token longer, the second one shorter. The entry (this host's, sealed) still
    # names it; the plan is made from it, and the reader holds each record to it.
    before = path.stat()
    rewritten = plain(corpus([7, 5] + [6] * 38))
    assert len(rewritten) == before.st_size
    with path.open("r+b") as out:
        out.write(rewritten)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    with pytest.raises(MalformedShardError, match=r"corpus\.parquet.*when the shard was inspected"):
        rows(config)


def test_a_forged_cache_entry_is_a_miss_not_a_changed_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 48, case 12: an entry edited with its counts recomputed is not this host's (its seal
    # is the host key's): a miss, so the stream plans from the shard itself.
    cache = tmp_path / "inspect-cache"
    monkeypatch.setenv("O41_INSPECT_CACHE", str(cache))
    path = write_lists(tmp_path / "corpus.parquet", corpus([6] * 40))
    config = packed([path], 16, batch_size=4)
    expected = rows(config)
    (entry,) = cache.glob("*/*.lengths")
    data = bytearray(entry.read_bytes())
    header = int.from_bytes(data[8:12], "little")
    first = 12 + header + 8
    lengths = np.frombuffer(data[first:-16], dtype="<u4").copy()
    lengths[0] += 1
    lengths[1] -= 1
    entry.write_bytes(bytes(data[:first]) + lengths.tobytes() + bytes(data[-16:]))
    got = rows(config)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a["tokens"], b["tokens"])


def token_column_bytes(path: Path) -> int:
    """Compressed bytes of the ``tokens`` column's chunks."""
    meta = pq.ParquetFile(path).metadata
    return sum(
        meta.row_group(g).column(c).total_compressed_size
        for g in range(meta.num_row_groups)
        for c in range(meta.num_columns)
        if meta.row_group(g).column(c).path_in_schema.startswith("tokens")
    )


def test_saver_written_shards_are_planned_from_their_footers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No inspection cache: every open plans from the shards themselves.
    monkeypatch.setenv("O41_INSPECT_CACHE", "off")
    docs = corpus([50 + (37 * i) % 900 for i in range(1200)])
    parts = [docs[k::4] for k in range(4)]
    saver = TrainingData().dataset_saver(tmp_path / "saved" / "data-manifest-v1.json")
    for k, part in enumerate(parts):
        saver.save("train", None, [{"tokens": d} for d in part], shard_id=str(k))
    saver.commit_manifest()
    saved = sorted((tmp_path / "saved").rglob("*.parquet"))
    foreign = [write_lists(tmp_path / f"foreign-{k}.parquet", part) for k, part in enumerate(parts)]

    def reads(files: list[Path]) -> tuple[int, int, list[dict[str, np.ndarray]]]:
        """Bytes read at open, bytes read in all, and the epoch's rows."""
        with open_batch_stream(packed(files, 256)) as stream:
            opened = stream.stats.open.bytes_read
            delivered = drain(stream)
            total = stream.stats.bytes_read
        return opened, total, delivered

    saved_open, saved_total, saved_rows = reads(saved)
    foreign_open, _, foreign_rows = reads(foreign)
    # Every token was read, and counted.
    assert saved_total >= sum(token_column_bytes(p) for p in saved)
    # The same windows either way.
    assert len(saved_rows) == len(foreign_rows)
    for a, b in zip(saved_rows, foreign_rows, strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    check_packed(saved_rows, [d for part in parts for d in part], 256, eos=False)
    # Without the footer index, open reads every page of the token column; with it, the
    # footers alone (a few KiB here, against the column's MiBs).
    assert foreign_open >= sum(token_column_bytes(p) for p in foreign)
    assert saved_open < 0.01 * sum(token_column_bytes(p) for p in saved), saved_open


def test_a_fixed_size_list_column_packs_as_documents(tmp_path: Path) -> None:
    docs = corpus([4] * 10)
    path = tmp_path / "fixed.parquet"
    pq.write_table(pa.table({"tokens": pa.array(docs, pa.list_(pa.int32(), 4))}), path)
    delivered = rows(packed([path], 8))
    assert len(delivered) == 5  # two whole documents a window
    check_packed(delivered, docs, 8, eos=False)


@pytest.mark.parametrize("values", [pa.list_(pa.float32()), pa.string()])
def test_a_token_column_that_is_not_a_list_of_ids_is_refused_at_open(
    tmp_path: Path, values: pa.DataType
) -> None:
    column = [[1.5, 2.0]] * 3 if values != pa.string() else ["a b", "c", "d"]
    path = tmp_path / "floats.parquet"
    pq.write_table(pa.table({"tokens": pa.array(column, values)}), path)
    with pytest.raises(ProjectionError, match=r"floats\.parquet.*'tokens'.*list of integer ids"):
        open_batch_stream(packed([path], 8))


def test_a_footer_index_its_records_do_not_hold_fails_closed(tmp_path: Path) -> None:
    import base64
    import zlib

    docs = corpus([6] * 40)
    lengths = np.array([len(d) for d in docs], dtype="<u4")
    # Another writer's shard with an index that moves a token from the second record to the
    # first: the row group's level count still agrees, so the plan is made from it, and the
    # reader holds each record to it.
    lengths[0] += 1
    lengths[1] -= 1
    deflate = zlib.compressobj(wbits=-15)
    value = "1:" + base64.b64encode(deflate.compress(lengths.tobytes()) + deflate.flush()).decode()
    table = pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))})
    table = table.replace_schema_metadata({"o41.list_lengths.tokens": value})
    path = tmp_path / "lying.parquet"
    pq.write_table(table, path)
    with pytest.raises(MalformedShardError, match=r"lying\.parquet.*when the shard was inspected"):
        rows(packed([path], 16, batch_size=4))


def test_positions_a_document_outgrows_in_i32_are_refused_at_open(tmp_path: Path) -> None:
    """A position past i32 is refused at open, naming the field and the shard, not wrapped."""
    # A .bin of one document of 2^31 + 2 tokens would be 4 GiB; the check reads the plan, so a
    # stream windows stage (positions up to the stream's length) over a sparse file shows it.
    path = tmp_path / "huge.bin"
    with path.open("wb") as file:
        file.truncate(2 * (2**31 + 2))
    (tmp_path / "meta.json").write_text(json.dumps({"dtype": "uint16"}))
    config = BatchStreamConfig(
        fields=[
            ProjectedField(name="tokens", source="tokens", dtype="i32", length=9),
            ProjectedField(name="positions", source="@positions", dtype="i32", length=9),
        ],
        stages=[
            Stage(sources=[FileSource(files=[str(path)])], batch_size=1, windows=TokenWindows("tokens", 8))
        ],
    )
    with pytest.raises(ConfigError, match=r"fields\[1\]\.dtype.*huge\.bin.*i64"):
        open_batch_stream(config)
    wide_positions = ProjectedField(name="positions", source="@positions", dtype="i64", length=9)
    wide = replace(config, fields=[config.fields[0], wide_positions])
    with open_batch_stream(wide) as stream:
        first = next(iter(stream)).arrays()
    assert first["positions"][0].tolist() == list(range(9))


def test_window_columns_keep_their_pad_in_every_reused_batch(tmp_path: Path) -> None:
    """Batch buffers are reused; each window's segment ids and positions are written whole."""
    docs = corpus([3, 9, 1, 7, 2, 8, 5, 4] * 40)
    path = write_bin(tmp_path / "c.bin", docs)
    config = BatchStreamConfig(
        fields=[
            ProjectedField(name="tokens", source="tokens", dtype="i32", length=8),
            ProjectedField(name="segment_ids", source="@segment_ids", dtype="i32", length=8, pad=-1),
            ProjectedField(name="positions", source="@positions", dtype="i64", length=8, pad=-7),
        ],
        stages=[
            Stage(
                sources=[FileSource(files=[str(path)])],
                batch_size=2,
                packing=Packing(field="tokens", seq_len=8, bins=2),
            )
        ],
        threads=2,
    )
    windows = 0
    for row in rows(config):
        used = int((row["segment_ids"] > 0).sum())
        assert (row["segment_ids"][used:] == -1).all()
        assert (row["positions"][used:] == -7).all()
        assert (row["segment_ids"][:used] >= 1).all()
        windows += 1
    assert windows > 100


def test_a_partitioned_packed_stage_delivers_each_token_once_across_ranks(tmp_path: Path) -> None:
    # Partitions share each source's packed windows among them (docs/order.md, "Partitions"):
    # two ranks of two partitions deliver between them what one rank of the same order does,
    # each token at most once, and what they leave out is what stats.dropped_rows counts.
    lengths = np.random.default_rng(3).integers(1, 40, size=120).tolist()
    docs = corpus(lengths)
    path = write_bin(tmp_path / "corpus.bin", docs)
    config = replace(
        packed([path], 16, bins=4, batch_size=2, shuffle=Shuffle(buffer_rows=8), infinite=False), partitions=2
    )
    windows = len(rows(replace(config, partitions=1, stages=[replace(config.stages[0], batch_size=1)])))
    per_rank, dropped = [], set()
    for rank in range(2):
        with open_batch_stream(replace(config, rank=rank, world_size=2)) as stream:
            per_rank.append(drain(stream))
            dropped.add(stream.stats.dropped_rows)
    single = rows(config)
    assert sorted(r["tokens"].tobytes() for rows_ in per_rank for r in rows_) == sorted(
        r["tokens"].tobytes() for r in single
    )
    tokens = [
        int(t) for rows_ in per_rank for r in rows_ for t in r["tokens"][r["segment_ids"] > 0] if t != EOS
    ]
    assert len(tokens) == len(set(tokens)), "no token twice"
    assert len(dropped) == 1
    assert sum(len(r) for r in per_rank) + dropped.pop() == windows
