"""The tracker contract, run on InMemoryTracker and on RedisTracker against a real Redis."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from distscrape_celery.errors import JobConflict, JobNotFound
from distscrape_celery.tracker import MAX_ADD_BATCH, FailOutcome, LeaseStatus, RedisTracker

SPEC = '{"seeds": ["http://127.0.0.1/"]}'


def new_job(tracker, job="j", concurrency=2):
    tracker.create_job(job, SPEC)
    wid = tracker.register_worker("host", 1, concurrency)
    return wid


def test_worker_ids_unique_and_liveness(tracker_factory):
    t = tracker_factory(lease_seconds=0.5, dispatch_factor=3)
    assert t.dispatch_bound() == 0
    a = t.register_worker("h1", 10, 2)
    b = t.register_worker("h2", 11, 5)
    assert a != b
    assert t.dispatch_bound() == 3 * (2 + 5)
    t.deregister_worker(b)
    assert t.dispatch_bound() == 3 * 2
    alive = {w.id: w.alive for w in t.workers()}
    assert alive == {a: True, b: False}
    time.sleep(0.7)  # a missed its heartbeats for longer than a lease
    assert t.dispatch_bound() == 0
    t.heartbeat(a)
    assert t.dispatch_bound() == 6
    assert [w.host for w in t.workers()] == ["h1", "h2"]


def test_add_deduplicates_and_counts(tracker_factory):
    t = tracker_factory()
    t.create_job("j", SPEC)
    assert t.add("j", ["a", "b", "a"]).added == 2
    assert t.add("j", ["b", "c"]).added == 1
    s = t.stats("j")
    assert (s.seen, s.queued, s.leased, s.done, s.dead) == (3, 3, 0, 0, 0)
    assert s.started and not s.finished


def test_dispatch_is_bounded_by_live_concurrency(tracker_factory):
    t = tracker_factory(dispatch_factor=2)
    wid = new_job(t, concurrency=2)  # bound 4
    res = t.add("j", [f"i{n}" for n in range(10)])
    assert res.dispatch == ["i0", "i1", "i2", "i3"]
    s = t.stats("j")
    assert (s.frontier, s.dispatched, s.queued) == (6, 4, 10)
    # Nothing more while the broker is full.
    assert t.add("j", ["i10"]).dispatch == []
    # A checkout frees a slot and refills it from the head of the frontier.
    co = t.checkout("j", "i0", wid)
    assert co.status is LeaseStatus.OK and co.dispatch == ["i4"]
    s = t.stats("j")
    assert (s.frontier, s.dispatched, s.leased) == (6, 4, 1)


def test_checkout_is_exclusive_and_done_is_final(tracker_factory):
    t = tracker_factory()
    w1 = new_job(t)
    w2 = t.register_worker("other", 2, 1)
    t.add("j", ["x"], depth=3)
    co = t.checkout("j", "x", w1)
    assert (co.status, co.depth) == (LeaseStatus.OK, 3)
    assert t.checkout("j", "x", w2).status is LeaseStatus.BUSY
    assert t.complete("j", "x").changed is True
    assert t.complete("j", "x").changed is False  # idempotent
    assert t.checkout("j", "x", w2).status is LeaseStatus.DONE
    assert t.checkout("j", "nope", w2).status is LeaseStatus.UNKNOWN
    s = t.stats("j")
    assert (s.done, s.leased, s.queued) == (1, 0, 0)
    assert s.finished


def test_fail_retries_then_dead_never_done(tracker_factory):
    t = tracker_factory()
    w = new_job(t)
    t.add("j", ["x"])
    for attempt in (1, 2):
        assert t.checkout("j", "x", w).status is LeaseStatus.OK
        res = t.fail("j", "x", f"boom {attempt}", max_retries=2)
        assert res.outcome is FailOutcome.RETRY
        assert t.stats("j").queued == 1
    co = t.checkout("j", "x", w)
    assert co.failed_attempts == 2
    assert t.fail("j", "x", "boom 3", max_retries=2).outcome is FailOutcome.DEAD
    assert t.checkout("j", "x", w).status is LeaseStatus.DEAD
    assert t.complete("j", "x").changed is False  # a dead item never becomes done
    assert t.fail("j", "x", "again", max_retries=2).outcome is FailOutcome.IGNORED
    s = t.stats("j")
    assert (s.done, s.dead, s.queued, s.leased, s.finished) == (0, 1, 0, 0, True)
    assert t.dead_items("j") == {"x": "boom 3"}


def test_non_retryable_and_uncounted_failures(tracker_factory):
    t = tracker_factory()
    w = new_job(t)
    t.add("j", ["a", "b"])
    t.checkout("j", "a", w)
    assert t.fail("j", "a", "HTTP 404", max_retries=5, retryable=False).outcome is FailOutcome.DEAD
    t.checkout("j", "b", w)
    for _ in range(3):  # requeues that do not count never exhaust the retries
        assert t.fail("j", "b", "body expired", max_retries=0, count=False).outcome is FailOutcome.RETRY
        assert t.checkout("j", "b", w).failed_attempts == 0
    assert t.dead_items("j") == {"a": "HTTP 404"}


def test_extend_keeps_lease_and_maintain_reclaims_expired(tracker_factory):
    t = tracker_factory(lease_seconds=0.5)
    w = new_job(t)
    t.add("j", ["held", "lost"])
    t.checkout("j", "held", w)
    t.checkout("j", "lost", w)
    for _ in range(3):
        time.sleep(0.25)
        t.heartbeat(w)
        assert t.extend("j", ["held"]) == 1
    res = t.maintain("j", max_retries=3)
    assert res.reclaimed == 1
    assert "lost" in res.dispatch  # handed straight back out
    assert t.checkout("j", "held", "w-other").status is LeaseStatus.BUSY
    co = t.checkout("j", "lost", "w-other")
    assert co.status is LeaseStatus.OK and co.failed_attempts == 1
    assert t.maintain("j", max_retries=3).reclaimed == 0


def test_expired_leases_count_and_poison_item_dies(tracker_factory):
    t = tracker_factory(lease_seconds=0.5)
    w = new_job(t)
    t.add("j", ["poison"])
    for _ in range(2):
        assert t.checkout("j", "poison", w).status is LeaseStatus.OK
        time.sleep(0.6)
        t.heartbeat(w)
        res = t.maintain("j", max_retries=1)
    assert (res.reclaimed, res.died) == (0, 1)
    assert "lease expired" in t.dead_items("j")["poison"]
    assert t.stats("j").finished


def test_expired_dispatch_is_reclaimed_without_counting(tracker_factory):
    t = tracker_factory(lease_seconds=0.5)
    w = new_job(t, concurrency=1)
    assert t.add("j", ["m"]).dispatch == ["m"]  # its message is lost
    time.sleep(0.6)
    t.heartbeat(w)
    res = t.maintain("j", max_retries=0)
    assert (res.reclaimed, res.died, res.dispatch) == (1, 0, ["m"])
    assert t.checkout("j", "m", w).failed_attempts == 0


def test_late_duplicate_message_after_reclaim(tracker_factory):
    """A redelivered message for a reclaimed, re-queued item leases it; the fresh one no-ops."""
    t = tracker_factory(lease_seconds=0.5)
    w = new_job(t, concurrency=1)
    t.add("j", ["a", "b"])
    time.sleep(0.6)
    t.heartbeat(w)
    t.maintain("j", max_retries=3)
    assert t.checkout("j", "b", w).status is LeaseStatus.OK  # b was queued, not dispatched
    t.complete("j", "b")
    s = t.stats("j")
    assert (s.done, s.queued, s.leased) == (1, 1, 0)
    # The stale frontier entry for b is skipped; only a is handed out.
    t.checkout("j", "a", w)
    t.complete("j", "a")
    assert t.stats("j").finished


def test_jobs_specs_and_namespaces(tracker_factory):
    t = tracker_factory()
    assert t.create_job("one", SPEC) is True
    assert t.create_job("one", SPEC) is False
    with pytest.raises(JobConflict):
        t.create_job("one", '{"seeds": ["http://127.0.0.1/other"]}')
    with pytest.raises(JobNotFound):
        t.load_spec("missing")
    t.create_job("two", SPEC)
    t.add("one", ["x"])
    t.add("two", ["x", "y"])
    assert t.jobs() == ["one", "two"]
    assert t.load_spec("one") == SPEC
    assert (t.stats("one").seen, t.stats("two").seen) == (1, 2)


def test_large_batches_are_chunked(tracker_factory):
    t = tracker_factory()
    new_job(t, concurrency=1)
    n = MAX_ADD_BATCH * 3 + 7
    res = t.add("j", [f"u{i}" for i in range(n)])
    assert res.added == n and len(res.dispatch) == 2
    assert t.stats("j").queued == n


def test_redis_state_survives_new_tracker_instances(redis_url):
    first = RedisTracker.from_url(redis_url)
    first.create_job("keep", SPEC)
    first.add("keep", ["a", "b"])
    second = RedisTracker.from_url(redis_url)  # e.g. a worker starting: must delete nothing
    assert second.stats("keep").seen == 2
    assert second.add("keep", ["a"]).added == 0


def _race(url, barrier, results, worker_no):
    tracker = RedisTracker.from_url(url)
    barrier.wait()
    # Same order in every process: the most contention per item.
    statuses = {
        item: tracker.checkout("race", item, f"w{worker_no}").status.value
        for item in [f"item{i}" for i in range(100)]
    }
    results.put((worker_no, statuses))


def test_many_processes_race_for_items_each_leased_once(redis_url):
    tracker = RedisTracker.from_url(redis_url)
    tracker.create_job("race", SPEC)
    tracker.add("race", [f"item{i}" for i in range(100)])
    n = 8
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(redis_url, barrier, results, i)) for i in range(n)]
    for p in procs:
        p.start()
    won = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    assert all(len(statuses) == 100 for _, statuses in won)  # every process tried every item
    leased = [item for _, statuses in won for item, status in statuses.items() if status == "ok"]
    assert sorted(leased) == sorted(f"item{i}" for i in range(100))  # each exactly once
    others = {status for _, statuses in won for status in statuses.values()} - {"ok"}
    assert others == {"busy"}
    assert tracker.stats("race").leased == 100
