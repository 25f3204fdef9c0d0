"""The links a scraped page hands on: cut to the job's cap, and sent to the tracker once."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Optional

from ...caches import ByteBoundedCache, text_bytes
from ...scrapers import FoundItems

log = logging.getLogger(__name__)


def cap_links(job: str, item: str, found: Sequence[str], cap: int) -> tuple[list[str], int]:
    """``found`` without repeats and cut to its first ``cap`` items (the job's
    max_links_per_page), with how many were cut: those past the cap, and those the scraper
    left out itself when ``found`` is a :class:`FoundItems` (it stopped early, at the cap or
    at its bound on hrefs looked at). A cut page is logged once, naming the limit."""
    distinct = list(dict.fromkeys(found))
    early, limit = (found.cut, found.limit) if isinstance(found, FoundItems) else (0, "")
    cut = early + max(len(distinct) - cap, 0)
    if cut == 0:
        return distinct, 0
    log.warning("%s %s: %d links cut, past the page's %s", job, item, cut,
                limit if early and limit else f"max_links_per_page={cap}")
    return distinct[:cap], cut


def _known_link_bytes(key: tuple[str, str, str], _: object) -> int:
    # The job and creation strings are interned, one of each for all the job's entries: an
    # entry costs its link and the tuple.
    return text_bytes(key[2]) + 64


class KnownLinks:
    """Links passed to the tracker, per (job, creation, link), within ``max_bytes`` (0: none
    kept); from a job's second generation on, the creation the tracker names carries the
    generation too. The tracker answered for each: it holds it for the generation, or dropped
    it past max_pages or max_pages_per_domain, limits that a job's creation never loosens.
    Sending it again would cost a round of deduplication in Redis for nothing; a link forgotten
    here is only sent again."""

    def __init__(self, max_bytes: int) -> None:
        self._links: Optional[ByteBoundedCache[tuple[str, str, str], bool]] = (
            ByteBoundedCache(max_bytes, _known_link_bytes) if max_bytes else None)

    def __len__(self) -> int:
        return len(self._links) if self._links is not None else 0

    @property
    def bytes(self) -> int:
        """The bytes the links kept are reckoned to hold."""
        return self._links.bytes if self._links is not None else 0

    def _key_prefix(self, job: str, created: str) -> Optional[tuple[str, str]]:
        """The first two parts of the keys of ``job``'s known links (interned: one copy for
        all its entries); None if nothing is remembered (none kept, or no creation named)."""
        if self._links is None or not created:
            return None
        return sys.intern(job), sys.intern(created)

    def unknown(self, job: str, created: str, found: list[str]) -> list[str]:
        """``found`` without the links this process passed to the tracker already for this
        creation of ``job``."""
        prefix = self._key_prefix(job, created)
        if prefix is None or not found:
            return found
        get = self._links.get
        return [link for link in found if get((*prefix, link)) is None]

    def remember(self, job: str, created: str, sent: list[str]) -> None:
        """The tracker answered a call that passed it ``sent``."""
        prefix = self._key_prefix(job, created)
        if prefix is not None:
            for link in sent:
                self._links.put((*prefix, link), True)
