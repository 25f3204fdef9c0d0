"""The ``distscrape`` command: ``main`` is its entry point (``python -m distscrape_celery.cli``)."""

from .commands import main

__all__ = ["main"]
