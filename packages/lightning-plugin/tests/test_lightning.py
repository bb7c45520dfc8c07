"""The Lightning plugin: exact resume on every rank, stream checkpoints beside model checkpoints,
curricula, and a real DDP job killed and restarted."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.strategies import SingleDeviceStrategy
from o41_testkit import copy_without_times, write_shard
from o41_training_data import (
    BatchStream,
    BatchStreamConfig,
    Checkpoint,
    CheckpointError,
    ConfigError,
    FileSource,
    Position,
    ProjectedField,
    Ramp,
    Shuffle,
    Stage,
    open_batch_stream,
    rank_file_name,
    read_checkpoint,
    resume_batch_stream,
)
from o41_training_data_lightning import (
    FORMAT,
    INDEX_FILE,
    STATE_VERSION,
    O41Curriculum,
    O41DataModule,
    SidecarCheckpointIO,
    rank_file,
    sidecar_directory,
)
from torch.utils.data import DataLoader

# Lightning warns whenever a run resumes into the directory its checkpoints are in: the point here.
RESUMING = pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty:UserWarning")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    directory = tmp_path / "data"
    directory.mkdir()
    write_shard(directory / "a.parquet", "parquet", [{"x": [i, i + 1, i + 2, i + 3]} for i in range(300)])
    write_shard(directory / "b.jsonl", "jsonl", [{"x": [1000 + i] * 4} for i in range(200)])
    return directory


def make_config(data: Path, *, infinite: bool = True, seed: int = 1) -> BatchStreamConfig:
    return BatchStreamConfig(
        fields=[ProjectedField("x", "x", "f32", length=4), ProjectedField("id", "@row_id", "i64")],
        stages=[
            Stage(
                sources=[FileSource(files=[str(data / "a.parquet")])],
                batch_size=4,
                shuffle=Shuffle(buffer_rows=32),
                infinite=infinite,
            ),
            Stage(sources=[FileSource(files=[str(data / "b.jsonl")])], batch_size=4, infinite=infinite),
        ],
        seed=seed,
        threads=1,
    )


def make_val_config(data: Path) -> BatchStreamConfig:
    return BatchStreamConfig(
        fields=[ProjectedField("x", "x", "f32", length=4), ProjectedField("id", "@row_id", "i64")],
        stages=[Stage(sources=[FileSource(files=[str(data / "b.jsonl")])], batch_size=64)],
        threads=1,
    )


def shared_name_of(checkpoint: Checkpoint) -> str:
    """The split form's resolved document name of ``checkpoint``'s stream."""
    return checkpoint.to_split()[1]


def digest(x: torch.Tensor, ids: torch.Tensor) -> str:
    return hashlib.sha256(x.numpy().tobytes() + ids.numpy().tobytes()).hexdigest()[:12]


class Recorder(LightningModule):
    """Records (global step, batch index, stage, fingerprint) of every batch a step trains on."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.trained: list[tuple[int, int, int, str]] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.trained.append(
            (self.global_step, batch["batch_index"], batch["stage"], digest(batch["x"], batch["id"]))
        )
        return self.layer(batch["x"]).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Validating(Recorder):
    """Also counts the batches of each validation run."""

    def __init__(self) -> None:
        super().__init__()
        self.validated: list[int] = []

    def on_validation_epoch_start(self) -> None:
        self.validated.append(0)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.validated[-1] += 1
        return self.layer(batch["x"]).mean()


def fit(
    datamodule: O41DataModule,
    root: Path,
    max_steps: int,
    *,
    model: Recorder | None = None,
    callbacks: list[Any] | None = None,
    ckpt_path: Any = None,
    **trainer_options: Any,
) -> Recorder:
    model = model if model is not None else Recorder()
    options: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
    }
    trainer = Trainer(
        max_steps=max_steps,
        default_root_dir=root,
        callbacks=callbacks or [],
        **{**options, **trainer_options},
    )
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return model


def checkpoints(directory: Path, every: int = 4, **options: Any) -> ModelCheckpoint:
    return ModelCheckpoint(dirpath=directory, every_n_train_steps=every, save_top_k=-1, **options)


def core_digests(checkpoint: Checkpoint, count: int) -> list[str]:
    with resume_batch_stream(checkpoint) as stream:
        return [
            digest(torch.from_numpy(b.arrays()["x"]), torch.from_numpy(b.arrays()["id"]))
            for b in (next(stream) for _ in range(count))
        ]


# -- Resume on one device: the same restore path as on every rank of a DDP job.


@RESUMING
@pytest.mark.parametrize("workers", [0, 2])
def test_a_mid_epoch_resume_trains_on_exactly_the_batches_of_an_uninterrupted_run(
    data: Path, tmp_path: Path, workers: int
) -> None:
    def datamodule() -> O41DataModule:
        return O41DataModule(make_config(data), val_config=make_val_config(data), num_workers=workers)

    straight = fit(
        datamodule(),
        tmp_path / "s",
        12,
        model=Validating(),
        callbacks=[checkpoints(tmp_path / "s")],
        val_check_interval=5,
    )
    assert isinstance(straight, Validating)
    assert [step for step, *_ in straight.trained] == list(range(12))
    assert straight.validated == [3, 3]  # each validation run reads the whole stream: 3 batches of 64

    options = {"callbacks": [checkpoints(tmp_path / "r")], "val_check_interval": 5}
    fit(datamodule(), tmp_path / "r", 6, model=Validating(), **options)
    saved = tmp_path / "r" / "epoch=0-step=4.ckpt"
    options["callbacks"] = [checkpoints(tmp_path / "r")]
    resumed = fit(datamodule(), tmp_path / "r", 12, model=Validating(), ckpt_path=saved, **options)
    assert resumed.trained == straight.trained[4:]

    # Lightning's own loader state (rank 0's, given to every rank) holds no position to fight over.
    state = torch.load(saved, weights_only=True)
    assert state["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [
        {"format": FORMAT, "version": STATE_VERSION, "positions": "in the O41DataModule state"}
    ]
    entry = state["O41DataModule"]
    assert (entry["format"], entry["version"], entry["world_size"]) == (FORMAT, STATE_VERSION, 1)
    assert Position.from_json(entry["ranks"][0]["position"]).batches_yielded == 4  # consumed, not fetched


@RESUMING
def test_a_resume_over_shards_copied_without_their_times_trains_on_the_same_batches(
    data: Path, tmp_path: Path
) -> None:
    straight = fit(O41DataModule(make_config(data)), tmp_path / "s", 10)
    fit(O41DataModule(make_config(data)), tmp_path / "r", 6, callbacks=[checkpoints(tmp_path / "r")])
    for path in data.iterdir():
        copy_without_times(path)
    options = {"callbacks": [checkpoints(tmp_path / "r")]}
    saved = tmp_path / "r" / "epoch=0-step=4.ckpt"
    resumed = fit(O41DataModule(make_config(data)), tmp_path / "r", 10, ckpt_path=saved, **options)
    assert resumed.trained == straight.trained[4:]


class Scoring(Recorder):
    """Records the size of every training batch and the rows each validation run scored."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []
        self.scored: list[list[int]] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.sizes.append(len(batch["x"]))
        return super().training_step(batch, batch_idx)

    def on_validation_epoch_start(self) -> None:
        self.scored.append([])

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        valid = batch["valid"]
        assert valid.dtype == torch.bool
        self.scored[-1].extend(batch["id"][valid].tolist())
        return self.layer(batch["x"][valid]).mean()


@RESUMING
def test_a_ramp_trains_on_growing_batches_resumes_mid_ramp_and_validation_scores_every_row(
    data: Path, tmp_path: Path
) -> None:
    config = dataclasses.replace(
        make_config(data),
        stages=[dataclasses.replace(make_config(data).stages[0], batch_size=8, ramp=Ramp(2, 2, 12))],
    )
    val_config = dataclasses.replace(make_val_config(data), validation_pass=True)

    def datamodule() -> O41DataModule:
        return O41DataModule(config, val_config=val_config)

    options = {"callbacks": [checkpoints(tmp_path / "s", every=2)], "val_check_interval": 5}
    straight = fit(datamodule(), tmp_path / "s", 8, model=Scoring(), **options)
    assert isinstance(straight, Scoring)
    assert straight.sizes == [2, 2, 4, 6, 8, 8, 8, 8]  # ramp steps of ceil(12 / (3 * size)) batches
    # 200 rows in batches of 64: the fourth batch is padded (8 rows of data), not dropped.
    assert [sorted(ids) for ids in straight.scored] == [list(range(200))]

    options["callbacks"] = [checkpoints(tmp_path / "s", every=2)]
    resumed = fit(
        datamodule(),
        tmp_path / "s",
        8,
        model=Scoring(),
        ckpt_path=tmp_path / "s" / "epoch=0-step=2.ckpt",
        **options,
    )
    assert isinstance(resumed, Scoring)
    assert resumed.sizes == straight.sizes[2:]
    assert resumed.trained == straight.trained[2:]


@RESUMING
def test_a_curriculum_switch_resumes_exactly_from_every_checkpoint_around_it(
    data: Path, tmp_path: Path
) -> None:
    def run(max_steps: int, ckpt_path: Path | None = None) -> Recorder:
        callbacks = [checkpoints(tmp_path / "ck", every=1), O41Curriculum({5: 1})]
        return fit(
            O41DataModule(make_config(data)), tmp_path, max_steps, callbacks=callbacks, ckpt_path=ckpt_path
        )

    straight = run(10)
    # Requested when step 5 starts; the batch fetched ahead is still stage 0, the next one is not.
    assert [stage for _, _, stage, _ in straight.trained] == [0] * 7 + [1] * 3
    switches = {
        step: Position.from_json(
            torch.load(tmp_path / "ck" / f"epoch=0-step={step}.ckpt", weights_only=True)["O41DataModule"][
                "ranks"
            ][0]["position"]
        ).switches
        for step in (5, 6, 7, 8)
    }
    # Not requested yet; pending one batch ahead; due right at the resume; reached. The switch is
    # the position's own, at the global batch the new stage starts (docs/checkpoint.md).
    assert switches == {5: [], 6: [(1, 7)], 7: [(1, 7)], 8: []}
    for step in (5, 6, 7, 8):
        resumed = run(10, tmp_path / "ck" / f"epoch=0-step={step}.ckpt")
        assert resumed.trained == straight.trained[step:], step
    # A state of version 1 kept the switch beside the position, counted in the rank's batches.
    saved = torch.load(tmp_path / "ck" / "epoch=0-step=6.ckpt", weights_only=True)
    entry = saved["O41DataModule"]
    position = json.loads(entry["ranks"][0]["position"])
    del position["switches"]
    entry["version"] = 1
    entry["ranks"] = [{"position": json.dumps(position), "switches": [[1, 7]]}]
    torch.save(saved, tmp_path / "version1.ckpt")
    assert run(10, tmp_path / "version1.ckpt").trained == straight.trained[6:]


@RESUMING
def test_a_partitioned_stream_resumes_exactly_and_switches_where_the_core_does(
    data: Path, tmp_path: Path
) -> None:
    # docs/order.md, "Partitions": the module reads a partitioned stream and resumes it from any
    # checkpoint; a curriculum switch lands where the core's stream puts it.
    base = make_config(data)
    shuffled = [
        dataclasses.replace(stage, shuffle=Shuffle(buffer_rows=8, unit_rows=2)) for stage in base.stages
    ]
    config = dataclasses.replace(base, stages=shuffled, partitions=4)

    def run(max_steps: int, ckpt_path: Path | None = None) -> Recorder:
        callbacks = [checkpoints(tmp_path / "ck", every=1), O41Curriculum({4: 1})]
        return fit(O41DataModule(config), tmp_path, max_steps, callbacks=callbacks, ckpt_path=ckpt_path)

    straight = run(12)
    with open_batch_stream(config) as stream:
        # Requested at step 4 after batch 5 went out: at global batch 6, which the engine moves
        # to 8, the first batch a multiple of partitions=4 after the stage began.
        stream.advance(1, at=6)
        core = [
            (b.stage, digest(torch.from_numpy(b.arrays()["x"]), torch.from_numpy(b.arrays()["id"])))
            for b, _ in zip(stream, range(12), strict=False)
        ]
    assert [stage for stage, _ in core] == [0] * 8 + [1] * 4
    assert [(stage, digest_) for _, _, stage, digest_ in straight.trained] == core
    for step in (3, 5, 7, 9):
        resumed = run(12, tmp_path / "ck" / f"epoch=0-step={step}.ckpt")
        assert resumed.trained == straight.trained[step:], step


@RESUMING
@pytest.mark.parametrize("workers", [0, 2])
def test_a_switch_opens_no_extra_stream_and_a_resume_switches_at_the_same_global_batch(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    opened: list[int] = []
    real_init = BatchStream.__init__

    def counting_init(self: BatchStream, *args: Any, **kwargs: Any) -> None:
        opened.append(os.getpid())
        real_init(self, *args, **kwargs)

    # Streams opened in this process: the datamodule's own and, without workers, the passes'.
    monkeypatch.setattr(BatchStream, "__init__", counting_init)

    def run(max_steps: int, ckpt_path: Path | None = None) -> Recorder:
        callbacks = [checkpoints(tmp_path / "ck", every=1), O41Curriculum({5: 1})]
        datamodule = O41DataModule(make_config(data), num_workers=workers)
        return fit(datamodule, tmp_path, max_steps, callbacks=callbacks, ckpt_path=ckpt_path)

    straight = run(10)
    # One stream per pass (none in this process with workers): the first pass, then the one
    # the switch starts, whose dataset switches its stream through the core's SwitchPoint.
    assert len(opened) == (2 if workers == 0 else 0)
    first = next(index for _, index, stage, _ in straight.trained if stage == 1)
    assert [stage for *_, stage, _ in straight.trained] == [0] * 7 + [1] * 3
    # Steps 6 and 7's checkpoints hold the request, not yet in effect: a resume switches at the
    # same global batch in one stream, which applies the position's pending switch itself.
    for step, passes in ((6, 1), (7, 1)):
        opened.clear()
        resumed = run(10, tmp_path / "ck" / f"epoch=0-step={step}.ckpt")
        assert resumed.trained == straight.trained[step:]
        assert next(index for _, index, stage, _ in resumed.trained if stage == 1) == first
        assert len(opened) == (passes if workers == 0 else 0)


def test_advance_before_fit_starts_the_run_in_that_stage(data: Path, tmp_path: Path) -> None:
    datamodule = O41DataModule(make_config(data))
    datamodule.advance(1)
    datamodule.advance(1)  # the stage already requested: nothing more
    model = fit(datamodule, tmp_path, 3)
    assert [stage for _, _, stage, _ in model.trained] == [1, 1, 1]
    checkpoint = datamodule.checkpoint()
    assert checkpoint is not None
    assert checkpoint.stage == 1
    assert checkpoint.batches_yielded == 3
    with pytest.raises(ConfigError, match="invalid stage: there is no stage 2; the stream has 2 stages"):
        datamodule.advance(2)


@RESUMING
def test_epochs_of_an_infinite_stream_continue_where_the_last_one_stopped(data: Path, tmp_path: Path) -> None:
    def run(max_steps: int, ckpt_path: Path | None = None) -> Recorder:
        callbacks = [checkpoints(tmp_path / "ck", every=2)]
        datamodule = O41DataModule(make_config(data))
        return fit(
            datamodule, tmp_path, max_steps, callbacks=callbacks, ckpt_path=ckpt_path, limit_train_batches=3
        )

    straight = run(9)
    # The batch Lightning fetched ahead when an epoch was cut short is the next epoch's first.
    assert [index for _, index, _, _ in straight.trained] == list(range(9))
    # A mid-epoch resume with a finite epoch length counts as resumable: no warning (errors here).
    resumed = run(9, tmp_path / "ck" / "epoch=1-step=4.ckpt")
    assert resumed.trained == straight.trained[4:]


@RESUMING
def test_each_epoch_of_a_finite_stream_reads_it_from_the_start(data: Path, tmp_path: Path) -> None:
    config = dataclasses.replace(
        make_config(data), stages=[Stage(sources=[FileSource(files=[str(data / "b.jsonl")])], batch_size=20)]
    )

    def run(ckpt_path: Path | None = None) -> Recorder:
        epoch_end = ModelCheckpoint(dirpath=tmp_path / "ck", every_n_epochs=1, save_top_k=-1)
        return fit(
            O41DataModule(config), tmp_path, -1, max_epochs=2, callbacks=[epoch_end], ckpt_path=ckpt_path
        )

    straight = run()
    assert len(straight.trained) == 20  # 200 rows, 20 a batch, twice
    assert [t[1:] for t in straight.trained[:10]] == [t[1:] for t in straight.trained[10:]]
    # Resumed at the end of the stream, the next epoch starts it over, as the first run did.
    resumed = run(tmp_path / "ck" / "epoch=0-step=10.ckpt")
    assert resumed.trained == straight.trained[10:]


# -- Stream checkpoints beside the model checkpoints.


def test_every_checkpoint_gets_its_stream_checkpoints_and_loses_them_with_it(
    data: Path, tmp_path: Path
) -> None:
    directory = tmp_path / "ck"
    top_two = ModelCheckpoint(
        dirpath=directory, every_n_train_steps=2, save_top_k=2, monitor="step", mode="max"
    )
    datamodule = O41DataModule(make_config(data))
    trainer = Trainer(
        max_steps=8, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[top_two, O41Curriculum({6: 1})],
    )  # fmt: skip
    trainer.fit(Recorder(), datamodule=datamodule)
    trainer.save_checkpoint(tmp_path / "manual.ckpt")

    names = sorted(p.name for p in directory.iterdir())
    assert names == [
        "epoch=0-step=6.ckpt",
        "epoch=0-step=6.ckpt.o41",
        "epoch=0-step=8.ckpt",
        "epoch=0-step=8.ckpt.o41",
    ]
    for path in [
        directory / "epoch=0-step=6.ckpt",
        directory / "epoch=0-step=8.ckpt",
        tmp_path / "manual.ckpt",
    ]:
        sidecars = Path(sidecar_directory(path))
        assert sidecars == path.with_name(path.name + ".o41")
        state = torch.load(path, weights_only=True)
        entry = state["O41DataModule"]
        written = read_checkpoint(sidecars / rank_file(0, 1))
        assert sorted(p.name for p in sidecars.iterdir()) == [
            INDEX_FILE,
            shared_name_of(written),
            rank_file(0, 1),
        ]  # no temporary files
        assert written == Checkpoint.from_position(
            Position.from_json(entry["ranks"][0]["position"]), entry["resolved"]
        )
        assert written.batches_yielded == state["global_step"]
        index = json.loads((sidecars / INDEX_FILE).read_text())
        assert index == {
            "format": FORMAT,
            "version": STATE_VERSION,
            "world_size": 1,
            "global_step": state["global_step"],
            "ranks": [{"file": rank_file(0, 1)}],
        }
    # Requested at step 6 for the 9th batch, which no step had trained on when these were written:
    # the rank's checkpoint holds it (docs/checkpoint.md, "Pending switches").
    for path in [directory / "epoch=0-step=8.ckpt.o41", tmp_path / "manual.ckpt.o41"]:
        assert read_checkpoint(path / rank_file(0, 1)).position.switches == [(1, 8)]
    assert read_checkpoint(directory / "epoch=0-step=6.ckpt.o41" / rank_file(0, 1)).position.switches == []
    assert read_checkpoint(tmp_path / "manual.ckpt.o41" / rank_file(0, 1)) == datamodule.checkpoint()


def test_removing_a_last_link_keeps_the_stream_checkpoints_of_the_checkpoint_it_named(
    data: Path, tmp_path: Path
) -> None:
    directory = tmp_path / "ck"
    links = checkpoints(directory, every=2, save_last="link")
    links.CHECKPOINT_NAME_LAST = "last-{step}"  # a new link at each save, and the previous one removed
    fit(O41DataModule(make_config(data)), tmp_path, 6, callbacks=[links])
    assert sorted(p.name for p in directory.iterdir()) == [
        *[
            name
            for step in (2, 4, 6)
            for name in (f"epoch=0-step={step}.ckpt", f"epoch=0-step={step}.ckpt.o41")
        ],
        "last-step=6.ckpt",
    ]
    for step in (2, 4, 6):
        assert (directory / f"epoch=0-step={step}.ckpt.o41" / rank_file(0, 1)).exists()


def test_stream_checkpoints_go_to_object_stores_too(data: Path, tmp_path: Path) -> None:
    directory = tmp_path / "ck"
    fit(O41DataModule(make_config(data)), tmp_path, 4, callbacks=[checkpoints(directory)])
    state = torch.load(directory / "epoch=0-step=4.ckpt", weights_only=True)
    io = SidecarCheckpointIO(TorchCheckpointIO())
    memory = fsspec.filesystem("memory")
    run = f"/{tmp_path.name}"
    io.save_checkpoint(state, f"memory://{run}/step=4.ckpt")
    written = memory.cat_file(f"{run}/step=4.ckpt.o41/{rank_file(0, 1)}").decode()
    assert written == (directory / "epoch=0-step=4.ckpt.o41" / rank_file(0, 1)).read_text()
    assert io.load_checkpoint(f"memory://{run}/step=4.ckpt")["O41DataModule"] == state["O41DataModule"]
    io.remove_checkpoint(f"memory://{run}/step=4.ckpt")
    assert memory.find(run) == []


@RESUMING
def test_a_renamed_datamodule_resumes_from_the_stream_checkpoints_through_a_linked_last(
    data: Path, tmp_path: Path
) -> None:
    class Renamed(O41DataModule):
        """Lightning keys datamodule state by class name: this one finds none in the checkpoint."""

    def run(datamodule: O41DataModule, max_steps: int, ckpt_path: Path | None = None) -> Recorder:
        callbacks = [checkpoints(tmp_path / "ck", every=3, save_last="link")]
        return fit(datamodule, tmp_path, max_steps, callbacks=callbacks, ckpt_path=ckpt_path)

    straight = run(O41DataModule(make_config(data)), 6)
    last = tmp_path / "ck" / "last.ckpt"
    assert last.is_symlink()
    assert os.readlink(last) == "epoch=0-step=6.ckpt"
    assert Path(sidecar_directory(last)) == tmp_path / "ck" / "epoch=0-step=6.ckpt.o41"
    last.unlink()
    last.symlink_to("epoch=0-step=3.ckpt")  # as if the job had died before step 6

    resumed = run(Renamed(make_config(data)), 6, last)
    assert resumed.trained == straight.trained[3:]

    at_step_3 = tmp_path / "ck" / "epoch=0-step=3.ckpt"
    (tmp_path / "ck" / "epoch=0-step=3.ckpt.o41" / rank_file(0, 1)).unlink()
    with pytest.raises(CheckpointError, match=r"epoch=0-step=3\.ckpt\.o41 lacks stream-rank0-of-1\.json"):
        run(Renamed(make_config(data)), 6, at_step_3)
    (tmp_path / "ck" / "epoch=0-step=3.ckpt.o41" / INDEX_FILE).unlink()
    with pytest.raises(
        CheckpointError, match=r"step=3\.ckpt holds no O41DataModule state and .*datamodule\.json"
    ):
        run(Renamed(make_config(data)), 6, at_step_3)


@RESUMING
def test_sidecars_have_the_one_rank_file_name_and_two_names_for_a_rank_are_refused(
    data: Path, tmp_path: Path
) -> None:
    class Renamed(O41DataModule):
        """Lightning keys datamodule state by class name: this one resumes from the sidecars."""

    fit(O41DataModule(make_config(data)), tmp_path, 3, callbacks=[checkpoints(tmp_path / "ck", every=3)])
    saved = tmp_path / "ck" / "epoch=0-step=3.ckpt"
    sidecars = Path(sidecar_directory(saved))
    assert rank_file(0, 1) == rank_file_name(0, 1) == "stream-rank0-of-1.json"
    assert sorted(p.name for p in sidecars.iterdir())[::2] == [INDEX_FILE, "stream-rank0-of-1.json"]
    # Another name for rank 0 of 1 (the JAX handler's of an earlier release) beside it.
    (sidecars / "process_0-of-1.json").write_text((sidecars / "stream-rank0-of-1.json").read_text())
    with pytest.raises(
        CheckpointError,
        match=r"\.o41 holds two files for rank 0 of 1, process_0-of-1\.json and stream-rank0-of-1\.json",
    ):
        fit(
            Renamed(make_config(data)),
            tmp_path,
            6,
            callbacks=[checkpoints(tmp_path / "ck", every=3)],
            ckpt_path=saved,
        )


# -- What a resume refuses, and how it moves positions to another world size.


def with_state(source: Path, target: Path, state: dict[str, Any]) -> Path:
    checkpoint = torch.load(source, weights_only=True)
    checkpoint["O41DataModule"] = state
    torch.save(checkpoint, target)
    return target


def two_rank_state(
    config: BatchStreamConfig, batches: tuple[int, int], switch_rank1_after: int | None = None
) -> tuple[dict[str, Any], Checkpoint]:
    taken = []
    for rank, count in enumerate(batches):
        with open_batch_stream(dataclasses.replace(config, rank=rank, world_size=2)) as stream:
            for k in range(count):
                if rank == 1 and k == switch_rank1_after:
                    stream.advance(1)
                next(stream)
            taken.append(stream.checkpoint())
    state = {
        "format": FORMAT,
        "version": STATE_VERSION,
        "world_size": 2,
        "resolved": taken[0].resolved_json(),
        "ranks": [{"position": c.position.to_json()} for c in taken],
    }
    return state, taken[0]


@RESUMING
def test_a_resume_on_another_world_size_moves_the_positions_when_the_ranks_agree(
    data: Path, tmp_path: Path
) -> None:
    config = make_config(data)
    fit(O41DataModule(config), tmp_path, 4, callbacks=[checkpoints(tmp_path / "ck")])
    state, rank0 = two_rank_state(config, (4, 4))
    moved = with_state(tmp_path / "ck" / "epoch=0-step=4.ckpt", tmp_path / "two-ranks.ckpt", state)
    datamodule = O41DataModule(config)
    resumed = fit(datamodule, tmp_path, 10, callbacks=[checkpoints(tmp_path / "ck")], ckpt_path=moved)
    # One rank now takes every global batch from where both old ranks stopped (docs/order.md).
    assert [d for *_, d in resumed.trained] == core_digests(rank0.for_world(0, 1), 6)
    assert [index for _, index, _, _ in resumed.trained] == list(range(8, 14))

    state, _ = two_rank_state(config, (4, 5))
    uneven = with_state(tmp_path / "ck" / "epoch=0-step=4.ckpt", tmp_path / "uneven.ckpt", state)
    with pytest.raises(
        CheckpointError, match=r"rank 0 at global batch 8 \(stage 0\), rank 1 at global batch 10"
    ):
        fit(O41DataModule(config), tmp_path, 10, callbacks=[checkpoints(tmp_path / "ck")], ckpt_path=uneven)
    # One global batch, but rank 1 switched to stage 1 on the way: the same refusal as the core's.
    state, _ = two_rank_state(config, (4, 4), switch_rank1_after=2)
    segments = with_state(tmp_path / "ck" / "epoch=0-step=4.ckpt", tmp_path / "segments.ckpt", state)
    with pytest.raises(
        CheckpointError, match=r"rank 0 at global batch 8 \(stage 0\), rank 1 at global batch 8 \(stage 1\)"
    ):
        fit(O41DataModule(config), tmp_path, 10, callbacks=[checkpoints(tmp_path / "ck")], ckpt_path=segments)


def test_a_resume_with_another_stream_or_state_version_is_refused(data: Path, tmp_path: Path) -> None:
    fit(O41DataModule(make_config(data)), tmp_path, 4, callbacks=[checkpoints(tmp_path / "ck")])
    saved = tmp_path / "ck" / "epoch=0-step=4.ckpt"
    with pytest.raises(CheckpointError, match="seed is 1 in the checkpoint, 2 in the config"):
        fit(O41DataModule(make_config(data, seed=2)), tmp_path, 8, ckpt_path=saved)
    state = torch.load(saved, weights_only=True)["O41DataModule"]
    with pytest.raises(CheckpointError, match=f"{FORMAT} state version 3; this release reads versions 1, 2"):
        O41DataModule(make_config(data)).load_state_dict({**state, "version": 3})
    with pytest.raises(CheckpointError, match="expected 1 rank entries, found 2"):
        O41DataModule(make_config(data)).load_state_dict({**state, "ranks": state["ranks"] * 2})


class RestoresAfterSetup(SingleDeviceStrategy):
    """Like FSDP and DeepSpeed: the checkpoint is restored after configure_optimizers."""

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True


class ReadsSteppingBatches(Recorder):
    def configure_optimizers(self) -> torch.optim.Optimizer:
        assert self.trainer.estimated_stepping_batches == 8
        return super().configure_optimizers()


@RESUMING
def test_estimated_stepping_batches_before_a_late_restore_is_refused_not_silently_wrong(
    data: Path, tmp_path: Path
) -> None:
    config = make_config(data)

    # The strategy brings its device; max_epochs makes estimated_stepping_batches load the train loader.
    def run(max_steps: int, model: Recorder, ckpt_path: Path | None = None) -> Recorder:
        # The strategy brings its device; with max_epochs set, estimated_stepping_batches loads
        # the train loader when configure_optimizers reads it.
        strategy = RestoresAfterSetup(device=torch.device("cpu"))
        callbacks = [checkpoints(tmp_path / "ck")]
        options = {"strategy": strategy, "accelerator": "auto", "max_epochs": 1, "callbacks": callbacks}
        return fit(O41DataModule(config), tmp_path, max_steps, model=model, ckpt_path=ckpt_path, **options)

    run(4, Recorder())
    saved = tmp_path / "ck" / "epoch=0-step=4.ckpt"
    resumed = run(8, Recorder(), saved)
    assert [index for _, index, _, _ in resumed.trained] == [4, 5, 6, 7]
    with pytest.raises(CheckpointError, match="arrived after this fit's train loader had started"):
        run(8, ReadsSteppingBatches(), saved)


# -- The datamodule's hooks and arguments.


def test_a_models_own_on_before_batch_transfer_still_runs(data: Path, tmp_path: Path) -> None:
    class Transforms(Recorder):
        def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            return {**batch, "transformed": True}  # after the datamodule recorded the position

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
            assert batch["transformed"]
            return super().training_step(batch, batch_idx)

    datamodule = O41DataModule(make_config(data))
    with pytest.warns(UserWarning, match="overridden `on_before_batch_transfer` in both"):
        model = fit(datamodule, tmp_path, 3, model=Transforms())
    assert len(model.trained) == 3
    checkpoint = datamodule.checkpoint()
    assert checkpoint is not None
    assert checkpoint.batches_yielded == 3


@pytest.mark.filterwarnings("ignore:You are using the `dataloader_iter` step flavor")  # Lightning's, first
def test_a_training_step_that_fetches_its_own_batches_is_refused(data: Path, tmp_path: Path) -> None:
    class FetchesItself(Recorder):
        def training_step(self, dataloader_iter: Any) -> torch.Tensor:
            batch, _, _ = next(dataloader_iter)
            return self.layer(batch["x"]).mean()

    with pytest.raises(ConfigError, match=r"training_step\(dataloader_iter\)"):
        fit(O41DataModule(make_config(data)), tmp_path, 3, model=FetchesItself())


def test_a_config_rank_other_than_the_trainers_is_refused(data: Path, tmp_path: Path) -> None:
    config = dataclasses.replace(make_config(data), rank=1, world_size=2)
    with pytest.raises(ConfigError, match="the config says rank 1 of 2, the trainer says rank 0 of 1"):
        fit(O41DataModule(config), tmp_path, 3)


@pytest.mark.filterwarnings("ignore:The 'train_dataloader' does not have many workers")  # a plain DataLoader
def test_the_curriculum_callback_needs_an_o41_datamodule(tmp_path: Path) -> None:
    class Plain(Recorder):
        def train_dataloader(self) -> Any:
            return DataLoader([torch.zeros(4, 4)] * 4, batch_size=None)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.layer(batch).mean()

    trainer = Trainer(
        max_steps=3, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, callbacks=[O41Curriculum({1: 1})],
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"O41Curriculum: the trainer's datamodule is None"):
        trainer.fit(Plain())


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda c, v: O41DataModule(c.to_json()), "config: expected a BatchStreamConfig, got str"),
        (lambda c, v: O41DataModule(c, val_config=c), r"val_config.stages\[0\].infinite is True"),
        (lambda c, v: O41DataModule(c, val_config=v, num_workers=-1), "num_workers: expected an int >= 0"),
        (
            lambda c, v: O41DataModule(c, bool_as="int8"),
            "invalid bool_as: 'int8'; expected 'bool' or 'uint8'",
        ),
        (lambda c, v: O41DataModule(c, training_data="s3"), "invalid training_data: expected a TrainingData"),
        (lambda c, v: O41Curriculum({-1: 1}), "schedule: -1: 1 is not a global step"),
        (lambda c, v: O41Curriculum([(1, 1)]), "schedule: expected a mapping"),
    ],
)
def test_bad_arguments_are_named(data: Path, make: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make(make_config(data), make_val_config(data))


def test_only_a_datamodule_with_a_validation_stream_offers_one(data: Path) -> None:
    assert "val_dataloader" not in vars(O41DataModule(make_config(data)))
    loader = O41DataModule(make_config(data), val_config=make_val_config(data)).val_dataloader()
    assert [len(batch["x"]) for batch in loader] == [64, 64, 64]
    assert [len(batch["x"]) for batch in loader] == [64, 64, 64]  # every run reads all of it


# -- A real DDP job on two CPU ranks, killed with SIGKILL and restarted.


def ddp_data(tmp_path: Path) -> Path:
    """The shards lightning_train.py reads."""
    data = tmp_path / "data"
    data.mkdir()
    for k in range(2):
        write_shard(
            data / f"a-{k}.parquet", "parquet", [{"input_ids": [k * 1000 + i] * (i % 9)} for i in range(60)]
        )
    write_shard(data / "b-0.jsonl", "jsonl", [{"input_ids": [7, i]} for i in range(70)])
    return data


def ddp_job(data: Path, out: Path, *arguments: str) -> int:
    """Runs lightning_train.py (two DDP ranks) to its end or its death; its exit status."""
    out.mkdir(exist_ok=True)
    script = Path(__file__).with_name("lightning_train.py")
    command = [sys.executable, str(script), "--data", str(data), "--out", str(out), *arguments]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    process = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        return process.wait(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def ddp_logs(out: Path) -> list[list[str]]:
    """Each rank's log of the batches its steps trained on."""
    return [(out / f"log-rank{r}.txt").read_text().splitlines() for r in range(2)]


def keep_steps_before(out: Path, step: int) -> None:
    """Drops the log lines of steps at or after ``step``: what a restart from it trains again."""
    for rank, lines in enumerate(ddp_logs(out)):
        kept = [line for line in lines if int(line.split()[0]) < step]
        (out / f"log-rank{rank}.txt").write_text("".join(line + "\n" for line in kept))


def test_a_killed_ddp_job_restarts_each_rank_at_its_own_position(tmp_path: Path) -> None:
    data = ddp_data(tmp_path)
    assert ddp_job(data, tmp_path / "straight") == 0
    straight = ddp_logs(tmp_path / "straight")
    assert [len(lines) for lines in straight] == [16, 16]
    assert straight[0] != straight[1]  # each rank trains on its own batches
    assert [line.split()[2] for line in straight[0]] == ["0"] * 8 + ["1"] * 8  # the curriculum switch

    crashed = tmp_path / "crashed"
    assert ddp_job(data, crashed, "--die-at", "10") == -signal.SIGKILL
    last = crashed / "checkpoints" / "last.ckpt"
    assert os.readlink(last) == "epoch=0-step=8.ckpt"
    state = torch.load(last, weights_only=True)["O41DataModule"]
    assert state["world_size"] == 2
    for rank in range(2):
        written = read_checkpoint(Path(sidecar_directory(last)) / rank_file(rank, 2))
        assert written.position == Position.from_json(state["ranks"][rank]["position"])
        assert (written.rank, written.world_size, written.batches_yielded) == (rank, 2, 8)
    # What each rank trained on after the checkpoint is trained on again after the restart.
    keep_steps_before(crashed, 8)
    assert ddp_job(data, crashed, "--resume") == 0
    assert ddp_logs(crashed) == straight


def test_a_job_killed_inside_a_save_resumes_from_the_newest_checkpoint_on_disk(tmp_path: Path) -> None:
    # The model checkpoint is the commit marker: the stream checkpoints beside it are written
    # first, so a job killed right after the .ckpt of step 12 is written has a complete pair
    # there, which a restart through the sidecars (a renamed datamodule) resumes exactly.
    data = ddp_data(tmp_path)
    assert ddp_job(data, tmp_path / "straight") == 0
    crashed = tmp_path / "crashed"
    assert ddp_job(data, crashed, "--die-after-save", "12") == -signal.SIGKILL
    directory = crashed / "checkpoints"
    newest = directory / "epoch=0-step=12.ckpt"
    assert newest.exists()
    assert os.readlink(directory / "last.ckpt") == "epoch=0-step=8.ckpt"  # the link was never moved
    index = json.loads((Path(sidecar_directory(newest)) / INDEX_FILE).read_text())
    assert index["global_step"] == 12
    keep_steps_before(crashed, 12)
    assert ddp_job(data, crashed, "--resume-newest", "--renamed") == 0
    assert ddp_logs(crashed) == ddp_logs(tmp_path / "straight")


@RESUMING
def test_sidecars_of_another_step_under_the_same_name_are_refused(data: Path, tmp_path: Path) -> None:
    class Renamed(O41DataModule):
        """Lightning keys datamodule state by class name: this one finds none in the checkpoint."""

    fit(O41DataModule(make_config(data)), tmp_path, 8, callbacks=[checkpoints(tmp_path / "ck")])
    at_4 = tmp_path / "ck" / "epoch=0-step=4.ckpt"
    at_8 = Path(sidecar_directory(tmp_path / "ck" / "epoch=0-step=8.ckpt"))
    # As if a save of step 8 under step 4's name had written its sidecars and died.
    for name in os.listdir(at_8):
        (Path(sidecar_directory(at_4)) / name).write_bytes((at_8 / name).read_bytes())
    with pytest.raises(CheckpointError, match=r"written for global step 8, but .*step=4\.ckpt is at step 4"):
        fit(
            Renamed(make_config(data)), tmp_path, 10, callbacks=[checkpoints(tmp_path / "ck")], ckpt_path=at_4
        )


def test_outside_a_trainer_the_module_takes_its_rank_from_rank_and_world_size(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The core's rule (process_ranks): with no trainer and no torch.distributed, the RANK and
    # WORLD_SIZE a launcher set decide, as they do for the torch adapter and the core.
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    module = O41DataModule(make_config(data))
    batches = iter(module.train_dataloader())
    assert [int(next(batches)["batch_index"]) for _ in range(3)] == [1, 4, 7]
    # Its state is one rank's of three, which needs the others' to be whole: without
    # torch.distributed to gather them, it is refused rather than written as a world of one.
    with pytest.raises(ConfigError, match="the run has 3 ranks"):
        module.state_dict()
