"""Where a downloaded body waits between the scrape task and the save task.

Bodies never travel through the broker: the scrape task stages the body here and the save task
receives a reference. A body that expired before its save ran is not data loss: the item is not
done yet, so it is queued again and downloaded again.
"""

from __future__ import annotations

import threading
import uuid
from abc import ABC, abstractmethod
from typing import Optional

import redis

from .errors import TrackerUnavailable
from .keys import JobKeys


class BodyStaging(ABC):
    @abstractmethod
    def stage(self, job: str, body: bytes) -> str:
        """Store ``body`` and return a reference to it."""

    @abstractmethod
    def take(self, job: str, ref: str) -> Optional[bytes]:
        """Return the staged body and forget it; None if it expired or was taken already."""


class RedisBodyStaging(BodyStaging):
    """Bodies in Redis under the job's namespace, each with a TTL so nothing leaks."""

    def __init__(self, client: redis.Redis, ttl_seconds: float) -> None:
        if client.get_connection_kwargs().get("decode_responses"):
            raise ValueError("RedisBodyStaging needs a client that returns bytes")
        self.client = client
        self.ttl_ms = max(int(ttl_seconds * 1000), 1000)

    def stage(self, job: str, body: bytes) -> str:
        ref = uuid.uuid4().hex
        try:
            self.client.set(JobKeys(job).body(ref), body, px=self.ttl_ms)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise TrackerUnavailable(f"cannot stage a body in Redis: {exc}") from exc
        return ref

    def take(self, job: str, ref: str) -> Optional[bytes]:
        try:
            return self.client.getdel(JobKeys(job).body(ref))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise TrackerUnavailable(f"cannot read a staged body from Redis: {exc}") from exc


class InMemoryBodyStaging(BodyStaging):
    """Bodies in a dict, for single-process crawls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bodies: dict[tuple[str, str], bytes] = {}

    def stage(self, job: str, body: bytes) -> str:
        ref = uuid.uuid4().hex
        with self._lock:
            self._bodies[(job, ref)] = body
        return ref

    def take(self, job: str, ref: str) -> Optional[bytes]:
        with self._lock:
            return self._bodies.pop((job, ref), None)
