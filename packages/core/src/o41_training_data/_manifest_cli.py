"""``o41 manifest inspect`` and ``o41 manifest verify``.

``s3://`` manifests and shards are read with the storage settings of the standard ``AWS_*``
environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...).
"""

from __future__ import annotations

import sys
from collections import defaultdict

from ._errors import ObjectNotFoundError
from ._manifest import DataManifest, ManifestShard, load_manifest
from ._progress import Progress
from ._storage import StorageConfig

__all__ = ["inspect", "verify"]


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def inspect(uri: str, storage: StorageConfig | None = None) -> int:
    """Prints the manifest's splits and stages with shard, row and byte counts."""
    manifest: DataManifest = load_manifest(uri, storage=storage or StorageConfig.resolve())
    rows = [["split / stage", "shards", "rows", "bytes"]]
    for name, split in manifest.splits.items():
        rows.append(
            [
                name,
                str(len(split.shards)),
                f"{sum(s.rows for s in split.shards):,}",
                f"{sum(s.bytes for s in split.shards):,}",
            ]
        )
        stages: dict[str, list[ManifestShard]] = defaultdict(list)
        for shard in split.shards:
            stages[shard.curriculum_stage or "(none)"].append(shard)
        for stage, shards in stages.items():
            rows.append(
                [
                    f"  stage {stage}",
                    str(len(shards)),
                    f"{sum(s.rows for s in shards):,}",
                    f"{sum(s.bytes for s in shards):,}",
                ]
            )
        by_location = {s.location: s for s in split.shards}
        for curriculum in split.curricula:
            chosen = [by_location[loc] for loc in curriculum.shards]
            rows.append(
                [
                    f"  curriculum {curriculum.name}",
                    str(len(chosen)),
                    f"{sum(s.rows for s in chosen):,}",
                    f"{sum(s.bytes for s in chosen):,}",
                ]
            )
    print(f"{manifest.uri}: data_format {manifest.data_format}")
    print(_table(rows))
    return 0


def verify(uri: str, storage: StorageConfig | None = None) -> int:
    """Checks every shard's size and content checksum against the manifest; 1 on a mismatch.

    The engine hashes each shard's bytes (SHA-256, the saver's algorithm); a checksum of
    another algorithm cannot be verified and counts as a problem.
    """
    config = storage or StorageConfig.resolve()
    manifest = load_manifest(uri, storage=config)
    store = config.core()
    shards = [s for split in manifest.splits.values() for s in split.shards]
    progress = Progress(total=len(shards), label="verifying", unit="shards")
    problems = []
    for shard in shards:
        path = shard.path
        algorithm, _, expected = shard.checksum.partition(":")
        try:
            opened = store.open(path)
        except ObjectNotFoundError:
            problems.append(f"{path}: missing")
        else:
            if opened.size != shard.bytes:
                problems.append(f"{path}: {opened.size} bytes, the manifest says {shard.bytes}")
            elif algorithm != "sha256":
                problems.append(f"{path}: cannot verify a {algorithm or 'missing'} checksum, only sha256")
            elif store.content_sha256(path) != expected:
                problems.append(f"{path}: checksum differs from the manifest's {shard.checksum}")
        progress.update(1)
    progress.close()
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{len(shards) - len(problems)} of {len(shards)} shards verified")
    return 1 if problems else 0
