"""Redis memory per queued and per done URL (or ID): a queued item costs at most its own bytes
+ 32, a done one at most 16 bytes.

    .venv/bin/python -m bench.bench_seen_memory [--urls 10000000] [--domains 10000] [--ids] [--no-complete]

Starts a throwaway Redis and creates a job with the default job settings. Adds ``--urls``
generated URLs (~66 characters, spread over ``--domains`` domains; with ``--ids``, 10-digit IDs
instead, all of one pseudo-domain, whose in-flight cap is raised so that the completion phase
is not throttled) through ``RedisTracker.add_stream``, as ``distscrape seed`` does, and reports
memory with every item queued. Then (unless ``--no-complete``) registers one worker and takes
every item through dispatch and ``complete`` (the tracker's real scripts, pipelined; the
download in between is left out) and reports memory with every item done. Memory is read two
ways: MEMORY USAGE (SAMPLES 0, exact) of each of the job's keys, split into the seen set, the
live-item buckets, the frontier (domain queues and the domain schedule) and the rest; and INFO
memory's used_memory before the job and after.

tests/integration/tracker/test_seen_memory.py imports :func:`measure` and asserts the bounds at 100,000
items.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import redis

from distscrape_celery.tracker import keys
from distscrape_celery.job.spec import JobSpec
from distscrape_celery.tracker import CrawlLimits, DomainLimits, RedisTracker

JOB = "seen"
# One worker's concurrency: the broker bound is twice that, so each pipelined round completes
# up to 2,000 dispatched items.
CONCURRENCY = 1000


# The pseudo-domain of the IDs (the host of a job's download_url_fmt).
ID_DOMAIN = "ids.example.invalid"


def url(n: int, domains: int) -> str:
    """The n-th generated URL: ~66 characters, like bench_frontier.py's."""
    return f"http://n{n % domains}.example.invalid/2026/11/22/s-{n % 97}/article-{n:09d}.html"


def item_id(n: int) -> str:
    """The n-th generated ID: 10 digits, as bench_seed_ids.py's."""
    return str(1_000_000_000 + n * 7)


def item(n: int, domains: int, ids: bool = False) -> str:
    return item_id(n) if ids else url(n, domains)


def mean_length(n: int, domains: int, ids: bool = False) -> float:
    """The mean length in bytes of the first ``n`` generated items (at most 100,000 looked at)."""
    step = max(1, n // 100_000)
    sample = range(0, n, step)
    return sum(len(item(i, domains, ids)) for i in sample) / len(sample)


def job_memory(client: redis.Redis, job: str) -> dict[str, int]:
    """Bytes (MEMORY USAGE, SAMPLES 0: every element counted) of the job's keys, by part."""
    k = keys.JobKeys(job)
    parts = {"seen": 0, "items": 0, "frontier": 0, "other": 0}
    names = [n.decode() if isinstance(n, bytes) else n
             for n in client.scan_iter(match=k.pattern, count=1000)]
    sizes = []
    for start in range(0, len(names), 1000):
        pipe = client.pipeline(transaction=False)
        for name in names[start:start + 1000]:
            pipe.memory_usage(name, samples=0)
        sizes.extend(pipe.execute())
    for name, size in zip(names, sizes):
        if name.startswith(k.seen_buckets):
            part = "seen"
        elif name.startswith(k.item_buckets):
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
            complete: bool = True, ids: bool = False) -> Figures:
    """Add ``n`` URLs (``ids``: IDs) to a new job with default settings, then (if ``complete``)
    complete them all (see above); ``log`` (print, say) gets each phase's figures as it ends."""
    client = redis.Redis.from_url(url_redis, socket_timeout=None)
    tracker = RedisTracker.from_url(url_redis)
    spec = JobSpec.model_validate({"seeds": [url(0, domains)]})
    limits = spec.crawl_limits()
    if ids:  # one pseudo-domain for every ID: its cap would throttle the completion phase
        limits = CrawlLimits(default=DomainLimits(concurrency=2 * CONCURRENCY), id_domain=ID_DOMAIN)
    # A first job loads (and compiles) the scripts, so the delta below is the job's own.
    tracker.create_job("warm-up", spec.to_json(), limits)
    tracker.add("warm-up", [item(0, domains, ids)])
    complete_all(tracker, "warm-up")
    before = used_memory(client)
    tracker.create_job(JOB, spec.to_json(), limits)

    def items() -> Iterator[str]:
        return (item(i, domains, ids) for i in range(n))

    started = time.monotonic()
    added, dispatched = 0, []
    for _, res in tracker.add_stream(JOB, items()):
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
    parser.add_argument("--ids", action="store_true",
                        help="10-digit IDs instead of URLs (--urls of them, --domains ignored)")
    parser.add_argument("--no-complete", action="store_true",
                        help="measure the queued state only, where the seen set is still empty (fingerprints are "
                             "written at complete; completing 10M items took 29 minutes)")
    args = parser.parse_args()
    from distscrape_celery.local.embedded import EmbeddedRedis

    with EmbeddedRedis() as server:
        f = measure(server.url, args.urls, args.domains,
                    log=lambda line: print(line, file=sys.stderr, flush=True),
                    complete=not args.no_complete, ids=args.ids)
    n = f.urls
    mean = mean_length(n, args.domains, args.ids)
    what = "IDs" if args.ids else "URLs"

    def per(d: dict[str, int]) -> str:
        return ", ".join(f"{k} {v / n:.2f}" for k, v in d.items())

    over = "one pseudo-domain" if args.ids else f"{args.domains:,} domains"
    print(f"{n:,} {what} of {mean:.1f} bytes on average over {over}, default job settings")
    print(f"add: {f.add_seconds:.1f}s ({n / f.add_seconds:,.0f} {what}/s)" + (
        f"; dispatch+complete: {f.complete_seconds:.1f}s ({n / f.complete_seconds:,.0f} items/s)"
        if f.done else ""))
    queued = sum(f.queued.values()) / n
    print(f"all queued: {queued:.2f} bytes/item in the job's keys, its own bytes + "
          f"{queued - mean:.2f} ({per(f.queued)}); used_memory delta {f.queued_used / n:.2f} "
          "bytes/item")
    if f.done:
        print(f"all done:   {sum(f.done.values()) / n:.2f} bytes/item in the job's keys "
              f"({per(f.done)}); used_memory delta {f.done_used / n:.2f} bytes/item")
        print(f"seen set: {f.buckets:,} buckets, largest {f.largest_bucket} members "
              f"(intset up to set-max-intset-entries, 512 by default)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
