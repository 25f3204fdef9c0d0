"""A scrape task carries on from page to page (the item pipeline on a real Redis tracker and real
HTTP, without Celery in the way): a crawl takes far fewer tasks than pages and still fetches and
saves every page exactly once, with save tasks or saving inline; a task that may not go on
scrapes its own page alone."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Optional

import pytest

from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.core.pipeline import ItemPipeline
from distscrape_celery.core.runtime import Runtime
from distscrape_celery.job.spec import JobSpec, build_spec
from distscrape_celery.testing.sitegen import SiteServer, generate_site
from tests.support.crawl import crawl_settings
from tests.support.pipeline import InlinePublisher


def _crawl(rt: Runtime, job: str, spec: JobSpec, go_on: Optional[Callable[[], bool]]) -> int:
    """Seed ``job`` and run its tasks in this thread, each scrape task with ``go_on``, until it
    is finished; returns how many scrape tasks ran."""
    publish = InlinePublisher()
    pipe = ItemPipeline(rt, publish)
    CrawlManager(rt.tracker, publish.scrape).seed(job, spec)
    scrapes = 0
    for _ in range(5000):
        if not publish.tasks and pipe.flush() and publish.tasks:
            continue  # the gathered saves
        if not publish.tasks:
            if rt.tracker.stats(job).finished:
                break
            publish.scrape(job, rt.tracker.maintain(job, max_lost=spec.max_lost).dispatch)
            continue
        kind, *args = publish.tasks.popleft()
        if kind == "scrape":
            pipe.scrape(*args, go_on=go_on)
            scrapes += 1
        else:
            pipe.save(*args)
    assert rt.tracker.stats(job).finished
    return scrapes


@pytest.mark.parametrize("save_inline", [True, False], ids=["inline", "save-tasks"])
@pytest.mark.parametrize("carry", [True, False], ids=["carrying", "one-each"])
def test_a_crawl_carries_on_from_page_to_page(redis_url, tmp_path, save_inline, carry):
    site = generate_site(60, seed=5, unreachable=0)
    out = tmp_path / "out"
    with SiteServer(site) as server:
        # The broker may hold one scrape message (4 task slots): a page's plain top-up mostly
        # finds it full, and only the carry hands out more.
        rt = Runtime.for_redis(crawl_settings(redis_url, lease_seconds=30, save_inline=save_inline,
                                              dispatch_factor=0.25))
        rt.tracker.register_worker("inline", 1, 4)
        spec = build_spec({"seeds": [server.url("/")], "saver": {"output": str(out)}})
        tasks = _crawl(rt, "c", spec, (lambda: True) if carry else None)
        pages = len(site.reachable)
        assert collections.Counter(server.requests) == {path: 1 for path in site.reachable}
        assert sum(1 for p in out.rglob("*") if p.is_file()) == pages
        assert rt.tracker.stats("c").done == pages
        if carry:
            assert tasks <= pages // 4, tasks
        else:
            assert tasks >= pages, tasks
