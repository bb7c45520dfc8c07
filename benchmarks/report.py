"""Shared pieces of the benchmark scripts: machine description and RESULTS.md sections."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

import o41_training_data
import pyarrow as pa

RESULTS = Path(__file__).parent / "RESULTS.md"
HEADER = """# Benchmark results

Each section is written by the script it names, from one run on one machine; figures are
medians of repeated runs with contenders alternating, and ratios compare figures of the same
run. Re-run with `make bench`.
"""


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def preamble(command: str) -> str:
    return (
        f"- Date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}\n"
        f"- Machine: {machine()}\n"
        f"- Versions: Python {platform.python_version()}, "
        f"o41-training-data {o41_training_data.__version__}, pyarrow {pa.__version__}\n"
        f"- Command: `{command}`\n"
    )


def write_section(name: str, body: str) -> None:
    """Replaces (or appends) the section ``name`` of RESULTS.md."""
    text = RESULTS.read_text() if RESULTS.exists() else HEADER
    if not text.startswith("# Benchmark results"):
        text = HEADER
    block = f"<!-- section:{name} -->\n{body.strip()}\n<!-- end:{name} -->"
    pattern = re.compile(rf"<!-- section:{re.escape(name)} -->.*?<!-- end:{re.escape(name)} -->", re.DOTALL)
    text = (
        pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    )
    RESULTS.write_text(text)


def run_child(
    command: list[str], env: dict[str, str] | None = None, timeout: float | None = None
) -> dict[str, Any]:
    """Runs one measurement in a fresh process and returns the JSON object it printed last.

    NumPy's OpenBLAS pool spins a core for about a tenth of a second after import, waiting for
    work no contender gives it; on a two-core machine that halves what a fresh process measures
    first (open, the first batch) and adds to its CPU time. Children run with one BLAS thread
    unless ``env`` says otherwise.
    """
    env = {**(os.environ if env is None else env)}
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env, timeout=timeout)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result
