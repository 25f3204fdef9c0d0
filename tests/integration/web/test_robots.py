"""robots.txt as each job must see it: a large file read to 500 KiB (Google's rule) and cut at a
line break, and a shared record that no job's user agent, limits or guard decides for another.
Real HTTP on 127.0.0.1, real Redis (and the in-memory store of ``--in-memory``)."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest
import redis

from tests.support.crawl import crawl_settings

from distscrape_celery.worker.app import configure_app
from distscrape_celery.errors import FetchError
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.web.robots import DISALLOWED, RobotsCache
from distscrape_celery.web.robots_stores import MemoryRobotsStore, RedisRobotsStore
from distscrape_celery.worker.publish import publisher
from distscrape_celery.tracker import RedisTracker, keys
from tests.support.http import reply, serve
from tests.support.guard import public_test_hooks
from tests.support.robots import store  # noqa: F401  (a fixture)

HEAD = 500 * 1024  # what Google reads of a robots.txt
TEXT = {"Content-Type": "text/plain"}


def big_robots(size: int = 600_000) -> bytes:
    """A robots.txt of ``size`` bytes whose first rule disallows /private/, whose 500 KiB mark
    falls inside ``Disallow: /abc`` (a cut there would leave ``Disallow: /``: everything), and
    which disallows /late/ only after that mark."""
    body = b"User-agent: *\nDisallow: /private/\n"
    line = b"# " + b"x" * 97 + b"\n"
    half = b"Disallow: /"
    while len(body) + len(line) + len(half) <= HEAD:
        body += line
    gap = HEAD - len(body) - len(half)
    if gap:
        body += b"#" * (gap - 1) + b"\n"
    body += half + b"abc\nDisallow: /late/\n"
    assert body.index(b"Disallow: /abc") + len(half) == HEAD
    while len(body) < size:
        body += line
    return body




def cache_for(base: str, store, hooks: dict | None = None, seeds: list[str] | None = None,
              **fetch) -> RobotsCache:
    spec = build_spec({"seeds": seeds or [base + "/"], "fetch": fetch})
    return RobotsCache.from_spec(spec, store, **(hooks or {}))


def test_oversized_robots_txt_is_read_to_500_kib_at_a_line_break(store):
    hits = []
    body = big_robots()
    routes = {"/robots.txt": lambda h: (hits.append(1), reply(h, 200, body, TEXT))}
    with serve(routes) as (base, _, _log):
        cache = cache_for(base, store)
        with pytest.raises(FetchError, match=DISALLOWED):
            cache.check(base + "/private/x")
        assert cache.allowed(base + "/other")  # the half rule at the mark was not read
        assert cache.allowed(base + "/late/x")  # after 500 KiB: ignored
        assert cache.allowed(base + "/abc")  # the line cut at the mark: dropped whole
    assert len(hits) == 1


def test_small_max_bytes_of_one_job_does_not_change_another_jobs_policy(store):
    body = b"User-agent: *\nDisallow: /private/\n" + b"# padding\n" * 300  # 3 KB
    routes = {"/robots.txt": lambda h: reply(h, 200, body, TEXT)}
    with serve(routes) as (base, _, _log):
        small = cache_for(base, store, max_bytes=1000)
        other = cache_for(base, store)
        # Pages of 1,000 bytes at most, but robots.txt is read to 500 KiB all the same.
        assert not small.allowed(base + "/private/x")
        assert not other.allowed(base + "/private/x")


def test_jobs_with_different_user_agents_get_their_own_answers(store):
    """Both the groups of one file and a site that answers each user agent its own way."""
    def robots(h):
        if "BadBot" in h.headers.get("User-Agent", ""):
            reply(h, 200, b"User-agent: *\nDisallow: /y\n", TEXT)
        else:
            reply(h, 200, b"User-agent: BadBot\nDisallow: /x\n\nUser-agent: *\nDisallow:\n", TEXT)

    with serve({"/robots.txt": robots}) as (base, _, log):
        good = cache_for(base, store, user_agent="GoodBot/1.0")
        bad = cache_for(base, store, user_agent="BadBot/2.0")
        assert good.allowed(base + "/x") and good.allowed(base + "/y")
        assert bad.allowed(base + "/x") and not bad.allowed(base + "/y")
        assert len(log) == 2  # one file per user agent
        # A file shared by user agents is still matched per job: one record, two answers.
        other = cache_for(base, store, user_agent="GoodBot/1.0", max_bytes=5000)
        assert other.allowed(base + "/x")
        assert len(log) == 2


def test_a_jobs_retry_period_does_not_hold_another_job(store):
    """An unreachable robots.txt is kept for the fetching job's robots_retry_seconds; a job that
    asks again sooner reads it again then, not when the other job would."""
    hits = []

    def robots(h):
        hits.append(1)
        if len(hits) == 1:
            reply(h, 503, b"down")
        else:
            reply(h, 200, b"User-agent: *\nDisallow: /private/\n", TEXT)

    with serve({"/robots.txt": robots}) as (base, _, _log):
        patient = cache_for(base, store, robots_retry_seconds=3600)
        eager = cache_for(base, store, robots_retry_seconds=0.3)
        with pytest.raises(FetchError, match="robots.txt unavailable"):
            patient.check(base + "/page")
        time.sleep(0.5)
        with pytest.raises(FetchError, match=DISALLOWED):
            eager.check(base + "/private/x")
    assert len(hits) == 2


def test_a_refused_robots_txt_is_not_shared_with_a_job_that_may_reach_it(store):
    """A job whose guard refuses the host (it is loopback, and not its seeds') must not leave an
    'allow everything' record for a job whose seeds are on that host."""
    routes = {"/robots.txt": lambda h: reply(h, 200, b"User-agent: *\nDisallow: /private/\n", TEXT)}
    with serve(routes) as (base, _, log):
        port = base.rsplit(":", 1)[1]
        hooks = public_test_hooks({"public.invalid": "127.0.0.1"})
        outsider = cache_for(base, store, hooks, seeds=[f"http://public.invalid:{port}/"])
        outsider.check(base + "/private/x")  # its own fetch of the page is refused anyway
        assert log == []
        owner = cache_for(base, store)
        with pytest.raises(FetchError, match=DISALLOWED):
            owner.check(base + "/private/x")


def test_a_record_of_the_old_layout_is_not_read(redis_client, redis_url):
    routes = {"/robots.txt": lambda h: reply(h, 200, b"User-agent: *\nDisallow: /private/\n", TEXT)}
    with serve(routes) as (base, _, log):
        redis_client.set(keys.robots(base), json.dumps({"allow": "exceeds max_bytes=524288"}))
        cache = cache_for(base, RedisRobotsStore(redis.Redis.from_url(redis_url)))
        assert not cache.allowed(base + "/private/x")
        assert [e["path"] for e in log] == ["/robots.txt"]


def test_parsed_files_are_bounded_by_their_bytes():
    """The process-wide cache of parsed files counts each by the memory its rules take."""
    from distscrape_celery.web.robots import _PARSED, PARSED_ROBOTS_BYTES

    store = MemoryRobotsStore()
    body = b"User-agent: *\n" + b"".join(b"Disallow: /p%d/\n" % n for n in range(20_000))
    routes = {"/robots.txt": lambda h: reply(h, 200, body, TEXT)}
    with serve(routes) as (base, _, _log):
        # Twenty jobs, each its own entry of ~4 MB reckoned (the record's 64 KiB of rules).
        for n in range(20):
            assert not cache_for(base, store, user_agent=f"bot{n}").allowed(base + "/p7/x")
    assert 0 < _PARSED.bytes <= PARSED_ROBOTS_BYTES
    assert len(_PARSED) < 20


def test_oversized_robots_txt_through_real_workers(redis_url, workers, tmp_path):
    """Two real workers crawl a site whose 600 KB robots.txt disallows /private/ first: the
    disallowed pages are never requested."""
    settings = crawl_settings(redis_url, lease_seconds=10)
    procs = [workers(settings, f"robots-{i}", concurrency=2) for i in range(2)]
    tracker = RedisTracker.from_url(redis_url)
    wait_for_workers(tracker, 2, procs=procs)
    configure_app(settings)
    counts: Counter = Counter()
    lock = threading.Lock()
    links = "".join(f'<a href="/private/{n}">p</a><a href="/page/{n}">q</a>' for n in range(6))
    body = big_robots()

    def counted(route):
        def handler(h):
            with lock:
                counts[h.path] += 1
            route(h)
        return handler

    page = lambda text: lambda h: reply(h, 200, text, {"Content-Type": "text/html"})  # noqa: E731
    routes = {"/robots.txt": lambda h: reply(h, 200, body, TEXT), "/": page(links.encode())}
    routes.update({f"/page/{n}": page(b"ok") for n in range(6)})
    routes.update({f"/private/{n}": page(b"secret") for n in range(6)})
    with serve({path: counted(route) for path, route in routes.items()}) as (base, _, _log):
        spec = build_spec({"seeds": [base + "/"], "saver": {"output": str(tmp_path / "out")}})
        manager = CrawlManager(tracker, publisher.scrape)
        manager.seed("bigrobots", spec)

        def alive():
            for p in procs:
                p.check()

        manager.wait("bigrobots", timeout=120, check=alive)
    dead = tracker.dead_items("bigrobots")
    assert set(dead) == {f"{base}/private/{n}" for n in range(6)}
    assert all(DISALLOWED in why for why in dead.values()), dead
    assert not [path for path in counts if path.startswith("/private/")]
    assert counts["/robots.txt"] == 1
    assert all(counts[f"/page/{n}"] == 1 for n in range(6))
