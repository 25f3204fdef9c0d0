#!/usr/bin/env python
"""Client CPU of one tracker item script: ``python bench/bench_script_call.py [--calls 20000]``.

The same EVALSHA (a checkout's 20 keys and 6 arguments, a script that does nothing) sent the way
RedisTracker sends its item scripts, on a connection the thread keeps (``RedisTracker._eval``),
and the way redis-py's ``Script`` sends it, through the connection pool and the client's command
layers, alternated in one run against a throwaway Redis. Prints microseconds of CPU a call.
"""

from __future__ import annotations

import argparse
import time

import redis

from distscrape_celery.local.embedded import EmbeddedRedis
from distscrape_celery.tracker import RedisTracker

NOOP = "return {ARGV[1], #KEYS}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url, decode_responses=True, socket_timeout=30)
        tracker = RedisTracker(client)
        tracker._scripts["noop"] = script = client.register_script(NOOP)
        keys = [f"ds:bench:{{j}}:k{i}" for i in range(20)]
        argv = ["http://127.0.0.1:8080/p/1.html", "worker-1", 300, 1000, 64, 3]
        ways = {
            "kept connection (RedisTracker._eval)": lambda: tracker._eval("noop", keys, argv),
            "redis-py Script": lambda: script(keys=keys, args=argv),
        }
        for call in ways.values():
            for _ in range(1000):
                call()
        for n in range(args.rounds):
            figures = []
            for name, call in ways.items():
                start = time.process_time()
                for _ in range(args.calls):
                    call()
                figures.append(f"{name} {(time.process_time() - start) / args.calls * 1e6:.1f} us")
            print(f"round {n + 1}: " + ", ".join(figures))


if __name__ == "__main__":
    main()
