"""SIGKILL whole worker process groups mid-crawl: nothing may be lost, recovery takes ~a lease."""

from __future__ import annotations

import signal
import time

import pytest

from tests.support.crawl import crawl_settings, expected_files, registered_id, saved_files
from distscrape_celery.testing.sitegen import SiteServer

from distscrape_celery.worker.app import configure_app
from distscrape_celery.job.spec import build_spec
from distscrape_celery.tracker.keys import JobKeys
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.worker.publish import publisher
from distscrape_celery.tracker import RedisTracker

LEASE = 2.0
KILLS = 3


def holders(redis_client, job: str) -> set[str]:
    """IDs of the workers holding in-flight items of ``job`` (owners are "<worker> <token>")."""
    return {v.split()[0] for v in redis_client.hvals(JobKeys(job).owners)}


def _two_workers(redis_url, workers, first: str, second: str, pool: str = "prefork"):
    """Settings with a short lease, a tracker, and two registered workers; the app configured."""
    settings = crawl_settings(redis_url, lease_seconds=LEASE)
    tracker = RedisTracker.from_url(redis_url)
    procs = workers(settings, first, pool=pool), workers(settings, second, pool=pool)
    wait_for_workers(tracker, 2)
    configure_app(settings)
    return settings, tracker, procs


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_sigkill_workers_mid_crawl_loses_nothing(redis_url, redis_client, site, workers, tmp_path,
                                                 pool):
    """With the threads pool the tasks carry on from item to item, so a victim dies holding
    items that no message names."""
    settings, tracker, (victim, survivor) = _two_workers(redis_url, workers, "crash-0",
                                                         "crash-survivor", pool)
    # Celery's own redelivery would take the visibility timeout; recovery must not wait for it.
    assert settings.visibility_timeout >= 5 * LEASE
    n = len(site.reachable)
    out = tmp_path / "out"
    job = "crash"

    with SiteServer(site, delay=0.1) as server:  # slow enough to kill it three times
        spec = build_spec({"seeds": [server.url("/")], "saver": {"output": str(out)}})
        manager = CrawlManager(tracker, publisher.scrape)
        started = time.monotonic()
        manager.seed(job, spec)
        recoveries = []
        for kill in range(KILLS):
            victim_id = registered_id(tracker, victim)
            # Kill while the victim holds leases, at a different point of the crawl each time.
            target = n * (kill + 1) // (KILLS + 2)
            while tracker.stats(job).done < target or victim_id not in holders(redis_client, job):
                assert not tracker.stats(job).finished, "crawl finished before the kills"
                survivor.check()
                time.sleep(0.02)
            victim.kill(signal.SIGKILL)
            killed_at = time.monotonic()
            victim.proc.wait(10)
            victim = workers(settings, f"crash-{kill + 1}", pool=pool)
            # The dead worker's leases must be handed on within about one lease.
            while victim_id in holders(redis_client, job):
                assert time.monotonic() - killed_at < LEASE + 8, "leases of a dead worker not recovered"
                time.sleep(0.05)
            recoveries.append(time.monotonic() - killed_at)

        stats = manager.wait(job, timeout=120, check=survivor.check)
        elapsed = time.monotonic() - started

    assert (stats.done, stats.dead, stats.seen) == (n, 0, n)
    assert saved_files(out) == expected_files(server, site, out)
    assert sum(server.counts().values()) > n  # leased work of the killed workers was redone
    assert max(recoveries) <= LEASE + 3, recoveries
    carried = survivor.log_path.read_text(errors="replace").count(": carried on to: ")
    if pool == "threads":
        assert carried > 0
    else:  # its heartbeat, in the pool's parent, could not keep what a pool process carried
        assert carried == 0
    print(f"\ncrash test: {KILLS} kills, recoveries {[round(r, 2) for r in recoveries]} s, "
          f"whole crawl {elapsed:.1f} s, {sum(server.counts().values()) - n} refetches")


def test_frozen_worker_is_routed_around_and_its_late_work_is_harmless(
    redis_url, redis_client, site, workers, tmp_path
):
    """SIGSTOP a worker group (a hung host) for two leases, then let it go on: its items are done
    by others meanwhile, and what it finishes late changes nothing."""
    _, tracker, (frozen, survivor) = _two_workers(redis_url, workers, "frozen", "thawed-survivor")
    n = len(site.reachable)
    out = tmp_path / "out"

    with SiteServer(site, delay=0.05) as server:
        spec = build_spec({"seeds": [server.url("/")], "saver": {"output": str(out)}})
        manager = CrawlManager(tracker, publisher.scrape)
        manager.seed("freeze", spec)
        frozen_id = registered_id(tracker, frozen)
        while tracker.stats("freeze").done < n // 4 or frozen_id not in holders(redis_client, "freeze"):
            time.sleep(0.02)
        frozen.kill(signal.SIGSTOP)
        stopped_at = time.monotonic()
        while frozen_id in holders(redis_client, "freeze"):
            assert time.monotonic() - stopped_at < LEASE + 8, "a frozen worker kept its leases"
            time.sleep(0.05)
        time.sleep(LEASE)
        frozen.kill(signal.SIGCONT)
        stats = manager.wait("freeze", timeout=120, check=survivor.check)
        frozen.check()  # it woke up and lives on

    assert (stats.done, stats.dead, stats.seen) == (n, 0, n)
    assert saved_files(out) == expected_files(server, site, out)
