"""The total deadline of a download, over every phase: connect, TLS handshake, status line,
headers and body.

Per-read timeouts cannot bound a server that sends one byte at a time. One watchdog thread per
process keeps the deadlines of all downloads in progress in a heap; when one passes, it shuts
down the socket of the connection that download is using, so a read blocked in any phase
returns at once and the thread is free again. Connections learn which download they serve from
a context variable that :func:`total_deadline` sets (each thread of a pool has its own).
"""

from __future__ import annotations

import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Optional

from urllib3.connection import HTTPConnection
from urllib3.connectionpool import HTTPConnectionPool

# The shortest timeout a socket is given once the deadline has passed (0 would make it
# non-blocking, None would make it wait for ever).
_MIN_WAIT = 0.001


class Deadline:
    """When one download must be over (``time.monotonic()`` seconds), and the socket it uses."""

    __slots__ = ("when", "expired", "done", "queued", "conn", "fd")

    def __init__(self, when: float) -> None:
        self.when = when
        self.expired = False  # set by the watchdog when ``when`` has passed
        self.done = False  # the download ended; the watchdog forgets it
        self.queued = True  # still in the watchdog's heap
        self.conn: Optional[HTTPConnection] = None  # the connection ``fd`` belongs to
        # A descriptor of its own (a dup) for the connection's socket, closed when the download
        # ends: http.client closes the connection's own when a response is read up to the close
        # (Connection: close), and urllib3's TLS wrapping detaches the plain one; this one stays
        # valid until then, and is never a reused number of another socket. A bare number: a
        # socket object for it costs several times the dup, and is needed only at expiry.
        self.fd = -1

    def passed(self) -> bool:
        return self.expired or time.monotonic() >= self.when

    def _shutdown(self) -> None:
        """Called with the watchdog's lock held (the descriptor stays open meanwhile)."""
        if self.fd < 0:
            return
        sock = socket.socket(fileno=self.fd)
        try:
            sock.shutdown(socket.SHUT_RDWR)  # every descriptor's reads and writes end
        except OSError:
            pass  # already closed by the peer
        finally:
            sock.detach()

    def _release(self) -> int:
        """Forget the socket; the caller closes the returned descriptor (if not -1)."""
        fd, self.fd, self.conn = self.fd, -1, None
        return fd


_current: ContextVar[Optional[Deadline]] = ContextVar("distscrape_deadline", default=None)


class _Watchdog:
    """One daemon thread that shuts down the connection of every download whose deadline passes.
    Per download: a heap push, a dup() of its socket and three short locks; no thread or timer
    of its own (about 6 microseconds of CPU)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._wake = threading.Condition(self.lock)
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()
        self._finished_in_heap = 0
        self._thread: Optional[threading.Thread] = None

    def start(self, seconds: float) -> Deadline:
        deadline = Deadline(time.monotonic() + seconds)
        with self.lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="distscrape-deadlines", daemon=True)
                self._thread.start()
            earliest = not self._heap or deadline.when < self._heap[0][0]
            heapq.heappush(self._heap, (deadline.when, next(self._order), deadline))
            if earliest:
                self._wake.notify()
        return deadline

    def finish(self, deadline: Deadline) -> None:
        with self.lock:
            deadline.done = True
            fd = deadline._release()
            if fd >= 0:
                os.close(fd)
            if not deadline.queued:
                return
            # Finished downloads stay in the heap until their time (lazy removal, O(1) here);
            # rebuilt when they are most of it, so the heap stays near the downloads in progress.
            self._finished_in_heap += 1
            if self._finished_in_heap > 64 and 2 * self._finished_in_heap > len(self._heap):
                for _when, _n, gone in self._heap:
                    gone.queued = not gone.done
                self._heap = [entry for entry in self._heap if not entry[2].done]
                heapq.heapify(self._heap)
                self._finished_in_heap = 0

    def attach(self, conn: HTTPConnection, sock: socket.socket, new: bool) -> None:
        """``sock`` of ``conn`` now serves the current download (if any): the one to shut down.
        ``new``: a socket just connected; otherwise a kept-alive one, perhaps known already."""
        deadline = _current.get()
        if deadline is None or (deadline.conn is conn and not new):
            return
        fd = os.dup(sock.fileno())
        with self.lock:
            old = deadline._release()
            deadline.fd, deadline.conn = fd, conn
            if deadline.expired:  # it passed while no socket was known (resolving, connecting)
                deadline._shutdown()
        if old >= 0:
            os.close(old)

    def _run(self) -> None:
        with self.lock:
            while True:
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    deadline = heapq.heappop(self._heap)[2]
                    deadline.queued = False
                    if deadline.done:
                        self._finished_in_heap -= 1
                        continue
                    deadline.expired = True
                    deadline._shutdown()
                self._wake.wait(self._heap[0][0] - now if self._heap else None)


_watchdog = _Watchdog()


def _after_fork_in_child() -> None:
    # The parent's watchdog thread does not exist in a forked child (a prefork pool's worker).
    global _watchdog
    _watchdog = _Watchdog()


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextmanager
def total_deadline(seconds: float) -> Iterator[Deadline]:
    """Within the block, every connection of :func:`watched_pool_classes` the current thread
    uses is shut down ``seconds`` after entry: whatever it waits for then fails at once."""
    watchdog = _watchdog
    deadline = watchdog.start(seconds)
    token = _current.set(deadline)
    try:
        yield deadline
    finally:
        _current.reset(token)
        watchdog.finish(deadline)


class _WatchedConnection(HTTPConnection):
    """A connection the watchdog can shut down, whose every socket timeout (connect, each read
    or send) is also at most what is left of the current download's budget."""

    _timeout_value: Optional[float] = None

    @property  # type: ignore[override]
    def timeout(self) -> Any:
        value = self._timeout_value
        deadline = _current.get()
        # Read before each connect attempt (each address of a host) and each read or send phase.
        if deadline is None or not (value is None or isinstance(value, (int, float))):
            return value
        left = max(deadline.when - time.monotonic(), _MIN_WAIT)
        return left if value is None else min(value, left)

    @timeout.setter
    def timeout(self, value: Any) -> None:
        self._timeout_value = value

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _watchdog.attach(self, sock, new=True)  # before the TLS handshake, if any
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        if self.sock is not None:  # a kept-alive connection (a new one connects further on)
            _watchdog.attach(self, self.sock, new=False)
        super().request(*args, **kwargs)


def watched_pool_classes(
    pools: dict[str, type[HTTPConnectionPool]],
) -> dict[str, type[HTTPConnectionPool]]:
    """``pools`` (a ``PoolManager``'s ``pool_classes_by_scheme``) with connections that obey
    :func:`total_deadline`; everything else about them (an SSRF guard's checks) is kept."""
    watched = {}
    for scheme, pool in pools.items():
        conn = type(pool.ConnectionCls.__name__, (_WatchedConnection, pool.ConnectionCls), {})
        watched[scheme] = type(pool.__name__, (pool,), {"ConnectionCls": conn})
    return watched
