"""A worker's life in the tracker: register, heartbeat, keep its items' leases, recover others'.

Each worker process runs one agent thread (in the pool's parent for prefork). Every heartbeat
interval it (1) records that the worker lives, (2) extends the deadlines of the items the worker has
reserved or is running, and (3) for every active job (neither finished nor cancelled), reclaims items whose deadline passed and tops the
broker up from the frontier; (4) starts the next generation of jobs whose schedule is due. Any
live worker does (3) and (4), so recovery, dispatch and schedules need no singleton.
When a domain's turn or a backoff ends sooner than the next heartbeat (rate limits), (3) runs
again then, so a throttled domain is served at its rate even while no task frees a slot; while
items are dispatched or leased, at least every second, since a failure may start a short backoff.
The one maintenance that finds a job finished sends :data:`~.events.job_finished`; each heartbeat
also prunes the records of workers dead for longer than ``worker_prune_seconds``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Optional

import redis

from ..core.runtime import Runtime
from ..core.schedules import fire_due
from ..errors import JobNotFound, TrackerUnavailable
from .events import job_finished
from .lost_saves import LostSaves
from .names import SAVE_BATCH_TASK, SAVE_TASK, SCRAPE_TASK, save_pairs

log = logging.getLogger(__name__)

# Least wait between two dispatch rounds, so a domain whose turn has come does not spin the agent.
MIN_WAKE = 0.05
# Every this many heartbeats (the first included) a worker repairs the list of active jobs where
# a client died between a shard's change and its mirror (Tracker.heal_active_jobs): it reads
# every job that is not listed, so not on every beat.
HEAL_EVERY = 10


class Held:
    """What one worker holds of one job, from Celery's own books."""

    def __init__(self) -> None:
        self.items: list[str] = []  # scrape and save messages reserved (running ones too)
        self.running: list[str] = []  # tasks running now: only they keep their items' leases
        self.saves: list[tuple[str, int]] = []  # (item, token) of save messages reserved


HeldItems = Callable[[], dict[str, Held]]
# (job, item, since): an item a task carried on to, since then (time.time()).
Carried = tuple[str, str, float]


def reserved_items(
    max_running: Optional[float] = None, carried: Callable[[], Iterable[Carried]] = tuple,
) -> dict[str, Held]:
    """What this worker has reserved or is running, by job, with the items its running tasks
    carried on to (``carried()``: (job, item, since), ``since`` by ``time.time()``; the tasks
    of this process only). A task running for longer than
    ``max_running`` seconds counts as not running, so its lease is no longer kept: the prefork
    pool kills such a task at its time limit anyway, but the threads pool has no time limits,
    and a hung download or save must not hold its item for ever (another worker takes it a lease
    later; the hung run's fencing token is then stale)."""
    from celery.worker import state


    held: dict[str, Held] = defaultdict(Held)
    active = set(_snapshot(state.active_requests))
    reserved = _snapshot(state.reserved_requests)
    # With an ETA (a deferred save), a message waits in the worker's timer, in neither set,
    # until then; its items are in our hands all that time, so they must be kept too.
    scheduled = _snapshot(getattr(state, "scheduled_requests", ()))
    requests = list(dict.fromkeys([*reserved, *active, *scheduled]))
    if max_running is not None:
        # Neither its lease nor (for a save) its item's wait for the save is kept any more.
        too_old = time.time() - max_running
        requests = [r for r in requests if not (r.time_start and r.time_start < too_old)]
    for request in requests:
        try:
            if request.name == SCRAPE_TASK:
                saves = []
            elif request.name in (SAVE_TASK, SAVE_BATCH_TASK):
                saves = save_pairs(request.name, request.args)
            else:
                continue
            job = request.args[0]
            items = [item for item, _ in saves] if saves else [request.args[1]]
            held[job].items.extend(items)
            if request in active:
                held[job].running.extend(items)
            held[job].saves.extend(saves)
        except (IndexError, TypeError, ValueError):
            continue
    # Items the running tasks carried on to: no request names them.
    for job, item, since in carried():
        if max_running is None or since >= time.time() - max_running:
            held[job].items.append(item)
            held[job].running.append(item)
    return held


def _snapshot(requests) -> list:
    """The members of one of Celery's request sets (weak sets), which the consumer changes while
    the heartbeat thread reads them. Iterating one can then fail ("changed size during
    iteration"); copying its underlying set is a single step under the GIL."""
    data = getattr(requests, "data", None)
    if isinstance(data, set):
        return [r for r in (ref() for ref in data.copy()) if r is not None]
    return list(requests)


def _merged(*by_job: dict[str, Iterable[tuple[str, int]]]) -> dict[str, set[tuple[str, int]]]:
    """The union, job by job, of (item, token) pairs."""
    merged: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for pairs_by_job in by_job:
        for job, pairs in pairs_by_job.items():
            merged[job].update(pairs)
    return merged


class WorkerAgent:
    """Keeps one worker registered and alive in the tracker, from a background thread."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        concurrency: int,
        publish: Callable[[str, Sequence[str]], None],
        held_items: HeldItems = reserved_items,
        interval: Optional[float] = None,
    ) -> None:
        self.runtime = runtime
        self.concurrency = concurrency
        self.publish = publish
        self.held_items = held_items
        self.interval = interval or runtime.settings.heartbeat_interval
        self._stop = threading.Event()
        self._stopped = False
        self._thread: Optional[threading.Thread] = None
        self._ticks = 0
        self._lost_saves: Optional[LostSaves] = None  # see _expire_lost_saves
        # Jobs whose maintenance failed, with the failure last logged: a job that fails the same
        # way on every heartbeat (one of an older format, say) is logged once, not each time.
        self._failing: dict[str, str] = {}
        # The (item, token) of the save messages this worker has reserved, by job: as of the last
        # heartbeat (written by the heartbeat thread only), and received since (by the consumer
        # thread, under the lock). A stop gives back every other save-pending item it holds at
        # once (kept for a batch its processes never queued); Celery has forgotten its reserved
        # messages by then, and every message passed through task_received.
        self._saves_lock = threading.Lock()
        self._reserved_saves: dict[str, set[tuple[str, int]]] = {}
        self._received_saves: dict[str, set[tuple[str, int]]] = defaultdict(set)

    def register(self) -> str:
        worker_id = self.runtime.tracker.register_worker(socket.gethostname(), os.getpid(),
                                                         self.concurrency)
        self.runtime.worker_id = worker_id
        log.info("registered as worker %s", worker_id)
        return worker_id

    def tick(self) -> Optional[float]:
        """One heartbeat: stay alive, keep held leases, recover expired ones, top up dispatch.
        Returns the seconds until dispatch can hand out more (None: not by time alone)."""
        tracker = self.runtime.tracker
        tracker.heartbeat(self.runtime.worker_id)
        with self._saves_lock:  # before the snapshot, so nothing falls between the two
            received, self._received_saves = self._received_saves, defaultdict(set)
        held_items = self.held_items()
        self._reserved_saves = _merged({job: held.saves for job, held in held_items.items()},
                                       received)
        for job, held in held_items.items():
            tracker.extend(job, held.items, self.runtime.worker_id, held.saves, held.running)
        pruned = tracker.prune_workers(self.runtime.settings.worker_prune_seconds)
        if pruned:
            log.info("pruned the records of dead worker(s) %s", ", ".join(pruned))
        self._ticks += 1
        if self._ticks % HEAL_EVERY == 1 and tracker.heal_active_jobs():
            log.warning("listed again job(s) with unfinished work that were not maintained")
        self._fire_schedules()
        jobs = tracker.active_jobs()
        self._expire_lost_saves(jobs)
        return self.maintain_all(jobs)

    def _fire_schedules(self) -> None:
        """Start the generations that are due (any worker may; the tracker lets one start each)."""
        try:
            fire_due(self.runtime.tracker, self.publish)
        except TrackerUnavailable:
            raise
        except Exception:  # a broken schedule must not stop the heartbeat
            log.exception("could not start the jobs whose schedule is due")

    def _expire_lost_saves(self, jobs: list[str]) -> None:
        """Items whose save message a dead worker took from the Redis broker wait a lease, not the
        save timeout (see :mod:`.lost_saves`); the maintenance that follows reclaims them."""
        settings = self.runtime.settings
        if not self.runtime.finds_lost_saves:
            return  # another broker's queue cannot be read: they wait out the save timeout
        if self._lost_saves is None:
            tracker = self.runtime.tracker
            broker = (tracker.client if settings.effective_broker_url == tracker.url
                      and not tracker.cluster else redis.Redis.from_url(
                          settings.effective_broker_url, socket_timeout=settings.redis_socket_timeout,
                          socket_connect_timeout=10))
            self._lost_saves = LostSaves(tracker, broker, settings.save_queue,
                                         age=settings.lease_seconds)
        self._lost_saves.forget_others(jobs)
        for job in jobs:
            try:
                self._lost_saves.check(job)
            except Exception as exc:  # the save timeout still applies
                log.warning("job %s: could not look for lost save messages: %s", job, exc)

    def note_received_saves(self, job: str, saves: Sequence[tuple[str, int]]) -> None:
        """A save message for these (item, token) reached this worker (see ``_reserved_saves``)."""
        with self._saves_lock:
            self._received_saves[job].update(saves)

    def maintain_all(self, jobs: Optional[list[str]] = None) -> Optional[float]:
        """Maintain every active job (``jobs``, if the caller has just listed them); the soonest
        wake of any (see :meth:`tick`)."""
        wake: Optional[float] = None
        for job in self.runtime.tracker.active_jobs() if jobs is None else jobs:
            try:
                job_wake = self._maintain(job)
            except Exception as exc:  # one broken job must not stop recovery of the others
                failure = f"{type(exc).__name__}: {exc}"
                if self._failing.get(job) != failure:
                    log.exception("maintenance of job %s failed (logged again only if the "
                                  "failure changes)", job)
                    self._failing[job] = failure
                continue
            if self._failing.pop(job, None) is not None:
                log.warning("maintenance of job %s works again", job)
            if job_wake is not None and (wake is None or job_wake < wake):
                wake = job_wake
        return wake

    def _maintain(self, job: str) -> Optional[float]:
        outcome = self.runtime.tracker.maintain(job, max_lost=self.runtime.spec(job).max_lost)
        if outcome.reclaimed or outcome.died:
            log.warning("job %s: reclaimed %d expired item(s), %d dead", job, outcome.reclaimed,
                        outcome.died)
        if outcome.requeued:
            log.info("job %s: queued %d item(s) again whose scrape message did not start within "
                     "a lease", job, outcome.requeued)
        if outcome.dispatch:
            self.publish(job, outcome.dispatch)
        if outcome.expired:
            info = self.runtime.tracker.job_info(job)
            log.warning("job %s expired (its max_duration ran out): %s", job,
                        ", ".join(f"{n} {v}" for n, v in info.final.items()))
        if outcome.finished:
            info = self.runtime.tracker.job_info(job)
            log.warning("job %s finished: %s", job,
                        ", ".join(f"{n} {v}" for n, v in info.final.items()))
            # Receivers' exceptions are logged by the signal; they cannot stop the heartbeat.
            job_finished.send(sender=self, job=job, info=info)
        return outcome.wake

    def _run(self) -> None:
        failing = False
        next_beat = 0.0
        while True:
            wake: Optional[float] = None
            try:
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.interval
                    wake = self.tick()
                else:
                    wake = self.maintain_all()
                if failing:
                    log.warning("worker heartbeat works again")
                failing = False
            except TrackerUnavailable as exc:
                # Redis down or restarting: one line per try, no traceback flood; the next try
                # comes after the usual interval, so an outage costs no CPU.
                log.warning("worker heartbeat failed, retrying in %.1f s: %s", self.interval, exc)
                failing = True
            except Exception:  # a bug must not end the heartbeat for good either
                log.exception("worker heartbeat failed; retrying")
                failing = True
            wait = next_beat - time.monotonic()
            if wake is not None and not failing:
                wait = min(wait, max(wake, MIN_WAKE))
            if self._stop.wait(max(wait, 0.0)):
                return

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="distscrape-agent", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop heartbeating, give back what this worker still holds, deregister. Idempotent:
        runs on a warm shutdown and again at exit (a cold shutdown sends no signal)."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval + 5)
        try:
            # Whatever this worker still holds (its tasks were cut short, its pool processes'
            # unqueued save batches) goes back at once, rather than a lease or a save timeout
            # from now; its reserved save messages go back to the broker.
            with self._saves_lock:
                returning = _merged(self._reserved_saves, self._received_saves)
            for job in self.runtime.tracker.jobs():
                try:
                    released = self.runtime.tracker.release(job, self.runtime.worker_id,
                                                       sorted(returning.get(job, ())))
                except JobNotFound:  # being deleted
                    continue
                if released:
                    log.warning("job %s: gave back %d unfinished item(s) (those it held, and "
                                "the job's dispatched ones: any may be a message it never sent)",
                                job, released)
            self.runtime.tracker.deregister_worker(self.runtime.worker_id)
        except Exception:
            log.exception("could not deregister worker %s", self.runtime.worker_id)
        self.runtime.close()
