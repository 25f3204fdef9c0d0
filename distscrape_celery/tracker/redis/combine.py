"""Calls that threads of one process make at the same time, sent together (group commit).

A worker process runs its tasks in threads, and the tasks one broker fetch delivers start
together: each leases its item within microseconds of the others, and pages of one site finish
about as close. On Redis a round trip costs as much CPU as dozens of commands inside a script
(docs/performance.md), so a call that comes while another call under the same key is in flight
waits for that one and then goes with every other call that came meanwhile, as one. A call that
comes while none is in flight goes at once: a quiet process waits for nothing, a busy one makes
fewer, larger calls.
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
    __slots__ = ("payload", "weight", "reply", "error", "ready", "lead")

    def __init__(self, payload: Any, weight: int = 1) -> None:
        self.payload = payload
        self.weight = weight
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
    returns it hands the calls that came meanwhile to the first of them, which sends those.
    A send takes at most ``max_calls`` calls and, past its first, ``max_weight`` of their weight
    (what a call costs Redis, in the caller's units): one script call that ran every waiting
    thread's work at once would hold Redis up for all other clients that long."""

    def __init__(self, send: Send, *, max_calls: int = 32, max_weight: int = 2048) -> None:
        self._send = send
        self._max_calls, self._max_weight = max_calls, max_weight
        self._reset()

    def _reset(self) -> None:
        # A child forked while a parent's thread held the lock or led a send would wait forever.
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._groups: dict[Hashable, _Group] = {}

    def call(self, key: Hashable, payload: Any, weight: int = 1) -> Any:
        """Send ``payload`` under ``key`` (alone or with others) and return its reply."""
        if self._pid != os.getpid():
            self._reset()
        own = _Call(payload, weight)
        with self._lock:
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = _Group()
            group.waiting.append(own)
            lead, group.busy = not group.busy, True
        if not lead:
            try:
                own.ready.wait()
            except BaseException:
                self._abandon(group, own)
                raise
            if not own.lead:
                return self._outcome(own)
        with self._lock:
            calls = self._take(group)
        try:
            replies = self._send(key, [c.payload for c in calls])
            if len(replies) != len(calls):
                raise RuntimeError(f"{len(replies)} replies to {len(calls)} calls")
            for c, reply in zip(calls, replies):
                c.reply = reply
        except Exception as exc:
            for c in calls:
                c.error = exc if c is own else _copy(exc)
        except BaseException as exc:
            # Interrupted (a time limit, an exit): the others cannot know what became of their
            # calls, as when their own connection is cut mid-call.
            for c in calls:
                c.error = exc if c is own else redis.ConnectionError(
                    f"a call sent with this one was cut off ({exc!r})")
        finally:
            with self._lock:
                self._hand_on(group)
            for c in calls:
                if c is not own:
                    c.ready.set()
        return self._outcome(own)

    def _take(self, group: _Group) -> list[_Call]:
        """The calls the next send carries, from the head of the queue, which is the caller
        that leads it (under the lock)."""
        n, weight = 1, group.waiting[0].weight
        for c in group.waiting[1:self._max_calls]:
            if weight + c.weight > self._max_weight:
                break
            n, weight = n + 1, weight + c.weight
        calls, group.waiting = group.waiting[:n], group.waiting[n:]
        return calls

    @staticmethod
    def _hand_on(group: _Group) -> None:
        """The lead goes to the first call waiting, if any (under the lock)."""
        if group.waiting:
            group.waiting[0].lead = True
            group.waiting[0].ready.set()
        else:
            group.busy = False

    def _abandon(self, group: _Group, own: _Call) -> None:
        """A waiting caller was interrupted: it leaves the queue, and a lead handed to it goes
        on to the next, or the calls behind it would wait for ever."""
        with self._lock:
            if own in group.waiting:
                group.waiting.remove(own)
            if own.lead:
                self._hand_on(group)

    @staticmethod
    def _outcome(call: _Call) -> Any:
        """The call's reply, or the exception its send raised."""
        if call.error is not None:
            raise call.error
        return call.reply
