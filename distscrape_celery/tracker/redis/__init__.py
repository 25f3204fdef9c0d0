"""RedisTracker: the tracker for distributed crawls. Each operation is one Lua script call.

RedisTracker is made of one class per kind of call, each built on the state they all share:

* :mod:`.connection`: :class:`~.connection.RedisCore`, the client, its scripts and running them
  on each thread's own connection, with redis-py's errors turned into the tracker's;
* :mod:`.scripts`: the Lua scripts in ``lua/``, read once, and their function library;
* :mod:`.shards`: which shard holds an item, the active-jobs mirror, finishing sharded jobs;
* :mod:`.workers`, :mod:`.jobs`, :mod:`.items`, :mod:`.saves`, :mod:`.generations`: the calls of the
  :class:`~distscrape_celery.tracker.base.Tracker` contract on each;
* :mod:`.staging`: where a downloaded body waits for its save, beside the scripts that stage
  and drop it.
"""

from __future__ import annotations

from .connection import connect
from .generations import GenerationCalls
from .items import ItemCalls
from .jobs import JobCalls
from .saves import SaveCalls
from .shards import shard_policy
from .workers import WorkerCalls

__all__ = ["RedisTracker", "connect", "shard_policy"]


class RedisTracker(WorkerCalls, JobCalls, ItemCalls, SaveCalls, GenerationCalls):
    """Tracker state in Redis; safe for any number of worker processes on any number of hosts."""
