"""Where a downloaded body waits between the scrape task and the save task.

Bodies never travel through the broker: the tracker stages the body under its lease's fencing
token and the save message carries the token. The body stays until its item is complete (so a
save task redelivered after its process died finds it again) or its TTL runs out; a body that is
gone when its save runs costs a second download, never the item.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional

import redis

from ...errors import TrackerUnavailable
from ..keys import body_key


def body_ttl_ms(seconds: float) -> int:
    """A staged body's TTL in milliseconds, as both the tracker (which stages it) and
    :class:`RedisBodyStaging` (which stages a deferred save's body again) set it: at least a
    second."""
    return max(int(seconds * 1000), 1000)


class BodyStaging(ABC):
    """Keeps and drops the bodies that the tracker stages (:meth:`Tracker.scraped` stages a body
    in the same step as its item turns save-pending, :meth:`Tracker.begin_save` hands it to the
    save, :meth:`Tracker.complete` drops it): an implementation works on the store of the tracker
    it is paired with in the runtime. It stages a body itself only for a deferred save."""

    @abstractmethod
    def get(self, job: str, token: int) -> Optional[bytes]:
        """The staged body; None if it expired or was discarded. To look at it: a save gets its
        body from :meth:`Tracker.begin_save`, in the same round trip."""

    @abstractmethod
    def stage(self, job: str, token: int, body: bytes) -> None:
        """Keep ``body`` for the save of lease ``token``, with a fresh TTL (a save deferred
        because the output is full stages its body again)."""

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
    """Bodies in Redis under the job's namespace (keys.body_key), each with a TTL so nothing
    leaks; RedisTracker's scripts stage and drop them."""

    def __init__(self, client: redis.Redis, ttl_seconds: float) -> None:
        if client.get_connection_kwargs().get("decode_responses"):
            raise ValueError("RedisBodyStaging needs a client that returns bytes")
        self.client = client
        self.ttl_ms = body_ttl_ms(ttl_seconds)

    @_redis_errors("read")
    def get(self, job: str, token: int) -> Optional[bytes]:
        return self.client.get(body_key(job, token))

    @_redis_errors("stage")
    def stage(self, job: str, token: int, body: bytes) -> None:
        self.client.set(body_key(job, token), body, px=self.ttl_ms)

    @_redis_errors("drop")
    def discard(self, job: str, token: int) -> None:
        self.client.unlink(body_key(job, token))

