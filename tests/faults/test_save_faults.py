"""Faults around the save task, with real worker processes, a real Redis and a loopback site.

The savers (``tests/plugins/savers.py``) run in the workers' pool processes and take their
instructions from files next to the output directory: kill your own process the first time you
save these items, or every time, or pause in the save of this item. They log every call and every
write, so the tests can count how often each item was saved; the site server counts how often each
page was downloaded.

Two duplicate-save defects these tests found are fixed (begin_save answers busy while a run of
the same save holds a live lease).
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import threading
import time
from collections import Counter

import pytest
import redis
from tests.support.crawl import check_all, crawl_settings, expected_files, saved_files
from tests.plugins.savers import event_counts, instruct, paused_pid, save_events
from distscrape_celery.testing.sitegen import SiteServer, generate_site
from tests.support.tracker_state import item_state, live_items
from tests.support.tracker_state import lease_holders

from distscrape_celery.worker.app import configure_app
from distscrape_celery.worker.names import SAVE_BATCH_TASK, SAVE_QUEUE, SCRAPE_QUEUE
from distscrape_celery.job.spec import build_spec
from distscrape_celery.tracker.keys import HEARTBEATS, JobKeys
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.worker.lost_saves import queued_saves
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.settings import Settings
from distscrape_celery.worker.publish import publisher
from distscrape_celery.worker.tasks import save as save_task
from distscrape_celery.tracker import RedisTracker
from distscrape_celery.job.urls import normalize_url

LEASE = 2.0
DEFAULT_SAVE_BATCH = Settings.model_fields["save_batch_size"].default
SAVER = "tests.plugins.savers:CrashingSaver"
# The tests' own savers and scrapers: workers, and the checks of seeding, must allow them.
PLUGIN_MODULES = "tests.plugins"


def _setup(redis_url, start_worker, names, *, lease=LEASE, settings_kw=None, **worker_kw):
    settings = crawl_settings(redis_url, lease_seconds=lease, plugin_modules=PLUGIN_MODULES,
                              **(settings_kw or {}))
    tracker = RedisTracker.from_url(redis_url)
    procs = [start_worker(settings, name, **worker_kw) for name in names]
    wait_for_workers(tracker, len(procs), procs=procs)
    configure_app(settings)
    return settings, tracker, procs


def _manager(tracker) -> CrawlManager:
    """A manager whose seeding checks allow the tests' plugins."""
    return CrawlManager(tracker, publisher.scrape, settings=Settings(plugin_modules=PLUGIN_MODULES))


def _spec(server, out, saver=SAVER, **extra):
    return build_spec({
        "seeds": [server.url("/")], "saver": {"kind": saver, "output": str(out)},
        "max_retries": 0, **extra,
    })


def _crawl_with_victims(server, tracker, procs, job, spec, victims, timeout=60):
    """Crawl ``spec`` with the saves of ``victims`` (item -> path) killing their process once:
    (stats, seconds, fetches per path, the victims' request times per path)."""
    instruct(spec.saver.output, "crash_once", victims)
    started = time.monotonic()
    manager = _manager(tracker)
    manager.seed(job, spec)
    stats = manager.wait(job, timeout=timeout, check=check_all(procs))
    return (stats, time.monotonic() - started, server.counts(),
            {p: server.request_times(p) for p in victims.values()})


def _assert_nothing_in_flight(redis_client, job, fetched=None) -> None:
    """No owner, lease, pending save, dispatch or staged body is left. With ``fetched`` (the
    downloads of each page), the bodies staged under leases that were lost may wait out their
    TTL: at most one for each download past a page's first (a page can lose two leases to two
    kills, each with a body staged)."""
    in_flight = _in_flight(redis_client, job)
    if fetched is not None:
        left = list(redis_client.scan_iter(JobKeys(job).prefix + "body:*"))
        extra = sum(k - 1 for k in fetched.values())
        assert len(left) <= extra and all(redis_client.pttl(k) > 0 for k in left), (left, extra)
        in_flight["bodies"] = 0
    assert in_flight == dict.fromkeys(("owners", "leased", "pending", "dispatched", "bodies"), 0)


def _downloads_after_kill(out, victims, fetch_times) -> dict:
    """For each victim whose save killed its process: when it was downloaded after the kill
    (nothing, if its staged body was found)."""
    killed_at = {item: at for ev, _, at, item in save_events(out) if ev == "kill"}
    return {item: [t for t in fetch_times[victims[item]] if t > at] for item, at in killed_at.items()}


def _item(server, path: str) -> str:
    return normalize_url(server.url(path))


def _pages(site, k: int, seed: int) -> list[str]:
    """``k`` leaf-ish pages ("/p/N.html") of ``site``, chosen deterministically."""
    import random

    return random.Random(seed).sample(sorted(p for p in site.reachable if p.startswith("/p/")), k)


def _worker_logs(procs) -> str:
    return "".join(p.log_path.read_text(errors="replace") for p in procs if p.log_path.exists())


def _vanished_counts(logs: str) -> dict[str, int]:
    """How many times each item's holder vanished, by item, from the workers' "saving again" lines
    (the last count logged)."""
    counts: dict[str, int] = {}
    for m in re.finditer(r" (\S+): saving again; the worker holding it vanished (\d+) time", logs):
        counts[m[1]] = max(counts.get(m[1], 0), int(m[2]))
    return counts


def _assert_extra_downloads_had_a_vanished_holder(server, fetched, again, procs) -> None:
    """Each download of a page beyond its first had a holder that vanished (a killed process
    had scraped it and not yet queued its save). A page taken again after one kill can be caught
    by a later one too: seen in CI, downloaded 3 times, "vanished 2 time(s)"."""
    vanished = _vanished_counts(_worker_logs(procs))
    unexplained = {p: fetched[p] for p in again if fetched[p] - 1 > vanished.get(_item(server, p), 0)}
    assert not unexplained, (unexplained, vanished)


def _results(procs) -> Counter:
    """What became of each item a task ran, from the INFO lines: Celery's for the task's own
    ("... succeeded in 0.1s: 'saved'"), the pipeline's for those it carried on to ("... carried
    on to: saved")."""
    out: Counter = Counter()
    for line in _worker_logs(procs).splitlines():
        if "succeeded in" in line and ": '" in line:
            out[line.rsplit(": '", 1)[1].rstrip("'")] += 1
        elif ": carried on to: " in line:
            out[line.rsplit(": carried on to: ", 1)[1].strip()] += 1
    return out


def _queued_saves(redis_client) -> int:
    """How many items the save messages waiting in the broker's save queue carry (a message of
    ``distscrape.save_batch`` carries several)."""
    n = 0
    for raw in redis_client.lrange(SAVE_QUEUE, 0, -1):
        message = json.loads(raw)
        args = json.loads(base64.b64decode(message["body"]))[0]
        n += len(args[1]) if message["headers"]["task"] == SAVE_BATCH_TASK else 1
    return n


def _in_flight(redis_client, job: str) -> dict:
    k = JobKeys(job)
    return {
        "owners": redis_client.hlen(k.owners), "leased": redis_client.zcard(k.leased),
        "pending": redis_client.zcard(k.pending), "dispatched": redis_client.zcard(k.dispatched),
        "bodies": len(list(redis_client.scan_iter(k.prefix + "body:*"))),
    }


def _wait_broker_drained(redis_client, timeout=20.0) -> None:
    """Until both queues are empty and no message is unacknowledged (every delivered duplicate ran)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (redis_client.llen(SCRAPE_QUEUE) == 0 and redis_client.llen(SAVE_QUEUE) == 0
                and redis_client.hlen("unacked") == 0):
            return
        time.sleep(0.05)
    raise AssertionError("broker did not drain")


def _wait_written_by(out, item: str, pid: int, timeout: float = 15.0) -> None:
    """Until the saver in process ``pid`` has written ``item``."""
    deadline = time.monotonic() + timeout
    while not any(ev == "wrote" and p == pid and i == item for ev, p, _, i in save_events(out)):
        assert time.monotonic() < deadline, f"process {pid} never finished saving {item}"
        time.sleep(0.05)


def _report(name: str, **figures) -> None:
    print(f"\n{name}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))


# -- 1 -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [pytest.param(None, id="save-batches"),
                                        pytest.param(1, id="save-per-page")])
def test_sigkill_in_save_then_saved_exactly_once(
    redis_url, redis_client, start_worker, tmp_path, batch_size
):
    """The first save of each of 5 pages SIGKILLs its pool process. Celery delivers the save
    again (task_reject_on_worker_lost), the body is still staged, and the second save goes
    through: each page downloaded once, written once, nothing dead. With save batches (the
    default), pages the killed process had scraped and not yet queued for saving are downloaded
    again (a lease later), and only those."""
    site = generate_site(n_pages=60, seed=101, unreachable=0)
    settings_kw = {} if batch_size is None else {"save_batch_size": batch_size}
    _, tracker, procs = _setup(redis_url, start_worker, ["kill-a", "kill-b"], settings_kw=settings_kw)
    out, job = tmp_path / "out", "save-kill"
    n = len(site.reachable)
    with SiteServer(site, delay=0.02) as server:
        victims = {_item(server, p): p for p in _pages(site, 5, seed=1)}
        stats, elapsed, fetched, fetch_times = _crawl_with_victims(
            server, tracker, procs, job, _spec(server, out), victims)

    kills, calls, wrote = (event_counts(out, ev) for ev in ("kill", "call", "wrote"))
    _report("sigkill-in-save", elapsed=f"{elapsed:.1f}s", kills=sum(kills.values()),
            victim_fetches=[fetched[p] for p in victims.values()],
            victim_calls=[calls[i] for i in victims], victim_writes=[wrote[i] for i in victims],
            total_fetches=sum(fetched.values()), total_writes=sum(wrote.values()),
            results=dict(_results(procs)))
    assert (stats.seen, stats.done, stats.dead) == (n, n, 0)
    assert tracker.dead_items(job) == {}
    assert saved_files(out) == expected_files(server, site, out)
    assert kills == Counter(list(victims)), "every victim's first save must have killed its process"
    # The save was delivered again and found the staged body: no download after the kill. (With
    # save batches a victim may have been downloaded twice before its first save: when the process
    # that scraped it was killed by another victim's save before it queued this one's.)
    assert _downloads_after_kill(out, victims, fetch_times) == dict.fromkeys(victims, [])
    if batch_size == 1:
        assert {p: fetched[p] for p in victims.values()} == {p: 1 for p in victims.values()}
    assert {i: calls[i] for i in victims} == {i: 2 for i in victims}
    # One write per item in the end (the killed saves never wrote), and nobody else was disturbed.
    assert wrote == Counter(_item(server, p) for p in site.reachable)
    if batch_size == 1:
        assert set(fetched.values()) == {1}
    else:
        again = [p for p, k in fetched.items() if k > 1]
        assert len(again) <= 5 * DEFAULT_SAVE_BATCH, again
        _assert_extra_downloads_had_a_vanished_holder(server, fetched, again, procs)
    _assert_nothing_in_flight(redis_client, job, fetched=fetched if batch_size is None else None)


def test_sigkill_in_a_group_commit_loses_nothing_and_downloads_nothing_again(
    redis_url, redis_client, start_worker, tmp_path
):
    """Group commit: a save batch's bodies are in their temporary files, and the process
    is SIGKILLed before they are flushed and renamed (once for each of 5 pages' batches). Nothing
    of that group was marked done: Celery delivers the batch again, the bodies are still staged,
    and every page is saved in the end, none downloaded again after the kill, nothing dead or left
    in flight."""
    site = generate_site(n_pages=60, seed=103, unreachable=0)
    _, tracker, procs = _setup(redis_url, start_worker, ["group-a", "group-b"],
                               settings_kw={"save_batch_seconds": 0.5})
    out, job = tmp_path / "out", "group-kill"
    n = len(site.reachable)
    with SiteServer(site, delay=0.02) as server:
        victims = {_item(server, p): p for p in _pages(site, 5, seed=3)}
        stats, elapsed, fetched, fetch_times = _crawl_with_victims(
            server, tracker, procs, job,
            _spec(server, out, saver="tests.plugins.savers:GroupCrashingSaver"), victims)

    kills, calls = event_counts(out, "kill"), event_counts(out, "call")
    _report("sigkill-in-group-commit", elapsed=f"{elapsed:.1f}s", kills=sum(kills.values()),
            group_calls=sum(calls.values()), total_fetches=sum(fetched.values()),
            results=dict(_results(procs)))
    assert (stats.seen, stats.done, stats.dead) == (n, n, 0)
    assert saved_files(out) == expected_files(server, site, out)
    # A victim alone in its batch is saved without a group commit: at least some groups died.
    assert kills and set(kills) <= set(victims) and set(kills.values()) == {1}, kills
    # The killed groups' pages were saved from their staged bodies, not downloaded again; what the
    # killed process had scraped and not yet queued for saving was (a lease later), once more.
    assert _downloads_after_kill(out, victims, fetch_times) == dict.fromkeys(kills, [])
    again = [p for p, k in fetched.items() if k > 1]
    assert len(again) <= len(kills) * DEFAULT_SAVE_BATCH, again
    _assert_extra_downloads_had_a_vanished_holder(server, fetched, again, procs)
    _assert_nothing_in_flight(redis_client, job, fetched=fetched)


# -- 2 -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [pytest.param(None, id="save-batches"),
                                        pytest.param(1, id="save-per-page")])
def test_save_that_always_kills_its_process_ends_dead(
    redis_url, redis_client, start_worker, tmp_path, batch_size
):
    """One page's save SIGKILLs its process every time. With max_lost = 3 the page ends dead
    (after 4 interrupted saves) with a reason, the rest of the site is saved, and the page is not
    downloaded again and again."""
    max_lost = 3
    site = generate_site(n_pages=60, seed=202, unreachable=0)
    settings_kw = {} if batch_size is None else {"save_batch_size": batch_size}
    _, tracker, procs = _setup(redis_url, start_worker, ["doom-a", "doom-b"], settings_kw=settings_kw)
    out, job = tmp_path / "out", "save-doom"
    n = len(site.reachable)
    with SiteServer(site, delay=0.02) as server:
        [doomed_path] = _pages(site, 1, seed=2)
        doomed = _item(server, doomed_path)
        instruct(out, "crash_always", [doomed])
        started = time.monotonic()
        manager = _manager(tracker)
        manager.seed(job, _spec(server, out, max_lost=max_lost))
        stats = manager.wait(job, timeout=45, check=check_all(procs))
        elapsed = time.monotonic() - started
        fetched = server.counts()

    kills, wrote = event_counts(out, "kill"), event_counts(out, "wrote")
    dead = tracker.dead_items(job)
    _report("always-kill", elapsed=f"{elapsed:.1f}s", doomed_fetches=fetched[doomed_path],
            kills=kills[doomed], dead=dead, results=dict(_results(procs)))
    assert (stats.seen, stats.done, stats.dead) == (n, n - 1, 1)
    assert list(dead) == [doomed]
    assert "interrupted" in dead[doomed], dead
    expected = expected_files(server, site, out)
    del expected[str(_saver_name(out, doomed))]
    assert saved_files(out) == expected
    # Each interrupted save counted once: dead at the (max_lost + 1)th, downloaded once.
    assert kills[doomed] == max_lost + 1
    assert fetched[doomed_path] <= 2
    assert wrote[doomed] == 0
    assert elapsed < 45
    # The job can finish (the item dead in a heartbeat's maintain) while the redelivery of the
    # last killed save still waits in a worker as a delayed "save-busy" retry; that run finds
    # the item dead and discards its body. Let it run before counting bodies. With ack emulation
    # off (the default) a message a worker holds for its countdown is in no broker key, so a
    # drained broker does not mean that it ran: wait for the body to go, a few heartbeats at most.
    _wait_broker_drained(redis_client)
    deadline = time.monotonic() + 15
    while _in_flight(redis_client, job)["bodies"] and time.monotonic() < deadline:
        time.sleep(0.1)
    left = list(redis_client.scan_iter(JobKeys(job).prefix + "body:*"))
    if batch_size == 1:
        assert left == []
    else:
        # Pages a killed process had scraped and not yet queued for saving were downloaded again
        # under new leases; the bodies staged under their old ones wait out their TTL.
        assert len(left) <= (max_lost + 1) * DEFAULT_SAVE_BATCH
        assert all(redis_client.pttl(key) > 0 for key in left), left


def _saver_name(out, item):
    from distscrape_celery.savers import FileItemSaver

    return FileItemSaver(out).name_for(item)


# -- 3 -------------------------------------------------------------------------------------------

def test_save_waiting_in_broker_longer_than_a_lease_keeps_its_item(
    redis_url, redis_client, start_worker, tmp_path
):
    """Nobody consumes the save queue for 6 leases: the scraped items wait save-pending (their
    save timeout is 5 leases + 30 s) and are not scraped again; once a save worker comes, each is
    saved once."""
    lease = 1.0
    site = generate_site(n_pages=40, seed=303, unreachable=0)
    settings, tracker, [scraper_proc] = _setup(
        redis_url, start_worker, ["scrape-only"], lease=lease, queues=[SCRAPE_QUEUE])
    out, job = tmp_path / "out", "save-wait"
    n = len(site.reachable)
    with SiteServer(site, delay=0.02) as server:
        manager = _manager(tracker)
        manager.seed(job, _spec(server, out))
        # Scrapes go on until the save messages fill the broker's bound; then nothing moves.
        deadline = time.monotonic() + 30
        quiet_since, last = None, None
        while True:
            scraper_proc.check()
            s = tracker.stats(job)
            now = (s.save_pending, s.leased, s.dispatched, sum(server.counts().values()))
            if s.save_pending > 0 and s.leased == 0 and s.dispatched == 0 and now == last:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > lease:
                    break
            else:
                quiet_since = None
            last = now
            fetched = server.counts()
            assert max(fetched.values(), default=1) == 1, (
                f"a save-pending item was scraped again: {fetched.most_common(3)}")
            assert time.monotonic() < deadline, f"the scrapes never settled: {s.to_dict()}"
            time.sleep(0.05)
        waiting = tracker.stats(job)
        fetched_before = sum(server.counts().values())
        assert waiting.save_pending == _queued_saves(redis_client) > 0
        time.sleep(6 * lease)
        after_wait = tracker.stats(job)
        # Nothing was reclaimed meanwhile: same items save-pending, nothing downloaded again.
        assert after_wait == waiting, (waiting.to_dict(), after_wait.to_dict())
        assert sum(server.counts().values()) == fetched_before

        saver_proc = start_worker(settings, "save-only", queues=[SAVE_QUEUE])
        stats = manager.wait(job, timeout=60, check=check_all([scraper_proc, saver_proc]))
        fetched = server.counts()

    wrote = event_counts(out, "wrote")
    _report("save-waits", waited=f"{6 * lease:.0f}s", pending_while_waiting=waiting.save_pending,
            done_before_saver=waiting.done, total_fetches=sum(fetched.values()), pages=n,
            total_writes=sum(wrote.values()))
    assert (stats.seen, stats.done, stats.dead) == (n, n, 0)
    assert tracker.dead_items(job) == {}
    assert saved_files(out) == expected_files(server, site, out)
    assert fetched == Counter(site.reachable)
    assert wrote == Counter(_item(server, p) for p in site.reachable)


def test_hung_save_in_a_threads_pool_gives_its_item_up_after_the_time_limit(
    redis_url, redis_client, start_worker, tmp_path
):
    """The threads pool has no task time limits: a save that hangs is never stopped. Its worker's
    heartbeat keeps the lease of a running task only up to the task time limit, so the item goes
    to another run a lease later and is saved, long before the hung run would have ended."""
    lease, limit, hang = 1.0, 5.0, 60.0
    site = generate_site(n_pages=5, seed=17, unreachable=0)
    settings = crawl_settings(redis_url, lease_seconds=lease, task_time_limit=limit,
                              plugin_modules=PLUGIN_MODULES)
    tracker = RedisTracker.from_url(redis_url)
    proc = start_worker(settings, "threads", pool="threads", concurrency=4)
    wait_for_workers(tracker, 1, procs=[proc])
    configure_app(settings)
    out, job = tmp_path / "out", "hung-save"
    n = len(site.reachable)
    with SiteServer(site) as server:
        hung = _item(server, "/")
        instruct(out, "pause", [f"{hang} {hung}"])
        manager = _manager(tracker)
        started = time.monotonic()
        manager.seed(job, _spec(server, out))
        stats = manager.wait(job, timeout=hang - 10, check=check_all([proc]))
        took = time.monotonic() - started
    # The hung run would hold the worker's warm shutdown until the fixture's timeout: end it now.
    proc.stop(timeout=0)
    _report("hung-save", took=f"{took:.1f}s", limit=limit, hang=hang)
    assert (stats.seen, stats.done, stats.dead) == (n, n, 0)
    assert event_counts(out, "pause")[hung] == 1
    assert event_counts(out, "wrote")[hung] == 1  # by the second run; the hung one never wrote
    assert saved_files(out) == expected_files(server, site, out)


# -- 4a ------------------------------------------------------------------------------------------

def test_every_scrape_message_delivered_twice(redis_url, redis_client, start_worker, tmp_path):
    """A second scrape message for every item, sent whenever the test first sees the item (so it
    arrives while the item is queued, dispatched, being scraped, save-pending, being saved or
    done): the duplicates change nothing."""
    site = generate_site(n_pages=60, seed=404, unreachable=0)
    _, tracker, procs = _setup(redis_url, start_worker, ["dup-a", "dup-b"])
    out, job = tmp_path / "out", "dup-scrape"
    n = len(site.reachable)
    duplicated: set[str] = set()
    stop = threading.Event()

    def live() -> list[str]:
        try:
            return list(live_items(redis_client, job))
        except redis.ResponseError:  # NOJOB: not seeded yet
            return []

    def duplicate():
        while not stop.is_set():
            new = [i for i in live() if i not in duplicated]
            if new:
                publisher.scrape(job, new)
                duplicated.update(new)
            time.sleep(0.01)

    with SiteServer(site, delay=0.02) as server:
        manager = _manager(tracker)
        dup = threading.Thread(target=duplicate, daemon=True)
        manager.seed(job, _spec(server, out))
        dup.start()
        try:
            stats = manager.wait(job, timeout=60, check=check_all(procs))
        finally:
            stop.set()
            dup.join(5)
        _wait_broker_drained(redis_client)
        time.sleep(LEASE)  # a duplicate that did anything would show now
        stats = tracker.stats(job)
        fetched = server.counts()

    wrote = event_counts(out, "wrote")
    results = _results(procs)
    _report("dup-scrape", duplicates=len(duplicated), total_fetches=sum(fetched.values()),
            pages=n, total_writes=sum(wrote.values()), results=dict(results))
    assert len(duplicated) == n
    assert (stats.seen, stats.done, stats.dead) == (n, n, 0)
    assert tracker.dead_items(job) == {}
    assert saved_files(out) == expected_files(server, site, out)
    assert max(fetched.values()) <= 2
    assert fetched == Counter(site.reachable), "a duplicate scrape message downloaded a page again"
    assert wrote == Counter(_item(server, p) for p in site.reachable)
    # Every duplicate ran and did nothing: n scrape tasks scraped, the others found their item
    # busy or done. Up to 2n ran: a duplicate that arrives while its item is still queued (the
    # broker's bound was full) leases it straight from the queue, so no second message is sent.
    assert results["scraped"] == n
    assert set(results) <= {"scraped", "busy", "done", "throttled"}, results
    assert sum(results.values()) <= 2 * n, results
    assert _in_flight(redis_client, job) == dict.fromkeys(
        ("owners", "leased", "pending", "dispatched", "bodies"), 0)


# -- 4b ------------------------------------------------------------------------------------------

def _group_of(procs, pid: int):
    pgid = os.getpgid(pid)
    [proc] = [p for p in procs if p.proc.pid == pgid]
    return proc


def _leases_of(redis_client, job, worker_id) -> set[str]:
    """Items ``worker_id`` scrapes or saves (states l and S)."""
    k = JobKeys(job)
    return {i for i, w in lease_holders(redis_client, job).items()
            if w == worker_id and redis_client.zscore(k.leased, i) is not None}


def _unreserved_saves(redis_client, job, worker_id) -> set[str]:
    """Save-pending items whose save message no live worker has reserved: without a holder
    ("-", the message is in the broker or was never sent) or held by ``worker_id``."""
    k = JobKeys(job)
    return {i for i, w in lease_holders(redis_client, job).items()
            if w in ("-", worker_id) and (item_state(redis_client, job, i) or "").startswith("s")}


def _diagnose(redis_client, job, worker_id) -> dict:
    """The state of every item ``worker_id`` holds or nobody holds, with its deadlines, and the
    workers' heartbeats."""
    k = JobKeys(job)
    now = redis_client.time()
    out = {"redis_now_us": now[0] * 1_000_000 + now[1],
           "heartbeats": redis_client.zrange(HEARTBEATS, 0, -1, withscores=True)}
    for item, w in lease_holders(redis_client, job).items():
        if w in ("-", worker_id):
            out[item] = {
                "state": item_state(redis_client, job, item), "owner": redis_client.hget(k.owners, item),
                "leased": redis_client.zscore(k.leased, item),
                "pending": redis_client.zscore(k.pending, item),
                "dispatched": redis_client.zscore(k.dispatched, item),
            }
    return out


def test_late_worker_changes_nothing(redis_url, redis_client, start_worker, tmp_path):
    """A worker is frozen (SIGSTOP) in the middle of a save and while it holds other leases, for
    longer than a lease; the other worker redoes its items and finishes the crawl. Thawed, the
    late worker's scrapes and saves change nothing: every item stays done, nothing is dead, each
    page was downloaded at most twice (only the frozen worker's items twice), and the files are
    the site's."""
    site = generate_site(n_pages=60, seed=505, unreachable=0)
    settings, tracker, procs = _setup(redis_url, start_worker, ["late-a", "late-b"])
    out, job = tmp_path / "out", "late-save"
    n = len(site.reachable)
    with SiteServer(site, delay=0.02) as server:
        [paused_path] = _pages(site, 1, seed=5)
        paused = _item(server, paused_path)
        instruct(out, "pause", [f"1.5 {paused}"])
        manager = _manager(tracker)
        manager.seed(job, _spec(server, out))
        deadline = time.monotonic() + 30
        while (pid := paused_pid(out, paused)) is None:
            assert time.monotonic() < deadline, "the paused item was never saved"
            time.sleep(0.005)
        frozen = _group_of(procs, pid)
        survivor = next(p for p in procs if p is not frozen)
        frozen.kill(signal.SIGSTOP)
        stopped_at = time.monotonic()
        frozen_id = next(w.id for w in tracker.workers() if w.pid == frozen.proc.pid)
        time.sleep(0.3)  # anything the frozen worker sent before the stop has landed
        held_at_freeze = {i for i, w in lease_holders(redis_client, job).items() if w == frozen_id}
        # Save messages the frozen worker took from the broker in the instant before the stop,
        # before it could take their items over: in no queue, held by nobody. A live worker
        # finds them missing and has them downloaded again (lost_saves.py), as for a dead worker.
        queued = {i for _, i, _ in queued_saves(redis_client, settings.save_queue)}
        taken_at_freeze = {i for i, w in lease_holders(redis_client, job).items()
                           if w == "-" and i not in queued}
        done_at_freeze = tracker.stats(job).done
        assert paused in held_at_freeze
        # Its leases (items it scrapes or saves) go to the survivor within about a lease.
        while _leases_of(redis_client, job, frozen_id):
            assert time.monotonic() - stopped_at < LEASE + 8, (
                f"a frozen worker kept its leases: {_diagnose(redis_client, job, frozen_id)}")
            time.sleep(0.05)
        # The survivor finishes everything else, the pages of messages taken at the freeze
        # included. What the frozen worker holds by a reserved save message waits for it: wait
        # until only that is left, for a second on end.
        deadline = time.monotonic() + 60
        settled_since = None
        while True:
            survivor.check()
            left = _unreserved_saves(redis_client, job, frozen_id)
            if tracker.stats(job).done + len(left) < n:
                settled_since = None
            elif settled_since is None:
                settled_since = time.monotonic()
            elif time.monotonic() - settled_since > 1.0:
                break
            assert time.monotonic() < deadline, tracker.stats(job).to_dict()
            time.sleep(0.05)
        waiting_for_frozen = left
        frozen_for = time.monotonic() - stopped_at
        fetched_while_frozen = server.counts()
        frozen.kill(signal.SIGCONT)
        stats = manager.wait(job, timeout=60, check=survivor.check)
        # The late save goes through (the frozen process writes the same bytes), and the rest
        # drains. Its item was either saved meanwhile by the survivor (downloaded again after its
        # saving lease ran out twice) or still waiting for this very save, which completes it.
        deadline = time.monotonic() + 20
        frozen_pid = int(paused_pid(out, paused))
        while not any(ev == "wrote" and pid == frozen_pid and i == paused
                      for ev, pid, _, i in save_events(out)):
            frozen.check()
            assert time.monotonic() < deadline, "the thawed worker never finished its save"
            time.sleep(0.05)
        _wait_broker_drained(redis_client)
        time.sleep(LEASE)
        frozen.check()  # it lives on
        late = tracker.stats(job)
        fetched = server.counts()

    wrote = event_counts(out, "wrote")
    results = _results(procs)
    path_of = {_item(server, p): p for p in site.reachable}
    held_paths = {path_of[i] for i in held_at_freeze | taken_at_freeze}
    twice_fetched = {p for p, c in fetched.items() if c > 1}
    twice_written = {i for i, c in wrote.items() if c > 1}
    _report("late-worker", frozen_for=f"{frozen_for:.1f}s", held_at_freeze=len(held_at_freeze),
            left_to_frozen=len(waiting_for_frozen), taken_at_freeze=len(taken_at_freeze),
            done_at_freeze=done_at_freeze, fetched_twice=len(twice_fetched),
            fetched_after_thaw=sum((fetched - fetched_while_frozen).values()),
            written_twice=len(twice_written), total_fetches=sum(fetched.values()),
            total_writes=sum(wrote.values()), results=dict(results))
    assert (stats.seen, stats.done, stats.dead) == (n, n, 0)
    assert late == stats, (stats.to_dict(), late.to_dict())
    assert tracker.dead_items(job) == {}
    assert saved_files(out) == expected_files(server, site, out)
    # Each page downloaded at most twice; twice only if the frozen worker held it (a scrape it
    # had leased and resumed late); after the thaw, only those late scrapes downloaded anything.
    assert max(fetched.values()) <= 2
    assert twice_fetched <= held_paths, (twice_fetched, held_paths)
    assert set(fetched - fetched_while_frozen) <= held_paths
    # Only the frozen worker's late saves (the paused one, and any other it was in) wrote twice.
    assert max(wrote.values()) <= 2
    assert (paused in twice_written) == (paused_path in twice_fetched)
    assert twice_written <= held_at_freeze | taken_at_freeze, (twice_written, held_at_freeze)
    assert set(wrote) == {_item(server, p) for p in site.reachable}
    assert _in_flight(redis_client, job) == dict.fromkeys(
        ("owners", "leased", "pending", "dispatched", "bodies"), 0)


# -- found on the way: a worker dying between `scraped` and its save message -------------------

@pytest.mark.parametrize("pool", [
    # A prefork pool process keeps the item under its worker's lease until the message is out.
    "prefork",
    # A threads worker's item waits for its message with no holder from the start: the
    # survivor's check of the save queue finds it.
    "threads",
])
@pytest.mark.parametrize("batch_size", [
    # The default: the saves go out in batches.
    pytest.param(None, id="save-batches"),
    # A save message per page, sent right after scraped.
    pytest.param(1, id="save-per-page"),
])
def test_worker_killed_before_sending_a_save_recovers_within_a_lease(
    redis_url, redis_client, start_worker, tmp_path, batch_size, pool
):
    """A worker host dies (SIGKILL of the whole worker) right after ``scraped`` made an item
    save-pending and before the save message went out. README: "A worker dies (SIGKILL, OOM,
    power cut): what it was scraping or saving [...] go[es] back into the queue about one lease
    after its last heartbeat." The item must be downloaded again and saved within about a lease."""
    lease = 1.0
    site = generate_site(n_pages=30, seed=808, unreachable=0)
    settings, tracker, procs = _setup(
        redis_url, start_worker, ["unsent-a", "unsent-b"], lease=lease, pool=pool,
        settings_kw={} if batch_size is None else {"save_batch_size": batch_size},
    )
    out, job = tmp_path / "out", "unsent-save"
    n = len(site.reachable)
    with SiteServer(site, delay=0.02) as server:
        [doomed_path] = _pages(site, 1, seed=8)
        doomed = _item(server, doomed_path)
        instruct(out, "die_before_save_publish", [doomed])
        manager = _manager(tracker)
        manager.seed(job, build_spec({
            "seeds": [server.url("/")], "scraper": {"kind": "tests.plugins.scrapers:DyingScraper"},
            "saver": {"kind": SAVER, "output": str(out)}, "max_retries": 0,
        }))
        deadline = time.monotonic() + 30
        while all(p.alive for p in procs):
            assert time.monotonic() < deadline, "no worker died"
            time.sleep(0.02)
        died_at = time.monotonic()
        [survivor] = [p for p in procs if p.alive]
        dead_id = next(w.id for w in tracker.workers() if not w.alive or w.pid not in
                       {p.proc.pid for p in procs if p.alive})
        state_after_death = item_state(redis_client, job, doomed)
        holder_after_death = (redis_client.hget(JobKeys(job).owners, doomed) or "").split(" ")[0]
        recovered = None
        while time.monotonic() - died_at < lease + 8:
            survivor.check()
            # Done: out of the live items (into the seen set).
            if item_state(redis_client, job, doomed) is None:
                recovered = time.monotonic() - died_at
                break
            time.sleep(0.05)
        diagnosis = _diagnose(redis_client, job, dead_id)
        _report("unsent-save", state_after_death=state_after_death, recovered_after=recovered,
                stats=tracker.stats(job).to_dict(), held_by_dead_worker=diagnosis)
        assert state_after_death.startswith("s"), "the worker did not die between scraped and the save"
        # Kept by the dying worker (a pool process), or by nobody (a threads worker).
        assert holder_after_death == (dead_id if pool == "prefork" else "-"), holder_after_death
        assert recovered is not None, (
            f"not recovered {lease + 8:.0f} s after the worker died: "
            f"{tracker.stats(job).to_dict()}, {diagnosis}")
        # Another page's save batch that the dying worker had just taken from the broker, in the
        # instant before it could take its items over (most runs: its siblings' batches flush on
        # the same cadence), is in no queue: the survivor finds that and has its pages reclaimed
        # a lease or so after their hand-over, not after the save timeout (README, "Ack emulation
        # is off by default"). Before, the rest of the job waited that long.
        assert settings.save_timeout > 30
        stats = _manager(tracker).wait(
            job, timeout=15, check=check_all([survivor]))
    assert (stats.done, stats.dead) == (n, 0), (stats, _diagnose(redis_client, job, dead_id))


# -- 4c: a save message delivered twice while its first copy runs ------------------------------




def test_save_message_delivered_twice_while_its_save_runs(
    redis_url, redis_client, start_worker, tmp_path
):
    """A second copy of a save message arrives while the first copy's save is still running (as
    when the broker connection drops and kombu hands the unacknowledged message out again: see
    the next test). The README: "When a duplicate message is delivered, its task finds the item
    done or held and does nothing." The item must be written once, end done, and its live save
    must not count as a vanished holder. With max_lost = 0 the miscount shows most plainly: the
    item ends dead although its save succeeded."""
    max_lost = 0
    site = generate_site(n_pages=20, seed=606, unreachable=0)
    _, tracker, procs = _setup(redis_url, start_worker, ["dupsave-a", "dupsave-b"])
    out, job = tmp_path / "out", "dup-save"
    n = len(site.reachable)
    with SiteServer(site, delay=0.02) as server:
        [slow_path] = _pages(site, 1, seed=6)
        slow = _item(server, slow_path)
        instruct(out, "pause", [f"2.0 {slow}"])
        manager = _manager(tracker)
        manager.seed(job, _spec(server, out, max_lost=max_lost))
        deadline = time.monotonic() + 30
        while paused_pid(out, slow) is None:
            assert time.monotonic() < deadline, "the slow item was never saved"
            time.sleep(0.005)
        # The first save runs (it is in the saver): send the same save message again.
        owner = redis_client.hget(JobKeys(job).owners, slow)
        assert item_state(redis_client, job, slow).startswith("S"), "not saving"
        token = int(owner.split()[1])
        meta = {"url": slow, "status": 200, "content_type": "text/html; charset=utf-8",
                "fetched_at": time.time()}
        save_task.apply_async((job, slow, token, meta))
        stats = manager.wait(job, timeout=60, check=check_all(procs))
        # Both copies ran to the end: with late acks, a message leaves "unacked" when its task ends.
        _wait_broker_drained(redis_client)
        _wait_written_by(out, slow, paused_pid(out, slow))
        stats = tracker.stats(job)
        fetched = server.counts()

    wrote = event_counts(out, "wrote")
    _report(f"dup-save(max_lost={max_lost})", slow_writes=wrote[slow], slow_fetches=fetched[slow_path],
            dead=tracker.dead_items(job), stats=stats.to_dict(),
            slow_calls=event_counts(out, "call")[slow], results=dict(_results(procs)),
            vanished_warnings=[l.split("] ", 1)[1] for l in _worker_logs(procs).splitlines()
                               if "vanished" in l or "interrupted" in l])
    assert fetched[slow_path] == 1
    assert tracker.dead_items(job) == {}
    assert (stats.seen, stats.done, stats.dead) == (n, n, 0)
    assert wrote[slow] == 1, "the duplicate save message saved the item a second time"
    assert "vanished" not in _worker_logs(procs)


def test_broker_connection_lost_while_a_save_runs(redis_url, redis_client, start_worker, tmp_path):
    """The same duplicate, made by Celery itself: the saving worker's broker connection drops
    while its save runs. The consumer reconnects and restores its unacknowledged messages
    ("Restoring N unacknowledged message(s)"), the running save's among them (late acks), so a
    copy is delivered while the first run is still in the saver. celery_app.py expects "that
    duplicate does nothing (the tracker's fencing tokens)"."""
    site = generate_site(n_pages=20, seed=707, unreachable=0)
    _, tracker, procs = _setup(redis_url, start_worker, ["drop-a", "drop-b"])
    out, job = tmp_path / "out", "drop-save"
    n = len(site.reachable)
    with SiteServer(site, delay=0.02) as server:
        [slow_path] = _pages(site, 1, seed=7)
        slow = _item(server, slow_path)
        instruct(out, "pause", [f"3.0 {slow}"])
        manager = _manager(tracker)
        manager.seed(job, _spec(server, out))
        deadline = time.monotonic() + 30
        while (pid := paused_pid(out, slow)) is None:
            assert time.monotonic() < deadline, "the slow item was never saved"
            time.sleep(0.005)
        saving = _group_of(procs, pid)
        # Cut every consumer's connection (the ones blocked in BRPOP or BLMPOP) for a while.
        cut_until = time.monotonic() + 1.5
        while time.monotonic() < cut_until:
            for client in redis_client.client_list():
                if client.get("cmd") in ("brpop", "blmpop"):
                    try:
                        redis_client.client_kill_filter(_id=client["id"])
                    except Exception:
                        pass  # gone already
            time.sleep(0.05)
        stats = manager.wait(job, timeout=60, check=check_all(procs))
        _wait_broker_drained(redis_client)
        # The first run's message was handed out again, so only its own write says it ended.
        _wait_written_by(out, slow, pid)
        time.sleep(0.5)  # its complete() call
        stats = tracker.stats(job)

    log = saving.log_path.read_text(errors="replace")
    if "Restoring" not in log:
        pytest.skip("the saving worker's consumer was not cut off while it saved")
    wrote = event_counts(out, "wrote")
    _report("connection-lost-in-save", slow_calls=event_counts(out, "call")[slow],
            slow_writes=wrote[slow], stats=stats.to_dict(), results=dict(_results(procs)),
            vanished_warnings=[l.split("] ", 1)[1] for l in _worker_logs(procs).splitlines()
                               if "vanished" in l or "interrupted" in l])
    assert (stats.seen, stats.done, stats.dead) == (n, n, 0)
    assert saved_files(out) == expected_files(server, site, out)
    assert wrote[slow] == 1, "the restored save message saved the item a second time"
    # Only the slow item's live save must not count as vanished. A CLIENT KILL can land after
    # Redis popped messages for the blocked BRPOP or BLMPOP and before the reply left: they are
    # gone, and the tracker resends its save after the save timeout, counting a vanished holder
    # (seen in CI). That is recovery working, not the duplicate this test is about.
    assert not [l for l in _worker_logs(procs).splitlines() if "vanished" in l and slow in l]


# -- saves run inside the scrape task (save_inline) ------------------------------------

@pytest.mark.parametrize("batch", [1, 32], ids=["each-page", "batches"])
def test_sigkill_in_an_inline_save_downloads_again_and_loses_nothing(
    redis_url, redis_client, start_worker, tmp_path, batch
):
    """With ``save_inline`` no save message exists to be delivered again: when the process dies
    in the save, its scrape message comes back (task_reject_on_worker_lost) and finds the item
    being saved, or (saved with its process's batch) the scrape task is long over. Either way it
    is the tracker that reclaims the item, once the saving lease and one more lease have passed.
    docs/architecture.md, "Saving inline": the page is downloaded again, saved once, and nothing
    is lost; no save task runs at all. A batch's pages not saved when its process died are
    downloaded again too, so a victim in the same batch as another may take a third download."""
    site = generate_site(n_pages=40, seed=909, unreachable=0)
    _, tracker, procs = _setup(redis_url, start_worker, ["inline-a", "inline-b"],
                               settings_kw={"save_inline": True, "save_batch_size": batch})
    out, job = tmp_path / "out", "inline-kill"
    n = len(site.reachable)
    with SiteServer(site, delay=0.02) as server:
        victims = {_item(server, p): p for p in _pages(site, 3, seed=9)}
        instruct(out, "crash_once", victims)
        _manager(tracker).seed(job, _spec(server, out))
        stats = _manager(tracker).wait(job, timeout=60, check=check_all(procs))
        fetched = server.counts()

    kills, wrote = event_counts(out, "kill"), event_counts(out, "wrote")
    logs = _worker_logs(procs)
    _report("sigkill-in-inline-save", kills=sum(kills.values()),
            victim_fetches=[fetched[p] for p in victims.values()], results=dict(_results(procs)))
    assert (stats.seen, stats.done, stats.dead) == (n, n, 0)
    assert saved_files(out) == expected_files(server, site, out)
    assert kills == Counter(list(victims)), "every victim's first save must have killed its process"
    victim_fetches = {p: fetched[p] for p in victims.values()}
    if batch == 1:
        assert victim_fetches == {p: 2 for p in victims.values()}
    else:
        assert min(victim_fetches.values()) >= 2 and max(victim_fetches.values()) <= 4
    assert wrote == Counter(_item(server, p) for p in site.reachable)
    assert "distscrape.save[" not in logs and "distscrape.save_batch[" not in logs, (
        "a save task ran although saves are inline")
    if batch == 1:
        # Each page saved by the task that scraped it. A task reports its own item when its
        # run ends, so a process killed later in the run never reports it (saved before the
        # kill, its message comes back and finds it done): one report fewer per kill at most.
        assert n - len(victims) <= _results(procs)["saved"] <= n
    # An inline save stages no body, so none is left behind by the killed ones either.
    assert _in_flight(redis_client, job) == dict.fromkeys(
        ("owners", "leased", "pending", "dispatched", "bodies"), 0)


# -- save batches: a worker that stops queues what it gathered ------------------------------------

def _stop_while_gathering(redis_url, start_worker, tmp_path, job, gathered, at_stop, *, pool,
                          settings_kw=None, **worker_kw):
    """Crawl with one worker that gathers its pages' saves (up to 1000 pages or 2 s a batch),
    stop it (SIGTERM) once ``gathered()`` names 3 pages waiting in it, read ``at_stop(tracker)``
    and let another worker finish. Every page must be saved, each downloaded once. Returns what
    ``at_stop`` read, and the downloads before the stop and in all."""
    site = generate_site(n_pages=40, seed=909, unreachable=0)
    settings, tracker, [scraper] = _setup(
        redis_url, start_worker, ["gather"], lease=8.0, pool=pool, **worker_kw,
        settings_kw={"save_batch_seconds": 2.0, "save_batch_size": 1000, **(settings_kw or {})},
    )
    out = tmp_path / "out"
    n = len(site.reachable)
    with SiteServer(site, delay=0.02) as server:
        manager = _manager(tracker)
        manager.seed(job, _spec(server, out))
        deadline = time.monotonic() + 30
        while len(gathered()) < 3:
            assert time.monotonic() < deadline, "no scraped page waits in the worker"
            time.sleep(0.02)
        scraper.stop(timeout=20)
        assert not scraper.alive
        seen = at_stop(tracker)
        fetched_before = server.counts()
        full = start_worker(settings, "finish")
        stats = manager.wait(job, timeout=60, check=check_all([full]))
        fetched = server.counts()
    assert (stats.seen, stats.done, stats.dead) == (n, n, 0)
    assert saved_files(out) == expected_files(server, site, out)
    assert fetched == Counter(site.reachable), "a page gathered at the stop was downloaded again"
    return seen, fetched_before, fetched


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_stopping_worker_queues_the_saves_it_gathered(
    redis_url, redis_client, start_worker, tmp_path, pool
):
    """A worker process holds the saves of the pages it scraped for up to
    save_batch_seconds. A warm shutdown (SIGTERM) must queue them: not leave them to be
    reclaimed a lease later and downloaded again."""
    job = "gathered"
    k = JobKeys(job)

    def kept():
        """Save-pending pages whose save message is not in the broker: waiting in the
        worker (the pending set is read first, so a batch sent meanwhile is not counted)."""
        pending = [i for i in redis_client.zrange(k.pending, 0, -1)
                   if (item_state(redis_client, job, i) or "").startswith("s")]
        queued = {item for _, item, _ in queued_saves(redis_client, SAVE_QUEUE)}
        return [i for i in pending if i not in queued]

    (still_kept, waiting, queued), fetched_before, fetched = _stop_while_gathering(
        redis_url, start_worker, tmp_path, job, kept,
        lambda tracker: (kept(), tracker.stats(job).save_pending, _queued_saves(redis_client)),
        pool=pool, queues=[SCRAPE_QUEUE])
    _report("stop-flush", pool=pool, waiting_saves=waiting, queued_saves=queued,
            fetched_before_stop=sum(fetched_before.values()), total_fetches=sum(fetched.values()))
    assert still_kept == []  # every gathered save was queued
    assert waiting == queued > 0


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_stopping_worker_saves_what_it_gathered_inline(
    redis_url, redis_client, start_worker, tmp_path, pool
):
    """With ``save_inline``, the pages a process gathered for its save batch are its own to save:
    a warm shutdown (SIGTERM) saves them before the worker exits, none downloaded again."""
    job = "gathered-inline"
    k = JobKeys(job)

    def gathered() -> list[str]:
        return [i for i in redis_client.zrange(k.leased, 0, -1)
                if (item_state(redis_client, job, i) or "").startswith("S")]

    (done_at_stop, left), _, _ = _stop_while_gathering(
        redis_url, start_worker, tmp_path, job, gathered,
        lambda tracker: (tracker.stats(job).done, gathered()),
        pool=pool, settings_kw={"save_inline": True})
    _report("stop-saves-inline", pool=pool, done_at_stop=done_at_stop, left=len(left))
    assert left == []  # every gathered page was saved
    assert done_at_stop >= 3
