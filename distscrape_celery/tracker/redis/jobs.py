"""RedisTracker's calls on whole jobs: create, control, delete, and report their items."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Optional

import redis

from .. import keys
from ...errors import JobConflict, JobNotFound, JobStateError, TrackerUnavailable
from ..base import MAX_ADD_BATCH
from ..model import (
    ControlResult, CrawlLimits, DomainStats, JobAction, JobInfo, JobState, JobStats,
    RetryDeadResult, SKIP_COUNTERS,
)
from .connection import converts_redis_errors
from .scripts import dispatched
from .shards import DELETE_BATCH, SHARDS_FIELD, ShardLayout, shard_policy


def spec_differences(stored: str, new: str) -> list[str]:
    """Dotted fields (``saver.output``) in which two spec JSONs differ, ``seeds`` aside: a job
    takes new seeds, never new options. Empty when ``new`` may join the job ``stored`` defines."""

    def walk(old_value: Any, new_value: Any, path: str) -> list[str]:
        if isinstance(old_value, dict) and isinstance(new_value, dict):
            return [
                diff for key in sorted(set(old_value) | set(new_value))
                if not (path == "" and key == "seeds")
                for diff in walk(old_value.get(key), new_value.get(key),
                                 f"{path}.{key}" if path else key)
            ]
        return [] if old_value == new_value else [path or "(spec)"]

    return walk(json.loads(stored), json.loads(new), "")


def job_conflict(job: str, differences: Sequence[str]) -> JobConflict:
    """The error that refuses a job's new spec, naming the ``differences`` (spec_differences)."""
    *others, last = differences
    what = f"{', '.join(others)} and {last} differ" if others else f"{last} differs"
    return JobConflict(
        f"job {job!r} already exists with a different spec ({what}); only seeds can be added "
        "to a job: pick another job name"
    )


class JobCalls(ShardLayout):
    """A job's life (create, pause, resume, cancel, delete) and its figures, over every shard."""

    @converts_redis_errors
    def create_job(self, job: str, spec_json: str, limits: Optional[CrawlLimits] = None) -> bool:
        limits = limits or CrawlLimits()
        shards = limits.shards
        job_keys = keys.JobKeys(job)
        creation = uuid.uuid4().hex
        max_duration = "" if limits.max_duration is None else float(limits.max_duration)
        if not self._routed(shards):
            policy = limits.policy_fields()
            created, existing = self._create_job_script(
                keys=[job_keys.spec, job_keys.policy, job_keys.control, job_keys.stats, keys.JOBS,
                      keys.ACTIVE_JOBS],
                args=[job, spec_json, 0, keys.JOB_FORMAT, creation, 0, max_duration,
                      *(x for pair in policy.items() for x in pair)],
            )
        else:
            # Listed first, so delete finds a job whose creation was cut short. It is not active
            # yet: it has no work until items come, and their add marks and lists it.
            self.client.sadd(keys.JOBS, job)
            created = existing = None
            # Shard 0 first: a conflicting spec is refused before any other shard is written.
            for s in range(shards):
                shard_keys = keys.JobKeys(job, s)
                policy = shard_policy(limits, s)
                shard_created, shard_spec = self._create_job_script(
                    keys=[shard_keys.spec, shard_keys.policy, shard_keys.control, shard_keys.stats],
                    args=[job, spec_json, s << keys.SHARD_TOKEN_BITS, keys.JOB_FORMAT, creation,
                          int(s > 0 and bool(created)), max_duration,
                          *(x for pair in policy.items() for x in pair)],
                )
                if s == 0:
                    created, existing = shard_created, shard_spec
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
            # (a shard never given an item has nothing to finish); expired, all of them ended
            # and one expired (each shard runs out of time on its own).
            if head.get("state") in ("paused", "cancelled"):
                state = head["state"]
            elif self._idle(controls):
                state = "finished"
            elif self._ended(controls):
                state = "expired"
            else:
                state = "running"
            ended = [float(c["ended"]) for c in controls if "ended" in c]
            head = {"state": state, "started": head.get("started")}
            if JobState(state).ended and ended:
                head["ended"] = str(max(ended))
                for n in ("seen", "done", "dead", "unchanged", "gone"):
                    head[f"final_{n}"] = str(sum(int(c.get(f"final_{n}", 0)) for c in controls))
                if state == "expired":
                    head["final_queued"] = str(sum(
                        int(c.get("final_seen", 0)) - int(c.get("final_done", 0))
                        - int(c.get("final_dead", 0)) for c in controls))

        def number(name: str) -> Optional[float]:
            return float(head[name]) if head.get(name) is not None else None

        final = {n: int(head[f"final_{n}"]) for n in ("seen", "done", "dead", "queued")
                 if f"final_{n}" in head}
        # A job that revisits counts these too; the others never have any.
        final.update({n: int(head[f"final_{n}"]) for n in ("unchanged", "gone")
                      if int(head.get(f"final_{n}", 0))})
        own = controls[0]  # the schedule and generation are shard 0's
        return JobInfo(job=job, state=JobState(head.get("state", "running")),
                       started=number("started"), ended=number("ended"), final=final,
                       generation=int(own.get("generation", 1)),
                       next_due=float(own["next_due"]) if own.get("next_due") else None,
                       schedule=own.get("schedule"), schedule_paused=own.get("schedule_paused") == "1")

    @converts_redis_errors
    def control(self, job: str, action: JobAction) -> ControlResult:
        shards = self._shards(job)
        if shards == 1:
            res = self._run("control", job, [JobAction(action).value, *self._top_up_args(job)])
            before, after = JobState(res[0]), JobState(res[1])
            dispatch = dispatched(res[2:])
        else:
            before = self.job_info(job).state
            if before is JobState.FINISHED and action != JobAction.RESUME:
                raise JobStateError(f"job {job!r}: the job is finished")
            if before is JobState.EXPIRED:
                raise JobStateError(f"job {job!r}: the job expired: its max_duration ran out")
            dispatch = []
            for s in range(shards):  # shard 0 first: it speaks for the job (job_info)
                res = self._eval("control", self._item_keys(job, s),
                                 [JobAction(action).value, *self._top_up_args(job), 1])
                dispatch.extend(dispatched(res[2:]))
            after = self.job_info(job).state
        if self._routed(shards):
            if action == JobAction.CANCEL:
                self._unlist_if_idle(job)
            else:
                self._mirror_active(job, range(shards))
        return ControlResult(dispatch=dispatch, before=before, after=after)

    @converts_redis_errors
    def delete_job(self, job: str) -> int:
        job_keys = keys.JobKeys(job)
        if not (self.client.sismember(keys.JOBS, job)
                or self.client.exists(job_keys.spec, job_keys.control)):
            raise JobNotFound(f"no job named {job!r} on {self.url}")
        try:
            shards = self._shards(job)
        except JobNotFound:  # its spec is gone already (a delete cut short): shard 0 only
            shards = int(self.client.hget(job_keys.policy, SHARDS_FIELD) or 1)
        # Without its spec the item scripts refuse the job (NOJOB): a late worker recreates nothing.
        self.client.srem(keys.ACTIVE_JOBS, job)
        deleted = sum(int(self.client.unlink(keys.JobKeys(job, s).spec)) for s in range(shards))
        scans = {"hash": self.client.hscan, "zset": self.client.zscan, "set": self.client.sscan}
        removes = {"hash": self.client.hdel, "zset": self.client.zrem, "set": self.client.srem}
        # A cluster client's scan_iter visits every master (SCAN itself covers one node). The
        # policy of shard 0 (its shard count) goes last, so a delete cut short can be redone.
        for s in reversed(range(shards)):
            shard_keys = keys.JobKeys(job, s)
            buckets: list[str] = []
            for key in self.client.scan_iter(match=shard_keys.pattern, count=DELETE_BATCH):
                if s == 0 and key == shard_keys.policy:
                    continue
                if key.startswith((shard_keys.seen_buckets, shard_keys.item_buckets)):
                    # A seen-set or live-item bucket is one small intset or listpack allocation,
                    # freed in O(1): a batch of them goes in one short UNLINK (a 10M-item job has
                    # ~60,000 seen-set buckets, or ~280,000 live-item buckets while all are
                    # queued). Keys of one shard share a slot, so one UNLINK may take many on a
                    # cluster too.
                    buckets.append(key)
                    if len(buckets) == DELETE_BATCH:
                        deleted += int(self.client.unlink(*buckets))
                        buckets = []
                    continue
                kind = self.client.type(key)
                if kind in scans:
                    self._empty(key, scans[kind], removes[kind])
                deleted += int(self.client.unlink(key))
            if buckets:
                deleted += int(self.client.unlink(*buckets))
        if not self.cluster:
            # Its fetches under way in the sites every job shares (on a cluster, its own keys).
            for key in self.client.scan_iter(match=keys.site_fetches_pattern(job),
                                             count=DELETE_BATCH):
                deleted += int(self.client.unlink(key))
        deleted += int(self.client.unlink(job_keys.policy))
        self.client.srem(keys.JOBS, job)
        self._layouts.pop(job, None)
        for cached in [key for key in self._key_lists if key[0] == job]:
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

    @converts_redis_errors
    def count_sitemap_urls(self, job: str, domain: str, count: int) -> int:
        shards, _ = self._layout(job)
        counts = keys.JobKeys(job, keys.shard_of(domain, shards)).sitemap_urls
        return int(self.client.hincrby(counts, domain, int(count)))

    # -- a job's figures and dead items -----------------------------------------------------

    @converts_redis_errors
    def stats(self, job: str) -> JobStats:
        try:
            shards = self._shards(job)
        except JobNotFound:
            raise JobNotFound(f"no job named {job!r} on {self.url}") from None
        pipe = self.client.pipeline(transaction=not self.cluster)
        for s in range(shards):
            shard_keys = keys.JobKeys(job, s)
            pipe.hgetall(shard_keys.stats)
            pipe.zcard(shard_keys.dispatched)
            pipe.zcard(shard_keys.leased)
            pipe.zcard(shard_keys.pending)
            pipe.zcard(shard_keys.delayed)
        pipe.exists(keys.JobKeys(job).spec)
        replies = pipe.execute()
        if not replies[-1]:
            raise JobNotFound(f"no job named {job!r} on {self.url}")
        total = Counter()
        for s in range(shards):
            counters, dispatched, leased, pending, delayed = replies[5 * s : 5 * s + 5]
            for name in ("seen", "queued", "done", "dead", "links_cut", "unchanged", "gone", "kn",
                         *SKIP_COUNTERS):
                total[name] += int(counters.get(name, 0))
            total.update(dispatched=dispatched, leased=leased, pending=pending, delayed=delayed)
        return JobStats(
            seen=total["seen"], frontier=total["queued"], dispatched=total["dispatched"],
            leased=total["leased"], done=total["done"], dead=total["dead"],
            save_pending=total["pending"], delayed=total["delayed"], links_cut=total["links_cut"],
            unchanged=total["unchanged"], gone=total["gone"], known=total["kn"],
            noindex=total["noindex"], canonical=total["canonical"],
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
        requeued, dispatch = 0, []
        # One pass of HSCAN sees every item dead when it began; each batch is one atomic call on
        # the item's own shard.
        for s in range(self._shards(job)):
            batch: list[str] = []
            for item, _reason in self.client.hscan_iter(keys.JobKeys(job, s).dead,
                                                        count=MAX_ADD_BATCH):
                batch.append(item)
                if len(batch) == MAX_ADD_BATCH:
                    requeued, dispatch = self._retry_dead_batch(job, s, batch, requeued, dispatch)
                    batch = []
            requeued, dispatch = self._retry_dead_batch(job, s, batch, requeued, dispatch)
        return RetryDeadResult(dispatch=dispatch, requeued=requeued)

    @converts_redis_errors
    def _retry_dead_batch(
        self, job: str, shard: int, batch: list[str], requeued: int, dispatch: list[str]
    ) -> tuple[int, list[str]]:
        reply = self._run("retry_dead", job, [*self._top_up_args(job), *batch], shard)
        if int(reply[0]):
            self._mirror_active(job, [shard])
        return requeued + int(reply[0]), dispatch + dispatched(reply[1:])

    def domain_stats(self, job: str) -> list[DomainStats]:
        shards, id_domain = self._layout(job)
        dead: Counter[str] = Counter(keys.domain_of(item, id_domain)
                                     for item, _reason in self.iter_dead(job))
        return self._domain_figures(job, shards, dead)

    @converts_redis_errors
    def _domain_figures(self, job: str, shards: int, dead: Counter[str]) -> list[DomainStats]:
        found: dict[str, DomainStats] = {}
        for s in range(shards):
            k = keys.JobKeys(job, s)
            reply = self._domain_stats_script(keys=[k.domains, k.inflight, k.latency, k.queues])
            for i in range(0, len(reply), 4):
                domain = reply[i].decode() if isinstance(reply[i], bytes) else reply[i]
                mean = reply[i + 3]
                found[domain] = DomainStats(
                    domain, queued=int(reply[i + 1]), in_flight=max(int(reply[i + 2]), 0),
                    dead=dead[domain], mean_fetch=int(mean) / 1e6 if mean else None)
        for domain, count in dead.items():  # dead items only: nothing queued or in flight
            found.setdefault(domain, DomainStats(domain, dead=count))
        return list(found.values())

    @converts_redis_errors
    def leased_by_worker(self, job: str) -> dict[str, int]:
        # Owners hold only in-flight items, so the hash stays as small as the broker's bound.
        total: Counter[str] = Counter()
        for s in range(self._shards(job)):
            owners = (o.split(" ", 1)[0] for o in self.client.hvals(keys.JobKeys(job, s).owners))
            # "-": a save message waiting in the broker, which nobody holds.
            total.update(w for w in owners if w != "-")
        return dict(total)
