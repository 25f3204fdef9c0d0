"""Job states in the tracker (both kinds): pause, resume, cancel, completion detected once,
finished jobs no longer maintained, incremental delete, pruning of dead workers."""

from __future__ import annotations

import time

import pytest

from distscrape_celery.tracker import keys
from distscrape_celery.errors import JobNotFound, JobStateError
from distscrape_celery.tracker import Fault, JobAction, JobState, LeaseStatus, RedisTracker
from tests.support.jobs import new_job

SPEC = '{"seeds": ["http://a.invalid/"]}'
ITEMS = [f"http://h{i}.invalid/" for i in range(6)]  # a domain each: no cap in the way


def dispatched_job(t, items=ITEMS):
    """Job "j" with one worker and ``items`` added: (worker id, the items to dispatch)."""
    w = new_job(t, spec=SPEC)  # bound 4 with the default dispatch factor
    return w, t.add("j", items).dispatch


def finish(t, w, item):
    co = t.checkout("j", item, w, max_lost=3)
    assert co.status is LeaseStatus.OK
    t.scraped("j", item, co.token)
    t.begin_save("j", item, co.token, w, max_lost=3)
    return t.complete("j", item).dispatch


def test_pause_resume_cancel(tracker_factory):
    t = tracker_factory(dispatch_factor=2)  # 2 slots: 4 scrape messages
    w, sent = dispatched_job(t)
    co = t.checkout("j", sent[0], w, max_lost=3)
    assert co.status is LeaseStatus.OK
    assert t.control("j", JobAction.PAUSE).after is JobState.PAUSED
    held = t.checkout("j", sent[1], w, max_lost=3)
    assert held.status is LeaseStatus.HELD and held.dispatch == []
    # The lease in hand completes; nothing new is handed out while paused.
    t.scraped("j", sent[0], co.token)
    t.begin_save("j", sent[0], co.token, w, max_lost=3)
    assert t.complete("j", sent[0]).dispatch == []
    assert t.maintain("j", max_lost=3).dispatch == []
    assert t.stats("j").dispatched == 3 and "j" in t.active_jobs()  # 4, less the one held
    res = t.control("j", JobAction.RESUME)
    assert (res.before, res.after) == (JobState.PAUSED, JobState.RUNNING)
    assert len(res.dispatch) == 1 and t.stats("j").dispatched == 4  # the broker's bound again
    assert t.control("j", JobAction.CANCEL).after is JobState.CANCELLED
    info = t.job_info("j")
    assert info.ended is not None and info.final["done"] == 1 and info.final["seen"] == 6
    assert "j" not in t.active_jobs() and "j" in t.jobs()
    assert t.add("j", ["http://new.invalid/"]).dispatch == []  # cancelled stays cancelled
    assert t.job_info("j").state is JobState.CANCELLED
    # The done item is remembered as done (never fetched again), though only its fingerprint stays.
    assert t.checkout("j", sent[0], w, max_lost=3).status is LeaseStatus.DONE
    assert t.stats("j").done == 1


def test_completion_is_detected_once_and_new_work_reactivates(tracker_factory):
    t = tracker_factory(dispatch_factor=2)  # 2 slots: 4 scrape messages
    w, sent = dispatched_job(t, ITEMS[:2])
    for item in sent:
        finish(t, w, item)
    first, second = t.maintain("j", max_lost=3), t.maintain("j", max_lost=3)
    assert (first.finished, second.finished) == (True, False)
    info = t.job_info("j")
    assert info.state is JobState.FINISHED and info.final == {"seen": 2, "done": 2, "dead": 0}
    assert t.active_jobs() == []
    with pytest.raises(JobStateError):
        t.control("j", JobAction.PAUSE)
    t.add("j", ["http://more.invalid/"])  # new seeds: it runs and is maintained again
    assert t.job_info("j").state is JobState.RUNNING and t.active_jobs() == ["j"]
    co = t.checkout("j", "http://more.invalid/", w, max_lost=3)
    t.fail("j", "http://more.invalid/", co.token, "gone", fault=Fault.ITEM, max_retries=0,
           max_lost=3, retryable=False)
    assert t.maintain("j", max_lost=3).finished and t.active_jobs() == []
    assert t.retry_dead("j").requeued == 1 and t.active_jobs() == ["j"]


def test_dead_workers_are_pruned(tracker_factory):
    t = tracker_factory(lease_seconds=0.5)
    a, b = t.register_worker("a", 1, 1), t.register_worker("b", 2, 1)
    t.deregister_worker(a)
    assert [w.alive for w in t.workers()] == [False, True]
    assert t.prune_workers(60) == []
    time.sleep(0.3)
    t.heartbeat(b)
    assert t.prune_workers(0.7) == [a]  # stopped one lease before its deregistration
    assert [w.id for w in t.workers()] == [b]


def test_delete_keeps_redis_responsive_and_leaves_no_key(redis_url, redis_client):
    t = RedisTracker.from_url(redis_url)
    t.create_job("big", SPEC)
    t.create_job("other", SPEC)
    t.add("other", ["http://o.invalid/"])
    n = 200_000
    for _ in t.add_stream("big", (f"http://d{i % 50}.invalid/p{i}" for i in range(n))):
        pass
    assert t.stats("big").seen == n
    with pytest.raises(JobStateError):
        from distscrape_celery.core.jobs import check_deletable
        check_deletable(t, "big", force=False)
    t.control("big", JobAction.CANCEL)
    # Redis's own timing of every command the delete sends (SLOWLOG), not a ping loop's: a ping
    # from this process also waits for the GIL and the scheduler, which a loaded machine
    # stretches past any bound. 10 ms at 200,000 items is 50 ms at a million (the bound a delete
    # must keep to stay out of other clients' way), with DEL freeing in the foreground (as Redis
    # does by default), so a delete that dropped a large key whole would show here.
    saved = redis_client.config_get("slowlog-log-slower-than")
    saved.update(redis_client.config_get("lazyfree-lazy-user-del"))
    redis_client.config_set("slowlog-log-slower-than", 10_000)
    redis_client.config_set("lazyfree-lazy-user-del", "no")
    redis_client.slowlog_reset()
    try:
        assert t.delete_job("big") > 10
        slow = [(e["command"], e["duration"]) for e in redis_client.slowlog_get(100)]
    finally:
        for name, value in saved.items():
            redis_client.config_set(name, value)
    assert slow == [], f"commands that took over 10 ms (µs): {slow}"
    assert list(redis_client.scan_iter(match=keys.JobKeys("big").pattern)) == []
    assert t.jobs() == ["other"] and t.stats("other").seen == 1
    with pytest.raises(JobNotFound):
        t.job_info("big")


def test_metrics_give_the_state_and_skip_a_job_being_deleted(redis_url, redis_client):
    from distscrape_celery.cli.exporter import crawl_registry, render

    t = RedisTracker.from_url(redis_url)
    for job in ("a", "b", "gone"):
        t.create_job(job, SPEC)
    t.control("b", JobAction.PAUSE)
    redis_client.unlink(keys.JobKeys("gone").spec)  # a delete under way: the name goes last
    text = render(crawl_registry(t)).decode()
    assert 'distscrape_job_state{job="a",state="running"} 1.0' in text
    assert 'distscrape_job_state{job="b",state="paused"} 1.0' in text
    assert 'distscrape_job_state{job="b",state="running"} 0.0' in text
    assert 'job="gone"' not in text and "distscrape_up 1.0" in text


def test_watch_ends_with_the_job_and_the_cli_reads_states(redis_url):
    import json
    import os
    import subprocess
    import sys

    from tests.support.cli import assert_one_line_error, run

    t = RedisTracker.from_url(redis_url)
    w, sent = dispatched_job(t, ITEMS[:2])
    co = t.checkout("j", sent[0], w, max_lost=3)
    t.fail("j", sent[0], co.token, "HTTP 404", fault=Fault.ITEM, max_retries=0, max_lost=3,
           retryable=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")}
    watch = subprocess.Popen(
        [sys.executable, "-m", "distscrape_celery.cli", "status", "j", "--watch", "--redis-url",
         redis_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        time.sleep(3)  # it keeps watching while the job runs
        assert watch.poll() is None
        t.control("j", JobAction.CANCEL)
        out, err = watch.communicate(timeout=60)
    finally:
        watch.kill()
    assert watch.returncode == 0, err
    assert "cancelled" in out and f"dead {sent[0]}: HTTP 404" in out
    assert run("export", "j", "--dead", "--redis-url", redis_url).stdout == f"{sent[0]}\tHTTP 404\n"
    rows = [json.loads(line) for line in run("jobs", "--json", "--redis-url", redis_url).stdout.splitlines()]
    assert [(r["job"], r["state"], r["dead"]) for r in rows] == [("j", "cancelled", 1)]
    assert_one_line_error(run("pause", "nosuch", "--redis-url", redis_url), "no job named 'nosuch'")
    assert_one_line_error(run("export", "j", "--redis-url", redis_url), "give --dead")
    # Done items are not kept: the error points to where the saved pages are listed.
    assert_one_line_error(run("export", "j", "--done", "--redis-url", redis_url), "tar-index")


def test_jobs_table_keeps_every_field_whole_on_an_80_column_terminal(redis_url):
    from tests.support.cli import run

    t = RedisTracker.from_url(redis_url)
    job = "a-job-with-a-rather-long-name-that-needs-room"
    t.create_job(job, SPEC)
    t.add(job, ITEMS[:2])
    started = t.job_info(job).started
    assert started
    res = run("jobs", "--redis-url", redis_url, env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stderr
    assert "…" not in res.stdout, res.stdout
    assert job in res.stdout and "running" in res.stdout, res.stdout
    assert time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) in res.stdout, res.stdout
