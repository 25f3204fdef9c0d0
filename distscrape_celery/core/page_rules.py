"""What a job makes of what a page says about itself (:mod:`..web.page_meta`): whether the page
is saved, whether its links are followed, and which canonical URL is queued in its place.

By the job's scraper spec: ``obey_noindex`` (a noindex page is not saved), ``obey_nofollow``
(a nofollow page adds no links), ``dedupe_canonical`` (a page whose one canonical URL is another
URL the job follows is not saved, and that URL is queued instead). A canonical URL is taken
only if the job's link scope accepts it, the SSRF guard does not refuse its literal address,
and the page, its HTML and its headers name no other one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional
from urllib.parse import urljoin, urlsplit

from ..job.patterns import PatternTimeout
from ..job.spec import JobSpec
from ..job.urls import DEFAULT_PORTS
from ..tracker.model import SKIP_COUNTERS
from ..web.fetch import Download
from ..web.page_meta import PageMeta, agent_token, header_canonicals, header_directives
from ..web.scope import LinkScope
from ..web.ssrf import AddressGuard, AddressRefused, literal_addresses

# Why a page was not saved: the name of the job's counter that counts it (Tracker.complete).
NOINDEX, CANONICAL = SKIP_COUNTERS


@dataclass(frozen=True)
class Verdict:
    """What becomes of a page: ``skip`` is "" (saved) or why it is not saved (:data:`NOINDEX`,
    :data:`CANONICAL`); ``follow``: whether its links are added; ``canonical``: the URL queued
    as its link in its place (with CANONICAL)."""

    skip: str = ""
    follow: bool = True
    canonical: Optional[str] = None


SAVE = Verdict()
_SAVE_NOFOLLOW = Verdict(follow=False)


class PageRules:
    """A job's rules for what its pages say about themselves (see the module's docstring).
    ``agent``: the crawler's token in meta tag names and X-Robots-Tag prefixes."""

    def __init__(
        self, *, obey_noindex: bool = True, obey_nofollow: bool = True,
        dedupe_canonical: bool = False, agent: str = "", scope: Optional[LinkScope] = None,
        guard: Optional[AddressGuard] = None,
    ) -> None:
        self.obey_noindex = obey_noindex
        self.obey_nofollow = obey_nofollow
        self.dedupe_canonical = dedupe_canonical
        self.agent = agent
        self.scope = scope if scope is not None else LinkScope()
        self.guard = guard

    @classmethod
    def from_spec(cls, spec: JobSpec) -> "PageRules":
        scraper = spec.scraper
        return cls(
            obey_noindex=scraper.obey_noindex, obey_nofollow=scraper.obey_nofollow,
            dedupe_canonical=scraper.dedupe_canonical, agent=agent_token(spec.fetch.user_agent),
            scope=LinkScope.from_spec(spec) if scraper.dedupe_canonical else None,
            guard=AddressGuard.from_spec(spec) if scraper.dedupe_canonical else None,
        )

    @property
    def reads_pages(self) -> bool:
        """Whether any rule looks at what a page says: without one, every page is saved and
        followed, and its meta tags need not be read."""
        return self.obey_noindex or self.obey_nofollow or self.dedupe_canonical

    def header_noindex(self, download: Download) -> bool:
        """Whether the job does not keep ``download`` by its X-Robots-Tag header alone (a
        revisit that found the page unchanged reads nothing else)."""
        return self.obey_noindex and header_directives(download.robots_tags, self.agent).noindex

    def judge(self, item: str, download: Download, meta: PageMeta) -> Verdict:
        """What becomes of page ``item``, downloaded as ``download`` whose content says
        ``meta``."""
        if not self.reads_pages:
            return SAVE
        robots = meta.robots
        if download.robots_tags and (self.obey_noindex or self.obey_nofollow):
            robots = robots | header_directives(download.robots_tags, self.agent)
        follow = not (self.obey_nofollow and robots.nofollow)
        if self.obey_noindex and robots.noindex:
            return Verdict(NOINDEX, follow)
        if self.dedupe_canonical and (meta.canonicals or download.links):
            canonical = self._canonical(item, download, meta)
            if canonical is not None:
                return Verdict(CANONICAL, follow, canonical)
        return SAVE if follow else _SAVE_NOFOLLOW

    def _canonical(self, item: str, download: Download, meta: PageMeta) -> Optional[str]:
        """The one canonical URL the page names, in canonical form, if it is another page the
        job follows; else None."""
        hrefs = list(meta.canonicals)
        for href in header_canonicals(download.links):
            try:
                hrefs.append(urljoin(download.url, href))
            except ValueError:
                return None  # a URL no one can fetch: the page names no usable canonical
        try:
            found = {self.scope.accept(href) for href in hrefs}
        except PatternTimeout:
            return None
        if len(found) != 1:
            return None
        url = found.pop()
        if url is None or url in (item, self._canonical_form(download.url)):
            return None
        return url if self._guard_allows(url) else None

    def _canonical_form(self, url: str) -> Optional[str]:
        try:
            return self.scope.canonicalizer.canonical(url).url
        except ValueError:
            return None

    def _guard_allows(self, url: str) -> bool:
        """Whether the SSRF guard lets ``url`` through as far as it can tell without DNS: an IP
        literal or localhost it refuses is no canonical URL (a name is checked when fetched)."""
        if self.guard is None:
            return True
        try:
            parts = urlsplit(url)
            host, port = parts.hostname or "", parts.port or DEFAULT_PORTS.get(parts.scheme)
        except ValueError:
            return False
        if not literal_addresses(host) or port is None:
            return True
        try:
            self.guard.addresses(host, port)
        except AddressRefused:
            return False
        return True

