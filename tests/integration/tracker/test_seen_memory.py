"""The tracker's memory bounds, at 100,000 items: a done URL costs at most 16 bytes of Redis
(dedup and state), a queued URL at most its own bytes + 32, a queued ID at most 48 bytes.

Runs bench/bench_seen_memory.py's measurement (real RedisTracker scripts on a real Redis, a job
with default settings) at a small scale; the 10-million figures are in docs/performance.md.
"""

from __future__ import annotations

from bench.bench_seen_memory import mean_length, measure  # bench/ is a namespace package

BOUND = 16  # bytes of Redis per seen (done) URL
QUEUED_OVER = 32  # bytes of Redis per queued URL beyond the URL's own
QUEUED_ID = 48  # bytes of Redis per queued ID


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


def test_a_queued_url_costs_at_most_its_own_bytes_and_32(redis_url, capsys):
    """Stored once, in its domain's queue, and known by its fingerprint in a live-item bucket.
    1,000 URLs a domain, as 10 million over the bench's 10,000 domains: a domain's queue costs a
    few hundred bytes whatever it holds, which a scale this small would otherwise weigh ten times
    as much as at 10 million."""
    n, domains = 100_000, 100
    f = measure(redis_url, n, domains, complete=False)
    own = mean_length(n, domains)
    queued = sum(f.queued.values()) / n
    with capsys.disabled():
        print(f"\n{n:,} URLs of {own:.1f} bytes: queued {queued:.2f} bytes/URL (frontier "
              f"{f.queued['frontier'] / n:.2f}, items {f.queued['items'] / n:.2f}, other "
              f"{f.queued['other'] / n:.2f}), used_memory delta {f.queued_used / n:.2f}")
    assert queued <= own + QUEUED_OVER
    assert f.queued_used / n <= own + QUEUED_OVER


def test_a_queued_id_costs_at_most_48_bytes(redis_url, capsys):
    n = 100_000
    f = measure(redis_url, n, complete=False, ids=True)
    queued = sum(f.queued.values()) / n
    with capsys.disabled():
        print(f"\n{n:,} IDs of {mean_length(n, 0, ids=True):.0f} bytes: queued {queued:.2f} "
              f"bytes/ID (frontier {f.queued['frontier'] / n:.2f}, items "
              f"{f.queued['items'] / n:.2f}), used_memory delta {f.queued_used / n:.2f}")
    assert queued <= QUEUED_ID
    assert f.queued_used / n <= QUEUED_ID
