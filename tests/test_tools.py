"""The repository's own checks (run by `make lint`) find what they are for, on small synthetic trees."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def tool(name: str) -> ModuleType:
    # The tools import their shared module from their own folder, as when run as scripts.
    if str(ROOT / "tools") not in sys.path:
        sys.path.insert(0, str(ROOT / "tools"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def crate(tmp_path: Path, files: dict[str, str]) -> Path:
    """A source tree (a crate's or a package's) of ``files`` under ``tmp_path/src``."""
    src = tmp_path / "src"
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    return src


def test_a_cycle_between_top_level_modules_is_reported_with_its_edges(tmp_path: Path) -> None:
    cycles = tool("rust_module_cycles")
    src = crate(
        tmp_path,
        {
            "lib.rs": "pub mod config;\npub mod formats;\n",
            "config.rs": "use crate::formats::{Promise, Other};\npub struct Spec;\n",
            "formats/mod.rs": "mod tokens;\npub struct Promise;\npub struct Other;\n",
            # The cycle closes through a submodule: formats::tokens uses config.
            "formats/tokens.rs": "use crate::config::Spec;\n",
        },
    )
    [problem] = cycles.check(src, max_lines=800)
    assert "a cycle of 2 modules" in problem
    assert "crate::config -> crate::formats" in problem
    assert "crate::formats -> crate::config (crate::formats::tokens uses crate::config::Spec)" in problem


def test_siblings_are_layers_but_a_parent_and_its_children_are_one_unit(tmp_path: Path) -> None:
    cycles = tool("rust_module_cycles")
    src = crate(
        tmp_path,
        {
            "lib.rs": "pub mod formats;\n",
            # The parent re-exports its child and the child uses the parent's shared item: no cycle.
            "formats/mod.rs": "mod parquet;\npub use parquet::Reader;\npub struct Meta;\n",
            "formats/parquet/mod.rs": "mod fetch;\nmod read;\nuse super::Meta;\npub use read::Reader;\n",
            # Siblings under formats::parquet that use each other are a cycle, inline paths included.
            "formats/parquet/fetch.rs": "pub fn held() { super::read::decode(); }\n",
            "formats/parquet/read.rs": "use super::fetch::held;\npub struct Reader;\npub fn decode() {}\n",
        },
    )
    [problem] = cycles.check(src, max_lines=800)
    assert "crate::formats::parquet::fetch -> crate::formats::parquet::read" in problem
    assert "crate::formats::parquet::read -> crate::formats::parquet::fetch" in problem
    assert "crate::formats ->" not in problem


def test_test_modules_comments_and_strings_make_no_edges_and_no_lines(tmp_path: Path) -> None:
    cycles = tool("rust_module_cycles")
    body = "\n".join(f"pub fn f{k}() {{}}" for k in range(5))
    src = crate(
        tmp_path,
        {
            "lib.rs": "pub mod a;\npub mod b;\n",
            "a.rs": "use crate::b::B;\n" + body + "\n",
            "b.rs": (
                'pub struct B;\n// crate::a::f0 in a comment\nconst S: &str = "crate::a::f1";\n'
                "#[cfg(test)]\nmod tests {\n    use crate::a::f2;\n" + "    // x\n" * 50 + "}\n"
            ),
        },
    )
    assert cycles.check(src, max_lines=800) == []
    assert cycles.lines_of_code(src / "b.rs") == 2
    [too_long] = cycles.check(src, max_lines=4)
    assert "a.rs: 6 lines of code (limit 4)" in too_long


def test_a_path_after_a_continued_string_or_a_quote_character_is_still_an_edge(tmp_path: Path) -> None:
    # A string continued with a backslash before its newline, a `"` character literal, an
    # apostrophe in a comment or a string: none may pair quotes across the code between them
    # and erase the path that closes the cycle.
    cycles = tool("rust_module_cycles")
    src = crate(
        tmp_path,
        {
            "lib.rs": "pub mod config;\npub mod fields;\n",
            "config.rs": (
                "pub fn check(s: &str) -> String {\n"
                "    let quote = '\"';\n"
                "    // the field's prefix\n"
                '    let m = format!("a message \\\n         continued, it\'s {quote}");\n'
                "    if s.starts_with(crate::fields::PREFIX) { m } else { String::new() }\n"
                "}\npub struct Spec<'a>(&'a str, char);\nconst Q: char = '\"';\n"
            ),
            "fields.rs": 'use crate::config::Spec;\npub const PREFIX: &str = "@length:";\n',
        },
    )
    [problem] = cycles.check(src, max_lines=800)
    assert "crate::config -> crate::fields (crate::config uses crate::fields::PREFIX)" in problem


def test_the_engine_has_no_module_cycle_and_no_oversized_file() -> None:
    cycles = tool("rust_module_cycles")
    for src in sorted(ROOT.glob("rust/*/src")):
        assert cycles.check(src, max_lines=800) == []


def test_an_import_cycle_through_a_deferred_or_type_only_import_is_reported(tmp_path: Path) -> None:
    imports = tool("python_import_cycles")
    src = crate(
        tmp_path,
        {
            "pkg/__init__.py": "from ._a import A\n",
            "pkg/_a.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._b import B\nA = 1\n"
            ),
            "pkg/_b.py": "def f():\n    from pkg import _a\n    return _a\n",
            "pkg/_c.py": "from . import _core\n",
            "pkg/_core.pyi": "def g() -> None: ...\n",
        },
    )
    [problem] = imports.check(src)
    assert "an import cycle of 2 modules" in problem
    assert "pkg._a -> pkg._b (pkg/_a.py:3)" in problem
    assert "pkg._b -> pkg._a (pkg/_b.py:2)" in problem
    # A compiled module (known by its stub) is a module of its own, not the package.
    assert imports.imports_of("pkg._c", src / "pkg" / "_c.py", imports.modules_of(src)) == {"pkg._core": 1}


def test_the_packages_have_no_import_cycle() -> None:
    imports = tool("python_import_cycles")
    for src in sorted(ROOT.glob("packages/*/src")):
        assert imports.check(src) == []


def test_a_message_broken_over_lines_without_a_backslash_is_found() -> None:
    breaks = tool("rust_string_breaks")
    source = (
        "fn f() -> String {\n"
        '    let ok = "one \\\n              two";\n'
        '    let raw = r#"a\nb"#;\n'
        '    let c = \'"\'; // a "quote" in a comment\n'
        '    let s: &\'static str = "x";\n'
        '    format!("declare\n                 dtype i32 {ok}{raw}{c}{s}")\n'
        "}\n"
    )
    assert breaks.broken_strings(source) == [8]


def test_no_engine_message_is_broken_over_lines() -> None:
    breaks = tool("rust_string_breaks")
    found = [
        (path, line)
        for path in sorted(ROOT.glob("rust/*/src/**/*.rs"))
        for line in breaks.broken_strings(path.read_text())
    ]
    assert found == []
