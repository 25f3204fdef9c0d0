"""What a page says about itself: its robots directives (``<meta name=robots>``, a meta tag
named after the crawler, the ``X-Robots-Tag`` header) and its canonical URL (``<link
rel=canonical>``, a ``Link: <...>; rel="canonical"`` header), read as Google documents them.

Only ``noindex``, ``nofollow`` and ``none`` (both) change anything; every other directive
(``all``, ``index``, ``noarchive``, ``max-snippet: 20``, ``unavailable_after: ...``) is
ignored. Where several tags or headers disagree the most restrictive wins. Nothing here raises
because of what a site sent, and no tag or header line costs more than a few KiB of work."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# Of one meta content or header value, the characters read: real ones are a few dozen.
MAX_VALUE_CHARS = 1024
# Of a page's robots meta tags (those named for the crawler), the first this many are read: a
# real page has one or two, and a page of many thousands costs a name check each past these.
MAX_ROBOTS_TAGS = 32
# Of one Link header line, the characters read: it may list many links (preloads, alternates).
_MAX_LINK_CHARS = 8 * MAX_VALUE_CHARS
# Of a page's canonical hrefs, the distinct ones kept: two tell that the page names several.
_MAX_CANONICALS = 2
# Directives that take a value after a colon: "max-snippet: 20" names no user agent.
_VALUE_DIRECTIVES = frozenset({
    "unavailable_after", "max-snippet", "max-image-preview", "max-video-preview",
})
# A user agent token before a colon ("googlebot: noindex"); a date's "15:00" has none.
_AGENT = re.compile(r"[a-z0-9_.*-]+\Z")
_HTML_WHITESPACE = " \t\n\f\r"
# One link-value of a Link header: the URL between angle brackets and its parameters.
_LINK_VALUE = re.compile(r"<([^>]*)>([^<]*)")
_REL_PARAM = re.compile(r';\s*rel\s*=\s*(?:"([^"]*)"|([^\s;,"]+))', re.IGNORECASE)


@dataclass(frozen=True)
class Directives:
    """The robots directives that apply to a page: ``noindex`` (do not keep it) and
    ``nofollow`` (do not follow its links)."""

    noindex: bool = False
    nofollow: bool = False

    def __or__(self, other: "Directives") -> "Directives":
        return Directives(self.noindex or other.noindex, self.nofollow or other.nofollow)


NO_DIRECTIVES = Directives()
_NONE = Directives(True, True)


@dataclass(frozen=True)
class PageMeta:
    """What a page's HTML says about itself: the robots directives of its meta tags that apply
    to the crawler, and its ``<link rel=canonical>`` hrefs (distinct, at most two: more than one
    means the page names no single canonical URL; as written in :class:`MetaReader`, resolved
    against the page's base in what a scraper returns)."""

    robots: Directives = NO_DIRECTIVES
    canonicals: tuple[str, ...] = ()


NO_META = PageMeta()


def agent_token(user_agent: str) -> str:
    """The product token of a User-Agent, lower-cased, as a meta tag's name or an
    ``X-Robots-Tag`` prefix names a crawler: "distscrape-celery/0.1 (+https://x)" gives
    "distscrape-celery"."""
    return user_agent.strip().split("/", 1)[0].split(None, 1)[0].lower() if user_agent.strip() else ""


def _directive(word: str) -> Directives:
    """What one directive (lower case, stripped) says."""
    if word == "noindex":
        return Directives(noindex=True)
    if word == "nofollow":
        return Directives(nofollow=True)
    if word == "none":
        return _NONE
    return NO_DIRECTIVES


def _meta_flags(content: str) -> tuple[bool, bool]:
    """(noindex, nofollow) of a robots meta tag's ``content``."""
    words = {word.strip(_HTML_WHITESPACE) for word in content[:MAX_VALUE_CHARS].lower().split(",")}
    none = "none" in words
    return none or "noindex" in words, none or "nofollow" in words


def meta_directives(content: str) -> Directives:
    """The directives of a robots meta tag's ``content`` ("noindex, nofollow")."""
    return Directives(*_meta_flags(content))


def header_directives(values: Iterable[str], agent: str) -> Directives:
    """The directives of ``X-Robots-Tag`` header ``values`` (one per header line) that apply to
    the crawler whose :func:`agent_token` is ``agent``. A directive after a user agent and a colon
    ("otherbot: noindex, nofollow") applies to that agent only, as do those after it on the same
    line, up to the next agent named; the others to every crawler."""
    found = NO_DIRECTIVES
    for value in values:
        applies = True
        for part in value[:MAX_VALUE_CHARS].lower().split(","):
            name, colon, rest = part.partition(":")
            name = name.strip()
            if colon:
                if name in _VALUE_DIRECTIVES or not _AGENT.match(name):
                    continue
                applies = name == agent
                part = rest
            if applies:
                found |= _directive(part.strip())
    return found


def header_canonicals(values: Iterable[str]) -> list[str]:
    """The URLs of the ``Link`` header ``values`` whose ``rel`` includes ``canonical``, distinct,
    as written (relative ones are the caller's to resolve), at most two."""
    found: dict[str, None] = {}
    for value in values:
        for match in _LINK_VALUE.finditer(value[:_MAX_LINK_CHARS]):
            for rel in _REL_PARAM.finditer(match[2]):
                if "canonical" in (rel[1] if rel[1] is not None else rel[2]).lower().split():
                    found[match[1].strip()] = None
                    break
            if len(found) >= _MAX_CANONICALS:
                return list(found)
    return list(found)


def meta_names(agent: str) -> frozenset[str]:
    """The names of the meta tags whose directives apply to the crawler whose
    :func:`agent_token` is ``agent``: ``robots``, and ``agent`` itself."""
    return frozenset({"robots", agent} - {""})


class MetaReader:
    """Reads the robots meta tags and canonical links of one page from its parser's events
    (:meth:`tag`), for the crawler whose :func:`agent_token` is ``agent``. Each tag costs at most
    :data:`MAX_VALUE_CHARS` of work; past the first :data:`MAX_ROBOTS_TAGS` robots meta tags, or
    once nothing more could be learned of them, a meta tag costs nothing more."""

    def __init__(self, agent: str = "") -> None:
        self.names = meta_names(agent)
        self.reset()

    def reset(self) -> None:
        self.noindex = self.nofollow = False
        self._robots_left = MAX_ROBOTS_TAGS
        self.canonicals: list[str] = []

    def tag(self, tag: str, attrib: dict) -> None:
        """An element the parser started (lower-case ``tag``); only ``meta`` and ``link`` count."""
        if tag == "meta":
            if self._robots_left <= 0:
                return
            name, content = attrib.get("name"), attrib.get("content")
            if (name is None or content is None
                    or name[:64].strip(_HTML_WHITESPACE).lower() not in self.names):
                return
            noindex, nofollow = _meta_flags(content)
            self.noindex |= noindex
            self.nofollow |= nofollow
            self._robots_left = 0 if self.noindex and self.nofollow else self._robots_left - 1
        elif tag == "link" and len(self.canonicals) < _MAX_CANONICALS:
            rel, href = attrib.get("rel"), attrib.get("href")
            if (rel is not None and href is not None
                    and "canonical" in rel[:MAX_VALUE_CHARS].lower().split()):
                href = href.strip(_HTML_WHITESPACE)
                if href and href not in self.canonicals:
                    self.canonicals.append(href)

    def result(self) -> PageMeta:
        return PageMeta(Directives(self.noindex, self.nofollow), tuple(self.canonicals))

