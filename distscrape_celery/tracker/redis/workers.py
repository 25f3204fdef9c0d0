"""RedisTracker's calls on workers: IDs, heartbeats, and the broker bound they set."""

from __future__ import annotations

import json
import time

from .. import keys
from ..model import WorkerInfo
from .connection import RedisCore, converts_redis_errors

# Most dead workers' records pruned per call.
MAX_PRUNE_BATCH = 100


class WorkerCalls(RedisCore):
    """Workers register, beat and go; their live concurrency sets the dispatch bound."""

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
        self._slots = int(total)
        self._slots_at = time.monotonic()
        return self._slots

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
    def worker_slots(self) -> int:
        if self._slots is None or time.monotonic() - self._slots_at > self._slots_refresh:
            return self._beat("")
        return self._slots
