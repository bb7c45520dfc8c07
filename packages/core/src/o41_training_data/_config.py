"""Stream configuration: projected fields, sources, stages and the stream config itself.

These are plain frozen dataclasses. They are checked lightly here (types that Python can
catch early) and fully by the engine at open; both raise :class:`ConfigError` naming the
option at fault.
"""

from __future__ import annotations

import json
import math
import operator
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, Literal, TypeVar

from . import _core
from ._errors import ConfigError
from ._errors import invalid as _invalid
from ._files import as_path, check_depth, read_text
from ._limits import LIMITS
from ._storage import normalize

__all__ = [
    "DTYPES",
    "ENCODINGS",
    "BatchStreamConfig",
    "DType",
    "Encoding",
    "FileSource",
    "ManifestSource",
    "Packing",
    "ProjectedField",
    "Ramp",
    "Shuffle",
    "Stage",
    "TokenWindows",
]

DType = Literal["i32", "i64", "f32", "f64", "bool", "u8"]
"""Element type of a projected column; ``bool`` is delivered as ``uint8`` 0/1; ``u8`` is a row of
a string's (or binary value's) UTF-8 bytes, for text the trainer needs in the batch."""

Encoding = Literal[
    "parquet",
    "jsonl",
    "jsonl.gz",
    "msgpack",
    "bin",
    "megatron",
    "npy",
    "arrow",
    "mds",
    "array_record:json",
    "array_record:msgpack",
    "array_record:uint8",
    "array_record:int8",
    "array_record:uint16",
    "array_record:int16",
    "array_record:uint32",
    "array_record:int32",
    "array_record:uint64",
    "array_record:int64",
]
"""Shard encoding; framed MessagePack and ``.bin`` token streams are specified in
``docs/formats.md``, corpora read in place (``megatron``, ``npy``, ``arrow``, ``mds``,
``array_record:<payload>``) in ``docs/corpora.md``. An ArrayRecord file does not say what its
records hold, so its encoding names the payload: a JSON object, a MessagePack map, or the
little-endian token ids of one document (``array_record:uint16``), read as the field ``tokens``.
``bin`` and ``npy`` shards are read only by stages with ``packing`` or ``windows``."""

DTYPES: tuple[str, ...] = ("i32", "i64", "f32", "f64", "bool", "u8")
ENCODINGS: tuple[str, ...] = ("parquet", "jsonl", "jsonl.gz", "msgpack")
"""The encodings the dataset saver writes and ``o41 tokenize`` reads."""
ARRAY_RECORD_ENCODINGS: tuple[str, ...] = tuple(e for e in _core.encodings() if e.startswith("array_record:"))
"""ArrayRecord files, one encoding per payload their records hold (the engine's list)."""
IN_PLACE_ENCODINGS: tuple[str, ...] = tuple(e for e in _core.encodings() if e not in (*ENCODINGS, "bin"))
"""Corpora other tools wrote, read in place (``docs/corpora.md``) and listed in manifests: every
encoding of the engine but the saver's own and ``.bin`` token streams."""
_SOURCE_ENCODINGS: tuple[str, ...] = tuple(_core.encodings())
"""Every encoding a source may name: the engine's list (``Encoding`` above types it)."""

_U64 = 2**64


def _integer(option: str, value: object, *, minimum: int, maximum: int = _U64 - 1) -> None:
    """Refuses anything but an int in ``[minimum, maximum]`` (bools are not integers here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(option, f"expected an integer, got {value!r}")
    if not minimum <= value <= maximum:
        raise _invalid(option, f"must be between {minimum} and {maximum}, got {value}")


def _sequence(option: str, value: object) -> Sequence[Any]:
    """``value`` when it is a list or tuple-like sequence (not a string), else a ConfigError."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, tuple, list)):
        if isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping)):
            return list(value)
        raise _invalid(option, f"expected a list, got {type(value).__name__}")
    return value


def _as_int(value: object) -> object:
    """``value`` as an int when it is integer-like (``operator.index``), else unchanged."""
    if isinstance(value, bool):
        return value
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return value


def _weight(option: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _invalid(option, f"expected a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise _invalid(option, f"must be a positive finite number, got {value!r}")


def _plain_number(value: object) -> object:
    """A NumPy (or other) subclass of int or float as the plain number, so documents are JSON."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value


class _Columns(Mapping[str, str]):
    """A source's column mapping as a config holds it: read-only, sorted by name, hashable.

    Equal to any mapping of the same pairs (a plain ``dict`` included).
    """

    __slots__ = ("_pairs",)

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        self._pairs = dict(sorted(pairs))

    def __getitem__(self, key: str) -> str:
        return self._pairs[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._pairs)

    def __len__(self) -> int:
        return len(self._pairs)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return self._pairs == dict(other.items())

    def __hash__(self) -> int:
        return hash(tuple(self._pairs.items()))

    def __repr__(self) -> str:
        return repr(self._pairs)

    def __reduce__(self) -> tuple[type[_Columns], tuple[tuple[tuple[str, str], ...]]]:
        return _Columns, (tuple(self._pairs.items()),)


def _columns(option: str, value: object) -> _Columns | None:
    """A source's ``columns`` checked and frozen; None for no mapping (an empty one too).

    Names and columns are non-empty strings; neither may be a reserved ``@`` name, which is no
    record's column.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _invalid(option, f"expected a mapping of field names to column names, got {_kind(value)}")
    for name, column in value.items():
        at = f"{option}[{name!r}]"
        for what, text in (("name", name), ("column", column)):
            if not isinstance(text, str) or not text:
                raise _invalid(at, f"expected a non-empty string as the {what}, got {text!r}")
            if text.startswith("@"):
                raise _invalid(at, f"{text!r} is a reserved column (@...), not one a shard holds")
            if "\0" in text:
                raise _invalid(at, f"{text!r} holds a NUL character; a column name cannot")
    return _Columns(value.items()) if value else None


def _check_field(option: str, field: ProjectedField) -> None:
    if not isinstance(field, ProjectedField):
        raise _invalid(option, f"expected a ProjectedField, got {type(field).__name__}")
    if not isinstance(field.name, str) or not field.name:
        raise _invalid(f"{option}.name", f"expected a non-empty string, got {field.name!r}")
    parts = (field.source,) if isinstance(field.source, str) else field.source
    if not isinstance(field.source, str) and not parts:
        raise _invalid(f"{option}.source", "a stack names at least one record field")
    for k, part in enumerate(parts):
        if not isinstance(part, str) or not part:
            at = f"{option}.source" if isinstance(field.source, str) else f"{option}.source[{k}]"
            raise _invalid(at, f"expected a non-empty string, got {part!r}")
    if "\0" in field.name:
        # Arrow's C data interface, which hands batches to Python, cannot carry it.
        raise _invalid(f"{option}.name", f"{field.name!r} holds a NUL character; a column name cannot")
    for size in field.shape or ():
        _integer(f"{option}.shape", size, minimum=1)
    pad = field.pad
    if not isinstance(pad, (bool, int, float)):
        raise _invalid(f"{option}.pad", f"expected a number or a bool, got {pad!r}")
    if isinstance(pad, float) and not math.isfinite(pad):
        raise _invalid(f"{option}.pad", f"must be finite, got {pad!r}")


def _check_source(option: str, source: FileSource | ManifestSource) -> None:
    if isinstance(source, FileSource):
        if not source.files:
            raise _invalid(f"{option}.files", "at least one file is required")
        if source.encoding is not None and source.encoding not in _SOURCE_ENCODINGS:
            raise _invalid(
                f"{option}.encoding",
                f"unknown encoding {source.encoding!r}; expected one of {', '.join(_SOURCE_ENCODINGS)}",
            )
    elif not isinstance(source, ManifestSource):
        raise _invalid(option, f"expected a FileSource or a ManifestSource, got {type(source).__name__}")
    _weight(f"{option}.weight", source.weight)


def _check_stage(option: str, stage: Stage) -> None:
    if not isinstance(stage, Stage):
        raise _invalid(option, f"expected a Stage, got {type(stage).__name__}")
    _integer(f"{option}.batch_size", stage.batch_size, minimum=1)
    if not isinstance(stage.infinite, bool):
        raise _invalid(f"{option}.infinite", f"expected a bool, got {stage.infinite!r}")
    if stage.shuffle is not None:
        if not isinstance(stage.shuffle, Shuffle):
            raise _invalid(f"{option}.shuffle", f"expected a Shuffle, got {type(stage.shuffle).__name__}")
        _integer(f"{option}.shuffle.buffer_rows", stage.shuffle.buffer_rows, minimum=1)
        if stage.shuffle.unit_rows is not None:
            _integer(f"{option}.shuffle.unit_rows", stage.shuffle.unit_rows, minimum=1)
        if stage.shuffle.block_rows is not None:
            _integer(f"{option}.shuffle.block_rows", stage.shuffle.block_rows, minimum=1)
    if stage.ramp is not None:
        if not isinstance(stage.ramp, Ramp):
            raise _invalid(f"{option}.ramp", f"expected a Ramp, got {type(stage.ramp).__name__}")
        for name in ("start", "increment", "rows"):
            _integer(f"{option}.ramp.{name}", getattr(stage.ramp, name), minimum=1)
    if not stage.sources:
        raise _invalid(f"{option}.sources", "at least one source is required")
    for j, source in enumerate(stage.sources):
        _check_source(f"{option}.sources[{j}]", source)
    _check_tokens(option, stage)


def _check_tokens(option: str, stage: Stage) -> None:
    # Types and ranges only: rules between options (packing with windows, ramps, validation
    # passes, partitions) are the engine's alone, refused at open with the option's path.
    if stage.packing is not None:
        packing = stage.packing
        if not isinstance(packing, Packing):
            raise _invalid(f"{option}.packing", f"expected a Packing, got {type(packing).__name__}")
        _check_token_field(f"{option}.packing.field", packing.field)
        _integer(f"{option}.packing.seq_len", packing.seq_len, minimum=1, maximum=_MAX_SEQ_LEN)
        _integer(f"{option}.packing.bins", packing.bins, minimum=1, maximum=_MAX_BINS)
        if packing.eos_id is not None:
            _integer(f"{option}.packing.eos_id", packing.eos_id, minimum=0)
        if packing.overflow not in ("split", "drop", "error"):
            raise _invalid(
                f"{option}.packing.overflow",
                f"unknown value {packing.overflow!r}; expected one of 'split', 'drop', 'error'",
            )
    if stage.windows is not None:
        windows = stage.windows
        if not isinstance(windows, TokenWindows):
            raise _invalid(f"{option}.windows", f"expected a TokenWindows, got {type(windows).__name__}")
        _check_token_field(f"{option}.windows.field", windows.field)
        _integer(f"{option}.windows.seq_len", windows.seq_len, minimum=1, maximum=_MAX_SEQ_LEN)
        if windows.eos_id is not None:
            _integer(f"{option}.windows.eos_id", windows.eos_id, minimum=0)


def _check_token_field(option: str, field: object) -> None:
    if not isinstance(field, str) or not field or field.startswith("@"):
        raise _invalid(option, f"expected the name of a record field, got {field!r}")


_MAX_SEQ_LEN = LIMITS["max_seq_len"]
_MAX_BINS = LIMITS["max_bins"]


@dataclass(frozen=True)
class ProjectedField:
    """One fixed-shape column read from a record field.

    Give ``length`` for a 1-D column, ``shape`` for a nested one, or neither for a scalar
    (``length`` then reads the size of a 1-D shape however it was given, and None otherwise).
    Every axis truncates longer lists and pads shorter ones with ``pad``. For the first axis,
    ``overflow="error"`` makes a longer list a :class:`ProjectionError` naming the shard, row
    and field instead (a truncated completion would train on another answer);
    ``overflow="drop"`` leaves such a row out of the stream (open finds every one, so the order
    is planned without them: the same on every rank and after every resume, counted in the
    stats' ``dropped_rows``); ``pad_side="left"`` puts the pad before the values, so that the
    last value ends the row (prompts for generation).

    A ``source`` that lists several record fields stacks them on a new leading axis, whose
    length the shape starts with: ``source=("chosen_ids", "rejected_ids"), shape=(2, 512)``
    delivers a preference pair as ``[B, 2, 512]``. ``overflow`` and ``pad_side`` then apply to
    each entry's first axis, and a row is dropped when any entry is too long.

    Examples:
        >>> ProjectedField(name="tokens", source="input_ids", dtype="i32", length=2048, pad=0).shape
        (2048,)
        >>> ProjectedField(name="ids", source=("chosen", "rejected"), dtype="i32", shape=(2, 8)).source
        ('chosen', 'rejected')

    """

    name: str
    source: str | tuple[str, ...]
    dtype: DType
    length: int | None = None
    shape: tuple[int, ...] | None = None
    pad: int | float | bool = 0
    overflow: Literal["truncate", "error", "drop"] = "truncate"
    pad_side: Literal["right", "left"] = "right"

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) and isinstance(self.source, Iterable):
            object.__setattr__(self, "source", tuple(self.source))
        for option, allowed in (("overflow", ("truncate", "error", "drop")), ("pad_side", ("right", "left"))):
            if getattr(self, option) not in allowed:
                raise ConfigError(
                    f"invalid field '{self.name}'.{option}: {getattr(self, option)!r}; expected one of "
                    f"{', '.join(map(repr, allowed))}"
                )
        if self.dtype not in DTYPES:
            raise ConfigError(
                f"invalid field '{self.name}'.dtype: unknown dtype {self.dtype!r}; "
                f"expected one of {', '.join(DTYPES)}"
            )
        # Sizes are checked with the field's path by BatchStreamConfig; integer-like values
        # (NumPy integers) become ints here.
        if self.shape is not None:
            shape = tuple(_as_int(d) for d in _sequence(f"field '{self.name}'.shape", self.shape))
            # Both only as a field's own values come back (dataclasses.replace passes both).
            if self.length is not None and shape != (_as_int(self.length),):
                raise ConfigError(f"invalid field '{self.name}': give length or shape, not both")
            object.__setattr__(self, "shape", shape)
        elif self.length is not None:
            object.__setattr__(self, "shape", (_as_int(self.length),))
        else:
            object.__setattr__(self, "shape", ())
        # ``length`` is the 1-D shape's size however it was given, so a field given ``length=8``
        # equals one given ``shape=(8,)`` (to_dict writes the shape) and from_dict round-trips.
        shape = self.shape or ()
        object.__setattr__(self, "length", shape[0] if len(shape) == 1 else None)
        object.__setattr__(self, "pad", _plain_number(self.pad))

    def to_dict(self) -> dict[str, Any]:
        """The field as the engine's JSON document expects it."""
        out: dict[str, Any] = {
            "name": self.name,
            "source": self.source if isinstance(self.source, str) else list(self.source),
            "dtype": self.dtype,
            "shape": list(self.shape or ()),
            "pad": self.pad,
        }
        # Only when set: the resolved document (and its fingerprint) of a field without them is
        # what it was before they existed.
        if self.overflow != "truncate":
            out["overflow"] = self.overflow
        if self.pad_side != "right":
            out["pad_side"] = self.pad_side
        return out


@dataclass(frozen=True)
class FileSource:
    """A plain list of shard files, read in the listed order.

    ``encoding`` may be omitted when every file name ends in ``.parquet``, ``.jsonl``,
    ``.jsonl.gz`` (or ``.json.gz``, as Dolma names it), ``.msgpack`` or an in-place format's
    suffix (``docs/corpora.md``). ``weight`` is the source's relative share of its stage.

    ``columns`` maps a name the fields read (a :class:`ProjectedField`'s ``source``,
    :class:`Packing`'s or :class:`TokenWindows`' ``field``) to the column this source's shards
    hold it under, so corpora that name one thing differently mix in one stage: with
    ``columns={"input_ids": "tokens"}``, where the fields read ``input_ids`` this source's
    ``tokens`` column is read. A name not mapped is read as it is. The mapping is kept sorted
    and read-only; reserved ``@`` names cannot be mapped.

    Paths are kept as written. A relative local path is resolved against the working
    directory when the stream opens, or, in a config file, against the file's directory
    (:meth:`BatchStreamConfig.from_file`).

    Examples:
        >>> FileSource(files=["part-000.parquet"], weight=3.0).encoding is None
        True
        >>> FileSource(files=["corpus.idx"], columns={"input_ids": "tokens"}).columns
        {'input_ids': 'tokens'}

    """

    files: Sequence[str]
    encoding: Encoding | None = None
    weight: float = 1.0
    columns: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.files, (str, os.PathLike)):
            raise ConfigError("invalid FileSource.files: expected a list of paths, got one path")
        files = _sequence("FileSource.files", self.files)
        for i, item in enumerate(files):
            if not isinstance(item, (str, os.PathLike)) or not isinstance(os.fspath(item), str):
                raise _invalid(f"FileSource.files[{i}]", f"expected a path, got {type(item).__name__}")
        object.__setattr__(self, "files", tuple(os.fspath(f) for f in files))
        object.__setattr__(self, "weight", _plain_number(self.weight))
        object.__setattr__(self, "columns", _columns("FileSource.columns", self.columns))

    def to_dict(self) -> dict[str, Any]:
        """The source as the engine's JSON document expects it."""
        out: dict[str, Any] = {
            "kind": "files",
            "files": list(self.files),
            "encoding": self.encoding,
            "weight": self.weight,
        }
        # Only when set: the document (and fingerprint) of an unmapped source is unchanged.
        if self.columns:
            out["columns"] = dict(self.columns)
        return out


@dataclass(frozen=True)
class ManifestSource:
    """A selection of a data manifest's split (``docs/manifest.md``).

    ``curriculum_stages`` reads the union of those curriculum selections (or, where no selection
    has the name, the shards saved under that curriculum stage) in the listed order; omitted, the
    split's root order. The resolved config pins the selected shards and their row counts, so a
    manifest republished later does not change what a resumed stream reads. ``columns`` maps the
    names the fields read to the columns of this source's shards, as for :class:`FileSource`.

    Examples:
        >>> ManifestSource(manifest_uri="data/data-manifest-v1.json", split="train").weight
        1.0
        >>> ManifestSource(manifest_uri="m.json", split="train", columns={"text": "content"}).columns
        {'text': 'content'}

    """

    manifest_uri: str
    split: str
    curriculum_stages: Sequence[str] | None = None
    weight: float = 1.0
    columns: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.curriculum_stages, str):
            raise ConfigError(
                "invalid ManifestSource.curriculum_stages: expected a list of names, got one string"
            )
        if not isinstance(self.manifest_uri, (str, os.PathLike)) or not isinstance(
            os.fspath(self.manifest_uri), str
        ):
            raise _invalid(
                "ManifestSource.manifest_uri", f"expected a path, got {type(self.manifest_uri).__name__}"
            )
        object.__setattr__(self, "manifest_uri", os.fspath(self.manifest_uri))
        object.__setattr__(self, "weight", _plain_number(self.weight))
        object.__setattr__(self, "columns", _columns("ManifestSource.columns", self.columns))
        if not isinstance(self.split, str):
            raise _invalid("ManifestSource.split", f"expected a string, got {type(self.split).__name__}")
        if self.curriculum_stages is not None:
            stages = _sequence("ManifestSource.curriculum_stages", self.curriculum_stages)
            for i, name in enumerate(stages):
                if not isinstance(name, str):
                    kind = type(name).__name__
                    raise _invalid(f"ManifestSource.curriculum_stages[{i}]", f"expected a string, got {kind}")
            object.__setattr__(self, "curriculum_stages", tuple(stages))

    def to_dict(self) -> dict[str, Any]:
        """The source as the engine's JSON document expects it."""
        out: dict[str, Any] = {
            "kind": "manifest",
            "manifest_uri": self.manifest_uri,
            "split": self.split,
            "curriculum_stages": list(self.curriculum_stages) if self.curriculum_stages is not None else None,
            "weight": self.weight,
        }
        if self.columns:  # only when set, as for FileSource
            out["columns"] = dict(self.columns)
        return out


@dataclass(frozen=True)
class Shuffle:
    """Row shuffling within a window of ``buffer_rows`` rows (rounded up to whole units).

    Each window of the stage's mixed rows is permuted by a seeded bijection, in units of
    ``unit_rows`` consecutive rows (default 8, or 1 with ``partitions`` above 1, where a window
    belongs to one rank whatever the unit): larger units mean fewer, longer reads, which keeps
    each rank's read cost flat as ``world_size`` grows; ``unit_rows=1`` shuffles single rows.
    Shard order is also permuted per epoch. See ``docs/order.md``.

    ``block_rows`` cuts each shard into blocks of that many rows from its start and permutes the
    blocks of the whole source every epoch instead of its shards (each shard's shorter last run
    follows them): a window then gathers blocks from all over the corpus, each still read in
    one piece. Set it to the rows of a row group (or of a page, with a page index) so that, with
    partitions, no read unit is split between ranks (docs/order.md, "Blocks").

    Examples:
        >>> Shuffle(buffer_rows=4096).unit_rows is None
        True

    """

    buffer_rows: int
    unit_rows: int | None = None
    block_rows: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The shuffle as the engine's JSON document expects it (``block_rows`` when set)."""
        out: dict[str, Any] = {"buffer_rows": self.buffer_rows, "unit_rows": self.unit_rows}
        if self.block_rows is not None:
            out["block_rows"] = self.block_rows
        return out


@dataclass(frozen=True)
class Ramp:
    """A batch ramp: the global batch grows from ``start`` rows to the stage's ``batch_size``.

    With ``k = (batch_size - start) / increment`` steps (a whole number, checked at open), step
    ``i`` reads global batches of ``start + i * increment`` rows for ``ceil(rows / (k * size))``
    batches, about ``rows / k`` rows, and the stage reads full batches after that. The step a
    batch is in follows from its position, so a resumed stream continues the ramp with
    nothing else saved.

    Every rank receives an equal share of each global batch of a ramped stage (its
    ``size / world_size`` rows), so all ranks step together through the ramp: ``start``,
    every step and ``batch_size`` must divide by ``world_size`` (checked at open and by
    ``Checkpoint.for_world``). See ``docs/order.md#batch-ramps``.

    Examples:
        >>> stage = Stage(
        ...     sources=[FileSource(files=["a.parquet"])],
        ...     batch_size=256,
        ...     ramp=Ramp(start=64, increment=64, rows=1_000_000),
        ... )
        >>> stage.ramp.start
        64

    """

    start: int
    increment: int
    rows: int

    def to_dict(self) -> dict[str, Any]:
        """The ramp as the engine's JSON document expects it."""
        return {"start": self.start, "increment": self.increment, "rows": self.rows}


@dataclass(frozen=True)
class Packing:
    """Whole documents of a token corpus packed into windows of ``seq_len`` tokens.

    Documents are the records of a Parquet column of token lists (``field``), or the spans of a
    token stream that end at ``eos_id`` (the eos token included): a ``.bin`` shard always, and a
    Parquet column when ``eos_id`` is given. Each document goes into the first of ``bins`` open
    windows with room for it. ``overflow`` says what a document longer than a window does:
    ``"split"`` (the default) cuts it into full windows and a tail; ``"drop"`` leaves it out of
    the stream, so no window starts a conversation in its middle (the shard's plan finds every
    such document, so every rank and every resume agrees; the stats' ``dropped_rows`` count
    them); ``"error"`` fails with a :class:`ProjectionError` naming the shard and document.
    Every row is then one window, and three projected fields describe it, each an ``i32`` or
    ``i64`` of length ``seq_len``: the tokens (``source=field``), ``source="@segment_ids"``
    (which document of the window each token is from: 1, 2, ..., and the pad for padding) and
    ``source="@positions"`` (each token's position within its document). Per row instead of
    per token, ``source="@segment_lengths"`` (``i32`` or ``i64`` of any length ``k``) holds the
    window's segment lengths in order, then the pad: what variable-length attention takes
    (FlashAttention's ``cu_seqlens`` are their running sums), at a fraction of the bytes of a
    per-token column. Open refuses a ``k`` smaller than the most segments a window holds.
    Any other projected record field of a Parquet shard is aligned with the tokens: a list as
    long as each record's token list (a loss mask, role ids), an ``i32``, ``i64`` or ``bool``
    of length ``seq_len``, cut and padded exactly where the tokens are. ``source="@labels"``
    (``i32`` or ``i64`` of length ``seq_len``, ``pad=-100``) holds next-token targets: each
    token's successor in its document, and the pad, the ignore index, where it has none in the
    window (a document's end, padding); ``source="@labels:<mask>"`` also ignores a target the
    aligned field named ``<mask>`` marks 0 (``labels[t]`` is ``tokens[t + 1]`` when
    ``mask[t + 1]`` is 1: the mask marks the tokens trained on, aligned with the tokens). See
    ``docs/post_training.md``.

    The windows are planned per shard from its documents alone, so they are the same on every
    rank count and after every resume; ``Shuffle`` then orders windows like any rows. See
    ``docs/order.md`` ("Token corpora").

    Examples:
        >>> Packing(field="tokens", seq_len=2048).bins
        8

    """

    field: str
    seq_len: int
    bins: int = 8
    eos_id: int | None = None
    overflow: Literal["split", "drop", "error"] = "split"

    def __post_init__(self) -> None:
        for name in ("seq_len", "bins", "eos_id"):
            object.__setattr__(self, name, _as_int(getattr(self, name)))

    def to_dict(self) -> dict[str, Any]:
        """The packing as the engine's JSON document expects it."""
        out: dict[str, Any] = {"field": self.field, "seq_len": self.seq_len, "bins": self.bins}
        if self.eos_id is not None:
            out["eos_id"] = self.eos_id
        # Only when set: a packing without it keeps its resolved document and fingerprint.
        if self.overflow != "split":
            out["overflow"] = self.overflow
        return out


@dataclass(frozen=True)
class TokenWindows:
    """A token corpus read as windows of ``seq_len + 1`` tokens, one every ``seq_len`` tokens.

    Each shard's stream (a ``.bin`` file, or a Parquet column of token lists read as one
    stream) is cut so that the last token of a window is the first of the next: every
    transition is in exactly one window, and a shard's last window is padded. The token field
    (``source=field``) is an ``i32`` or ``i64`` of length ``seq_len + 1``; ``@segment_ids``,
    ``@positions`` and ``@segment_lengths`` (see :class:`Packing`) may be projected too, and
    follow the documents a window holds: its segments are those documents, in order, and
    positions count from each document's first token (the document a window starts in
    continues from the window before). With ``eos_id``, documents are the spans of the stream
    that end at it, as for :class:`Packing`, and open scans each shard for it (a ``.bin`` shard
    is read once, a Parquet column's ids decoded once). Without it a Parquet record is a
    document, and a ``.bin`` window is one segment with positions counted from the shard's
    first token.

    Examples:
        >>> TokenWindows(field="tokens", seq_len=2048).seq_len
        2048

    """

    field: str
    seq_len: int
    eos_id: int | None = None

    def __post_init__(self) -> None:
        for name in ("seq_len", "eos_id"):
            object.__setattr__(self, name, _as_int(getattr(self, name)))

    def to_dict(self) -> dict[str, Any]:
        """The windows as the engine's JSON document expects them."""
        out: dict[str, Any] = {"field": self.field, "seq_len": self.seq_len}
        if self.eos_id is not None:
            out["eos_id"] = self.eos_id
        return out


@dataclass(frozen=True)
class Stage:
    """One curriculum stage: a weighted mix of sources cut into global batches.

    A finite stage (``infinite=False``) reads each source once and then ends the stream; an
    infinite stage repeats its sources in epochs. ``ramp`` grows the global batch to
    ``batch_size`` over the stage's first rows (:class:`Ramp`); a ramped stage's global batches
    are shared by all ranks instead of handed to them in turn. ``packing`` or
    ``windows`` make it read token corpora (``.bin`` or Parquet token lists) as rows of token
    windows.

    Examples:
        >>> Stage(sources=[FileSource(files=["a.parquet"])], batch_size=32).infinite
        False

    """

    sources: Sequence[FileSource | ManifestSource]
    batch_size: int
    shuffle: Shuffle | None = None
    infinite: bool = False
    ramp: Ramp | None = None
    packing: Packing | None = None
    windows: TokenWindows | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", tuple(self.sources))

    def to_dict(self) -> dict[str, Any]:
        """The stage as the engine's JSON document expects it."""
        out: dict[str, Any] = {
            "sources": [s.to_dict() for s in self.sources],
            "batch_size": self.batch_size,
            "shuffle": self.shuffle.to_dict() if self.shuffle else None,
            "infinite": self.infinite,
        }
        if self.ramp is not None:
            out["ramp"] = self.ramp.to_dict()
        if self.packing is not None:
            out["packing"] = self.packing.to_dict()
        if self.windows is not None:
            out["windows"] = self.windows.to_dict()
        return out


@dataclass(frozen=True)
class BatchStreamConfig:
    """Everything a batch stream needs: projected fields, stages, seed and resources.

    ``threads`` decode threads run in Rust; ``prefetch_batches`` batches are assembled ahead
    of the consumer. ``rank``/``world_size`` select this process's slice of the global batch
    sequence. ``memory_limit_bytes`` bounds the working set (default: half of host memory).

    ``validation_pass=True`` reads every row of the (finite, unshuffled, unramped) stages
    exactly once across the ranks: the final round of ``world_size`` batches is padded with
    zero rows instead of dropped, and every batch carries a ``valid`` column (``bool``,
    delivered as ``uint8``) that is 1 for a row of data and 0 for padding, so a score covers
    the whole split. ``stream.stats().dropped_rows`` is then 0.

    ``skip_batches`` lists ranges ``(start, end)`` (or ``range(start, end)``) of global batches
    no rank receives, for recovering from a loss spike (docs/order.md, "Skipping batches");
    every other batch keeps its rows and its place. A resumed stream may add ranges that start
    at or after its position.

    ``partitions`` cuts every epoch of each source into that many contiguous shares, one per
    partition; each partition mixes and shuffles its own shares, and global batch ``g`` comes
    from partition ``g mod partitions`` (counted from the stage's start), so that on a world
    size dividing it each rank reads rows no other rank reads: each byte of the corpus is
    fetched by one rank per pass, but for the blocks a share's ends cut. An infinite stage
    needs every source to hold at least ``partitions`` rows. Set it to the world size a run is
    planned for; a
    rank holds ``partitions / world_size`` windows at once (docs/order.md, "Partitions"). It
    is part of the order, like ``seed``: 1 (the default) is the order of streams without it.
    Every stage must shuffle and none may ramp; stage switches land where every partition has
    read the same rows.

    Examples:
        >>> config = BatchStreamConfig(
        ...     fields=[ProjectedField(name="x", source="x", dtype="f32")],
        ...     stages=[Stage(sources=[FileSource(files=["a.parquet"])], batch_size=8)],
        ... )
        >>> config.world_size
        1

    """

    fields: Sequence[ProjectedField]
    stages: Sequence[Stage]
    seed: int = 0
    threads: int = 4
    prefetch_batches: int = 2
    rank: int = 0
    world_size: int = 1
    memory_limit_bytes: int | None = None
    validation_pass: bool = False
    skip_batches: Sequence[tuple[int, int]] = ()
    partitions: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(_sequence("fields", self.fields)))
        object.__setattr__(self, "stages", tuple(_sequence("stages", self.stages)))
        # Types and ranges are checked here, with each option's path, so that a wrong value is
        # named where the config is built; rules between options are the engine's alone.
        _integer("seed", self.seed, minimum=0)
        _integer("threads", self.threads, minimum=1, maximum=LIMITS["max_threads"])
        _integer("prefetch_batches", self.prefetch_batches, minimum=0, maximum=2**32)
        _integer("world_size", self.world_size, minimum=1, maximum=LIMITS["max_world_size"])
        _integer("rank", self.rank, minimum=0, maximum=self.world_size - 1)
        if self.memory_limit_bytes is not None:
            _integer("memory_limit_bytes", self.memory_limit_bytes, minimum=1)
        if not isinstance(self.validation_pass, bool):
            raise _invalid("validation_pass", f"expected a bool, got {self.validation_pass!r}")
        object.__setattr__(self, "skip_batches", _skip_ranges(self.skip_batches))
        _integer("partitions", self.partitions, minimum=1, maximum=LIMITS["max_world_size"])
        if not self.fields:
            raise _invalid("fields", "at least one projected field is required")
        for i, field in enumerate(self.fields):
            _check_field(f"fields[{i}]", field)
        if not self.stages:
            raise _invalid("stages", "at least one stage is required")
        for s, stage in enumerate(self.stages):
            _check_stage(f"stages[{s}]", stage)

    def to_dict(self) -> dict[str, Any]:
        """The config as a document of plain values: what :meth:`from_dict` reads back.

        Every option is in it (a field's ``length`` as its ``shape``; options at their default
        that appeared after the first release, such as ``overflow`` or a source's ``columns``,
        are left out, so the document of a config without them is what it always was), and
        ``BatchStreamConfig.from_dict(config.to_dict()) == config``. Paths are as written:
        a relative local path is resolved against the working directory when a stream opens.

        Examples:
            >>> config = BatchStreamConfig(
            ...     fields=[ProjectedField(name="x", source="x", dtype="f32")],
            ...     stages=[Stage(sources=[FileSource(files=["a.parquet"])], batch_size=8)],
            ... )
            >>> BatchStreamConfig.from_dict(config.to_dict()) == config
            True

        """
        return {
            "fields": [f.to_dict() for f in self.fields],
            "stages": [s.to_dict() for s in self.stages],
            "seed": self.seed,
            "threads": self.threads,
            "prefetch_batches": self.prefetch_batches,
            "rank": self.rank,
            "world_size": self.world_size,
            "memory_limit_bytes": self.memory_limit_bytes,
            **({"validation_pass": True} if self.validation_pass else {}),
            **({"skip_batches": [list(r) for r in self.skip_batches]} if self.skip_batches else {}),
            **({"partitions": self.partitions} if self.partitions != 1 else {}),
        }

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON: what the engine receives, and a config file's content.

        Paths are as written. Saved as a config file, a relative local path is then taken
        relative to the file's directory by :meth:`from_file`; write absolute paths (or the file
        in the working directory) for a file that opens the same shards as the config.
        """
        return json.dumps(self.to_dict(), allow_nan=False)

    @classmethod
    def from_dict(
        cls, document: Mapping[str, Any], *, base_dir: str | os.PathLike[str] | None = None
    ) -> BatchStreamConfig:
        """The config a document of plain values describes (what :meth:`to_dict` returns).

        Keys mirror the dataclasses' arguments, every one of them: ``fields`` (each with
        ``length`` or ``shape``, ``overflow``, ``pad_side``; a stack's ``source`` a list),
        ``stages`` (each with ``sources``, ``batch_size``, ``shuffle``, ``infinite``, ``ramp``,
        ``packing``, ``windows``), ``seed``, the resources, ``validation_pass``,
        ``skip_batches`` (a list of ``[start, end]`` pairs) and ``partitions``. A source with ``files`` is a
        :class:`FileSource`, one with ``manifest_uri`` a :class:`ManifestSource` (``kind:
        files|manifest`` may say so too); either may have ``columns``. An unknown or missing key,
        or a value of the wrong type, raises :class:`ConfigError` whose ``option`` is the key's
        path (``stages[0].shuffle.buffer_rows``).

        Paths are kept as written, except that with ``base_dir`` a relative local path in
        ``files`` or ``manifest_uri`` is joined to it (:meth:`from_file` passes the file's
        directory). Without it, a relative path stays relative and is resolved against the
        working directory when a stream opens.

        Examples:
            >>> config = BatchStreamConfig.from_dict({
            ...     "fields": [{"name": "tokens", "source": "input_ids", "dtype": "i32", "length": 8}],
            ...     "stages": [{"sources": [{"files": ["/data/a.parquet"]}], "batch_size": 4}],
            ... })
            >>> config.stages[0].sources[0].files
            ('/data/a.parquet',)

        """
        base = None if base_dir is None else Path(base_dir)
        values = _arguments(cls, "config", document)
        values["fields"] = [
            _field_from(f"fields[{i}]", item) for i, item in enumerate(_list("fields", values["fields"]))
        ]
        values["stages"] = [
            _stage_from(f"stages[{i}]", item, base)
            for i, item in enumerate(_list("stages", values["stages"]))
        ]
        return cls(**values)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> BatchStreamConfig:
        """The config a YAML (``.yaml``, ``.yml``) or JSON (``.json``) file describes.

        The document is the one :meth:`from_dict` reads; relative local paths in it are taken
        relative to the file's directory, so a config file travels with its data. Errors name
        the file and the key at fault (``ConfigError``, with ``path`` and ``option`` set); a
        missing file raises :class:`ObjectNotFoundError`. YAML needs PyYAML, which the ``cli``
        extra installs (``pip install 'o41-training-data[cli]'``).

        Examples:
            >>> config = BatchStreamConfig.from_file("stream.yaml")  # doctest: +SKIP

        """
        file = as_path(path)
        # Bounded: a FIFO, a device, a directory or a huge file is refused before it is read.
        text = read_text(file, ConfigError, "config file")
        document = _parse_document(file, text)
        if not isinstance(document, Mapping):
            raise _in_file(file, _invalid("config", f"expected a mapping at the top, got {_kind(document)}"))
        try:
            return cls.from_dict(document, base_dir=Path(normalize(file)).parent)
        except ConfigError as error:
            raise _in_file(file, error) from None


def _skip_ranges(value: Any) -> tuple[tuple[int, int], ...]:
    """``skip_batches`` as pairs of whole numbers (``range`` objects of step 1 too).

    The engine checks their order and overlap.
    """
    ranges = [
        (r.start, r.stop) if isinstance(r, range) and r.step == 1 else r
        for r in _sequence("skip_batches", value)
    ]
    for i, item in enumerate(ranges):
        if isinstance(item, str | bytes) or not isinstance(item, Sequence) or len(item) != 2:
            raise _invalid(f"skip_batches[{i}]", f"expected a (start, end) pair, got {item!r}")
        for bound in item:
            _integer(f"skip_batches[{i}]", bound, minimum=0)
    return tuple((int(start), int(end)) for start, end in ranges)


_Part = TypeVar("_Part")


def _arguments(cls: type[Any], option: str, document: object, extra: Sequence[str] = ()) -> dict[str, Any]:
    """The entries of ``document`` as ``cls``'s keyword arguments.

    The known keys are the dataclass's fields (and ``extra``), the required ones those without a
    default, so that an option added to a class is read from documents without another list.
    """
    known = (*extra, *(f.name for f in fields(cls) if f.init))
    required = [
        f.name for f in fields(cls) if f.init and f.default is MISSING and f.default_factory is MISSING
    ]
    return _keys(option, document, known, required)


def _part(cls: type[_Part], option: str, document: object) -> _Part | None:
    """The optional part (``shuffle``, ``ramp``, ``packing``, ``windows``) ``document`` describes."""
    if document is None:
        return None
    return cls(**_arguments(cls, option, document))


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _keys(
    option: str, document: object, known: Sequence[str], required: Sequence[str] = ()
) -> dict[str, Any]:
    """The entries of the mapping ``document`` as keyword arguments, refusing unknown keys."""
    if not isinstance(document, Mapping):
        raise _invalid(option, f"expected a mapping, got {_kind(document)}")
    prefix = "" if option == "config" else f"{option}."
    for key in document:
        if key not in known:
            raise _invalid(f"{prefix}{key}", f"unknown key {key!r}; expected one of {', '.join(known)}")
    for key in required:
        if key not in document:
            raise _invalid(f"{prefix}{key}", "missing required key")
    return {str(k): v for k, v in document.items() if k != "kind"}


def _list(option: str, value: object) -> list[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise _invalid(option, f"expected a list, got {_kind(value)}")
    return list(value)


def _strings(option: str, value: object) -> list[str]:
    items = _list(option, value)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise _invalid(f"{option}[{i}]", f"expected a string, got {_kind(item)}")
    return items


def _local(location: str, base: Path | None) -> str:
    """``location`` joined to ``base`` when it is a relative local path, else as written."""
    if base is None or "://" in location or Path(location).is_absolute():
        return location
    return os.path.join(base, location)


def _field_from(option: str, document: object) -> ProjectedField:
    values = _arguments(ProjectedField, option, document)
    if not isinstance(values["source"], str):
        values["source"] = tuple(_strings(f"{option}.source", values["source"]))
    if values.get("shape") is not None:
        values["shape"] = tuple(_list(f"{option}.shape", values["shape"]))
    if values.get("length") is not None and values.get("shape") is not None:
        raise _invalid(option, f"field '{values['name']}': give length or shape, not both")
    if values["dtype"] not in DTYPES:
        raise _invalid(
            f"{option}.dtype", f"unknown dtype {values['dtype']!r}; expected one of {', '.join(DTYPES)}"
        )
    try:
        return ProjectedField(**values)
    except ConfigError as error:
        raise _invalid(option, str(error).removeprefix("invalid ")) from None


def _source_from(option: str, document: object, base: Path | None) -> FileSource | ManifestSource:
    if not isinstance(document, Mapping):
        raise _invalid(option, f"expected a mapping, got {_kind(document)}")
    kind = document.get("kind")
    if kind is None:
        kind = "files" if "files" in document else "manifest" if "manifest_uri" in document else None
    cls: type[FileSource | ManifestSource]
    if kind == "files":
        cls = FileSource
        values = _arguments(cls, option, document, extra=("kind",))
        values["files"] = [_local(f, base) for f in _strings(f"{option}.files", values["files"])]
    elif kind == "manifest":
        cls = ManifestSource
        values = _arguments(cls, option, document, extra=("kind",))
        if not isinstance(values["manifest_uri"], str):
            raise _invalid(
                f"{option}.manifest_uri", f"expected a string, got {_kind(values['manifest_uri'])}"
            )
        values["manifest_uri"] = _local(values["manifest_uri"], base)
        if values.get("curriculum_stages") is not None:
            values["curriculum_stages"] = _strings(f"{option}.curriculum_stages", values["curriculum_stages"])
    elif "kind" in document:
        raise _invalid(f"{option}.kind", f"unknown source kind {kind!r}; expected files or manifest")
    else:
        raise _invalid(
            option, "a source needs 'files' (a file list) or 'manifest_uri' (a manifest selection)"
        )
    # Checked here with the key's path; the class checks them again as ``FileSource.columns``.
    values["columns"] = _columns(f"{option}.columns", values.get("columns"))
    try:
        return cls(**values)
    except ConfigError as error:
        # The class names its own options (``ManifestSource.split``); name the key's path instead.
        at = error.option
        if at is None or not at.startswith(f"{cls.__name__}."):
            raise
        message = str(error).removeprefix(f"invalid {at}: ")
        raise _invalid(option + at.removeprefix(cls.__name__), message) from None


def _stage_from(option: str, document: object, base: Path | None) -> Stage:
    values = _arguments(Stage, option, document)
    values["sources"] = [
        _source_from(f"{option}.sources[{j}]", item, base)
        for j, item in enumerate(_list(f"{option}.sources", values["sources"]))
    ]
    parts: dict[str, type[Any]] = {
        "shuffle": Shuffle,
        "ramp": Ramp,
        "packing": Packing,
        "windows": TokenWindows,
    }
    for key, cls in parts.items():
        if key in values:
            values[key] = _part(cls, f"{option}.{key}", values[key])
    return Stage(**values)


def _parse_document(file: Path, text: str) -> object:
    """The document in ``text``: YAML or JSON by the file's suffix."""
    suffix = file.suffix.lower()
    if suffix in (".json", ".yaml", ".yml"):
        check_depth(text, file, ConfigError)
    if suffix == ".json":
        try:
            return json.loads(text)
        except RecursionError:
            raise _in_file(file, ConfigError("nests too deep to be a config")) from None
        except json.JSONDecodeError as error:
            raise _in_file(file, ConfigError(f"not valid JSON at line {error.lineno}: {error.msg}")) from None
    if suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ImportError(
                f"{file}: reading a YAML config needs PyYAML; install it with "
                "pip install 'o41-training-data[cli]' (or write the config as JSON)"
            ) from None
        try:
            return yaml.safe_load(text)
        except RecursionError:
            raise _in_file(file, ConfigError("nests too deep to be a config")) from None
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            problem = getattr(error, "problem", None) or str(error)
            raise _in_file(file, ConfigError(f"not valid YAML{where}: {problem}")) from None
    raise _in_file(file, ConfigError(f"unknown config file suffix {file.suffix!r}; use .yaml, .yml or .json"))


def _in_file(file: Path, error: ConfigError) -> ConfigError:
    """``error`` with the config file named first in its message and as its ``path``."""
    located = ConfigError(f"{file}: {error}")
    located.option = error.option
    located.path = str(file)
    return located


def config_json(config: object) -> str:
    """The JSON document of a ``config`` argument; a :class:`ConfigError` unless it is a config."""
    if not isinstance(config, BatchStreamConfig):
        raise _invalid("config", f"expected a BatchStreamConfig, got {type(config).__name__}")
    return config.to_json()
