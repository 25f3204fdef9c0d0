"""How RedisTracker spreads a job over shards, and keeps the list of active jobs right.

Shards and Redis Cluster. A job of ``tracker.shards`` > 1 has one full set of item keys per shard
(keys.py), each its own hash tag; an item's operations run on the shard of its domain
(:func:`keys.shard_of`), so per-domain politeness is exact within one shard. Calls on the whole
job (stats, control, maintain, delete, ...) visit every shard. ``max_pages`` and the broker bound
are split over the shards (each shard gets ``ceil(bound / n)``, so the broker may hold up to n-1
messages more than the bound; each shard keeps ``max_pages / n``, so a job whose domains fall
unevenly stops adding before max_pages).

The active-jobs rule ("a job with unfinished work is always maintained") across slots: on one
Redis an unsharded job's scripts update ``ds:active-jobs`` atomically, as ever. A sharded job, or
any job on a cluster, has a marker set per shard (``P active``) that its scripts update instead,
atomically with the work, and the client mirrors it into ``ds:active-jobs``:

* after a call that may have marked a shard (items added, resume, retry-dead), the client reads
  the marker and adds the job if it is set (:meth:`RedisTracker._mirror_active`);
* only maintain (after the job's end is recorded) and cancel take a job out: remove it, then read
  every marker, and add it back if any is set (:meth:`RedisTracker._unlist_if_idle`). A marker set
  before that read is seen; one set after it is mirrored by its own caller after the removal.
* a client that dies between its script and its mirror is covered by the sweep every worker runs
  now and then (:meth:`RedisTracker.heal_active_jobs`): a listed job with a marked shard is added.

Completion of a sharded job: its shards finish one by one (maintain.lua, per shard). The job is
finished when every shard was idle at one moment: two reads of every shard's (state, epoch,
seen) agree and show every shard finished or never given an item. An epoch moves on at every end
of a shard (record_end in _lib_job.lua), so agreeing reads mean no shard ran in between. finish_job.lua
then records that idle period once in shard 0, and only that caller reports ``finished``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .. import keys
from ...errors import JobNotFound
from ..base import MAX_ADD_BATCH
from ..model import CrawlLimits, JobState
from .connection import RedisCore, converts_redis_errors

# Job names read per SSCAN, and keys (or hash fields, set members) removed per command when a
# job is deleted: each command stays short, so Redis keeps answering others meanwhile.
DELETE_BATCH = 200
# Policy field holding a sharded job's shard count (absent: 1).
SHARDS_FIELD = "shards"
# Most items one call hands out for dispatch (each shard's, see _top_up_args): the max_batch of
# take_for_dispatch in the Lua library.
MAX_DISPATCH_BATCH = 200


def shard_policy(limits: CrawlLimits, shard: int) -> dict[str, Any]:
    """The policy hash of one shard: the job's, with its share of max_pages (an even split,
    the first shards taking the remainder) and the shard count."""
    fields = limits.policy_fields()
    n = limits.shards
    if n > 1:
        fields[SHARDS_FIELD] = n
        if limits.max_pages is not None:
            share = limits.max_pages // n + (1 if shard < limits.max_pages % n else 0)
            # A shard whose share is 0 takes nothing (max_pages < shards).
            fields["max_pages"] = share
    return fields


def chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    """``items`` in slices of up to ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


class ShardLayout(RedisCore):
    """Which shard holds what, the item scripts run on it, and the active-jobs mirror."""

    # -- layout: shards ---------------------------------------------------------------------

    def _layout(self, job: str) -> tuple[int, str]:
        """The job's shard count and id_domain, read once (neither ever changes)."""
        layout = self._layouts.get(job)
        if layout is None:
            k = keys.JobKeys(job)
            pipe = self.client.pipeline(transaction=False)
            pipe.exists(k.spec)
            pipe.hmget(k.policy, SHARDS_FIELD, "id_domain")
            exists, (shards, id_domain) = pipe.execute()
            if not exists:
                raise JobNotFound(f"no job named {job!r} on {self.url}")
            layout = (int(shards or 1), id_domain or keys.NO_DOMAIN)
            self._layouts[job] = layout
        return layout

    def _shards(self, job: str) -> int:
        return self._layout(job)[0]

    def _routed(self, shards: int) -> bool:
        """Whether the job's scripts keep shard-local active markers (see the module doc)."""
        return self.cluster or shards > 1

    def _shard_of(self, job: str, item: str) -> int:
        """The shard that holds ``item`` (0 for an unsharded job, without parsing the item)."""
        shards, id_domain = self._layout(job)
        if shards == 1:
            return 0
        return keys.shard_of(keys.domain_of(item, id_domain), shards)

    def _item_keys(self, job: str, shard: int = 0) -> tuple[str, ...]:
        # Built once per job and shard: every item call takes them (21 names).
        found = self._key_lists.get((job, shard))
        if found is None:
            # A cluster keeps each job's sites apart (keys.py): one call's keys share a slot.
            found = keys.JobKeys(job, shard).item_keys(
                local_active=self._routed(self._shards(job)), shared_sites=not self.cluster)
            self._key_lists[(job, shard)] = found
        return found

    def _by_shard(self, job: str, items: Iterable[str]) -> dict[int, list[str]]:
        """``items`` grouped by the shard that holds them, in their order within each."""
        shards = self._shards(job)
        if shards == 1:
            return {0: list(items)}
        out: dict[int, list[str]] = {}
        for item in items:
            out.setdefault(self._shard_of(job, item), []).append(item)
        return out

    def _by_shard_with(
        self, job: str, pairs: Sequence[tuple[str, Any]]
    ) -> dict[int, list[tuple[str, Any]]]:
        """(item, value) ``pairs`` grouped by the shard that holds their item, in their order
        within each."""
        if self._shards(job) == 1:
            return {0: list(pairs)}
        out: dict[int, list[tuple[str, Any]]] = {}
        for pair in pairs:
            out.setdefault(self._shard_of(job, pair[0]), []).append(pair)
        return out

    def _group_pairs(self, job: str, pairs: Sequence[tuple[str, int]]) -> dict[int, list[tuple[str, int]]]:
        """``pairs`` (item, token) by the shard of their item."""
        by_shard: dict[int, list[tuple[str, int]]] = {}
        for item, token in pairs:
            by_shard.setdefault(self._shard_of(job, item), []).append((item, int(token)))
        return by_shard

    def _pairs_by_shard(self, job: str, pairs: Sequence[tuple[str, int]]) -> Iterator[tuple[int, list[Any]]]:
        """(shard, flat item, token, item, token... arguments) for ``pairs``, a script's worth at a
        time, shard by shard."""
        for s, group in sorted(self._group_pairs(job, pairs).items()):
            for chunk in chunks(group, MAX_ADD_BATCH // 2):
                yield s, [x for item, token in chunk for x in (item, token)]

    def _token_home(self, job: str, item: str, token: int) -> bool:
        """Whether lease ``token`` was handed out by the shard that holds ``item`` (see
        _body_keys)."""
        return int(token) >> keys.SHARD_TOKEN_BITS == self._shard_of(job, item)

    def _body_keys(self, job: str, token: int, home: int) -> list[str]:
        """The body key of lease ``token`` as an extra script key, if it is in shard ``home``'s
        slot. Every token the item's shard hands out is; another cannot hold the item, so the
        script would stage nothing anyway (and a cluster would refuse the key)."""
        if token >> keys.SHARD_TOKEN_BITS != home:
            return []
        return [keys.body_key(job, token)]

    def _top_up_args(self, job: str) -> list[Any]:
        """The dispatch top-up arguments of one of ``job``'s scripts. Each shard tops up on its
        own: it gets an even share of the bound, rounded up so that none is starved (the broker
        may hold up to shards-1 messages over the bound)."""
        shards = self._shards(job)
        bound = f"{-(-self.dispatch_bound() // shards)} {-(-self.save_bound() // shards)}"
        return [bound, MAX_DISPATCH_BATCH, self.lease_seconds]

    def _run(self, name: str, job: str, args: Sequence[Any], shard: int = 0) -> Any:
        return self._eval(name, self._item_keys(job, shard), args)

    def _run_item(self, name: str, job: str, item: str, args: Sequence[Any]) -> Any:
        """Run an item script on the shard that holds ``item``."""
        return self._run(name, job, args, self._shard_of(job, item))

    # -- the active-jobs mirror and the completion of sharded jobs ------------------------------

    def _mirror_active(self, job: str, shards: Iterable[int]) -> None:
        """List ``job`` as active if one of ``shards`` is marked active (after a call on them
        that may have marked them). Runs after the script, so an unlisting that ran before this
        read is undone here, and one that runs after it sees the marker itself."""
        if not self._routed(self._shards(job)):
            return
        pipe = self.client.pipeline(transaction=False)
        for s in sorted(set(shards)):
            pipe.sismember(keys.JobKeys(job, s).active, job)
        if any(pipe.execute()):
            self.client.sadd(keys.ACTIVE_JOBS, job)

    def _marked(self, job: str, shards: int) -> bool:
        """Whether a shard of ``job`` that has work is marked active: it was given an item, or
        its generation's refill is under way (it may find its first item due many maintain calls
        from now). A shard never given one has nothing to finish, so its marker (set by a resume)
        never clears: it does not count. An add that gives it items and reads as unmarked here is
        caught by :meth:`_unlist_if_idle`'s second read, or mirrored by its own caller after
        it."""
        pipe = self.client.pipeline(transaction=False)
        for s in range(shards):
            k = keys.JobKeys(job, s)
            pipe.sismember(k.active, job)
            pipe.hget(k.stats, "seen")
            pipe.hexists(k.control, "refill")
        res = pipe.execute()
        return any(res[3 * s] and (int(res[3 * s + 1] or 0) > 0 or res[3 * s + 2])
                   for s in range(shards))

    def _unlist_if_idle(self, job: str) -> None:
        """Take ``job`` out of ``ds:active-jobs`` unless a shard is marked. The removal comes
        first and the markers are read after it, so a shard marked meanwhile is never missed:
        either this read sees it, or its own caller's mirror runs after the removal."""
        shards = self._shards(job)
        if self._marked(job, shards):
            return
        self.client.srem(keys.ACTIVE_JOBS, job)
        if self._marked(job, shards):
            self.client.sadd(keys.ACTIVE_JOBS, job)

    @converts_redis_errors
    def heal_active_jobs(self) -> int:
        """List every job that has a shard marked active but is not listed (its client died
        between its script and its mirror). Returns how many were listed. Workers run it now and
        then; on one Redis, unsharded jobs need none of it (their scripts list them)."""
        listed = set(self.client.smembers(keys.ACTIVE_JOBS))
        healed = 0
        for job in self.client.sscan_iter(keys.JOBS, count=DELETE_BATCH):
            if job in listed:
                continue
            try:
                shards = self._shards(job)
            except JobNotFound:  # being created or deleted
                continue
            if self._routed(shards) and self._marked(job, shards):
                self.client.sadd(keys.ACTIVE_JOBS, job)
                healed += 1
        return healed

    def _shard_controls(self, job: str, shards: int) -> list[dict[str, str]]:
        """Every shard's control hash plus its ``seen`` counter, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for s in range(shards):
            k = keys.JobKeys(job, s)
            pipe.hgetall(k.control)
            pipe.hget(k.stats, "seen")
        res = pipe.execute()
        return [{**res[2 * s], "seen": res[2 * s + 1] or "0"} for s in range(shards)]

    @staticmethod
    def _idle(controls: list[dict[str, str]]) -> bool:
        """Every shard at shard 0's generation, each finished or with nothing to do (never
        given an item, no refill under way), and at least one item seen (or a generation after
        the first begun: it may find nothing due). A shard behind shard 0 has yet to start the
        generation (start_generation runs shard 0 first); one whose refill has not queued its
        first item has seen nothing yet."""
        started = sum(int(c["seen"]) for c in controls) > 0 or "generation" in controls[0]
        generation = controls[0].get("generation", "1")
        return started and all(
            c.get("generation", "1") == generation and (
                c.get("state") == JobState.FINISHED.value
                or (c.get("state", "running") == "running" and c["seen"] == "0"
                    and "refill" not in c))
            for c in controls
        )

    @staticmethod
    def _ended(controls: list[dict[str, str]]) -> bool:
        """Every shard finished, expired or never given an item, one of them expired, and at
        least one item seen: nothing is left to maintain, and it ran out of time. (Finished
        shards alone, of different generations, are a generation under way.)"""
        return sum(int(c["seen"]) for c in controls) > 0 and any(
            c.get("state") == JobState.EXPIRED.value for c in controls) and all(
            c.get("state") in (JobState.FINISHED.value, JobState.EXPIRED.value)
            or (c.get("state", "running") == "running" and c["seen"] == "0")
            for c in controls
        )

    def _record_finish(self, job: str, shards: int) -> tuple[bool, bool]:
        """The double collect (see the module doc): (whether every shard was idle at one
        moment, or the job ended otherwise (expired); whether this caller recorded that moment
        finished: True for one caller only)."""
        first = self._shard_controls(job, shards)
        if not self._idle(first):
            return self._ended(first), False
        second = self._shard_controls(job, shards)
        fields = ("state", "epoch", "seen")
        if [[c.get(f) for f in fields] for c in first] != [[c.get(f) for f in fields] for c in second]:
            return False, False  # a shard moved in between: the next maintain looks again
        epochs = ",".join(c.get("epoch", "0") for c in second)
        return True, bool(self._finish_job_script(keys=[keys.JobKeys(job).control], args=[epochs]))
