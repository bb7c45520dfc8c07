"""What ``o41 manifest inspect``, ``verify`` and ``diff`` compute.

Summaries, shard checks and differences of data manifests, as plain values the command line
presents.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from ._errors import DataError, ObjectNotFoundError
from ._manifest import DataManifest, ManifestShard, ManifestSplit
from ._storage import StorageConfig

__all__ = ["ManifestChange", "diff_manifests", "manifest_summary", "verify_manifest"]


def _totals(shards: list[ManifestShard] | tuple[ManifestShard, ...]) -> tuple[int, int, int]:
    return len(shards), sum(s.rows for s in shards), sum(s.bytes for s in shards)


def manifest_summary(manifest: DataManifest) -> list[tuple[str, int, int, int]]:
    """``(name, shards, rows, bytes)`` for each split, its curriculum stages and its curricula."""
    rows = []
    for name, split in manifest.splits.items():
        rows.append((name, *_totals(split.shards)))
        stages: dict[str, list[ManifestShard]] = defaultdict(list)
        for shard in split.shards:
            stages[shard.curriculum_stage or "(none)"].append(shard)
        for stage, shards in stages.items():
            rows.append((f"  stage {stage}", *_totals(shards)))
        by_location = {s.location: s for s in split.shards}
        for curriculum in split.curricula:
            chosen = [by_location[location] for location in curriculum.shards]
            rows.append((f"  curriculum {curriculum.name}", *_totals(chosen)))
    return rows


def verify_manifest(
    manifest: DataManifest, storage: StorageConfig, advance: Callable[[int], None] | None = None
) -> list[str]:
    """Checks every shard's size, content SHA-256 and record count against the manifest.

    Returns the problems. The engine reads each shard once, as ``o41 manifest build`` does: it
    hashes its bytes (SHA-256, the saver's algorithm) and counts its records from the format's
    own index (a Parquet footer, a Megatron ``.idx``, an MDS ``index.json``, ...), so a shard
    whose bytes or index changed is reported; a checksum of another algorithm cannot be verified
    and counts as a problem. ``advance(1)`` is called per shard.
    """
    store = storage.core()
    problems = []
    for split in manifest.splits.values():
        for shard in split.shards:
            path = shard.path
            algorithm, _, expected = shard.checksum.partition(":")
            try:
                _, rows, size, digest = store.describe_shard(path, manifest.data_format)
            except ObjectNotFoundError:
                problems.append(f"{path}: missing")
            except DataError as error:
                # A shard that no longer reads: its bytes changed (its size or checksum says so),
                # or only its companion index did (a Megatron .idx), which the error names.
                size = store.open(path).size
                if size != shard.bytes:
                    problems.append(f"{path}: {size} bytes, the manifest says {shard.bytes}")
                elif algorithm == "sha256" and store.content_sha256(path) != expected:
                    problems.append(f"{path}: checksum differs from the manifest's {shard.checksum}")
                else:
                    problems.append(str(error))
            else:
                if size != shard.bytes:
                    problems.append(f"{path}: {size} bytes, the manifest says {shard.bytes}")
                elif algorithm != "sha256":
                    problems.append(f"{path}: cannot verify a {algorithm or 'missing'} checksum, only sha256")
                elif digest != expected:
                    problems.append(f"{path}: checksum differs from the manifest's {shard.checksum}")
                elif rows != shard.rows:
                    problems.append(f"{path}: {rows:,} records, the manifest says {shard.rows:,}")
            if advance is not None:
                advance(1)
    return problems


@dataclass(frozen=True)
class ManifestChange:
    """One difference between two manifests."""

    split: str
    """The split it is in ("" for the manifest as a whole)."""
    item: str
    """The shard location, ``curriculum NAME``, or what else differs."""
    change: str
    """What changed, from the old manifest to the new one."""


def _shard_changes(old: ManifestShard, new: ManifestShard) -> list[str]:
    changes = []
    for name in ("rows", "bytes", "checksum", "curriculum_stage", "metadata"):
        before, after = getattr(old, name), getattr(new, name)
        if before != after:
            changes.append(f"{name} {before} -> {after}")
    return changes


def _split_changes(name: str, old: ManifestSplit, new: ManifestSplit) -> list[ManifestChange]:
    before = {s.location: s for s in old.shards}
    after = {s.location: s for s in new.shards}
    changes = [
        ManifestChange(name, s.location, f"removed ({s.rows:,} rows)")
        for s in old.shards
        if s.location not in after
    ]
    changes += [
        ManifestChange(name, s.location, f"added ({s.rows:,} rows)")
        for s in new.shards
        if s.location not in before
    ]
    for shard in old.shards:
        if shard.location in after:
            differences = _shard_changes(shard, after[shard.location])
            if differences:
                changes.append(ManifestChange(name, shard.location, "; ".join(differences)))
    kept_old = [s.location for s in old.shards if s.location in after]
    kept_new = [s.location for s in new.shards if s.location in before]
    if kept_old != kept_new:
        changes.append(ManifestChange(name, "(root order)", "the shards both list are in another order"))
    old_curricula = {c.name: c for c in old.curricula}
    new_curricula = {c.name: c for c in new.curricula}
    for curriculum in old.curricula:
        other = new_curricula.get(curriculum.name)
        if other is None:
            changes.append(ManifestChange(name, f"curriculum {curriculum.name}", "removed"))
        elif other.shards != curriculum.shards:
            changes.append(
                ManifestChange(
                    name,
                    f"curriculum {curriculum.name}",
                    f"selects other shards ({len(curriculum.shards)} -> {len(other.shards)})",
                )
            )
        elif other.metadata != curriculum.metadata:
            changes.append(ManifestChange(name, f"curriculum {curriculum.name}", "metadata changed"))
    changes += [
        ManifestChange(name, f"curriculum {c.name}", "added")
        for c in new.curricula
        if c.name not in old_curricula
    ]
    return changes


def diff_manifests(old: DataManifest, new: DataManifest) -> list[ManifestChange]:
    """The differences from ``old`` to ``new``: data format, splits, shards, order, curricula.

    Shards are matched by their location as listed (relative to the manifest where it is), so
    a manifest copied with its shards compares equal to the original.
    """
    changes = []
    if old.data_format != new.data_format:
        changes.append(ManifestChange("", "data_format", f"{old.data_format} -> {new.data_format}"))
    for name, split in old.splits.items():
        if name not in new.splits:
            changes.append(ManifestChange(name, "(split)", f"removed ({len(split.shards):,} shards)"))
        else:
            changes += _split_changes(name, split, new.splits[name])
    changes += [
        ManifestChange(name, "(split)", f"added ({len(split.shards):,} shards)")
        for name, split in new.splits.items()
        if name not in old.splits
    ]
    return changes
