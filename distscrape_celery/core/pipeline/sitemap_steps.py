"""The scrape of a sitemap item, and the adding of a host's sitemaps, for jobs that read sitemaps.

A sitemap is an item of the job's frontier (see :mod:`~distscrape_celery.web.sitemap_items`):
leased, paced and retried like a page, but never saved. Its entries are reported as the items
found in it, the item turns saving under this worker's lease in the same step, and is completed
at once: an item whose worker dies in between is reclaimed and read again, never lost.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..backoff import Backoff
from ..context import JobContext
from ..runtime import Runtime
from ...errors import FetchError
from ...tracker import Checkout, Fault
from ...tracker.keys import domain_of
from ...web.fetch import redirect_check
from ...web.sitemap_items import JobSitemaps, SitemapFinds, sitemap_url
from ...web.sitemaps import Sitemap
from .failures import Failures
from .fetch_rules import FetchRules
from .publishing import Publisher, dispatch

log = logging.getLogger(__name__)

# Statuses that say a sitemap is not there: the item is done, not dead (with sitemaps.guess most
# hosts have no /sitemap.xml, and a crawl must not end with an error for that).
_NOT_THERE = frozenset({404, 410})
# The depth of the pages a sitemap lists, however deep its index: one hop from the site, as the
# links of a seed (their own links then follow scraper.max_depth).
PAGE_DEPTH = 1


class SitemapSteps:
    """Adds each host's sitemaps once per process (:meth:`offer`) and scrapes sitemap items
    (:meth:`scrape`), for any job whose spec reads sitemaps."""

    def __init__(self, runtime: Runtime, publisher: Publisher, failures: Failures,
                 fetch_rules: FetchRules) -> None:
        self.runtime = runtime
        self.publisher = publisher
        self.failures = failures
        self.fetch_rules = fetch_rules

    def offer(self, context: JobContext, sitemaps: JobSitemaps, url: str) -> None:
        """Add the sitemaps of ``url``'s host to the job the first time this process fetches
        from the host (deduplicated like links, so other processes' adds cost nothing). Never
        fails the page: what could not be added is offered again with the host's next page."""
        try:
            items = sitemaps.offered(url)
            if items:
                reply = self.runtime.tracker.add(context.job, items, depth=0)
                dispatch(self.publisher, context.job, reply.dispatch)
        except Exception as exc:
            log.warning("%s %s: the host's sitemaps are not added yet: %s", context.job, url, exc)
            try:
                sitemaps.forget(url)
            except FetchError:
                pass  # a URL without a usable host offers nothing

    def scrape(self, context: JobContext, sitemaps: JobSitemaps, item: str,
               checkout: Checkout) -> str:
        """Download and read the leased sitemap ``item``, add what the job takes of it, and
        complete it; a failed download is handed back as a page's is."""
        url = sitemap_url(item)
        domain = domain_of(url)
        limit = sitemaps.spec.max_urls_per_host
        if self.runtime.tracker.count_sitemap_urls(context.job, domain, 0) >= limit:
            log.warning("%s %s: not read, %s has given sitemaps.max_urls_per_host=%d entries",
                        context.job, item, domain, limit)
            return self._complete(context, item, checkout, [], 0)
        try:
            sitemap = self._download(context, sitemaps, url)
        except FetchError as exc:
            if exc.status in _NOT_THERE:
                log.warning("%s %s: no sitemap there (%s)", context.job, item, exc)
                return self._complete(context, item, checkout, [], 0)
            delay = Backoff.from_spec(context.spec.politeness).delay(
                checkout.failed_attempts, exc.retry_after) if exc.retryable else 0.0
            return self.failures.fail(context, item, checkout.token, str(exc), fault=Fault.ITEM,
                                      retryable=exc.retryable, delay=delay)
        except Exception as exc:  # a bug must cost one item, never the worker
            log.exception("%s %s: reading the sitemap raised", context.job, item)
            return self.failures.fail(context, item, checkout.token,
                                      f"sitemap error: {exc!r}", fault=Fault.ITEM)
        finds = sitemaps.finds(sitemap, checkout.depth)
        _log_left_out(context.job, item, sitemap, finds)
        found = [entry.url for entry in finds.pages] or finds.sitemaps
        if found:
            total = self.runtime.tracker.count_sitemap_urls(context.job, domain, len(found))
            room = max(0, limit - (total - len(found)))
            if room < len(found):
                log.warning("%s %s: %d entries cut, past sitemaps.max_urls_per_host=%d of %s",
                            context.job, item, len(found) - room, limit, domain)
                found = found[:room]
        depth = PAGE_DEPTH if finds.pages else checkout.depth + 1
        if context.spec.revisit is not None:
            self._revisit_changed(context, finds, set(found))
        return self._complete(context, item, checkout, found, depth)

    def _revisit_changed(self, context: JobContext, finds: SitemapFinds, taken: set[str]) -> None:
        """A job that revisits fetches again, now, the known pages whose lastmod says they
        changed since it last fetched them."""
        changed = [(entry.url, entry.lastmod.timestamp()) for entry in finds.pages
                   if entry.lastmod is not None and entry.url in taken]
        if changed:
            reply = self.runtime.tracker.changed(context.job, changed)
            dispatch(self.publisher, context.job, reply.dispatch)

    def _download(self, context: JobContext, sitemaps: JobSitemaps, url: str) -> Sitemap:
        """The sitemap at ``url``, fetched as a page is: if robots.txt allows it (a site that
        lists a sitemap it disallows is taken at its rule), its redirects kept to the job's
        hosts and checked against robots.txt."""
        rules = self.fetch_rules
        rules.check_robots(context, url)
        self.offer(context, sitemaps, url)
        with redirect_check(rules.redirect_check(context)):
            return sitemaps.fetch(url)

    def _complete(self, context: JobContext, item: str, checkout: Checkout,
                  found: Sequence[str], depth: int) -> str:
        """Add ``found`` at ``depth`` and make the item done without saving it: it turns saving
        under this worker's lease in the step that adds them, then done."""
        tracker, job, token = self.runtime.tracker, context.job, checkout.token
        reply = tracker.scraped(job, item, token, list(found), depth,
                                save_as=self.runtime.worker_id)
        dispatch(self.publisher, job, reply.dispatch)
        if not reply.held:
            return "stale"  # our lease ran out and another worker has the item
        dispatch(self.publisher, job, tracker.complete(job, item, token).dispatch)
        return "sitemap"


def _log_left_out(job: str, item: str, sitemap: Sitemap, finds: SitemapFinds) -> None:
    """One line for a sitemap that was cut, or had entries the job does not take."""
    if sitemap.cut:
        log.warning("%s %s: sitemap cut, %s", job, item, sitemap.cut)
    if finds.malformed or finds.out_of_scope:
        log.info("%s %s: %d malformed entries and %d out of the job's scope skipped",
                 job, item, finds.malformed, finds.out_of_scope)
