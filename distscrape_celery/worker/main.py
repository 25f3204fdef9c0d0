"""Start Celery workers of this app without Celery's command line, for the worker processes that
``distscrape crawl`` and the tests start themselves.

``python -m distscrape_celery.worker.main -Q QUEUES -P POOL -c N -n NAME -l LEVEL
[--without-gossip] [--without-mingle] [-I MODULES] [--forks C1,C2,...]`` runs the same worker as
``celery -A distscrape_celery worker`` with those options: the same ``app.Worker`` class, its signal
handling and exit code. What it leaves out is Celery's command line, which loads every subcommand
and plugin (Flower's web app, click-repl, prompt_toolkit) before it starts a worker: about a
quarter of a worker's CPU from start to ready (docs/performance.md), paid by every worker of every
crawl. Hosts of a distributed crawl keep using ``celery -A distscrape_celery worker``.

With ``--forks``, this process imports what a worker needs once and then forks one worker per
number given, each with that concurrency and ``-1``, ``-2``, ... after the node name's first part.
Importing costs about 0.4 s of CPU per process; ``distscrape crawl`` starts two workers per core,
and on a small machine the ones still importing would take that CPU from the first already
crawling. This process stays as their supervisor: a stop signal it gets goes to every worker (a
warm shutdown each), and a worker that exits on its own stops the others, so that whoever started
them sees one process that exits when the workers do, with the first failing worker's code.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import os
import platform
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn, Optional

from ..lifecycle import die_with_parent

# Signals the supervisor passes on to its workers, which act on them as Celery workers do.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _concurrencies(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(
            f"--forks wants positive whole numbers separated by commas, not {text!r}")
    return values


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m distscrape_celery.worker.main", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("-Q", "--queues", required=True, help="comma-separated queue names")
    parser.add_argument("-P", "--pool", default="threads", help="prefork, threads or solo")
    parser.add_argument("-c", "--concurrency", type=int, default=None)
    parser.add_argument("-n", "--hostname", default=None, help="node name; %%h is the host")
    parser.add_argument("-l", "--loglevel", default="WARNING")
    parser.add_argument("--without-gossip", action="store_true")
    parser.add_argument("--without-mingle", action="store_true")
    parser.add_argument("-I", "--include", default="", help="comma-separated modules to import")
    parser.add_argument("--forks", type=_concurrencies, default=None, metavar="C1,C2,...",
                        help="fork one worker per number, with that concurrency (instead of -c)")
    args = parser.parse_args(argv)
    if args.forks is not None and args.concurrency is not None:
        parser.error("give either -c or --forks, not both")
    return args


def forked_name(hostname: Optional[str], index: int) -> str:
    """``name@host`` → ``name-INDEX@host`` (the default node name ``celery@%h`` if none)."""
    name, at, host = (hostname or "celery@%h").partition("@")
    return f"{name}-{index}{at}{host}"


def run_worker(args: argparse.Namespace, hostname: Optional[str], concurrency: Optional[int]) -> int:
    """Run one worker in this process until it stops; its exit code."""
    from celery.utils.nodenames import default_nodename, host_format

    from .app import app

    worker = app.Worker(
        hostname=host_format(default_nodename(hostname)),
        pool_cls=args.pool,
        concurrency=concurrency,
        queues=args.queues,
        loglevel=args.loglevel,
        without_gossip=args.without_gossip,
        without_mingle=args.without_mingle,
        include=[m for m in args.include.split(",") if m],
    )
    worker.start()
    return worker.exitcode or 0


# What a worker imports on its way to ready, beyond the app and its tasks (listed from a worker's
# sys.modules). One a Celery version lacks is skipped: each worker then imports its own.
WORKER_MODULES = (
    "celery.apps.worker", "celery.worker.components", "celery.worker.consumer",
    "celery.worker.consumer.delayed_delivery", "celery.worker.strategy", "celery.worker.autoscale",
    "celery.app.amqp", "celery.app.control", "celery.app.events", "celery.app.log",
    "celery.app.routes", "celery.backends.base", "celery.events.dispatcher",
    "celery.events.receiver", "kombu.asynchronous.hub", "kombu.pidbox", "kombu.mixins",
    "billiard.pool", "encodings.idna",
)


def _preload(pool: str) -> None:
    """Import, before forking, what each worker would import on its way to ready."""
    from celery.concurrency import get_implementation

    # The app's tasks and hooks, and through them the pipeline, components and savers.
    from . import signals, tasks  # noqa: F401

    for name in WORKER_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    get_implementation(pool)
    # Celery's start-up banner asks for it, and on Linux it runs `uname -p` in a subprocess:
    # asked once here, each forked worker finds it cached.
    platform.platform()


def _exit_status(status: int) -> int:
    """A child's exit code, or 128 + the signal that killed it, as a shell reports it."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


preloaded_modules: frozenset[str] = frozenset()
"""In a forked worker: the modules its supervisor had imported when it forked."""


class _Supervisor:
    """The forked workers' parent: it passes a stop signal on to every worker, and waits until
    they have all exited."""

    def __init__(self) -> None:
        self.children: set[int] = set()
        self.stopping = 0  # the stop signal passed on, once there is one

    def forward(self, signum: int, _frame: object) -> None:
        """Signal handler: send ``signum`` to every worker, and remember it."""
        self.stopping = signum
        for pid in self.children:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def wait(self) -> int:
        """Wait until every worker has exited; the first failing one's exit code, else 0."""
        result = 0
        while self.children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            if pid not in self.children:
                continue
            self.children.remove(pid)
            code = _exit_status(status)
            result = result or code
            if not self.stopping:
                # A worker that stops on its own (a crash, a remote shutdown) stops the rest:
                # the caller watches this one process.
                self.forward(signal.SIGTERM, None)
        return result


def _be_forked_worker(args: argparse.Namespace, index: int, concurrency: int,
                      handlers: dict, tie_to_us: Optional[Callable[[], None]]) -> NoReturn:
    """In a child just forked: undo the supervisor's signal handling, run worker ``index``
    until it stops, and exit with its code."""
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)
    # A session of its own, as a worker started by itself would have: Linux shares the CPU
    # fairly between sessions (autogroups) first, and four workers in one session would get no
    # more of it than the Redis server beside them (measured: 8-12 % fewer pages/s;
    # docs/performance.md).
    os.setsid()
    if tie_to_us is not None:
        tie_to_us()  # the supervisor SIGKILLed: a warm shutdown, as for a stop signal
    code = 1
    try:
        code = run_worker(args, forked_name(args.hostname, index), concurrency)
    except SystemExit as exc:  # a stop signal before Celery's own handlers (agent)
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        # Never back into the supervisor's loop; exit as a worker would, through its exit
        # handlers (the agent's gives back what it holds and deregisters).
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run_forked(args: argparse.Namespace) -> int:
    """Fork the workers, then supervise them until every one has exited."""
    global preloaded_modules
    _preload(args.pool)
    preloaded_modules = frozenset(sys.modules)
    # What the children inherit is left out of their collections (as Python's gc.freeze docs
    # advise before a fork): a child's collection at ready (freeze_startup_objects) would
    # otherwise walk all of it and write to every object's header, copying each page of the
    # parent's memory it touched.
    gc.collect()
    gc.freeze()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # or each child would write the parent's buffered output again
    tie_to_us = die_with_parent(signal.SIGTERM)
    supervisor = _Supervisor()
    previous = {sig: signal.signal(sig, supervisor.forward) for sig in FORWARDED_SIGNALS}
    for index, concurrency in enumerate(args.forks, 1):
        if supervisor.stopping:
            break
        # Held back across the fork, so that a child never runs the supervisor's handler.
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
        pid = os.fork()
        if pid == 0:
            _be_forked_worker(args, index, concurrency, previous, tie_to_us)
        supervisor.children.add(pid)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)
    if supervisor.stopping:
        supervisor.forward(supervisor.stopping, None)  # for a child forked as the signal came
    return supervisor.wait()


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.forks is not None:
        return run_forked(args)
    return run_worker(args, args.hostname, args.concurrency)


if __name__ == "__main__":
    # Run as distscrape_celery.worker.main, not as __main__, so that a worker's modules see the
    # one module (preloaded_modules).
    from distscrape_celery.worker.main import main as _main

    sys.exit(_main())
