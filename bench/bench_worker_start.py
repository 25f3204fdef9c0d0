"""A worker's CPU from start to ready: `celery -A distscrape_celery worker` against
`python -m distscrape_celery.worker_main` (what `distscrape crawl` starts), alternated.

    python bench/bench_worker_start.py [--rounds 5] [--pool "threads -c 16"]

Starts a throwaway Redis; each round starts one worker of each kind, waits until it has
registered with the tracker and then one second more (start-up work that follows "ready"), reads
the process's user + system CPU from /proc and stops it. Prints every reading and the medians.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_crawl import own_cpu  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pool", default="threads -c 16", help="-P value and options after it")
    args = parser.parse_args()

    from distscrape_celery.celery_app import SAVE_QUEUE, SCRAPE_QUEUE
    from distscrape_celery.embedded import EmbeddedRedis
    from distscrape_celery.settings import Settings
    from distscrape_celery.tracker import RedisTracker

    pool = ["-P", *args.pool.split()]
    common = ["-Q", f"{SCRAPE_QUEUE},{SAVE_QUEUE}", *pool, "--loglevel", "WARNING",
              "--without-gossip", "--without-mingle"]
    kinds = {
        "celery worker": [sys.executable, "-m", "celery", "-A", "distscrape_celery", "worker"],
        "worker_main": [sys.executable, "-m", "distscrape_celery.worker_main"],
    }
    readings: dict[str, list[float]] = {k: [] for k in kinds}
    with EmbeddedRedis() as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")}
        env.update(Settings(redis_url=server.url).to_env())
        tracker = RedisTracker.from_url(server.url)
        for r in range(args.rounds):
            for name, cmd in kinds.items():
                before = sum(1 for w in tracker.workers() if w.alive)
                proc = subprocess.Popen([*cmd, *common, "-n", f"start{r}-{len(name)}@%h"], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                deadline = time.monotonic() + 60
                while sum(1 for w in tracker.workers() if w.alive) <= before:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise SystemExit(f"{name} did not come up")
                    time.sleep(0.02)
                time.sleep(1.0)
                cpu = own_cpu(proc.pid)
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)  # its warm shutdown deregisters it
                readings[name].append(cpu)
                print(f"round {r + 1}: {name:<14} {cpu:.2f} s CPU", flush=True)
    base = statistics.median(readings["celery worker"])
    for name, values in readings.items():
        med = statistics.median(values)
        print(f"median {name:<14} {med:.2f} s ({med / base:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
