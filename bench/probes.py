"""How the benchmark measures a crawl: its :class:`Result`, Redis's ``INFO`` deltas
(:class:`RedisProbe`), a command run to its end with its CPU, the CPU its processes spent before
the site's first request (:class:`StartupCpu`), a throwaway Redis, the figures a site's access
log gives, and what the items were doing while it ran (``--sample``)."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar, Optional

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from bench.helpers import (command_name, cpu_seconds, descendants, free_port, stop_process,
                           wait_port)
from bench.sites import Site

# Each crawl's number, for its own Redis directory, job and output.
RUNS = itertools.count(1)


@dataclass
class Result:
    name: str
    site: str
    pages: int = 0
    distinct: int = 0
    seconds: float = 0.0
    wall: float = 0.0
    cpu: float = 0.0  # seconds, crawler processes, Redis excluded
    startup_cpu: float = 0.0  # seconds of ``cpu`` spent before the site's first request
    redis_cmds: float = 0.0
    redis_reads: float = 0.0  # requests Redis read from clients: round trips
    redis_scripts: float = 0.0  # Lua script calls (EVALSHA, EVAL, FCALL)
    redis_cpu: float = 0.0
    redis_probe: Optional[RedisProbe] = None  # the probe behind the three Redis figures
    site_cpu: float = 0.0  # seconds, the site's server, over the whole crawl
    middle: float = 0.0  # pages/s between the first and the last 5 % of the pages
    busiest: float = 0.0  # workers: the busiest worker process's share of a core, seed to finish
    seed_cpu: float = 0.0  # workers: their CPU seconds from seed to finish (start-up excluded)
    seed_wall: float = 0.0  # workers: seconds from seed to finish
    # From the site's log: how long the first and last 5 % of the pages took and the rate in
    # between, and (the latency site) how late its answers left, median and 90th percentile.
    timeline: str = ""
    note: str = ""
    ok: bool = True
    # What main ran: scrapy, scrapy-redis, default, baseline, workers, scale-N, hosts-N, variant.
    kind: str = ""

    @property
    def rate(self) -> float:
        return (self.pages - 1) / self.seconds if self.seconds > 0 else 0.0

    @property
    def running_cpu(self) -> float:
        """CPU seconds from the site's first request on: ``cpu`` without its start-up."""
        return self.cpu - self.startup_cpu

    def per_page(self, value: float) -> float:
        return value / self.pages if self.pages else 0.0


class StartupCpu:
    """The CPU a crawler's processes spent before ``site`` logged its first request since
    ``mark``: from :meth:`watch` on, every INTERVAL s, a thread adds up the CPU of the roots and
    of every live descendant (``/proc``, reaped children included; processes whose command
    name is in ``leave_out`` not), stamped with the wall clock the sites log in, until SETTLE s
    after a request was logged; :meth:`seconds` takes the CPU at that request's arrival,
    interpolated between the samples either side of it."""

    INTERVAL = 0.025
    # Long enough for the latency site's log (written every 20 ms, after its delay) to hold the
    # request that arrived first.
    SETTLE = 0.3

    def __init__(self, site: Site, mark: tuple[int, float], leave_out: frozenset = frozenset()):
        self.site, self.offset, self.leave_out = site, mark[0], leave_out
        self.samples: list[tuple[float, float]] = []  # (time.time(), CPU seconds)
        self.done = threading.Event()
        self.thread: Optional[threading.Thread] = None

    def watch(self, roots: Callable[[], list[int]]) -> None:
        """Sample the processes ``roots()`` names (asked at each sample) and their descendants."""
        self.thread = threading.Thread(target=self._sample, args=(roots,), daemon=True)
        self.thread.start()

    def _sample(self, roots: Callable[[], list[int]]) -> None:
        logged: Optional[float] = None
        while not self.done.is_set():
            pids = [p for root in roots() for p in (root, *descendants(root))]
            if self.leave_out:
                pids = [p for p in pids if command_name(p) not in self.leave_out]
            self.samples.append((time.time(), cpu_seconds(pids)))
            if logged is None and self.site.log.exists() and (
                    self.site.log.stat().st_size > self.offset):
                logged = time.monotonic()
            if logged is not None and time.monotonic() - logged > self.SETTLE:
                return
            self.done.wait(self.INTERVAL)

    def stop(self) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join()

    def seconds(self) -> float:
        """The CPU seconds at the first request's arrival (0 if none came or none was sampled)."""
        self.stop()
        first = self.site.first_request_since(self.offset)
        if first is None or not self.samples:
            return 0.0
        before = [s for s in self.samples if s[0] <= first]
        after = [s for s in self.samples if s[0] > first]
        if not after:
            return before[-1][1]
        if not before:  # it came before the first sample: at most that sample's CPU
            return after[0][1]
        (t0, c0), (t1, c1) = before[-1], after[0]
        return c0 + (c1 - c0) * (first - t0) / (t1 - t0)


def probe_client(**where) -> redis.Redis:
    """A client for a probe: one try a call, never long. redis-py (6 and later) retries a failed
    call with a growing backoff by default, about 4 s against a Redis that is gone: a probe
    sampled as the measured command shuts its Redis down would hold up the loop that waits for
    the command, and add those seconds to its wall time."""
    return redis.Redis(**where, retry=Retry(NoBackoff(), 0), socket_connect_timeout=1,
                       socket_timeout=2)


@dataclass
class RedisProbe:
    """``INFO`` deltas of one Redis: commands processed (those a Lua script runs included), CPU
    seconds, and requests read from clients (``total_reads_processed``: a round trip counts once,
    however many commands its pipeline or script holds)."""

    client: redis.Redis
    start: dict = field(default_factory=dict)
    last: dict = field(default_factory=dict)
    # With ``trace`` (a function of a command's arguments and client address, giving a label),
    # every command Redis runs is logged (SLOWLOG at threshold 0, drained at each sample in one
    # transaction) and ``traced[label]`` sums its calls and microseconds. It costs Redis CPU of
    # its own: compare CPU only between crawls traced alike.
    trace: Optional[object] = None
    traced: dict = field(default_factory=dict)
    trace_default: ClassVar[Optional[object]] = None  # ``trace`` of probes made without one

    def __post_init__(self) -> None:
        if self.trace is None:
            self.trace = RedisProbe.trace_default

    def sample(self) -> dict:
        try:
            info = self.client.info("all")
            if self.trace is not None:
                self._drain_slowlog(first=not self.start)
        except redis.RedisError:
            return self.last
        self.last = {"cmds": info["total_commands_processed"],
                     "cpu": info["used_cpu_user"] + info["used_cpu_sys"],
                     "reads": info.get("total_reads_processed", 0),
                     "scripts": sum(info.get(f"cmdstat_{c}", {}).get("calls", 0)
                                    for c in ("evalsha", "eval", "fcall")),
                     # INFO commandstats: calls and microseconds of each command (those a script
                     # runs counted on their own, and in the script's time too).
                     "commands": {k[len("cmdstat_"):]: (v["calls"], v["usec"])
                                  for k, v in info.items() if k.startswith("cmdstat_")}}
        if not self.start:
            self.start = self.last
        return self.last

    def delta(self) -> tuple[float, float, float]:
        """Commands, CPU seconds and reads since the first sample."""
        if not self.start:
            return 0.0, 0.0, 0.0
        return tuple(self.last[k] - self.start[k] for k in ("cmds", "cpu", "reads"))

    def scripts(self) -> float:
        """Lua script calls since the first sample."""
        return self.last.get("scripts", 0) - self.start.get("scripts", 0) if self.start else 0.0

    def command_delta(self) -> dict[str, tuple[int, int]]:
        """Calls and microseconds of each command since the first sample."""
        if not self.start:
            return {}
        before = self.start.get("commands", {})
        out = {}
        for name, (calls, usec) in self.last.get("commands", {}).items():
            c0, u0 = before.get(name, (0, 0))
            if calls > c0:
                out[name] = (calls - c0, usec - u0)
        return out

    def _drain_slowlog(self, first: bool) -> None:
        if first:
            self.client.config_set("slowlog-max-len", 1_000_000)
            self.client.config_set("slowlog-log-slower-than", 0)
            self.client.slowlog_reset()
            self.traced = {}
            return
        with self.client.pipeline(transaction=True) as pipe:
            entries, _ = pipe.slowlog_get(-1).slowlog_reset().execute()
        for entry in entries:
            command = entry["command"]
            args = (command if isinstance(command, bytes) else command.encode()).split(b" ")
            label = self.trace(args, entry.get("client_address", b""))
            calls, usec = self.traced.get(label, (0, 0))
            self.traced[label] = (calls + 1, usec + entry["duration"])


class ThrowawayRedis:
    def __init__(self, workdir: Path, name: str) -> None:
        self.port = free_port()
        self.dir = workdir / name
        self.dir.mkdir(exist_ok=True)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
             str(self.dir), "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
             "--maxmemory-policy", "noeviction"],
            stdout=subprocess.DEVNULL, start_new_session=True)
        wait_port(self.port)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.probe = RedisProbe(probe_client(port=self.port))
        self.probe.sample()

    def stop(self) -> None:
        self.probe.sample()
        self.proc.terminate()
        self.proc.wait(10)


def site_figures(result: Result, site: Site, mark: tuple[int, float]) -> None:
    result.site_cpu = site.cpu_seconds() - mark[1]
    hits = [(t, p) for t, p in site.requests_since(mark[0]) if p != "/robots.txt"]
    result.pages = len(hits)
    result.distinct = len({p for _, p in hits})
    if len(hits) > 1:
        result.seconds = hits[-1][0] - hits[0][0]
    if len(hits) > 40:
        # Where the time goes: the ramp-up (the first 5 % of pages, while the frontier is
        # still narrow), the steady middle, and the tail (the last 5 %).
        t = [h[0] for h in hits]
        a, b = len(t) // 20, len(t) - len(t) // 20
        result.middle = (b - a) / (t[b] - t[a]) if t[b] > t[a] else 0.0
        result.timeline = (f"first 5 % {t[a] - t[0]:.2f} s, middle {result.middle:.0f} "
                           f"pages/s, last 5 % {t[-1] - t[b]:.2f} s")
    lag = sorted(site.lag_since(mark[0]))
    if lag:
        result.timeline += (f"; site lag ms: median {lag[len(lag) // 2]:.1f}, "
                           f"90th {lag[int(len(lag) * 0.9)]:.1f}")


def run_measured(cmd: list[str], env: dict, timeout: float, log: Path, probe_for=None,
                 startup: Optional[StartupCpu] = None
                 ) -> tuple[int, float, float, Optional[RedisProbe]]:
    """Run ``cmd`` to its end (SIGTERM, then SIGKILL, at ``timeout``); return its status, wall
    seconds and the CPU seconds of it and every descendant it reaped. ``probe_for(pid)`` may
    return a RedisProbe, sampled every 0.25 s while the command runs; ``startup`` watches the
    command's start."""
    started = time.monotonic()
    with log.open("ab") as out:
        # From the work directory, not the repository: a crawl that starts its workers with
        # `python -m` from the repository would run this checkout's package in them, whatever a
        # --baseline's PYTHONPATH says.
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=log.parent)
    if startup is not None:
        startup.watch(lambda: [proc.pid])
    probe = None
    status = None
    try:
        while status is None:
            pid, raw, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                status = os.waitstatus_to_exitcode(raw)
                break
            if probe is None and probe_for is not None:
                probe = probe_for(proc.pid)
            if probe is not None:
                probe.sample()
            if time.monotonic() - started > timeout:
                proc.send_signal(signal.SIGTERM)
                _, raw, usage = os.wait4(proc.pid, 0)
                status = os.waitstatus_to_exitcode(raw)
                break
            time.sleep(0.25)
    except BaseException:
        stop_process(proc)  # Ctrl-C or SIGTERM: the command must not outlive the benchmark
        raise
    finally:
        if startup is not None:
            startup.stop()
    proc.returncode = status
    return status, time.monotonic() - started, usage.ru_utime + usage.ru_stime, probe


def embedded_probe(state_dir: Path):
    """A probe of the ``distscrape crawl``'s embedded Redis, once it is up."""
    def find(pid: int) -> Optional[RedisProbe]:
        for child in descendants(pid):
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            # redis-server rewrites its title to "redis-server 127.0.0.1:PORT", or to
            # "redis-server unixsocket:PATH" without a TCP port (as the crawl now starts it).
            title = b"\0".join(cmdline)
            on_port = re.search(rb"redis-server[^\0]* 127\.0\.0\.1:(\d+)", title)
            on_socket = re.search(rb"redis-server[^\0]* unixsocket:([^\0]+)", title)
            if on_port or on_socket:
                where = ({"port": int(on_port.group(1))} if on_port
                         else {"unix_socket_path": on_socket.group(1).decode()})
                password = (state_dir / "redis.password").read_text().strip()
                probe = RedisProbe(probe_client(**where, password=password))
                return probe if probe.sample() else None
        return None
    return find


def cap_used(r: Result, hosts: int, share: float) -> float:
    """How much of their caps ``hosts`` hosts of ``share`` of a core used from seed to finish:
    near 1, each got its share and pages/s measure the crawler; well under it, the hosts waited
    for pages or for a machine too busy to give them their share."""
    return r.seed_cpu / max(r.seed_wall * hosts * share, 1e-9)


class Occupancy:
    """``--sample``: what the crawl's items were doing, on average over polls every 30 ms: handed
    out to the broker (dispatched), leased or being saved (leased), waiting for a save message
    (pending), and the messages waiting in the broker's scrape and save queues. Whether the workers
    waited for messages (an empty scrape queue while fewer items were leased than threads) shows
    here, not in pages/s."""

    def __init__(self, client: redis.Redis, queues: tuple[str, str]) -> None:
        self.client, self.queues = client, queues  # the Redis that is also the broker
        self.rows: list[tuple[int, ...]] = []

    def add(self, stats) -> None:
        self.rows.append((stats.dispatched, stats.leased, stats.save_pending,
                          *(self.client.llen(queue) for queue in self.queues)))

    def __bool__(self) -> bool:
        return bool(self.rows)

    def __str__(self) -> str:
        n = len(self.rows)
        mean = [sum(row[i] for row in self.rows) / n for i in range(5)]
        empty = sum(1 for row in self.rows if row[3] == 0) / n
        return (f"mean dispatched {mean[0]:.0f}, leased {mean[1]:.0f}, pending {mean[2]:.0f}, "
                f"scrape queue {mean[3]:.0f} (empty in {empty:.0%} of {n} polls), "
                f"save queue {mean[4]:.1f}")
