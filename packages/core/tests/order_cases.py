"""Random small stream configs over real shard files, and a driver that runs them."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import strategies as st
from o41_testkit import SUFFIX, write_shard
from o41_training_data import (
    BatchStream,
    BatchStreamConfig,
    Checkpoint,
    FileSource,
    ProjectedField,
    Ramp,
    Shuffle,
    Stage,
    open_batch_stream,
    resume_batch_stream,
)

SCHEMA = pa.schema([("v", pa.int64()), ("text", pa.string())])

FIELDS = [
    ProjectedField("v", "v", "i64"),
    ProjectedField("id", "@row_id", "i64"),
    ProjectedField("src", "@source", "i64"),
    ProjectedField("stg", "@stage", "i64"),
]


@dataclass
class SourceCase:
    shards: list[int]
    encoding: str
    weight: float


@dataclass
class StageCase:
    sources: list[SourceCase]
    batch_size: int
    shuffle: tuple[int, int] | None
    infinite: bool
    ramp: tuple[int, int, int] | None = None
    block_rows: int | None = None


@dataclass
class Case:
    stages: list[StageCase]
    seed: int
    world_size: int
    files: list[list[list[str]]] = field(default_factory=list)
    validation_pass: bool = False
    partitions: int = 1

    def rows(self, stage: int) -> int:
        return sum(sum(s.shards) for s in self.stages[stage].sources)

    def config(
        self, rank: int = 0, world_size: int | None = None, threads: int = 2, prefetch: int = 2
    ) -> BatchStreamConfig:
        stages = []
        for s, stage in enumerate(self.stages):
            sources = [
                FileSource(files=self.files[s][j], weight=src.weight) for j, src in enumerate(stage.sources)
            ]
            shuffle = (
                Shuffle(buffer_rows=stage.shuffle[0], unit_rows=stage.shuffle[1], block_rows=stage.block_rows)
                if stage.shuffle
                else None
            )
            ramp = Ramp(*stage.ramp) if stage.ramp else None
            stages.append(
                Stage(
                    sources=sources,
                    batch_size=stage.batch_size,
                    shuffle=shuffle,
                    infinite=stage.infinite,
                    ramp=ramp,
                )
            )
        return BatchStreamConfig(
            fields=FIELDS,
            stages=stages,
            seed=self.seed,
            threads=threads,
            prefetch_batches=prefetch,
            rank=rank,
            world_size=world_size if world_size is not None else self.world_size,
            validation_pass=self.validation_pass,
            partitions=self.partitions,
        )

    def write(self, directory: Path) -> None:
        self.files = []
        for s, stage in enumerate(self.stages):
            stage_files = []
            for j, source in enumerate(stage.sources):
                paths = []
                for f, rows in enumerate(source.shards):
                    base = s * 1_000_000 + j * 10_000 + f * 100
                    records = [{"v": base + r, "text": "x" * (r % 3)} for r in range(rows)]
                    path = directory / f"s{s}-j{j}-f{f}{SUFFIX[source.encoding]}"
                    write_shard(path, source.encoding, records, schema=SCHEMA)
                    paths.append(str(path))
                stage_files.append(paths)
            self.files.append(stage_files)


@st.composite
def source_cases(draw: st.DrawFn) -> SourceCase:
    shards = draw(st.lists(st.integers(0, 25), min_size=1, max_size=3).filter(lambda rows: sum(rows) > 0))
    encoding = draw(st.sampled_from(["parquet", "jsonl", "jsonl.gz", "msgpack"]))
    weight = draw(st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.0]))
    return SourceCase(shards, encoding, weight)


@st.composite
def stage_cases(draw: st.DrawFn, infinite: bool | None = None) -> StageCase:
    return StageCase(
        sources=draw(st.lists(source_cases(), min_size=1, max_size=4)),
        batch_size=draw(st.integers(1, 6)),
        shuffle=draw(st.none() | st.tuples(st.integers(1, 40), st.integers(1, 4))),
        infinite=draw(st.booleans()) if infinite is None else infinite,
        block_rows=draw(st.none() | st.integers(1, 9)),
    )


@st.composite
def cases(draw: st.DrawFn, max_stages: int = 3, infinite: bool | None = None) -> Case:
    stages = draw(st.lists(stage_cases(infinite), min_size=1, max_size=max_stages))
    world_size = draw(st.integers(1, 4))
    # Partitions need every stage shuffled; a multiple of the world size keeps a rank's windows
    # its own and its stage switches where a single rank's are.
    # An infinite stage shares every source among the partitions: each needs a row per partition.
    partitions = 1
    if all(stage.shuffle for stage in stages):
        smallest = min(
            (sum(source.shards) for stage in stages if stage.infinite for source in stage.sources),
            default=None,
        )
        partitions = draw(
            st.sampled_from([p for p in (1, world_size, 2 * world_size) if smallest is None or p <= smallest])
        )
    return Case(stages=stages, seed=draw(st.integers(0, 2**32)), world_size=world_size, partitions=partitions)


def materialise(case: Case) -> tempfile.TemporaryDirectory[str]:
    """Writes the case's shards; the caller keeps the directory alive while streaming."""
    directory = tempfile.TemporaryDirectory(prefix="o41-case-")
    case.write(Path(directory.name))
    return directory


Record = tuple[int, int, dict[str, list[int]]]


def record(batch_index: int, stage: int, arrays: dict[str, np.ndarray]) -> Record:
    return batch_index, stage, {k: v.tolist() for k, v in arrays.items()}


def drive(stream: BatchStream, limit: int, advances: dict[int, int], consumed: int = 0) -> list[Record]:
    """Reads up to ``limit`` batches in total (counting ``consumed`` already read), calling
    ``advance(stage)`` whenever the count of consumed batches is a key of ``advances``."""
    out: list[Record] = []
    while consumed + len(out) < limit:
        at = consumed + len(out)
        if at in advances:
            stream.advance(advances[at])
        batch = next(stream, None)
        if batch is None:
            break
        out.append(record(batch.batch_index, batch.stage, batch.arrays()))
    return out


def run(config: BatchStreamConfig, limit: int, advances: dict[int, int] | None = None) -> list[Record]:
    with open_batch_stream(config) as stream:
        return drive(stream, limit, advances or {})


def run_with_stop(
    config: BatchStreamConfig, limit: int, stop: int, advances: dict[int, int] | None = None
) -> list[Record]:
    """Runs to ``stop``, checkpoints through JSON, resumes in a new stream and runs to ``limit``."""
    advances = advances or {}
    with open_batch_stream(config) as stream:
        head = drive(stream, stop, advances)
        if stop in advances:
            stream.advance(advances[stop])
        text = stream.checkpoint().to_json()
    with resume_batch_stream(Checkpoint.from_json(text)) as resumed:
        return head + drive(
            resumed, limit, {k: v for k, v in advances.items() if k > stop}, consumed=len(head)
        )
