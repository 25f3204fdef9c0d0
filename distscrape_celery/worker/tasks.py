"""The Celery tasks: thin wrappers that hand each item to :class:`~.pipeline.ItemPipeline`."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from typing import NamedTuple, Optional

from celery.utils.nodenames import anon_nodename
from kombu import Producer
from kombu.utils.uuid import uuid

from ..core.pipeline import ItemPipeline, left_for_recovery
from ..core.runtime import current_runtime
from ..errors import TrackerUnavailable
from .app import app, current_settings
from .names import SAVE_BATCH_TASK, SAVE_TASK, SCRAPE_TASK

log = logging.getLogger(__name__)


class _OwnProducer(NamedTuple):
    """A thread's kept producer, and what it was made for: the app's connection pool (replaced
    by configure_app) and the process (a fork must not share its connection)."""

    pool: object
    pid: int
    producer: Producer


class CeleryPublisher:
    """Publishes our tasks. Inside :meth:`batch`, every message this thread publishes goes to the
    broker in one round trip when the block ends (kombu's publish batch: one Redis pipeline).

    A message is built by Celery (``app.amqp.as_task_v2``: protocol 2, the same headers, parent
    and root IDs as ``apply_async``) and handed to kombu's producer for the queue's name on the
    default exchange, which is where ``apply_async`` routes a direct queue too. What it skips, at
    about 45 % of the cost of publishing a page's messages (docs/performance.md): Celery's
    router and option merging, the ``before/after_task_publish`` signals (nothing here listens),
    publish retries (a batch sends nothing until it ends), a ``reply_to`` for results that are
    never kept, and kombu copying and binding the queue for every message only to find it
    declared already.
    """

    def __init__(self) -> None:
        # Per thread (threads pool): the open batch's producer, and the thread's own producer.
        self._local = threading.local()
        self._origin: tuple[int, str] = (0, "")

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Publish what is published in the block together at its end; if the block raises,
        nothing of it is sent. Raises what the broker raised when the batch is sent."""
        if getattr(self._local, "producer", None) is not None:
            yield  # nested: the outer batch sends it all
            return
        producer = self._own_producer()
        try:
            with producer.batch():
                self._local.producer = producer
                try:
                    yield
                finally:
                    self._local.producer = None
        except BaseException:
            # Its connection may be broken: the thread's next batch starts on a new one.
            self._drop_own_producer()
            raise

    def _own_producer(self) -> Producer:
        """This thread's producer on a broker connection of its own, kept between batches.

        Celery's producer pool would hand out a producer per batch and bind it to a connection
        again each time (a third of the cost of publishing, docs/performance.md). The cost of keeping
        one: a broker connection per publishing thread. It is rebuilt after a fork, and when
        :func:`~.celery_app.configure_app` replaced the app's connections (another broker).
        """
        pool, pid = app.pool, os.getpid()
        own = getattr(self._local, "own", None)
        if own is not None and own.pool is pool and own.pid == pid:
            return own.producer
        self._drop_own_producer()
        producer = app.amqp.Producer(app.connection_for_write())
        self._local.own = _OwnProducer(pool, pid, producer)
        return producer

    def _drop_own_producer(self) -> None:
        own, self._local.own = getattr(self._local, "own", None), None
        if own is not None and own.pid == os.getpid():  # a forked child leaves its parent's be
            with contextlib.suppress(Exception):
                own.producer.connection.close()

    def scrape(self, job: str, items: Sequence[str]) -> None:
        settings = current_settings()
        with self.batch():
            for item in items:
                self._send(SCRAPE_TASK, settings.scrape_queue, (job, item))

    def save(self, job: str, item: str, token: int, meta: dict, delay: float = 0) -> None:
        with self.batch():
            self._send(SAVE_TASK, current_settings().save_queue, (job, item, token, meta),
                       countdown=delay or None)

    def save_batch(self, job: str, saves: Sequence[tuple[str, int, dict]]) -> None:
        with self.batch():
            self._send(SAVE_BATCH_TASK, current_settings().save_queue,
                       (job, [list(entry) for entry in saves]))

    def _send(self, name: str, queue: str, args: tuple, countdown: Optional[float] = None) -> None:
        producer, conf = self._local.producer, app.conf
        parent_id = root_id = None
        parent = app.current_worker_task
        if parent is not None:  # Flower shows the task that queued this one
            parent_id = parent.request.id
            root_id = parent.request.root_id or parent_id
        headers, properties, body, _ = app.amqp.as_task_v2(
            uuid(), name, args, None, countdown=countdown, root_id=root_id, parent_id=parent_id,
            ignore_result=True, origin=self._origin_name(), time_limit=conf.task_time_limit,
            soft_time_limit=conf.task_soft_time_limit, **_reprs(args),
        )
        queue_obj = app.amqp.queues[queue]
        # kombu keeps what a connection declared (and forgets it on reconnect): declare the queue
        # once per connection, as apply_async would, so that AMQP brokers have it before use.
        declared = producer.connection.declared_entities
        producer.publish(
            body, exchange="", routing_key=queue, serializer="json", headers=headers,
            delivery_mode=conf.task_default_delivery_mode, retry=False,
            declare=None if hash(queue_obj) in declared else [queue_obj], **properties,
        )

    def _origin_name(self) -> str:
        """Celery's ``origin`` header (``gen<pid>@<host>``), computed once per process."""
        pid = os.getpid()
        if self._origin[0] != pid:
            self._origin = (pid, anon_nodename())
        return self._origin[1]


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
