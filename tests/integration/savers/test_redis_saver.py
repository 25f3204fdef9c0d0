"""RedisItemSaver against a real second Redis, alone and through real worker processes."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import redis

from tests.support.crawl import crawl_settings
from distscrape_celery.testing.sitegen import SiteServer, generate_site
from tests.support.saving import sha1

from distscrape_celery.worker.app import configure_app
from distscrape_celery.core.components import build_saver
from distscrape_celery.local.embedded import EmbeddedRedis
from distscrape_celery.errors import ConfigError, SaveError
from distscrape_celery.web.fetch import Download
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.savers import RedisItemSaver
from distscrape_celery.settings import Settings
from distscrape_celery.worker.publish import publisher
from distscrape_celery.tracker import RedisTracker


@pytest.fixture(scope="module")
def output_redis():
    with EmbeddedRedis() as server:
        yield server.url


def test_saves_body_and_metadata_and_a_resave_leaves_one_copy(output_redis):
    client = redis.Redis.from_url(output_redis)
    client.flushdb()
    saver = RedisItemSaver(output_redis, "out:{job}:{sha1}", job="j", ttl_seconds=60)
    saver.open()
    item = "http://127.0.0.1:9/a"
    dl = Download(item, 200, "text/html", b"\x00binary\xff", fetched_at=1700000000.25)
    key = saver.save(item, dl)
    assert key == f"out:j:{sha1(item)}"
    assert client.hgetall(key) == {
        b"body": b"\x00binary\xff", b"item": item.encode(), b"url": item.encode(),
        b"status": b"200", b"content_type": b"text/html", b"fetched_at": b"1700000000.25",
    }
    assert 0 < client.pttl(key) <= 60_000
    saver.save(item, Download(item, 200, "text/plain", b"again"))
    assert client.keys("out:*") == [key.encode()]
    assert client.hget(key, "body") == b"again"
    saver.close()


def test_bad_configuration_is_named(output_redis):
    with pytest.raises(ConfigError, match="not a Redis URL"):
        RedisItemSaver("/tmp/out")
    with pytest.raises(ConfigError, match="unknown field"):
        RedisItemSaver(output_redis, "out:{host}")
    with pytest.raises(ConfigError, match="must use"):
        RedisItemSaver(output_redis, "out:{job}")
    with pytest.raises(SaveError, match="unreachable"):
        RedisItemSaver("redis://127.0.0.1:1/0").open()


def test_chosen_by_configuration_alone(output_redis):
    spec = build_spec({"seeds": ["http://127.0.0.1:9/"],
                       "saver": {"kind": "redis", "output": output_redis}})
    assert isinstance(build_saver(spec, "j", "w1", Settings()), RedisItemSaver)


def test_crawl_into_a_separate_redis_through_real_workers(redis_url, output_redis, workers):
    out = redis.Redis.from_url(output_redis)
    out.flushdb()
    site = generate_site(n_pages=60, seed=5, unreachable=0)
    settings = crawl_settings(redis_url, lease_seconds=5)
    tracker = RedisTracker.from_url(redis_url)
    workers(settings, "rsave-a", concurrency=2)
    workers(settings, "rsave-b", concurrency=2)
    wait_for_workers(tracker, 2)
    configure_app(settings)
    with SiteServer(site) as server:
        spec = build_spec({"seeds": [server.url("/")],
                           "saver": {"kind": "redis", "output": output_redis,
                                     "key_scheme": "site:{sha1}"}})
        manager = CrawlManager(tracker, publisher.scrape)
        manager.seed("rsave", spec)
        stats = manager.wait("rsave", timeout=90)
    n = len(site.reachable)
    assert (stats.done, stats.dead) == (n, 0)
    keys = sorted(k.decode() for k in out.keys("site:*"))
    assert len(keys) == n
    for path in site.reachable:
        url = server.url(path)
        h = out.hgetall(f"site:{sha1(url)}")
        assert h[b"body"] == site.pages[path]
        assert (h[b"item"].decode(), h[b"status"], h[b"content_type"]) == (url, b"200", b"text/html; charset=utf-8")
        assert float(h[b"fetched_at"]) > 0
    # Nothing of the output went to the tracker's Redis.
    assert redis.Redis.from_url(redis_url).keys("site:*") == []


def test_a_batch_is_written_in_one_transaction_per_group_and_errors_name_their_entries(
        output_redis, monkeypatch):
    """Found while measuring: a save batch going to the Redis saver cost two round trips a page
    (its write, and marking it done); now one transaction per group of pages, and the pages are
    marked done together."""
    from distscrape_celery.savers import redis as redis_saver

    client = redis.Redis.from_url(output_redis)
    client.flushdb()
    saver = RedisItemSaver(output_redis, "b:{sha1}", job="j")
    saver.open()
    assert saver.commits_groups()
    monkeypatch.setattr(redis_saver, "GROUP_BYTES", 10)
    items = [f"http://127.0.0.1:9/{i}" for i in range(5)]
    bodies = [b"1234", b"5678", b"abcdefghijk", b"x", b"y"]  # groups: [0, 1, 2], [3, 4]
    executed = []
    real_pipeline = saver._client.pipeline

    def pipeline(*args, **kwargs):
        pipe = real_pipeline(*args, **kwargs)
        real_execute = pipe.execute
        pipe.execute = lambda *a, **k: (executed.append(len(pipe.command_stack)), real_execute(*a, **k))[1]
        return pipe

    monkeypatch.setattr(saver._client, "pipeline", pipeline)
    got = saver.save_many([(i, Download(i, 200, "text/html", b)) for i, b in zip(items, bodies)])
    assert got == [f"b:{sha1(i)}" for i in items]
    assert executed == [6, 4]  # DEL + HSET per page, one transaction per group
    assert [client.hget(f"b:{sha1(i)}", "body") for i in items] == bodies
    # A group that Redis refuses fails as a whole, each of its entries with the error.
    client.config_set("maxmemory", 1)
    try:
        got = saver.save_many([(i, Download(i, 200, "text/html", b"z" * 4)) for i in items[:2]])
    finally:
        client.config_set("maxmemory", 0)
    assert all(isinstance(r, SaveError) and "cannot save a group of 2 item(s)" in str(r) for r in got), got
    saver.close()


def test_records_are_kept_beside_their_page_and_exported_as_json_lines(
        redis_url, output_redis, workers, tmp_path):
    """A job that extracts, saved by the redis saver through real workers: each page's hash holds
    its records, and `distscrape export JOB --records` writes every record once, to standard
    output or a file; another job's records under the same scheme are not its."""
    from tests.support.cli import assert_one_line_error, run

    out = redis.Redis.from_url(output_redis)
    out.flushdb()
    site = generate_site(n_pages=40, seed=6, unreachable=0)
    settings = crawl_settings(redis_url, lease_seconds=5)
    tracker = RedisTracker.from_url(redis_url)
    workers(settings, "rrec-a", concurrency=2)
    wait_for_workers(tracker, 1)
    configure_app(settings)
    extract = {"item": "#main li", "fields": {"href": "a::attr(href)", "text": "a::text"}}
    with SiteServer(site) as server:
        manager = CrawlManager(tracker, publisher.scrape)
        for job in ("rrec", "rrec-x"):
            manager.seed(job, build_spec({
                "seeds": [server.url("/")], "extract": extract,
                "saver": {"kind": "redis", "output": output_redis, "key_scheme": "r:{job}-{item}"},
            }))
        for job in ("rrec", "rrec-x"):
            stats = manager.wait(job, timeout=90)
            assert (stats.done, stats.dead) == (len(site.reachable), 0)
    expected = Counter()
    for path in site.reachable:
        url = server.url(path)
        records = json.loads(out.hget(f"r:rrec-{url}", "records") or b"[]")
        links = site.pages[path].count(b"<li><a href=")
        assert len(records) == links
        assert all(r["url"] == url and r["job"] == "rrec" and r["text"].startswith("link ")
                   for r in records)
        expected.update((url, r["href"]) for r in records)

    env = {"DISTSCRAPE_REDIS_URL": redis_url}
    res = run("export", "rrec", "--records", env=env)
    assert res.returncode == 0, res.stderr
    got = [json.loads(line) for line in res.stdout.splitlines()]
    assert Counter((r["url"], r["href"]) for r in got) == expected
    assert {r["job"] for r in got} == {"rrec"}
    res = run("export", "rrec", "--records", "--output", str(tmp_path / "r.jsonl"), env=env)
    assert res.returncode == 0 and res.stdout == "", res.stderr
    assert sorted((tmp_path / "r.jsonl").read_text().splitlines()) == sorted(
        res_lines := [json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in got])
    assert len(res_lines) == sum(expected.values())
    assert_one_line_error(run("export", "rrec", "--dead", "--output", "x", env=env),
                          "--output goes with --records")


def test_export_records_of_a_job_that_has_none_is_refused(redis_url, output_redis):
    from tests.support.cli import assert_one_line_error, run

    tracker = RedisTracker.from_url(redis_url)
    manager = CrawlManager(tracker, lambda *a, **k: None)
    manager.seed("plain", build_spec({"seeds": ["http://127.0.0.1:9/"],
                                      "saver": {"kind": "redis", "output": output_redis}}))
    res = run("export", "plain", "--records", env={"DISTSCRAPE_REDIS_URL": redis_url})
    assert_one_line_error(res, "has no [extract]")
