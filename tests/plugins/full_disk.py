"""A saver whose output disk is full while a marker file exists, for
tests/faults/test_worker_faults.py.

Workers are separate processes, so the test switches the "disk" between full and not full with a
marker file next to the output directory (``<output>.disk-full``), never inside it: the output
must hold exactly the site's pages. While the marker exists, every save fails the way
:class:`FileItemSaver` fails on a full disk: a ``SaveError`` raised from ``OSError(ENOSPC)``.

Every attempt is logged to ``<output>.saves.log`` as one ``O_APPEND`` line
``<event>\\t<pid>\\t<process group>\\t<time.time()>\\t<item>`` with event ``full`` (refused:
disk full) or ``wrote``. The process group tells which worker saved (a ``WorkerProcess`` leads
its own group), and ``time.time()`` is the saving process's own clock.
"""

from __future__ import annotations

import errno
import os
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from distscrape_celery.errors import SaveError
from distscrape_celery.savers import FileItemSaver


def marker_path(output) -> Path:
    """While this file exists, the disk of ``output`` is full."""
    return Path(os.path.abspath(output) + ".disk-full")


def log_path(output) -> Path:
    return Path(os.path.abspath(output) + ".saves.log")


def _log(output, event: str, item: str) -> None:
    line = f"{event}\t{os.getpid()}\t{os.getpgrp()}\t{time.time():.3f}\t{item}\n"
    _append(log_path(output), line)


def _append(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# How long a write takes to fail on the full disk (it got partway, as a real one would); the
# workers' environment may set it.
FULL_WRITE_SECONDS = float(os.environ.get("DISTSCRAPE_TEST_FULL_WRITE_SECONDS") or 0.02)


class FullDiskSaver(FileItemSaver):
    """FileItemSaver that fails with ENOSPC while ``marker_path(output)`` exists."""

    def save(self, item, download):
        if marker_path(self.output).exists():
            _log(self.output, "full", item)
            time.sleep(FULL_WRITE_SECONDS)
            target = self.output / self.name_for(item)
            cause = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            raise SaveError(f"cannot write {str(target)!r}: {cause.strerror}") from cause
        where = super().save(item, download)
        _log(self.output, "wrote", item)
        return where


# -- for the tests ---------------------------------------------------------------------------

class Event(NamedTuple):
    event: str  # "full" or "wrote"
    pid: int
    pgrp: int  # the worker's process group (its main process's pid)
    clock: float  # time.time() in the saving process
    item: str


def events(output) -> list[Event]:
    """Every save attempt so far, in order."""
    try:
        text = log_path(output).read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split("\t", 4)
        if len(parts) == 5:
            event, pid, pgrp, clock, item = parts
            out.append(Event(event, int(pid), int(pgrp), float(clock), item))
    return out


def event_counts(output, event: str) -> Counter:
    """How many times each item had ``event`` ("full" or "wrote")."""
    return Counter(e.item for e in events(output) if e.event == event)
