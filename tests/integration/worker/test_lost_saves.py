"""Save messages that left the Redis broker with a worker that died before it took their items
over (README, "Ack emulation is off by default"): a live worker finds them missing from the save
queue and has their items reclaimed a lease after the hand-over, not after the save timeout.

Real Redis (tracker and broker), real HTTP, the real publisher (kombu's message format); the
dead worker's BRPOP is an RPOP of the message here. test_save_faults.py has the real crash."""

from __future__ import annotations

import json

import pytest
import redis

from distscrape_celery.worker.app import configure_app
from distscrape_celery.tracker.keys import JobKeys
from distscrape_celery.worker.lost_saves import LostSaves, queued_saves
from distscrape_celery.core.pipeline import ItemPipeline
from distscrape_celery.worker.publish import publisher
from tests.support.pipeline import pipeline_env
from tests.support.tracker_state import live_items


@pytest.fixture
def env(redis_url, server, tmp_path):  # noqa: F811
    rt, _, _, server = pipeline_env(redis_url, server, tmp_path, save_batch_size=8,
                                    save_batch_seconds=5, queue_prefix="lost")
    configure_app(rt.settings)
    broker = redis.Redis.from_url(redis_url)
    broker.delete(rt.settings.save_queue, rt.settings.scrape_queue)
    yield rt, ItemPipeline(rt, publisher), server, broker
    broker.delete(rt.settings.save_queue, rt.settings.scrape_queue)


def _owner(rt, item):
    return rt.tracker.client.hget(JobKeys("p").owners, item)


def test_a_save_message_taken_by_a_dead_worker_has_its_items_reclaimed(env):
    rt, pipe, server, broker = env
    taken = [server.base + "/ok", server.base + "/hostile"]
    waiting = server.base + "/ok2"
    rt.tracker.add("p", [*taken, waiting])
    for items in (taken, [waiting]):  # two save batches, two messages
        for item in items:
            assert pipe.scrape("p", item) == "scraped"
        assert pipe.flush()
    assert all(_owner(rt, item).startswith("- ") for item in [*taken, waiting])
    queue = rt.settings.save_queue
    assert {(item, token) for _, item, token in queued_saves(broker, queue)} == set(
        rt.tracker.unclaimed_saves("p", age=0))
    # A worker takes the older message (kombu pushes left, pops right) and dies before it
    # can take its items over.
    message = json.loads(broker.rpop(queue))
    assert message["headers"]["task"] == "distscrape.save_batch"
    # Not before they were handed over a lease ago...
    assert LostSaves(rt.tracker, broker, queue, age=rt.settings.lease_seconds).check("p") == 0
    # ... then only those whose message is gone, and missing at three checks in a row.
    finder = LostSaves(rt.tracker, broker, queue, age=0)
    assert finder.check("p") == 0
    assert finder.check("p") == 0
    assert rt.tracker.stats("p").save_pending == 3
    assert finder.check("p") == 2
    res = rt.tracker.maintain("p", max_lost=3)
    assert res.reclaimed == 2
    assert rt.tracker.stats("p").save_pending == 1 and _owner(rt, waiting).startswith("- ")
    assert all(_owner(rt, item) is None for item in taken)
    # Queued again (dispatched by the maintenance, or in the frontier) and downloaded anew.
    assert set(taken) <= set(res.dispatch) | set(live_items(rt.tracker.client, "p"))


def test_a_save_taken_over_meanwhile_is_left_alone(env):
    """The message was in no queue because a live worker had just taken it: once that worker
    holds the items, expiring them changes nothing."""
    rt, pipe, server, broker = env
    item = server.base + "/ok"
    rt.tracker.add("p", [item])
    assert pipe.scrape("p", item) == "scraped"
    assert pipe.flush()
    [(same, token)] = rt.tracker.unclaimed_saves("p", age=0)
    broker.rpop(rt.settings.save_queue)
    finder = LostSaves(rt.tracker, broker, rt.settings.save_queue, age=0)
    assert finder.check("p") == 0  # missing, before the receiver's heartbeat takes it over
    assert finder.check("p") == 0
    rt.tracker.extend("p", [], "w9", saves=[(item, token)], running=[])  # that heartbeat
    assert finder.check("p") == 0
    assert finder.check("p") == 0
    assert rt.tracker.expire_saves("p", [(item, token)]) == 0
    assert rt.tracker.maintain("p", max_lost=3).reclaimed == 0


def test_messages_that_are_not_ours_are_skipped(env):
    rt, _, _, broker = env
    queue = rt.settings.save_queue
    broker.lpush(queue, b"not json", json.dumps({"headers": {"task": "other"}, "body": ""}))
    broker.lpush(queue + "\x06\x163", json.dumps({"headers": {"task": "distscrape.save"},
                                                   "body": json.dumps([["j", "i", 7, {}], {}, {}]),
                                                   "properties": {}}))
    assert queued_saves(broker, queue) == {("j", "i", 7)}
    broker.delete(queue + "\x06\x163")
