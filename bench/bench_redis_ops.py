"""What Redis spends on one round trip, one command inside a script, and each step of the tracker's
function library, in microseconds of Redis CPU.

    .venv/bin/python -m bench.bench_redis_ops [--calls 2000] [--loop 200]

Starts a throwaway Redis 7 (the embedded one's binary), creates a job with default settings and
queues 2,000 URLs on 40 hosts. Then:

- round trips: PING from one client, one at a time, and from 16 processes at once (a busy Redis
  serves several ready clients per wake-up, so a round trip costs less);
- a function call that does nothing, with no keys and with the 21 keys an item call passes, and
  one that runs the library's per-call start (``begin``);
- each step of ``_lib.lua`` that a page's calls run, ``--loop`` times inside one call, less an
  empty loop: a command (HGET, ZSCORE), the item's domain and fingerprint, its state, its
  domain's limits and head start (read afresh, as each call reads them once), Redis's clock.

Redis CPU is ``used_cpu_user + used_cpu_sys`` before and after ``--calls`` calls. The machine's
noise moves each figure by a tenth or more between runs; what matters is their orders of
magnitude (docs/performance.md, "What a page's Redis work is made of").
"""

from __future__ import annotations

import argparse
import sys
import multiprocessing

import redis

from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.embedded import EmbeddedRedis
from distscrape_celery.tracker import RedisTracker
from distscrape_celery.tracker.redis import scripts

# Each step as a statement run with `u`, one of 50 URLs, bound (the library's locals in scope).
STEPS = {
    "redis.call HGET": "local x = redis.call('HGET', K_STATS, 'seen')",
    "redis.call ZSCORE": "local x = redis.call('ZSCORE', K_LEASED, u)",
    "domain_of(item)": "local x = domain_of(u)",
    "fingerprint(item), not cached": "fingerprints = {}; local x = fingerprint(u)",
    "live_get(item): its state": "local x = live_get(u)",
    "holder(item)": "local w, t = holder(u)",
    "limits(domain), read afresh": "limits_cache = {}; local a, b = limits(domain_of(u))",
    "head_start(domain), read afresh":
        "head_starts = {}; job_latency = nil; local h = head_start(domain_of(u))",
    "redis_now(), read afresh": "now_cache = nil; local n = redis_now()",
    "string.format('%d', n)": "local x = string.format('%d', 12345678)",
    "tonumber(text)": "local x = tonumber('12345678')",
}


def step_function(name: str, statement: str) -> str:
    return (f"redis.register_function('bench_{name}', function(keys, args)\n"
            "  local err = begin(keys); if err then return err end\n"
            "  for i = 1, tonumber(args[1]) do local u = args[2 + i % 50]; "
            f"{statement} end\n  return 1\nend)\n")


def send(url: str, command: tuple, times: int) -> None:
    client = redis.Redis.from_url(url)
    for _ in range(times):
        client.execute_command(*command)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per figure")
    parser.add_argument("--loop", type=int, default=200, help="steps per call, for each step")
    args = parser.parse_args()

    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        if int(client.info("server")["redis_version"].split(".")[0]) < 7:
            print("needs Redis 7 or later (functions)", file=sys.stderr)
            return 1
        tracker = RedisTracker.from_url(server.url)
        spec = build_spec({"seeds": ["http://host0.bench.invalid/"],
                           "saver": {"output": "/nonexistent"}})
        tracker.create_job("bench", spec.to_json(), spec.crawl_limits())
        urls = [f"http://host{i % 40}.bench.invalid/section/page{i}.html" for i in range(2000)]
        tracker.add("bench", urls)
        keys = tracker._item_keys("bench", 0)
        names = {step: f"s{n}" for n, step in enumerate(["empty", *STEPS])}
        code = (scripts.library_text() + scripts._ENTRIES % scripts.read_lua("_begin")
                + "redis.register_function('bench_nothing', function() return 1 end)\n"
                + "redis.register_function('bench_begin', function(keys) "
                  "return begin(keys) or 1 end)\n"
                + step_function(names["empty"], "local x = 0")
                + "".join(step_function(names[s], text) for s, text in STEPS.items()))
        client.execute_command("FUNCTION", "LOAD", "REPLACE", "#!lua name=bench_ops\n" + code)

        def cpu() -> tuple[float, float]:
            """Redis's CPU seconds so far: user, and in the kernel."""
            info = client.info("cpu")
            return float(info["used_cpu_user"]), float(info["used_cpu_sys"])

        kernel_share = [0.0]  # of the last per_call's figure

        def per_call(*command, clients: int = 1) -> float:
            """Redis CPU µs a call of ``command``, sent --calls times in all by ``clients``
            processes (threads would take turns under the GIL: one request at a time)."""
            each = args.calls // clients
            user, system = cpu()
            if clients == 1:
                send(server.url, command, each)
            else:
                procs = [multiprocessing.Process(target=send, args=(server.url, command, each))
                         for _ in range(clients)]
                for p in procs:
                    p.start()
                for p in procs:
                    p.join()
            user_after, system_after = cpu()
            spent = user_after - user + system_after - system
            kernel_share[0] = (system_after - system) / spent if spent else 0.0
            return spent / (each * clients) * 1e6

        print("Redis CPU, µs:")
        ping = per_call("PING")
        print(f"  a round trip (PING), one client at a time: {ping:8.1f}  "
              f"({kernel_share[0]:.0%} of it in the kernel)")
        print(f"  a round trip (PING), 16 clients at once:    {per_call('PING', clients=16):8.1f}")
        nothing = per_call("FCALL", "bench_nothing", 0)
        print(f"  FCALL of a function that does nothing:      {nothing:8.1f}")
        with_keys = per_call("FCALL", "bench_nothing", len(keys), *keys)
        print(f"  ... with the 21 keys of an item call:       {with_keys:8.1f}")
        begin = per_call("FCALL", "bench_begin", len(keys), *keys)
        print(f"  ... running the per-call start (begin):     {begin:8.1f}")

        def loop_cost(name: str) -> float:
            call = ("FCALL", "bench_" + names[name], len(keys), *keys)
            return (per_call(*call, args.loop, *urls[:51])
                    - per_call(*call, 0, *urls[:51])) / args.loop

        empty = loop_cost("empty")
        print("  inside a call, each step:")
        for step in STEPS:
            print(f"    {step:34s} {loop_cost(step) - empty:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
