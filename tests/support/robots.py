"""The robots.txt store of each kind, as a fixture for the tests of the robots cache."""

from __future__ import annotations

import pytest
import redis

from distscrape_celery.web.robots_stores import MemoryRobotsStore, RedisRobotsStore


@pytest.fixture(params=["redis", "memory"])
def store(request):
    """A robots store of each kind, empty, with the default bound (Redis: the tests' own)."""
    if request.param == "memory":
        yield MemoryRobotsStore()
        return
    client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    yield RedisRobotsStore(client)
    client.close()
