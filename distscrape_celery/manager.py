"""The crawl manager: seeds jobs, reports their state, waits for them to finish."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional

from .components import check_components
from .jobspec import JobSpec
from .keys import check_job_name
from .tracker import JobStats, Tracker


@dataclass(frozen=True)
class SeedResult:
    created: bool
    added: int
    dispatched: int


class CrawlManager:
    """Coordinates a job through the tracker; ``publish`` sends scrape tasks for dispatched items."""

    def __init__(self, tracker: Tracker, publish: Callable[[str, Sequence[str]], None]) -> None:
        self.tracker = tracker
        self.publish = publish

    def seed(self, job: str, spec: JobSpec) -> SeedResult:
        """Store the job's spec (workers on every host read it by name) and queue its seeds.
        Seeding the same job with the same spec again adds nothing and is harmless."""
        check_job_name(job)
        check_components(spec)
        created = self.tracker.create_job(job, spec.to_json(), spec.crawl_limits())
        res = self.tracker.add(job, spec.seeds, depth=0)
        if res.dispatch:
            self.publish(job, res.dispatch)
        return SeedResult(created=created, added=res.added, dispatched=len(res.dispatch))

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
        """Poll until the job is finished and return its final stats. ``check`` may raise to
        abort (e.g. when the local workers died). Raises TimeoutError after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            stats = self.tracker.stats(job)
            if on_progress is not None:
                on_progress(stats)
            if stats.finished:
                return stats
            if check is not None:
                check()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job!r} did not finish within {timeout:.0f}s: {stats.to_dict()}")
            time.sleep(poll)
