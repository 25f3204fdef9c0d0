"""A job's sitemaps as items of its frontier: which a host offers, how one is fetched, and which
of its entries the job takes.

A sitemap is an item like a page, so it gets leases, politeness, retries and deduplication from
the tracker: its canonical URL with :data:`SITEMAP_MARKER` as its fragment. A page item never has
a fragment (every URL is canonicalized without one), so the two cannot collide, and the item
keeps its URL's domain. Its entries are taken like found links: a page through the job's link
scope (hosts, patterns, extensions) in canonical form, a nested sitemap through the job's hosts
alone (``.xml.gz`` is a denied extension, and a ``link_regex`` is about pages).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional
from urllib.parse import urljoin

from ..caches import ByteBoundedCache, text_bytes
from ..job.patterns import PatternTimeout
from ..job.spec import JobSpec
from ..job.urls import Canonicalizer
from .fetch import Fetcher
from .robots import RobotsCache, robots_origin
from .scope import HostScope, LinkScope
from .sitemaps import MAX_SITEMAP_BYTES, SITEMAP_INDEX, URLSET, Sitemap, SitemapEntry, SitemapReader
from .ssrf import AddressGuard

log = logging.getLogger(__name__)

SITEMAP_MARKER = "#distscrape-sitemap"
# The file every host is asked for with sitemaps.guess.
GUESSED_PATH = "/sitemap.xml"
# Origins whose sitemaps this process has added, per job: one entry per host crawled.
_ADDED_ORIGINS_BYTES = 1024 * 1024


def sitemap_item(url: str) -> str:
    """The item of the sitemap at canonical ``url``."""
    return url + SITEMAP_MARKER


def is_sitemap_item(item: str) -> bool:
    return item.endswith(SITEMAP_MARKER)


def sitemap_url(item: str) -> str:
    """The URL of sitemap item ``item``."""
    return item[:-len(SITEMAP_MARKER)]


@dataclass
class SitemapFinds:
    """What a job takes of one sitemap: ``pages`` (canonical URLs, with each entry's lastmod
    kept for whoever wants it) or ``sitemaps`` (items of the sitemaps an index lists), and how
    many entries it left out: ``malformed`` (no usable URL) and ``out_of_scope``."""

    pages: list[SitemapEntry] = field(default_factory=list)
    sitemaps: list[str] = field(default_factory=list)
    malformed: int = 0
    out_of_scope: int = 0


class JobSitemaps:
    """One job's sitemaps: the items a host offers (:meth:`offered`, once per origin and
    process), a sitemap's download (:meth:`fetch`) and what the job takes of it (:meth:`finds`).
    ``robots``: the job's robots.txt records, whose Sitemap lines list a host's sitemaps."""

    def __init__(self, spec: JobSpec, robots: RobotsCache, fetcher: Fetcher, *,
                 obey_robots: bool) -> None:
        self.spec = spec.sitemaps
        self.robots = robots
        self.fetcher = fetcher
        self.obey_robots = obey_robots
        self.links = LinkScope.from_spec(spec)
        self.hosts = HostScope.from_spec(spec)
        self.canonicalizer = Canonicalizer(spec.scraper.strip_params)
        self._origins: ByteBoundedCache[str, bool] = ByteBoundedCache(
            _ADDED_ORIGINS_BYTES, lambda origin, _: text_bytes(origin) + 24)

    @classmethod
    def from_spec(cls, spec: JobSpec, robots_store, robots: Optional[RobotsCache] = None,
                  **guard_hooks) -> "JobSitemaps":
        """The job's sitemaps, fetched within its timeouts and SSRF guard, each file read to
        :data:`MAX_SITEMAP_BYTES` whatever the job's ``max_bytes``. ``robots``: the job's policy
        (None when it ignores robots.txt: the records are then read for their Sitemap lines
        alone)."""
        limits = spec.fetch.model_copy(update={"max_bytes": MAX_SITEMAP_BYTES})
        fetcher = Fetcher(limits, AddressGuard.from_spec(spec, **guard_hooks),
                          cut_at_max_bytes=True)
        own = robots if robots is not None else RobotsCache.from_spec(spec, robots_store,
                                                                      **guard_hooks)
        return cls(spec, own, fetcher, obey_robots=robots is not None)

    @property
    def only(self) -> bool:
        """Whether the job follows no link found in a page."""
        return self.spec.mode == "only"

    @property
    def max_depth(self) -> int:
        return self.spec.max_depth

    def offered(self, url: str) -> Optional[list[str]]:
        """The sitemap items of ``url``'s origin that the job takes (those its robots.txt lists,
        and ``/sitemap.xml`` with ``guess``) the first time this process asks for the origin;
        None after, or while its robots.txt cannot be read (asked again then)."""
        origin = robots_origin(url)
        if self._origins.get(origin):
            return None
        listed = self.robots.sitemaps(url)
        if listed is None:
            return None
        self._origins.put(origin, True)
        base = origin + "/robots.txt"
        urls = [urljoin(base, line) for line in listed]
        if self.spec.guess:
            urls.append(origin + GUESSED_PATH)
        items = []
        for written in urls:
            found = self._sitemap_url(written)
            # A sitemap robots.txt forbids would end dead: the site said not to fetch it.
            if found is None or (self.obey_robots and not self.robots.allowed(found)):
                log.info("%s: sitemap %s is not taken (out of the job's hosts, malformed or "
                         "disallowed by robots.txt)", origin, written)
                continue
            items.append(sitemap_item(found))
        return list(dict.fromkeys(items))

    def forget(self, url: str) -> None:
        """Offer ``url``'s origin's sitemaps again (they could not be added)."""
        self._origins.put(robots_origin(url), False)

    def fetch(self, url: str) -> Sitemap:
        """The sitemap at ``url``, read as it downloads, within :class:`SitemapReader`'s
        bounds. Raises :class:`~distscrape_celery.errors.FetchError` as a page's download."""
        reader = SitemapReader()
        self.fetcher.get(url, sink=reader)
        return reader.close()

    def finds(self, sitemap: Sitemap, depth: int) -> SitemapFinds:
        """What the job takes of ``sitemap``, an item at ``depth`` (0: listed by robots.txt):
        its pages in the job's link scope, or, from an index above ``max_depth``, its sitemaps
        on the job's hosts. A file that is neither gives nothing."""
        finds = SitemapFinds(malformed=sitemap.malformed)
        if sitemap.kind == URLSET:
            self._pages(sitemap.entries, finds)
        elif sitemap.kind == SITEMAP_INDEX and depth < self.spec.max_depth:
            for entry in sitemap.entries:
                found = self._sitemap_url(entry.url)
                if found is None:
                    finds.out_of_scope += 1
                else:
                    finds.sitemaps.append(sitemap_item(found))
        elif sitemap.kind == SITEMAP_INDEX:
            finds.out_of_scope = len(sitemap.entries)
        return finds

    def _pages(self, entries: list[SitemapEntry], finds: SitemapFinds) -> None:
        budget = self.links.page_budget()
        for number, entry in enumerate(entries):
            try:
                found = self.links.accept(entry.url, budget)
            except PatternTimeout as exc:
                log.warning("sitemap entries past the %dth are cut: %s (scraper.regex_seconds)",
                            number, exc)
                finds.out_of_scope += len(entries) - number
                return
            if found is None:
                finds.out_of_scope += 1
            else:
                finds.pages.append(SitemapEntry(found, entry.lastmod))

    def _sitemap_url(self, url: str) -> Optional[str]:
        """``url`` in canonical form if it is on the job's hosts; None if not, or malformed."""
        try:
            found = self.canonicalizer.canonical(url).url
        except ValueError:
            return None
        return found if self.hosts.takes(found) else None
