"""The schedule routes: list, set, pause, resume and delete the schedules that run jobs again,
over the functions ``distscrape schedule`` calls."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ..core import schedules as control
from . import models
from .runtime import Runtime, runtime

router = APIRouter(prefix="/api/schedules", tags=["schedules"])
RESPONSES: dict[int | str, dict[str, Any]] = {404: {"model": models.Message},
                                              422: {"model": models.Refused}}


def _row(rt: Runtime, job: str) -> dict[str, Any]:
    for row in control.schedule_rows(rt.tracker):
        if row["job"] == job:
            return row
    raise AssertionError("a schedule just set or changed is listed")


@router.get("", response_model=list[models.ScheduleRow])
def list_schedules(rt: Runtime = runtime) -> list[dict[str, Any]]:
    """Every job with a schedule (``distscrape schedule list --json``)."""
    return control.schedule_rows(rt.tracker)


@router.put("/{job}", response_model=models.ScheduleRow, responses=RESPONSES)
def set_schedule(job: str, given: models.ScheduleSet, rt: Runtime = runtime) -> dict[str, Any]:
    """Give JOB a schedule (or a new one); its next run is the schedule's first time from now."""
    rt.tracker.load_spec(job)  # JobNotFound for a job never seeded
    control.set_schedule(rt.tracker, job, control.schedule_of(given.every, given.cron))
    return _row(rt, job)


@router.post("/{job}/pause", response_model=models.ScheduleRow, responses=RESPONSES)
def pause_schedule(job: str, rt: Runtime = runtime) -> dict[str, Any]:
    """Start no more runs of JOB (a run under way goes on)."""
    control.pause_schedule(rt.tracker, job)
    return _row(rt, job)


@router.post("/{job}/resume", response_model=models.ScheduleRow, responses=RESPONSES)
def resume_schedule(job: str, rt: Runtime = runtime) -> dict[str, Any]:
    """Run JOB on its schedule again, from its next time from now (missed runs are not made up)."""
    control.resume_schedule(rt.tracker, job)
    return _row(rt, job)


@router.delete("/{job}", response_model=models.Message, responses=RESPONSES)
def delete_schedule(job: str, rt: Runtime = runtime) -> models.Message:
    """Remove JOB's schedule (the job and its data stay)."""
    control.delete_schedule(rt.tracker, job)
    return models.Message(detail=f"job {job}: schedule deleted")
