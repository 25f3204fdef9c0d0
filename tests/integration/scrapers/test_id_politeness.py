"""An ID is fetched from the job's download host, so the politeness of that host holds for every
ID, whatever its shape: one shaped ``a://x1`` is not a domain of its own. Checked in the tracker's
Lua (on InMemoryTracker and on RedisTracker against a real Redis, unsharded and sharded) and
through a crawl of real worker processes, measured by the download host's own count of requests in
flight."""

from __future__ import annotations

import json
import threading
import time

import pytest

from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.tracker import InMemoryTracker, LeaseStatus, RedisTracker, keys
from distscrape_celery.worker.app import configure_app
from distscrape_celery.worker.publish import publisher
from tests.support.crawl import crawl_settings
from tests.support.http import RouteServer

DOWNLOAD_HOST = "127.0.0.1:8080"
FMT = f"http://{DOWNLOAD_HOST}/item/{{}}"
# IDs as a hostile listing names them: six shaped like URLs of six schemes' "hosts", other shapes
# that are no http(s) URL, and plain ones.
SHAPED = [f"a://x{i}" for i in range(1, 7)]
IDS = SHAPED + ["x-a:///", "mailto:x@y.invalid", "//h.invalid/x", "B://x1", "7", "8"]


def ids_spec(shards: int = 1, **politeness):
    return build_spec({
        "seeds": ["7"], "tracker": {"shards": shards},
        "scraper": {"kind": "ids", "id_regex": r"\S+", "download_url_fmt": FMT},
        "politeness": {"per_domain_concurrency": 2, **politeness},
    })


@pytest.fixture(params=["memory", "redis", "redis-4-shards"])
def tracker_kind(request):
    """(tracker, shards): InMemoryTracker (the Redis scripts on a fake Redis), or RedisTracker
    on a real Redis with the job in one shard or spread over four."""
    if request.param == "memory":
        return InMemoryTracker(bound_refresh_seconds=0), 1
    url = request.getfixturevalue("redis_url")
    shards = 4 if "shards" in request.param else 1
    return RedisTracker.from_url(url, bound_refresh_seconds=0), shards


def start_job(t, shards: int, **politeness) -> str:
    spec = ids_spec(shards, **politeness)
    t.create_job("ids", spec.to_json(), spec.crawl_limits())
    return t.register_worker("host", 1, 16)  # broker room for far more than two items


def test_ids_shaped_like_urls_are_leased_at_most_two_at_a_time_under_a_cap_of_two(tracker_kind):
    """With per_domain_concurrency = 2 the tracker never has more than two IDs dispatched or
    leased at once, however they are shaped, and every one of them is fetched in turn."""
    t, shards = tracker_kind
    w = start_job(t, shards)
    dispatched = list(t.add("ids", IDS).dispatch)
    leased: dict[str, int] = {}  # item -> token, oldest first
    finished: list[str] = []
    peak = 0

    def in_flight() -> int:
        nonlocal peak
        peak = max(peak, len(dispatched) + len(leased))
        return len(dispatched) + len(leased)

    assert in_flight() <= 2, dispatched
    while dispatched or leased:
        while dispatched:
            item = dispatched.pop(0)
            co = t.checkout("ids", item, w, max_lost=1)
            assert co.status is LeaseStatus.OK, (item, co)
            leased[item] = co.token
            dispatched += co.dispatch
            assert in_flight() <= 2, (leased, dispatched)
        item, token = next(iter(leased.items()))  # the oldest fetch ends; its place is free
        del leased[item]
        dispatched += t.scraped("ids", item, token).dispatch
        dispatched += t.complete("ids", item, token).dispatch
        finished.append(item)
        assert in_flight() <= 2, (leased, dispatched)
    assert sorted(finished) == sorted(IDS) and peak == 2


def test_ids_shaped_like_urls_count_against_the_download_hosts_page_limit(tracker_kind):
    """max_pages_per_domain = 3 takes three IDs in all, not three per scheme-shaped 'host'."""
    t, shards = tracker_kind
    start_job(t, shards, max_pages_per_domain=3)
    assert t.add("ids", IDS).added == 3
    assert t.stats("ids").seen == 3


def test_ids_shaped_like_urls_wait_for_the_download_hosts_fetch_slot(tracker_kind):
    """With max_rate (here one fetch per 1000 s) one ID is handed out, and no other until the
    download host's next slot, however the others are shaped."""
    t, shards = tracker_kind
    w = start_job(t, shards, max_rate=0.001)
    (first,) = t.add("ids", IDS).dispatch
    co = t.checkout("ids", first, w, max_lost=1)
    assert co.status is LeaseStatus.OK and co.dispatch == []
    assert t.scraped("ids", first, co.token).dispatch == []
    assert t.complete("ids", first, co.token).dispatch == []


# Items, and the domain each is fetched from in a job whose download host is DOWNLOAD_HOST.
DOMAIN_RULE = [
    ("a://x1", DOWNLOAD_HOST), ("A://X1", DOWNLOAD_HOST), ("x-a:///", DOWNLOAD_HOST),
    ("x-a:///\x1b]0;t\x07", DOWNLOAD_HOST), ("mailto:x@y.invalid", DOWNLOAD_HOST),
    ("//h.invalid/x", DOWNLOAD_HOST), ("ftp://h.invalid/x", DOWNLOAD_HOST),
    ("http\u017f://s.invalid/", DOWNLOAD_HOST), ("https:s.invalid", DOWNLOAD_HOST),
    ("12345", DOWNLOAD_HOST), ("HTTP://Up.INVALID/a", "up.invalid"),
    ("hTtPs://u:p@s.invalid:8443/p?q=1#f", "s.invalid:8443"), ("http://[::1]:80/", "[::1]:80"),
    ("http://b.invalid?x=/y", "b.invalid"), (f"http://{DOWNLOAD_HOST}/item/7", DOWNLOAD_HOST),
]


def test_the_lua_domain_rule_gives_ids_the_download_hosts_domain_as_python_does(tracker_kind):
    """Each item lands in the queue of the domain the table names, in the shard of that domain
    (the tracker's Lua), and keys.domain_of names the same domain (the Python twin)."""
    t, shards = tracker_kind
    spec = ids_spec(shards)
    t.create_job("ids", spec.to_json(), spec.crawl_limits())  # no worker: nothing is dispatched
    assert t.add("ids", [item for item, _ in DOMAIN_RULE]).added == len(DOMAIN_RULE)
    for item, domain in DOMAIN_RULE:
        assert keys.domain_of(item, DOWNLOAD_HOST) == domain, item
        queue = keys.JobKeys("ids", keys.shard_of(domain, shards)).domain_queue(domain)
        assert item in t.client.lrange(queue, 0, -1), (item, domain)


class CountingSite:
    """A download host on 127.0.0.1 that serves a listing of ``ids`` at /list and every other
    path after ``seconds``, counting the requests it is answering at once (robots.txt aside)."""

    def __init__(self, ids: list[str], seconds: float, robots: bytes = b"") -> None:
        listing = json.dumps([{"id": i} for i in ids]).encode()
        lock = threading.Lock()
        self.now = self.peak = 0

        def respond(path: str, n: int):
            if path == "/robots.txt":
                if not robots:
                    return 404, b"", {}, 0
                return 200, robots, {"Content-Type": "text/plain"}, 0
            with lock:
                self.now += 1
                self.peak = max(self.peak, self.now)
            try:
                time.sleep(seconds)
                return 200, listing if path == "/list" else b"{}", {}, 0
            finally:
                with lock:
                    self.now -= 1

        self.server = RouteServer(respond)
        self.base = self.server.base

    def starts(self) -> list[float]:
        """When the pages (not robots.txt) were asked for, in order."""
        return sorted(t for t, p in self.server.log if p != "/robots.txt")


@pytest.fixture
def crawl_ids(redis_url, workers, tmp_path):
    """Two real workers of three threads each; ``crawl(job, site)`` crawls the IDs that
    ``site``'s listing names with per_domain_concurrency = 2 and returns the job's stats."""
    settings = crawl_settings(redis_url, lease_seconds=30)
    tracker = RedisTracker.from_url(redis_url)
    procs = [workers(settings, f"ids-polite-{i}", concurrency=3) for i in range(2)]
    wait_for_workers(tracker, 2, procs=procs)
    configure_app(settings)
    manager = CrawlManager(tracker, publisher.scrape)

    def crawl(job: str, site: CountingSite):
        manager.seed(job, build_spec({
            "seeds": [site.base + "/list"], "max_retries": 0,
            "scraper": {"kind": "ids", "id_regex": r'"id": "([^"]*)"',
                        "download_url_fmt": site.base + "/item/{}"},
            "saver": {"output": str(tmp_path / job)},
            "politeness": {"per_domain_concurrency": 2},
        }))

        def check():
            for p in procs:
                p.check()

        return manager.wait(job, timeout=120, check=check)

    return crawl


def test_a_crawl_keeps_the_download_hosts_cap_for_ids_shaped_like_urls(crawl_ids):
    """A listing names IDs shaped ``a://x1`` ... and others, each answered in 0.4 s: under
    per_domain_concurrency = 2 the download host never answers more than two requests at once,
    though six worker threads are free."""
    site = CountingSite(IDS, seconds=0.4)
    with site.server:
        stats = crawl_ids("ids-cap", site)
    assert (stats.done, stats.dead) == (len(IDS) + 1, 0)
    assert site.peak == 2, site.peak  # two at once, never more


def test_a_crawl_keeps_the_download_hosts_crawl_delay_for_ids_shaped_like_urls(crawl_ids):
    """The download host's robots.txt asks for a Crawl-delay of 0.5 s: no two of its requests
    start closer together, IDs shaped ``a://x1`` ... included."""
    ids = SHAPED + ["7"]
    site = CountingSite(ids, seconds=0.0, robots=b"User-agent: *\nCrawl-delay: 0.5\n")
    with site.server:
        stats = crawl_ids("ids-delay", site)
    assert (stats.done, stats.dead) == (len(ids) + 1, 0)
    starts = site.starts()
    assert len(starts) == len(ids) + 1
    # The listing is fetched as its robots.txt's delay becomes known; from then on one fetch per
    # 0.5 s (less a tolerance for the time between the tracker granting a fetch and its arrival).
    gaps = [b - a for a, b in zip(starts[1:], starts[2:])]
    assert min(gaps) >= 0.5 - 0.15, gaps
