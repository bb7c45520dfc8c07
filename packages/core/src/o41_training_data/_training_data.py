"""``TrainingData``: the entry point that will carry storage settings (local storage for now)."""

from __future__ import annotations

import os
from typing import Any

from ._config import BatchStreamConfig
from ._core import Checkpoint
from ._errors import ConfigError
from ._manifest import DataManifest, load_manifest, save_manifest
from ._saver import DatasetSaver
from ._stream import BatchStream, open_batch_stream, resolve_batch_stream_config, resume_batch_stream

__all__ = ["TrainingData"]


class TrainingData:
    """Opens streams and manifests with one set of storage settings.

    This release serves local paths only: ``TrainingData()`` with no arguments. Passing object
    storage settings raises :class:`ConfigError` until S3 support lands.

    Example:
        >>> training_data = TrainingData()
        >>> stream = training_data.batch_stream(config)  # doctest: +SKIP

    """

    def __init__(
        self,
        s3_base_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
    ) -> None:
        given = [
            name
            for name, value in (
                ("s3_base_url", s3_base_url),
                ("region", region),
                ("access_key_id", access_key_id),
                ("secret_access_key", secret_access_key),
                ("session_token", session_token),
            )
            if value is not None
        ]
        if given:
            raise ConfigError(
                f"invalid {given[0]}: object storage is not available in this release; "
                "use TrainingData() with local paths"
            )

    def batch_stream(self, config: BatchStreamConfig) -> BatchStream:
        """Opens a stream over ``config`` (see :func:`open_batch_stream`)."""
        return open_batch_stream(config)

    def resume_batch_stream(self, checkpoint: Checkpoint, **kwargs: Any) -> BatchStream:
        """Resumes the stream ``checkpoint`` describes (see :func:`resume_batch_stream`)."""
        return resume_batch_stream(checkpoint, **kwargs)

    def resolve_batch_stream_config(self, config: BatchStreamConfig) -> dict[str, Any]:
        """The resolved document a stream over ``config`` would run."""
        return resolve_batch_stream_config(config)

    def dataset_saver(
        self, manifest_uri: str | os.PathLike[str], data_format: str = "parquet"
    ) -> DatasetSaver:
        """A saver that writes shards beside ``manifest_uri`` and publishes the manifest last."""
        return DatasetSaver(manifest_uri, data_format=data_format)

    def load_manifest(self, uri: str | os.PathLike[str]) -> DataManifest:
        """Reads and checks a data manifest (see :func:`load_manifest`)."""
        return load_manifest(uri)

    def save_manifest(
        self, uri: str | os.PathLike[str], manifest: DataManifest, *, overwrite: bool = False
    ) -> None:
        """Writes a copy of ``manifest`` (see :func:`save_manifest`)."""
        save_manifest(uri, manifest, overwrite=overwrite)

    def __repr__(self) -> str:
        return "TrainingData(local)"
