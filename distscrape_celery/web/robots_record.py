"""What a robots.txt record keeps of a file: small and bounded, whatever the file.

Of the file's first :data:`MAX_ROBOTS_BYTES` (500 KiB, as Google reads), only the groups that can
apply to the record's user agent (its own and ``*``; ``Allow``, ``Disallow``, ``Crawl-delay``,
``Request-rate``) and the ``Sitemap`` lines are kept, written out again, and cut at
:data:`MAX_ROBOTS_RECORD_BYTES` (the rules before the cut hold, as for the 500 KiB mark; a group
cut before its first rule is left out whole). Filtering by user agent is sound because the user
agent is in the record's name (see :mod:`.robots`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional

# Google reads the first 500 KiB and ignores the rest; a larger file is cut there, not refused.
MAX_ROBOTS_BYTES = 500 * 1024
# The most one stored record takes (its JSON, UTF-8): room for the groups of a large real file
# that apply to one user agent (the biggest sites' are some 10-30 KiB), while a hostile 500 KiB
# file costs the shared Redis an eighth of that, and its parsed rules 4 MB of a process, not 30.
MAX_ROBOTS_RECORD_BYTES = 64 * 1024
# What a record holds besides its rules ("at", the keys, the braces), with room to spare.
_RECORD_FRAME_BYTES = 128


def robots_head(body: bytes) -> bytes:
    """The part of ``body`` that is read: all of it up to :data:`MAX_ROBOTS_BYTES`, else the
    lines that end before that mark (a line cut there could read as another rule)."""
    if len(body) <= MAX_ROBOTS_BYTES:
        return body
    head = body[:MAX_ROBOTS_BYTES]
    return head[:max(head.rfind(b"\n"), head.rfind(b"\r")) + 1]


# Directive names as protego reads them (misspellings included); others are dropped.
_USER_AGENT = frozenset({"user-agent", "useragent", "user agent"})
_RULES = {
    **dict.fromkeys(("allow",), "Allow"),
    **dict.fromkeys(("disallow", "dissallow", "dissalow", "disalow", "diasllow", "disallaw"),
                    "Disallow"),
    **dict.fromkeys(("crawl-delay", "crawl delay"), "Crawl-delay"),
    **dict.fromkeys(("request-rate", "request rate"), "Request-rate"),
}
_SITEMAP = frozenset({"sitemap", "sitemaps", "site-map"})
_SITE_WIDE = _SITEMAP | {"host"}  # directives that do not end a group
_DIRECTIVES = _USER_AGENT | set(_RULES) | _SITE_WIDE | {"visit-time", "visit time"}


def _directive(line: str) -> Optional[tuple[str, str]]:
    """A line (comment and outer space removed) as (lower-case field, value), as protego reads
    it: ``field: value``, or ``field value`` for a known field; None: no directive."""
    name: Optional[str] = None
    value = ""
    if ":" in line:
        name, raw = line.split(":", 1)
        name, value = name.strip().lower(), raw.strip()
        if name in _DIRECTIVES or not raw or raw[0].isspace():
            return name, value
    words = line.split()
    for count in (1, 2):
        candidate = " ".join(words[:count]).lower()
        if candidate in _DIRECTIVES:
            return candidate, " ".join(words[count:])
    return (name, value) if name is not None else None


@dataclass
class _Group:
    """One group of a robots.txt: its user agents (lower case) and its rule lines, written out."""

    agents: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def _groups(text: str) -> tuple[list[_Group], list[str]]:
    """The groups of ``text`` and its sitemaps, grouped as protego groups them: a user-agent line
    after any other directive but a site-wide one starts a group; a rule before the first
    user agent, or without a value, is dropped."""
    groups: list[_Group] = []
    sitemaps: list[str] = []
    current: Optional[_Group] = None
    previous: Optional[str] = None
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        parsed = _directive(line) if line else None
        if parsed is None:
            continue
        name, value = parsed
        if name in _USER_AGENT and (current is None or previous not in _USER_AGENT):
            current = _Group()
            groups.append(current)
        if name not in _SITE_WIDE:
            previous = name
        if not value:
            continue
        if name in _USER_AGENT:
            current.agents.append(value.lower())  # type: ignore[union-attr]
        elif name in _SITEMAP:
            sitemaps.append(value)
        elif name in _RULES and current is not None and current.agents:
            current.lines.append(f"{_RULES[name]}: {value}")
    return groups, sitemaps


def _applies(agent: str, user_agent: str) -> bool:
    """Whether a group of ``agent`` can apply to ``user_agent`` (lower case): ``*``, or the
    token (with or without its own ``*``) within it. Looser than protego's match at token
    boundaries, so that no group it would choose is left out."""
    if agent == "*" or agent in user_agent:
        return True
    bare = agent.replace("*", "")
    return bool(bare) and bare in user_agent


def _encoded_bytes(line: str) -> int:
    """What ``line`` and its line break take in a record's JSON (UTF-8, escapes included)."""
    return len(json.dumps(line, ensure_ascii=False).encode()) - 2 + 2


def robots_rules(text: str, user_agent: str,
                 limit: int = MAX_ROBOTS_RECORD_BYTES - _RECORD_FRAME_BYTES) -> tuple[str, bool]:
    """What a record keeps of robots.txt ``text`` for ``user_agent``: the groups that can apply
    to it (:func:`_applies`), in their order, their rules written out one per line, then the
    sitemaps, cut where the record's JSON would pass ``limit`` bytes (a group cut before its
    first rule is left out whole, so that it allows nothing it did not). Protego reads the result
    as it reads ``text`` for ``user_agent``. Returns the rules and whether they were cut."""
    agent = user_agent.strip().lower()
    groups, sitemaps = _groups(text)
    kept: list[str] = []
    used = 0
    for group in groups:
        agents = [a for a in dict.fromkeys(group.agents) if _applies(a, agent)]
        if not agents:
            continue
        # A group without rules still needs a line that ends it: else the next group's user
        # agents would join it (and a user agent with no rules allows everything).
        lines = group.lines or ["Disallow:"]
        head = [f"User-agent: {a}" for a in agents] + lines[:1]
        cost = sum(_encoded_bytes(line) for line in head)
        if used + cost > limit:
            return "\n".join(kept), True
        kept += head
        used += cost
        for line in lines[1:]:
            cost = _encoded_bytes(line)
            if used + cost > limit:
                return "\n".join(kept), True
            kept.append(line)
            used += cost
    for url in sitemaps:
        line = f"Sitemap: {url}"
        cost = _encoded_bytes(line)
        if used + cost > limit:
            return "\n".join(kept), True
        kept.append(line)
        used += cost
    return "\n".join(kept), False
