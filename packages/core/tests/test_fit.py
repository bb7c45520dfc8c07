"""How a list field fits its first axis (``overflow``, ``pad_side``) and stacks, in every format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from o41_testkit import ShardWriter, collect, config_for
from o41_training_data import (
    BatchStreamConfig,
    ConfigError,
    FileSource,
    Packing,
    ProjectedField,
    ProjectionError,
    Stage,
    open_batch_stream,
    resume_batch_stream,
)
from o41_training_data.testing import assert_resumable

PROMPTS = [[1, 2], [3, 4, 5, 6], [], [7], [8, 9, 10]]


def records() -> list[dict[str, Any]]:
    return [{"id": k, "prompt": p, "same": p, "pairs": [[v, -v] for v in p]} for k, p in enumerate(PROMPTS)]


def rows(config: BatchStreamConfig, name: str) -> list[list[Any]]:
    return [row.tolist() for batch in collect(config) for row in batch[name]]


def test_left_padding_ends_each_row_with_its_last_value(shard: ShardWriter, encoding: str) -> None:
    path = shard(encoding, records())
    fields = [
        ProjectedField("prompt", "prompt", "i32", length=4, pad=-1, pad_side="left"),
        ProjectedField("right", "same", "i32", length=4, pad=-1),
        # A nested field pads its first axis on the left; the inner axis stays as it is.
        ProjectedField("pairs", "pairs", "i64", shape=(3, 2), pad=0, pad_side="left"),
    ]
    config = config_for([FileSource([path])], fields, batch_size=5)
    assert rows(config, "prompt") == [
        [-1, -1, 1, 2],
        [3, 4, 5, 6],
        [-1, -1, -1, -1],
        [-1, -1, -1, 7],
        [-1, 8, 9, 10],
    ]
    assert rows(config, "right") == [
        [1, 2, -1, -1],
        [3, 4, 5, 6],
        [-1, -1, -1, -1],
        [7, -1, -1, -1],
        [8, 9, 10, -1],
    ]
    assert rows(config, "pairs")[0] == [[0, 0], [1, -1], [2, -2]]
    assert rows(config, "pairs")[1] == [[3, -3], [4, -4], [5, -5]]  # the first three kept


def test_overflow_error_names_the_shard_row_and_field(shard: ShardWriter, encoding: str) -> None:
    path = shard(encoding, records())
    fitting = ProjectedField("prompt", "prompt", "i32", length=4, overflow="error")
    assert len(rows(config_for([FileSource([path])], [fitting], batch_size=5), "prompt")) == 5
    strict = ProjectedField("prompt", "prompt", "i32", length=3, overflow="error")
    with pytest.raises(ProjectionError, match=r"a list of 4 values, longer than the field's 3") as info:
        rows(config_for([FileSource([path])], [strict], batch_size=5), "prompt")
    assert info.value.row == 1
    assert info.value.field == "prompt"
    assert info.value.path == path


def test_the_options_travel_in_checkpoints_and_keep_old_fingerprints(shard: ShardWriter) -> None:
    path = shard("jsonl", records() * 4)
    plain = config_for(
        [FileSource([path])], [ProjectedField("prompt", "prompt", "i32", length=4)], batch_size=2
    )
    left = config_for(
        [FileSource([path])],
        [ProjectedField("prompt", "prompt", "i32", length=4, pad_side="left", overflow="error")],
        batch_size=2,
    )
    with open_batch_stream(plain) as a, open_batch_stream(left) as b:
        assert a.checkpoint().fingerprint != b.checkpoint().fingerprint
        resolved = a.resolved_config()
    assert "pad_side" not in resolved["fields"][0]
    assert "overflow" not in resolved["fields"][0]
    assert_resumable(left, batches=6)
    with open_batch_stream(left) as stream:
        next(stream)
        checkpoint = stream.checkpoint()
    with resume_batch_stream(checkpoint) as resumed:
        # Records 2 (empty) and 3 ([7]), as the uninterrupted stream has them.
        assert next(resumed).arrays()["prompt"].tolist() == [[0, 0, 0, 0], [0, 0, 0, 7]]
    # From a config file too.
    document = left.to_dict()
    assert BatchStreamConfig.from_dict(document).fields[0].pad_side == "left"


def test_the_options_are_checked(shard: ShardWriter) -> None:
    with pytest.raises(ConfigError, match="pad_side"):
        ProjectedField("p", "p", "i32", length=2, pad_side="middle")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="overflow"):
        ProjectedField("p", "p", "i32", length=2, overflow="discard")  # type: ignore[arg-type]
    path = shard("jsonl", records())
    scalar = ProjectedField("id", "id", "i64", overflow="error")
    with pytest.raises(ConfigError, match=r"overflow applies to a list field"):
        open_batch_stream(config_for([FileSource([path])], [scalar]))
    tokens = shard("parquet", [{"tokens": [1, 2, 3]}])
    packed = BatchStreamConfig(
        fields=[ProjectedField("tokens", "tokens", "i32", length=8, pad_side="left")],
        stages=[Stage(sources=[FileSource([tokens])], batch_size=1, packing=Packing("tokens", 8))],
    )
    with pytest.raises(ConfigError, match="token windows, which place and pad it themselves"):
        open_batch_stream(packed)


def test_a_stack_delivers_its_fields_on_a_leading_axis(shard: ShardWriter, encoding: str) -> None:
    path = shard(encoding, records())
    fields = [
        ProjectedField("both", ("prompt", "same"), "i32", shape=(2, 3), pad=-1, pad_side="left"),
        ProjectedField("id", "id", "i64"),
        ProjectedField("lengths", "@length:both", "i32", length=2),
    ]
    got = collect(config_for([FileSource([path])], fields, batch_size=5))[0]
    assert got["both"].shape == (5, 2, 3)
    assert got["lengths"].tolist() == [[min(len(p), 3)] * 2 for p in PROMPTS]
    for k, prompt in enumerate(PROMPTS):
        fitted = ([-1] * 3 + prompt)[-3:] if len(prompt) <= 3 else prompt[:3]
        assert got["both"][k].tolist() == [fitted, fitted]
    assert got["id"].tolist() == [0, 1, 2, 3, 4]


def test_overflow_drop_leaves_the_row_out(shard: ShardWriter, encoding: str) -> None:
    path = shard(encoding, records() * 2)
    fields = [
        ProjectedField("prompt", "prompt", "i32", length=3, overflow="drop"),
        ProjectedField("row", "@row", "i64"),
        ProjectedField("row_id", "@row_id", "i64"),
    ]
    config = config_for([FileSource([path])], fields, batch_size=1)
    batches = collect(config)
    # Records 1 and 6 hold four values: left out, and the others keep their rows and ids.
    assert [int(b["row"][0]) for b in batches] == [0, 2, 3, 4, 5, 7, 8, 9]
    assert [int(b["row_id"][0]) for b in batches] == [0, 2, 3, 4, 5, 7, 8, 9]
    assert [b["prompt"][0].tolist() for b in batches][:2] == [[1, 2, 0], [0, 0, 0]]
    with open_batch_stream(config) as stream:
        assert stream.stats.sources[0].dropped_rows == 2
        assert stream.stats.since(stream.stats).sources[0].dropped_rows == 2
    assert_resumable(config_for([FileSource([path])], fields, batch_size=2, infinite=True), batches=7)


def test_drop_in_a_manifest_source_on_two_ranks_and_after_a_resume(tmp_path: Path) -> None:
    from dataclasses import replace

    from o41_training_data import DatasetSaver, ManifestSource, Shuffle

    saver = DatasetSaver(tmp_path / "data" / "data-manifest-v1.json", data_format="parquet")
    for part in range(3):
        saver.save(
            "train",
            None,
            [{"id": part * 10 + k, "ids": list(range(k % 5))} for k in range(10)],
            shard_id=str(part),
        )
    saver.commit_manifest()
    fields = [
        ProjectedField("ids", "ids", "i32", length=3, overflow="drop"),
        ProjectedField("id", "id", "i64"),
    ]
    source = ManifestSource(manifest_uri=str(tmp_path / "data" / "data-manifest-v1.json"), split="train")
    config = BatchStreamConfig(fields=fields, stages=[Stage(sources=[source], batch_size=2)])
    kept = sorted(part * 10 + k for part in range(3) for k in range(10) if k % 5 <= 3)
    assert sorted(int(i) for b in collect(config) for i in b["id"]) == kept
    # Every rank plans without the same rows: two ranks together read each kept record once.
    per_rank = [collect(replace(config, rank=r, world_size=2)) for r in range(2)]
    assert sorted(int(i) for rank in per_rank for b in rank for i in b["id"]) == kept
    shuffled = replace(
        config, stages=[replace(config.stages[0], infinite=True, shuffle=Shuffle(buffer_rows=8, unit_rows=1))]
    )
    assert_resumable(shuffled, batches=14)
    with open_batch_stream(shuffled) as stream:
        for _ in range(3):
            next(stream)
        checkpoint = stream.checkpoint()
        following = [next(stream).arrays()["id"].tolist() for _ in range(3)]
    with resume_batch_stream(checkpoint) as resumed:
        assert resumed.stats.sources[0].dropped_rows == 6
        assert [next(resumed).arrays()["id"].tolist() for _ in range(3)] == following


def test_a_stack_is_checked(shard: ShardWriter) -> None:
    path = shard("jsonl", records())
    cases = [
        (ProjectedField("p", ("prompt", "same"), "i32", shape=(3, 2)), r"fields\[0\].shape.*starting with 2"),
        (ProjectedField("p", ("prompt", "prompt"), "i32", shape=(2, 2)), r"source\[1\].*already in"),
        (ProjectedField("p", ("prompt", "@row"), "i32", shape=(2, 2)), r"source\[1\].*record fields"),
        (ProjectedField("p", (), "i32", shape=(2, 2)), r"at least one record field"),
        (ProjectedField("p", ("prompt", "same"), "i32", shape=(2,), overflow="drop"), "a list field"),
    ]
    for field, message in cases:
        with pytest.raises(ConfigError, match=message):
            open_batch_stream(config_for([FileSource([path])], [field]))
    twice = [
        ProjectedField("p", ("prompt", "same"), "i32", shape=(2, 2)),
        ProjectedField("s", "same", "i32", length=2),
    ]
    with pytest.raises(ConfigError, match=r"'same' is already projected by fields\[0\]"):
        open_batch_stream(config_for([FileSource([path])], twice))
    tokens = shard("parquet", [{"tokens": [1, 2, 3], "mask": [1, 1, 1]}])
    packed = BatchStreamConfig(
        fields=[
            ProjectedField("tokens", "tokens", "i32", length=8),
            ProjectedField("mask", ("mask", "tokens2"), "i32", shape=(2, 8)),
        ],
        stages=[Stage(sources=[FileSource([tokens])], batch_size=1, packing=Packing("tokens", 8))],
    )
    with pytest.raises(ConfigError, match="a stack is for stages of records"):
        open_batch_stream(packed)
    from_file = BatchStreamConfig.from_dict(config_for([FileSource([path])], [cases[0][0]]).to_dict())
    assert from_file.fields[0].source == ("prompt", "same")


def test_length_of_a_field_counts_the_values_it_holds(shard: ShardWriter, encoding: str) -> None:
    path = shard(encoding, records())
    fields = [
        ProjectedField("prompt", "prompt", "i32", length=3, pad=-1, pad_side="left"),
        ProjectedField("prompt_length", "@length:prompt", "i64"),
        ProjectedField("pairs", "pairs", "i64", shape=(4, 2)),
        ProjectedField("pairs_length", "@length:pairs", "i32"),
    ]
    got = collect(config_for([FileSource([path])], fields, batch_size=5))[0]
    # The values the row holds, not the pad: a longer list fills the axis.
    assert got["prompt_length"].tolist() == [min(len(p), 3) for p in PROMPTS]
    assert got["pairs_length"].tolist() == [min(len(p), 4) for p in PROMPTS]
    assert got["pairs_length"].dtype.name == "int32"
    # With left padding, the last `length` entries are the prompt.
    for row, length, prompt in zip(got["prompt"], got["prompt_length"], PROMPTS, strict=True):
        assert row[3 - length :].tolist() == (prompt[:3][-length:] if length else [])


def test_length_is_checked(shard: ShardWriter) -> None:
    path = shard("jsonl", records())
    prompt = ProjectedField("prompt", "prompt", "i32", length=3)
    cases = [
        (ProjectedField("n", "@length:nothing", "i64"), "no field has that name"),
        (ProjectedField("n", "@length:id", "i64"), "'id' is not one"),
        (
            ProjectedField("n", "@length:prompt", "i64", length=2),
            "declare dtype i64 \\(or i32\\) and no length",
        ),
        (ProjectedField("n", "@length:prompt", "f32"), "declare dtype i64"),
        (ProjectedField("n", "@lengths:prompt", "i64"), r"@length:<field>"),
    ]
    id_field = ProjectedField("id", "id", "i64")
    for field, message in cases:
        with pytest.raises(ConfigError, match=message):
            open_batch_stream(config_for([FileSource([path])], [prompt, id_field, field]))
    tokens = shard("parquet", [{"tokens": [1, 2, 3]}])
    packed = BatchStreamConfig(
        fields=[
            ProjectedField("tokens", "tokens", "i32", length=8),
            ProjectedField("n", "@length:tokens", "i64"),
        ],
        stages=[Stage(sources=[FileSource([tokens])], batch_size=1, packing=Packing("tokens", 8))],
    )
    with pytest.raises(ConfigError, match="'@segment_lengths' gives"):
        open_batch_stream(packed)


ANSWERS = ["42", "héllo wörld", "", "x" * 12]


def test_strings_arrive_as_rows_of_their_bytes(shard: ShardWriter, encoding: str) -> None:
    path = shard(encoding, [{"id": k, "answer": a} for k, a in enumerate(ANSWERS)])
    fields = [
        ProjectedField("answer", "answer", "u8", length=16, pad=0),
        ProjectedField("answer_length", "@length:answer", "i64"),
        ProjectedField("id", "id", "i64"),
    ]
    got = collect(config_for([FileSource([path])], fields, batch_size=4))[0]
    assert got["answer"].dtype.name == "uint8"
    assert got["answer"].shape == (4, 16)
    for row, length, answer in zip(got["answer"], got["answer_length"], ANSWERS, strict=True):
        raw = answer.encode()
        assert int(length) == len(raw)
        assert bytes(row[: len(raw)]).decode() == answer
        assert not row[len(raw) :].any()
    # Left padding with a space, and a string too long for its row left out.
    fitted = [
        ProjectedField("answer", "answer", "u8", length=11, pad=32, pad_side="left", overflow="drop"),
        ProjectedField("id", "id", "i64"),
    ]
    kept = collect(config_for([FileSource([path])], fitted, batch_size=1))
    assert [int(b["id"][0]) for b in kept] == [0, 2]  # "héllo wörld" is 13 bytes
    assert bytes(kept[0]["answer"][0]).decode() == " " * 9 + "42"
    strict = [ProjectedField("answer", "answer", "u8", length=11, overflow="error")]
    with pytest.raises(ProjectionError, match="a list of 13 values, longer than the field's 11") as info:
        collect(config_for([FileSource([path])], strict, batch_size=4))
    assert info.value.row == 1


def test_a_u8_field_is_checked(shard: ShardWriter) -> None:
    path = shard("jsonl", records())
    cases = [
        (ProjectedField("p", "prompt", "u8", length=4), r"found (a list|integer 1) where u8"),
        (ProjectedField("p", "id", "u8", length=4), "found integer 0 where u8"),
    ]
    for field, message in cases:
        with pytest.raises(ProjectionError, match=message):
            collect(config_for([FileSource([path])], [field]))
    for field, message in [
        (ProjectedField("p", "prompt", "u8"), "declare a length"),
        (ProjectedField("p", "prompt", "u8", shape=(2, 2)), "declare a length"),
        (ProjectedField("p", "prompt", "u8", length=2, pad=256), "does not fit dtype u8"),
    ]:
        with pytest.raises(ConfigError, match=message):
            open_batch_stream(config_for([FileSource([path])], [field]))


@pytest.mark.parametrize("kind", ["string", "large_string", "string_view", "binary", "large_binary"])
def test_u8_reads_every_arrow_string_and_binary_type(tmp_path: Path, kind: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"a": pa.array(["ab", "cdé", ""], type=getattr(pa, kind)())}), path)
    fields = [ProjectedField("a", "a", "u8", length=4), ProjectedField("n", "@length:a", "i32")]
    got = collect(config_for([FileSource([str(path)])], fields, batch_size=3))[0]
    assert got["a"].tolist() == [[97, 98, 0, 0], [99, 100, 195, 169], [0, 0, 0, 0]]
    assert got["n"].tolist() == [2, 4, 0]


def test_a_trace_names_the_records_a_drop_stream_delivers(shard: ShardWriter) -> None:
    from o41_training_data import read_traced_rows, trace_batches

    paths = [shard("jsonl", records() * 2), shard("parquet", records())]
    fields = [
        ProjectedField("prompt", "prompt", "i32", length=3, overflow="drop"),
        ProjectedField("id", "id", "i64"),
        ProjectedField("row", "@row", "i64"),
    ]
    config = config_for([FileSource(paths)], fields, batch_size=2)
    delivered = collect(config)
    traced = trace_batches(config, range(len(delivered)))
    # Each traced row is the record's number in its file, the one `@row` delivers ...
    assert [t.row for t in traced] == [int(r) for b in delivered for r in b["row"]]
    # ... so reading it back gives the record delivered (record 1 of each file was left out).
    read = read_traced_rows(traced)
    assert [r["id"] for r in read if r] == [int(i) for b in delivered for i in b["id"]]
    assert 1 not in [t.row for t in traced]
    with open_batch_stream(config) as stream:
        next(stream)
        checkpoint = stream.checkpoint()
    from_checkpoint = trace_batches(checkpoint, range(1, len(delivered)))
    assert [t.row for t in from_checkpoint] == [t.row for t in traced[2:]]


def test_a_source_whose_every_record_is_dropped_says_so(shard: ShardWriter) -> None:
    path = shard("jsonl", [{"prompt": [1, 2, 3, 4]}] * 3)
    field = ProjectedField("prompt", "prompt", "i32", length=2, overflow="drop")
    with pytest.raises(ConfigError, match=r"stages\[0\].sources\[0\].*overflow 'drop'.*all 3") as info:
        open_batch_stream(config_for([FileSource([path])], [field]))
    assert info.value.option == "stages[0].sources[0]"
