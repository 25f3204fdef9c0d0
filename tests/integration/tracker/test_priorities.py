"""Priorities within a domain's queue, on InMemoryTracker and on RedisTracker against a real Redis:
higher first, equal ones first come first served, kept by an item through retries and hand-backs;
and a job that uses none pays nothing for them."""

from __future__ import annotations

import pytest

from distscrape_celery.tracker import (
    CrawlLimits, DomainLimits, JobAction, LeaseStatus, RedisTracker, keys,
)
from distscrape_celery.tracker.base import PRIORITY_MAX
from tests.support.jobs import new_job
from tests.support.tracker_state import item_states

LOST = 10
ONE_AT_A_TIME = CrawlLimits(default=DomainLimits(concurrency=1))


def drain(t, w, first, job="j"):
    """Scrape and save items one at a time, from ``first`` (already dispatched) on, as the
    tracker hands them out; returns them in that order."""
    order, out = [], [first]
    while out:
        item = out.pop(0)
        order.append(item)
        co = t.checkout(job, item, w, max_lost=LOST)
        assert co.status is LeaseStatus.OK, co
        out += co.dispatch
        out += t.scraped(job, item, co.token).dispatch
        out += t.complete(job, item, co.token).dispatch
    return order


def test_a_domain_hands_out_higher_priorities_first_then_first_come(tracker_factory):
    t = tracker_factory()
    w = new_job(t, concurrency=1, limits=ONE_AT_A_TIME)
    first = t.add("j", ["http://a.invalid/first"]).dispatch  # the domain's one place taken
    assert first == ["http://a.invalid/first"]
    t.add("j", ["http://a.invalid/z1", "http://a.invalid/z2"])
    t.add("j", ["http://a.invalid/p5a"], priority=5)
    t.add("j", ["http://a.invalid/n1"], priority=-1)
    t.add("j", ["http://a.invalid/p5b", "http://a.invalid/top"], depth=2, priority=5)
    t.add("j", ["http://a.invalid/top"], priority=PRIORITY_MAX)  # seen: keeps its first
    t.add("j", ["http://a.invalid/max"], priority=PRIORITY_MAX)
    t.add("j", ["http://a.invalid/z3"])
    assert drain(t, w, first[0]) == [
        "http://a.invalid/first", "http://a.invalid/max", "http://a.invalid/p5a",
        "http://a.invalid/p5b", "http://a.invalid/top", "http://a.invalid/z1",
        "http://a.invalid/z2", "http://a.invalid/z3", "http://a.invalid/n1",
    ]


def test_found_links_take_their_own_priorities_and_report_their_depth(tracker_factory):
    t = tracker_factory()
    w = new_job(t, concurrency=1, limits=ONE_AT_A_TIME)
    seed = "http://a.invalid/"
    t.add("j", [seed])
    co = t.checkout("j", seed, w, max_lost=LOST)
    found = ["http://a.invalid/low", "http://a.invalid/high", "http://a.invalid/mid"]
    res = t.scraped("j", seed, co.token, found, depth=3, priorities=[-PRIORITY_MAX, 7, 0])
    t.complete("j", seed, co.token)
    assert res.dispatch == ["http://a.invalid/high"]
    co = t.checkout("j", "http://a.invalid/high", w, max_lost=LOST)
    assert co.depth == 3  # the priority is kept apart from the depth
    with pytest.raises(ValueError):
        t.scraped("j", seed, 1, found, priorities=[1])  # one per found item, or none


def test_an_item_keeps_its_priority_when_retried_or_handed_back(tracker_factory):
    """A failed attempt queues it again at the back of its priority; a delivered message of a
    held job hands it back to the head of its priority, ahead of one that came before it."""
    t = tracker_factory()
    w = new_job(t, concurrency=1, limits=ONE_AT_A_TIME)
    a, b, low = "http://a.invalid/a", "http://a.invalid/b", "http://a.invalid/low"
    assert t.add("j", [low]).dispatch == [low]
    t.add("j", [a, b], priority=3)
    token = t.checkout("j", low, w, max_lost=LOST).token
    assert t.fail("j", low, token, "boom", fault="item", max_retries=3,
                  max_lost=LOST).dispatch == [a]
    # Held: a's message comes back to the head of priority 3, ahead of b.
    t.control("j", JobAction.PAUSE)
    assert t.checkout("j", a, w, max_lost=LOST).status is LeaseStatus.HELD
    assert t.control("j", JobAction.RESUME).dispatch == [a]
    token = t.checkout("j", a, w, max_lost=LOST).token
    # a fails: it goes behind b in priority 3, still ahead of the retried item of priority 0.
    assert t.fail("j", a, token, "boom", fault="item", max_retries=3,
                  max_lost=LOST).dispatch == [b]
    assert item_states(t.client, "j", [a, low]) == [f"q{3 * 2**24}", "q0"]
    assert drain(t, w, b) == [b, a, low]


def test_priorities_out_of_bounds_are_refused(tracker_factory):
    t = tracker_factory()
    new_job(t)
    for bad in (PRIORITY_MAX + 1, -PRIORITY_MAX - 1, 1.5, True):
        with pytest.raises(ValueError, match="priority"):
            t.add("j", ["http://a.invalid/"], priority=bad)
    assert t.stats("j").seen == 0


def test_a_job_without_priorities_never_looks_at_a_priority_queue(redis_url, redis_client):
    """Every item at 0: its items and commands are those of a job before priorities existed
    (no zset read or written, no flag, no arrival counter), and its live values are the depth
    alone."""
    t = RedisTracker.from_url(redis_url, bound_refresh_seconds=0)
    w = new_job(t, concurrency=2)
    items = [f"http://a.invalid/{n}" for n in range(20)]
    redis_client.config_resetstat()
    out = list(t.add("j", items, depth=2).dispatch)
    assert set(item_states(redis_client, "j", [i for i in items if i not in out])) == {"q2"}
    while out:
        item = out.pop(0)
        co = t.checkout("j", item, w, max_lost=LOST)
        # Each seed links to one page; that page links to nothing.
        found = [item + "/x"] if item in items else []
        out += co.dispatch + t.scraped("j", item, co.token, found, depth=3).dispatch
        out += t.complete("j", item, co.token).dispatch
    stats = redis_client.info("commandstats")
    assert "cmdstat_zrange" not in stats and "cmdstat_zcard" in stats, sorted(stats)
    k = keys.JobKeys("j")
    assert list(redis_client.scan_iter(match=k.queues + "*/p")) == []
    assert redis_client.hget(k.control, "priorities") is None
    assert redis_client.hget(k.stats, "arrivals") is None
