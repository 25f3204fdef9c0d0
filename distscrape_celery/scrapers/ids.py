"""IDScraper: items are IDs; each is downloaded from a URL made from it, and more IDs are found in
what came back."""

from __future__ import annotations

import re
from typing import Optional
from urllib.parse import quote

from ..encoding import decode_html
from ..errors import FetchError
from ..fetch import Download, Fetcher
from ..jobspec import DOT_IDS, MAX_ID_CHARS, FetchSpec, JobSpec
from ..urls import is_url
from .base import Scraper


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
    group when it has one) in what was downloaded, decoded as text.

    Items are plain strings, so a found ID that looks like an http(s) URL could not be told from
    a listing URL later: it is handed on as its download URL instead, which keeps it an ID."""

    def __init__(
        self, id_regex: str, download_url_fmt: str, fetcher: Optional[Fetcher] = None
    ) -> None:
        self.id_pattern = re.compile(id_regex)
        self.download_url_fmt = download_url_fmt
        self.fetcher = fetcher if fetcher is not None else Fetcher(FetchSpec())

    @classmethod
    def from_spec(cls, spec: JobSpec) -> "IDScraper":
        s = spec.scraper
        if s.id_regex is None or s.download_url_fmt is None:  # the spec validator requires both
            raise ValueError("IDScraper needs scraper.id_regex and scraper.download_url_fmt")
        return cls(s.id_regex, s.download_url_fmt, fetcher=Fetcher.for_job(spec))

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

    def find_items(self, item: str, download: Download) -> list[str]:
        """IDs matched in ``download``, each once, in order of appearance; one shaped like an
        http(s) URL as its download URL. Never raises because of what the body contains."""
        text = decode_html(download.content_type, download.body)
        found: dict[str, None] = {}
        group = 1 if self.id_pattern.groups else 0
        for match in self.id_pattern.finditer(text):
            found_id = match.group(group)
            if (found_id and len(found_id) <= MAX_ID_CHARS and found_id.isprintable()
                    and found_id not in DOT_IDS):
                if is_url(found_id):
                    found_id = id_url(self.download_url_fmt, found_id)
                found[found_id] = None
        return list(found)
