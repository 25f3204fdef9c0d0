"""RedisTracker: the tracker for distributed crawls. Each operation is one Lua script call."""

from __future__ import annotations

import functools
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any, Optional, TypeVar

import redis

from .. import keys
from ..errors import JobNotFound, JobStateError, TrackerUnavailable
from ..settings import redact
from .base import (
    ADD_STREAM_PIPELINE,
    MAX_ADD_BATCH,
    MAX_REASON,
    MAX_DISPATCH_BATCH,
    MAX_RECLAIM_BATCH,
    WAKE_WHILE_LEASED,
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
    Tracker,
    WorkerInfo,
    batches,
    job_conflict,
    spec_differences,
)

if TYPE_CHECKING:
    from ..settings import Settings

F = TypeVar("F", bound=Callable[..., Any])

_ITEM_SCRIPTS = (
    "add", "checkout", "scraped", "begin_save", "defer_save", "complete", "fail", "extend",
    "maintain", "release", "retry_dead", "control",
)
# Keys (or hash fields, set members) removed per command when a job is deleted: each command
# stays short, so Redis keeps answering others meanwhile.
DELETE_BATCH = 200
# Most dead workers' records pruned per call.
MAX_PRUNE_BATCH = 100


def _read_lua(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


def _converts_redis_errors(method: F) -> F:
    """Turn redis-py connection errors into :class:`TrackerUnavailable` where they enter."""

    @functools.wraps(method)
    def wrapper(self: "RedisTracker", *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise TrackerUnavailable(f"Redis at {self.url} is unreachable: {exc}") from exc
        except redis.ResponseError as exc:
            # In a pipeline redis-py puts "Command # N (...) of pipeline caused error: " first.
            reply = str(exc).rpartition("caused error: ")[2]
            if reply.startswith("NOJOB"):  # raised by the item scripts (_lib.lua)
                raise JobNotFound(f"no job named {args[0]!r} on {self.url}") from None
            if reply.startswith("JOBSTATE"):  # raised by control.lua
                raise JobStateError(f"job {args[0]!r}: {reply[9:]}") from None
            raise TrackerUnavailable(f"Redis at {self.url} answered with an error: {exc}") from exc

    return wrapper  # type: ignore[return-value]


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class RedisTracker(Tracker):
    """Tracker state in Redis; safe for any number of worker processes on any number of hosts."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        lease_seconds: float = 60.0,
        dispatch_factor: int = 2,
        save_timeout: Optional[float] = None,
        bound_refresh_seconds: Optional[float] = None,
    ) -> None:
        super().__init__(
            lease_seconds=lease_seconds, dispatch_factor=dispatch_factor, save_timeout=save_timeout
        )
        if not client.get_connection_kwargs().get("decode_responses"):
            raise ValueError("RedisTracker needs a client created with decode_responses=True")
        self.client = client
        kw = client.get_connection_kwargs()
        self.url = redact(f"redis://{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}")
        lib = _read_lua("_lib")
        self._scripts = {
            name: client.register_script(lib + "\n" + _read_lua(name)) for name in _ITEM_SCRIPTS
        }
        self._heartbeat_script = client.register_script(_read_lua("heartbeat"))
        self._deregister_script = client.register_script(_read_lua("deregister"))
        self._prune_script = client.register_script(_read_lua("prune_workers"))
        self._create_job_script = client.register_script(_read_lua("create_job"))
        self._bound_refresh = (
            bound_refresh_seconds
            if bound_refresh_seconds is not None
            else min(max(self.lease_seconds / 4, 0.2), 2.0)
        )
        self._bound: Optional[int] = None
        self._bound_at = 0.0

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> "RedisTracker":
        """Connect to ``url`` and check that Redis answers, so a bad URL fails now, clearly."""
        client = redis.Redis.from_url(
            url, decode_responses=True, socket_connect_timeout=5, socket_timeout=30,
            health_check_interval=30,
        )
        tracker = cls(client, **kwargs)
        tracker.url = redact(url)
        tracker.ping()
        return tracker

    @classmethod
    def from_settings(cls, settings: "Settings") -> "RedisTracker":
        return cls.from_url(
            settings.redis_url, lease_seconds=settings.lease_seconds,
            dispatch_factor=settings.dispatch_factor, save_timeout=settings.save_timeout,
        )

    @_converts_redis_errors
    def ping(self) -> None:
        self.client.ping()

    # -- workers ---------------------------------------------------------------------------

    @_converts_redis_errors
    def register_worker(self, host: str, pid: int, concurrency: int) -> str:
        worker_id = f"w{self.client.incr(keys.WORKER_SEQ)}"
        info = json.dumps({"host": host, "pid": pid, "concurrency": concurrency})
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(keys.WORKERS, worker_id, info)
        pipe.hset(keys.WORKER_CONCURRENCY, worker_id, concurrency)
        pipe.execute()
        self.heartbeat(worker_id)
        return worker_id

    @_converts_redis_errors
    def heartbeat(self, worker_id: str) -> None:
        self._beat(worker_id)

    def _beat(self, worker_id: str) -> int:
        total, _live = self._heartbeat_script(
            keys=[keys.HEARTBEATS, keys.WORKER_CONCURRENCY], args=[worker_id, self.lease_seconds]
        )
        self._bound = int(total) * self.dispatch_factor
        self._bound_at = time.monotonic()
        return self._bound

    @_converts_redis_errors
    def deregister_worker(self, worker_id: str) -> None:
        self._deregister_script(keys=[keys.HEARTBEATS], args=[worker_id, self.lease_seconds])

    @_converts_redis_errors
    def prune_workers(self, max_age: float) -> list[str]:
        return list(self._prune_script(
            keys=[keys.HEARTBEATS, keys.WORKERS, keys.WORKER_CONCURRENCY],
            args=[max_age, MAX_PRUNE_BATCH],
        ))

    @_converts_redis_errors
    def workers(self) -> list[WorkerInfo]:
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(keys.WORKERS)
        pipe.zrange(keys.HEARTBEATS, 0, -1, withscores=True)
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

    @_converts_redis_errors
    def dispatch_bound(self) -> int:
        if self._bound is None or time.monotonic() - self._bound_at > self._bound_refresh:
            return self._beat("")
        return self._bound

    # -- jobs ------------------------------------------------------------------------------

    @_converts_redis_errors
    def create_job(self, job: str, spec_json: str, limits: Optional[CrawlLimits] = None) -> bool:
        k = keys.JobKeys(job)
        policy = (limits or CrawlLimits()).policy_fields()
        created, existing = self._create_job_script(
            keys=[k.spec, keys.JOBS, k.policy, k.control, keys.ACTIVE_JOBS],
            args=[job, spec_json, *(x for pair in policy.items() for x in pair)],
        )
        # A stored spec never changes, so comparing the one the script read is comparing now.
        differences = [] if created else spec_differences(existing, spec_json)
        if differences:
            raise job_conflict(job, differences)
        return bool(created)

    @_converts_redis_errors
    def load_spec(self, job: str) -> str:
        spec = self.client.get(keys.JobKeys(job).spec)
        if spec is None:
            raise JobNotFound(f"no job named {job!r} on {self.url}")
        return spec

    @_converts_redis_errors
    def jobs(self) -> list[str]:
        return sorted(self.client.smembers(keys.JOBS))

    @_converts_redis_errors
    def active_jobs(self) -> list[str]:
        return sorted(self.client.smembers(keys.ACTIVE_JOBS))

    @_converts_redis_errors
    def job_info(self, job: str) -> JobInfo:
        k = keys.JobKeys(job)
        pipe = self.client.pipeline(transaction=True)
        pipe.hgetall(k.control)
        pipe.exists(k.spec)
        control, exists = pipe.execute()
        if not exists:
            raise JobNotFound(f"no job named {job!r} on {self.url}")

        def number(name: str) -> Optional[float]:
            return float(control[name]) if name in control else None

        final = {n: int(control[f"final_{n}"]) for n in ("seen", "done", "dead")
                 if f"final_{n}" in control}
        return JobInfo(job=job, state=JobState(control.get("state", "running")),
                       started=number("started"), ended=number("ended"), final=final)

    @_converts_redis_errors
    def control(self, job: str, action: JobAction) -> ControlResult:
        res = self._run("control", job, [JobAction(action).value, *self._top_up_args()])
        return ControlResult(dispatch=list(res[2:]), before=JobState(res[0]), after=JobState(res[1]))

    @_converts_redis_errors
    def delete_job(self, job: str) -> int:
        k = keys.JobKeys(job)
        if not (self.client.sismember(keys.JOBS, job) or self.client.exists(k.spec, k.control)):
            raise JobNotFound(f"no job named {job!r} on {self.url}")
        # Without its spec the item scripts refuse the job (NOJOB): a late worker recreates nothing.
        self.client.srem(keys.ACTIVE_JOBS, job)
        deleted = int(self.client.unlink(k.spec))
        scans = {"hash": self.client.hscan, "zset": self.client.zscan, "set": self.client.sscan}
        removes = {"hash": self.client.hdel, "zset": self.client.zrem, "set": self.client.srem}
        for key in self.client.scan_iter(match=k.pattern, count=DELETE_BATCH):
            kind = self.client.type(key)
            if kind in scans:
                self._empty(key, scans[kind], removes[kind])
            deleted += int(self.client.unlink(key))
        self.client.srem(keys.JOBS, job)
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

    @_converts_redis_errors
    def set_domain_delay(self, job: str, domain: str, seconds: float) -> None:
        policy = keys.JobKeys(job).policy
        if seconds > 0:
            self.client.hset(policy, f"delay:{domain}", float(seconds))
        else:
            self.client.hdel(policy, f"delay:{domain}")

    # -- items -----------------------------------------------------------------------------

    def _top_up_args(self) -> list[Any]:
        return [self.dispatch_bound(), MAX_DISPATCH_BATCH, self.lease_seconds]

    def add(self, job: str, items: Sequence[str], depth: int = 0) -> AddResult:
        return self._add_batches(job, list(items), depth)

    def add_stream(
        self, job: str, items: Iterable[str], depth: int = 0
    ) -> Iterator[tuple[int, AddResult]]:
        for group in batches(items, MAX_ADD_BATCH * ADD_STREAM_PIPELINE):
            yield len(group), self._add_batches(job, group, depth)

    @_converts_redis_errors
    def _add_batches(self, job: str, items: Sequence[str], depth: int) -> AddResult:
        """One round trip: a short Lua call per MAX_ADD_BATCH items, pipelined (one call with no
        items still tops up dispatch)."""
        k = keys.JobKeys(job).item_keys()
        top_up = self._top_up_args()
        pipe = self.client.pipeline(transaction=False)
        for chunk in list(_chunks(items, MAX_ADD_BATCH)) or [[]]:
            self._scripts["add"](keys=k, args=[depth, *top_up, *chunk], client=pipe)
        added, dispatch = 0, []
        for res in pipe.execute():
            added += int(res[0])
            dispatch.extend(res[1:])
        return AddResult(dispatch=dispatch, added=added)

    def _run(self, name: str, job: str, args: Sequence[Any]) -> Any:
        return self._scripts[name](keys=keys.JobKeys(job).item_keys(), args=list(args))

    @_converts_redis_errors
    def checkout(self, job: str, item: str, worker_id: str, *, max_lost: int) -> Checkout:
        bound, max_batch, lease = self._top_up_args()
        res = self._run("checkout", job, [item, worker_id, lease, bound, max_batch, max_lost])
        return Checkout(
            status=LeaseStatus(res[0]), depth=int(res[1]), failed_attempts=int(res[2]),
            token=int(res[3]), wait=float(res[4]), dispatch=list(res[5:]),
        )

    @_converts_redis_errors
    def scraped(
        self, job: str, item: str, token: int, found: Sequence[str] = (), depth: int = 0
    ) -> ScrapedResult:
        found = list(found)
        added, dispatch = 0, []
        # Finds beyond one batch go first, through add; the last batch rides with the state change.
        while len(found) > MAX_ADD_BATCH:
            res = self.add(job, found[:MAX_ADD_BATCH], depth)
            added += res.added
            dispatch.extend(res.dispatch)
            found = found[MAX_ADD_BATCH:]
        res = self._run(
            "scraped", job, [item, token, self.save_timeout, depth, *self._top_up_args(), *found]
        )
        return ScrapedResult(
            dispatch=dispatch + list(res[2:]), added=added + int(res[1]), held=res[0] == "ok"
        )

    @_converts_redis_errors
    def begin_save(self, job: str, item: str, token: int, worker_id: str, *, max_lost: int) -> SaveBegin:
        bound, max_batch, lease = self._top_up_args()
        res = self._run("begin_save", job, [item, token, worker_id, lease, max_lost, bound, max_batch])
        return SaveBegin(dispatch=list(res[2:]), status=SaveStart(res[0]), lost=int(res[1]))

    @_converts_redis_errors
    def defer_save(self, job: str, item: str, token: int) -> bool:
        return bool(self._run("defer_save", job, [item, token, self.save_timeout]))

    @_converts_redis_errors
    def complete(self, job: str, item: str) -> CompleteResult:
        res = self._run("complete", job, [item, *self._top_up_args()])
        return CompleteResult(dispatch=list(res[1:]), changed=bool(res[0]))

    @_converts_redis_errors
    def fail(
        self, job: str, item: str, token: int, reason: str, *, fault: Fault, max_retries: int,
        max_lost: int, retryable: bool = True, delay: float = 0.0,
    ) -> FailResult:
        res = self._run(
            "fail", job,
            [item, token, reason[:MAX_REASON], Fault(fault).value, int(retryable), max_retries,
             max_lost, *self._top_up_args(), max(float(delay), 0.0)],
        )
        return FailResult(dispatch=list(res[1:]), outcome=FailOutcome(res[0]))

    @_converts_redis_errors
    def extend(
        self, job: str, items: Sequence[str], worker_id: str,
        saves: Sequence[tuple[str, int]] = (), running: Optional[Sequence[str]] = None,
    ) -> int:
        items = list(items)
        running = items if running is None else list(running)
        n = 0
        for chunk in _chunks(items, MAX_ADD_BATCH):
            n += int(self._run("extend", job, [self.lease_seconds, worker_id, len(chunk), *chunk, 0]))
        for chunk in _chunks(running, MAX_ADD_BATCH):
            n += int(self._run("extend", job, [self.lease_seconds, worker_id, 0, len(chunk), *chunk]))
        for chunk in _chunks(list(saves), MAX_ADD_BATCH // 2):
            pairs = [x for item, token in chunk for x in (item, token)]
            n += int(self._run("extend", job, [self.lease_seconds, worker_id, 0, 0, *pairs]))
        return n

    @_converts_redis_errors
    def maintain(self, job: str, *, max_lost: int) -> MaintainResult:
        res = self._run(
            "maintain", job,
            [*self._top_up_args(), MAX_RECLAIM_BATCH, max_lost, WAKE_WHILE_LEASED],
        )
        return MaintainResult(
            dispatch=list(res[4:]), reclaimed=int(res[0]), died=int(res[1]),
            wake=float(res[2]) if res[2] else None, finished=bool(res[3]),
        )

    @_converts_redis_errors
    def release(self, job: str, worker_id: Optional[str] = None) -> int:
        return int(self._run("release", job, [worker_id or "", self.save_timeout]))

    @_converts_redis_errors
    def stats(self, job: str) -> JobStats:
        k = keys.JobKeys(job)
        pipe = self.client.pipeline(transaction=True)
        pipe.hgetall(k.stats)
        pipe.zcard(k.dispatched)
        pipe.zcard(k.leased)
        pipe.zcard(k.pending)
        pipe.zcard(k.delayed)
        pipe.exists(k.spec)
        counters, dispatched, leased, pending, delayed, exists = pipe.execute()
        if not exists:
            raise JobNotFound(f"no job named {job!r} on {self.url}")
        c = {name: int(counters.get(name, 0)) for name in ("seen", "queued", "done", "dead")}
        return JobStats(
            seen=c["seen"], frontier=c["queued"], dispatched=dispatched, leased=leased,
            done=c["done"], dead=c["dead"], saving=pending, delayed=delayed,
        )

    def _hscan(self, job: str, key: str) -> Iterator[tuple[str, str]]:
        """The fields of one of the job's hashes, streamed a batch at a time."""
        self.load_spec(job)  # JobNotFound for a job never seeded
        try:
            yield from self.client.hscan_iter(key, count=MAX_ADD_BATCH)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise TrackerUnavailable(f"Redis at {self.url} is unreachable: {exc}") from exc

    def iter_dead(self, job: str) -> Iterator[tuple[str, str]]:
        yield from self._hscan(job, keys.JobKeys(job).dead)

    def iter_done(self, job: str) -> Iterator[str]:
        for item, state in self._hscan(job, keys.JobKeys(job).items):
            if state.startswith("D"):
                yield item

    def retry_dead(self, job: str) -> RetryDeadResult:
        n, dispatch = 0, []
        batch: list[str] = []
        # One pass of HSCAN sees every item dead when it began; each batch is one atomic call.
        for item, _reason in self.iter_dead(job):
            batch.append(item)
            if len(batch) == MAX_ADD_BATCH:
                n, dispatch = self._retry_dead_batch(job, batch, n, dispatch)
                batch = []
        n, dispatch = self._retry_dead_batch(job, batch, n, dispatch)
        return RetryDeadResult(dispatch=dispatch, requeued=n)

    @_converts_redis_errors
    def _retry_dead_batch(
        self, job: str, batch: list[str], n: int, dispatch: list[str]
    ) -> tuple[int, list[str]]:
        res = self._run("retry_dead", job, [*self._top_up_args(), *batch])
        return n + int(res[0]), dispatch + list(res[1:])

    @_converts_redis_errors
    def leased_by_worker(self, job: str) -> dict[str, int]:
        # Owners hold only in-flight items, so the hash stays as small as the broker's bound.
        owners = (o.split(" ", 1)[0] for o in self.client.hvals(keys.JobKeys(job).owners))
        # "-": a save message waiting in the broker, which nobody holds.
        return dict(Counter(w for w in owners if w != "-"))
