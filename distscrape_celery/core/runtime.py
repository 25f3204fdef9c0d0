"""What one worker process holds: settings, tracker, staging, its worker ID, and a context per job.

Celery tasks stay thin: they ask the runtime for collaborators and hand the work to
:mod:`.pipeline`, which asks it for a job's :class:`.context.JobContext` once per task. The
runtime is built lazily from the app's settings, or installed explicitly (the in-memory crawl
installs one with an InMemoryTracker).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
from typing import Optional

from .context import JobContext
from ..job.spec import JobSpec
from ..web.robots import RobotsCache
from ..web.cookies import CookieStore, RedisCookieStore
from ..web.robots_stores import MemoryRobotsStore, RedisRobotsStore, RobotsStore
from ..savers import ItemSaver
from ..scrapers import Scraper
from ..settings import Settings
from ..tracker.redis.staging import BodyStaging, RedisBodyStaging
from ..tracker import Tracker
from ..tracker.redis import RedisTracker, connect

log = logging.getLogger(__name__)


class Runtime:
    """What one worker process shares between its tasks: ``settings``, the ``tracker``, the body
    ``staging``, the ``robots_store``, the ``cookie_store`` (the jobs' cookie jars; None: jobs
    keep no cookies), its worker ID, and a :class:`JobContext` per job, built once per creation
    of the job (:meth:`job_context`)."""

    def __init__(
        self, settings: Settings, tracker: Tracker, staging: BodyStaging, *, in_memory: bool = False,
        robots_store: Optional[RobotsStore] = None, cookie_store: Optional[CookieStore] = None,
    ) -> None:
        self.settings = settings
        self.tracker = tracker
        self.staging = staging
        self.in_memory = in_memory
        self.robots_store = (robots_store if robots_store is not None
                             else MemoryRobotsStore(settings.robots_cache_bytes))
        self.cookie_store = cookie_store
        # Until the worker agent registers, leases name the process.
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self._lock = threading.Lock()
        self._contexts: dict[str, JobContext] = {}
        self._created: dict[str, str] = {}  # job -> the creation its context was built for

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
            cookie_store=RedisCookieStore(bodies),
        )

    @classmethod
    def in_memory_runtime(cls, settings: Settings) -> "Runtime":
        from ..tracker import InMemoryTracker  # a fake Redis with Lua: only an in-memory crawl

        tracker = InMemoryTracker(
            lease_seconds=settings.lease_seconds, dispatch_factor=settings.dispatch_factor,
            save_backlog_factor=settings.save_backlog_factor, save_timeout=settings.save_timeout,
        )
        # The tracker stages bodies itself (in scraped): the staging reads them there.
        return cls(settings, tracker, tracker.bodies, in_memory=True,
                   cookie_store=RedisCookieStore(tracker.bodies.client))

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

    def job_context(self, job: str, created: str = "") -> JobContext:
        """The job's context (spec, scope, robots.txt policy, scraper, saver), built once per
        process and creation of the job from its stored spec. ``created``: the creation the
        tracker just answered for, if any (see :meth:`follow_job`); with none, the context of
        the creation seen last, or of the stored spec if none was seen yet."""
        self.follow_job(job, created)
        context = self._contexts.get(job)
        if context is None:
            spec = JobSpec.from_json(self.tracker.load_spec(job))
            with self._lock:
                context = self._contexts.get(job)
                if context is None:
                    context = self._contexts[job] = self._new_context(job, spec)
        return context

    def _new_context(
        self, job: str, spec: JobSpec, scraper: Optional[Scraper] = None,
        robots: Optional[RobotsCache] = None,
    ) -> JobContext:
        """A context of ``job`` built from ``spec`` (with ``scraper`` and ``robots`` if built
        already)."""
        # The saver is named after the worker's ID when it opens: the ID changes once the
        # worker registers.
        return JobContext(job, spec, self.settings, self.robots_store, lambda: self.worker_id,
                          scraper=scraper, robots=robots, cookie_store=self.cookie_store)

    def preset_context(
        self, job: str, spec: JobSpec, *, scraper: Scraper, robots: RobotsCache
    ) -> JobContext:
        """Use ``scraper`` and ``robots`` for ``job`` of ``spec`` instead of building them (a
        test's way to give a job components built with hooks, a resolver say), until another
        creation of the job is seen."""
        context = self._new_context(job, spec, scraper, robots)
        with self._lock:
            self._contexts[job] = context
        return context

    def follow_job(self, job: str, created: str) -> None:
        """The tracker answered for the creation ``created`` of ``job``. A job deleted and
        seeded again under its name is another creation, with a spec of its own, and so, to a
        worker, is each generation of a job that runs again: when the creation differs from the
        one seen before, the job's context is dropped, to be built again from the stored spec;
        its saver, if opened, is closed."""
        if not created or self._created.get(job) == created:
            return
        with self._lock:
            known = self._created.get(job)
            self._created[job] = created
            if known is None or known == created:
                return
            context = self._contexts.pop(job, None)
        if context is not None:
            self._close_context(
                context, "job %s was created again (or began its next generation): its saver is "
                "built anew from its spec")

    def spec(self, job: str) -> JobSpec:
        """The job's spec (a stored spec never changes; see :meth:`job_context`)."""
        return self.job_context(job).spec

    def scraper(self, job: str) -> Scraper:
        """The job's scraper (:meth:`JobContext.scraper`)."""
        return self.job_context(job).scraper()

    def robots(self, job: str) -> Optional[RobotsCache]:
        """The job's robots.txt policy; None when the job ignores robots.txt."""
        return self.job_context(job).robots()

    def saver(self, job: str) -> ItemSaver:
        """The job's saver, opened (:meth:`JobContext.saver`)."""
        return self.job_context(job).saver()

    def close(self) -> None:
        """Close every saver opened in this process (flushes what they buffer)."""
        with self._lock:
            contexts = list(self._contexts.values())
        for context in contexts:
            self._close_context(context)

    @staticmethod
    def _close_context(context: JobContext, note: str = "") -> None:
        """Close ``context``'s saver, logging ``note`` first if it had one open; one that fails
        to close is logged, not raised (the job's output; the next context is not touched)."""
        if note and context.has_saver:
            log.info(note, context.job)
        try:
            context.close()
        except Exception:
            log.exception("closing the saver of job %s failed", context.job)


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
