"""Start-up: importing the package and the ``o41`` commands that do no data work load neither
NumPy, PyArrow, Jinja nor tokenizers (benchmarks/startup_bench.py has the times).

Each check runs in a fresh interpreter and asserts on the modules loaded, not on time, so that
it holds on a loaded machine.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import o41_training_data
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

O41 = str(Path(sys.executable).parent / "o41")
HEAVY = ("numpy", "pyarrow", "jinja2", "tokenizers")
PACKAGE = Path(o41_training_data.__file__)


def imported(command: list[str]) -> set[str]:
    """The top-level modules a fresh ``python -X importtime`` run of ``command`` imports."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *command], capture_output=True, text=True, check=True
    )
    return {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def test_importing_the_package_loads_no_heavy_module() -> None:
    assert imported(["-c", "import o41_training_data"]).isdisjoint(HEAVY)
    # A name whose module needs neither comes without them too.
    assert imported(["-c", "from o41_training_data import ConfigError, Checkpoint, __version__"]).isdisjoint(
        HEAVY
    )


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["trace", "--help"]])
def test_o41_answers_without_numpy_or_pyarrow(argv: list[str]) -> None:
    assert imported([O41, *argv]).isdisjoint(HEAVY)


def test_o41_trace_of_a_config_loads_no_heavy_module(tmp_path: Path) -> None:
    # Tracing computes the order from row counts in the engine: nothing to decode in Python.
    pq.write_table(pa.table({"v": pa.array(range(100), pa.int64())}), tmp_path / "part.parquet")
    config = {
        "fields": [{"name": "v", "source": "v", "dtype": "i64"}],
        "stages": [{"sources": [{"files": ["part.parquet"]}], "batch_size": 4}],
    }
    (tmp_path / "stream.json").write_text(json.dumps(config))
    assert imported([O41, "trace", str(tmp_path / "stream.json"), "--global-batch", "3"]).isdisjoint(HEAVY)


def test_o41_trace_and_show_of_a_checkpoint_load_no_heavy_module(tmp_path: Path) -> None:
    from o41_training_data import BatchStreamConfig, open_batch_stream, write_checkpoint

    pq.write_table(pa.table({"v": pa.array(range(100), pa.int64())}), tmp_path / "part.parquet")
    config = BatchStreamConfig.from_dict(
        {
            "fields": [{"name": "v", "source": "v", "dtype": "i64"}],
            "stages": [{"sources": [{"files": [str(tmp_path / "part.parquet")]}], "batch_size": 4}],
        }
    )
    with open_batch_stream(config) as stream:
        next(stream)
        (tmp_path / "ck").mkdir()
        file = write_checkpoint(stream.checkpoint(), tmp_path / "ck" / "rank-0.json")
    assert imported([O41, "trace", str(file), "--global-batch", "3"]).isdisjoint(HEAVY)
    assert imported([O41, "checkpoint", "show", str(file)]).isdisjoint(HEAVY)


def test_every_public_name_imports_and_is_listed() -> None:
    names = o41_training_data.__all__
    code = f"from o41_training_data import {', '.join(names)}"
    subprocess.run([sys.executable, "-c", code], check=True)
    assert set(names) <= set(dir(o41_training_data))
    for name in names:
        assert getattr(o41_training_data, name) is not None
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = o41_training_data.no_such_name  # type: ignore[attr-defined]


def test_the_lazy_table_agrees_with_all_and_the_type_checking_imports() -> None:
    # Three lists name the public names (the lazy table, __all__, the imports type checkers
    # read): each must name every one, from the same module.
    tree = ast.parse(PACKAGE.read_text())
    [guard] = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
    ]
    typed = {
        alias.name: str(node.module)
        for node in guard.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    lazy = {name: module for module, names in o41_training_data._EXPORTS.items() for name in names}
    assert lazy == typed
    assert sorted(lazy) == sorted(o41_training_data.__all__)
    assert len(set(o41_training_data.__all__)) == len(o41_training_data.__all__)
