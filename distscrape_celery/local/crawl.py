"""The one-command crawl on one machine: everything it needs is started here and stopped after."""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

from .. import lifecycle
from .embedded import EmbeddedRedis
from ..errors import ConfigError
from ..job.spec import JobSpec
from .processes import WorkerProcess, can_fork_workers
from ..core.manager import CrawlManager
from ..core.schedules import run_again
from ..savers.joining import Joined
from ..settings import Settings
from .shape import DEFAULT_CRAWL_CONCURRENCY, crawl_worker_processes
from ..tracker import JobState, JobStats, RedisTracker
from ..job.urls import url_host

Progress = Callable[[JobStats], None]


@dataclass(frozen=True)
class CrawlResult:
    job: str
    stats: JobStats
    seconds: float
    dead: dict[str, str]
    resumed: bool = False  # the job was found in the state directory and continued
    already_finished: bool = False  # ... and it had ended before: nothing was crawled
    # Its max_duration ran out: it ended expired, with stats.queued items left queued.
    expired: bool = False

    @property
    def pages_per_second(self) -> float:
        return self.stats.done / self.seconds if self.seconds > 0 else 0.0


def default_job_name(spec: JobSpec) -> str:
    """The same name for the same seeds, so that running the same command again resumes the
    job: ``crawl-`` and the first seed's host and port (``crawl-example.org``,
    ``crawl-127.0.0.1_8080``), made a valid job name."""
    seed = spec.seeds[0]
    if "://" in seed:
        parts = urlsplit(seed)
        host = url_host(seed) + (f"_{parts.port}" if parts.port is not None else "")
    else:  # an ID (the ids scraper)
        host = seed
    return ("crawl-" + re.sub(r"[^A-Za-z0-9_.-]", "_", host))[:100]


def with_own_output_root(settings: Settings, spec: JobSpec) -> Settings:
    """``settings`` whose output roots are the output ``spec`` names, if they have none and the
    saver writes a path: the crawl's workers (and the in-memory crawl) then write there and
    nowhere else, with no setting, since the user who runs the crawl chose it. Roots that are set
    apply as they are: an output outside them is refused (:func:`check_components`)."""
    from ..core.components import writes_paths

    try:
        if settings.output_roots is not None or not writes_paths(spec, settings):
            return settings
    except ConfigError:
        return settings  # a saver the settings refuse: the spec's check names it as it should
    root = str(Path(spec.saver.output).expanduser().resolve())
    return Settings.model_validate({**settings.model_dump(), "output_roots": (root,)})


@contextlib.contextmanager
def redis_for_crawl(
    settings: Settings, use_embedded: bool, state_dir: Optional[Path] = None
) -> Iterator[Settings]:
    """Yield settings that point at a reachable Redis, starting an embedded one if asked; with
    ``state_dir``, one that keeps its data there. The crawl's processes reach it on its Unix
    socket, its only listener; on TCP only if no socket path fits (see :class:`EmbeddedRedis`)."""
    if not use_embedded:
        yield settings
        return
    server = EmbeddedRedis(state_dir=state_dir, tcp=False)
    try:
        server.start()
        url = server.socket_url or server.url
        yield settings.model_copy(update={"redis_url": url, "broker_url": None})
    finally:
        with lifecycle.shielded():
            server.stop()


def _forget_previous_run(tracker: RedisTracker, job: str) -> int:
    """Before a private Redis's job is resumed: the workers of the previous run are gone, so
    their broker messages go (with the unacknowledged ones, which the Redis transport would
    otherwise restore later as duplicates), their registrations go, and what they had in flight
    goes back in the frontier at once. Returns how many items were put back.

    Only for the embedded Redis, where no other worker can be running the job."""
    from ..worker.app import app, current_settings

    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for queue in (current_settings().scrape_queue, current_settings().save_queue):
            channel.queue_purge(queue)
        channel.client.delete(
            channel.unacked_key, channel.unacked_index_key, channel.unacked_mutex_key
        )
    for worker in tracker.workers():
        tracker.deregister_worker(worker.id)
    return tracker.release(job)


def _check_no_other_unfinished_job(tracker: RedisTracker, job: str, state_dir: Path) -> None:
    """Workers work on every job in their Redis: an unfinished job of another crawl in the state
    directory would be crawled too."""
    for other in tracker.jobs():
        if other != job and not tracker.stats(other).finished and not (
                tracker.job_info(other).state is JobState.EXPIRED):  # an expired job runs no more
            raise ConfigError(
                f"the state directory {state_dir} holds job {other!r}, which is not finished and "
                f"is not this crawl's ({job!r}): give another --state-dir or --output, "
                f"or --fresh to drop it"
            )


# One saved item's headers (its URL and item, in PAX headers or WARC fields) beside its body.
_UNIT_HEADROOM = 1 << 20


def archive_shards(spec: JobSpec) -> list[Path]:
    """The shards of a tar, WARC or JSON Lines output on this host; [] for any other saver."""
    from ..savers.jsonl import jsonl_shards
    from ..savers.tar import tar_shards
    from ..savers.warc import warc_shards

    kind, output = spec.saver.kind, spec.saver.output
    if kind == "tar":
        return tar_shards(output)
    if kind == "warc":
        return warc_shards(output)
    if kind == "jsonl":
        return jsonl_shards(output)
    return []


def join_archive(spec: JobSpec, job: str) -> Optional[Joined]:
    """At the end of a crawl into a tar, WARC or JSON Lines output: join its shards on this host into the
    named file, which then exists, and remove them. None for any other saver. Raises
    :class:`~distscrape_celery.errors.SaveError` (shards and output left as they were) when
    that cannot be done."""
    return join_archive_file(spec.saver.kind, spec.saver.output, max_bytes=spec.fetch.max_bytes,
                             job=job)


def join_archive_file(kind: str, output: str, *, max_bytes: int, job: str = "") -> Optional[Joined]:
    """Join the shards of the ``kind`` (tar, warc or jsonl) output ``output`` found on this host
    into ``output``, as :func:`join_archive` does; ``max_bytes`` is the largest body a saved item
    may hold (the job's ``fetch.max_bytes``). None for any other kind."""
    from ..savers.jsonl import join_jsonl
    from ..savers.tar import join_tar
    from ..savers.warc import join_warc

    max_unit = max_bytes + _UNIT_HEADROOM
    if kind == "tar":
        return join_tar(output, max_unit=max_unit)
    if kind == "warc":
        return join_warc(output, max_unit=max_unit, job=job)
    if kind == "jsonl":
        return join_jsonl(output)
    return None


def _quiet(message: str) -> None:
    pass


def run_local_crawl(
    job: str,
    spec: JobSpec,
    settings: Settings,
    *,
    embedded_redis: bool,
    state_dir: Optional[Path] = None,
    concurrency: int = DEFAULT_CRAWL_CONCURRENCY,
    on_progress: Optional[Progress] = None,
    timeout: Optional[float] = None,
    say: Callable[[str], None] = _quiet,
    stop_timeout: float = 20.0,
) -> CrawlResult:
    """Crawl ``spec`` with real worker processes on this machine, two per core, each a threads
    pool (``concurrency`` threads in all, see :func:`crawl_worker_processes`), and wait until it
    is finished. Without output roots in ``settings``, its own output is the workers' root.

    With ``state_dir`` (embedded Redis only; see :func:`.state.state_directory`) the crawl's
    state is kept there, and a job found in it is resumed: what the previous run had in flight
    is put back at once. A job found finished is not crawled again (``already_finished`` in the
    result), unless it revisits: then its next generation runs.
    However the crawl ends, the worker gets a warm shutdown (up to ``stop_timeout`` s, less if
    :data:`lifecycle.hurry` is set) and the embedded Redis is stopped."""
    from ..worker.app import configure_app
    from ..worker.publish import publisher

    if state_dir is not None and not embedded_redis:
        raise ValueError("state_dir is for the embedded Redis")
    settings = with_own_output_root(settings, spec)
    with redis_for_crawl(settings, embedded_redis, state_dir) as settings:
        tracker = RedisTracker.from_settings(settings)
        configure_app(settings)
        manager = CrawlManager(tracker, publisher.scrape, settings=settings)
        resumed, finished = _seed_or_resume(manager, tracker, job, spec, state_dir, say)
        if finished is not None:
            return finished
        return _crawl_with_workers(
            manager, tracker, job, settings, resumed=resumed, concurrency=concurrency,
            on_progress=on_progress, timeout=timeout, say=say, stop_timeout=stop_timeout,
        )


def _seed_or_resume(
    manager: CrawlManager, tracker: RedisTracker, job: str, spec: JobSpec,
    state_dir: Optional[Path], say: Callable[[str], None],
) -> tuple[bool, Optional[CrawlResult]]:
    """Seed ``job``, resuming it if the tracker holds it already (see :func:`run_local_crawl`).
    Returns whether it was resumed, and its result if it had finished before."""
    resumed = job in tracker.jobs()
    released = 0
    if resumed:
        # A different spec: JobConflict, nothing changed.
        tracker.create_job(job, spec.to_json(), spec.crawl_limits())
    if state_dir is not None:
        _check_no_other_unfinished_job(tracker, job, state_dir)
        if resumed:
            released = _forget_previous_run(tracker, job)
    manager.seed(job, spec)
    if resumed:
        stats = tracker.stats(job)
        expired = tracker.job_info(job).state is JobState.EXPIRED
        finished = manager.finished(job, stats)
        if (finished or expired) and spec.revisit is not None:
            # A job that revisits runs again: its next generation fetches what is due. Its end
            # may not be recorded yet (the last run stopped as soon as it saw nothing left).
            started = run_again(tracker, job, manager.publish)
            if started.started:
                say(f"job {job}: generation {started.generation}, revisiting the known "
                    f"page(s) that are due ({tracker.stats(job).known} known)")
                return True, None
        if finished or expired:
            return True, CrawlResult(job, stats, 0.0, tracker.dead_items(job),
                                     already_finished=True, expired=expired)
        say(
            f"resuming job {job}: {stats.done} done, {stats.queued} queued"
            + (f" ({released} interrupted item(s) put back)" if released else "")
        )
    return resumed, None


def _crawl_with_workers(
    manager: CrawlManager, tracker: RedisTracker, job: str, settings: Settings, *, resumed: bool,
    concurrency: int, on_progress: Optional[Progress], timeout: Optional[float],
    say: Callable[[str], None], stop_timeout: float,
) -> CrawlResult:
    """Start the crawl's workers, wait until ``job`` is finished, and stop the workers however
    the wait ends (see :func:`run_local_crawl`)."""
    workers: list[WorkerProcess] = []
    interrupted: Optional[str] = None  # how a second stop request is made, once stopping
    try:
        _start_workers(workers, settings, job, concurrency)
        started = time.monotonic()

        def check() -> None:
            for worker in workers:
                worker.check()

        stats = manager.wait(job, timeout=timeout, on_progress=on_progress, check=check)
        seconds = time.monotonic() - started
        return CrawlResult(job, stats, seconds, tracker.dead_items(job), resumed=resumed,
                           expired=tracker.job_info(job).state is JobState.EXPIRED)
    except KeyboardInterrupt:
        interrupted = "another Ctrl-C"
        raise
    except lifecycle.Terminated as exc:
        interrupted = f"another {exc.signal_name} (or Ctrl-C)"
        raise
    finally:
        if workers:
            if interrupted and any(worker.alive for worker in workers):
                say(
                    f"distscrape: stopping: the worker finishes its running downloads "
                    f"(up to {stop_timeout:.0f}s; {interrupted} stops it at once)"
                )
            with lifecycle.shielded():
                _stop_all(workers, stop_timeout)


def _start_workers(
    workers: list[WorkerProcess], settings: Settings, job: str, concurrency: int
) -> None:
    """Start the crawl's worker processes, each added to ``workers`` as soon as it runs (so
    that a failure to start the next one still stops it)."""
    # Threads, not prefork: the prefork parent costs a third of the CPU per page.
    # Time limits do not apply to threads; reserved_items gives up a task's lease
    # after task_time_limit instead. Where it can, one process imports everything
    # once and forks the workers (worker.main --forks).
    shape = crawl_worker_processes(concurrency)
    if can_fork_workers():
        workers.append(WorkerProcess(settings, name=f"distscrape-{job}", pool="threads",
                                     forks=shape).start())
    else:
        for number, threads in enumerate(shape, start=1):
            workers.append(WorkerProcess(settings, name=f"distscrape-{job}-{number}",
                                         concurrency=threads, pool="threads").start())


def _stop_all(workers: list[WorkerProcess], timeout: float) -> None:
    """Warm-stop every worker at once (each may wait for its running downloads)."""
    stoppers = [
        threading.Thread(target=worker.stop,
                         kwargs={"timeout": timeout, "hurry": lifecycle.hurry})
        for worker in workers
    ]
    for stopper in stoppers:
        stopper.start()
    for stopper in stoppers:
        stopper.join()


# What the in-process worker logs when run_in_memory_crawl stops it: not news to its user.
_REMOTE_SHUTDOWN_LOGGER = "celery.worker.control"
_REMOTE_SHUTDOWN = "Got shutdown from remote"


@contextlib.contextmanager
def _without_log(logger_name: str, message: str) -> Iterator[None]:
    """Drop records of ``logger_name`` whose message starts with ``message`` while inside."""
    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(message)

    logger = logging.getLogger(logger_name)
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def run_in_memory_crawl(
    job: str,
    spec: JobSpec,
    settings: Settings,
    *,
    concurrency: int = DEFAULT_CRAWL_CONCURRENCY,
    on_progress: Optional[Progress] = None,
    timeout: Optional[float] = None,
) -> CrawlResult:
    """Crawl ``spec`` in this process: InMemoryTracker, Celery's in-memory transport and an
    in-process worker. No Redis, no broker; for small crawls. Without output roots in
    ``settings``, its own output is the root."""
    from celery.contrib.testing.worker import start_worker

    from ..worker.agent import WorkerAgent, reserved_items
    from ..worker.tasks import carried_items, carry_here
    from ..worker.app import app, configure_app
    from ..core.runtime import Runtime, install_runtime
    from ..worker.publish import publisher

    settings = with_own_output_root(settings, spec)
    configure_app(settings, in_memory=True)
    runtime = Runtime.in_memory_runtime(settings)
    install_runtime(runtime)
    agent = WorkerAgent(runtime, concurrency=concurrency, publish=publisher.scrape,
                        held_items=functools.partial(reserved_items, carried=carried_items))
    try:
        with contextlib.ExitStack() as stack, start_worker(
            app, pool="threads", concurrency=concurrency, perform_ping_check=False,
            loglevel="WARNING", shutdown_timeout=60,
        ) as worker:
            agent.register()
            carry_here()  # the worker's threads run here, where the agent keeps their leases
            agent.start()
            try:
                manager = CrawlManager(runtime.tracker, publisher.scrape, settings=settings)
                started = time.monotonic()
                manager.seed(job, spec)
                stats = manager.wait(job, timeout=timeout, on_progress=on_progress)
                seconds = time.monotonic() - started
            finally:
                agent.stop()
                # The worker's loop notices a stop only between waits for a message of up to
                # 2 s each; a shutdown command is a message, so it ends the wait at once.
                stack.enter_context(_without_log(_REMOTE_SHUTDOWN_LOGGER, _REMOTE_SHUTDOWN))
                app.control.shutdown(destination=[worker.hostname])
        return CrawlResult(job, stats, seconds, runtime.tracker.dead_items(job),
                           expired=runtime.tracker.job_info(job).state is JobState.EXPIRED)
    finally:
        install_runtime(None)
