"""Redis memory per seen URL (at most 16 bytes at 10 million URLs, dedup and state).

    python bench/bench_seen_memory.py [--urls 10000000] [--domains 10000]

Starts a throwaway Redis and creates a job with the default job settings. Adds ``--urls``
generated URLs (~73 characters, spread over ``--domains`` domains) through
``RedisTracker.add_stream``, as ``distscrape seed`` does, and reports memory with every URL
queued. Then registers one worker and takes every URL through dispatch and ``complete`` (the
tracker's real scripts, pipelined; the download in between is left out) and reports memory with
every URL done. Memory is read two ways: MEMORY USAGE (SAMPLES 0, exact) of each of the job's
keys, split into the seen set, the live-items hash, the frontier (domain queues and the domain
schedule) and the rest; and INFO memory's used_memory before the job and after.

tests/integration/test_seen_memory.py imports :func:`measure` and asserts the bound at 100,000 URLs.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from distscrape_celery.tracker import keys  # noqa: E402
from distscrape_celery.job.spec import JobSpec  # noqa: E402
from distscrape_celery.tracker import RedisTracker  # noqa: E402

JOB = "seen"
# One worker's concurrency: the broker bound is twice that, so each pipelined round completes
# up to 2,000 dispatched items.
CONCURRENCY = 1000


def url(n: int, domains: int) -> str:
    """The n-th generated URL: ~73 characters, like bench_frontier.py's."""
    return f"http://n{n % domains}.example.invalid/2026/11/22/s-{n % 97}/article-{n:09d}.html"


def job_memory(client: redis.Redis, job: str) -> dict[str, int]:
    """Bytes (MEMORY USAGE) of the job's keys, by part. Every element is counted (SAMPLES 0),
    except in the live-items hash when it is large: counting millions of fields would block
    Redis for seconds, so its figure is Redis's estimate from a sample of 1,000 fields."""
    k = keys.JobKeys(job)
    parts = {"seen": 0, "items": 0, "frontier": 0, "other": 0}
    names = [n.decode() if isinstance(n, bytes) else n
             for n in client.scan_iter(match=k.pattern, count=1000)]
    sizes = []
    for start in range(0, len(names), 1000):
        pipe = client.pipeline(transaction=False)
        for name in names[start:start + 1000]:
            pipe.memory_usage(name, samples=1000 if name == k.items else 0)
        sizes.extend(pipe.execute())
    for name, size in zip(names, sizes):
        if name.startswith(k.seen_buckets):
            part = "seen"
        elif name == k.items:
            part = "items"
        elif name.startswith(k.queues) or name == k.domains:
            part = "frontier"
        else:
            part = "other"
        parts[part] += int(size or 0)
    return parts


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def complete_all(tracker: RedisTracker, job: str, dispatched: Iterable[str] = ()) -> int:
    """Take every queued item through dispatch and complete, pipelined; returns how many.
    ``dispatched``: items earlier calls handed out for dispatch."""
    script = tracker._scripts["complete"]  # the real script, in a pipeline (a bench's shortcut)
    item_keys = keys.JobKeys(job).item_keys()
    worker = tracker.register_worker("bench", 0, CONCURRENCY)
    todo = [*dispatched, *tracker.add(job, []).dispatch]
    done = 0
    while True:
        if not todo:
            tracker.heartbeat(worker)
            todo = tracker.add(job, []).dispatch
            if not todo:
                break
        pipe = tracker.client.pipeline(transaction=False)
        top_up = tracker._top_up_args(job)
        for item in todo:
            script(keys=item_keys, args=[item, *top_up], client=pipe)
        todo = []
        for res in pipe.execute():
            done += int(res[0])
            todo.extend(res[1:])
    tracker.deregister_worker(worker)
    return done


@dataclass
class Figures:
    urls: int
    add_seconds: float
    complete_seconds: float
    queued: dict[str, int]  # job_memory with every URL queued
    queued_used: int  # used_memory delta then
    done: dict[str, int]  # job_memory with every URL done
    done_used: int
    buckets: int
    largest_bucket: int


def measure(url_redis: str, n: int, domains: int = 10_000, log=None,
            complete: bool = True) -> Figures:
    """Add ``n`` URLs to a new job with default settings, then (if ``complete``) complete them
    all (see above); ``log`` (print, say) gets each phase's figures as it ends."""
    client = redis.Redis.from_url(url_redis, socket_timeout=None)
    tracker = RedisTracker.from_url(url_redis)
    spec = JobSpec.model_validate({"seeds": [url(0, domains)]})
    # A first job loads (and compiles) the scripts, so the delta below is the job's own.
    tracker.create_job("warm-up", spec.to_json(), spec.crawl_limits())
    tracker.add("warm-up", [url(0, domains)])
    complete_all(tracker, "warm-up")
    before = used_memory(client)
    tracker.create_job(JOB, spec.to_json(), spec.crawl_limits())

    def urls() -> Iterator[str]:
        return (url(i, domains) for i in range(n))

    started = time.monotonic()
    added, dispatched = 0, []
    for _, res in tracker.add_stream(JOB, urls()):
        added += res.added
        dispatched.extend(res.dispatch)
    add_seconds = time.monotonic() - started
    assert added == n, (added, n)
    queued, queued_used = job_memory(client, JOB), used_memory(client) - before
    if log:
        log(f"added {n:,} in {add_seconds:.1f}s; queued: {queued} used_memory delta {queued_used}")

    if not complete:
        return Figures(n, add_seconds, 0.0, queued, queued_used, {}, 0, *bucket_sizes(client))
    started = time.monotonic()
    done = complete_all(tracker, JOB, dispatched)
    complete_seconds = time.monotonic() - started
    stats = tracker.stats(JOB)
    assert done == n and (stats.seen, stats.done, stats.frontier, stats.dispatched) == (n, n, 0, 0)
    done_mem, done_used = job_memory(client, JOB), used_memory(client) - before
    return Figures(n, add_seconds, complete_seconds, queued, queued_used, done_mem, done_used,
                   *bucket_sizes(client))


def bucket_sizes(client: redis.Redis) -> tuple[int, int]:
    """How many seen-set buckets the job has, and the most members one holds (0 and 0 while
    nothing is done: fingerprints are written at complete)."""
    prefix = keys.JobKeys(JOB).seen_buckets
    names = list(client.scan_iter(match=prefix + "*", count=1000))
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.scard(name)
    return len(names), max(pipe.execute(), default=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", type=int, default=10_000_000)
    parser.add_argument("--domains", type=int, default=10_000)
    parser.add_argument("--no-complete", action="store_true",
                        help="measure the queued state only, where the seen set is still empty (fingerprints are "
                             "written at complete; completing 10M items took 29 minutes)")
    args = parser.parse_args()
    from distscrape_celery.local.embedded import EmbeddedRedis

    with EmbeddedRedis() as server:
        f = measure(server.url, args.urls, args.domains,
                    log=lambda line: print(line, file=sys.stderr, flush=True),
                    complete=not args.no_complete)
    n = f.urls
    mean_url = sum(len(url(i, args.domains)) for i in range(1000)) / 1000

    def per(d: dict[str, int]) -> str:
        return ", ".join(f"{k} {v / n:.2f}" for k, v in d.items())

    print(f"{n:,} URLs of ~{mean_url:.0f} bytes over {args.domains:,} domains, default job settings")
    print(f"add: {f.add_seconds:.1f}s ({n / f.add_seconds:,.0f} URLs/s)" + (
        f"; dispatch+complete: {f.complete_seconds:.1f}s ({n / f.complete_seconds:,.0f} items/s)"
        if f.done else ""))
    print(f"all queued: {sum(f.queued.values()) / n:.2f} bytes/URL in the job's keys ({per(f.queued)}); "
          f"used_memory delta {f.queued_used / n:.2f} bytes/URL")
    if f.done:
        print(f"all done:   {sum(f.done.values()) / n:.2f} bytes/URL in the job's keys "
              f"({per(f.done)}); used_memory delta {f.done_used / n:.2f} bytes/URL")
        print(f"seen set: {f.buckets:,} buckets, largest {f.largest_bucket} members "
              f"(intset up to set-max-intset-entries, 512 by default)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
