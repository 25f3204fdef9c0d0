"""RedisTracker: the tracker for distributed crawls. Each operation is one Lua script call.

How a job is spread over shards, and how the list of active jobs is kept right across them, is
told in :mod:`.shards`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Optional

import redis

from .. import keys
from ...errors import JobNotFound, JobStateError, TrackerUnavailable
from ..base import (
    ADD_STREAM_PIPELINE,
    MAX_ADD_BATCH,
    MAX_REASON,
    MAX_RECLAIM_BATCH,
    WAKE_WHILE_LEASED,
    batches,
    check_save_as,
    job_conflict,
    read_ahead,
    spec_differences,
)
from ..model import (
    AddResult,
    Checkout,
    CompleteResult,
    ControlResult,
    CrawlLimits,
    FailOutcome,
    FailResult,
    Fault,
    JobAction,
    JobInfo,
    JobState,
    JobStats,
    LeaseStatus,
    MaintainResult,
    RetryDeadResult,
    SaveBegin,
    SaveStart,
    ScrapedResult,
    WorkerInfo,
)
from .connection import UNDECODED, connect, converts_redis_errors
# bench/bench_crawl.py labels EVALSHA calls with these.
from .scripts import ITEM_SCRIPTS as _ITEM_SCRIPTS, read_lua as _read_lua  # noqa: F401
from .shards import DELETE_BATCH, SHARDS_FIELD, ShardLayout, chunks, shard_policy

__all__ = ["RedisTracker", "connect", "shard_policy"]

# Most dead workers' records pruned per call.
MAX_PRUNE_BATCH = 100


class RedisTracker(ShardLayout):
    """Tracker state in Redis; safe for any number of worker processes on any number of hosts."""

    # -- workers ---------------------------------------------------------------------------

    @converts_redis_errors
    def register_worker(self, host: str, pid: int, concurrency: int) -> str:
        worker_id = f"w{self.client.incr(keys.WORKER_SEQ)}"
        info = json.dumps({"host": host, "pid": pid, "concurrency": concurrency})
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(keys.WORKERS, worker_id, info)
        pipe.hset(keys.WORKER_CONCURRENCY, worker_id, concurrency)
        pipe.execute()
        self.heartbeat(worker_id)
        return worker_id

    @converts_redis_errors
    def heartbeat(self, worker_id: str) -> None:
        self._beat(worker_id)

    def _beat(self, worker_id: str) -> int:
        total, _live = self._heartbeat_script(
            keys=[keys.HEARTBEATS, keys.WORKER_CONCURRENCY], args=[worker_id, self.lease_seconds]
        )
        self._bound = int(total) * self.dispatch_factor
        self._bound_at = time.monotonic()
        return self._bound

    @converts_redis_errors
    def deregister_worker(self, worker_id: str) -> None:
        self._deregister_script(keys=[keys.HEARTBEATS], args=[worker_id, self.lease_seconds])

    @converts_redis_errors
    def prune_workers(self, max_age: float) -> list[str]:
        return list(self._prune_script(
            keys=[keys.HEARTBEATS, keys.WORKERS, keys.WORKER_CONCURRENCY],
            args=[max_age, MAX_PRUNE_BATCH],
        ))

    @converts_redis_errors
    def workers(self) -> list[WorkerInfo]:
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(keys.WORKERS)
        pipe.zrange(keys.HEARTBEATS, 0, -1, withscores=True)
        if self.cluster:
            # A cluster pipeline takes keyed commands only; the clock is that of the master
            # that scored the heartbeats.
            infos, beats = pipe.execute()
            node = self.client.get_node_from_key(keys.HEARTBEATS)
            sec, usec = self.client.time(target_nodes=node)
        else:
            pipe.time()
            infos, beats, (sec, usec) = pipe.execute()
        now = sec + usec / 1e6
        last = dict(beats)
        out = []
        for worker_id, raw in sorted(infos.items(), key=lambda kv: int(kv[0][1:])):
            info = json.loads(raw)
            seen = last.get(worker_id)
            out.append(
                WorkerInfo(
                    id=worker_id, host=info["host"], pid=info["pid"],
                    concurrency=info["concurrency"], last_seen=seen,
                    alive=seen is not None and now - seen <= self.lease_seconds,
                )
            )
        return out

    @converts_redis_errors
    def dispatch_bound(self) -> int:
        if self._bound is None or time.monotonic() - self._bound_at > self._bound_refresh:
            return self._beat("")
        return self._bound

    # -- jobs ------------------------------------------------------------------------------

    @converts_redis_errors
    def create_job(self, job: str, spec_json: str, limits: Optional[CrawlLimits] = None) -> bool:
        limits = limits or CrawlLimits()
        shards = limits.shards
        k = keys.JobKeys(job)
        if not self._routed(shards):
            policy = limits.policy_fields()
            created, existing = self._create_job_script(
                keys=[k.spec, k.policy, k.control, k.stats, keys.JOBS, keys.ACTIVE_JOBS],
                args=[job, spec_json, 0, keys.JOB_FORMAT,
                      *(x for pair in policy.items() for x in pair)],
            )
        else:
            # Listed first, so delete finds a job whose creation was cut short. It is not active
            # yet: it has no work until items come, and their add marks and lists it.
            self.client.sadd(keys.JOBS, job)
            created = existing = None
            # Shard 0 first: a conflicting spec is refused before any other shard is written.
            for s in range(shards):
                ks = keys.JobKeys(job, s)
                policy = shard_policy(limits, s)
                c, e = self._create_job_script(
                    keys=[ks.spec, ks.policy, ks.control, ks.stats],
                    args=[job, spec_json, s << keys.SHARD_TOKEN_BITS, keys.JOB_FORMAT,
                          *(x for pair in policy.items() for x in pair)],
                )
                if s == 0:
                    created, existing = c, e
                    if not created and spec_differences(existing, spec_json):
                        break
        # A stored spec never changes, so comparing the one the script read is comparing now.
        differences = [] if created else spec_differences(existing, spec_json)
        if differences:
            raise job_conflict(job, differences)
        return bool(created)

    @converts_redis_errors
    def load_spec(self, job: str) -> str:
        spec = self.client.get(keys.JobKeys(job).spec)
        if spec is None:
            raise JobNotFound(f"no job named {job!r} on {self.url}")
        return spec

    @converts_redis_errors
    def jobs(self) -> list[str]:
        return sorted(self.client.smembers(keys.JOBS))

    @converts_redis_errors
    def active_jobs(self) -> list[str]:
        return sorted(self.client.smembers(keys.ACTIVE_JOBS))

    @converts_redis_errors
    def job_info(self, job: str) -> JobInfo:
        shards = self._shards(job)
        controls = self._shard_controls(job, shards)
        head = controls[0]
        if shards > 1:
            # Pause and cancel reach every shard, shard 0 first; finished needs all of them
            # (a shard never given an item has nothing to finish).
            if head.get("state") in ("paused", "cancelled"):
                state = head["state"]
            elif self._idle(controls):
                state = "finished"
            else:
                state = "running"
            ended = [float(c["ended"]) for c in controls if "ended" in c]
            head = {"state": state, "started": head.get("started")}
            if state in ("finished", "cancelled") and ended:
                head["ended"] = str(max(ended))
                for n in ("seen", "done", "dead"):
                    head[f"final_{n}"] = str(sum(int(c.get(f"final_{n}", 0)) for c in controls))

        def number(name: str) -> Optional[float]:
            return float(head[name]) if head.get(name) is not None else None

        final = {n: int(head[f"final_{n}"]) for n in ("seen", "done", "dead")
                 if f"final_{n}" in head}
        return JobInfo(job=job, state=JobState(head.get("state", "running")),
                       started=number("started"), ended=number("ended"), final=final)

    @converts_redis_errors
    def control(self, job: str, action: JobAction) -> ControlResult:
        shards = self._shards(job)
        if shards == 1:
            res = self._run("control", job, [JobAction(action).value, *self._top_up_args(job)])
            before, after = JobState(res[0]), JobState(res[1])
            dispatch = list(res[2:])
        else:
            before = self.job_info(job).state
            if before is JobState.FINISHED and action != JobAction.RESUME:
                raise JobStateError(f"job {job!r}: the job is finished")
            dispatch = []
            for s in range(shards):  # shard 0 first: it speaks for the job (job_info)
                res = self._scripts["control"](
                    keys=self._item_keys(job, s),
                    args=[JobAction(action).value, *self._top_up_args(job), 1],
                )
                dispatch.extend(res[2:])
            after = self.job_info(job).state
        if self._routed(shards):
            if action == JobAction.CANCEL:
                self._unlist_if_idle(job)
            else:
                self._mirror_active(job, range(shards))
        return ControlResult(dispatch=dispatch, before=before, after=after)

    @converts_redis_errors
    def delete_job(self, job: str) -> int:
        k = keys.JobKeys(job)
        if not (self.client.sismember(keys.JOBS, job) or self.client.exists(k.spec, k.control)):
            raise JobNotFound(f"no job named {job!r} on {self.url}")
        try:
            shards = self._shards(job)
        except JobNotFound:  # its spec is gone already (a delete cut short): shard 0 only
            shards = int(self.client.hget(k.policy, SHARDS_FIELD) or 1)
        # Without its spec the item scripts refuse the job (NOJOB): a late worker recreates nothing.
        self.client.srem(keys.ACTIVE_JOBS, job)
        deleted = sum(int(self.client.unlink(keys.JobKeys(job, s).spec)) for s in range(shards))
        scans = {"hash": self.client.hscan, "zset": self.client.zscan, "set": self.client.sscan}
        removes = {"hash": self.client.hdel, "zset": self.client.zrem, "set": self.client.srem}
        # A cluster client's scan_iter visits every master (SCAN itself covers one node). The
        # policy of shard 0 (its shard count) goes last, so a delete cut short can be redone.
        for s in reversed(range(shards)):
            ks = keys.JobKeys(job, s)
            seen_buckets: list[str] = []
            for key in self.client.scan_iter(match=ks.pattern, count=DELETE_BATCH):
                if s == 0 and key == ks.policy:
                    continue
                if key.startswith(ks.seen_buckets):
                    # A seen-set bucket is one small intset allocation, freed in O(1): a batch of
                    # them goes in one short UNLINK (a 10M-item job has ~60,000 of them). Keys of
                    # one shard share a slot, so one UNLINK may take many on a cluster too.
                    seen_buckets.append(key)
                    if len(seen_buckets) == DELETE_BATCH:
                        deleted += int(self.client.unlink(*seen_buckets))
                        seen_buckets = []
                    continue
                kind = self.client.type(key)
                if kind in scans:
                    self._empty(key, scans[kind], removes[kind])
                deleted += int(self.client.unlink(key))
            if seen_buckets:
                deleted += int(self.client.unlink(*seen_buckets))
        deleted += int(self.client.unlink(k.policy))
        self.client.srem(keys.JOBS, job)
        self._layouts.pop(job, None)
        for cached in [k for k in self._key_lists if k[0] == job]:
            del self._key_lists[cached]
        return deleted

    @staticmethod
    def _empty(key: str, scan: Callable[..., Any], remove: Callable[..., Any]) -> None:
        """Remove a hash's, zset's or set's members a batch at a time, each a short command
        (members removed behind the cursor do not disturb the scan)."""
        cursor = 0
        while True:
            cursor, batch = scan(key, cursor, count=DELETE_BATCH)
            members = [m[0] if isinstance(m, tuple) else m for m in batch]
            if members:
                remove(key, *members)
            if cursor == 0:
                return

    @converts_redis_errors
    def set_domain_delay(self, job: str, domain: str, seconds: float) -> None:
        shards, _ = self._layout(job)
        policy = keys.JobKeys(job, keys.shard_of(domain, shards)).policy
        if seconds > 0:
            self.client.hset(policy, f"delay:{domain}", float(seconds))
        else:
            self.client.hdel(policy, f"delay:{domain}")

    # -- items -----------------------------------------------------------------------------

    def add(self, job: str, items: Sequence[str], depth: int = 0) -> AddResult:
        return self._add_batches(job, list(items), depth)

    def add_stream(
        self, job: str, items: Iterable[str], depth: int = 0
    ) -> Iterator[tuple[int, AddResult]]:
        # The next group is read (from a seed file: decoded and checked) while Redis adds this one.
        for group in read_ahead(batches(items, MAX_ADD_BATCH * ADD_STREAM_PIPELINE)):
            yield len(group), self._add_batches(job, group, depth)

    @converts_redis_errors
    def _add_batches(self, job: str, items: Sequence[str], depth: int) -> AddResult:
        """A short Lua call per MAX_ADD_BATCH items of one shard, pipelined in one round trip
        on one Redis (one call with no items still tops up dispatch, on every shard). On a
        cluster the calls go one by one: a cluster pipeline does not load missing scripts."""
        shards = self._shards(job)
        top_up = self._top_up_args(job)
        groups = self._by_shard(job, items) if items else {s: [] for s in range(shards)}
        calls = [(s, chunk) for s, group in sorted(groups.items())
                 for chunk in list(chunks(group, MAX_ADD_BATCH)) or [[]]]
        if self.cluster:
            results = [self._scripts["add"](keys=self._item_keys(job, s), args=[depth, *top_up, *chunk])
                       for s, chunk in calls]
        else:
            pipe = self.client.pipeline(transaction=False)
            for s, chunk in calls:
                self._scripts["add"](keys=self._item_keys(job, s), args=[depth, *top_up, *chunk],
                                     client=pipe)
            results = pipe.execute()
        added, dispatch, grew = 0, [], set()
        for (s, _), res in zip(calls, results):
            added += int(res[0])
            dispatch.extend(res[1:])
            if int(res[0]):
                grew.add(s)
        if grew:
            self._mirror_active(job, grew)
        return AddResult(dispatch=dispatch, added=added)

    @converts_redis_errors
    def checkout(self, job: str, item: str, worker_id: str, *, max_lost: int) -> Checkout:
        bound, max_batch, lease = self._top_up_args(job)
        res = self._run_item("checkout", job, item, [item, worker_id, lease, bound, max_batch, max_lost])
        return Checkout(
            status=LeaseStatus(res[0]), depth=int(res[1]), failed_attempts=int(res[2]),
            token=int(res[3]), wait=float(res[4]), dispatch=list(res[5:]),
        )

    @converts_redis_errors
    def scraped(
        self, job: str, item: str, token: int, found: Sequence[str] = (), depth: int = 0,
        body: Optional[bytes] = None, save_as: Optional[str] = None, keep_as: Optional[str] = None,
        cut: int = 0,
    ) -> ScrapedResult:
        check_save_as(body, save_as, keep_as)
        home = self._shard_of(job, item)
        groups = self._by_shard(job, found)
        found = groups.pop(home, [])
        # Finds of other shards, and beyond one batch, go first, through add, while the item is
        # still leased: its shard cannot be idle before they are queued, so a sharded job is never
        # seen finished with links still to add. The last batch rides with the state change.
        later = [x for group in groups.values() for x in group]
        while len(found) > MAX_ADD_BATCH:
            later.extend(found[:MAX_ADD_BATCH])
            found = found[MAX_ADD_BATCH:]
        added, dispatch = 0, []
        if later:
            res = self.add(job, later, depth)
            added, dispatch = res.added, list(res.dispatch)
        # The body rides with the state change: one round trip, and staged only if still held.
        body_keys = self._body_keys(job, token, home) if body is not None else []
        res = self._eval(
            "scraped", [*self._item_keys(job, home), *body_keys],
            [item, token, self.save_timeout, depth, *self._top_up_args(job),
             self._body_ttl_ms, body if body_keys else b"", save_as or "", keep_as or "", int(cut),
             *found],
        )
        if int(res[1]):
            self._mirror_active(job, [home])
        return ScrapedResult(
            dispatch=dispatch + list(res[2:]), added=added + int(res[1]), held=res[0] == "ok"
        )

    @converts_redis_errors
    def handoff(self, job: str, worker_id: str, saves: Sequence[tuple[str, int]]) -> int:
        return sum(int(self._run("handoff", job, [worker_id, self.save_timeout, *pairs], s))
                   for s, pairs in self._pairs_by_shard(job, saves))

    def _begin_save_call(
        self, job: str, item: str, token: int, worker_id: str, max_lost: int
    ) -> tuple[list[str], list[Any]]:
        """The keys and arguments of begin_save.lua for one save. The staged body comes back in
        the same round trip (binary: the reply is read undecoded, see _begin_reply)."""
        bound, max_batch, lease = self._top_up_args(job)
        home = self._shard_of(job, item)
        return ([*self._item_keys(job, home), *self._body_keys(job, token, home)],
                [item, token, worker_id, lease, max_lost, bound, max_batch])

    @staticmethod
    def _begin_reply(res: list[Any]) -> SaveBegin:
        return SaveBegin(dispatch=[x.decode() for x in res[3:]], status=SaveStart(res[0].decode()),
                         lost=int(res[1]), body=res[2])

    @converts_redis_errors
    def begin_save(self, job: str, item: str, token: int, worker_id: str, *, max_lost: int) -> SaveBegin:
        begin = self._begin_reply(self._eval(
            "begin_save", *self._begin_save_call(job, item, token, worker_id, max_lost),
            undecoded=True))
        if begin.status is SaveStart.STALE and not self._token_home(job, item, token):
            # A token of another shard (see _body_keys): its body is read on its own.
            body = self.client.execute_command("GET", keys.body_key(job, token), **UNDECODED)
            begin = dataclasses.replace(begin, body=body)
        return begin

    def _pipelined(self, job: str, saves: Sequence[tuple[str, int]]) -> bool:
        """Whether the item scripts of these saves can go in one pipeline: one Redis (a cluster
        pipeline does not load missing scripts), and every token of its item's shard (see
        _body_keys)."""
        return len(saves) > 1 and not self.cluster and all(
            self._token_home(job, item, token) for item, token in saves)

    @converts_redis_errors
    def begin_saves(
        self, job: str, saves: Sequence[tuple[str, int]], worker_id: str, *, max_lost: int
    ) -> list[SaveBegin]:
        if not self._pipelined(job, saves):
            return super().begin_saves(job, saves, worker_id, max_lost=max_lost)
        calls = [self._begin_save_call(job, item, token, worker_id, max_lost) for item, token in saves]
        return [self._begin_reply(res) for res in self._run_all_undecoded("begin_save", calls)]

    @converts_redis_errors
    def defer_save(self, job: str, item: str, token: int) -> bool:
        return bool(self._run_item("defer_save", job, item, [item, token, self.save_timeout]))

    def _complete_call(
        self, job: str, item: str, token: Optional[int]
    ) -> tuple[list[str], list[Any], list[str]]:
        """The keys and arguments of complete.lua for one item, and its body keys among them:
        the body key only if the token is of the item's shard (another's body is dropped on its
        own, see complete)."""
        home = self._shard_of(job, item)
        body_keys = self._body_keys(job, token, home) if token is not None else []
        return [*self._item_keys(job, home), *body_keys], [item, *self._top_up_args(job)], body_keys

    @converts_redis_errors
    def complete_many(self, job: str, saves: Sequence[tuple[str, int]]) -> list[CompleteResult]:
        if not self._pipelined(job, saves):
            return super().complete_many(job, saves)
        calls = [self._complete_call(job, item, token)[:2] for item, token in saves]
        return [CompleteResult(dispatch=[x.decode() for x in res[1:]], changed=bool(res[0]))
                for res in self._run_all_undecoded("complete", calls)]

    @converts_redis_errors
    def complete(self, job: str, item: str, token: Optional[int] = None) -> CompleteResult:
        script_keys, args, body_keys = self._complete_call(job, item, token)
        res = self._eval("complete", script_keys, args)
        if token is not None and not body_keys:
            # A token of another shard (none can hold the item): its body is dropped on its own.
            self.client.unlink(keys.body_key(job, token))
        return CompleteResult(dispatch=list(res[1:]), changed=bool(res[0]))

    @converts_redis_errors
    def fail(
        self, job: str, item: str, token: int, reason: str, *, fault: Fault, max_retries: int,
        max_lost: int, retryable: bool = True, delay: float = 0.0,
    ) -> FailResult:
        res = self._run_item(
            "fail", job, item,
            [item, token, reason[:MAX_REASON], Fault(fault).value, int(retryable), max_retries,
             max_lost, *self._top_up_args(job), max(float(delay), 0.0)],
        )
        return FailResult(dispatch=list(res[1:]), outcome=FailOutcome(res[0]))

    @converts_redis_errors
    def extend(
        self, job: str, items: Sequence[str], worker_id: str,
        saves: Sequence[tuple[str, int]] = (), running: Optional[Sequence[str]] = None,
    ) -> int:
        running = list(items) if running is None else list(running)
        n = 0
        reserved_by, running_by = self._by_shard(job, items), self._by_shard(job, running)
        for s in sorted(set(reserved_by) | set(running_by)):
            for chunk in chunks(reserved_by.get(s, []), MAX_ADD_BATCH):
                n += int(self._run("extend", job, [self.lease_seconds, worker_id, len(chunk), *chunk, 0], s))
            for chunk in chunks(running_by.get(s, []), MAX_ADD_BATCH):
                n += int(self._run("extend", job, [self.lease_seconds, worker_id, 0, len(chunk), *chunk], s))
        for s, pairs in self._pairs_by_shard(job, saves):
            n += int(self._run("extend", job, [self.lease_seconds, worker_id, 0, 0, *pairs], s))
        return n

    @converts_redis_errors
    def maintain(self, job: str, *, max_lost: int) -> MaintainResult:
        shards = self._shards(job)
        reclaimed = died = 0
        dispatch: list[str] = []
        wake: Optional[float] = None
        finished = False
        for s in range(shards):
            res = self._run(
                "maintain", job,
                [*self._top_up_args(job), MAX_RECLAIM_BATCH, max_lost, WAKE_WHILE_LEASED], s,
            )
            reclaimed, died = reclaimed + int(res[0]), died + int(res[1])
            dispatch.extend(res[4:])
            if res[2] and (wake is None or float(res[2]) < wake):
                wake = float(res[2])
            finished = finished or bool(res[3])
        if self._routed(shards):
            if shards > 1:
                idle, finished = self._record_finish(job, shards)
            else:
                idle = self._idle(self._shard_controls(job, shards))
            # Unlisted only once its end is recorded (or seen recorded): the maintain that
            # records it must still find it listed, even if an earlier one died after its script.
            if idle:
                self._unlist_if_idle(job)
        return MaintainResult(
            dispatch=dispatch, reclaimed=reclaimed, died=died, wake=wake, finished=finished,
        )

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

    @converts_redis_errors
    def stats(self, job: str) -> JobStats:
        try:
            shards = self._shards(job)
        except JobNotFound:
            raise JobNotFound(f"no job named {job!r} on {self.url}") from None
        pipe = self.client.pipeline(transaction=not self.cluster)
        for s in range(shards):
            k = keys.JobKeys(job, s)
            pipe.hgetall(k.stats)
            pipe.zcard(k.dispatched)
            pipe.zcard(k.leased)
            pipe.zcard(k.pending)
            pipe.zcard(k.delayed)
        pipe.exists(keys.JobKeys(job).spec)
        res = pipe.execute()
        if not res[-1]:
            raise JobNotFound(f"no job named {job!r} on {self.url}")
        total = Counter()
        for s in range(shards):
            counters, dispatched, leased, pending, delayed = res[5 * s : 5 * s + 5]
            for name in ("seen", "queued", "done", "dead", "links_cut"):
                total[name] += int(counters.get(name, 0))
            total.update(dispatched=dispatched, leased=leased, pending=pending, delayed=delayed)
        return JobStats(
            seen=total["seen"], frontier=total["queued"], dispatched=total["dispatched"],
            leased=total["leased"], done=total["done"], dead=total["dead"],
            saving=total["pending"], delayed=total["delayed"], links_cut=total["links_cut"],
        )

    def _hscan(self, job: str, name: str) -> Iterator[tuple[str, str]]:
        """The fields of one of the job's hashes (``name``: a JobKeys property), every shard's,
        streamed a batch at a time."""
        self.load_spec(job)  # JobNotFound for a job never seeded
        try:
            for s in range(self._shards(job)):
                yield from self.client.hscan_iter(getattr(keys.JobKeys(job, s), name),
                                                  count=MAX_ADD_BATCH)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise TrackerUnavailable(f"Redis at {self.url} is unreachable: {exc}") from exc

    def iter_dead(self, job: str) -> Iterator[tuple[str, str]]:
        yield from self._hscan(job, "dead")

    def retry_dead(self, job: str) -> RetryDeadResult:
        n, dispatch = 0, []
        # One pass of HSCAN sees every item dead when it began; each batch is one atomic call on
        # the item's own shard.
        for s in range(self._shards(job)):
            batch: list[str] = []
            for item, _reason in self.client.hscan_iter(keys.JobKeys(job, s).dead,
                                                        count=MAX_ADD_BATCH):
                batch.append(item)
                if len(batch) == MAX_ADD_BATCH:
                    n, dispatch = self._retry_dead_batch(job, s, batch, n, dispatch)
                    batch = []
            n, dispatch = self._retry_dead_batch(job, s, batch, n, dispatch)
        return RetryDeadResult(dispatch=dispatch, requeued=n)

    @converts_redis_errors
    def _retry_dead_batch(
        self, job: str, shard: int, batch: list[str], n: int, dispatch: list[str]
    ) -> tuple[int, list[str]]:
        res = self._run("retry_dead", job, [*self._top_up_args(job), *batch], shard)
        if int(res[0]):
            self._mirror_active(job, [shard])
        return n + int(res[0]), dispatch + list(res[1:])

    @converts_redis_errors
    def leased_by_worker(self, job: str) -> dict[str, int]:
        # Owners hold only in-flight items, so the hash stays as small as the broker's bound.
        total: Counter[str] = Counter()
        for s in range(self._shards(job)):
            owners = (o.split(" ", 1)[0] for o in self.client.hvals(keys.JobKeys(job, s).owners))
            # "-": a save message waiting in the broker, which nobody holds.
            total.update(w for w in owners if w != "-")
        return dict(total)
