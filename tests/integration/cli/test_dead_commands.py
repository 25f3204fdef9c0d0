"""`distscrape dead`, `retry-dead`, and what `status` says about dead items, against a real Redis;
the politeness options of `seed` land in the job's spec."""

from __future__ import annotations

import json

from tests.support.cli import assert_one_line_error, run

from distscrape_celery.job.spec import JobSpec
from distscrape_celery.tracker import Fault, RedisTracker

SPEC = '{"seeds": ["http://127.0.0.1:9/"]}'


def make_dead(redis_url: str, n: int) -> list[str]:
    t = RedisTracker.from_url(redis_url, dispatch_factor=100)
    t.create_job("j", SPEC)
    w = t.register_worker("host", 1, 1)
    items = [f"http://h{i}.invalid/x" for i in range(n)]  # one domain each: no cap in the way
    t.add("j", items)
    for item in items:
        token = t.checkout("j", item, w, max_lost=1).token
        t.fail("j", item, token, f"HTTP 404 for {item}", fault=Fault.ITEM, max_retries=3,
               max_lost=1, retryable=False)
    t.deregister_worker(w)
    return items


def test_dead_lists_all_and_status_counts_the_rest(redis_url):
    items = make_dead(redis_url, 13)
    res = run("dead", "j", "--redis-url", redis_url)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == sorted(f"{i}\tHTTP 404 for {i}" for i in items)
    res = run("dead", "j", "--json", "--redis-url", redis_url)
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert sorted(r["item"] for r in rows) == sorted(items)
    res = run("status", "j", "--redis-url", redis_url)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("dead http://") == 10
    assert "3 more: see distscrape dead j" in res.stdout
    assert_one_line_error(run("dead", "nosuch", "--redis-url", redis_url), "no job named 'nosuch'")


def test_retry_dead_requeues_them_all(redis_url):
    make_dead(redis_url, 3)
    res = run("retry-dead", "j", "--redis-url", redis_url)
    assert res.returncode == 0, res.stderr
    assert "job j: 3 dead item(s) queued again" in res.stdout
    status = json.loads(run("status", "j", "--json", "--redis-url", redis_url).stdout)
    assert (status["dead"], status["queued"]) == (0, 3)
    assert run("dead", "j", "--redis-url", redis_url).stdout == ""


def test_seed_takes_the_politeness_options(redis_url, tmp_path):
    res = run("seed", "p", "http://127.0.0.1:9/", "--output", str(tmp_path), "--max-rate", "2.5",
              "--per-domain-concurrency", "3", "--max-pages", "50", "--max-pages-per-domain", "20",
              "--redis-url", redis_url)
    assert res.returncode == 0, res.stderr
    spec = JobSpec.from_json(RedisTracker.from_url(redis_url).load_spec("p"))
    p = spec.politeness
    assert (p.max_rate, p.per_domain_concurrency, p.max_pages, p.max_pages_per_domain) == (
        2.5, 3, 50, 20)
    bad = run("seed", "q", "http://127.0.0.1:9/", "--max-rate", "0", "--redis-url", redis_url)
    assert bad.returncode == 2 and "--max-rate" in bad.stderr
