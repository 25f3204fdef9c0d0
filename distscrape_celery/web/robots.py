"""robots.txt: fetched once per origin through the job's guarded fetcher, parsed with protego,
kept in a shared store (Redis, or process memory for the in-memory crawl) for a TTL.

What an answer means (Google's rules): 2xx, the rules of its first 500 KiB; 4xx or an unusable
file, allow everything; 5xx, 429 or an unreachable host, nothing may be fetched for now (the item
is retried later).

The store keeps what the host answered for one kind of fetch, never a job's decision: a record is
named by the origin and a digest of what the request sends and waits for (user agent, timeouts,
redirects, the job's fetch policy), each job reads the record only while it is fresh by its own
TTLs, and a fetch the job's own guard refused (or that this worker could not send as the job's
policy asks) is not shared. The origin is ``scheme://host[:port]``: scheme and host in
lower case (the host IDNA-encoded), no user info, no default port, so that ``http://u@h:80/`` and
``http://H/`` share one record.

What a record holds is small and bounded, whatever the file: of the file's first 500 KiB, only the
groups that can apply to the digest's user agent and the ``Sitemap`` lines, cut at
:data:`~.robots_record.MAX_ROBOTS_RECORD_BYTES` (see :mod:`.robots_record`). The records of all
jobs together are bounded by the worker setting ``robots_cache_bytes``: past it the stores
(:mod:`.robots_stores`) drop the records nearest their expiry (fetched again when next needed).

Nothing a site sends makes this module raise: a malformed number (``Crawl-delay``,
``Request-rate``) is ignored or cut to :data:`MAX_CRAWL_DELAY`, and a fetch that raises anyway
ends its claim, so other threads need not wait it out.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlsplit

from protego import Protego

from ..caches import ByteBoundedCache, text_bytes
from ..errors import FetchError
from ..job.fetch_policy_spec import POLICY_FIELDS
from ..job.sections import FetchSpec
from ..job.spec import JobSpec
from .fetch import Fetcher
from .fetch_policy import PolicyRefused
from .robots_record import MAX_ROBOTS_BYTES, MAX_ROBOTS_RECORD_BYTES, robots_head, robots_rules
from .robots_stores import RobotsStore
from .ssrf import AddressGuard, AddressRefused

log = logging.getLogger(__name__)

DISALLOWED = "disallowed by robots.txt"
# Parsed files kept per process, by their size: protego's rules take some 40 to 60 times the
# file's text (a 512 KiB file, 30 MB), so a count of files bounds nothing.
PARSED_ROBOTS_BYTES = 64 * 1024 * 1024
_PARSED_PER_CHAR = 64
# A failure's reason kept in a record (a redirect's URL may be long).
_MAX_REASON_CHARS = 1000
# The longest Crawl-delay (or Request-rate, as seconds a request) obeyed: a larger one (or a
# hostile one) would all but stop the domain; this still keeps to one request a minute.
MAX_CRAWL_DELAY = 60.0
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class _Rules:
    """One origin's robots.txt as this process uses it."""

    parser: Optional[Protego]  # None: everything allowed
    unavailable: Optional[str] = None  # why nothing may be fetched for now
    expires: float = 0.0
    size: int = 0  # about the memory the parsed rules take


# Shared by the jobs of a process; each job's entries are its own (keyed by its cache's id).
_PARSED: ByteBoundedCache[tuple[int, str], _Rules] = ByteBoundedCache(
    PARSED_ROBOTS_BYTES, lambda key, rules: text_bytes(key[1]) + rules.size
)
_CACHE_IDS = itertools.count()


def fetch_digest(spec: FetchSpec) -> str:
    """What a robots.txt fetch under ``spec`` depends on besides the origin: the user agent it
    sends (a site may answer each its own file) and how long and how far it follows the host.
    The body limit is not in it: every fetch reads the same :data:`MAX_ROBOTS_BYTES`. A job
    with a fetch policy (headers, auth, proxies, cookies) has it in too: its requests differ."""
    parts = [spec.user_agent, spec.connect_timeout, spec.read_timeout, spec.total_timeout,
             spec.max_redirects]
    policy = spec.model_dump(include=set(POLICY_FIELDS), exclude_defaults=True)
    if policy:
        parts.append(policy)
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def robots_origin(url: str) -> str:
    """The origin whose robots.txt governs ``url``: ``scheme://host[:port]``, scheme and host in
    lower case (a host name IDNA-encoded), no user info, no default port. Raises
    :class:`FetchError` (permanent) for a URL without a usable host or port."""
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        host = parts.hostname or ""
        port = parts.port
        if not host.isascii():
            host = host.encode("idna").decode("ascii")
    except (ValueError, UnicodeError) as exc:
        raise FetchError(f"invalid URL {url}: {exc}", retryable=False) from None
    if not host:
        raise FetchError(f"invalid URL {url}: no host", retryable=False)
    netloc = f"[{host}]" if ":" in host else host
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        netloc = f"{netloc}:{port}"
    return f"{scheme}://{netloc}"


def _reason(text: str) -> str:
    """A failure's reason as a record keeps it: at most :data:`_MAX_REASON_CHARS`."""
    return text if len(text) <= _MAX_REASON_CHARS else text[:_MAX_REASON_CHARS] + "..."


def _per_request(seconds: int, requests: int) -> float:
    """A Request-rate as seconds a request, however large its numbers (a quotient too large for
    a float is the longest delay obeyed)."""
    try:
        return seconds / requests
    except OverflowError:
        return MAX_CRAWL_DELAY


class RobotsCache:
    """Answers whether a URL may be fetched under its host's robots.txt, and the host's
    Crawl-delay, for one job's user agent."""

    def __init__(
        self, fetcher: Fetcher, store: RobotsStore, *, user_agent: str, ttl: float,
        retry_seconds: float = 10.0,
    ) -> None:
        self.fetcher = fetcher
        self.store = store
        self.user_agent = user_agent
        self.ttl = ttl
        # An unreadable robots.txt is asked again after this long, not after the TTL; its items
        # retry then (their Retry-After), so a robots.txt that was down for a moment costs no item.
        self.retry_seconds = retry_seconds
        self.digest = fetch_digest(fetcher.spec)
        self._id = next(_CACHE_IDS)

    @classmethod
    def from_spec(cls, spec: JobSpec, store: RobotsStore, **guard_hooks) -> "RobotsCache":
        """The job's robots.txt policy, its files fetched within the job's timeouts and guard
        (``guard_hooks``: ``resolver`` and ``classify``, for tests), each read to 500 KiB
        whatever the job's ``max_bytes``."""
        # One byte more than is read, to tell a file cut at the mark from one that ends there.
        limits = spec.fetch.model_copy(update={"max_bytes": MAX_ROBOTS_BYTES + 1})
        # Any content type: robots.txt is read whatever types the scraper keeps.
        fetcher = Fetcher(limits, AddressGuard.from_spec(spec, **guard_hooks),
                          cut_at_max_bytes=True)
        return cls(fetcher, store, user_agent=spec.fetch.user_agent,
                   ttl=spec.fetch.robots_cache_seconds,
                   retry_seconds=spec.fetch.robots_retry_seconds)

    def check(self, url: str) -> None:
        """Raise :class:`FetchError` unless ``url`` may be fetched now: permanent when robots.txt
        disallows it (or ``url`` has no usable host), retryable when the host's robots.txt is
        unavailable."""
        rules = self._rules(url)
        if rules.unavailable is not None:
            raise FetchError(rules.unavailable, retryable=True, retry_after=self.retry_seconds)
        if rules.parser is not None and not rules.parser.can_fetch(url, self.user_agent):
            raise FetchError(DISALLOWED, retryable=False)

    def allowed(self, url: str) -> bool:
        """True if robots.txt lets ``url`` be fetched now."""
        try:
            self.check(url)
        except FetchError:
            return False
        return True

    def sitemaps(self, url: str) -> Optional[list[str]]:
        """The ``Sitemap`` lines of the robots.txt of ``url``'s host, as written (maybe
        relative); [] when it has none, or allows everything (a 4xx); None while it cannot be
        read. Raises :class:`FetchError` (permanent) for a URL without a usable host."""
        rules = self._rules(url)
        if rules.unavailable is not None:
            return None
        return list(rules.parser.sitemaps) if rules.parser is not None else []

    def crawl_delay(self, url: str) -> Optional[float]:
        """The Crawl-delay (seconds) robots.txt asks of our user agent on ``url``'s host, if
        any (also the Request-rate, as seconds per request), at most :data:`MAX_CRAWL_DELAY`.
        A value that is no number of seconds (negative, not finite) is ignored."""
        parser = self._rules(url).parser
        if parser is None:
            return None
        delay = parser.crawl_delay(self.user_agent)
        rate = parser.request_rate(self.user_agent)
        if rate is not None and rate.requests > 0 and rate.seconds >= 0:
            delay = max(delay or 0.0, _per_request(rate.seconds, rate.requests))
        if delay is None or not 0 <= delay <= math.inf:  # NaN fails both comparisons
            return None
        return min(float(delay), MAX_CRAWL_DELAY)

    def name(self, origin: str) -> str:
        """The store's name for ``origin``'s record as this job fetches it."""
        return f"{self.digest}:{origin}"

    def _rules(self, url: str) -> _Rules:
        origin = robots_origin(url)
        rules = _PARSED.get((self._id, origin))
        if isinstance(rules, _Rules) and rules.expires > time.monotonic():
            return rules
        name = self.name(origin)
        data = self._usable(self.store.get(name)) or self._fetch_shared(name, origin)
        rules = self._parse(data)
        _PARSED.put((self._id, origin), rules)
        return rules

    def _keep(self, data: dict) -> float:
        """How long after its fetch this job uses a record."""
        return min(self.ttl, self.retry_seconds) if "unavailable" in data else self.ttl

    def _usable(self, record: Optional[str]) -> Optional[dict]:
        """``record`` read, if this job may use it: of this layout, and fresh by this job's TTLs
        (another job's may be longer)."""
        try:
            data = json.loads(record) if record is not None else None
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("at"), (int, float)):
            return None
        return data if time.time() - data["at"] < self._keep(data) else None

    def _fetch_shared(self, name: str, origin: str) -> dict:
        """Fetch ``origin``'s robots.txt, unless another worker is doing so: then wait for its
        record (up to one download's time limit) rather than fetch the file twice."""
        budget = self.fetcher.spec.total_timeout + self.fetcher.spec.connect_timeout
        deadline = time.monotonic() + budget
        # A fetcher may end its claim without a record (its guard refused the host): then the
        # next one takes the claim rather than wait it out.
        while not self.store.claim(name, budget):
            time.sleep(0.1)
            data = self._usable(self.store.get(name))
            if data is not None:
                return data
            if time.monotonic() > deadline:
                break
        else:
            # The worker that stored the record may have ended its claim since we looked.
            data = self._usable(self.store.get(name))
            if data is not None:
                self.store.release(name)
                return data
        stored = False
        try:
            data, shared = self._fetch(origin)
            if shared:
                self.store.put(name, json.dumps(data, ensure_ascii=False), self._keep(data))
                stored = True
        finally:
            # Whatever raised (a bug, a worker's time limit), the others must not wait out the
            # claim: the next one to ask fetches the file itself.
            if not stored:
                self.store.release(name)
        return data

    def _fetch(self, origin: str) -> tuple[dict, bool]:
        """The record of ``origin``'s robots.txt, and whether it is the host's answer (to be
        shared) rather than this job's guard's refusal."""
        url = origin + "/robots.txt"
        fetched_at = time.time()
        try:
            download = self.fetcher.get(url)
        except FetchError as exc:
            if exc.retryable:
                reason = _reason(f"robots.txt unavailable, retried later: {exc}")
                return {"unavailable": reason, "at": fetched_at}, True
            # The job's own fetch of the page is refused too; a job that may reach the host
            # (or a worker that has the credential or proxy this one lacks) must not read this
            # as the host's "allow everything".
            refused = isinstance(exc.__cause__, (AddressRefused, PolicyRefused))
            return {"allow": _reason(str(exc)), "at": fetched_at}, not refused
        if not 200 <= download.status < 300:  # an unfollowed redirect
            return {"allow": f"HTTP {download.status}", "at": fetched_at}, True
        text = robots_head(download.body).decode("utf-8", "replace")
        rules, cut = robots_rules(text, self.user_agent)
        if cut:
            log.info("%s: the robots.txt rules for %s past %d bytes are ignored", url,
                     self.user_agent, MAX_ROBOTS_RECORD_BYTES)
        return {"rules": rules, "at": fetched_at}, True

    def _parse(self, data: dict) -> _Rules:
        """A record as rules, kept in this process until the store is asked again: after
        ``retry_seconds``, or sooner when the record is older than this job keeps it."""
        left = self._keep(data) - (time.time() - data["at"])
        expires = time.monotonic() + max(0.0, min(self.retry_seconds, left))
        if "unavailable" in data:
            return _Rules(None, unavailable=data["unavailable"], expires=expires,
                          size=text_bytes(data["unavailable"]))
        if "rules" in data:
            try:
                return _Rules(Protego.parse(data["rules"]), expires=expires,
                              size=len(data["rules"]) * _PARSED_PER_CHAR)
            except Exception:  # a file protego cannot read is no file: allow all
                log.warning("unreadable robots.txt; allowing everything", exc_info=True)
        return _Rules(None, expires=expires)
