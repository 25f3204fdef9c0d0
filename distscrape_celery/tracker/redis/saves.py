"""RedisTracker's calls on saves: hand them to the broker, begin, defer, complete, expire."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from .. import keys
from ..base import MAX_ADD_BATCH
from ..model import CompleteResult, SaveBegin, SaveStart
from ..revisits import RevisitUpdate
from .connection import converts_redis_errors
from .scripts import dispatched
from .shards import ShardLayout


class SaveCalls(ShardLayout):
    """A scraped item's save, which carries its lease's token and the body staged for it; a
    batch of saves goes in one script call where it can (scripts.BATCH)."""

    @converts_redis_errors
    def handoff(self, job: str, worker_id: str, saves: Sequence[tuple[str, int]]) -> int:
        return sum(int(self._run("handoff", job, [worker_id, self.save_timeout, *pairs], s))
                   for s, pairs in self._pairs_by_shard(job, saves))

    def _begin_save_call(
        self, job: str, item: str, token: int, worker_id: str, max_lost: int
    ) -> tuple[list[str], list[Any]]:
        """The keys and arguments of begin_save.lua for one save."""
        bound, max_batch, lease = self._top_up_args(job)
        return (list(self._item_keys(job, self._shard_of(job, item))),
                [item, token, worker_id, lease, max_lost, bound, max_batch])

    @staticmethod
    def _begin_reply(res: list[Any], body: Optional[bytes]) -> SaveBegin:
        """begin_save.lua's reply (undecoded) and the staged body, read after it: the body is
        the save's with ok and stale."""
        status = SaveStart(res[0].decode())
        return SaveBegin(dispatch=dispatched(res[3:]), status=status, lost=int(res[1]),
                         body=body if status in (SaveStart.OK, SaveStart.STALE) else None,
                         created=res[2].decode())

    @converts_redis_errors
    def begin_save(self, job: str, item: str, token: int, worker_id: str, *, max_lost: int) -> SaveBegin:
        # The staged body is read in the same round trip, after the script.
        res, (body,) = self._eval_around(
            "begin_save", *self._begin_save_call(job, item, token, worker_id, max_lost),
            after=[("GET", keys.body_key(job, token))], undecoded=True)
        return self._begin_reply(res, body)

    def _batched(self, job: str, saves: Sequence[tuple[str, int]]) -> bool:
        """Whether the item scripts of these saves can go in one batch call: one Redis (a
        cluster routes a call by one slot), and every token of its item's shard (see
        _body_keys: each call then has its body key)."""
        return len(saves) > 1 and not self.cluster and all(
            self._token_home(job, item, token) for item, token in saves)

    def _places_by_shard(self, job: str, saves: Sequence[tuple[str, int]]) -> list[list[int]]:
        """The places in ``saves`` of each shard's items (a batch call runs on one shard)."""
        if self._shards(job) == 1:
            return [list(range(len(saves)))]
        by_shard: dict[int, list[int]] = {}
        for i, (item, _) in enumerate(saves):
            by_shard.setdefault(self._shard_of(job, item), []).append(i)
        return list(by_shard.values())

    @converts_redis_errors
    def begin_saves(
        self, job: str, saves: Sequence[tuple[str, int]], worker_id: str, *, max_lost: int
    ) -> list[SaveBegin]:
        if not self._batched(job, saves):
            return super().begin_saves(job, saves, worker_id, max_lost=max_lost)
        out: list[Any] = [None] * len(saves)
        for places in self._places_by_shard(job, saves):
            calls = [self._begin_save_call(job, *saves[i], worker_id, max_lost) for i in places]
            replies, (bodies,) = self._eval_many(
                [("begin_save", *call) for call in calls],
                after=[("MGET", *(keys.body_key(job, saves[i][1]) for i in places))],
                undecoded=True)
            for i, res, body in zip(places, replies, bodies):
                out[i] = self._begin_reply(res, body)
        return out

    @converts_redis_errors
    def defer_save(self, job: str, item: str, token: int) -> bool:
        return bool(self._run_item("defer_save", job, item, [item, token, self.save_timeout]))

    def _complete_call(
        self, job: str, item: str, token: Optional[int], revisit: Optional[RevisitUpdate] = None,
        carry: bool = False,
    ) -> tuple[list[str], list[Any], list[str]]:
        """The keys and arguments of complete.lua for one item, and its body keys among them:
        the body key only if the token is of the item's shard (another's body is dropped on its
        own, see complete)."""
        home = self._shard_of(job, item)
        body_keys = self._body_keys(job, token, home) if token is not None else []
        args = [item, *self._top_up_args(job), *(revisit.args() if revisit else ())]
        if carry:
            args += [*(() if revisit else ("", "")), "1"]
        return [*self._item_keys(job, home), *body_keys], args, body_keys

    @converts_redis_errors
    def complete_many(
        self, job: str, saves: Sequence[tuple[str, int]],
        revisits: Optional[Sequence[Optional[RevisitUpdate]]] = None,
    ) -> list[CompleteResult]:
        if not self._batched(job, saves):
            return super().complete_many(job, saves, revisits)
        out: list[Any] = [None] * len(saves)
        for places in self._places_by_shard(job, saves):
            calls = [self._complete_call(job, *saves[i], revisits[i] if revisits else None)[:2]
                     for i in places]
            replies, _ = self._eval_many([("complete", *call) for call in calls], undecoded=True)
            for i, res in zip(places, replies):
                out[i] = CompleteResult(dispatch=dispatched(res[1:]),
                                        changed=bool(res[0]))
        return out

    @converts_redis_errors
    def complete(
        self, job: str, item: str, token: Optional[int] = None,
        revisit: Optional[RevisitUpdate] = None, *, carry: bool = False,
    ) -> CompleteResult:
        script_keys, args, body_keys = self._complete_call(job, item, token, revisit, carry)
        # Combined with the calls other threads make at the same time: a revisit that finds a
        # page unchanged completes it right after its checkout, and a generation makes many.
        res = self._eval_combined("complete", script_keys, args)
        if token is not None and not body_keys:
            # A token of another shard (none can hold the item): its body is dropped on its own.
            self.client.unlink(keys.body_key(job, token))
        return CompleteResult(dispatch=dispatched(res[1:]), changed=bool(res[0]))

    @converts_redis_errors
    def unclaimed_saves(self, job: str, age: float, limit: int = MAX_ADD_BATCH) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        for s in range(self._shards(job)):
            flat = self._run("unclaimed_saves", job, [age, self.save_timeout, limit], s)
            out += [(flat[i], int(flat[i + 1])) for i in range(0, len(flat), 2)]
        return out

    @converts_redis_errors
    def expire_saves(self, job: str, saves: Sequence[tuple[str, int]]) -> int:
        return sum(int(self._run("expire_saves", job, pairs, s))
                   for s, pairs in self._pairs_by_shard(job, saves))
