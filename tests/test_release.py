"""The release workflow builds what the README promises and tests the wheel as `make wheel-test` does."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())


def maturin_steps(job: str) -> list[dict]:
    return [
        s["with"]
        for s in WORKFLOW["jobs"][job]["steps"]
        if s.get("uses", "").startswith("PyO3/maturin-action@")
    ]


def test_wheels_for_linux_x86_64_and_aarch64_manylinux_2_28_macos_arm64_and_an_sdist() -> None:
    (linux,) = maturin_steps("linux")
    assert WORKFLOW["jobs"]["linux"]["strategy"]["matrix"]["target"] == ["x86_64", "aarch64"]
    assert linux["manylinux"] == "2_28"
    (macos,) = maturin_steps("macos")
    assert WORKFLOW["jobs"]["macos"]["runs-on"] == "macos-14"  # an arm64 runner
    assert macos["target"] == "aarch64"
    (sdist,) = maturin_steps("sdist")
    assert sdist["command"] == "sdist"
    for step in (linux, macos, sdist):
        assert step["working-directory"] == "packages/core"  # where pyproject.toml names the module
    for step in (linux, macos):
        assert "--release" in step["args"].split()
    assert set(WORKFLOW["jobs"]["publish"]["needs"]) == {"linux", "macos", "sdist", "test-wheel"}


def test_the_abi3_build_is_what_the_binding_declares() -> None:
    cargo = (ROOT / "rust" / "Cargo.toml").read_text()
    assert re.search(r'^pyo3 = \{.*"abi3-py310"', cargo, flags=re.MULTILINE)


def test_the_release_tests_the_wheel_as_make_wheel_test_does() -> None:
    makefile = (ROOT / "Makefile").read_text()
    block = re.search(r"^WHEEL_TEST_DEPS = (.*?)\n(?!\t)", makefile, flags=re.MULTILINE | re.DOTALL)
    assert block is not None
    deps = block.group(1).replace("\\\n", " ").split()
    run = next(s["run"] for s in WORKFLOW["jobs"]["test-wheel"]["steps"] if "run" in s)
    # The wheel alone first (wheel_check.py wants a bare venv), then what the tests need.
    assert re.search(r"pip install dist/o41_training_data-\*\.whl\n.*wheel_check\.py", run)
    installed = re.search(r"pip install (pytest .*?)\n(?! )", run, flags=re.DOTALL)
    assert installed is not None
    assert installed.group(1).replace("\\\n", " ").split() == deps
    # Both run the core's whole tests folder with the test kit, never a hand-kept list.
    assert "pytest -q -p no:cacheprovider packages/core/tests" in run
    assert "packages/core/tests" in makefile
    assert "--no-deps packages/testkit" in run
    assert run.index("wheel_check.py") < run.index("--no-deps packages/testkit")
