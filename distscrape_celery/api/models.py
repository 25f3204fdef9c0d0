"""What the job API answers, as pydantic models: the routes' response models, and so the
schemas of its OpenAPI description. The field names are those of ``distscrape ... --json``."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, Field


class JobStatus(BaseModel):
    """A job's state, times (Unix seconds, the tracker's clock), counts and average pages/s:
    the object ``distscrape status --json`` prints."""

    job: str
    state: str = Field(description="running, paused, cancelled, finished or expired")
    started: Optional[float] = None
    ended: Optional[float] = None
    final: Optional[dict[str, int]] = Field(
        None, description="seen, done and dead when it ended (and queued for an expired job)")
    generation: int
    schedule: Optional[str] = None
    schedule_paused: bool = False
    next_due: Optional[float] = None
    seen: int
    queued: int
    frontier: int
    dispatched: int
    leased: int
    saving: int
    delayed: int
    done: int
    dead: int
    links_cut: int
    unchanged: int
    gone: int
    known: int
    finished: bool
    rate: float = Field(description="pages done a second since it started")


class Seeded(BaseModel):
    """What creating a job (or adding seeds to it) did."""

    job: str
    created: bool = Field(description="false: the job existed and took the seeds")
    added: int = Field(description="items new to the job")
    already_seen: int
    dispatched: int = Field(description="items sent to the workers now")
    off_host: int = Field(description="seeds on none of the job's seeds' hosts: downloaded, "
                                      "their links not followed")
    schedule: Optional[str] = None
    next_due: Optional[float] = None


class Controlled(BaseModel):
    """A job's state before and after a pause, resume or cancel."""

    job: str
    before: str
    after: str


class Deleted(BaseModel):
    job: str
    keys: int = Field(description="Redis keys removed")


class DeadItem(BaseModel):
    item: str
    reason: str


class DeadItems(BaseModel):
    """Dead items with their reasons, the first ``limit`` met in Redis, and how many there are."""

    job: str
    total: int
    items: list[DeadItem]


class Requeued(BaseModel):
    job: str
    requeued: int = Field(description="dead items queued again")


class Generation(BaseModel):
    job: str
    generation: int
    dispatched: int


class Domain(BaseModel):
    """One domain of a job now (queued counts its queue's entries; done items are not counted
    by domain)."""

    domain: str
    queued: int
    in_flight: int
    dead: int
    mean_fetch: Optional[float] = Field(None, description="its fetches' moving mean, seconds")


class Domains(BaseModel):
    """A page of a job's domains, sorted, and how many match the filter."""

    job: str
    total: int
    domains: list[Domain]


class Worker(BaseModel):
    worker: str
    host: str
    pid: int
    concurrency: int
    leased: dict[str, int] = Field(description="items held, by job")
    last_seen: float


class ScheduleRow(BaseModel):
    """A job's schedule: ``distscrape schedule list --json``'s object."""

    job: str
    schedule: str
    paused: bool
    state: str
    generation: int
    next_due: Optional[float] = None


class ScheduleSet(BaseModel):
    """A schedule to give a job: ``every`` (a duration such as 6h) or ``cron`` (five fields,
    UTC), exactly one."""

    model_config = {"extra": "forbid"}

    every: Optional[str] = Field(None, max_length=100, examples=["6h"])
    cron: Optional[str] = Field(None, max_length=200, examples=["0 3 * * *"])


class Problem(BaseModel):
    """One problem with a request, as FastAPI's own validation errors are, with ``field``, the
    spec's field at fault (dotted), when there is one."""

    loc: list[str]
    msg: str
    type: str
    field: Optional[str] = None


class Refused(BaseModel):
    detail: list[Problem]


class Message(BaseModel):
    detail: str
