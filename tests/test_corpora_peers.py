"""The corpora read in place, against the libraries that write them where those import PyTorch
(megatron-core, mosaicml-streaming): files they write are read and compared value for value with
their own readers, and the test kit's NumPy writers, which the core's tests use, are checked to
write what they write.
"""

from __future__ import annotations

import itertools
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from o41_testkit import LocalS3Server, data_for, upload
from o41_testkit.corpora import (
    assert_same_rows,
    token_config,
    write_mds_tokens_plain,
    write_megatron_plain,
)
from o41_testkit.corpora import stream_rows as rows
from o41_testkit.corpora import token_corpus as corpus
from o41_testkit.corpora import write_token_lists as write_lists
from o41_training_data import (
    BatchStreamConfig,
    FileSource,
    MalformedShardError,
    Packing,
    ProjectedField,
    ProjectionError,
    Stage,
    TokenWindows,
    UnsupportedFormatError,
    iter_shard,
    manifest_from_files,
    open_batch_stream,
)

with warnings.catch_warnings():
    # megatron-core warns at import that its fused GPU kernels (Transformer Engine, Apex) are
    # absent; its indexed datasets need neither.
    warnings.simplefilter("ignore")
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

LENGTHS = [13, 2, 7, 30, 5, 5, 9, 1, 22, 0, 17]
Docs = list[list[int]]
EOS = 0


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


@pytest.mark.parametrize("dtype", [np.int32, np.uint16, np.int64, np.uint8])
def test_megatron_documents_are_records_equal_to_megatron_cores_reader(tmp_path: Path, dtype: type) -> None:
    docs = [[t % 250 + 1 for t in d] for d in corpus(LENGTHS)]
    idx = write_megatron(tmp_path / "corpus", docs, dtype)
    expected = megatron_documents(tmp_path / "corpus")
    assert expected == docs
    config = BatchStreamConfig(
        fields=[ProjectedField(name="ids", source="tokens", dtype="i64", length=max(LENGTHS), pad=-1)],
        stages=[Stage(sources=[FileSource(files=[str(idx)])], batch_size=1)],
    )
    assert [list(r["ids"][r["ids"] >= 0]) for r in rows(config)] == expected
    assert [r["tokens"] for r in iter_shard("megatron", idx)] == expected
    # The test kit's writer, which the core's tests use, writes the same bytes.
    write_megatron_plain(tmp_path / "plain", docs, np.dtype(dtype).name)
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"plain{suffix}").read_bytes() == (tmp_path / f"corpus{suffix}").read_bytes()


def test_packing_a_megatron_core_dataset_equals_packing_the_same_documents_from_parquet(
    tmp_path: Path,
) -> None:
    docs = corpus(LENGTHS)
    idx = write_megatron(tmp_path / "corpus", docs)
    lists = write_lists(tmp_path / "lists.parquet", docs)
    for layout in (
        {"packing": Packing(field="tokens", seq_len=8, bins=4)},
        {"windows": TokenWindows(field="tokens", seq_len=8)},
    ):
        got = rows(token_config(FileSource(files=[str(idx)]), **layout))
        assert_same_rows(got, rows(token_config(FileSource(files=[str(lists)]), **layout)))


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


# --- MosaicML MDS ----------------------------------------------------------------------


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
    # The index promises each shard's size at open; the first read holds the file to it.
    with pytest.raises(MalformedShardError, match=r"index lists \d+ bytes, the shard is \d+ bytes"):
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


def write_mds_tokens(out: Path, docs: Docs, compression: str | None = None, size_limit: int = 1 << 9) -> Path:
    from streaming import MDSWriter

    with MDSWriter(
        out=str(out),
        columns={"tokens": "ndarray:int32", "n": "int"},
        compression=compression,
        size_limit=size_limit,
    ) as writer:
        for doc in docs:
            writer.write({"tokens": np.asarray(doc, np.int32), "n": len(doc)})
    return out


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_token_stages_read_mds_lists_as_parquet_lists(tmp_path: Path, compression: str | None) -> None:
    # MDSWriter cannot write an empty array: every document here holds tokens.
    docs = corpus([n for n in LENGTHS if n > 0])
    lists = write_lists(tmp_path / "lists.parquet", docs)
    mds = write_mds_tokens(tmp_path / "mds", docs, compression, size_limit=1 << 20)
    assert len(json.loads((mds / "index.json").read_text())["shards"]) == 1
    for layout in (
        {"packing": Packing(field="tokens", seq_len=8, bins=4)},
        {"windows": TokenWindows(field="tokens", seq_len=8)},
        {"windows": TokenWindows(field="tokens", seq_len=8, eos_id=9)},
    ):
        got = rows(token_config(FileSource(files=[str(mds)], encoding="mds"), **layout))
        assert_same_rows(got, rows(token_config(FileSource(files=[str(lists)]), **layout)))


def test_a_token_stage_refuses_an_mds_column_that_is_not_ids(tmp_path: Path) -> None:
    write_mds(tmp_path / "mds")
    config = BatchStreamConfig(
        fields=[ProjectedField(name="text", source="text", dtype="i64", length=8)],
        stages=[
            Stage(
                sources=[FileSource(files=[str(tmp_path / "mds")], encoding="mds")],
                batch_size=1,
                packing=Packing(field="text", seq_len=8),
            )
        ],
    )
    with pytest.raises(ProjectionError, match=r"list of integer ids; this is a string"):
        rows(config)


# streaming's LocalDataset opens index.json without closing it.
@pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
def test_the_test_kits_mds_writer_writes_what_streaming_reads(tmp_path: Path) -> None:
    from streaming import LocalDataset

    docs = corpus([3, 300, 1, 70000 % 977, 12])
    own = LocalDataset(local=str(write_mds_tokens_plain(tmp_path / "mds", docs, per_shard=2)))
    assert [own[i]["tokens"].tolist() for i in range(len(own))] == docs
    assert [own[i]["n"] for i in range(len(own))] == [len(d) for d in docs]
