"""Crawls into PostgreSQL with real worker processes, a real Redis and a loopback site; and a
worker without the database setting, whose items fail with a clear error while it lives on."""

from __future__ import annotations

import pytest

from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.testing.sitegen import SiteServer, generate_site
from distscrape_celery.tracker import RedisTracker
from distscrape_celery.worker.app import configure_app
from distscrape_celery.worker.publish import publisher
from tests.support.crawl import check_all, crawl_settings
from tests.support.postgres import rows


@pytest.fixture(scope="module")
def records_site():
    """A 40-page site with 3 pages no link reaches: the table must hold none of them."""
    return generate_site(n_pages=40, seed=47, unreachable=3)


def _start(redis_url, workers, names, **settings_overrides):
    settings = crawl_settings(redis_url, **settings_overrides)
    tracker = RedisTracker.from_url(redis_url)
    procs = [workers(settings, name, concurrency=2) for name in names]
    wait_for_workers(tracker, len(procs), procs=procs)
    configure_app(settings)
    return tracker, procs


@pytest.mark.parametrize("save_inline", [False, True], ids=["save-tasks", "save-inline"])
def test_crawl_into_a_postgres_table(redis_url, workers, postgres_dsn, records_site, save_inline):
    site = records_site
    tracker, procs = _start(redis_url, workers, ["pg-a", "pg-b"], postgres_dsn=postgres_dsn,
                            save_inline=save_inline)
    with SiteServer(site) as server:
        spec = build_spec({"seeds": [server.url("/")], "saver": {
            "kind": "postgres", "table": "pages", "create_table": True}})
        manager = CrawlManager(tracker, publisher.scrape)
        manager.seed("records", spec)
        stats = manager.wait("records", timeout=120, check=check_all(procs))
    n = len(site.reachable)
    assert (stats.done, stats.dead, stats.seen) == (n, 0, n)
    got = rows(postgres_dsn, "pages")
    assert sorted(r["url"] for r in got) == sorted(server.url(p) for p in site.reachable)
    for row in got:
        assert (row["job"], row["status"]) == ("records", 200)
        assert row["record"]["url"] == row["url"] and row["record"]["job"] == "records"
        assert row["record"]["fetched_at"].endswith("Z")


def test_a_worker_without_the_database_fails_the_items_and_lives_on(
        redis_url, workers, records_site):
    tracker, procs = _start(redis_url, workers, ["pg-nodsn"])
    with SiteServer(records_site) as server:
        spec = build_spec({"seeds": [server.url("/")], "max_retries": 3, "saver": {
            "kind": "postgres", "table": "pages"}})
        manager = CrawlManager(tracker, publisher.scrape)
        manager.seed("nodsn", spec)
        stats = manager.wait("nodsn", timeout=60, check=check_all(procs))
        dead = tracker.dead_items("nodsn")
        # Not retried: the seed page was downloaded once.
        assert server.counts()["/"] == 1
    assert stats.done == 0 and stats.dead == stats.seen >= 1
    assert all("set DISTSCRAPE_POSTGRES_DSN on the workers" in reason for reason in dead.values())
    for proc in procs:
        proc.check()
