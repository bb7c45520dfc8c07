"""Across the packages: each adapter imports the core of its own version, and the core's tests
stay independent of every adapter (the wheel test runs them with the core alone)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import o41_training_data
import pytest

ROOT = Path(__file__).resolve().parent.parent
ADAPTERS = ("o41_training_data_torch", "o41_training_data_jax", "o41_training_data_lightning")


@pytest.mark.parametrize("module", ["o41_training_data_jax", "o41_training_data_lightning"])
def test_adapter_skeletons_import_the_core(module: str) -> None:
    adapter = importlib.import_module(module)
    assert adapter.core_version == o41_training_data.__version__


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_core_tests_import_no_adapter_nor_framework() -> None:
    tests = sorted((ROOT / "packages" / "core" / "tests").glob("*.py"))
    assert tests
    for path in tests:
        found = imported_roots(path) & {*ADAPTERS, "torch", "jax", "lightning", "flax", "orbax"}
        assert not found, f"{path.relative_to(ROOT)} imports {sorted(found)}"


def private_core_imports(path: Path) -> list[str]:
    """The core's private names (``_core``, ``_rules``, ...) ``path`` imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [
            m for m in modules if m.startswith("o41_training_data.") and m.split(".")[1].startswith("_")
        ]
    return [name for name in found if not name.endswith(".__version__")]


def test_adapters_use_the_cores_public_names_only() -> None:
    sources = sorted((ROOT / "packages").glob("*/src/o41_training_data_*/*.py"))
    assert len({path.parent for path in sources}) == len(ADAPTERS)
    for path in sources:
        assert not private_core_imports(path), f"{path.relative_to(ROOT)}: {private_core_imports(path)}"
