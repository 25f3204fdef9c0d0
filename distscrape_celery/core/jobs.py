"""Job control, one code path for the ``distscrape`` commands and the job API: a job's figures,
every job's, pause, resume and cancel, retrying dead items, and deleting a job."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import JobNotFound, JobStateError
from ..tracker import ControlResult, JobAction, JobInfo, JobState, JobStats, Tracker
from ..tracker.model import RetryDeadResult

Publish = Callable[[str, Sequence[str]], None]


def job_row(tracker: Tracker, job: str) -> dict[str, Any]:
    """A job's state, times, counts and average pages/s (done over its running time)."""
    info, stats = tracker.job_info(job), tracker.stats(job)
    return {"job": job, **info.to_dict(), **stats.to_dict(), "rate": rate(info, stats)}


def rate(info: JobInfo, stats: JobStats) -> float:
    """Pages done a second since the job started, to its end if it ended."""
    if info.started is None:
        return 0.0
    end = info.ended if info.ended is not None else time.time()
    return round(stats.done / max(end - info.started, 1e-3), 2)


def job_rows(tracker: Tracker) -> list[dict[str, Any]]:
    """:func:`job_row` of every job, a job being deleted left out."""
    rows = []
    for job in tracker.jobs():
        try:
            rows.append(job_row(tracker, job))
        except JobNotFound:  # being deleted: its name goes last
            continue
    return rows


def worker_rows(tracker: Tracker) -> list[dict[str, Any]]:
    """The live workers: ID, host, pid, concurrency, the items each holds by job, last
    heartbeat."""
    held: dict[str, dict[str, int]] = {}
    for job in tracker.active_jobs():
        for worker_id, count in tracker.leased_by_worker(job).items():
            held.setdefault(worker_id, {})[job] = count
    return [
        {"worker": worker.id, "host": worker.host, "pid": worker.pid,
         "concurrency": worker.concurrency, "leased": held.get(worker.id, {}),
         "last_seen": worker.last_seen}
        for worker in tracker.workers() if worker.alive
    ]


def control(tracker: Tracker, publish: Publish, job: str, action: JobAction) -> ControlResult:
    """Apply ``action`` to ``job`` and send the workers what it lets flow (a resumed job's
    items). JobStateError if the job's state does not allow it."""
    res = tracker.control(job, action)
    if res.dispatch:
        publish(job, res.dispatch)
    return res


def retry_dead(tracker: Tracker, publish: Publish, job: str) -> RetryDeadResult:
    """Queue every dead item of ``job`` again, failure counts reset, and send what it lets flow."""
    res = tracker.retry_dead(job)
    if res.dispatch:
        publish(job, res.dispatch)
    return res


def check_deletable(tracker: Tracker, job: str, force: bool) -> None:
    """Refuse to delete a running or paused job (workers still work on it) unless ``force``."""
    state = tracker.job_info(job).state
    if state in (JobState.RUNNING, JobState.PAUSED) and not force:
        raise JobStateError(
            f"job {job!r} is {state.value}: cancel it first (distscrape cancel {job}), "
            "or give --force"
        )


def delete(tracker: Tracker, job: str, force: bool = False) -> int:
    """Remove every key of ``job`` (its saved output stays); the number of keys removed.
    A running or paused job only with ``force`` (:func:`check_deletable`)."""
    check_deletable(tracker, job, force)
    return tracker.delete_job(job)
