"""Where robots.txt records are shared: a store in Redis for every worker, or in process memory
for the in-memory crawl; each kept within a bound of bytes, dropping the records nearest their
expiry first. What a record holds is :mod:`.robots_record`'s; how a job uses it, :mod:`.robots`'s.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from typing import Optional, Protocol

import redis

from ..settings import DEFAULT_ROBOTS_CACHE_BYTES
from ..tracker import keys
from ..tracker.redis import scripts

log = logging.getLogger(__name__)


class RobotsStore(Protocol):
    """Where fetched robots.txt records are shared, by name: ``<fetch digest>:<origin>``, the
    origin as ``scheme://host[:port]`` (see :meth:`.robots.RobotsCache.name`). A store keeps its records
    within a bound of bytes (:func:`record_bytes` each), dropping those nearest their expiry."""

    def get(self, name: str) -> Optional[str]:
        """The record stored as ``name``, or None."""

    def put(self, name: str, record: str, ttl: float) -> None:
        """Store ``record`` as ``name`` for ``ttl`` seconds, and end the fetcher's claim (so
        the next fetch, once the record expires, need not wait for the claim to run out)."""

    def claim(self, name: str, seconds: float) -> bool:
        """True if the caller is the one to fetch ``name``'s file now (for ``seconds``)."""

    def release(self, name: str) -> None:
        """End a claim on ``name`` without storing a record."""


def record_bytes(name: str, record: str) -> int:
    """What a record counts as against its store's bound: its text, and its name, which Redis
    holds four times (the record's key, its claim's, the index and the sizes), and some more for
    the keys' own cost."""
    return len(record.encode()) + 4 * len(name.encode()) + 200


class MemoryRobotsStore:
    """A :class:`RobotsStore` in process memory, for the in-memory crawl, holding at most
    ``max_bytes`` (:func:`record_bytes`)."""

    def __init__(self, max_bytes: int = DEFAULT_ROBOTS_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._records: dict[str, tuple[float, str, int]] = {}  # name -> expires, record, bytes
        self._expiries: list[tuple[float, str]] = []  # a heap; stale entries skipped
        self._claims: dict[str, float] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._records)

    def get(self, name: str) -> Optional[str]:
        with self._lock:
            expires, record, _ = self._records.get(name, (0.0, None, 0))
            return record if expires > time.monotonic() else None

    def put(self, name: str, record: str, ttl: float) -> None:
        now = time.monotonic()
        size = record_bytes(name, record)
        with self._lock:
            self._drop(name)
            self._records[name] = (now + ttl, record, size)
            self.bytes += size
            heapq.heappush(self._expiries, (now + ttl, name))
            self._claims.pop(name, None)
            self._trim(now)

    def _drop(self, name: str) -> None:
        entry = self._records.pop(name, None)
        if entry is not None:
            self.bytes -= entry[2]

    def _trim(self, now: float) -> None:
        """Drop the expired records, then those nearest their expiry while over the bound."""
        heap = self._expiries
        while heap and (heap[0][0] <= now or self.bytes > self.max_bytes):
            expires, name = heapq.heappop(heap)
            entry = self._records.get(name)
            if entry is not None and entry[0] == expires:
                self._drop(name)
        if len(heap) > 2 * len(self._records) + 64:  # mostly stale entries: rebuild
            self._expiries = [(entry[0], name) for name, entry in self._records.items()]
            heapq.heapify(self._expiries)

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
    """A :class:`RobotsStore` in Redis, shared by every worker, holding at most ``max_bytes``
    (:func:`record_bytes`) in all: a script stores each record and drops the expired ones, then
    those nearest their expiry while over the bound (keys: :mod:`..tracker.keys`, ``{robots}``).
    A Redis error makes a miss (the file is fetched again), never a failed item."""

    def __init__(self, client: redis.Redis, max_bytes: int = DEFAULT_ROBOTS_CACHE_BYTES) -> None:
        self.client = client
        self.max_bytes = max_bytes
        self._put = scripts.register(client, "robots_put")

    def get(self, name: str) -> Optional[str]:
        try:
            record = self.client.get(keys.robots(name))
        except redis.RedisError as exc:
            log.warning("robots.txt cache unavailable (%s); fetching it again", exc)
            return None
        return record.decode() if isinstance(record, bytes) else record

    def put(self, name: str, record: str, ttl: float) -> None:
        try:
            self._put(
                keys=[keys.robots(name), keys.robots_fetch(name), keys.ROBOTS_INDEX,
                      keys.ROBOTS_SIZES, keys.ROBOTS_BYTES],
                args=[name, record, max(1, int(ttl * 1000)), record_bytes(name, record),
                      self.max_bytes, keys.ROBOTS_RECORD_PREFIX],
            )
        except redis.RedisError as exc:
            log.warning("robots.txt cache unavailable (%s); not kept", exc)
            self.release(name)

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
