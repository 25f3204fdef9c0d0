"""SimpleScraper: items are URLs, new items are the links of HTML pages."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Optional
from urllib.parse import urljoin

import lxml.etree
import lxml.html

from ..fetch import Download, Fetcher
from ..jobspec import MAX_URL_CHARS, FetchSpec, JobSpec
from ..urls import normalize_url, url_host
from .base import Scraper

_HTML_TYPES = ("text/html", "application/xhtml+xml")
_HTML_STARTS = (b"<!doctype html", b"<html")
_HTML_WHITESPACE = " \t\n\f\r"


class SimpleScraper(Scraper):
    """Items are http(s) URLs; new items are the links (``<a>``, ``<area>``) of HTML pages.

    ``link_regex`` (``re.search`` on the normalised absolute URL) and ``allowed_hosts`` filter
    the links; ``None`` means no filter.
    """

    def __init__(
        self,
        link_regex: Optional[str] = None,
        allowed_hosts: Optional[Iterable[str]] = None,
        fetcher: Optional[Fetcher] = None,
    ) -> None:
        self.link_pattern = re.compile(link_regex) if link_regex is not None else None
        self.allowed_hosts = (
            frozenset(host.lower() for host in allowed_hosts) if allowed_hosts is not None else None
        )
        self.fetcher = fetcher if fetcher is not None else Fetcher(FetchSpec())

    @classmethod
    def from_spec(cls, spec: JobSpec) -> "SimpleScraper":
        """Follow ``spec.scraper.link_regex``, stay on the seeds' hosts if ``same_host``."""
        hosts = {url_host(seed) for seed in spec.seeds} if spec.scraper.same_host else None
        return cls(
            link_regex=spec.scraper.link_regex, allowed_hosts=hosts, fetcher=Fetcher(spec.fetch)
        )

    def download(self, item: str) -> Download:
        return self.fetcher.get(item)

    def find_items(self, item: str, download: Download) -> list[str]:
        """Normalised absolute URLs linked from ``download`` that pass the filters, each once,
        in document order. Never raises because of what the page contains."""
        if not _looks_like_html(download):
            return []
        base_href, hrefs = _parse_links(download.body, _charset(download.content_type))
        try:
            base = urljoin(download.url, base_href) if base_href is not None else download.url
        except ValueError:
            base = download.url
        found: dict[str, None] = {}  # an ordered set
        for href in hrefs:
            url = self._accept(base, href)
            if url is not None:
                found[url] = None
        return list(found)

    def _accept(self, base: str, href: str) -> Optional[str]:
        """``href`` resolved and normalised, or None if it is not a followable, wanted link."""
        try:
            url = normalize_url(urljoin(base, href))
        except ValueError:  # mailto:, javascript:, data:, ftp:, malformed
            return None
        if len(url) > MAX_URL_CHARS:
            return None
        if self.allowed_hosts is not None and url_host(url) not in self.allowed_hosts:
            return None
        if self.link_pattern is not None and not self.link_pattern.search(url):
            return None
        return url


def _looks_like_html(download: Download) -> bool:
    media_type = download.content_type.split(";", 1)[0].strip().lower()
    if media_type:
        return media_type in _HTML_TYPES
    head = download.body[:256].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    return head.startswith(_HTML_STARTS)


def _charset(content_type: str) -> Optional[str]:
    """The ``charset`` parameter of a Content-Type header, if any."""
    for param in content_type.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip("\"'") or None
    return None


class _LinkCollector:
    """lxml parser target: the first ``<base href>`` and every ``<a>``/``<area>`` href, in order.

    Events instead of a tree, because libxml2 gives up on trees nested deeper than its limit
    and the links after that would be lost.
    """

    def __init__(self) -> None:
        self.base_href: Optional[str] = None
        self.hrefs: list[str] = []

    def start(self, tag: str, attrib: dict) -> None:
        href = attrib.get("href")
        if href is None:
            return
        if tag in ("a", "area"):
            self.hrefs.append(href.strip(_HTML_WHITESPACE))
        elif tag == "base" and self.base_href is None:
            self.base_href = href.strip(_HTML_WHITESPACE)

    def close(self) -> None:
        pass


def _parse_links(body: bytes, charset: Optional[str]) -> tuple[Optional[str], list[str]]:
    """(first base href, hrefs) of an HTML body; whatever libxml2 recovers from broken input."""
    collector = _LinkCollector()
    # huge_tree: libxml2's default limits would stop the parse at a text or attribute over
    # 10 MB and lose every later link; the fetcher's max_bytes already bounds the input.
    try:
        parser = lxml.html.HTMLParser(target=collector, encoding=charset, huge_tree=True)
    except (LookupError, ValueError):  # a charset libxml2 does not know: let it sniff the body
        parser = lxml.html.HTMLParser(target=collector, huge_tree=True)
    try:
        lxml.etree.fromstring(body, parser)
    except lxml.etree.LxmlError:
        pass  # keep the links found before the parser gave up
    return collector.base_href, collector.hrefs
