"""The Celery worker's signal hooks (``celery -A distscrape_celery worker``): register the
worker with the tracker before its pool forks, start its agent when it is ready, take received
save messages into its hands, and give everything back when it stops. The app names this module
in its ``include``, so Celery imports it before ``worker_init``."""

from __future__ import annotations

import atexit
import functools
import gc
import logging
import os
import signal
import sys
import threading
import time
from typing import Optional

from celery import signals as celery_signals

from ..core import runtime
from ..lifecycle import child_pids
from ..core.runtime import Runtime, current_runtime
from ..settings import ENV_PREFIX
from ..tracker import RedisTracker
from ..tracker import checks as redis_checks
from .agent import WorkerAgent, reserved_items
from .app import current_settings
from .names import SAVE_BATCH_TASK, SAVE_TASK, save_pairs
from .publish import publisher
from .tasks import carried_items, carry_here, flush_saves

log = logging.getLogger(__name__)

_agent: Optional[WorkerAgent] = None


def _runtime_for_worker() -> Runtime:
    return current_runtime(current_settings)


@celery_signals.worker_init.connect
def _on_worker_init(sender, **_):
    """Register before the pool forks, so every pool process inherits the worker ID."""
    global _agent
    worker_runtime = _runtime_for_worker()
    if worker_runtime.in_memory:
        return
    concurrency = sender.concurrency if isinstance(sender.concurrency, int) else os.cpu_count() or 1
    max_running = worker_runtime.settings.task_time_limit
    _agent = WorkerAgent(
        worker_runtime, concurrency=concurrency, publish=publisher.scrape,
        held_items=functools.partial(reserved_items, max_running=max_running,
                                     carried=carried_items),
    )
    _agent.register()
    # Its heartbeat keeps the leases of what this process's tasks carry on to (a prefork pool
    # process's are out of its sight: there every item stays a task of its own).
    carry_here()
    # Celery's cold shutdown (SIGQUIT, or a second SIGTERM) skips worker_shutdown; the process
    # still exits through the interpreter, so give back what we hold there too.
    atexit.register(_agent.stop)
    _exit_on_stop_signals()


@celery_signals.celeryd_after_setup.connect
def _on_worker_logging_ready(sender=None, **_):
    """Say where the worker went, and what its Redis weakens, once Celery has set up its logging:
    at ``worker_init`` a ``--logfile`` is not open yet, so a detached worker (``celery multi``)
    would send these lines to a closed stderr."""
    worker_runtime = _runtime_for_worker()
    tracker = worker_runtime.tracker
    if worker_runtime.in_memory or not isinstance(tracker, RedisTracker):
        return
    # WARNING, Celery's default level for workers: an operator starting a worker sees where
    # it went whatever the log level (the URL's password is redacted).
    log.warning("worker %s connected to Redis at %s", worker_runtime.worker_id, tracker.url)
    redis_checks.warn_about(tracker.client, tracker.url)
    if worker_runtime.settings.output_roots is None:
        log.warning(
            "%sOUTPUT_ROOTS is unset: this worker refuses every files, tar and warc output (their "
            "items end dead) until it names the directories the worker may write", ENV_PREFIX
        )


def _exit_on_stop_signals() -> None:
    """Until Celery installs its own handlers (in its start, after its banner), a stop signal
    would end the registered worker at once, by the signal's default action: no exit handlers,
    so it would stay listed as alive until its heartbeat ran out. Exit through the interpreter
    instead, so ``atexit`` deregisters it. Celery replaces these before the pool starts."""
    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum: int, _frame: object) -> None:
        log.warning("stopped by %s before the worker was ready", signal.Signals(signum).name)
        sys.exit(0)

    for sig in (signal.SIGTERM, signal.SIGQUIT):
        signal.signal(sig, stop)


def freeze_startup_objects() -> None:
    """Leave what the process holds once it is ready (modules, the app, its tasks: about 100,000
    objects in a worker) out of every later garbage collection. A worker allocates without end
    and Python's collector then walks all of them now and again; frozen, the collections of a
    crawl took about half the time (docs/performance.md). Garbage there is now
    is collected first, so nothing unreachable is kept for good."""
    gc.collect()
    gc.freeze()


# How long a cold shutdown may take before the worker gives back what it holds and ends.
COLD_SHUTDOWN_SECONDS = 5.0


def _guard_cold_shutdown(pool: object) -> None:
    """Celery runs a cold shutdown (SIGQUIT) inside its signal handler, wherever the main thread
    was. A prefork worker caught while writing a task to a pool process then waits for ever for
    that pool process, which waits for the rest of the task. Wrap Celery's handler: past
    COLD_SHUTDOWN_SECONDS such a worker gives back what it holds and ends, pool processes too
    (they were being cancelled anyway). Other pools are left to Celery."""
    # Not imported here: a threads worker forked by worker.main must not load the prefork pool.
    prefork = sys.modules.get("celery.concurrency.prefork")
    if prefork is None or not isinstance(pool, prefork.TaskPool):
        return
    if threading.current_thread() is not threading.main_thread():
        return
    celery_handler = signal.getsignal(signal.SIGQUIT)
    if not callable(celery_handler):
        return
    started = threading.Event()

    def on_sigquit(signum: int, frame: object) -> None:
        if not started.is_set():
            started.set()
            threading.Thread(target=_end_a_stuck_shutdown, name="distscrape-cold-shutdown",
                             daemon=True).start()
        celery_handler(signum, frame)

    signal.signal(signal.SIGQUIT, on_sigquit)


def _end_a_stuck_shutdown() -> None:
    time.sleep(COLD_SHUTDOWN_SECONDS)
    log.warning("the cold shutdown did not end within %.0f s: giving back what this worker "
                "holds and ending it", COLD_SHUTDOWN_SECONDS)
    try:
        if _agent is not None:
            _agent.stop()
    finally:
        _kill_children()
        os._exit(1)


def _kill_children() -> None:
    """SIGKILL this process's pool processes: the children its main thread forked (Linux)."""
    for child in child_pids(os.getpid()) or []:
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            continue


@celery_signals.worker_ready.connect
def _on_worker_ready(sender=None, **_):
    freeze_startup_objects()
    _guard_cold_shutdown(getattr(sender, "pool", None))
    if _agent is not None:
        _agent.start()


@celery_signals.worker_process_init.connect
def _on_pool_process_init(**_):
    # A prefork pool process: the worker froze its own objects after the pool had forked.
    freeze_startup_objects()
    runtime.note_pool_process()


def _flush_saves() -> None:
    """Queue the saves this process gathered before it lets go of its items: else they wait in
    the tracker for a lease (and are downloaded again)."""
    if not flush_saves():
        log.warning("some gathered saves could not be queued; their items are downloaded again")


@celery_signals.task_received.connect
def _on_task_received(request, **_):
    """A save message just left the broker for this worker: note its items, so that a stop
    before the next heartbeat returns them to the broker's care rather than requeueing them.
    The heartbeat takes them over; until then they wait under the save timeout, and a live
    worker finds them if this one dies first (``lost_saves``)."""
    if _agent is None:
        return
    if request.name not in (SAVE_BATCH_TASK, SAVE_TASK):
        return
    try:
        _agent.note_received_saves(request.args[0], save_pairs(request.name, request.args))
    except Exception as exc:  # a malformed message: its save task reports it
        log.warning("could not note the items of a received save message: %s", exc)


@celery_signals.worker_shutdown.connect
def _on_worker_shutdown(**_):
    _flush_saves()
    if _agent is not None:
        _agent.stop()


@celery_signals.worker_process_shutdown.connect
def _on_pool_process_shutdown(**_):
    _flush_saves()
    # Pool processes own their savers; close them so buffered output is flushed.
    if runtime._runtime is not None:
        runtime._runtime.close()
