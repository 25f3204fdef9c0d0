"""robots.txt: fetched once per host through the job's guarded fetcher, parsed with protego, kept
in a shared store (Redis, or process memory for the in-memory crawl) for a TTL.

What an answer means (Google's rules): 2xx, the rules of its first 500 KiB; 4xx or an unusable
file, allow everything; 5xx, 429 or an unreachable host, nothing may be fetched for now (the item
is retried later).

The store keeps what the host answered (the file's head, its status), never a job's decision: a
record is named by the origin and a digest of what the request sends and waits for (user agent,
timeouts, redirects), each job matches the text against its own user agent and reads the record
only while it is fresh by its own TTLs, and a fetch the job's own guard refused is not shared.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Optional, Protocol
from urllib.parse import urlsplit

import redis
from protego import Protego

from ..tracker import keys
from ..caches import ByteBoundedCache, text_bytes
from ..errors import FetchError
from .fetch import Fetcher
from ..job.spec import FetchSpec, JobSpec
from .ssrf import AddressGuard, AddressRefused

log = logging.getLogger(__name__)

DISALLOWED = "disallowed by robots.txt"
# Google reads the first 500 KiB and ignores the rest; a larger file is cut there, not refused.
MAX_ROBOTS_BYTES = 500 * 1024
# Parsed files kept per process, by their size: protego's rules take some 40 to 60 times the
# file's text (a 512 KiB file, 30 MB), so a count of files bounds nothing.
PARSED_ROBOTS_BYTES = 64 * 1024 * 1024
_PARSED_PER_CHAR = 64


class RobotsStore(Protocol):
    """Where fetched robots.txt records are shared, by name: ``<fetch digest>:<origin>``, the
    origin as ``scheme://host[:port]`` (see :meth:`RobotsCache.name`)."""

    def get(self, name: str) -> Optional[str]:
        """The record stored as ``name``, or None."""

    def put(self, name: str, record: str, ttl: float) -> None:
        """Store ``record`` as ``name`` for ``ttl`` seconds, and end the fetcher's claim (so
        the next fetch, once the record expires, need not wait for the claim to run out)."""

    def claim(self, name: str, seconds: float) -> bool:
        """True if the caller is the one to fetch ``name``'s file now (for ``seconds``)."""

    def release(self, name: str) -> None:
        """End a claim on ``name`` without storing a record."""


class MemoryRobotsStore:
    """A :class:`RobotsStore` in process memory, for the in-memory crawl."""

    def __init__(self) -> None:
        self._records: dict[str, tuple[float, str]] = {}
        self._claims: dict[str, float] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Optional[str]:
        with self._lock:
            expires, record = self._records.get(name, (0.0, None))
            return record if expires > time.monotonic() else None

    def put(self, name: str, record: str, ttl: float) -> None:
        with self._lock:
            self._records[name] = (time.monotonic() + ttl, record)
            self._claims.pop(name, None)

    def claim(self, name: str, seconds: float) -> bool:
        now = time.monotonic()
        with self._lock:
            if self._claims.get(name, 0.0) > now:
                return False
            self._claims[name] = now + seconds
            return True

    def release(self, name: str) -> None:
        with self._lock:
            self._claims.pop(name, None)


class RedisRobotsStore:
    """A :class:`RobotsStore` in Redis, shared by every worker. A Redis error makes a miss (the
    file is fetched again), never a failed item."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def get(self, name: str) -> Optional[str]:
        try:
            record = self.client.get(keys.robots(name))
        except redis.RedisError as exc:
            log.warning("robots.txt cache unavailable (%s); fetching it again", exc)
            return None
        return record.decode() if isinstance(record, bytes) else record

    def put(self, name: str, record: str, ttl: float) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)  # the two keys may be in two slots
            pipe.set(keys.robots(name), record, px=max(1, int(ttl * 1000)))
            pipe.delete(keys.robots_fetch(name))
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("robots.txt cache unavailable (%s); not kept", exc)

    def claim(self, name: str, seconds: float) -> bool:
        try:
            return bool(
                self.client.set(keys.robots_fetch(name), "1", nx=True, px=int(seconds * 1000))
            )
        except redis.RedisError:
            return True

    def release(self, name: str) -> None:
        try:
            self.client.delete(keys.robots_fetch(name))
        except redis.RedisError:
            pass  # the claim runs out by itself


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
    The body limit is not in it: every fetch reads the same :data:`MAX_ROBOTS_BYTES`."""
    parts = [spec.user_agent, spec.connect_timeout, spec.read_timeout, spec.total_timeout,
             spec.max_redirects]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def robots_head(body: bytes) -> bytes:
    """The part of ``body`` that is read: all of it up to :data:`MAX_ROBOTS_BYTES`, else the
    lines that end before that mark (a line cut there could read as another rule)."""
    if len(body) <= MAX_ROBOTS_BYTES:
        return body
    head = body[:MAX_ROBOTS_BYTES]
    return head[:max(head.rfind(b"\n"), head.rfind(b"\r")) + 1]


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

    def name(self, origin: str) -> str:
        """The store's name for ``origin``'s record as this job fetches it."""
        return f"{self.digest}:{origin}"

    def _rules(self, url: str) -> _Rules:
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
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
        data, shared = self._fetch(origin)
        if shared:
            self.store.put(name, json.dumps(data), self._keep(data))
        else:
            self.store.release(name)
        return data

    def _fetch(self, origin: str) -> tuple[dict, bool]:
        """The record of ``origin``'s robots.txt, and whether it is the host's answer (to be
        shared) rather than this job's guard's refusal."""
        url = origin + "/robots.txt"
        at = time.time()
        try:
            download = self.fetcher.get(url)
        except FetchError as exc:
            if exc.retryable:
                reason = f"robots.txt unavailable, retried later: {exc}"
                return {"unavailable": reason, "at": at}, True
            # The job's own fetch of the page is refused too; a job that may reach the host
            # must not read this as the host's "allow everything".
            return {"allow": str(exc), "at": at}, not isinstance(exc.__cause__, AddressRefused)
        if not 200 <= download.status < 300:  # an unfollowed redirect
            return {"allow": f"HTTP {download.status}", "at": at}, True
        text = robots_head(download.body).decode("utf-8", "replace")
        return {"rules": text, "at": at}, True

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
