"""The item pipeline without Celery: a publisher that records what it would send, one that runs
what it is sent in this thread (a whole crawl, inline), the routes of the pipeline tests' site,
and a pipeline on a real Redis tracker with one registered worker."""

from __future__ import annotations

import contextlib
import errno
import time
from collections import deque

from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.core.pipeline import ItemPipeline
from distscrape_celery.core.runtime import Runtime
from distscrape_celery.job.spec import JobSpec, build_spec
from distscrape_celery.tracker.keys import JobKeys
from tests.support.crawl import crawl_settings


def lease_runs_out(rt, job, item):
    """As if the process running ``item`` died a lease ago: nobody kept its lease."""
    rt.tracker.client.zadd(JobKeys(job).leased, {item: 0}, xx=True)


class Recorder:
    """A publisher that remembers what would have been sent to the broker."""

    def __init__(self) -> None:
        self.scrapes: list[str] = []
        self.saves: list[tuple] = []
        self.delays: list[float] = []
        self.batches: list[list[tuple]] = []

    def scrape(self, job, items):
        self.scrapes.extend(items)

    def save(self, job, item, token, meta, delay=0):
        self.saves.append((job, item, token, meta))
        self.delays.append(delay)

    def save_batch(self, job, saves):
        self.batches.append([tuple(entry) for entry in saves])
        for item, token, meta in saves:
            self.save(job, item, token, meta)

    def batch(self):
        return contextlib.nullcontext()


ROUTES = {
    "/ok": (200, b'<a href="/ok2">x</a><a href="http://elsewhere.invalid/">off</a>'),
    "/ok2": (200, b"leaf"),
    "/hostile": (200, b"<html>" + b"<div>" * 3000 + b"\x00\xff\xfe<a href='/ok2'>" + b"\x80" * 5000),
    "/gone": (404, b"not here"),
    "/flaky": (503, b"try later"),
}


def pipeline_env(redis_url, server, tmp_path, politeness=None, **settings):
    # A save message per page, sent at once, unless a test gathers them (save_batch_size).
    settings.setdefault("save_batch_size", 1)
    # Room for 8 scrape messages (4 task slots, below): these tests are about what a page hands
    # out, not about the broker's bound.
    settings.setdefault("dispatch_factor", 2)
    rt = Runtime.for_redis(crawl_settings(redis_url, lease_seconds=30, **settings))
    rt.tracker.register_worker("test", 1, 4)  # the only live worker: 4 task slots
    spec = build_spec(
        {"seeds": [server.base + "/ok"], "saver": {"output": str(tmp_path / "out")}, "max_retries": 1,
         **({"politeness": politeness} if politeness else {})}
    )
    rt.tracker.create_job("p", spec.to_json(), spec.crawl_limits())
    rec = Recorder()
    return rt, ItemPipeline(rt, rec), rec, server


def full_disk_save(item, download):
    """A saver's save on a full disk."""
    from distscrape_celery.errors import SaveError

    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError as exc:
        raise SaveError(f"cannot write {item!r}: No space left on device") from exc


class InlinePublisher:
    """Runs the tasks the pipeline publishes in this thread, in order, instead of via a broker."""

    def __init__(self) -> None:
        self.tasks: deque = deque()

    def scrape(self, job, items):
        self.tasks.extend(("scrape", job, item) for item in items)

    def save(self, job, item, token, meta, delay=0):
        self.tasks.append(("save", job, item, token, meta))

    def save_batch(self, job, saves):
        self.tasks.extend(("save", job, item, token, meta) for item, token, meta in saves)

    def batch(self):
        return contextlib.nullcontext()


def crawl_inline(rt: Runtime, job: str, spec: JobSpec, max_tasks: int = 500, timeout: float = 30):
    """Run the job's tasks in this thread until it is finished. When no task is left but items
    wait out a backoff, do what a worker's heartbeat does: ``maintain`` hands them out when due."""
    publish = InlinePublisher()
    pipe = ItemPipeline(rt, publish)
    rt.tracker.register_worker("inline", 1, 4)
    CrawlManager(rt.tracker, publish.scrape).seed(job, spec)
    deadline = time.monotonic() + timeout
    for _ in range(max_tasks):
        if not publish.tasks and pipe.flush() and publish.tasks:
            continue  # the gathered saves
        if not publish.tasks:
            if rt.tracker.stats(job).finished or time.monotonic() > deadline:
                break
            publish.scrape(job, rt.tracker.maintain(job, max_lost=spec.max_lost).dispatch)
            if not publish.tasks:
                time.sleep(0.05)
            continue
        kind, *args = publish.tasks.popleft()
        (pipe.scrape if kind == "scrape" else pipe.save)(*args)
    stats = rt.tracker.stats(job)
    assert stats.finished, stats
    return stats
