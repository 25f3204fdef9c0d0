"""Tracker throughput: operations per second and Redis CPU per operation, one client.

    .venv/bin/python -m bench.bench_tracker_ops [--urls 50000] [--pages 10000] [--code PATH] [--scripts]
        [--callgrind] [--save-batch N] [--inline]

Starts a throwaway Redis and creates a job with default settings. Then:

- add: ``--urls`` new URLs through ``RedisTracker.add_stream`` (as ``distscrape seed`` does);
- cycle: ``--pages`` pages through the whole item protocol a worker runs, one call at a time
  (checkout, scraped with no links, begin_save, complete; with ``--save-batch N``, begin_saves
  and complete_many for N pages at a time), each dispatched item as soon as a call hands it out, with a ``--body``-byte body staged, read and dropped as the pipeline does
  (``--body 0``: no body). Code whose tracker stages the body in ``scraped`` and drops it in
  ``complete`` does it so (5 round trips a page); older code uses the staging's own calls (7).
  ``--inline``: as a worker that saves its pages itself (``save_inline``), checkout, scraped
  (the item turns saving; no body staged) and complete, or complete_many for N pages;

and prints, for each, items per second (wall, one client: round trips included) and Redis CPU
per item (INFO cpu, used_cpu_user + used_cpu_sys, of the embedded server only); for the cycle
also the client's own CPU per page (this process: redis-py and the tracker's Python). ``--code``
imports distscrape_celery from another checkout (e.g. /work/main) to measure before and after in
one session; run both while the machine's load is the same and compare ratios. ``--scripts``
runs the item scripts with EVALSHA on a Redis that has functions (the form Redis 6.2 and a
cluster get). ``--callgrind`` also counts the instructions Redis runs a page in the cycle
(valgrind): the same count however busy the machine is.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.helpers import ROOT, use_checkout


def callgrind_control(option: str, pid: int) -> None:
    subprocess.run(["callgrind_control", option, str(pid)], check=True, capture_output=True)


def redis_cpu(client) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", type=int, default=50_000)
    parser.add_argument("--pages", type=int, default=10_000)
    parser.add_argument("--commands", action="store_true",
                        help="also print the Redis commands the cycle runs (INFO commandstats, "
                             "calls from inside the scripts included), per page")
    parser.add_argument("--body", type=int, default=6000, help="bytes of each staged body")
    parser.add_argument("--code", default=str(ROOT),
                        help="the checkout whose distscrape_celery to measure")
    parser.add_argument("--save-batch", type=int, default=1,
                        help="pages a save batch begins and completes in one call each, as "
                             "workers do (begin_saves, complete_many; needs --body > 0); 1: a "
                             "begin_save and a complete a page")
    parser.add_argument("--inline", action="store_true",
                        help="the cycle of a page saved where it was downloaded (save_inline): "
                             "scraped puts it in the saving state, no body is staged, and with "
                             "--save-batch N a complete_many ends N pages")
    parser.add_argument("--scripts", action="store_true",
                        help="run the item scripts with EVALSHA where Redis has functions too")
    parser.add_argument("--callgrind", action="store_true",
                        help="run Redis under valgrind's callgrind and also print the instructions "
                             "it runs a page in the cycle: a count that a busy machine does not "
                             "change, unlike CPU time (slow: try --urls 2000 --pages 500)")
    args = parser.parse_args()
    use_checkout(args.code)
    import redis

    import inspect

    import distscrape_celery
    from distscrape_celery.local.embedded import EmbeddedRedis
    from distscrape_celery.job.spec import JobSpec
    from distscrape_celery.tracker.redis.staging import RedisBodyStaging
    from distscrape_celery.tracker import RedisTracker

    def url(n: int) -> str:
        return f"http://n{n % 1000}.example.invalid/2026/11/22/s-{n % 97}/article-{n:09d}.html"

    tmp = tempfile.mkdtemp(prefix="bench-ops-")
    embedded = EmbeddedRedis()
    if args.callgrind:
        # The server runs in valgrind, exec'd in the place of a wrapper: the same PID.
        wrapper = Path(tmp, "redis-server")
        wrapper.write_text(f"#!/bin/sh\nexec valgrind --tool=callgrind --compress-strings=no --callgrind-out-file="
                           f"{tmp}/callgrind.out {shlex.quote(embedded.binary)} \"$@\"\n")
        wrapper.chmod(0o755)
        embedded = EmbeddedRedis(binary=str(wrapper), startup_timeout=120)
    with embedded as server:
        client = redis.Redis.from_url(server.url)
        t = RedisTracker.from_url(server.url, **({"functions": False} if args.scripts else {}))
        spec = JobSpec.model_validate({"seeds": [url(0)]})
        t.create_job("ops", spec.to_json(), spec.crawl_limits())
        cpu, started = redis_cpu(client), time.monotonic()
        for _ in t.add_stream("ops", (url(i) for i in range(args.urls))):
            pass
        add_wall, add_cpu = time.monotonic() - started, redis_cpu(client) - cpu

        staging = RedisBodyStaging(client, 600)
        fused = "body" in inspect.signature(t.scraped).parameters
        body = b"x" * args.body
        w = t.register_worker("bench", 0, 8)
        todo = list(t.add("ops", []).dispatch)
        client.config_resetstat()
        if args.callgrind:
            callgrind_control("-z", server.pid)  # count from here
        cpu, started, pages = redis_cpu(client), time.monotonic(), 0
        own = time.process_time()
        batch: list[tuple[str, int]] = []  # scraped pages whose saves wait for a batch

        def save_batch() -> None:
            for begin in ([] if args.inline else t.begin_saves("ops", batch, w, max_lost=3)):
                todo.extend(begin.dispatch)
                assert begin.body == body
            for done in t.complete_many("ops", batch):
                todo.extend(done.dispatch)
            batch.clear()

        while pages < args.pages and (todo or batch):
            if not todo or len(batch) == args.save_batch:
                save_batch()
                continue
            item = todo.pop()
            co = t.checkout("ops", item, w, max_lost=3)
            todo.extend(co.dispatch)
            if co.status.value != "ok":
                continue
            if args.inline:
                todo.extend(t.scraped("ops", item, co.token, save_as=w).dispatch)
            elif not body:
                todo.extend(t.scraped("ops", item, co.token).dispatch)
            elif fused:
                todo.extend(t.scraped("ops", item, co.token, body=body).dispatch)
            else:
                staging.stage("ops", co.token, body)
                todo.extend(t.scraped("ops", item, co.token).dispatch)
            pages += 1
            if args.save_batch > 1:
                batch.append((item, co.token))
                continue
            if args.inline:
                todo.extend(t.complete("ops", item, token=co.token).dispatch)
                continue
            todo.extend(t.begin_save("ops", item, co.token, w, max_lost=3).dispatch)
            if body:
                assert staging.get("ops", co.token) == body
            if body and fused:
                todo.extend(t.complete("ops", item, token=co.token).dispatch)
            else:
                todo.extend(t.complete("ops", item).dispatch)
                if body:
                    staging.discard("ops", co.token)
        if batch:
            save_batch()
        cycle_own = time.process_time() - own
        cycle_wall, cycle_cpu = time.monotonic() - started, redis_cpu(client) - cpu
        if args.callgrind:
            callgrind_control("-d", server.pid)
            dumps = sorted(Path(tmp).glob("callgrind.out.*"), key=lambda p: p.stat().st_mtime)
            match = re.search(r"^summary: (\d+)", dumps[-1].read_text(), re.M)
            instructions = int(match.group(1)) if match else 0
        commands = client.info("commandstats")
        assert t.stats("ops").done == pages == args.pages, (t.stats("ops"), pages)

    print(f"code: {Path(distscrape_celery.__file__).parent.parent}")
    print(f"add:   {args.urls / add_wall:,.0f} URLs/s, Redis CPU {add_cpu / args.urls * 1e6:.1f} us/URL")
    trips = 4 + (0 if not body else 1 if fused else 3)
    if args.inline:
        trips = 3
    if args.save_batch > 1:
        trips = f"2 + {1 if args.inline else 2}/{args.save_batch}"
    print(f"cycle: {pages / cycle_wall:,.0f} pages/s ({trips} round trips, body {args.body} B), "
          f"Redis CPU {cycle_cpu / pages * 1e6:.1f} us/page, client CPU {cycle_own / pages * 1e6:.1f} "
          f"us/page")
    if args.callgrind:
        print(f"cycle: {instructions / pages:,.0f} Redis instructions a page (callgrind; "
              "redis-server's own counts under valgrind)")
    if args.commands:
        print("cycle, per page: command, calls, us (Redis's own timing; evalsha and fcall include the "
              "calls it makes)")
        rows = sorted(commands.items(), key=lambda kv: -kv[1]["usec"])
        for name, c in rows:
            if name.startswith("cmdstat_") and c["calls"] >= pages / 10:
                print(f"  {name[8:]:<14} {c['calls'] / pages:6.2f} {c['usec'] / pages:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
