"""`distscrape crawl --max-duration` on a slow site: the crawl stops once its budget ran out,
its job ends expired, and nothing is lost (every item not saved is still queued and counted,
nothing is left in flight). The command runs as a subprocess on a real Redis."""

from __future__ import annotations

import time

from distscrape_celery.testing.sitegen import SiteServer
from distscrape_celery.tracker import JobState, RedisTracker
from tests.support.crawl import saved_files
from tests.support.crawl_command import Crawl

BUDGET = 8.0


def test_a_crawl_stops_after_its_budget_with_its_job_expired(small_site, redis_url, tmp_path):
    out = tmp_path / "out"
    with SiteServer(small_site, delay=0.4) as server:  # 80 pages at ~5/s: far past the budget
        began = time.monotonic()
        crawl = Crawl(tmp_path, server.url("/"), out, "--redis-url", redis_url, "--job", "timed",
                      "--max-duration", str(BUDGET))
        assert crawl.wait(120) == 0, crawl.stderr
        took = time.monotonic() - began
    tracker = RedisTracker.from_url(redis_url)
    info, stats = tracker.job_info("timed"), tracker.stats("timed")
    assert info.state is JobState.EXPIRED, (info, stats)
    assert BUDGET <= info.ended - info.started < BUDGET + 30, info
    assert took < BUDGET + 60
    # Nothing in flight, nothing lost: what was not saved is queued, and counted.
    assert (stats.dispatched, stats.leased, stats.save_pending) == (0, 0, 0), stats
    assert 0 < stats.done < stats.seen and stats.frontier + stats.delayed > 0, stats
    assert stats.done + stats.dead + stats.frontier + stats.delayed == stats.seen, stats
    assert info.final == {"seen": stats.seen, "done": stats.done, "dead": stats.dead,
                          "queued": stats.frontier + stats.delayed}
    assert len(saved_files(out)) == stats.done
    assert "expired (its max_duration ran out)" in crawl.stdout, crawl.stdout
    assert f"{stats.queued} left queued" in crawl.stdout, crawl.stdout
