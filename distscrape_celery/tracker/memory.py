"""InMemoryTracker: RedisTracker's own Lua scripts, run in this process on a private fake Redis.

The item protocol is written once, in ``redis/lua/``: this tracker is a :class:`RedisTracker`
whose client talks to a :class:`fakeredis.FakeServer` that executes those scripts with lupa (Lua
5.1, as Redis). Nothing leaves the process; state lives as long as the tracker. The fake server
runs every command and every script whole under its own lock, so the threads of an in-memory
crawl may share the tracker as worker threads share a Redis.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Optional

import fakeredis
import redis

from .defaults import DISPATCH_FACTOR, LEASE_SECONDS, SAVE_BACKLOG_FACTOR
from .redis import RedisTracker
from .redis.staging import RedisBodyStaging

Clock = Callable[[], float]


def _sha1hex(data: Any) -> bytes:
    """``redis.sha1hex`` as Redis defines it: the SHA-1 of its argument as a Lua string (a number
    is formatted as Lua 5.1 does, "%.14g"), in lower-case hex."""
    if not isinstance(data, bytes):
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise TypeError("redis.sha1hex takes a string")
        data = format(data, ".14g").encode()
    return hashlib.sha1(data).hexdigest().encode()


def _connection_class(clock: Optional[Clock]) -> type[fakeredis.FakeRedisConnection]:
    """Connections whose TIME (the scripts' clock) reads ``clock``; fakeredis's own (the wall
    clock, as Redis) without one."""
    if clock is None:
        return fakeredis.FakeRedisConnection

    def time_reply() -> list[bytes]:
        us = round(clock() * 1_000_000)
        return [str(us // 1_000_000).encode(), str(us % 1_000_000).encode()]

    class ClockedConnection(fakeredis.FakeRedisConnection):
        def _connect(self) -> Any:
            sock = super()._connect()
            # fakeredis looks a command's method up on the socket: this one answers TIME.
            sock.time = time_reply
            return sock

    return ClockedConnection


class _CompiledChunks:
    """The fake server's Lua runtime, compiling each script source once: fakeredis compiles a
    script at every EVAL, which took about as long as running it (the scripts share ~500 lines
    of the library). A compiled chunk run again is the script run again: its top-level locals are made
    anew at each call, and KEYS and ARGV are globals that fakeredis sets before each call."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime
        self._chunks: dict[bytes, Any] = {}  # source -> compiled chunk; a handful of sources

    def execute(self, source: bytes) -> Any:
        chunk = self._chunks.get(source)
        if chunk is None:
            chunk = self._chunks[source] = self._runtime.compile(source)
        return chunk()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)


def _prepare_lua(server: fakeredis.FakeServer, client: redis.Redis) -> None:
    """Complete the script environment of ``server`` and cache its compiled scripts. fakeredis
    builds the server's Lua runtime on the first script and keeps it, as ``_lua_runtime``, for
    the server's life (every script runs under the server's lock)."""
    client.eval("return 0", 0)
    runtime = server._lua_runtime
    # fakeredis 2.41's script environment lacks redis.sha1hex, which the scripts use for the
    # fingerprints of items (_lib_seen.lua). Set on the `redis` table, which is no new global
    # (fakeredis refuses scripts that leave one). tests/test_tracker.py compares the keys written
    # with a real Redis's.
    runtime.globals()[b"redis"][b"sha1hex"] = _sha1hex
    server._lua_runtime = _CompiledChunks(runtime)


class InMemoryTracker(RedisTracker):
    """A RedisTracker on a fake Redis of its own: the same scripts, no server, one process.

    ``clock`` (seconds) replaces Redis's clock for the scripts, for tests that move time by hand.
    ``bodies`` is the staging that reads the bodies this tracker stages (the in-memory runtime's).
    """

    def __init__(
        self, *, lease_seconds: float = LEASE_SECONDS, dispatch_factor: float = DISPATCH_FACTOR,
        save_backlog_factor: int = SAVE_BACKLOG_FACTOR, save_timeout: Optional[float] = None,
        body_ttl: Optional[float] = None, bound_refresh_seconds: Optional[float] = None,
        clock: Optional[Clock] = None,
    ) -> None:
        server = fakeredis.FakeServer()
        connection_class = _connection_class(clock)

        def client(decode: bool) -> redis.Redis:
            return fakeredis.FakeRedis(
                server=server, decode_responses=decode, connection_class=connection_class)

        text = client(True)
        super().__init__(
            text, lease_seconds=lease_seconds, dispatch_factor=dispatch_factor,
            save_backlog_factor=save_backlog_factor, save_timeout=save_timeout, body_ttl=body_ttl,
            bound_refresh_seconds=bound_refresh_seconds, functions=False,
        )
        self.url = "the in-memory tracker"
        _prepare_lua(server, text)
        self.bodies = RedisBodyStaging(client(False), self.body_ttl)
