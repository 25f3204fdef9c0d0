"""A scrape task that finds its page unchanged carries on with the next due page (the item
pipeline on a real Redis tracker and real HTTP, without Celery in the way): a generation of
revisits takes far fewer tasks than pages, and still fetches every known page exactly once."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Optional

from distscrape_celery.core.pipeline import ItemPipeline
from distscrape_celery.core.runtime import Runtime
from distscrape_celery.core.schedules import run_again
from distscrape_celery.job.spec import build_spec
from distscrape_celery.tracker import JobState
from distscrape_celery.testing.sitegen import SiteServer, generate_site
from tests.support.crawl import crawl_settings
from tests.support.pipeline import InlinePublisher, crawl_inline


def _generation(rt: Runtime, job: str, generation: int,
                go_on: Optional[Callable[[], bool]]) -> int:
    """Start ``job``'s next generation and run its scrape tasks in this thread, each with
    ``go_on``, until the job is finished; returns how many tasks ran."""
    publish = InlinePublisher()
    pipe = ItemPipeline(rt, publish)
    result = run_again(rt.tracker, job, publish.scrape)
    assert result.started and result.generation == generation
    tasks = 0
    for _ in range(2000):
        if not publish.tasks:
            # What a worker's heartbeat does: the generation's refill, and its end.
            publish.scrape(job, rt.tracker.maintain(job, max_lost=3).dispatch)
            if not publish.tasks and rt.tracker.job_info(job).state is JobState.FINISHED:
                break
            continue
        kind, *args = publish.tasks.popleft()
        assert kind == "scrape", kind  # nothing changed: nothing to save
        pipe.scrape(*args, go_on=go_on)
        tasks += 1
    assert rt.tracker.job_info(job).state is JobState.FINISHED
    return tasks


def test_unchanged_revisits_carry_on_in_one_task(redis_url, tmp_path):
    site = generate_site(60, seed=4, unreachable=0)
    with SiteServer(site, validators=True) as server:
        # The broker may hold one scrape message (4 task slots): a completion's plain top-up
        # finds it full, and only the carry goes on.
        rt = Runtime.for_redis(crawl_settings(redis_url, lease_seconds=30, save_batch_size=1,
                                              dispatch_factor=0.25))
        spec = build_spec({"seeds": [server.url("/")], "revisit": {},
                           "saver": {"output": str(tmp_path / "out")}})
        crawl_inline(rt, "r", spec)
        pages = len(site.reachable)
        assert len(server.requests) == pages

        def counted_since(start: int) -> collections.Counter:
            return collections.Counter(server.requests[start:])

        # Carrying on: a task goes on from page to page while its pages are unchanged.
        start = len(server.requests)
        tasks = _generation(rt, "r", 2, go_on=lambda: True)
        assert counted_since(start) == {path: 1 for path in site.reachable}
        assert tasks <= pages // 4, tasks
        assert rt.tracker.stats("r").unchanged == pages
        # A task that may not go on scrapes its own page alone.
        start = len(server.requests)
        tasks = _generation(rt, "r", 3, go_on=lambda: False)
        assert counted_since(start) == {path: 1 for path in site.reachable}
        assert tasks >= pages, tasks
