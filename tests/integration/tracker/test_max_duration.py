"""A job's time budget (max_duration), kept by the tracker on its own clock: on the in-memory
tracker with a clock the test moves, and on a real Redis whose clock runs."""

from __future__ import annotations

import time

import pytest

from distscrape_celery.errors import JobStateError
from distscrape_celery.tracker import (
    CrawlLimits, DomainLimits, JobAction, JobState, LeaseStatus,
)
from tests.conftest import make_tracker
from tests.support.jobs import FakeClock, new_job

LOST = 10
ITEMS = [f"http://a.invalid/{n}" for n in range(6)]


def run_out_of_time(t, w, job, pass_time):
    """A job of budget 10 s with two items dispatched and one leased when its time runs out:
    nothing more is handed out, the lease ends normally, and the next maintenance records it
    expired with every item it did not finish still queued."""
    out = t.add(job, ITEMS).dispatch
    assert len(out) == 2
    leased, delivered = out
    token = t.checkout(job, leased, w, max_lost=LOST).token
    pass_time()
    # Out of time: no call hands anything out, a delivered message gives its item back.
    assert t.add(job, ["http://a.invalid/late"]).dispatch == []
    co = t.checkout(job, delivered, w, max_lost=LOST)
    assert (co.status, co.dispatch) == (LeaseStatus.HELD, [])
    # What is in flight finishes: the lease is scraped and saved.
    assert t.scraped(job, leased, token).held
    assert t.maintain(job, max_lost=LOST).expired is False  # its save is still pending
    assert t.complete(job, leased, token).dispatch == []
    res = t.maintain(job, max_lost=LOST)
    assert (res.expired, res.finished, res.dispatch) == (True, False, [])
    assert t.maintain(job, max_lost=LOST).expired is False  # recorded once
    info, stats = t.job_info(job), t.stats(job)
    assert info.state is JobState.EXPIRED and info.ended is not None
    assert info.final == {"seen": 7, "done": 1, "dead": 0, "queued": 6}
    assert (stats.frontier, stats.dispatched, stats.leased, stats.save_pending) == (6, 0, 0, 0)
    assert job not in t.active_jobs()
    # It stays expired: new items wait, and no action moves it.
    assert t.add(job, ["http://a.invalid/later"]).dispatch == []
    assert t.job_info(job).state is JobState.EXPIRED and job not in t.active_jobs()
    for action in JobAction:
        with pytest.raises(JobStateError, match="expired"):
            t.control(job, action)


def test_a_job_out_of_time_dispatches_nothing_and_ends_expired_on_a_moved_clock():
    clock = FakeClock()
    t = make_tracker("memory", None, clock=clock)
    limits = CrawlLimits(default=DomainLimits(concurrency=2), max_duration=10)
    w = new_job(t, concurrency=1, limits=limits)
    clock.now += 9.9
    assert t.maintain("j", max_lost=LOST).expired is False

    def pass_time():
        clock.now += 0.2

    run_out_of_time(t, w, "j", pass_time)


def test_a_job_out_of_time_ends_expired_on_redis_clock(redis_url):
    t = make_tracker("redis", redis_url)
    limits = CrawlLimits(default=DomainLimits(concurrency=2), max_duration=1.0)
    w = new_job(t, concurrency=1, limits=limits)
    started = t.job_info("j").started
    run_out_of_time(t, w, "j", lambda: time.sleep(max(0.0, started + 1.1 - time.time())))


def test_the_budget_counts_from_the_jobs_started_field(tracker_factory):
    """The budget is read from the job's start in its control hash at every call, so a job
    whose start moves on (a recurring job run again) gets its whole budget again."""
    t = tracker_factory()
    w = new_job(t, concurrency=1, limits=CrawlLimits(max_duration=3600))
    control = "ds:{j}:control"
    t.client.hset(control, "started", "1000.0")  # long ago: out of time
    assert t.add("j", ITEMS[:1]).dispatch == []
    t.client.hset(control, "started", f"{time.time() + 100:.6f}")
    assert t.add("j", ITEMS[1:2]).dispatch == ITEMS[:2]
    assert t.checkout("j", ITEMS[0], w, max_lost=LOST).status is LeaseStatus.OK


def test_a_paused_job_out_of_time_ends_expired_too():
    clock = FakeClock()
    t = make_tracker("memory", None, clock=clock)
    new_job(t, limits=CrawlLimits(max_duration=5))
    t.add("j", ITEMS)
    t.control("j", JobAction.PAUSE)
    clock.now += 60  # the dispatched items' messages are lost: reclaimed a lease later
    assert t.maintain("j", max_lost=LOST).expired is True
    assert t.job_info("j").final["queued"] == len(ITEMS)


def test_a_job_without_a_budget_never_expires():
    clock = FakeClock()
    t = make_tracker("memory", None, clock=clock)
    new_job(t, concurrency=1)
    t.add("j", ITEMS)
    clock.now += 10 * 365 * 86400
    assert t.maintain("j", max_lost=LOST).expired is False
    assert t.job_info("j").state is JobState.RUNNING
    assert t.client.hget("ds:{j}:control", "max_duration") is None
