"""Corpora other tools wrote, read in place: Megatron indexed datasets and NumPy token arrays.

Each file here is written by its own library (megatron-core's ``IndexedDatasetBuilder``,
``numpy.save`` / ``ndarray.tofile``), and every token the stream delivers is compared with what
that library's own reader returns, or with the same documents read from a Parquet shard.
"""

from __future__ import annotations

import itertools
import json
import struct
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from o41_testkit import LocalS3Server, data_for, upload
from o41_training_data import (
    BatchStreamConfig,
    ConfigError,
    FileSource,
    MalformedShardError,
    ManifestSource,
    Packing,
    ProjectedField,
    Shuffle,
    Stage,
    TokenWindows,
    UnsupportedFormatError,
    iter_shard,
    manifest_from_files,
    open_batch_stream,
)
from o41_training_data.testing import assert_resumable

with warnings.catch_warnings():
    # megatron-core warns at import that its fused GPU kernels (Transformer Engine, Apex) are
    # absent; its indexed datasets need neither.
    warnings.simplefilter("ignore")
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

EOS = 0
Docs = list[list[int]]


def corpus(lengths: list[int], first: int = 1) -> Docs:
    """Documents of the given lengths holding unique ids from ``first`` on (never ``EOS``)."""
    docs, next_id = [], first
    for n in lengths:
        docs.append(list(range(next_id, next_id + n)))
        next_id += n
    return docs


LENGTHS = [13, 2, 7, 30, 5, 5, 9, 1, 22, 0, 17]


def write_megatron(prefix: Path, docs: Docs, dtype: type = np.int32, pieces: int = 2) -> Path:
    """A Megatron dataset written by megatron-core: each document as up to ``pieces`` sequences
    (``add_item`` then ``end_document``), the odd ones in one call (``add_document``)."""
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for d, doc in enumerate(docs):
        cuts = [len(doc) * k // pieces for k in range(pieces + 1)]
        parts = [doc[a:b] for a, b in itertools.pairwise(cuts)]
        if d % 2:
            builder.add_document(doc, [len(p) for p in parts])  # a list, as preprocess_data.py passes
        else:
            for part in parts:
                builder.add_item(torch.tensor(part, dtype=torch.int64))
            builder.end_document()
    builder.finalize(f"{prefix}.idx")
    return Path(f"{prefix}.idx")


def megatron_documents(prefix: Path) -> Docs:
    """Every document as megatron-core's own reader returns it (its sequences, joined)."""
    dataset = IndexedDataset(str(prefix))
    bounds = dataset.document_indices
    docs = []
    for a, b in itertools.pairwise(bounds):
        sequences = dataset[int(a) : int(b)] if b > a else []
        docs.append([int(t) for s in sequences for t in s])
    return docs


def write_lists(path: Path, docs: Docs) -> Path:
    pq.write_table(pa.table({"tokens": pa.array(docs, pa.list_(pa.int64()))}), path, row_group_size=4)
    return path


def token_fields(seq_len: int) -> list[ProjectedField]:
    return [
        ProjectedField(name="tokens", source="tokens", dtype="i64", length=seq_len),
        ProjectedField(name="segment_ids", source="@segment_ids", dtype="i32", length=seq_len),
        ProjectedField(name="positions", source="@positions", dtype="i32", length=seq_len),
    ]


def token_config(source: FileSource, seq_len: int = 8, **stage: Any) -> BatchStreamConfig:
    # A stream window holds the overlapping token too.
    width = seq_len + 1 if "windows" in stage else seq_len
    return BatchStreamConfig(
        fields=token_fields(width), stages=[Stage(sources=[source], batch_size=1, **stage)], threads=2
    )


def rows(config: BatchStreamConfig, storage: Any = None) -> list[dict[str, np.ndarray]]:
    opened = storage.batch_stream(config) if storage is not None else open_batch_stream(config)
    out = []
    with opened as stream:
        for batch in stream:
            arrays = batch.arrays()
            out.extend({k: v[r].copy() for k, v in arrays.items()} for r in range(batch.num_rows))
    return out


def assert_same_rows(got: list[dict[str, np.ndarray]], expected: list[dict[str, np.ndarray]]) -> None:
    assert len(got) == len(expected) > 0
    for r, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"row {r}, {name}")


# --- Megatron -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.int32, np.uint16, np.int64, np.uint8])
def test_megatron_documents_are_records_equal_to_megatron_cores_reader(tmp_path: Path, dtype: type) -> None:
    docs = (
        corpus(LENGTHS, first=1) if dtype != np.uint8 else [[t % 250 + 1 for t in d] for d in corpus(LENGTHS)]
    )
    idx = write_megatron(tmp_path / "corpus", docs, dtype)
    expected = megatron_documents(tmp_path / "corpus")
    assert expected == docs
    width = max(LENGTHS)
    config = BatchStreamConfig(
        fields=[ProjectedField(name="ids", source="tokens", dtype="i64", length=width, pad=-1)],
        stages=[Stage(sources=[FileSource(files=[str(idx)])], batch_size=1)],
    )
    delivered = [list(r["ids"][r["ids"] >= 0]) for r in rows(config)]
    assert delivered == expected
    # Named by its .bin (with the encoding), or by the common prefix.
    for name in [f"{tmp_path / 'corpus'}.bin", str(tmp_path / "corpus")]:
        named = BatchStreamConfig(
            fields=config.fields,
            stages=[Stage(sources=[FileSource(files=[name], encoding="megatron")], batch_size=1)],
        )
        assert [list(r["ids"][r["ids"] >= 0]) for r in rows(named)] == expected
    assert [r["tokens"] for r in iter_shard("megatron", idx)] == expected


def test_packing_a_megatron_dataset_equals_packing_the_same_documents_from_parquet(tmp_path: Path) -> None:
    docs = corpus(LENGTHS)
    idx = write_megatron(tmp_path / "corpus", docs)
    lists = write_lists(tmp_path / "lists.parquet", docs)
    for layout in (
        {"packing": Packing(field="tokens", seq_len=8, bins=4)},
        {"windows": TokenWindows(field="tokens", seq_len=8)},
    ):
        got = rows(token_config(FileSource(files=[str(idx)]), **layout))
        assert_same_rows(got, rows(token_config(FileSource(files=[str(lists)]), **layout)))
        # Every document's tokens arrive: the stage reads the dataset, not its first sequences.
        delivered = {int(t) for r in got for t in r["tokens"][r["segment_ids"] > 0]}
        assert delivered >= {t for d in docs for t in d}


def test_a_megatron_dataset_reads_from_s3_as_from_local_disk(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str
) -> None:
    docs = corpus(LENGTHS)
    write_megatron(tmp_path / "corpus", docs, np.uint16)
    for suffix in (".bin", ".idx"):
        upload(boto3_client, tmp_path / f"corpus{suffix}", f"{s3_prefix}corpus{suffix}")
    packing = {"packing": Packing(field="tokens", seq_len=8, bins=4)}
    expected = rows(token_config(FileSource(files=[str(tmp_path / "corpus.idx")]), **packing))
    remote = token_config(FileSource(files=[f"{s3_prefix}corpus.idx"]), **packing)
    assert_same_rows(rows(remote, data_for(s3_server)), expected)
    records = BatchStreamConfig(
        fields=[ProjectedField(name="ids", source="tokens", dtype="i32", length=30)],
        stages=[Stage(sources=[FileSource(files=[f"{s3_prefix}corpus"], encoding="megatron")], batch_size=1)],
    )
    got = [list(r["ids"][: len(d)]) for r, d in zip(rows(records, data_for(s3_server)), docs, strict=True)]
    assert got == docs


def forge_idx(idx: Path, at: int, value: bytes) -> None:
    raw = bytearray(idx.read_bytes())
    raw[at : at + len(value)] = value
    idx.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    ("forgery", "message"),
    [
        (lambda n, d: (26, struct.pack("<Q", d + 1)), r"the index is \d+ bytes; \d+ sequences"),
        (lambda n, d: (18, struct.pack("<Q", 2**62)), r"more than any file holds|the index is"),
        (
            lambda n, d: (34 + 4 * n + 8 * 3, struct.pack("<q", 10**9)),
            r"sequence 3 starts at byte 1000000000",
        ),
        (lambda n, d: (34, struct.pack("<i", -4)), r"sequence 0 has length -4"),
        (lambda n, d: (34 + 12 * n + 8 * 2, struct.pack("<q", 0)), r"document index 2 is 0, after"),
        (lambda n, d: (34 + 12 * n + 8 * (d - 1), struct.pack("<q", n - 1)), r"last document index"),
        (lambda n, d: (0, b"NOTANIDX"), r"not a Megatron index"),
        (lambda n, d: (17, b"\x09"), r"dtype code 9"),
    ],
)
def test_a_forged_megatron_index_fails_closed_naming_the_file_and_entry(
    tmp_path: Path, forgery: Any, message: str
) -> None:
    idx = write_megatron(tmp_path / "corpus", corpus(LENGTHS))
    sequences, entries = struct.unpack("<QQ", idx.read_bytes()[18:34])
    forge_idx(idx, *forgery(sequences, entries))
    config = BatchStreamConfig(
        fields=[ProjectedField(name="ids", source="tokens", dtype="i64", length=4)],
        stages=[Stage(sources=[FileSource(files=[str(idx)])], batch_size=2)],
    )
    with pytest.raises(MalformedShardError, match=message) as raised:
        open_batch_stream(config)
    assert str(idx) in str(raised.value)
    with pytest.raises(MalformedShardError, match=message):
        open_batch_stream(
            token_config(FileSource(files=[str(idx)]), packing=Packing(field="tokens", seq_len=8))
        )


def test_a_megatron_bin_the_index_does_not_cover_fails_closed(tmp_path: Path) -> None:
    idx = write_megatron(tmp_path / "corpus", corpus(LENGTHS))
    with (tmp_path / "corpus.bin").open("ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(MalformedShardError, match=r"corpus\.idx.*cover \d+ bytes of .*corpus\.bin"):
        list(iter_shard("megatron", idx))
    (tmp_path / "corpus.bin").write_bytes(b"\0" * 8)
    with pytest.raises(MalformedShardError, match=r"ends at byte \d+ of .*corpus\.bin, which holds 8"):
        list(iter_shard("megatron", idx))
    (tmp_path / "corpus.idx").unlink()
    with pytest.raises(MalformedShardError, match=r"corpus\.idx, which cannot be read"):
        list(iter_shard("megatron", tmp_path / "corpus.bin"))


def test_a_float_megatron_dataset_is_read_as_records_and_refused_as_tokens(tmp_path: Path) -> None:
    builder = IndexedDatasetBuilder(f"{tmp_path / 'f'}.bin", dtype=np.float32)
    builder.add_item(torch.tensor([0.5, 1.5, -2.0]))
    builder.end_document()
    builder.finalize(f"{tmp_path / 'f'}.idx")
    assert [r["tokens"] for r in iter_shard("megatron", tmp_path / "f.idx")] == [[0.5, 1.5, -2.0]]
    config = token_config(
        FileSource(files=[str(tmp_path / "f.idx")]), packing=Packing(field="tokens", seq_len=8)
    )
    with pytest.raises(UnsupportedFormatError, match=r"float32, not token ids"):
        open_batch_stream(config)


def test_manifest_build_lists_a_megatron_dataset_by_its_bin(tmp_path: Path) -> None:
    docs = corpus(LENGTHS)
    idx_a = write_megatron(tmp_path / "a", docs[:6])
    idx_b = write_megatron(tmp_path / "b", docs[6:])
    manifest = manifest_from_files([idx_a, idx_b], tmp_path / "data-manifest-v1.json")
    assert manifest.data_format == "megatron"
    shards = manifest.splits["train"].shards
    assert [s.location for s in shards] == ["a.bin", "b.bin"]
    assert [s.rows for s in shards] == [6, len(docs) - 6]
    assert [s.bytes for s in shards] == [(tmp_path / n).stat().st_size for n in ("a.bin", "b.bin")]
    config = BatchStreamConfig(
        fields=[ProjectedField(name="ids", source="tokens", dtype="i64", length=30, pad=-1)],
        stages=[
            Stage(
                sources=[ManifestSource(manifest_uri=str(tmp_path / "data-manifest-v1.json"), split="train")],
                batch_size=1,
            )
        ],
    )
    assert [list(r["ids"][r["ids"] >= 0]) for r in rows(config)] == docs
    with pytest.raises(ConfigError, match=r"a\.bin is listed twice"):
        manifest_from_files([idx_a, tmp_path / "a.bin"], tmp_path / "twice.json", data_format="megatron")


# --- NumPy --------------------------------------------------------------------------------


def stream_of(docs: Docs) -> list[int]:
    return [t for doc in docs for t in [*doc, EOS]]


def write_bin(path: Path, docs: Docs) -> Path:
    np.asarray(stream_of(docs), dtype="<u2").tofile(path)
    (path.parent / "meta.json").write_text(json.dumps({"dtype": "uint16", "eos_id": EOS}))
    return path


@pytest.mark.parametrize(
    ("dtype", "version"), [("<u2", (1, 0)), ("<i4", (2, 0)), ("<u4", (3, 0)), ("<i8", None), ("|u1", None)]
)
def test_a_numpy_token_array_packs_as_the_same_ids_in_a_bin_shard(
    tmp_path: Path, dtype: str, version: tuple[int, int] | None
) -> None:
    docs = [[t % 250 + 1 for t in d] for d in corpus(LENGTHS)]
    array = np.asarray(stream_of(docs), dtype=dtype)
    path = tmp_path / "tokens.npy"
    if version is None:
        np.save(path, array)
    else:
        with path.open("wb") as f:
            np.lib.format.write_array(f, array, version=version)
    assert np.array_equal(np.load(path), array)
    (tmp_path / "ref").mkdir()
    reference = write_bin(tmp_path / "ref" / "corpus.bin", docs)
    for layout in (
        {"packing": Packing(field="tokens", seq_len=8, bins=4, eos_id=EOS)},
        {"windows": TokenWindows(field="tokens", seq_len=8, eos_id=EOS)},
        {"windows": TokenWindows(field="tokens", seq_len=8)},
    ):
        got = rows(token_config(FileSource(files=[str(path)]), **layout))
        assert_same_rows(got, rows(token_config(FileSource(files=[str(reference)]), **layout)))


def test_a_headerless_numpy_array_is_described_by_its_meta_json(tmp_path: Path) -> None:
    docs = corpus(LENGTHS)
    np.asarray(stream_of(docs), dtype=np.uint32).tofile(tmp_path / "part-0.npy")
    packing = {"packing": Packing(field="tokens", seq_len=8, bins=4)}
    with pytest.raises(MalformedShardError, match=r"meta\.json.*cannot be read"):
        open_batch_stream(token_config(FileSource(files=[str(tmp_path / "part-0.npy")]), **packing))
    (tmp_path / "meta.json").write_text(json.dumps({"dtype": "uint32", "eos_id": EOS}))
    got = rows(token_config(FileSource(files=[str(tmp_path / "part-0.npy")]), **packing))
    np.save(tmp_path / "with-header.npy", np.asarray(stream_of(docs), dtype=np.uint32))
    with_header = token_config(
        FileSource(files=[str(tmp_path / "with-header.npy")]),
        packing=Packing(field="tokens", seq_len=8, bins=4, eos_id=EOS),
    )
    assert_same_rows(got, rows(with_header))


@pytest.mark.parametrize(
    ("array", "error", "message"),
    [
        (
            np.arange(12, dtype=">u2"),
            UnsupportedFormatError,
            r"'>u2'; token arrays hold little-endian integers",
        ),
        (np.arange(12, dtype="<f4"), UnsupportedFormatError, r"'<f4'"),
        (
            np.arange(12, dtype="<u2").reshape(3, 4),
            UnsupportedFormatError,
            r"shape is \(3, 4\); a token array has one",
        ),
    ],
)
def test_a_numpy_array_that_holds_no_token_ids_is_refused(
    tmp_path: Path, array: np.ndarray, error: type[Exception], message: str
) -> None:
    np.save(tmp_path / "a.npy", array)
    config = token_config(
        FileSource(files=[str(tmp_path / "a.npy")]), packing=Packing(field="tokens", seq_len=8, eos_id=EOS)
    )
    with pytest.raises(error, match=message):
        open_batch_stream(config)


def test_a_numpy_header_that_lies_about_its_length_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "a.npy"
    np.save(path, np.arange(100, dtype="<u2"))
    raw = path.read_bytes().replace(b"(100,)", b"(900,)")
    path.write_bytes(raw)
    config = token_config(
        FileSource(files=[str(path)]), packing=Packing(field="tokens", seq_len=8, eos_id=EOS)
    )
    with pytest.raises(MalformedShardError, match=r"a\.npy.*900 elements of 2 bytes"):
        open_batch_stream(config)
    path.write_bytes(raw[:8] + struct.pack("<H", 65000) + raw[10:])
    with pytest.raises(MalformedShardError, match=r"header claims 65000 bytes"):
        open_batch_stream(config)


def test_numpy_arrays_are_token_streams_only(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(10, dtype="<u2"))
    with pytest.raises(UnsupportedFormatError, match=r"one stream of ids, not records"):
        list(iter_shard("npy", tmp_path / "a.npy"))
    config = BatchStreamConfig(
        fields=[ProjectedField(name="ids", source="tokens", dtype="i64", length=4)],
        stages=[Stage(sources=[FileSource(files=[str(tmp_path / "a.npy")])], batch_size=2)],
    )
    with pytest.raises(ConfigError, match=r"npy"):
        open_batch_stream(config)
    manifest = manifest_from_files([tmp_path / "a.npy"], tmp_path / "m.json")
    assert manifest.data_format == "npy"
    assert [s.rows for s in manifest.splits["train"].shards] == [10]


# --- Mixed --------------------------------------------------------------------------------


def test_a_shuffled_mix_of_megatron_numpy_and_parquet_resumes_exactly(tmp_path: Path) -> None:
    docs = corpus([3 + (7 * i) % 40 for i in range(60)])
    # The stage cuts documents at its eos id in every source, so the Megatron documents end in one.
    idx = write_megatron(tmp_path / "m", [[*d, EOS] for d in docs[:20]])
    np.save(tmp_path / "n.npy", np.asarray(stream_of(docs[20:40]), dtype="<u4"))
    lists = write_lists(tmp_path / "p.parquet", docs[40:])
    config = BatchStreamConfig(
        fields=token_fields(16),
        stages=[
            Stage(
                sources=[
                    FileSource(files=[str(idx)], weight=2.0),
                    FileSource(files=[str(tmp_path / "n.npy")], weight=1.0),
                    FileSource(files=[str(lists)], weight=1.0),
                ],
                batch_size=2,
                packing=Packing(field="tokens", seq_len=16, bins=4, eos_id=EOS),
                shuffle=Shuffle(buffer_rows=8),
                infinite=True,
            )
        ],
        seed=7,
        threads=2,
    )
    assert_resumable(config, batches=12)


# --- Hugging Face datasets (Arrow IPC) ----------------------------------------------------


def hf_dataset(n: int = 23) -> Any:
    import datasets

    return datasets.Dataset.from_dict(
        {
            "ids": [list(range(i, i + 1 + i % 5)) for i in range(n)],
            "label": [i * 3 - 7 for i in range(n)],
            "score": [i / 4 for i in range(n)],
            "keep": [i % 3 == 0 for i in range(n)],
            "grid": [[[i, i + 1, i + 2], [i * 2, 0, 1]] for i in range(n)],
            "text": [f"row {i}" for i in range(n)],
        }
    )


HF_FIELDS = [
    ProjectedField(name="ids", source="ids", dtype="i64", length=6, pad=-1),
    ProjectedField(name="label", source="label", dtype="i32"),
    ProjectedField(name="score", source="score", dtype="f64"),
    ProjectedField(name="keep", source="keep", dtype="bool"),
    ProjectedField(name="grid", source="grid", dtype="i32", shape=(2, 3)),
]


def expected_hf_rows(rows_: list[dict[str, Any]]) -> list[dict[str, np.ndarray]]:
    """What HF_FIELDS make of ``datasets``' own rows."""
    out = []
    for r in rows_:
        ids = np.full(6, -1, np.int64)
        ids[: len(r["ids"])] = r["ids"]
        out.append(
            {
                "ids": ids,
                "label": np.int32(r["label"]),
                "score": np.float64(r["score"]),
                "keep": np.uint8(r["keep"]),
                "grid": np.asarray(r["grid"], np.int32),
            }
        )
    return out


def record_rows(source: FileSource, storage: Any = None) -> list[dict[str, np.ndarray]]:
    config = BatchStreamConfig(fields=HF_FIELDS, stages=[Stage(sources=[source], batch_size=1)])
    return [{k: v for k, v in r.items() if k != "valid"} for r in rows(config, storage)]


def test_a_save_to_disk_directory_reads_as_datasets_reads_it(tmp_path: Path) -> None:
    import datasets

    hf_dataset().save_to_disk(str(tmp_path / "ds"), num_shards=2)
    assert len(list((tmp_path / "ds").glob("data-*.arrow"))) == 2
    own = datasets.load_from_disk(str(tmp_path / "ds"))
    got = record_rows(FileSource(files=[str(tmp_path / "ds")], encoding="arrow"))
    assert_same_rows(got, expected_hf_rows(list(own)))
    first = sorted((tmp_path / "ds").glob("data-*.arrow"))[0]
    assert list(iter_shard("arrow", first)) == list(own)[: len(list(iter_shard("arrow", first)))]


def test_a_dataset_dict_is_read_one_split_at_a_time(tmp_path: Path) -> None:
    import datasets

    whole = hf_dataset(30)
    datasets.DatasetDict(
        {"train": whole.select(range(20)), "test": whole.select(range(20, 30))}
    ).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ConfigError, match=r"DatasetDict; name one of its splits' directories: .*dd/train"):
        open_batch_stream(
            BatchStreamConfig(
                fields=HF_FIELDS,
                stages=[
                    Stage(sources=[FileSource(files=[str(tmp_path / "dd")], encoding="arrow")], batch_size=1)
                ],
            )
        )
    test_split = datasets.load_from_disk(str(tmp_path / "dd"))["test"]
    got = record_rows(FileSource(files=[str(tmp_path / "dd" / "test")], encoding="arrow"))
    assert_same_rows(got, expected_hf_rows(list(test_split)))


def test_the_datasets_cache_file_of_a_map_and_an_ipc_file_with_a_footer_read(tmp_path: Path) -> None:
    import pyarrow.ipc as ipc

    mapped = hf_dataset().map(
        lambda r: {"label": r["label"] + 100}, cache_file_name=str(tmp_path / "cache-map.arrow")
    )
    assert (tmp_path / "cache-map.arrow").exists()
    got = record_rows(FileSource(files=[str(tmp_path / "cache-map.arrow")]))
    assert_same_rows(got, expected_hf_rows(list(mapped)))
    table = hf_dataset().data.table
    with ipc.new_file(str(tmp_path / "footer.arrow"), table.schema) as writer:
        for batch in table.to_batches(max_chunksize=5):
            writer.write_batch(batch)
    got = record_rows(FileSource(files=[str(tmp_path / "footer.arrow")]))
    assert_same_rows(got, expected_hf_rows(table.to_pylist()))


def test_a_save_to_disk_directory_reads_from_s3(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str
) -> None:
    hf_dataset().save_to_disk(str(tmp_path / "ds"), num_shards=2)
    for f in (tmp_path / "ds").iterdir():
        upload(boto3_client, f, f"{s3_prefix}ds/{f.name}")
    expected = record_rows(FileSource(files=[str(tmp_path / "ds")], encoding="arrow"))
    got = record_rows(FileSource(files=[f"{s3_prefix}ds"], encoding="arrow"), data_for(s3_server))
    assert_same_rows(got, expected)


def test_arrow_files_that_are_not_tables_fail_closed(tmp_path: Path) -> None:
    import pyarrow.ipc as ipc

    table = pa.table({"ids": pa.array([[1, 2], [3]], pa.list_(pa.int64()))})
    with ipc.new_stream(str(tmp_path / "a.arrow"), table.schema) as writer:
        writer.write_table(table)
    raw = (tmp_path / "a.arrow").read_bytes()
    fields = [ProjectedField(name="ids", source="ids", dtype="i64", length=2)]

    def open_it(name: str) -> None:
        config = BatchStreamConfig(
            fields=fields, stages=[Stage(sources=[FileSource(files=[str(tmp_path / name)])], batch_size=1)]
        )
        with open_batch_stream(config) as stream:
            list(stream)

    open_it("a.arrow")
    (tmp_path / "cut.arrow").write_bytes(raw[: len(raw) - 20])
    with pytest.raises(MalformedShardError, match=r"cut\.arrow.*bytes remain"):
        open_it("cut.arrow")
    (tmp_path / "huge.arrow").write_bytes(raw[:4] + struct.pack("<I", 2**31) + raw[8:])
    with pytest.raises(MalformedShardError, match=r"huge\.arrow.*claims a 2147483648-byte header"):
        open_it("huge.arrow")
    (tmp_path / "text.arrow").write_bytes(b"not arrow at all\n" * 4)
    with pytest.raises(MalformedShardError, match=r"text\.arrow"):
        open_it("text.arrow")
    dictionary = pa.table({"ids": pa.array(["a", "b", "a"]).dictionary_encode()})
    with ipc.new_stream(str(tmp_path / "dict.arrow"), dictionary.schema) as writer:
        writer.write_table(dictionary)
    with pytest.raises(UnsupportedFormatError, match=r"dictionary-encoded"):
        open_it("dict.arrow")
    with pytest.raises(ConfigError, match=r"neither an \.arrow file nor a datasets save_to_disk directory"):
        record_rows(FileSource(files=[str(tmp_path)], encoding="arrow"))


def test_manifest_build_lists_arrow_files(tmp_path: Path) -> None:
    hf_dataset().save_to_disk(str(tmp_path / "ds"), num_shards=2)
    files = sorted((tmp_path / "ds").glob("data-*.arrow"))
    manifest = manifest_from_files(files, tmp_path / "m.json")
    assert manifest.data_format == "arrow"
    assert sum(s.rows for s in manifest.splits["train"].shards) == 23
    config = BatchStreamConfig(
        fields=HF_FIELDS,
        stages=[
            Stage(
                sources=[ManifestSource(manifest_uri=str(tmp_path / "m.json"), split="train")], batch_size=1
            )
        ],
    )
    assert len(rows(config)) == 23


def test_a_shuffled_mix_of_arrow_megatron_and_parquet_records_resumes_exactly(tmp_path: Path) -> None:
    docs = corpus([1 + (5 * i) % 9 for i in range(40)])
    idx = write_megatron(tmp_path / "m", docs[:20])
    lists = write_lists(tmp_path / "p.parquet", docs[20:])
    import datasets

    datasets.Dataset.from_dict({"tokens": docs[10:30]}).save_to_disk(str(tmp_path / "hf"), num_shards=3)
    config = BatchStreamConfig(
        fields=[ProjectedField(name="tokens", source="tokens", dtype="i64", length=10, pad=-1)],
        stages=[
            Stage(
                sources=[
                    FileSource(files=[str(idx)], weight=1.0),
                    FileSource(files=[str(tmp_path / "hf")], encoding="arrow", weight=2.0),
                    FileSource(files=[str(lists)], weight=1.0),
                ],
                batch_size=3,
                shuffle=Shuffle(buffer_rows=8),
                infinite=True,
            )
        ],
        seed=11,
    )
    assert_resumable(config, batches=12)


# --- MosaicML MDS -------------------------------------------------------------------------

MDS_COLUMNS = {
    "id": "int",
    "tokens": "ndarray:int32",
    "any": "ndarray",
    "fixed": "ndarray:uint16:4",
    "score": "float32",
    "text": "str",
    "meta": "json",
}


def write_mds(out: Path, n: int = 40, compression: str | None = None) -> list[dict[str, Any]]:
    """An MDS dataset written by mosaicml-streaming's MDSWriter, in several shards."""
    from streaming import MDSWriter

    samples = [
        {
            "id": i * 7 - 30,
            "tokens": np.arange(i, i + 1 + i % 6, dtype=np.int32),
            "any": np.arange(6, dtype=np.int16).reshape(2, 3) * (i - 20),
            "fixed": np.array([i, i + 1, i + 2, 65535], dtype=np.uint16),
            "score": np.float32(i / 8),
            "text": f"sample {i}",
            "meta": {"ids": [i, i * 2]},
        }
        for i in range(n)
    ]
    with MDSWriter(out=str(out), columns=MDS_COLUMNS, compression=compression, size_limit=1 << 10) as writer:
        for sample in samples:
            writer.write(sample)
    return samples


MDS_FIELDS = [
    ProjectedField(name="id", source="id", dtype="i64"),
    ProjectedField(name="tokens", source="tokens", dtype="i32", length=8, pad=-1),
    ProjectedField(name="any", source="any", dtype="i32", shape=(2, 3)),
    ProjectedField(name="fixed", source="fixed", dtype="i32", length=4),
    ProjectedField(name="score", source="score", dtype="f32"),
]


def expected_mds_rows(samples: list[dict[str, Any]]) -> list[dict[str, np.ndarray]]:
    out = []
    for s in samples:
        tokens = np.full(8, -1, np.int32)
        tokens[: len(s["tokens"])] = s["tokens"]
        out.append(
            {
                "id": np.int64(s["id"]),
                "tokens": tokens,
                "any": np.asarray(s["any"], np.int32),
                "fixed": np.asarray(s["fixed"], np.int32),
                "score": np.float32(s["score"]),
            }
        )
    return out


def mds_rows(source: FileSource, storage: Any = None) -> list[dict[str, np.ndarray]]:
    config = BatchStreamConfig(fields=MDS_FIELDS, stages=[Stage(sources=[source], batch_size=1)])
    return [{k: v for k, v in r.items() if k != "valid"} for r in rows(config, storage)]


# streaming's LocalDataset opens index.json without closing it.
@pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("compression", [None, "zstd", "zstd:7", "gz", "br", "snappy"])
def test_an_mds_dataset_reads_as_streaming_reads_it(tmp_path: Path, compression: str | None) -> None:
    import shutil

    from streaming import LocalDataset
    from streaming.base.compression import decompress

    write_mds(tmp_path / "mds", compression=compression)
    index = json.loads((tmp_path / "mds" / "index.json").read_text())
    assert len(index["shards"]) > 2
    # streaming reads a compressed shard once its Stream has inflated it beside it: do that in a
    # copy, with streaming's own codec, so the stream below reads the compressed files alone.
    shutil.copytree(tmp_path / "mds", tmp_path / "ref")
    for shard in index["shards"]:
        if shard["zip_data"]:
            packed = (tmp_path / "ref" / shard["zip_data"]["basename"]).read_bytes()
            (tmp_path / "ref" / shard["raw_data"]["basename"]).write_bytes(
                decompress(shard["compression"], packed)
            )
    assert not list((tmp_path / "mds").glob("*.mds")) or compression is None
    own = LocalDataset(local=str(tmp_path / "ref"))
    samples = [own[i] for i in range(len(own))]
    got = mds_rows(FileSource(files=[str(tmp_path / "mds")], encoding="mds"))
    assert_same_rows(got, expected_mds_rows(samples))
    # Every column, as iter_shard reads it, equals what streaming decodes.
    first = index["shards"][0]
    name = (first["zip_data"] or first["raw_data"])["basename"]
    records = list(iter_shard("mds", tmp_path / "mds" / name))
    assert len(records) == first["samples"]
    for record, sample in zip(records, samples, strict=False):
        assert record["id"] == sample["id"]
        assert record["tokens"] == sample["tokens"].tolist()
        assert record["any"] == sample["any"].tolist()
        assert record["fixed"] == sample["fixed"].tolist()
        assert record["score"] == float(sample["score"])
        assert record["text"] == sample["text"]
        assert record["meta"] == sample["meta"]


def test_an_mds_shard_whose_count_disagrees_with_index_json_fails_closed(tmp_path: Path) -> None:
    write_mds(tmp_path / "mds")
    index_path = tmp_path / "mds" / "index.json"
    index = json.loads(index_path.read_text())
    index["shards"][1]["samples"] += 1
    index_path.write_text(json.dumps(index))
    with pytest.raises(MalformedShardError, match=r"shard\.00001\.mds.*holds \d+ samples; index\.json says"):
        mds_rows(FileSource(files=[str(tmp_path / "mds")], encoding="mds"))
    index["shards"][1]["samples"] -= 1
    index["shards"][1]["raw_data"]["bytes"] += 5
    index_path.write_text(json.dumps(index))
    with pytest.raises(MalformedShardError, match=r"listed as \d+ bytes; the file holds"):
        mds_rows(FileSource(files=[str(tmp_path / "mds")], encoding="mds"))


def test_an_mds_codec_not_built_is_refused_naming_it(tmp_path: Path) -> None:
    write_mds(tmp_path / "mds", compression="bz2")
    with pytest.raises(UnsupportedFormatError, match=r"compressed with 'bz2'"):
        mds_rows(FileSource(files=[str(tmp_path / "mds")], encoding="mds"))


def test_an_mds_dataset_reads_from_s3(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str
) -> None:
    write_mds(tmp_path / "mds", compression="zstd")
    for f in (tmp_path / "mds").iterdir():
        upload(boto3_client, f, f"{s3_prefix}mds/{f.name}")
    expected = mds_rows(FileSource(files=[str(tmp_path / "mds")], encoding="mds"))
    got = mds_rows(FileSource(files=[f"{s3_prefix}mds"], encoding="mds"), data_for(s3_server))
    assert_same_rows(got, expected)


def test_manifest_build_lists_mds_shards(tmp_path: Path) -> None:
    samples = write_mds(tmp_path / "mds", compression="zstd")
    files = sorted((tmp_path / "mds").glob("shard.*.mds.zstd"))
    manifest = manifest_from_files(files, tmp_path / "m.json")
    assert manifest.data_format == "mds"
    assert sum(s.rows for s in manifest.splits["train"].shards) == len(samples)
