"""What the crawl's guarantees need of the Redis that holds the tracker, checked at worker start.

The tracker's state (what was seen, leased, done) and, with the Redis broker, the queued tasks
live in Redis. Two settings decide whether they survive:

- persistence: AOF on (``appendonly yes``) with ``appendfsync everysec`` (at most a second of
  writes lost in a crash of the Redis host) or ``always``. With neither AOF nor RDB snapshots, a
  restart of Redis forgets the crawl; with RDB snapshots only, it forgets the minutes since the
  last snapshot, and items marked done in that time are downloaded again (nothing is lost, since
  a done item was saved first, but work is repeated and dedup forgets);
- ``maxmemory-policy noeviction``: any other policy lets Redis delete keys when it is full, and
  a deleted tracker key is lost work or lost dedup. With noeviction a full Redis refuses writes
  instead, which the workers report and retry.

And two settings decide what the tracker's buckets cost (tracker/redis/lua/_lib_seen.lua, _lib_live.lua): a live-item
bucket is a hash of up to ~100 fingerprints (19-digit integers), kept compact while
``hash-max-listpack-entries`` >= 128 and ``hash-max-listpack-value`` >= 19; a seen-set bucket a
set of up to ~400, kept an intset while ``set-max-intset-entries`` >= 512. Below that, buckets
become hash tables at several times the memory: nothing is lost, but a 10-million-item job may
need gigabytes more.
"""

from __future__ import annotations

import logging
from typing import Optional

import redis

log = logging.getLogger(__name__)


def redis_problems(client: redis.Redis) -> list[str]:
    """One sentence per setting of ``client``'s server that weakens the guarantees (or the
    tracker's memory bounds); a single note if the server does not let us read its configuration
    (managed Redis often forbids it)."""
    try:
        config = client.config_get("appendonly")
        config.update(client.config_get("appendfsync"))
        config.update(client.config_get("maxmemory-policy"))
        config.update(client.config_get("save"))
    except redis.ResponseError as exc:
        return [f"could not read the Redis configuration ({exc}); check by hand that AOF is on "
                "and maxmemory-policy is noeviction"]
    config = {_text(k): _text(v) for k, v in config.items()}
    problems = []
    if config.get("appendonly") != "yes":
        snapshots = config.get("save", "").strip()
        risk = (
            "it keeps only RDB snapshots, so a restart forgets the crawl's progress since the "
            "last one" if snapshots else "it keeps nothing on disk, so a restart forgets the crawl"
        )
        problems.append(f"appendonly is {config.get('appendonly')!r}: {risk}; set appendonly yes")
    elif config.get("appendfsync") not in ("everysec", "always"):
        problems.append(
            f"appendfsync is {config.get('appendfsync')!r}: a crash of the Redis host may lose "
            "more than a second of the crawl's state; set appendfsync everysec"
        )
    if config.get("maxmemory-policy", "noeviction") != "noeviction":
        problems.append(
            f"maxmemory-policy is {config.get('maxmemory-policy')!r}: a full Redis may evict "
            "tracker keys (lost work, lost dedup); set maxmemory-policy noeviction"
        )
    problems.extend(_encoding_problems(client))
    return problems


# Settings below which the tracker's buckets lose their compact encodings:
# (name, its name before Redis 7, the least value, Redis's default).
COMPACT = (
    ("hash-max-listpack-entries", "hash-max-ziplist-entries", 128, 128),
    ("hash-max-listpack-value", "hash-max-ziplist-value", 19, 64),
    ("set-max-intset-entries", None, 512, 512),
)


def _encoding_problems(client: redis.Redis) -> list[str]:
    problems = []
    for name, older, least, default in COMPACT:
        try:
            found = client.config_get(name)
            if not found and older:  # named as this Redis (before 7) names it
                name, found = older, client.config_get(older)
        except redis.ResponseError:
            continue  # reading the config was refused: redis_problems said so already
        value = _text(next(iter(found.values()))) if found else None
        if value is not None and int(value) < least:
            kind = "done" if name.startswith("set") else "live"
            problems.append(
                f"{name} is {value}: the tracker's buckets of {kind} items stay compact only at "
                f"{least} or more; below, they take several times the memory (nothing is lost); "
                f"set it back to Redis's default, {default}"
            )
    return problems


def warn_about(client: redis.Redis, where: str, logger: Optional[logging.Logger] = None) -> list[str]:
    """Log each of :func:`redis_problems` as a warning naming the server; return them."""
    problems = redis_problems(client)
    for problem in problems:
        (logger or log).warning("Redis at %s: %s", where, problem)
    return problems


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
