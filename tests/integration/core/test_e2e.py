"""End to end: real Redis, real `celery worker` processes, real HTTP on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.support.crawl import crawl_settings, crawl_site_with_workers, expected_files, saved_files



def test_distributed_crawl_saves_exactly_the_reachable_set_once(
    redis_url, site, site_server, workers, tmp_path
):
    settings = crawl_settings(redis_url, lease_seconds=30)
    out = tmp_path / "out"
    stats = crawl_site_with_workers(settings, workers, site_server, out, "e2e")

    n = len(site.reachable)
    assert (stats.done, stats.dead, stats.seen) == (n, 0, n)
    assert saved_files(out) == expected_files(site_server, site, out)
    counts = site_server.counts()
    assert set(counts) == site.reachable  # nothing unreachable, nothing off-site
    assert max(counts.values()) == 1, [p for p, n in counts.items() if n > 1]
    assert site_server.robots_requests == 1  # once for the host, shared by both workers in Redis


def run_cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "distscrape_celery.cli", *args],
        capture_output=True, text=True, timeout=timeout,
    )


def test_crawl_command_with_embedded_redis(site, site_server, tmp_path):
    out = tmp_path / "site"
    started = time.monotonic()
    res = run_cli("crawl", site_server.url("/"), "--output", str(out), "--concurrency", "4")
    assert res.returncode == 0, res.stderr
    assert f"{len(site.reachable)} saved, 0 dead" in res.stdout
    assert saved_files(out) == expected_files(site_server, site, out)
    assert max(site_server.counts().values()) == 1
    assert time.monotonic() - started < 120


def test_crawl_command_in_memory(site, site_server, tmp_path):
    out = tmp_path / "mem"
    res = run_cli("crawl", "--in-memory", site_server.url("/"), "--output", str(out))
    assert res.returncode == 0, res.stderr
    assert f"{len(site.reachable)} saved, 0 dead" in res.stdout
    assert saved_files(out) == expected_files(site_server, site, out)
