"""``o41 config resolve`` and ``o41 trace`` over config files of packed and windowed runs.

Every option a config holds is in its file (issue 46: ``packing`` was an unknown key), and the
file's relative paths are taken from its own directory, wherever the command runs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from o41_training_data import BatchStreamConfig, open_batch_stream, trace_batches
from o41_training_data._cli import main

FIELDS = """\
fields:
  - {name: tokens, source: tokens, dtype: i32, length: 8, pad: 0}
  - {name: segment_ids, source: "@segment_ids", dtype: i32, length: 8}
  - {name: positions, source: "@positions", dtype: i32, length: 8, pad_side: right}
"""

PACKED = f"""\
{FIELDS}stages:
  - sources:
      - files: [data/a.parquet]
      - files: [data/b.parquet]
        weight: 2
    batch_size: 4
    shuffle: {{buffer_rows: 16, unit_rows: 2}}
    ramp: {{start: 2, increment: 2, rows: 8}}
    packing: {{field: tokens, seq_len: 8, bins: 2}}
skip_batches: [[1, 2]]
seed: 5
"""

WINDOWED = """\
fields:
  - {name: tokens, source: tokens, dtype: i32, length: 9, pad: 0}
  - {name: segment_ids, source: "@segment_ids", dtype: i32, length: 9}
stages:
  - sources: [{files: [data/a.parquet, data/b.parquet]}]
    batch_size: 2
    windows: {field: tokens, seq_len: 8}
validation_pass: true
"""


def write_corpus(directory: Path) -> None:
    directory.mkdir()
    first = 1
    for name, lengths in (("a", [5, 9, 3, 12, 7, 2]), ("b", [4, 4, 11, 6, 1, 8])):
        docs = []
        for n in lengths:
            docs.append(list(range(first, first + n)))
            first += n
        pq.write_table(
            pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))}), directory / f"{name}.parquet"
        )


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The run's folder, holding its corpus; the commands run from another folder."""
    folder = tmp_path / "run"
    folder.mkdir()
    write_corpus(folder / "data")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return folder


@pytest.mark.parametrize("text", [PACKED, WINDOWED], ids=["packed", "windowed"])
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_config_resolve_prints_the_document_of_a_token_run(
    run: Path, text: str, suffix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    path = run / f"stream{suffix}"
    path.write_text(json.dumps(yaml.safe_load(text)) if suffix == ".json" else text)
    config = BatchStreamConfig.from_file(path)
    layout = "packing" if text is PACKED else "windows"
    assert getattr(config.stages[0], layout) is not None
    assert main(["config", "resolve", str(path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    with open_batch_stream(config) as stream:
        next(stream)
        assert printed == stream.checkpoint().resolved_config()
    stage = printed["stages"][0]
    assert stage[layout]["seq_len"] == 8
    paths = [shard["path"] for source in stage["sources"] for shard in source["shards"]]
    assert paths == [str(run / "data/a.parquet"), str(run / "data/b.parquet")]


@pytest.mark.parametrize("text", [PACKED, WINDOWED], ids=["packed", "windowed"])
def test_o41_trace_follows_the_windows_of_a_token_run(
    run: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = run / "stream.yaml"
    path.write_text(text)
    assert main(["trace", str(path), "--global-batch", "0", "--to", "2"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = trace_batches(BatchStreamConfig.from_file(path), range(3))
    assert lines == [json.loads(json.dumps(dataclasses.asdict(row))) for row in expected]
    assert lines
    assert all(line["window"] for line in lines if not line["padding"])
    # Each window names the documents it holds: the record and its tokens.
    assert all(line["documents"] for line in lines if not line["padding"])
    assert all(set(d) == {"record", "start", "end", "position"} for line in lines for d in line["documents"])
    assert main(["trace", str(path), "--global-batch", "0", "--rows"]) == 0
    with_rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["record"]["documents"] for line in with_rows] == [
        line["documents"] for line in lines[: len(with_rows)]
    ]
    assert {line["path"] for line in lines if not line["padding"]} <= {
        str(run / "data/a.parquet"),
        str(run / "data/b.parquet"),
    }


def test_a_config_written_by_to_json_reads_back_through_the_commands(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A config built in Python, with absolute paths, saved as the file the commands read.
    source = run / "stream.yaml"
    source.write_text(PACKED)
    config = BatchStreamConfig.from_file(source)
    saved = run / "saved" / "stream.json"
    saved.parent.mkdir()
    saved.write_text(config.to_json())
    assert BatchStreamConfig.from_file(saved) == config
    assert main(["trace", str(saved), "--global-batch", "3"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [json.loads(json.dumps(dataclasses.asdict(row))) for row in trace_batches(config, 3)]


SFT = """\
fields:
  - {name: input_ids, source: input_ids, dtype: i32, length: 8}
  - {name: labels, source: "@labels", dtype: i64, length: 8, pad: -100}
  - {name: segment_ids, source: "@segment_ids", dtype: i32, length: 8}
stages:
  - sources:
      - {files: [data/a.parquet], columns: {input_ids: tokens}}
    batch_size: 1
    packing: {field: input_ids, seq_len: 8, overflow: drop}
"""


def test_a_config_file_maps_columns_drops_long_documents_and_shifts_labels(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = run / "sft.yaml"
    path.write_text(SFT)
    assert main(["config", "resolve", str(path)]) == 0
    document = json.loads(capsys.readouterr().out)
    source = document["stages"][0]["sources"][0]
    assert source["columns"] == {"input_ids": "tokens"}
    assert document["stages"][0]["packing"]["overflow"] == "drop"
    config = BatchStreamConfig.from_file(path)
    with open_batch_stream(config) as stream:
        rows = [b.arrays() for b in stream]
        assert stream.stats.sources[0].dropped_rows == 2  # a.parquet's 9- and 12-token documents
    for arrays in rows:
        ids, labels, segments = arrays["input_ids"][0], arrays["labels"][0], arrays["segment_ids"][0]
        for t in range(7):
            same = segments[t] > 0 and segments[t + 1] == segments[t]
            assert labels[t] == (ids[t + 1] if same else -100)
    assert main(["trace", str(path), "--global-batch", "0"]) == 0
    line = json.loads(capsys.readouterr().out.splitlines()[0])
    assert all(d["end"] - d["start"] <= 8 for d in line["documents"])
