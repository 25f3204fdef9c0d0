"""Redis restarted, frozen or killed in the middle of a real crawl: workers ride it out, nothing
is lost.

Each test runs its own ``redis-server`` (not the session one), with AOF on as the README asks,
on a fixed port so that it can come back where the workers look for it. The workers are real
``celery worker`` processes (prefork), the site is real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis

from tests.support.crawl import crawl_settings, expected_files, saved_files
from distscrape_celery.testing.sitegen import SiteServer, generate_site

from distscrape_celery.worker.app import configure_app
from distscrape_celery.local.embedded import find_redis_server
from distscrape_celery.errors import TrackerUnavailable
from distscrape_celery.job.spec import build_spec
from distscrape_celery.tracker.keys import JobKeys
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.worker.publish import publisher
from distscrape_celery.tracker import LeaseStatus, RedisTracker

CLK_TCK = os.sysconf("SC_CLK_TCK")
LEASE = 2.0
# The workers' Redis reads time out after SOCKET_TIMEOUT s (DISTSCRAPE_REDIS_SOCKET_TIMEOUT); an
# outage lasts three times that, so every connection times out or is refused, and is made again,
# while Redis is away.
SOCKET_TIMEOUT = 5.0
OUTAGE = 3 * SOCKET_TIMEOUT
# CPU the two workers (main process, pool processes) may burn while Redis is away for OUTAGE s.
MAX_OUTAGE_CPU = 0.1 * OUTAGE


class AofRedis:
    """A ``redis-server`` with AOF (fsync every second) in ``directory``, on a fixed port, with a
    password. It can be stopped cleanly, killed, frozen and started again on the same port and
    directory, so that it comes back with what its AOF holds."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.binary = find_redis_server()
        self.password = secrets.token_hex(8)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://:{self.password}@127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "AofRedis":
        conf = self.dir / "redis.conf"  # the password in a file, not on the command line
        conf.write_text(f"requirepass {self.password}\n")
        self.proc = subprocess.Popen(
            [
                self.binary, str(conf), "--port", str(self.port), "--bind", "127.0.0.1",
                "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
                "--maxmemory-policy", "noeviction", "--dir", str(self.dir),
                "--logfile", str(self.dir / "redis.log"), "--daemonize", "no",
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 30
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited: {self.log_tail()}")
                try:
                    client.ping()
                    return self
                except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"redis-server did not come up: {self.log_tail()}")
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM is a clean shutdown (the AOF is complete); SIGKILL loses up to its last second."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a frozen server cannot act on SIGTERM
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def freeze(self) -> None:
        """SIGSTOP: connections are accepted by the kernel but never answered, like a partition."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def log_tail(self) -> str:
        try:
            return (self.dir / "redis.log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"


@pytest.fixture
def aof_redis(tmp_path):
    server = AofRedis(tmp_path / "redis").start()
    yield server
    server.stop()


def group_cpu(pgid: int) -> float:
    """CPU seconds (user + system) used so far by every live process of process group ``pgid``
    (a worker runs in its own session, so that is its main process and its pool processes)."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                # Fields after "(comm)": state ppid pgrp ... utime(14th) stime(15th) overall.
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def workers_cpu(procs) -> float:
    return sum(group_cpu(p.proc.pid) for p in procs)


def start_crawl(aof_redis, workers, tmp_path, server, job):
    settings = crawl_settings(aof_redis.url, lease_seconds=LEASE, redis_socket_timeout=SOCKET_TIMEOUT)
    tracker = RedisTracker.from_url(aof_redis.url)
    procs = [workers(settings, f"{job}-a", concurrency=2), workers(settings, f"{job}-b", concurrency=2)]
    wait_for_workers(tracker, 2, procs=procs)
    configure_app(settings)
    spec = build_spec({"seeds": [server.url("/")], "saver": {"output": str(tmp_path / "out")}})
    CrawlManager(tracker, publisher.scrape).seed(job, spec)
    return tracker, procs


def wait_done(tracker, job, at_least, procs, timeout=60):
    deadline = time.monotonic() + timeout
    while (stats := tracker.stats(job)).done < at_least:
        assert not stats.finished, "the crawl finished before the fault"
        assert time.monotonic() < deadline, f"{job}: {stats}"
        for p in procs:
            p.check()
        time.sleep(0.05)


def wait_finished(tracker, job, timeout, procs):
    """Like CrawlManager.wait, but patient while Redis comes back."""
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
    raise AssertionError(
        f"{job} did not finish within {timeout}s: {tracker.stats(job)} {stuck}\n"
        + "\n".join(p.log_tail(3000) for p in procs)
    )


def assert_survived(procs, tracker, job, site, server, tmp_path, stats, aof_redis, *, noticed=True):
    """Every page saved, nothing dead, both workers alive and never past an unrecoverable error."""
    n = len(site.reachable)
    assert (stats.done, stats.dead, stats.seen) == (n, 0, n), tracker.dead_items(job)
    out = tmp_path / "out"
    assert saved_files(out) == expected_files(server, site, out)
    for p in procs:
        assert p.proc.poll() is None, p.log_tail()
        log = p.log_path.read_text(errors="replace")
        # ("CRITICAL Couldn't ack" lines are expected while Redis is away: those messages come
        # again after the reconnect and their tasks find the items done.)
        assert "Unrecoverable error" not in log, log[-5000:]
        assert aof_redis.password not in log  # never logged the password
        assert re.search(r"connected to Redis at redis://:\*\*\*@127\.0\.0\.1:\d+/0", log), log[:3000]
        # A refused or reset connection is noticed; a frozen server may only look slow to the
        # broker connection until it answers again.
        if noticed:
            assert "Connection to broker lost" in log


def test_redis_restart_mid_crawl(aof_redis, workers, tmp_path):
    """Redis stopped cleanly (its AOF complete) for 8 s and started again on the same port and
    directory: the workers reconnect by themselves and the crawl finishes with every page."""
    site = generate_site(n_pages=120, seed=21, unreachable=0)
    with SiteServer(site, delay=0.05) as server:
        tracker, procs = start_crawl(aof_redis, workers, tmp_path, server, "restart")
        wait_done(tracker, "restart", 30, procs)
        aof_redis.stop(signal.SIGTERM)
        time.sleep(8)
        for p in procs:
            p.check()
        aof_redis.start()
        assert tracker.stats("restart").done >= 30  # it came back with the crawl's state
        stats = wait_finished(tracker, "restart", 120, procs)
    assert_survived(procs, tracker, "restart", site, server, tmp_path, stats, aof_redis)


def reclaimed(procs) -> int:
    """Items the workers' heartbeat threads reclaimed after their leases expired."""
    pattern = re.compile(r"reclaimed (\d+) expired item")
    return sum(
        int(m.group(1)) for p in procs
        for m in pattern.finditer(p.log_path.read_text(errors="replace"))
    )


def ghost_lease(url, job) -> str:
    """Lease a dispatched item of ``job`` for LEASE s to a worker that never beats again."""
    tracker = RedisTracker.from_url(url, lease_seconds=LEASE)
    client = tracker.client
    ghost = tracker.register_worker("ghost", 0, 1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for item in client.zrange(JobKeys(job).dispatched, 0, -1):
            co = tracker.checkout(job, item, ghost, max_lost=5)
            publisher.scrape(job, co.dispatch)
            if co.status is LeaseStatus.OK:
                return item
        time.sleep(0.01)
    raise AssertionError("no dispatched item to lease")


def test_redis_frozen_mid_crawl_past_the_socket_timeout(aof_redis, workers, tmp_path):
    """Redis frozen (SIGSTOP) for three socket timeouts: connections hang instead of failing.
    The workers neither crash nor spin, and when Redis answers again the leases that expired
    meanwhile (on Redis's clock) are reclaimed and the crawl finishes with every page.
    A live worker extends the expired leases of the pages it still holds at its first heartbeat,
    and may do so before any maintenance runs; so one lease is held by a worker that never comes
    back, which only a reclaim brings back."""
    site = generate_site(n_pages=120, seed=22, unreachable=0)
    with SiteServer(site, delay=0.05) as server:
        tracker, procs = start_crawl(aof_redis, workers, tmp_path, server, "frozen")
        wait_done(tracker, "frozen", 30, procs)
        ghost_lease(aof_redis.url, "frozen")
        reclaimed_before = reclaimed(procs)
        cpu_before = workers_cpu(procs)
        assert cpu_before > 0.5  # the meter sees the workers (they used CPU to start and crawl)
        aof_redis.freeze()
        time.sleep(OUTAGE)
        cpu_during = workers_cpu(procs) - cpu_before
        for p in procs:
            p.check()
        aof_redis.thaw()
        stats = wait_finished(tracker, "frozen", 150, procs)
    print(f"\nworker CPU during the {OUTAGE:.0f} s freeze: {cpu_during:.2f} s; "
          f"reclaimed after it: {reclaimed(procs) - reclaimed_before}")
    assert cpu_during < MAX_OUTAGE_CPU, f"workers spun while Redis was away: {cpu_during:.1f} s of CPU"
    assert reclaimed(procs) > reclaimed_before, "no expired lease was reclaimed after the freeze"
    assert_survived(procs, tracker, "frozen", site, server, tmp_path, stats, aof_redis, noticed=False)


def test_redis_killed_and_down_mid_crawl_past_the_socket_timeout(aof_redis, workers, tmp_path):
    """Redis killed (SIGKILL: the last second of its AOF may be lost) and away for three socket
    timeouts, so every connection attempt is refused at once: the workers retry without
    spinning, and once it is back the crawl finishes with every page."""
    site = generate_site(n_pages=120, seed=23, unreachable=0)
    with SiteServer(site, delay=0.05) as server:
        tracker, procs = start_crawl(aof_redis, workers, tmp_path, server, "killed")
        wait_done(tracker, "killed", 30, procs)
        aof_redis.stop(signal.SIGKILL)
        cpu_before = workers_cpu(procs)
        time.sleep(OUTAGE)
        cpu_during = workers_cpu(procs) - cpu_before
        for p in procs:
            p.check()
        aof_redis.start()
        stats = wait_finished(tracker, "killed", 150, procs)
    print(f"\nworker CPU while Redis was down {OUTAGE:.0f} s: {cpu_during:.2f} s")
    assert cpu_during < MAX_OUTAGE_CPU, f"workers spun while Redis was away: {cpu_during:.1f} s of CPU"
    assert_survived(procs, tracker, "killed", site, server, tmp_path, stats, aof_redis)
