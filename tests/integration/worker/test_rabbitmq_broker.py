"""A crawl whose Celery broker is a real RabbitMQ (the tracker stays in Redis).

The broker is DISTSCRAPE_TEST_AMQP_URL, else a RabbitMQ on 127.0.0.1:5672 with the guest user.
With neither reachable the tests skip, naming what to set, except in CI (CI=true), where they
fail: .ci/run starts RabbitMQ when it is installed. Each test uses queues (and exchanges) of its
own, removed at the end, so parallel runs and other users of that RabbitMQ never collide.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest
from tests.support.crawl import crawl_settings, crawl_site_with_workers, expected_files, saved_files
from tests.support.http import RouteServer
from kombu import Connection

from distscrape_celery.worker.app import configure_app
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.worker.publish import publisher
from distscrape_celery.tracker import RedisTracker

LOCAL_AMQP = "amqp://guest:guest@127.0.0.1:5672//"


@pytest.fixture(scope="module")
def amqp_url():
    url = os.environ.get("DISTSCRAPE_TEST_AMQP_URL") or LOCAL_AMQP
    try:
        with Connection(url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:  # any failure to reach it: refused, auth, timeout
        reason = (f"no RabbitMQ at {url} ({exc.__class__.__name__}: {exc}); set "
                  "DISTSCRAPE_TEST_AMQP_URL or run RabbitMQ on 127.0.0.1:5672")
        if os.environ.get("CI") == "true":
            pytest.fail(reason + " (CI must run this test)")
        pytest.skip(reason)
    return url


@pytest.fixture
def amqp_settings(amqp_url, redis_url):
    """Settings with a queue prefix of this test's own; its queues are deleted at the end."""
    settings = crawl_settings(redis_url, broker_url=amqp_url, lease_seconds=30,
                              queue_prefix=f"dstest-{uuid.uuid4().hex[:12]}")
    yield settings
    with Connection(amqp_url) as conn:
        channel = conn.default_channel
        for name in (settings.scrape_queue, settings.save_queue):
            channel.queue_delete(name)
            channel.exchange_delete(name)


def queue_depth(url: str, name: str) -> int:
    with Connection(url) as conn:
        _, messages, _ = conn.default_channel.queue_declare(name, passive=True)
        return messages


def test_crawl_with_a_rabbitmq_broker(amqp_settings, site, site_server, workers, tmp_path):
    settings = amqp_settings
    out = tmp_path / "out"
    stats = crawl_site_with_workers(settings, workers, site_server, out, "amqp", timeout=180)
    n = len(site.reachable)
    assert (stats.done, stats.dead, stats.seen) == (n, 0, n)
    assert saved_files(out) == expected_files(site_server, site, out)
    assert max(site_server.counts().values()) == 1
    # The messages went through this test's own queues, and none is left behind.
    assert queue_depth(settings.broker_url, settings.scrape_queue) == 0
    assert queue_depth(settings.broker_url, settings.save_queue) == 0


def test_a_killed_workers_message_is_redelivered_at_once(amqp_settings, workers, tmp_path):
    """On RabbitMQ an unacknowledged message is back in its queue as soon as its consumer's
    connection closes (Redis's transport waits out its visibility timeout, task time limit plus
    two leases). The tracker's lease still decides: the redelivered message finds the item
    leased to the dead worker until the lease ends, then it is saved once."""
    settings = amqp_settings.model_copy(update={"lease_seconds": 5.0})
    with RouteServer({"/": (200, b"<html>slow</html>", 4.0)}) as site:
        first = workers(settings, "amqp-doomed", concurrency=1)
        tracker = RedisTracker.from_url(settings.redis_url)
        wait_for_workers(tracker, 1, procs=[first])
        configure_app(settings)
        out = tmp_path / "out"
        spec = build_spec({"seeds": [site.base + "/"], "saver": {"output": str(out)},
                           "fetch": {"obey_robots": False}})
        manager = CrawlManager(tracker, publisher.scrape)
        manager.seed("kill", spec)
        deadline = time.monotonic() + 60
        while site.page_hits.count("/") < 1:
            assert time.monotonic() < deadline, "the page was never fetched"
            time.sleep(0.05)
        assert queue_depth(settings.broker_url, settings.scrape_queue) == 0  # it is unacked
        first.kill(signal.SIGKILL)  # mid-download, its message unacknowledged
        deadline = time.monotonic() + 5  # well within the lease, let alone a visibility timeout
        while queue_depth(settings.broker_url, settings.scrape_queue) != 1:
            assert time.monotonic() < deadline, "the broker did not redeliver the message"
            time.sleep(0.05)
        second = workers(settings, "amqp-rescuer", concurrency=1)
        stats = manager.wait("kill", timeout=60, check=second.check)
        assert (stats.done, stats.dead) == (1, 0)
        assert len(saved_files(out)) == 1


def test_a_save_message_of_a_killed_worker_is_redelivered_and_saved_without_a_download(
        amqp_settings, workers, tmp_path):
    """A worker dies in the middle of a save: RabbitMQ puts the save message back at once, and
    another worker saves the page from its staged body when the dead worker's lease ends. No
    check of the save queue is needed (none runs on RabbitMQ), and the page is not downloaded
    again."""
    from tests.plugins.savers import instruct, paused_pid
    from distscrape_celery.settings import Settings

    settings = amqp_settings.model_copy(update={"lease_seconds": 5.0,
                                                "plugin_modules": "tests.plugins"})
    with RouteServer({"/": (200, b"<html>one page</html>", 0.0)}) as site:
        out = tmp_path / "out"
        page = site.base + "/"
        instruct(out, "pause", [f"60 {page}"])  # the first save of the page hangs
        first = workers(settings, "amqp-saver-doomed", concurrency=1)
        tracker = RedisTracker.from_url(settings.redis_url)
        wait_for_workers(tracker, 1, procs=[first])
        configure_app(settings)
        spec = build_spec({"seeds": [page], "fetch": {"obey_robots": False},
                           "saver": {"kind": "tests.plugins.savers:CrashingSaver",
                                     "output": str(out)}})
        manager = CrawlManager(tracker, publisher.scrape,
                               settings=Settings(plugin_modules="tests.plugins"))
        manager.seed("save-kill", spec)
        deadline = time.monotonic() + 60
        while paused_pid(out, page) is None:
            assert time.monotonic() < deadline, "the save never began"
            time.sleep(0.05)
        assert queue_depth(settings.broker_url, settings.save_queue) == 0  # it is unacked
        first.kill(signal.SIGKILL)  # mid-save, its message unacknowledged
        deadline = time.monotonic() + 5
        while queue_depth(settings.broker_url, settings.save_queue) != 1:
            assert time.monotonic() < deadline, "the broker did not redeliver the save message"
            time.sleep(0.05)
        second = workers(settings, "amqp-saver-rescuer", concurrency=1)
        stats = manager.wait("save-kill", timeout=60, check=second.check)
        assert (stats.done, stats.dead) == (1, 0)
        assert len(saved_files(out)) == 1
        assert site.page_hits.count("/") == 1  # saved from its staged body, not downloaded again


def test_an_urgent_item_is_sent_in_line_on_rabbitmq(amqp_settings):
    """RabbitMQ has no head of the queue for a message: an Urgent item's message is published
    like any other, in the order given, and none is lost."""
    from kombu import Consumer

    from distscrape_celery.tracker import Urgent
    from distscrape_celery.worker.app import app

    configure_app(amqp_settings)
    with publisher.batch():
        publisher.scrape("j", ["a", Urgent("slow"), "b"])
    taken = []

    def on_message(body, message):
        taken.append(body[0][1])
        message.ack()

    with app.connection_for_read() as conn:
        with Consumer(conn, queues=[app.amqp.queues[amqp_settings.scrape_queue]],
                      callbacks=[on_message], accept=["json"]):
            while len(taken) < 3:
                conn.drain_events(timeout=5)
    assert taken == ["a", "slow", "b"]


def test_the_queue_prefix_names_queues_and_exchanges():
    from distscrape_celery.worker.app import celery_config
    from distscrape_celery.worker.names import SAVE_TASK, SCRAPE_TASK
    from distscrape_celery.errors import ConfigError
    from distscrape_celery.settings import Settings

    conf = celery_config(Settings.from_env({"DISTSCRAPE_QUEUE_PREFIX": "crawl-a"}))
    assert [(q.name, q.exchange.name) for q in conf["task_queues"]] == [
        ("crawl-a.scrape", "crawl-a.scrape"), ("crawl-a.save", "crawl-a.save")]
    assert conf["task_routes"][SCRAPE_TASK]["queue"] == "crawl-a.scrape"
    assert conf["task_routes"][SAVE_TASK]["queue"] == "crawl-a.save"
    with pytest.raises(ConfigError, match="DISTSCRAPE_QUEUE_PREFIX"):
        Settings.from_env({"DISTSCRAPE_QUEUE_PREFIX": "no spaces"})
