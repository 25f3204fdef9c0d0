"""A job's figures by domain (the job API's domain table), on both trackers: what each domain
has queued, in flight and dead, and its mean fetch time."""

from __future__ import annotations

from distscrape_celery.tracker import Fault, JobAction, LeaseStatus
from tests.support.jobs import new_job


def _by_domain(tracker, job="j"):
    return {d.domain: (d.queued, d.in_flight, d.dead) for d in tracker.domain_stats(job)}


def test_each_domain_shows_its_queued_in_flight_and_dead_items(tracker_factory):
    t = tracker_factory(dispatch_factor=1)  # 2 slots: 2 items dispatched
    w = new_job(t)
    items = [f"http://a.invalid/{i}" for i in range(3)] + ["http://b.invalid:8080/x",
                                                           "http://c.invalid/gone"]
    sent = t.add("j", items).dispatch
    assert len(sent) == 2
    figures = _by_domain(t)
    assert set(figures) == {"a.invalid", "b.invalid:8080", "c.invalid"}
    assert sum(q for q, _, _ in figures.values()) == 3
    assert sum(f for _, f, _ in figures.values()) == 2
    # One dispatched item is fetched and dies; its domain counts it dead, and no longer in flight.
    item = sent[0]
    co = t.checkout("j", item, w, max_lost=3)
    assert co.status is LeaseStatus.OK
    t.fail("j", item, co.token, "404 not found", fault=Fault.ITEM, max_retries=0, max_lost=3,
           retryable=False)
    domain = item.split("/")[2]
    after = _by_domain(t)
    assert after[domain][2] == 1
    assert sum(d for _, _, d in after.values()) == 1
    assert sum(q + f for q, f, _ in after.values()) == 4
    # Paused, the queued items stay listed by domain.
    t.control("j", JobAction.PAUSE)
    assert sum(q + f for q, f, _ in _by_domain(t).values()) == 4
