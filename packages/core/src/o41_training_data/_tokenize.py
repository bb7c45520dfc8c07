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

import itertools
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from . import _core
from ._chat import ChatEncoder, ChatTemplate, LossOn
from ._config import ENCODINGS
from ._errors import DataError, ObjectNotFoundError
from ._errors import invalid as _invalid
from ._manifest import DataManifest
from ._manifest_build import encoding_of
from ._ray import connect
from ._saver import SHARD_EXTENSIONS, DatasetSaver, SavedShard
from ._storage import StorageConfig, normalize, parent
from ._tokenizer import BYTE_EOS, TextTokenizer, TokenizerIdentity, data_error

__all__ = ["TextTokenizer", "TokenizedDataset", "TokenizerIdentity", "tokenize_dataset"]

TOKENS_FIELD = "tokens"
"""The output records' one field: a document's token ids, int32, ending with the eos id."""
CHAT_FIELDS = ("input_ids", "loss_mask")
"""A rendered conversation's output fields: int32 ids and a uint8 mask, of equal length."""
DEFAULT_TOKENS_PER_SHARD = 1 << 26  # 256 MiB of int32 ids: a Parquet shard far below 5 GiB
DEFAULT_BATCH = 1024
_PART_DIGITS = 6
# Options a completed shard records, in the order a refused restart names them.
_OPTIONS = ("tokenizer", "chat", "text_field", "prompt_field", "keep_fields", "tokens_per_shard")


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
    text_fields: tuple[str, ...]
    split: str
    tokens_per_shard: int
    batch_size: int
    storage: StorageConfig
    chat: ChatEncoder | None = None
    tools_field: str | None = None
    prompt_field: str | None = None
    keep_fields: tuple[str, ...] = ()

    @property
    def text_field(self) -> str:
        """The first field read (errors about the record name it)."""
        return self.text_fields[0]

    @property
    def per_conversation(self) -> tuple[str, ...]:
        """The fields one rendered conversation gives."""
        if self.chat is None:
            return (TOKENS_FIELD,)
        return (*CHAT_FIELDS, "role_ids") if self.chat.role_ids else CHAT_FIELDS

    @property
    def fields(self) -> tuple[str, ...]:
        """The output records' fields, each conversation field's prefixed when there are several."""
        if len(self.text_fields) == 1:
            return (*self.per_conversation, *self.keep_fields)
        rendered = tuple(f"{field}_{out}" for field in self.text_fields for out in self.per_conversation)
        return (*rendered, *self.keep_fields)


@dataclass(frozen=True)
class _InputResult:
    shards: list[SavedShard]
    documents: int
    tokens: int


def _column(job: _InputJob, chunk: Any, field: str, row: int, option: str) -> list[Any]:
    """One field's values of a chunk (records or a record batch); a missing column raises.

    Text to tokenise must be strings; a kept field (``option`` ``keep_fields``) may be anything.
    """
    if isinstance(chunk, list):
        if option == "keep_fields":  # a missing field would be written as null: refused
            for k, record in enumerate(chunk):
                if field not in record:
                    raise data_error(
                        f"{job.path}, record {row + k}: no column '{field}' to keep ({option})",
                        job.path,
                        row + k,
                        field,
                    )
        return [record.get(field) for record in chunk]
    index = chunk.schema.get_field_index(field)
    if index < 0:
        raise data_error(
            f"{job.path}: no column '{field}' to tokenise ({option}); it has {', '.join(chunk.schema.names)}",
            job.path,
            row,
            field,
        )
    column = chunk.column(index)
    text = pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
    if job.chat is None and not text and option != "keep_fields":
        raise data_error(
            f"{job.path}, field '{field}': a {column.type} column, not text", job.path, row, field
        )
    values: list[Any] = column.to_pylist()
    return values


def _not_text(job: _InputJob, value: Any, row: int, field: str) -> DataError:
    what = "missing" if value is None else f"a {type(value).__name__}, not text"
    return data_error(f"{job.path}, record {row}, field '{field}': {what}", job.path, row, field)


def _check_conversation(job: _InputJob, value: Any, row: int, field: str, tools: bool = False) -> None:
    """Refuses a record's value that is not a list of messages (or of tool schemas, or None)."""
    if tools and value is None:
        return
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        kind = "missing" if value is None else f"a {type(value).__name__}"
        raise data_error(
            f"{job.path}, record {row}, field '{field}': {kind}, not a list of "
            + ("tool schemas" if tools else "messages ({role, content} objects)"),
            job.path,
            row,
            field,
        )
    if not tools:
        for k, message in enumerate(value):
            if not isinstance(message.get("role"), str):
                raise data_error(
                    f"{job.path}, record {row}, field '{field}', message {k}: no 'role' string",
                    job.path,
                    row,
                    field,
                )


def _texts(job: _InputJob, skip: int) -> Iterator[tuple[list[list[Any]], list[Any] | None, list[list[Any]]]]:
    """The input's values in chunks, from record ``skip`` on, one list per text field.

    A conversation is led by its record's prompt (``prompt_field``); each record's tools come
    beside (chat only), and the values of ``keep_fields``. Bad records raise naming them.
    """
    records = _core.ShardRecords(job.path, job.encoding, job.storage.core(), job.batch_size)
    row = 0
    while (chunk := records.next_chunk(job.batch_size)) is not None:
        size = len(chunk) if isinstance(chunk, list) else chunk.num_rows
        if row + size <= skip:
            row += size
            continue
        columns = [_column(job, chunk, field, row, "text_field") for field in job.text_fields]
        tools = None if job.tools_field is None else _column(job, chunk, job.tools_field, row, "tools_field")
        prompts = (
            None if job.prompt_field is None else _column(job, chunk, job.prompt_field, row, "prompt_field")
        )
        kept = [_column(job, chunk, field, row, "keep_fields") for field in job.keep_fields]
        for field, texts in zip(job.text_fields, columns, strict=True):
            for k, text in enumerate(texts):
                if job.chat is None:
                    if not isinstance(text, str):
                        raise _not_text(job, text, row + k, field)
                else:
                    _check_conversation(job, text, row + k, field)
        if tools is not None:
            for k, value in enumerate(tools):
                _check_conversation(job, value, row + k, str(job.tools_field), tools=True)
        if prompts is not None:
            for k, value in enumerate(prompts):
                _check_conversation(job, value, row + k, str(job.prompt_field))
            columns = [[p + c for p, c in zip(prompts, texts, strict=True)] for texts in columns]
        start = max(skip - row, 0)
        row += size
        if start:
            columns = [texts[start:] for texts in columns]
            tools = None if tools is None else tools[start:]
            kept = [values[start:] for values in kept]
        yield columns, tools, kept


def _documents(job: _InputJob, skip: int) -> Iterator[tuple[npt.NDArray[Any], ...]]:
    """Each document's arrays (one per output field), in input order, from ``skip`` on.

    Text: its ids (views into its batch's buffer), eos last. Chat: its rendered ids and loss mask
    (and role ids), per conversation field. Then the values of ``keep_fields``, as read.
    """
    # The engine's readers hand over valid UTF-8 only (a lone surrogate in JSON is a malformed
    # record, naming the shard and row), so every text encodes.
    row = skip
    for columns, tools, kept in _texts(job, skip):
        carried = list(zip(*kept, strict=True)) if kept else [() for _ in columns[0]]
        if job.chat is not None:
            pairs: list[list[npt.NDArray[Any]]] = [[] for _ in columns[0]]
            for field, texts in zip(job.text_fields, columns, strict=True):
                try:
                    encoded = job.chat.encode_batch(texts, tools)
                except DataError as err:
                    raise data_error(f"{job.path}, records from {row}: {err}", job.path, row, field) from None
                for arrays, chat in zip(pairs, encoded, strict=True):
                    arrays += (chat.input_ids, chat.loss_mask)
                    if chat.role_ids is not None:
                        arrays.append(chat.role_ids)
            yield from ((*arrays, *values) for arrays, values in zip(pairs, carried, strict=True))
        else:
            offsets, ids = job.tokenizer.encode_batch(columns[0])
            for k in range(len(columns[0])):
                yield (ids[offsets[k] : offsets[k + 1]], *carried[k])
        row += len(columns[0])


def _document_tokens(job: _InputJob, document: tuple[npt.NDArray[Any], ...]) -> int:
    """The ids a document holds: its tokens, or every conversation's ids (not their masks)."""
    arrays = document[: len(document) - len(job.keep_fields)]
    return sum(len(a) for a in arrays[0 :: len(job.per_conversation)])


def _expected_metadata(job: _InputJob, first_row: int) -> dict[str, Any]:
    """What a part of ``job`` starting at ``first_row`` records, beside its ``tokens`` and ``last``."""
    expected = {
        "tokenizer": job.tokenizer.identity.to_metadata(),
        "source": job.path,
        # One field as a name: shards written before several fields were read stay recoverable.
        "text_field": job.text_field if len(job.text_fields) == 1 else list(job.text_fields),
        "first_row": first_row,
        "tokens_per_shard": job.tokens_per_shard,
    }
    if job.prompt_field is not None:
        expected["prompt_field"] = job.prompt_field
    if job.keep_fields:
        expected["keep_fields"] = list(job.keep_fields)
    if job.chat is not None:
        expected["chat"] = job.chat.identity()
    return expected


def _tokenize_input(job: _InputJob, progress: Callable[[int], None] | None = None) -> _InputResult:
    """Tokenises one input shard into parts ``<index>-<part>``; completed parts are recovered.

    Also the body of a Ray task. ``progress`` is told the tokens of each part as it completes.
    """
    shards: list[SavedShard] = []
    row = tokens = 0
    documents: Iterator[tuple[npt.NDArray[Any], ...]] | None = None
    upcoming: tuple[npt.NDArray[Any], ...] | None = None
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
                raise data_error(
                    f"{job.path}: has {row} records, but its completed shards say more follow; the "
                    "input changed since they were written",
                    job.path,
                    row,
                )
        part_docs: list[tuple[npt.NDArray[Any], ...]] = []
        count = 0
        while upcoming is not None and count < job.tokens_per_shard:
            part_docs.append(upcoming)
            count += _document_tokens(job, upcoming)
            upcoming = next(documents, None)
        last = upcoming is None
        fields = job.fields
        if job.saver.data_format == "parquet":
            records: list[dict[str, Any]] = [dict(zip(fields, doc, strict=True)) for doc in part_docs]
        else:  # the engine's record writers take Python lists
            records = [
                {f: a.tolist() if isinstance(a, np.ndarray) else a for f, a in zip(fields, doc, strict=True)}
                for doc in part_docs
            ]
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
    text_field: str | Sequence[str] | None = None,
    split: str = "train",
    input_format: str | None = None,
    data_format: str = "parquet",
    tokens_per_shard: int = DEFAULT_TOKENS_PER_SHARD,
    batch_size: int = DEFAULT_BATCH,
    ray_address: str | None = None,
    storage: StorageConfig | None = None,
    progress: Callable[[int], None] | None = None,
    chat_template: str | os.PathLike[str] | ChatTemplate | None = None,
    chat_template_name: str | None = None,
    loss_on: LossOn = "all",
    chat_options: Mapping[str, Any] | None = None,
    tools_field: str | None = None,
    prompt_field: str | None = None,
    role_ids: bool = False,
    keep_fields: Sequence[str] = (),
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

    **Conversations.** With ``chat_template`` (a ``tokenizer_config.json``, whose named template
    ``chat_template_name`` it may pick, or a :class:`ChatTemplate`), ``text_field`` (default
    ``messages``) holds a conversation, a list of ``{"role", "content", ...}`` messages, and
    ``tools_field`` optionally the tool schemas. Each is rendered as ``transformers``'
    ``apply_chat_template`` renders it, with ``chat_options`` as the template's switches
    (``{"enable_thinking": False}``), and becomes a record ``{"input_ids": [...], "loss_mask":
    [...]}``: int32 ids with no eos added (the template writes its own end tokens) and a uint8
    mask of 1 on the tokens the assistant wrote, in every assistant turn (``loss_on="all"``) or
    the last (``"last"``). ``tokens_per_shard`` counts ids. See ``docs/post_training.md``.

    **Preference pairs.** ``text_field`` may name several conversation fields (TRL's
    ``("chosen", "rejected")``): each is rendered, and the record holds ``<field>_input_ids`` and
    ``<field>_loss_mask`` for each, which a stacked :class:`ProjectedField` delivers as
    ``[B, 2, S]``. ``prompt_field`` names a field of messages that leads every conversation
    field (TRL's explicit prompt layout, whose completions hold the assistant's turns only).
    ``role_ids=True`` adds ``role_ids`` (uint8, :data:`ROLE_IDS`: who wrote each token) beside
    each ``loss_mask``.

    ``keep_fields`` are input fields copied into each output record as they are (an RL prompt's
    reference answer, delivered by a ``dtype="u8"`` field), text or conversations alike.

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
    if text_field is None:
        text_field = "text" if chat_template is None else "messages"
    text_fields = (text_field,) if isinstance(text_field, str) else tuple(text_field)
    if not text_fields or not all(isinstance(f, str) and f for f in text_fields):
        raise _invalid("text_field", f"expected field names, got {text_field!r}")
    if len(set(text_fields)) != len(text_fields):
        raise _invalid("text_field", f"a field is named twice in {list(text_fields)}")
    if len(text_fields) > 1 and chat_template is None:
        raise _invalid(
            "text_field", "several fields are conversations (preference pairs); give chat_template too"
        )
    for option, named in (("tools_field", tools_field), ("prompt_field", prompt_field)):
        if named is not None and chat_template is None:
            raise _invalid(option, f"{option} is for conversations; give chat_template too")
    if prompt_field is not None and prompt_field in text_fields:
        raise _invalid("prompt_field", f"'{prompt_field}' is also a text_field")
    kept = (keep_fields,) if isinstance(keep_fields, str) else tuple(keep_fields)
    if not all(isinstance(f, str) and f for f in kept) or len(set(kept)) != len(kept):
        raise _invalid("keep_fields", f"expected distinct field names, got {keep_fields!r}")
    config = storage or StorageConfig.resolve()
    text_tokenizer = _tokenizer_of(tokenizer, eos, config)
    chat = None
    if chat_template is not None:
        if not isinstance(chat_template, ChatTemplate):
            chat_template = ChatTemplate.from_tokenizer_config(
                chat_template, chat_template_name, storage=config
            )
        chat = ChatEncoder(
            text_tokenizer, chat_template, loss_on=loss_on, role_ids=role_ids, **dict(chat_options or {})
        )
    elif chat_template_name is not None or chat_options is not None or role_ids:
        raise _invalid("chat_template", "chat_template_name, chat_options and role_ids need chat_template")
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
            text_fields,
            split,
            tokens_per_shard,
            batch_size,
            config,
            chat,
            tools_field,
            prompt_field,
            kept,
        )
        for k, (path, encoding) in enumerate(zip(paths, encodings, strict=True))
    ]
    clash = set(kept) & set(jobs[0].fields[: len(jobs[0].fields) - len(kept)]) if jobs else set()
    if clash:
        raise _invalid("keep_fields", f"{sorted(clash)} would overwrite the fields the job writes")
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
