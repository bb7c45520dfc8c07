"""Checks of the installed wheel, run by ``make wheel-test`` with the bare venv's Python.

The venv holds the wheel (so PyArrow and NumPy) and the test runner's tools, nothing else: the
package must come from the wheel, depend on PyArrow and NumPy only, and its ``o41`` console
script must name the ``cli`` extra that is not installed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import o41_training_data

ROOT = Path(__file__).resolve().parent.parent

location = Path(o41_training_data.__file__).resolve()
assert ROOT / "packages" not in location.parents, f"imported from the source tree: {location}"
assert Path(sys.prefix) in location.parents, f"not the venv's copy: {location}"

requires = importlib.metadata.requires("o41-training-data") or []
core = sorted(re.split(r"[ <>=!~;\[]", r, maxsplit=1)[0] for r in requires if "extra ==" not in r)
assert core == ["numpy", "pyarrow"], f"the core must depend on PyArrow and NumPy only, not {core}"
for module in ("click", "rich", "yaml"):
    assert importlib.util.find_spec(module) is None, f"{module} is installed: the venv is not bare"

result = subprocess.run(
    [str(Path(sys.executable).parent / "o41"), "demo"], capture_output=True, text=True, check=False
)
assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
assert "pip install 'o41-training-data[cli]'" in result.stderr, result.stderr
print(f"wheel check: {location.parent} depends on {', '.join(core)}; o41 names the cli extra")
