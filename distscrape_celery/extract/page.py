"""A saved page as extraction sees it: its download, parsed once, and the keys every record of it
carries."""

from __future__ import annotations

import functools
from datetime import datetime, timezone

from parsel import Selector

from ..web.encoding import decode_html
from ..web.fetch import Download

# Content types parsed as XML rather than HTML (feeds, sitemaps, XHTML served as XML).
_XML_TYPES = ("application/xml", "text/xml", "application/rss+xml", "application/atom+xml")


def iso_utc(timestamp: float) -> str:
    """Unix time ``timestamp`` as ISO 8601 in UTC, to the microsecond (``2026-05-01T12:00:00.250000Z``)."""
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def page_record(download: Download, job: str) -> dict:
    """The keys every record of page ``download`` of job ``job`` starts with, and the one record
    of a page of a job that extracts none: url, status, fetched_at (ISO 8601, UTC) and job."""
    return {"url": download.url, "status": download.status,
            "fetched_at": iso_utc(download.fetched_at), "job": job}


class Page:
    """One saved page of job ``job``: what a plug-in extractor is given. ``text`` (decoded as a
    browser would) and ``selector`` (a parsel Selector of it) are built on first use, once."""

    def __init__(self, download: Download, job: str) -> None:
        self.download = download
        self.job = job
        self.url = download.url
        self.status = download.status
        self.content_type = download.content_type
        self.body = download.body
        self.fetched_at = iso_utc(download.fetched_at)

    @functools.cached_property
    def text(self) -> str:
        return decode_html(self.content_type, self.body)

    @functools.cached_property
    def selector(self) -> Selector:
        media = self.content_type.partition(";")[0].strip().lower()
        kind = "xml" if media in _XML_TYPES else "html"
        return Selector(text=self.text, type=kind, base_url=self.url)

    def keys(self) -> dict:
        """The keys every record of this page starts with: url, status, fetched_at, job."""
        return page_record(self.download, self.job)
