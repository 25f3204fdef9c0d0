"""The worker processes that `distscrape crawl` and the tests start (distscrape_celery.worker_main):
the same worker as `celery -A distscrape_celery worker`, without Celery's command line."""

from __future__ import annotations

import re
import signal
import socket
import time

from conftest import plugins_path

from distscrape_celery.local import WorkerProcess, wait_for_workers
from distscrape_celery.settings import Settings
from distscrape_celery.tracker import RedisTracker
from distscrape_celery.worker_main import parse_args

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
        extra_env={"PYTHONPATH": plugins_path()}, include=["plugins.loaded_modules"],
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
