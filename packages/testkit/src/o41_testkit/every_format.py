"""One small corpus in every format the engine reads, and what a stream over it must deliver.

Token formats (Parquet lists, ``.bin``, Megatron, NumPy, Arrow IPC, MDS, ArrayRecord) hold the
same documents, ids 1 to ``T`` in order, in one shard each, read as stream windows; record
formats (JSON Lines, gzip JSON Lines, framed MessagePack) hold records ``{"v": i}``. The
expected rows follow from the formats' and the windows' documented meaning alone, so a case
checks a reader, not a copy of another reader's output.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from o41_training_data import (
    BatchStreamConfig,
    Encoding,
    FileSource,
    ProjectedField,
    Stage,
    TokenWindows,
    _core,
)

from .corpora import token_corpus, write_mds_tokens_plain, write_megatron_plain, write_token_lists
from .shards import write_shard

__all__ = ["EVERY_FORMAT", "FormatCase", "write_format_case"]

EVERY_FORMAT: tuple[Encoding, ...] = tuple(
    name  # type: ignore[misc]  # the engine's names are the Encoding literal's
    for name in _core.encodings()
    if not name.startswith("array_record:") or name == "array_record:uint32"
)
"""Every encoding family the engine reads, from its own table (ArrayRecord with one of its
payloads): a format added to the engine fails :func:`write_format_case` until it has a writer."""

SEQ_LEN = 8
RECORDS = 37
DOCUMENTS = token_corpus([5, 1, 12, 7, 3, 9, 16, 2, 8, 11, 4, 6])


@dataclass(frozen=True)
class FormatCase:
    """A corpus written in one format under a directory, and the rows a stream over it delivers."""

    encoding: Encoding
    root: Path
    """The directory the corpus is written under."""
    files: tuple[str, ...]
    """Every file written, relative to ``root`` (upload them all, as they are)."""
    entry: str
    """The name a config lists, relative to the directory."""
    tokens: bool
    """Whether a token stage reads it (windows of ``tokens``), else a record stage (``v``)."""

    def config(self, base: str) -> BatchStreamConfig:
        """One finite, unshuffled stage over the corpus under ``base`` (a directory or URI prefix)."""
        source = FileSource(files=[f"{base.rstrip('/')}/{self.entry}"], encoding=self.encoding)
        if self.tokens:
            field = ProjectedField("tokens", "tokens", "i64", length=SEQ_LEN + 1)
            stage = Stage(
                sources=[source], batch_size=1, windows=TokenWindows(field="tokens", seq_len=SEQ_LEN)
            )
        else:
            field = ProjectedField("v", "v", "i64")
            stage = Stage(sources=[source], batch_size=1)
        return BatchStreamConfig(fields=[field], stages=[stage], threads=1)

    def expected(self) -> list[list[int]]:
        """Every row's values, in order: the windows of ids 1 to T, or each record's ``v``."""
        if not self.tokens:
            return [[v] for v in range(RECORDS)]
        stream = [t for document in DOCUMENTS for t in document]
        # A window of SEQ_LEN + 1 ids every SEQ_LEN ids, the last one padded with 0.
        starts = range(0, len(stream) - 1, SEQ_LEN)
        return [(stream[s : s + SEQ_LEN + 1] + [0] * SEQ_LEN)[: SEQ_LEN + 1] for s in starts]


def _files(root: Path) -> tuple[str, ...]:
    return tuple(sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()))


def _write_arrow(path: Path, documents: Sequence[Sequence[int]]) -> None:
    table = pa.table({"tokens": pa.array(documents, pa.list_(pa.int64()))})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


def write_format_case(encoding: Encoding, root: Path) -> FormatCase:
    """Writes the corpus in ``encoding`` under the empty directory ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    stream = np.asarray([t for document in DOCUMENTS for t in document])
    if encoding in ("jsonl", "jsonl.gz", "msgpack"):
        suffix = {"jsonl": ".jsonl", "jsonl.gz": ".jsonl.gz", "msgpack": ".msgpack"}[encoding]
        write_shard(root / f"records{suffix}", encoding, [{"v": i} for i in range(RECORDS)])
        return FormatCase(encoding, root, _files(root), f"records{suffix}", tokens=False)
    if encoding == "parquet":
        write_token_lists(root / "t.parquet", DOCUMENTS)
        entry = "t.parquet"
    elif encoding == "bin":
        stream.astype("<u2").tofile(root / "t.bin")
        (root / "meta.json").write_text(json.dumps({"dtype": "uint16"}))
        entry = "t.bin"
    elif encoding == "megatron":
        write_megatron_plain(root / "t", DOCUMENTS)
        entry = "t.idx"
    elif encoding == "npy":
        np.save(root / "t.npy", stream.astype("<u4"))
        entry = "t.npy"
    elif encoding == "arrow":
        _write_arrow(root / "t.arrow", DOCUMENTS)
        entry = "t.arrow"
    elif encoding == "mds":
        write_mds_tokens_plain(root / "mds", DOCUMENTS, per_shard=len(DOCUMENTS))
        entry = "mds"
    elif encoding == "array_record:uint32":
        # array_record ships no type information.
        from array_record.python import array_record_module as ar  # type: ignore[import-untyped]

        writer = ar.ArrayRecordWriter(str(root / "t.array_record"), "group_size:4")
        for document in DOCUMENTS:
            writer.write(np.asarray(document, dtype="<u4").tobytes())
        writer.close()
        entry = "t.array_record"
    else:  # pragma: no cover - a test bug
        raise AssertionError(encoding)
    return FormatCase(encoding, root, _files(root), entry, tokens=True)
