"""Sharded jobs, on one Redis and on a real three-master Redis Cluster started by the test:
the tracker contract across shards, completion recorded once, the active-jobs mirror, and a crawl
by real worker processes whose job lives on several masters."""

from __future__ import annotations

import json
import threading
import time

import pytest
from tests.support.crawl import crawl_settings, expected_files, saved_files
from redis.cluster import RedisCluster
from tests.support.redis_cluster import RedisClusterProcess
from distscrape_celery.testing.sitegen import SiteServer, generate_site
from tests.support.cli import run
from tests.support.crawl import wait_until
from tests.support.tracker_state import item_state
from tests.support.jobs import new_job

from distscrape_celery.tracker import keys
from distscrape_celery.worker.app import configure_app
from distscrape_celery.local.embedded import EmbeddedRedis
from distscrape_celery.errors import ConfigError, JobStateError
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.settings import Settings
from distscrape_celery.tracker.redis.staging import RedisBodyStaging
from distscrape_celery.worker.publish import publisher
from distscrape_celery.tracker import Fault, JobAction, JobState, LeaseStatus, RedisTracker, SaveStart
from distscrape_celery.tracker.model import CrawlLimits
from distscrape_celery.tracker.redis import connect

SPEC = '{"seeds": ["http://a.invalid/"], "tracker": {"shards": 3}}'
ITEMS = [f"http://h{i}.invalid/" for i in range(12)]  # a domain each, spread over the shards


@pytest.fixture(scope="module")
def cluster():
    with RedisClusterProcess(masters=3) as c:
        yield c


@pytest.fixture(params=["one-redis", "cluster"])
def tracker(request, redis_url):
    """A tracker of a flushed Redis: a standalone server, or the three-master cluster; twice its
    workers' slots in scrape messages, so that every shard has a share of them."""
    if request.param == "cluster":
        c = request.getfixturevalue("cluster")
        c.flush()
        t = RedisTracker.from_url(c.url, cluster=True, bound_refresh_seconds=0,
                                  dispatch_factor=2)
        t.test_url = c.url
    else:
        t = RedisTracker.from_url(redis_url, bound_refresh_seconds=0, dispatch_factor=2)
        t.test_url = redis_url
    return t


def shard_items(t):
    """Item -> its shard, as the tracker routes it."""
    return {item: keys.shard_of(keys.domain_of(item), 3) for item in ITEMS}


def sharded_job(t, items=ITEMS, max_pages=None):
    """Job "j" on three shards with one worker, and ``items`` added: (worker id, AddResult)."""
    w = new_job(t, concurrency=3, spec=SPEC,  # bound 6: 2 per shard
                limits=CrawlLimits(shards=3, max_pages=max_pages))
    return w, t.add("j", items)


def finish(t, w, item):
    """Scrape and save ``item``; returns every item its calls handed out for dispatch."""
    co = t.checkout("j", item, w, max_lost=3)
    assert co.status is LeaseStatus.OK, co
    out = co.dispatch + t.scraped("j", item, co.token).dispatch
    out += t.begin_save("j", item, co.token, w, max_lost=3).dispatch
    return out + t.complete("j", item).dispatch


def drain(t, w, pending):
    """Finish every dispatched item, and those dispatched meanwhile, until none is left."""
    pending = list(pending)
    while pending:
        pending.extend(finish(t, w, pending.pop()))
    assert t.stats("j").queued == 0


def test_items_live_in_their_domains_shard_and_dedup_holds_across_shards(tracker):
    t = tracker
    w, res = sharded_job(t)
    assert res.added == len(ITEMS)
    assert len(set(shard_items(t).values())) == 3  # the test's items reach every shard
    # Every item's state is in its own shard's live items, and only there.
    for item, shard in shard_items(t).items():
        for s in range(3):
            assert (item_state(t.client, "j", item, s) is not None) == (s == shard)
    assert t.add("j", ITEMS + [ITEMS[0]]).added == 0  # dedup within and across calls
    # Each shard tops up to its share of the bound (ceil(6 / 3) = 2 each).
    assert len(res.dispatch) == 6
    stats = t.stats("j")
    assert (stats.seen, stats.queued, stats.dispatched) == (12, 12, 6)
    # A found link of another shard is queued in that shard by scraped.
    item = res.dispatch[0]
    co = t.checkout("j", item, w, max_lost=3)
    other = next(f"http://n{i}.invalid/" for i in range(100)
                 if keys.shard_of(f"n{i}.invalid", 3) != shard_items(t)[item])
    assert t.scraped("j", item, co.token, [other, ITEMS[1]], depth=1).added == 1
    assert item_state(t.client, "j", other, keys.shard_of(keys.domain_of(other), 3))
    assert t.stats("j").seen == 13
    assert t.checkout("j", item, w, max_lost=3).status is LeaseStatus.BUSY
    t.begin_save("j", item, co.token, w, max_lost=3)
    t.complete("j", item)
    # Done: gone from its shard's live items, remembered by its shard's seen set.
    assert item_state(t.client, "j", item, shard_items(t)[item]) is None
    assert t.checkout("j", item, w, max_lost=3).status is LeaseStatus.DONE
    assert t.add("j", [item]).added == 0 and t.stats("j").done == 1
    assert t.leased_by_worker("j") == {}


def test_fencing_tokens_are_unique_across_shards(tracker):
    # A staged body is keyed by job and token: two shards' leases must never share a token.
    t = tracker
    w, res = sharded_job(t)
    tokens = [t.checkout("j", item, w, max_lost=3).token for item in res.dispatch]
    assert len({shard_items(t)[i] for i in res.dispatch}) == 3
    assert len(set(tokens)) == len(tokens) and all(tokens)


def test_a_staged_body_lives_in_the_shard_of_its_token(tracker):
    t = tracker
    w, res = sharded_job(t)
    item = next(i for i in res.dispatch if shard_items(t)[i] == 2)
    token = t.checkout("j", item, w, max_lost=3).token
    assert keys.body_key("j", token).startswith("ds:{j:2}:body:")
    staging = RedisBodyStaging(connect(t.test_url, cluster=t.cluster, decode_responses=False), 60)
    # Staged by the scraped script itself, with the shard's item keys: one slot on a cluster.
    assert t.scraped("j", item, token, body=b"page").held
    assert t.client.exists(keys.JobKeys("j", 2).body(token)) and staging.get("j", token) == b"page"
    assert t.begin_save("j", item, token, w, max_lost=3).status is SaveStart.OK
    assert t.complete("j", item, token).changed  # and drops the body in the same script
    assert not t.client.exists(keys.JobKeys("j", 2).body(token)) and staging.get("j", token) is None


def test_pause_and_cancel_reach_every_shard(tracker):
    t = tracker
    w, res = sharded_job(t)
    assert t.control("j", JobAction.PAUSE).after is JobState.PAUSED
    assert all(t.checkout("j", i, w, max_lost=3).status is LeaseStatus.HELD for i in res.dispatch)
    assert t.maintain("j", max_lost=3).dispatch == [] and t.add("j", ["http://x.invalid/"]).dispatch == []
    resumed = t.control("j", JobAction.RESUME)
    assert (resumed.before, resumed.after) == (JobState.PAUSED, JobState.RUNNING)
    assert len(resumed.dispatch) == 6
    assert t.control("j", JobAction.CANCEL).after is JobState.CANCELLED
    assert t.job_info("j").state is JobState.CANCELLED and t.active_jobs() == []
    assert t.job_info("j").final["seen"] == 13
    assert t.add("j", ["http://y.invalid/"]).dispatch == [] and t.active_jobs() == []


def test_completion_is_recorded_once_and_new_work_reactivates(tracker):
    t = tracker
    # Four domains only: at least one of the three shards is never given an item, and the
    # job still finishes.
    w, res = sharded_job(t, ITEMS[:4])
    drain(t, w, res.dispatch)
    assert t.active_jobs() == ["j"]  # its end is not recorded yet: still maintained
    results: list[bool] = []

    def maintain():
        for _ in range(5):
            results.append(t.maintain("j", max_lost=3).finished)

    threads = [threading.Thread(target=maintain) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert results.count(True) == 1, results  # exactly one maintain reports it
    info = t.job_info("j")
    assert info.state is JobState.FINISHED and info.final == {"seen": 4, "done": 4, "dead": 0}
    assert t.active_jobs() == [] and not t.maintain("j", max_lost=3).finished
    with pytest.raises(JobStateError):
        t.control("j", JobAction.PAUSE)
    # New work on any shard makes it run, be maintained, and finish (once) again.
    t.add("j", ["http://more.invalid/"])
    assert t.job_info("j").state is JobState.RUNNING and t.active_jobs() == ["j"]
    co = t.checkout("j", "http://more.invalid/", w, max_lost=3)
    t.fail("j", "http://more.invalid/", co.token, "gone", fault=Fault.ITEM, max_retries=0,
           max_lost=3, retryable=False)
    assert [t.maintain("j", max_lost=3).finished for _ in range(3)] == [True, False, False]
    assert t.active_jobs() == []
    assert t.retry_dead("j").requeued == 1 and t.active_jobs() == ["j"]


def test_a_crawl_delay_reaches_the_domains_shard(tracker):
    t = tracker
    w, _ = sharded_job(t, [])
    shard = keys.shard_of("h5.invalid", 3)
    t.set_domain_delay("j", "h5.invalid", 0.6)
    assert [t.client.hget(keys.JobKeys("j", s).policy, "delay:h5.invalid") for s in range(3)] \
        == [("0.6" if s == shard else None) for s in range(3)]
    t.add("j", ["http://h5.invalid/a", "http://h5.invalid/b"])
    first = t.checkout("j", "http://h5.invalid/a", w, max_lost=3)
    second = t.checkout("j", "http://h5.invalid/b", w, max_lost=3)
    assert first.status is LeaseStatus.OK and second.status is LeaseStatus.THROTTLED
    assert 0.3 < second.wait <= 0.6


def test_a_resumed_job_with_an_empty_shard_still_leaves_the_active_list(tracker):
    t = tracker
    w, res = sharded_job(t, ITEMS[:4])  # four domains: a shard is left empty
    t.control("j", JobAction.CANCEL)
    resumed = t.control("j", JobAction.RESUME)  # marks every shard active, the empty one too
    assert t.active_jobs() == ["j"]
    drain(t, w, res.dispatch + resumed.dispatch)
    assert [t.maintain("j", max_lost=3).finished for _ in range(2)] == [True, False]
    assert t.job_info("j").state is JobState.FINISHED and t.active_jobs() == []


def test_a_job_listed_by_a_client_that_died_is_healed(tracker):
    t = tracker
    sharded_job(t, ITEMS[:2])
    # A client that died after its add script, before it mirrored the shard's marker.
    t.client.srem(keys.ACTIVE_JOBS, "j")
    assert t.active_jobs() == []
    assert t.heal_active_jobs() == 1 and t.active_jobs() == ["j"]
    assert t.heal_active_jobs() == 0


def test_max_pages_is_split_over_the_shards(tracker):
    t = tracker
    _, res = sharded_job(t, [], max_pages=7)
    per_shard = [int(t.client.hget(keys.JobKeys("j", s).policy, "max_pages")) for s in range(3)]
    assert per_shard == [3, 2, 2]
    many = [f"http://m{i}.invalid/" for i in range(60)]
    t.add("j", many)
    # Each shard stops at its share: 7 in all, exactly when every shard had enough domains.
    assert t.stats("j").seen == 7


def test_delete_removes_every_shards_keys(tracker):
    t = tracker
    w, res = sharded_job(t)
    finish(t, w, res.dispatch[0])
    t.delete_job("j")
    assert t.jobs() == [] and t.active_jobs() == []
    assert not list(t.client.scan_iter(match="ds:{j*"))


def test_a_cluster_tracker_needs_a_separate_broker():
    with pytest.raises(ConfigError, match="DISTSCRAPE_BROKER_URL must be set when "
                                          "DISTSCRAPE_REDIS_CLUSTER is true"):
        Settings.from_env({"DISTSCRAPE_REDIS_CLUSTER": "true"})
    assert Settings.from_env({"DISTSCRAPE_REDIS_CLUSTER": "true",
                              "DISTSCRAPE_BROKER_URL": "amqp://guest@127.0.0.1//"}).redis_cluster


def test_shards_is_validated():
    with pytest.raises(ConfigError, match="tracker.shards"):
        build_spec({"seeds": ["http://a.invalid/"], "tracker": {"shards": 0}})
    assert build_spec({"seeds": ["http://a.invalid/"]}).to_json().count("tracker") == 0


# -- a crawl by real workers ------------------------------------------------------------------


def masters_of(c: RedisClusterProcess, job: str, shards: int) -> dict[int, int]:
    """Shard -> port of the master holding it."""
    client = RedisCluster.from_url(c.url)
    try:
        return {s: int(client.get_node_from_key(keys.JobKeys(job, s).spec).port)
                for s in range(shards)}
    finally:
        client.close()


def test_crawl_on_a_three_master_cluster(cluster, workers, tmp_path):
    cluster.flush()
    # A job name whose three shards are on three masters.
    job = next(f"c{i}" for i in range(1000) if len(set(masters_of(cluster, f"c{i}", 3).values())) == 3)
    with EmbeddedRedis() as broker:
        sites, servers = [], []
        try:
            # Sites on ports whose domains fall into at least two shards.
            while len(servers) < 3 or len({keys.shard_of(s.url("/").split("/")[2], 3)
                                           for s in servers}) < 2:
                site = generate_site(n_pages=40, seed=len(sites), unreachable=3)
                sites.append(site)
                servers.append(SiteServer(site).__enter__())
            settings = crawl_settings(cluster.url, redis_cluster=True, broker_url=broker.url,
                                      lease_seconds=30)
            procs = [workers(settings, f"cluster-{i}", include=["tests.plugins.hooks"])
                     for i in range(2)]
            tracker = RedisTracker.from_url(cluster.url, cluster=True)
            wait_for_workers(tracker, 2, procs=procs)
            configure_app(settings)
            out = tmp_path / "out"
            spec = build_spec({"seeds": [s.url("/") for s in servers],
                               "saver": {"output": str(out)}, "tracker": {"shards": 3}})
            manager = CrawlManager(tracker, publisher.scrape)
            manager.seed(job, spec)

            def check():
                for p in procs:
                    p.check()

            stats = manager.wait(job, timeout=180, check=check)
            n = sum(len(site.reachable) for site in sites)
            assert (stats.done, stats.dead, stats.seen) == (n, 0, n)
            expected = {}
            for site, server in zip(sites, servers):
                expected.update(expected_files(server, site, out))
            assert saved_files(out) == expected
            for site, server in zip(sites, servers):
                counts = server.counts()
                assert set(counts) == site.reachable
                assert max(counts.values()) == 1  # every page fetched (and saved) once
            # The job's items really live on more than one master: each shard that was given
            # items keeps their fingerprints in its seen-set buckets (done items leave the live ones).
            holders = {port for port, found in cluster.keys_by_node(f"ds:{{{job}*").items()
                       if any(":f:" in k for k in found)}
            assert len(holders) >= 2, holders
            # Its end is recorded once, and it leaves the maintained jobs.
            wait_until("the job's end is recorded",
                       lambda: tracker.job_info(job).state is JobState.FINISHED, procs=procs)
            wait_until("the job to leave the active list",
                       lambda: job not in tracker.active_jobs(), procs=procs)

            def hook_lines():
                return sum(p.log_path.read_text(errors="replace").count(
                    f"job_finished hook: {job} finished") for p in procs)

            wait_until("the job_finished hook", lambda: hook_lines() >= 1, procs=procs)
            time.sleep(2)  # several heartbeats of both workers: no second event
            assert hook_lines() == 1
        finally:
            for server in servers:
                server.__exit__(None, None, None)


def test_cli_seeds_reports_and_deletes_a_sharded_job_on_the_cluster(cluster, tmp_path):
    cluster.flush()
    env = {"DISTSCRAPE_REDIS_URL": cluster.url, "DISTSCRAPE_REDIS_CLUSTER": "true",
           "DISTSCRAPE_BROKER_URL": "redis://127.0.0.1:1/0"}  # never reached: no worker is asked
    seeds = [f"http://s{i}.invalid/" for i in range(9)]
    res = run("seed", "sj", *seeds, "--shards", "3", "--all-hosts", "--output",
              str(tmp_path / "o"), env=env)
    # Seeding publishes nothing: no worker is alive, so the broker's bound is 0.
    assert res.returncode == 0, res.stderr
    status = json.loads(run("status", "sj", "--json", env=env).stdout)
    assert status["seen"] == 9 and status["state"] == "running"
    assert "sj" in run("jobs", env=env).stdout
    bad = run("seed", "sk", seeds[0], "--shards", "0", env=env)
    assert bad.returncode == 2 and "--shards" in bad.stderr
    res = run("delete", "sj", "--force", env=env)
    assert res.returncode == 0, res.stderr
    assert not any(found for found in cluster.keys_by_node("ds:{sj*").values())


def test_a_stale_save_with_another_shards_token_still_gets_its_body(tracker):
    """begin_save reads the body in its own script when the token's shard holds the item; a token
    of another shard (so a stale one) has its body read on its own, from that shard's slot."""
    t = tracker
    w, res = sharded_job(t)
    by_shard = {shard_items(t)[i]: i for i in res.dispatch}
    token = t.checkout("j", by_shard[2], w, max_lost=3).token
    assert t.scraped("j", by_shard[2], token, body=b"\x00page\xff").held
    other = t.checkout("j", by_shard[0], w, max_lost=3).token
    assert t.scraped("j", by_shard[0], other, body=b"other").held
    stale = t.begin_save("j", by_shard[0], token, w, max_lost=3)
    assert (stale.status, stale.body) == (SaveStart.STALE, b"\x00page\xff")
    assert t.begin_save("j", by_shard[0], other, w, max_lost=3).body == b"other"


def test_a_sharded_job_keeps_each_items_priority_in_the_items_shard(tracker):
    """Seeds, and links found in a page of another shard (which go through add first), keep
    their priority in their own shard; each shard hands out its highest first."""
    t = tracker
    w, _ = sharded_job(t, items=[])
    rank = 2**24  # a live value's rank: priority * 2**24 + depth
    t.add("j", ITEMS[:6], priority=4)
    page, found = ITEMS[6], ITEMS[7:]
    t.add("j", [page])
    co = t.checkout("j", page, w, max_lost=3)  # its domain has room: leased, queued or not
    assert co.status is LeaseStatus.OK, co
    t.scraped("j", page, co.token, found, depth=1, priorities=[-2] * len(found))
    # Queued or dispatched (each shard has room for two), at the rank they came with.
    for items, want in ((ITEMS[:6], 4 * rank), (found, -2 * rank + 1)):
        for item in items:
            state = item_state(t.client, "j", item, shard_items(t)[item])
            assert state[0] in "qd" and int(state[1:]) == want, (item, state)


def test_a_sharded_job_out_of_time_ends_expired(tracker):
    w = new_job(tracker, concurrency=3, spec=SPEC,
                limits=CrawlLimits(shards=3, max_duration=1.0))
    out = tracker.add("j", ITEMS).dispatch
    time.sleep(1.1)
    for item in out:
        assert tracker.checkout("j", item, w, max_lost=3).status is LeaseStatus.HELD
    assert tracker.maintain("j", max_lost=3).expired
    info = tracker.job_info("j")
    assert info.state is JobState.EXPIRED and info.final["queued"] == len(ITEMS)
    assert "j" not in tracker.active_jobs()
    with pytest.raises(JobStateError, match="expired"):
        tracker.control("j", JobAction.RESUME)
