"""The postgres saver under SIGKILL, with real worker processes, a real Redis, a loopback site
and a real PostgreSQL database: every page's record is in the table exactly once (upserted by
URL: one row a URL, none lost), whether a whole worker dies mid-crawl or a save dies between
its commit and the tracker's done mark."""

from __future__ import annotations


import pytest

from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.settings import Settings
from distscrape_celery.testing.sitegen import SiteServer, generate_site
from distscrape_celery.tracker import RedisTracker
from distscrape_celery.tracker.model import LeaseStatus
from distscrape_celery.worker.app import configure_app
from distscrape_celery.worker.publish import publisher
from tests.plugins.savers import event_counts
from tests.support.crawl import check_all, crawl_settings, sigkill_mid_crawl
from tests.support.postgres import rows
from tests.support.tracker_state import live_items

LEASE = 2.0
PLUGIN_MODULES = "tests.plugins"


def _start(redis_url, workers, names, **overrides):
    settings = crawl_settings(redis_url, lease_seconds=LEASE, **overrides)
    tracker = RedisTracker.from_url(redis_url)
    procs = [workers(settings, name, concurrency=3) for name in names]
    wait_for_workers(tracker, len(procs), procs=procs)
    configure_app(settings)
    return settings, tracker, procs


def _assert_each_page_once(postgres_dsn, tracker, redis_client, job, expected) -> None:
    """The table holds one row for each page of ``expected`` and nothing else, and the tracker
    says each is done with nothing left live."""
    got = rows(postgres_dsn, "pages")
    assert sorted(r["url"] for r in got) == sorted(expected)
    assert all(r["status"] == 200 and r["job"] == job for r in got)
    assert live_items(redis_client, job) == {}
    done = {item for item in expected
            if tracker.checkout(job, item, "probe", max_lost=10).status is LeaseStatus.DONE}
    assert done == set(expected)


def test_worker_sigkilled_while_saving_to_postgres(
        redis_url, redis_client, workers, postgres_dsn):
    site = generate_site(n_pages=120, seed=53, unreachable=4)
    n = len(site.reachable)
    settings, tracker, procs = _start(
        redis_url, workers, ["pg-victim", "pg-survivor"], postgres_dsn=postgres_dsn)
    victim, survivor = procs
    job = "pgcrash"
    with SiteServer(site, delay=0.05) as server:
        spec = build_spec({"seeds": [server.url("/")], "saver": {
            "kind": "postgres", "table": "pages", "create_table": True}})
        manager = CrawlManager(tracker, publisher.scrape)
        manager.seed(job, spec)
        # Kill while the victim holds items and rows are being written.
        done_at_kill = sigkill_mid_crawl(tracker, redis_client, job, victim, survivor,
                                         done=n // 3)
        rows_at_kill = len(rows(postgres_dsn, "pages"))
        replacement = workers(settings, "pg-replacement", concurrency=3)
        stats = manager.wait(job, timeout=120, check=check_all([survivor, replacement]))
    assert done_at_kill < n
    assert (stats.done, stats.dead, stats.seen) == (n, 0, n)
    _assert_each_page_once(postgres_dsn, tracker, redis_client, job,
                           [server.url(p) for p in site.reachable])
    print(f"\npostgres crash test: killed at {done_at_kill}/{n} done, {rows_at_kill} rows")


@pytest.mark.parametrize("batch_size", [pytest.param(None, id="save-batches"),
                                        pytest.param(1, id="save-per-page")])
def test_a_save_killed_after_its_commit_adds_no_second_row(
        redis_url, redis_client, workers, postgres_dsn, tmp_path, batch_size):
    """Each of 6 pages' first save SIGKILLs its pool process right after its transaction
    committed, before the tracker marks it done: the page is saved again (upserted), and the
    table still holds one row for it. Saved in batches (one transaction, marked done together)
    and a page at a time."""
    site = generate_site(n_pages=60, seed=59, unreachable=2)
    n = len(site.reachable)
    _, tracker, procs = _start(redis_url, workers, ["pg-commit-a", "pg-commit-b"],
                               postgres_dsn=postgres_dsn, plugin_modules=PLUGIN_MODULES,
                               save_batch_size=batch_size)
    control = tmp_path / "control"
    job = "pgcommit"
    with SiteServer(site) as server:
        victims = [server.url(p) for p in sorted(site.reachable)[1:7]]
        from tests.plugins.savers import instruct

        instruct(control, "crash_once", victims)
        spec = build_spec({"seeds": [server.url("/")], "saver": {
            "kind": "tests.plugins.savers:CommitCrashingPostgresSaver", "output": str(control),
            "table": "pages", "create_table": True}})
        manager = CrawlManager(tracker, publisher.scrape,
                               settings=Settings(plugin_modules=PLUGIN_MODULES))
        manager.seed(job, spec)
        stats = manager.wait(job, timeout=120, check=check_all(procs))
    assert (stats.done, stats.dead, stats.seen) == (n, 0, n)
    kills, writes = event_counts(control, "kill"), event_counts(control, "wrote")
    # Every victim's save committed, then killed its process, then was saved again.
    assert sum(kills.values()) >= 1
    assert all(writes[v] >= 2 for v in victims), {v: writes[v] for v in victims}
    _assert_each_page_once(postgres_dsn, tracker, redis_client, job,
                           [server.url(p) for p in site.reachable])
