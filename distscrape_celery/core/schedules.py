"""Starting a job's next generation: now (``distscrape run``, a recurring ``distscrape crawl``)
or when its schedule says; and the schedules' control (list, set, pause, resume, delete) (every worker looks on its heartbeat; no process has to stay up for
schedules to fire, and the tracker lets one caller start each due run)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any, Optional

from ..errors import ConfigError, JobNotFound
from ..job.schedule import Schedule, ScheduleSpec
from ..job.spec import JobSpec
from ..tracker import JobState, Tracker
from ..tracker.model import GenerationResult

log = logging.getLogger(__name__)

Publish = Callable[[str, Sequence[str]], None]


def run_again(tracker: Tracker, job: str, publish: Publish) -> GenerationResult:
    """Start ``job``'s next generation now if it is idle (finished or expired); the result says
    whether it started, or why not."""
    info = tracker.job_info(job)
    spec = JobSpec.from_json(tracker.load_spec(job))
    if info.state is JobState.RUNNING and tracker.stats(job).finished:
        # Done, but its end not recorded yet (the maintenance that records it comes with a
        # worker's next heartbeat): recorded now.
        tracker.maintain(job, max_lost=spec.max_lost)
        info = tracker.job_info(job)
    result = tracker.start_generation(job, spec.seeds, generation=info.generation + 1)
    if result.dispatch:
        publish(job, result.dispatch)
    return result


def fire_due(tracker: Tracker, publish: Publish, limit: int = 100) -> list[str]:
    """Start the generation of every job whose schedule is due and which is idle; returns the
    jobs started. A job still running when its run is due starts its next generation as soon as
    it is idle (its due time stays, so runs are never doubled, and one catch-up run stands for
    every run missed); the next due time is the first after the generation's start."""
    started = []
    for job, due in tracker.due_schedules(limit):
        try:
            if _fire(tracker, job, due, publish):
                started.append(job)
        except JobNotFound:  # deleted meanwhile
            tracker.index_schedule(job, None)
        except (ValueError, TypeError) as exc:
            # Not a schedule this version wrote (anyone who can write to Redis could): that job
            # is left alone, and the others still run.
            log.warning("job %s: its schedule cannot be read (%s); it is not run", job, exc)
            tracker.index_schedule(job, None)
    return started


def _fire(tracker: Tracker, job: str, due: str, publish: Publish) -> bool:
    info = tracker.job_info(job)
    if info.schedule is None or info.schedule_paused:
        tracker.index_schedule(job, None)
        return False
    schedule = Schedule.parse(info.schedule)
    spec = JobSpec.from_json(tracker.load_spec(job))
    next_due = schedule.next_after(tracker.now())
    result = tracker.start_generation(job, spec.seeds, generation=info.generation + 1, due=due,
                                      next_due=f"{next_due:.6f}")
    if result.dispatch:
        publish(job, result.dispatch)
    if result.started:
        tracker.index_schedule(job, next_due)
        log.warning("job %s: generation %d started on its schedule (%s); next due at %s",
                    job, result.generation, schedule, _when(next_due))
        return True
    if result.status in ("moved", "early", "current") and result.next_due is not None:
        tracker.index_schedule(job, result.next_due)  # a stale index entry
    return False


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


# -- the schedules' control, one code path for `distscrape schedule` and the job API ---------------


def schedule_rows(tracker: Tracker) -> list[dict[str, Any]]:
    """Every job with a schedule: the schedule, whether it is paused, the job's state and
    generation, and its next run (None while paused)."""
    rows = []
    for job in tracker.jobs():
        try:
            info = tracker.job_info(job)
        except JobNotFound:  # being deleted
            continue
        if info.schedule is None:
            continue
        rows.append({"job": job, "schedule": str(Schedule.parse(info.schedule)),
                     "paused": info.schedule_paused, "state": info.state.value,
                     "generation": info.generation,
                     "next_due": None if info.schedule_paused else info.next_due})
    return rows


def schedule_of(every: Optional[str], cron: Optional[str]) -> Schedule:
    """The schedule of ``every`` (a duration) or ``cron`` (an expression, UTC): exactly one."""
    try:
        return ScheduleSpec(every=every, cron=cron).schedule()
    except ValueError as exc:
        raise ConfigError(f"invalid schedule: {exc}".replace("\n", " ")) from None


def set_schedule(tracker: Tracker, job: str, schedule: Schedule) -> float:
    """Give ``job`` ``schedule`` (or a new one); its next run, the schedule's first time from
    now, which it returns."""
    next_due = schedule.next_after(tracker.now())
    tracker.set_schedule(job, schedule.text, next_due)
    return next_due


def pause_schedule(tracker: Tracker, job: str) -> None:
    """Start no more runs of ``job`` (a run under way goes on)."""
    tracker.pause_schedule(job, True)


def resume_schedule(tracker: Tracker, job: str) -> float:
    """Run ``job`` on its schedule again from its next time from now (missed runs are not made
    up); that time. ConfigError if it has no schedule."""
    info = tracker.job_info(job)
    if info.schedule is None:
        raise ConfigError(f"job {job!r} has no schedule: give it one with distscrape schedule set")
    next_due = Schedule.parse(info.schedule).next_after(tracker.now())
    tracker.pause_schedule(job, False, next_due)
    return next_due


def delete_schedule(tracker: Tracker, job: str) -> None:
    """Remove ``job``'s schedule (the job and its data stay). ConfigError if it has none."""
    if tracker.job_info(job).schedule is None:
        raise ConfigError(f"job {job!r} has no schedule")
    tracker.set_schedule(job, None, None)
