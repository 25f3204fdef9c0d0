"""Redis's own counters for the crawl benchmark (``bench.bench_crawl``): ``INFO`` snapshots and
their differences, and MONITOR read in a thread to count the commands clients send (round trips)
apart from those Lua scripts run inside Redis."""

from __future__ import annotations

import collections
import hashlib
import os
import re
import socket
import threading
import time
from typing import Any, Optional


def redis_snapshot(client) -> dict[str, Any]:
    info = client.info("all")
    return {
        "commands": int(info["total_commands_processed"]),
        "cpu": float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
        "connections": int(info["total_connections_received"]),
        "cmdstats": {
            k[len("cmdstat_") :]: (int(v["calls"]), int(v["usec"]))
            for k, v in info.items()
            if k.startswith("cmdstat_")
        },
    }


def redis_diff(before: dict, after: dict) -> dict[str, Any]:
    calls, usecs = {}, {}
    for name, (c, u) in after["cmdstats"].items():
        c0, u0 = before["cmdstats"].get(name, (0, 0))
        if c - c0:
            calls[name] = c - c0
            usecs[name] = u - u0
    return {
        # the `INFO all` that took `before` is itself counted in `after`
        "commands": after["commands"] - before["commands"] - 1,
        "cpu": after["cpu"] - before["cpu"],
        "connections": after["connections"] - before["connections"],
        "calls": calls,
        # Redis's own timing per command name. A script's time (evalsha) includes the calls it
        # makes, which are also counted under their own names: do not add them up.
        "usecs": usecs,
    }


_MONITOR_RE = re.compile(r'\+(\d+\.\d+) \[(\d+) ([^\]]+)\] "([^"]*)"(?: "([^"]*)")?')


class MonitorCounter:
    """Reads MONITOR of one Redis server in a thread; counts commands per source and name."""

    def __init__(self, host: str, port: int, sha_names: Optional[dict[str, str]] = None,
                 password: Optional[str] = None) -> None:
        self.port = port
        self.sha_names = sha_names or {}
        self.sock = socket.create_connection((host, port))
        self.sock.settimeout(0.2)
        # The embedded servers have a password; AUTH's +OK comes first, then MONITOR's.
        self._oks_before_monitor = 1 if password else 0
        if password:
            self.sock.sendall(b"AUTH %s\r\n" % password.encode())
        self.sock.sendall(b"MONITOR\r\n")
        self._buf = b""
        # (client address or 'lua', command label) -> count
        self.counts: collections.Counter = collections.Counter()
        self.multi_blocks: collections.Counter = collections.Counter()  # address -> MULTI..EXEC
        self.queued: collections.Counter = collections.Counter()  # address -> commands in blocks
        self._in_multi: set[str] = set()
        self.lines = 0
        self._stop = threading.Event()
        self._ok = threading.Event()
        self.error = ""
        self._thread = threading.Thread(target=self._run, name=f"monitor:{port}", daemon=True)
        self._thread.start()
        if not self._ok.wait(5):
            raise RuntimeError(f"MONITOR on port {port} did not answer")
        if self.error:
            raise RuntimeError(f"MONITOR on port {port}: {self.error}")

    def _label(self, cmd: str, arg: Optional[str]) -> str:
        cmd = cmd.lower()
        if cmd == "evalsha" and arg is not None:
            return f"evalsha {self.sha_names.get(arg, arg[:8])}"
        if cmd == "fcall" and arg is not None:  # the function library: distscrape_<hash>_NAME
            return f"fcall {arg[len('distscrape_') + 17:]}"
        return cmd

    def _line(self, line: bytes) -> None:
        if line == b"+OK":
            if self._oks_before_monitor:
                self._oks_before_monitor -= 1
            else:
                self._ok.set()
            return
        if line.startswith(b"-") and not self._ok.is_set():
            self.error = line.decode(errors="replace")
            self._ok.set()
            return
        m = _MONITOR_RE.match(line[:400].decode("latin-1"))
        if not m:
            return
        self.lines += 1
        _, _db, source, cmd, arg = m.groups()
        label = self._label(cmd, arg)
        self.counts[(source, label)] += 1
        if source != "lua":
            if label == "multi":
                self._in_multi.add(source)
            elif label in ("exec", "discard") and source in self._in_multi:
                self._in_multi.discard(source)
                self.multi_blocks[source] += 1
            elif source in self._in_multi:
                self.queued[source] += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(1 << 20)
            except socket.timeout:
                continue
            except OSError:
                return
            if not data:
                return
            self._buf += data
            *lines, self._buf = self._buf.split(b"\r\n")
            for line in lines:
                self._line(line)

    def stop(self) -> None:
        time.sleep(0.3)  # let the last lines arrive
        self._stop.set()
        self._thread.join(2)
        self.sock.close()

    def summary(self, exclude: set[str]) -> dict[str, Any]:
        """Commands sent by clients (all but ``exclude``d addresses) and run inside Lua."""
        client: collections.Counter = collections.Counter()
        lua: collections.Counter = collections.Counter()
        excluded: collections.Counter = collections.Counter()
        for (source, label), n in self.counts.items():
            if source == "lua":
                lua[label] += n
            elif source in exclude:
                excluded[label] += n
            else:
                client[label] += n
        blocks = sum(n for src, n in self.multi_blocks.items() if src not in exclude)
        queued = sum(n for src, n in self.queued.items() if src not in exclude)
        multi_exec = sum(client[k] for k in ("multi", "exec", "discard"))
        total = sum(client.values())
        return {
            "client": dict(client), "lua": dict(lua), "excluded": dict(excluded),
            "client_total": total, "lua_total": sum(lua.values()),
            "excluded_total": sum(excluded.values()), "multi_blocks": blocks,
            "multi_exec_commands": multi_exec, "queued_in_blocks": queued,
            # a redis-py/kombu MULTI..EXEC block is written in one go: count it as one round trip
            "round_trips_blocks_as_one": total - multi_exec - queued + blocks,
        }


def own_redis_addresses(port: int) -> set[str]:
    """'127.0.0.1:<local port>' of this process's TCP connections to 127.0.0.1:``port``."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = set()
    with open("/proc/net/tcp") as fh:
        next(fh)
        for row in fh:
            parts = row.split()
            local, remote, inode = parts[1], parts[2], parts[9]
            if inode in inodes and int(remote.split(":")[1], 16) == port:
                out.add(f"127.0.0.1:{int(local.split(':')[1], 16)}")
    return out


def script_names() -> dict[str, str]:
    """SHA1 -> name of the tracker's Lua scripts, to label EVALSHA calls."""
    try:  # an older checkout's scripts module: its EVALSHA calls show a SHA prefix
        from distscrape_celery.tracker.redis import scripts

        names = (*scripts.item_script_names(), "heartbeat")
    except (ImportError, AttributeError):
        return {}
    return {hashlib.sha1(scripts.source(name).encode()).hexdigest(): name for name in names}
