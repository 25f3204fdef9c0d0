"""The Celery tasks: thin wrappers that hand each item to :class:`~.pipeline.ItemPipeline`."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Optional

from .celery_app import SAVE_TASK, SCRAPE_TASK, app, current_settings
from .errors import TrackerUnavailable
from .pipeline import ItemPipeline
from .runtime import current_runtime

log = logging.getLogger(__name__)


class CeleryPublisher:
    """Publishes our tasks. Inside :meth:`batch`, every message this thread publishes goes to the
    broker in one round trip when the block ends (kombu's publish batch: one Redis pipeline)."""

    def __init__(self) -> None:
        self._local = threading.local()  # the open batch's producer, per thread (threads pool)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Publish what is published in the block together at its end; if the block raises,
        nothing of it is sent. Raises what the broker raised when the batch is sent."""
        if getattr(self._local, "producer", None) is not None:
            yield  # nested: the outer batch sends it all
            return
        with app.producer_or_acquire() as producer, producer.batch():
            self._local.producer = producer
            try:
                yield
            finally:
                self._local.producer = None

    def scrape(self, job: str, items: Sequence[str]) -> None:
        with self.batch():
            for item in items:
                args = (job, item)
                scrape.apply_async(args, producer=self._local.producer, **_reprs(args))

    def save(self, job: str, item: str, token: int, meta: dict, delay: float = 0) -> None:
        with self.batch():
            args = (job, item, token, meta)
            save.apply_async(args, countdown=delay or None, producer=self._local.producer,
                             **_reprs(args))


# The arguments' text that Flower shows: Python's repr, at a tenth of the cost of Celery's saferepr
# per message, and the same text for our arguments (strings, numbers, a flat dict) but for how a
# quote inside a string is escaped.
_REPR_MAX = 1024  # Celery's own limit (amqp.argsrepr_maxsize)


def _reprs(args: tuple) -> dict[str, str]:
    text = repr(args)
    if len(text) > _REPR_MAX:
        text = text[:_REPR_MAX - 3] + "..."
    return {"argsrepr": text, "kwargsrepr": "{}"}


publisher = CeleryPublisher()


_pipeline: Optional[ItemPipeline] = None


def pipeline() -> ItemPipeline:
    """The process's pipeline: one per runtime, so what it learns once per domain (robots.txt's
    Crawl-delay, passed to the tracker) costs one round trip per process, not one per page."""
    global _pipeline
    runtime = current_runtime(current_settings)
    if _pipeline is None or _pipeline.rt is not runtime:
        _pipeline = ItemPipeline(runtime, publisher)
    return _pipeline


def _tracker_down(job: str, item: str, exc: TrackerUnavailable) -> str:
    # The item stays in flight in the tracker; its deadline passes and it is reclaimed. One line,
    # not a traceback per task, while Redis is down.
    log.warning("%s %s: left for recovery, the tracker is unavailable: %s", job, item, exc)
    return "tracker-unavailable"


@app.task(name=SCRAPE_TASK, ignore_result=True)
def scrape(job: str, item: str) -> str:
    """Download one item (URL or ID), queue the items found in it, and chain its save task."""
    try:
        return pipeline().scrape(job, item)
    except TrackerUnavailable as exc:
        return _tracker_down(job, item, exc)


@app.task(name=SAVE_TASK, ignore_result=True)
def save(job: str, item: str, token: int, meta: dict) -> str:
    """Store one downloaded item (scraped under lease ``token``) through the job's saver, then
    mark it done."""
    try:
        return pipeline().save(job, item, token, meta)
    except TrackerUnavailable as exc:
        return _tracker_down(job, item, exc)
