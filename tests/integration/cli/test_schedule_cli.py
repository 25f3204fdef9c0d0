"""``distscrape schedule list/set/pause/resume/delete`` and ``distscrape run`` against a real
Redis, as a user runs them: what they change in the tracker, what ``jobs`` and ``status`` show,
and one-line errors with exit status 2."""

from __future__ import annotations

import json
import time

from distscrape_celery.tracker import RedisTracker
from tests.integration.tracker.test_generations import SEEDS, SPEC, crawl_all
from tests.support.cli import assert_one_line_error, run
from tests.support.jobs import new_job


def _cli(redis_url, *args):
    return run(*args, "--redis-url", redis_url)


def _listed(redis_url) -> dict:
    res = _cli(redis_url, "schedule", "list", "--json")
    assert res.returncode == 0, res.stderr
    return {row["job"]: row for row in map(json.loads, res.stdout.splitlines())}


def test_a_schedule_is_set_listed_paused_resumed_and_deleted(redis_url):
    res = _cli(redis_url, "seed", "j", "http://127.0.0.1:9/", "--every", "1h")
    assert res.returncode == 0, res.stderr
    assert "runs again every 1h: next at" in res.stdout
    row = _listed(redis_url)["j"]
    assert (row["schedule"], row["paused"], row["generation"]) == ("every 1h", False, 1)
    assert abs(row["next_due"] - (time.time() + 3600)) < 60, row
    text = _cli(redis_url, "schedule", "list").stdout
    assert text.startswith("j\tevery 1h\tnext ") and "generation 1 running" in text, text
    assert "every 1h" in _cli(redis_url, "status", "j").stdout

    res = _cli(redis_url, "schedule", "set", "j", "--cron", "0 */6 * * *")
    assert res.returncode == 0 and "runs again cron '0 */6 * * *'" in res.stdout, res
    row = _listed(redis_url)["j"]
    assert row["schedule"] == "cron '0 */6 * * *'" and row["next_due"] % 21600 == 0, row

    assert _cli(redis_url, "schedule", "pause", "j").returncode == 0
    row = _listed(redis_url)["j"]
    assert row["paused"] and row["next_due"] is None
    assert "\tpaused\t" in _cli(redis_url, "schedule", "list").stdout
    assert "paused" in _cli(redis_url, "jobs").stdout
    res = _cli(redis_url, "schedule", "resume", "j")
    assert res.returncode == 0 and "schedule resumed, next at" in res.stdout, res
    assert not _listed(redis_url)["j"]["paused"]

    assert _cli(redis_url, "schedule", "delete", "j").returncode == 0
    assert _listed(redis_url) == {}
    assert _cli(redis_url, "schedule", "list").stdout.strip() == "no job has a schedule"
    status = json.loads(_cli(redis_url, "status", "j", "--json").stdout)
    assert (status["schedule"], status["next_due"]) == (None, None)


def test_schedule_errors_are_one_line(redis_url):
    assert _cli(redis_url, "seed", "j", "http://127.0.0.1:9/").returncode == 0
    assert_one_line_error(_cli(redis_url, "schedule", "set", "j", "--every", "5s"),
                          "invalid schedule", "at most every 10 seconds")
    assert_one_line_error(_cli(redis_url, "schedule", "set", "j", "--cron", "61 * * * *"),
                          "invalid schedule", "not a cron expression")
    assert_one_line_error(_cli(redis_url, "schedule", "set", "j", "--every", "soon"),
                          "invalid schedule", "not a duration")
    assert _cli(redis_url, "schedule", "set", "j").returncode == 2
    assert _cli(redis_url, "schedule", "set", "j", "--every", "1h", "--cron", "* * * * *"
                ).returncode == 2
    assert_one_line_error(_cli(redis_url, "seed", "k", "http://127.0.0.1:9/", "--every", "5s"),
                          "at most every 10 seconds")
    assert "k" not in _cli(redis_url, "jobs").stdout  # refused before anything was stored
    # A job with no schedule, and no job at all.
    for action in ("pause", "resume"):
        assert_one_line_error(_cli(redis_url, "schedule", action, "j"), "no schedule")
    assert_one_line_error(_cli(redis_url, "schedule", "delete", "j"), "no schedule")
    for args in (("schedule", "set", "nope", "--every", "1h"), ("schedule", "pause", "nope"),
                 ("run", "nope")):
        assert_one_line_error(_cli(redis_url, *args), "nope")
    assert _listed(redis_url) == {}


def test_run_starts_the_next_generation_of_a_finished_job_only(redis_url):
    tracker = RedisTracker.from_url(redis_url, bound_refresh_seconds=0)
    worker = new_job(tracker, spec=SPEC)
    pending = tracker.add("j", SEEDS).dispatch
    assert_one_line_error(_cli(redis_url, "run", "j"), "job 'j' is running",
                          "only a finished job runs again")
    assert tracker.job_info("j").generation == 1
    crawl_all(tracker, "j", worker, pending=pending)
    assert tracker.job_info("j").state.value == "finished"
    tracker.set_schedule("j", "every 3600", tracker.now() + 3600)

    res = _cli(redis_url, "run", "j")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("job j: generation 2 started;"), res.stdout
    info = tracker.job_info("j")
    assert (info.generation, info.state.value, info.schedule) == (2, "running", "every 3600")
    assert tracker.stats("j").queued == 2  # the seeds, queued again
    status = json.loads(_cli(redis_url, "status", "j", "--json").stdout)
    assert (status["generation"], status["state"]) == (2, "running")
    assert abs(status["next_due"] - info.next_due) < 1e-3
    row = next(line for line in _cli(redis_url, "jobs").stdout.splitlines() if " j " in line)
    assert " 2 " in row and time.strftime("%Y-%m-%d", time.localtime(info.next_due)) in row, row
    assert_one_line_error(_cli(redis_url, "run", "j"), "is running")
    assert tracker.job_info("j").generation == 2
