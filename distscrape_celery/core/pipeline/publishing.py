"""What the pipeline sends to the broker, and how it sends the scrape messages a step hands out."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol

log = logging.getLogger(__name__)


class Publisher(Protocol):
    """Sends tasks to the broker."""

    def scrape(self, job: str, items: Sequence[str]) -> None:
        """Publish one scrape task per item."""

    def save(self, job: str, item: str, token: int, meta: dict, delay: float = 0) -> None:
        """Publish the save task of an item scraped under lease ``token``, to run after ``delay``."""

    def save_batch(self, job: str, saves: Sequence[tuple[str, int, dict]]) -> None:
        """Publish one save task for several scraped items: (item, token, meta) each."""

    def batch(self) -> AbstractContextManager[None]:
        """A block whose publishes may be sent together when it ends (none if it raises); the
        send's error is raised at the end of the block."""


def dispatch(publisher: Publisher, job: str, items: Sequence[str]) -> None:
    """Publish a scrape task for each of ``items``, which the tracker handed out (if any)."""
    if items:
        publisher.scrape(job, items)


def dispatch_or_keep(publisher: Publisher, job: str, item: str, found: list[str]) -> list[str]:
    """Publish ``found`` (handed out while ``item`` was scraped) now; what the broker refused
    is returned, to go with the page's save, or to be sent again when the page ends."""
    if not found:
        return found
    try:
        dispatch(publisher, job, found)
    except Exception as exc:
        log.warning("%s %s: could not queue %d scrape messages yet, trying again with the "
                    "page's save or when it ends: %s", job, item, len(found), exc)
        return found
    return []
