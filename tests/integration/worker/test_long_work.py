"""Work that outlasts the lease keeps its lease while its worker lives: fetched once, not stolen."""

from __future__ import annotations

import pytest

from tests.support.crawl import crawl_settings
from tests.support.http import RouteServer

from distscrape_celery.worker.app import configure_app
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.worker.publish import publisher
from distscrape_celery.tracker import RedisTracker

LEASE = 1.0
SLOW = 4 * LEASE


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_download_longer_than_the_lease_is_not_reclaimed(redis_url, workers, tmp_path, pool):
    """With the threads pool the slow page is the one the first page's task carries on to: no
    message names it, and the worker's heartbeat keeps its lease all the same."""
    settings = crawl_settings(redis_url, lease_seconds=LEASE)
    # Two workers: had the slow item's lease lapsed, the idle one would have fetched it again.
    procs = [workers(settings, f"long-{i}", concurrency=2, pool=pool) for i in range(2)]
    tracker = RedisTracker.from_url(redis_url)
    wait_for_workers(tracker, 2, procs=procs)
    configure_app(settings)
    routes = {"/": (200, b'<a href="/slow">slow</a>'), "/slow": (200, b"done at last", SLOW)}
    with RouteServer(routes) as server:
        spec = build_spec({"seeds": [server.base + "/"], "saver": {"output": str(tmp_path / "out")}})
        manager = CrawlManager(tracker, publisher.scrape)
        manager.seed("long", spec)
        stats = manager.wait("long", timeout=60)
    assert (stats.done, stats.dead) == (2, 0), tracker.dead_items("long")
    assert server.hits.count("/slow") == 1
    logs = "".join(p.log_path.read_text(errors="replace") for p in procs)
    assert ("/slow: carried on to: " in logs) == (pool == "threads")
    assert (tmp_path / "out").is_dir()
