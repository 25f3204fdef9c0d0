"""The tracker interface: the central authority on workers, jobs and the state of every item.

Item life cycle (every seen item is in exactly one state, so none can be lost)::

    add -> queued -(dispatch)-> dispatched -(checkout)-> leased -(complete)-> done
                ^                    |                     |  \\-(fail, retries left)-> queued
                \\--(reclaim: deadline passed)-------------/   \\-(fail, no retries)----> dead

Dispatched and leased items carry a deadline; a live worker's heartbeat extends the deadlines of
the items it holds, and any worker's maintenance reclaims items whose deadline passed.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

# A Lua call handles at most this many items, so no batch can overflow the Lua stack or block Redis.
MAX_ADD_BATCH = 500
# Most items handed out for dispatch by one call.
MAX_DISPATCH_BATCH = 200
# Most items reclaimed from one in-flight set by one maintenance call.
MAX_RECLAIM_BATCH = 1000


class LeaseStatus(str, enum.Enum):
    """Result of :meth:`Tracker.checkout`."""

    OK = "ok"  # the caller holds the lease now
    BUSY = "busy"  # another worker holds a live lease
    DONE = "done"  # already done: a redelivered duplicate, nothing to do
    DEAD = "dead"  # given up on
    UNKNOWN = "unknown"  # never added to this job


class FailOutcome(str, enum.Enum):
    RETRY = "retry"
    DEAD = "dead"
    IGNORED = "ignored"


@dataclass(frozen=True)
class Checkout:
    status: LeaseStatus
    depth: int
    failed_attempts: int
    dispatch: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Dispatchable:
    """Result of a tracker call that may also hand out items to publish as tasks."""

    dispatch: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class AddResult(Dispatchable):
    added: int = 0


@dataclass(frozen=True)
class CompleteResult(Dispatchable):
    changed: bool = False


@dataclass(frozen=True)
class FailResult(Dispatchable):
    outcome: FailOutcome = FailOutcome.IGNORED


@dataclass(frozen=True)
class MaintainResult(Dispatchable):
    reclaimed: int = 0
    died: int = 0


@dataclass(frozen=True)
class JobStats:
    """Counts of a job's items by state. ``queued`` includes dispatched items."""

    seen: int
    frontier: int
    dispatched: int
    leased: int
    done: int
    dead: int

    @property
    def queued(self) -> int:
        return self.frontier + self.dispatched

    @property
    def started(self) -> bool:
        return self.seen > 0

    @property
    def finished(self) -> bool:
        return self.started and self.queued == 0 and self.leased == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "seen": self.seen,
            "queued": self.queued,
            "frontier": self.frontier,
            "dispatched": self.dispatched,
            "leased": self.leased,
            "done": self.done,
            "dead": self.dead,
            "finished": self.finished,
        }


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    host: str
    pid: int
    concurrency: int
    last_seen: Optional[float]
    alive: bool


class Tracker(ABC):
    """Central authority for a crawl: hands out worker IDs, leases items, deduplicates new items.

    Every method is atomic. Item methods that free a dispatch slot also return items to publish
    as tasks (``.dispatch``); the caller must publish each of them once. The broker then holds at
    most ``dispatch_factor`` x the live workers' concurrency messages per job.
    """

    def __init__(self, *, lease_seconds: float = 60.0, dispatch_factor: int = 2) -> None:
        self.lease_seconds = float(lease_seconds)
        self.dispatch_factor = int(dispatch_factor)

    # -- workers ---------------------------------------------------------------------------

    @abstractmethod
    def register_worker(self, host: str, pid: int, concurrency: int) -> str:
        """Give a starting worker its unique ID and count it as alive."""

    @abstractmethod
    def heartbeat(self, worker_id: str) -> None:
        """Record that ``worker_id`` is alive."""

    @abstractmethod
    def deregister_worker(self, worker_id: str) -> None:
        """A worker is stopping cleanly: stop counting it as alive."""

    @abstractmethod
    def workers(self) -> list[WorkerInfo]:
        """Every worker ever registered, alive or not."""

    @abstractmethod
    def dispatch_bound(self) -> int:
        """Most scrape messages of one job the broker may hold now (0 with no live worker)."""

    # -- jobs ------------------------------------------------------------------------------

    @abstractmethod
    def create_job(self, job: str, spec_json: str) -> bool:
        """Store a job's spec. True if created; False if it exists with the same spec.
        Raises :class:`~distscrape_celery.errors.JobConflict` if it exists with another spec."""

    @abstractmethod
    def load_spec(self, job: str) -> str:
        """The job's spec JSON. Raises :class:`~distscrape_celery.errors.JobNotFound`."""

    @abstractmethod
    def jobs(self) -> list[str]:
        """Names of all seeded jobs."""

    # -- items -----------------------------------------------------------------------------

    @abstractmethod
    def add(self, job: str, items: Sequence[str], depth: int = 0) -> AddResult:
        """Deduplicate ``items`` against everything the job has seen and queue the new ones."""

    @abstractmethod
    def checkout(self, job: str, item: str, worker_id: str) -> Checkout:
        """Lease ``item`` to ``worker_id`` until ``lease_seconds`` from now."""

    @abstractmethod
    def complete(self, job: str, item: str) -> CompleteResult:
        """Mark ``item`` done. Idempotent; a done item is never leased again."""

    @abstractmethod
    def fail(
        self, job: str, item: str, reason: str, *, max_retries: int, retryable: bool = True,
        count: bool = True,
    ) -> FailResult:
        """Record a failed attempt: queue ``item`` again, or make it dead with ``reason``."""

    @abstractmethod
    def extend(self, job: str, items: Sequence[str]) -> int:
        """Move the deadlines of in-flight ``items`` to ``lease_seconds`` from now."""

    @abstractmethod
    def maintain(self, job: str, *, max_retries: int) -> MaintainResult:
        """Reclaim items whose deadline passed and top up dispatch."""

    @abstractmethod
    def stats(self, job: str) -> JobStats:
        """Counts of the job's items by state."""

    @abstractmethod
    def dead_items(self, job: str, limit: int = 100) -> dict[str, str]:
        """Up to ``limit`` dead items with the reason each was given up on."""
