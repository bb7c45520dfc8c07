"""The PyTorch adapter: DataLoader workers, ranks, state, advance, and a real torchrun job."""

from __future__ import annotations

import functools
import gc
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.distributed as dist
from o41_testkit import ShardWriter, write_shard
from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    ConfigError,
    FileSource,
    ProjectedField,
    Ramp,
    Shuffle,
    Stage,
    SwitchPoint,
    open_batch_stream,
    switch_point,
)
from o41_training_data_torch import POSITION_KEY, O41IterableDataset
from o41_training_data_torch._dataset import _tensor
from o41_training_data_torch._ring import SEGMENT_PREFIX, WorkerRing, segment_directories, segment_of
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

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


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"bool_as": "int8"}, "invalid bool_as: 'int8'; expected 'bool' or 'uint8'"),
        ({"training_data": "s3"}, "invalid training_data: expected a TrainingData, got str"),
    ],
)
def test_adapter_options_are_checked_as_every_adapter_checks_them(
    config: BatchStreamConfig, options: dict[str, object], message: str
) -> None:
    # The core's check_adapter_options: the same words from the torch, Lightning and JAX doors.
    with pytest.raises(ConfigError, match=message):
        O41IterableDataset(config, **options)  # type: ignore[arg-type]


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


def switch_pass(dataset: O41IterableDataset, workers: int, advance_after: int | None = None) -> list:
    """One pass over ``dataset`` (30 batches), advancing to stage 1 after ``advance_after`` batches."""
    got = []
    for batch in DataLoader(dataset, batch_size=None, num_workers=workers):
        got.append((batch["batch_index"], batch["v"].tolist()))
        if len(got) == advance_after:
            dataset.advance(1, after=batch)
        if len(got) == 30:
            break
    return got


@MANY_WORKERS
@pytest.mark.parametrize(("first", "later"), [(0, 0), (2, 2), (0, 2), (2, 0)])
def test_a_switch_persists_into_later_passes_and_workers(
    config: BatchStreamConfig, first: int, later: int
) -> None:
    dataset = O41IterableDataset(config)
    switch = 5 if first == 0 else 5 + first * 2
    expected = core_sequence(config, advance_at=switch, limit=30)
    assert switch_pass(dataset, first, advance_after=5) == expected
    assert dataset.switch == SwitchPoint(stage=1, at=switch)
    # A new pass starts over from the config, in this process or in new workers, and switches
    # at the same global batch: the dataset kept its switch point.
    assert switch_pass(dataset, later) == expected


@MANY_WORKERS
def test_persistent_and_split_workers_keep_the_switch(config: BatchStreamConfig) -> None:
    dataset = O41IterableDataset(config, split_workers=True)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=True)
    got = []
    for batch in loader:
        got.append((batch["batch_index"], batch["v"].tolist()))
        if len(got) == 5:
            dataset.advance(1, after=batch)
        if len(got) == 30:
            break
    expected = core_sequence(config, advance_at=9, limit=30)
    assert got == expected
    # The persistent workers' second pass switches at the same batch.
    assert loader_sequence(loader, limit=30) == expected


def test_a_switch_point_is_the_cores_and_is_checked(config: BatchStreamConfig) -> None:
    dataset = O41IterableDataset(config)
    batches = iter(DataLoader(dataset, batch_size=None))
    for _ in range(3):
        batch = next(batches)
    dataset.advance(1, after=batch)
    assert dataset.switch == switch_point(config, batch[POSITION_KEY], 1) == SwitchPoint(stage=1, at=3)
    with pytest.raises(ConfigError, match="invalid stage: there is no stage 2; the stream has 2 stages"):
        dataset.advance(2, after=batch)
    del batches
    placed = O41IterableDataset(config, switch=SwitchPoint(stage=1, at=4))
    assert loader_sequence(DataLoader(placed, batch_size=None), limit=20) == core_sequence(
        config, advance_at=4, limit=20
    )
    with pytest.raises(ConfigError, match="invalid switch: expected a SwitchPoint, got tuple"):
        O41IterableDataset(config, switch=(1, 4))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="invalid switch: there is no stage 5; the stream has 2 stages"):
        O41IterableDataset(config, switch=SwitchPoint(stage=5, at=4))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_stream_takes_the_switch_it_has_not_reached(
    config: BatchStreamConfig, workers: int
) -> None:
    dataset = O41IterableDataset(config)
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=workers)
    got, state = [], None
    for batch in loader:
        got.append((batch["batch_index"], batch["v"].tolist()))
        if len(got) == 3:
            dataset.advance(1, after=batch)
        if len(got) == 4:
            state = loader.state_dict()  # before the switch takes effect (with workers)
        if len(got) == 30:
            break
    switch = 3 if workers == 0 else 3 + workers * 2
    assert got == core_sequence(config, advance_at=switch, limit=30)
    # The same dataset resumed from a state taken between request and effect switches at the
    # same batch; one taken after it already reflects the switch.
    resumed = StatefulDataLoader(dataset, batch_size=None, num_workers=workers)
    resumed.load_state_dict(state)
    assert loader_sequence(resumed, limit=26) == got[4:]


def test_the_state_carries_a_switch_it_has_not_reached(config: BatchStreamConfig) -> None:
    dataset = O41IterableDataset(config, switch=SwitchPoint(stage=1, at=6))
    untouched = dataset.state_dict()  # before the first batch: the start, with the switch placed
    assert Checkpoint.from_json(untouched["checkpoint"]).position.switches == [(1, 6)]
    it = iter(dataset)
    first = [next(it) for _ in range(2)]
    state = dataset.state_dict()
    # The switch is the checkpoint's own (docs/checkpoint.md): no entry of the adapter's beside it.
    assert "switch" not in state
    assert Checkpoint.from_json(state["checkpoint"]).position.switches == [(1, 6)]
    rest = [next(it) for _ in range(10)]
    # Loaded into a dataset that was never told of the switch, it switches at the same batch.
    fresh = O41IterableDataset(config)
    fresh.load_state_dict(state)
    again = iter(fresh)
    assert [b["v"].tolist() for b in (next(again) for _ in range(10))] == [b["v"].tolist() for b in rest]
    assert first[0]["batch_index"] == 0
    from_start = O41IterableDataset(config)
    from_start.load_state_dict(untouched)
    assert loader_sequence(DataLoader(from_start, batch_size=None), limit=12) == core_sequence(
        config, advance_at=6, limit=12
    )
    # Once reached, the position no longer carries it.
    assert Checkpoint.from_json(dataset.state_dict()["checkpoint"]).position.switches == []


def test_a_state_of_an_earlier_release_keeps_its_switch(config: BatchStreamConfig) -> None:
    dataset = O41IterableDataset(config)
    it = iter(dataset)
    head = [next(it) for _ in range(2)]
    del head
    state = {**dataset.state_dict(), "switch": [1, 6]}  # how the previous release kept it
    fresh = O41IterableDataset(config)
    fresh.load_state_dict(state)
    got = loader_sequence(DataLoader(fresh, batch_size=None), limit=10)
    assert got == core_sequence(config, advance_at=6, limit=12)[2:]
    at_start = O41IterableDataset(config)
    legacy = {"version": 1, "config": config.to_json(), "offset": 0, "stride": 1, "workers": 1}
    at_start.load_state_dict({**legacy, "switch": [1, 4]})
    assert loader_sequence(DataLoader(at_start, batch_size=None), limit=8) == core_sequence(
        config, advance_at=4, limit=8
    )
    for bad, what in (([1], "pair"), (["1", 6], "stage"), ([9, 6], "stage 9"), ([1, -2], "at")):
        with pytest.raises(CheckpointError, match=what):
            O41IterableDataset(config).load_state_dict({**state, "switch": bad})


@MANY_WORKERS
def test_a_ramp_yields_growing_batches_and_advances_after_what_workers_hold(shard: ShardWriter) -> None:
    rows = [{"v": i, "m": [i % 3 == 0] * 3} for i in range(300)]
    source = FileSource(files=[shard("parquet", rows)])
    config = BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i64"), ProjectedField("m", "m", "bool", length=3)],
        stages=[
            Stage(sources=[source], batch_size=8, ramp=Ramp(start=2, increment=2, rows=24), infinite=True),
            Stage(sources=[source], batch_size=4, infinite=True),
        ],
        threads=1,
        rank=1,
        world_size=2,
    )
    dataset = O41IterableDataset(config)
    got = []
    for batch in DataLoader(dataset, batch_size=None, num_workers=2):
        assert batch["m"].dtype == torch.bool
        got.append((batch["batch_index"], batch["v"].tolist()))
        if len(got) == 3:
            dataset.advance(1, after=batch)
        if len(got) == 16:
            break
    # In the ramped stage one local batch is one global batch (the ranks share each), so the
    # switch comes after the 2 workers' 2 batches each, not 2 rounds of world_size batches each.
    assert got == core_sequence(config, advance_at=3 + 2 * 2, limit=16)
    # Global batches of 2 (4 of them), 4 (2), 6 (2), then 8; this rank holds half of each.
    assert [len(v) for _, v in got[:7]] == [1, 1, 1, 1, 2, 2, 3]
    assert {len(v) for _, v in got[7:]} == {4}


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


def test_a_validation_pass_under_torchrun_scores_every_row_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    # 41 rows in batches of 4 on 3 ranks: 11 batches, so the last round of 3 is padded (one
    # batch of 1 row, one of none) instead of dropped.
    write_shard(data / "a.parquet", "parquet", [{"x": float(i)} for i in range(23)])
    write_shard(data / "b.parquet", "parquet", [{"x": float(100 + i)} for i in range(18)])
    out = tmp_path / "out"
    out.mkdir()
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=3",
        str(Path(__file__).with_name("torch_validate.py")), "--data", str(data), "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    process = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        assert process.wait(timeout=240) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    result = json.loads((out / "validation.json").read_text())
    ranks = result["ranks"]
    assert [r["steps"] for r in ranks] == [4, 4, 4], (
        "every rank runs the same steps, the padded round included"
    )
    ids = [i for r in ranks for i in r["ids"]]
    source_of = [(i >> 40) & 0xFFFF for i in ids]
    assert len(ids) == 41
    assert sorted(i & 0xFFFFFFFFFF for i, s in zip(ids, source_of, strict=True) if s == 0) == list(range(41))
    expected = sum(range(23)) + sum(100 + i for i in range(18))
    assert result["score"] == [float(expected), 41.0]


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


# -- The shared-memory ring that carries batches from DataLoader workers (o41_training_data_torch._ring).


def _pickled_in_worker(item):
    """A collate_fn: what crossing the DataLoader's queue costs, measured inside the worker."""
    from multiprocessing.reduction import ForkingPickler

    payload = bytes(ForkingPickler.dumps(item))
    return {"size": len(payload), "torch_storage": b"rebuild_storage" in payload, "item": item}


def _record_pid(directory: Path, worker_id: int) -> None:
    (directory / f"worker-{os.getpid()}").touch()


def _worker_pids(directory: Path, expect: int = 0, seconds: float = 20.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while len(pids := [int(p.name.split("-")[1]) for p in directory.glob("worker-*")]) < expect:
        assert time.monotonic() < deadline, f"{len(pids)} of {expect} workers started"
        time.sleep(0.05)
    return pids


def _ring_files(pids: list[int]) -> list[str]:
    return sorted(
        str(path)
        for directory in segment_directories()
        for pid in pids
        for path in Path(directory).glob(f"{SEGMENT_PREFIX}{pid}-*")
    )


def _wait_for_exit(pids: list[int], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    for pid in pids:
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{pid}").exists(), f"worker {pid} did not exit"


def _wide_config(shard: ShardWriter, batch_size: int, length: int) -> BatchStreamConfig:
    rows = [{"v": i, "t": list(range(i % 7)), "m": [True] * (i % 5)} for i in range(batch_size * 6)]
    return BatchStreamConfig(
        fields=[
            ProjectedField("v", "v", "i64"),
            ProjectedField("t", "t", "i32", length=length),
            ProjectedField("m", "m", "bool", length=length),
        ],
        stages=[Stage(sources=[FileSource(files=[shard("parquet", rows)])], batch_size=batch_size)],
        threads=1,
    )


def test_a_worker_item_crosses_as_a_small_handle(shard: ShardWriter) -> None:
    sizes = []
    for batch_size, length in [(4, 3), (256, 2048)]:
        config = _wide_config(shard, batch_size, length)
        reference = [batch.arrays()["t"].tolist() for batch in open_batch_stream(config)]
        loader = DataLoader(
            O41IterableDataset(config), batch_size=None, num_workers=2, collate_fn=_pickled_in_worker
        )
        got = []
        for out in loader:
            assert not out["torch_storage"]  # no torch shared-memory tensors in the payload
            sizes.append(out["size"])
            got.append(out["item"]["t"].tolist())
            assert out["item"]["m"].dtype == torch.bool
            assert segment_of(out["item"]["t"]) is not None
        assert got == reference
    # 256 x 2048 int32 + mask is 2.6 MB of fields; what crosses is the same few hundred bytes.
    assert max(sizes) < 4096
    assert max(sizes) - min(sizes) < 64


def test_kept_batches_never_change(config: BatchStreamConfig) -> None:
    reference = []
    with open_batch_stream(config) as stream:
        for batch in stream:
            reference.append({name: array.copy() for name, array in batch.arrays().items()})
    loader = DataLoader(O41IterableDataset(config), batch_size=None, num_workers=2, prefetch_factor=1)
    kept = []
    for batch in loader:
        assert segment_of(batch["v"]) is not None  # a view of a ring slot, not a copy
        kept.append(batch)
        if len(kept) == 40:
            break
    del loader
    # Each worker holds 20 batches: more than its first segment's slots, so it grew.
    assert len({segment_of(batch["v"]) for batch in kept}) > 2
    for batch, expected in zip(kept, reference, strict=False):
        assert batch["v"].numpy().tolist() == expected["v"].tolist()
        assert batch["m"].dtype == torch.bool
        assert batch["m"].numpy().view(np.uint8).tolist() == expected["m"].tolist()


@pytest.mark.parametrize("persistent", [False, True])
def test_no_segment_files_outlive_the_workers(
    config: BatchStreamConfig, tmp_path: Path, persistent: bool
) -> None:
    loader = DataLoader(
        O41IterableDataset(config),
        batch_size=None,
        num_workers=2,
        persistent_workers=persistent,
        worker_init_fn=functools.partial(_record_pid, tmp_path),
    )
    for _ in range(2 if persistent else 1):
        for batch in loader:  # to the end
            assert segment_of(batch["v"]) is not None
    # Abandoned after one batch: the other worker's first batch (and segment) is still in flight.
    iterator = iter(loader)
    batch = next(iterator)
    assert segment_of(batch["v"]) is not None
    pids = _worker_pids(tmp_path, expect=2 if persistent else 4)
    del iterator, loader, batch
    gc.collect()
    _wait_for_exit(pids)
    assert _ring_files(pids) == []


def _double_in_worker(item):
    # Worker-side transforms see ordinary tensors, in place or not; here nothing that views a
    # slot is left for the queue, so the batch crosses the usual way.
    item["v"].unsqueeze_(0)
    item["m"] = item["m"].clone()
    item["double"] = item["v"] * 2
    return item


def test_collate_functions_in_workers_get_tensors_and_release_slots(
    config: BatchStreamConfig, tmp_path: Path
) -> None:
    reference = core_sequence(config)
    loader = DataLoader(
        O41IterableDataset(config),
        batch_size=None,
        num_workers=2,
        collate_fn=_double_in_worker,
        worker_init_fn=functools.partial(_record_pid, tmp_path),
    )
    got, most = [], 0
    for batch in loader:
        got.append((batch["batch_index"], batch["v"].squeeze(0).tolist()))
        assert batch["double"].tolist() == [[2 * v for v in got[-1][1]]]
        assert batch["m"].dtype == torch.bool
        # The worker's slot is free again once its collate_fn dropped the tensors: no growth.
        most = max(most, len(_ring_files(_worker_pids(tmp_path))))
    assert got == reference
    assert 1 <= most <= 2
    _wait_for_exit(_worker_pids(tmp_path))
    assert _ring_files(_worker_pids(tmp_path)) == []  # never mapped here: the workers unlinked them


def test_spawned_workers_use_the_ring(config: BatchStreamConfig) -> None:
    loader = DataLoader(
        O41IterableDataset(config), batch_size=None, num_workers=2, multiprocessing_context="spawn"
    )
    got = []
    for batch in loader:
        assert segment_of(batch["v"]) is not None
        assert batch["m"].dtype == torch.bool
        got.append((batch["batch_index"], batch["v"].tolist()))
    assert got == core_sequence(config)


def test_a_larger_stage_batch_gets_larger_slots(shard: ShardWriter) -> None:
    rows = [{"v": i, "m": [i % 3 == 0] * 3} for i in range(400)]
    source = FileSource(files=[shard("parquet", rows)])
    config = BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i64"), ProjectedField("m", "m", "bool", length=3)],
        stages=[Stage(sources=[source], batch_size=4), Stage(sources=[source], batch_size=64)],
        threads=1,
    )
    dataset = O41IterableDataset(config, bool_as="uint8")
    got = []
    for batch in DataLoader(dataset, batch_size=None, num_workers=2):
        assert segment_of(batch["v"]) is not None
        assert batch["m"].dtype == torch.uint8
        got.append((batch["batch_index"], batch["v"].tolist()))
        if len(got) == 3:
            dataset.advance(1, after=batch)
    assert got == core_sequence(config, advance_at=3 + 2 * 2)
    assert {len(v) for _, v in got} == {4, 64}


def _put(ring: WorkerRing, array: np.ndarray) -> torch.Tensor:
    """Puts one column holding ``array`` (rows of fixed shape) into ``ring``."""
    column = pa.array(array.reshape(-1))
    for size in reversed(array.shape[1:]):
        column = pa.FixedSizeListArray.from_arrays(column, size)
    return ring.put(pa.record_batch({"x": column}), {"x": array}, frozenset())["x"]


def test_worker_tensors_pickle_as_plain_tensors_outside_the_queue() -> None:
    ring = WorkerRing()
    try:
        tensor = _put(ring, np.arange(6, dtype=np.int32).reshape(2, 3))
        restored = pickle.loads(pickle.dumps(tensor))
        assert type(restored) is torch.Tensor
        assert restored.tolist() == [[0, 1, 2], [3, 4, 5]]
        assert type(tensor + 1) is torch.Tensor
    finally:
        ring.slots.unlink_unreceived()


def test_a_slot_is_reused_only_after_every_tensor_of_it_is_gone() -> None:
    from multiprocessing.reduction import ForkingPickler

    ring = WorkerRing()  # this process plays both the worker and the main process
    try:
        first = _put(ring, np.arange(4, dtype=np.int64))
        assert first._o41_slot[0].index == 0
        payload = bytes(ForkingPickler.dumps(first))
        assert len(payload) < 512
        del first  # the worker's own tensor is gone, but the handle is on its way
        assert _put(ring, np.arange(4, dtype=np.int64))._o41_slot[0].index == 1
        received = pickle.loads(payload)  # maps the segment, views slot 0
        assert type(received) is torch.Tensor
        assert segment_of(received) is not None
        tail = received[2:]
        del received
        # slot 1 was released with its tensor; slot 0 is still viewed through `tail`
        assert _put(ring, np.arange(4, dtype=np.int64))._o41_slot[0].index == 1
        assert tail.tolist() == [2, 3]
        del tail
        gc.collect()
        assert _put(ring, np.arange(4, dtype=np.int64))._o41_slot[0].index == 0
    finally:
        ring.slots.unlink_unreceived()


class _Tagged(O41IterableDataset):
    """Records which DataLoader worker produced each item."""

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else -1
        for item in super().__iter__():
            dict.__setitem__(item, "worker", worker)
            yield item


@MANY_WORKERS
@pytest.mark.parametrize("workers", [2, 3])
def test_workers_decode_each_batch_once_in_the_first_worker(config: BatchStreamConfig, workers: int) -> None:
    reference = core_sequence(config)
    got, producers = [], []
    for batch in DataLoader(_Tagged(config), batch_size=None, num_workers=workers):
        got.append((batch["batch_index"], batch["v"].tolist()))
        producers.append(batch["worker"])
    assert got == reference
    assert set(producers) == {0}
    split, producers = [], []
    for batch in DataLoader(_Tagged(config, split_workers=True), batch_size=None, num_workers=workers):
        split.append((batch["batch_index"], batch["v"].tolist()))
        producers.append(batch["worker"])
    assert split == reference
    assert producers[:workers] == list(range(workers))
