"""Corpora other tools wrote, read in place: Megatron indexed datasets, NumPy token arrays,
Hugging Face ``datasets`` Arrow files and MosaicML MDS shards (ArrayRecord files in
``test_corpora_array_record.py``; here in the mix of every format).

NumPy and Arrow files here are written by their own libraries (``numpy.save``,
``ndarray.tofile``, ``datasets``, ``pyarrow.ipc``) and every value the stream delivers is compared
with what those libraries read. megatron-core's and mosaicml-streaming's writers import PyTorch,
which the core's tests run without: Megatron and MDS files here come from the test kit's NumPy
writers, which ``tests/test_corpora_peers.py`` checks against those libraries (and where the
libraries' own files are read and compared with their own readers).
"""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from o41_testkit import LocalS3Server, data_for, upload
from o41_testkit.corpora import (
    assert_same_rows,
    token_config,
    token_fields,
    write_mds_tokens_plain,
    write_megatron_plain,
)
from o41_testkit.corpora import stream_rows as rows
from o41_testkit.corpora import token_corpus as corpus
from o41_testkit.corpora import write_token_lists as write_lists
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
    UnsupportedFormatError,
    iter_shard,
    manifest_from_files,
    open_batch_stream,
    resume_batch_stream,
)
from o41_training_data.testing import assert_resumable

EOS = 0
LENGTHS = [13, 2, 7, 30, 5, 5, 9, 1, 22, 0, 17]
Docs = list[list[int]]


def write_megatron(prefix: Path, docs: list[list[int]], dtype: str = "int32") -> Path:
    return write_megatron_plain(prefix, docs, dtype)


# --- Megatron -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["int32", "uint16", "int64", "uint8", "int8", "int16"])
def test_megatron_documents_are_records(tmp_path: Path, dtype: str) -> None:
    docs = [[t % 120 + 1 for t in d] for d in corpus(LENGTHS)]
    idx = write_megatron(tmp_path / "corpus", docs, dtype)
    config = BatchStreamConfig(
        fields=[ProjectedField(name="ids", source="tokens", dtype="i64", length=max(LENGTHS), pad=-1)],
        stages=[Stage(sources=[FileSource(files=[str(idx)])], batch_size=1)],
    )
    assert [list(r["ids"][r["ids"] >= 0]) for r in rows(config)] == docs
    # Named by its .bin (with the encoding), or by the common prefix.
    for name in [f"{tmp_path / 'corpus'}.bin", str(tmp_path / "corpus")]:
        named = BatchStreamConfig(
            fields=config.fields,
            stages=[Stage(sources=[FileSource(files=[name], encoding="megatron")], batch_size=1)],
        )
        assert [list(r["ids"][r["ids"] >= 0]) for r in rows(named)] == docs
    assert [r["tokens"] for r in iter_shard("megatron", idx)] == docs


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
    write_megatron(tmp_path / "corpus", docs, "uint16")
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


def write_hf_tokens(out: Path, docs: Docs, shards: int = 2) -> Path:
    import datasets

    datasets.Dataset.from_dict({"tokens": docs}).save_to_disk(str(out), num_shards=shards)
    return out


@pytest.mark.parametrize("kind", ["arrow", "mds"])
def test_token_stages_read_arrow_and_mds_lists_as_parquet_lists(tmp_path: Path, kind: str) -> None:
    # MDS cannot hold an empty array: every document here holds tokens.
    docs = corpus([n for n in LENGTHS if n > 0])
    lists = write_lists(tmp_path / "lists.parquet", docs)
    # Windows are planned per shard: one shard each, as the Parquet file is.
    if kind == "arrow":
        source = FileSource(files=[str(write_hf_tokens(tmp_path / "hf", docs, shards=1))], encoding="arrow")
    else:
        source = FileSource(
            files=[str(write_mds_tokens_plain(tmp_path / "mds", docs, per_shard=100))], encoding="mds"
        )
    for layout in (
        {"packing": Packing(field="tokens", seq_len=8, bins=4)},
        {"windows": TokenWindows(field="tokens", seq_len=8)},
        {"windows": TokenWindows(field="tokens", seq_len=8, eos_id=9)},
    ):
        got = rows(token_config(source, **layout))
        assert_same_rows(got, rows(token_config(FileSource(files=[str(lists)]), **layout)))


def test_a_token_stage_refuses_an_arrow_column_that_is_not_ids(tmp_path: Path) -> None:
    hf_dataset().save_to_disk(str(tmp_path / "hf"))
    config = BatchStreamConfig(
        fields=[ProjectedField(name="text", source="text", dtype="i64", length=8)],
        stages=[
            Stage(
                sources=[FileSource(files=[str(tmp_path / "hf")], encoding="arrow")],
                batch_size=1,
                packing=Packing(field="text", seq_len=8),
            )
        ],
    )
    with pytest.raises(ProjectionError, match=r"list of integer ids from it; the column is Utf8"):
        rows(config)


@pytest.fixture(scope="module")
def every_format(tmp_path_factory: pytest.TempPathFactory) -> BatchStreamConfig:
    """A token stage mixing Megatron, NumPy, Arrow, MDS, ArrayRecord and Parquet sources with
    weights."""
    from array_record.python import array_record_module as ar

    tmp = tmp_path_factory.mktemp("every-format")
    docs = [[*d, EOS] for d in corpus([2 + (11 * i) % 37 for i in range(180)])]
    parts = [docs[k * 30 : (k + 1) * 30] for k in range(6)]
    idx = write_megatron(tmp / "m", parts[0])
    np.save(tmp / "n.npy", np.asarray([t for d in parts[1] for t in d], dtype="<u4"))
    hf = write_hf_tokens(tmp / "hf", parts[2], shards=3)
    mds = write_mds_tokens_plain(tmp / "mds", parts[3])
    lists = write_lists(tmp / "p.parquet", parts[4])
    writer = ar.ArrayRecordWriter(str(tmp / "a.array_record"), "group_size:4,zstd:3")
    for d in parts[5]:
        writer.write(np.asarray(d, dtype="<u4").tobytes())
    writer.close()
    return BatchStreamConfig(
        fields=token_fields(16),
        stages=[
            Stage(
                sources=[
                    FileSource(files=[str(idx)], weight=2.0),
                    FileSource(files=[str(tmp / "n.npy")], weight=1.0),
                    FileSource(files=[str(hf)], encoding="arrow", weight=1.5),
                    FileSource(files=[str(mds)], encoding="mds", weight=1.0),
                    FileSource(files=[str(lists)], weight=0.5),
                    FileSource(
                        files=[str(tmp / "a.array_record")], encoding="array_record:uint32", weight=1.0
                    ),
                ],
                batch_size=2,
                packing=Packing(field="tokens", seq_len=16, bins=4, eos_id=EOS),
                shuffle=Shuffle(buffer_rows=8),
                infinite=True,
            )
        ],
        seed=5,
        threads=2,
    )


def batches(
    config: BatchStreamConfig, n: int, checkpoint: Any = None, **world: int
) -> list[dict[str, np.ndarray]]:
    opened = resume_batch_stream(checkpoint, **world) if checkpoint is not None else open_batch_stream(config)
    out = []
    with opened as stream:
        for _ in range(n):
            out.append({k: v.copy() for k, v in next(stream).arrays().items()})
    return out


def test_a_mix_of_every_format_resumes_exactly(every_format: BatchStreamConfig) -> None:
    assert_resumable(every_format, batches=10)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stop=st.integers(min_value=0, max_value=9))
def test_a_mix_of_every_format_moves_from_two_ranks_to_three_exactly(
    every_format: BatchStreamConfig, stop: int
) -> None:
    single = batches(every_format, 2 * stop + 9)
    with open_batch_stream(replace(every_format, rank=0, world_size=2)) as stream:
        for _ in range(stop):
            next(stream)
        checkpoint = stream.checkpoint()
    # After `stop` local batches on each of 2 ranks, global batch 2 * stop is next; rank r of 3
    # then reads global batches 2 * stop + r, + 3, + 6.
    for r in range(3):
        moved = batches(every_format, 3, checkpoint.for_world(rank=r, world_size=3), rank=r, world_size=3)
        for j, batch in enumerate(moved):
            expected = single[2 * stop + r + 3 * j]
            for name in batch:
                np.testing.assert_array_equal(
                    batch[name], expected[name], err_msg=f"stop {stop}, rank {r}, {name}"
                )


def test_manifest_verify_reports_a_megatron_index_that_no_longer_counts_the_same(tmp_path: Path) -> None:
    from o41_training_data import StorageConfig, load_manifest
    from o41_training_data._manifest_check import verify_manifest

    docs = corpus(LENGTHS)
    idx = write_megatron(tmp_path / "a", docs)
    manifest_from_files([idx], tmp_path / "m.json")
    manifest = load_manifest(tmp_path / "m.json")
    assert verify_manifest(manifest, StorageConfig()) == []
    # The same .bin, indexed as fewer documents: its bytes and checksum still match.
    write_megatron(tmp_path / "a", [docs[0] + docs[1], *docs[2:]])
    assert verify_manifest(manifest, StorageConfig()) == [
        f"{tmp_path / 'a.bin'}: {len(docs) - 1} records, the manifest says {len(docs)}"
    ]
    (tmp_path / "a.idx").write_bytes(b"MMIDIDX")
    (problem,) = verify_manifest(manifest, StorageConfig())
    assert "a.idx" in problem
    assert "shorter than an index header" in problem


def test_manifest_build_over_a_directory_lists_the_shards_under_it(tmp_path: Path) -> None:
    docs = corpus([4 + i % 9 for i in range(30)])
    (tmp_path / "megatron").mkdir()
    for k in range(3):
        write_megatron(tmp_path / "megatron" / f"part-{k}", docs[k * 10 : (k + 1) * 10])
    manifest = manifest_from_files([tmp_path / "megatron"], tmp_path / "m1.json")
    assert manifest.data_format == "megatron"
    assert [s.location for s in manifest.splits["train"].shards] == [
        f"megatron/part-{k}.bin" for k in range(3)
    ]
    import datasets

    datasets.Dataset.from_dict({"tokens": docs}).save_to_disk(str(tmp_path / "hf"), num_shards=2)
    manifest = manifest_from_files([tmp_path / "hf"], tmp_path / "m2.json")
    assert (manifest.data_format, sum(s.rows for s in manifest.splits["train"].shards)) == ("arrow", 30)
    write_mds_tokens_plain(tmp_path / "mds", docs, per_shard=7)
    manifest = manifest_from_files([tmp_path / "mds"], tmp_path / "m3.json")
    assert (manifest.data_format, len(manifest.splits["train"].shards)) == ("mds", 5)
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"tokens": docs})}).save_to_disk(
        str(tmp_path / "dd")
    )
    with pytest.raises(ConfigError, match=r"DatasetDict: build a manifest from one split's directory"):
        manifest_from_files([tmp_path / "dd"], tmp_path / "m4.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"holds no shard with a known suffix"):
        manifest_from_files([tmp_path / "empty"], tmp_path / "m5.json")
