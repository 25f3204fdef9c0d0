"""The live streams (server-sent events): every job's status, or one job's, each second. A
stream ends when its job ends (finished, cancelled or expired) or is deleted. Authenticated
by the ``Authorization`` header like every route, so a client reads it with fetch(), not
EventSource (which cannot send one): no secret goes in a URL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.sse import EventSourceResponse, ServerSentEvent

from ..core import jobs as job_control
from ..errors import JobNotFound
from . import models
from .runtime import Runtime, runtime

router = APIRouter(prefix="/api", tags=["stream"])
ENDED = ("finished", "cancelled", "expired")
Interval = Annotated[float, Query(ge=0.2, le=60, description="seconds between two events")]
# How long a client waits before it reconnects, milliseconds.
RETRY_MS = 2000


def _existing(job: str, rt: Runtime = runtime) -> str:
    """``job``, checked before the stream starts: JobNotFound (404) for a job never seeded."""
    rt.tracker.load_spec(job)
    return job


@router.get("/events", response_class=EventSourceResponse,
            responses={200: {"description": "`jobs` events: every job's status, a list"}})
async def every_job(interval: Interval = 1.0, rt: Runtime = runtime) -> AsyncIterator[Any]:
    """Every job's status (a list of JobStatus, the ``jobs`` event) each ``interval``."""
    while True:
        rows = await run_in_threadpool(job_control.job_rows, rt.tracker)
        yield ServerSentEvent(event="jobs", data=rows, retry=RETRY_MS)
        await asyncio.sleep(interval)


@router.get("/jobs/{job}/events", response_class=EventSourceResponse,
            responses={200: {"description": "`status` events (a JobStatus) each interval; an "
                                            "`end` event (the last JobStatus) when the job "
                                            "ends, or `gone` when it is deleted; then the "
                                            "stream closes"},
                       404: {"model": models.Message}})
async def one_job(job: Annotated[str, Depends(_existing)], interval: Interval = 1.0,
                  rt: Runtime = runtime) -> AsyncIterator[Any]:
    """JOB's status (the ``status`` event) each ``interval`` until it ends."""
    while True:
        try:
            row = await run_in_threadpool(job_control.job_row, rt.tracker, job)
        except JobNotFound:
            yield ServerSentEvent(event="gone", data={"job": job})
            return
        if row["state"] in ENDED:
            yield ServerSentEvent(event="end", data=row)
            return
        yield ServerSentEvent(event="status", data=row, retry=RETRY_MS)
        await asyncio.sleep(interval)
