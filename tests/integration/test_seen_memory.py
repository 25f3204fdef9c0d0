"""The seen set's bound, at 100,000 URLs: a done URL costs at most 16 bytes of Redis (dedup and
state).

Runs bench/bench_seen_memory.py's measurement (real RedisTracker scripts on a real Redis, a job
with default settings) at a small scale; the 10-million figure is in docs/performance.md.
"""

from __future__ import annotations

from bench.bench_seen_memory import measure  # bench/ is a namespace package under the root

BOUND = 16  # bytes of Redis per seen (done) URL


def test_a_done_url_costs_at_most_16_bytes_of_redis(redis_url, capsys):
    n = 100_000
    f = measure(redis_url, n)
    done_keys = sum(f.done.values()) / n
    with capsys.disabled():  # the figures, for the record (the frontier is reported apart)
        print(f"\n{n:,} URLs: done {done_keys:.2f} bytes/URL (job keys), used_memory delta "
              f"{f.done_used / n:.2f}; queued {sum(f.queued.values()) / n:.1f} bytes/URL "
              f"(frontier {f.queued['frontier'] / n:.1f}, items {f.queued['items'] / n:.1f}, "
              f"seen {f.queued['seen'] / n:.1f}); {f.buckets} buckets, largest {f.largest_bucket}")
    # Every done URL is gone from the live items and the frontier: only its fingerprint stays.
    assert f.done["items"] == 0 and f.done["frontier"] == 0
    assert done_keys <= BOUND
    assert f.done_used / n <= BOUND  # Redis's own account agrees (nothing hides outside the keys)
    assert f.largest_bucket < 512  # every bucket an intset (set-max-intset-entries)


def test_the_queued_only_measurement_reports_an_empty_seen_set(redis_url):
    # Fingerprints are written at complete: with every URL only queued there is no bucket yet.
    f = measure(redis_url, 1000, complete=False)
    assert (f.buckets, f.largest_bucket) == (0, 0)
    assert f.queued["frontier"] > 0 and f.done == {}
