"""Data manifests: load, inspect and copy them (the format is in ``docs/manifest.md``)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from . import _core
from ._errors import MalformedShardError, ObjectConflictError
from ._storage import StorageConfig, normalize, parent, relative_location

__all__ = ["Curriculum", "DataManifest", "ManifestShard", "ManifestSplit", "load_manifest", "save_manifest"]


@dataclass(frozen=True)
class ManifestShard:
    """One physical shard: where it is, its rows, bytes, checksum, stage and metadata."""

    location: str
    """As written in the manifest: relative to its directory unless absolute."""
    rows: int
    bytes: int
    checksum: str
    curriculum_stage: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    path: str = ""
    """The shard's absolute path or ``s3://`` location, resolved against its manifest's."""


@dataclass(frozen=True)
class Curriculum:
    """A named, ordered selection of a split's shards (by location)."""

    name: str
    shards: tuple[str, ...]
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ManifestSplit:
    """A split: every shard once, in root order, and its curriculum selections."""

    shards: tuple[ManifestShard, ...]
    curricula: tuple[Curriculum, ...] = ()


@dataclass(frozen=True)
class DataManifest:
    """A loaded data manifest.

    Examples:
        >>> manifest = load_manifest("data/data-manifest-v1.json")  # doctest: +SKIP
        >>> [shard.rows for shard in manifest.splits["train"].shards]  # doctest: +SKIP
        [1000, 1000]

    """

    data_format: str
    splits: dict[str, ManifestSplit]
    uri: str | None = None
    """Where it was loaded from (locations are relative to its directory)."""

    def to_json(self, relative_to: str | None = None) -> str:
        """The manifest document.

        Locations are relative to ``relative_to``'s directory where they can be (the
        manifest's own directory by default).
        """
        base = parent(normalize(relative_to or self.uri or "./manifest"))

        def location(shard: ManifestShard) -> str:
            target = shard.path or shard.location
            if not (os.path.isabs(target) or target.startswith("s3://")):
                return target
            return relative_location(target, base)

        def split_document(split: ManifestSplit) -> dict[str, Any]:
            # New location of every shard, computed once per split for the curricula below.
            moved = {s.location: location(s) for s in split.shards}
            return {
                "shards": [
                    {
                        "location": moved[s.location],
                        "rows": s.rows,
                        "bytes": s.bytes,
                        "checksum": s.checksum,
                        "curriculum_stage": s.curriculum_stage,
                        "metadata": s.metadata,
                    }
                    for s in split.shards
                ],
                "curricula": [
                    {"name": c.name, "shards": [moved[loc] for loc in c.shards], "metadata": c.metadata}
                    for c in split.curricula
                ],
            }

        document = {
            "format": "o41-data-manifest",
            "version": 1,
            "data_format": self.data_format,
            "splits": {name: split_document(split) for name, split in self.splits.items()},
        }
        # The engine writes the document (the format lives in its `manifest` module): it checks
        # the format's rules on the way, so an invalid manifest is never produced.
        return _core.check_manifest(json.dumps(document), relative_to or self.uri or "manifest")


def _parse(text: str, uri: str) -> DataManifest:
    document = json.loads(_core.check_manifest(text, uri))
    splits = {
        name: ManifestSplit(
            shards=tuple(
                ManifestShard(
                    location=s["location"],
                    rows=s["rows"],
                    bytes=s["bytes"],
                    checksum=s["checksum"],
                    curriculum_stage=s.get("curriculum_stage"),
                    metadata=s.get("metadata", {}),
                    path=_core.shard_location(uri, s["location"]),
                )
                for s in split["shards"]
            ),
            curricula=tuple(
                Curriculum(name=c["name"], shards=tuple(c["shards"]), metadata=c.get("metadata", {}))
                for c in split.get("curricula", [])
            ),
        )
        for name, split in document["splits"].items()
    }
    return DataManifest(data_format=document["data_format"], splits=splits, uri=uri)


def load_manifest(uri: str | os.PathLike[str], *, storage: StorageConfig | None = None) -> DataManifest:
    """Reads and checks a data manifest at a local path or, given ``storage``, an ``s3://`` location.

    Raises ``MalformedShardError`` naming the manifest when it breaks the format's rules and
    ``ObjectNotFoundError`` when it does not exist.
    """
    target = normalize(uri, "uri")
    text = _core.load_manifest(target, (storage or StorageConfig()).core())
    return _parse(text, target)


def save_manifest(
    uri: str | os.PathLike[str],
    manifest: DataManifest,
    *,
    overwrite: bool = False,
    storage: StorageConfig | None = None,
) -> None:
    """Writes ``manifest`` to ``uri`` (a copy: locations are rewritten relative to ``uri``).

    The write is all or nothing: a local temporary file then a link that cannot replace an
    existing file, or a create-only conditional upload. Writing the same manifest again is a
    no-op; a different manifest already at ``uri`` raises :class:`ObjectConflictError` unless
    ``overwrite``.
    """
    target = normalize(uri, "uri")
    text = manifest.to_json(relative_to=target)  # written and checked by the engine
    store = (storage or StorageConfig()).core()
    try:
        store.write(target, text.encode(), create_only=not overwrite)
    except ObjectConflictError:
        # Equal documents with other formatting are the same publication. The file there is
        # read as a manifest is (bounded, UTF-8, checked); one that is not a manifest at all is
        # certainly not this one.
        try:
            existing = _parse(_core.load_manifest(target, store), target)
        except MalformedShardError:
            same = False
        else:
            same = existing.to_json(relative_to=target) == text
        if not same:
            conflict = ObjectConflictError(
                f"{target} already holds a different manifest or another file; pass overwrite=True "
                "to replace it"
            )
            conflict.path = target
            raise conflict from None
