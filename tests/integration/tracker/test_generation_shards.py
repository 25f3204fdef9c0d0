"""Generations and revisits of sharded jobs, and of any job on a Redis Cluster (one Redis and the
three-master cluster of test_cluster.py): a finished job runs again on every shard, known items
come back on their own shards, and the job is neither taken for finished nor dropped from the
maintained jobs while a shard's refill is still under way."""

from __future__ import annotations

import pytest

from distscrape_celery.tracker import JobState, keys
from distscrape_celery.tracker.model import CrawlLimits
from distscrape_celery.tracker.redis import items as redis_items
from distscrape_celery.tracker.redis.scripts import dispatched
from tests.integration.tracker.test_cluster import cluster, tracker  # noqa: F401 (fixtures)
from tests.integration.tracker.test_generations import _update, crawl_all
from tests.support.jobs import new_job
from tests.support.tracker_state import item_state

ITEMS = [f"http://h{i}.invalid/" for i in range(12)]  # a domain each, spread over 3 shards


def _spec(revisit: bool) -> str:
    seeds = ", ".join(f'"{i}"' for i in ITEMS)
    return '{"seeds": [%s], "tracker": {"shards": 3}%s}' % (seeds, ', "revisit": {}' if revisit else "")


def _shard(item: str, shards: int = 3) -> int:
    return keys.shard_of(keys.domain_of(item), shards) if shards > 1 else 0


def _job(t, revisit: bool, shards: int = 3) -> str:
    spec = _spec(revisit) if shards > 1 else _spec(revisit).replace(', "tracker": {"shards": 3}', "")
    return new_job(t, concurrency=3, spec=spec, limits=CrawlLimits(shards=shards))


def _generations(t, job: str = "j", shards: int = 3) -> list[int]:
    return [int(t.client.hget(keys.JobKeys(job, s).control, "generation") or 1)
            for s in range(shards)]


def test_a_finished_sharded_job_queues_its_seeds_on_every_shard(tracker):
    t = tracker
    w = _job(t, revisit=False)
    assert len({_shard(i) for i in ITEMS}) == 3
    crawl_all(t, "j", w, pending=t.add("j", ITEMS).dispatch)
    assert t.job_info("j").state is JobState.FINISHED
    result = t.start_generation("j", ITEMS, generation=2)
    assert result.started and _generations(t) == [2, 2, 2]
    for item in ITEMS:  # queued again, on its own shard
        assert item_state(t.client, "j", item, _shard(item)) is not None
    assert t.active_jobs() == ["j"] and t.job_info("j").state is JobState.RUNNING
    second, _ = crawl_all(t, "j", w, pending=result.dispatch)
    assert sorted(second) == sorted(ITEMS)
    assert [t.maintain("j", max_lost=3).finished for _ in range(2)] == [False, False]
    info = t.job_info("j")
    assert (info.state, info.generation, info.final["done"]) == (JobState.FINISHED, 2, 12)
    assert t.active_jobs() == []


def test_known_items_come_back_on_their_shards_and_the_job_runs_until_they_are_done(tracker):
    t = tracker
    w = _job(t, revisit=True)
    crawl_all(t, "j", w, _update("saved"), t.add("j", ITEMS).dispatch)
    assert t.stats("j").known == 12
    # Every generation queues its seeds, known or not, on their shards at once (as many are
    # handed out as the broker may hold).
    result = t.start_generation("j", ITEMS, generation=2)
    assert result.started and result.dispatch and set(result.dispatch) <= set(ITEMS)
    # Every shard has its refill under way: the job runs (it was taken for finished, and
    # a second run started at once, doubling the generation).
    assert t.job_info("j").state is JobState.RUNNING
    again = t.start_generation("j", ITEMS, generation=3)
    assert not again.started and again.status == "running"
    assert t.active_jobs() == ["j"]
    pending = result.dispatch + t.maintain("j", max_lost=3).dispatch
    for item in ITEMS:
        assert item_state(t.client, "j", item, _shard(item)) is not None, item
    second, checkouts = crawl_all(t, "j", w, _update("unchanged"), pending)
    assert sorted(second) == sorted(ITEMS)
    assert all(checkouts[i].record is not None for i in ITEMS)
    info, stats = t.job_info("j"), t.stats("j")
    assert (info.state, info.generation) == (JobState.FINISHED, 2)
    assert (stats.done, stats.unchanged, stats.known) == (12, 12, 12)


@pytest.mark.parametrize("shards", [3, 1], ids=["sharded", "one-shard"])
def test_a_long_refill_that_finds_nothing_due_keeps_the_job_maintained(tracker, monkeypatch,
                                                                       shards):
    """A generation whose refill takes several maintain calls and finds nothing due: no item
    is seen for a while, yet the job runs until every refill ended, stays among the maintained
    jobs meanwhile (it was unlisted, and its refill never ended), then finishes once."""
    t = tracker
    if shards == 1 and not t.cluster:
        pytest.skip("an unsharded job on one Redis lists itself in its scripts")
    w = _job(t, revisit=True, shards=shards)
    many = [f"http://h{i}.invalid/p{n}" for i in range(12) for n in range(40)]
    crawl_all(t, "j", w, _update("saved", interval=3600), t.add("j", ITEMS + many).dispatch)
    assert t.stats("j").known == 492
    monkeypatch.setattr(redis_items, "MAX_RECLAIM_BATCH", 1)  # a refill slice of 5 items
    # No seeds this time (every generation queues its seeds): nothing at all is due.
    assert t.start_generation("j", [], generation=2).started
    finished, calls = [], 0
    while t.job_info("j").state is not JobState.FINISHED:
        calls += 1
        assert calls < 40, "the generation never ended"
        assert t.active_jobs() == ["j"], f"unlisted after {calls - 1} maintain call(s)"
        finished.append(t.maintain("j", max_lost=3).finished)
    assert calls >= 3 and finished.count(True) == 1, (calls, finished)
    assert t.active_jobs() == [] and t.stats("j").seen == 0
    assert not any(t.client.hexists(keys.JobKeys("j", s).control, "refill") for s in range(shards))


def test_a_generation_started_part_way_is_completed_by_the_next_caller(tracker):
    """A caller died after shard 0 began generation 2, before the other shards followed: the job
    is not idle (a next generation must not start over it), and the next start finishes it."""
    t = tracker
    w = _job(t, revisit=False)
    crawl_all(t, "j", w, pending=t.add("j", ITEMS).dispatch)
    zero = [i for i in ITEMS if _shard(i) == 0]
    reply = t._run("generation", "j", [2, "", "", 0, *t._top_up_args("j"), *zero], 0)
    assert _generations(t) == [2, 1, 1]
    crawl_all(t, "j", w, pending=dispatched(reply[3:]))  # shard 0's seeds
    assert t.job_info("j").state is JobState.RUNNING
    result = t.start_generation("j", ITEMS, generation=3)
    assert not result.started and result.generation == 2 and _generations(t) == [2, 2, 2]
    second, _ = crawl_all(t, "j", w, pending=result.dispatch)
    assert sorted(second) == sorted(set(ITEMS) - set(zero))
    assert t.job_info("j").state is JobState.FINISHED
