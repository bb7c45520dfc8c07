"""The ``o41`` command's exit statuses (docs/cli.md), apart from the entry point and the commands.

``_cli`` (the entry point, importable without the ``cli`` extra) and ``_commands`` (the click
commands) both use them; keeping them here lets ``_cli`` import ``_commands`` and not the reverse.
"""

from __future__ import annotations

__all__ = ["EXIT_ERROR", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE"]

EXIT_OK = 0
"""Success."""
EXIT_FAILED = 1
"""A check found problems (``manifest verify``) or differences (``manifest diff``)."""
EXIT_USAGE = 2
"""A usage error: an unknown option, a missing argument, the missing ``cli`` extra."""
EXIT_ERROR = 3
"""An error doing the work, reported on stderr naming the file or option at fault."""
EXIT_INTERRUPTED = 130
"""Interrupted (SIGINT)."""
