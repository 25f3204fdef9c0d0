"""What a worker process uses for one creation of one job: its spec and what is built from it.

The runtime resolves a job's context once per process and creation of the job
(:meth:`.runtime.Runtime.job_context`) and the pipeline's steps take it, instead of asking the
runtime for the spec, scraper, saver and robots.txt policy of the job at every call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Optional, TypeVar

from .components import build_priority_rule, build_saver, build_scraper
from .priorities import PriorityRule
from ..job.spec import JobSpec
from ..savers import ItemSaver
from ..scrapers import Scraper
from ..settings import Settings
from ..web.cookies import CookieStore
from ..web.fetch_policy import FetchPolicy
from ..web.robots import RobotsCache, RobotsStore
from ..web.scope import HostScope
from ..web.sitemap_items import JobSitemaps

Component = TypeVar("Component")


class JobContext:
    """One creation of job ``job``, as this process knows it: its stored ``spec`` (a stored spec
    never changes) and the components built from it, each on first use, under this process's
    ``settings``: the hosts its redirects may lead to, its robots.txt policy (whose files go to
    ``robots_store``), its scraper, and its saver (named after ``worker_id()``, the worker's ID
    when the saver opens).

    A scraper or saver that fails to build is not kept: the next item asks again (a refused
    plug-in is refused again without importing anything). ``scraper`` and ``robots``, if given,
    are used as built already. ``fetch_policy``: what its requests carry (headers, credentials,
    proxies, its cookie jar in ``cookie_store``), None when its spec asks for nothing of that.
    Threads may share a context."""

    def __init__(
        self, job: str, spec: JobSpec, settings: Settings, robots_store: RobotsStore,
        worker_id: Callable[[], str], *, scraper: Optional[Scraper] = None,
        robots: Optional[RobotsCache] = None, cookie_store: Optional[CookieStore] = None,
    ) -> None:
        self.job = job
        self.spec = spec
        self.settings = settings
        self.robots_store = robots_store
        self.worker_id = worker_id
        self._lock = threading.Lock()
        self._scope: Optional[HostScope] = None
        self._robots = robots
        self._scraper = scraper
        self._saver: Optional[ItemSaver] = None
        self._sitemaps: Optional[JobSitemaps] = None
        self._priority_rule: Optional[PriorityRule] = None
        self.fetch_policy = FetchPolicy.for_job(
            job, spec, proxies=settings.proxies, credentials=settings.credentials,
            cookie_store=cookie_store)

    def scope(self) -> HostScope:
        """The hosts the job's redirects may lead to (its link scope's hosts)."""
        scope = self._scope
        return scope if scope is not None else self._once(
            "_scope", lambda: HostScope.from_spec(self.spec))

    def robots(self) -> Optional[RobotsCache]:
        """The job's robots.txt policy; None when the job ignores robots.txt."""
        if not self.spec.fetch.obey_robots:
            return None
        robots = self._robots
        return robots if robots is not None else self._once(
            "_robots", lambda: RobotsCache.from_spec(self.spec, self.robots_store))

    def sitemaps(self) -> Optional[JobSitemaps]:
        """The job's sitemaps; None when the job ignores them."""
        if not self.spec.sitemaps.enabled:
            return None
        sitemaps = self._sitemaps
        if sitemaps is not None:
            return sitemaps
        robots = self.robots()  # before the lock, which building the policy takes too
        return self._once(
            "_sitemaps", lambda: JobSitemaps.from_spec(self.spec, self.robots_store, robots))

    def scraper(self) -> Scraper:
        """The job's scraper; raises ConfigError when this worker's settings refuse the class its
        spec names."""
        scraper = self._scraper
        return scraper if scraper is not None else self._once(
            "_scraper", lambda: build_scraper(self.spec, self.settings))

    def priority_rule(self) -> Optional[PriorityRule]:
        """The job's rule for the priorities of found links; None for breadth-first (all 0).
        Raises ConfigError when this worker's settings refuse the function its spec names."""
        if self.spec.priority.rule == "breadth-first":
            return None
        rule = self._priority_rule
        return rule if rule is not None else self._once(
            "_priority_rule", lambda: build_priority_rule(self.spec, self.settings))

    def saver(self) -> ItemSaver:
        """The job's saver, opened; raises ConfigError when this worker's settings refuse its
        class or its output."""
        saver = self._saver
        return saver if saver is not None else self._once("_saver", self._open_saver)

    def _open_saver(self) -> ItemSaver:
        saver = build_saver(self.spec, self.job, self.worker_id(), self.settings)
        saver.open()
        return saver

    def _once(self, attribute: str, build: Callable[[], Component]) -> Component:
        """The component kept in ``attribute``, built by ``build`` if none is: under the lock,
        so that racing threads build (and open) one, not one each."""
        with self._lock:
            component = getattr(self, attribute)
            if component is None:
                component = build()
                setattr(self, attribute, component)
            return component

    @property
    def has_saver(self) -> bool:
        """Whether this context opened the job's saver."""
        return self._saver is not None

    def close(self) -> None:
        """Close the job's saver if this context opened one (it flushes what it buffers); a
        later save opens it again."""
        with self._lock:
            saver, self._saver = self._saver, None
        if saver is not None:
            saver.close()
