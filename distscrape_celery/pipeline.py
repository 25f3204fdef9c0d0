"""What happens to one item: lease, download, find new items, stage, save, complete.

Celery-free so it can be tested and reasoned about alone; :mod:`.tasks` wraps it. The rule that
keeps data safe: an item is completed only after its saver returned, and every failure path
either hands the item back to the tracker or leaves it leased so that its lease expires.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from .errors import FetchError
from .fetch import Download
from .runtime import Runtime
from .tracker import LeaseStatus

log = logging.getLogger(__name__)


class Publisher(Protocol):
    """Sends tasks to the broker."""

    def scrape(self, job: str, items: Sequence[str]) -> None:
        """Publish one scrape task per item."""

    def save(self, job: str, item: str, ref: str, meta: dict) -> None:
        """Publish the save task of a scraped item."""


class ItemPipeline:
    def __init__(self, runtime: Runtime, publisher: Publisher) -> None:
        self.rt = runtime
        self.publisher = publisher

    def _dispatch(self, job: str, items: Sequence[str]) -> None:
        if items:
            self.publisher.scrape(job, items)

    def _fail(self, job: str, item: str, reason: str, *, retryable: bool, count: bool = True) -> str:
        spec = self.rt.spec(job)
        res = self.rt.tracker.fail(
            job, item, reason, max_retries=spec.max_retries, retryable=retryable, count=count
        )
        self._dispatch(job, res.dispatch)
        log.warning("%s %s: %s (%s)", job, item, reason, res.outcome.value)
        return res.outcome.value

    def scrape(self, job: str, item: str) -> str:
        """Lease and download ``item``, queue what it links to, hand it to a save task.
        Returns what happened (for logs and tests)."""
        tracker = self.rt.tracker
        co = tracker.checkout(job, item, self.rt.worker_id)
        self._dispatch(job, co.dispatch)
        if co.status is not LeaseStatus.OK:
            return co.status.value  # done, dead, busy elsewhere, or unknown: nothing to do
        scraper = self.rt.scraper(job)
        try:
            download = scraper.download(item)
        except FetchError as exc:
            return self._fail(job, item, str(exc), retryable=exc.retryable)
        except Exception as exc:  # a scraper bug must cost one item, never the worker
            log.exception("%s %s: scraper download raised", job, item)
            return self._fail(job, item, f"download error: {exc!r}", retryable=True)
        try:
            found = scraper.find_items(item, download)
        except Exception as exc:
            log.exception("%s %s: scraper find_items raised", job, item)
            return self._fail(job, item, f"scraper error: {exc!r}", retryable=True)
        if found:
            self._dispatch(job, tracker.add(job, found, co.depth + 1).dispatch)
        try:
            ref = self.rt.staging.stage(job, download.body)
            self.publisher.save(job, item, ref, download.meta())
        except Exception as exc:
            # Hand the item back now rather than wait for its lease to expire.
            return self._fail(job, item, f"could not queue the save: {exc}", retryable=True, count=False)
        return "scraped"

    def save(self, job: str, item: str, ref: str, meta: dict) -> str:
        """Save a scraped item through the job's saver, then mark it done."""
        body = self.rt.staging.take(job, ref)
        if body is None:
            return self._fail(
                job, item, "staged body expired before it was saved", retryable=True, count=False
            )
        try:
            self.rt.saver(job).save(item, Download.from_meta(meta, body))
        except Exception as exc:
            log.exception("%s %s: save failed", job, item)
            return self._fail(job, item, f"save failed: {exc}", retryable=True)
        res = self.rt.tracker.complete(job, item)
        self._dispatch(job, res.dispatch)
        return "saved" if res.changed else "saved-again"
