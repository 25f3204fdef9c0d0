"""SimpleScraper: items are URLs, new items are the links of HTML pages."""

from __future__ import annotations

import logging
import re
import threading
from typing import Optional
from urllib.parse import urljoin, urlsplit

import lxml.etree
import lxml.html

from ..caches import ByteBoundedCache, text_bytes
from ..web.encoding import decode_html
from ..web.fetch import Download, Fetcher, media_type_of
from ..job.spec import FetchSpec, JobSpec
from ..job.patterns import Budget, PatternTimeout
from ..web.scope import LinkScope
from ..job.urls import PLAIN_SEGMENT, is_plain_url
from .base import Scraper

_HTML_TYPES = ("text/html", "application/xhtml+xml")
_HTML_STARTS = (b"<!doctype html", b"<html")
_HTML_WHITESPACE = " \t\n\f\r"
# Links resolved and scoped, per scraper (job) and process: a site's menus and footers repeat on
# every page. Some 15,000 links of a usual length.
_CACHED_LINK_BYTES = 8 * 1024 * 1024
_MISSING = object()
# An href that urljoin resolves without its parsing: a path from the root ("/a/b.html") or one
# relative to the page's directory, maybe behind "./" and "../" ("../a/b.html"), of unreserved
# characters with no empty, "." or ".." segment after those, no query, maybe a fragment.
# tests/unit/test_url_fast_paths.py checks the result against urljoin's.
_PLAIN_HREF = re.compile(
    rf"(/|(?:\.\.?/)*)((?:{PLAIN_SEGMENT}(?:/{PLAIN_SEGMENT})*/?)?)(?:#[!-~]*)?\Z"
)
_PLAIN_DIR = re.compile(rf"/(?:{PLAIN_SEGMENT}/)*\Z")
# (the page's scheme, host and directory; an href on it): a key of the links cache.
_LinkKey = tuple[tuple[str, str, str], str]

log = logging.getLogger(__name__)


def _link_bytes(key: _LinkKey, url: Optional[str]) -> int:
    """What an entry of the links cache holds: its key's strings and the URL."""
    (scheme, netloc, directory), href = key
    return text_bytes(scheme, netloc, directory, href, url or "")


class SimpleScraper(Scraper):
    """Items are http(s) URLs; new items are the links (``<a>``, ``<area>``) of HTML pages that
    ``scope`` accepts, in its canonical form. Other content types are downloaded (and saved) but
    have no links. An href longer than the scope's ``max_url_length`` is dropped before anything
    else is done with it."""

    def __init__(self, scope: Optional[LinkScope] = None, fetcher: Optional[Fetcher] = None) -> None:
        self.scope = scope if scope is not None else LinkScope()
        self.fetcher = fetcher if fetcher is not None else Fetcher(FetchSpec())
        self._links: ByteBoundedCache[_LinkKey, Optional[str]] = ByteBoundedCache(
            _CACHED_LINK_BYTES, _link_bytes
        )

    @classmethod
    def from_spec(cls, spec: JobSpec) -> "SimpleScraper":
        """Follow the links ``spec.scraper`` scopes in, fetched with the job's guarded fetcher."""
        return cls(LinkScope.from_spec(spec), Fetcher.for_job(spec))

    def download(self, item: str) -> Download:
        return self.fetcher.get(item)

    def find_items(self, item: str, download: Download) -> list[str]:
        """Canonical absolute URLs linked from ``download`` that the scope accepts, each once,
        in document order. Never raises because of what the page contains: when the scope's
        patterns use up the page's time budget, the links found until then are returned."""
        if not _looks_like_html(download):
            return []
        text = decode_html(download.content_type, download.body)
        base_href, hrefs = _parse_links(text)
        try:
            base = urljoin(download.url, base_href) if base_href is not None else download.url
        except ValueError:
            base = download.url
        found: dict[str, None] = {}  # an ordered set
        prefixes: Optional[tuple[str, tuple[str, ...]]] = None
        try:
            scheme, netloc, path, _, _ = urlsplit(base)
            # What urljoin takes from the base for an href with a path of its own: the base's
            # directory, not its last segment, query or fragment. Pages of one directory share
            # the resolved links.
            where: Optional[tuple[str, str, str]] = (scheme, netloc, path[:path.rfind("/") + 1])
            if scheme in ("http", "https") and netloc and _PLAIN_DIR.match(where[2]):
                prefixes = (f"{scheme}://{netloc}", tuple(where[2].split("/")[1:-1]))
        except ValueError:
            where = None
        links = self._links
        max_length = self.scope.max_url_length
        budget = self.scope.page_budget()
        try:
            for href in hrefs:
                if len(href) > max_length:  # junk or an attack: never resolved, never cached
                    continue
                # An empty href, or one that starts with "?", "#" or ";", takes more of the base.
                if where is None or not href or href[0] in "?#;":
                    url = self._follow(base, href, budget)
                else:
                    key = (where, href)
                    url = links.get(key, _MISSING)
                    if url is _MISSING:
                        url = self._follow(base, href, budget, prefixes)
                        links.put(key, url)
                if url is not None:
                    found[url] = None
        except PatternTimeout as exc:
            log.warning("%s: link extraction stopped, %s (scraper.regex_seconds); the %d links "
                        "found before are kept", item, exc, len(found))
        return list(found)

    def _follow(
        self, base: str, href: str, budget: Budget,
        prefixes: Optional[tuple[str, tuple[str, ...]]] = None,
    ) -> Optional[str]:
        """The canonical URL ``href`` on a page at ``base`` points to, if the scope takes it
        (its patterns matched within ``budget``). ``prefixes``: the base's origin and directory
        segments, when they are plain enough to join a plain href to (see _PLAIN_HREF)."""
        try:
            plain = _PLAIN_HREF.match(href) if prefixes is not None else None
            if plain is not None:
                joined = join_plain(prefixes, *plain.groups())
            elif prefixes is not None and is_plain_url(href):
                joined = href  # absolute already; urljoin would take it apart and put it back
            else:
                joined = urljoin(base, href)
            return self.scope.accept(joined, budget)
        except ValueError:  # urljoin on a malformed href (a bad IPv6 literal)
            return None


def join_plain(prefixes: tuple[str, tuple[str, ...]], lead: str, rest: str) -> str:
    """What urljoin gives for a plain href (``lead``: "/" or its "./" and "../" steps, ``rest``:
    the path after them) on a page whose origin and directory segments are ``prefixes``, without
    the fragment. Past the root, ".." stays at the root, as in urljoin."""
    origin, dirs = prefixes
    if lead == "/":
        return f"{origin}/{rest}"
    up = lead.count("../")
    kept = dirs[:max(len(dirs) - up, 0)]
    return origin + "/" + "".join(d + "/" for d in kept) + rest


def _looks_like_html(download: Download) -> bool:
    media_type = media_type_of(download.content_type)
    if media_type:
        return media_type in _HTML_TYPES
    head = download.body[:256].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    return head.startswith(_HTML_STARTS)


class _LinkCollector:
    """lxml parser target: the first ``<base href>`` and every ``<a>``/``<area>`` href, in order.

    Events instead of a tree, because libxml2 gives up on trees nested deeper than its limit
    and the links after that would be lost.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
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


_parsers = threading.local()


def _parse_links(text: str) -> tuple[Optional[str], list[str]]:
    """(first base href, hrefs) of an HTML page; whatever libxml2 recovers from broken input."""
    # One parser and collector per thread, reused: building a target parser inspects the
    # target's methods (inspect.getfullargspec), which cost about as much as the parse itself.
    state = getattr(_parsers, "state", None)
    if state is None:
        collector = _LinkCollector()
        # huge_tree: libxml2's default limits would stop the parse at a text or attribute over
        # 10 MB and lose every later link; the fetcher's max_bytes already bounds the input.
        parser = lxml.html.HTMLParser(target=collector, encoding="utf-8", huge_tree=True)
        state = _parsers.state = (collector, parser)
    collector, parser = state
    collector.reset()
    try:
        # Bytes, already decoded once: libxml2 refuses text that carries an encoding declaration.
        lxml.etree.fromstring(text.encode("utf-8", "surrogatepass"), parser)
    except lxml.etree.LxmlError:
        pass  # keep the links found before the parser gave up
    return collector.base_href, collector.hrefs
