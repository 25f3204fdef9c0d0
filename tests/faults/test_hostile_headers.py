"""Numbers a site sends that are no numbers, or too large for one: Retry-After, Content-Length,
robots.txt's Crawl-delay and Request-rate. Each is refused or capped, never raised out of a
worker's call, and the item ends done or dead with a reason; a robots.txt fetch that raises anyway
ends its claim. Real HTTP on 127.0.0.1, real Redis, the real item pipeline."""

from __future__ import annotations

import time

import pytest
import redis

from distscrape_celery.core.runtime import Runtime
from distscrape_celery.errors import FetchError
from distscrape_celery.job.spec import build_spec
from distscrape_celery.tracker import keys
from distscrape_celery.tracker.keys import JobKeys, domain_of
from distscrape_celery.web.robots import MAX_CRAWL_DELAY, RobotsCache
from distscrape_celery.web.robots_stores import RedisRobotsStore
from tests.support.pipeline import crawl_inline
from tests.support.crawl import crawl_settings
from tests.support.guard import public_test_hooks
from tests.support.http import reply, serve
from tests.support.robots import store  # noqa: F401  (a fixture)

HTML = {"Content-Type": "text/html"}
TEXT = {"Content-Type": "text/plain"}
HUGE = "9" * 400


def crawl_one(redis_url, tmp_path, routes: dict, path: str, job: str, **spec) -> tuple[Runtime, str]:
    """Crawl the one page ``path`` of a site serving ``routes`` through the item pipeline, with
    no retries; returns the runtime and the page's URL."""
    with serve(routes) as (base, _, _log):
        spec = build_spec({"seeds": [base + path], "max_retries": 0,
                           "saver": {"output": str(tmp_path / "o")}, **spec})
        rt = Runtime.for_redis(crawl_settings(redis_url, lease_seconds=30))
        crawl_inline(rt, job, spec)
    return rt, base + path


@pytest.mark.parametrize("value, shown", [
    ("\u00b2", None),  # str.isdigit takes it, float() does not
    (HUGE, "86400s"),  # cut to a day, not "inf"
    ("-5", None), ("1.5", None), ("0x10", None),
    ("Mon, 01 Jan 99999 00:00:00 GMT", None),
    ("Wed, 21 Oct 2099 07:28:00 GMT", "86400s"),
])
def test_a_malformed_retry_after_is_absent_and_a_huge_one_is_capped(redis_url, tmp_path, value, shown):
    routes = {"/busy": lambda h: reply(h, 503, b"busy", {"Retry-After": value})}
    rt, url = crawl_one(redis_url, tmp_path, routes, "/busy", "retryafter")
    dead = rt.tracker.dead_items("retryafter")
    expected = f"HTTP 503 for {url}" + (f" (Retry-After {shown})" if shown else "")
    assert dead == {url: expected}


@pytest.mark.parametrize("value", ["\u00b2", HUGE, "1, 2", "-3", "0x10"])
def test_a_malformed_content_length_is_refused_or_ignored(redis_url, tmp_path, value):
    """Whatever the server claims the body's length is, the item ends done or dead with a
    reason of the fetcher's, not an exception's."""
    headers = {**HTML, "Content-Length": value, "Connection": "close"}
    routes = {"/page": lambda h: reply(h, 200, b"<html>short</html>", headers)}
    rt, url = crawl_one(redis_url, tmp_path, routes, "/page", "contentlength",
                        fetch={"read_timeout": 2, "total_timeout": 5})
    dead = rt.tracker.dead_items("contentlength")
    stats = rt.tracker.stats("contentlength")
    assert stats.done + stats.dead == 1
    # A reason of the pipeline's catch-all (an exception the fetcher let out) would start so.
    assert not [why for why in dead.values() if why.startswith(("download error", "scraper error"))]


@pytest.mark.parametrize("line, delay", [
    (f"Request-rate: 1/{HUGE}s", MAX_CRAWL_DELAY),  # seconds / requests overflows a float
    (f"Request-rate: {HUGE}/1s", None),  # a request every 1e-400 s: no delay
    (f"Crawl-delay: {HUGE}", None),  # not finite: ignored
    ("Crawl-delay: 1e308", MAX_CRAWL_DELAY),
    ("Crawl-delay: nan", None),
    ("Crawl-delay: -4", None),
])
def test_a_huge_or_malformed_crawl_delay_is_capped_or_ignored(redis_url, tmp_path, line, delay):
    robots = f"User-agent: *\n{line}\nDisallow: /private/\n".encode()
    routes = {"/robots.txt": lambda h: reply(h, 200, robots, TEXT),
              "/page": lambda h: reply(h, 200, b"<html>fine</html>", HTML)}
    rt, url = crawl_one(redis_url, tmp_path, routes, "/page", "delays")
    assert rt.tracker.dead_items("delays") == {}
    assert rt.tracker.stats("delays").done == 1
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    kept = client.hget(JobKeys("delays").policy, f"delay:{domain_of(url)}")
    client.close()
    assert (float(kept) if kept is not None else None) == delay




def claim_held(store, name: str) -> bool:
    """Whether someone holds the claim to fetch record ``name``'s robots.txt."""
    if isinstance(store, RedisRobotsStore):
        return bool(store.client.exists(keys.robots_fetch(name)))
    return name in store._claims


def test_a_malformed_retry_after_on_robots_txt_makes_it_unavailable(store):
    """robots.txt answers 503 with ``Retry-After: ²``: the host's robots.txt is unavailable for
    now (a retryable failure), nothing raised, and no claim left behind."""
    routes = {"/robots.txt": lambda h: reply(h, 503, b"down", {"Retry-After": "\u00b2"})}
    with serve(routes) as (base, _, _log):
        cache = RobotsCache.from_spec(build_spec({"seeds": [base + "/"]}), store)
        with pytest.raises(FetchError, match="robots.txt unavailable") as info:
            cache.check(base + "/page")
        assert info.value.retryable
        assert not claim_held(store, cache.name(base))


def test_a_robots_txt_fetch_that_raises_ends_its_claim(store):
    """A robots.txt fetch that raises (here: a resolver answer that is no address) ends its
    claim: another job of the same fetch gets its answer at once, not after the claim's 70 s."""
    routes = {"/robots.txt": lambda h: reply(h, 200, b"User-agent: *\nDisallow: /private/\n", TEXT)}
    with serve(routes) as (base, _, log):
        port = base.rsplit(":", 1)[1]
        site = f"http://site.invalid:{port}"
        spec = build_spec({"seeds": [site + "/"]})
        broken = RobotsCache.from_spec(spec, store, resolver=lambda host: ["not-an-address"],
                                       classify=lambda host, ip: None)
        with pytest.raises(ValueError, match="not-an-address"):
            broken.check(site + "/private/x")
        assert not claim_held(store, broken.name(site))
        working = RobotsCache.from_spec(spec, store, **public_test_hooks({"site.invalid": "127.0.0.1"}))
        assert working.name(site) == broken.name(site)  # the one record both would share
        started = time.monotonic()
        assert not working.allowed(site + "/private/x")
        assert time.monotonic() - started < 5.0
    assert [e["path"] for e in log] == ["/robots.txt"]
