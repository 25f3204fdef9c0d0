"""RedisTracker's calls on a job's runs: its next generation, and the schedule that starts them.

A schedule lives in the job's control hash (shard 0: ``schedule``, ``next_due``,
``schedule_paused``) and, while it is not paused, in ``ds:schedules`` (job -> next due time), the
index every worker reads to find the jobs that are due. The index may lag the control hash (a
caller that died between the two writes): the generation script compares the due time it is given
with the control hash's, so a stale entry starts nothing, and the caller that finds it stale
writes it again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from .. import keys
from ...errors import JobNotFound
from ..base import MAX_ADD_BATCH
from ..model import AddResult, GenerationResult, JobState
from .connection import converts_redis_errors
from .scripts import dispatched
from .shards import ShardLayout, chunks


class GenerationCalls(ShardLayout):
    """A job's generations and its schedule."""

    @converts_redis_errors
    def start_generation(
        self, job: str, seeds: Sequence[str], *, generation: int, due: Optional[str] = None,
        next_due: Optional[str] = None,
    ) -> GenerationResult:
        shards = self._shards(job)
        groups = self._by_shard(job, seeds)
        top_up = self._top_up_args(job)
        check = 1
        if shards > 1:
            # Shard 0 alone cannot tell that the job is idle (a shard never given an item looks
            # running): the whole job is read first, and shard 0's generation decides the race.
            info = self.job_info(job)
            if self._lagging(job, shards, info.generation):
                # A caller died after shard 0 began its generation: that one is finished first
                # (the job is not idle until every shard follows shard 0).
                generation = info.generation
            elif info.state not in (JobState.FINISHED, JobState.EXPIRED):
                return GenerationResult(status=info.state.value, generation=info.generation,
                                        next_due=info.next_due)
            check = 0
        reply = self._run("generation", job, [generation, due or "", next_due or "", check,
                                              *top_up, *groups.get(0, [])])
        status, dispatch = reply[0], dispatched(reply[3:])
        if status in ("started", "current") and int(reply[1]) == generation:
            # The other shards follow shard 0 (again, if a caller died part way).
            for s in range(1, shards):
                res = self._run("generation", job, [generation, "", "", 0, *top_up,
                                                    *groups.get(s, [])], s)
                dispatch += dispatched(res[3:])
            self._mirror_active(job, range(shards))
        return GenerationResult(dispatch=dispatch, status=status, generation=int(reply[1]),
                                next_due=float(reply[2]) if reply[2] else None)

    @converts_redis_errors
    def changed(self, job: str, entries: Sequence[tuple[str, float]]) -> AddResult:
        by_shard = self._by_shard_with(job, entries)
        queued, dispatch = 0, []
        for s, pairs in sorted(by_shard.items()):
            for chunk in chunks(pairs, MAX_ADD_BATCH):
                reply = self._run("changed", job, [*self._top_up_args(job),
                                                   *(x for item, when in chunk
                                                     for x in (item, f"{when:.0f}"))], s)
                queued += int(reply[0])
                dispatch += dispatched(reply[1:])
        if queued:
            self._mirror_active(job, by_shard)
        return AddResult(dispatch=dispatch, added=queued)

    def _lagging(self, job: str, shards: int, generation: int) -> bool:
        """Whether a shard of ``job`` is behind shard 0's ``generation``."""
        pipe = self.client.pipeline(transaction=False)
        for s in range(1, shards):
            pipe.hget(keys.JobKeys(job, s).control, "generation")
        return any(int(g or 1) < generation for g in pipe.execute())

    # -- schedules ------------------------------------------------------------------------------

    @converts_redis_errors
    def set_schedule(self, job: str, schedule: Optional[str], next_due: Optional[float]) -> None:
        """Give ``job`` the ``schedule`` (its text, see core/schedules.py), next due at
        ``next_due`` (Unix seconds, tracker clock), unpaused; None removes the schedule."""
        self.load_spec(job)  # JobNotFound for a job never seeded
        control = keys.JobKeys(job).control
        if schedule is None:
            self.client.hdel(control, "schedule", "next_due", "schedule_paused")
            self.client.zrem(keys.SCHEDULES, job)
            return
        due = f"{next_due:.6f}"
        self.client.hset(control, mapping={"schedule": schedule, "next_due": due,
                                           "schedule_paused": "0"})
        self.client.zadd(keys.SCHEDULES, {job: float(due)})

    @converts_redis_errors
    def pause_schedule(self, job: str, paused: bool, next_due: Optional[float] = None) -> None:
        """Pause ``job``'s schedule (no generation starts), or resume it due at ``next_due``.
        Raises JobNotFound if it has no schedule."""
        control = keys.JobKeys(job).control
        if not self.client.hexists(control, "schedule"):
            raise JobNotFound(f"job {job!r} has no schedule")
        if paused:
            self.client.hset(control, "schedule_paused", "1")
            self.client.zrem(keys.SCHEDULES, job)
            return
        due = f"{next_due:.6f}"
        self.client.hset(control, mapping={"schedule_paused": "0", "next_due": due})
        self.client.zadd(keys.SCHEDULES, {job: float(due)})

    @converts_redis_errors
    def due_schedules(self, limit: int = 100) -> list[tuple[str, str]]:
        """Up to ``limit`` (job, due time as the control hash has it) of the unpaused schedules
        whose time has come on the tracker's clock."""
        due = self.client.zrangebyscore(keys.SCHEDULES, "-inf", self.now(), start=0, num=limit)
        out: list[tuple[str, str]] = []
        for job in due:
            text = self.client.hget(keys.JobKeys(job).control, "next_due")
            if text is None:  # the job or its schedule is gone
                self.client.zrem(keys.SCHEDULES, job)
            else:
                out.append((job, text))
        return out

    @converts_redis_errors
    def index_schedule(self, job: str, next_due: Optional[float]) -> None:
        """Write ``job``'s entry of the schedule index (after a generation started, or to repair
        a stale one); None removes it."""
        if next_due is None:
            self.client.zrem(keys.SCHEDULES, job)
        else:
            self.client.zadd(keys.SCHEDULES, {job: next_due})

    @converts_redis_errors
    def now(self) -> float:
        """The tracker's clock (Redis TIME), Unix seconds."""
        seconds, micros = self.client.time()
        return seconds + micros / 1e6
