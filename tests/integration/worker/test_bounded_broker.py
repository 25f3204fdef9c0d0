"""The frontier waits in the tracker; the broker holds only a bounded number of messages."""

from __future__ import annotations

import json
import time

from tests.support.crawl import crawl_settings
from distscrape_celery.testing.sitegen import Site, SiteServer

from distscrape_celery.worker.app import configure_app
from distscrape_celery.worker.names import SCRAPE_QUEUE
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.worker.publish import publisher
from distscrape_celery.tracker import RedisTracker

ITEMS = 20_000


def broker_messages(client) -> tuple[int, int]:
    """Scrape messages in the broker: (waiting in its queue lists, delivered but not acked)."""
    waiting = sum(client.llen(k) for k in client.keys(f"{SCRAPE_QUEUE}*"))
    unacked = sum(
        1 for raw in client.hvals("unacked") if json.loads(raw)[2] == SCRAPE_QUEUE
    )
    return waiting, unacked


def test_broker_stays_bounded_while_the_frontier_holds_the_rest(redis_url, redis_client, workers):
    pages = {f"/i/{n}": b"<html><body>leaf</body></html>" for n in range(ITEMS)}
    pages["/"] = b"<html><body>seed</body></html>"
    site = Site(pages=pages, reachable=set(pages), unreachable=set())
    settings = crawl_settings(redis_url, lease_seconds=30, dispatch_factor=2)
    tracker = RedisTracker.from_url(redis_url, dispatch_factor=2)
    slow = workers(settings, "slow", concurrency=1)
    wait_for_workers(tracker, 1, procs=[slow])
    bound = tracker.dispatch_bound()
    assert bound == 2  # 2 x one worker of concurrency 1
    configure_app(settings)

    with SiteServer(site, delay=0.02) as server:
        manager = CrawlManager(tracker, publisher.scrape)
        spec = build_spec({"seeds": [server.url("/")], "saver": {"output": "/tmp/unused-bounded"}})
        manager.seed("bounded", spec)
        res = tracker.add("bounded", [server.url(f"/i/{n}") for n in range(ITEMS)], depth=1)
        assert res.added == ITEMS
        publisher.scrape("bounded", res.dispatch)

        peak_waiting = peak_total = samples = 0
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            waiting, unacked = broker_messages(redis_client)
            peak_waiting = max(peak_waiting, waiting)
            peak_total = max(peak_total, waiting + unacked)
            samples += 1
            time.sleep(0.01)
        stats = tracker.stats("bounded")
        slow.check()

    assert samples > 100
    assert stats.done >= 20  # the worker made progress, so messages really flowed
    # Not-yet-started messages are bounded by the tracker; a started task's message stays
    # unacknowledged (late ack) until it ends, so each unit of concurrency adds one more.
    assert peak_waiting <= bound
    assert peak_total <= bound + 1, f"broker held {peak_total} scrape messages, bound {bound} + 1"
    assert stats.dispatched <= bound
    # The rest waits in the tracker: beyond the scrape messages, at most the saves' own bound
    # of pages and the one task running.
    assert stats.frontier >= ITEMS - stats.done - bound - tracker.save_bound() - 1
    assert stats.queued + stats.leased + stats.save_pending + stats.done == ITEMS + 1
