"""A site's budget shared across jobs, and politeness by address, through real `celery worker`
processes, real Redis and real HTTP on 127.0.0.1, measured by the server's own request
timestamps."""

from __future__ import annotations

import contextlib

import pytest

from tests.integration.web.test_politeness_crawl import fan_out, times
from tests.support.crawl import check_all, crawl_settings
from tests.support.http import RouteServer

from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.tracker import RedisTracker
from distscrape_celery.worker.app import configure_app
from distscrape_celery.worker.publish import publisher

# The time between the tracker granting a fetch and the request's arrival at the server varies
# by a few tens of milliseconds on a loaded machine: each measured span may be that much short.
TOLERANCE = 0.15


@pytest.fixture
def site():
    with contextlib.ExitStack() as stack:
        yield lambda respond: stack.enter_context(RouteServer(respond))


@pytest.fixture
def crawl_jobs(redis_url, tmp_path, start_worker):
    """Start two real workers (concurrency 3 each), seed every job of ``jobs`` (name -> seeds) at
    once with ``spec``, and wait until all of them finish."""

    def run(jobs: dict[str, list[str]], timeout: float = 180, **spec):
        settings = crawl_settings(redis_url, lease_seconds=30)
        tracker = RedisTracker.from_url(redis_url)
        procs = [start_worker(settings, f"shared-{i}", concurrency=3) for i in range(2)]
        wait_for_workers(tracker, 2, procs=procs)
        configure_app(settings)
        manager = CrawlManager(tracker, publisher.scrape)
        for job, seeds in jobs.items():
            manager.seed(job, build_spec(
                {"seeds": seeds, "saver": {"output": str(tmp_path / job)},
                 "scraper": {"same_host": False}, **spec}))
        return {job: manager.wait(job, timeout=timeout, check=check_all(procs)) for job in jobs}

    return run


def most_in_a_second(t: list[float]) -> float:
    """The shortest span of six requests in a row: at 5 requests/s, a second or more."""
    return min(b - a for a, b in zip(t, t[5:]))


def test_two_jobs_on_one_host_at_max_rate_5_stay_at_5_requests_a_second_together(
        site, crawl_jobs):
    server = site(fan_out(25))
    stats = crawl_jobs({"first": [server.base + "/"], "second": [server.base + "/"]},
                       politeness={"max_rate": 5})
    assert [(s.done, s.dead) for s in stats.values()] == [(26, 0), (26, 0)]
    t = times(server)
    assert len(t) == 52  # each job fetched each page once
    # Together, never more than 5 in any second: any 6 requests in a row span a second or more
    # (less the tolerance); alone, each job would have kept to 5 a second and the two to 10.
    assert most_in_a_second(t) >= 1.0 - TOLERANCE, most_in_a_second(t)
    assert t[-1] - t[0] >= 51 / 5 - TOLERANCE, t[-1] - t[0]  # 51 gaps of at least 0.2 s


def test_host_names_of_one_address_are_paced_as_one_with_key_ip(site, crawl_jobs):
    # Two names for one server: names under .localhost are the loopback addresses (RFC 6761),
    # which the seeds name, so the SSRF guard lets the job reach them; both resolve to
    # 127.0.0.1, where the server is.
    server = site(fan_out(12))
    port = server.base.rsplit(":", 1)[1]
    seeds = [f"http://one.localhost:{port}/", f"http://two.localhost:{port}/"]
    stats = crawl_jobs({"by-address": seeds}, politeness={"max_rate": 5, "key": "ip"})
    assert (stats["by-address"].done, stats["by-address"].dead) == (26, 0)
    t = times(server)
    assert len(t) == 26  # 13 pages under each name
    # One site at 5 requests/s, not two.
    assert most_in_a_second(t) >= 1.0 - TOLERANCE, most_in_a_second(t)
    assert t[-1] - t[0] >= 25 / 5 - TOLERANCE, t[-1] - t[0]


def test_host_names_of_one_address_are_two_sites_by_default(site, crawl_jobs):
    """The same crawl paced by host: two sites, each at 5 requests/s (what key "ip" changes)."""
    server = site(fan_out(12))
    port = server.base.rsplit(":", 1)[1]
    seeds = [f"http://one.localhost:{port}/", f"http://two.localhost:{port}/"]
    stats = crawl_jobs({"by-host": seeds}, politeness={"max_rate": 5})
    assert (stats["by-host"].done, stats["by-host"].dead) == (26, 0)
    t = times(server)
    assert len(t) == 26
    assert most_in_a_second(t) < 1.0 - 0.2, most_in_a_second(t)  # two sites at once: faster
