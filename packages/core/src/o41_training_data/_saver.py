"""The dataset saver: shards with completion descriptors, curricula, and the manifest last.

Layout under the manifest's directory: ``<split>/<stage or _>/shard-<id>.<ext>`` for each data
object and ``....done.json`` beside it for its completion descriptor. A shard counts as saved
once its descriptor exists and matches its data object; the manifest is written last.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from . import _core
from ._errors import ConfigError, DataError, MalformedShardError, ObjectConflictError, ObjectNotFoundError
from ._errors import invalid as _invalid
from ._files import MAX_DOCUMENT_BYTES, MAX_DOCUMENT_DEPTH, create_beside, json_depth
from ._limits import LIMITS
from ._manifest import Curriculum, DataManifest, ManifestShard, ManifestSplit, load_manifest, save_manifest
from ._storage import StorageConfig, is_remote, normalize, parent

__all__ = ["DatasetSaver", "SavedShard"]

DESCRIPTOR_VERSION = 1
MAX_SHARD_BYTES = 5 * 2**30
# The file extension of a saved shard, by data format.
SHARD_EXTENSIONS = {"parquet": ".parquet", "msgpack": ".msgpack", "jsonl.gz": ".jsonl.gz"}
_ID = re.compile(r"[A-Za-z0-9._-]+")
_DESCRIPTOR = re.compile(r"^[A-Za-z0-9._-]+/[A-Za-z0-9._-]+/shard-[A-Za-z0-9._-]+\.done\.json$")


@dataclass(frozen=True)
class SavedShard:
    """A completed shard, as its completion descriptor records it."""

    split: str
    curriculum_stage: str | None
    shard_id: str
    location: str
    """Relative to the manifest's directory."""
    rows: int
    bytes: int
    checksum: str
    schema: dict[str, str]
    metadata: dict[str, Any] = field(default_factory=dict)


def _arrow_type_name(kind: pa.DataType) -> str:
    """The saver's name for an inferred Arrow type (widths do not matter across shards)."""
    if pa.types.is_null(kind):
        return "null"
    if pa.types.is_boolean(kind):
        return "bool"
    if pa.types.is_integer(kind):
        return "int"
    if pa.types.is_floating(kind):
        return "float"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "string"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"list<{_arrow_type_name(kind.value_type)}>"
    if pa.types.is_struct(kind):
        return "object"
    return str(kind)


def _merge(a: str, b: str) -> str | None:
    """The common type of two inferred types, or None when they conflict."""
    if a == b or b == "null" or (b == "list<null>" and a.startswith("list<")):
        return a
    if a == "null" or (a == "list<null>" and b.startswith("list<")):
        return b
    if {a, b} == {"int", "float"}:
        return "float"
    if a.startswith("list<") and b.startswith("list<"):
        inner = _merge(a[5:-1], b[5:-1])
        return f"list<{inner}>" if inner else None
    return None


def _to_table(records: Sequence[Mapping[str, Any]], where: str) -> pa.Table:
    """The records as an Arrow table (types inferred in C); a conflict names record and field."""
    try:
        return pa.Table.from_pylist(list(records))
    except (pa.ArrowException, TypeError, AttributeError, OverflowError) as err:
        for row, record in enumerate(records):
            if not isinstance(record, Mapping):
                raise DataError(
                    f"{where}, record {row}: expected a mapping of fields, got {type(record).__name__}"
                ) from None
        names = {name for record in records for name in record}
        for name in sorted(names):
            values = [record.get(name) for record in records]
            try:
                pa.array(values)
            except (pa.ArrowException, TypeError, OverflowError) as field_err:
                row = next((i for i in range(1, len(values) + 1) if _fails(values[:i])), 0) - 1
                raise DataError(f"{where}, record {max(row, 0)}, field '{name}': {field_err}") from None
        raise DataError(f"{where}: {err}") from None


_MAX_NESTING = LIMITS["max_nesting"]


def _check_nesting(records: Sequence[Any], where: str) -> None:
    """Refuses a record whose values nest deeper than the engine writes, before Arrow sees it.

    Arrow's type inference takes memory quadratic in the depth (3 GB for one value 5,000 lists
    deep) and the process aborts when it runs out, so the depth is found first, walking no
    deeper than the limit.
    """
    for row, record in enumerate(records):
        if not isinstance(record, Mapping):
            continue  # refused by _to_table, naming it
        for name, value in record.items():
            if _deeper_than(value, _MAX_NESTING):
                error = DataError(
                    f"{where}, record {row}, field {name!r}: nests more than {_MAX_NESTING} levels "
                    "deep, more than a shard written here may"
                )
                error.field = str(name)
                raise error


_CONTAINERS = (list, tuple, Mapping)


def _deeper_than(value: object, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` lists or mappings deep.

    Level by level, no deeper than the limit; a level's elements are told apart by their types
    in C (``set(map(type, ...))``), so a long flat list of numbers costs no Python step each.
    """
    level = [value]
    for _ in range(limit):
        inner: list[object] = []
        for item in level:
            children = (
                item.values()
                if isinstance(item, Mapping)
                else item
                if isinstance(item, (list, tuple))
                else ()
            )
            if any(issubclass(kind, _CONTAINERS) for kind in set(map(type, children))):
                inner.extend(x for x in children if isinstance(x, _CONTAINERS))
        if not inner:
            return False
        level = inner
    return True


def _check_names(schema: pa.Schema, where: str) -> None:
    """Refuses a field name with a NUL character: Arrow's C data interface cuts the name there."""
    pending: list[tuple[str, pa.Field]] = [("", f) for f in schema]
    while pending:
        prefix, item = pending.pop()
        path = f"{prefix}{item.name}"
        if "\0" in item.name:
            error = DataError(f"{where}, field {path!r}: a field name cannot hold a NUL character")
            error.field = path
            raise error
        kind = item.type
        while pa.types.is_list(kind) or pa.types.is_large_list(kind):
            kind = kind.value_type
        if pa.types.is_struct(kind):
            pending.extend((f"{path}.", kind.field(i)) for i in range(kind.num_fields))


def _fails(values: list[Any]) -> bool:
    try:
        pa.array(values)
    except (pa.ArrowException, TypeError, OverflowError):
        return True
    return False


def _write_data(
    path: Path, name: str, data_format: str, records: Sequence[Mapping[str, Any]], table: pa.Table
) -> tuple[int, str]:
    """Writes the shard through the engine's writer for its encoding; returns (bytes, sha256 hex).

    Errors name the shard ``name``, where it will be published, not the temporary ``path``.
    """
    if data_format == "parquet":
        return _core.write_shard(str(path), data_format, table=table, name=name)
    return _core.write_shard(str(path), data_format, records=records, name=name)


def _refused(descriptor: str, why: str) -> MalformedShardError:
    error = MalformedShardError(f"{descriptor}: {why}; remove it and its data object to regenerate the shard")
    error.path = descriptor
    return error


def _parse_descriptor(text: bytes, descriptor: str, location: str) -> SavedShard:
    """A completion descriptor's shard; anything truncated, altered or foreign is refused naming it."""

    def refuse(why: str) -> MalformedShardError:
        return _refused(descriptor, why)

    try:
        body = text.decode()
    except UnicodeDecodeError as err:
        raise refuse(f"not a completion descriptor ({err})") from None
    if json_depth(body) > MAX_DOCUMENT_DEPTH:
        raise refuse(f"not a completion descriptor (nested deeper than {MAX_DOCUMENT_DEPTH})")
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as err:
        raise refuse(f"not a completion descriptor ({err})") from None
    if not isinstance(document, dict):
        raise refuse("not a completion descriptor (not a JSON object)")
    if document.pop("version", None) != DESCRIPTOR_VERSION:
        raise refuse("unknown descriptor version")
    try:
        shard = SavedShard(**document)
    except TypeError as err:
        raise refuse(f"its fields are not a saved shard's ({err})") from None
    kinds = {
        "split": str,
        "shard_id": str,
        "location": str,
        "rows": int,
        "bytes": int,
        "checksum": str,
        "schema": dict,
        "metadata": dict,
    }
    for name, kind in kinds.items():
        value = getattr(shard, name)
        if not isinstance(value, kind) or isinstance(value, bool) or (isinstance(value, int) and value < 0):
            raise refuse(f"field '{name}' is {value!r}")
    if shard.curriculum_stage is not None and not isinstance(shard.curriculum_stage, str):
        raise refuse(f"field 'curriculum_stage' is {shard.curriculum_stage!r}")
    expected = location.split("/")
    if (
        shard.location != location
        or shard.split != expected[0]
        or (shard.curriculum_stage or "_") != expected[1]
        or not expected[2].startswith(f"shard-{shard.shard_id}.")
    ):
        raise refuse(f"it describes {shard.location!r} of split {shard.split!r}, not the shard beside it")
    if not shard.checksum.startswith("sha256:"):
        raise refuse(f"checksum {shard.checksum!r} is not sha256:<hex>")
    return shard


def _publish_descriptor(store: _core.Storage, uri: str, document: bytes) -> None:
    """Writes a completion descriptor, create-only: the step that marks a shard complete."""
    store.write(uri, document)


class DatasetSaver:
    """Saves shards of a derived dataset and publishes its manifest last.

    Picklable: send it to worker processes (``ProcessPoolExecutor``, Ray tasks); the parent's
    :meth:`commit_manifest` finds every shard the workers completed from their descriptors.
    The pickle carries no credentials (see :class:`StorageConfig` for how workers get them).

    Examples:
        >>> saver = TrainingData().dataset_saver("out/data-manifest-v1.json")  # doctest: +SKIP
        >>> shard = saver.save("train", "easy", records, shard_id="0")  # doctest: +SKIP
        >>> manifest = saver.commit_manifest()  # doctest: +SKIP

    """

    def __init__(
        self,
        manifest_uri: str | os.PathLike[str],
        data_format: str = "parquet",
        *,
        storage: StorageConfig | None = None,
    ) -> None:
        if data_format not in SHARD_EXTENSIONS:
            raise ConfigError(
                f"invalid data_format: {data_format!r}; expected one of {', '.join(SHARD_EXTENSIONS)}"
            )
        self.manifest_uri = normalize(manifest_uri, "manifest_uri")
        self.data_format = data_format
        self._storage = storage or StorageConfig()
        if is_remote(self.manifest_uri) and not self._storage.has_s3:
            self._storage_missing()
        self._root = parent(self.manifest_uri)
        self._known: dict[tuple[str, str], SavedShard] = {}
        self._curricula: dict[str, dict[str, tuple[tuple[str, ...], dict[str, Any]]]] = {}
        self._orders: dict[str, tuple[str, ...]] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Registrations belong to the process that made them; workers only save.
        return {"manifest_uri": self.manifest_uri, "data_format": self.data_format, "storage": self._storage}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["manifest_uri"], state["data_format"], storage=state["storage"])  # type: ignore[misc]

    def _storage_missing(self) -> None:
        raise ConfigError(
            f"storage: {self.manifest_uri} is in object storage; create the saver with "
            "TrainingData(s3_base_url=...).dataset_saver(...)"
        )

    def _uri(self, location: str) -> str:
        return _core.shard_location(self.manifest_uri, location)

    def _location(self, split: str, stage: str | None, shard_id: str) -> str:
        if stage in ("", "_"):
            # "_" is the directory of shards without a stage: a stage of that name would be none.
            raise _invalid("curriculum_stage", f"{stage!r} is not a stage name; pass None for no stage")
        for name, value in (("split", split), ("curriculum_stage", stage or "_"), ("shard_id", shard_id)):
            # fullmatch: "$" would let a trailing newline through.
            if not isinstance(value, str) or not _ID.fullmatch(value) or value in (".", ".."):
                raise _invalid(name, f"{value!r}: use letters, digits, '.', '_' and '-'")
        return f"{split}/{stage or '_'}/shard-{shard_id}{SHARD_EXTENSIONS[self.data_format]}"

    def _read_descriptor(self, location: str) -> SavedShard | None:
        descriptor = self._uri(location + ".done.json")
        data = self._uri(location)
        store = self._storage.core()
        try:
            handle = store.open(descriptor)
        except ObjectNotFoundError:
            return None
        if handle.size > MAX_DOCUMENT_BYTES:
            raise _refused(descriptor, f"{handle.size:,} bytes is over the {MAX_DOCUMENT_BYTES:,}-byte limit")
        shard = _parse_descriptor(bytes(handle.read_range(0, handle.size)), descriptor, location)
        try:
            # Rows too: a descriptor's count would otherwise reach the manifest unchecked.
            _, rows, size, digest = store.describe_shard(data, self.data_format)
            found = {"rows": rows, "bytes": size, "checksum": "sha256:" + digest}
        except (ObjectNotFoundError, DataError) as unreadable:
            found = {"data object": str(unreadable)}
        differ = [name for name, value in found.items() if getattr(shard, name, None) != value]
        if differ:
            mismatch = MalformedShardError(
                f"{data}: the data object does not match its completion descriptor {descriptor} "
                f"({', '.join(differ)}); remove both to regenerate the shard"
            )
            mismatch.path = data
            raise mismatch
        return shard

    def recover(self, split: str, curriculum_stage: str | None, *, shard_id: str) -> SavedShard:
        """The completed shard ``shard_id``, verified against its descriptor, without records.

        Raises ``ObjectNotFoundError`` when it was never completed and ``MalformedShardError`` when
        its data does not match its descriptor.
        """
        location = self._location(split, curriculum_stage, shard_id)
        shard = self._read_descriptor(location)
        if shard is None:
            raise ObjectNotFoundError(
                f"{self._uri(location)}: no completion descriptor; the shard was never completed"
            )
        self._known[(split, location)] = shard
        return shard

    def save(
        self,
        split: str,
        curriculum_stage: str | None,
        records: Iterable[Mapping[str, Any]],
        curriculum_metadata: Mapping[str, Any] | None = None,
        *,
        shard_id: str,
    ) -> SavedShard:
        """Writes one shard and its completion descriptor; returns the completed shard.

        When a valid descriptor already exists (a restarted job), the shard is verified and
        returned without consuming ``records``. A data object without a descriptor (a crash
        mid-save) is written again; one that does not match its descriptor fails closed.
        """
        location = self._location(split, curriculum_stage, shard_id)
        done = self._read_descriptor(location)
        if done is not None:
            self._known[(split, location)] = done
            return done
        try:
            rows = list(records)
        except TypeError:
            raise _invalid(
                "records", f"expected an iterable of mappings, got {type(records).__name__}"
            ) from None
        if curriculum_metadata is not None and not isinstance(curriculum_metadata, Mapping):
            raise _invalid(
                "curriculum_metadata", f"expected a mapping, got {type(curriculum_metadata).__name__}"
            )
        metadata = dict(curriculum_metadata or {})
        try:
            # Checked before any byte is written: the descriptor holds it as JSON.
            json.dumps(metadata, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as err:
            raise _invalid("curriculum_metadata", f"not JSON: {err}") from None
        data = self._uri(location)
        _check_nesting(rows, data)
        table = _to_table(rows, data)
        _check_names(table.schema, data)
        schema = {f.name: _arrow_type_name(f.type) for f in table.schema}
        # A local target gets its temporary file beside it, so publishing is a link, not a copy.
        scratch = None if is_remote(data) else Path(data).parent
        if scratch is not None:
            scratch.mkdir(parents=True, exist_ok=True)
        if scratch is not None:
            # With the mode open() gives: the link that publishes it keeps it.
            created, tmp = create_beside(Path(data), prefix=".tmp-")
            os.close(created)
        else:
            with tempfile.NamedTemporaryFile(prefix=".tmp-", delete=False) as handle:
                tmp = Path(handle.name)
        try:
            size, digest = _write_data(tmp, data, self.data_format, rows, table)
            if size >= MAX_SHARD_BYTES:
                raise DataError(
                    f"{data}: {size} bytes is over the 5 GiB limit of an atomic shard write; "
                    "split the records over more shard ids"
                )
            checksum = "sha256:" + digest
            store = self._storage.core()
            try:
                store.write_file(data, str(tmp), digest)
            except ObjectConflictError:
                # No descriptor claims the object there: an orphan of a crash mid-save.
                store.write_file(data, str(tmp), digest, create_only=False)
        finally:
            tmp.unlink(missing_ok=True)
        shard = SavedShard(
            split=split,
            curriculum_stage=curriculum_stage,
            shard_id=shard_id,
            location=location,
            rows=len(rows),
            bytes=size,
            checksum=checksum,
            schema=schema,
            metadata=metadata,
        )
        descriptor = json.dumps({"version": DESCRIPTOR_VERSION, **asdict(shard)}).encode()
        _publish_descriptor(store, self._uri(location + ".done.json"), descriptor)
        self._known[(split, location)] = shard
        return shard

    def _check_known(self, split: str, shards: Sequence[SavedShard], what: str) -> list[str]:
        locations = [s.location for s in shards]
        if len(set(locations)) != len(locations):
            raise ConfigError(f"{what}: a shard is listed twice")
        for shard in shards:
            if (split, shard.location) not in self._known or shard.split != split:
                raise ConfigError(
                    f"{what}: {shard.location} was not saved or recovered in split '{split}' by this saver"
                )
        return locations

    def register_curriculum(
        self, split: str, name: str, shards: Sequence[SavedShard], metadata: Mapping[str, Any] | None = None
    ) -> None:
        """Publishes ``shards`` (saved or recovered in ``split``) as the ordered selection ``name``.

        The same registration again is a no-op; a different one for ``name``, a shard listed
        twice, or a name that is a curriculum stage of other shards is refused.
        """
        what = f"curriculum '{name}' of split '{split}'"
        locations = tuple(self._check_known(split, shards, what))
        stage_shards = [
            s.location
            for (sp, _), s in sorted(self._known.items())
            if sp == split and s.curriculum_stage == name
        ]
        if stage_shards and sorted(stage_shards) != sorted(locations):
            raise ConfigError(f"{what}: '{name}' is already the curriculum stage of other shards")
        entry = (locations, dict(metadata or {}))
        existing = self._curricula.setdefault(split, {}).get(name)
        if existing is not None and existing != entry:
            raise ConfigError(f"{what} is already registered with other shards or metadata")
        self._curricula[split][name] = entry

    def register_split_order(self, split: str, shards: Sequence[SavedShard]) -> None:
        """Prescribes the root order of ``split``: every shard of the split exactly once."""
        what = f"split order of '{split}'"
        locations = tuple(self._check_known(split, shards, what))
        for shard in shards:
            if self._known[(split, shard.location)] != shard:
                raise ConfigError(f"{what}: {shard.location} differs from the saved shard (metadata?)")
        existing = self._orders.get(split)
        if existing is not None and existing != locations:
            raise ConfigError(f"{what} is already registered with another order")
        self._orders[split] = locations

    def _completed(self) -> dict[str, list[SavedShard]]:
        splits: dict[str, list[SavedShard]] = {}
        prefix = self._root + "/"
        for descriptor in self._storage.core().list(self._root):
            location = descriptor.removeprefix(prefix)[: -len(".done.json")]
            if not _DESCRIPTOR.match(descriptor.removeprefix(prefix)):
                continue
            if not location.endswith(SHARD_EXTENSIONS[self.data_format]):
                # One manifest lists one data_format: shards of another cannot join it.
                raise ConfigError(
                    f"data_format: {self._root} already holds {location}, saved as another format "
                    f"than this saver's {self.data_format!r}; save to another location, or with "
                    "the data_format of the shards there"
                )
            shard = self._read_descriptor(location)
            if shard is not None:
                splits.setdefault(shard.split, []).append(shard)
        return splits

    def build_manifest(self) -> DataManifest:
        """The manifest :meth:`commit_manifest` would publish, without writing it."""
        splits = {}
        for split, shards in self._completed().items():
            for shard in shards:
                self._known.setdefault((split, shard.location), shard)
            schema: dict[str, str] = {}
            for shard in shards:
                for name, kind in shard.schema.items():
                    merged = _merge(schema.get(name, kind), kind)
                    if merged is None:
                        raise DataError(
                            f"{self._uri(shard.location)}, field '{name}': {kind} conflicts with "
                            f"{schema[name]} in other shards of split '{split}'"
                        )
                    schema[name] = merged
            by_location = {s.location: s for s in shards}
            order = self._orders.get(split)
            if order is not None and sorted(order) != sorted(by_location):
                raise ConfigError(
                    f"the registered split order of '{split}' does not list every shard of the split; "
                    "register it again with all of them"
                )
            ordered = [by_location[loc] for loc in (order or sorted(by_location))]
            curricula = tuple(
                Curriculum(name=name, shards=locations, metadata=metadata)
                for name, (locations, metadata) in sorted(self._curricula.get(split, {}).items())
            )
            splits[split] = ManifestSplit(
                shards=tuple(
                    ManifestShard(
                        location=s.location,
                        rows=s.rows,
                        bytes=s.bytes,
                        checksum=s.checksum,
                        curriculum_stage=s.curriculum_stage,
                        metadata=s.metadata,
                        path=self._uri(s.location),
                    )
                    for s in ordered
                ),
                curricula=curricula,
            )
        for split in self._curricula:
            if split not in splits:
                raise ConfigError(f"curricula are registered for split '{split}', which has no shards")
        return DataManifest(data_format=self.data_format, splits=splits, uri=self.manifest_uri)

    def commit_manifest(self) -> DataManifest:
        """Publishes the manifest of every completed shard, written last and all at once.

        Committing the same completed publication again is a no-op.
        """
        manifest = self.build_manifest()
        if not manifest.splits:
            error = ConfigError(
                f"{self.manifest_uri}: no completed shard under {self._root}; a manifest lists at "
                "least one, so nothing was published"
            )
            error.path = self.manifest_uri
            raise error
        try:
            save_manifest(self.manifest_uri, manifest, storage=self._storage)
        except ObjectConflictError:
            # An empty manifest (published by an earlier version) holds nothing to protect.
            existing = load_manifest(self.manifest_uri, storage=self._storage)
            if any(split.shards for split in existing.splits.values()):
                raise
            save_manifest(self.manifest_uri, manifest, overwrite=True, storage=self._storage)
        return load_manifest(self.manifest_uri, storage=self._storage)
