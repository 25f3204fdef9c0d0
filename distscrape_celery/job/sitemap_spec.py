"""The sitemaps section of a job spec: whether the job reads the sites' sitemaps, and how far."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .sections import StrictModel

IGNORE, FOLLOW, ONLY = "ignore", "follow", "only"
# Default of sitemaps.max_urls_per_host: twice the entries of one full sitemap file.
DEFAULT_SITEMAP_URLS_PER_HOST = 100_000


class SitemapsSpec(StrictModel):
    """Which sitemaps a job reads: those robots.txt lists (and ``/sitemap.xml`` with ``guess``),
    their entries taken like found links, within per-host and nesting bounds."""

    mode: Literal["ignore", "follow", "only"] = Field(
        IGNORE,
        description='"ignore": no sitemap is read; "follow": the pages sitemaps list are crawled '
        'besides the links found in pages; "only": the seeds and the pages sitemaps list, and '
        "no link found in a page.",
    )
    guess: bool = Field(
        False, description="Also read <origin>/sitemap.xml of every host crawled, whether or not "
        "robots.txt lists it.",
    )
    max_urls_per_host: int = Field(
        DEFAULT_SITEMAP_URLS_PER_HOST, ge=1, le=100_000_000,
        description="Most entries (pages and sitemaps) taken from the sitemaps of one host in "
        "the whole job, repeats included; the rest are cut.",
    )
    max_depth: int = Field(
        2, ge=0, le=5,
        description="Sitemap indexes are followed this many levels down: 0 reads only the "
        "sitemaps robots.txt lists (or /sitemap.xml), and an index among them gives nothing.",
    )

    @property
    def enabled(self) -> bool:
        """Whether the job reads sitemaps at all."""
        return self.mode != IGNORE
