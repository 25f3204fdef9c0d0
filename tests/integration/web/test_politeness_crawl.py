"""Politeness through real `celery worker` processes, real Redis and real HTTP on 127.0.0.1,
measured by the servers' own request timestamps."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import pytest

from tests.support.crawl import check_all, crawl_settings
from tests.support.http import RouteServer

from distscrape_celery.worker.app import configure_app
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.worker.publish import publisher
from distscrape_celery.tracker import RedisTracker

# (status, body, extra headers, seconds to wait before answering)
Response = tuple[int, bytes, dict, float]


def times(server: RouteServer, path: str | None = None) -> list[float]:
    """When the server received the requests for pages (for ``path``), in order. robots.txt,
    fetched once per host outside the domain's pacing (see the README's Known limits), is not a
    page."""
    return sorted(t for t, p in server.log if (p == path if path else p != "/robots.txt"))


@pytest.fixture
def sites():
    with contextlib.ExitStack() as stack:
        yield lambda respond: stack.enter_context(RouteServer(respond))


def fan_out(pages: int, delay: float = 0.0) -> Callable[[str, int], Response]:
    """A root linking to ``pages`` leaves, each answered after ``delay``."""
    root = "".join(f'<a href="/p{i}">{i}</a>' for i in range(pages)).encode()

    def respond(path: str, n: int) -> Response:
        if path == "/":
            return 200, root, {}, 0.0
        if path.startswith("/p") and path[2:].isdigit() and int(path[2:]) < pages:
            return 200, b"leaf", {}, delay
        return 404, b"", {}, 0.0

    return respond


@pytest.fixture
def crawl(redis_url, tmp_path, start_worker):
    """Start two real workers (concurrency 3 each), seed a job, wait for it to finish."""

    def run(job: str, seeds: list[str], timeout: float = 120, **spec):
        settings = crawl_settings(redis_url, lease_seconds=30)
        tracker = RedisTracker.from_url(redis_url)
        procs = [start_worker(settings, f"{job}-{i}", concurrency=3) for i in range(2)]
        wait_for_workers(tracker, 2, procs=procs)
        configure_app(settings)
        manager = CrawlManager(tracker, publisher.scrape)
        manager.seed(job, build_spec(
            {"seeds": seeds, "saver": {"output": str(tmp_path / job)}, "scraper": {"same_host": False},
             **spec}
        ))
        return manager.wait(job, timeout=timeout, check=check_all(procs))

    return run


def test_rate_limit_holds_across_two_workers(sites, crawl):
    site = sites(fan_out(40))
    stats = crawl("rate", [site.base + "/"], politeness={"max_rate": 5})
    assert (stats.done, stats.dead) == (41, 0)
    t = times(site)
    assert len(t) == 41  # each page once
    # At 5 requests/s no 1-second window holds more than 5: any 6 in a row span a second or
    # more (less a tolerance for the time between the tracker granting a fetch and its arrival).
    spans = [b - a for a, b in zip(t, t[5:])]
    assert min(spans) >= 1.0 - 0.15, min(spans)
    assert t[-1] - t[0] >= 40 / 5 - 0.15  # 40 gaps of at least 0.2 s each (same tolerance)


def test_robots_crawl_delay_paces_the_domain_across_two_workers(sites, crawl):
    pages = fan_out(8)

    def respond(path: str, n: int) -> Response:
        if path == "/robots.txt":
            return 200, b"User-agent: *\nCrawl-delay: 0.5\n", {"Content-Type": "text/plain"}, 0.0
        return pages(path, n)

    site = sites(respond)
    stats = crawl("delayed", [site.base + "/"])  # no max_rate: robots.txt alone paces it
    assert (stats.done, stats.dead) == (9, 0)
    t = times(site)
    assert len(t) == 9
    # The root is fetched before its robots.txt's delay is known; from then on one fetch per
    # 0.5 s, whichever worker makes it (less the same tolerance as the rate test).
    gaps = [b - a for a, b in zip(t[1:], t[2:])]
    assert min(gaps) >= 0.5 - 0.15, gaps


def test_a_slow_site_does_not_starve_a_fast_one(sites, crawl):
    # The slow site's leaves hang until the fast site has served all of its own (at most 30 s),
    # then take 0.5 s each: with six worker slots and at most two on the slow site, the fast
    # site's pages must all come while two slow requests hang, however slow the machine is.
    fast_pages, lock = fan_out(20), threading.Lock()
    fast_served, fast_leaves = threading.Event(), []
    slow_pages, waits = fan_out(20, delay=0.5), []

    def fast_respond(path: str, n: int) -> Response:
        if path.startswith("/p"):
            with lock:
                fast_leaves.append(path)
                if len(set(fast_leaves)) == 20:
                    fast_served.set()
        return fast_pages(path, n)

    def slow_respond(path: str, n: int) -> Response:
        if path.startswith("/p"):
            waits.append(fast_served.wait(30))
        return slow_pages(path, n)

    slow, fast = sites(slow_respond), sites(fast_respond)
    stats = crawl("two", [slow.base + "/", fast.base + "/"],
                  politeness={"per_domain_concurrency": 2})
    assert (stats.done, stats.dead) == (42, 0)
    assert all(waits), "the fast site was not done 30 s after a slow request came"
    fast_done = times(fast)[-1]
    slow_by_then = sum(1 for t in times(slow) if t <= fast_done)
    assert slow_by_then <= 3, slow_by_then  # the root and the two requests that hang
    # Never more than two of the slow site's requests in flight at once.
    starts = times(slow)[1:]  # the root answers at once
    assert all(b - a >= 0.5 - 0.1 for a, b in zip(starts, starts[2:])), starts


def test_500_then_200_ends_done(sites, crawl):
    def respond(path: str, n: int) -> Response:
        if path == "/":
            return 200, b'<a href="/flaky">f</a>', {}, 0.0
        if path == "/flaky":
            return (500, b"oops", {}, 0.0) if n == 0 else (200, b"fine", {}, 0.0)
        return 404, b"", {}, 0.0

    site = sites(respond)
    stats = crawl("flaky", [site.base + "/"], politeness={"backoff_base": 0.2})
    assert (stats.done, stats.dead) == (2, 0)
    assert len(times(site, "/flaky")) == 2


def test_429_retry_after_is_honoured(sites, crawl):
    def respond(path: str, n: int) -> Response:
        if path == "/":
            return 200, b'<a href="/busy">b</a>', {}, 0.0
        if path == "/busy":
            return (429, b"slow down", {"Retry-After": "2"}, 0.0) if n == 0 else (200, b"ok", {}, 0.0)
        return 404, b"", {}, 0.0

    site = sites(respond)
    stats = crawl("busy", [site.base + "/"], politeness={"backoff_base": 0.1})
    assert (stats.done, stats.dead) == (2, 0)
    first, second = times(site, "/busy")
    assert second - first >= 2.0, second - first  # measured by the server


def test_max_pages_stops_the_crawl_at_the_count(sites, crawl):
    site = sites(fan_out(40))
    stats = crawl("ten", [site.base + "/"], politeness={"max_pages": 10})
    assert (stats.seen, stats.done, stats.dead) == (10, 10, 0)
    assert len(times(site)) == 10


def test_crawl_delay_goes_to_the_tracker_once_per_process_not_per_page(sites, crawl, redis_url):
    """Passing robots.txt's Crawl-delay on to the tracker is one command per worker process and
    domain; it used to be one more Redis round trip for every page."""
    import threading

    import redis

    site = sites(fan_out(30))
    sent: list[list[str]] = []
    stop = threading.Event()
    client = redis.Redis.from_url(redis_url, decode_responses=True)

    def read() -> None:
        with client.monitor() as monitor:
            for command in monitor.listen():
                if stop.is_set():
                    return
                if command.get("client_type") != "lua":  # only what clients send
                    sent.append(command["command"].split())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        stats = crawl("delay-once", [site.base + "/"])
    finally:
        stop.set()
        client.ping()  # one more command, so that the reader sees the flag
        reader.join(10)
    assert (stats.done, stats.dead) == (31, 0)
    delay_commands = [c for c in sent if c[0].upper() in ("HSET", "HDEL") and "delay:" in " ".join(c)]
    # Two workers of three pool processes each: at most one per process, whatever the pages.
    assert 1 <= len(delay_commands) <= 6, delay_commands
