"""InMemoryTracker: the same contract as RedisTracker, in one process, for small crawls and tests."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from ..errors import JobConflict, JobNotFound
from ..keys import check_job_name
from .base import (
    MAX_DISPATCH_BATCH,
    MAX_RECLAIM_BATCH,
    AddResult,
    Checkout,
    CompleteResult,
    FailOutcome,
    FailResult,
    JobStats,
    LeaseStatus,
    MaintainResult,
    Tracker,
    WorkerInfo,
)

QUEUED, DISPATCHED, LEASED, DONE, DEAD = "q", "d", "l", "D", "X"


@dataclass
class _Job:
    spec: str
    state: dict[str, str] = field(default_factory=dict)  # item -> state letter
    depth: dict[str, int] = field(default_factory=dict)
    frontier: deque = field(default_factory=deque)  # may hold stale entries, as in Redis
    dispatched: dict[str, float] = field(default_factory=dict)  # item -> deadline
    leased: dict[str, float] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)
    fails: dict[str, int] = field(default_factory=dict)
    dead: dict[str, str] = field(default_factory=dict)
    queued: int = 0
    done: int = 0


class InMemoryTracker(Tracker):
    """Tracker state in Python dicts behind one lock. Not shared between processes."""

    def __init__(
        self, *, lease_seconds: float = 60.0, dispatch_factor: int = 2, clock=time.monotonic
    ) -> None:
        super().__init__(lease_seconds=lease_seconds, dispatch_factor=dispatch_factor)
        self._lock = threading.Lock()
        self._clock = clock
        self._jobs: dict[str, _Job] = {}
        self._workers: dict[str, tuple[str, int, int]] = {}
        self._beats: dict[str, float] = {}
        self._seq = 0

    # -- workers ---------------------------------------------------------------------------

    def register_worker(self, host: str, pid: int, concurrency: int) -> str:
        with self._lock:
            self._seq += 1
            worker_id = f"w{self._seq}"
            self._workers[worker_id] = (host, pid, concurrency)
            self._beats[worker_id] = self._clock()
            return worker_id

    def heartbeat(self, worker_id: str) -> None:
        with self._lock:
            self._beats[worker_id] = self._clock()

    def deregister_worker(self, worker_id: str) -> None:
        with self._lock:
            self._beats.pop(worker_id, None)

    def workers(self) -> list[WorkerInfo]:
        with self._lock:
            now = self._clock()
            return [
                WorkerInfo(
                    id=wid, host=host, pid=pid, concurrency=conc, last_seen=self._beats.get(wid),
                    alive=wid in self._beats and now - self._beats[wid] <= self.lease_seconds,
                )
                for wid, (host, pid, conc) in self._workers.items()
            ]

    def dispatch_bound(self) -> int:
        with self._lock:
            return self._bound_locked()

    def _bound_locked(self) -> int:
        now = self._clock()
        total = sum(
            self._workers[wid][2]
            for wid, seen in self._beats.items()
            if now - seen <= self.lease_seconds
        )
        return total * self.dispatch_factor

    # -- jobs ------------------------------------------------------------------------------

    def create_job(self, job: str, spec_json: str) -> bool:
        check_job_name(job)
        with self._lock:
            existing = self._jobs.get(job)
            if existing is None:
                self._jobs[job] = _Job(spec=spec_json)
                return True
            if json.loads(existing.spec) != json.loads(spec_json):
                raise JobConflict(
                    f"job {job!r} already exists with a different spec; pick another job name"
                )
            return False

    def _job(self, job: str) -> _Job:
        try:
            return self._jobs[job]
        except KeyError:
            raise JobNotFound(f"no job named {job!r} in this process") from None

    def load_spec(self, job: str) -> str:
        with self._lock:
            return self._job(job).spec

    def jobs(self) -> list[str]:
        with self._lock:
            return sorted(self._jobs)

    # -- items -----------------------------------------------------------------------------

    def _take_for_dispatch(self, j: _Job, now: float) -> list[str]:
        room = min(self._bound_locked() - len(j.dispatched), MAX_DISPATCH_BATCH)
        out: list[str] = []
        while room > 0 and j.frontier:
            item = j.frontier.popleft()
            if j.state.get(item) == QUEUED:
                j.state[item] = DISPATCHED
                j.dispatched[item] = now + self.lease_seconds
                j.queued -= 1
                out.append(item)
                room -= 1
        return out

    def _clear_inflight(self, j: _Job, item: str) -> None:
        j.dispatched.pop(item, None)
        j.leased.pop(item, None)
        j.owners.pop(item, None)

    def add(self, job: str, items: Sequence[str], depth: int = 0) -> AddResult:
        with self._lock:
            j = self._job(job)
            added = 0
            for item in items:
                if item not in j.state:
                    j.state[item] = QUEUED
                    j.depth[item] = depth
                    j.frontier.append(item)
                    added += 1
            j.queued += added
            return AddResult(dispatch=self._take_for_dispatch(j, self._clock()), added=added)

    def checkout(self, job: str, item: str, worker_id: str) -> Checkout:
        with self._lock:
            j = self._job(job)
            state = j.state.get(item)
            if state is None:
                return Checkout(LeaseStatus.UNKNOWN, 0, 0)
            depth, fails = j.depth[item], j.fails.get(item, 0)
            if state == DONE:
                return Checkout(LeaseStatus.DONE, depth, fails)
            if state == DEAD:
                return Checkout(LeaseStatus.DEAD, depth, fails)
            now = self._clock()
            if state == LEASED and j.leased[item] > now:
                return Checkout(LeaseStatus.BUSY, depth, fails)
            if state == QUEUED:
                j.queued -= 1
            j.dispatched.pop(item, None)
            j.leased[item] = now + self.lease_seconds
            j.owners[item] = worker_id
            j.state[item] = LEASED
            return Checkout(LeaseStatus.OK, depth, fails, self._take_for_dispatch(j, now))

    def complete(self, job: str, item: str) -> CompleteResult:
        with self._lock:
            j = self._job(job)
            state = j.state.get(item)
            changed = state in (QUEUED, DISPATCHED, LEASED)
            if changed:
                if state == QUEUED:
                    j.queued -= 1
                self._clear_inflight(j, item)
                j.state[item] = DONE
                j.fails.pop(item, None)
                j.done += 1
            return CompleteResult(dispatch=self._take_for_dispatch(j, self._clock()), changed=changed)

    def fail(
        self, job: str, item: str, reason: str, *, max_retries: int, retryable: bool = True,
        count: bool = True,
    ) -> FailResult:
        with self._lock:
            j = self._job(job)
            state = j.state.get(item)
            outcome = FailOutcome.IGNORED
            if state in (QUEUED, DISPATCHED, LEASED):
                if count:
                    j.fails[item] = j.fails.get(item, 0) + 1
                if state == QUEUED:
                    j.queued -= 1
                self._clear_inflight(j, item)
                if retryable and j.fails.get(item, 0) <= max_retries:
                    j.state[item] = QUEUED
                    j.frontier.append(item)
                    j.queued += 1
                    outcome = FailOutcome.RETRY
                else:
                    self._make_dead(j, item, reason[:2000])
                    outcome = FailOutcome.DEAD
            return FailResult(dispatch=self._take_for_dispatch(j, self._clock()), outcome=outcome)

    @staticmethod
    def _make_dead(j: _Job, item: str, reason: str) -> None:
        j.state[item] = DEAD
        j.dead[item] = reason

    def extend(self, job: str, items: Sequence[str]) -> int:
        with self._lock:
            j = self._job(job)
            deadline = self._clock() + self.lease_seconds
            n = 0
            for item in items:
                for inflight in (j.leased, j.dispatched):
                    if item in inflight:
                        inflight[item] = deadline
                        n += 1
            return n

    def maintain(self, job: str, *, max_retries: int) -> MaintainResult:
        with self._lock:
            j = self._job(job)
            now = self._clock()
            reclaimed = died = 0
            expired = sorted((d, i) for i, d in j.leased.items() if d <= now)[:MAX_RECLAIM_BATCH]
            for _, item in expired:
                owner = j.owners.get(item, "?")
                self._clear_inflight(j, item)
                j.fails[item] = j.fails.get(item, 0) + 1
                if j.fails[item] <= max_retries:
                    self._requeue_front(j, item)
                    reclaimed += 1
                else:
                    self._make_dead(
                        j, item, f"lease expired too often (last holder {owner} died or hung)"
                    )
                    died += 1
            expired = sorted((d, i) for i, d in j.dispatched.items() if d <= now)[:MAX_RECLAIM_BATCH]
            for _, item in expired:
                self._clear_inflight(j, item)
                self._requeue_front(j, item)
                reclaimed += 1
            return MaintainResult(
                dispatch=self._take_for_dispatch(j, now), reclaimed=reclaimed, died=died
            )

    @staticmethod
    def _requeue_front(j: _Job, item: str) -> None:
        j.state[item] = QUEUED
        j.frontier.appendleft(item)
        j.queued += 1

    def stats(self, job: str) -> JobStats:
        with self._lock:
            j = self._job(job)
            return JobStats(
                seen=len(j.state), frontier=j.queued, dispatched=len(j.dispatched),
                leased=len(j.leased), done=j.done, dead=len(j.dead),
            )

    def dead_items(self, job: str, limit: int = 100) -> dict[str, str]:
        with self._lock:
            j = self._job(job)
            return dict(list(j.dead.items())[:limit])
