"""Scraped pages waiting in this worker process for their save batch, and their hand-over.

With save batches (``save_batch_size`` above 1) a scraped page does not get a save message of its
own: it waits here, with the scrape messages it handed out, and one message per job carries the
saves of many pages (or, with ``save_inline``, this process saves them itself, with no message).
"""

from __future__ import annotations

import logging
from typing import NamedTuple, Optional

from ..batching import Batcher
from ..context import JobContext
from ..runtime import Runtime
from ...tracker import Fault
from ...web.fetch import Download
from .failures import Failures
from .publishing import Publisher, dispatch
from .saving import ItemToStore, Saving

log = logging.getLogger(__name__)


class ScrapedSave(NamedTuple):
    """A scraped item waiting in its worker process for its save batch, with the items found in
    it that the tracker handed out for scraping. ``download``: the page itself, where this
    process saves it (``save_inline``); otherwise its body is staged and a save task takes it."""

    job: str
    item: str
    token: int
    meta: dict
    dispatch: list[str]
    download: Optional[Download] = None


def _by_job(saves: list[ScrapedSave]) -> dict[str, list[ScrapedSave]]:
    by_job: dict[str, list[ScrapedSave]] = {}
    for entry in saves:
        by_job.setdefault(entry.job, []).append(entry)
    return by_job


def page_holder(runtime: Runtime) -> Optional[str]:
    """Who holds a scraped page until its save message is out: this worker, where it must
    (``Runtime.keeps_scraped_pages``), so that the page comes back a lease after the worker
    dies, not a save timeout after; otherwise nobody, and no hand-over follows the message."""
    return runtime.worker_id if runtime.keeps_scraped_pages else None


def hand_over(runtime: Runtime, job: str, saves: list[tuple[str, int]]) -> None:
    """Give the items of save messages just queued (item, token) the save timeout: from
    now on the broker holds them, not this worker's lease."""
    try:
        runtime.tracker.handoff(job, runtime.worker_id, saves)
    except Exception as exc:
        # The messages are out: each save runs, and if it waits longer than a lease its
        # item is downloaded again meanwhile, which the late save's complete settles.
        log.warning("%s: could not hand over %d queued saves: %s", job, len(saves), exc)


class ScrapedSaves:
    """Gathers scraped pages (:class:`ScrapedSave`) from the tasks of this process and passes
    them on in groups of ``save_batch_size``, at most ``save_batch_seconds`` after the first."""

    def __init__(
        self, runtime: Runtime, publisher: Publisher, failures: Failures, saving: Saving
    ) -> None:
        self.runtime = runtime
        self.publisher = publisher
        self.failures = failures
        self.saving = saving
        settings = runtime.settings
        self._batcher: Batcher[ScrapedSave] = Batcher(
            self._save_here if settings.save_inline else self._queue_saves,
            max_items=settings.save_batch_size, max_wait=settings.save_batch_seconds,
            name="distscrape-saves",
        )

    def add(self, save: ScrapedSave) -> None:
        """Let ``save`` wait for its batch (blocks while too many batches wait already)."""
        self._batcher.add(save)

    def flush(self, timeout: float = 30.0) -> bool:
        """Pass on every page gathered so far now. True if none is left waiting."""
        return self._batcher.flush(timeout)

    def may_wait(self, context: JobContext) -> bool:
        """Whether the scrape messages a page hands out may wait in this process for its save
        batch (up to ``save_batch_seconds``) instead of going to the broker at once.

        Only where no domain's cap can limit the crawl: a held message counts as in flight, so
        under a cap that the workers could fill, holding it stretches every fetch cycle of the
        domain by the batch's wait. With the default cap (8) the one-site crawl ran at half its
        pages/s on a 50 ms site and at a quarter on loopback (docs/performance.md).
        The cap is compared with the task slots of the live workers. And only where the broker may
        hold more scrape messages than there are slots: with fewer, the held messages would be
        most of what the broker has for the idle slots (the default holds a quarter)."""
        tracker = self.runtime.tracker
        slots = tracker.worker_slots()
        return (context.spec.politeness.smallest_concurrency >= slots
                and tracker.dispatch_bound() > slots)

    def _queue_saves(self, saves: list[ScrapedSave]) -> None:
        """Publish one save task per job for ``saves``, with the scrape messages of the items
        found in them: one broker round trip. What cannot be published is handed back."""
        for job, group in _by_job(saves).items():
            try:
                with self.publisher.batch():
                    dispatch(self.publisher, job, [x for entry in group for x in entry.dispatch])
                    self.publisher.save_batch(job, [(e.item, e.token, e.meta) for e in group])
            except Exception as exc:
                self._give_back(job, group, exc)
                continue
            if page_holder(self.runtime) is not None:
                hand_over(self.runtime, job, [(e.item, e.token) for e in group])

    def _give_back(self, job: str, group: list[ScrapedSave], exc: Exception) -> None:
        """The save message of ``group`` could not be queued (``exc``): hand its items back now
        rather than a lease later. Scrape messages that were not sent leave their items
        dispatched: reclaimed within a lease."""
        for entry in group:
            try:
                self.runtime.staging.discard(job, entry.token)
                self.failures.fail(self.runtime.job_context(job), entry.item, entry.token,
                                   f"could not queue the save: {exc}", fault=Fault.FREE)
            except Exception as again:  # the tracker reclaims it within a lease
                log.warning("%s %s: left for recovery: %s", job, entry.item, again)

    def _save_here(self, saves: list[ScrapedSave]) -> None:
        """Save ``saves``, scraped by this process and held under its saving leases, as
        :meth:`Saving.save_batch` saves a batch it has begun, one group per job, and publish the
        scrape messages that waited with them: a save batch with no save task (``save_inline``)."""
        for job, group in _by_job(saves).items():
            stores = [ItemToStore(i, e.item, e.token, e.download, False) for i, e in enumerate(group)]
            results: list[Optional[str]] = [None] * len(stores)
            try:
                with self.publisher.batch():
                    dispatch(self.publisher, job, [x for entry in group for x in entry.dispatch])
                    self.saving.store_all(self.runtime.job_context(job), stores, results,
                                          together=True)
            except Exception as exc:
                # Not saved, or saved with what they handed out unsent: either way the tracker
                # reclaims what is left in flight within a lease.
                log.warning("%s: %d saves ended early (%d saved): %s", job, len(group),
                            results.count("saved"), exc)
