"""What Celery itself costs per task here: worker CPU per task that does nothing, with our app's
settings (JSON, late acknowledgement, no results, no events) and a real Redis broker.

    python bench/bench_task_overhead.py [--tasks 20000] [--pool "-P threads -c 16"] ...

Starts a throwaway Redis, queues ``--tasks`` no-op tasks (published as our pipeline publishes:
``CeleryPublisher``, a batch of ``--batch`` per round trip), then starts one ``celery worker``
with each ``--pool`` option set in turn and reads its CPU time (user + system, from /proc) once
the queue is empty. Every page of a crawl is two tasks (scrape and save), so twice the figure is
the floor that Celery sets under a page's CPU, before any download, tracker call or save.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NOOP_TASK = "distscrape.bench.noop"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--pool", action="append", default=[],
                        help="celery worker options (repeatable; default -P threads -c 16, -P solo)")
    args = parser.parse_args()
    pools = args.pool or ["-P threads -c 16", "-P solo"]
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(HERE))

    from bench_crawl import own_cpu
    from bench_noop_app import app  # noqa: F401  (registers the no-op task)
    from distscrape_celery.worker.app import configure_app
    from distscrape_celery.worker.names import SCRAPE_QUEUE
    from distscrape_celery.local.embedded import EmbeddedRedis
    from distscrape_celery.settings import Settings
    from distscrape_celery.worker.tasks import publisher

    with EmbeddedRedis() as server:
        configure_app(Settings.from_env({}, redis_url=server.url))
        import redis

        client = redis.Redis.from_url(server.url)
        env = dict(os.environ, DISTSCRAPE_REDIS_URL=server.url,
                   PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT)]))
        for pool in pools:
            for _ in range(args.tasks // args.batch):
                with publisher.batch():
                    for _ in range(args.batch):
                        publisher._send(NOOP_TASK, SCRAPE_QUEUE, ("job", "item"))
            worker = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "bench_noop_app", "worker", "-Q",
                 SCRAPE_QUEUE, *pool.split(), "--loglevel", "WARNING", "--without-gossip",
                 "--without-mingle"], env=env, stdout=subprocess.DEVNULL)
            try:
                # Start-up (imports) is not per task: measure from the first task taken.
                while client.llen(SCRAPE_QUEUE) >= args.tasks:
                    time.sleep(0.01)
                cpu, wall = own_cpu(worker.pid), time.monotonic()
                done_from = client.llen(SCRAPE_QUEUE)
                while client.llen(SCRAPE_QUEUE):
                    time.sleep(0.01)
                time.sleep(0.3)  # the last tasks run
                cpu, wall = own_cpu(worker.pid) - cpu, time.monotonic() - wall
            finally:
                worker.terminate()
                worker.wait()
            print(f"celery worker {pool}: {1e6 * cpu / done_from:.0f} us CPU per no-op task, "
                  f"{done_from / wall:.0f} tasks/s ({done_from} tasks)")
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
