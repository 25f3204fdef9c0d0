"""How long `distscrape delete` takes for a big finished job, and how long Redis keeps others
waiting meanwhile.

    python bench/bench_delete.py [--items 1000000] [--domains 50]

Starts a throwaway Redis, adds ``--items`` items to a job on ``--domains`` domains (no worker
runs), cancels the job, then deletes it while another client pings Redis every 5 ms. Prints the seconds the delete took and the slowest and 99th percentile ping.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from distscrape_celery.tracker import keys  # noqa: E402
from distscrape_celery.local.embedded import EmbeddedRedis  # noqa: E402
from distscrape_celery.tracker import JobAction, RedisTracker  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--domains", type=int, default=50)
    args = ap.parse_args()
    with EmbeddedRedis() as server:
        t = RedisTracker.from_url(server.url)
        t.create_job("big", '{"seeds": ["http://d0.invalid/"]}')
        started = time.monotonic()
        items = (f"http://d{i % args.domains}.invalid/page/{i}" for i in range(args.items))
        for _ in t.add_stream("big", items):
            pass
        print(f"added {args.items:,} items in {time.monotonic() - started:.1f} s")
        t.control("big", JobAction.CANCEL)
        client = redis.Redis.from_url(server.url)
        used = client.info("memory")["used_memory"]
        pings: list[float] = []
        stop = threading.Event()

        def ping() -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                client.ping()
                pings.append(time.perf_counter() - t0)
                time.sleep(0.005)

        pinger = threading.Thread(target=ping)
        pinger.start()
        started = time.monotonic()
        n = t.delete_job("big")
        seconds = time.monotonic() - started
        stop.set()
        pinger.join()
        left = list(client.scan_iter(match=keys.JobKeys("big").pattern))
        pings.sort()
        p99 = pings[int(len(pings) * 0.99)] if pings else 0.0
        print(f"deleted {n} keys ({used / 2**20:.0f} MiB) in {seconds:.1f} s; {len(left)} left")
        print(f"pings during the delete: {len(pings)}, slowest {pings[-1] * 1000:.1f} ms, "
              f"p99 {p99 * 1000:.1f} ms, median {statistics.median(pings) * 1000:.2f} ms")


if __name__ == "__main__":
    main()
