"""The crawl manager: seeds jobs, reports their state, waits for them to finish."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Optional

from .components import check_components
from ..job.spec import JobSpec
from ..tracker.keys import check_job_name
from ..settings import Settings
from ..tracker import JobState, JobStats, Tracker
from ..job.urls import url_host


@dataclass(frozen=True)
class SeedResult:
    """What seeding did: ``added`` items were new, ``already_seen`` were known to the job;
    ``off_host`` of them are on none of the job's seeds' hosts, so their links are not followed."""

    created: bool
    added: int
    already_seen: int
    dispatched: int
    off_host: int = 0


class CrawlManager:
    """Coordinates a job through the tracker; ``publish`` sends scrape tasks for dispatched items.
    A spec is seeded only if ``settings`` (this process's; default: the built-in kinds only, any
    output) would let it load the classes the spec names and write where it says."""

    def __init__(
        self, tracker: Tracker, publish: Callable[[str, Sequence[str]], None], *,
        settings: Optional[Settings] = None,
    ) -> None:
        self.tracker = tracker
        self.publish = publish
        self.settings = settings if settings is not None else Settings()

    def seed(
        self, job: str, spec: JobSpec, more: Iterable[str] = (),
        on_progress: Optional[Callable[[int, int], None]] = None, priority: int = 0,
    ) -> SeedResult:
        """Store the job's spec (workers on every host read it by name) and queue its seeds, then
        the items of ``more`` (already normalised), streamed in batches, at ``priority``. A job
        that exists takes the new seeds if nothing else in its spec differs (it keeps its first
        seeds in its spec). ``on_progress(items taken, new)`` is called after each round trip."""
        check_job_name(job)
        check_components(spec, self.settings)
        created = self.tracker.create_job(job, spec.to_json(), spec.crawl_limits())
        stored = spec if created else JobSpec.from_json(self.tracker.load_spec(job))
        counter = _HostCounter(stored)
        taken = added = dispatched = 0
        items = counter.count(itertools.chain(spec.seeds, more))
        for batch_size, batch in self.tracker.add_stream(job, items, priority=priority):
            if batch.dispatch:
                self.publish(job, batch.dispatch)
            taken, added = taken + batch_size, added + batch.added
            dispatched += len(batch.dispatch)
            if on_progress is not None:
                on_progress(taken, added)
        return SeedResult(created=created, added=added, already_seen=taken - added,
                          dispatched=dispatched, off_host=counter.off_host)

    def finished(self, job: str, stats: JobStats) -> bool:
        """Whether ``job``, whose figures are ``stats``, has nothing left to do. A generation
        that found nothing due sees nothing at all, so its figures never look finished: its
        recorded end says so."""
        if stats.finished:
            return True
        return not stats.started and self.tracker.job_info(job).state is JobState.FINISHED

    def status(self, job: str) -> JobStats:
        self.tracker.load_spec(job)  # raises JobNotFound for a job never seeded
        return self.tracker.stats(job)

    def wait(
        self,
        job: str,
        *,
        poll: float = 0.25,
        timeout: Optional[float] = None,
        on_progress: Optional[Callable[[JobStats], None]] = None,
        check: Optional[Callable[[], None]] = None,
    ) -> JobStats:
        """Poll until the job is finished (or expired: its max_duration ran out) and return its
        final stats. ``check`` may raise to abort (e.g. when the local workers died). Raises
        TimeoutError after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            stats = self.tracker.stats(job)
            if on_progress is not None:
                on_progress(stats)
            if self.finished(job, stats):
                return stats
            if self.tracker.job_info(job).state is JobState.EXPIRED:
                return self.tracker.stats(job)
            if check is not None:
                check()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job!r} did not finish within {timeout:.0f}s: {stats.to_dict()}")
            time.sleep(poll)


class _HostCounter:
    """Counts the URL items on none of the hosts a job's simple scraper stays on (same_host):
    they are downloaded, but their links are not followed."""

    def __init__(self, spec: JobSpec) -> None:
        self.hosts = (
            {url_host(seed) for seed in spec.seeds}
            if spec.scraper.kind == "simple" and spec.scraper.same_host else None
        )
        self.off_host = 0

    def count(self, items: Iterable[str]) -> Iterator[str]:
        for item in items:
            if self.hosts is not None and url_host(item) not in self.hosts:
                self.off_host += 1
            yield item
