"""The scraper interface: download one item and find more items in what came back."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Optional

from ..web.fetch import Download, Fetcher
from ..web.page_meta import NO_META, PageMeta
from ..job.spec import JobSpec
from ..job.urls import is_url


class FoundItems(list[str]):
    """What :meth:`Scraper.find_items` found in one page: the items, in order, and how many more
    the page had that the scraper left out because a limit stopped it early (``cut``, with
    ``limit`` naming the limit for the log). ``looked_at``: the candidates the scraper examined
    (for a link scraper, the hrefs it resolved or dropped), so that a test or a log can tell
    how much work the page cost. ``meta``: what the page says about itself (robots meta tags,
    canonical links), read in the same parse, if the scraper reads it. A plain list means
    nothing was left out and nothing was read of the page's meta tags."""

    def __init__(
        self, items: Iterable[str] = (), *, cut: int = 0, limit: str = "", looked_at: int = 0,
        meta: PageMeta = NO_META,
    ) -> None:
        super().__init__(items)
        self.cut = cut
        self.limit = limit
        self.looked_at = looked_at
        self.meta = meta


class Scraper(ABC):
    """Downloads one item and finds new items in it. Items are strings; they need not be URLs."""

    # What downloads the items, if the scraper has one: its SSRF guard resolves their hosts.
    fetcher: Optional[Fetcher] = None

    @classmethod
    @abstractmethod
    def from_spec(cls, spec: JobSpec) -> "Scraper":
        """Build the scraper a job's spec describes."""

    def url_for(self, item: str) -> Optional[str]:
        """The URL ``item`` is downloaded from, for the robots.txt check; None: not known."""
        return item if is_url(item) else None

    def address_of(self, item: str) -> str:
        """The address ``item``'s download connects to, resolved and checked by the fetcher's
        SSRF guard and kept for that connection (the host is resolved once); '' when not known
        (no fetcher or URL, or a host that does not resolve or is refused)."""
        url = self.url_for(item)
        guard = self.fetcher.guard if self.fetcher is not None else None
        return guard.pacing_address(url) if url and guard is not None else ""

    @abstractmethod
    def download(self, item: str) -> Download:
        """Fetch ``item``. Raises :class:`~distscrape_celery.errors.FetchError` on failure."""

    @abstractmethod
    def find_items(self, item: str, download: Download) -> list[str]:
        """New items found in ``download`` (duplicates allowed; the tracker deduplicates). The
        pipeline keeps the first ``scraper.max_links_per_page`` distinct ones; a scraper that
        stops before that to save work returns a :class:`FoundItems` saying how many it cut,
        and one that reads the page's robots meta tags and canonical links returns them in its
        :attr:`FoundItems.meta`."""

    def page_meta(self, item: str, download: Download) -> PageMeta:
        """What ``download`` says about itself in its content (robots meta tags, canonical
        links, resolved to absolute URLs), for a page whose links are not wanted (the job's
        max_depth reached). Default: nothing, as for any scraper that does not read them."""
        return NO_META
