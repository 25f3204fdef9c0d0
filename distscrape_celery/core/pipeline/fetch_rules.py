"""What a job lets a download fetch: its robots.txt, and the hosts its redirects may reach."""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

from ..context import JobContext
from ...caches import ByteBoundedCache, text_bytes
from ...errors import FetchError
from ...tracker import Tracker
from ...tracker.keys import domain_of
from ...web.fetch import redirect_check

_CRAWL_DELAYS_BYTES = 4 * 1024 * 1024  # some 10,000 domains


class FetchRules:
    """Checks a download against its job's robots.txt and host scope, and passes each domain's
    Crawl-delay on to ``tracker``, which paces the domain with it."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker
        # The Crawl-delay last passed on per (job, domain): one entry per domain crawled, so
        # bounded by bytes; one dropped costs only another pass of the same delay.
        self._crawl_delays: ByteBoundedCache[tuple[str, str], float] = ByteBoundedCache(
            _CRAWL_DELAYS_BYTES, lambda key, delay: text_bytes(*key) + 24
        )

    def check_robots(self, context: JobContext, url: Optional[str]) -> None:
        """Raise :class:`FetchError` if the job's robots.txt policy forbids fetching ``url``;
        else pass the host's Crawl-delay on to the tracker."""
        robots = context.robots()
        if robots is None or url is None:
            return
        robots.check(url)
        delay = robots.crawl_delay(url) or 0.0  # at most robots.MAX_CRAWL_DELAY
        domain = domain_of(url)
        if self._crawl_delays.get((context.job, domain)) != delay:
            # Once per domain and process (again if robots.txt changes): it is the same for all.
            self.tracker.set_domain_delay(context.job, domain, delay)
            self._crawl_delays.put((context.job, domain), delay)

    @staticmethod
    def redirect_check(context: JobContext) -> Optional[Callable[[str], None]]:
        """What a redirect target must pass, in order: the job's host scope (a target outside
        it ends the item, and nothing is fetched there, not even its robots.txt), then the
        job's robots.txt (unless it ignores it). None: nothing to check."""
        scope, robots = context.scope(), context.robots()
        if scope.takes_any and robots is None:
            return None

        def check(url: str) -> None:
            if not scope.takes(url):
                raise FetchError(
                    f"redirect to {url} leaves the job's hosts (scraper.same_host, "
                    "scraper.allowed_domains)", retryable=False,
                )
            if robots is not None:
                with redirect_check(None):  # fetching the target host's robots.txt checks no hop
                    robots.check(url)

        return check
