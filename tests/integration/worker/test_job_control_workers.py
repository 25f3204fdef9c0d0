"""Job control through real `celery worker` processes, real Redis and real HTTP on 127.0.0.1:
pause holds fetching and resume finishes the job; cancel stops it and export lists what was
saved; the completion event fires once across two workers; a finished job is no longer
maintained; `workers` lists both workers; a dead worker's records are pruned; a job deleted and
seeded again under its name with another spec is crawled by that spec."""

from __future__ import annotations

import json
import time

import pytest
import redis

from tests.support.crawl import crawl_settings, wait_until
from tests.support.http import RouteServer
from tests.support.cli import run

from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.tracker import JobAction, JobState, RedisTracker
from distscrape_celery.tracker.redis import scripts

PAGES = 30


def fan_out(delay: float):
    root = "".join(f'<a href="/p{i}">{i}</a>' for i in range(PAGES)).encode()

    def respond(path: str, n: int):
        if path == "/":
            return 200, root, {}, 0.0
        if path.startswith("/p") and path[2:].isdigit():
            return 200, b"leaf " + path.encode(), {}, delay
        return 404, b"", {}, 0.0

    return respond


@pytest.fixture
def two_workers(redis_url, workers):
    settings = crawl_settings(redis_url, lease_seconds=5, worker_prune_seconds=6)
    tracker = RedisTracker.from_url(redis_url)
    ghost = tracker.register_worker("ghost.invalid", 1, 1)  # never beats again
    procs = [
        workers(settings, f"jc{i}", concurrency=2, include=["tests.plugins.hooks"])
        for i in range(2)
    ]
    wait_for_workers(tracker, 2, procs=procs)
    return tracker, procs, ghost


def cli(redis_url, *args):
    res = run(*args, "--redis-url", redis_url)
    assert res.returncode == 0, res.stderr
    return res.stdout


def settled(tracker, job):
    """Nothing of ``job`` is being fetched or saved."""
    s = tracker.stats(job)
    return s.leased == 0 and s.save_pending == 0


def maintain_calls(redis_url, tracker, seconds: float) -> dict[str, int]:
    """How many maintain script calls each job got during ``seconds`` (Redis MONITOR)."""
    # The script by its SHA1, or the library's function (Redis 7 and later).
    calls = (f"EVALSHA {tracker._scripts['maintain'].sha}",
             f"FCALL {scripts.library().functions['maintain']}")
    counts: dict[str, int] = {}
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    with client.monitor() as m:
        end = time.monotonic() + seconds
        for cmd in m.listen():
            text = cmd["command"]
            if text.startswith(calls):
                job = text.split("ds:{", 1)[1].split("}", 1)[0]
                counts[job] = counts.get(job, 0) + 1
            if time.monotonic() > end:
                break
    client.close()
    return counts


def test_pause_resume_completion_once_and_workers(redis_url, two_workers, tmp_path):
    tracker, procs, ghost = two_workers
    with RouteServer(fan_out(1.0)) as site:
        out = tmp_path / "out"
        cli(redis_url, "seed", "j", site.base + "/", "--output", str(out))
        wait_until("some pages", lambda: tracker.stats("j").done >= 2, procs=procs)
        assert "job j: paused" in cli(redis_url, "pause", "j")
        wait_until("in-flight pages to end", lambda: settled(tracker, "j"), procs=procs)
        hits = len(site.page_hits)
        rows = [json.loads(line) for line in cli(redis_url, "workers", "--json").splitlines()]
        time.sleep(3)  # no request may arrive while paused
        assert len(site.page_hits) == hits
        assert tracker.stats("j").done < PAGES + 1
        assert json.loads(cli(redis_url, "status", "j", "--json"))["state"] == "paused"
        # The CLI's own lease (60 s) still counts the ghost alive; the workers are listed.
        assert {p.proc.pid for p in procs} <= {r["pid"] for r in rows if r["concurrency"] == 2}
        # Still maintained while paused; a finished job will not be.
        assert "j" in maintain_calls(redis_url, tracker, 1.5)

        assert "job j: running" in cli(redis_url, "resume", "j")
        wait_until("the job to finish", lambda: tracker.job_info("j").state is JobState.FINISHED,
                   procs=procs)
        assert sorted(site.page_hits) == sorted(["/"] + [f"/p{i}" for i in range(PAGES)])
        info = tracker.job_info("j")
        assert info.final == {"seen": PAGES + 1, "done": PAGES + 1, "dead": 0}
        assert info.ended >= info.started

        def hook_lines():
            return sum(p.log_path.read_text(errors="replace").count("job_finished hook: j finished")
                       for p in procs)

        wait_until("the job_finished hook", lambda: hook_lines() >= 1, procs=procs)
        tracker.create_job("k", '{"seeds": ["http://k.invalid/"]}')
        tracker.control("k", JobAction.PAUSE)
        tracker.add("k", ["http://k.invalid/"])
        calls = maintain_calls(redis_url, tracker, 2.0)
        assert calls.get("k", 0) > 0 and "j" not in calls
        assert hook_lines() == 1
        wait_until("the ghost worker's records to be pruned",
                   lambda: ghost not in {w.id for w in tracker.workers()}, timeout=30)
        table = cli(redis_url, "jobs")
        assert "finished" in table and "paused" in table


def test_cancel_stops_fetching_and_delete_removes_the_job(redis_url, two_workers, tmp_path):
    tracker, procs, _ = two_workers
    # 2 s a page: the 4 task slots fetch 2 pages a second, so the cancel below has 13 s, two
    # command-line runs on a loaded machine, to come before the last page is leased.
    with RouteServer(fan_out(2.0)) as site:
        cli(redis_url, "seed", "c", site.base + "/", "--output", str(tmp_path / "out"))
        wait_until("some pages", lambda: tracker.stats("c").done >= 2, procs=procs)
        refused = run("delete", "c", "--redis-url", redis_url)
        assert refused.returncode == 2 and "cancel it first" in refused.stderr
        assert "job c: cancelled" in cli(redis_url, "cancel", "c")
        wait_until("in-flight pages to end", lambda: settled(tracker, "c"), procs=procs)
        hits = len(site.page_hits)
        time.sleep(2)
        assert len(site.page_hits) == hits < PAGES + 1
        assert tracker.stats("c").done <= len(site.page_hits)
        assert tracker.job_info("c").state is JobState.CANCELLED
        assert "c" not in tracker.active_jobs()
        assert "deleted" in cli(redis_url, "delete", "c")
        assert tracker.jobs() == []


def test_a_job_seeded_again_after_delete_follows_its_new_spec(redis_url, workers, tmp_path):
    """Workers keep what they built from a job's spec (its saver, scraper, robots.txt policy).
    A job deleted and seeded again under its name is another job: the same workers must save
    it where its new spec says, not into the first one's output."""
    from tests.support.crawl import saved_files
    from distscrape_celery.testing.sitegen import SiteServer, generate_site
    from distscrape_celery.core.manager import CrawlManager
    from distscrape_celery.job.spec import build_spec
    from distscrape_celery.worker.app import configure_app
    from distscrape_celery.worker.publish import publisher

    site = generate_site(n_pages=30, seed=5, unreachable=0)
    settings = crawl_settings(redis_url, lease_seconds=30)
    procs = [workers(settings, "respec-0", concurrency=2)]
    tracker = RedisTracker.from_url(redis_url)
    wait_for_workers(tracker, 1, procs=procs)
    configure_app(settings)
    manager = CrawlManager(tracker, publisher.scrape)
    first, second = tmp_path / "first", tmp_path / "second"

    def check():
        for p in procs:
            p.check()

    with SiteServer(site) as server:
        spec = {"seeds": [server.url("/")], "saver": {"output": str(first)}}
        manager.seed("j", build_spec(spec))
        manager.wait("j", timeout=90, check=check)
        assert len(saved_files(first)) == len(site.reachable)
        tracker.delete_job("j")
        manager.seed("j", build_spec({**spec, "saver": {"output": str(second)}}))
        stats = manager.wait("j", timeout=90, check=check)
    assert stats.done == len(site.reachable)
    assert len(saved_files(second)) == len(site.reachable)
