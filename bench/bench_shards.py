"""Tracker operations of one job on one Redis and on a three-master Redis Cluster, unsharded and
in 3 shards: items/s through the tracker (add, then checkout, scraped, begin_save, complete for
each), and how the Redis CPU of the run is spread over the cluster's masters.

    .venv/bin/python bench/bench_shards.py [--items 3000] [--domains 30]

One client process, so the figure is round trips, not Redis saturation: compare the rows of one
run as ratios. What sharding buys on a cluster is the spread of CPU (and memory) over masters.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from redis_cluster import RedisClusterProcess  # noqa: E402

from distscrape_celery.local.embedded import EmbeddedRedis  # noqa: E402
from distscrape_celery.tracker import LeaseStatus, RedisTracker  # noqa: E402
from distscrape_celery.tracker.base import CrawlLimits  # noqa: E402


def cpu(client) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def run(tracker: RedisTracker, nodes, shards: int, items: list[str], job: str) -> dict:
    before = [cpu(n) for n in nodes]
    started = time.perf_counter()
    tracker.create_job(job, '{"seeds": ["http://x.invalid/"]}',
                       CrawlLimits(shards=shards, max_pages=None))
    w = tracker.register_worker("bench", os.getpid(), 50)
    pending = list(tracker.add(job, items).dispatch)
    done = 0
    while pending:
        item = pending.pop()
        if done % 200 == 0:  # stay alive: the broker's bound counts live workers only
            tracker.heartbeat(w)
        co = tracker.checkout(job, item, w, max_lost=3)
        pending.extend(co.dispatch)
        if co.status is not LeaseStatus.OK:
            continue
        pending.extend(tracker.scraped(job, item, co.token).dispatch)
        pending.extend(tracker.begin_save(job, item, co.token, w, max_lost=3).dispatch)
        pending.extend(tracker.complete(job, item).dispatch)
        done += 1
        if not pending:
            pending.extend(tracker.maintain(job, max_lost=3).dispatch)
    elapsed = time.perf_counter() - started
    spent = [cpu(n) - b for n, b in zip(nodes, before)]
    return {"done": done, "items_per_s": done / elapsed, "cpu_ms_per_item": 1000 * sum(spent) / done,
            "cpu_share": [round(x / sum(spent), 2) for x in spent]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=3000)
    ap.add_argument("--domains", type=int, default=30)
    args = ap.parse_args()
    items = [f"http://d{i % args.domains}.invalid/p{i}" for i in range(args.items)]
    print(f"load: {os.getloadavg()}")
    with EmbeddedRedis() as single, RedisClusterProcess(masters=3) as cluster:
        plain = RedisTracker.from_url(single.url, bound_refresh_seconds=0)
        clustered = RedisTracker.from_url(cluster.url, cluster=True, bound_refresh_seconds=0)
        nodes = [cluster.node(p) for p in cluster.ports]
        for name, tracker, node_list, shards in (
            ("one Redis, 1 shard", plain, [plain.client], 1),
            ("one Redis, 3 shards", plain, [plain.client], 3),
            ("cluster, 1 shard", clustered, nodes, 1),
            ("cluster, 3 shards", clustered, nodes, 3),
        ):
            res = run(tracker, node_list, shards, items, f"b{shards}")
            print(f"{name:22} {res['done']} items  {res['items_per_s']:7.0f} items/s  "
                  f"Redis CPU {res['cpu_ms_per_item']:.3f} ms/item  CPU share by node {res['cpu_share']}")
    print(f"load: {os.getloadavg()}")


if __name__ == "__main__":
    main()
