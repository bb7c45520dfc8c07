r"""Finds Rust string literals broken over lines without a continuation backslash.

A message written over several lines needs a ``\`` at each line's end; without it the line
break and the next line's indentation land in the message (``declare                 dtype``).
Raw strings (``r"..."``, ``r#"..."#``) keep their line breaks on purpose and are not checked.

Usage: ``python tools/rust_string_breaks.py [ROOT]`` (default ``rust/``); prints each literal
at fault as ``file:line`` and exits 1 if there is one.
"""

from __future__ import annotations

import sys
from pathlib import Path


def broken_strings(text: str) -> list[int]:
    """The lines (from 1) where a non-raw string literal of ``text`` holds a bare line break."""
    found: list[int] = []
    i, line, n = 0, 1, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            line += text.count("\n", i, end)
            i = end
        elif c == "r" and (text.startswith('r"', i) or text.startswith("r#", i)) and not _ident(text, i):
            j = i + 1
            hashes = 0
            while j < n and text[j] == "#":
                hashes += 1
                j += 1
            if j >= n or text[j] != '"':
                i += 1
                continue
            close = '"' + "#" * hashes
            end = text.find(close, j + 1)
            end = n if end < 0 else end + len(close)
            line += text.count("\n", i, end)
            i = end
        elif c == '"':
            i += 1
            start_line = line
            while i < n and text[i] != '"':
                if text[i] == "\\":
                    if i + 1 < n and text[i + 1] == "\n":
                        line += 1
                    i += 2
                    continue
                if text[i] == "\n":
                    if not found or found[-1] != start_line:
                        found.append(start_line)
                    line += 1
                i += 1
            i += 1
        elif c == "'":
            # A char literal ('x', '\n', '\''), or a lifetime ('a), which has no closing quote.
            if text.startswith("\\", i + 1):
                end = text.find("'", i + 3)
                i = n if end < 0 else end + 1
            elif i + 2 < n and text[i + 2] == "'":
                i += 3
            else:
                i += 1
        else:
            i += 1
    return found


def _ident(text: str, i: int) -> bool:
    """Whether the ``r`` at ``i`` ends an identifier (``for"`` is no raw string)."""
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")


def main(argv: list[str]) -> int:
    """Checks every ``.rs`` file under ``argv[1]`` (default ``rust/``); 1 if a literal is broken."""
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent / "rust"
    faults = [
        f"{path}:{line}: a string literal is broken over lines without a trailing backslash"
        for path in sorted(root.rglob("*.rs"))
        if "target" not in path.parts
        for line in broken_strings(path.read_text())
    ]
    print("\n".join(faults) or "no string literal broken over lines")
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
