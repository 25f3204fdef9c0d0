"""The Celery tasks: thin wrappers that hand each item to :class:`~.pipeline.ItemPipeline`."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Optional

from celery.worker import state as worker_state

from ..core.pipeline import ItemPipeline
from ..core.pipeline.failures import left_for_recovery
from ..core.runtime import current_runtime
from ..errors import TrackerUnavailable
from .app import app, current_settings
from .names import SAVE_BATCH_TASK, SAVE_TASK, SCRAPE_TASK
from .publish import publisher

_pipeline: Optional[ItemPipeline] = None
# The process whose heartbeat keeps the leases of the items its tasks carry on to (see
# carry_here); in any other (a prefork pool process) every item is a task of its own.
_carrying_pid: Optional[int] = None

def pipeline() -> ItemPipeline:
    """The process's pipeline: one per runtime, so what it learns once per domain (robots.txt's
    Crawl-delay, passed to the tracker) costs one round trip per process, not one per page."""
    global _pipeline
    runtime = current_runtime(current_settings)
    if _pipeline is None or _pipeline.runtime is not runtime:
        _pipeline = ItemPipeline(runtime, publisher)
    return _pipeline


@app.task(name=SCRAPE_TASK, ignore_result=True)
def scrape(job: str, item: str) -> str:
    """Download one item (URL or ID), queue the items found in it, and chain its save task;
    then, for up to ``carry_seconds``, the same for each item the tracker hands it next."""
    go_on = (_carry_for(current_settings().carry_seconds) if _carrying_pid == os.getpid()
             else None)
    try:
        return pipeline().scrape(job, item, go_on)
    except TrackerUnavailable as exc:
        return left_for_recovery(job, item, exc)


def carry_here() -> None:
    """Let this process's scrape tasks carry on from item to item: its worker agent, which keeps
    the leases of what they hold (:func:`carried_items`), runs here."""
    global _carrying_pid
    _carrying_pid = os.getpid()


def carried_items() -> list[tuple[str, str, float]]:
    """(job, item, since: ``time.time()``) of each item this process's scrape tasks carried on
    to and are on now."""
    return [] if _pipeline is None else _pipeline.carried()


def _carry_for(seconds: float) -> Optional[Callable[[], bool]]:
    """Whether a task begun now may still carry on with another item (None: it may not)."""
    if seconds <= 0:
        return None
    until = time.monotonic() + seconds
    return lambda: time.monotonic() < until and not _stopping()


def _stopping() -> bool:
    """Whether this worker was told to stop. Celery sets these flags to the exit code (0 for a
    warm shutdown) and reads them as its ``maybe_shutdown`` does."""
    return any(flag is not None and flag is not False
               for flag in (worker_state.should_stop, worker_state.should_terminate))


def flush_saves(timeout: float = 30.0) -> bool:
    """Queue the saves this process gathered (a worker stopping calls it). True if none is
    left waiting."""
    return _pipeline is None or _pipeline.flush(timeout)


@app.task(name=SAVE_TASK, ignore_result=True)
def save(job: str, item: str, token: int, meta: dict) -> str:
    """Store one downloaded item (scraped under lease ``token``) through the job's saver, then
    mark it done."""
    try:
        return pipeline().save(job, item, token, meta)
    except TrackerUnavailable as exc:
        return left_for_recovery(job, item, exc)


@app.task(name=SAVE_BATCH_TASK, ignore_result=True)
def save_batch(job: str, saves: list) -> list[str]:
    """Store several downloaded items, each ``[item, token, meta]``, as :func:`save` would."""
    return pipeline().save_batch(job, saves)
