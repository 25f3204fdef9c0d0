"""Recurring crawls with real worker processes: a revisit generation survives SIGKILL of every
worker, and schedules start each due run exactly once however many workers race, after a restart
of every worker (one catch-up run for all the runs missed), and never over a run still going.

Real Redis (conftest), real ``celery worker`` processes, real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import signal
import time

from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.core.schedules import run_again
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.savers import FileItemSaver
from distscrape_celery.testing.sitegen import SiteServer, evolve_site, generate_site
from distscrape_celery.tracker import JobState, RedisTracker
from distscrape_celery.worker.app import configure_app
from distscrape_celery.worker.publish import publisher
from tests.faults.test_crash import holders
from tests.plugins.full_disk import events
from tests.support.crawl import check_all, crawl_settings, kill_all, wait_until

SAVER = "tests.plugins.full_disk:FullDiskSaver"  # logs every write: saves can be counted


def _start(redis_url, workers, names, lease):
    settings = crawl_settings(redis_url, lease_seconds=lease, plugin_modules="tests.plugins.full_disk")
    tracker = RedisTracker.from_url(redis_url)
    procs = [workers(settings, name, concurrency=2) for name in names]
    wait_for_workers(tracker, len(procs), procs=procs)
    configure_app(settings)
    return settings, tracker, procs


def _seed(settings, tracker, job, server, out, **sections):
    spec = build_spec({"seeds": [server.url("/")], "saver": {"kind": SAVER, "output": str(out)},
                       **sections})
    manager = CrawlManager(tracker, publisher.scrape, settings=settings)
    manager.seed(job, spec)
    return manager


def _ended(tracker, job, procs, generation, timeout=120):
    """Wait until ``job`` is at ``generation`` and its end is recorded."""
    wait_until(f"generation {generation} to end", lambda: (
        (info := tracker.job_info(job)).generation == generation
        and info.state is JobState.FINISHED), timeout=timeout, procs=procs)


# -- a revisit generation survives SIGKILL of every worker ---------------------------------------

LEASE = 2.0


def test_sigkill_of_every_worker_during_generation_2_saves_each_change_once(
        redis_url, redis_client, workers, tmp_path):
    """Generation 1 crawls the site; the site changes; generation 2 (``distscrape run``'s call)
    is a third done when every worker is SIGKILLed, whole process groups; new workers finish
    it. Generation 2 saves exactly the changed and added pages, with their new content, each
    once (a second write only of a page whose first write was by a killed worker, before it
    could mark it done), and its figures add up."""
    site = generate_site(n_pages=120, seed=31, unreachable=0)
    change = evolve_site(site, seed=2)
    out = tmp_path / "out"
    job = "regen"
    settings, tracker, procs = _start(redis_url, workers, ["gen-a", "gen-b"], LEASE)
    with SiteServer(site, delay=0.05, validators=True) as server:
        manager = _seed(settings, tracker, job, server, out, revisit={})
        manager.wait(job, timeout=120, check=check_all(procs))
        _ended(tracker, job, procs, 1)
        first_writes = len(events(out))
        assert first_writes == len(site.reachable)
        server.replace_site(change.site)
        started = run_again(tracker, job, manager.publish)
        assert started.started and started.generation == 2
        ids = {w.id for w in tracker.workers() if w.alive}
        wait_until("a third of generation 2 done, held by the workers", lambda: (
            tracker.stats(job).done >= len(site.reachable) // 3
            and holders(redis_client, job) & ids), timeout=60, procs=procs)
        assert not tracker.stats(job).finished
        for proc in procs:
            proc.kill(signal.SIGKILL)
        for proc in procs:
            proc.proc.wait(10)
        killed = {proc.proc.pid for proc in procs}
        at_kill = tracker.stats(job)
        procs = [workers(settings, f"gen-new-{i}", concurrency=2) for i in range(2)]
        _ended(tracker, job, procs, 2)
        stats = tracker.stats(job)
        fetched = server.counts()

    url = {server.url(p): p for p in change.site.pages | dict.fromkeys(site.pages)}
    second = events(out)[first_writes:]
    writes: dict[str, list[int]] = {}
    for e in second:
        assert e.event == "wrote", e
        writes.setdefault(url[e.item], []).append(e.pgrp)
    print(f"\nSIGKILL in generation 2: at the kill {at_kill}; after {stats}; "
          f"{sum(map(len, writes.values()))} writes of {len(writes)} pages; "
          f"{sum(fetched.values())} requests")
    assert set(writes) == change.changed | change.added
    twice = {p: w for p, w in writes.items() if len(w) > 1}
    assert all(len(w) == 2 and w[0] in killed for w in twice.values()), twice
    for path in change.changed | change.added:
        saved = out / str(FileItemSaver(str(out)).name_for(server.url(path)))
        assert saved.read_bytes() == change.site.pages[path], path
    # Every known page was asked again, the added ones once at least.
    assert set(fetched) == site.reachable | change.added
    n = len(site.reachable | change.added)
    unchanged = len(site.reachable) - len(change.changed) - len(change.removed)
    assert (stats.seen, stats.done, stats.dead) == (n, n, 0), stats
    assert (stats.unchanged, stats.gone) == (unchanged, len(change.removed)), stats
    assert stats.done - stats.unchanged - stats.gone == len(change.changed | change.added)
    assert stats.known == n  # a gone page is kept until it is gone drop_gone_after times


# -- schedules ---------------------------------------------------------------------------------

SCHEDULE_LEASE = 8.0  # heartbeats every 2 s; nothing is reclaimed on a loaded machine


def _crawled_once(redis_url, workers, names, server, out, job):
    settings, tracker, procs = _start(redis_url, workers, names, SCHEDULE_LEASE)
    manager = _seed(settings, tracker, job, server, out)
    manager.wait(job, timeout=120, check=check_all(procs))
    _ended(tracker, job, procs, 1)
    return settings, tracker, procs


def _fired_lines(procs, job) -> list[str]:
    return [line for p in procs for line in p.log_path.read_text(errors="replace").splitlines()
            if f"job {job}: generation" in line and "started on its schedule" in line]


def test_a_due_run_fires_once_with_three_workers_racing(redis_url, workers, tmp_path):
    site = generate_site(n_pages=25, seed=32, unreachable=0)
    job = "racing"
    with SiteServer(site) as server:
        _, tracker, procs = _crawled_once(redis_url, workers, ["race-a", "race-b", "race-c"],
                                          server, tmp_path / "out", job)
        # Frozen past a heartbeat, then thawed together: every worker's overdue heartbeat
        # finds the run due at the same moment.
        for proc in procs:
            proc.kill(signal.SIGSTOP)
        tracker.set_schedule(job, "every 3600", tracker.now() - 1)
        time.sleep(2.5)
        for proc in procs:
            proc.kill(signal.SIGCONT)
        _ended(tracker, job, procs, 2)
        time.sleep(3 * 2.0)  # several heartbeats of every worker: no second run
        info, fetched = tracker.job_info(job), server.counts()
        now = tracker.now()
    assert info.generation == 2 and info.state is JobState.FINISHED
    assert fetched == {p: 2 for p in site.reachable}, fetched
    assert 3600 - 30 < info.next_due - now <= 3600, info
    assert len(_fired_lines(procs, job)) == 1, _fired_lines(procs, job)


def test_missed_runs_give_one_catch_up_run_after_every_worker_restarted(
        redis_url, workers, tmp_path):
    site = generate_site(n_pages=25, seed=33, unreachable=0)
    job = "missed"
    with SiteServer(site) as server:
        settings, tracker, procs = _crawled_once(redis_url, workers, ["miss-a", "miss-b"],
                                                 server, tmp_path / "out", job)
        kill_all(procs)
        # Due five periods ago, as if every worker had been down for five runs.
        tracker.set_schedule(job, "every 10", tracker.now() - 50)
        time.sleep(1)
        assert tracker.job_info(job).generation == 1
        procs = [workers(settings, f"miss-new-{i}", concurrency=2) for i in range(3)]
        _ended(tracker, job, procs, 2, timeout=60)
        info, fetched, now = tracker.job_info(job), server.counts(), tracker.now()
    assert info.generation == 2
    assert fetched == {p: 2 for p in site.reachable}, fetched
    # The next run is one period after the catch-up began, not one of the missed ones.
    assert now < info.next_due <= info.started + 10 + 1, (info, now)
    assert len(_fired_lines(procs, job)) == 1


def test_a_run_due_while_the_last_one_runs_starts_after_it_once(redis_url, workers, tmp_path):
    site = generate_site(n_pages=40, seed=34, unreachable=0)
    job = "overlap"
    settings, tracker, procs = _start(redis_url, workers, ["lap-a", "lap-b", "lap-c"],
                                      SCHEDULE_LEASE)
    with SiteServer(site, delay=1.0) as server:  # 6 task slots: about 7 s a generation
        _seed(settings, tracker, job, server, tmp_path / "out")
        wait_until("generation 1 under way", lambda: tracker.stats(job).done >= 3, procs=procs)
        due = tracker.now() - 1
        tracker.set_schedule(job, "every 3600", due)
        time.sleep(2.5)  # heartbeats of every worker find the run due while generation 1 runs
        assert tracker.job_info(job).generation == 1
        assert not tracker.stats(job).finished, "generation 1 ended too soon to test anything"
        _ended(tracker, job, procs, 2)
        time.sleep(3 * 2.0)
        info, fetched = tracker.job_info(job), server.counts()
        times = {p: server.request_times(p) for p in site.reachable}
    assert info.generation == 2
    assert fetched == {p: 2 for p in site.reachable}, fetched
    # Every request of generation 2 came after every request of generation 1.
    assert max(t[0] for t in times.values()) < min(t[1] for t in times.values())
    assert info.next_due - info.started > 3600 - 30
    assert len(_fired_lines(procs, job)) == 1
