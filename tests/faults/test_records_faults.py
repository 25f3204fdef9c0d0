"""The JSON Lines saver under SIGKILL, with real worker processes, a real Redis and a loopback
site: every page's records are in the joined file exactly once.

A kill right after a page's records were written, before the tracker heard of it, makes the page
be saved again (from its staged body: the same page, fetched at the same time), so its records
are in two shards; a worker killed mid-crawl leaves shards that end anywhere. The join keeps each
page's records once."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from tests.plugins.savers import event_counts, instruct
from tests.support.crawl import check_all, crawl_settings, registered_id, sigkill_mid_crawl

from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.job.spec import build_spec
from distscrape_celery.job.urls import normalize_url
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.savers.jsonl import JsonLinesShard, join_jsonl, jsonl_shards
from distscrape_celery.settings import Settings
from distscrape_celery.testing.sitegen import SiteServer, generate_site
from distscrape_celery.tracker import RedisTracker
from distscrape_celery.worker.app import configure_app
from distscrape_celery.worker.publish import publisher

LEASE = 2.0
PLUGIN_MODULES = "tests.plugins"
# A record per link of a page: a page's records are several lines, one unit of its shard.
EXTRACT = {"item": "#main li", "fields": {"href": "a::attr(href)", "text": "a::text"}}


def _spec(server, output, kind="jsonl", **saver):
    return build_spec({"seeds": [server.url("/")], "extract": EXTRACT, "max_retries": 0,
                       "saver": {"kind": kind, "output": str(output), **saver}})


def _expected(server, site) -> Counter:
    """(page URL, link) for every link of every reachable page: one record each."""
    expected: Counter = Counter()
    for path in site.reachable:
        html = site.pages[path].decode()
        links = [part.split('"', 1)[0] for part in html.split('<li><a href="')[1:]]
        expected.update((server.url(path), link) for link in links)
    return expected


def _joined_records(output) -> Counter:
    joined = join_jsonl(output)
    assert jsonl_shards(output) == [] and joined.path == output
    reader = JsonLinesShard(output)
    got = Counter((r["url"], r["href"]) for r in reader.records())
    assert not reader.torn
    return got


def _in_shards(output) -> Counter:
    """Every record in the shards, duplicates included."""
    return Counter((r["url"], r["href"]) for shard in jsonl_shards(output)
                   for r in JsonLinesShard(shard).records())


@pytest.mark.parametrize("batch_size", [pytest.param(None, id="save-batches"),
                                        pytest.param(1, id="save-per-page")])
def test_sigkill_right_after_the_records_are_written_keeps_them_once(
        redis_url, start_worker, tmp_path, batch_size):
    """The first save of each of 4 pages writes its records, then SIGKILLs its pool process
    before the tracker hears of it. The save runs again elsewhere and writes them again: the
    shards hold them twice, the joined file once, and nothing is dead."""
    site = generate_site(n_pages=50, seed=71, unreachable=0)
    settings = crawl_settings(redis_url, lease_seconds=LEASE, plugin_modules=PLUGIN_MODULES,
                              **({} if batch_size is None else {"save_batch_size": batch_size}))
    tracker = RedisTracker.from_url(redis_url)
    procs = [start_worker(settings, name) for name in ("rk-a", "rk-b")]
    wait_for_workers(tracker, len(procs), procs=procs)
    configure_app(settings)
    output = tmp_path / "out" / "items.jsonl"
    with SiteServer(site, delay=0.02) as server:
        victims = [normalize_url(server.url(p))
                   for p in sorted(p for p in site.reachable if p.startswith("/p/"))[:4]]
        instruct(output, "crash_once", victims)
        manager = CrawlManager(tracker, publisher.scrape,
                               settings=Settings(plugin_modules=PLUGIN_MODULES))
        manager.seed("rkill", _spec(server, output,
                                    kind="tests.plugins.savers:KilledAfterWriteJsonLines"))
        stats = manager.wait("rkill", timeout=120, check=check_all(procs))
    n = len(site.reachable)
    assert (stats.seen, stats.done, stats.dead) == (n, n, 0)
    assert event_counts(output, "kill") == Counter(victims)
    expected = _expected(server, site)
    in_shards = _in_shards(output)
    # Each victim's records were written by the killed save and again by the next one (a group
    # that held two victims, three times: once per kill, then whole).
    for victim in victims:
        assert all(in_shards[key] >= 2 for key in expected if key[0] == victim), victim
    assert _joined_records(output) == expected


def test_worker_sigkilled_while_writing_record_shards(redis_url, redis_client, workers, tmp_path):
    """One of two workers is SIGKILLed mid-crawl while it holds items and has written shards
    (gzip ones, rotated every 5 pages); a replacement takes over. Every page's records are in
    the joined file exactly once."""
    site = generate_site(n_pages=100, seed=72, unreachable=3)
    n = len(site.reachable)
    settings = crawl_settings(redis_url, lease_seconds=LEASE)
    tracker = RedisTracker.from_url(redis_url)
    victim, survivor = (workers(settings, name, concurrency=3) for name in ("rw-victim", "rw-survivor"))
    wait_for_workers(tracker, 2, procs=[victim, survivor])
    configure_app(settings)
    victim_id = registered_id(tracker, victim)
    output = tmp_path / "items.jsonl.gz"
    job = "rcrash"
    with SiteServer(site, delay=0.05) as server:
        manager = CrawlManager(tracker, publisher.scrape)
        manager.seed(job, _spec(server, output, shard_max_items=5))
        done_at_kill = sigkill_mid_crawl(
            tracker, redis_client, job, victim, survivor, done=n // 3,
            also=lambda: any(s.name.startswith(f"items-{victim_id}-") and s.stat().st_size
                             for s in jsonl_shards(output)))
        replacement = workers(settings, "rw-replacement", concurrency=3)
        stats = manager.wait(job, timeout=120, check=check_all([survivor, replacement]))
    assert done_at_kill < n
    assert (stats.done, stats.dead, stats.seen) == (n, 0, n)
    expected = _expected(server, site)
    assert set(_in_shards(output)) == set(expected)
    assert _joined_records(output) == expected
    print(f"\nrecords crash test: killed at {done_at_kill}/{n} done, "
          f"{sum(expected.values())} records")


def test_hostile_pages_cost_only_their_own_records_through_real_workers(
        redis_url, workers, tmp_path):
    """Pages built to break extraction (9 MB of matches, 100,000 nested elements, microdata
    nested without end, bytes that are no HTML, a regex that backtracks for ever) among
    ordinary ones, through a real worker: every page is saved, the worker lives, the ordinary
    pages have their records, and each hostile page has at most its own, bounded."""
    from tests.support.http import RouteServer

    settings = crawl_settings(redis_url, lease_seconds=10)
    [proc] = [workers(settings, "hostile-records", concurrency=3)]
    tracker = RedisTracker.from_url(redis_url)
    wait_for_workers(tracker, 1, procs=[proc])
    configure_app(settings)
    hostile = {
        "/huge": b"<html><body>" + b"<p class=price>1</p>" * 450_000 + b"</body></html>",
        "/deep": b"<div>" * 100_000 + b"<h1>deep</h1>",
        "/items": b"<div itemscope>" * 20_000 + b"<b itemprop=y>1</b>",
        "/binary": bytes(range(256)) * 4000,
        "/backtrack": b"<h1>" + b"a" * 30_000 + b"!</h1>",
    }
    ordinary = {f"/ok/{n}": f"<html><body><h1>page {n}</h1><p class=price>{n}.50</p></body></html>".encode()
                for n in range(20)}
    index = ("<html><body>" + "".join(f'<a href="{p}">x</a>' for p in [*hostile, *ordinary])
             + "</body></html>").encode()
    routes = {"/": (200, index), **{p: (200, b) for p, b in {**hostile, **ordinary}.items()}}
    output = tmp_path / "items.jsonl"
    with RouteServer(routes) as server:
        spec = build_spec({
            "seeds": [server.base + "/"], "saver": {"output": str(output)},
            "scraper": {"regex_seconds": 1.0},
            "fetch": {"max_bytes": 10 * 1024 * 1024},
            "extract": {"fields": {
                "heading": {"css": "h1::text", "re": r"(a|aa)+$"},
                "prices": {"css": ".price::text", "all": True},
            }, "structured": ["json-ld", "microdata"], "max_record_bytes": 64 * 1024},
        })
        manager = CrawlManager(tracker, publisher.scrape)
        manager.seed("hostile-records", spec)
        stats = manager.wait("hostile-records", timeout=180, check=check_all([proc]))
    pages = 1 + len(hostile) + len(ordinary)
    assert (stats.done, stats.dead) == (pages, 0)
    proc.check()  # alive: no page cost the worker
    records = {r["url"]: r for r in _joined_records_of(output)}
    for path, n in ((p, int(p.rsplit("/", 1)[1])) for p in ordinary):
        assert records[server.base + path]["prices"] == [f"{n}.50"]
    for path in hostile:
        record = records.get(server.base + path)
        assert record is None or len(json.dumps(record)) <= 64 * 1024, path
    # 450,000 prices make a record far past max_record_bytes: dropped, the page saved.
    assert server.base + "/huge" not in records
    # The regex ran out of its time budget on the page's heading: no record of that page.
    assert server.base + "/backtrack" not in records


def _joined_records_of(output) -> list[dict]:
    join_jsonl(output)
    return list(JsonLinesShard(output).records())
