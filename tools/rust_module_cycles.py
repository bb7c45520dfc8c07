"""Fails on any module cycle in the Rust crates, and on any Rust source file over its size limit.

A module is one source file (``lib.rs`` is the crate root, ``a/mod.rs`` is ``a``, ``a/b.rs`` is
``a::b``). Module ``m`` uses module ``n`` when ``m`` names an item of ``n`` through a ``crate::``,
``super::`` or ``self::`` path, or a path starting with one of its own child modules, in a ``use``
declaration or inline, outside its ``#[cfg(test)]`` modules; ``mod`` declarations only place a
file. A path resolves to the deepest module file it names.

Layers are siblings: an edge from ``a::x::...`` to ``a::y::...`` is an edge between the siblings
``a::x`` and ``a::y`` under their common parent ``a``, so ``crate::formats::tokens`` using
``crate::order::pack`` makes ``formats`` use ``order``. A module and its own descendants are one
unit (a parent re-exports its children, a child uses its parent's shared items), so edges
between them are not layer edges. Every strongly connected component of two or more siblings is
a cycle and is reported with the edges that make it.

Lines of code count what is left of a file without its ``#[cfg(test)]`` modules, comments and
blank lines; a file over ``--max-lines`` (800) fails too.

Usage: ``python tools/rust_module_cycles.py [CRATE_SRC ...]`` (default: every ``rust/*/src``).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from strongly_connected import components

ROOT = Path(__file__).resolve().parent.parent
_PATH = re.compile(r"\b(crate|super|self)((?:::\w+)+)")
_USE = re.compile(r"\buse\s+((?:crate|super|self)::[^;]*);", re.DOTALL)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
# Comments, string literals (raw ones closed by as many `#` as opened them; an escape may be a
# backslash before a newline, which continues the string) and character literals, found in one
# left-to-right pass so that none is read inside another: a quote in a comment, `"` as a char,
# an apostrophe in a string. A lifetime (`'a`) is no character literal: one has its closing
# quote after one character or escape.
_TOKEN = re.compile(
    r"(?P<comment>//[^\n]*|/\*.*?\*/)"
    r'|(?P<string>b?r(?P<hashes>#*)".*?"(?P=hashes)|b?"(?:\\.|[^"\\])*")'
    r"|(?P<char>b?'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]{1,6}\}|.)|[^'\\\n])')",
    re.DOTALL,
)


def module_of(src: Path, file: Path) -> tuple[str, ...]:
    """The module path of ``file`` in the crate whose sources are under ``src``."""
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts.pop()
    return tuple(parts)


def strip(text: str) -> str:
    """The code of ``text`` without comments, string and character literals."""

    def blank(match: re.Match[str]) -> str:
        return " " if match.group("comment") else '""'

    return _TOKEN.sub(blank, text)


def without_tests(code: str) -> str:
    """``code`` without its ``#[cfg(test)] mod ... { ... }`` blocks."""
    out, i = [], 0
    for match in re.finditer(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", code):
        if match.start() < i:
            continue
        out.append(code[i : match.start()])
        depth, j = 1, match.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        i = j
    out.append(code[i:])
    return "".join(out)


def expand(tree: str) -> Iterable[str]:
    """The paths a ``use`` tree names: ``a::{b, c::{d, self}}`` gives ``a::b``, ``a::c::d``, ``a::c``."""
    tree = re.sub(r"\s+", "", tree)
    brace = tree.find("{")
    if brace < 0:
        yield re.sub(r"::self$", "", re.sub(r"\bas\w+$", "", tree)) if " as " not in tree else tree
        return
    prefix, inner = tree[:brace], tree[brace + 1 : tree.rindex("}")]
    depth, start = 0, 0
    for k, char in enumerate(inner + ","):
        if char in "{":
            depth += 1
        elif char == "}":
            depth -= 1
        elif char == "," and depth == 0:
            part = inner[start:k]
            start = k + 1
            if part:
                for path in expand(part):
                    yield prefix + path if path != "self" else prefix.rstrip(":")


def resolve(path: str, here: tuple[str, ...], modules: set[tuple[str, ...]]) -> tuple[str, ...]:
    """The deepest module that ``path`` (``crate::a::b``, ``super::x``, ``self::y``) names."""
    head, *rest = path.split("::")
    rest = [re.sub(r"as\w+$", "", part) for part in rest if part and part != "*"]
    if head == "crate":
        base: tuple[str, ...] = ()
    elif head == "self":
        base = here
    else:  # super: the parent of this module
        base = here[:-1]
        while rest and rest[0] == "super":
            rest.pop(0)
            base = base[:-1]
    best = base
    for k in range(1, len(rest) + 1):
        candidate = base + tuple(rest[:k])
        if candidate in modules:
            best = candidate
    return best


def graph(src: Path) -> dict[tuple[str, ...], dict[tuple[str, ...], str]]:
    """Each module's dependencies, with the first path that makes each one."""
    files = {module_of(src, f): f for f in sorted(src.rglob("*.rs"))}
    modules = set(files)
    edges: dict[tuple[str, ...], dict[tuple[str, ...], str]] = {m: {} for m in modules}
    for module, file in files.items():
        code = without_tests(strip(file.read_text()))
        children = "|".join(c[-1] for c in modules if c[:-1] == module and len(c) == len(module) + 1)
        # Paths that start at a child module (`use parquet::X`, `parquet::read(...)`) are self:: paths.
        if children:
            code = re.sub(rf"(?<![\w:])({children})::", r"self::\1::", code)
        paths = [p for tree in _USE.findall(code) for p in expand(tree)]
        paths += [head + tail for head, tail in _PATH.findall(_USE.sub(" ", code))]
        for path in paths:
            target = resolve(path, module, modules)
            if target != module:
                edges[module].setdefault(target, path)
    return edges


def layers(
    edges: dict[tuple[str, ...], dict[tuple[str, ...], str]],
) -> dict[tuple[str, ...], dict[tuple[str, ...], str]]:
    """The module edges as edges between siblings; a module and its descendants are one unit."""
    lifted: dict[tuple[str, ...], dict[tuple[str, ...], str]] = {}
    for source, targets in edges.items():
        for target, path in targets.items():
            common = 0
            while common < min(len(source), len(target)) and source[common] == target[common]:
                common += 1
            if common == len(source) or common == len(target):
                continue  # an ancestor and its descendant
            a, b = source[: common + 1], target[: common + 1]
            lifted.setdefault(a, {}).setdefault(b, f"{name(source)} uses {path}")
            lifted.setdefault(b, {})
    return lifted


def cycles(edges: dict[tuple[str, ...], dict[tuple[str, ...], str]]) -> list[list[tuple[str, ...]]]:
    """The strongly connected components of two or more modules."""
    return components(edges)


def lines_of_code(file: Path) -> int:
    """Non-blank lines of ``file`` outside comments and ``#[cfg(test)]`` modules."""
    code = without_tests(_COMMENT.sub("", file.read_text()))
    return sum(1 for line in code.splitlines() if line.strip())


def name(module: tuple[str, ...]) -> str:
    """``crate::a::b`` for ``("a", "b")``."""
    return "::".join(("crate", *module))


def check(src: Path, max_lines: int) -> list[str]:
    """The problems of the crate under ``src``: its cycles and its oversized files."""
    problems = []
    edges = layers(graph(src))
    for component in cycles(edges):
        members = set(component)
        lines = [
            f"  {name(a)} -> {name(b)} ({path})"
            for a in component
            for b, path in sorted(edges[a].items())
            if b in members
        ]
        problems.append(f"{src}: a cycle of {len(component)} modules:\n" + "\n".join(lines))
    for file in sorted(src.rglob("*.rs")):
        count = lines_of_code(file)
        if count > max_lines:
            problems.append(
                f"{file.relative_to(ROOT) if ROOT in file.parents else file}: {count} lines of code"
                f" (limit {max_lines})"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    """Checks the crates named on the command line (default: every crate under ``rust/``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", nargs="*", type=Path)
    parser.add_argument("--max-lines", type=int, default=800)
    args = parser.parse_args(argv)
    sources = args.src or sorted(ROOT.glob("rust/*/src"))
    problems = [p for src in sources for p in check(src, args.max_lines)]
    for problem in problems:
        print(problem)
    if not problems:
        print(f"no module cycle, no file over {args.max_lines} lines of code in {len(sources)} crates")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
