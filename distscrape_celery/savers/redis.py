"""RedisItemSaver: each item as one Redis hash (body and metadata), on a Redis of its own if wanted."""

from __future__ import annotations

import hashlib
import string
from typing import Optional
from urllib.parse import urlsplit

import redis

from ..errors import ConfigError, SaveError
from ..fetch import Download
from ..jobspec import SaverSpec
from ..settings import redact
from .base import ItemSaver

KEY_FIELDS = ("job", "item", "sha1")


class RedisItemSaver(ItemSaver):
    """Stores each item as a hash at ``key_scheme`` (fields {job} {item} {sha1}) holding ``body``,
    ``item``, ``url``, ``status``, ``content_type`` and ``fetched_at``; with ``ttl_seconds`` the
    key expires. Saving an item again overwrites its one hash."""

    def __init__(
        self, url: str, key_scheme: str = "ds:out:{job}:{sha1}", *, job: str = "",
        ttl_seconds: Optional[float] = None, client: Optional[redis.Redis] = None,
    ) -> None:
        if urlsplit(url).scheme not in ("redis", "rediss", "unix"):
            raise ConfigError(
                f"saver.output {redact(url)!r} is not a Redis URL (redis://, rediss:// or unix://)"
            )
        _check_scheme(key_scheme)
        self.url = url
        self.key_scheme = key_scheme
        self.job = job
        self.ttl_ms = int(ttl_seconds * 1000) if ttl_seconds else None
        self._client = client

    @classmethod
    def from_spec(cls, spec: SaverSpec, *, job: str, worker_id: str) -> "RedisItemSaver":
        """``spec.output`` is the Redis URL; ``worker_id`` is unused."""
        return cls(spec.output, spec.key_scheme, job=job, ttl_seconds=spec.ttl_seconds)

    def open(self) -> None:
        """Connect and check that Redis answers, so a bad URL fails at the first save, clearly."""
        if self._client is None:
            self._client = redis.Redis.from_url(
                self.url, socket_connect_timeout=5, socket_timeout=30, health_check_interval=30
            )
        try:
            self._client.ping()
        except redis.RedisError as exc:
            raise SaveError(f"output Redis {redact(self.url)} is unreachable: {exc}") from exc

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def key_for(self, item: str) -> str:
        sha1 = hashlib.sha1(item.encode("utf-8", "surrogatepass")).hexdigest()
        return self.key_scheme.format(job=self.job, item=item, sha1=sha1)

    def save(self, item: str, download: Download) -> str:
        """Write the item's hash (and its TTL) in one transaction; return its key."""
        if self._client is None:
            self.open()
        key = self.key_for(item)
        pipe = self._client.pipeline(transaction=True)
        pipe.delete(key)  # a re-save replaces the hash whole, never merges into it
        pipe.hset(key, mapping={
            "body": download.body, "item": item, "url": download.url,
            "status": download.status, "content_type": download.content_type,
            "fetched_at": repr(download.fetched_at),
        })
        if self.ttl_ms:
            pipe.pexpire(key, self.ttl_ms)
        try:
            pipe.execute()
        except redis.RedisError as exc:
            raise SaveError(f"cannot save {item!r} to {redact(self.url)}: {exc}") from exc
        return key


def _check_scheme(scheme: str) -> None:
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(scheme) if f is not None}
    except ValueError as exc:
        raise ConfigError(f"invalid saver.key_scheme {scheme!r}: {exc}") from None
    unknown = fields - set(KEY_FIELDS)
    if unknown:
        raise ConfigError(
            f"invalid saver.key_scheme {scheme!r}: unknown field(s) "
            f"{', '.join('{' + f + '}' for f in sorted(unknown))}; allowed: {{job}} {{item}} {{sha1}}"
        )
    if not fields & {"item", "sha1"}:
        raise ConfigError(
            f"invalid saver.key_scheme {scheme!r}: it must use {{item}} or {{sha1}}, or every "
            "item would share one key"
        )
