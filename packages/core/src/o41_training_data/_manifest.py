"""Data manifests: load, inspect and copy them (the format is in ``docs/manifest.md``)."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _core
from ._errors import ConfigError

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
    """The shard's absolute path, resolved against the manifest it was loaded from."""


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

    Example:
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
        base = Path(relative_to or self.uri or ".").resolve().parent

        def location(shard: ManifestShard) -> str:
            target = shard.path or shard.location
            if not os.path.isabs(target):
                return target
            return os.path.relpath(target, base)

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
        return json.dumps(document, indent=2)


def _parse(text: str, uri: str) -> DataManifest:
    document = json.loads(_core.check_manifest(text, uri))
    base = Path(uri).resolve().parent
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
                    path=str((base / s["location"]).resolve()),
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
    return DataManifest(data_format=document["data_format"], splits=splits, uri=str(Path(uri).resolve()))


def load_manifest(uri: str | os.PathLike[str]) -> DataManifest:
    """Reads and checks a local data manifest.

    Raises ``MalformedShardError`` naming the manifest when it breaks the format's rules and
    ``ObjectNotFoundError`` when it does not exist.
    """
    text = _core.load_manifest(str(uri))
    return _parse(text, str(uri))


def save_manifest(uri: str | os.PathLike[str], manifest: DataManifest, *, overwrite: bool = False) -> None:
    """Writes ``manifest`` to ``uri`` (a copy: locations are rewritten relative to ``uri``).

    The write is all or nothing (a temporary file, then a link that cannot replace an existing
    file). Writing the same manifest again is a no-op; a different manifest already at ``uri``
    is refused unless ``overwrite``.
    """
    target = Path(uri).resolve()
    text = manifest.to_json(relative_to=str(target))
    _core.check_manifest(text, str(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=target.parent, prefix=".manifest-", delete=False) as tmp:
        tmp.write(text)
    try:
        if overwrite:
            os.replace(tmp.name, target)
            return
        try:
            os.link(tmp.name, target)
        except FileExistsError:
            existing = _parse(target.read_text(), str(target))
            if existing.to_json(relative_to=str(target)) != text:
                raise ConfigError(
                    f"{target} already holds a different manifest; pass overwrite=True to replace it"
                ) from None
    finally:
        if os.path.exists(tmp.name):
            os.unlink(tmp.name)
