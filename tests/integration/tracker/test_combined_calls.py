"""Tracker calls that threads of one process make at the same time go to Redis as one call,
leases and page reports alike, and each caller gets exactly the reply it would have got alone.

Real Redis. ``CLIENT PAUSE`` holds the first call in Redis for a moment, so the calls the other
threads make meanwhile are sure to come while it is in flight; Redis's own call counts
(``INFO commandstats``) tell how many calls reached it. The combiner's hand-over between
threads (errors, interrupted waiters, a fork) is tested on its own with a send of the test's.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import redis

from distscrape_celery.errors import JobNotFound
from distscrape_celery.tracker import CrawlLimits, DomainLimits, LeaseStatus, RedisTracker
from distscrape_celery.tracker.redis import combine, scripts
from distscrape_celery.tracker.redis.combine import Combiner
from distscrape_celery.tracker.redis.staging import RedisBodyStaging
from tests.support.tracker_state import item_states
from tests.support.jobs import SPEC, script_calls

# Far longer than threads let go together take to make their calls, on a loaded machine too.
PAUSE_MS = 1000


def run_paused(client, calls):
    """Run each of ``calls`` in a thread of its own, all let go together while Redis is paused
    for PAUSE_MS (every command waits), so the first call sent is in flight while the others
    are made. Returns their results in order (an exception raised is returned)."""
    results: list = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def run(i):
        start.wait()
        try:
            results[i] = calls[i]()
        except Exception as exc:  # noqa: BLE001 - returned to the test
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    client.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    return results


@pytest.fixture(params=["functions", "scripts"])
def tracker(request, redis_url):
    """A tracker whose item scripts run from the function library (FCALL), or as scripts
    (EVALSHA: Redis 6.2, a server that refuses FUNCTION LOAD)."""
    # The dispatch bound read once (each refresh is a script call of its own).
    t = RedisTracker.from_url(redis_url, bound_refresh_seconds=600, lease_seconds=30,
                              save_timeout=60,
                              functions=None if request.param == "functions" else False)
    # Every script in Redis's cache already, so that no call below is a NOSCRIPT reply and its
    # second try (the function library is loaded by the first call).
    for name in scripts.item_script_names():
        t.client.script_load(scripts.source(name))
    # Every page of the one test domain in flight at once.
    t.create_job("j", SPEC, CrawlLimits(default=DomainLimits(concurrency=64)))
    yield t


def test_checkouts_made_at_once_go_as_one_call_each_with_its_own_reply(tracker, redis_client):
    urls = [f"http://127.0.0.1/p{n}" for n in range(6)]
    tracker.add("j", urls)
    worker = tracker.register_worker("host", 1, 8)
    tracker.checkout("j", "http://127.0.0.1/none", worker, max_lost=3)  # the library is loaded
    before = script_calls(redis_client)
    # Eight threads: one per page, and two more for pages another thread asks for too.
    asked = urls + urls[:2]
    results = run_paused(redis_client, [
        lambda u=u: tracker.checkout("j", u, worker, max_lost=3) for u in asked])
    assert script_calls(redis_client) - before == 2  # the first alone, then the other seven
    by_url: dict[str, list] = {}
    for url, res in zip(asked, results):
        assert not isinstance(res, Exception), res
        by_url.setdefault(url, []).append(res)
    for url in urls:
        statuses = sorted(r.status.value for r in by_url[url])
        # Exactly one lease a page, the other asker told it is busy, as one at a time would be.
        assert statuses == (["busy", "ok"] if url in urls[:2] else ["ok"]), (url, statuses)
    tokens = [r.token for rs in by_url.values() for r in rs if r.status is LeaseStatus.OK]
    assert len(set(tokens)) == 6 and 0 not in tokens
    assert item_states(redis_client, "j", urls) == ["l0"] * 6
    # The lease each reply names is the one the tracker holds: scraped under it is held.
    for url in urls:
        ok = next(r for r in by_url[url] if r.status is LeaseStatus.OK)
        assert tracker.scraped("j", url, ok.token, body=b"page").held


def test_leases_and_page_reports_made_at_once_go_as_one_call(tracker, redis_client):
    """Calls of two scripts (leases and page reports, each a thread's) that come while one call
    is in flight go together too, each with the reply it would get alone: the leases' pages
    leased, each body staged under its token, the finds added once."""
    reported = [f"http://127.0.0.1/r{n}" for n in range(3)]
    leased = [f"http://127.0.0.1/l{n}" for n in range(3)]
    tracker.add("j", reported + leased)
    worker = tracker.register_worker("host", 1, 8)
    tokens = [tracker.checkout("j", u, worker, max_lost=3).token for u in reported]
    calls = []
    for n, (url, token) in enumerate(zip(reported, tokens)):
        calls.append(lambda url=url, token=token, n=n: tracker.scraped(
            "j", url, token, ["http://127.0.0.1/new", f"http://127.0.0.1/new{n}"], 1,
            body=f"page {n}".encode()))
    for url in leased:
        calls.append(lambda url=url: tracker.checkout("j", url, worker, max_lost=3))
    before = script_calls(redis_client)
    results = run_paused(redis_client, calls)
    assert script_calls(redis_client) - before == 2  # the first alone, then the other five
    assert not any(isinstance(r, Exception) for r in results), results
    reports, leases = results[:3], results[3:]
    assert [r.held for r in reports] == [True] * 3
    assert sum(r.added for r in reports) == 4  # "new" once, and each page's own
    assert [r.status for r in leases] == [LeaseStatus.OK] * 3
    new_tokens = [r.token for r in leases]
    assert len(set(tokens + new_tokens)) == 6 and min(new_tokens) > 0
    staging = _staging(tracker)
    assert [staging.get("j", t) for t in tokens] == [b"page 0", b"page 1", b"page 2"]
    assert item_states(redis_client, "j", reported + leased) == ["s0"] * 3 + ["l0"] * 3
    dispatched = [x for r in results for x in r.dispatch]
    assert len(dispatched) == len(set(dispatched))  # every new page handed out once at most
    for url, res in zip(leased, leases):  # each lease is the one the tracker holds
        assert tracker.scraped("j", url, res.token).held


def test_scraped_calls_made_at_once_keep_each_body_and_each_reply(tracker, redis_client):
    urls = [f"http://127.0.0.1/p{n}" for n in range(5)]
    tracker.add("j", urls)
    worker = tracker.register_worker("host", 1, 8)
    tokens = [tracker.checkout("j", u, worker, max_lost=3).token for u in urls]
    stale = tokens[4] + 1000  # a token that does not hold p4
    calls = [
        # Two pages find the same new link: it is added once, by the first call.
        lambda: tracker.scraped("j", urls[0], tokens[0], ["http://127.0.0.1/a", "http://127.0.0.1/b"],
                                1, body=b"page 0"),
        lambda: tracker.scraped("j", urls[1], tokens[1], ["http://127.0.0.1/b"], 1, body=b"page 1"),
        lambda: tracker.scraped("j", urls[2], tokens[2], [], 1, body=b"\x00page 2\xff"),
        lambda: tracker.scraped("j", urls[3], tokens[3], [urls[0], "http://127.0.0.1/c"], 1,
                                body=b"page 3"),
        lambda: tracker.scraped("j", urls[4], stale, ["http://127.0.0.1/d"], 1, body=b"stale"),
    ]
    before = script_calls(redis_client)
    results = run_paused(redis_client, calls)
    assert script_calls(redis_client) - before == 2
    assert not any(isinstance(r, Exception) for r in results), results
    assert [r.held for r in results] == [True, True, True, True, False]
    # Which call added "b" depends on the order the threads reached Redis; the total does not.
    assert sum(r.added for r in results) == 4  # a, b, c, d: each once
    assert results[2].added == 0
    assert results[4].added == 1  # a stale holder's finds are real, and queued
    staging = _staging(tracker)
    assert [staging.get("j", t) for t in tokens[:4]] == [b"page 0", b"page 1", b"\x00page 2\xff",
                                                        b"page 3"]
    assert staging.get("j", stale) is None  # a stale holder stages nothing
    assert item_states(redis_client, "j", urls) == ["s0", "s0", "s0", "s0", "l0"]
    dispatched = [x for r in results for x in r.dispatch]
    assert len(dispatched) == len(set(dispatched))  # every new page handed out once at most


def _staging(tracker):
    kw = {**tracker.client.get_connection_kwargs(), "decode_responses": False}
    return RedisBodyStaging(redis.Redis(connection_pool=redis.ConnectionPool(**kw)), 60)


def test_calls_made_at_once_for_a_missing_job_each_raise(tracker, redis_client):
    worker = tracker.register_worker("host", 1, 4)
    tracker.checkout("j", "http://127.0.0.1/none", worker, max_lost=3)
    results = run_paused(redis_client, [
        lambda n=n: tracker.checkout("gone", f"http://127.0.0.1/{n}", worker, max_lost=3)
        for n in range(4)])
    assert all(isinstance(r, JobNotFound) for r in results), results
    assert len({id(r) for r in results}) == 4  # each thread its own exception
    # The calls after them go on, alone or together.
    assert tracker.checkout("j", "http://127.0.0.1/none", worker, max_lost=3).status \
        is LeaseStatus.UNKNOWN


# -- the combiner on its own ------------------------------------------------------------------


class Gate:
    """A send that holds each batch until the test lets it go, and records what it sent."""

    def __init__(self, fail_with=None):
        self.sent: list[list] = []
        self.entered = threading.Semaphore(0)
        self.go = threading.Semaphore(0)
        self.fail_with = fail_with

    def __call__(self, key, payloads):
        self.sent.append(list(payloads))
        self.entered.release()
        assert self.go.acquire(timeout=10)
        if self.fail_with is not None:
            raise self.fail_with
        return [f"{key}:{p}" for p in payloads]


def start(combiner, key, payload, out):
    def run():
        try:
            out[payload] = combiner.call(key, payload)
        except BaseException as exc:  # noqa: BLE001
            out[payload] = exc
    t = threading.Thread(target=run)
    t.start()
    return t


def wait_waiting(combiner, key, n):
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with combiner._lock:
            group = combiner._groups.get(key)
            if group is not None and len(group.waiting) == n:
                return
        time.sleep(0.001)
    raise AssertionError(f"never {n} waiting")


def test_combiner_sends_what_came_during_a_send_as_one_and_keys_apart():
    gate = Gate()
    c = Combiner(gate)
    out: dict = {}
    first = start(c, "k", 1, out)
    assert gate.entered.acquire(timeout=5)
    others = [start(c, "k", n, out) for n in (2, 3, 4)]
    other_key = start(c, "other", 9, out)  # another key does not wait for k's send
    assert gate.entered.acquire(timeout=5)
    wait_waiting(c, "k", 3)
    for _ in range(3):
        gate.go.release()
    for t in [first, *others, other_key]:
        t.join(5)
    assert sorted(map(sorted, gate.sent)) == [[1], [2, 3, 4], [9]]
    assert out == {1: "k:1", 2: "k:2", 3: "k:3", 4: "k:4", 9: "other:9"}
    gate.go.release()
    assert c.call("k", 5) == "k:5"  # nothing in flight: at once, alone


def test_a_send_carries_at_most_max_calls_and_max_weight():
    """What waits past the caps goes in the next send, led by the first left waiting; a call
    heavier than the cap still goes, alone."""
    gate = Gate()
    c = Combiner(gate, max_calls=3, max_weight=10)
    out: dict = {}
    threads = [start_weighted(c, "k", 1, 1, out)]
    assert gate.entered.acquire(timeout=5)
    for payload, weight in [(2, 4), (3, 4), (4, 4), (5, 1), (6, 1), (7, 1), (8, 50), (9, 1)]:
        threads.append(start_weighted(c, "k", payload, weight, out))
        wait_waiting(c, "k", payload - 1)
    for _ in range(6):
        gate.go.release()
    for t in threads:
        t.join(5)
    # 2+3 weigh 8 (4 would make 12); 4+5+6 are three calls; 7 then 8 would weigh 51; 8 alone.
    assert gate.sent == [[1], [2, 3], [4, 5, 6], [7], [8], [9]]
    assert out == {n: f"k:{n}" for n in range(1, 10)}


def start_weighted(combiner, key, payload, weight, out):
    def run():
        out[payload] = combiner.call(key, payload, weight)
    t = threading.Thread(target=run)
    t.start()
    return t


def test_combiner_gives_each_caller_the_error_and_goes_on():
    gate = Gate(fail_with=redis.ConnectionError("gone"))
    c = Combiner(gate)
    out: dict = {}
    first = start(c, "k", 1, out)
    assert gate.entered.acquire(timeout=5)
    others = [start(c, "k", n, out) for n in (2, 3)]
    wait_waiting(c, "k", 2)
    gate.go.release()
    assert gate.entered.acquire(timeout=5)
    gate.go.release()
    for t in [first, *others]:
        t.join(5)
    assert all(isinstance(out[n], redis.ConnectionError) for n in (1, 2, 3))
    assert out[2] is not out[3]
    gate.fail_with = None
    gate.go.release()
    assert c.call("k", 4) == "k:4"


def test_an_interrupted_waiter_passes_the_lead_on(monkeypatch):
    """A waiting caller interrupted (an exception raised in its thread, as by a signal) leaves
    the queue; if the lead had just been handed to it, the next caller takes it, so none waits
    for ever."""
    interrupt = threading.Event()

    class InterruptibleEvent(threading.Event):
        def wait(self, timeout=None):
            interrupt.wait(10)
            raise KeyboardInterrupt

    real_call = combine._Call

    def make(payload, weight=1):
        call = real_call(payload, weight)
        if payload == 2:
            call.ready = InterruptibleEvent()
        return call

    monkeypatch.setattr(combine, "_Call", make)
    gate = Gate()
    c = Combiner(gate)
    out: dict = {}
    first = start(c, "k", 1, out)
    assert gate.entered.acquire(timeout=5)
    second = start(c, "k", 2, out)
    wait_waiting(c, "k", 1)
    third = start(c, "k", 3, out)
    wait_waiting(c, "k", 2)
    gate.go.release()  # the first's send returns: the lead goes to 2, which is interrupted now
    first.join(5)
    with c._lock:
        waiting = c._groups["k"].waiting
        assert [w.payload for w in waiting] == [2, 3] and waiting[0].lead
    interrupt.set()
    second.join(5)
    assert gate.entered.acquire(timeout=5)  # 3 took the lead and sends
    gate.go.release()
    third.join(5)
    assert out[1] == "k:1" and out[3] == "k:3"
    assert isinstance(out[2], KeyboardInterrupt)
    assert gate.sent == [[1], [3]]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_does_not_inherit_a_held_lock():
    c = Combiner(lambda key, payloads: [p * 2 for p in payloads])
    with c._lock:
        pid = os.fork()
        if pid == 0:  # the child: the parent's thread holds the lock it copied
            signal.alarm(5)  # a child stuck on that lock dies rather than hang the test
            code = 0 if c.call("k", 21) == 42 else 1
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert c.call("k", 1) == 2
