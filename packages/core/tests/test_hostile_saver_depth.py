"""Issue 48, case 15: the dataset saver given a record nested 5,000 deep aborted the process
(``std::bad_alloc`` in Arrow's type inference, whose memory grows with the square of the depth)
under a 4 GB address-space cap. The depth is found first, and refused as a DataError naming the
record and field, for every format, whatever the cap."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from o41_training_data import LIMITS, DataError, TrainingData


def nest(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("data_format", ["parquet", "msgpack", "jsonl.gz"])
@pytest.mark.parametrize("depth", [LIMITS["max_nesting"] + 1, 300, 5_000])
def test_a_record_nested_past_the_limit_is_refused(tmp_path: Path, data_format: str, depth: int) -> None:
    saver = TrainingData().dataset_saver(str(tmp_path / "data-manifest-v1.json"), data_format=data_format)
    records = [{"ok": [1, 2, 3]}, {"ok": [4], "deep": nest(depth)}]
    with pytest.raises(DataError, match=r"record 1, field 'deep': nests more than 64 levels deep") as refused:
        saver.save("train", None, records, shard_id="0")
    assert refused.value.field == "deep"
    assert not list(tmp_path.rglob("*.done.json")), "nothing published"


def test_the_limit_itself_is_saved(tmp_path: Path) -> None:
    saver = TrainingData().dataset_saver(str(tmp_path / "data-manifest-v1.json"), data_format="msgpack")
    saver.save("train", None, [{"deep": nest(LIMITS["max_nesting"] - 1)}], shard_id="0")


def test_a_deep_record_is_refused_under_an_address_space_cap(tmp_path: Path) -> None:
    # As the issue ran it: a 4 GB cap on the whole process; before, Arrow aborted it.
    script = textwrap.dedent(
        f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        from o41_training_data import DataError, TrainingData
        value = 1
        for _ in range(5000):
            value = [value]
        saver = TrainingData().dataset_saver({str(tmp_path / "data-manifest-v1.json")!r})
        try:
            saver.save("train", None, [{{"deep": value}}], shard_id="0")
        except DataError as error:
            print("refused:", error)
            sys.exit(0)
        sys.exit(1)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "nests more than 64 levels deep" in done.stdout
