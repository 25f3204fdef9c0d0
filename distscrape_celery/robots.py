"""robots.txt: fetched once per host through the job's guarded fetcher, parsed with protego, kept
in a shared store (Redis, or process memory for the in-memory crawl) for a TTL.

What an answer means (Google's rules): 2xx, the rules; 4xx or an unusable file, allow everything;
5xx, 429 or an unreachable host, nothing may be fetched for now (the item is retried later).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Optional, Protocol
from urllib.parse import urlsplit

import redis
from protego import Protego

from . import keys
from .errors import FetchError
from .fetch import Fetcher
from .jobspec import JobSpec
from .ssrf import AddressGuard

log = logging.getLogger(__name__)

DISALLOWED = "disallowed by robots.txt"
# Google reads the first 500 KiB; a larger file is not worth more.
MAX_ROBOTS_BYTES = 512 * 1024
_PARSED_ORIGINS = 1024  # parsed files kept per process


class RobotsStore(Protocol):
    """Where fetched robots.txt records are shared, by origin (``http://host:port``)."""

    def get(self, origin: str) -> Optional[str]:
        """The record stored for ``origin``, or None."""

    def put(self, origin: str, record: str, ttl: float) -> None:
        """Store ``record`` for ``origin`` for ``ttl`` seconds, and end the fetcher's claim (so
        the next fetch, once the record expires, need not wait for the claim to run out)."""

    def claim(self, origin: str, seconds: float) -> bool:
        """True if the caller is the one to fetch ``origin``'s file now (for ``seconds``)."""

    def release(self, origin: str) -> None:
        """End a claim on ``origin`` without storing a record."""


class MemoryRobotsStore:
    """A :class:`RobotsStore` in process memory, for the in-memory crawl."""

    def __init__(self) -> None:
        self._records: dict[str, tuple[float, str]] = {}
        self._claims: dict[str, float] = {}
        self._lock = threading.Lock()

    def get(self, origin: str) -> Optional[str]:
        with self._lock:
            expires, record = self._records.get(origin, (0.0, None))
            return record if expires > time.monotonic() else None

    def put(self, origin: str, record: str, ttl: float) -> None:
        with self._lock:
            self._records[origin] = (time.monotonic() + ttl, record)
            self._claims.pop(origin, None)

    def claim(self, origin: str, seconds: float) -> bool:
        now = time.monotonic()
        with self._lock:
            if self._claims.get(origin, 0.0) > now:
                return False
            self._claims[origin] = now + seconds
            return True

    def release(self, origin: str) -> None:
        with self._lock:
            self._claims.pop(origin, None)


class RedisRobotsStore:
    """A :class:`RobotsStore` in Redis, shared by every worker. A Redis error makes a miss (the
    file is fetched again), never a failed item."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def get(self, origin: str) -> Optional[str]:
        try:
            record = self.client.get(keys.robots(origin))
        except redis.RedisError as exc:
            log.warning("robots.txt cache unavailable (%s); fetching it again", exc)
            return None
        return record.decode() if isinstance(record, bytes) else record

    def put(self, origin: str, record: str, ttl: float) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)  # the two keys may be in two slots
            pipe.set(keys.robots(origin), record, px=max(1, int(ttl * 1000)))
            pipe.delete(keys.robots_fetch(origin))
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("robots.txt cache unavailable (%s); not kept", exc)

    def claim(self, origin: str, seconds: float) -> bool:
        try:
            return bool(
                self.client.set(keys.robots_fetch(origin), "1", nx=True, px=int(seconds * 1000))
            )
        except redis.RedisError:
            return True

    def release(self, origin: str) -> None:
        try:
            self.client.delete(keys.robots_fetch(origin))
        except redis.RedisError:
            pass  # the claim runs out by itself


@dataclass(frozen=True)
class _Rules:
    """One origin's robots.txt as this process uses it."""

    parser: Optional[Protego]  # None: everything allowed
    unavailable: Optional[str] = None  # why nothing may be fetched for now
    expires: float = 0.0


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
        self._parsed: dict[str, _Rules] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_spec(cls, spec: JobSpec, store: RobotsStore, **guard_hooks) -> "RobotsCache":
        """The job's robots.txt policy, its files fetched within the job's limits and guard
        (``guard_hooks``: ``resolver`` and ``classify``, for tests)."""
        limits = spec.fetch.model_copy(
            update={"max_bytes": min(spec.fetch.max_bytes, MAX_ROBOTS_BYTES)}
        )
        # Any content type: robots.txt is read whatever types the scraper keeps.
        fetcher = Fetcher(limits, AddressGuard.from_spec(spec, **guard_hooks))
        return cls(fetcher, store, user_agent=spec.fetch.user_agent,
                   ttl=spec.fetch.robots_cache_seconds,
                   retry_seconds=spec.fetch.robots_retry_seconds)

    def check(self, url: str) -> None:
        """Raise :class:`FetchError` unless ``url`` may be fetched now: permanent when robots.txt
        disallows it, retryable when the host's robots.txt is unavailable."""
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

    def crawl_delay(self, url: str) -> Optional[float]:
        """The Crawl-delay (seconds) robots.txt asks of our user agent on ``url``'s host, if
        any (also the Request-rate, as seconds per request)."""
        parser = self._rules(url).parser
        if parser is None:
            return None
        delay = parser.crawl_delay(self.user_agent)
        rate = parser.request_rate(self.user_agent)
        if rate is not None and rate.requests:
            delay = max(delay or 0.0, rate.seconds / rate.requests)
        return float(delay) if delay is not None else None

    def _rules(self, url: str) -> _Rules:
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        rules = self._parsed.get(origin)
        if rules is not None and rules.expires > time.monotonic():
            return rules
        record = self.store.get(origin) or self._fetch_shared(origin)
        rules = _parse(record, self.retry_seconds)
        with self._lock:
            if len(self._parsed) >= _PARSED_ORIGINS:
                self._parsed.pop(next(iter(self._parsed)))
            self._parsed[origin] = rules
        return rules

    def _fetch_shared(self, origin: str) -> str:
        """Fetch ``origin``'s robots.txt, unless another worker is doing so: then wait for its
        record (up to one download's time limit) rather than fetch the file twice."""
        budget = self.fetcher.spec.total_timeout + self.fetcher.spec.connect_timeout
        if self.store.claim(origin, budget):
            # The worker that stored the record may have ended its claim since we looked.
            record = self.store.get(origin)
            if record is not None:
                self.store.release(origin)
                return record
        else:
            deadline = time.monotonic() + budget
            while time.monotonic() < deadline:
                time.sleep(0.1)
                record = self.store.get(origin)
                if record is not None:
                    return record
        record, ttl = self._fetch(origin)
        self.store.put(origin, record, ttl)
        return record

    def _fetch(self, origin: str) -> tuple[str, float]:
        """The record of ``origin``'s robots.txt, and how long to keep it."""
        url = origin + "/robots.txt"
        try:
            download = self.fetcher.get(url)
        except FetchError as exc:
            if exc.retryable:
                reason = f"robots.txt unavailable, retried later: {exc}"
                return json.dumps({"unavailable": reason}), min(self.ttl, self.retry_seconds)
            return json.dumps({"allow": str(exc)}), self.ttl
        if not 200 <= download.status < 300:  # an unfollowed redirect
            return json.dumps({"allow": f"HTTP {download.status}"}), self.ttl
        return json.dumps({"rules": download.body.decode("utf-8", "replace")}), self.ttl


def _parse(record: str, keep_seconds: float) -> _Rules:
    """A stored record as rules, kept in this process for ``keep_seconds`` before the store is
    asked again."""
    data = json.loads(record)
    expires = time.monotonic() + keep_seconds
    if "unavailable" in data:
        return _Rules(None, unavailable=data["unavailable"], expires=expires)
    if "rules" in data:
        try:
            return _Rules(Protego.parse(data["rules"]), expires=expires)
        except Exception:  # a file protego cannot read is no file: allow all
            log.warning("unreadable robots.txt; allowing everything", exc_info=True)
    return _Rules(None, expires=expires)
