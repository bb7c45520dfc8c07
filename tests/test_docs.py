"""The README's and the docs' Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.DOTALL)


EXAMPLES = [(path, i, code) for path in DOCUMENTS for i, code in enumerate(python_blocks(path))]


def test_there_are_examples() -> None:
    assert any(path.name == "README.md" for path, _, _ in EXAMPLES)


@pytest.mark.parametrize(("path", "index", "code"), EXAMPLES, ids=[f"{p.name}-{i}" for p, i, _ in EXAMPLES])
def test_example_runs(
    path: Path, index: int, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"example_{index}"}
    exec(compile(code, f"{path.name}[{index}]", "exec"), namespace)
