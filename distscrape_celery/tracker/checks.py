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
"""

from __future__ import annotations

import logging
from typing import Optional

import redis

log = logging.getLogger(__name__)


def redis_problems(client: redis.Redis) -> list[str]:
    """One sentence per setting of ``client``'s server that weakens the guarantees; a single
    note if the server does not let us read its configuration (managed Redis often forbids it)."""
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
    return problems


def warn_about(client: redis.Redis, where: str, logger: Optional[logging.Logger] = None) -> list[str]:
    """Log each of :func:`redis_problems` as a warning naming the server; return them."""
    problems = redis_problems(client)
    for problem in problems:
        (logger or log).warning("Redis at %s: %s", where, problem)
    return problems


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
