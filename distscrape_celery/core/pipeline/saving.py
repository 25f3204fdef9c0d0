"""Saving scraped items: a save task's item, or a save batch's items, through the job's saver.

A save begins in the tracker (the item turns saving under this worker's lease, and its staged
body comes back), goes to the saver, and completes in the tracker: only after the saver returned.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import NamedTuple, Optional

from ..context import JobContext
from ..runtime import Runtime
from ...errors import TrackerUnavailable
from ...savers import ItemSaver
from ...tracker import Fault, SaveBegin, SaveStart
from ...tracker.revisits import RevisitOutcome, RevisitUpdate
from ...web.fetch import Download
from .failures import Failures, left_for_recovery
from .publishing import Publisher, dispatch

log = logging.getLogger(__name__)


def saved_revisit(download: Download) -> Optional[RevisitUpdate]:
    """What the tracker records of a saved page of a job that revisits (None for other jobs)."""
    if not download.revisit:
        return None
    outcome = RevisitOutcome.UNCHANGED if download.unchanged else RevisitOutcome.SAVED
    return RevisitUpdate(outcome, download.revisit)


def page_record(job: str, download: Download) -> dict:
    """The record every page gives: its URL, status, fetch time (ISO 8601, UTC) and job."""
    fetched_at = datetime.fromtimestamp(download.fetched_at, timezone.utc)
    return {
        "url": download.url, "status": download.status,
        "fetched_at": fetched_at.isoformat().replace("+00:00", "Z"), "job": job,
    }


def for_saver(saver: ItemSaver, job: str, download: Download) -> Download:
    """``download`` as ``saver`` takes it: for a saver that saves records, with the page's
    record (:func:`page_record`) as its one record."""
    if not saver.saves_records:
        return download
    return dataclasses.replace(download, records=(page_record(job, download),))


class ItemToStore(NamedTuple):
    """A downloaded item of a save batch, to be stored: its entry's index, its lease and body,
    and whether that lease is stale (another run holds the item now)."""

    index: int
    item: str
    token: int
    download: Download
    stale: bool


class Saving:
    """Saves scraped items through their job's saver, then marks them done in the tracker;
    what beginning and completing hand out for scraping goes to ``publisher``."""

    def __init__(self, runtime: Runtime, publisher: Publisher, failures: Failures) -> None:
        self.runtime = runtime
        self.publisher = publisher
        self.failures = failures

    def save(self, job: str, item: str, token: int, meta: dict) -> str:
        """Save a scraped item through the job's saver, then mark it done."""
        runtime = self.runtime
        context = runtime.job_context(job)
        begin = runtime.tracker.begin_save(
            job, item, token, runtime.worker_id, max_lost=context.spec.max_lost)
        context = runtime.job_context(job, begin.created)
        outcome = self._download_to_store(context, item, token, meta, begin)
        if isinstance(outcome, str):
            return outcome
        return self.store(context, item, token, outcome, stale=begin.status is SaveStart.STALE)

    def save_batch(self, job: str, saves: Sequence[tuple[str, int, dict]]) -> list[str]:
        """Save several scraped items, each as :meth:`save` would, with one tracker round trip to
        begin them all; returns what happened to each.

        With a saver that commits groups (:meth:`ItemSaver.commits_groups`: the file saver makes
        them durable with two disk flushes, not two per item), the bodies go to it together and
        the items are marked done together once all are stored. Otherwise, and for a batch of
        which an item was interrupted before (its holder vanished, ``lost``), each item is saved
        and marked done in turn, so that a save that kills its process costs the items before it
        no second write."""
        entries = [(item, int(token), meta) for item, token, meta in saves]
        runtime = self.runtime
        context = runtime.job_context(job)
        try:
            begins = runtime.tracker.begin_saves(
                job, [(item, token) for item, token, _ in entries], runtime.worker_id,
                max_lost=context.spec.max_lost,
            )
        except TrackerUnavailable as exc:
            # Left in flight: the tracker reclaims them (the worker's heartbeat keeps them until
            # the batch is over, then a lease).
            log.warning("%s: %d saves left for recovery, the tracker is unavailable: %s",
                        job, len(entries), exc)
            return ["tracker-unavailable"] * len(entries)
        if begins:
            context = runtime.job_context(job, begins[0].created)
        results: list[Optional[str]] = [None] * len(entries)
        try:
            # What beginning and completing hand out for scraping goes to the broker together,
            # at the end.
            with self.publisher.batch():
                stores = self._begun_stores(context, entries, begins, results)
                self.store_all(context, stores, results,
                               together=not any(begin.lost for begin in begins))
        except Exception as exc:
            if None in results:  # not the batch's send at the end
                raise
            # Every item is saved or handed back; what the tracker handed out for scraping meanwhile
            # (and a save to look at again later) was not queued: reclaimed within a lease.
            log.warning("%s: could not queue what %d saves handed out: %s", job, len(entries), exc)
        return results  # type: ignore[return-value]

    def _begun_stores(
        self, context: JobContext, entries: list[tuple[str, int, dict]], begins: list[SaveBegin],
        results: list[Optional[str]],
    ) -> list[ItemToStore]:
        """The entries of a begun batch that are to be stored; what happened instead to the
        others goes to ``results`` at their index."""
        stores: list[ItemToStore] = []
        for index, ((item, token, meta), begin) in enumerate(zip(entries, begins)):
            try:
                outcome = self._download_to_store(context, item, token, meta, begin)
            except TrackerUnavailable as exc:
                outcome = left_for_recovery(context.job, item, exc)
            if isinstance(outcome, str):
                results[index] = outcome
            else:
                stores.append(ItemToStore(index, item, token, outcome,
                                          begin.status is SaveStart.STALE))
        return stores

    def store_all(
        self, context: JobContext, stores: list[ItemToStore], results: list[Optional[str]], *,
        together: bool,
    ) -> None:
        """Store ``stores``: as one group where ``together`` allows and the job's saver commits
        groups, else each alone; each result goes to ``results`` at its entry's index."""
        if together and len(stores) > 1 and self._commits_groups(context):
            self._store_together(context, stores, results)
            return
        for store in stores:
            try:
                results[store.index] = self.store(
                    context, store.item, store.token, store.download, stale=store.stale)
            except TrackerUnavailable as exc:
                results[store.index] = left_for_recovery(context.job, store.item, exc)

    @staticmethod
    def _commits_groups(context: JobContext) -> bool:
        """Whether the job's saver commits groups; False if it cannot be built, so that each
        item's own save meets (and reports) the error."""
        try:
            return context.saver().commits_groups()
        except Exception:
            return False

    def _store_together(
        self, context: JobContext, stores: list[ItemToStore], results: list[Optional[str]]
    ) -> None:
        """Hand ``stores`` to the saver as one group, then mark the stored ones done in one
        tracker round trip; each result goes to ``results`` at its entry's index."""
        stored = self._saved_together(context, stores, results)
        if not stored:
            return
        job = context.job
        try:
            # The staged bodies are dropped in the same step.
            revisits = [saved_revisit(s.download) for s in stored]
            done = self.runtime.tracker.complete_many(
                job, [(s.item, s.token) for s in stored], *([revisits] if any(revisits) else []))
        except TrackerUnavailable as exc:
            for store in stored:  # saved; saved again once the tracker reclaims them
                results[store.index] = left_for_recovery(job, store.item, exc)
            return
        for store, completed in zip(stored, done):
            dispatch(self.publisher, job, completed.dispatch)
            results[store.index] = "saved" if completed.changed else "saved-again"

    def _saved_together(
        self, context: JobContext, stores: list[ItemToStore], results: list[Optional[str]]
    ) -> list[ItemToStore]:
        """Hand ``stores`` to the saver as one group: those it stored are returned, what
        happened to the others goes to ``results``."""
        saver = context.saver()
        try:
            outcomes = saver.save_many(
                [(s.item, for_saver(saver, context.job, s.download)) for s in stores])
            if len(outcomes) != len(stores):
                raise RuntimeError(f"save_many returned {len(outcomes)} results for {len(stores)} items")
        except Exception as exc:  # a saver bug: as if each save had raised it
            outcomes = [exc] * len(stores)
        stored = []
        for store, outcome in zip(stores, outcomes):
            if isinstance(outcome, BaseException):
                try:
                    results[store.index] = self.failures.save_failed(
                        context, store.item, store.token, store.download, outcome, stale=store.stale)
                except TrackerUnavailable as exc:
                    results[store.index] = left_for_recovery(context.job, store.item, exc)
            else:
                stored.append(store)
        return stored

    def _download_to_store(
        self, context: JobContext, item: str, token: int, meta: dict, begin: SaveBegin
    ) -> "str | Download":
        """What to do once ``begin_save`` answered: the download to store, or what happened
        instead (skipped, busy, stale, failed). Raises TrackerUnavailable."""
        job = context.job
        dispatch(self.publisher, job, begin.dispatch)
        if begin.status in (SaveStart.DONE, SaveStart.DEAD, SaveStart.UNKNOWN):
            self.runtime.staging.discard(job, token)
            if begin.status is SaveStart.DEAD:
                log.warning("%s %s: given up on before its save (lost %d times)", job, item, begin.lost)
            return f"save-skipped-{begin.status.value}"
        if begin.status is SaveStart.BUSY:
            # Another run of this very save holds a live lease: a duplicate delivery, or the
            # redelivery of a run whose process just died and whose lease has not run out yet.
            # Look again soon: by then it is done, or back to waiting for its save.
            self.publisher.save(job, item, token, meta,
                                delay=self.runtime.settings.heartbeat_interval)
            return "save-busy"
        stale = begin.status is SaveStart.STALE
        if begin.lost and not stale:
            log.warning(
                "%s %s: saving again; the worker holding it vanished %d time(s) so far",
                job, item, begin.lost,
            )
        if begin.body is not None:
            return Download.from_meta(meta, begin.body)
        if stale:
            return "stale"
        return self.failures.fail(
            context, item, token,
            "its staged body was gone when the save ran (it waited longer than the body's "
            "TTL, or Redis lost it); it will be downloaded again",
            fault=Fault.LOST,
        )

    def store(
        self, context: JobContext, item: str, token: int, download: Download, *, stale: bool = False
    ) -> str:
        """Hand ``download`` to the job's saver under lease ``token``, then mark the item done."""
        try:
            saver = context.saver()
            saver.save(item, for_saver(saver, context.job, download))
        except Exception as exc:
            return self.failures.save_failed(context, item, token, download, exc, stale=stale)
        # Drops the staged body too.
        completed = self.runtime.tracker.complete(context.job, item, token, saved_revisit(download))
        dispatch(self.publisher, context.job, completed.dispatch)
        return "saved" if completed.changed else "saved-again"
