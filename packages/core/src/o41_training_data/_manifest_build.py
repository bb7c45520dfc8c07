"""Indexing shards other tools wrote into a data manifest (``o41 manifest build``).

Streams over a manifest open in time independent of the data's size: the manifest carries each
shard's row count and size, so no rank reads a shard to count it. Building the manifest reads
every shard once (to count its records and hash its bytes); a file list too large for one
machine is described in parallel tasks on a Ray cluster.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence

from . import _core
from ._config import ARRAY_RECORD_ENCODINGS, ENCODINGS, IN_PLACE_ENCODINGS
from ._errors import invalid as _invalid
from ._manifest import DataManifest, ManifestShard, ManifestSplit, load_manifest, save_manifest
from ._ray import connect
from ._storage import StorageConfig, normalize

__all__ = ["manifest_from_files"]

# The encodings a manifest may declare; a Megatron dataset is named by its `.idx`.
_MANIFEST_ENCODINGS = (*ENCODINGS, *IN_PLACE_ENCODINGS)
_SUFFIXES = sorted(
    [
        # The engine's table (one place), less what a manifest does not list: `.bin` token
        # streams, and a Megatron dataset's `.bin` beside its `.idx`, which names it.
        *((suffix, e) for suffix, e in _core.encoding_suffixes() if e in _MANIFEST_ENCODINGS),
        # What an ArrayRecord file's records hold is not in its name: data_format says.
        (".array_record", "array_record"),
    ],
    key=lambda pair: -len(pair[0]),
)
# Shards per Ray task: enough to amortise a task's start, few enough to spread a file list.
_TASK_SHARDS = 64


def encoding_of(path: str) -> str | None:
    """The shard encoding ``path``'s extension names (the longest matching suffix), or ``None``.

    An ArrayRecord file (``x.array_record``, or TFDS's ``x.array_record-00000-of-00008``) gives
    ``"array_record"``, which names no payload: a manifest of them needs ``data_format``.
    """
    if re.search(r"\.array_record-\d+-of-\d+$", path):
        return "array_record"
    return next((encoding for suffix, encoding in _SUFFIXES if path.endswith(suffix)), None)


def _is_directory(path: str) -> bool:
    return path.endswith("/") if path.startswith("s3://") else os.path.isdir(path)


def _shards_under(directory: str, storage: StorageConfig) -> list[str]:
    """The shard files under ``directory`` (and its subdirectories), by their suffixes, sorted.

    Files that describe shards rather than hold them (a Megatron ``.bin``'s ``.idx`` stands for
    the pair; ``index.json``, ``state.json``, ``meta.json``) are not listed. A ``datasets``
    ``DatasetDict`` is refused: each of its splits is a directory of its own.
    """
    found = storage.core().list(directory.rstrip("/"))
    if any(p.rsplit("/", 1)[-1] == "dataset_dict.json" for p in found):
        raise _invalid(
            "files", f"{directory} is a datasets DatasetDict: build a manifest from one split's directory"
        )
    shards = [p for p in found if encoding_of(p) is not None]
    if not shards:
        raise _invalid(
            "files", f"{directory} holds no shard with a known suffix ({', '.join(s for s, _ in _SUFFIXES)})"
        )
    return shards


def _describe(
    paths: Sequence[str], data_format: str, storage: StorageConfig
) -> list[tuple[str, int, int, str]]:
    """Location, rows, bytes and SHA-256 of each of ``paths``, in order (also the body of a Ray task)."""
    store = storage.core()
    return [store.describe_shard(path, data_format) for path in paths]


def _describe_on_ray(
    paths: list[str],
    data_format: str,
    storage: StorageConfig,
    ray_address: str,
    progress: Callable[[int], None],
) -> list[tuple[str, int, int, str]]:
    import ray

    connect(ray_address)
    remote = ray.remote(_describe)
    chunks = [paths[i : i + _TASK_SHARDS] for i in range(0, len(paths), _TASK_SHARDS)]
    pending = {remote.remote(chunk, data_format, storage): k for k, chunk in enumerate(chunks)}
    results: list[list[tuple[str, int, int, str]] | None] = [None] * len(chunks)
    waiting = list(pending)
    while waiting:
        done, waiting = ray.wait(waiting, num_returns=1)
        for ref in done:
            k = pending[ref]
            results[k] = ray.get(ref)
            progress(len(chunks[k]))
    return [described for chunk in results if chunk is not None for described in chunk]


def manifest_from_files(
    files: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    split: str = "train",
    data_format: str | None = None,
    storage: StorageConfig | None = None,
    ray_address: str | None = None,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
) -> DataManifest:
    """Indexes ``files`` (local paths or ``s3://`` locations) into a data manifest at ``output``.

    A directory among ``files`` (an ``s3://`` prefix ending in ``/``) stands for the shard files
    under it whose suffixes name an encoding, sorted: a directory of Megatron datasets (their
    ``.idx``), a ``datasets`` ``save_to_disk`` directory, an MDS dataset directory, Parquet
    files, and so on.

    Each shard is read once through the engine: its records are counted as a stream would
    count them and its bytes hashed (SHA-256), so the manifest lists rows, bytes and checksum
    for every shard, in the order given, as split ``split``. Every shard must have the one
    encoding a manifest declares: ``data_format``, or the one their names' suffixes agree on.
    With ``ray_address`` (an address, ``"auto"`` or ``"local"``), shards are described in Ray
    tasks of 64 shards, and the manifest is written by this process once all succeeded. The
    write is all or nothing (:func:`save_manifest`); a malformed shard raises before anything
    is written, naming it. ``progress(n)``, when given, is called as ``n`` more shards are
    described (``o41 manifest build`` draws its progress bar with it).

    Examples:
        >>> manifest_from_files(["a.parquet", "b.parquet"], "data-manifest-v1.json")  # doctest: +SKIP

    """
    config = storage or StorageConfig.resolve()
    paths = []
    for f in files:
        path = normalize(f)
        # A directory (an s3:// prefix ending in "/") stands for the shard files under it.
        if _is_directory(path):
            paths.extend(_shards_under(path, config))
        else:
            paths.append(path)
    if not paths:
        raise _invalid("files", "no shard to index")
    if data_format is None:
        found = {path: encoding_of(path) for path in paths}
        unknown = [path for path, encoding in found.items() if encoding is None]
        if unknown:
            raise _invalid(
                "data_format",
                f"{unknown[0]} has no known suffix ({', '.join(s for s, _ in _SUFFIXES)}); name the encoding",
            )
        kinds = sorted({str(e) for e in found.values()})
        if len(kinds) > 1:
            raise _invalid("files", f"a manifest holds one encoding, these files have {', '.join(kinds)}")
        data_format = kinds[0]
        if data_format == "array_record":
            raise _invalid(
                "data_format",
                f"{paths[0]} is an ArrayRecord file, whose records' payload its name does not give; "
                f"name it: one of {', '.join(ARRAY_RECORD_ENCODINGS)}",
            )
    elif data_format not in _MANIFEST_ENCODINGS:
        raise _invalid("data_format", f"'{data_format}' is not one of {', '.join(_MANIFEST_ENCODINGS)}")
    if len(set(paths)) != len(paths):
        twice = next(p for p in paths if paths.count(p) > 1)
        raise _invalid("files", f"{twice} is listed twice")

    def advance(n: int) -> None:
        if progress is not None:
            progress(n)

    if ray_address is None:
        store = config.core()
        described = []
        for path in paths:
            described.append(store.describe_shard(path, data_format))
            advance(1)
    else:
        described = _describe_on_ray(paths, data_format, config, ray_address, advance)
    shards = tuple(
        ManifestShard(location=location, rows=rows, bytes=size, checksum=f"sha256:{sha}", path=location)
        for location, rows, size, sha in described
    )
    locations = [shard.location for shard in shards]
    if len(set(locations)) != len(locations):
        twice = next(p for p in locations if locations.count(p) > 1)
        raise _invalid("files", f"{twice} is listed twice (a Megatron dataset by its .idx and its .bin)")
    manifest = DataManifest(data_format=data_format, splits={split: ManifestSplit(shards=shards)})
    target = normalize(output)
    save_manifest(target, manifest, overwrite=overwrite, storage=config)
    return load_manifest(target, storage=config)
