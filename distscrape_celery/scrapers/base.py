"""The scraper interface: download one item and find more items in what came back."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional

from ..web.fetch import Download
from ..job.spec import JobSpec
from ..job.urls import is_url


class Scraper(ABC):
    """Downloads one item and finds new items in it. Items are strings; they need not be URLs."""

    @classmethod
    @abstractmethod
    def from_spec(cls, spec: JobSpec) -> "Scraper":
        """Build the scraper a job's spec describes."""

    def url_for(self, item: str) -> Optional[str]:
        """The URL ``item`` is downloaded from, for the robots.txt check; None: not known."""
        return item if is_url(item) else None

    @abstractmethod
    def download(self, item: str) -> Download:
        """Fetch ``item``. Raises :class:`~distscrape_celery.errors.FetchError` on failure."""

    @abstractmethod
    def find_items(self, item: str, download: Download) -> list[str]:
        """New items found in ``download`` (duplicates allowed; the tracker deduplicates)."""
