"""ArrayRecord files (grain, MaxText) read in place, written here by ``array-record``'s own
``ArrayRecordWriter`` and compared record for record with its ``ArrayRecordReader``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from array_record.python import array_record_module as ar
from o41_testkit import LocalS3Server, data_for, upload
from o41_testkit.corpora import assert_same_rows, token_config
from o41_testkit.corpora import stream_rows as rows
from o41_testkit.corpora import token_corpus as corpus
from o41_testkit.corpora import write_token_lists as write_lists
from o41_training_data import (
    BatchStreamConfig,
    ConfigError,
    FileSource,
    MalformedShardError,
    Packing,
    ProjectedField,
    ProjectionError,
    Stage,
    UnsupportedFormatError,
    iter_shard,
    load_manifest,
    manifest_from_files,
)

EOS = 0
LENGTHS = [13, 2, 7, 30, 5, 5, 9, 1, 22, 0, 17, 40, 3]
Docs = list[list[int]]
# The options ArrayRecordWriter takes: every codec it writes, small groups so files hold
# several chunks, and the library's default (zstd, groups of 65,536).
OPTIONS = [
    "group_size:3,uncompressed",
    "group_size:4,zstd:3",
    "group_size:2,brotli",
    "group_size:5,snappy",
    "",
]


def write(path: Path, payloads: list[bytes], options: str = "group_size:3,uncompressed") -> Path:
    writer = ar.ArrayRecordWriter(str(path), options)
    for payload in payloads:
        writer.write(payload)
    writer.close()
    return path


def read_back(path: Path) -> list[bytes]:
    """What array-record's own reader returns for every record of ``path``."""
    reader = ar.ArrayRecordReader(str(path))
    try:
        return list(reader.read_all())
    finally:
        reader.close()


def id_docs(docs: Docs, dtype: str) -> list[bytes]:
    return [np.asarray(d, dtype=np.dtype(dtype).newbyteorder("<")).tobytes() for d in docs]


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("dtype", ["uint16", "int32", "int64", "uint8"])
def test_a_file_of_ids_holds_one_token_document_per_record(tmp_path: Path, dtype: str, options: str) -> None:
    docs = [[t % 250 for t in d] for d in corpus(LENGTHS)]
    path = write(tmp_path / "docs.array_record", id_docs(docs, dtype), options)
    theirs = [np.frombuffer(b, dtype=np.dtype(dtype).newbyteorder("<")).tolist() for b in read_back(path)]
    assert theirs == docs
    ours = [r["tokens"] for r in iter_shard(f"array_record:{dtype}", str(path))]
    assert ours == theirs


@pytest.mark.parametrize("options", OPTIONS[:2])
def test_packing_an_array_record_file_equals_packing_the_same_documents_from_parquet(
    tmp_path: Path, options: str
) -> None:
    docs = [[*d, EOS] for d in corpus(LENGTHS)]
    path = write(tmp_path / "docs.array_record", id_docs(docs, "uint32"), options)
    lists = write_lists(tmp_path / "docs.parquet", docs)
    packing = {"packing": Packing(field="tokens", seq_len=16, bins=4, eos_id=EOS)}
    ours = rows(token_config(FileSource(files=[str(path)], encoding="array_record:uint32"), 16, **packing))
    assert_same_rows(ours, rows(token_config(FileSource(files=[str(lists)]), 16, **packing)))


def records_config(path: Path, encoding: str, fields: list[ProjectedField]) -> BatchStreamConfig:
    return BatchStreamConfig(
        fields=fields,
        stages=[Stage(sources=[FileSource(files=[str(path)], encoding=encoding)], batch_size=2)],
    )


def sample(i: int) -> dict[str, Any]:
    return {"id": i, "score": i / 4, "ids": [i, i + 1, i + 2], "name": f"row {i}", "keep": i % 2 == 0}


RECORD_FIELDS = [
    ProjectedField(name="id", source="id", dtype="i64"),
    ProjectedField(name="score", source="score", dtype="f64"),
    ProjectedField(name="ids", source="ids", dtype="i32", shape=(3,)),
    ProjectedField(name="keep", source="keep", dtype="bool"),
]


@pytest.mark.parametrize(
    ("payload", "encode", "decode"),
    [
        ("json", lambda r: json.dumps(r).encode(), json.loads),
        ("msgpack", msgpack.packb, msgpack.unpackb),
    ],
)
def test_json_and_msgpack_records_project_as_their_own_readers_decode_them(
    tmp_path: Path, payload: str, encode: Any, decode: Any
) -> None:
    path = write(
        tmp_path / "rows.array_record", [encode(sample(i)) for i in range(22)], "group_size:5,zstd:3"
    )
    theirs = [decode(b) for b in read_back(path)]
    assert [dict(r) for r in iter_shard(f"array_record:{payload}", str(path))] == theirs
    got = rows(records_config(path, f"array_record:{payload}", RECORD_FIELDS))
    assert [int(r["id"]) for r in got] == [t["id"] for t in theirs]
    for r, t in zip(got, theirs, strict=True):
        assert float(r["score"]) == t["score"]
        assert r["ids"].tolist() == t["ids"]
        assert bool(r["keep"]) == t["keep"]


def test_an_array_record_file_reads_from_s3_as_from_local_disk(
    tmp_path: Path, s3_server: LocalS3Server, boto3_client: Any, s3_prefix: str
) -> None:
    docs = [[*d, EOS] for d in corpus(LENGTHS)]
    path = write(tmp_path / "docs.array_record", id_docs(docs, "uint16"), "group_size:2,zstd:3")
    uri = upload(boto3_client, path, f"{s3_prefix}docs.array_record")
    packing = {"packing": Packing(field="tokens", seq_len=16, bins=4, eos_id=EOS)}
    local = rows(token_config(FileSource(files=[str(path)], encoding="array_record:uint16"), 16, **packing))
    remote = token_config(FileSource(files=[uri], encoding="array_record:uint16"), 16, **packing)
    assert_same_rows(rows(remote, data_for(s3_server)), local)
    records = BatchStreamConfig(
        fields=[ProjectedField(name="ids", source="tokens", dtype="i32", length=48)],
        stages=[Stage(sources=[FileSource(files=[uri], encoding="array_record:uint16")], batch_size=1)],
    )
    got = [list(r["ids"][: len(d)]) for r, d in zip(rows(records, data_for(s3_server)), docs, strict=True)]
    assert got == docs


def test_the_payload_must_be_named(tmp_path: Path) -> None:
    path = write(tmp_path / "docs.array_record", id_docs([[1, 2]], "uint16"))
    config = BatchStreamConfig(
        fields=RECORD_FIELDS, stages=[Stage(sources=[FileSource(files=[str(path)])], batch_size=1)]
    )
    with pytest.raises(ConfigError, match=r"array_record:json"):
        rows(config)


def test_a_file_of_ids_read_for_another_field_or_as_the_wrong_width_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "docs.array_record", [np.asarray([1, 2, 3], dtype="<u2").tobytes()])
    config = BatchStreamConfig(
        fields=[ProjectedField(name="ids", source="input_ids", dtype="i32", length=8)],
        stages=[
            Stage(
                sources=[FileSource(files=[str(path)], encoding="array_record:uint16")],
                batch_size=1,
                packing=Packing(field="input_ids", seq_len=8, bins=2, eos_id=EOS),
            )
        ],
    )
    with pytest.raises(ProjectionError, match=r"one field, 'tokens'"):
        rows(config)
    with pytest.raises(MalformedShardError, match=r"not a whole number of uint32 ids"):
        list(iter_shard("array_record:uint32", str(path)))


def test_transposed_chunks_are_refused_naming_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "t.array_record", [b"abc", b"de"], "group_size:1,transpose:true,uncompressed")
    with pytest.raises(UnsupportedFormatError, match=r"t\.array_record.*transposed"):
        list(iter_shard("array_record:uint8", str(path)))


def test_damaged_and_cut_files_fail_closed(tmp_path: Path) -> None:
    docs = corpus(LENGTHS)
    good = write(tmp_path / "good.array_record", id_docs(docs, "uint16"), "group_size:3,uncompressed")
    data = bytearray(good.read_bytes())
    # A byte of the first chunk's records: its data hash no longer matches.
    data[64 + 40 + 10] ^= 0xFF
    damaged = tmp_path / "damaged.array_record"
    damaged.write_bytes(bytes(data))
    with pytest.raises(MalformedShardError, match=r"damaged\.array_record.*does not match its hash"):
        list(iter_shard("array_record:uint16", str(damaged)))
    cut = tmp_path / "cut.array_record"
    cut.write_bytes(good.read_bytes()[:1000])
    with pytest.raises(MalformedShardError, match=r"cut\.array_record"):
        list(iter_shard("array_record:uint16", str(cut)))
    other = tmp_path / "other.array_record"
    other.write_bytes(b"\0" * 70_000)
    with pytest.raises(MalformedShardError, match=r"other\.array_record"):
        list(iter_shard("array_record:uint16", str(other)))


def test_manifest_build_lists_array_record_files_once_their_payload_is_named(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    docs = corpus(LENGTHS)
    write(data / "train.array_record-00000-of-00002", id_docs(docs[:6], "int32"))
    write(data / "train.array_record-00001-of-00002", id_docs(docs[6:], "int32"))
    with pytest.raises(ConfigError, match=r"data_format.*array_record:int32"):
        manifest_from_files([str(data)], str(tmp_path / "m.json"))
    built = manifest_from_files([str(data)], str(tmp_path / "m.json"), data_format="array_record:int32")
    assert built.data_format == "array_record:int32"
    shards = load_manifest(str(tmp_path / "m.json")).splits["train"].shards
    assert [s.rows for s in shards] == [6, len(docs) - 6]
    assert [Path(s.location).name for s in shards] == [
        "train.array_record-00000-of-00002",
        "train.array_record-00001-of-00002",
    ]


def test_token_lists_of_json_records_pack(tmp_path: Path) -> None:
    docs = [[*d, EOS] for d in corpus(LENGTHS)]
    path = write(tmp_path / "docs.array_record", [json.dumps({"tokens": d}).encode() for d in docs])
    lists = write_lists(tmp_path / "docs.parquet", docs)
    packing = {"packing": Packing(field="tokens", seq_len=16, bins=4, eos_id=EOS)}
    ours = rows(token_config(FileSource(files=[str(path)], encoding="array_record:json"), 16, **packing))
    assert_same_rows(ours, rows(token_config(FileSource(files=[str(lists)]), 16, **packing)))
