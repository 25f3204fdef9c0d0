"""SimpleScraper: items are URLs, new items are the links of HTML pages."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from typing import Optional
from urllib.parse import urljoin, urlsplit

import lxml.etree
import lxml.html

from ..caches import ByteBoundedCache, text_bytes
from ..web.encoding import decode_html
from ..web.fetch import Download, Fetcher, media_type_of
from ..web.page_meta import (
    MAX_VALUE_CHARS, NO_META, MetaReader, PageMeta, agent_token, meta_names,
)
from ..job.scraper_spec import DEFAULT_MAX_LINKS_PER_PAGE, HREFS_LOOKED_AT_PER_LINK
from ..job.sections import FetchSpec
from ..job.spec import JobSpec
from ..job.patterns import Budget, PatternTimeout
from ..web.scope import LinkScope
from ..job.urls import PLAIN_SEGMENT, is_plain_url
from .base import FoundItems, Scraper

_HTML_TYPES = ("text/html", "application/xhtml+xml")
_HTML_STARTS = (b"<!doctype html", b"<html")
_HTML_WHITESPACE = " \t\n\f\r"
# Links resolved and scoped, per scraper (job) and process: a site's menus and footers repeat on
# every page. Some 15,000 links of a usual length.
_CACHED_LINK_BYTES = 8 * 1024 * 1024
_MISSING = object()
# Text fed to the parser at a time: bounds the hrefs held at once to those of one slice (some
# 6,000 of the shortest), and the parse done past the point where extraction stops.
_FEED_CHARS = 64 * 1024
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
    ``scope`` accepts, in its canonical form, at most ``max_links`` a page. Other content types
    are downloaded (and saved) but have no links. An href longer than the scope's
    ``max_url_length`` is dropped before anything else is done with it. At most
    ``HREFS_LOOKED_AT_PER_LINK * max_links`` hrefs of a page are looked at (``max_hrefs``).
    With ``skip_rel_nofollow``, a link whose ``rel`` says ``nofollow`` is no link at all. The
    same parse reads the page's robots meta tags (``robots``, or named ``agent``: the crawler's
    :func:`~distscrape_celery.web.page_meta.agent_token`) and canonical links."""

    def __init__(
        self, scope: Optional[LinkScope] = None, fetcher: Optional[Fetcher] = None,
        max_links: int = DEFAULT_MAX_LINKS_PER_PAGE, *, agent: str = "",
        skip_rel_nofollow: bool = False,
    ) -> None:
        if max_links < 1:
            raise ValueError(f"scraper.max_links_per_page must be at least 1, not {max_links}")
        self.scope = scope if scope is not None else LinkScope()
        self.fetcher = fetcher if fetcher is not None else Fetcher(FetchSpec())
        self.max_links = max_links
        self.meta_names = meta_names(agent)
        self.skip_rel_nofollow = skip_rel_nofollow
        self.max_hrefs = HREFS_LOOKED_AT_PER_LINK * max_links
        self._links: ByteBoundedCache[_LinkKey, Optional[str]] = ByteBoundedCache(
            _CACHED_LINK_BYTES, _link_bytes
        )

    @classmethod
    def from_spec(cls, spec: JobSpec) -> "SimpleScraper":
        """Follow the links ``spec.scraper`` scopes in, at most its max_links_per_page a page,
        fetched with the job's guarded fetcher."""
        return cls(LinkScope.from_spec(spec), Fetcher.for_job(spec),
                   spec.scraper.max_links_per_page, agent=agent_token(spec.fetch.user_agent),
                   skip_rel_nofollow=spec.scraper.obey_rel_nofollow)

    def download(self, item: str) -> Download:
        return self.fetcher.get(item)

    def find_items(self, item: str, download: Download) -> FoundItems:
        """Canonical absolute URLs linked from ``download`` that the scope accepts, each once,
        in document order, at most ``max_links``. Never raises because of what the page
        contains: when the scope's patterns use up the page's time budget, the links found
        until then are returned.

        The page's hrefs are parsed a slice at a time and looked at as they come. Extraction
        stops once ``max_links`` links are found or ``max_hrefs`` hrefs were looked at; the
        hrefs after that are counted (as ``cut``), never resolved or kept.

        The page's robots meta tags and canonical links come in the same parse
        (:attr:`FoundItems.meta`)."""
        if not _looks_like_html(download):
            return FoundItems()
        text = decode_html(download.content_type, download.body)
        budget = self.scope.page_budget()
        with self._hrefs(text) as hrefs:
            base_href = hrefs.leading_base()
            found = self._collect(item, download.url, base_href, hrefs, budget)
            # Known once the whole page was parsed (not after a pattern timeout).
            first_base = hrefs.base_href if hrefs.ended else base_href
            found.meta = hrefs.meta(_page_base(download.url, first_base))
        if first_base == base_href:
            return found
        # A <base> after the first link applies to the links before it as well (it is the
        # page's first): the page once more, knowing it. Rare, and twice the work at most.
        with self._hrefs(text) as hrefs:
            again = self._collect(item, download.url, first_base, hrefs, budget)
        again.meta = found.meta
        return again

    def page_meta(self, item: str, download: Download) -> PageMeta:
        """The page's robots meta tags and canonical links, its hrefs counted, not resolved."""
        if not _looks_like_html(download):
            return NO_META
        with self._hrefs(decode_html(download.content_type, download.body)) as hrefs:
            hrefs.count_rest()
            return hrefs.meta(_page_base(download.url, hrefs.base_href))

    def _hrefs(self, text: str) -> "_HrefStream":
        return _HrefStream(text, self.meta_names, self.skip_rel_nofollow)

    def _collect(
        self, item: str, url: str, base_href: Optional[str], hrefs: "_HrefStream", budget: Budget,
    ) -> FoundItems:
        """The links of ``hrefs``, on a page at ``url`` whose ``<base href>`` is ``base_href``,
        up to the limits (see :meth:`find_items`); the stream is parsed to its end unless the
        patterns ran out of ``budget``."""
        base = _page_base(url, base_href)
        where, prefixes = _base_parts(base)
        found: dict[str, None] = {}  # an ordered set
        looked_at = 0
        limit = ""
        try:
            for href in hrefs:
                looked_at += 1
                link = self._resolve(base, href, where, prefixes, budget)
                if link is not None:
                    found[link] = None
                    if len(found) >= self.max_links:
                        limit = f"max_links_per_page={self.max_links}"
                        break
                if looked_at >= self.max_hrefs:
                    limit = (f"{self.max_hrefs} hrefs looked at ({HREFS_LOOKED_AT_PER_LINK} "
                             f"x max_links_per_page={self.max_links})")
                    break
        except PatternTimeout as exc:
            log.warning("%s: link extraction stopped, %s (scraper.regex_seconds); the %d "
                        "links found before are kept", item, exc, len(found))
            return FoundItems(found, looked_at=looked_at)
        cut = hrefs.count_rest()  # 0 when the loop ran to the end
        return FoundItems(found, cut=cut, limit=limit if cut else "", looked_at=looked_at)

    def _resolve(
        self, base: str, href: str, where: Optional[tuple[str, str, str]],
        prefixes: Optional[tuple[str, tuple[str, ...]]], budget: Budget,
    ) -> Optional[str]:
        """What :meth:`_follow` gives for ``href`` on a page at ``base`` (whose scheme, host
        and directory are ``where``), through the links cache when the result depends on
        nothing else. An href over the scope's max_url_length is None at once, and not cached."""
        if len(href) > self.scope.max_url_length:  # junk or an attack: never resolved or cached
            return None
        # An empty href, or one that starts with "?", "#" or ";", takes more of the base.
        if where is None or not href or href[0] in "?#;":
            return self._follow(base, href, budget)
        key = (where, href)
        url = self._links.get(key, _MISSING)
        if url is _MISSING:
            url = self._follow(base, href, budget, prefixes)
            self._links.put(key, url)
        return url

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
    levels_up = lead.count("../")
    kept = dirs[:max(len(dirs) - levels_up, 0)]
    return origin + "/" + "".join(d + "/" for d in kept) + rest


def _looks_like_html(download: Download) -> bool:
    media_type = media_type_of(download.content_type)
    if media_type:
        return media_type in _HTML_TYPES
    head = download.body[:256].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    return head.startswith(_HTML_STARTS)


def _joined(base: str, href: str) -> str:
    """``href`` resolved against ``base``; as written if urljoin refuses it (a bad IPv6
    literal)."""
    try:
        return urljoin(base, href)
    except ValueError:
        return href


def _page_base(url: str, base_href: Optional[str]) -> str:
    """The URL a page's hrefs are resolved against: its ``<base href>`` joined to its own
    ``url``, or ``url`` when it has none or a malformed one."""
    if base_href is None:
        return url
    try:
        return urljoin(url, base_href)
    except ValueError:
        return url


def _base_parts(
    base: str,
) -> tuple[Optional[tuple[str, str, str]], Optional[tuple[str, tuple[str, ...]]]]:
    """(``where``, ``prefixes``) of a page's ``base``: what urljoin takes from the base for an
    href with a path of its own (its scheme, host and directory, not its last segment, query or
    fragment; pages of one directory share the resolved links), and the origin and directory
    segments a plain href is joined to (None unless plain enough, see _PLAIN_HREF). Both None
    for a base urlsplit refuses."""
    try:
        scheme, netloc, path, _, _ = urlsplit(base)
    except ValueError:
        return None, None
    where = (scheme, netloc, path[:path.rfind("/") + 1])
    if scheme in ("http", "https") and netloc and _PLAIN_DIR.match(where[2]):
        return where, (f"{scheme}://{netloc}", tuple(where[2].split("/")[1:-1]))
    return where, None


class _LinkCollector:
    """lxml parser target: the first ``<base href>`` and every ``<a>``/``<area>`` href, in order
    (without those whose ``rel`` says nofollow, with ``skip_nofollow``), and the robots meta tags
    and canonical links (``meta``). While ``counting``, hrefs are only counted (``counted``), not
    kept.

    Events instead of a tree, because libxml2 gives up on trees nested deeper than its limit
    and the links after that would be lost.
    """

    def __init__(self) -> None:
        self.meta = MetaReader()
        self.reset()

    def reset(self, meta_names: frozenset[str] = frozenset(), skip_nofollow: bool = False) -> None:
        self.base_href: Optional[str] = None
        self.hrefs: list[str] = []
        self.counting = False
        self.counted = 0
        self.skip_nofollow = skip_nofollow
        self.meta.names = meta_names
        self.meta.reset()

    def start(self, tag: str, attrib: dict) -> None:
        href = attrib.get("href")
        if href is None:
            if tag == "meta":
                self.meta.tag(tag, attrib)
            return
        if tag in ("a", "area"):
            if self.skip_nofollow and _says_nofollow(attrib.get("rel")):
                return
            if self.counting:
                self.counted += 1
            else:
                self.hrefs.append(href.strip(_HTML_WHITESPACE))
        elif tag == "base" and self.base_href is None:
            self.base_href = href.strip(_HTML_WHITESPACE)
        elif tag == "link":
            self.meta.tag(tag, attrib)

    def close(self) -> None:
        pass


def _says_nofollow(rel: Optional[str]) -> bool:
    """Whether a link's ``rel`` attribute includes ``nofollow``."""
    return rel is not None and "nofollow" in rel[:MAX_VALUE_CHARS].lower().split()


_parsers = threading.local()


def _thread_parser() -> tuple[_LinkCollector, lxml.etree.HTMLParser]:
    """This thread's collector and the parser feeding it, made on first use and reused: building
    a target parser inspects the target's methods (inspect.getfullargspec), which cost about as
    much as a parse. One page at a time per thread (see _HrefStream)."""
    state = getattr(_parsers, "state", None)
    if state is None:
        collector = _LinkCollector()
        # huge_tree: libxml2's default limits would stop the parse at a text or attribute over
        # 10 MB and lose every later link; the fetcher's max_bytes already bounds the input.
        parser = lxml.html.HTMLParser(target=collector, encoding="utf-8", huge_tree=True)
        state = _parsers.state = (collector, parser)
    return state


class _HrefStream:
    """The ``<a>``/``<area>`` hrefs of an HTML page's ``text``, in document order, as libxml2
    finds them: the text is fed to the parser ``_FEED_CHARS`` at a time, so that only one
    slice's hrefs are held at once and a caller that stops early leaves the rest unresolved.
    Whatever libxml2 recovers from broken input; the hrefs found before it gives up are kept.

    A context manager: leaving it ends the parse, which the thread's reused parser needs before
    its next page."""

    def __init__(self, text: str, meta_names: frozenset[str] = frozenset(),
                 skip_nofollow: bool = False) -> None:
        self._text = text
        self._collector, self._parser = _thread_parser()
        self._collector.reset(meta_names, skip_nofollow)
        self._fed = 0  # characters of the text fed to the parser
        self._batch: list[str] = []  # the hrefs of the last slice fed
        self._taken = 0  # of them, handed out
        self._ended = False

    def __enter__(self) -> "_HrefStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self._end()
        self._collector.reset()  # drop the page's strings

    def __iter__(self) -> Iterator[str]:
        while True:
            batch = self._batch
            for index in range(self._taken, len(batch)):
                self._taken = index + 1
                yield batch[index]
            if not self._feed_more():
                return

    @property
    def ended(self) -> bool:
        """Whether the whole page has been parsed (or the parser gave up)."""
        return self._ended

    @property
    def base_href(self) -> Optional[str]:
        """The page's first ``<base href>`` as far as it has been parsed."""
        return self._collector.base_href

    def meta(self, base: str) -> PageMeta:
        """The robots meta tags and canonical links of the page as far as it has been parsed,
        the canonical hrefs resolved against ``base`` (the page's base URL; one urljoin
        refuses stays as written, a URL no scope takes)."""
        found = self._collector.meta.result()
        if not found.canonicals:
            return found
        return PageMeta(found.robots, tuple(_joined(base, href) for href in found.canonicals))

    def leading_base(self) -> Optional[str]:
        """The ``<base href>`` of the page before its first href or in the slice holding it
        (where a page's head has it), if any: the text is fed until a slice gives hrefs."""
        while not self._batch and self._feed_more():
            pass
        return self._collector.base_href

    def count_rest(self) -> int:
        """The hrefs not handed out yet, counted to the end of the page without being kept;
        ends the stream."""
        rest = len(self._batch) - self._taken
        self._batch, self._taken = [], 0
        self._collector.counting = True
        while self._feed_more():
            pass
        return rest + self._collector.counted

    def _feed_more(self) -> bool:
        """Feed the parser the next slice of the text (or end the parse after the last); the
        hrefs that completed become the batch. False once the parse has ended."""
        if self._ended:
            return False
        collector = self._collector
        collector.hrefs = []
        text = self._text
        # Bytes of text decoded once already: libxml2 refuses text that carries an encoding
        # declaration. A slice encodes to the bytes it has in the whole.
        if self._fed == 0 and len(text) <= _FEED_CHARS:
            # A page of one slice (most pages) is parsed in one call: a push parse costs more
            # to set up than the parse of a small page.
            self._fed = len(text)
            self._ended = True
            try:
                lxml.etree.fromstring(text.encode("utf-8", "surrogatepass"), self._parser)
            except lxml.etree.LxmlError:
                pass  # keep the links found before the parser gave up
        elif self._fed < len(text):
            piece = text[self._fed:self._fed + _FEED_CHARS]
            self._fed += len(piece)
            try:
                self._parser.feed(piece.encode("utf-8", "surrogatepass"))
            except lxml.etree.LxmlError:
                self._end()  # keep the links found before the parser gave up
        else:
            self._end()  # the last elements come out as the parse ends
        self._batch, self._taken = collector.hrefs, 0
        return True

    def _end(self) -> None:
        """End the parse (once), so that the thread's parser starts afresh on its next page."""
        if not self._ended:
            self._ended = True
            try:
                self._parser.close()
            except lxml.etree.LxmlError:
                pass  # an empty or broken page: nothing more to find
