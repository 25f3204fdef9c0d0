"""Workers' CPU from start to ready, alternated: `celery -A distscrape_celery worker`,
`python -m distscrape_celery.worker.main`, and ``--workers`` of them, started one by one or
forked from one process that imported everything once (`worker.main --forks`, what
`distscrape crawl` starts).

    .venv/bin/python -m bench.bench_worker_start [--rounds 5] [--pool "threads -c 16"] [--workers 4]

Starts a throwaway Redis; each round starts each kind, waits until its workers have registered
with the tracker and then one to two seconds more (start-up work that follows "ready"), reads the user +
system CPU of every process of it from /proc and stops it (SIGTERM, a warm shutdown), timing the
stop until every process has exited. Prints every reading and the medians.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import time

from bench.helpers import children_of, own_cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pool", default="threads -c 16", help="-P value and options after it")
    parser.add_argument("--workers", type=int, default=4, help="workers of the last two kinds")
    args = parser.parse_args()

    from distscrape_celery.worker.names import SAVE_QUEUE, SCRAPE_QUEUE
    from distscrape_celery.local.embedded import EmbeddedRedis
    from distscrape_celery.settings import Settings
    from distscrape_celery.tracker import RedisTracker

    pool = ["-P", *args.pool.split()]
    common = ["-Q", f"{SCRAPE_QUEUE},{SAVE_QUEUE}", "--loglevel", "WARNING",
              "--without-gossip", "--without-mingle"]
    celery = [sys.executable, "-m", "celery", "-A", "distscrape_celery", "worker"]
    lean = [sys.executable, "-m", "distscrape_celery.worker.main"]
    n, threads = args.workers, pool[pool.index("-c") + 1] if "-c" in pool else "1"
    forks = ["-P", pool[1], "--forks", ",".join([threads] * n)]
    # name -> (command, how many processes of it, how many workers each registers)
    kinds = {
        "celery worker": (celery + pool, 1, 1),
        "worker.main": (lean + pool, 1, 1),
        f"{n} x worker.main": (lean + pool, n, 1),
        f"--forks ({n})": (lean + forks, 1, n),
    }
    readings: dict[str, list[float]] = {k: [] for k in kinds}
    stops: dict[str, list[float]] = {k: [] for k in kinds}
    with EmbeddedRedis() as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")}
        env.update(Settings(redis_url=server.url).to_env())
        tracker = RedisTracker.from_url(server.url)
        for r in range(args.rounds):
            for k, (name, (cmd, procs, each)) in enumerate(kinds.items()):
                before = sum(1 for w in tracker.workers() if w.alive)
                started = [subprocess.Popen([*cmd, *common, "-n", f"start{r}-{k}-{i}@%h"], env=env,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                           for i in range(procs)]
                deadline = time.monotonic() + 60
                while sum(1 for w in tracker.workers() if w.alive) < before + procs * each:
                    if time.monotonic() > deadline or any(p.poll() is not None for p in started):
                        raise SystemExit(f"{name} did not come up")
                    time.sleep(0.02)
                # Plus a random part of a second: the stop then lands anywhere in the consumer's
                # BRPOP, as a stop does in a crawl (at a fixed delay it would always land in the
                # same place).
                time.sleep(1.0 + random.random())
                pids = [p.pid for p in started]
                pids += [c for p in started for c in children_of(p.pid)]
                cpu = sum(own_cpu(pid) for pid in pids)
                stop = time.monotonic()
                for proc in started:
                    proc.send_signal(signal.SIGTERM)
                for proc in started:
                    proc.wait(30)  # a warm shutdown deregisters each worker
                stop = time.monotonic() - stop
                readings[name].append(cpu)
                stops[name].append(stop)
                print(f"round {r + 1}: {name:<16} {cpu:.2f} s CPU, stopped in {stop:.2f} s",
                      flush=True)
    base = statistics.median(readings["celery worker"])
    for name, values in readings.items():
        med = statistics.median(values)
        print(f"median {name:<16} {med:.2f} s ({med / base:.2f}x); stop (SIGTERM to exit, wall) "
              f"median {statistics.median(stops[name]):.2f} s, longest {max(stops[name]):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
