"""Gathers what the tasks of one worker process hand over, and passes it on in groups.

A page's save as a Celery task of its own costs about a quarter of the page's CPU (publishing,
delivery, the worker's request; docs/performance.md). Grouped, one message carries the
saves of many pages.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# How many groups may wait behind one that is being sent before add() blocks its caller: a broker
# that stopped answering must slow the scrapes down, not fill the process's memory.
BACKLOG_GROUPS = 4


class Batcher(Generic[T]):
    """Collects entries from any thread and calls ``flush(entries)`` from a thread of its own,
    once ``max_items`` wait or the oldest has waited ``max_wait`` seconds.

    ``flush`` owns its entries: whatever it raises is logged and the entries are not offered
    again, so it must hand back what it could not pass on itself. After a fork the child starts
    empty (its parent's entries are the parent's to send).
    """

    def __init__(
        self, flush: Callable[[list[T]], None], *, max_items: int, max_wait: float, name: str
    ) -> None:
        if max_items < 1:
            raise ValueError(f"max_items must be at least 1, not {max_items}")
        self._flush = flush
        self.max_items = max_items
        self.max_wait = max_wait
        self.name = name
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._entries: list[T] = []
        self._first_at = 0.0
        self._sending = 0  # entries taken by the thread and not flushed yet
        self._closed = False
        self._thread: threading.Thread | None = None

    def add(self, entry: T) -> None:
        """Queue ``entry`` for the next group. Blocks while too many groups wait already."""
        if self._pid != os.getpid():
            self._reset()
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self.name} is closed")
            while len(self._entries) >= BACKLOG_GROUPS * self.max_items:
                self._cond.wait(0.1)
            if not self._entries:
                self._first_at = time.monotonic()
            self._entries.append(entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            if len(self._entries) == 1 or len(self._entries) >= self.max_items:
                self._cond.notify_all()

    def pending(self) -> int:
        """Entries added and not flushed yet (being flushed included)."""
        with self._cond:
            return len(self._entries) + self._sending

    def _take(self) -> list[T]:
        """The next group, once it is due; an empty list once closed and drained."""
        with self._cond:
            while True:
                if self._entries:
                    due = self._first_at + self.max_wait - time.monotonic()
                    if self._closed or len(self._entries) >= self.max_items or due <= 0:
                        group = self._entries[: self.max_items]
                        del self._entries[: self.max_items]
                        # What is left was added later; it waits at most max_wait from now.
                        self._first_at = time.monotonic()
                        self._sending = len(group)
                        self._cond.notify_all()
                        return group
                    self._cond.wait(due)
                elif self._closed:
                    return []
                else:
                    self._cond.wait()

    def _run(self) -> None:
        while True:
            group = self._take()
            if not group:
                return
            try:
                self._flush(group)
            except Exception:
                log.exception("%s: could not pass on %d entries", self.name, len(group))
            finally:
                with self._cond:
                    self._sending = 0
                    self._cond.notify_all()

    def flush(self, timeout: float = 30.0) -> bool:
        """Send everything added so far now, and wait until it is sent (up to ``timeout``
        seconds). True if nothing is left waiting."""
        deadline = time.monotonic() + timeout
        with self._cond:
            if self._pid != os.getpid() or self._thread is None:
                return not self._entries
            self._first_at = -self.max_wait  # due now
            self._cond.notify_all()
            while self._entries or self._sending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def close(self, timeout: float = 30.0) -> bool:
        """Send what is left and stop the thread; later adds raise. True if all was sent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread if self._pid == os.getpid() else None
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True
