"""The Celery tasks: thin wrappers that hand each item to :class:`~.pipeline.ItemPipeline`."""

from __future__ import annotations

from typing import Optional

from ..core.pipeline import ItemPipeline
from ..core.pipeline.failures import left_for_recovery
from ..core.runtime import current_runtime
from ..errors import TrackerUnavailable
from .app import app, current_settings
from .names import SAVE_BATCH_TASK, SAVE_TASK, SCRAPE_TASK
from .publish import publisher

_pipeline: Optional[ItemPipeline] = None


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
    """Download one item (URL or ID), queue the items found in it, and chain its save task."""
    try:
        return pipeline().scrape(job, item)
    except TrackerUnavailable as exc:
        return left_for_recovery(job, item, exc)


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
