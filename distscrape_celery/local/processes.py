"""Real Celery worker processes on this machine, for the one-command crawl and for tests."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from collections.abc import Sequence
from typing import Optional

from ..errors import EmbeddedServiceError
from ..lifecycle import child_pids, die_with_parent
from ..settings import Settings


# The directory this process imported distscrape_celery from.
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent.parent)


def _same_package_path(env: dict[str, str]) -> dict[str, str]:
    """The environment a worker needs to import the distscrape_celery this process runs.
    ``python -m`` puts the working directory first on the module path, where another copy of
    the package (a source checkout of another version) would win, and the two would disagree on
    the tracker's layout: Python 3.11 and later leave it out with PYTHONSAFEPATH, and this
    package's own directory goes first on PYTHONPATH. The working directory stays on it, after
    the package, where this process has it too (run as ``python -m``: plug-in modules there
    load in both)."""
    cwd = os.getcwd()
    ours = [cwd] if ("" in sys.path or cwd in sys.path) else []
    path = [_PACKAGE_ROOT, *ours, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return {"PYTHONSAFEPATH": "1", "PYTHONPATH": os.pathsep.join(dict.fromkeys(path))}


class WorkerProcess:
    """``celery -A distscrape_celery worker`` as a child process in its own session and process
    group, so that a Ctrl-C on our terminal does not reach it (we stop it in order) and killing
    it takes its pool processes too. On Linux, started from the main thread, it gets SIGTERM
    when this process dies, even by SIGKILL (see :mod:`~distscrape_celery.lifecycle`)."""

    def __init__(
        self,
        settings: Settings,
        *,
        name: str = "distscrape-local",
        concurrency: int = 2,
        pool: str = "prefork",
        loglevel: str = "WARNING",
        log_dir: Optional[str] = None,
        extra_env: Optional[dict[str, str]] = None,
        include: Sequence[str] = (),
        forks: Optional[Sequence[int]] = None,
    ) -> None:
        self.settings = settings
        self.name = name
        self.concurrency = concurrency
        self.pool = pool
        self.loglevel = loglevel
        # A log directory we made is ours to remove; one we were given is the caller's.
        self._own_log_dir = log_dir is None
        self.log_path = Path(log_dir or tempfile.mkdtemp(prefix="distscrape-worker-"), f"{name}.log")
        self.extra_env = extra_env or {}
        self.include = list(include)  # modules the worker imports (e.g. job_finished hooks)
        # Several workers forked from one process, one per concurrency (worker.main --forks),
        # named NAME-1, NAME-2, ...; the process started here supervises them.
        self.forks = list(forks) if forks else None
        self.proc: Optional[subprocess.Popen] = None

    def command(self) -> list[str]:
        # The same worker as `celery -A distscrape_celery worker`, started without Celery's
        # command line and its plugins (see worker.main).
        return [
            sys.executable, "-m", "distscrape_celery.worker.main",
            "-Q", f"{self.settings.scrape_queue},{self.settings.save_queue}", "-P", self.pool,
            *(["--forks", ",".join(map(str, self.forks))] if self.forks
              else ["-c", str(self.concurrency)]),
            "-n", f"{self.name}@%h", "--loglevel", self.loglevel,
            "--without-gossip", "--without-mingle",
            *(["-I", ",".join(self.include)] if self.include else []),
        ]

    def start(self) -> "WorkerProcess":
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")}
        env.update(self.settings.to_env())
        env.update(_same_package_path(env))
        env.update(self.extra_env)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(), env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGTERM),
            )
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def check(self) -> None:
        """Raise if the worker exited on its own."""
        if self.proc is not None and self.proc.poll() is not None:
            raise EmbeddedServiceError(
                f"worker {self.name} exited with code {self.proc.returncode}; "
                f"last log lines:\n{self.log_tail()}"
            )

    def forked_pids(self) -> list[int]:
        """The workers the started process forked and still supervises (``forks`` only)."""
        if self.proc is None or not self.forks:
            return []
        return child_pids(self.proc.pid) or []

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the worker's whole process group (parent and pool processes), and
        to each forked worker's own group (see worker.main), before their supervisor's."""
        if self.proc is None:
            return
        for pid in [*self.forked_pids(), self.proc.pid]:
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = 20.0, hurry: Optional[threading.Event] = None) -> None:
        """Warm shutdown, then SIGKILL of the whole group if it takes longer than ``timeout`` s
        or once ``hurry`` is set.

        SIGTERM goes to the worker's main process only: Celery then stops taking messages and
        waits for its running tasks, and the agent gives back whatever the worker still holds.
        The pool processes must not get it themselves: they die at once on SIGTERM, and the
        downloads they were running would be thrown away.
        """
        if self.proc is not None:
            if self.proc.poll() is None:
                self.kill(signal.SIGCONT)  # a stopped worker cannot act on SIGTERM
                try:
                    self.proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
                deadline = time.monotonic() + timeout
                while (self.proc.poll() is None and time.monotonic() < deadline
                       and not (hurry is not None and hurry.is_set())):
                    time.sleep(0.05)
            self.kill(signal.SIGKILL)  # also reaps pool processes a crashed parent left behind
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if self._own_log_dir:
            shutil.rmtree(self.log_path.parent, ignore_errors=True)


def can_fork_workers() -> bool:
    """Whether workers may be forked from one supervisor here (worker.main ``--forks``): Linux
    only, where a forked worker ends with its supervisor and the supervisor's children can be
    listed, so that :meth:`WorkerProcess.kill` reaches every one."""
    return sys.platform.startswith("linux") and child_pids(os.getpid()) is not None


def wait_for_workers(tracker, count: int, timeout: float = 60.0, procs=()) -> None:
    """Block until ``count`` workers are alive in the tracker."""
    deadline = time.monotonic() + timeout
    while sum(1 for w in tracker.workers() if w.alive) < count:
        for p in procs:
            p.check()
        if time.monotonic() > deadline:
            raise EmbeddedServiceError(f"fewer than {count} worker(s) came up within {timeout:.0f}s")
        time.sleep(0.1)

