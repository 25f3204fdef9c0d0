"""The Celery app's guarantees: JSON only, late ack, bounded prefetch, visibility from the lease."""

from __future__ import annotations

import time

import pytest

from tests.support.crawl import crawl_settings

from distscrape_celery.worker.app import app, celery_config, configure_app
from distscrape_celery.worker.names import SAVE_QUEUE, SAVE_TASK, SCRAPE_QUEUE, SCRAPE_TASK
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.errors import ConfigError
from distscrape_celery.settings import Settings
from distscrape_celery.tracker import RedisTracker


@pytest.mark.parametrize("lease, limit", [(0.5, 5.0), (60.0, 300.0), (3600.0, 60.0)])
def test_config_follows_from_settings(lease, limit):
    s = Settings.from_env({}, lease_seconds=lease, task_time_limit=limit, redis_url="redis://r:1/0")
    conf = celery_config(s)
    assert conf["accept_content"] == ["json"]
    assert conf["task_serializer"] == conf["result_serializer"] == conf["event_serializer"] == "json"
    assert conf["task_acks_late"] and conf["task_reject_on_worker_lost"]
    assert conf["worker_prefetch_multiplier"] == 1
    assert conf["broker_url"] == "redis://r:1/0"
    visibility = conf["broker_transport_options"]["visibility_timeout"]
    assert conf["task_time_limit"] == limit > conf["task_soft_time_limit"]
    # Redelivery never hits a task that may still run, and comes two leases after the limit.
    assert visibility == limit + 2 * lease
    assert conf["task_routes"][SCRAPE_TASK]["queue"] == SCRAPE_QUEUE
    assert conf["task_routes"][SAVE_TASK]["queue"] == SAVE_QUEUE


def test_default_visibility_is_far_below_celerys_hour():
    conf = celery_config(Settings.from_env({}))
    assert conf["broker_transport_options"]["visibility_timeout"] == 300 + 2 * 60


def test_redis_socket_timeout_reaches_the_broker_and_the_tracker(redis_url):
    assert celery_config(Settings.from_env({}))["broker_transport_options"]["socket_timeout"] == 30
    s = Settings.from_env({"DISTSCRAPE_REDIS_SOCKET_TIMEOUT": "4.5"}, redis_url=redis_url)
    assert celery_config(s)["broker_transport_options"]["socket_timeout"] == 4.5
    tracker = RedisTracker.from_settings(s)
    assert tracker.client.connection_pool.connection_kwargs["socket_timeout"] == 4.5
    with pytest.raises(ConfigError, match="DISTSCRAPE_REDIS_SOCKET_TIMEOUT"):
        Settings.from_env({"DISTSCRAPE_REDIS_SOCKET_TIMEOUT": "0"})


def test_separate_broker_url():
    s = Settings.from_env({"DISTSCRAPE_BROKER_URL": "amqp://guest@127.0.0.1//"})
    assert celery_config(s)["broker_url"] == "amqp://guest@127.0.0.1//"
    assert s.redis_url == "redis://127.0.0.1:6379/0"


def test_worker_refuses_pickle(redis_url, workers, tmp_path):
    """A pickled message is never deserialised by a worker (it could run arbitrary code)."""
    settings = crawl_settings(redis_url, lease_seconds=30)
    w = workers(settings, "pickle-check")
    wait_for_workers(RedisTracker.from_url(redis_url), 1, procs=[w])
    configure_app(settings)
    app.send_task(SCRAPE_TASK, args=("nojob", "http://127.0.0.1:9/"), serializer="pickle")
    deadline = time.monotonic() + 30
    refusal = "Refusing to deserialize untrusted content of type pickle"
    while refusal not in w.log_tail(20000):
        assert time.monotonic() < deadline, w.log_tail()
        time.sleep(0.1)
    log = w.log_tail(20000)
    assert "Task distscrape.scrape" not in log  # it never ran
    w.check()  # and the worker lives on


def test_a_worker_waits_on_one_list_per_queue_and_takes_any_priority(redis_url, workers):
    """A worker's fetch (BLMPOP with room for several messages, else BRPOP) names each of its
    queues once (kombu's default priority lists made it 8 keys for our 2 queues), and a message
    published with a priority is still taken."""
    import redis

    settings = crawl_settings(redis_url, lease_seconds=30)
    w = workers(settings, "priority-check")
    wait_for_workers(RedisTracker.from_url(redis_url), 1, procs=[w])
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    with client.monitor() as monitor:
        while True:
            command = monitor.next_command()["command"].split()
            if command[0] == "BRPOP":
                keys = command[1:-1]
                break
            if command[0] == "BLMPOP":  # BLMPOP timeout numkeys key... RIGHT COUNT n
                keys = command[3:3 + int(command[2])]
                assert command[3 + len(keys):-1] == ["RIGHT", "COUNT"], command
                break
    assert sorted(keys) == sorted([SCRAPE_QUEUE, SAVE_QUEUE])
    configure_app(settings)
    app.send_task(SCRAPE_TASK, args=("nojob", "http://127.0.0.1:9/"), queue=SCRAPE_QUEUE,
                  priority=9)
    deadline = time.monotonic() + 30
    while client.keys(f"{SCRAPE_QUEUE}*"):  # taken by the worker, from whichever list
        assert time.monotonic() < deadline, client.keys("*")
        time.sleep(0.1)
    w.check()


def test_save_timeout_is_five_leases_and_30s_unless_set(redis_url):
    assert Settings.from_env({}, lease_seconds=2).save_timeout == 40
    s = Settings.from_env({"DISTSCRAPE_SAVE_TIMEOUT_SECONDS": "12"}, redis_url=redis_url,
                          lease_seconds=2)
    assert s.save_timeout == 12 and s.body_ttl == 12 + s.visibility_timeout
    assert Settings.from_env(s.to_env()).save_timeout == 12  # a worker's environment keeps it
    assert RedisTracker.from_settings(s).save_timeout == 12  # what the workers' tracker waits
    with pytest.raises(ConfigError, match="DISTSCRAPE_SAVE_TIMEOUT_SECONDS"):
        Settings.from_env({"DISTSCRAPE_SAVE_TIMEOUT_SECONDS": "0"})


def test_save_batches_wait_200_ms_or_a_quarter_of_a_shorter_lease():
    """Unset, the wait is 0.2 s, or a quarter of a lease shorter than 0.8 s (a page waits
    under its lease); a worker given the settings' environment gets the same."""
    assert Settings().save_batch_seconds == 0.2
    short = Settings(lease_seconds=0.5)
    assert short.save_batch_seconds == 0.125
    assert Settings.from_env(short.to_env()).save_batch_seconds == 0.125
    assert Settings.from_env({"DISTSCRAPE_LEASE_SECONDS": "0.6"}).save_batch_seconds == 0.15
    assert Settings.from_env({"DISTSCRAPE_SAVE_BATCH_SECONDS": "0.05"}).save_batch_seconds == 0.05


def test_save_batches_wait_far_less_than_a_lease(redis_url):
    """A scraped page waits for its batch under its worker's lease: the wait must leave the lease
    room for a slow broker round trip."""
    s = Settings.from_env({"DISTSCRAPE_SAVE_BATCH_SECONDS": "0.5"}, lease_seconds=2)
    assert (s.save_batch_size, s.save_batch_seconds) == (32, 0.5)
    with pytest.raises(ConfigError, match="DISTSCRAPE_SAVE_BATCH_SECONDS.*quarter of lease_seconds"):
        Settings.from_env({"DISTSCRAPE_SAVE_BATCH_SECONDS": "0.6"}, lease_seconds=2)
    with pytest.raises(ConfigError, match="DISTSCRAPE_SAVE_BATCH_SIZE"):
        Settings.from_env({"DISTSCRAPE_SAVE_BATCH_SIZE": "0"})


@pytest.mark.parametrize("handler", ["_on_worker_ready", "_on_pool_process_init"])
def test_a_ready_worker_leaves_its_startup_objects_out_of_garbage_collection(monkeypatch, handler):
    """What a worker (or prefork pool process) holds once ready is frozen, so the
    collections of a crawl do not walk it again; garbage there is collected first, not kept."""
    import gc
    import weakref

    from distscrape_celery.worker import signals

    class Node:
        pass

    cycle = Node()
    cycle.me = cycle
    gone = weakref.ref(cycle)
    del cycle
    monkeypatch.setattr(signals, "_agent", None)
    gc.unfreeze()  # an in-process worker of an earlier test may have frozen this process
    try:
        getattr(signals, handler)()
        assert gone() is None  # collected, not frozen
        assert gc.get_freeze_count() > 1000
    finally:
        gc.unfreeze()
