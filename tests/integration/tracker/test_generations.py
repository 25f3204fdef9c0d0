"""A job's generations on both trackers: a finished job runs again from its seeds, exactly once
however many callers race, and a job that revisits keeps a record of each known item and fetches
again only what is due."""

from __future__ import annotations

import threading

import pytest

from distscrape_celery.tracker import LeaseStatus
from distscrape_celery.tracker.revisits import Record, RevisitOutcome, RevisitUpdate, digest
from tests.support.jobs import new_job

SEEDS = ["http://a.test/", "http://b.test/"]
SPEC = '{"seeds": ["http://a.test/", "http://b.test/"]}'


def crawl_all(tracker, job, worker, revisit=None, pending=()):
    """Check out and complete every item the tracker hands out (``pending``: handed out
    already), with ``revisit(item, checkout)``'s update; returns the items in the order they
    were leased, and their checkouts."""
    pending, leased, checkouts = list(pending), [], {}
    for _ in range(1000):
        pending += tracker.maintain(job, max_lost=3).dispatch
        if not pending:
            if tracker.stats(job).queued == 0:
                break
            continue
        item = pending.pop(0)
        c = tracker.checkout(job, item, worker, max_lost=3)
        pending += c.dispatch
        if c.status is LeaseStatus.OK:
            leased.append(item)
            checkouts[item] = c
            pending += tracker.complete(job, item, c.token,
                                        revisit(item, c) if revisit else None).dispatch
    tracker.maintain(job, max_lost=3)
    return leased, checkouts


def test_a_finished_job_runs_again_from_its_seeds(tracker_factory):
    tracker = tracker_factory()
    worker = new_job(tracker, spec=SPEC)
    first, _ = crawl_all(tracker, "j", worker, pending=tracker.add("j", SEEDS).dispatch)
    assert sorted(first) == SEEDS
    assert tracker.job_info("j").state.value == "finished"
    # Without a generation the done seeds are never added again.
    assert tracker.add("j", SEEDS).added == 0
    result = tracker.start_generation("j", SEEDS, generation=2)
    assert result.started and result.generation == 2
    info = tracker.job_info("j")
    assert info.generation == 2 and info.state.value == "running"
    second, _ = crawl_all(tracker, "j", worker, pending=result.dispatch)
    assert sorted(second) == SEEDS
    stats = tracker.stats("j")
    assert (stats.seen, stats.done) == (2, 2)
    assert tracker.job_info("j").state.value == "finished"


def test_a_running_job_does_not_start_another_generation(tracker_factory):
    tracker = tracker_factory()
    new_job(tracker, spec=SPEC)
    tracker.add("j", SEEDS)
    result = tracker.start_generation("j", SEEDS, generation=2)
    assert result.status == "running" and not result.started
    assert tracker.job_info("j").generation == 1


def test_racing_callers_start_one_generation(tracker_factory):
    tracker = tracker_factory()
    worker = new_job(tracker, spec=SPEC)
    crawl_all(tracker, "j", worker, pending=tracker.add("j", SEEDS).dispatch)
    tracker.set_schedule("j", "every 60", tracker.now() - 1)
    due = tracker.due_schedules()
    assert [job for job, _ in due] == ["j"]
    outcomes = []

    def fire():
        outcomes.append(tracker.start_generation("j", SEEDS, generation=2, due=due[0][1],
                                                 next_due=f"{tracker.now() + 60:.6f}").status)

    threads = [threading.Thread(target=fire) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("started") == 1, outcomes
    assert tracker.job_info("j").generation == 2
    # A stale due time starts nothing, even once the job is idle again.
    crawl_all(tracker, "j", worker)
    late = tracker.start_generation("j", SEEDS, generation=3, due=due[0][1])
    assert late.status == "moved" and tracker.job_info("j").generation == 2


def test_dead_items_are_tried_again_in_the_next_generation(tracker_factory):
    tracker = tracker_factory()
    worker = new_job(tracker, spec=SPEC)
    pending = tracker.add("j", SEEDS).dispatch
    c = tracker.checkout("j", SEEDS[0], worker, max_lost=3)
    tracker.fail("j", SEEDS[0], c.token, "HTTP 500", fault="item", max_retries=0, max_lost=3)
    crawl_all(tracker, "j", worker, pending=[i for i in pending if i != SEEDS[0]])
    assert tracker.stats("j").dead == 1
    second, _ = crawl_all(tracker, "j", worker,
                          pending=tracker.start_generation("j", SEEDS, generation=2).dispatch)
    assert sorted(second) == SEEDS
    assert (tracker.stats("j").dead, tracker.stats("j").done) == (0, 2)


def _update(outcome, interval=0, etag=""):
    def revisit(item, checkout):
        return RevisitUpdate.of(RevisitOutcome(outcome), Record(
            depth=checkout.depth, interval=interval, digest=digest(item.encode()), etag=etag))
    return revisit


def test_known_items_come_back_with_their_records_when_due(tracker_factory):
    tracker = tracker_factory()
    worker = new_job(tracker, spec=SPEC)
    pending = tracker.add("j", SEEDS).dispatch
    c = tracker.checkout("j", SEEDS[0], worker, max_lost=3)
    assert c.record is None
    pending += tracker.scraped("j", SEEDS[0], c.token, ["http://a.test/p"], 1, save_as=worker).dispatch
    tracker.complete("j", SEEDS[0], c.token, _update("saved", etag='"v1"')(SEEDS[0], c))
    crawl_all(tracker, "j", worker, _update("saved", etag='"v1"'),
              pending=[i for i in pending if i != SEEDS[0]])
    stats = tracker.stats("j")
    assert stats.known == 3 and stats.done == 3
    # A known item is done: a link to it adds nothing.
    assert tracker.add("j", ["http://a.test/p"]).added == 0
    second, checkouts = crawl_all(tracker, "j", worker, _update("unchanged", interval=3600),
                                  tracker.start_generation("j", SEEDS, generation=2).dispatch)
    assert sorted(second) == sorted([*SEEDS, "http://a.test/p"])
    record = checkouts["http://a.test/p"].record
    assert record.etag == '"v1"' and record.depth == 1 and record.digest == digest(b"http://a.test/p")
    stats = tracker.stats("j")
    assert (stats.unchanged, stats.done, stats.known) == (3, 3, 3)
    # Due again an hour after generation 2 began: generation 3 fetches its seeds (every
    # generation does) and nothing else, and ends.
    third, _ = crawl_all(tracker, "j", worker,
                         pending=tracker.start_generation("j", SEEDS, generation=3).dispatch)
    assert sorted(third) == SEEDS
    assert tracker.job_info("j").state.value == "finished"
    assert tracker.job_info("j").generation == 3


def test_an_item_gone_for_good_is_forgotten(tracker_factory):
    tracker = tracker_factory()
    worker = new_job(tracker, spec=SPEC)
    crawl_all(tracker, "j", worker, _update("saved"), tracker.add("j", SEEDS).dispatch)
    pending = tracker.start_generation("j", SEEDS, generation=2).dispatch

    def drop_a(item, checkout):
        if item == SEEDS[0]:
            return RevisitUpdate(RevisitOutcome.DROPPED)
        return _update("unchanged")(item, checkout)

    crawl_all(tracker, "j", worker, drop_a, pending)
    stats = tracker.stats("j")
    assert (stats.gone, stats.unchanged, stats.known) == (1, 1, 1)
    # Forgotten: a link to it later is a new item.
    crawl_all(tracker, "j", worker, _update("unchanged"),
              tracker.start_generation("j", [], generation=3).dispatch)
    assert tracker.add("j", [SEEDS[0]]).added == 1


def test_a_schedule_that_cannot_be_read_holds_back_no_other(tracker_factory):
    """A schedule text no version wrote (written to Redis by hand) is dropped from the index
    with a warning; the other due jobs start all the same."""
    from distscrape_celery.core.schedules import fire_due
    from distscrape_celery.tracker import keys

    tracker = tracker_factory()
    worker = new_job(tracker, "bad", spec=SPEC)
    new_job(tracker, "good", spec=SPEC)
    for job in ("bad", "good"):
        crawl_all(tracker, job, worker, pending=tracker.add(job, SEEDS).dispatch)
        tracker.set_schedule(job, "every 60", tracker.now() - 1)
    tracker.client.hset(keys.JobKeys("bad").control, "schedule", "every soon")
    published = []
    started = fire_due(tracker, lambda job, items: published.append(job))
    assert started == ["good"] and tracker.job_info("good").generation == 2
    assert tracker.job_info("bad").generation == 1
    assert [job for job, _ in tracker.due_schedules()] == []
