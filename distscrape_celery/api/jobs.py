"""The job routes: create a job from its spec (TOML or JSON) or add seeds to it, list jobs, a
job's status, domains and dead items, pause, resume, cancel, run, retry-dead and delete. Each
calls the function the ``distscrape`` command of that name calls."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from ..core import jobs as job_control
from ..core.schedules import run_again
from ..core.seeding import seed_job, spec_from_data
from ..errors import JobStateError, SpecError
from ..job.spec import JobSpec, tomllib
from ..tracker import JobAction
from ..tracker.base import PRIORITY_MAX
from . import models
from .runtime import Runtime, runtime

router = APIRouter(prefix="/api", tags=["jobs"])

# The media types a spec may come in; TOML is what `distscrape seed --config` reads.
JSON_TYPES = ("application/json",)
TOML_TYPES = ("application/toml", "text/toml", "application/x-toml")
SPEC_BODY = {
    "required": True,
    "description": "The job's spec, as a --config file holds it (seeds included).",
    "content": {
        "application/json": {"schema": {"type": "object"}},
        "application/toml": {"schema": {"type": "string"}},
    },
}
Priority = Annotated[int, Query(ge=-PRIORITY_MAX, le=PRIORITY_MAX,
                                description="the seeds' priority within their domains")]


class NewSeeds(BaseModel):
    """Seeds for a job that exists, taken as its spec stands."""

    model_config = {"extra": "forbid"}

    seeds: list[str] = Field(min_length=1)
    priority: int = Field(0, ge=-PRIORITY_MAX, le=PRIORITY_MAX)


def spec_data(body: bytes, content_type: str) -> dict[str, Any]:
    """The spec's fields from a request body in JSON or TOML; SpecError if it is neither, or
    not a table of fields."""
    media = content_type.split(";", 1)[0].strip().lower()
    try:
        if media in TOML_TYPES:
            data = tomllib.loads(body.decode("utf-8"))
        elif media in JSON_TYPES or not media:
            data = json.loads(body)
        else:
            raise SpecError(f"a spec is JSON or TOML, not {media}",
                            [("(body)", f"a spec is JSON or TOML, not {media}")])
    except (ValueError, UnicodeDecodeError) as exc:  # JSON's and TOML's errors are ValueErrors
        raise SpecError(f"the spec does not parse: {exc}",
                        [("(body)", f"does not parse: {exc}")]) from None
    if not isinstance(data, dict):
        raise SpecError("the spec is not an object", [("(body)", "not an object of fields")])
    return data


def _seeded(job: str, done: Any) -> models.Seeded:
    seeded = done.seeded
    return models.Seeded(
        job=job, created=seeded.created, added=seeded.added, already_seen=seeded.already_seen,
        dispatched=seeded.dispatched, off_host=seeded.off_host,
        schedule=str(done.schedule) if done.schedule is not None else None,
        next_due=done.next_due,
    )


@router.put("/jobs/{job}", response_model=models.Seeded, status_code=status.HTTP_201_CREATED,
            openapi_extra={"requestBody": SPEC_BODY},
            responses={200: {"model": models.Seeded, "description": "the job existed and took "
                                                                    "the spec's seeds"},
                       409: {"model": models.Message, "description": "it exists with another spec"},
                       422: {"model": models.Refused, "description": "an invalid spec"}})
async def create_job(job: str, request: Request, response: Response, priority: Priority = 0,
                     rt: Runtime = runtime) -> models.Seeded:
    """Create JOB from its spec, JSON or TOML by Content-Type (as ``distscrape seed --config``),
    and queue its seeds; a job that exists with the same spec takes the seeds (200)."""
    data = spec_data(await request.body(), request.headers.get("content-type", ""))

    def seed() -> Any:
        # The manager refuses classes and outputs the API's settings do not allow, as seed does.
        return seed_job(rt.tracker, rt.manager, job, spec_from_data(data), priority=priority)

    done = await run_in_threadpool(seed)
    if not done.seeded.created:
        response.status_code = status.HTTP_200_OK
    return _seeded(job, done)


@router.post("/jobs/{job}/seeds", response_model=models.Seeded,
             responses={404: {"model": models.Message}, 422: {"model": models.Refused}})
def add_seeds(job: str, new: NewSeeds, rt: Runtime = runtime) -> models.Seeded:
    """Queue more seeds for JOB, which takes them as its spec stands (``distscrape seed JOB
    SEED...`` with no spec option)."""
    stored = json.loads(rt.tracker.load_spec(job))
    stored["seeds"] = new.seeds
    spec: JobSpec = spec_from_data(stored)
    return _seeded(job, seed_job(rt.tracker, rt.manager, job, spec, priority=new.priority))


@router.get("/jobs", response_model=list[models.JobStatus])
def list_jobs(rt: Runtime = runtime) -> list[dict[str, Any]]:
    """Every job's status (``distscrape jobs --json``)."""
    return job_control.job_rows(rt.tracker)


@router.get("/jobs/{job}", response_model=models.JobStatus,
            responses={404: {"model": models.Message}})
def job_status(job: str, rt: Runtime = runtime) -> dict[str, Any]:
    """JOB's state, times, counts and pages/s (``distscrape status JOB --json``)."""
    rt.tracker.load_spec(job)  # JobNotFound for a job never seeded
    return job_control.job_row(rt.tracker, job)


@router.get("/jobs/{job}/spec", responses={404: {"model": models.Message}})
def job_spec(job: str, rt: Runtime = runtime) -> dict[str, Any]:
    """The spec JOB was created with, as stored in Redis."""
    return json.loads(rt.tracker.load_spec(job))


def _control(rt: Runtime, job: str, action: JobAction) -> models.Controlled:
    res = job_control.control(rt.tracker, rt.manager.publish, job, action)
    return models.Controlled(job=job, before=res.before.value, after=res.after.value)


CONTROL_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"model": models.Message}, 409: {"model": models.Message, "description": "its state "
                                                                                 "does not allow it"}}


@router.post("/jobs/{job}/pause", response_model=models.Controlled, responses=CONTROL_RESPONSES)
def pause(job: str, rt: Runtime = runtime) -> models.Controlled:
    """Hold JOB's new work; what is queued stays, what is in flight ends."""
    return _control(rt, job, JobAction.PAUSE)


@router.post("/jobs/{job}/resume", response_model=models.Controlled, responses=CONTROL_RESPONSES)
def resume(job: str, rt: Runtime = runtime) -> models.Controlled:
    """Let a paused (or cancelled) JOB's work flow again at once."""
    return _control(rt, job, JobAction.RESUME)


@router.post("/jobs/{job}/cancel", response_model=models.Controlled, responses=CONTROL_RESPONSES)
def cancel(job: str, rt: Runtime = runtime) -> models.Controlled:
    """Stop JOB for good: nothing more is fetched; its data stays."""
    return _control(rt, job, JobAction.CANCEL)


@router.post("/jobs/{job}/run", response_model=models.Generation, responses=CONTROL_RESPONSES)
def run(job: str, rt: Runtime = runtime) -> models.Generation:
    """Start JOB's next generation now (``distscrape run``): only a finished or expired job."""
    result = run_again(rt.tracker, job, rt.manager.publish)
    if not result.started:
        raise JobStateError(f"job {job!r} is {result.status}: only a finished job runs again")
    return models.Generation(job=job, generation=result.generation,
                             dispatched=len(result.dispatch))


@router.delete("/jobs/{job}", response_model=models.Deleted, responses=CONTROL_RESPONSES)
def delete(job: str, force: Annotated[bool, Query(description="delete a running or paused "
                                                                "job too")] = False,
           rt: Runtime = runtime) -> models.Deleted:
    """Remove every key of JOB from Redis (its saved output stays): a running or paused job
    only with ``force``."""
    return models.Deleted(job=job, keys=job_control.delete(rt.tracker, job, force))


@router.get("/jobs/{job}/dead", response_model=models.DeadItems,
            responses={404: {"model": models.Message}})
def dead(job: str, limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
         rt: Runtime = runtime) -> models.DeadItems:
    """JOB's dead items with their reasons: the first ``limit`` met, and how many there are
    (``distscrape dead`` lists them all)."""
    items = rt.tracker.dead_items(job, limit=limit)
    return models.DeadItems(job=job, total=rt.tracker.stats(job).dead,
                            items=[models.DeadItem(item=i, reason=r) for i, r in items.items()])


@router.post("/jobs/{job}/retry-dead", response_model=models.Requeued,
             responses={404: {"model": models.Message}})
def retry_dead(job: str, rt: Runtime = runtime) -> models.Requeued:
    """Queue every dead item of JOB again, its failure counts reset."""
    rt.tracker.load_spec(job)
    return models.Requeued(job=job,
                           requeued=job_control.retry_dead(rt.tracker, rt.manager.publish,
                                                           job).requeued)


DomainOrder = Literal["queued", "in_flight", "dead", "mean_fetch", "domain"]


@router.get("/jobs/{job}/domains", response_model=models.Domains,
            responses={404: {"model": models.Message}})
def domains(job: str, sort: DomainOrder = "queued",
            q: Annotated[str, Query(max_length=253, description="only domains holding this")] = "",
            offset: Annotated[int, Query(ge=0)] = 0,
            limit: Annotated[int, Query(ge=1, le=1000)] = 100,
            rt: Runtime = runtime) -> models.Domains:
    """A page of JOB's domains with something queued, in flight or dead, the largest first
    (by ``sort``; by name, A to Z), filtered by ``q``."""
    rows = [d for d in rt.tracker.domain_stats(job) if q.lower() in d.domain]
    if sort == "domain":
        rows.sort(key=lambda d: d.domain)
    else:
        rows.sort(key=lambda d: (-(getattr(d, sort) or 0), d.domain))
    page = rows[offset:offset + limit]
    return models.Domains(job=job, total=len(rows),
                          domains=[models.Domain(**asdict(d)) for d in page])


@router.get("/workers", response_model=list[models.Worker], tags=["workers"])
def workers(rt: Runtime = runtime) -> list[dict[str, Any]]:
    """The live workers (``distscrape workers --json``)."""
    return job_control.worker_rows(rt.tracker)

