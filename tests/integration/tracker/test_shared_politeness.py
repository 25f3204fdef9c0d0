"""A site's budget shared by every job crawling it, and politeness by address, in the tracker's
Lua: on InMemoryTracker and on RedisTracker against a real Redis (and, for what a cluster keeps
apart, a real Redis Cluster)."""

from __future__ import annotations

import time

import pytest

from distscrape_celery.tracker import CrawlLimits, DomainLimits, LeaseStatus, RedisTracker
from distscrape_celery.tracker import keys
from tests.support.jobs import new_job
from tests.support.redis_cluster import RedisClusterProcess

# A broker bound roomy enough that dispatch never holds an item back in these tests.
ROOMY = 8


def two_jobs(t, limits: CrawlLimits, other: CrawlLimits | None = None) -> str:
    """Jobs "a" and "b" (``other``'s limits for b, else ``limits``); returns the worker's id."""
    new_job(t, "a", ROOMY, limits=limits)
    return new_job(t, "b", ROOMY, limits=other or limits)


def lease(t, job: str, item: str, worker: str, address: str = ""):
    return t.checkout(job, item, worker, max_lost=3, address=address)


def wait_for_dispatch(t, job: str, worker: str) -> list[str]:
    """What ``job``'s maintenance hands out first, once it hands something out (``worker``
    kept live meanwhile)."""
    deadline = time.monotonic() + 10
    while True:
        t.heartbeat(worker)
        handed = t.maintain(job, max_lost=3).dispatch
        if handed:
            return handed
        assert time.monotonic() < deadline, "nothing was dispatched"
        time.sleep(0.02)


def test_two_jobs_on_one_site_share_its_fetch_slot(tracker_factory):
    t = tracker_factory()
    w = two_jobs(t, CrawlLimits(default=DomainLimits(interval=0.5)))
    (a,) = t.add("a", ["http://site.invalid/x"]).dispatch
    (b,) = t.add("b", ["http://site.invalid/x"]).dispatch
    (c,) = t.add("b", ["http://other.invalid/x"]).dispatch
    assert lease(t, "a", a, w).status is LeaseStatus.OK
    # The other job's fetch of the same site waits out the interval a's fetch began...
    throttled = lease(t, "b", b, w)
    assert throttled.status is LeaseStatus.THROTTLED
    assert 0.3 < throttled.wait <= 0.5, throttled.wait
    # ...and another site is not held back.
    assert lease(t, "b", c, w).status is LeaseStatus.OK
    assert wait_for_dispatch(t, "b", w) == [b]  # when the site's slot opens
    assert lease(t, "b", b, w).status is LeaseStatus.OK


def test_the_strictest_job_sets_the_pace_of_a_shared_site(tracker_factory):
    t = tracker_factory()
    w = two_jobs(t, CrawlLimits(default=DomainLimits(interval=0.05)),
                 CrawlLimits(default=DomainLimits(interval=1.0)))
    t.add("a", ["http://site.invalid/x", "http://site.invalid/y"])
    t.add("b", ["http://site.invalid/x"])
    assert lease(t, "b", "http://site.invalid/x", w).status is LeaseStatus.OK
    # The fast job's fetch waits the slow job's interval after the slow job's fetch...
    throttled = lease(t, "a", "http://site.invalid/x", w)
    assert throttled.status is LeaseStatus.THROTTLED and throttled.wait > 0.5, throttled.wait
    time.sleep(throttled.wait + 0.02)
    assert lease(t, "a", "http://site.invalid/x", w).status is LeaseStatus.OK
    # ...and, while the slow job crawls the site, after the fast job's own fetches too.
    throttled = lease(t, "a", "http://site.invalid/y", w)
    assert throttled.status is LeaseStatus.THROTTLED and throttled.wait > 0.5, throttled.wait


def test_two_jobs_share_a_sites_in_flight_cap(tracker_factory):
    t = tracker_factory()
    w = two_jobs(t, CrawlLimits(default=DomainLimits(concurrency=2)))
    first = t.add("a", ["http://site.invalid/1", "http://site.invalid/2"]).dispatch
    tokens = {item: lease(t, "a", item, w).token for item in first}
    assert all(tokens.values())
    (b,) = t.add("b", ["http://site.invalid/1"]).dispatch
    # Two fetches of the site are under way (job a's): job b's waits, briefly.
    throttled = lease(t, "b", b, w)
    assert throttled.status is LeaseStatus.THROTTLED and 0 < throttled.wait <= 1.0
    # One of them ends (its page is scraped): b's fetch may start.
    t.scraped("a", first[0], tokens[first[0]])
    wait_for_dispatch(t, "b", w)
    assert lease(t, "b", b, w).status is LeaseStatus.OK


def test_a_job_alone_is_held_back_by_its_own_cap_only(tracker_factory):
    """The site's cap holds a fetch back only while another job has fetches under way: alone, a
    job's dispatched items go as they did before sites were shared."""
    t = tracker_factory()
    w = new_job(t, "a", ROOMY, limits=CrawlLimits(default=DomainLimits(concurrency=2)))
    first = t.add("a", [f"http://site.invalid/{i}" for i in range(4)]).dispatch
    assert len(first) == 2
    assert all(lease(t, "a", item, w).status is LeaseStatus.OK for item in first)


def test_a_deleted_job_frees_its_places_at_once(tracker_factory):
    t = tracker_factory()
    w = two_jobs(t, CrawlLimits(default=DomainLimits(concurrency=1)))
    (a,) = t.add("a", ["http://site.invalid/1"]).dispatch
    assert lease(t, "a", a, w).status is LeaseStatus.OK
    (b,) = t.add("b", ["http://site.invalid/1"]).dispatch
    assert lease(t, "b", b, w).status is LeaseStatus.THROTTLED
    t.delete_job("a")
    wait_for_dispatch(t, "b", w)
    assert lease(t, "b", b, w).status is LeaseStatus.OK


def test_a_vanished_workers_fetch_stops_counting_when_its_lease_runs_out(tracker_factory):
    t = tracker_factory(lease_seconds=1)
    w = two_jobs(t, CrawlLimits(default=DomainLimits(concurrency=1)))
    (a,) = t.add("a", ["http://site.invalid/1"]).dispatch
    assert lease(t, "a", a, w).status is LeaseStatus.OK  # and its worker never reports again
    (b,) = t.add("b", ["http://site.invalid/1"]).dispatch
    assert lease(t, "b", b, w).status is LeaseStatus.THROTTLED
    started = time.monotonic()
    # Job a is never maintained: its lease's deadline alone ends its count.
    while lease(t, "b", b, w).status is not LeaseStatus.OK:
        assert time.monotonic() - started < 10, "b's fetch never started"
        wait_for_dispatch(t, "b", w)
    assert time.monotonic() - started > 0.5


def test_pacing_by_address_paces_host_names_of_one_address_as_one(tracker_factory):
    t = tracker_factory()
    w = new_job(t, "ip", ROOMY, limits=CrawlLimits(default=DomainLimits(interval=0.5), pace="ip"))
    one, two, three = t.add("ip", ["http://one.invalid/", "http://two.invalid/",
                                   "http://three.invalid/"]).dispatch
    assert lease(t, "ip", one, w, "192.0.2.7").status is LeaseStatus.OK
    # Another name, the same address: one site.
    throttled = lease(t, "ip", two, w, "192.0.2.7")
    assert throttled.status is LeaseStatus.THROTTLED and throttled.wait > 0.3
    # Another address: another site.
    assert lease(t, "ip", three, w, "192.0.2.8").status is LeaseStatus.OK


def test_pacing_by_host_ignores_the_address(tracker_factory):
    t = tracker_factory()
    w = new_job(t, "host", ROOMY, limits=CrawlLimits(default=DomainLimits(interval=0.5)))
    one, two = t.add("host", ["http://one.invalid/", "http://two.invalid/"]).dispatch
    assert lease(t, "host", one, w, "192.0.2.7").status is LeaseStatus.OK
    assert lease(t, "host", two, w, "192.0.2.7").status is LeaseStatus.OK


def test_an_ip_job_and_a_host_job_share_nothing_unless_their_sites_match(tracker_factory):
    """A job paced by address and one paced by host count different sites for one server: the
    budget is shared between jobs that name the site the same way."""
    t = tracker_factory()
    limits = DomainLimits(interval=0.5)
    new_job(t, "ip", ROOMY, limits=CrawlLimits(default=limits, pace="ip"))
    w = new_job(t, "host", ROOMY, limits=CrawlLimits(default=limits))
    (by_ip,) = t.add("ip", ["http://one.invalid/"]).dispatch
    (by_host,) = t.add("host", ["http://one.invalid/"]).dispatch
    assert lease(t, "ip", by_ip, w, "192.0.2.7").status is LeaseStatus.OK
    assert lease(t, "host", by_host, w).status is LeaseStatus.OK


def test_an_ended_fetch_leaves_no_site_keys_behind(tracker_factory):
    """The site's fetches under way empty as fetches end, and its slot key expires with the
    slot: nothing grows with the sites a crawl has visited but the recent jobs' entries, which
    expire too."""
    t = tracker_factory()
    w = new_job(t, "j", ROOMY, limits=CrawlLimits(default=DomainLimits(interval=0.05)))
    (item,) = t.add("j", ["http://site.invalid/"]).dispatch
    token = lease(t, "j", item, w).token
    client = t.client
    assert client.zcard(keys.SITES + "f:j:site.invalid") == 1
    t.scraped("j", item, token)
    t.complete("j", item)
    time.sleep(0.1)
    assert client.exists(keys.SITES + "f:j:site.invalid") == 0
    assert client.exists(keys.SITES + "s:site.invalid") == 0
    assert 0 < client.pttl(keys.SITES + "j:site.invalid") <= 10_000


@pytest.fixture(scope="module")
def cluster():
    with RedisClusterProcess(masters=3) as c:
        yield c


def test_on_a_cluster_each_job_keeps_its_own_budget(cluster):
    """A script's keys must share a cluster slot, and a job's cannot share one with another job's:
    on a cluster the budget is each job's own (and its scripts run, no CROSSSLOT)."""
    cluster.flush()
    t = RedisTracker.from_url(cluster.url, cluster=True, bound_refresh_seconds=0)
    w = two_jobs(t, CrawlLimits(default=DomainLimits(interval=0.5)))
    t.add("a", ["http://site.invalid/x", "http://site.invalid/y"])
    t.add("b", ["http://site.invalid/x"])
    assert lease(t, "a", "http://site.invalid/x", w).status is LeaseStatus.OK
    # The job's own pace holds; another job's does not.
    assert lease(t, "a", "http://site.invalid/y", w).status is LeaseStatus.THROTTLED
    assert lease(t, "b", "http://site.invalid/x", w).status is LeaseStatus.OK
