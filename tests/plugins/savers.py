"""Savers that misbehave on request, for the save fault tests (tests/faults/test_save_faults.py).

Workers are separate processes, so a test instructs them through files in a control directory
next to the output directory (``<output>.ctl``), never inside it: the output must hold exactly the
site's pages. Every file here is written by one process and read by another, so each event is one
``O_APPEND`` write of one line (lines from many processes never interleave).

Control files (one item per line):

``crash_once``    SIGKILL the saving process the first time each of these items is saved (a marker
                  ``crashed/<sha1>`` is written and fsynced before the kill, so the second save
                  goes through)
``crash_always``  SIGKILL the saving process every time one of these items is saved
``pause``         lines "<seconds> <item>": the first save of the item writes ``paused/<sha1>``
                  (holding the pid) and sleeps that long before it writes

The log ``saves.log`` gets one tab-separated line per event: ``call pid time item`` when a
save starts, ``kill ...`` just before a SIGKILL, ``pause ...`` before a pause, and ``wrote ...``
after the file was written.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections import Counter
from pathlib import Path

from distscrape_celery.savers import FileItemSaver
from distscrape_celery.savers.postgres import PostgresItemSaver


def control_dir(output: str | os.PathLike) -> Path:
    """Where the tests and the savers of an output directory exchange instructions and logs."""
    return Path(str(Path(os.path.abspath(output))) + ".ctl")


def _sha1(item: str) -> str:
    return hashlib.sha1(item.encode()).hexdigest()


def _append(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_durably(path: Path, text: str) -> bool:
    """Create ``path`` holding ``text`` and make it durable; False if it existed already."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return True


def _lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


class LoggingSaver(FileItemSaver):
    """FileItemSaver that logs every call and every write to ``<output>.ctl/saves.log``."""

    def _log(self, event: str, item: str) -> None:
        _append(self.ctl / "saves.log", f"{event}\t{os.getpid()}\t{time.time():.3f}\t{item}\n")

    @property
    def ctl(self) -> Path:
        return control_dir(self.output)

    def save(self, item, download):
        self.ctl.mkdir(parents=True, exist_ok=True)
        self._log("call", item)
        self.before_write(item)
        where = super().save(item, download)
        self._log("wrote", item)
        return where

    def before_write(self, item: str) -> None:
        pass


class CrashingSaver(LoggingSaver):
    """LoggingSaver that kills its own process, or pauses, on the items the control files name."""

    def _kill(self, item: str) -> None:
        self._log("kill", item)
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # never reached: SIGKILL cannot be caught

    def before_write(self, item: str) -> None:
        ctl = self.ctl
        if item in _lines(ctl / "crash_always"):
            self._kill(item)
        if item in _lines(ctl / "crash_once"):
            if _create_durably(ctl / "crashed" / _sha1(item), item):
                self._kill(item)
        for line in _lines(ctl / "pause"):
            seconds, _, target = line.partition(" ")
            if target == item and _create_durably(ctl / "paused" / _sha1(item), str(os.getpid())):
                self._log("pause", item)
                time.sleep(float(seconds))


# -- for the tests: reading what the savers did ------------------------------------------------

def save_events(output) -> list[tuple[str, int, float, str]]:
    """(event, pid, time, item) for every line of the saver log, in order."""
    out = []
    for line in _lines(control_dir(output) / "saves.log"):
        event, pid, at, item = line.split("\t", 3)
        out.append((event, int(pid), float(at), item))
    return out


def event_counts(output, event: str) -> Counter:
    """How many times each item had ``event`` ("call", "kill", "pause", "wrote")."""
    return Counter(item for ev, _, _, item in save_events(output) if ev == event)


def instruct(output, name: str, lines) -> None:
    """Write the control file ``name`` (crash_once, crash_always, pause) for the savers of
    ``output``."""
    ctl = control_dir(output)
    ctl.mkdir(parents=True, exist_ok=True)
    tmp = ctl / (name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, ctl / name)


def paused_pid(output, item: str):
    """The pid of the process that paused in the save of ``item``, or None so far."""
    try:
        text = (control_dir(output) / "paused" / _sha1(item)).read_text()
    except FileNotFoundError:
        return None
    return int(text) if text else None


class GroupCrashingSaver(FileItemSaver):
    """FileItemSaver whose group commit (``save_many``, one per save batch) SIGKILLs its process
    once for each item named in ``crash_once``: after the group's bodies are in their temporary
    files, before the first flush and before any rename. Logs ``call`` for each item of a group
    (and of a single save), ``kill``, and ``wrote`` once a group or a save returned. It swaps the
    saver module's ``syncfs`` for the length of a group: for prefork workers, whose processes save
    one batch at a time."""

    _log = LoggingSaver._log
    ctl = LoggingSaver.ctl

    def save_many(self, entries):
        from distscrape_celery.savers import files

        self.ctl.mkdir(parents=True, exist_ok=True)
        for item, _ in entries:
            self._log("call", item)
        victims = set(_lines(self.ctl / "crash_once"))
        doomed = [item for item, _ in entries
                  if item in victims and _create_durably(self.ctl / "crashed" / _sha1(item), item)]
        real = files._syncfs
        if doomed and real is not None and len(entries) > 1:
            def syncfs(directory):
                self._log("kill", doomed[0])
                os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(60)

            files._syncfs = syncfs
        try:
            out = super().save_many(entries)
        finally:
            files._syncfs = real
        for (item, _), where in zip(entries, out):
            if isinstance(where, str):
                self._log("wrote", item)
        return out


class CommitCrashingPostgresSaver(PostgresItemSaver):
    """PostgresItemSaver that SIGKILLs its process once for each item named in ``crash_once``
    of the control directory of the spec's ``output`` (which the postgres saver itself does not
    use): after the item's records are committed, before the tracker hears that it is saved.
    Logs ``wrote`` for each item of a committed save (single or batch) and ``kill``."""

    output = ""
    _log = LoggingSaver._log
    ctl = LoggingSaver.ctl

    @classmethod
    def for_worker(cls, spec, *, job, worker_id, settings):
        saver = super().for_worker(spec, job=job, worker_id=worker_id, settings=settings)
        saver.output = spec.output
        return saver

    def save_many(self, entries):
        self.ctl.mkdir(parents=True, exist_ok=True)
        out = super().save_many(entries)
        for (item, _), where in zip(entries, out):
            if isinstance(where, str):
                self._log("wrote", item)
        victims = set(_lines(self.ctl / "crash_once"))
        doomed = [item for (item, _), where in zip(entries, out)
                  if isinstance(where, str) and item in victims
                  and _create_durably(self.ctl / "crashed" / _sha1(item), item)]
        if doomed:
            self._log("kill", doomed[0])
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)  # never reached: SIGKILL cannot be caught
        return out
