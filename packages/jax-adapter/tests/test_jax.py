"""The JAX adapter: sharded global batches, device prefetch, state, Orbax and grain checkpoints,
curriculum and validation, and a real two-process job on CPU devices."""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grain.checkpoint
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jax_train import ADVANCE_AFTER, BATCH, train_config, validation_config
from o41_testkit import ShardWriter, copy_without_times
from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    ConfigError,
    FileSource,
    ProjectedField,
    ProjectionError,
    Ramp,
    Shuffle,
    Stage,
    StreamClosedError,
    open_batch_stream,
    read_checkpoint,
)
from o41_training_data_jax import O41CheckpointHandler, O41JaxIterator, O41Restore, O41Save

# Two CPU devices for this process, so that every batch here is split over devices. It must be
# set before jax starts its backend, which nothing does while tests are being collected.
jax.config.update("jax_num_cpu_devices", 2)


SCRIPT = Path(__file__).parent / "jax_train.py"
PREFETCH_THREAD = "o41-jax-prefetch"


@pytest.fixture
def config(shard: ShardWriter) -> BatchStreamConfig:
    a = shard("parquet", [{"v": i, "m": [i % 2 == 0] * 3} for i in range(120)])
    b = shard("jsonl.gz", [{"v": 1000 + i, "m": [True, False, True]} for i in range(50)])
    c = shard("jsonl", [{"v": 5000 + i, "m": [False] * 3} for i in range(80)])
    return BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i32"), ProjectedField("m", "m", "bool", length=3)],
        stages=[
            Stage(
                sources=[FileSource(files=[a], weight=2.0), FileSource(files=[b])],
                batch_size=4,
                shuffle=Shuffle(buffer_rows=24, unit_rows=2),
                infinite=True,
            ),
            Stage(
                sources=[FileSource(files=[c])], batch_size=4, shuffle=Shuffle(buffer_rows=16), infinite=True
            ),
        ],
        seed=5,
        threads=1,
    )


@pytest.fixture
def sharding() -> NamedSharding:
    return NamedSharding(jax.make_mesh((2,), ("data",)), P("data"))


def core_batches(config: BatchStreamConfig, count: int, advance_at: int | None = None) -> list[list[int]]:
    """The core stream's batches (``v`` per row), switching to stage 1 at global batch ``advance_at``."""
    out = []
    with open_batch_stream(config) as stream:
        if advance_at is not None:
            stream.advance(1, at=advance_at)
        for batch in stream:
            out.append(batch.arrays()["v"].tolist())
            if len(out) == count:
                break
    return out


def values(iterator: Iterator[dict[str, jax.Array]], count: int) -> list[list[int]]:
    out = []
    for batch in iterator:
        out.append(np.asarray(batch["v"]).tolist())
        if len(out) == count:
            break
    return out


def wait_for(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def prefetch_threads() -> int:
    return sum(t.name == PREFETCH_THREAD and t.is_alive() for t in threading.enumerate())


def taken_from_engine(iterator: O41JaxIterator) -> int:
    # How far the engine ran ahead is not public state; the test reads it to check the bound.
    return int(iterator._pipeline.stream.stats.batches_yielded)


# -- batches -------------------------------------------------------------------------------


def test_batches_are_global_arrays_split_over_the_devices(
    config: BatchStreamConfig, sharding: NamedSharding
) -> None:
    with O41JaxIterator(config, sharding) as iterator:
        batch = next(iterator)
    assert set(batch) == {"v", "m"}
    assert batch["v"].dtype == np.int32
    assert batch["v"].shape == (4,)
    assert batch["m"].dtype == np.bool_
    assert batch["m"].shape == (4, 3)
    assert batch["v"].sharding == sharding
    shards = sorted((s.index[0].start, s.device.id) for s in batch["v"].addressable_shards)
    assert shards == [(0, 0), (2, 1)]  # rows 0-1 on the first device, 2-3 on the second
    with O41JaxIterator(config, sharding, bool_as="uint8") as iterator:
        assert next(iterator)["m"].dtype == np.uint8
    assert [np.asarray(batch["v"]).tolist()] == core_batches(config, 1)


def test_cpu_devices_view_the_engines_memory(config: BatchStreamConfig, sharding: NamedSharding) -> None:
    # docs/jax.md: on CPU devices a batch is not copied, because the engine's columns are aligned.
    with open_batch_stream(config) as stream:
        host = next(stream).arrays()["v"]
        on_devices = jax.device_put(host, sharding)
        first = min(on_devices.addressable_shards, key=lambda s: s.index[0].start or 0)
        assert first.data.unsafe_buffer_pointer() == host.ctypes.data


@pytest.mark.parametrize("prefetch", [0, 1, 2, 5])
def test_prefetch_keeps_the_core_order(
    config: BatchStreamConfig, sharding: NamedSharding, prefetch: int
) -> None:
    with O41JaxIterator(config, sharding, prefetch=prefetch) as iterator:
        assert values(iterator, 40) == core_batches(config, 40)


@pytest.mark.parametrize("handed_out", [0, 1, 3])
def test_the_state_is_that_of_the_last_batch_handed_out(
    config: BatchStreamConfig, sharding: NamedSharding, handed_out: int
) -> None:
    with open_batch_stream(config) as stream:
        expected = stream.checkpoint()
        for _ in range(handed_out):
            expected = next(stream).checkpoint()
    with O41JaxIterator(config, sharding, prefetch=2) as iterator:
        iterator.start_prefetch()
        for _ in range(handed_out):
            next(iterator)
        # The thread fills its two slots and stops there: two batches ahead, never more.
        wait_for(lambda: taken_from_engine(iterator) == handed_out + 2)
        time.sleep(0.2)
        assert taken_from_engine(iterator) == handed_out + 2
        assert Checkpoint.from_json(iterator.get_state().decode()) == expected
        assert iterator.checkpoint() == expected
        assert iterator.position == expected.position


def test_the_state_resumes_exactly(config: BatchStreamConfig, sharding: NamedSharding) -> None:
    with O41JaxIterator(config, sharding) as iterator:
        values(iterator, 7)
        state = iterator.get_state()
        rest = values(iterator, 10)
    with O41JaxIterator(config, sharding) as restored:
        values(restored, 3)
        restored.set_state(state)
        restored.start_prefetch()
        assert values(restored, 10) == rest
    with O41JaxIterator(Checkpoint.from_json(state.decode()), sharding) as resumed:
        assert values(resumed, 10) == rest


def test_the_state_resumes_over_shards_copied_without_their_times(
    config: BatchStreamConfig, sharding: NamedSharding
) -> None:
    with O41JaxIterator(config, sharding) as iterator:
        values(iterator, 7)
        state = iterator.get_state()
        rest = values(iterator, 10)
    for stage in config.stages:
        for source in stage.sources:
            for path in source.files:
                copy_without_times(path)
    with O41JaxIterator(Checkpoint.from_json(state.decode()), sharding) as resumed:
        assert values(resumed, 10) == rest


def test_set_state_refuses_what_is_not_this_streams_state(
    config: BatchStreamConfig, sharding: NamedSharding
) -> None:
    other = dataclasses.replace(config, seed=6)
    with O41JaxIterator(other, sharding) as iterator:
        other_state = iterator.get_state()
    with open_batch_stream(dataclasses.replace(config, rank=1, world_size=2)) as stream:
        rank_state = stream.checkpoint().to_json().encode()
    with O41JaxIterator(config, sharding) as iterator:
        with pytest.raises(CheckpointError, match="seed is 6 in the checkpoint, 5 in the config"):
            iterator.set_state(other_state)
        with pytest.raises(CheckpointError, match="it belongs to rank 1 of 2, this process is rank 0 of 1"):
            iterator.set_state(rank_state)
        with pytest.raises(CheckpointError, match="not valid JSON"):
            iterator.set_state(b"{")
        with pytest.raises(CheckpointError, match="not UTF-8"):
            iterator.set_state(b"\xff")
        with pytest.raises(CheckpointError, match="expected bytes from get_state"):
            iterator.set_state(other_state.decode())  # type: ignore[arg-type]
        assert values(iterator, 2) == core_batches(config, 2)  # still usable after refusals
    checkpoint = Checkpoint.from_json(iterator.get_state().decode())
    with (
        O41JaxIterator(checkpoint, sharding) as resumed,
        pytest.raises(CheckpointError, match="another stream"),
    ):
        resumed.set_state(other_state)
    with pytest.raises(CheckpointError, match="rank 1 of 2"):
        O41JaxIterator(Checkpoint.from_json(rank_state.decode()), sharding)


def test_invalid_arguments_are_named(config: BatchStreamConfig, sharding: NamedSharding) -> None:
    with pytest.raises(ConfigError, match="invalid sharding: expected a jax.sharding.Sharding"):
        O41JaxIterator(config, P("data"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="invalid prefetch"):
        O41JaxIterator(config, sharding, prefetch=-1)
    with pytest.raises(ConfigError, match="invalid bool_as"):
        O41JaxIterator(config, sharding, bool_as="int")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="invalid training_data"):
        O41JaxIterator(config, sharding, "s3://bucket")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="source: expected a BatchStreamConfig or a Checkpoint"):
        O41JaxIterator("config.json", sharding)  # type: ignore[arg-type]
    with pytest.raises(
        ConfigError,
        match=r"the config says rank 1 of 2, the sharding \(its block of the batch axis\) says rank 0 of 1",
    ):
        O41JaxIterator(dataclasses.replace(config, rank=1, world_size=2), sharding)
    odd = dataclasses.replace(config, stages=[dataclasses.replace(config.stages[1], batch_size=3)])
    with pytest.raises(ConfigError, match="invalid batch_size 3: field 'v'"):
        O41JaxIterator(odd, sharding)


def test_i64_fields_need_64_bit_jax(shard: ShardWriter, sharding: NamedSharding) -> None:
    config = BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i64")],
        stages=[
            Stage(
                sources=[FileSource(files=[shard("jsonl", [{"v": 2**40 + i} for i in range(8)])])],
                batch_size=4,
            )
        ],
        threads=1,
    )
    with pytest.raises(ConfigError, match="invalid field 'v': it is i64, but jax_enable_x64 is off"):
        O41JaxIterator(config, sharding)
    with jax.enable_x64(True):
        iterator = O41JaxIterator(config, sharding)
    # Outside the context, and on the prefetch thread, the iterator keeps the setting it was built with.
    with iterator:
        batch = next(iterator)
    assert batch["v"].dtype == np.int64
    assert np.asarray(batch["v"]).tolist() == [2**40 + i for i in range(4)]


def test_errors_arrive_after_the_batches_before_them(shard: ShardWriter, sharding: NamedSharding) -> None:
    rows: list[dict[str, Any]] = [{"v": i} for i in range(20)]
    rows[10] = {"v": "ten"}
    config = BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i32")],
        stages=[Stage(sources=[FileSource(files=[shard("jsonl", rows)])], batch_size=4)],
        threads=1,
    )
    with O41JaxIterator(config, sharding) as iterator:
        assert values(iterator, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
        for _ in range(2):  # and again: the iterator does not skip past it
            with pytest.raises(ProjectionError, match="ten|row 10"):
                next(iterator)


# -- close -----------------------------------------------------------------------------------


def test_close_stops_the_prefetch_thread(config: BatchStreamConfig, sharding: NamedSharding) -> None:
    before = prefetch_threads()
    iterator = O41JaxIterator(config, sharding, prefetch=3)
    values(iterator, 2)
    wait_for(lambda: taken_from_engine(iterator) == 5)  # the thread now waits for room
    assert prefetch_threads() == before + 1
    state = iterator.get_state()
    iterator.close()
    assert iterator.closed
    assert prefetch_threads() == before
    assert iterator.get_state() == state  # the state of the last batch handed out stays readable
    iterator.close()  # idempotent
    for verb in (lambda: next(iterator), iterator.start_prefetch, lambda: iterator.advance(1)):
        with pytest.raises(StreamClosedError, match="the iterator was closed"):
            verb()
    with O41JaxIterator(config, sharding) as iterator:
        next(iterator)
    assert iterator.closed
    assert prefetch_threads() == before
    dropped = O41JaxIterator(config, sharding)
    next(dropped)
    del dropped
    gc.collect()
    wait_for(lambda: prefetch_threads() == before)  # an iterator dropped without close() stops too


# -- curriculum and validation ---------------------------------------------------------------


@pytest.mark.parametrize("prefetch", [0, 2])
def test_advance_switches_from_the_next_batch(
    config: BatchStreamConfig, sharding: NamedSharding, prefetch: int
) -> None:
    expected = core_batches(config, 12, advance_at=5)
    with O41JaxIterator(config, sharding, prefetch=prefetch) as iterator:
        first = values(iterator, 5)
        if prefetch:
            wait_for(lambda: taken_from_engine(iterator) == 7)  # old-stage batches already transferred
        iterator.advance(1)
        state = iterator.get_state()
        assert Checkpoint.from_json(state.decode()).stage == 1
        iterator.advance(1)  # the same stage: nothing changes
        with pytest.raises(ConfigError, match="there is no stage 2; the stream has 2 stages"):
            iterator.advance(2)
        assert first + values(iterator, 7) == expected
    with O41JaxIterator(config, sharding) as resumed:
        resumed.set_state(state)  # a state taken right after advance resumes in the new stage
        assert values(resumed, 7) == expected[5:]


def test_a_validation_split_ends_after_whole_batches(shard: ShardWriter, sharding: NamedSharding) -> None:
    split = shard("jsonl", [{"v": 9000 + i} for i in range(27)])
    config = BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i32")],
        stages=[Stage(sources=[FileSource(files=[split])], batch_size=4)],
        threads=1,
    )
    with O41JaxIterator(config, sharding) as validation:
        seen = values(validation, 100)
        with pytest.raises(StopIteration):
            next(validation)  # it stays ended
    assert seen == core_batches(config, 100)
    assert len(seen) == 6  # 27 rows: six whole batches, the last 3 rows dropped


def test_a_validation_pass_pads_the_last_batch_and_passes_the_mask(
    shard: ShardWriter, sharding: NamedSharding
) -> None:
    split = shard("jsonl", [{"v": 9000 + i} for i in range(27)])
    config = BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i32")],
        stages=[Stage(sources=[FileSource(files=[split])], batch_size=4)],
        threads=1,
        validation_pass=True,
    )
    with O41JaxIterator(config, sharding) as validation:
        batches = list(validation)
    assert len(batches) == 7  # 27 rows: the seventh batch holds 3 rows and one padding row
    assert all(b["valid"].dtype == np.bool_ and b["valid"].sharding == sharding for b in batches)
    v = np.concatenate([np.asarray(b["v"]) for b in batches])
    valid = np.concatenate([np.asarray(b["valid"]) for b in batches])
    assert v[valid].tolist() == list(range(9000, 9027))
    assert valid.tolist() == [True] * 27 + [False]
    assert v[~valid].tolist() == [0]


def test_a_ramp_gives_each_step_its_own_global_shape(shard: ShardWriter, sharding: NamedSharding) -> None:
    rows = shard("parquet", [{"v": i} for i in range(200)])
    config = BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i32")],
        stages=[Stage(sources=[FileSource(files=[rows])], batch_size=8, ramp=Ramp(2, 2, 12), infinite=True)],
        threads=1,
    )
    with O41JaxIterator(config, sharding) as iterator:
        shapes, seen = [], []
        for batch in iterator:
            assert batch["v"].sharding == sharding
            shapes.append(batch["v"].shape[0])
            seen.append(np.asarray(batch["v"]).tolist())
            if len(seen) == 8:
                break
    # Three ramp steps of ceil(12 / (3 * size)) batches each (2, 1, 1), then the full batch.
    assert shapes == [2, 2, 4, 6, 8, 8, 8, 8]
    assert seen == core_batches(config, 8)
    # A ramp size the devices cannot split is refused before anything is read.
    odd = dataclasses.replace(
        config,
        stages=[Stage(sources=[FileSource(files=[rows])], batch_size=7, ramp=Ramp(1, 2, 12), infinite=True)],
    )
    with pytest.raises(ConfigError, match="invalid batch_size 1"):
        O41JaxIterator(odd, sharding)


def test_the_sharding_decides_the_rank_not_the_launchers_variables(
    config: BatchStreamConfig, sharding: NamedSharding, monkeypatch: pytest.MonkeyPatch
) -> None:
    # JAX places rows by the mesh: a process's rank is its block of the batch axis, which a
    # launcher's RANK/WORLD_SIZE do not change (docs/rules.md, "Ranks"). One process here.
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with O41JaxIterator(config, sharding) as iterator:
        assert (iterator.rank, iterator.world_size) == (0, 1)
        assert values(iterator, 4) == core_batches(config, 4)


# -- Orbax and grain -------------------------------------------------------------------------


def save_and_restore(
    config: BatchStreamConfig, sharding: NamedSharding, directory: Path, save: Any, restore: Any
) -> None:
    """Saves model state and the iterator after 6 batches, restores both into fresh objects."""
    params = {"w": jax.device_put(np.arange(4, dtype=np.float32), NamedSharding(sharding.mesh, P()))}
    with O41JaxIterator(config, sharding) as iterator:
        values(iterator, 6)
        with ocp.CheckpointManager(directory) as manager:
            manager.save(6, args=ocp.args.Composite(state=ocp.args.StandardSave(params), data=save(iterator)))
            manager.wait_until_finished()
        rest = values(iterator, 8)
    with O41JaxIterator(config, sharding) as fresh, ocp.CheckpointManager(directory) as manager:
        abstract = {"w": jax.ShapeDtypeStruct((4,), np.float32, sharding=params["w"].sharding)}
        restored = manager.restore(
            manager.latest_step(),
            args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), data=restore(fresh)),
        )
        assert restored["data"] is fresh
        assert np.asarray(restored["state"]["w"]).tolist() == [0.0, 1.0, 2.0, 3.0]
        assert values(fresh, 8) == rest
    state_file = directory / "6" / "data" / "process_0-of-1.json"
    assert read_checkpoint(state_file).batches_yielded == 6  # the split form, or grain's whole one


@pytest.mark.parametrize(
    ("save", "restore"),
    [
        (O41Save, O41Restore),
        (grain.checkpoint.CheckpointSave, grain.checkpoint.CheckpointRestore),
        (grain.checkpoint.CheckpointSave, O41Restore),
        (O41Save, grain.checkpoint.CheckpointRestore),
    ],
    ids=["ours", "grain", "grain-then-ours", "ours-then-grain"],
)
def test_orbax_checkpoints_resume_exactly(
    config: BatchStreamConfig, sharding: NamedSharding, tmp_path: Path, save: Any, restore: Any
) -> None:
    save_and_restore(config, sharding, tmp_path / "checkpoints", save, restore)


def write_world(config: BatchStreamConfig, directory: Path, local_batches: list[int]) -> None:
    """The state files processes 0..W-1 of a W-process job would write after those batches."""
    directory.mkdir(parents=True)
    world = len(local_batches)
    for rank, count in enumerate(local_batches):
        with open_batch_stream(dataclasses.replace(config, rank=rank, world_size=world)) as stream:
            for _ in range(count):
                next(stream)
            text = stream.checkpoint().to_json()
        (directory / f"process_{rank}-of-{world}.json").write_text(text)


def test_the_handler_restores_onto_another_number_of_processes(
    config: BatchStreamConfig, sharding: NamedSharding, tmp_path: Path
) -> None:
    write_world(config, tmp_path / "data", [4, 4, 4])
    with O41JaxIterator(config, sharding) as iterator:
        O41CheckpointHandler().restore(epath.Path(tmp_path / "data"), args=O41Restore(iterator))
        assert iterator.world_size == 1
        # Three processes stopped after 4 local batches each: global batch 12 comes next.
        assert values(iterator, 6) == core_batches(config, 18)[12:]


def test_the_handler_refuses_an_inexact_move(
    config: BatchStreamConfig, sharding: NamedSharding, tmp_path: Path
) -> None:
    write_world(config, tmp_path / "uneven", [4, 3])
    write_world(config, tmp_path / "missing", [4, 4])
    (tmp_path / "missing" / "process_1-of-2.json").unlink()
    write_world(config, tmp_path / "mixed", [4, 4])
    (tmp_path / "mixed" / "process_0-of-1.json").write_text(
        (tmp_path / "mixed" / "process_0-of-2.json").read_text()
    )
    write_world(dataclasses.replace(config, seed=9), tmp_path / "streams", [4, 4])
    (tmp_path / "streams" / "process_1-of-2.json").unlink()
    write_world(config, tmp_path / "ours", [4, 4])
    (tmp_path / "streams" / "process_1-of-2.json").write_text(
        (tmp_path / "ours" / "process_1-of-2.json").read_text()
    )
    for shared in (tmp_path / "ours").glob("resolved-*.json"):  # the split form's document with it
        (tmp_path / "streams" / shared.name).write_text(shared.read_text())
    write_world(config, tmp_path / "misnamed", [4])  # a world of 1's file under a world of 2's name
    (tmp_path / "misnamed" / "process_0-of-1.json").rename(tmp_path / "misnamed" / "process_0-of-2.json")
    write_world(config, tmp_path / "misnamed-1", [4, 4])
    (tmp_path / "misnamed-1" / "process_1-of-2.json").rename(tmp_path / "misnamed" / "process_1-of-2.json")
    (tmp_path / "empty").mkdir()
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "process_0-of-1.json").write_text("{")
    cases = {
        "uneven": r"process_0-of-2.json at global batch 8 \(stage 0\), process_1-of-2.json at global batch 6",
        "missing": "lacks process_1-of-2.json",
        "mixed": "mixes per-rank files of 1, 2 ranks",
        "streams": "belong to different streams",
        "misnamed": r"misnamed/process_0-of-2.json: it holds rank 0 of 1, not the one its name says",
        "empty": r"no per-rank checkpoint file \(stream-rank<r>-of-<n>.json or process_<i>-of-<n>.json\)",
        "corrupt": "checkpoint refused: .*corrupt/process_0-of-1.json: not valid JSON",
    }
    with O41JaxIterator(config, sharding) as iterator:
        for name, message in cases.items():
            with pytest.raises(CheckpointError, match=message):
                O41CheckpointHandler().restore(epath.Path(tmp_path / name), args=O41Restore(iterator))
        assert values(iterator, 3) == core_batches(config, 3)  # untouched by the refusals


def test_the_handler_refuses_processes_at_one_global_batch_in_different_segments(
    config: BatchStreamConfig, sharding: NamedSharding, tmp_path: Path
) -> None:
    # Both processes come to global batch 6, but process 1 switched to stage 1 on the way: moving
    # either position onto another world would deliver one of the two segments' batches wrongly.
    directory = tmp_path / "segments"
    directory.mkdir()
    for rank, switch_after in [(0, None), (1, 1)]:
        with open_batch_stream(dataclasses.replace(config, rank=rank, world_size=2)) as stream:
            for k in range(3):
                if k == switch_after:
                    stream.advance(1)
                next(stream)
            checkpoint = stream.checkpoint()
        assert (checkpoint.next_batch, checkpoint.stage) == (6, rank)
        (directory / f"process_{rank}-of-2.json").write_text(checkpoint.to_json())
    with O41JaxIterator(config, sharding) as iterator:
        with pytest.raises(
            CheckpointError,
            match=r"process_0-of-2.json at global batch 6 \(stage 0\), process_1-of-2.json at global batch 6 "
            r"\(stage 1\)",
        ):
            O41CheckpointHandler().restore(epath.Path(directory), args=O41Restore(iterator))
        assert values(iterator, 3) == core_batches(config, 3)  # untouched by the refusal


def test_the_orbax_names_say_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import o41_training_data_jax

    monkeypatch.delitem(sys.modules, "o41_training_data_jax._orbax")
    monkeypatch.delattr(o41_training_data_jax, "_orbax")
    monkeypatch.setitem(sys.modules, "orbax.checkpoint", None)  # as if orbax-checkpoint were missing
    with pytest.raises(ImportError, match=r"pip install 'o41-training-data-jax\[orbax\]'"):
        o41_training_data_jax.O41Save  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'O41Loader'"):
        o41_training_data_jax.O41Loader  # noqa: B018


# -- a real two-process job ----------------------------------------------------------------


def write_corpus(directory: Path) -> None:
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    def record(i: int) -> dict[str, Any]:
        n = i % 9
        return {
            "tokens": [(i * 7 + j) % 50 for j in range(n)],
            "mask": [j % 3 != 0 for j in range(n)],
            "id": i,
        }

    directory.mkdir()
    for k in range(2):
        rows = [record(i) for i in range(k * 100, k * 100 + 100)]
        pq.write_table(pa.Table.from_pylist(rows), directory / f"a-{k}.parquet")
    with gzip.open(directory / "b.jsonl.gz", "wt") as out:
        out.writelines(json.dumps(record(1000 + i)) + "\n" for i in range(80))
    (directory / "c.jsonl").write_text("".join(json.dumps(record(5000 + i)) + "\n" for i in range(120)))
    (directory / "val.jsonl").write_text("".join(json.dumps(record(9000 + i)) + "\n" for i in range(27)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(
    data: Path, out: Path, checkpoints: Path, steps: int, processes: int = 2, *extra: str
) -> list[int]:
    """Runs the training script on ``processes`` processes; returns their exit codes."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    command = [sys.executable, str(SCRIPT), "--data", str(data), "--out", str(out)]
    command += ["--checkpoints", str(checkpoints), "--steps", str(steps), *extra]
    if processes > 1:
        command += ["--coordinator", f"127.0.0.1:{free_port()}", "--processes", str(processes)]
    jobs = [
        subprocess.Popen(
            [*command, "--process-id", str(i)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(processes)
    ]
    outputs = []
    try:
        for job in jobs:
            outputs.append(job.communicate(timeout=240)[0])
    finally:
        for job in jobs:
            job.kill()
            job.wait()
    codes = [job.returncode for job in jobs]
    if any(code not in (0, -9) for code in codes):
        raise AssertionError(f"exit codes {codes}:\n" + "\n".join(o[-3000:] for o in outputs))
    return codes


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def digest(arrays: dict[str, np.ndarray]) -> str:
    return hashlib.sha256(b"".join(arrays[k].tobytes() for k in sorted(arrays))).hexdigest()[:16]


def reference_steps(
    config: BatchStreamConfig, world: int, first: int, count: int, advance_at: int | None = None
) -> list:
    """(ids, digest) of the JAX steps of ``world`` processes over core batches ``first..``: each
    step is ``world`` core batches."""
    with open_batch_stream(config) as stream:
        if advance_at is not None:
            stream.advance(1, at=advance_at)
        core = [
            {k: np.asarray(v) for k, v in b.arrays().items()}
            for b in (next(stream) for _ in range(first + count))
        ]
    steps = []
    for step in range(first, first + count, world):
        parts = core[step : step + world]
        rows = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        rows["mask"] = rows["mask"].view(np.bool_)
        steps.append((rows["id"].tolist(), digest(rows)))
    return steps


def test_two_processes_checkpoint_restart_and_match_an_uninterrupted_run(tmp_path: Path) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    write_corpus(data)
    config = train_config(data)
    switch = ADVANCE_AFTER * 2  # the core global batch of the first step after advance, 2 processes

    # An uninterrupted run of 12 steps (and the layout checks), then a run killed after step 7
    # whose last checkpoint is step 6, restarted from it on the same two processes.
    for directory in (out, out / "straight", out / "crash"):
        directory.mkdir()
    launch(data, out / "straight", tmp_path / "ck-straight", 12, 2, "--check-layouts")
    assert launch(data, out / "crash", tmp_path / "ck", 12, 2, "--die-at", "7") == [-9, -9]
    launch(data, out / "crash", tmp_path / "ck", 12, 2)
    straight = [read_log(out / "straight" / f"log-2-{i}.jsonl") for i in range(2)]
    crashed = [read_log(out / "crash" / f"log-2-{i}.jsonl") for i in range(2)]
    layouts = [log.pop(0)["layouts"] for log in straight]
    restarts = []
    for process, log in enumerate(crashed):
        restarts.append(next(i for i, r in enumerate(log) if "restored" in r))
        assert log.pop(restarts[-1]) == {"restored": 6, "rank": process, "world": 2}
    # Every process saw the same global batches.
    assert straight[0] == straight[1]
    assert crashed[0] == crashed[1]

    steps = [r for r in straight[0] if "step" in r]
    expected = reference_steps(config, 2, 0, 24, switch)
    assert [(r["ids"], r["batch"]) for r in steps] == expected  # global batches in the core's order
    assert all(r["shape"] == [2 * BATCH, 8] for r in steps)
    for process, layout in enumerate(layouts):
        # On a mesh that lists the processes the other way round, ranks follow the rows' blocks.
        assert layout["reversed"] == {"rank": 1 - process, "world": 2, "ids": expected[0][0]}
        # The batch axis within each process: both hold every row, and both read the same rows.
        assert layout["replicated"] == {"rank": 0, "world": 1, "ids": expected[0][0][:BATCH]}
        assert "process 0 holds rows 0:1, 2:3 of the batch axis" in layout["interleaved"]
    validation = next(r["validation"] for r in straight[0] if "validation" in r)
    val = reference_steps(validation_config(data), 2, 0, 6)
    assert validation == [ids for ids, _ in val]  # 27 rows: three whole rounds on each process

    before, after = crashed[0][: restarts[0]], crashed[0][restarts[0] :]
    assert [r["step"] for r in before if "step" in r] == list(range(1, 8))
    assert after == [r for r in straight[0] if r.get("step", 0) > 6]  # batches and model state

    # The same checkpoint directory (last saved at step 12) on one process: the elastic move.
    launch(data, out / "crash", tmp_path / "ck", 20, 1)
    elastic = read_log(out / "crash" / "log-1-0.jsonl")
    assert elastic[0] == {"restored": 12, "rank": 0, "world": 1}
    ones = [(r["ids"], r["batch"]) for r in elastic[1:]]
    assert ones == reference_steps(config, 1, 24, 8, switch)
