"""The item pipeline: the scrape and save tasks of one worker process, joined from its parts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Optional

from ..runtime import Runtime
from .failures import Failures
from .links import KnownLinks
from .publishing import Publisher
from .saving import Saving
from .scraped_saves import ScrapedSaves
from .scraping import Scraping


class ItemPipeline:
    """Scrapes and saves the items of any job for one worker process, publishing through
    ``publisher``. ``runtime`` holds what the process shares (settings, tracker, body staging,
    worker ID) and resolves each job's context (:meth:`Runtime.job_context`) once per creation
    of the job; the steps take that context, not the runtime, for what is the job's own."""

    def __init__(self, runtime: Runtime, publisher: Publisher) -> None:
        self.runtime = runtime
        self.publisher = publisher
        settings = runtime.settings
        failures = Failures(runtime.tracker, runtime.staging, publisher, settings.save_retry_delay)
        self.known_links = KnownLinks(settings.known_links_bytes)
        self._saving = Saving(runtime, publisher, failures)
        self._scraped_saves: Optional[ScrapedSaves] = (
            ScrapedSaves(runtime, publisher, failures, self._saving)
            if settings.save_batch_size > 1 else None)
        self._scraping = Scraping(runtime, publisher, failures, self.known_links, self._saving,
                                  self._scraped_saves)

    def scrape(self, job: str, item: str, go_on: Optional[Callable[[], bool]] = None) -> str:
        """Lease and download ``item``, queue what it links to, hand it to a save task (or save
        it here, with the ``save_inline`` setting); with ``go_on``, carry on with more items of
        the job while ``go_on()`` says so (:meth:`Scraping.scrape`). Returns what happened to
        ``item`` (for logs and tests)."""
        return self._scraping.scrape(job, item, go_on)

    def carried(self) -> list[tuple[str, str, float]]:
        """(job, item, since: ``time.time()``) of each item a scrape carried on to and is on now:
        held by this process although no task names it."""
        return self._scraping.carried()

    def save(self, job: str, item: str, token: int, meta: dict) -> str:
        """Save a scraped item through the job's saver, then mark it done."""
        return self._saving.save(job, item, token, meta)

    def save_batch(self, job: str, saves: Sequence[tuple[str, int, dict]]) -> list[str]:
        """Save several scraped items with one tracker round trip to begin them all
        (:meth:`Saving.save_batch`); returns what happened to each."""
        return self._saving.save_batch(job, saves)

    def flush(self, timeout: float = 30.0) -> bool:
        """Queue the save tasks of every item scraped so far now, or save them here
        (``save_inline``); a worker stopping calls it. True if none is left waiting."""
        return self._scraped_saves is None or self._scraped_saves.flush(timeout)
