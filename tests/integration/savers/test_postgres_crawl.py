"""Crawls into PostgreSQL with real worker processes, a real Redis and a loopback site; and a
worker without the database setting, whose items fail with a clear error while it lives on."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.testing.sitegen import SiteServer, generate_site
from distscrape_celery.tracker import RedisTracker
from distscrape_celery.worker.app import configure_app
from distscrape_celery.worker.publish import publisher
from tests.integration.deploy.test_readme_commands import REAL_SITE, REAL_SITE_REGEX
from tests.support import REPO_ROOT
from tests.support.cli import assert_one_line_error, run
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


def test_the_guides_crawl_into_postgres(postgres_dsn, records_site, tmp_path):
    """docs/guide.md's job file and `distscrape crawl` command, as written but for the site's
    URL and the database; then its query."""
    guide = (REPO_ROOT / "docs" / "guide.md").read_text()
    section = guide[guide.index("### Into PostgreSQL"):guide.index("### Stopping it")]
    job_file = re.search(r"```toml\n(.*?)```", section, re.S)[1]
    command = next(line for line in section.splitlines()
                   if line.startswith("DISTSCRAPE_POSTGRES_DSN="))
    query = re.search(r"```sql\n(.*?)```", section, re.S)[1]
    (tmp_path / "pages.toml").write_text(job_file)
    with SiteServer(records_site) as server:
        local = re.sub(r"DISTSCRAPE_POSTGRES_DSN='[^']*'",
                       "DISTSCRAPE_POSTGRES_DSN=" + shlex.quote(postgres_dsn), command)
        local = local.replace(REAL_SITE_REGEX, shlex.quote("^" + re.escape(server.url("/"))))
        local = local.replace(REAL_SITE, server.url("/"))
        local = local.replace(".venv/bin/", str(Path(sys.executable).parent) + "/")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")}
        res = subprocess.run(["bash", "-c", local], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=180)
    n = len(records_site.reachable)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f": {n} saved, 0 dead, {n} seen in " in res.stdout, res.stdout
    assert "output in table pages" in res.stdout, res.stdout
    assert len(rows(postgres_dsn, "pages")) == n
    with psycopg.connect(postgres_dsn) as conn:
        latest = conn.execute(query).fetchall()
    assert len(latest) == 10 and all(status == 200 for _, status, _ in latest)


def test_seed_notes_that_the_workers_database_setting_decides(redis_url, tmp_path):
    job_file = tmp_path / "job.toml"
    job_file.write_text('[saver]\nkind = "postgres"\ntable = "shop.products"\nkey = "sku"\n')
    res = run("seed", "products", "http://127.0.0.1:8000/", "--config", str(job_file),
              "--redis-url", redis_url)
    assert res.returncode == 0, res.stderr
    assert ("distscrape: note: workers write table shop.products into the database of their "
            "own DISTSCRAPE_POSTGRES_DSN") in res.stderr
    job_file.write_text('[saver]\nkind = "postgres"\n')
    res = run("seed", "bad", "http://127.0.0.1:8000/", "--config", str(job_file),
              "--redis-url", redis_url)
    assert_one_line_error(res, "the postgres saver needs saver.table")
