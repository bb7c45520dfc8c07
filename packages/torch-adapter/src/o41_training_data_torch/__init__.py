"""PyTorch adapter for o41-training-data: ``DataLoader(O41IterableDataset(...), batch_size=None)``.

Each item is one whole batch of the core stream as a dict of tensors that share memory with the
engine's Arrow buffers (no copies; from ``DataLoader`` workers, one copy into a shared-memory
ring), exact under ``DataLoader`` workers, ``torchrun`` ranks and ``StatefulDataLoader``
checkpoints. See ``docs/torch.md``.

Examples:
    >>> from torch.utils.data import DataLoader
    >>> from o41_training_data_torch import O41IterableDataset
    >>> loader = DataLoader(O41IterableDataset(config), batch_size=None, num_workers=2)  # doctest: +SKIP

"""

from ._dataset import POSITION_KEY, WORKERS_KEY, O41Batch, O41IterableDataset

__all__ = ["POSITION_KEY", "WORKERS_KEY", "O41Batch", "O41IterableDataset"]
