"""What a worker process uses for one creation of one job: its spec and what is built from it.

The runtime resolves a job's context once per process and creation of the job
(:meth:`.runtime.Runtime.job_context`) and the pipeline's steps take it, instead of asking the
runtime for the spec, scraper, saver and robots.txt policy of the job at every call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Optional, TypeVar

from ..job.spec import JobSpec
from ..savers import ItemSaver
from ..scrapers import Scraper
from ..web.robots import RobotsCache
from ..web.scope import HostScope

Component = TypeVar("Component")


class JobContext:
    """One creation of job ``job``, as this process knows it: its stored ``spec`` (a stored spec
    never changes), the hosts its redirects may lead to (``scope``), its robots.txt policy
    (``robots``; None when the job ignores robots.txt), and its scraper and saver, each built on
    first use by ``build_scraper`` and ``open_saver``.

    A scraper or saver that fails to build is not kept: the next item asks again (a refused
    plug-in is refused again without importing anything). Threads may share a context."""

    def __init__(
        self, job: str, spec: JobSpec, *, robots: Optional[RobotsCache],
        build_scraper: Callable[[], Scraper], open_saver: Callable[[], ItemSaver],
        scraper: Optional[Scraper] = None,
    ) -> None:
        self.job = job
        self.spec = spec
        self.scope = HostScope.from_spec(spec)
        self.robots = robots
        self._build_scraper = build_scraper
        self._open_saver = open_saver
        self._lock = threading.Lock()
        self._scraper = scraper  # a scraper built already, if given: not built again
        self._saver: Optional[ItemSaver] = None

    def scraper(self) -> Scraper:
        """The job's scraper; raises ConfigError when this worker's settings refuse the class its
        spec names."""
        scraper = self._scraper
        return scraper if scraper is not None else self._once("_scraper", self._build_scraper)

    def saver(self) -> ItemSaver:
        """The job's saver, opened; raises ConfigError when this worker's settings refuse its
        class or its output."""
        saver = self._saver
        return saver if saver is not None else self._once("_saver", self._open_saver)

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
