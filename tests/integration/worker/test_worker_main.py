"""The worker processes that `distscrape crawl` and the tests start (distscrape_celery.worker.main):
the same worker as `celery -A distscrape_celery worker`, without Celery's command line."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.support.crawl import plugins_path

from distscrape_celery.errors import EmbeddedServiceError
from distscrape_celery.local.processes import WorkerProcess, wait_for_workers
from distscrape_celery.settings import Settings
from distscrape_celery.tracker import RedisTracker
from distscrape_celery.worker.main import forked_name, parse_args

def wait_for_line(worker: WorkerProcess, pattern: str, timeout: float = 60) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, worker.log_tail(100_000))
        if m:
            return m
        worker.check()
        time.sleep(0.1)
    raise AssertionError(f"{pattern!r} not in the log:\n{worker.log_tail()}")


def test_a_started_worker_runs_without_celerys_command_line(redis_url, tmp_path):
    settings = Settings(redis_url=redis_url)
    worker = WorkerProcess(
        settings, name="lean", concurrency=2, pool="threads", loglevel="INFO", log_dir=str(tmp_path),
        extra_env={"PYTHONPATH": plugins_path()}, include=["tests.plugins.loaded_modules"],
    ).start()
    try:
        m = wait_for_line(worker, r"command-line modules loaded: (\d+) (.*)")
        assert m.group(1) == "0", m.group(2)
        # The node name has its host filled in, as `celery worker -n` does.
        wait_for_line(worker, re.escape(f"lean@{socket.gethostname()} ready."))
        wait_for_workers(RedisTracker.from_settings(settings), 1, procs=[worker])
        # A warm shutdown on SIGTERM, exit code 0, as the command line's worker.
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(30) == 0
    finally:
        worker.stop(timeout=5)


def test_the_options_are_celery_workers_own():
    args = parse_args(["-Q", "a,b", "-P", "solo", "-c", "3", "-n", "x@%h", "--loglevel", "INFO",
                       "--without-gossip", "--without-mingle", "-I", "m1,m2"])
    assert (args.queues, args.pool, args.concurrency, args.hostname, args.loglevel) == (
        "a,b", "solo", 3, "x@%h", "INFO")
    assert args.without_gossip and args.without_mingle and args.include == "m1,m2"


# ----------------------------------------------------------------- workers forked (--forks)


@contextlib.contextmanager
def forked(redis_url: str, tmp_path, forks: list[int], include: str = "tests.plugins.loaded_modules"):
    """``worker.main --forks FORKS`` on ``redis_url``, once every worker has registered: (its
    WorkerProcess, the tracker, the forked workers' pids). Stopped on the way out."""
    settings = Settings(redis_url=redis_url)
    tracker = RedisTracker.from_settings(settings)
    worker = WorkerProcess(
        settings, name="forked", pool="threads", loglevel="INFO", log_dir=str(tmp_path),
        forks=forks, extra_env={"PYTHONPATH": plugins_path()}, include=[include],
    ).start()
    try:
        wait_for_workers(tracker, len(forks), procs=[worker])
        yield worker, tracker, worker.forked_pids()
    finally:
        worker.stop(timeout=5)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie is gone too: only its parent's wait is left.
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z")


def _wait_gone(pids, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not all(_gone(p) for p in pids):
        assert time.monotonic() < deadline, f"still running: {[p for p in pids if not _gone(p)]}"
        time.sleep(0.05)


def _imported_after_the_fork(worker: WorkerProcess, workers: int) -> list[int]:
    """How many modules each forked worker imported itself (plugins.loaded_modules)."""
    pattern = r"modules imported after the fork: (\d+)"
    wait_for_line(worker, "(.|\n)*".join([pattern] * workers))
    return [int(n) for n in re.findall(pattern, worker.log_tail(100_000))]


def test_forked_workers_are_named_apart_each_in_its_own_session_and_stop_together(
        redis_url, tmp_path):
    with forked(redis_url, tmp_path, [1, 2]) as (worker, tracker, pids):
        # One worker per number, with that concurrency, each its own process.
        assert {w.pid: w.concurrency for w in tracker.workers()} == dict(zip(pids, [1, 2]))
        host = socket.gethostname()
        for n in (1, 2):
            wait_for_line(worker, re.escape(f"forked-{n}@{host} ready."))
        # Each its own session (and process group), as a worker started alone: see worker.main.
        assert [os.getsid(p) for p in pids] == pids
        assert os.getsid(worker.proc.pid) not in pids
        # What a worker imports is imported before the fork, once.
        assert max(_imported_after_the_fork(worker, 2)) < 8, worker.log_tail()
        # SIGTERM to the supervisor: a warm shutdown of both, and exit code 0.
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(30) == 0
        _wait_gone(pids)
        assert not [w for w in tracker.workers() if w.alive]


def test_a_forked_worker_that_dies_stops_the_others_and_the_supervisor_reports_it(
        redis_url, tmp_path):
    with forked(redis_url, tmp_path, [1, 1, 1]) as (worker, _, pids):
        victim, *others = pids
        os.kill(victim, signal.SIGKILL)
        assert worker.proc.wait(30) == 128 + signal.SIGKILL
        _wait_gone(others)
        with pytest.raises(EmbeddedServiceError, match="exited with code 137"):
            worker.check()


def test_killing_a_forked_worker_process_kills_every_worker(redis_url, tmp_path):
    with forked(redis_url, tmp_path, [1, 1]) as (worker, _, pids):
        # Stopped, the workers could not act on the SIGTERM their supervisor's death sends:
        # only a SIGKILL of their own ends them.
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        worker.kill(signal.SIGKILL)
        assert worker.proc.wait(30) == -signal.SIGKILL
        _wait_gone(pids, timeout=5)


def test_forked_workers_shut_down_when_their_supervisor_is_killed(redis_url, tmp_path):
    with forked(redis_url, tmp_path, [1, 1]) as (worker, tracker, pids):
        # Ready: Celery's own handlers make the stop a warm shutdown (before, see the next test).
        for n in (1, 2):
            wait_for_line(worker, re.escape(f"forked-{n}@{socket.gethostname()} ready."))
        os.kill(worker.proc.pid, signal.SIGKILL)  # the supervisor alone
        worker.proc.wait(30)
        _wait_gone(pids)
        # A warm shutdown (SIGTERM), not a kill: each deregistered itself.
        assert not [w for w in tracker.workers() if w.alive]
        assert worker.log_tail(100_000).count("worker: Warm shutdown") == 2, worker.log_tail()


def test_a_worker_stopped_before_it_is_ready_deregisters(redis_url, tmp_path):
    """A worker registers in worker_init; Celery installs its stop handlers later in its start.
    A stop signal in between used to end it by the signal's default action, with no exit
    handlers: it stayed listed as alive until its heartbeat ran out (seen in CI, 1 run of ~10,
    when a supervisor was killed while its workers started)."""
    settings = Settings(redis_url=redis_url)
    tracker = RedisTracker.from_settings(settings)
    worker = WorkerProcess(
        settings, name="early", pool="threads", concurrency=1, log_dir=str(tmp_path),
        extra_env={"PYTHONPATH": plugins_path()}, include=["tests.plugins.slow_start"],
    ).start()
    try:
        wait_for_workers(tracker, 1, procs=[worker])
        wait_for_line(worker, "slow start: pausing")  # registered, Celery's handlers not yet in
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(30) == 0  # well before the plugin's 60 s pause ends
        assert not [w for w in tracker.workers() if w.alive]
        assert "stopped by SIGTERM before the worker was ready" in worker.log_tail(100_000)
    finally:
        worker.stop(timeout=5)


def test_forked_workers_stopped_before_they_are_ready_deregister(redis_url, tmp_path):
    with forked(redis_url, tmp_path, [1, 1], include="tests.plugins.slow_start") as (
            worker, tracker, pids):
        wait_for_line(worker, "slow start: pausing(.|\n)*slow start: pausing")
        os.kill(worker.proc.pid, signal.SIGKILL)  # the supervisor: each worker gets a SIGTERM
        worker.proc.wait(30)
        _wait_gone(pids)
        assert not [w for w in tracker.workers() if w.alive]
        assert worker.log_tail(100_000).count("before the worker was ready") == 2


@pytest.mark.parametrize("argv, message", [
    (["--forks", "2,x"], "positive whole numbers"),
    (["--forks", "0"], "positive whole numbers"),
    (["--forks", "2", "-c", "2"], "either -c or --forks"),
])
def test_bad_forks_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(["-Q", "a", *argv])
    assert message in capsys.readouterr().err


def test_a_forked_workers_node_name_gets_its_number_before_the_host():
    assert forked_name("distscrape-job@%h", 2) == "distscrape-job-2@%h"
    assert forked_name(None, 1) == "celery-1@%h"
    assert forked_name("plain", 3) == "plain-3"


def test_an_idle_workers_stop_waits_at_most_a_short_brpop(redis_url, tmp_path):
    """A worker stopping waits for the fetch it has in flight to answer (BRPOP, or BLMPOP with
    room for several messages), and an idle one's answers only when it times out: kombu's
    default of 1 s made every stop of an idle worker (each `distscrape crawl`, each `celery
    multi stopwait`) take up to a second more."""
    import redis

    from distscrape_celery.worker.app import BRPOP_SECONDS

    settings = Settings(redis_url=redis_url)
    worker = WorkerProcess(settings, name="idle", concurrency=2, pool="threads",
                           log_dir=str(tmp_path)).start()
    monitor_client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        wait_for_workers(RedisTracker.from_settings(settings), 1, procs=[worker])
        timeouts = []
        with monitor_client.monitor() as monitor:
            while len(timeouts) < 3:  # the idle worker's fetches, one after another
                command = monitor.next_command()["command"].split()
                if command[0] == "BRPOP":
                    timeouts.append(float(command[-1]))
                elif command[0] == "BLMPOP":  # BLMPOP timeout numkeys key... RIGHT COUNT n
                    timeouts.append(float(command[1]))
        assert timeouts == [BRPOP_SECONDS] * 3
        assert BRPOP_SECONDS <= 0.25
        started = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(30) == 0
        # Not a benchmark (bench/bench_worker_start.py measures it): a bound that a kombu
        # default BRPOP of 1 s, plus the shutdown, would not leave room for every time.
        assert time.monotonic() - started < 5
    finally:
        monitor_client.close()
        worker.stop(timeout=5)
