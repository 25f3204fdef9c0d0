"""The ``distscrape`` command: ``main`` is its entry point (``python -m distscrape_celery.cli``).

The group and ``main`` are in :mod:`.group`. Each command module adds its commands to the group
when imported: importing them here, once, registers every command.
"""

from .group import cli, main
from . import archives, crawl, jobs, metrics, seed  # noqa: F401,E402  (registers the commands)

__all__ = ["cli", "main"]
