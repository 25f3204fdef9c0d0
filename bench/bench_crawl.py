#!/usr/bin/env python
"""Throughput and cost per page of a real distributed crawl on this machine, per worker layout.

    python bench/bench_crawl.py [--pages 1000] [--page-bytes 6000]
                                [--configs prefork:1x4,solo:2x1,threads:1x8] [--delay 0]

One run does everything, so the configurations are compared under the same machine load:

1. generates a site with ``tests/support/sitegen.py`` (pages padded to about ``--page-bytes``) and serves
   it on 127.0.0.1 with ``SiteServer``, by default in a forked child process so that the test
   server's CPU does not share a GIL with the bench driver (``--server-in-process`` to keep it in a
   thread of the driver instead);
2. starts two throwaway Redis servers (EmbeddedRedis): one holds the tracker (``redis_url``, which
   also holds the staged page bodies), the other is the Celery broker (``broker_url``), so the
   work of each can be counted apart;
3. for every ``POOL:PROCxCONC`` config (with ``:nofsync`` appended: saver.fsync=false) starts
   PROC real ``celery worker`` processes (WorkerProcess, pool POOL, concurrency CONC), waits until they registered in the tracker and
   answer a Celery ping, seeds a fresh job, waits until it is finished and records pages saved,
   dead, wall seconds from seed to finished, pages/s, worker CPU per page (user+sys of every
   process in the workers' process groups, read from /proc), Redis commands per page (``INFO``
   before/after on each server) and the CPU of the other processes (both Redis servers, the site
   server, this driver). Workers are stopped and both Redis databases flushed between configs.
   Every config is checked: every reachable page saved exactly once under the right name with the
   right bytes, and the server's request log shows no page fetched twice;
4. runs one extra crawl with the first config while a MONITOR connection on each Redis server is
   read in a thread, to count the commands that clients send (round trips) apart from the
   commands Lua scripts run inside Redis. This run is separate because MONITOR slows Redis.

Network: 127.0.0.1 only. Standard library only, apart from the project and its dependencies.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import hashlib
import json
import multiprocessing
import os
import platform
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for distscrape_celery and tests.support

from tests.support.sitegen import Site, SiteServer, generate_site  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------- /proc CPU


def _proc_stat(pid: int) -> Optional[list[str]]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    return data[data.rfind(")") + 2 :].split()  # fields from 3 (state) on


def group_pids(pgid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _proc_stat(int(name))
            if st is not None and int(st[2]) == pgid:  # field 5: process group
                pids.append(int(name))
    return pids


def cpu_seconds(pids: list[int]) -> float:
    """user+sys of ``pids``, plus that of their reaped children (cutime+cstime)."""
    ticks = 0
    for pid in pids:
        st = _proc_stat(pid)
        if st is not None:
            ticks += sum(int(x) for x in st[11:15])  # utime stime cutime cstime (fields 14-17)
    return ticks / CLK_TCK


def children_of(pid: int) -> list[int]:
    """The live children of ``pid`` (Linux's /proc/PID/task/PID/children), or none."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def own_cpu(pid: int) -> float:
    """user+sys of ``pid`` alone (not its children)."""
    st = _proc_stat(pid)
    return 0.0 if st is None else (int(st[11]) + int(st[12])) / CLK_TCK


def own_system_cpu(pid: int) -> float:
    """sys of ``pid`` alone: the kernel's share of :func:`own_cpu`."""
    st = _proc_stat(pid)
    return 0.0 if st is None else int(st[12]) / CLK_TCK


def group_cpu(pgids: list[int]) -> float:
    return sum(cpu_seconds(group_pids(g)) for g in pgids)


def machine_ticks() -> tuple[int, int, int]:
    """(busy, iowait, total) jiffies of all CPUs, from the first line of /proc/stat."""
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:]]
    total = sum(v[:8])  # user nice system idle iowait irq softirq steal (guest is in user)
    return total - v[3] - v[4], v[4], total


def self_cpu() -> float:
    t = os.times()
    return t.user + t.system


# ---------------------------------------------------------------------------------- site server


def _serve_in_child(site: Site, delay: float, conn) -> None:
    server = SiteServer(site, delay=delay)
    conn.send(server.port)
    while True:
        msg = conn.recv()
        if msg == "mark":
            conn.send(len(server.requests))
        elif isinstance(msg, tuple) and msg[0] == "since":
            conn.send(dict(collections.Counter(server.requests[msg[1] :])))
        elif msg == "stop":
            server.stop()
            conn.send("stopped")
            return


class ServedSite:
    """The site on 127.0.0.1, either in a forked child process or in a thread of this process."""

    def __init__(self, site: Site, delay: float, in_process: bool) -> None:
        self.in_process = in_process
        self.proc = None
        if in_process:
            self._server = SiteServer(site, delay=delay)
            port = self._server.port
        else:
            ctx = multiprocessing.get_context("fork")
            self._conn, child = ctx.Pipe()
            self.proc = ctx.Process(target=_serve_in_child, args=(site, delay, child), daemon=True)
            self.proc.start()
            port = self._conn.recv()
        self.base_url = f"http://127.0.0.1:{port}"

    def url(self, path: str = "/") -> str:
        return self.base_url + path

    def mark(self) -> int:
        if self.in_process:
            return len(self._server.requests)
        self._conn.send("mark")
        return self._conn.recv()

    def counts_since(self, mark: int) -> dict[str, int]:
        if self.in_process:
            return dict(collections.Counter(self._server.requests[mark:]))
        self._conn.send(("since", mark))
        return self._conn.recv()

    def cpu(self) -> Optional[float]:
        return None if self.proc is None else cpu_seconds([self.proc.pid])

    def stop(self) -> None:
        if self.in_process:
            self._server.stop()
        elif self.proc is not None and self.proc.is_alive():
            try:
                self._conn.send("stop")
                self._conn.recv()
            except (OSError, EOFError):
                pass
            self.proc.join(5)
            if self.proc.is_alive():
                self.proc.kill()


# ---------------------------------------------------------------------------------- Redis counters


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


# ---------------------------------------------------------------------------------- one crawl


@dataclass
class Config:
    pool: str
    procs: int
    conc: int
    fsync: bool = True

    @property
    def label(self) -> str:
        return f"{self.pool}:{self.procs}x{self.conc}" + ("" if self.fsync else ":nofsync")

    @classmethod
    def parse(cls, text: str, fsync: bool = True) -> "Config":
        m = re.fullmatch(r"(prefork|solo|threads|gevent|eventlet):(\d+)x(\d+)(:nofsync)?", text.strip())
        if not m:
            raise SystemExit(
                f"bad config {text!r}: expected POOL:PROCxCONC[:nofsync], e.g. prefork:1x4"
            )
        return cls(m.group(1), int(m.group(2)), int(m.group(3)), fsync and not m.group(4))


@dataclass
class Result:
    config: str
    job: str
    saved: int = 0
    dead: int = 0
    seen: int = 0
    seconds: float = 0.0
    worker_cpu: float = 0.0
    worker_main_cpu: float = 0.0  # of which the `celery worker` main processes (prefork: consumer)
    tracker: dict = field(default_factory=dict)
    broker: dict = field(default_factory=dict)
    server_cpu: Optional[float] = None
    machine_busy: float = 0.0  # CPU seconds all processes of the machine used during the crawl
    machine_iowait: float = 0.0
    machine_capacity: float = 0.0
    driver_cpu: float = 0.0
    driver_tracker_cmds: int = 0
    polls: int = 0
    files_ok: bool = False
    files_note: str = ""
    duplicates: dict = field(default_factory=dict)
    missing_fetches: int = 0
    extra_fetches: int = 0
    fetches: int = 0
    monitor: Optional[dict] = None

    @property
    def pages_per_s(self) -> float:
        return self.saved / self.seconds if self.seconds else 0.0

    def per_page(self, x: float) -> float:
        return x / self.saved if self.saved else float("nan")


class Bench:
    def __init__(self, args: argparse.Namespace, site: Site, served: ServedSite, work: Path) -> None:
        import redis

        from distscrape_celery.worker.app import configure_app
        from distscrape_celery.local.embedded import EmbeddedRedis
        from distscrape_celery.settings import Settings
        from distscrape_celery.errors import JobNotFound
        from distscrape_celery.tracker import RedisTracker

        self.args = args
        self.site = site
        self.served = served
        self.work = work
        self.tracker_redis = EmbeddedRedis().start()
        self.broker_redis = EmbeddedRedis().start()
        self.settings = Settings.from_env(
            {}, redis_url=self.tracker_redis.url, broker_url=self.broker_redis.url,
            lease_seconds=args.lease_seconds,
        )
        self.app = configure_app(self.settings)
        self.tracker = RedisTracker.from_url(
            self.settings.redis_url, lease_seconds=self.settings.lease_seconds,
            dispatch_factor=self.settings.dispatch_factor,
        )
        self.tr_info = redis.Redis.from_url(self.tracker_redis.url)
        self.br_info = redis.Redis.from_url(self.broker_redis.url)
        # Commands one `tracker.stats()` poll of the driver costs, subtracted from the tracker's.
        before = redis_snapshot(self.tr_info)
        with contextlib.suppress(JobNotFound):  # the probe job does not exist; the poll ran
            self.tracker.stats("bench-probe")
        self.poll_cost = redis_diff(before, redis_snapshot(self.tr_info))["commands"]
        self.sha_names = script_names()

    def close(self) -> None:
        for r in (self.tracker_redis, self.broker_redis):
            r.stop()

    def _wait_ready(self, workers, timeout: float = 90.0) -> None:
        from distscrape_celery.local.processes import wait_for_workers

        wait_for_workers(self.tracker, len(workers), timeout=timeout, procs=workers)
        pids = {w.proc.pid for w in workers}
        deadline = time.monotonic() + timeout
        # Registered (worker_init) comes before the consumer runs: also wait for a ping reply.
        names = {w.name for w in workers}
        while True:
            alive = {w.pid for w in self.tracker.workers() if w.alive}
            replies = self.app.control.ping(timeout=0.5) or []
            answered = {name.split("@", 1)[0] for r in replies for name in r}
            if pids <= alive and names <= answered:
                return
            for w in workers:
                w.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not ready: registered {alive}, pinged {answered}")

    def run(self, cfg: Config, job: str, monitor: bool = False) -> Result:
        from distscrape_celery.job.spec import build_spec
        from distscrape_celery.local.processes import WorkerProcess
        from distscrape_celery.core.manager import CrawlManager
        from distscrape_celery.savers import FileItemSaver
        from distscrape_celery.worker.publish import publisher

        res = Result(cfg.label, job)
        out = self.work / job
        logs = self.work / "logs"
        logs.mkdir(exist_ok=True)
        workers = [
            WorkerProcess(self.settings, name=f"{job}-{i}", pool=cfg.pool, concurrency=cfg.conc,
                          log_dir=str(logs))
            for i in range(cfg.procs)
        ]
        try:
            for w in workers:
                w.start()
            self._wait_ready(workers)
            time.sleep(0.5)
            pgids = [w.proc.pid for w in workers]
            mons = []
            if monitor:
                mons = [
                    MonitorCounter("127.0.0.1", self.tracker_redis.port, self.sha_names,
                                   password=self.tracker_redis.password),
                    MonitorCounter("127.0.0.1", self.broker_redis.port,
                                   password=self.broker_redis.password),
                ]
            saver_spec: dict[str, Any] = {"output": str(out)}
            if not cfg.fsync:
                saver_spec["fsync"] = False
            spec = build_spec({"seeds": [self.served.url("/")], "saver": saver_spec})
            manager = CrawlManager(self.tracker, publisher.scrape)
            mark = self.served.mark()
            tr0, br0 = redis_snapshot(self.tr_info), redis_snapshot(self.br_info)
            srv0, drv0, cpu0 = self.served.cpu(), self_cpu(), group_cpu(pgids)
            main0 = sum(own_cpu(g) for g in pgids)
            m0 = machine_ticks()
            t0 = time.monotonic()
            manager.seed(job, spec)

            def progress(_stats) -> None:
                res.polls += 1

            def check() -> None:
                for w in workers:
                    w.check()

            stats = manager.wait(job, poll=0.05, timeout=self.args.timeout, on_progress=progress,
                                 check=check)
            res.seconds = time.monotonic() - t0
            m1 = machine_ticks()
            res.worker_cpu = group_cpu(pgids) - cpu0
            res.worker_main_cpu = sum(own_cpu(g) for g in pgids) - main0
            res.driver_cpu = self_cpu() - drv0
            res.machine_busy, res.machine_iowait, res.machine_capacity = (
                (b - a) / CLK_TCK for a, b in zip(m0, m1)
            )
            srv1 = self.served.cpu()
            res.server_cpu = None if srv0 is None else srv1 - srv0
            res.tracker = redis_diff(tr0, redis_snapshot(self.tr_info))
            res.broker = redis_diff(br0, redis_snapshot(self.br_info))
            res.driver_tracker_cmds = res.polls * self.poll_cost
            res.saved, res.dead, res.seen = stats.done, stats.dead, stats.seen
            if monitor:
                exclude_tr = own_redis_addresses(self.tracker_redis.port)
                exclude_br = own_redis_addresses(self.broker_redis.port)
                for m in mons:
                    m.stop()
                res.monitor = {
                    "tracker": mons[0].summary(exclude_tr),
                    "broker": mons[1].summary(exclude_br),
                }
            counts = self.served.counts_since(mark)
        finally:
            for w in workers:
                w.stop()

        # -- checks
        reachable = self.site.reachable
        res.fetches = sum(counts.values())
        res.duplicates = {p: n for p, n in counts.items() if n > 1}
        res.missing_fetches = len(reachable - set(counts))
        res.extra_fetches = len(set(counts) - reachable)
        saver = FileItemSaver(str(out))
        expected = {str(saver.name_for(self.served.url(p))): p for p in reachable}
        found = {
            str(p.relative_to(out)): p
            for p in out.rglob("*") if p.is_file() and not p.name.startswith(".~tmp-")
        } if out.exists() else {}
        wrong = [n for n in expected if n in found and found[n].read_bytes() != self.site.pages[expected[n]]]
        missing, extra = set(expected) - set(found), set(found) - set(expected)
        res.files_ok = not (missing or extra or wrong) and res.saved == len(reachable)
        res.files_note = (
            f"{len(found)} files for {len(reachable)} reachable pages; missing {len(missing)}, "
            f"unexpected {len(extra)}, wrong content {len(wrong)}; tracker done={res.saved} "
            f"seen={res.seen} dead={res.dead}"
        )
        if not self.args.keep:
            shutil.rmtree(out, ignore_errors=True)
        # a clean slate for the next config: no stale jobs, workers or broker messages
        self.tr_info.flushall()
        self.br_info.flushall()
        return res


# ---------------------------------------------------------------------------------- report


def machine_info() -> dict[str, Any]:
    import celery
    import kombu
    import redis

    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from distscrape_celery.local.embedded import find_redis_server
    import subprocess

    rv = subprocess.run([find_redis_server(), "--version"], capture_output=True, text=True).stdout
    m = re.search(r"v=(\S+)", rv)
    git = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "distscrape_celery"],
                           capture_output=True, text=True).stdout.strip()
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "loadavg_at_start": os.getloadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "celery": celery.__version__,
        "kombu": kombu.__version__,
        "redis_py": redis.__version__,
        "redis_server": m.group(1) if m else rv.strip(),
        "commit": (git or "?") + (" + uncommitted changes in distscrape_celery/" if dirty else ""),
    }


def fmt(x: Optional[float], digits: int = 1) -> str:
    if x is None:
        return "-"
    return f"{x:.{digits}f}"


def print_report(results: list[Result], monitor: Optional[Result], info: dict, args, site_info: dict) -> None:
    print()
    print(f"machine: nproc={info['nproc']} ({info['cpu_model']}), Python {info['python']}, "
          f"Redis {info['redis_server']}, celery {info['celery']}, kombu {info['kombu']}, "
          f"redis-py {info['redis_py']}; code at {info['commit']}; load average at start {', '.join(f'{x:.2f}' for x in info['loadavg_at_start'])}")
    print(f"site: {site_info['reachable']} reachable pages (+{site_info['unreachable']} orphans), "
          f"mean page {site_info['mean_bytes']:.0f} bytes, server delay {args.delay}s, "
          f"server {'in a thread of the driver' if args.server_in_process else 'in its own forked process'}")
    print()
    cols = [
        ("config", lambda r: r.config),
        ("saved", lambda r: str(r.saved)),
        ("dead", lambda r: str(r.dead)),
        ("wall s", lambda r: fmt(r.seconds, 2)),
        ("pages/s", lambda r: fmt(r.pages_per_s)),
        ("worker CPU ms/page", lambda r: fmt(1000 * r.per_page(r.worker_cpu), 2)),
        ("of which main process", lambda r: fmt(1000 * r.per_page(r.worker_main_cpu), 2)),
        ("tracker cmds/page", lambda r: fmt(r.per_page(r.tracker["commands"] - r.driver_tracker_cmds))),
        ("broker cmds/page", lambda r: fmt(r.per_page(r.broker["commands"]))),
        ("tracker Redis CPU ms/page", lambda r: fmt(1000 * r.per_page(r.tracker["cpu"]), 2)),
        ("broker Redis CPU ms/page", lambda r: fmt(1000 * r.per_page(r.broker["cpu"]), 2)),
        ("site server CPU ms/page", lambda r: fmt(None if r.server_cpu is None else 1000 * r.per_page(r.server_cpu), 2)),
        ("driver CPU ms/page", lambda r: fmt(1000 * r.per_page(r.driver_cpu), 2)),
        ("bench CPU / capacity", lambda r: fmt(100 * total_cpu(r) / r.machine_capacity, 0) + "%"),
        ("other processes' CPU", lambda r: fmt(100 * max(0.0, r.machine_busy - total_cpu(r)) / r.machine_capacity, 0) + "%"),
        ("iowait", lambda r: fmt(100 * r.machine_iowait / r.machine_capacity, 0) + "%"),
        ("checks", lambda r: "ok" if (r.files_ok and not r.duplicates and not r.missing_fetches and not r.extra_fetches) else "FAIL"),
    ]
    print("| " + " | ".join(c[0] for c in cols) + " |")
    print("|" + "|".join("---" for _ in cols) + "|")
    for r in results:
        print("| " + " | ".join(c[1](r) for c in cols) + " |")
    print()
    base = results[0]
    print(f"relative to {base.config} (same run):")
    print("| config | pages/s | worker CPU/page | tracker cmds/page | broker cmds/page |")
    print("|---|---|---|---|---|")
    for r in results:
        def ratio(f):
            b = f(base)
            return f"{f(r) / b:.2f}x" if b else "-"
        print(f"| {r.config} | {ratio(lambda x: x.pages_per_s)} | "
              f"{ratio(lambda x: x.per_page(x.worker_cpu))} | "
              f"{ratio(lambda x: x.per_page(x.tracker['commands'] - x.driver_tracker_cmds))} | "
              f"{ratio(lambda x: x.per_page(x.broker['commands']))} |")
    print()
    print("Redis commands per page by command name, with Redis's own time for them per page (INFO "
          "commandstats; counts commands run inside Lua too, and evalsha's time includes theirs):")
    for r in results:
        for role in ("tracker", "broker"):
            calls = sorted(getattr(r, role)["calls"].items(), key=lambda kv: -kv[1])
            usecs = getattr(r, role)["usecs"]
            print(f"  {r.config} {role}: " + ", ".join(
                f"{k} {r.per_page(v):.2f} ({r.per_page(usecs.get(k, 0)):.0f} us)"
                for k, v in calls if r.per_page(v) >= 0.01
            ) + f"  ({getattr(r, role)['connections']} connections opened)")
    print("  (tracker counts include the bench driver's own stats() polls: "
          f"{', '.join(f'{r.config} {r.per_page(r.driver_tracker_cmds):.2f}/page' for r in results)}; "
          "subtracted in the table above)")
    print()
    for r in results:
        if r.duplicates or r.missing_fetches or r.extra_fetches or not r.files_ok:
            print(f"CHECK FAILED {r.config}: {r.files_note}; fetches {r.fetches}, "
                  f"duplicates {len(r.duplicates)} {dict(list(r.duplicates.items())[:5])}, "
                  f"never fetched {r.missing_fetches}, off-site/unknown fetched {r.extra_fetches}")
        else:
            print(f"check {r.config}: {r.files_note}; {r.fetches} fetches, none twice")
    if monitor is not None:
        print()
        print_monitor(monitor)


def total_cpu(r: Result) -> float:
    return (r.worker_cpu + r.tracker["cpu"] + r.broker["cpu"] + (r.server_cpu or 0.0) + r.driver_cpu)


def print_monitor(r: Result) -> None:
    m = r.monitor
    assert m is not None
    print(f"MONITOR run ({r.config}, separate crawl, job {r.job}): {r.saved} pages in {r.seconds:.2f}s "
          f"({r.pages_per_s:.0f} pages/s with MONITOR on; checks "
          f"{'ok' if r.files_ok and not r.duplicates and not r.missing_fetches else 'FAIL: ' + r.files_note})")
    print("Commands sent by clients (workers' pool processes and agent threads; the bench driver's own "
          "connections excluded). Each command of a pipeline counts once, so these are an upper bound "
          "on round trips; a MULTI..EXEC block is one write, see 'blocks'.")
    for role in ("tracker", "broker"):
        s = m[role]
        print(f"  {role}: client commands {r.per_page(s['client_total']):.2f}/page "
              f"(of which MULTI/EXEC {r.per_page(s['multi_exec_commands']):.2f}; "
              f"{r.per_page(s['multi_blocks']):.2f} MULTI..EXEC blocks/page; "
              f"round trips if each block is one: "
              f"{r.per_page(s['round_trips_blocks_as_one']):.2f}/page), "
              f"commands inside Lua {r.per_page(s['lua_total']):.2f}/page, "
              f"driver's own {r.per_page(s['excluded_total']):.2f}/page")
        top = sorted(s["client"].items(), key=lambda kv: -kv[1])
        print("    client: " + ", ".join(f"{k} {r.per_page(v):.2f}" for k, v in top if r.per_page(v) >= 0.005))
        if s["lua"]:
            top = sorted(s["lua"].items(), key=lambda kv: -kv[1])
            print("    in Lua: " + ", ".join(f"{k} {r.per_page(v):.2f}" for k, v in top if r.per_page(v) >= 0.005))


# ---------------------------------------------------------------------------------- main


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=1000, help="reachable pages of the site")
    p.add_argument("--page-bytes", type=int, default=6000, help="approximate size of a page")
    p.add_argument("--configs", default="prefork:1x4,solo:2x1,threads:1x8",
                   help="comma-separated POOL:PROCxCONC (PROC worker processes of concurrency CONC)")
    p.add_argument("--delay", type=float, default=0.0, help="server delay per request, seconds")
    p.add_argument("--seed", type=int, default=1, help="site generator seed")
    p.add_argument("--lease-seconds", type=float, default=60.0)
    p.add_argument("--timeout", type=float, default=300.0, help="give up on one crawl after this")
    p.add_argument("--no-fsync", action="store_true",
                   help="saver.fsync=false for every config (default: the saver's default, fsync "
                   "on); a config may also end in ':nofsync'")
    p.add_argument("--no-monitor", action="store_true", help="skip the MONITOR round-trip run")
    p.add_argument("--server-in-process", action="store_true",
                   help="serve the site from a thread of the driver instead of a forked process")
    p.add_argument("--json", help="also write the raw figures to this file")
    p.add_argument("--keep", action="store_true", help="keep the crawled files and worker logs")
    args = p.parse_args(argv)
    configs = [Config.parse(c, not args.no_fsync) for c in args.configs.split(",") if c.strip()]
    if not configs:
        raise SystemExit("no configs")

    started = time.monotonic()
    probe = generate_site(args.pages, seed=args.seed, unreachable=10, page_padding=0)
    base = sum(len(b) for b in probe.pages.values()) / len(probe.pages)
    site = generate_site(args.pages, seed=args.seed, unreachable=10,
                         page_padding=max(0, int(args.page_bytes - base)))
    site_info = {
        "reachable": len(site.reachable), "unreachable": len(site.unreachable),
        "mean_bytes": sum(len(site.pages[p]) for p in site.reachable) / len(site.reachable),
    }
    # Fork the server before this process has threads or connections.
    served = ServedSite(site, args.delay, args.server_in_process)
    info = machine_info()
    work = Path(tempfile.mkdtemp(prefix="distscrape-bench-"))
    bench = None
    results: list[Result] = []
    failed: list[str] = []
    monitor_result = None
    stamp = datetime.datetime.now().strftime("%H%M%S")
    try:
        bench = Bench(args, site, served, work)
        print(f"tracker Redis {bench.tracker_redis.url}, broker Redis {bench.broker_redis.url}, "
              f"site {served.base_url} ({site_info['reachable']} pages, ~{site_info['mean_bytes']:.0f} B)",
              flush=True)
        for i, cfg in enumerate(configs):
            job = f"bench-{stamp}-{i}-{cfg.label.replace(':', '-')}"
            try:
                r = bench.run(cfg, job)
            except Exception as exc:  # report, clean up, go on with the next config
                print(f"  {cfg.label}: FAILED: {exc!r} (worker logs: {work / 'logs'})", flush=True)
                failed.append(cfg.label)
                bench.tr_info.flushall()
                bench.br_info.flushall()
                continue
            results.append(r)
            print(f"  {cfg.label}: {r.saved} saved, {r.dead} dead in {r.seconds:.2f}s = "
                  f"{r.pages_per_s:.0f} pages/s, worker CPU {1000 * r.per_page(r.worker_cpu):.2f} ms/page",
                  flush=True)
        if not args.no_monitor:
            cfg = configs[0]
            try:
                monitor_result = bench.run(
                    cfg, f"bench-{stamp}-monitor-{cfg.label.replace(':', '-')}", monitor=True
                )
            except Exception as exc:
                print(f"  MONITOR run FAILED: {exc!r}", flush=True)
                failed.append("MONITOR run")
            if monitor_result is not None:
                print(f"  MONITOR run {cfg.label}: {monitor_result.saved} saved in "
                  f"{monitor_result.seconds:.2f}s", flush=True)
    finally:
        if bench is not None:
            bench.close()
        served.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")

    if not results:
        print("no config finished")
        return 1
    print_report(results, monitor_result, info, args, site_info)
    if failed:
        print(f"\nFAILED configs: {', '.join(failed)}")
    print(f"\ntotal bench time {time.monotonic() - started:.0f}s")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": info, "site": site_info, "args": vars(args),
            "results": [r.__dict__ for r in results],
            "monitor": monitor_result.__dict__ if monitor_result else None,
        }, indent=1, default=str))
    ok = all(r.files_ok and not r.duplicates and not r.missing_fetches and not r.extra_fetches
             for r in results + ([monitor_result] if monitor_result else []))
    return 0 if ok and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
