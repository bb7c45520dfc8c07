"""Tokenising text records into a token dataset (``o41 tokenize``), through the dataset saver.

Each input shard (JSON Lines, gzip JSON Lines, Parquet or framed MessagePack records with a text
field) is read by the engine, encoded in batches, and saved as one or more output shards of
records ``{"tokens": list<int32>}``, one record per input record, each ending with the end of
document id. An output shard closes once it holds ``tokens_per_shard`` tokens, so shard
boundaries depend only on the input and the tokenizer: a job killed at any point and run again
recovers every completed shard from its descriptor, re-tokenises only the rest, and publishes the
same dataset an uninterrupted run does. With a Ray address, each input shard is tokenised in its
own Ray task. See ``docs/tokenize.md``.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from . import _core
from ._config import ENCODINGS
from ._errors import DataError, ObjectNotFoundError
from ._errors import invalid as _invalid
from ._manifest import DataManifest
from ._manifest_build import encoding_of
from ._ray import connect
from ._saver import SHARD_EXTENSIONS, DatasetSaver, SavedShard
from ._storage import StorageConfig, normalize, parent

__all__ = ["TextTokenizer", "TokenizedDataset", "TokenizerIdentity", "tokenize_dataset"]

TOKENS_FIELD = "tokens"
"""The output records' one field: a document's token ids, int32, ending with the eos id."""
BYTE_EOS = 256
"""The byte tokenizer's end of document id: one past the 256 byte values."""
# End-of-document tokens looked for, in this order, when a tokenizer.json is given without eos.
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
DEFAULT_TOKENS_PER_SHARD = 1 << 26  # 256 MiB of int32 ids: a Parquet shard far below 5 GiB
DEFAULT_BATCH = 1024
_PART_DIGITS = 6
# Options a completed shard records, in the order a refused restart names them.
_OPTIONS = ("tokenizer", "text_field", "tokens_per_shard")
_EXTRA_HINT = "pip install 'o41-training-data[tokenize]'"


def _data_error(message: str, path: str, row: int | None = None, field: str | None = None) -> DataError:
    error = DataError(message)
    error.path, error.row, error.field = path, row, field
    return error


@dataclass(frozen=True)
class TokenizerIdentity:
    """What a token dataset was encoded with, as every shard's manifest metadata records it.

    ``kind`` is ``"byte"`` (UTF-8 bytes 0-255, eos 256) or ``"tokenizers"`` (a Hugging Face
    ``tokenizer.json``); ``sha256`` is the hex SHA-256 of that file's bytes (``None`` for the
    byte tokenizer, which has no file).

    Examples:
        >>> TextTokenizer.byte().identity
        TokenizerIdentity(kind='byte', vocab_size=257, eos_id=256, sha256=None)

    """

    kind: str
    vocab_size: int
    eos_id: int
    sha256: str | None

    def to_metadata(self) -> dict[str, Any]:
        """The identity as the JSON object stored under ``metadata["tokenizer"]``."""
        return {
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "sha256": self.sha256,
        }

    @classmethod
    def from_manifest(cls, manifest: DataManifest) -> TokenizerIdentity:
        """The identity every shard of a tokenised dataset records; raises if any shard differs.

        Raises :class:`DataError` naming the first shard that records no tokenizer or another one.

        Examples:
            >>> manifest = load_manifest("tokens/data-manifest-v1.json")  # doctest: +SKIP
            >>> TokenizerIdentity.from_manifest(manifest)  # doctest: +SKIP
            TokenizerIdentity(kind='byte', vocab_size=257, eos_id=256, sha256=None)

        """
        found: TokenizerIdentity | None = None
        for split in manifest.splits.values():
            for shard in split.shards:
                recorded = shard.metadata.get("tokenizer")
                try:
                    identity = cls(**recorded) if isinstance(recorded, dict) else None
                except TypeError:
                    identity = None
                if identity is None:
                    raise _data_error(
                        f"{shard.path or shard.location}: its manifest metadata records no tokenizer "
                        "(metadata.tokenizer); it was not written by o41 tokenize",
                        shard.path or shard.location,
                        field="metadata.tokenizer",
                    )
                if found is not None and identity != found:
                    raise _data_error(
                        f"{shard.path or shard.location}: encoded with {identity}, other shards with {found}",
                        shard.path or shard.location,
                        field="metadata.tokenizer",
                    )
                found = identity
        if found is None:
            raise DataError(f"{manifest.uri or 'the manifest'}: has no shards to read a tokenizer from")
        return found


class TextTokenizer:
    """Turns documents into int32 token ids, each document ending with the eos id.

    :meth:`byte` is built in: a document's UTF-8 bytes (ids 0-255) then eos 256.
    :meth:`from_file` loads a Hugging Face ``tokenizer.json`` with the ``tokenizers`` package
    (the ``[tokenize]`` extra), without network access; its batch encoder runs in Rust threads
    outside the GIL. Special tokens of the tokenizer's post-processor (BOS, CLS...) are not
    added: a document is its text's tokens, then eos.

    Pickles as its ``tokenizer.json`` text, so Ray tasks and worker processes need no file.

    Examples:
        >>> offsets, ids = TextTokenizer.byte().encode_batch(["hi", ""])
        >>> offsets.tolist(), ids.tolist()
        ([0, 3, 4], [104, 105, 256, 256])

    """

    def __init__(self, identity: TokenizerIdentity, source: str, tokenizer_json: str | None = None) -> None:
        self.identity = identity
        """Kind, vocabulary size, eos id and file hash."""
        self.source = source
        """``"byte"`` or the location the ``tokenizer.json`` was read from."""
        self._json = tokenizer_json
        self._hf: Any = None

    @classmethod
    def byte(cls) -> TextTokenizer:
        """The built-in byte tokenizer: vocabulary 257, eos 256."""
        return cls(TokenizerIdentity("byte", 257, BYTE_EOS, None), "byte")

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike[str],
        eos: str | None = None,
        *,
        storage: StorageConfig | None = None,
    ) -> TextTokenizer:
        """A Hugging Face ``tokenizer.json`` (local path or ``s3://`` location) and its eos token.

        ``eos`` names the end of document token; omitted, the first of ``<|endoftext|>``,
        ``</s>``, ``<eos>``, ``<|end_of_text|>`` the vocabulary has. Raises ``ImportError`` naming
        the ``[tokenize]`` extra without the ``tokenizers`` package, and :class:`ConfigError`
        (``option`` ``tokenizer`` or ``eos``) for a file that is no tokenizer or an unknown eos.
        """
        uri = normalize(path)
        data = bytes((storage or StorageConfig()).core().read(uri))
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise _invalid("tokenizer", f"{uri} is not a tokenizer.json (not UTF-8: {err})") from None
        identity_hash = hashlib.sha256(data).hexdigest()
        hf = _load_tokenizers(text, uri)
        if eos is None:
            found = next((t for t in EOS_CANDIDATES if hf.token_to_id(t) is not None), None)
            if found is None:
                raise _invalid(
                    "eos",
                    f"{uri} has none of the usual end of document tokens ({', '.join(EOS_CANDIDATES)}); "
                    "name its eos token (--eos)",
                )
            eos = found
        eos_id = hf.token_to_id(eos)
        if eos_id is None:
            raise _invalid("eos", f"{eos!r} is not a token of {uri}")
        vocab_size = int(hf.get_vocab_size(with_added_tokens=True))
        if vocab_size > 2**31:
            raise _invalid("tokenizer", f"{uri} has {vocab_size} tokens, more than int32 ids can hold")
        tokenizer = cls(TokenizerIdentity("tokenizers", vocab_size, int(eos_id), identity_hash), uri, text)
        tokenizer._hf = hf
        return tokenizer

    def __getstate__(self) -> dict[str, Any]:
        return {"identity": self.identity, "source": self.source, "json": self._json}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["identity"], state["source"], state["json"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"TextTokenizer({self.source!r}, {self.identity})"

    def encode_batch(self, texts: Sequence[str]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
        """``(offsets, ids)``: document ``i`` is ``ids[offsets[i]:offsets[i + 1]]``, eos last."""
        if self.identity.kind == "byte":
            pieces: list[bytes] = [text.encode("utf-8") for text in texts]
            lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
            body: npt.NDArray[Any] = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        else:
            if self._hf is None:
                self._hf = _load_tokenizers(self._json or "", self.source)
            encode = getattr(self._hf, "encode_batch_fast", None) or self._hf.encode_batch
            encodings = encode(list(texts), add_special_tokens=False)
            lengths = np.fromiter(map(len, encodings), dtype=np.int64, count=len(encodings))
            body = np.fromiter(
                itertools.chain.from_iterable(e.ids for e in encodings),
                dtype=np.int32,
                count=int(lengths.sum()),
            )
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths + 1, out=offsets[1:])
        ids = np.empty(int(offsets[-1]), dtype=np.int32)
        ends = offsets[1:] - 1
        keep = np.ones(len(ids), dtype=bool)
        keep[ends] = False
        ids[keep] = body
        ids[ends] = self.identity.eos_id
        return offsets, ids


def _load_tokenizers(text: str, uri: str) -> Any:
    try:
        from tokenizers import Tokenizer  # type: ignore[import-untyped]
    except ImportError as err:
        raise ImportError(
            f"reading the tokenizer {uri} needs the `tokenizers` package: {_EXTRA_HINT}"
        ) from err
    try:
        return Tokenizer.from_str(text)
    except Exception as err:  # tokenizers raises a bare Exception for any malformed file
        raise _invalid("tokenizer", f"{uri} is not a Hugging Face tokenizer.json ({err})") from None


@dataclass(frozen=True)
class TokenizedDataset:
    """What :func:`tokenize_dataset` published."""

    manifest: DataManifest
    tokenizer: TokenizerIdentity
    documents: int
    """Documents (= input records = output records), all shards included."""
    tokens: int
    """Token ids written, one eos per document included."""


@dataclass(frozen=True)
class _InputJob:
    """One input shard to tokenise: the unit of work of a process or a Ray task."""

    saver: DatasetSaver
    tokenizer: TextTokenizer
    index: int
    digits: int
    path: str
    encoding: str
    text_field: str
    split: str
    tokens_per_shard: int
    batch_size: int
    storage: StorageConfig


@dataclass(frozen=True)
class _InputResult:
    shards: list[SavedShard]
    documents: int
    tokens: int


def _texts(job: _InputJob, skip: int) -> Iterator[list[str]]:
    """The input's text values in chunks, from record ``skip`` on; bad records raise naming them."""
    records = _core.ShardRecords(job.path, job.encoding, job.storage.core(), job.batch_size)
    row = 0
    field = job.text_field
    while (chunk := records.next_chunk(job.batch_size)) is not None:
        size = len(chunk) if isinstance(chunk, list) else chunk.num_rows
        if row + size <= skip:
            row += size
            continue
        texts: list[Any]  # checked to be str below
        if isinstance(chunk, list):
            texts = [record.get(field) for record in chunk]
        else:
            index = chunk.schema.get_field_index(field)
            if index < 0:
                raise _data_error(
                    f"{job.path}: no column '{field}' to tokenise (text_field); it has "
                    f"{', '.join(chunk.schema.names)}",
                    job.path,
                    row,
                    field,
                )
            column = chunk.column(index)
            kind = column.type
            if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
                raise _data_error(
                    f"{job.path}, field '{field}': a {kind} column, not text", job.path, row, field
                )
            texts = column.to_pylist()
        for k, text in enumerate(texts):
            if not isinstance(text, str):
                what = "missing" if text is None else f"a {type(text).__name__}, not text"
                raise _data_error(
                    f"{job.path}, record {row + k}, field '{field}': {what}", job.path, row + k, field
                )
        start = max(skip - row, 0)
        row += size
        yield texts[start:] if start else texts


def _documents(job: _InputJob, skip: int) -> Iterator[npt.NDArray[np.int32]]:
    """Each document's ids (views into its batch's buffer), in input order, from ``skip`` on."""
    # The engine's readers hand over valid UTF-8 only (a lone surrogate in JSON is a malformed
    # record, naming the shard and row), so every text encodes.
    for texts in _texts(job, skip):
        offsets, ids = job.tokenizer.encode_batch(texts)
        for k in range(len(texts)):
            yield ids[offsets[k] : offsets[k + 1]]


def _expected_metadata(job: _InputJob, first_row: int) -> dict[str, Any]:
    """What a part of ``job`` starting at ``first_row`` records, beside its ``tokens`` and ``last``."""
    return {
        "tokenizer": job.tokenizer.identity.to_metadata(),
        "source": job.path,
        "text_field": job.text_field,
        "first_row": first_row,
        "tokens_per_shard": job.tokens_per_shard,
    }


def _tokenize_input(job: _InputJob, progress: Callable[[int], None] | None = None) -> _InputResult:
    """Tokenises one input shard into parts ``<index>-<part>``; completed parts are recovered.

    Also the body of a Ray task. ``progress`` is told the tokens of each part as it completes.
    """
    shards: list[SavedShard] = []
    row = tokens = 0
    documents: Iterator[npt.NDArray[np.int32]] | None = None
    upcoming: npt.NDArray[np.int32] | None = None
    for part in itertools.count():
        if part >= 10**_PART_DIGITS:
            raise _invalid("tokens_per_shard", f"{job.path} needs over {10**_PART_DIGITS} shards; raise it")
        shard_id = f"{job.index:0{job.digits}d}-{part:0{_PART_DIGITS}d}"
        expected = _expected_metadata(job, row)
        done = None
        if documents is None:  # before the first part to write, every part may be complete
            try:
                done = job.saver.recover(job.split, None, shard_id=shard_id)
            except ObjectNotFoundError:
                done = None
        if done is not None:
            recorded = {k: v for k, v in done.metadata.items() if k not in ("tokens", "last")}
            if recorded != expected:
                changed = sorted(
                    k for k in expected.keys() | recorded.keys() if recorded.get(k) != expected.get(k)
                )
                # The option at fault: an option that differs, else the inputs (source, first_row).
                option = next((k for k in _OPTIONS if k in changed), "inputs")
                raise _invalid(
                    option,
                    f"{job.saver.manifest_uri}: its completed shard {done.location} was written by another "
                    f"job ({', '.join(f'{k}: {recorded.get(k)!r}' for k in changed)}; this job has "
                    f"{', '.join(f'{k}: {expected.get(k)!r}' for k in changed)}); tokenise into another "
                    "output, or repeat the job with the same inputs and options",
                )
            shards.append(done)
            row += done.rows
            tokens += int(done.metadata.get("tokens", 0))
            if progress is not None:
                progress(int(done.metadata.get("tokens", 0)))
            if done.metadata.get("last"):
                return _InputResult(shards, row, tokens)
            continue
        if documents is None:
            documents = _documents(job, row)
            upcoming = next(documents, None)
            if upcoming is None:
                if part == 0:
                    return _InputResult(shards, 0, 0)  # an empty input contributes no shard
                raise _data_error(
                    f"{job.path}: has {row} records, but its completed shards say more follow; the "
                    "input changed since they were written",
                    job.path,
                    row,
                )
        part_docs: list[npt.NDArray[np.int32]] = []
        count = 0
        while upcoming is not None and count < job.tokens_per_shard:
            part_docs.append(upcoming)
            count += len(upcoming)
            upcoming = next(documents, None)
        last = upcoming is None
        if job.saver.data_format == "parquet":
            records: list[dict[str, Any]] = [{TOKENS_FIELD: doc} for doc in part_docs]
        else:  # the engine's record writers take Python lists
            records = [{TOKENS_FIELD: doc.tolist()} for doc in part_docs]
        shard = job.saver.save(
            job.split,
            None,
            records,
            curriculum_metadata={**expected, "tokens": count, "last": last},
            shard_id=shard_id,
        )
        shards.append(shard)
        row += len(part_docs)
        tokens += count
        if progress is not None:
            progress(count)
        if last:
            return _InputResult(shards, row, tokens)
    raise AssertionError("unreachable")  # pragma: no cover


def _ray_task(job: _InputJob) -> _InputResult:
    """A Ray task's body: one input on the one CPU the task holds.

    A tokenizer.json's batch encoder would otherwise start a thread per core of the node in
    every task; its thread pool reads ``RAYON_NUM_THREADS`` when first used in the process.
    """
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    return _tokenize_input(job)


def _run_on_ray(
    jobs: list[_InputJob], ray_address: str, done: Callable[[_InputResult], None]
) -> list[_InputResult]:
    import ray

    connect(ray_address)
    remote = ray.remote(_ray_task).options(num_cpus=1)
    pending = {remote.remote(job): k for k, job in enumerate(jobs)}
    results: list[_InputResult | None] = [None] * len(jobs)
    waiting = list(pending)
    while waiting:
        finished, waiting = ray.wait(waiting, num_returns=1)
        for ref in finished:
            result: _InputResult = ray.get(ref)
            results[pending[ref]] = result
            done(result)
    return [r for r in results if r is not None]


def _tokenizer_of(
    tokenizer: str | os.PathLike[str] | TextTokenizer, eos: str | None, storage: StorageConfig
) -> TextTokenizer:
    if isinstance(tokenizer, TextTokenizer):
        if eos is not None:
            raise _invalid("eos", "give it to TextTokenizer.from_file, not beside a TextTokenizer")
        return tokenizer
    if str(tokenizer) == "byte":
        if eos is not None:
            raise _invalid("eos", f"the byte tokenizer's eos is always {BYTE_EOS}")
        return TextTokenizer.byte()
    return TextTokenizer.from_file(tokenizer, eos, storage=storage)


def _fits(match: re.Match[str] | None, inputs: int) -> bool:
    return match is not None and int(match.group(1)) < inputs


def _refuse_strays(saver: DatasetSaver, config: StorageConfig, ours: Callable[[str], bool]) -> None:
    """Refuses a completed shard under the output that is not ``ours``: it would join the manifest.

    Lists the completion descriptors; reads no data (``build_manifest`` would hash every shard).
    """
    root = parent(saver.manifest_uri)
    for uri in config.core().list(root):
        name = uri.removeprefix(root + "/")
        location = name.removesuffix(".done.json")
        if name.endswith(".done.json") and "/.tmp-" not in f"/{name}" and not ours(location):
            raise _invalid(
                "output",
                f"{saver.manifest_uri}: its directory holds {location}, which this job did not write; "
                "tokenise into an empty directory",
            )


def tokenize_dataset(
    inputs: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    tokenizer: str | os.PathLike[str] | TextTokenizer = "byte",
    eos: str | None = None,
    text_field: str = "text",
    split: str = "train",
    input_format: str | None = None,
    data_format: str = "parquet",
    tokens_per_shard: int = DEFAULT_TOKENS_PER_SHARD,
    batch_size: int = DEFAULT_BATCH,
    ray_address: str | None = None,
    storage: StorageConfig | None = None,
    progress: Callable[[int], None] | None = None,
) -> TokenizedDataset:
    """Tokenises the text field of every record of ``inputs`` into a token dataset at ``output``.

    ``inputs`` are shards (local paths or ``s3://`` locations) of records with a string field
    ``text_field``, in an encoding their suffix names (or ``input_format``); the engine reads
    them. ``tokenizer`` is ``"byte"`` (built in: UTF-8 bytes, eos 256), the path of a Hugging
    Face ``tokenizer.json`` (with ``eos`` naming its end of document token), or a
    :class:`TextTokenizer`. Each input record becomes one output record ``{"tokens": [...]}``
    (int32 ids, eos last), in input order, written by a :class:`DatasetSaver` as split
    ``split`` of the data manifest ``output`` (``data_format``: ``parquet``, ``msgpack`` or
    ``jsonl.gz``). Each input shard becomes shards ``<input>-<part>`` of at least
    ``tokens_per_shard`` tokens (the last one fewer); every shard's manifest metadata records
    the tokenizer (:class:`TokenizerIdentity`), its source shard and first row, and its tokens.

    Resumable: run the same job again after a crash and completed shards are recovered from
    their descriptors, not re-tokenised; the published dataset is the one an uninterrupted run
    publishes. A completed shard written with another tokenizer or options is refused
    (:class:`ConfigError`). With ``ray_address`` (an address, ``"auto"`` or ``"local"``), each
    input shard is tokenised in a Ray task of one CPU; this process publishes the manifest.
    ``progress(n)``, when given, is called as ``n`` more inputs are done (``o41 tokenize``
    draws its progress bar with it).

    Examples:
        >>> result = tokenize_dataset(["corpus.jsonl.gz"], "tokens/data-manifest-v1.json")  # doctest: +SKIP
        >>> result.tokens, result.tokenizer.eos_id  # doctest: +SKIP
        (1048576, 256)

    """
    paths = [normalize(p) for p in inputs]
    if not paths:
        raise _invalid("inputs", "no input shard to tokenise")
    if len(set(paths)) != len(paths):
        raise _invalid("inputs", f"{next(p for p in paths if paths.count(p) > 1)} is listed twice")
    if input_format is not None and input_format not in ENCODINGS:
        raise _invalid("input_format", f"'{input_format}' is not one of {', '.join(ENCODINGS)}")
    encodings = []
    for path in paths:
        encoding = input_format or encoding_of(path)
        if encoding is None:
            raise _invalid(
                "input_format", f"{path} has no known suffix ({', '.join(ENCODINGS)}); name the encoding"
            )
        encodings.append(encoding)
    for option, value in (("tokens_per_shard", tokens_per_shard), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _invalid(option, f"expected an integer of at least 1, got {value!r}")
    if not text_field:
        raise _invalid("text_field", "an empty field name")
    config = storage or StorageConfig.resolve()
    text_tokenizer = _tokenizer_of(tokenizer, eos, config)
    saver = DatasetSaver(output, data_format, storage=config)
    digits = max(5, len(str(len(paths) - 1)))
    jobs = [
        _InputJob(
            saver,
            text_tokenizer,
            k,
            digits,
            path,
            encoding,
            text_field,
            split,
            tokens_per_shard,
            batch_size,
            config,
        )
        for k, (path, encoding) in enumerate(zip(paths, encodings, strict=True))
    ]
    # Shards no input of this job could have written are refused before any work; the rest
    # are checked against their recorded metadata as they are recovered.
    names = re.compile(
        rf"{re.escape(split)}/_/shard-(\d{{{digits}}})-\d{{{_PART_DIGITS}}}{re.escape(SHARD_EXTENSIONS[data_format])}"
    )
    _refuse_strays(saver, config, lambda location: _fits(names.fullmatch(location), len(jobs)))

    def advance() -> None:
        if progress is not None:
            progress(1)

    if ray_address is None:
        results = []
        for job in jobs:
            results.append(_tokenize_input(job))
            advance()
    else:
        results = _run_on_ray(jobs, ray_address, lambda result: advance())
    ours = {shard.location for result in results for shard in result.shards}
    _refuse_strays(saver, config, lambda location: location in ours)
    manifest = saver.commit_manifest()
    return TokenizedDataset(
        manifest=manifest,
        tokenizer=text_tokenizer.identity,
        documents=sum(r.documents for r in results),
        tokens=sum(r.tokens for r in results),
    )
