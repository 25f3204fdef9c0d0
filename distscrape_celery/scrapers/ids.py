"""IDScraper: items are IDs; each is downloaded from a URL made from it, and more IDs are found in
what came back."""

from __future__ import annotations

import logging
from typing import Optional
from urllib.parse import quote

from ..web.encoding import decode_html
from ..errors import FetchError
from ..web.fetch import Download, Fetcher
from ..job.scraper_spec import DEFAULT_MAX_LINKS_PER_PAGE, HREFS_LOOKED_AT_PER_LINK
from ..job.sections import FetchSpec
from ..job.spec import DOT_IDS, MAX_ID_CHARS, JobSpec
from ..job.patterns import DEFAULT_REGEX_SECONDS, Budget, PatternTimeout, compile_pattern
from ..job.urls import is_url
from .base import FoundItems, Scraper

log = logging.getLogger(__name__)


def id_url(download_url_fmt: str, item_id: str) -> str:
    """``download_url_fmt`` with the ID filled in for ``{}`` or ``{id}``, percent-escaped so an ID
    can only ever be one path segment or query value (an ID of ``../admin`` stays one segment).
    Raises ValueError for an ID of ``.`` or ``..``."""
    if item_id in DOT_IDS:
        raise ValueError(f"the ID {item_id!r} cannot be a path segment")
    safe = quote(item_id, safe="")
    return download_url_fmt.format(safe, id=safe)


class IDScraper(Scraper):
    """Items are IDs (or listing URLs, e.g. seeds). An ID is downloaded from
    ``download_url_fmt.format(id)``; new IDs are the matches of ``id_regex`` (its first capture
    group when it has one) in what was downloaded, decoded as text, found within
    ``regex_seconds`` a page.

    Items are plain strings, so a found ID that looks like an http(s) URL could not be told from
    a listing URL later: it is handed on as its download URL instead, which keeps it an ID."""

    def __init__(
        self, id_regex: str, download_url_fmt: str, fetcher: Optional[Fetcher] = None,
        regex_seconds: float = DEFAULT_REGEX_SECONDS,
        max_ids: int = DEFAULT_MAX_LINKS_PER_PAGE,
    ) -> None:
        if max_ids < 1:
            raise ValueError(f"scraper.max_links_per_page must be at least 1, not {max_ids}")
        self.id_pattern = compile_pattern(id_regex)
        self.regex_seconds = regex_seconds
        self.max_ids = max_ids
        self.max_matches = HREFS_LOOKED_AT_PER_LINK * max_ids
        self.download_url_fmt = download_url_fmt
        self.fetcher = fetcher if fetcher is not None else Fetcher(FetchSpec())

    @classmethod
    def from_spec(cls, spec: JobSpec) -> "IDScraper":
        scraper_spec = spec.scraper
        # The spec validator requires both.
        if scraper_spec.id_regex is None or scraper_spec.download_url_fmt is None:
            raise ValueError("IDScraper needs scraper.id_regex and scraper.download_url_fmt")
        return cls(scraper_spec.id_regex, scraper_spec.download_url_fmt,
                   fetcher=Fetcher.for_job(spec), regex_seconds=scraper_spec.regex_seconds,
                   max_ids=scraper_spec.max_links_per_page)

    def url_for(self, item: str) -> str:
        """The URL ``item`` is downloaded from: itself if a URL, else made from the ID. Raises
        a permanent :class:`FetchError` for an ID that cannot be one (``.``, ``..``)."""
        if is_url(item):
            return item
        try:
            return id_url(self.download_url_fmt, item)
        except ValueError as exc:
            raise FetchError(str(exc), retryable=False) from None

    def download(self, item: str) -> Download:
        return self.fetcher.get(self.url_for(item))

    def find_items(self, item: str, download: Download) -> FoundItems:
        """IDs matched in ``download``, each once, in order of appearance; one shaped like an
        http(s) URL as its download URL. Collecting stops at ``max_ids`` IDs or after
        ``max_matches`` matches looked at; the matches after that are only counted (``cut``).
        Never raises because of what the body contains: when the regex uses up the page's time
        budget, the IDs found until then are returned."""
        text = decode_html(download.content_type, download.body)
        found: dict[str, None] = {}  # an ordered set
        group = 1 if self.id_pattern.groups else 0
        looked_at = cut = 0
        limit = ""
        try:
            for match in Budget(self.regex_seconds).finditer(self.id_pattern, text):
                if limit:
                    cut += 1
                    continue
                looked_at += 1
                found_id = match.group(group)
                if (found_id and len(found_id) <= MAX_ID_CHARS and found_id.isprintable()
                        and found_id not in DOT_IDS):
                    if is_url(found_id):
                        found_id = id_url(self.download_url_fmt, found_id)
                    found[found_id] = None
                if len(found) >= self.max_ids:
                    limit = f"max_links_per_page={self.max_ids}"
                elif looked_at >= self.max_matches:
                    limit = (f"{self.max_matches} matches looked at ({HREFS_LOOKED_AT_PER_LINK} "
                             f"x max_links_per_page={self.max_ids})")
        except PatternTimeout as exc:
            log.warning("%s: ID extraction stopped, %s (scraper.regex_seconds); the %d IDs found "
                        "before are kept", item, exc, len(found))
        return FoundItems(found, cut=cut, limit=limit if cut else "", looked_at=looked_at)
