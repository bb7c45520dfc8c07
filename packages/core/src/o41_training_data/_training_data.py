"""``TrainingData``: the entry point that carries storage settings to streams, savers and manifests."""

from __future__ import annotations

import os
from typing import Any

from ._config import BatchStreamConfig
from ._core import Checkpoint
from ._manifest import DataManifest, load_manifest, save_manifest
from ._saver import DatasetSaver
from ._storage import CredentialProvider, RetryPolicy, StorageConfig
from ._stream import BatchStream, open_batch_stream, resolve_batch_stream_config, resume_batch_stream

__all__ = ["TrainingData"]


class TrainingData:
    """Opens streams, savers and manifests with one set of storage settings.

    It serves local paths and ``s3://bucket/key`` locations, and local and ``s3://`` sources
    can mix in one stream. ``s3://`` is AWS S3 in ``region`` (virtual-hosted requests, as the AWS
    SDKs send them), or the S3-compatible service at ``s3_base_url`` (addressed path-style).
    Omitted settings fall back to the standard environment variables (``AWS_ENDPOINT_URL``,
    ``AWS_REGION``, ``AWS_CA_BUNDLE``); the region defaults to ``us-east-1``.

    Credentials are, in this order of choice: ``access_key_id`` and ``secret_access_key`` (with
    ``session_token``), fixed for the run; ``credential_provider``, a function returning
    :class:`TemporaryCredentials`, asked again before they expire; else the standard AWS chain
    (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, a web identity token file, the shared
    config and credentials files with ``profile`` or ``AWS_PROFILE``, container and instance
    metadata), looked at on the first ``s3://`` request. A request refused for its credentials
    is retried once with credentials fetched anew. Credentials never reach checkpoints, resolved
    configs, reprs, pickles or error messages.

    Examples:
        >>> training_data = TrainingData(
        ...     s3_base_url="http://127.0.0.1:8333",
        ...     region="auto",
        ...     access_key_id="...",
        ...     secret_access_key="...",
        ... )
        >>> training_data
        TrainingData(s3_base_url='http://127.0.0.1:8333', region='auto', credentials=<redacted>)

    """

    def __init__(
        self,
        s3_base_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        *,
        retry: RetryPolicy | None = None,
        profile: str | None = None,
        credential_provider: CredentialProvider | None = None,
        ca_bundle: str | os.PathLike[str] | None = None,
    ) -> None:
        self._storage = StorageConfig.resolve(
            s3_base_url=s3_base_url,
            region=region,
            access_key_id=access_key_id,
            secret_access_key=secret_access_key,
            session_token=session_token,
            retry=retry,
            profile=profile,
            credential_provider=credential_provider,
            ca_bundle=ca_bundle,
        )

    @property
    def storage_config(self) -> StorageConfig:
        """The storage settings, for :func:`iter_shard` and the module-level functions."""
        return self._storage

    def batch_stream(self, config: BatchStreamConfig, **kwargs: Any) -> BatchStream:
        """Opens a stream over ``config`` (see :func:`open_batch_stream`)."""
        return open_batch_stream(config, storage=self._storage, **kwargs)

    def resume_batch_stream(self, checkpoint: Checkpoint, **kwargs: Any) -> BatchStream:
        """Resumes the stream ``checkpoint`` describes (see :func:`resume_batch_stream`)."""
        return resume_batch_stream(checkpoint, storage=self._storage, **kwargs)

    def resolve_batch_stream_config(self, config: BatchStreamConfig) -> dict[str, Any]:
        """The resolved document a stream over ``config`` would run; it holds no credentials."""
        return resolve_batch_stream_config(config, storage=self._storage)

    def dataset_saver(
        self, manifest_uri: str | os.PathLike[str], data_format: str = "parquet"
    ) -> DatasetSaver:
        """A saver that writes shards beside ``manifest_uri`` and publishes the manifest last."""
        return DatasetSaver(manifest_uri, data_format=data_format, storage=self._storage)

    def load_manifest(self, uri: str | os.PathLike[str]) -> DataManifest:
        """Reads and checks a data manifest (see :func:`load_manifest`)."""
        return load_manifest(uri, storage=self._storage)

    def save_manifest(
        self, uri: str | os.PathLike[str], manifest: DataManifest, *, overwrite: bool = False
    ) -> None:
        """Writes a copy of ``manifest`` (see :func:`save_manifest`)."""
        save_manifest(uri, manifest, overwrite=overwrite, storage=self._storage)

    def __repr__(self) -> str:
        settings = repr(self._storage)
        return "TrainingData" + settings[len("StorageConfig") :]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_from_storage, (self._storage,))


def _from_storage(storage: StorageConfig) -> TrainingData:
    """Unpickles a :class:`TrainingData` (its storage settings travel without credentials)."""
    training_data = TrainingData.__new__(TrainingData)
    training_data._storage = storage
    return training_data
