"""What one worker process holds: settings, tracker, staging, its worker ID, and per-job components.

Celery tasks stay thin: they ask the runtime for collaborators and hand the work to
:mod:`.pipeline`. The runtime is built lazily from the app's settings, or installed explicitly (the
in-memory crawl installs one with an InMemoryTracker).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
from typing import Optional

from .components import build_saver, build_scraper
from ..job.spec import JobSpec
from ..web.robots import RobotsCache
from ..web.robots_stores import MemoryRobotsStore, RedisRobotsStore, RobotsStore
from ..web.scope import HostScope
from ..savers import ItemSaver
from ..scrapers import Scraper
from ..settings import Settings
from ..tracker.staging import BodyStaging, RedisBodyStaging
from ..tracker import Tracker
from ..tracker.redis import RedisTracker, connect

log = logging.getLogger(__name__)


class Runtime:
    def __init__(
        self, settings: Settings, tracker: Tracker, staging: BodyStaging, *, in_memory: bool = False,
        robots_store: Optional[RobotsStore] = None,
    ) -> None:
        self.settings = settings
        self.tracker = tracker
        self.staging = staging
        self.in_memory = in_memory
        self.robots_store = (robots_store if robots_store is not None
                             else MemoryRobotsStore(settings.robots_cache_bytes))
        # Until the worker agent registers, leases name the process.
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self._lock = threading.Lock()
        self._specs: dict[str, JobSpec] = {}
        self._scrapers: dict[str, Scraper] = {}
        self._savers: dict[str, ItemSaver] = {}
        self._robots: dict[str, RobotsCache] = {}
        self._host_scopes: dict[str, HostScope] = {}
        self._created: dict[str, str] = {}  # job -> the creation its components were built for

    @classmethod
    def for_redis(cls, settings: Settings) -> "Runtime":
        tracker = RedisTracker.from_settings(settings)
        # Each body and robots key is used alone, so a cluster client routes it by its slot.
        bodies = connect(
            settings.redis_url, cluster=settings.redis_cluster, decode_responses=False,
            socket_connect_timeout=5, socket_timeout=settings.redis_socket_timeout,
        )
        return cls(
            settings, tracker, RedisBodyStaging(bodies, settings.body_ttl),
            robots_store=RedisRobotsStore(bodies, settings.robots_cache_bytes),
        )

    @classmethod
    def in_memory_runtime(cls, settings: Settings) -> "Runtime":
        from ..tracker import InMemoryTracker  # a fake Redis with Lua: only an in-memory crawl

        tracker = InMemoryTracker(
            lease_seconds=settings.lease_seconds, dispatch_factor=settings.dispatch_factor,
            save_backlog_factor=settings.save_backlog_factor, save_timeout=settings.save_timeout,
        )
        # The tracker stages bodies itself (in scraped): the staging reads them there.
        return cls(settings, tracker, tracker.bodies, in_memory=True)

    @functools.cached_property
    def finds_lost_saves(self) -> bool:
        """Whether live workers find the save messages that a dead worker took from the broker
        (``worker/lost_saves.py``): the broker is Redis, whose save queue can be read, and so is
        the tracker. They find a page whose worker died before it sent the page's save message
        the same way. (Read for every page: its settings and tracker never change.)"""
        return isinstance(self.tracker, RedisTracker) and self.settings.broker_is_redis

    @property
    def keeps_scraped_pages(self) -> bool:
        """Whether this process holds each page it scraped under its worker's lease until the
        page's save message is out, and then hands it to the broker's care (one more tracker
        call). It must where nothing else brings such a page back soon if the process ends with
        the message unsent: where live workers do not find lost saves, and in a prefork pool
        process, which a SIGTERM to the worker's process group ends at once, leaving the worker's
        stop to give its gathered pages back. Elsewhere a scraped page waits for its message with
        no holder from the start."""
        return _in_pool_process or not self.finds_lost_saves

    def follow_job(self, job: str, created: str) -> None:
        """The tracker answered for the creation ``created`` of ``job``. A job deleted and
        seeded again under its name is another creation, with a spec of its own: when the
        creation differs from the one seen before, what this process built for the job (spec,
        scraper, robots.txt policy, saver) is dropped, to be built again from the stored spec;
        a dropped saver is closed."""
        if not created or self._created.get(job) == created:
            return
        with self._lock:
            known = self._created.get(job)
            self._created[job] = created
            if known is None or known == created:
                return
            self._specs.pop(job, None)
            self._scrapers.pop(job, None)
            self._robots.pop(job, None)
            self._host_scopes.pop(job, None)
            saver = self._savers.pop(job, None)
        if saver is not None:
            log.info("job %s was created again: its saver is built anew from its spec", job)
            try:
                saver.close()
            except Exception:  # the earlier job's output; the new one is not touched
                log.exception("closing the saver of the earlier job %s failed", job)

    def spec(self, job: str) -> JobSpec:
        """The job's spec, read from the tracker once per process and creation of the job (a
        stored spec never changes; see :meth:`follow_job`)."""
        spec = self._specs.get(job)
        if spec is None:
            spec = JobSpec.from_json(self.tracker.load_spec(job))
            self._specs[job] = spec
        return spec

    def scraper(self, job: str) -> Scraper:
        """The job's scraper; raises ConfigError when this worker's settings refuse the class its
        spec names (not kept: each item asking again is refused without importing anything)."""
        return self._per_job(
            self._scrapers, job, lambda spec: build_scraper(spec, self.settings)
        )

    def robots(self, job: str) -> Optional[RobotsCache]:
        """The job's robots.txt policy; None when the job ignores robots.txt."""
        if not self.spec(job).fetch.obey_robots:
            return None
        return self._per_job(
            self._robots, job, lambda spec: RobotsCache.from_spec(spec, self.robots_store)
        )

    def host_scope(self, job: str) -> HostScope:
        """The hosts the job's redirects may lead to (its link scope's hosts)."""
        return self._per_job(self._host_scopes, job, HostScope.from_spec)

    def saver(self, job: str) -> ItemSaver:
        """The job's saver, opened; raises ConfigError when this worker's settings refuse its
        class or its output."""

        def open_saver(spec: JobSpec) -> ItemSaver:
            saver = build_saver(spec, job, self.worker_id, self.settings)
            saver.open()
            return saver

        return self._per_job(self._savers, job, open_saver)

    def _per_job(self, cache: dict, job: str, build):
        """``cache[job]``, built once per process from the job's spec (threads may race here)."""
        component = cache.get(job)
        if component is None:
            with self._lock:
                component = cache.get(job)
                if component is None:
                    component = cache[job] = build(self.spec(job))
        return component

    def close(self) -> None:
        """Close every saver opened in this process (flushes what they buffer)."""
        with self._lock:
            savers, self._savers = self._savers, {}
        for job, saver in savers.items():
            try:
                saver.close()
            except Exception:  # one saver failing to close must not stop the others
                log.exception("closing the saver of job %s failed", job)


_runtime: Optional[Runtime] = None
_runtime_lock = threading.Lock()
# Set in a prefork pool process (see Runtime.keeps_scraped_pages).
_in_pool_process = False


def note_pool_process() -> None:
    """This process is a pool process of a prefork worker."""
    global _in_pool_process
    _in_pool_process = True


def install_runtime(runtime: Optional[Runtime]) -> None:
    global _runtime
    with _runtime_lock:
        _runtime = runtime


def current_runtime(settings_factory) -> Runtime:
    """The process's runtime, built on first use from ``settings_factory()``."""
    global _runtime
    if _runtime is None:
        with _runtime_lock:
            if _runtime is None:
                _runtime = Runtime.for_redis(settings_factory())
    return _runtime
