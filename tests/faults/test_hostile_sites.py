"""Hostile and tricky sites on 127.0.0.1, crawled through the real item pipeline and a real Redis
tracker (and once through real Celery workers): every item ends done, or dead with its reason;
robots.txt, canonical duplicates and the SSRF guard hold."""

from __future__ import annotations


import gzip
import json
import logging
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler

import pytest

from tests.support.crawl import crawl_settings

from distscrape_celery.worker.app import configure_app
from distscrape_celery.web.fetch import Fetcher
from distscrape_celery.job.spec import JobSpec, build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.errors import FetchError
from distscrape_celery.web.robots import RobotsCache
from distscrape_celery.core.runtime import Runtime
from distscrape_celery.savers import FileItemSaver
from distscrape_celery.web.scope import LinkScope
from distscrape_celery.scrapers import SimpleScraper
from distscrape_celery.worker.publish import publisher
from distscrape_celery.tracker import RedisTracker
from distscrape_celery.tracker import keys
from tests.support.http import reply, serve
from tests.support.guard import public_test_hooks, resolver
from tests.support.ops import closed_port
from tests.support.pipeline import crawl_inline

HTML = {"Content-Type": "text/html"}  # no charset: the body decides
TRAP_LINKS = 2000


def hostile_routes(refused: int) -> tuple[dict, Counter]:
    """Routes of a site where every page misbehaves its own way, and a counter of requests."""
    counts: Counter = Counter()
    trap = "".join(f'<a href="/target?utm_source={n}&utm_medium=m#f{n}">t</a>' for n in range(TRAP_LINKS))
    links = ["/huge", "/bomb", "/endless/0", "/loop-a", "/drip", "/lying-gzip", "/bad-bytes",
             "/flaky", "/busy", "/private/secret", "/to-private", "/h/über", "/trap", "/gone",
             "/unasked-304",
             f"http://127.0.0.1:{refused}/refused"]
    index = "<html><body>" + "".join(f'<a href="{link}">x</a>' for link in links) + "</body></html>"

    def counted(handler):
        def route(h: BaseHTTPRequestHandler) -> None:
            counts[h.path] += 1
            handler(h)
        return route

    def drip(h):
        h.send_response(200)
        h.send_header("Content-Length", "1000")
        h.end_headers()
        try:
            for _ in range(1000):
                h.wfile.write(b"x")
                h.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass  # the crawler gave up, as it should

    def once_then(first, then):
        def route(h):
            (first if counts[h.path] == 1 else then)(h)
        return route

    ok = lambda body: lambda h: reply(h, 200, body, HTML)  # noqa: E731
    routes = {
        "/robots.txt": lambda h: reply(h, 200, b"User-agent: *\nDisallow: /private/\nCrawl-delay: 0.5\n",
                                       {"Content-Type": "text/plain"}),
        "/": ok(index.encode()),
        "/huge": ok(b"x" * 3_000_000),
        "/bomb": lambda h: reply(h, 200, gzip.compress(b"\0" * 50_000_000), {**HTML, "Content-Encoding": "gzip"}),
        "/loop-a": lambda h: reply(h, 302, headers={"Location": "/loop-b"}),
        "/loop-b": lambda h: reply(h, 302, headers={"Location": "/loop-a"}),
        "/drip": drip,
        "/lying-gzip": lambda h: reply(h, 200, b"not gzip at all", {**HTML, "Content-Encoding": "gzip"}),
        "/bad-bytes": ok(b'<html><p>\xff\xfe\x80\xc3(</p><a href="/ok">ok</a>\xe2\x82</html>'),
        "/ok": ok(b"fine"),
        "/flaky": once_then(lambda h: reply(h, 500, b"oops"), ok(b"recovered")),
        "/busy": once_then(lambda h: reply(h, 429, b"slow down", {"Retry-After": "1"}), ok(b"served")),
        "/private/secret": ok(b"robots said no"),
        "/to-private": lambda h: reply(h, 302, headers={"Location": "/private/secret"}),
        "/h/%C3%BCber": ok(b"uber"),
        "/trap": ok(f"<html>{trap}</html>".encode()),
        "/target": ok(b"the one page behind every tracking link"),
        "/gone": lambda h: reply(h, 404, b"no"),
        # "Not modified" to a request that named no copy: there is no page in it to save.
        "/unasked-304": lambda h: reply(h, 304, headers={"ETag": '"v1"'}),
    }
    for n in range(20):  # an endless chain of redirects
        routes[f"/endless/{n}"] = (lambda n: lambda h: reply(h, 302, headers={"Location": f"/endless/{n + 1}"}))(n)
    return {path: counted(route) for path, route in routes.items()}, counts


def hostile_spec(base: str, out, refused: int) -> JobSpec:
    """The hostile site's job. The closed port is a seed too: a private address is trusted only
    on the ports the seeds name, and its connection refused is what is tried here."""
    return build_spec({
        "seeds": [base + "/", f"http://127.0.0.1:{refused}/refused"],
        "saver": {"output": str(out)},
        # Generous for a loaded machine; only the slow drip should hit total_timeout.
        # An unreadable robots.txt (the refused host's) is asked again after 1 s, not 10.
        "fetch": {"connect_timeout": 5, "read_timeout": 5, "total_timeout": 5, "max_bytes": 1_000_000,
                  "robots_retry_seconds": 1},
        "max_retries": 1,
    })


def expected_outcomes(base: str, refused: int) -> tuple[set[str], dict[str, str]]:
    done = {"/", "/bad-bytes", "/ok", "/flaky", "/busy", "/h/%C3%BCber", "/trap", "/target"}
    dead = {
        "/huge": "exceeds max_bytes=1000000",
        "/bomb": "exceeds max_bytes=1000000",
        "/endless/0": "more than 5 redirects",
        "/loop-a": "redirect loop",
        "/drip": "total_timeout",
        "/lying-gzip": "cannot decode the body",
        "/private/secret": "disallowed by robots.txt",
        "/to-private": "disallowed by robots.txt",  # robots.txt is asked at every redirect hop
        "/gone": "HTTP 404",
        "/unasked-304": "HTTP 304 (not modified) to a request that asked nothing conditionally",
    }
    dead_urls = {base + path: why for path, why in dead.items()}
    dead_urls[f"http://127.0.0.1:{refused}/refused"] = "connection refused"
    return {base + path for path in done}, dead_urls


def check_outcomes(tracker, job, base, refused, counts, out) -> None:
    done, dead = expected_outcomes(base, refused)
    reasons = tracker.dead_items(job)
    assert set(reasons) == set(dead), reasons
    for url, why in dead.items():
        assert why in reasons[url], (url, reasons[url])
    saver = FileItemSaver(out)
    assert {url for url in done if (out / saver.name_for(url)).is_file()} == done
    stats = tracker.stats(job)
    assert (stats.done, stats.dead) == (len(done), len(dead))
    assert counts["/private/secret"] == 0  # disallowed: never requested, not even by a redirect
    assert counts["/to-private"] == 1  # a disallowed target is not a retryable failure
    assert counts["/target"] == 1  # 2,000 tracking variants: one item, fetched once
    assert counts["/flaky"] == 2 and counts["/busy"] == 2  # failed once, then retried to done
    assert counts["/robots.txt"] == 1  # once per host, then from Redis
    assert counts["/drip"] == 2  # a timeout is retried (max_retries=1), then dead
    assert counts["/unasked-304"] == 2  # a cache may serve it for a while: retried, then dead


def test_hostile_site_through_the_pipeline(redis_url, tmp_path, caplog):
    refused = closed_port()
    routes, counts = hostile_routes(refused)
    rt = Runtime.for_redis(crawl_settings(redis_url, lease_seconds=30))
    out = tmp_path / "out"
    with serve(routes) as (base, _, log), caplog.at_level(logging.WARNING):
        spec = hostile_spec(base, out, refused)
        crawl_inline(rt, "hostile", spec)
        assert rt.robots("hostile").crawl_delay(base + "/") == 0.5  # for the tracker's pacing
    check_outcomes(rt.tracker, "hostile", base, refused, counts, out)
    # The 429's Retry-After reached the pipeline (the tracker's backoff will wait that long).
    assert "HTTP 429 for " + base + "/busy (Retry-After 1s)" in caplog.text
    # Connection refused was retried (each attempt asks the closed port's robots.txt first).
    assert caplog.text.count(f"http://127.0.0.1:{refused}/refused: robots.txt unavailable") == 2
    assert not any("%C3%83" in entry["path"] for entry in log)  # über never requested as Ã¼ber


def test_hostile_site_through_real_workers(redis_url, workers, tmp_path):
    settings = crawl_settings(redis_url, lease_seconds=10)
    procs = [workers(settings, f"hostile-{i}", concurrency=3) for i in range(2)]
    tracker = RedisTracker.from_url(redis_url)
    wait_for_workers(tracker, 2, procs=procs)
    configure_app(settings)
    refused = closed_port()
    routes, counts = hostile_routes(refused)
    out = tmp_path / "out"
    with serve(routes) as (base, _, _log):
        manager = CrawlManager(tracker, publisher.scrape)
        manager.seed("hostile", hostile_spec(base, out, refused))

        def alive():
            for p in procs:
                p.check()  # no worker died of what it was sent

        manager.wait("hostile", timeout=120, check=alive)
    check_outcomes(tracker, "hostile", base, refused, counts, out)
    alive()


def test_max_depth_stops_the_crawl(redis_url, tmp_path):
    chain = {f"/d{n}": (lambda n: lambda h: reply(h, 200, f'<a href="/d{n + 1}">next</a>'.encode(), HTML))(n)
             for n in range(10)}
    rt = Runtime.for_redis(crawl_settings(redis_url, lease_seconds=30))
    with serve(chain) as (base, _, log):
        spec = build_spec({"seeds": [base + "/d0"], "saver": {"output": str(tmp_path / "o")},
                           "scraper": {"max_depth": 3}})
        stats = crawl_inline(rt, "deep", spec)
    assert (stats.done, stats.dead, stats.seen) == (4, 0, 4)  # /d0 (depth 0) to /d3
    assert [e["path"] for e in log if e["path"] != "/robots.txt"] == ["/d0", "/d1", "/d2", "/d3"]


def test_ignore_robots_and_robots_status_rules(redis_url, tmp_path):
    disallow_all = lambda h: reply(h, 200, b"User-agent: *\nDisallow: /\n")  # noqa: E731
    rt = Runtime.for_redis(crawl_settings(redis_url, lease_seconds=30))
    for job, robots, obey, outcome in [
        ("obeyed", disallow_all, True, "disallowed by robots.txt"),
        ("ignored", disallow_all, False, None),
        ("missing", lambda h: reply(h, 404, b""), True, None),  # 4xx: everything allowed
        ("erroring", lambda h: reply(h, 503, b""), True, "robots.txt unavailable"),  # 5xx: nothing yet
    ]:
        routes = {"/robots.txt": robots, "/page": lambda h: reply(h, 200, b"page", HTML)}
        with serve(routes) as (base, _, log):
            spec = build_spec({"seeds": [base + "/page"], "saver": {"output": str(tmp_path / job)},
                               "fetch": {"obey_robots": obey, "robots_retry_seconds": 1},
                               "max_retries": 1})
            stats = crawl_inline(rt, job, spec)
        dead = rt.tracker.dead_items(job)
        if outcome is None:
            assert (stats.done, dead) == (1, {}), job
        else:
            assert outcome in dead[base + "/page"], (job, dead)
            assert "/page" not in [e["path"] for e in log], job
        if not obey:
            assert "/robots.txt" not in [e["path"] for e in log]


def test_robots_txt_is_cached_in_redis_for_every_worker(redis_url, redis_client):
    hits = []
    routes = {"/robots.txt": lambda h: (hits.append(1), reply(h, 200, b"User-agent: *\nDisallow: /x\n"))}
    with serve(routes) as (base, _, _log):
        spec = build_spec({"seeds": [base + "/"], "fetch": {"robots_cache_seconds": 30}})
        workers = [Runtime.for_redis(crawl_settings(redis_url)) for _ in range(3)]  # as 3 processes
        results = []
        threads = [threading.Thread(target=lambda r=r: results.append(
            RobotsCache.from_spec(spec, r.robots_store).allowed(base + "/x/1"))) for r in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert results == [False, False, False]
    assert len(hits) == 1  # fetched by one worker, the others waited for its record
    [key] = redis_client.keys(keys.robots(f"*:{base}"))  # one record: one user agent, one origin
    ttl = redis_client.pttl(key)
    assert 0 < ttl <= 30_000


@pytest.mark.parametrize("store", ["redis", "memory"])
def test_robots_txt_is_asked_again_as_soon_as_its_record_expires(store, redis_url):
    """The fetcher's claim ends with the record it stored: when the record of an unreachable
    robots.txt expires, the next check fetches again at once instead of waiting out the claim
    (which made every retry of a dead host's item hang for a minute)."""
    hits = []
    routes = {"/robots.txt": lambda h: (hits.append(1), reply(h, 503, b"down"))}
    with serve(routes) as (base, _, _log):
        spec = build_spec({"seeds": [base + "/"], "fetch": {"robots_retry_seconds": 0.3}})
        settings = crawl_settings(redis_url)
        rt = Runtime.for_redis(settings) if store == "redis" else Runtime.in_memory_runtime(settings)
        cache = RobotsCache.from_spec(spec, rt.robots_store)
        for attempt in range(2):
            started = time.monotonic()
            with pytest.raises(FetchError, match="robots.txt unavailable"):
                cache.check(base + "/page")
            assert time.monotonic() - started < 2.0, f"attempt {attempt} waited for a stale claim"
            time.sleep(0.4)  # the record expires
    assert len(hits) == 2


def test_public_seed_cannot_reach_loopback_or_metadata(redis_url, tmp_path):
    """A "public" site (public.invalid, served on 127.0.0.1 but classified as public by the
    guard's injected resolver) links and redirects to 127.0.0.1 and 169.254.169.254: both are
    refused after resolution, and nothing is requested there."""
    routes: dict = {}
    with serve(routes) as (base, _, log):
        port = base.rsplit(":", 1)[1]
        public = f"http://public.invalid:{port}"
        page = (f'<a href="{base}/secret">a</a><a href="http://169.254.169.254/latest/meta-data/">b</a>'
                f'<a href="/go">c</a><a href="http://[::ffff:127.0.0.1]:{port}/secret">d</a>')
        routes.update({
            "/": lambda h: reply(h, 200, page.encode(), HTML),
            "/go": lambda h: reply(h, 302, headers={"Location": f"{base}/secret"}),
            "/secret": lambda h: reply(h, 200, b"internal"),
        })
        spec = build_spec({"seeds": [public + "/"], "scraper": {"same_host": False},
                           "saver": {"output": str(tmp_path / "o")}, "max_retries": 0})
        rt = Runtime.for_redis(crawl_settings(redis_url, lease_seconds=30))
        hooks = public_test_hooks({"public.invalid": "127.0.0.1"})
        # The job's components, built as the runtime would but with the injected resolver.
        rt.preset_context("ssrf", spec,
                          scraper=SimpleScraper(LinkScope.from_spec(spec), Fetcher.for_job(spec, **hooks)),
                          robots=RobotsCache.from_spec(spec, rt.robots_store, **hooks))
        crawl_inline(rt, "ssrf", spec)
    dead = rt.tracker.dead_items("ssrf")
    assert "refused: 127.0.0.1 is a loopback address" in dead[f"{base}/secret"]
    assert "refused: 127.0.0.1 is a loopback address" in dead[f"{public}/go"]
    assert "refused: ::ffff:7f00:1 is a loopback address" in dead[f"http://[::ffff:7f00:1]:{port}/secret"]
    assert "refused: 169.254.169.254 is a link-local address" in dead["http://169.254.169.254/latest/meta-data/"]
    assert sorted(e["path"] for e in log) == ["/", "/go", "/robots.txt"]
    assert all(e["headers"]["Host"] == f"public.invalid:{port}" for e in log)


def test_a_literal_seed_address_is_trusted_only_by_that_literal_and_port(redis_url, tmp_path):
    """A job seeded with http://127.0.0.1:PORT/ crawls it, but its private address is reached by
    no other name and on no other port: a link and a redirect to evil.invalid:PORT (whose injected
    DNS answer is 127.0.0.1) and a link to 127.0.0.1 on another port, where a second server
    listens, are refused, and neither server is asked for them."""
    routes: dict = {}
    with serve({"/secret": lambda h: reply(h, 200, b"other service")}) as (other, _, other_log):
        with serve(routes) as (base, _, log):
            port = base.rsplit(":", 1)[1]
            evil = f"http://evil.invalid:{port}"
            page = (f'<a href="{evil}/by-name">a</a><a href="/go">b</a>'
                    f'<a href="{other}/secret">c</a><a href="/page">d</a>')
            routes.update({
                "/": lambda h: reply(h, 200, page.encode(), HTML),
                "/page": lambda h: reply(h, 200, b"<html>fine</html>", HTML),
                "/go": lambda h: reply(h, 302, headers={"Location": f"{evil}/by-redirect"}),
                "/by-name": lambda h: reply(h, 200, b"internal"),
                "/by-redirect": lambda h: reply(h, 200, b"internal"),
            })
            spec = build_spec({"seeds": [base + "/"], "scraper": {"same_host": False},
                               "saver": {"output": str(tmp_path / "o")}, "max_retries": 0})
            rt = Runtime.for_redis(crawl_settings(redis_url, lease_seconds=30))
            hooks = {"resolver": resolver({"evil.invalid": ["127.0.0.1"]})}
            rt.preset_context("lit", spec,
                              scraper=SimpleScraper(LinkScope.from_spec(spec), Fetcher.for_job(spec, **hooks)),
                              robots=RobotsCache.from_spec(spec, rt.robots_store, **hooks))
            stats = crawl_inline(rt, "lit", spec)
    assert sorted(e["path"] for e in log) == ["/", "/go", "/page", "/robots.txt"]
    assert [e["path"] for e in other_log] == []
    dead = rt.tracker.dead_items("lit")
    assert (stats.done, stats.dead) == (2, 3), dead
    by_name = "refused: evil.invalid resolves to 127.0.0.1, a loopback address"
    assert by_name in dead[f"{evil}/by-name"]
    assert by_name in dead[f"{base}/go"]
    assert (f"refused: 127.0.0.1 is a loopback address on port {other.rsplit(':', 1)[1]}, "
            "not the seed's port") in dead[f"{other}/secret"]


# -- every trap of a hostile site at once, through two real workers ------------------------------

ROBOTS_HEAD = b"User-agent: *\nDisallow: /private/\n"
TRAP_CAP = 200  # scraper.max_links_per_page of the trap crawl
MANY_LINKS = 5_000
WORKER_PEAK_RSS = 300 * 2**20


def trap_routes(release: threading.Event) -> tuple[dict, Counter]:
    """A site whose every page is a trap: a 600 KB robots.txt that disallows /private/ in its
    first rule, headers that drip a byte at a time, a nested gzip bomb, a page of 100 KB links,
    a page of 5,000 links, and a link that makes the job's deny_regex backtrack."""
    from tests.support.http import nested_gzip_bomb

    counts: Counter = Counter()
    filler = b"".join(b"# %06d padding a robots.txt past its 500 KiB head\n" % n for n in range(12_000))
    robots = ROBOTS_HEAD + filler
    assert len(robots) > 600_000
    bomb = nested_gzip_bomb()
    long_links = "".join(f'<a href="/long/{n}/{"x" * 100_000}">l</a>' for n in range(60))
    many = "".join(f'<a href="/m/{n}">m</a>' for n in range(MANY_LINKS))
    index = "".join(f'<a href="{p}">x</a>' for p in (
        "/private/1", "/private/2", "/slow-headers", "/bomb", "/long-links", "/many-links", "/ok",
        "http://offsite.invalid/x",
        "/x" + "a" * 38 + "!",  # last: the deny_regex runs out of time on it
    ))

    def slow_headers(h: BaseHTTPRequestHandler) -> None:
        try:
            h.wfile.write(b"HTTP/1.1 200 OK\r\n")
            h.wfile.flush()
            while not release.wait(0.3):
                h.wfile.write(b"X")
                h.wfile.flush()
        except OSError:
            pass  # the crawler gave up, as it should

    ok = lambda body: lambda h: reply(h, 200, body, HTML)  # noqa: E731
    routes = {
        "/robots.txt": lambda h: reply(h, 200, robots, {"Content-Type": "text/plain"}),
        "/": ok(f"<html>{index}</html>".encode()),
        "/private/1": ok(b"secret"), "/private/2": ok(b"secret"),
        "/slow-headers": slow_headers,
        "/bomb": lambda h: reply(h, 200, bomb, {**HTML, "Content-Encoding": "gzip, gzip"}),
        "/long-links": ok(f'<html>{long_links}<a href="/ok">ok</a></html>'.encode()),
        "/many-links": ok(f"<html>{many}</html>".encode()),
        "/ok": ok(b"fine"),
    }
    for n in range(MANY_LINKS):
        routes[f"/m/{n}"] = ok(b"<html>leaf</html>")

    def counted(path, handler):
        def route(h):
            counts[path.split("/")[1] if path.startswith(("/m/", "/private/")) else path] += 1
            handler(h)
        return route

    return {path: counted(path, route) for path, route in routes.items()}, counts


def peak_rss(pid: int) -> int:
    """The highest resident memory of process ``pid`` so far (VmHWM), in bytes."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


def test_every_trap_at_once_through_two_real_workers(redis_url, workers, tmp_path):
    """Two real threads-pool workers crawl the trap site: the job finishes, no worker dies or
    grows past a bound, robots.txt's first rule holds although the file is over 500 KiB, and the
    job holds at most the per-page cap of the many-links page."""
    from tests.support.cli import run

    settings = crawl_settings(redis_url, lease_seconds=10)
    procs = [workers(settings, f"traps-{i}", concurrency=4, pool="threads") for i in range(2)]
    tracker = RedisTracker.from_url(redis_url)
    wait_for_workers(tracker, 2, procs=procs)
    configure_app(settings)
    release = threading.Event()
    routes, counts = trap_routes(release)
    out = tmp_path / "out"
    with serve(routes) as (base, stop, _log):
        spec = build_spec({
            "seeds": [base + "/"],
            "saver": {"output": str(out)},
            # The default regex budget (2 s a page, wall clock): the backtracking link uses it up;
            # the 5,000-link page needs a small part of it, even on a loaded machine.
            "scraper": {"max_links_per_page": TRAP_CAP, "deny_regex": [r"x(\w|\w\w)+$"]},
            "fetch": {"connect_timeout": 5, "read_timeout": 5, "total_timeout": 2,
                      "max_bytes": 8_000_000},
            "max_retries": 1,
        })
        CrawlManager(tracker, publisher.scrape).seed("traps", spec)

        def alive():
            for p in procs:
                p.check()  # no worker died of what it was sent

        try:
            CrawlManager(tracker, publisher.scrape).wait("traps", timeout=180, check=alive)
        finally:
            release.set()
            stop.set()
    alive()
    stats = tracker.stats("traps")
    reasons = tracker.dead_items("traps")
    assert counts["private"] == 0, counts  # robots.txt's first rule, in a 600 KB file
    assert "total_timeout" in reasons[base + "/slow-headers"], reasons
    assert counts["/slow-headers"] == 2  # retried once, each attempt cut at the total deadline
    assert "exceeds max_bytes" in reasons[base + "/bomb"], reasons
    # The many-links page gave the cap; nothing else on the site links onwards.
    assert counts["m"] == TRAP_CAP
    assert stats.seen <= TRAP_CAP + 20, stats
    assert stats.links_cut >= MANY_LINKS - TRAP_CAP, stats
    status = json.loads(run("status", "traps", "--json", "--redis-url", redis_url).stdout)
    assert status["links_cut"] == stats.links_cut
    logs = "".join(p.log_path.read_text(errors="replace") for p in procs)
    assert "link extraction stopped" in logs and "scraper.regex_seconds" in logs
    for p in procs:
        rss = peak_rss(p.proc.pid)
        print(f"{p.name}: peak RSS {rss / 2**20:.0f} MB")
        assert rss < WORKER_PEAK_RSS, f"{p.name}: peak RSS {rss / 2**20:.0f} MB"
