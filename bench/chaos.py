"""A crawl under fire: workers SIGKILLed, Redis restarted and cut off, and nothing may be lost.

    .venv/bin/python -m bench.chaos [--pages 5000] [--workers 3] [--kill-every 4] [--cutoff 20]

Runs the same crawl twice on this machine, first undisturbed, then with chaos, and prints for
each: pages lost (reachable pages not saved with the right bytes; must be 0), duplicate saves
(items saved more than once), refetches, dead items, and seconds to finish, with the chaos run's
time as a ratio of the undisturbed one. Exits 1 if a page was lost or a crawl did not finish.

The chaos: every ``--kill-every`` seconds (jittered) one random worker's whole process group is
SIGKILLed and a new worker started in its place; once, a third of the way in, Redis is restarted
(SIGTERM, which writes its AOF, then started again on the same port and directory); once, two
thirds of the way in, Redis is cut off for ``--cutoff`` seconds (SIGSTOP: connections hang, as
on a network partition, then SIGCONT).

Redis runs with AOF (``appendfsync everysec``) and ``noeviction``, as docs/deployment.md asks.
The workers save with ``bench.chaos_saver`` (files, each save logged). The site is served on
127.0.0.1 by a forked child process. Run from the repository root: the workers import the saver
from there.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import redis

from bench.helpers import ServedSite, free_port
from distscrape_celery.testing.sitegen import Site, generate_site

JOB = "chaos"


class AofRedis:
    """A redis-server with AOF on a fixed port and directory, so it can be restarted in place."""

    def __init__(self, workdir: Path) -> None:
        from distscrape_celery.local.embedded import find_redis_server

        self.binary = find_redis_server()
        self.dir = workdir / "redis"
        self.dir.mkdir()
        self.port = free_port()
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "everysec", "--maxmemory-policy", "noeviction",
             "--dir", str(self.dir), "--logfile", str(self.dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    return
            except (redis.ConnectionError, redis.BusyLoadingError):
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            self.proc.wait(30)

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)


class Run:
    """One crawl of the site by ``--workers`` workers on a Redis of its own, with or without
    chaos, and its report."""

    def __init__(self, name: str, args, site: Site, served: ServedSite, workdir: Path) -> None:
        self.name = name
        self.args = args
        self.site = site
        self.served = served
        self.dir = workdir / name
        self.dir.mkdir()
        self.out = self.dir / "out"
        self.saves_log = self.dir / "saves.log"
        self.redis = AofRedis(self.dir)
        self.workers: list = []  # every WorkerProcess started, the killed ones too
        self.events: list[str] = []

    def settings(self):
        from distscrape_celery.settings import Settings

        return Settings.from_env({}, redis_url=self.redis.url, lease_seconds=self.args.lease,
                                 plugin_modules=("bench.chaos_saver",),
                                 output_roots=(str(self.dir),))

    def start_worker(self) -> None:
        from distscrape_celery.local.processes import WorkerProcess

        worker = WorkerProcess(
            self.settings(), name=f"chaos-{self.name}-{len(self.workers) + 1}",
            pool=self.args.pool, concurrency=self.args.concurrency, log_dir=str(self.dir),
            extra_env={"CHAOS_SAVES_LOG": str(self.saves_log)})
        self.workers.append(worker.start())

    def chaos(self, stop: threading.Event, expected_seconds: float) -> None:
        """Until ``stop``: a SIGKILL every ``--kill-every`` s or so; a Redis restart a third of
        ``expected_seconds`` in, a cut-off of ``--cutoff`` s two thirds in."""
        rng = random.Random(7)
        started = time.monotonic()
        restarted = cut = False
        while not stop.wait(self.args.kill_every * rng.uniform(0.6, 1.4)):
            elapsed = time.monotonic() - started
            if not restarted and elapsed > expected_seconds / 3:
                restarted = True
                self.events.append(f"{elapsed:.1f}s redis restart")
                self.redis.stop()
                time.sleep(2)
                self.redis.start()
            elif not cut and elapsed > 2 * expected_seconds / 3:
                cut = True
                self.events.append(f"{elapsed:.1f}s redis cut off for {self.args.cutoff}s")
                self.redis.pause()
                stopping = stop.wait(self.args.cutoff)
                self.redis.resume()
                if stopping:
                    return
            else:
                self.kill_one(rng, elapsed)

    def kill_one(self, rng: random.Random, elapsed: float) -> None:
        """SIGKILL a random live worker's whole process group, and start a new one."""
        victims = [worker for worker in self.workers if worker.alive]
        if victims:
            victim = rng.choice(victims)
            self.events.append(f"{elapsed:.1f}s SIGKILL {victim.name}")
            victim.kill(signal.SIGKILL)
            self.start_worker()

    def go(self, chaos: bool, expected_seconds: float) -> dict:
        """The crawl, start to finish (or ``--timeout``), and its report."""
        from distscrape_celery.local.processes import wait_for_workers
        from distscrape_celery.tracker import RedisTracker

        self.redis.start()
        stop = threading.Event()
        try:
            for _ in range(self.args.workers):
                self.start_worker()
            tracker = RedisTracker.from_settings(self.settings())
            wait_for_workers(tracker, self.args.workers, timeout=60)
            mark = self.served.mark()
            started = time.monotonic()
            self.seed(tracker)
            thread = None
            if chaos:
                thread = threading.Thread(target=self.chaos, args=(stop, expected_seconds),
                                          daemon=True)
                thread.start()
            wait_finished(tracker, started + self.args.timeout)
            seconds = time.monotonic() - started
            stop.set()
            if thread is not None:
                thread.join(self.args.cutoff + 40)
            return self.report(tracker, seconds, self.served.counts_since(mark))
        finally:
            stop.set()
            for worker in self.workers:
                worker.stop(timeout=15)
            self.redis.stop()

    def seed(self, tracker) -> None:
        from distscrape_celery.core.manager import CrawlManager
        from distscrape_celery.job.spec import build_spec
        from distscrape_celery.worker.app import configure_app
        from distscrape_celery.worker.publish import publisher

        settings = self.settings()
        configure_app(settings)
        spec = build_spec({
            "seeds": [self.served.url("/")],
            "saver": {"kind": "bench.chaos_saver:CountingSaver", "output": str(self.out),
                      "fsync": False},
        })
        CrawlManager(tracker, publisher.scrape, settings=settings).seed(JOB, spec)

    def report(self, tracker, seconds: float, fetches: dict[str, int]) -> dict:
        from distscrape_celery.savers import FileItemSaver

        stats = tracker.stats(JOB)
        saver = FileItemSaver(self.out)
        lost = 0
        for path in self.site.reachable:
            target = self.out / saver.name_for(self.served.url(path))
            if not target.is_file() or target.read_bytes() != self.site.pages[path]:
                lost += 1
        saves = self.saves_log.read_text().splitlines() if self.saves_log.exists() else []
        return {
            "run": self.name, "pages": len(self.site.reachable), "finished": stats.finished,
            "lost": lost, "done": stats.done, "dead": stats.dead,
            "dead_examples": tracker.dead_items(JOB, limit=20),
            "save_calls": len(saves), "duplicate_saves": len(saves) - len(set(saves)),
            "fetches": sum(fetches.values()), "refetches": sum(fetches.values()) - len(fetches),
            "seconds": round(seconds, 1), "workers_started": len(self.workers),
            "events": self.events,
        }


def wait_finished(tracker, deadline: float) -> None:
    """Poll until the job is finished or ``deadline`` (monotonic) passes; Redis may be down on
    purpose meanwhile."""
    while time.monotonic() < deadline:
        try:
            if tracker.stats(JOB).finished:
                return
        except Exception:  # Redis is down on purpose
            pass
        time.sleep(0.5)


def chaos_run(args) -> list[dict]:
    """The undisturbed crawl, then the crawl under chaos: their reports."""
    site = generate_site(n_pages=args.pages, seed=11, unreachable=0)
    workdir = Path(tempfile.mkdtemp(prefix="distscrape-chaos-"))
    # Forked before this process has threads or connections.
    served = ServedSite(site, delay=args.delay, in_process=False)
    try:
        calm = Run("calm", args, site, served, workdir).go(chaos=False, expected_seconds=0)
        # The Redis restart and cut-off fall a third and two thirds into the undisturbed time.
        storm = Run("chaos", args, site, served, workdir).go(
            chaos=True, expected_seconds=calm["seconds"])
        storm["time_ratio"] = round(storm["seconds"] / calm["seconds"], 2)
        return [calm, storm]
    finally:
        served.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def print_reports(results: list[dict]) -> None:
    print(f"{'run':6} {'pages':>6} {'lost':>5} {'dead':>5} {'dup saves':>9} {'refetch':>8} "
          f"{'workers':>8} {'seconds':>8}")
    for result in results:
        print(f"{result['run']:6} {result['pages']:6} {result['lost']:5} {result['dead']:5} "
              f"{result['duplicate_saves']:9} {result['refetches']:8} "
              f"{result['workers_started']:8} {result['seconds']:8}")
    print(f"chaos took {results[1]['time_ratio']}x the undisturbed time")
    print("events:", "; ".join(results[1]["events"]))
    for result in results:
        if result["dead_examples"]:
            print(f"{result['run']} dead:", json.dumps(result["dead_examples"], indent=1)[:2000])


def parser() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_argument("--pages", type=int, default=5000)
    options.add_argument("--workers", type=int, default=3)
    options.add_argument("--pool", default="prefork", help="the workers' Celery pool")
    options.add_argument("--concurrency", type=int, default=4)
    options.add_argument("--lease", type=float, default=5.0, help="lease_seconds, seconds")
    options.add_argument("--delay", type=float, default=0.01,
                         help="seconds before each page is served")
    options.add_argument("--kill-every", type=float, default=4.0)
    options.add_argument("--cutoff", type=float, default=20.0)
    options.add_argument("--timeout", type=float, default=1800.0)
    options.add_argument("--json", action="store_true")
    return options


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(argv)
    results = chaos_run(args)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_reports(results)
    safe = all(r["lost"] == 0 and r["finished"] for r in results)
    return 0 if safe else 1


if __name__ == "__main__":
    sys.exit(main())
