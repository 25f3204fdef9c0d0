"""RedisTracker's calls on items: add, lease, scrape, fail, heartbeat, reclaim, release."""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Optional, TypeVar

from ...redaction import escape
from ..base import MAX_ADD_BATCH, batches, check_priority
from ..model import (
    AddResult,
    Checkout,
    FailOutcome,
    FailResult,
    Fault,
    LeaseStatus,
    MaintainResult,
    ScrapedResult,
)
from ..revisits import Record
from .connection import converts_redis_errors
from .scripts import dispatched
from .shards import ShardLayout, chunks

# Batches of an add stream sent in one round trip (pipelined), one Lua call each.
ADD_STREAM_PIPELINE = 20
# Most items reclaimed from one in-flight set by one maintenance call.
MAX_RECLAIM_BATCH = 1000
# While items are dispatched or leased, maintain wakes its caller at least this often (seconds):
# a failure may start a backoff shorter than the heartbeat interval.
WAKE_WHILE_LEASED = 1.0
# Reasons kept for dead items are cut to this many characters.
MAX_REASON = 500


def stored_reason(reason: str) -> str:
    """``reason`` as the tracker keeps it: a reason quotes what a site sent (URLs, redirect
    targets, headers), so its control characters are escaped (:func:`escape`) before anyone can
    print it; then cut to MAX_REASON characters."""
    return escape(reason)[:MAX_REASON]


def check_save_as(body: Optional[bytes], save_as: Optional[str], keep_as: Optional[str] = None) -> None:
    """:meth:`Tracker.scraped` stages a body for a save task, or hands the item to its caller's
    own save: never both. Only an item waiting for a save task can be kept."""
    if body is not None and save_as is not None:
        raise ValueError("scraped: a body to stage and save_as exclude each other")
    if save_as is not None and keep_as is not None:
        raise ValueError("scraped: save_as and keep_as exclude each other")


def priorities_text(priorities: Sequence[int]) -> str:
    """The scripts' text of one priority per item (add.lua's ARGV[5]): '' when all are 0 (a
    job that uses no priorities sends nothing more), one number when all are the same."""
    distinct = set(map(check_priority, priorities))
    if not distinct or distinct == {0}:
        return ""
    if len(distinct) == 1:
        return str(priorities[0])
    return " ".join(map(str, priorities))


Value = TypeVar("Value")


def read_ahead(values: Iterable[Value]) -> Iterator[Value]:
    """``values``, each taken from the iterable by a background thread while the consumer works
    on the one before: a seed file's next batch is read and checked while Redis adds the current
    one. At most one value waits; an exception of the iterable is raised here, in its place."""
    handoff: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def put(entry: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                handoff.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for value in values:
                if not put(("value", value)):
                    return
            put(("end", None))
        except BaseException as exc:  # handed to the consumer, which raises it
            put(("error", exc))

    threading.Thread(target=produce, name="distscrape-read-ahead", daemon=True).start()
    try:
        while True:
            kind, value = handoff.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stop.set()  # a consumer that stops early (an error) stops the reading too


class ItemCalls(ShardLayout):
    """An item's way from added to scraped (or back, or dead), each step one script call."""

    def add(self, job: str, items: Sequence[str], depth: int = 0, priority: int = 0) -> AddResult:
        check_priority(priority)
        return self._add_batches(job, list(items), depth, priority)

    def add_stream(
        self, job: str, items: Iterable[str], depth: int = 0, priority: int = 0
    ) -> Iterator[tuple[int, AddResult]]:
        check_priority(priority)
        # The next group is read (from a seed file: decoded and checked) while Redis adds this one.
        for group in read_ahead(batches(items, MAX_ADD_BATCH * ADD_STREAM_PIPELINE)):
            yield len(group), self._add_batches(job, group, depth, priority)

    @converts_redis_errors
    def _add_batches(
        self, job: str, items: Sequence[str], depth: int, priority: int | Sequence[int] = 0
    ) -> AddResult:
        """A short Lua call per MAX_ADD_BATCH items of one shard, pipelined in one round trip
        on one Redis (one call with no items still tops up dispatch, on every shard). On a
        cluster the calls go one by one, each to the node of its shard. ``priority``: one for
        all the items, or one per item."""
        shards = self._shards(job)
        top_up = self._top_up_args(job)
        if isinstance(priority, int):
            groups = self._by_shard(job, items) if items else {s: [] for s in range(shards)}
            calls = [(s, str(priority) if priority else "", chunk)
                     for s, group in sorted(groups.items())
                     for chunk in list(chunks(group, MAX_ADD_BATCH)) or [[]]]
        else:
            ranked = self._by_shard_with(job, list(zip(items, priority)))
            calls = [(s, priorities_text([p for _, p in chunk]), [x for x, _ in chunk])
                     for s, group in sorted(ranked.items())
                     for chunk in chunks(group, MAX_ADD_BATCH)]
        results = self._eval_pipelined("add", [
            (self._item_keys(job, s), [depth, *top_up, text, *chunk]) for s, text, chunk in calls])
        added, dispatch, grew = 0, [], set()
        for (s, _, _), reply in zip(calls, results):
            added += int(reply[0])
            dispatch.extend(dispatched(reply[1:]))
            if int(reply[0]):
                grew.add(s)
        if grew:
            self._mirror_active(job, grew)
        return AddResult(dispatch=dispatch, added=added)

    @converts_redis_errors
    def checkout(
        self, job: str, item: str, worker_id: str, *, max_lost: int, address: str = ""
    ) -> Checkout:
        bound, max_batch, lease = self._top_up_args(job)
        reply = self._eval_combined("checkout", self._item_keys(job, self._shard_of(job, item)),
                                  [item, worker_id, lease, bound, max_batch, max_lost, address])
        return Checkout(
            status=LeaseStatus(reply[0]), depth=int(reply[1]), failed_attempts=int(reply[2]),
            token=int(reply[3]), wait=float(reply[4]), created=reply[5],
            record=Record.from_hex(reply[6]), dispatch=dispatched(reply[7:]),
        )

    @converts_redis_errors
    def scraped(
        self, job: str, item: str, token: int, found: Sequence[str] = (), depth: int = 0,
        body: Optional[bytes] = None, save_as: Optional[str] = None, keep_as: Optional[str] = None,
        cut: int = 0, priorities: Sequence[int] = (), *, carry: bool = False,
    ) -> ScrapedResult:
        check_save_as(body, save_as, keep_as)
        if priorities and len(priorities) != len(found):
            raise ValueError("scraped: one priority per found item, or none")
        home = self._shard_of(job, item)
        # Each found item with its priority (0 for all when none are given).
        groups = self._by_shard_with(job, list(zip(found, priorities or itertools.repeat(0))))
        ranked = groups.pop(home, [])
        # Finds of other shards, and beyond one batch, go first, through add, while the item is
        # still leased: its shard cannot be idle before they are queued, so a sharded job is never
        # seen finished with links still to add. The last batch rides with the state change.
        later = [x for group in groups.values() for x in group]
        while len(ranked) > MAX_ADD_BATCH:
            later.extend(ranked[:MAX_ADD_BATCH])
            ranked = ranked[MAX_ADD_BATCH:]
        added, dispatch = 0, []
        if later:
            added_first = self._add_batches(job, [x for x, _ in later], depth,
                                            [p for _, p in later] if priorities else 0)
            added, dispatch = added_first.added, list(added_first.dispatch)
        # The body is staged in the same round trip as the state change, by a SET before it
        # (the script drops it if the lease is stale); it never goes through Lua.
        body_keys = self._body_keys(job, token, home) if body is not None else []
        reply = self._eval_combined(
            "scraped", [*self._item_keys(job, home), *body_keys],
            [item, token, self.save_timeout, depth, *self._top_up_args(job),
             save_as or "", keep_as or "", int(cut),
             priorities_text([p for _, p in ranked]) if priorities else "",
             "1" if carry else "", *(x for x, _ in ranked)],
            before=[("SET", key, body, "PX", self._body_ttl_ms) for key in body_keys],
        )
        if int(reply[1]):
            self._mirror_active(job, [home])
        return ScrapedResult(
            dispatch=dispatched(reply[2:]) + dispatch, added=added + int(reply[1]),
            held=reply[0] == "ok"
        )

    @converts_redis_errors
    def fail(
        self, job: str, item: str, token: int, reason: str, *, fault: Fault, max_retries: int,
        max_lost: int, retryable: bool = True, delay: float = 0.0,
    ) -> FailResult:
        reply = self._run_item(
            "fail", job, item,
            [item, token, stored_reason(reason), Fault(fault).value, int(retryable), max_retries,
             max_lost, *self._top_up_args(job), max(float(delay), 0.0)],
        )
        return FailResult(dispatch=dispatched(reply[1:]), outcome=FailOutcome(reply[0]))

    @converts_redis_errors
    def extend(
        self, job: str, items: Sequence[str], worker_id: str,
        saves: Sequence[tuple[str, int]] = (), running: Optional[Sequence[str]] = None,
    ) -> int:
        running = list(items) if running is None else list(running)
        extended = 0
        reserved_by, running_by = self._by_shard(job, items), self._by_shard(job, running)
        lease = self.lease_seconds
        for s in sorted(set(reserved_by) | set(running_by)):
            for chunk in chunks(reserved_by.get(s, []), MAX_ADD_BATCH):
                extended += int(self._run("extend", job, [lease, worker_id, len(chunk), *chunk, 0], s))
            for chunk in chunks(running_by.get(s, []), MAX_ADD_BATCH):
                extended += int(self._run("extend", job, [lease, worker_id, 0, len(chunk), *chunk], s))
        for s, pairs in self._pairs_by_shard(job, saves):
            extended += int(self._run("extend", job, [lease, worker_id, 0, 0, *pairs], s))
        return extended

    @converts_redis_errors
    def maintain(self, job: str, *, max_lost: int) -> MaintainResult:
        shards = self._shards(job)
        reclaimed = died = requeued = 0
        dispatch: list[str] = []
        wake: Optional[float] = None
        finished = expired = False
        for s in range(shards):
            reply = self._run(
                "maintain", job,
                [*self._top_up_args(job), MAX_RECLAIM_BATCH, max_lost, WAKE_WHILE_LEASED], s,
            )
            reclaimed, died = reclaimed + int(reply[0]), died + int(reply[1])
            requeued += int(reply[4])
            dispatch.extend(dispatched(reply[5:]))
            if reply[2] and (wake is None or float(reply[2]) < wake):
                wake = float(reply[2])
            finished = finished or reply[3] == "finished"
            expired = expired or reply[3] == "expired"
        if self._routed(shards):
            if shards > 1:
                idle, finished = self._record_finish(job, shards)
            else:
                controls = self._shard_controls(job, shards)
                idle = self._idle(controls) or self._ended(controls)
            # Unlisted only once its end is recorded (or seen recorded): the maintain that
            # records it must still find it listed, even if an earlier one died after its script.
            if idle:
                self._unlist_if_idle(job)
        return MaintainResult(
            dispatch=dispatch, reclaimed=reclaimed, died=died, requeued=requeued, wake=wake,
            finished=finished, expired=expired,
        )

    @converts_redis_errors
    def release(
        self, job: str, worker_id: Optional[str] = None, saves: Sequence[tuple[str, int]] = ()
    ) -> int:
        by_shard = self._group_pairs(job, saves)
        # One call per shard with all its pairs (not chunked): an item the call is not told
        # about is taken to have no message.
        return sum(
            int(self._run("release", job, [worker_id or "", self.save_timeout,
                                           *(x for pair in by_shard.get(s, ()) for x in pair)], s))
            for s in range(self._shards(job)))
