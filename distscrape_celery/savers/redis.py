"""RedisItemSaver: each item as one Redis hash (body and metadata), on a Redis of its own if wanted."""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Iterator, Sequence
from typing import Optional, Union

import redis

from ..errors import ConfigError, SaveError
from ..web.fetch import Download
from ..job.saver_spec import SaverSpec
from ..redaction import redact
from ..redis_urls import is_redis_url
from .base import ItemSaver

KEY_FIELDS = ("job", "item", "sha1")
# Hashes read at once by iter_records.
READ_BATCH = 500
# Bodies of at most about this many bytes go to the output Redis in one transaction: a batch of
# large pages is not one request of hundreds of MB.
GROUP_BYTES = 16 * 1024 * 1024


class RedisItemSaver(ItemSaver):
    """Stores each item as a hash at ``key_scheme`` (fields {job} {item} {sha1}) holding ``body``,
    ``item``, ``url``, ``status``, ``content_type`` and ``fetched_at``, and for a page with
    records (a job that extracts them) ``records``, a JSON array; with ``ttl_seconds`` the key
    expires. Saving an item again overwrites its one hash."""

    def __init__(
        self, url: str, key_scheme: str = "ds:out:{job}:{sha1}", *, job: str = "",
        ttl_seconds: Optional[float] = None, client: Optional[redis.Redis] = None,
    ) -> None:
        if not is_redis_url(url):
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
        [key] = self._write([(item, download)], what=repr(item))
        return key

    def commits_groups(self) -> bool:
        """A batch's items are written in one transaction (a rewrite of a hash costs no more
        than its first write), so they are marked done together too."""
        return type(self).save is RedisItemSaver.save

    def save_many(self, entries: Sequence[tuple[str, Download]]) -> list[Union[str, Exception]]:
        """The entries' hashes in one transaction (one round trip) per GROUP_BYTES of bodies:
        each group is written whole or not at all."""
        results: list[Union[str, Exception]] = []
        start, size = 0, 0
        for end, (_, download) in enumerate(entries, 1):
            size += len(download.body)
            if size >= GROUP_BYTES or end == len(entries):
                group = entries[start:end]
                try:
                    results.extend(self._write(group, what=f"a group of {len(group)} item(s)"))
                except SaveError as exc:
                    results.extend([exc] * len(group))
                start, size = end, 0
        return results

    def _write(self, entries: Sequence[tuple[str, Download]], what: str) -> list[str]:
        if self._client is None:
            self.open()
        keys = []
        pipe = self._client.pipeline(transaction=True)
        for item, download in entries:
            key = self.key_for(item)
            keys.append(key)
            pipe.delete(key)  # a re-save replaces the hash whole, never merges into it
            fields = {
                "body": download.body, "item": item, "url": download.url,
                "status": download.status, "content_type": download.content_type,
                "fetched_at": repr(download.fetched_at),
            }
            if download.records:
                fields["records"] = json.dumps(
                    download.records, ensure_ascii=False, separators=(",", ":"))
            pipe.hset(key, mapping=fields)
            if self.ttl_ms:
                pipe.pexpire(key, self.ttl_ms)
        try:
            pipe.execute()
        except redis.RedisError as exc:
            raise SaveError(f"cannot save {what} to {redact(self.url)}: {exc}") from exc
        return keys


    def iter_records(self) -> Iterator[dict]:
        """Every record kept in this saver's hashes of its job, a page's records together, in
        no particular order (a SCAN of the keys its ``key_scheme`` makes)."""
        if self._client is None:
            self.open()
        assert self._client is not None
        batch: list[bytes] = []
        try:
            for key in self._client.scan_iter(match=self._key_pattern(), count=1000):
                batch.append(key)
                if len(batch) >= READ_BATCH:
                    yield from self._records_of(batch)
                    batch = []
            yield from self._records_of(batch)
        except redis.RedisError as exc:
            raise SaveError(f"cannot read the records from {redact(self.url)}: {exc}") from exc

    def _key_pattern(self) -> str:
        """A SCAN pattern of the job's keys: the scheme, {job} escaped, {sha1} as 40 hex digits,
        {item} as anything (each hash's own item is checked against its key)."""
        fields = {"job": _glob_escape(self.job), "sha1": "[0-9a-f]" * 40, "item": "*"}
        return "".join(_glob_escape(literal) + (fields[field] if field else "")
                       for literal, field, _, _ in string.Formatter().parse(self.key_scheme))

    def _records_of(self, keys: list[bytes]) -> Iterator[dict]:
        pipe = self._client.pipeline(transaction=False)  # type: ignore[union-attr]
        for key in keys:
            pipe.hmget(key, "item", "records")
        for key, (item, records) in zip(keys, pipe.execute()):
            if item is None or records is None:
                continue  # gone meanwhile, a page without records, or not this job's
            if self.key_for(item.decode("utf-8", "surrogatepass")).encode() != key:
                continue  # another job's key that the pattern matched too
            yield from json.loads(records)


def _glob_escape(text: str) -> str:
    """``text`` as a Redis glob that matches only itself."""
    return "".join("\\" + c if c in "*?[]\\^" else c for c in text)


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
