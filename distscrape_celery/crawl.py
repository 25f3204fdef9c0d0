"""The one-command crawl on one machine: everything it needs is started here and stopped after."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Optional

from .embedded import EmbeddedRedis
from .jobspec import JobSpec
from .local import WorkerProcess
from .manager import CrawlManager
from .settings import Settings
from .tracker import JobStats, RedisTracker

Progress = Callable[[JobStats], None]


@dataclass(frozen=True)
class CrawlResult:
    job: str
    stats: JobStats
    seconds: float
    dead: dict[str, str]

    @property
    def pages_per_second(self) -> float:
        return self.stats.done / self.seconds if self.seconds > 0 else 0.0


@contextlib.contextmanager
def redis_for_crawl(settings: Settings, use_embedded: bool) -> Iterator[Settings]:
    """Yield settings that point at a reachable Redis, starting an embedded one if asked."""
    if not use_embedded:
        yield settings
        return
    with EmbeddedRedis() as server:
        yield settings.model_copy(update={"redis_url": server.url, "broker_url": None})


def run_local_crawl(
    job: str,
    spec: JobSpec,
    settings: Settings,
    *,
    embedded_redis: bool,
    concurrency: int = 4,
    on_progress: Optional[Progress] = None,
    timeout: Optional[float] = None,
) -> CrawlResult:
    """Crawl ``spec`` with a real worker process (prefork, ``concurrency`` pool processes) on this
    machine and wait until it is finished."""
    from .celery_app import configure_app
    from .tasks import publisher

    with redis_for_crawl(settings, embedded_redis) as settings:
        tracker = RedisTracker.from_settings(settings)
        configure_app(settings)
        worker = WorkerProcess(settings, name=f"distscrape-{job}", concurrency=concurrency)
        try:
            worker.start()
            manager = CrawlManager(tracker, publisher.scrape)
            started = time.monotonic()
            manager.seed(job, spec)
            stats = manager.wait(job, timeout=timeout, on_progress=on_progress, check=worker.check)
            seconds = time.monotonic() - started
            return CrawlResult(job, stats, seconds, tracker.dead_items(job))
        finally:
            worker.stop()


def run_in_memory_crawl(
    job: str,
    spec: JobSpec,
    settings: Settings,
    *,
    concurrency: int = 4,
    on_progress: Optional[Progress] = None,
    timeout: Optional[float] = None,
) -> CrawlResult:
    """Crawl ``spec`` in this process: InMemoryTracker, Celery's in-memory transport and an
    in-process worker. No Redis, no broker; for small crawls."""
    from celery.contrib.testing.worker import start_worker

    from .agent import WorkerAgent
    from .celery_app import app, configure_app
    from .runtime import Runtime, install_runtime
    from .tasks import publisher

    configure_app(settings, in_memory=True)
    runtime = Runtime.in_memory_runtime(settings)
    install_runtime(runtime)
    agent = WorkerAgent(runtime, concurrency=concurrency, publish=publisher.scrape)
    try:
        with start_worker(
            app, pool="threads", concurrency=concurrency, perform_ping_check=False,
            loglevel="WARNING", shutdown_timeout=60,
        ):
            agent.register()
            agent.start()
            try:
                manager = CrawlManager(runtime.tracker, publisher.scrape)
                started = time.monotonic()
                manager.seed(job, spec)
                stats = manager.wait(job, timeout=timeout, on_progress=on_progress)
                seconds = time.monotonic() - started
            finally:
                agent.stop()
        return CrawlResult(job, stats, seconds, runtime.tracker.dead_items(job))
    finally:
        install_runtime(None)
