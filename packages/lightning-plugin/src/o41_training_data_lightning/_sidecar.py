"""Per-rank stream checkpoints beside each model checkpoint, and the ``CheckpointIO`` that writes them.

Lightning tells no state hook where a checkpoint goes, but every save and every removal by
``ModelCheckpoint`` (``save_top_k``) or ``trainer.save_checkpoint`` reaches the strategy's
``CheckpointIO`` with the path, on rank 0. :class:`SidecarCheckpointIO` wraps it: before the
model checkpoint ``<name>.ckpt`` is written it writes, from the datamodule state going into it,

```text
<name>.ckpt.o41/stream-rank{r}-of-{n}.json   rank r's core checkpoint in the split form (read_checkpoint),
                                             named as every per-rank file (the core's rank_file_name)
<name>.ckpt.o41/resolved-<fingerprint>.json  the stream's resolved document, once for every rank
<name>.ckpt.o41/datamodule.json              format, version, world size, global step, and
                                             each rank's file (pending curriculum switches are
                                             in the rank's checkpoint)
```

each file atomically (a temporary file renamed over it; one ``PUT`` on object stores), and
removes the directory with its checkpoint. The model checkpoint is the commit marker: it is
written last (Lightning writes it atomically too), so a job killed at any point of a save leaves
either a complete pair or no ``.ckpt`` of that name, and the newest ``.ckpt`` is always
resumable; sidecars without their ``.ckpt`` are an interrupted save's, never read. The index
records the global step, and a ``.ckpt`` whose sidecars hold another step (a save under a reused
name that was interrupted) is refused naming both. The model checkpoint's own state is what a
resume reads; these files are for tools, and for a resume whose model checkpoint carries no
``O41DataModule`` state (Lightning keys it by class name, so a renamed subclass misses it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.strategies import Strategy
from o41_training_data import (
    RUN_STATE_FORMAT,
    Checkpoint,
    CheckpointError,
    RunIndex,
    RunState,
    rank_file_name,
    save_run_files,
    stale_run_files,
    write_rank_file,
)

SIDECAR_SUFFIX = ".o41"
"""Appended to a model checkpoint's path to name the directory of its stream checkpoints."""
INDEX_FILE = "datamodule.json"
"""The sidecar directory's index: format, version, world size, global step and each rank's file."""


def sidecar_directory(checkpoint_path: _PATH) -> str:
    """The directory beside ``checkpoint_path`` (``<path>.o41``); a local symlink is followed."""
    path = os.fspath(checkpoint_path)
    if _is_local(path):
        # `last.ckpt` may be a link to the checkpoint it names (ModelCheckpoint(save_last="link")).
        return os.path.realpath(path) + SIDECAR_SUFFIX
    return path + SIDECAR_SUFFIX


def _is_local(path: str) -> bool:
    protocol = get_filesystem(path).protocol
    return bool({"file", "local"} & set(protocol if isinstance(protocol, tuple | list) else [protocol]))


def _join(directory: str, name: str) -> str:
    if _is_local(directory):
        return os.path.join(directory, name)
    return f"{directory.rstrip('/')}/{name}"


def _entries(fs: Any, directory: str) -> dict[str, Any]:
    """The entries of ``directory`` by name."""
    return {os.path.basename(str(entry).rstrip("/")): entry for entry in fs.ls(directory, detail=False)}


def _write(directory: str, name: str, text: str) -> None:
    fs = get_filesystem(directory)
    path = _join(directory, name)
    if not _is_local(directory):
        fs.pipe_file(path, text.encode())  # one PUT: an object appears whole or not at all
        return
    # The core's rule for per-rank files: temporary file flushed, renamed, directory flushed.
    write_rank_file(Path(path), text, overwrite=True)


def write_sidecars(checkpoint_path: _PATH, state: RunState, global_step: Any = None) -> None:
    """Writes every rank's stream checkpoint and the index beside ``checkpoint_path``."""
    directory = sidecar_directory(checkpoint_path)
    fs = get_filesystem(directory)
    fs.makedirs(directory, exist_ok=True)
    # At the beginning of the config a rank has no checkpoint to write (its entry is null).
    checkpoints = [state.checkpoint(rank) for rank in range(state.world_size)]
    names = [
        rank_file_name(r, state.world_size) if c is not None else None for r, c in enumerate(checkpoints)
    ]
    files = {
        name: c for name, c in zip(names, checkpoints, strict=True) if name is not None and c is not None
    }
    # The core's layout: the resolved document once, then each rank's file naming it.
    save_run_files(files, lambda name, text: _write(directory, name, text))
    step = global_step if isinstance(global_step, int) else None
    _write(directory, INDEX_FILE, RunIndex(names, step).to_json() + "\n")
    written = next(iter(files.values()), None)
    entries = _entries(fs, directory)
    stale = stale_run_files(
        entries,
        state.world_size if written is not None else None,
        written.fingerprint if written is not None else None,
        place=directory,
    )
    for name in stale:
        fs.rm(entries[name])


def remove_sidecars(checkpoint_path: _PATH) -> None:
    """Removes the sidecar directory of ``checkpoint_path``, if there is one.

    A link (``last.ckpt``) has none of its own: the directory it leads to belongs to the
    checkpoint it names, which stays.
    """
    path = os.fspath(checkpoint_path)
    if _is_local(path) and os.path.islink(path):
        return
    directory = sidecar_directory(path)
    fs = get_filesystem(directory)
    if fs.exists(directory):
        fs.rm(directory, recursive=True)


def read_sidecars(
    checkpoint_path: _PATH, rank: int, world_size: int, global_step: int | None = None
) -> Checkpoint | None:
    """Where rank ``rank`` of ``world_size`` resumes, from the sidecars of ``checkpoint_path``.

    ``None``: the ranks had not started. With the world size that wrote them, only this rank's
    file is read; with another, every rank's, moved with the core's rule
    (:func:`o41_training_data.restore_run_checkpoint`). A missing index or rank file raises
    :class:`CheckpointError` naming it, as does an index written for another ``global_step``
    than the model checkpoint's (the sidecars of an interrupted save under the same name).
    """
    directory = sidecar_directory(checkpoint_path)
    fs = get_filesystem(directory)
    index_path = _join(directory, INDEX_FILE)
    if not fs.exists(index_path):
        raise CheckpointError(
            f"checkpoint refused: {os.fspath(checkpoint_path)} holds no O41DataModule state and "
            f"{index_path} does not exist, so this run cannot tell where each rank's stream stopped; "
            "resume with the datamodule class that wrote the checkpoint, or start a new run"
        )
    index = RunIndex.from_json(bytes(fs.cat_file(index_path)).decode(errors="replace"), index_path)
    written_at = index.global_step
    if global_step is not None and written_at is not None and written_at != global_step:
        raise CheckpointError(
            f"checkpoint refused: {index_path} was written for global step {written_at}, but "
            f"{os.fspath(checkpoint_path)} is at step {global_step}: a save under this name was "
            "interrupted between them; resume from another checkpoint"
        )

    def read(name: str) -> bytes:
        return bytes(fs.cat_file(_join(directory, name)))

    names = list(_entries(fs, directory))
    return index.restore(names, directory, read, rank, world_size, index_path)


class SidecarCheckpointIO(CheckpointIO):
    """Wraps the strategy's ``CheckpointIO``: stream checkpoints follow every model checkpoint.

    Saving writes the model checkpoint through the wrapped plugin, then, for the
    ``O41DataModule`` state inside it, each rank's stream checkpoint in ``<path>.o41/``.
    Removing a checkpoint removes that directory first. Loading is the wrapped plugin's.
    """

    def __init__(self, checkpoint_io: CheckpointIO) -> None:
        super().__init__()
        self.checkpoint_io = checkpoint_io

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None
    ) -> None:
        """Saves the stream checkpoints, then the model checkpoint: the commit marker."""
        for key, value in checkpoint.items():
            if isinstance(value, Mapping) and value.get("format") == RUN_STATE_FORMAT:
                state = RunState.from_dict(value, f"the {key!r} state of {os.fspath(path)}")
                write_sidecars(path, state, checkpoint.get("global_step"))
        self.checkpoint_io.save_checkpoint(checkpoint, path, storage_options=storage_options)

    def load_checkpoint(
        self, path: _PATH, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Loads the model checkpoint with the wrapped plugin."""
        return self.checkpoint_io.load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def remove_checkpoint(self, path: _PATH) -> None:
        """Removes the stream checkpoints, then the model checkpoint."""
        remove_sidecars(path)
        self.checkpoint_io.remove_checkpoint(path)

    def teardown(self) -> None:
        """Tears down the wrapped plugin."""
        self.checkpoint_io.teardown()


def install(strategy: Strategy) -> None:
    """Wraps ``strategy``'s ``CheckpointIO`` in a :class:`SidecarCheckpointIO`, once."""
    current = strategy.checkpoint_io
    if not isinstance(current, SidecarCheckpointIO):
        strategy.checkpoint_io = SidecarCheckpointIO(current)
