"""Where a downloaded body waits between the scrape task and the save task.

Bodies never travel through the broker: the scrape task stages the body under its lease's fencing
token and the save message carries the token. The body stays until its item is complete (so a
save task redelivered after its process died finds it again) or its TTL runs out; a body that is
gone when its save runs costs a second download, never the item.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Optional

import redis

from .errors import TrackerUnavailable
from .keys import JobKeys


class BodyStaging(ABC):
    @abstractmethod
    def stage(self, job: str, token: int, body: bytes) -> None:
        """Keep ``body`` for the save of lease ``token``."""

    @abstractmethod
    def get(self, job: str, token: int) -> Optional[bytes]:
        """The staged body; None if it expired or was discarded."""

    @abstractmethod
    def keep(self, job: str, token: int) -> None:
        """Restart the body's TTL (its save was deferred)."""

    @abstractmethod
    def discard(self, job: str, token: int) -> None:
        """Forget the body (its item is complete, or the lease was stale)."""


def _redis_errors(what: str):
    def wrap(method):
        def inner(self, *args):
            try:
                return method(self, *args)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                raise TrackerUnavailable(f"cannot {what} a staged body in Redis: {exc}") from exc

        inner.__name__, inner.__doc__ = method.__name__, method.__doc__
        return inner

    return wrap


class RedisBodyStaging(BodyStaging):
    """Bodies in Redis under the job's namespace, each with a TTL so nothing leaks."""

    def __init__(self, client: redis.Redis, ttl_seconds: float) -> None:
        if client.get_connection_kwargs().get("decode_responses"):
            raise ValueError("RedisBodyStaging needs a client that returns bytes")
        self.client = client
        self.ttl_ms = max(int(ttl_seconds * 1000), 1000)

    @_redis_errors("store")
    def stage(self, job: str, token: int, body: bytes) -> None:
        self.client.set(JobKeys(job).body(token), body, px=self.ttl_ms)

    @_redis_errors("read")
    def get(self, job: str, token: int) -> Optional[bytes]:
        return self.client.get(JobKeys(job).body(token))

    @_redis_errors("keep")
    def keep(self, job: str, token: int) -> None:
        self.client.pexpire(JobKeys(job).body(token), self.ttl_ms)

    @_redis_errors("drop")
    def discard(self, job: str, token: int) -> None:
        self.client.unlink(JobKeys(job).body(token))


class InMemoryBodyStaging(BodyStaging):
    """Bodies in a dict, for single-process crawls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bodies: dict[tuple[str, int], bytes] = {}

    def stage(self, job: str, token: int, body: bytes) -> None:
        with self._lock:
            self._bodies[(job, int(token))] = body

    def get(self, job: str, token: int) -> Optional[bytes]:
        with self._lock:
            return self._bodies.get((job, int(token)))

    def keep(self, job: str, token: int) -> None:
        pass

    def discard(self, job: str, token: int) -> None:
        with self._lock:
            self._bodies.pop((job, int(token)), None)
