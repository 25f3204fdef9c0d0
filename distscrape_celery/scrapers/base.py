"""The scraper interface: download one item and find more items in what came back."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Optional

from ..web.fetch import Download, Fetcher
from ..job.spec import JobSpec
from ..job.urls import is_url


class FoundItems(list[str]):
    """What :meth:`Scraper.find_items` found in one page: the items, in order, and how many more
    the page had that the scraper left out because a limit stopped it early (``cut``, with
    ``limit`` naming the limit for the log). ``looked_at``: the candidates the scraper examined
    (for a link scraper, the hrefs it resolved or dropped), so that a test or a log can tell
    how much work the page cost. A plain list means nothing was left out."""

    def __init__(
        self, items: Iterable[str] = (), *, cut: int = 0, limit: str = "", looked_at: int = 0
    ) -> None:
        super().__init__(items)
        self.cut = cut
        self.limit = limit
        self.looked_at = looked_at


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
        stops before that to save work returns a :class:`FoundItems` saying how many it cut."""
