"""How the one-command crawl ends: signals that unwind it cleanly, and children that notice when
their parent is gone.

``distscrape crawl`` starts a ``redis-server`` and a ``celery worker`` in sessions of their own,
so that a Ctrl-C on the terminal reaches the crawl only and the crawl stops them in order. Then
the crawl itself must turn every way of being told to stop into an ordinary unwind:

* :func:`stop_signals` makes the first SIGINT raise :class:`KeyboardInterrupt` and the first
  SIGTERM or SIGHUP raise :class:`Terminated`, so ``finally`` blocks and context managers stop
  what was started. One that arrives while a :func:`shielded` cleanup runs is raised when the
  cleanup is over. Any later signal raises nothing: it sets :data:`hurry`, and the cleanup then
  kills instead of waiting.
* :func:`die_with_parent` is a ``preexec_fn`` for the children: on Linux they get SIGTERM when
  the thread that started them ends, which covers a SIGKILLed parent, where nothing else can run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Optional

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived. A BaseException, like KeyboardInterrupt, so that no
    ``except Exception`` swallows it on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        """128 + the signal number, as a shell reports a command killed by it (143, 129)."""
        return 128 + self.signum


hurry = threading.Event()
"""Set when a second stop signal arrives: a cleanup that waits should stop waiting and kill."""

_installed = False
_unwinding = False
_shield_depth = 0
_pending: Optional[int] = None
_first: tuple[int, float] = (0, 0.0)  # the first stop signal and when it came

ECHO_SECONDS = 0.5
"""The same signal again within this time is the same request, not a second one: `timeout`
signals its command and then its whole process group, and a terminal signals every process of
its foreground group, so one request may arrive twice."""


def _raise_for(signum: int) -> None:
    global _unwinding
    _unwinding = True
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


def _on_signal(signum: int, _frame: object) -> None:
    global _pending, _first
    now = time.monotonic()
    if _first[0] == signum and now - _first[1] < ECHO_SECONDS:
        return
    if not _first[0]:
        _first = (signum, now)
    if _unwinding or _shield_depth:
        if not _unwinding and _pending is None:
            _pending = signum  # raised when the shielded cleanup, which stops things anyway, is over
        else:
            hurry.set()  # a second request: stop waiting
        return
    _raise_for(signum)


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """Turn SIGINT, SIGTERM and SIGHUP into exceptions while the block runs (main thread only;
    elsewhere it does nothing). A signal this process was started with ignored (``nohup``, a
    background job of a non-interactive shell) stays ignored. The previous handlers come back
    afterwards."""
    global _installed, _unwinding, _pending, _first
    if threading.current_thread() is not threading.main_thread() or _installed:
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    hurry.clear()
    _unwinding, _pending, _installed, _first = False, None, True, (0, 0.0)
    try:
        for sig, handler in previous.items():
            if handler != signal.SIG_IGN:
                signal.signal(sig, _on_signal)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _installed = False


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Run a cleanup that a stop signal must not cut short. The first signal that arrives
    meanwhile is raised once the cleanup is over; a second one sets :data:`hurry`."""
    global _shield_depth, _pending
    _shield_depth += 1
    try:
        yield
    finally:
        _shield_depth -= 1
        if _shield_depth == 0 and _pending is not None and not _unwinding:
            signum, _pending = _pending, None
            _raise_for(signum)


# -- children that die with their parent -----------------------------------------------------

_PR_SET_PDEATHSIG = 1
_prctl: Optional[Callable[..., int]] = None
if sys.platform.startswith("linux"):
    try:
        import ctypes

        _prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - no usable libc
        _prctl = None


def child_pids(pid: int) -> Optional[list[int]]:
    """The live children that the main thread of process ``pid`` forked (Linux's
    /proc/PID/task/PID/children); None where that list cannot be read."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return None
    return [int(child) for child in text.split()]


def die_with_parent(sig: int = signal.SIGTERM) -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` that makes the child receive ``sig`` when this thread ends (Linux
    ``PR_SET_PDEATHSIG``), or None where that does not exist or would be wrong.

    The kernel ties it to the *thread* that forks, so it is used only from the main thread,
    whose end is the process's end. It covers SIGKILL of the parent; it does not cover the
    children of the child (the worker's pool processes rely on the worker's own shutdown), nor
    a parent that lives on but hangs, nor anything on other platforms.
    """
    if _prctl is None or threading.current_thread() is not threading.main_thread():
        return None
    prctl, parent = _prctl, os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above: too late for it
            os._exit(1)

    return preexec
