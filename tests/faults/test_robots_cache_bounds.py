"""What a hostile site can cost the shared robots.txt cache: one record per origin whatever user
info or default port its redirects name, a record cut to its cap however large the file (its rules
before the cut still holding), no robots.txt fetched where a redirect leaves the job's hosts, and
the whole cache within its bound over many hosts. Real HTTP on 127.0.0.1, real Redis (and the
in-memory store of ``--in-memory``)."""

from __future__ import annotations

import gzip

import pytest
import redis

from distscrape_celery.core.runtime import Runtime
from distscrape_celery.errors import FetchError
from distscrape_celery.job.spec import build_spec
from distscrape_celery.scrapers import SimpleScraper
from distscrape_celery.tracker import keys
from distscrape_celery.web.fetch import Fetcher
from distscrape_celery.web.robots import DISALLOWED, RobotsCache, robots_origin
from distscrape_celery.web.robots_record import MAX_ROBOTS_RECORD_BYTES
from distscrape_celery.web.robots_stores import MemoryRobotsStore, RedisRobotsStore
from distscrape_celery.web.scope import LinkScope
from tests.support.pipeline import crawl_inline
from tests.support.crawl import crawl_settings
from tests.support.guard import public_test_hooks
from tests.support.http import reply, serve
from tests.support.robots import store  # noqa: F401  (a fixture)

HTML = {"Content-Type": "text/html"}
GZIP_TEXT = {"Content-Type": "text/plain", "Content-Encoding": "gzip"}
HEAD = 500 * 1024  # what is read of a robots.txt


def robots_records(client: redis.Redis) -> dict[str, int]:
    """Every robots.txt record in Redis (a key about robots.txt with a TTL that is not a fetch's
    claim), by key, with its size."""
    found = {}
    for key in client.scan_iter("ds:*robots*"):
        name = key.decode() if isinstance(key, bytes) else key
        if "fetch" in name.split(":")[:3] or client.type(key) not in (b"string", "string"):
            continue
        if client.pttl(key) > 0:
            found[name] = client.strlen(key)
    return found


def hostile_robots() -> bytes:
    """A robots.txt of nearly 500 KiB: a large group for another robot, then the ``*`` group,
    whose rules pass 64 KiB long before /late/ is disallowed, near the end of the file."""
    other = b"User-agent: OtherBot\nDisallow: /other-only/\n" + b"".join(
        b"Disallow: /o%06d/\n" % n for n in range(9_000))
    ours = b"User-agent: *\nDisallow: /private/\n" + b"".join(
        b"Disallow: /p%06d/\n" % n for n in range(12_000))
    body = other + ours
    body += b"# padding\n" * ((HEAD - len(body) - 40) // 10) + b"Disallow: /late/\n"
    assert HEAD - 100 < len(body) <= HEAD
    return body




def test_redirects_through_user_info_share_one_robots_record(redis_url, tmp_path):
    """A page redirects 5 times, each hop naming other user info: one robots.txt fetch, one
    record, and the page is saved. (Case and a default port name one origin as well.)"""
    assert robots_origin("HTTP://u:p@Example.COM:80/x") == robots_origin("http://example.com/")
    hits = []
    routes: dict = {"/robots.txt": lambda h: (hits.append(1), reply(h, 200, b"User-agent: *\n"
                                                                       b"Disallow: /private/\n"))}
    with serve(routes) as (base, _, _log):
        port = base.rsplit(":", 1)[1]
        for n in range(5):
            target = f"http://u{n} x@127.0.0.1:{port}/r{n + 1}"
            routes[f"/r{n}"] = lambda h, t=target: reply(h, 302, headers={"Location": t})
        routes["/r5"] = lambda h: reply(h, 200, b"<html>arrived</html>", HTML)
        spec = build_spec({"seeds": [base + "/r0"], "max_retries": 0,
                           "saver": {"output": str(tmp_path / "o")}})
        rt = Runtime.for_redis(crawl_settings(redis_url, lease_seconds=30))
        stats = crawl_inline(rt, "userinfo", spec)
    client = redis.Redis.from_url(redis_url)
    records = robots_records(client)
    client.close()
    assert len(records) == 1 and next(iter(records)).endswith(f":{base}"), records
    assert len(hits) == 1
    assert stats.done == 1 and stats.dead == 0, rt.tracker.dead_items("userinfo")


def test_a_500_kib_gzip_robots_txt_is_kept_cut_to_the_record_cap(store, redis_url):
    """A 500 KiB robots.txt served gzipped (a few kB on the wire): the record holds only the
    groups for the job's user agent and is cut at MAX_ROBOTS_RECORD_BYTES; the rules before the
    cut hold, those after it do not. A job of another user agent gets its own group."""
    body = gzip.compress(hostile_robots(), 9)
    assert len(body) < 60_000
    hits = []
    routes = {"/robots.txt": lambda h: (hits.append(1), reply(h, 200, body, GZIP_TEXT))}
    with serve(routes) as (base, _, _log):
        ours = RobotsCache.from_spec(build_spec({"seeds": [base + "/"]}), store)
        with pytest.raises(FetchError, match=DISALLOWED):
            ours.check(base + "/private/x")
        assert not ours.allowed(base + "/p000100/x")  # well before the cut
        assert ours.allowed(base + "/p011999/x")  # after the cut: not kept
        assert ours.allowed(base + "/late/x")
        assert ours.allowed(base + "/other-only/x")  # another robot's group
        other = RobotsCache.from_spec(
            build_spec({"seeds": [base + "/"], "fetch": {"user_agent": "OtherBot/2.0"}}), store)
        assert not other.allowed(base + "/other-only/x")
        assert other.allowed(base + "/private/x")  # OtherBot's own group wins over "*"
    assert len(hits) == 2  # one fetch per user agent
    if isinstance(store, RedisRobotsStore):
        sizes = robots_records(store.client)
        assert len(sizes) == 2 and max(sizes.values()) <= MAX_ROBOTS_RECORD_BYTES, sizes
    else:
        assert len(store) == 2
        assert all(len(record.encode()) <= MAX_ROBOTS_RECORD_BYTES
                   for _, record, _ in store._records.values())


def test_a_redirect_off_the_jobs_hosts_fetches_nothing_there(redis_url, tmp_path):
    """The seed's page redirects to another host (a "public" name served on 127.0.0.1, which the
    guard lets through): the item ends dead with the scope in its reason, and that host gets no
    request, not even for its robots.txt."""
    with serve({"/x": lambda h: reply(h, 200, b"elsewhere", HTML)}) as (other, _, other_log):
        other_port = other.rsplit(":", 1)[1]
        target = f"http://other.invalid:{other_port}/x"
        routes = {"/go": lambda h: reply(h, 302, headers={"Location": target})}
        with serve(routes) as (base, _, log):
            port = base.rsplit(":", 1)[1]
            seed = f"http://site.invalid:{port}/go"
            spec = build_spec({"seeds": [seed], "max_retries": 0,
                               "saver": {"output": str(tmp_path / "o")}})
            rt = Runtime.for_redis(crawl_settings(redis_url, lease_seconds=30))
            hooks = public_test_hooks({"site.invalid": "127.0.0.1", "other.invalid": "127.0.0.1"})
            rt.preset_context("scope", spec,
                              scraper=SimpleScraper(LinkScope.from_spec(spec), Fetcher.for_job(spec, **hooks)),
                              robots=RobotsCache.from_spec(spec, rt.robots_store, **hooks))
            crawl_inline(rt, "scope", spec)
    assert other_log == []
    dead = rt.tracker.dead_items("scope")
    assert list(dead) == [seed]
    assert f"redirect to {target} leaves the job's hosts" in dead[seed]
    assert sorted(e["path"] for e in log) == ["/go", "/robots.txt"]


BOUND = 1024 * 1024


@pytest.mark.parametrize("kind", ["redis", "memory"])
def test_the_robots_cache_stays_within_its_bound_over_many_hosts(kind, redis_url):
    """40 hosts (names served on 127.0.0.1) each serve a 500 KiB robots.txt: a store bounded to
    1 MiB holds at most that, counted with the records' names, and keeps the latest hosts."""
    body = gzip.compress(hostile_robots(), 9)
    routes = {"/robots.txt": lambda h: reply(h, 200, body, GZIP_TEXT)}
    client = redis.Redis.from_url(redis_url)
    store = RedisRobotsStore(client, max_bytes=BOUND) if kind == "redis" else MemoryRobotsStore(BOUND)
    hosts = [f"h{n}.invalid" for n in range(40)]
    with serve(routes) as (base, _, log):
        port = base.rsplit(":", 1)[1]
        hooks = public_test_hooks({host: "127.0.0.1" for host in hosts})
        cache = RobotsCache.from_spec(
            build_spec({"seeds": [f"http://{hosts[0]}:{port}/"]}), store, **hooks)
        for host in hosts:
            assert not cache.allowed(f"http://{host}:{port}/private/x")
            if kind == "redis":
                sizes = robots_records(client)
                assert sum(sizes.values()) <= BOUND, (host, len(sizes))
                assert int(client.get(keys.ROBOTS_BYTES)) <= BOUND
            else:
                assert store.bytes <= BOUND
    assert len(log) == 40
    latest = cache.name(f"http://{hosts[-1]}:{port}")
    assert store.get(latest) is not None  # the newest record is kept
    held = len(robots_records(client)) if kind == "redis" else len(store)
    assert 8 <= held <= BOUND // (60 * 1024), held
    client.close()
