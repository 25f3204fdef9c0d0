"""Politeness in the tracker, on InMemoryTracker and on RedisTracker against a real Redis: the
per-domain frontier takes turns, in-flight caps and fetch slots hold, a throttled checkout hands
its item back, backed-off retries wait on the tracker's clock, page limits, retry_dead."""

from __future__ import annotations

import time

import pytest

from distscrape_celery.tracker import keys
from distscrape_celery.tracker import (
    CrawlLimits,
    DomainLimits,
    Fault,
    InMemoryTracker,
    LeaseStatus,
    RedisTracker,
    Urgent,
)
from distscrape_celery.tracker.redis.items import WAKE_WHILE_LEASED
from tests.support.jobs import SPEC, FakeClock, new_job

UNCAPPED = DomainLimits(concurrency=10_000)


def job(t, limits: CrawlLimits, concurrency: int = 2, name: str = "j") -> str:
    return new_job(t, name, concurrency, limits=limits)


def urls(host: str, n: int) -> list[str]:
    return [f"http://{host}/p{i}" for i in range(n)]


def domain_counts(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[keys.domain_of(item)] = out.get(keys.domain_of(item), 0) + 1
    return out


def wait_for(condition, timeout: float = 10.0, poll: float = 0.01):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(poll)


def test_domains_take_turns_so_a_big_site_does_not_starve_a_small_one(tracker_factory):
    t = tracker_factory(dispatch_factor=2)
    job(t, CrawlLimits(default=UNCAPPED), concurrency=2)  # broker bound 4
    first = t.add("j", urls("big.invalid", 1000)).dispatch
    assert domain_counts(first) == {"big.invalid": 4}
    assert t.add("j", urls("small.invalid", 10)).dispatch == []  # the broker is full
    handed_out = []
    pending = list(first)
    for _ in range(20):  # each completion frees one slot, refilled by the next domain's turn
        handed_out += t.complete("j", pending.pop(0)).dispatch
        pending += handed_out[-1:]
    # Turns alternate: the small site's 10 items all went out among the next 20, not after 1000.
    assert domain_counts(handed_out) == {"big.invalid": 10, "small.invalid": 10}


def test_a_slow_domain_gets_its_turn_ahead_of_faster_ones_that_waited_less_than_its_fetches():
    """The domain whose leases last longest decides when a crawl ends: while the broker has
    little room, its turns come as if it had waited its mean lease time longer. A domain with a
    fetch interval keeps to its slots and gets no head start. (The in-memory tracker runs the
    Redis scripts; its clock is moved by hand so that the lease times are exact.)"""
    clock = FakeClock(1_000_000.0)
    t = InMemoryTracker(dispatch_factor=1, save_backlog_factor=100, bound_refresh_seconds=0,
                        clock=clock)
    w = job(t, CrawlLimits(default=UNCAPPED, overrides={"rated.invalid": DomainLimits(
        concurrency=10_000, interval=0.001)}), concurrency=1)  # one scrape message at a time
    assert t.add("j", ["http://blocker.invalid/"]).dispatch == ["http://blocker.invalid/"]
    # Each domain queues 4 items and fetches its first (leased straight from its queue: the
    # broker is full), which takes `held` seconds. The fast domain waits longest.
    order = {}
    for host, held in (("fast.invalid", 0.0), ("slow.invalid", 1.0), ("rated.invalid", 0.4)):
        first, *rest = urls(host, 4)
        order[host] = rest
        assert t.add("j", [first, *rest]).dispatch == []
        token = t.checkout("j", first, w, max_lost=1).token
        clock.now += held + 0.05
        t.scraped("j", first, token)
    fast, slow, rated = order["fast.invalid"], order["slow.invalid"], order["rated.invalid"]
    handed_out = t.checkout("j", "http://blocker.invalid/", w, max_lost=1).dispatch
    while len(handed_out) < 6:
        handed_out += t.checkout("j", handed_out[-1], w, max_lost=1).dispatch
    # fast0 first (waiting longest); then slow's turns come 1 s early, ahead of rated0, which
    # waited 0.45 s; rated's next turn is 1 ms after its last, without a head start, so fast1
    # goes first.
    assert handed_out[:6] == [fast[0], slow[0], slow[1], slow[2], rated[0], fast[1]]


def test_a_domain_keeps_its_lease_times_only_while_it_has_work(tracker_factory):
    """Kept for every domain ever fetched, lease times would grow with a broad crawl's hosts.
    The job's own mean is one field."""
    t = tracker_factory(dispatch_factor=1)
    w = job(t, CrawlLimits(default=UNCAPPED), concurrency=2)
    a0, a1 = urls("a.invalid", 2)
    assert t.add("j", [a0, a1]).dispatch == [a0, a1]
    latency = keys.JobKeys("j").latency
    t.scraped("j", a0, t.checkout("j", a0, w, max_lost=1).token)
    assert set(t.client.hgetall(latency)) == {"a.invalid", "/job"}  # a1 is still in flight
    t.scraped("j", a1, t.checkout("j", a1, w, max_lost=1).token)
    assert set(t.client.hgetall(latency)) == {"/job"}  # nothing queued or in flight: forgotten


def test_a_slow_domains_items_go_ahead_of_the_broker_queue(tracker_factory):
    """While a message waits in the broker it holds one of its domain's places under the cap:
    an item of a domain whose leases take at least twice the job's mean comes out Urgent (its
    message goes ahead of those waiting). Not before any lease time is known, never for a fast
    domain, nor for one with a fetch interval, which keeps to its slots."""
    t = tracker_factory(dispatch_factor=1, save_backlog_factor=100)
    w = job(t, CrawlLimits(default=UNCAPPED, overrides={"rated.invalid": DomainLimits(
        concurrency=10_000, interval=0.001)}), concurrency=3)  # three scrape messages at a time
    fast, slow, rated = urls("fast.invalid", 5), urls("slow.invalid", 4), urls("rated.invalid", 4)
    first = t.add("j", [*fast, *slow, *rated]).dispatch
    assert first == [fast[0], rated[0], slow[0]]
    assert not any(isinstance(x, Urgent) for x in first)
    tokens, handed = {}, []
    for x in first:
        co = t.checkout("j", x, w, max_lost=1)
        tokens[x] = co.token
        handed += co.dispatch
    handed += t.scraped("j", fast[0], tokens[fast[0]]).dispatch  # a few ms: the job's mean
    assert handed and not any(isinstance(x, Urgent) for x in handed)
    # Slow and rated leases last 1 s, hundreds of times the fast ones: a fast lease would have to
    # stall some 0.35 s on a loaded machine to make its domain's mean twice the job's.
    time.sleep(1.0)
    early, handed = handed, []
    for x in (slow[0], rated[0]):
        handed += t.scraped("j", x, tokens[x]).dispatch

    def fetch(x: str) -> list[str]:
        co = t.checkout("j", x, w, max_lost=1)
        return co.dispatch + t.scraped("j", x, co.token).dispatch

    for x in early:  # handed out before: their messages are out already
        handed += fetch(x)
    seen = {*first, *early}
    deadline = time.monotonic() + 10
    while seen != {*fast, *slow, *rated} and time.monotonic() < deadline:
        if not handed:  # rated's next fetch slot was not open yet
            handed = list(t.maintain("j", max_lost=1).dispatch)
            continue
        x = handed.pop(0)
        seen.add(x)
        assert isinstance(x, Urgent) == (keys.domain_of(x) == "slow.invalid"), x
        handed += fetch(x)
    assert seen == {*fast, *slow, *rated}
    assert any(keys.domain_of(x) == "slow.invalid" for x in seen - {*first, *early})


def test_in_flight_cap_holds_across_dispatch_and_checkout(tracker_factory):
    t = tracker_factory(dispatch_factor=10)
    w = job(t, CrawlLimits(default=DomainLimits(concurrency=3)), concurrency=5)  # bound 50
    res = t.add("j", urls("a.invalid", 10) + urls("b.invalid", 10))
    assert domain_counts(res.dispatch) == {"a.invalid": 3, "b.invalid": 3}
    # An item of a domain at its cap, leased straight from its queue (a stray message), is
    # refused: it keeps its place in the queue.
    queued = "http://a.invalid/p9"
    co = t.checkout("j", queued, w, max_lost=1)
    assert co.status is LeaseStatus.THROTTLED and co.token == 0
    # Leasing a dispatched item keeps the count (it was in flight already); finishing its fetch
    # (scraped) lets one more of its domain out, and no more.
    item = res.dispatch[0]
    token = t.checkout("j", item, w, max_lost=1).token
    assert t.maintain("j", max_lost=1).dispatch == []
    more = t.scraped("j", item, token, [], 1).dispatch
    assert domain_counts(more) == {keys.domain_of(item): 1}
    s = t.stats("j")
    assert (s.frontier, s.dispatched, s.leased, s.save_pending) == (13, 6, 0, 1)


def test_throttled_checkout_hands_the_item_back_and_frees_the_slot(tracker_factory):
    t = tracker_factory(dispatch_factor=1)
    w = job(t, CrawlLimits(default=UNCAPPED), concurrency=2)  # bound 2
    a1, a2 = t.add("j", urls("a.invalid", 2)).dispatch
    b1, b2 = urls("b.invalid", 2)
    t.add("j", [b1, b2])  # they wait: the broker is full
    # robots.txt says a.invalid wants 0.6 s between fetches (set at run time, cluster-wide).
    t.set_domain_delay("j", "a.invalid", 0.6)
    co = t.checkout("j", a1, w, max_lost=1)  # takes a's fetch slot
    assert co.status is LeaseStatus.OK and co.dispatch == [b1]
    throttled_at = time.monotonic()  # before the call: the wait is counted from inside it
    co = t.checkout("j", a2, w, max_lost=1)
    assert co.status is LeaseStatus.THROTTLED and co.token == 0
    assert 0.3 < co.wait <= 0.6
    # Its broker slot went to the next domain at once; a2 waits in its queue, not in a worker.
    assert co.dispatch == [b2]
    s = t.stats("j")
    assert (s.frontier, s.dispatched, s.leased) == (1, 2, 1)
    for item in (a1, b1, b2):
        t.complete("j", item)  # room in the broker, but a's slot is not open yet
    res = t.maintain("j", max_lost=1)
    assert res.dispatch == [] and res.wake is not None and 0 < res.wake <= 0.6
    assert wait_for(lambda: t.maintain("j", max_lost=1).dispatch) == [a2]
    # Not before the slot opened, counted from the throttled checkout (the calls in between take
    # their time on a busy machine: counted from after them, a correct dispatch looked early).
    assert time.monotonic() - throttled_at >= co.wait - 0.05
    assert t.checkout("j", a2, w, max_lost=1).status is LeaseStatus.OK
    t.set_domain_delay("j", "a.invalid", 0)  # cleared: no interval any more


def test_rate_limit_spaces_fetches_of_a_domain(tracker_factory):
    t = tracker_factory(dispatch_factor=5)
    w = job(t, CrawlLimits(default=DomainLimits(interval=0.2)), concurrency=2)
    handed_out = t.add("j", urls("a.invalid", 6)).dispatch
    assert len(handed_out) == 1  # one turn per interval, though the broker has room
    starts = []
    deadline = time.monotonic() + 20
    while len(starts) < 6:
        assert time.monotonic() < deadline
        for item in handed_out:
            co = t.checkout("j", item, w, max_lost=1)
            if co.status is LeaseStatus.OK:
                starts.append(time.monotonic())
                t.complete("j", item)
        time.sleep(0.01)
        handed_out = t.maintain("j", max_lost=1).dispatch
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert min(gaps) >= 0.2 - 0.02, gaps


def test_delayed_retry_comes_back_when_due_and_not_before(tracker_factory):
    t = tracker_factory()
    w = job(t, CrawlLimits())
    (item,) = t.add("j", ["http://a.invalid/"]).dispatch
    # While an item is in flight its failure may start a short backoff: the agent is asked to
    # look again within WAKE_WHILE_LEASED, not only at its next heartbeat.
    assert t.maintain("j", max_lost=1).wake == pytest.approx(WAKE_WHILE_LEASED, abs=0.01)
    token = t.checkout("j", item, w, max_lost=1).token
    failed = time.monotonic()
    res = t.fail("j", item, token, "HTTP 503", fault=Fault.ITEM, max_retries=3, max_lost=1,
                 delay=0.5)
    assert res.outcome.value == "retry" and res.dispatch == []
    s = t.stats("j")
    assert (s.delayed, s.queued, s.leased, s.finished) == (1, 0, 0, False)  # not finished
    assert t.checkout("j", item, w, max_lost=1).status is LeaseStatus.BUSY  # not before its time
    assert t.add("j", []).dispatch == []
    assert wait_for(lambda: t.maintain("j", max_lost=1).dispatch) == [item]
    assert time.monotonic() - failed >= 0.5 - 0.02
    co = t.checkout("j", item, w, max_lost=1)
    assert (co.status, co.failed_attempts) == (LeaseStatus.OK, 1)
    assert t.stats("j").delayed == 0


def test_max_pages_caps_what_is_added(tracker_factory):
    t = tracker_factory()
    job(t, CrawlLimits(max_pages=5, max_pages_per_domain=3))
    assert t.add("j", urls("a.invalid", 2)).added == 2
    assert t.add("j", urls("a.invalid", 5)).added == 1  # a's third; duplicates count nothing
    assert t.add("j", urls("b.invalid", 1) + urls("c.invalid", 3)).added == 2  # 5 in all
    assert t.add("j", urls("d.invalid", 1)).added == 0
    assert t.stats("j").seen == 5


def test_retry_dead_requeues_with_fresh_counters(tracker_factory):
    t = tracker_factory(dispatch_factor=10)
    w = job(t, CrawlLimits())
    items = urls("a.invalid", 3)
    t.add("j", items)
    for item in items:
        token = t.checkout("j", item, w, max_lost=1).token
        t.fail("j", item, token, f"HTTP 404 {item}", fault=Fault.ITEM, max_retries=3,
               max_lost=1, retryable=False)
    assert dict(t.iter_dead("j")) == {i: f"HTTP 404 {i}" for i in items}
    assert t.stats("j").dead == 3
    res = t.retry_dead("j")
    assert res.requeued == 3 and sorted(res.dispatch) == sorted(items)
    s = t.stats("j")
    assert (s.dead, s.dispatched, s.seen) == (0, 3, 3)
    assert list(t.iter_dead("j")) == []
    assert t.checkout("j", items[0], w, max_lost=1).failed_attempts == 0
    assert t.retry_dead("j").requeued == 0


def test_the_domain_rule_is_the_same_in_python_and_lua(redis_url):
    """keys.domain_of mirrors domain_of in _lib.lua: each item lands in the queue Python names."""
    t = RedisTracker.from_url(redis_url)
    t.create_job("j", SPEC, CrawlLimits(id_domain="api.invalid:8080"))  # no worker: no dispatch
    items = [
        "http://Example.INVALID/a", "https://user:pw@x.invalid:8443/p?q=1#f", "http://a.invalid",
        "http://[::1]:80/", "ftp://h.invalid/x", "12345", "http://b.invalid?x=/y", "HTTP://c.invalid/",
        "http://ä.invalid/",
    ]
    t.add("j", items)
    k = keys.JobKeys("j")
    for item in items:
        domain = keys.domain_of(item, "api.invalid:8080")
        assert t.client.lrange(k.domain_queue(domain), 0, -1).count(item) == 1, (item, domain)
    assert keys.domain_of("12345", "api.invalid:8080") == "api.invalid:8080"
    assert keys.domain_of("https://user:pw@x.invalid:8443/p") == "x.invalid:8443"


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_job_limits_are_kept_when_the_job_exists(kind, request):
    from tests.conftest import make_tracker

    url = request.getfixturevalue("redis_url") if kind == "redis" else None
    t = make_tracker(kind, url)
    job(t, CrawlLimits(max_pages=1))
    assert t.create_job("j", SPEC, CrawlLimits()) is False  # same spec: the first limits stay
    assert t.add("j", urls("a.invalid", 3)).added == 1


@pytest.mark.parametrize("batched", [False, True])
def test_lease_times_a_batch_records_are_those_its_calls_would_record(batched):
    """A batch of page reports (calls made at the same time, sent as one) folds each page's lease
    time into its domain's mean and the job's, and writes them once, at its end: the means come
    out as the calls one by one make them, and a domain that went idle in the batch stays
    forgotten. The clock is moved by hand, so the times are exact."""
    def run(batched: bool) -> dict:
        clock = FakeClock(1_000_000.0)
        t = InMemoryTracker(dispatch_factor=1, bound_refresh_seconds=0, clock=clock)
        w = job(t, CrawlLimits(default=UNCAPPED), concurrency=4)
        a0, a1, a2 = urls("a.invalid", 3)
        [b0] = urls("b.invalid", 1)
        t.add("j", [a0, a1, b0])
        tokens = {}
        for i, item in enumerate([a0, a1, b0]):
            tokens[item] = t.checkout("j", item, w, max_lost=1).token
            clock.now += 0.1 * (i + 1)
        t.add("j", [a2])  # queued: a.invalid is not idle once a0 and a1 are in
        if batched:
            bound, max_batch, lease = t._top_up_args("j")
            t._eval_many([
                ("scraped", list(t._item_keys("j")), [item, tokens[item], 60, 1, bound, max_batch,
                                                      lease, "", "", 0, "", ""]) for item in [a0, b0, a1]])
        else:
            for item in [a0, b0, a1]:
                assert t.scraped("j", item, tokens[item]).held
        return t.client.hgetall(keys.JobKeys("j").latency)

    singles, got = run(False), run(batched)
    assert set(singles) == {"a.invalid", "/job"}  # b.invalid went idle: forgotten
    assert got == singles
