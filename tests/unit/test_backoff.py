"""The retry delay the pipeline hands the tracker: exponential, jittered, Retry-After, capped."""

from __future__ import annotations

from distscrape_celery.core.backoff import Backoff
from distscrape_celery.job.sections import PolitenessSpec


def test_exponential_with_equal_jitter_and_a_cap():
    low, high = Backoff(1.0, 10.0, rand=lambda: 0.0), Backoff(1.0, 10.0, rand=lambda: 1.0)
    assert [low.delay(n) for n in range(5)] == [0.5, 1.0, 2.0, 4.0, 5.0]
    assert [high.delay(n) for n in range(5)] == [1.0, 2.0, 4.0, 8.0, 10.0]
    assert high.delay(10_000) == 10.0  # no overflow, still the cap


def test_retry_after_is_a_floor_but_capped_too():
    b = Backoff(1.0, 60.0, rand=lambda: 0.5)
    assert b.delay(0, retry_after=2) == 2.0
    assert b.delay(3, retry_after=2) == 6.0  # the backoff is longer already
    assert b.delay(0, retry_after=86400) == 60.0
    assert b.delay(0, retry_after=None) == b.delay(0, retry_after=0) == 0.75


def test_built_from_the_spec():
    b = Backoff.from_spec(PolitenessSpec(backoff_base=0.2, backoff_max=3))
    assert (b.base, b.cap) == (0.2, 3)
