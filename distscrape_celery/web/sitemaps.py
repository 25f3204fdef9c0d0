"""Sitemap files (sitemaps.org): a ``urlset`` of pages or a ``sitemapindex`` of more sitemaps,
plain XML or gzip, read a piece at a time and bounded, whatever the file.

Pure: no network, no job. :class:`SitemapReader` takes the bytes as they arrive and stops at the
protocol's limits (:data:`MAX_SITEMAP_URLS` entries, :data:`MAX_SITEMAP_BYTES` of XML after
gzip), so that a file is never held whole. The XML parser resolves no entity and loads no DTD
or anything else (``resolve_entities=False``, ``no_network``, ``huge_tree`` off): an external
entity (XXE) reads nothing, an entity bomb expands nothing. Nothing a file holds makes it raise:
a malformed entry is skipped and counted, broken XML ends the file where it breaks, keeping the
entries before.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Optional

import lxml.etree

from ..job.urls import MAX_URL_CHARS

# The sitemaps.org limits of one file: a larger one is cut there, not refused.
MAX_SITEMAP_URLS = 50_000
MAX_SITEMAP_BYTES = 50 * 1024 * 1024
# The longest <lastmod> read: a W3C Datetime is at most some 35 characters.
_MAX_LASTMOD_CHARS = 64
_GZIP_MAGIC = b"\x1f\x8b"
# Decompressed at a time, so a gzip bomb never expands past the byte bound in memory.
_INFLATE_CHUNK = 256 * 1024
URLSET, SITEMAP_INDEX = "urlset", "sitemapindex"
# An entry's element in each kind of file.
_ENTRY_TAG = {URLSET: "url", SITEMAP_INDEX: "sitemap"}
# W3C Datetime, the format of <lastmod>: YYYY, YYYY-MM, YYYY-MM-DD, then maybe a time of hh:mm,
# hh:mm:ss or hh:mm:ss.s... with a zone (Z or +hh:mm).
_W3C_DATETIME = re.compile(
    r"(\d{4})(?:-(\d{2})(?:-(\d{2})(?:T(\d{2}):(\d{2})(?::(\d{2})(?:\.(\d+))?)?"
    r"(Z|[+-]\d{2}:\d{2})?)?)?)?\Z"
)


@dataclass(frozen=True)
class SitemapEntry:
    """One entry of a sitemap: its ``<loc>`` (stripped, as written) and its ``<lastmod>`` (None
    when absent or unreadable)."""

    url: str
    lastmod: Optional[datetime] = None


@dataclass
class Sitemap:
    """What was read of one file. ``kind``: :data:`URLSET` (its entries are pages),
    :data:`SITEMAP_INDEX` (its entries are sitemaps) or None (not a sitemap: no entries).
    ``malformed``: entries skipped (no ``<loc>``, or one too long). ``cut``: why reading stopped
    before the end (a limit, or broken XML); empty if the whole file was read."""

    kind: Optional[str] = None
    entries: list[SitemapEntry] = field(default_factory=list)
    malformed: int = 0
    cut: str = ""


def parse_lastmod(text: Optional[str]) -> Optional[datetime]:
    """A ``<lastmod>`` as an aware datetime (UTC when it names no zone); None when it is not a
    W3C Datetime."""
    if text is None:
        return None
    text = text.strip()
    match = _W3C_DATETIME.match(text) if len(text) <= _MAX_LASTMOD_CHARS else None
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    try:
        tz = timezone.utc
        if zone and zone != "Z":
            sign = -1 if zone[0] == "-" else 1
            tz = timezone(sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
        return datetime(
            int(year), int(month or 1), int(day or 1), int(hour or 0), int(minute or 0),
            int(second or 0), int((fraction or "0")[:6].ljust(6, "0")), tzinfo=tz,
        )
    except ValueError:  # a month 13, a zone past a day
        return None


def _local(tag: object) -> str:
    """An element's name without its namespace (sitemaps of any namespace are read alike);
    '' for comments and processing instructions."""
    return tag.rpartition("}")[2] if isinstance(tag, str) else ""


class SitemapReader:
    """Reads one sitemap file from its bytes, fed as they arrive (:meth:`write`), gzip or not (by
    its first bytes, whatever its name or Content-Type): a
    :class:`~distscrape_celery.web.fetch.BodySink`. Keeps at most ``max_urls`` entries and
    parses at most ``max_bytes`` of XML; past either, :meth:`write` returns False and the file
    is cut there. :meth:`close` gives the :class:`Sitemap`. One file per reader."""

    def __init__(
        self, max_urls: int = MAX_SITEMAP_URLS, max_bytes: int = MAX_SITEMAP_BYTES
    ) -> None:
        self.max_urls = max_urls
        self.max_bytes = max_bytes
        self.sitemap = Sitemap()
        self._parser = lxml.etree.XMLPullParser(
            events=("end",), resolve_entities=False, no_network=True, load_dtd=False,
            huge_tree=False, remove_comments=True, remove_pis=True,
        )
        self._head = b""  # the first bytes, until they tell gzip from XML
        self._inflate: Optional[zlib._Decompress] = None
        self._gzip: Optional[bool] = None
        self._xml_bytes = 0
        self._cut_short = False  # the gzip stream ended before its end mark
        self._done = False

    def write(self, data: bytes) -> bool:
        """Take the next bytes of the file. False once reading has stopped (a limit, broken XML
        or broken gzip): the rest need not be read."""
        if self._done:
            return False
        if self._gzip is None:
            self._head += data
            if len(self._head) < len(_GZIP_MAGIC):
                return True
            data, self._head = self._head, b""
            self._gzip = data.startswith(_GZIP_MAGIC)
            if self._gzip:
                self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        if self._gzip:
            return self._feed_gzip(data)
        return self._feed_xml(data)

    def _feed_gzip(self, data: bytes) -> bool:
        """Inflate ``data`` a bounded piece at a time into the XML parser; a file of several gzip
        members (as ``cat a.gz b.gz`` makes) is read member after member."""
        while data and not self._done:
            try:
                piece = self._inflate.decompress(data, _INFLATE_CHUNK)
            except zlib.error as exc:
                return self._stop(f"broken gzip: {exc}")
            if self._inflate.eof:
                data = self._inflate.unused_data
                self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            else:
                data = self._inflate.unconsumed_tail
            if piece and not self._feed_xml(piece):
                return False
        return not self._done

    def _feed_xml(self, data: bytes) -> bool:
        room = self.max_bytes - self._xml_bytes
        cut = len(data) > room
        data = data[:room]
        self._xml_bytes += len(data)
        try:
            self._parser.feed(data)
            self._take(self._parser.read_events())
        except lxml.etree.XMLSyntaxError as exc:
            return self._stop(f"broken XML: {exc}")
        if cut and not self._done:
            return self._stop(f"more than {self.max_bytes} bytes of XML")
        return not self._done

    def _take(self, events) -> None:
        """Keep the entries the parser finished, dropping each element once read, so that the
        parsed tree never grows past one entry."""
        sitemap = self.sitemap
        for _, element in events:
            parent = element.getparent()
            if parent is None or parent.getparent() is not None:
                continue  # the root, or an element inside an entry: read with its entry
            if sitemap.kind is None:
                kind = _local(parent.tag)
                sitemap.kind = kind if kind in _ENTRY_TAG else ""
            if sitemap.kind and _local(element.tag) == _ENTRY_TAG[sitemap.kind]:
                self._entry(element)
            element.clear()
            # Entries read before stay the root's children unless removed.
            while element.getprevious() is not None:
                del parent[0]
            if len(sitemap.entries) >= self.max_urls:
                self._stop(f"more than {self.max_urls} entries")
                return

    def _entry(self, element: lxml.etree._Element) -> None:
        loc = lastmod = None
        for child in element:
            name = _local(child.tag)
            if name == "loc" and loc is None:
                # An entity reference is left unexpanded, as a child: such a <loc> is no URL.
                loc = "" if len(child) else (child.text or "").strip()
            elif name == "lastmod" and lastmod is None:
                lastmod = child.text
        if not loc or len(loc) > MAX_URL_CHARS:
            self.sitemap.malformed += 1
            return
        self.sitemap.entries.append(SitemapEntry(loc, parse_lastmod(lastmod)))

    def _stop(self, why: str) -> bool:
        if not self._done:
            self._done = True
            self.sitemap.cut = why
        return False

    def close(self) -> Sitemap:
        """The sitemap read so far; the parse ends (an entry the file left unfinished is lost)."""
        if not self._done:
            if self._head:
                self._feed_xml(self._head)
            if self._inflate is not None and self._xml_bytes and not self._inflate.eof:
                self._cut_short = True  # a download cut at its byte bound, or a broken file
            try:
                self._parser.close()
                self._take(self._parser.read_events())
            except lxml.etree.XMLSyntaxError as exc:
                if self._xml_bytes:
                    why = "gzip stream ends early" if self._cut_short else f"broken XML: {exc}"
                    self._stop(why)
            self._done = True
        self.sitemap.kind = self.sitemap.kind or None  # "": a root of another name
        return self.sitemap


def parse_sitemap(data: bytes, max_urls: int = MAX_SITEMAP_URLS,
                  max_bytes: int = MAX_SITEMAP_BYTES) -> Sitemap:
    """The sitemap of a whole file in ``data`` (:class:`SitemapReader`, fed in pieces)."""
    reader = SitemapReader(max_urls, max_bytes)
    for start in range(0, len(data), 64 * 1024):
        if not reader.write(data[start:start + 64 * 1024]):
            break
    return reader.close()
