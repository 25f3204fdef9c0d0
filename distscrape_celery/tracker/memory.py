"""InMemoryTracker: the same contract as RedisTracker, in one process, for small crawls and tests."""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Optional

from ..errors import JobNotFound, JobStateError
from .keys import check_job_name, domain_of
from .staging import InMemoryBodyStaging
from .base import (
    MAX_ADD_BATCH,
    MAX_DISPATCH_BATCH,
    MAX_REASON,
    MAX_RECLAIM_BATCH,
    WAKE_WHILE_LEASED,
    AddResult,
    Checkout,
    CompleteResult,
    ControlResult,
    CrawlLimits,
    FailOutcome,
    FailResult,
    Fault,
    JobAction,
    JobInfo,
    JobState,
    JobStats,
    LeaseStatus,
    MaintainResult,
    RetryDeadResult,
    SaveBegin,
    SaveStart,
    ScrapedResult,
    Tracker,
    WorkerInfo,
    check_save_as,
    job_conflict,
    spec_differences,
)

QUEUED, DELAYED, DISPATCHED, LEASED = "q", "w", "d", "l"
_HELD = (JobState.PAUSED, JobState.CANCELLED)  # dispatch nothing
_MAINTAINED = (JobState.RUNNING, JobState.PAUSED)
SAVE_PENDING, SAVING, DEAD = "s", "S", "X"


@dataclass
class _Job:
    spec: str
    limits: CrawlLimits
    # Every item ever added (Redis keeps the live ones by name and the done ones by fingerprint),
    # and the live ones' state letters and depths: a done item is only in `seen`.
    seen: set[str] = field(default_factory=set)
    state: dict[str, str] = field(default_factory=dict)  # live item -> state letter
    depth: dict[str, int] = field(default_factory=dict)
    # The structures of _lib.lua: domain queues (may hold stale entries, as in Redis; an empty
    # one is removed), domain -> next turn (the domains with queued items and room), in-flight
    # counts, fetch slots, items added per domain, robots.txt Crawl-delays, backed-off items.
    queues: dict[str, deque] = field(default_factory=dict)
    domains: dict[str, float] = field(default_factory=dict)
    inflight: dict[str, int] = field(default_factory=dict)
    slots: dict[str, float] = field(default_factory=dict)
    dseen: dict[str, int] = field(default_factory=dict)
    crawl_delays: dict[str, float] = field(default_factory=dict)
    delayed: dict[str, float] = field(default_factory=dict)  # item -> due
    dispatched: dict[str, float] = field(default_factory=dict)  # item -> deadline
    leased: dict[str, float] = field(default_factory=dict)  # scraping or saving
    pending: dict[str, float] = field(default_factory=dict)  # save message waiting
    owners: dict[str, tuple[str, int]] = field(default_factory=dict)  # -> (worker, token)
    fails: dict[str, int] = field(default_factory=dict)
    lost: dict[str, int] = field(default_factory=dict)
    dead: dict[str, str] = field(default_factory=dict)
    queued: int = 0  # items in state q
    done: int = 0
    links_cut: int = 0  # links past max_links_per_page, never added
    info: JobInfo = JobInfo(job="", state=JobState.RUNNING)  # state, times, final figures


class InMemoryTracker(Tracker):
    """Tracker state in Python dicts behind one lock. Not shared between processes."""

    def __init__(
        self, *, lease_seconds: float = 60.0, dispatch_factor: int = 2,
        save_timeout: Optional[float] = None, body_ttl: Optional[float] = None, clock=time.monotonic,
    ) -> None:
        super().__init__(
            lease_seconds=lease_seconds, dispatch_factor=dispatch_factor, save_timeout=save_timeout,
            body_ttl=body_ttl,
        )
        # Where scraped stages bodies: the in-memory runtime's staging reads them here. Bodies
        # do not expire in memory (complete drops them; a crash loses them with everything).
        self.bodies = InMemoryBodyStaging()
        self._lock = threading.Lock()
        self._clock = clock
        self._jobs: dict[str, _Job] = {}
        self._workers: dict[str, tuple[str, int, int]] = {}
        self._beats: dict[str, float] = {}
        self._seq = 0
        self._tokens = 0

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
            if worker_id in self._beats:  # dead at once, pruned like any dead worker
                self._beats[worker_id] = self._clock() - self.lease_seconds - 0.001

    def prune_workers(self, max_age: float) -> list[str]:
        with self._lock:
            now = self._clock()
            old = [wid for wid, seen in self._beats.items() if seen <= now - max_age]
            for wid in old:
                del self._beats[wid]
                self._workers.pop(wid, None)
            return old

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

    def create_job(self, job: str, spec_json: str, limits: Optional[CrawlLimits] = None) -> bool:
        check_job_name(job)
        with self._lock:
            existing = self._jobs.get(job)
            if existing is None:
                self._jobs[job] = _Job(
                    spec=spec_json, limits=limits or CrawlLimits(),
                    info=JobInfo(job=job, state=JobState.RUNNING, started=self._clock()),
                )
                return True
            differences = spec_differences(existing.spec, spec_json)
            if differences:
                raise job_conflict(job, differences)
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

    def active_jobs(self) -> list[str]:
        with self._lock:
            return sorted(name for name, j in self._jobs.items() if j.info.state in _MAINTAINED)

    def job_info(self, job: str) -> JobInfo:
        with self._lock:
            return self._job(job).info

    def control(self, job: str, action: JobAction) -> ControlResult:
        """The transitions of control.lua."""
        action = JobAction(action)
        with self._lock:
            j = self._job(job)
            before = j.info.state
            if before is JobState.FINISHED and action is not JobAction.RESUME:
                raise JobStateError(f"job {job!r}: the job is finished")
            now = self._clock()
            if action is JobAction.PAUSE and before is JobState.RUNNING:
                j.info = replace(j.info, state=JobState.PAUSED)
            elif action is JobAction.CANCEL and before is not JobState.CANCELLED:
                self._record_end(j, JobState.CANCELLED, now)
            elif action is JobAction.RESUME and before in _HELD:
                j.info = replace(j.info, state=JobState.RUNNING, ended=None)
            return ControlResult(dispatch=self._take_for_dispatch(j, now), before=before,
                                 after=j.info.state)

    @staticmethod
    def _record_end(j: _Job, state: JobState, now: float) -> None:
        final = {"seen": len(j.seen), "done": j.done, "dead": len(j.dead)}
        j.info = replace(j.info, state=state, ended=now, final=final)

    @staticmethod
    def _reactivate(j: _Job) -> None:
        if j.info.state is JobState.FINISHED:
            j.info = replace(j.info, state=JobState.RUNNING, ended=None)

    def delete_job(self, job: str) -> int:
        with self._lock:
            self._job(job)
            del self._jobs[job]
            return 1

    def set_domain_delay(self, job: str, domain: str, seconds: float) -> None:
        with self._lock:
            delays = self._job(job).crawl_delays
            if seconds > 0:
                delays[domain] = float(seconds)
            else:
                delays.pop(domain, None)

    # -- items -----------------------------------------------------------------------------

    # The domain rules of _lib.lua, step for step.

    @staticmethod
    def _domain(j: _Job, item: str) -> str:
        return domain_of(item, j.limits.id_domain)

    @staticmethod
    def _limits(j: _Job, dom: str) -> tuple[float, int]:
        lim = j.limits.for_domain(dom)
        return max(lim.interval, j.crawl_delays.get(dom, 0.0)), lim.concurrency

    def _schedule(self, j: _Job, dom: str, now: float) -> None:
        interval, cap = self._limits(j, dom)
        if j.inflight.get(dom, 0) < cap:
            j.domains.setdefault(dom, max(now, j.slots.get(dom, 0.0)) if interval > 0 else now)

    def _vacate(self, j: _Job, dom: str, now: float) -> None:
        n = j.inflight.get(dom, 0) - 1
        if n <= 0:
            j.inflight.pop(dom, None)
        else:
            j.inflight[dom] = n
        if j.queues.get(dom):
            self._schedule(j, dom, now)

    def _occupy(self, j: _Job, dom: str) -> None:
        j.inflight[dom] = j.inflight.get(dom, 0) + 1
        if j.inflight[dom] >= self._limits(j, dom)[1]:
            j.domains.pop(dom, None)

    def _enqueue(self, j: _Job, item: str, front: bool, now: float) -> None:
        dom = self._domain(j, item)
        queue = j.queues.setdefault(dom, deque())
        if front:
            queue.appendleft(item)
        else:
            queue.append(item)
        self._schedule(j, dom, now)

    def _pop_queued(self, j: _Job, dom: str) -> Optional[str]:
        queue = j.queues.get(dom)
        item = None
        while queue:
            candidate = queue.popleft()
            if j.state.get(candidate) == QUEUED:
                item = candidate
                break
        if queue is not None and not queue:
            del j.queues[dom]
        return item

    def _take_for_dispatch(self, j: _Job, now: float) -> list[str]:
        due = sorted((d, i) for i, d in j.delayed.items() if d <= now)[:MAX_DISPATCH_BATCH]
        for _, item in due:
            del j.delayed[item]
            j.state[item] = QUEUED
            j.queued += 1
            self._enqueue(j, item, False, now)
        room = min(self._bound_locked() - len(j.dispatched) - len(j.pending), MAX_DISPATCH_BATCH)
        out: list[str] = []
        if room <= 0 or j.info.state in _HELD:
            return out
        while room > 0:
            # Longest waiting first, ties by name: a Redis zset's order.
            doms = [d for _, d in sorted((s, d) for d, s in j.domains.items() if s <= now)][:room]
            if not doms:
                break
            for dom in doms:
                if room == 0:
                    break
                item = self._pop_queued(j, dom)
                if item is None:
                    j.domains.pop(dom, None)
                    continue
                j.state[item] = DISPATCHED
                j.dispatched[item] = now + self.lease_seconds
                j.queued -= 1
                out.append(item)
                room -= 1
                interval, cap = self._limits(j, dom)
                j.inflight[dom] = j.inflight.get(dom, 0) + 1
                if j.inflight[dom] >= cap or not j.queues.get(dom):
                    j.domains.pop(dom, None)
                else:
                    j.domains[dom] = now + interval
        return out

    def _clear_inflight(self, j: _Job, item: str, now: float) -> None:
        j.dispatched.pop(item, None)
        j.leased.pop(item, None)
        j.pending.pop(item, None)
        j.delayed.pop(item, None)
        j.owners.pop(item, None)
        if j.state[item] in (DISPATCHED, LEASED):
            self._vacate(j, self._domain(j, item), now)

    def _requeue(self, j: _Job, item: str, front: bool, now: float) -> None:
        if j.state[item] == QUEUED:
            return
        self._clear_inflight(j, item, now)
        j.state[item] = QUEUED
        j.queued += 1
        self._enqueue(j, item, front, now)

    def _delay_until(self, j: _Job, item: str, due: float, now: float) -> None:
        if j.state[item] == QUEUED:
            j.queued -= 1
        self._clear_inflight(j, item, now)
        j.state[item] = DELAYED
        j.delayed[item] = due

    def _give_up(self, j: _Job, item: str, reason: str, now: float) -> None:
        if j.state[item] == QUEUED:
            j.queued -= 1
        self._clear_inflight(j, item, now)
        j.state[item] = DEAD
        j.dead[item] = reason[:MAX_REASON]

    def _retry_or_dead(
        self, j: _Job, item: str, fault: Fault, *, retryable: bool, max_retries: int,
        max_lost: int, reason: str, front: bool, now: float, delay: float = 0.0,
    ) -> FailOutcome:
        """The one retry-or-dead rule (as ``retry_or_dead`` in _lib.lua)."""
        over = False
        if fault is Fault.ITEM:
            j.fails[item] = j.fails.get(item, 0) + 1
            over = j.fails[item] > max_retries
        elif fault is Fault.LOST:
            j.lost[item] = j.lost.get(item, 0) + 1
            over = j.lost[item] > max_lost
        if retryable and not over:
            if delay > 0:
                self._delay_until(j, item, now + delay, now)
            else:
                self._requeue(j, item, front, now)
            return FailOutcome.RETRY
        self._give_up(j, item, reason, now)
        return FailOutcome.DEAD

    def add(self, job: str, items: Sequence[str], depth: int = 0) -> AddResult:
        with self._lock:
            j = self._job(job)
            now = self._clock()
            added = self._add_locked(j, items, depth, now)
            return AddResult(dispatch=self._take_for_dispatch(j, now), added=added)

    def _add_locked(self, j: _Job, items: Sequence[str], depth: int, now: float) -> int:
        """Queue the new ones among ``items``, within max_pages and max_pages_per_domain."""
        max_pages, per_domain = j.limits.max_pages, j.limits.max_pages_per_domain
        room = max_pages - len(j.seen) if max_pages is not None else None
        added = 0
        for item in items:
            if room is not None and added >= room:
                break
            dom = self._domain(j, item)
            if per_domain is not None and j.dseen.get(dom, 0) >= per_domain:
                continue
            if item not in j.seen:
                j.seen.add(item)
                if per_domain is not None:
                    j.dseen[dom] = j.dseen.get(dom, 0) + 1
                j.state[item] = QUEUED
                j.depth[item] = depth
                self._enqueue(j, item, False, now)
                added += 1
        j.queued += added
        if added:
            self._reactivate(j)
        return added

    def checkout(self, job: str, item: str, worker_id: str, *, max_lost: int) -> Checkout:
        with self._lock:
            j = self._job(job)
            state = j.state.get(item)
            if state is None:  # done (its depth forgotten, as in Redis) or never added
                return Checkout(LeaseStatus.DONE if item in j.seen else LeaseStatus.UNKNOWN, 0, 0)
            depth, fails = j.depth[item], j.fails.get(item, 0)
            if state == DEAD:
                return Checkout(LeaseStatus.DEAD, depth, fails)
            if state in (SAVE_PENDING, DELAYED):
                return Checkout(LeaseStatus.BUSY, depth, fails)
            now = self._clock()
            if state in (LEASED, SAVING):
                if j.leased[item] > now:
                    return Checkout(LeaseStatus.BUSY, depth, fails)
                was = j.owners.get(item, ("?", 0))[0]
                outcome = self._retry_or_dead(
                    j, item, Fault.LOST, retryable=True, max_retries=0, max_lost=max_lost,
                    reason=f"its worker vanished too often (last holder {was})", front=True,
                    now=now,
                )
                if outcome is FailOutcome.DEAD:
                    return Checkout(LeaseStatus.DEAD, depth, fails)
                state = QUEUED
            dom = self._domain(j, item)
            if j.info.state in _HELD:
                if state == DISPATCHED:
                    self._back_to_queue(j, item, dom, now)
                return Checkout(LeaseStatus.HELD, depth, fails)
            interval, cap = self._limits(j, dom)
            slot = j.slots.get(dom, 0.0) if interval > 0 else 0.0
            if slot > now or (state == QUEUED and j.inflight.get(dom, 0) >= cap):
                if state == DISPATCHED:
                    self._back_to_queue(j, item, dom, now)
                if slot > now and dom in j.domains:
                    j.domains[dom] = max(j.domains[dom], slot)
                return Checkout(
                    LeaseStatus.THROTTLED, depth, fails, dispatch=self._take_for_dispatch(j, now),
                    wait=max(slot - now, 0.0),
                )
            if interval > 0:
                j.slots[dom] = now + interval
            if state == QUEUED:
                j.queued -= 1
                self._occupy(j, dom)
            self._tokens += 1
            j.dispatched.pop(item, None)
            j.leased[item] = now + self.lease_seconds
            j.owners[item] = (worker_id, self._tokens)
            j.state[item] = LEASED
            return Checkout(
                LeaseStatus.OK, depth, fails, self._tokens, self._take_for_dispatch(j, now)
            )

    def _back_to_queue(self, j: _Job, item: str, dom: str, now: float) -> None:
        """A dispatched item goes back to the head of its queue (as in checkout.lua)."""
        del j.dispatched[item]
        j.state[item] = QUEUED
        j.queued += 1
        j.queues.setdefault(dom, deque()).appendleft(item)
        self._vacate(j, dom, now)

    def _holds(self, j: _Job, item: str, token: int) -> bool:
        return item in j.owners and j.owners[item][1] == int(token)

    def scraped(
        self, job: str, item: str, token: int, found: Sequence[str] = (), depth: int = 0,
        body: Optional[bytes] = None, save_as: Optional[str] = None, keep_as: Optional[str] = None,
        cut: int = 0,
    ) -> ScrapedResult:
        check_save_as(body, save_as, keep_as)
        with self._lock:
            j = self._job(job)
            now = self._clock()
            added = self._add_locked(j, found, depth, now)
            j.links_cut += cut
            held = j.state.get(item) == LEASED and self._holds(j, item, token)
            if held:
                self._vacate(j, self._domain(j, item), now)
                if save_as is not None:  # its holder saves it now, under a lease
                    j.leased[item] = now + self.lease_seconds
                    j.owners[item] = (save_as, int(token))
                    j.state[item] = SAVING
                else:
                    if body is not None:
                        self.bodies.stage(job, token, body)
                    j.leased.pop(item, None)
                    if keep_as is not None:  # its keeper queues the save later (handoff)
                        j.pending[item] = now + self.lease_seconds
                        j.owners[item] = (keep_as, int(token))
                    else:
                        j.pending[item] = now + self.save_timeout
                        j.owners[item] = ("-", int(token))  # its message is in the broker
                    j.state[item] = SAVE_PENDING
            return ScrapedResult(dispatch=self._take_for_dispatch(j, now), added=added, held=held)

    def handoff(self, job: str, worker_id: str, saves: Sequence[tuple[str, int]]) -> int:
        with self._lock:
            j = self._job(job)
            later = self._clock() + self.save_timeout
            n = 0
            for item, token in saves:
                if j.state.get(item) == SAVE_PENDING and j.owners.get(item) == (worker_id, int(token)):
                    j.pending[item] = later
                    j.owners[item] = ("-", int(token))
                    n += 1
            return n

    def unclaimed_saves(self, job: str, age: float, limit: int = MAX_ADD_BATCH) -> list[tuple[str, int]]:
        with self._lock:
            j = self._job(job)
            before = self._clock() + self.save_timeout - age
            out = []
            for item, deadline in sorted(j.pending.items(), key=lambda kv: kv[1]):
                if deadline > before or len(out) >= limit:
                    break
                who, token = j.owners.get(item, (None, None))
                if j.state.get(item) == SAVE_PENDING and who == "-":
                    out.append((item, token))
            return out

    def expire_saves(self, job: str, saves: Sequence[tuple[str, int]]) -> int:
        with self._lock:
            j = self._job(job)
            now, n = self._clock(), 0
            for item, token in saves:
                if j.state.get(item) == SAVE_PENDING and j.owners.get(item) == ("-", int(token)):
                    j.pending[item] = now
                    n += 1
            return n

    def begin_save(self, job: str, item: str, token: int, worker_id: str, *, max_lost: int) -> SaveBegin:
        with self._lock:
            j = self._job(job)
            state = j.state.get(item)
            lost = j.lost.get(item, 0)
            if state is None:
                return SaveBegin(status=SaveStart.DONE if item in j.seen else SaveStart.UNKNOWN)
            if state == DEAD:
                return SaveBegin(status=SaveStart.DEAD, lost=lost)
            if not self._holds(j, item, token) or state not in (SAVE_PENDING, SAVING, LEASED):
                return SaveBegin(status=SaveStart.STALE, lost=lost, body=self.bodies.get(job, token))
            if state == SAVING:
                if j.leased[item] > self._clock():  # a live run: this is a duplicate delivery
                    return SaveBegin(status=SaveStart.BUSY, lost=lost)
                lost = j.lost[item] = lost + 1
                if lost > max_lost:
                    self._give_up(
                        j, item, f"its save was interrupted {lost} times: the worker process died "
                        "while saving it (out of memory, or a crashing saver?)", self._clock(),
                    )
                    return SaveBegin(status=SaveStart.DEAD, lost=lost)
            now = self._clock()
            j.pending.pop(item, None)
            if state == LEASED:
                self._vacate(j, self._domain(j, item), now)
            j.leased[item] = now + self.lease_seconds
            j.owners[item] = (worker_id, int(token))
            j.state[item] = SAVING
            return SaveBegin(
                dispatch=self._take_for_dispatch(j, now), status=SaveStart.OK, lost=lost,
                body=self.bodies.get(job, token),
            )

    def defer_save(self, job: str, item: str, token: int) -> bool:
        with self._lock:
            j = self._job(job)
            if j.state.get(item) != SAVING or not self._holds(j, item, token):
                return False
            j.leased.pop(item, None)
            j.pending[item] = self._clock() + self.save_timeout
            j.state[item] = SAVE_PENDING
            return True

    def complete(self, job: str, item: str, token: Optional[int] = None) -> CompleteResult:
        with self._lock:
            j = self._job(job)
            if token is not None:
                self.bodies.discard(job, token)
            state = j.state.get(item)
            changed = state is not None and state != DEAD
            now = self._clock()
            if changed:
                if state == QUEUED:
                    j.queued -= 1
                self._clear_inflight(j, item, now)
                # A done item leaves every per-item structure (finish in _lib.lua).
                del j.state[item]
                del j.depth[item]
                j.fails.pop(item, None)
                j.lost.pop(item, None)
                j.done += 1
            return CompleteResult(dispatch=self._take_for_dispatch(j, now), changed=changed)

    def fail(
        self, job: str, item: str, token: int, reason: str, *, fault: Fault, max_retries: int,
        max_lost: int, retryable: bool = True, delay: float = 0.0,
    ) -> FailResult:
        with self._lock:
            j = self._job(job)
            now = self._clock()
            outcome = FailOutcome.IGNORED
            if j.state.get(item) in (LEASED, SAVE_PENDING, SAVING) and self._holds(j, item, token):
                outcome = self._retry_or_dead(
                    j, item, Fault(fault), retryable=retryable, max_retries=max_retries,
                    max_lost=max_lost, reason=reason, front=False, now=now, delay=delay,
                )
            return FailResult(dispatch=self._take_for_dispatch(j, now), outcome=outcome)

    def extend(
        self, job: str, items: Sequence[str], worker_id: str,
        saves: Sequence[tuple[str, int]] = (), running: Optional[Sequence[str]] = None,
    ) -> int:
        with self._lock:
            j = self._job(job)
            deadline = self._clock() + self.lease_seconds
            n = 0
            for item in items:
                if item in j.dispatched and j.dispatched[item] < deadline:
                    j.dispatched[item] = deadline
                    n += 1
            for item in items if running is None else running:
                owner = j.owners.get(item)
                if item in j.leased and owner and owner[0] == worker_id and j.leased[item] < deadline:
                    j.leased[item] = deadline
                    n += 1
            for item, token in saves:
                if j.state.get(item) == SAVE_PENDING and self._holds(j, item, token):
                    if j.owners[item][0] == worker_id:  # held already: only ever later
                        j.pending[item] = max(j.pending[item], deadline)
                    else:  # just taken from the broker: on this worker's heartbeat now
                        j.pending[item] = deadline
                        j.owners[item] = (worker_id, int(token))
                    n += 1
            return n

    def maintain(self, job: str, *, max_lost: int) -> MaintainResult:
        with self._lock:
            j = self._job(job)
            now = self._clock()
            reclaimed = died = 0
            # An expired saving lease: one more lease to wait for its save (as in maintain.lua).
            expired = sorted((d, i) for i, d in j.leased.items() if d <= now)[:MAX_RECLAIM_BATCH]
            for _, item in expired:
                if j.state[item] != SAVING:
                    continue
                was, token = j.owners[item]
                j.lost[item] = j.lost.get(item, 0) + 1
                if j.lost[item] > max_lost:
                    self._give_up(
                        j, item, f"its save was interrupted too often (last holder {was})", now
                    )
                    died += 1
                else:
                    del j.leased[item]
                    j.pending[item] = now + self.lease_seconds
                    j.owners[item] = ("-", token)
                    j.state[item] = SAVE_PENDING
                    reclaimed += 1
            for inflight, fault, why in (
                (j.leased, Fault.LOST, "its worker vanished"),
                (j.pending, Fault.LOST, "its save message was lost"),
                (j.dispatched, Fault.FREE, ""),
            ):
                expired = sorted((d, i) for i, d in inflight.items() if d <= now)[:MAX_RECLAIM_BATCH]
                for _, item in expired:
                    was = j.owners.get(item, ("?", 0))[0]
                    outcome = self._retry_or_dead(
                        j, item, fault, retryable=True, max_retries=0, max_lost=max_lost,
                        reason=f"{why} too often (last holder {was})", front=True, now=now,
                    )
                    if outcome is FailOutcome.RETRY:
                        reclaimed += 1
                    else:
                        died += 1
            finished = j.info.state is JobState.RUNNING and self._stats(j).finished
            if finished:
                self._record_end(j, JobState.FINISHED, now)
            dispatch = self._take_for_dispatch(j, now)
            wake = None
            if self._bound_locked() - len(j.dispatched) - len(j.pending) > 0:
                times = list(j.domains.values()) + list(j.delayed.values())
                if j.leased or j.dispatched:
                    times.append(now + WAKE_WHILE_LEASED)
                wake = max(min(times) - now, 0.0) if times else None
            return MaintainResult(dispatch=dispatch, reclaimed=reclaimed, died=died, wake=wake,
                                  finished=finished)

    def release(
        self, job: str, worker_id: Optional[str] = None, saves: Sequence[tuple[str, int]] = ()
    ) -> int:
        with self._lock:
            j = self._job(job)
            now = self._clock()
            n = 0
            if worker_id:
                returning = {(item, int(token)) for item, token in saves}
                later = now + self.save_timeout
                for item in list(j.pending):
                    who, token = j.owners.get(item, ("", 0))
                    if who != worker_id:
                        continue
                    if (item, token) in returning:
                        j.pending[item] = later
                        j.owners[item] = ("-", token)
                    else:  # kept for a save batch never queued: no message will come
                        self._requeue(j, item, True, now)
                        n += 1
            # Dispatched items name no worker: all go back (see release.lua).
            sets = (j.leased, j.dispatched) if worker_id else (j.leased, j.pending, j.dispatched)
            for inflight in sets:
                for item in list(inflight):
                    if (worker_id is None or inflight is j.dispatched
                            or j.owners.get(item, ("", 0))[0] == worker_id):
                        self._requeue(j, item, True, now)
                        n += 1
            return n

    def stats(self, job: str) -> JobStats:
        with self._lock:
            return self._stats(self._job(job))

    @staticmethod
    def _stats(j: _Job) -> JobStats:
        return JobStats(
            seen=len(j.seen), frontier=j.queued, dispatched=len(j.dispatched),
            leased=len(j.leased), done=j.done, dead=len(j.dead), saving=len(j.pending),
            delayed=len(j.delayed), links_cut=j.links_cut,
        )

    def iter_dead(self, job: str) -> Iterator[tuple[str, str]]:
        with self._lock:
            dead = list(self._job(job).dead.items())
        yield from dead

    def retry_dead(self, job: str) -> RetryDeadResult:
        with self._lock:
            j = self._job(job)
            now = self._clock()
            items = list(j.dead)
            for item in items:
                del j.dead[item]
                j.fails.pop(item, None)
                j.lost.pop(item, None)
                self._requeue(j, item, False, now)
            if items:
                self._reactivate(j)
            return RetryDeadResult(dispatch=self._take_for_dispatch(j, now), requeued=len(items))

    def leased_by_worker(self, job: str) -> dict[str, int]:
        with self._lock:
            j = self._job(job)
            return dict(Counter(w for w, _ in j.owners.values() if w != "-"))
