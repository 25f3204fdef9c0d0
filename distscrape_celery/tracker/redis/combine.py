"""Calls that threads of one process make at the same time, sent together (group commit).

A worker process runs its tasks in threads, and the tasks one broker fetch delivers start
together: each leases its item within microseconds of the others, and pages of one site finish
about as close. On Redis a round trip costs as much CPU as dozens of commands inside a script
(docs/performance.md), so a call that comes while another call of its kind is in flight waits for
that one and then goes with every other call that came meanwhile, as one. A call that comes while
none is in flight goes at once: a quiet process waits for nothing, a busy one makes fewer, larger
calls.
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import redis

# send(key, payloads) -> one reply per payload, in order.
Send = Callable[[Hashable, Sequence[Any]], Sequence[Any]]


def _copy(exc: Exception) -> Exception:
    """An exception of its own for each caller: one instance raised in several threads would
    collect all their tracebacks."""
    try:
        return copy.copy(exc)
    except Exception:
        return exc


class _Call:
    __slots__ = ("payload", "reply", "error", "ready", "lead")

    def __init__(self, payload: Any) -> None:
        self.payload = payload
        self.reply: Any = None
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.lead = False


class _Group:
    __slots__ = ("waiting", "busy")

    def __init__(self) -> None:
        self.waiting: list[_Call] = []
        self.busy = False


class Combiner:
    """Runs ``send`` for the calls of one key that come while an earlier call of that key is in
    flight, all at once; each caller gets its own reply, or the exception that the send raised.
    No thread of its own: the first caller to find no call in flight sends, and when its send
    returns it hands the calls that came meanwhile to the first of them, which sends those."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._reset()

    def _reset(self) -> None:
        # A child forked while a parent's thread held the lock or led a send would wait forever.
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._groups: dict[Hashable, _Group] = {}

    def call(self, key: Hashable, payload: Any) -> Any:
        """Send ``payload`` under ``key`` (alone or with others) and return its reply."""
        if self._pid != os.getpid():
            self._reset()
        me = _Call(payload)
        with self._lock:
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = _Group()
            group.waiting.append(me)
            lead, group.busy = not group.busy, True
        if not lead:
            try:
                me.ready.wait()
            except BaseException:
                self._abandon(group, me)
                raise
            if not me.lead:
                return self._outcome(me)
        with self._lock:
            calls, group.waiting = group.waiting, []
        try:
            replies = self._send(key, [c.payload for c in calls])
            if len(replies) != len(calls):
                raise RuntimeError(f"{len(replies)} replies to {len(calls)} calls")
            for c, reply in zip(calls, replies):
                c.reply = reply
        except Exception as exc:
            for c in calls:
                c.error = exc if c is me else _copy(exc)
        except BaseException as exc:
            # Interrupted (a time limit, an exit): the others cannot know what became of their
            # calls, as when their own connection is cut mid-call.
            for c in calls:
                c.error = exc if c is me else redis.ConnectionError(
                    f"a call sent with this one was cut off ({exc!r})")
        finally:
            with self._lock:
                self._hand_on(group)
            for c in calls:
                if c is not me:
                    c.ready.set()
        return self._outcome(me)

    @staticmethod
    def _hand_on(group: _Group) -> None:
        """The lead goes to the first call waiting, if any (under the lock)."""
        if group.waiting:
            group.waiting[0].lead = True
            group.waiting[0].ready.set()
        else:
            group.busy = False

    def _abandon(self, group: _Group, me: _Call) -> None:
        """A waiting caller was interrupted: it leaves the queue, and a lead handed to it goes
        on to the next, or the calls behind it would wait for ever."""
        with self._lock:
            if me in group.waiting:
                group.waiting.remove(me)
            if me.lead:
                self._hand_on(group)

    @staticmethod
    def _outcome(call: _Call) -> Any:
        """The call's reply, or the exception its send raised."""
        if call.error is not None:
            raise call.error
        return call.reply
