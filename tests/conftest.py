"""Shared fixtures: a real throwaway Redis server, loopback sites, trackers of both kinds.

Set DISTSCRAPE_TEST_REDIS_URL to run against an existing Redis instead; the tests FLUSH its
database before each test, so point it at a database that holds nothing you need.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import redis

sys.path.insert(0, str(Path(__file__).parent))  # for `import sitegen`

from distscrape_celery.embedded import EmbeddedRedis  # noqa: E402
from distscrape_celery.tracker import InMemoryTracker, RedisTracker  # noqa: E402


@pytest.fixture(scope="session")
def redis_server_url():
    url = os.environ.get("DISTSCRAPE_TEST_REDIS_URL")
    if url:
        yield url
        return
    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture
def redis_url(redis_server_url):
    client = redis.Redis.from_url(redis_server_url)
    client.flushdb()
    client.close()
    return redis_server_url


@pytest.fixture
def redis_client(redis_url):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


def make_tracker(kind: str, redis_url: str | None, **kw):
    if kind == "memory":
        return InMemoryTracker(**kw)
    return RedisTracker.from_url(redis_url, bound_refresh_seconds=0, **kw)


@pytest.fixture(params=["memory", "redis"])
def tracker_factory(request):
    """Builds trackers of one kind; for Redis, all share one freshly flushed database."""
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    return lambda **kw: make_tracker(request.param, url, **kw)
