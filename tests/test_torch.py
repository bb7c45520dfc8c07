"""The PyTorch adapter: DataLoader workers, ranks, state, advance, and a real torchrun job."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    ConfigError,
    FileSource,
    ProjectedField,
    Shuffle,
    Stage,
    open_batch_stream,
)
from o41_training_data_torch import POSITION_KEY, O41IterableDataset
from o41_training_data_torch._dataset import _tensor
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from conftest import ShardWriter, write_shard

MANY_WORKERS = pytest.mark.filterwarnings("ignore:This DataLoader will create")
NO_ACCELERATOR = pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true but no accelerator")


@pytest.fixture
def config(shard: ShardWriter) -> BatchStreamConfig:
    a = [shard("parquet", [{"v": i, "m": [i % 2 == 0] * 3} for i in range(k, k + 60)]) for k in (0, 60)]
    b = shard("jsonl.gz", [{"v": 1000 + i, "m": [True, False, True]} for i in range(50)])
    return BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i64"), ProjectedField("m", "m", "bool", length=3)],
        stages=[
            Stage(
                sources=[FileSource(files=a, weight=2.0), FileSource(files=[b])],
                batch_size=4,
                shuffle=Shuffle(buffer_rows=24, unit_rows=2),
            ),
            Stage(sources=[FileSource(files=[b])], batch_size=4, infinite=True),
        ],
        threads=1,
    )


def core_sequence(config: BatchStreamConfig, advance_at: int | None = None, limit: int = 10_000) -> list:
    out = []
    with open_batch_stream(config) as stream:
        while len(out) < limit:
            if advance_at is not None and len(out) == advance_at:
                stream.advance(1)
            batch = next(stream, None)
            if batch is None:
                break
            out.append((batch.batch_index, batch.arrays()["v"].tolist()))
    return out


def loader_sequence(loader, limit: int = 10_000) -> list:
    out = []
    for batch in loader:
        out.append((batch["batch_index"], batch["v"].tolist()))
        if len(out) == limit:
            break
    return out


@MANY_WORKERS
@NO_ACCELERATOR
@pytest.mark.parametrize("workers", [0, 1, 2, 3])
@pytest.mark.parametrize("persistent", [False, True])
def test_workers_yield_exactly_the_rank_sequence(
    config: BatchStreamConfig, workers: int, persistent: bool
) -> None:
    if persistent and workers == 0:
        persistent = False  # persistent_workers needs workers; the plain case is covered by workers=0
    reference = core_sequence(config)
    loader = DataLoader(
        O41IterableDataset(config),
        batch_size=None,
        num_workers=workers,
        persistent_workers=persistent,
        pin_memory=True,
    )
    assert loader_sequence(loader) == reference
    if persistent:
        assert loader_sequence(loader) == reference  # a second pass over persistent workers


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_the_dataset_pickles_into_spawned_workers(config: BatchStreamConfig, method: str) -> None:
    loader = DataLoader(
        O41IterableDataset(config), batch_size=None, num_workers=2, multiprocessing_context=method
    )
    assert loader_sequence(loader) == core_sequence(config)
    assert pickle.loads(pickle.dumps(O41IterableDataset(config))).world_size == 1


def test_batches_are_dicts_of_shared_tensors(config: BatchStreamConfig) -> None:
    batch = next(iter(DataLoader(O41IterableDataset(config), batch_size=None)))
    assert batch["v"].dtype == torch.int64
    assert batch["m"].dtype == torch.bool
    assert batch["m"].shape == (4, 3)
    assert batch["stage"] == 0
    assert batch["batch_index"] == 0
    as_uint8 = next(iter(DataLoader(O41IterableDataset(config, bool_as="uint8"), batch_size=None)))
    assert as_uint8["m"].dtype == torch.uint8
    array = np.arange(6, dtype=np.int32)
    array.flags.writeable = False
    tensor = _tensor(array, as_bool=False)
    assert tensor.data_ptr() == array.ctypes.data  # torch.from_numpy: no copy


def test_a_batch_size_is_refused_with_what_to_write(config: BatchStreamConfig) -> None:
    with pytest.raises(ConfigError, match="batch_size=None"):
        next(iter(DataLoader(O41IterableDataset(config), batch_size=2)))


def test_ranks_from_torch_distributed(config: BatchStreamConfig, tmp_path: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert O41IterableDataset(config).world_size == 1
        import dataclasses

        with pytest.raises(ConfigError, match="torch.distributed says rank 0 of 1"):
            O41IterableDataset(dataclasses.replace(config, rank=1, world_size=2))
    finally:
        dist.destroy_process_group()


def test_ranks_from_the_environment(config: BatchStreamConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    dataset = O41IterableDataset(config)
    assert (dataset.rank, dataset.world_size) == (1, 2)
    batches = loader_sequence(DataLoader(dataset, batch_size=None))
    assert all(index % 2 == 1 for index, _ in batches)


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_exactly(config: BatchStreamConfig, workers: int) -> None:
    reference = core_sequence(config)
    loader = StatefulDataLoader(O41IterableDataset(config), batch_size=None, num_workers=workers)
    head = []
    for batch in loader:
        head.append((batch["batch_index"], batch["v"].tolist()))
        if len(head) == 7:
            state = loader.state_dict()
            break
    del loader
    resumed = StatefulDataLoader(O41IterableDataset(config), batch_size=None, num_workers=workers)
    resumed.load_state_dict(state)
    assert head + loader_sequence(resumed) == reference


@MANY_WORKERS
def test_dataset_level_position_resumes_with_other_worker_counts(config: BatchStreamConfig) -> None:
    reference = core_sequence(config)
    dataset = O41IterableDataset(config)
    head = []
    for batch in DataLoader(dataset, batch_size=None, num_workers=2):
        head.append((batch["batch_index"], batch["v"].tolist()))
        if len(head) == 9:
            text = dataset.checkpoint(batch).to_json()
            break
    for workers in (0, 1, 3):
        resumed = DataLoader(
            O41IterableDataset(Checkpoint.from_json(text)), batch_size=None, num_workers=workers
        )
        assert head + loader_sequence(resumed) == reference


def test_stateful_state_with_another_worker_count_is_refused(config: BatchStreamConfig) -> None:
    loader = StatefulDataLoader(O41IterableDataset(config), batch_size=None, num_workers=2)
    for i, _ in enumerate(loader):
        if i == 3:
            state = loader.state_dict()
            break
    dataset = O41IterableDataset(config)
    dataset.load_state_dict(state["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"])
    with pytest.raises(CheckpointError, match="taken with 2 workers"):
        next(iter(DataLoader(dataset, batch_size=None, num_workers=0)))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("persistent", [False, True])
def test_advance_reaches_the_workers(config: BatchStreamConfig, workers: int, persistent: bool) -> None:
    if persistent and workers == 0:
        persistent = False
    dataset = O41IterableDataset(config)
    loader = DataLoader(dataset, batch_size=None, num_workers=workers, persistent_workers=persistent)
    got = []
    for batch in loader:
        got.append((batch["batch_index"], batch["v"].tolist()))
        if len(got) == 5:
            dataset.advance(1, after=batch)
        if len(got) == 30:
            break
    # Without workers the switch is at the next batch; with them, after what they may hold.
    switch = 5 if workers == 0 else 5 + workers * 2
    assert got == core_sequence(config, advance_at=switch, limit=30)


def test_another_ranks_checkpoint_is_refused(
    config: BatchStreamConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    with open_batch_stream(dataclasses.replace(config, rank=1, world_size=2)) as stream:
        next(stream)
        checkpoint = stream.checkpoint()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(CheckpointError, match="belongs to rank 1 of 2"):
        O41IterableDataset(checkpoint)


def test_torchrun_job_killed_and_restarted_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for k in range(3):
        rows = [{"input_ids": [k * 1000 + i] * (i % 20)} for i in range(70)]
        write_shard(data / f"a-{k}.parquet", "parquet", rows)
    write_shard(data / "b-0.jsonl.gz", "jsonl.gz", [{"input_ids": [7, i]} for i in range(90)])
    script = Path(__file__).with_name("torch_train.py")

    def torchrun(out: Path, die_at: int = 0) -> int:
        out.mkdir(exist_ok=True)
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            str(script), "--data", str(data), "--out", str(out), "--die-at", str(die_at),
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        process = subprocess.Popen(command, env=env, start_new_session=True)
        try:
            return process.wait(timeout=240)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)

    def logs(out: Path) -> list[list[str]]:
        return [(out / f"log-rank{r}.txt").read_text().splitlines() for r in range(2)]

    assert torchrun(tmp_path / "straight") == 0
    straight = logs(tmp_path / "straight")
    assert len(straight[0]) == len(straight[1]) > 10  # both ranks stop after the same step count

    crashed = tmp_path / "crashed"
    assert torchrun(crashed, die_at=10) != 0  # SIGKILL of the whole job at step 10
    before = logs(crashed)
    assert max(int(line.split()[0]) for line in before[0]) == 10
    for r in range(2):
        # Each rank restarts from its own last checkpoint; what it logged after that is redone.
        restart = Checkpoint.from_json((crashed / f"stream-rank{r}.json").read_text()).batches_yielded
        assert restart % 4 == 0
        assert restart < len(straight[r])
        kept = [line for line in before[r] if int(line.split()[0]) <= restart]
        (crashed / f"log-rank{r}.txt").write_text("".join(line + "\n" for line in kept))
    assert torchrun(crashed) == 0
    assert logs(crashed) == straight
    for r in range(2):
        assert POSITION_KEY not in (crashed / f"stream-rank{r}.json").read_text()
