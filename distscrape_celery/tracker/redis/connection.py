"""The shared core of RedisTracker: its client, its scripts, and running them.

Every call of the tracker enters through :func:`converts_redis_errors`, which turns redis-py's
errors into the tracker's. Item scripts run on a connection each thread keeps
(:meth:`RedisCore._eval`), from the function library where Redis takes it (scripts.py); the
other modules of this package add the calls of the
:class:`~distscrape_celery.tracker.base.Tracker` contract on top of :class:`RedisCore`.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, Optional, TypeVar

import redis
from redis.client import NEVER_DECODE
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, NoScriptError, SlotNotCoveredError, TryAgainError

from . import scripts
from .combine import Combiner
from ...errors import JobNotFound, JobStateError, TrackerUnavailable
from ...redaction import redact
from ..base import Tracker
from ..defaults import DISPATCH_FACTOR, LEASE_SECONDS, REDIS_SOCKET_TIMEOUT, SAVE_BACKLOG_FACTOR
from .staging import body_ttl_ms

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T", bound="RedisCore")

log = logging.getLogger(__name__)

# execute_command's option for a reply read as bytes (bodies are binary).
UNDECODED = {NEVER_DECODE: []}


def _raise_first(replies: Sequence[Any]) -> None:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


def _lost(reply: Any) -> bool:
    """Whether ``reply`` is Redis's answer to an FCALL or EVALSHA of a function or script it
    does not have (it was restarted without persistence, or flushed)."""
    return isinstance(reply, NoScriptError) or (
        isinstance(reply, redis.ResponseError) and "Function not found" in str(reply))


# A request up to this size goes out in one write. redis-py sends each value over 6,000 bytes (a
# page's body) as a write of its own, and Redis then often reads one request in two or three
# reads, each an event-loop turn of its CPU; copying the body once costs less.
ONE_WRITE_MAX = 1 << 20


def _one_write(chunks: list[bytes]) -> list[bytes]:
    """``chunks`` of a packed request as one write when they are not too large to copy."""
    if len(chunks) < 2 or sum(len(c) for c in chunks) > ONE_WRITE_MAX:
        return chunks
    return [b"".join(chunks)]


def connect(url: str, *, cluster: bool = False, decode_responses: bool = True, **kwargs: Any) -> Any:
    """A client of the Redis at ``url``: a :class:`RedisCluster` (which follows the cluster's
    slots from that one node) when ``cluster``, else a plain one."""
    if cluster:
        return RedisCluster.from_url(url, decode_responses=decode_responses, **kwargs)
    return redis.Redis.from_url(url, decode_responses=decode_responses, **kwargs)


def converts_redis_errors(method: F) -> F:
    """Turn redis-py connection errors into :class:`TrackerUnavailable` where they enter."""

    @functools.wraps(method)
    def wrapper(self: "RedisCore", *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise TrackerUnavailable(f"Redis at {self.url} is unreachable: {exc}") from exc
        except (ClusterDownError, TryAgainError, SlotNotCoveredError) as exc:
            # A cluster failing over or resharding: as an outage, the caller retries later.
            raise TrackerUnavailable(f"Redis Cluster at {self.url} is unavailable: {exc}") from exc
        except redis.ResponseError as exc:
            # In a pipeline redis-py puts "Command # N (...) of pipeline caused error: " first.
            reply = str(exc).rpartition("caused error: ")[2]
            if reply.startswith("NOJOB"):  # raised by the item scripts (_begin.lua)
                raise JobNotFound(f"no job named {args[0]!r} on {self.url}") from None
            if reply.startswith("JOBSTATE"):  # raised by control.lua
                raise JobStateError(f"job {args[0]!r}: {reply[9:]}") from None
            if reply.startswith("JOBFORMAT"):  # raised by the item scripts (_begin.lua)
                raise JobStateError(f"job {args[0]!r}: {reply[10:]}") from None
            raise TrackerUnavailable(f"Redis at {self.url} answered with an error: {exc}") from exc

    return wrapper  # type: ignore[return-value]


class RedisCore(Tracker):
    """The state every part of RedisTracker shares, and the running of its scripts."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        lease_seconds: float = LEASE_SECONDS,
        dispatch_factor: float = DISPATCH_FACTOR,
        save_backlog_factor: int = SAVE_BACKLOG_FACTOR,
        save_timeout: Optional[float] = None,
        body_ttl: Optional[float] = None,
        bound_refresh_seconds: Optional[float] = None,
        functions: Optional[bool] = None,
    ) -> None:
        super().__init__(
            lease_seconds=lease_seconds, dispatch_factor=dispatch_factor,
            save_backlog_factor=save_backlog_factor, save_timeout=save_timeout, body_ttl=body_ttl,
        )
        self._body_ttl_ms = body_ttl_ms(self.body_ttl)
        if not client.get_connection_kwargs().get("decode_responses"):
            raise ValueError("RedisTracker needs a client created with decode_responses=True")
        self.client = client
        # On a cluster every script's keys must share a slot, and a pipeline may span nodes.
        self.cluster = isinstance(client, RedisCluster)
        kw = client.get_connection_kwargs()
        self.url = redact(f"redis://{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}")
        # job -> (shards, id_domain): both fixed when the job is created.
        self._layouts: dict[str, tuple[int, str]] = {}
        self._key_lists: dict[tuple[str, int], tuple[str, ...]] = {}
        self._scripts = {name: scripts.register(client, name)
                         for name in scripts.item_script_names()}
        # Whether the item scripts run from the function library: None until the first call
        # finds out (FUNCTION LOAD); a cluster runs scripts, each on the node of its keys.
        self._functions = False if self.cluster else functions
        self._heartbeat_script = scripts.register(client, "heartbeat")
        self._deregister_script = scripts.register(client, "deregister")
        self._prune_script = scripts.register(client, "prune_workers")
        self._create_job_script = scripts.register(client, "create_job")
        self._finish_job_script = scripts.register(client, "finish_job")
        self._domain_stats_script = scripts.register(client, "domain_stats")
        self._slots_refresh = (
            bound_refresh_seconds
            if bound_refresh_seconds is not None
            else min(max(self.lease_seconds / 4, 0.2), 2.0)
        )
        self._slots: Optional[int] = None
        self._slots_at = 0.0
        self._local = threading.local()  # the connection each thread keeps (_thread_connection)
        self._combiner = Combiner(self._send_combined)

    @classmethod
    def from_url(cls: type[T], url: str, *, cluster: bool = False, socket_timeout: float = REDIS_SOCKET_TIMEOUT,
                 **kwargs: Any) -> T:
        """Connect to ``url`` (a node of a Redis Cluster if ``cluster``) and check that Redis
        answers, so a bad URL fails now, clearly."""
        try:
            client = connect(
                url, cluster=cluster, socket_connect_timeout=5, socket_timeout=socket_timeout,
                health_check_interval=30,
            )
        except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.RedisClusterException) as exc:
            raise TrackerUnavailable(f"Redis Cluster at {redact(url)} is unreachable: {exc}") from exc
        tracker = cls(client, **kwargs)
        tracker.url = redact(url)
        tracker.ping()
        return tracker

    @classmethod
    def from_settings(cls: type[T], settings: Any) -> T:
        """The tracker that ``settings`` (a :class:`~distscrape_celery.settings.Settings`) names:
        its Redis, lease, broker bounds and save timeout. Typed loosely: the settings module
        takes its defaults from the tracker's (:mod:`..defaults`), so the tracker does not
        import it back."""
        return cls.from_url(
            settings.redis_url, cluster=settings.redis_cluster,
            socket_timeout=settings.redis_socket_timeout, lease_seconds=settings.lease_seconds,
            dispatch_factor=settings.dispatch_factor,
            save_backlog_factor=settings.save_backlog_factor, save_timeout=settings.save_timeout,
            body_ttl=settings.body_ttl,
        )

    @converts_redis_errors
    def ping(self) -> None:
        self.client.ping()

    def _eval(
        self, name: str, script_keys: Sequence[str], args: Sequence[Any], *, undecoded: bool = False
    ) -> Any:
        """Run item script ``name``; ``undecoded``: its reply as bytes, whatever the client
        decodes."""
        return self._eval_around(name, script_keys, args, undecoded=undecoded)[0]

    def _eval_around(
        self, name: str, script_keys: Sequence[str], args: Sequence[Any], *,
        before: Sequence[tuple[Any, ...]] = (), after: Sequence[tuple[Any, ...]] = (),
        undecoded: bool = False,
    ) -> tuple[Any, list[Any]]:
        """Run item script ``name`` with the commands ``before`` and ``after`` it in the same
        round trip (a body is staged and read so, never through Lua); its reply and those of
        ``after``. On one Redis, on a connection this thread keeps: taking a connection from
        redis-py's pool and going through its command layers cost about as much client CPU as
        the round trip itself (28 of 72 us for a checkout), and a page makes two of these calls.
        A cluster client routes each command by slot. A script or library that Redis lost
        (restarted, flushed) is loaded again, and the script and ``after`` sent again."""
        replies = self._send_many(
            [*before, self._script_command(name, script_keys, args), *after], undecoded)
        _raise_first(replies[:len(before)])
        replies = replies[len(before):]
        if _lost(replies[0]):
            self._reload(name)
            replies = self._send_many(
                [self._script_command(name, script_keys, args), *after], undecoded)
        _raise_first(replies)
        return replies[0], replies[1:]

    def _eval_combined(
        self, name: str, script_keys: Sequence[str], args: Sequence[Any], *,
        before: Sequence[tuple[Any, ...]] = (),
    ) -> Any:
        """:meth:`_eval_around` for one of scripts.BATCH_SCRIPTS, whose calls this process's
        threads make at the same time go as one call of scripts.BATCH (see combine.py), with the
        commands ``before`` each of them first. Calls go together only if they run on the same
        item keys: on one Redis, not a cluster, whose keys of their own (a body key, say) may be
        in other slots."""
        if self.cluster:
            return self._eval_around(name, script_keys, args, before=before)[0]
        # A call weighs its arguments (each found link is a few commands) and a unit per KiB it
        # stages (a body), so a combined call stays a few milliseconds of Redis at most.
        weight = len(args) + sum(len(a) for c in before for a in c if isinstance(a, bytes)) // 1024
        return self._combiner.call(tuple(script_keys[:scripts.ITEM_KEYS]),
                                   (name, script_keys, args, before), weight)

    def _send_combined(
        self, item_keys: tuple[str, ...],
        calls: Sequence[tuple[str, Sequence[str], Sequence[Any], Any]],
    ) -> list[Any]:
        """Send the item-script calls on ``item_keys`` that came together: one alone as itself,
        more as one call of scripts.BATCH; the reply of each."""
        if len(calls) == 1:
            name, script_keys, args, before = calls[0]
            return [self._eval_around(name, script_keys, args, before=before)[0]]
        return self._eval_many([(name, script_keys, args) for name, script_keys, args, _ in calls],
                               before=[c for *_, before in calls for c in before])[0]

    def _eval_many(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]], *,
        before: Sequence[tuple[Any, ...]] = (), after: Sequence[tuple[Any, ...]] = (),
        undecoded: bool = False,
    ) -> tuple[Any, list[Any]]:
        """Each (item script, keys, args) of ``calls``, scripts of BATCH_SCRIPTS on the same item
        keys, in one call of scripts.BATCH, with ``before`` and ``after`` around it as in
        :meth:`_eval_around`. Its reply (a list, one reply per call) and those of ``after``."""
        batch_keys: list[Any] = list(calls[0][1][:scripts.ITEM_KEYS])
        batch_args: list[Any] = [len(calls)]
        for name, script_keys, args in calls:
            own = script_keys[scripts.ITEM_KEYS:]
            batch_keys.extend(own)
            batch_args.extend((name, len(own), len(args)))
            batch_args.extend(args)
        return self._eval_around(scripts.BATCH, batch_keys, batch_args, before=before,
                                 after=after, undecoded=undecoded)

    def _eval_pipelined(
        self, name: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Run item script ``name`` once for each (keys, args) of ``calls``, in one round trip
        on one Redis (on a cluster one call at a time, each to the node of its keys); the
        replies, in order. A call that found its script lost runs again once it is loaded."""
        replies = self._send_many(
            [self._script_command(name, script_keys, args) for script_keys, args in calls], False)
        for i, reply in enumerate(replies):
            if _lost(reply):
                replies[i] = self._eval(name, *calls[i])
        _raise_first(replies)
        return replies

    def _script_command(
        self, name: str, script_keys: Sequence[str], args: Sequence[Any]
    ) -> tuple[Any, ...]:
        """The command that runs item script ``name``: FCALL of the library's function, or
        EVALSHA of the script."""
        library = self._library()
        if library is not None:
            return ("FCALL", library.functions[name], len(script_keys), *script_keys, *args)
        return ("EVALSHA", self._scripts[name].sha, len(script_keys), *script_keys, *args)

    def _reload(self, name: str) -> None:
        """Give Redis the function library, or script ``name``, again: it lost it (a restart
        without persistence, a flush)."""
        if self._library() is not None:
            self._load_library()
        else:
            script = self._scripts[name]
            script.sha = self.client.script_load(script.script)

    def _send_many(self, commands: Sequence[tuple[Any, ...]], undecoded: bool) -> list[Any]:
        """The replies to ``commands``, sent in one round trip on one Redis; an error reply is
        in its place, as the exception, so that every reply is read."""
        options = UNDECODED if undecoded else {}
        replies: list[Any] = []
        if self.cluster:
            for command in commands:
                try:
                    replies.append(self.client.execute_command(*command, **options))
                except redis.ResponseError as exc:
                    replies.append(exc)
            return replies
        conn = self._thread_connection()
        # A call cut off (timeout, error, interrupt) disconnects, as redis-py's own calls do:
        # its late replies are never read as the next call's.
        conn.send_packed_command(_one_write(conn.pack_commands(commands)))
        for _ in commands:
            try:
                replies.append(conn.read_response(disable_decoding=undecoded))
            except redis.ResponseError as exc:
                replies.append(exc)
        return replies

    def _library(self) -> Optional[scripts.Library]:
        """The function library the item scripts run from; None: they run as scripts."""
        if self._functions is None:
            self._functions = self._load_library(required=False)
        return scripts.library() if self._functions else None

    def _load_library(self, *, required: bool = True) -> bool:
        """Load the item scripts' function library (it may be there already); whether Redis
        has it. Unless ``required``, a Redis that refuses it (6.2 has no functions; an ACL or a
        proxy may forbid FUNCTION) is no error: the item scripts then run as scripts."""
        library = scripts.library()
        try:
            self.client.function_load(library.code)
        except redis.ResponseError as exc:
            if "already exists" in str(exc):
                return True
            if required:
                raise
            log.info("Redis at %s refused the function library (%s): the tracker runs its "
                     "item scripts with EVALSHA", self.url, exc)
            return False
        return True

    def _thread_connection(self) -> "redis.connection.AbstractConnection":
        """This thread's own connection, checked as redis-py's pool checks one it hands out: a
        connection with something to read (the server closed it, say) is made again. One that
        a forked child inherited is its parent's socket: the child makes its own."""
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.pid != os.getpid():
            conn = self._local.conn = self.client.connection_pool.make_connection()
        try:
            if conn.can_read():  # connects first when it is not connected
                raise redis.ConnectionError("Connection has data")
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            conn.disconnect()
            conn.connect()
            if conn.can_read():
                raise redis.ConnectionError("Connection not ready")
        return conn
