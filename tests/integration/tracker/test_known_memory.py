"""The Redis memory of a job that revisits, at 100,000 known URLs: every known-item bucket stays
listpack encoded, and a known URL should cost at most its own bytes, its ETag's and 48.

Runs bench/known_memory.py's measurement (the real RedisTracker calls: add_stream, then
dispatch and complete_many in batches of 500, each save with the record a worker packs, an
nginx-style ETag of 15 bytes) at a small scale; the 1,000,000-URL figures are in
docs/performance.md.
"""

from __future__ import annotations

import pytest
import redis

from bench.known_memory import ETAG_BYTES, KNOWN_OVER, mean_length, measure

N = 100_000


@pytest.fixture(scope="module")
def known(redis_server_url):
    redis.Redis.from_url(redis_server_url).flushdb()
    return measure(redis_server_url, N, revisit=True)


def test_known_buckets_stay_listpack_encoded(known, capsys):
    own = mean_length(N)
    with capsys.disabled():  # the figures, for the record
        print(f"\n{N:,} known URLs of {own:.1f} bytes, ETag {ETAG_BYTES}: {known.per_url:.2f} "
              f"bytes a URL (used_memory), {known.in_keys:.2f} in the job's keys (buckets "
              f"{known.parts['known'] / N:.2f}, names {known.parts['names'] / N:.2f}); "
              f"{known.buckets} buckets {dict(known.encodings)}, largest {known.largest}, "
              f"records up to {known.longest_record} bytes; {known.seconds:.1f}s")
    assert set(known.encodings) == {"listpack"}, known.encodings
    assert known.largest < 128  # hash-max-listpack-entries
    assert known.longest_record <= 64  # hash-max-listpack-value
    assert known.parts["seen"] == 0 and known.parts["items"] == 0


def test_a_known_url_costs_at_most_its_bytes_its_etag_and_48(known):
    over = known.per_url - mean_length(N) - ETAG_BYTES
    assert over <= KNOWN_OVER, over
