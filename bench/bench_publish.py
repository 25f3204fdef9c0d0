"""Publishing cost: client CPU per page for a page's messages (its links' scrape tasks and its save
task, in one batch, as the pipeline sends them), to a real Redis broker.

    python bench/bench_publish.py [--pages 5000] [--links 1] [--threads 1] [--code PATH]

Starts a throwaway Redis, points the Celery app at it and publishes ``--pages`` batches from
``--threads`` threads. Prints the client's CPU per page (process CPU time: the broker is another
process) and pages per second. ``--code`` imports distscrape_celery from another checkout (e.g.
one made with ``git worktree``) to measure before and after in one session; alternate the two
while the machine's load is the same and compare ratios.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=5000)
    parser.add_argument("--links", type=int, default=1, help="scrape messages per page")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--code", default=str(Path(__file__).resolve().parent.parent))
    args = parser.parse_args()
    sys.path.insert(0, args.code)

    from distscrape_celery.worker.app import configure_app
    from distscrape_celery.local.embedded import EmbeddedRedis
    from distscrape_celery.settings import Settings
    from distscrape_celery.worker.tasks import publisher

    meta = {"status": 200, "url": "http://127.0.0.1:8000/p/1.html",
            "headers": {"content-type": "text/html"}, "final_url": "http://127.0.0.1:8000/p/1.html"}

    def publish(pages: int, offset: int) -> None:
        for n in range(offset, offset + pages):
            url = f"http://127.0.0.1:8000/p/{n}.html"
            with publisher.batch():
                publisher.scrape("bench", [f"{url}?l={k}" for k in range(args.links)])
                publisher.save("bench", url, n, meta)

    with EmbeddedRedis() as server:
        configure_app(Settings.from_env({}, redis_url=server.url))
        publish(100, 0)  # connect and declare
        per = args.pages // args.threads
        for r in range(args.rounds):
            threads = [threading.Thread(target=publish, args=(per, (r + 1) * args.pages + t * per))
                       for t in range(args.threads)]
            cpu, wall = time.process_time(), time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            pages = per * args.threads
            print(f"round {r + 1}: {1e6 * cpu / pages:.0f} us client CPU per page, "
                  f"{pages / wall:.0f} pages/s ({args.threads} thread(s), {args.links} link(s) a page)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
