#!/usr/bin/env python
"""A crawl under fire: workers SIGKILLed, Redis restarted and cut off, and nothing may be lost.

    python bench/chaos.py [--pages 5000] [--workers 3] [--kill-every 4] [--cutoff 20]

Runs the same crawl twice on this machine, first undisturbed, then with chaos, and prints for
each: pages lost (reachable pages not saved with the right bytes; must be 0), duplicate saves
(saver calls beyond one per page), refetches, dead items, and seconds to finish, with the chaos
run's time as a ratio of the undisturbed one.

The chaos: every ``--kill-every`` seconds (jittered) one random worker's whole process group is
SIGKILLed and a new worker started in its place; once, a third of the way in, Redis is restarted
(SIGTERM, which writes its AOF, then started again on the same port and directory); once, two
thirds of the way in, Redis is cut off for ``--cutoff`` seconds (SIGSTOP: connections hang, as
on a network partition, then SIGCONT).

Redis runs with AOF (``appendfsync everysec``) and ``noeviction``, as the README asks. The site is
served on 127.0.0.1 by a forked child process. Standard library plus the project only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "tests"))  # sitegen
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))  # bench_crawl, chaos_saver

import redis  # noqa: E402
from bench_crawl import ServedSite  # noqa: E402
from sitegen import generate_site  # noqa: E402

from distscrape_celery.local.embedded import find_redis_server  # noqa: E402
from distscrape_celery.job.spec import build_spec  # noqa: E402
from distscrape_celery.local.processes import WorkerProcess, wait_for_workers  # noqa: E402
from distscrape_celery.core.manager import CrawlManager  # noqa: E402
from distscrape_celery.savers import FileItemSaver  # noqa: E402
from distscrape_celery.settings import Settings  # noqa: E402
from distscrape_celery.tracker import RedisTracker  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AofRedis:
    """A redis-server with AOF on a fixed port and directory, so it can be restarted in place."""

    def __init__(self, workdir: Path) -> None:
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
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
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
    def __init__(self, name: str, args, site, served: ServedSite, workdir: Path) -> None:
        self.name = name
        self.args = args
        self.site = site
        self.served = served
        self.dir = workdir / name
        self.dir.mkdir()
        self.out = self.dir / "out"
        self.saves_log = self.dir / "saves.log"
        self.redis = AofRedis(self.dir)
        self.workers: list[WorkerProcess] = []
        self.events: list[str] = []
        self._n = 0

    def settings(self) -> Settings:
        return Settings.from_env({}, redis_url=self.redis.url, lease_seconds=self.args.lease)

    def start_worker(self) -> WorkerProcess:
        self._n += 1
        w = WorkerProcess(
            self.settings(), name=f"chaos-{self.name}-{self._n}", concurrency=self.args.concurrency,
            log_dir=str(self.dir), loglevel="WARNING",
            extra_env={"PYTHONPATH": str(ROOT), "CHAOS_SAVES_LOG": str(self.saves_log)},
        )
        self.workers.append(w.start())
        return w

    def live_workers(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.alive]

    def chaos(self, stop: threading.Event, expected_seconds: float) -> None:
        rng = random.Random(7)
        started = time.monotonic()
        restarted = cut = False
        while not stop.wait(self.args.kill_every * rng.uniform(0.6, 1.4)):
            t = time.monotonic() - started
            if not restarted and t > expected_seconds / 3:
                restarted = True
                self.events.append(f"{t:.1f}s redis restart")
                self.redis.stop()
                time.sleep(2)
                self.redis.start()
                continue
            if not cut and t > 2 * expected_seconds / 3:
                cut = True
                self.events.append(f"{t:.1f}s redis cut off for {self.args.cutoff}s")
                self.redis.pause()
                if stop.wait(self.args.cutoff):
                    self.redis.resume()
                    return
                self.redis.resume()
                continue
            victims = self.live_workers()
            if victims:
                victim = rng.choice(victims)
                self.events.append(f"{t:.1f}s SIGKILL {victim.name}")
                victim.kill(signal.SIGKILL)
                self.start_worker()

    def go(self, chaos: bool, expected_seconds: float) -> dict:
        self.redis.start()
        stop = threading.Event()
        try:
            for _ in range(self.args.workers):
                self.start_worker()
            tracker = RedisTracker.from_url(self.redis.url)
            wait_for_workers(tracker, self.args.workers, timeout=60)
            from distscrape_celery.worker.app import configure_app
            from distscrape_celery.worker.tasks import publisher

            configure_app(self.settings())
            spec = build_spec({
                "seeds": [self.served.url("/")],
                "saver": {"kind": "chaos_saver:CountingSaver", "output": str(self.out),
                          "fsync": False},
            })
            manager = CrawlManager(tracker, publisher.scrape)
            mark = self.served.mark()
            started = time.monotonic()
            manager.seed("chaos", spec)
            thread = None
            if chaos:
                thread = threading.Thread(target=self.chaos, args=(stop, expected_seconds), daemon=True)
                thread.start()
            stats = None
            while time.monotonic() - started < self.args.timeout:
                try:
                    stats = tracker.stats("chaos")
                    if stats.finished:
                        break
                except Exception:  # Redis is down on purpose
                    pass
                time.sleep(0.5)
            seconds = time.monotonic() - started
            stop.set()
            if thread is not None:
                thread.join(self.args.cutoff + 40)
            stats = tracker.stats("chaos")
            dead = tracker.dead_items("chaos", limit=20)
            return self.report(stats, dead, seconds, self.served.counts_since(mark))
        finally:
            stop.set()
            for w in self.workers:
                w.stop(timeout=15)
            self.redis.stop()

    def report(self, stats, dead, seconds, fetches) -> dict:
        saver = FileItemSaver(self.out)
        lost = 0
        for path in self.site.reachable:
            target = self.out / saver.name_for(self.served.url(path))
            if not target.is_file() or target.read_bytes() != self.site.pages[path]:
                lost += 1
        saves = self.saves_log.read_text().splitlines() if self.saves_log.exists() else []
        n = len(self.site.reachable)
        return {
            "run": self.name, "pages": n, "finished": stats.finished, "lost": lost,
            "done": stats.done, "dead": stats.dead, "dead_examples": dead,
            "save_calls": len(saves), "duplicate_saves": len(saves) - len(set(saves)),
            "fetches": sum(fetches.values()), "refetches": sum(fetches.values()) - len(fetches),
            "seconds": round(seconds, 1), "workers_started": self._n, "events": self.events,
        }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=5000)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--lease", type=float, default=5.0)
    p.add_argument("--delay", type=float, default=0.01, help="seconds before each page is served")
    p.add_argument("--kill-every", type=float, default=4.0)
    p.add_argument("--cutoff", type=float, default=20.0)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    site = generate_site(n_pages=args.pages, seed=11, unreachable=0)
    workdir = Path(tempfile.mkdtemp(prefix="distscrape-chaos-"))
    served = ServedSite(site, delay=args.delay, in_process=False)
    results = []
    try:
        calm = Run("calm", args, site, served, workdir).go(chaos=False, expected_seconds=0)
        results.append(calm)
        # The Redis restart and cut-off fall a third and two thirds into the undisturbed time.
        storm = Run("chaos", args, site, served, workdir).go(
            chaos=True, expected_seconds=calm["seconds"]
        )
        storm["time_ratio"] = round(storm["seconds"] / calm["seconds"], 2)
        results.append(storm)
    finally:
        served.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"{'run':6} {'pages':>6} {'lost':>5} {'dead':>5} {'dup saves':>9} {'refetch':>8} "
              f"{'workers':>8} {'seconds':>8}")
        for r in results:
            print(f"{r['run']:6} {r['pages']:6} {r['lost']:5} {r['dead']:5} {r['duplicate_saves']:9} "
                  f"{r['refetches']:8} {r['workers_started']:8} {r['seconds']:8}")
        print(f"chaos took {results[1]['time_ratio']}x the undisturbed time")
        print("events:", "; ".join(results[1]["events"]))
        for r in results:
            if r["dead_examples"]:
                print(f"{r['run']} dead:", json.dumps(r["dead_examples"], indent=1)[:2000])
    return 0 if all(r["lost"] == 0 and r["finished"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
