"""URL canonicalization: the one form every item URL takes before it is deduplicated.

w3lib does the hard part (safe percent-encoding, sorted query, dot segments, lower-case host, no
fragment); on top of that default ports and tracking parameters go, so one page is one item.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from collections.abc import Iterable
from typing import NamedTuple, Optional
from urllib.parse import urlsplit, urlunsplit

from w3lib.url import canonicalize_url

from ..redaction import redact
from ..caches import ByteBoundedCache, text_bytes

# The port an http(s) URL without one names.
DEFAULT_PORTS = {"http": 80, "https": 443}
_URL_PREFIXES = ("http://", "https://")
# Canonical forms kept, per job and process: some 6,000 URLs of a usual length.
_CACHED_URL_BYTES = 4 * 1024 * 1024
# Longer URLs are junk or an attack (browsers and servers stop well before this).
MAX_URL_CHARS = 8192
# The default of scraper.max_url_length: Scrapy's URLLENGTH_LIMIT, the longest URL Internet
# Explorer took; the sitemap protocol asks for less than 2,048.
DEFAULT_MAX_URL_LENGTH = 2083

# Query parameters that only say where a visitor came from (analytics and ad click IDs).
DEFAULT_TRACKING_PARAMS: tuple[str, ...] = (
    "utm_*", "gclid", "gclsrc", "gbraid", "wbraid", "dclid", "fbclid", "msclkid", "yclid",
    "twclid", "igshid", "mc_cid", "mc_eid", "_ga", "_gl", "_hsenc", "_hsmi", "mkt_tok",
)


# A URL that canonicalize_url would give back as it is, but for its fragment: http(s), a
# lower-case host name or IPv4 address, a port (dropped below if it is the default), a path
# (maybe none) of unreserved characters with no empty, "." or ".." segment, and no query. Most
# links of a site look like this, and w3lib takes several times as long to hand them back
# unchanged. Anything else goes to w3lib; tests/unit/test_url_fast_paths.py checks that both agree.
PLAIN_SEGMENT = r"(?!\.\.?(?:[/#]|\Z))[A-Za-z0-9._~-]+"
PLAIN_PATH = rf"(?:(?:/{PLAIN_SEGMENT})+/?|/)"
# Its scheme, host and port (groups 1-3; the port may still be over 65535).
PLAIN_ORIGIN = r"(https?)://((?:[a-z0-9-]{1,63}\.)*[a-z0-9-]{1,63})(?::([1-9][0-9]{0,4}))?"
_PLAIN_URL = re.compile(rf"{PLAIN_ORIGIN}({PLAIN_PATH}?)(?:#[!-~]*)?\Z")


# A host name as a canonical URL has it (lower case, IDNA-encoded): labels of 1-63 letters,
# digits, '-' or '_' (real names have them), maybe a final dot. It takes every host _PLAIN_URL
# does. w3lib lets through hosts no resolver knows ("a..b", "exa mple.com", "*.a", "%41").
_HOST_NAME = re.compile(r"(?:[a-z0-9_-]{1,63}\.)*[a-z0-9_-]{1,63}\.?")


def host_name_error(host: str) -> Optional[str]:
    """Why ``host`` (lower case and IDNA-encoded, as :func:`urllib.parse.urlsplit` gives it; an
    IPv6 address without brackets) is no host name or address; None if it is one."""
    if _HOST_NAME.fullmatch(host):
        return None
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
            return None
        except ValueError:
            return "not an IPv6 address"
    if not host:
        return "empty"
    if "" in host.rstrip(".").split("."):
        return "empty label"
    if any(len(label) > 63 for label in host.split(".")):
        return "label longer than 63 characters"
    if "*" in host:
        return "no wildcard"
    if "%" in host:
        return "no percent-escape"
    return "not a host name (letters, digits, '-', '_' and dots only)"


class CanonicalURL(NamedTuple):
    """A canonical URL and the parts the scope checks need, so nobody splits it again."""

    url: str
    host: str
    path: str


class Canonicalizer:
    """Turns URLs into their canonical form, dropping the query parameters that match
    ``strip_params`` (names or ``fnmatch`` patterns such as ``utm_*``, case-sensitive)."""

    def __init__(self, strip_params: Iterable[str] = DEFAULT_TRACKING_PARAMS) -> None:
        patterns = [fnmatch.translate(p) for p in strip_params]
        self._strip = re.compile("|".join(patterns)).match if patterns else None
        # Most links of a site are on every page (menus, footers): each is worked out once.
        self._cache: ByteBoundedCache[str, CanonicalURL] = ByteBoundedCache(
            _CACHED_URL_BYTES, lambda url, c: text_bytes(url, c.url, c.host, c.path)
        )

    def canonical(self, url: str) -> CanonicalURL:
        """``url`` canonicalized (see :meth:`_canonical`), from the cache when it was before."""
        found = self._cache.get(url)
        if found is None:
            found = self._canonical(url)
            self._cache.put(url, found)
        return found

    def _canonical(self, url: str) -> CanonicalURL:
        """``url`` canonicalized. Raises ``ValueError`` unless it is an absolute http(s) URL
        without credentials."""
        plain = _PLAIN_URL.match(url)
        if plain is None:
            return self._canonical_w3lib(url)
        scheme, host, port, path = plain.groups()
        path = path or "/"
        if port is None or int(port) == DEFAULT_PORTS[scheme]:
            return CanonicalURL(f"{scheme}://{host}{path}", host, path)
        if int(port) > 65535:
            return self._canonical_w3lib(url)  # which refuses it
        return CanonicalURL(f"{scheme}://{host}:{port}{path}", host, path)

    def _canonical_w3lib(self, url: str) -> CanonicalURL:
        """:meth:`_canonical` for any URL."""
        # Messages show the URL redacted: one with credentials is refused, not printed.
        try:
            url = canonicalize_url(url.strip())
        except (ValueError, UnicodeError) as exc:
            raise ValueError(f"malformed URL {redact(url)!r}: {exc}") from None
        parts = urlsplit(url)
        scheme = parts.scheme
        if scheme not in DEFAULT_PORTS:
            raise ValueError(f"not an http(s) URL: {redact(url)!r}")
        host = parts.hostname or ""
        if not host:
            raise ValueError(f"URL has no host: {redact(url)!r}")
        why = host_name_error(host)
        if why is not None:
            raise ValueError(f"invalid host name {host!r} ({why})")
        if parts.username is not None or parts.password is not None:
            raise ValueError(f"URL carries credentials, refusing it: {redact(url)!r}")
        port = parts.port  # raises ValueError on a malformed port
        netloc = f"[{host}]" if ":" in host else host
        if port is not None and port != DEFAULT_PORTS[scheme]:
            netloc = f"{netloc}:{port}"
        query = parts.query
        if query and self._strip is not None:
            query = "&".join(
                pair for pair in query.split("&") if not self._strip(pair.partition("=")[0])
            )
        return CanonicalURL(urlunsplit((scheme, netloc, parts.path, query, "")), host, parts.path)


_DEFAULT = Canonicalizer()


def is_plain_url(url: str) -> bool:
    """True when ``url`` is already canonical but for a fragment or a default port (see
    _PLAIN_URL): joining it to a base gives it back as it is."""
    return _PLAIN_URL.match(url) is not None


def normalize_url(url: str, canonicalizer: Optional[Canonicalizer] = None) -> str:
    """The canonical form of ``url`` (default tracking parameters dropped). Raises
    ``ValueError`` when ``url`` is not an absolute http(s) URL, or carries credentials."""
    return (canonicalizer or _DEFAULT).canonical(url).url


def url_host(url: str) -> str:
    """The lowercased host of ``url`` (no port)."""
    return (urlsplit(url).hostname or "").lower()


def is_url(item: str) -> bool:
    """True when ``item`` is an http(s) URL (rather than an ID)."""
    return item[:8].lower().startswith(_URL_PREFIXES)
