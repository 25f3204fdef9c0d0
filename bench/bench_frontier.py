"""Memory per queued URL: the tracker's frontier versus the same URLs as Celery messages.

    .venv/bin/python -m bench.bench_frontier [--urls 200000] [--messages 2000]

Starts a throwaway Redis, queues ``--urls`` URLs through RedisTracker.add (no live worker, so
nothing is dispatched and the whole frontier waits in the tracker), and reports Redis's
used_memory per URL. Then publishes ``--messages`` real scrape-task messages to a broker on the
same kind of server and reports memory per message, so the two can be compared in one run.
"""

from __future__ import annotations

import argparse
import sys
import time

import redis

from distscrape_celery.local.embedded import EmbeddedRedis
from distscrape_celery.settings import Settings
from distscrape_celery.tracker import MAX_ADD_BATCH, RedisTracker


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def url(n: int) -> str:
    # About the length of a typical article URL (~70 characters).
    return f"http://news.example.invalid/2026/11/22/section-{n % 97}/article-{n:09d}.html"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", type=int, default=200_000)
    parser.add_argument("--messages", type=int, default=2_000)
    args = parser.parse_args()

    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        tracker = RedisTracker.from_url(server.url)
        tracker.create_job("frontier", '{"seeds": ["http://news.example.invalid/"]}')
        before = used_memory(client)
        started = time.monotonic()
        batch = []
        for n in range(args.urls):
            batch.append(url(n))
            if len(batch) == MAX_ADD_BATCH:
                tracker.add("frontier", batch, depth=1)
                batch = []
        if batch:
            tracker.add("frontier", batch, depth=1)
        seconds = time.monotonic() - started
        frontier_bytes = (used_memory(client) - before) / args.urls
        stats = tracker.stats("frontier")
        assert stats.frontier == args.urls and stats.dispatched == 0, stats

    with EmbeddedRedis() as broker:
        from distscrape_celery.worker.app import configure_app
        from distscrape_celery.worker.names import SCRAPE_QUEUE
        from distscrape_celery.worker.tasks import scrape

        configure_app(Settings.from_env({}, redis_url=broker.url))
        client = redis.Redis.from_url(broker.url)
        before = used_memory(client)
        from distscrape_celery.worker.app import app

        with app.producer_or_acquire() as producer:
            for n in range(args.messages):
                scrape.apply_async(("frontier", url(n)), producer=producer)
        message_bytes = (used_memory(client) - before) / args.messages
        assert client.llen(SCRAPE_QUEUE) == args.messages

    mean_url = sum(len(url(n)) for n in range(1000)) / 1000
    print(f"URL length: {mean_url:.0f} bytes")
    print(f"tracker frontier: {args.urls} URLs queued in {seconds:.1f}s "
          f"({args.urls / seconds:,.0f} URLs/s), {frontier_bytes:.0f} bytes of Redis memory per URL "
          f"({frontier_bytes / mean_url:.1f}x the URL)")
    print(f"Celery messages: {args.messages} scrape tasks, {message_bytes:.0f} bytes per message "
          f"({message_bytes / mean_url:.1f}x the URL)")
    print(f"ratio: a queued URL costs {frontier_bytes / message_bytes:.2f}x a Celery message; "
          f"10 million queued URLs: {frontier_bytes * 1e7 / 2**30:.1f} GiB in the tracker, "
          f"versus {message_bytes * 1e7 / 2**30:.1f} GiB as messages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
