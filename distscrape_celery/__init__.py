"""distscrape-celery: a distributed web scraper and crawler on Celery and Redis.

``celery -A distscrape_celery worker`` finds the Celery app as ``distscrape_celery.app``. It is
loaded on first access, so importing the package (e.g. for the CLI) reads no settings.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("app", "celery"):
        from .worker.app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
