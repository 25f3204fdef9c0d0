"""Publishing alone: messages per second of ``publisher.scrape`` (a page's links, one batch).

    .venv/bin/python -m bench.bench_publish [--items 8] [--batches 3000] [--rounds 5] [--code DIR ...]

Starts a throwaway Redis; for each ``--code`` checkout (this one by default; repeat the option
to compare, e.g. a clean checkout of main and this tree) a process of its own imports that
checkout's distscrape_celery and publishes ``--batches`` batches of ``--items`` scrape messages
through the worker's publisher, as a scraped page does. The checkouts take turns, round after
round, and the queue is emptied between them. Prints, per round and checkout, messages/s (wall,
round trips included) and the publishing process's CPU per message, then each one's median and
its ratio to the first checkout's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench.helpers import CHECKOUT_PRELUDE, ROOT

_CHILD = CHECKOUT_PRELUDE + r"""
import json, time
from distscrape_celery.settings import Settings
from distscrape_celery.worker.app import configure_app
from distscrape_celery.worker.publish import publisher

url, items, batches = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
configure_app(Settings.from_env({}, redis_url=url))
page = [f"http://h.example/2026/11/27/section/article-{n:06d}.html" for n in range(items)]
publisher.scrape("bench", page)  # the first publish connects and declares the queue
cpu, wall = time.process_time(), time.perf_counter()
for _ in range(batches):
    publisher.scrape("bench", page)
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
import distscrape_celery
print(json.dumps({"msgs_s": items * batches / wall, "cpu_us": cpu / (items * batches) * 1e6,
                  "from": distscrape_celery.__file__}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=8)
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--code", action="append",
                        help="a checkout whose distscrape_celery to measure (repeatable)")
    args = parser.parse_args()
    codes = args.code or [str(ROOT)]
    import redis

    from distscrape_celery.local.embedded import EmbeddedRedis

    results: dict[str, list[dict]] = {code: [] for code in codes}
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        for n in range(args.rounds):
            order = codes if n % 2 == 0 else codes[::-1]
            for code in order:
                out = subprocess.run(
                    [sys.executable, "-c", _CHILD, code, server.url, str(args.items),
                     str(args.batches)], check=True, capture_output=True, text=True, cwd="/")
                result = json.loads(out.stdout.strip().splitlines()[-1])
                results[code].append(result)
                client.flushdb()
                assert result["from"].startswith(str(Path(code).resolve())), result["from"]
                print(f"round {n + 1} {code}: {result['msgs_s']:.0f} messages/s, "
                      f"{result['cpu_us']:.1f} us CPU a message", flush=True)
    first = statistics.median(r["cpu_us"] for r in results[codes[0]])
    first_rate = statistics.median(r["msgs_s"] for r in results[codes[0]])
    for code in codes:
        cpu = statistics.median(r["cpu_us"] for r in results[code])
        rate = statistics.median(r["msgs_s"] for r in results[code])
        print(f"median {code}: {rate:.0f} messages/s ({rate / first_rate:.2f}x), "
              f"{cpu:.1f} us CPU a message ({cpu / first:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
