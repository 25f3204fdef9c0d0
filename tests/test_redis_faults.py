"""Redis restarted or frozen in the middle of a real crawl: workers ride it out, nothing is lost.

Each test runs its own redis-server with AOF (as the README asks for), on a fixed port so it can
come back where the workers look for it.
"""

from __future__ import annotations

import os
import socket
import time

import pytest

from conftest import crawl_settings, expected_files, saved_files
from sitegen import SiteServer, generate_site

from distscrape_celery.celery_app import configure_app
from distscrape_celery.embedded import EmbeddedRedis
from distscrape_celery.errors import TrackerUnavailable
from distscrape_celery.jobspec import build_spec
from distscrape_celery.keys import JobKeys
from distscrape_celery.local import wait_for_workers
from distscrape_celery.manager import CrawlManager
from distscrape_celery.tasks import publisher
from distscrape_celery.tracker import RedisTracker

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def aof_redis(tmp_path):
    server = EmbeddedRedis(state_dir=tmp_path / "redis", port=free_port()).start()
    yield server
    server.stop()


def group_cpu(pgid: int) -> float:
    """CPU seconds (user + system) of every process in group ``pgid``."""
    total = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def wait_finished(tracker, job, timeout, procs):
    """Like CrawlManager.wait, but patient while Redis is away."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            p.check()
        try:
            stats = tracker.stats(job)
            if stats.finished:
                return stats
        except TrackerUnavailable:
            pass
        time.sleep(0.2)
    k = JobKeys(job)
    stuck = {name: tracker.client.zrange(key, 0, -1) for name, key in
             (("leased", k.leased), ("pending", k.pending), ("dispatched", k.dispatched))}
    logs = "\n".join(
        line for p in procs for line in p.log_path.read_text(errors="replace").splitlines()
        if any(item in line for items in stuck.values() for item in items)
    )
    raise AssertionError(f"{job} did not finish within {timeout}s: {tracker.stats(job)} {stuck}\n{logs}")


def start_crawl(aof_redis, workers, tmp_path, site, server, job):
    settings = crawl_settings(aof_redis.url, lease_seconds=2)
    tracker = RedisTracker.from_url(aof_redis.url)
    procs = [workers(settings, f"{job}-a", concurrency=2), workers(settings, f"{job}-b", concurrency=2)]
    wait_for_workers(tracker, 2, procs=procs)
    configure_app(settings)
    spec = build_spec({"seeds": [server.url("/")], "saver": {"output": str(tmp_path / "out")}})
    CrawlManager(tracker, publisher.scrape).seed(job, spec)
    return tracker, procs


def assert_survived(procs, tracker, job, site, server, tmp_path, stats):
    n = len(site.reachable)
    assert (stats.done, stats.dead, stats.seen) == (n, 0, n), tracker.dead_items(job)
    out = tmp_path / "out"
    assert saved_files(out) == expected_files(server, site, out)
    for p in procs:
        assert p.alive, p.log_tail()
        log = p.log_path.read_text(errors="replace")
        # ("CRITICAL Couldn't ack" lines are expected while Redis is away: those messages come
        # again and their tasks find the items done.)
        assert "Unrecoverable error" not in log, log[-3000:]


def test_redis_restart_mid_crawl(aof_redis, workers, tmp_path):
    site = generate_site(n_pages=120, seed=21, unreachable=0)
    with SiteServer(site, delay=0.05) as server:
        tracker, procs = start_crawl(aof_redis, workers, tmp_path, site, server, "restart")
        while tracker.stats("restart").done < 30:
            time.sleep(0.05)
        aof_redis.restart(down_for=8)  # SIGTERM (the AOF is complete), 8 s away, same port
        assert tracker.stats("restart").done >= 30  # it came back with the crawl's state
        stats = wait_finished(tracker, "restart", 120, procs)
    assert_survived(procs, tracker, "restart", site, server, tmp_path, stats)
    for p in procs:  # they noticed, and came back by themselves
        assert "Connection to broker lost" in p.log_path.read_text(errors="replace")


def test_redis_unreachable_for_30s_mid_crawl(aof_redis, workers, tmp_path):
    site = generate_site(n_pages=120, seed=22, unreachable=0)
    with SiteServer(site, delay=0.05) as server:
        tracker, procs = start_crawl(aof_redis, workers, tmp_path, site, server, "outage")
        while tracker.stats("outage").done < 30:
            time.sleep(0.05)
        cpu_before = sum(group_cpu(p.proc.pid) for p in procs)
        aof_redis.pause()  # connections hang: a partition, not a refusal
        time.sleep(30)
        cpu_during = sum(group_cpu(p.proc.pid) for p in procs) - cpu_before
        aof_redis.resume()
        stats = wait_finished(tracker, "outage", 150, procs)
    print(f"\nworker CPU during the 30 s outage: {cpu_during:.2f} s")
    assert cpu_during < 3.0, f"workers spun while Redis was away: {cpu_during:.1f} s of CPU"
    assert_survived(procs, tracker, "outage", site, server, tmp_path, stats)
