"""The ``o41`` console script's entry point.

The commands (``_commands.py``) are built on click and rich, which the ``cli`` extra installs
(``pip install 'o41-training-data[cli]'``), so that the core package depends on PyArrow and NumPy
only. Without the extra, ``o41`` says which extra to install and exits with status 2.

Exit status, for every command: 0 success; 1 a check found problems (``manifest verify``) or
differences (``manifest diff``); 2 a usage error (unknown option, missing argument, missing
``cli`` extra); 3 an error doing the work (a bad config or checkpoint file, a missing or
malformed shard, storage), reported on stderr naming the file or option at fault; 130 when
interrupted.
"""

from __future__ import annotations

import sys

from ._exit import EXIT_ERROR, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE

__all__ = ["EXIT_ERROR", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "main"]

# The modules the commands need that the core package does not install.
_EXTRA_MODULES = ("click", "rich", "yaml")


def main(argv: list[str] | None = None) -> int:
    """Runs ``o41`` with ``argv`` (default: the process's arguments); returns the exit status."""
    try:
        from ._commands import run
    except ImportError as error:
        if error.name is None or error.name.split(".")[0] not in _EXTRA_MODULES:
            raise
        print(
            f"o41: the command line needs the 'cli' extra ({error.name} is not installed); "
            "install it with: pip install 'o41-training-data[cli]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return run(argv)
