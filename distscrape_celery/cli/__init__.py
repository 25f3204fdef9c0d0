"""The ``distscrape`` command: ``main`` is its entry point (``python -m distscrape_celery.cli``).

The group and the command runner are in :mod:`.group`. Each command module adds its commands to
the group when imported: :func:`main` imports them, once, which registers every command.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

__all__ = ["cli", "main"]


def main(argv: Optional[list[str]] = None) -> None:
    """Run ``distscrape`` with ``argv`` (see :func:`.group.main`). A Ctrl-C while the commands
    are still being imported (a few hundred milliseconds) ends it as one later does: one line
    and status 130, not a traceback."""
    try:
        from .group import main as run_command
        from . import api, archives, crawl, jobs, metrics, schedules, seed  # noqa: F401  (registers the commands)
    except KeyboardInterrupt:
        sys.stderr.write("distscrape: interrupted\n")
        sys.exit(130)
    run_command(argv)


def __getattr__(name: str) -> Any:
    if name == "cli":
        from .group import cli
        from . import api, archives, crawl, jobs, metrics, schedules, seed  # noqa: F401  (registers the commands)

        return cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
