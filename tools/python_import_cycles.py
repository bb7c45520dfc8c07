"""Fails on any import cycle among the modules of each Python package under ``packages/*/src``.

Every ``import`` and ``from ... import`` counts, relative or absolute, at module level or inside a
function (a deferred import still ties the two modules together) or under ``if TYPE_CHECKING:``
(a cycle of types is still a cycle of the design). ``from . import name`` names the submodule
``name`` where one exists, else the package. A package's ``__init__`` re-exports its modules,
so edges into ``__init__`` from its own submodules are reported like any other.

Usage: ``python tools/python_import_cycles.py [SRC ...]`` (default: every ``packages/*/src``).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

from strongly_connected import components

ROOT = Path(__file__).resolve().parent.parent


def modules_of(src: Path) -> dict[str, Path]:
    """Every module under ``src``, by dotted name (a package is its ``__init__``).

    A compiled module counts through its ``.pyi`` stub, so ``from . import _core`` names it.
    """
    found = {}
    for file in sorted([*src.rglob("*.py"), *src.rglob("*.pyi")]):
        parts = list(file.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts and (file.suffix == ".py" or ".".join(parts) not in found):
            found[".".join(parts)] = file
    return found


def imports_of(name: str, file: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The modules of ``modules`` that module ``name`` imports, with the line of the first import."""
    if file.suffix == ".pyi":
        return {}  # a compiled module imports nothing of the package
    tree = ast.parse(file.read_text(), str(file))
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        # The deepest module the dotted name names.
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.setdefault(target, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                origin = ".".join([*base, node.module] if node.module else base)
            else:
                origin = node.module or ""
            for alias in node.names:
                submodule = f"{origin}.{alias.name}"
                add(submodule if submodule in modules else origin, node.lineno)
    return found


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of two or more modules."""
    return components(edges)


def check(src: Path) -> list[str]:
    """The import cycles among the modules under ``src``, each with the imports that make it."""
    modules = modules_of(src)
    edges = {name: imports_of(name, file, modules) for name, file in modules.items()}
    problems = []
    for component in cycles(edges):
        members = set(component)
        lines = [
            f"  {a} -> {b} ({modules[a].relative_to(src)}:{line})"
            for a in component
            for b, line in sorted(edges[a].items())
            if b in members
        ]
        problems.append(f"{src}: an import cycle of {len(component)} modules:\n" + "\n".join(lines))
    return problems


def main(argv: list[str] | None = None) -> int:
    """Checks the source trees named on the command line (default: every package's)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("src", nargs="*", type=Path)
    args = parser.parse_args(argv)
    sources = args.src or sorted(ROOT.glob("packages/*/src"))
    problems = [p for src in sources for p in check(src)]
    for problem in problems:
        print(problem)
    if not problems:
        print(f"no import cycle in {len(sources)} Python source trees")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
