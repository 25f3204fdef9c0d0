"""Redis memory per known URL of a job that revisits: at most the URL's own bytes, its ETag's
and 48, against at most 16 bytes per done URL of a job that does not revisit.

    .venv/bin/python -m bench.known_memory [--urls 100000,1000000]

For each size, on a throwaway Redis (``EmbeddedRedis``), two jobs with default settings but a
raised in-flight cap (all URLs are of one shop): one with ``[revisit]``, one without. Adds
``--urls`` URLs of a shop's catalogue (~68 bytes, one domain) through
``RedisTracker.add_stream``, as ``distscrape seed`` does, then takes every one through dispatch
and ``RedisTracker.complete_many`` (batches of 500, the download in between left out), in the
job that revisits each with a record as a worker packs it: a 6-byte digest and
an nginx-style ETag (``"65a1b2c3-1f2e"``, 15 bytes). Memory is read, with every URL done, as
``used_memory``'s growth from before the job was created, and as MEMORY USAGE (SAMPLES 0) of
the job's keys by part: known-item buckets (fingerprint -> record), their lists of names, the
seen set, the rest. It also checks that every known-item bucket is listpack encoded (a record
over 64 bytes, or a bucket over 128 entries, would turn one into a hashtable).

tests/integration/tracker/test_known_memory.py runs :func:`measure` at 100,000 URLs.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional

import redis

from bench.bench_seen_memory import used_memory
from distscrape_celery.job.spec import JobSpec
from distscrape_celery.tracker import CrawlLimits, DomainLimits, RedisTracker, keys
from distscrape_celery.tracker.revisits import Record, RevisitOutcome, RevisitUpdate, digest

JOB = "known"
CONCURRENCY = 1000  # one worker's: up to 2,000 items dispatched at a time
BATCH = 500  # saves a complete_many call takes (the tracker's MAX_ADD_BATCH)
ETAG_BYTES = 15
# The bars: bytes of Redis a known URL costs beyond its URL and ETag; a done URL without revisits.
KNOWN_OVER = 48
DONE_BOUND = 16


def url(n: int) -> str:
    """The n-th URL of the shop's catalogue (68 bytes below 1,000,000)."""
    return (f"https://www.example-shop.test/catalog/category-{n % 100:02d}/"
            f"product-{n:06d}.html")


def etag(n: int) -> str:
    """An ETag as nginx makes it, ``"<mtime hex>-<size hex>"``: 15 bytes for pages of 4 to 64 KB."""
    return f'"{0x65A1B2C3 + n % 86400:08x}-{0x1000 + n * 7919 % 0xF000:x}"'


def record(n: int) -> Record:
    """What a worker packs for the n-th URL once it saved it (its interval 0: every generation)."""
    return Record(depth=3, interval=0, digest=digest(url(n).encode()),
                  last_modified=1_704_000_000 + n % 86400, etag=etag(n))


def mean_length(n: int) -> float:
    """The mean length of the first ``n`` URLs (at most 100,000 looked at)."""
    step = max(1, n // 100_000)
    sample = range(0, n, step)
    return sum(len(url(i)) for i in sample) / len(sample)


@dataclass
class Figures:
    urls: int
    revisit: bool
    seconds: float  # add, dispatch and complete
    used: int  # used_memory's growth, every URL done
    parts: dict[str, int]  # MEMORY USAGE of the job's keys, by part
    encodings: Counter  # OBJECT ENCODING of the known-item buckets
    buckets: int
    largest: int  # most entries in one known-item bucket
    longest_record: int

    @property
    def per_url(self) -> float:
        return self.used / self.urls

    @property
    def in_keys(self) -> float:
        return sum(self.parts.values()) / self.urls


def job_memory(client: redis.Redis, job: str) -> dict[str, int]:
    """Bytes (MEMORY USAGE, SAMPLES 0) of the job's keys: known-item buckets, their name lists,
    seen-set buckets, live-item buckets and the rest."""
    k = keys.JobKeys(job)
    prefixes = {"known": k.known_buckets, "names": k.known_names, "seen": k.seen_buckets,
                "items": k.item_buckets}
    parts = dict.fromkeys([*prefixes, "other"], 0)
    names = [n.decode() for n in client.scan_iter(match=k.pattern, count=1000)]
    for start in range(0, len(names), 1000):
        chunk = names[start:start + 1000]
        pipe = client.pipeline(transaction=False)
        for name in chunk:
            pipe.memory_usage(name, samples=0)
        for name, size in zip(chunk, pipe.execute()):
            part = next((p for p, prefix in prefixes.items() if name.startswith(prefix)), "other")
            parts[part] += int(size or 0)
    return parts


def known_buckets(client: redis.Redis, job: str) -> tuple[Counter, int, int]:
    """The encodings of the job's known-item buckets, the most entries one holds, and the
    longest record."""
    names = list(client.scan_iter(match=keys.JobKeys(job).known_buckets + "*", count=1000))
    encodings: Counter = Counter()
    largest = longest = 0
    for start in range(0, len(names), 500):
        chunk = names[start:start + 500]
        pipe = client.pipeline(transaction=False)
        for name in chunk:
            pipe.object("encoding", name)
            pipe.hlen(name)
            pipe.hrandfield(name, 4, withvalues=True)
        replies = pipe.execute()
        for encoding, size, sample in zip(replies[::3], replies[1::3], replies[2::3]):
            encodings[encoding.decode() if isinstance(encoding, bytes) else encoding] += 1
            largest = max(largest, size)
            longest = max([longest, *(len(v) for v in sample[1::2])])
    return encodings, largest, longest


def complete_every(tracker: RedisTracker, job: str, dispatched: list[str], revisit: bool) -> int:
    """Take every queued item through dispatch and complete_many; how many it completed."""
    worker = tracker.register_worker("bench", 0, CONCURRENCY)
    todo = [*dispatched, *tracker.add(job, []).dispatch]
    done = 0
    while todo:
        batch, todo = todo[:BATCH], todo[BATCH:]
        updates = ([RevisitUpdate.of(RevisitOutcome.SAVED, record(int(item[-11:-5])))
                    for item in batch] if revisit else None)
        # Token 0: complete takes any token (a late save still completes its item).
        for result in tracker.complete_many(job, [(item, 0) for item in batch], updates):
            done += result.changed
            todo.extend(result.dispatch)
        if not todo:
            tracker.heartbeat(worker)
            todo = tracker.add(job, []).dispatch
    tracker.deregister_worker(worker)
    return done


def new_job(tracker: RedisTracker, job: str, revisit: bool) -> None:
    data = {"seeds": [url(0)], **({"revisit": {}} if revisit else {})}
    spec = JobSpec.model_validate(data)
    # One shop: its in-flight cap is raised so that dispatch hands out 2,000 items at a time.
    limits = CrawlLimits(default=DomainLimits(concurrency=2 * CONCURRENCY))
    tracker.create_job(job, spec.to_json(), limits)


def measure(redis_url: str, n: int, revisit: bool = True,
            log: Optional[Callable[[str], None]] = None) -> Figures:
    """Add ``n`` URLs to a new job (``revisit``: one with [revisit]) on the Redis at
    ``redis_url`` and complete them all (see above); ``log`` gets a line when it is done."""
    client = redis.Redis.from_url(redis_url, socket_timeout=None)
    tracker = RedisTracker.from_url(redis_url)
    job = f"{JOB}-{'revisit' if revisit else 'plain'}-{n}"
    # A first job loads (and compiles) the scripts, so the growth below is the job's own.
    warm = f"warm-up-{job}"
    new_job(tracker, warm, revisit)
    complete_every(tracker, warm, tracker.add(warm, [url(0)]).dispatch, revisit)
    before = used_memory(client)
    started = time.monotonic()
    new_job(tracker, job, revisit)
    dispatched: list[str] = []
    for _, result in tracker.add_stream(job, (url(i) for i in range(n))):
        dispatched.extend(result.dispatch)
    done = complete_every(tracker, job, dispatched, revisit)
    seconds = time.monotonic() - started
    stats = tracker.stats(job)
    assert done == n and (stats.done, stats.frontier, stats.dispatched) == (n, 0, 0), stats
    assert stats.known == (n if revisit else 0), stats.known
    used = used_memory(client) - before
    parts = job_memory(client, job)
    encodings, largest, longest = known_buckets(client, job)
    figures = Figures(n, revisit, seconds, used, parts, encodings, sum(encodings.values()),
                      largest, longest)
    if log:
        log(f"{n:,} URLs, {'revisit' if revisit else 'no revisit'}: {seconds:.1f}s, used_memory "
            f"+{used:,}, keys {parts}")
    return figures


def report(n: int, known: Figures, plain: Figures) -> list[tuple[str, bool]]:
    """Print one size's figures; its bars as (text, passed)."""
    own = mean_length(n)
    over = known.per_url - own - ETAG_BYTES
    print(f"\n{n:,} URLs of {own:.1f} bytes, ETags of {ETAG_BYTES} bytes, records of "
          f"{known.longest_record} bytes at most; add + dispatch + complete took "
          f"{known.seconds:.1f}s with revisits, {plain.seconds:.1f}s without")
    print("| job | bytes a done URL (used_memory) | in the job's keys | beyond URL + ETag | "
          "known buckets | their names | seen set | rest |")
    print("|---|---|---|---|---|---|---|---|")
    for label, f, beyond in (("revisits", known, f"{over:.1f}"), ("no revisits", plain, "-")):
        p = {k: v / n for k, v in f.parts.items()}
        print(f"| {label} | {f.per_url:.2f} | {f.in_keys:.2f} | {beyond} | {p['known']:.2f} | "
              f"{p['names']:.2f} | {p['seen']:.2f} | {p['items'] + p['other']:.2f} |")
    print(f"known-item buckets: {known.buckets:,} ({dict(known.encodings)}), largest "
          f"{known.largest} entries")
    return [
        (f"{n:,}: a known URL costs at most its URL + ETag + {KNOWN_OVER} bytes "
         f"({known.per_url:.1f} = {own:.1f} + {ETAG_BYTES} + {over:.1f})", over <= KNOWN_OVER),
        (f"{n:,}: every known-item bucket listpack encoded ({dict(known.encodings)})",
         set(known.encodings) == {"listpack"}),
        (f"{n:,}: a done URL without revisits costs at most {DONE_BOUND} bytes "
         f"({plain.per_url:.2f})", plain.per_url <= DONE_BOUND),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", default="100000,1000000",
                        help="sizes, comma-separated (at most 1,000,000: the URLs' numbers have "
                             "6 digits)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.urls.split(",") if s.strip()]
    if not sizes or max(sizes) > 1_000_000 or min(sizes) < 1:
        parser.error("--urls: sizes from 1 to 1,000,000")
    from distscrape_celery.local.embedded import EmbeddedRedis

    def note(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    bars = []
    for n in sizes:
        with EmbeddedRedis() as server:  # a fresh Redis each: nothing of another job's memory
            known = measure(server.url, n, revisit=True, log=note)
        with EmbeddedRedis() as server:
            plain = measure(server.url, n, revisit=False, log=note)
        bars += report(n, known, plain)
    print()
    for text, ok in bars:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    return 0 if all(ok for _, ok in bars) else 1


if __name__ == "__main__":
    sys.exit(main())
