"""Save messages that left the Redis broker with a worker that died before it took their items
over (ack emulation off: docs/architecture.md, "Late acknowledgement and ack emulation").

Such an item is save pending with no holder ("- <token>") and its message is in no queue. The
same holds for a page whose worker died before it sent the page's save message: with this check
at work, a scraped page waits for its message with no holder from the start
(``Runtime.finds_lost_saves``). The broker holds few messages (the tracker's dispatch bound), so
a live worker reads the save queue and ends the wait of the items whose message is not there at
three checks in a row: they are reclaimed about a lease after they were scraped instead of after
the save timeout. A worker that receives a save message takes its items over at its next
heartbeat, so three checks, two heartbeats apart, leave a live receiver a heartbeat to spare; one
that could not take them over for two whole heartbeats costs its pages one download again
(its late save finds the lease stale). Nothing is lost either way.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterable

import redis
from kombu.transport.redis import PRIORITY_STEPS, Channel

from ..tracker import Tracker
from .names import SAVE_BATCH_TASK, SAVE_TASK, save_pairs

log = logging.getLogger(__name__)


def queued_saves(client: redis.Redis, queue: str) -> set[tuple[str, str, int]]:
    """(job, item, token) of every save in the messages waiting in the Redis broker's ``queue``
    (kombu keeps a message of priority p > 0 in the list "<queue><sep><p>"). A message that is
    not one of our save tasks, or cannot be read, is skipped."""
    pipe = client.pipeline(transaction=False)
    for p in PRIORITY_STEPS:
        pipe.lrange(f"{queue}{Channel.sep}{p}" if p else queue, 0, -1)
    saves: set[tuple[str, str, int]] = set()
    for raw in (m for messages in pipe.execute() for m in messages):
        try:
            message = json.loads(raw)
            task = message["headers"]["task"]
            if task not in (SAVE_TASK, SAVE_BATCH_TASK):
                continue
            body = message["body"]
            if message.get("properties", {}).get("body_encoding") == "base64":
                body = base64.b64decode(body)
            args = json.loads(body)[0]
            saves.update((args[0], item, token) for item, token in save_pairs(task, args))
        except (ValueError, TypeError, KeyError, IndexError):
            continue
    return saves


class LostSaves:
    """Finds, job by job, the items whose save message left the Redis broker ``queue`` with a
    worker that died, and ends their wait (:meth:`Tracker.expire_saves`).

    An item counts as lost when it was handed over ``age`` seconds ago or more, no worker has
    taken it over, and its message was in no queue at ``checks`` checks in a row (a heartbeat
    apart): a live worker that has just received the message takes the items over at its next
    heartbeat, so fewer checks could catch that worker in between and have the page downloaded
    again.
    """

    def __init__(self, tracker: Tracker, broker: redis.Redis, queue: str, age: float,
                 checks: int = 3) -> None:
        self.tracker, self.broker, self.queue, self.age = tracker, broker, queue, age
        self.checks = checks
        # By job: (item, token) -> the checks in a row that found it missing, up to the last.
        self._missing: dict[str, dict[tuple[str, int], int]] = {}

    def check(self, job: str) -> int:
        """One check of ``job``; how many items it ended the wait of."""
        candidates = self.tracker.unclaimed_saves(job, self.age)
        if not candidates:
            self._missing.pop(job, None)
            return 0
        waiting = queued_saves(self.broker, self.queue)
        before = self._missing.get(job, {})
        missing = {(item, token): before.get((item, token), 0) + 1 for item, token in candidates
                   if (job, item, token) not in waiting}
        lost = {pair for pair, n in missing.items() if n >= self.checks}
        self._missing[job] = {pair: n for pair, n in missing.items() if pair not in lost}
        if not lost:
            return 0
        expired = self.tracker.expire_saves(job, sorted(lost))
        if expired:
            log.warning("job %s: %d item(s) whose save message left the broker with a worker "
                        "that died: queued again", job, expired)
        return expired

    def forget_others(self, jobs: Iterable[str]) -> None:
        """Drop what is remembered of jobs not in ``jobs`` (finished, cancelled, deleted)."""
        keep = set(jobs)
        for job in [j for j in self._missing if j not in keep]:
            del self._missing[job]
