"""o41-training-data PyTorch adapter (IterableDataset).

This package is a skeleton: it pins the import path and its dependency on the core, and is
filled in by its own issue. It re-exports the core's version so a mismatch is easy to spot.
"""

from o41_training_data import __version__ as core_version

__all__ = ["core_version"]
