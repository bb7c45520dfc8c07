"""The README's and the docs' examples run as written.

Every Python block runs on its own, in a fresh namespace: it imports what it uses, so a reader
can paste any one of them into a new interpreter. Most pages hold independent examples, each run
in a fresh directory. The pages in ``SESSIONS`` are walkthroughs instead: their blocks run in
order in one directory, as a reader would type them, so a block may use the files an earlier
one wrote (never its variables): a block titled ``title="NAME"`` is written to the file NAME,
and each ``$ command`` line of a ``console`` block runs in a shell, where it must exit with 0
(or with the status a trailing ``# exits N`` names).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SESSIONS = {"cli.md", "quickstart.md"}
BLOCK = re.compile(r"```(\w+)([^\n]*)\n(.*?)```", flags=re.DOTALL)


def blocks(path: Path) -> list[tuple[str, str, str]]:
    """``(language, info after it, code)`` of every fenced block of ``path``."""
    return [(lang, info.strip(), code) for lang, info, code in BLOCK.findall(path.read_text())]


def python_blocks(path: Path) -> list[str]:
    return [code for lang, _, code in blocks(path) if lang == "python"]


EXAMPLES = [
    (path, i, code)
    for path in DOCUMENTS
    if path.name not in SESSIONS
    for i, code in enumerate(python_blocks(path))
]


def test_there_are_examples() -> None:
    assert any(path.name == "README.md" for path, _, _ in EXAMPLES)
    assert {path.name for path in DOCUMENTS} >= SESSIONS


@pytest.mark.parametrize(("path", "index", "code"), EXAMPLES, ids=[f"{p.name}-{i}" for p, i, _ in EXAMPLES])
def test_example_runs(
    path: Path, index: int, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"example_{index}"}
    exec(compile(code, f"{path.name}[{index}]", "exec"), namespace)


def run_console(block: str, where: str, env: dict[str, str]) -> int:
    """Runs each ``$ `` line of a console block; returns how many ran."""
    commands = [line[2:] for line in block.splitlines() if line.startswith("$ ")]
    for command in commands:
        expected = re.search(r"#\s*exits\s+(\d+)\s*$", command)
        status = int(expected.group(1)) if expected else 0
        result = subprocess.run(command, shell=True, env=env, capture_output=True, text=True, check=False)
        assert result.returncode == status, (
            f"{where}: `{command}` exited with {result.returncode}, not {status}\n"
            f"{result.stdout}\n{result.stderr}"
        )
    return len(commands)


@pytest.mark.parametrize("name", sorted(SESSIONS))
def test_walkthrough_runs_in_order(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # `o41 bench` runs the benchmark suite of the checkout around the current directory.
    (tmp_path / "benchmarks").symlink_to(ROOT / "benchmarks")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    ran = 0
    for index, (lang, info, code) in enumerate(blocks(ROOT / "docs" / name)):
        where = f"{name}[{index}]"
        title = re.search(r'title="([^"]+)"', info)
        if title:
            (tmp_path / title.group(1)).write_text(code)
        elif lang == "python":
            namespace: dict[str, object] = {"__name__": f"walkthrough_{name}_{index}"}
            exec(compile(code, where, "exec"), namespace)
        elif lang == "console":
            ran += run_console(code, where, env)
        else:
            # Install lines (`sh`) are the only blocks a reader runs outside the walkthrough.
            assert lang == "sh", where
            assert all(shlex.split(line)[:1] == ["pip"] for line in code.splitlines() if line), where
    assert ran > 0


def test_docstring_examples_are_sections_the_api_reference_renders() -> None:
    # mkdocstrings (griffe, Google style) renders an "Examples:" section as code; "Example:" would
    # become an admonition whose ">>>" lines render as nested block quotes.
    singular = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "packages").glob("*/src/**/*.py*"))
        if path.suffix in {".py", ".pyi"}  # not the bytecode a run may leave in __pycache__
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if line.strip() == "Example:"
    ]
    assert singular == []
