"""What the benchmarks share: where things are, ports on loopback, the CPU of processes from
/proc, a generated site served from a child process, the environment a crawl of ours gets, and
how a child process imports another checkout's package.

Importing it changes nothing: no Celery app, no environment, no ``sys.path``.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from distscrape_celery.testing.sitegen import Site, SiteServer

ROOT = Path(__file__).resolve().parent.parent  # the repository
BENCH = ROOT / "bench"
PEERS = BENCH / ".venv-peers"  # Scrapy, scrapy-redis, py-spy and uvloop (bench.peers)
CRAWLEE = BENCH / ".venv-crawlee"  # Crawlee for Python (bench.crawlee_peer)
BIN = Path(sys.executable).parent  # this virtualenv's programs: distscrape, celery
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Settings a bench sets for every crawler of ours (broad's --dispatch-factor); nothing else of
# the shell's DISTSCRAPE_* reaches a crawl.
BENCH_SETTINGS: dict[str, str] = {}

# The first lines of a child program (``python -c``) that measures the distscrape_celery of the
# checkout named by its first argument (the installed one if that is empty). An editable
# install's finder comes before ``sys.path``: it is taken out, or the checkout would not count.
CHECKOUT_PRELUDE = r'''
import sys
if sys.argv[1]:
    sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, sys.argv[1])
'''


def use_checkout(code: str) -> None:
    """Make this process import distscrape_celery from the checkout ``code`` (before anything
    imported it), as CHECKOUT_PRELUDE does for a child."""
    sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, code)


def clean_env() -> dict:
    """This process's environment less every DISTSCRAPE_ setting, plus BENCH_SETTINGS."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")}
    return {**env, **BENCH_SETTINGS}


# ------------------------------------------------------------------------------- loopback


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port: int, timeout: float = 20, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex((host, port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {host}:{port}")


# ------------------------------------------------------------------------------- /proc CPU


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
            fields = _proc_stat(int(name))
            if fields is not None and int(fields[2]) == pgid:  # field 5: process group
                pids.append(int(name))
    return pids


def cpu_seconds(pids: list[int]) -> float:
    """user+sys of ``pids``, plus that of their reaped children (cutime+cstime)."""
    ticks = 0
    for pid in pids:
        fields = _proc_stat(pid)
        if fields is not None:
            ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime (14-17)
    return ticks / CLK_TCK


def group_cpu(pgids: list[int]) -> float:
    return sum(cpu_seconds(group_pids(g)) for g in pgids)


def children_of(pid: int) -> list[int]:
    """The live children of ``pid`` (Linux's /proc/PID/task/PID/children), or none."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, through the children of each of its threads."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            for task in os.listdir(f"/proc/{parent}/task"):
                with open(f"/proc/{parent}/task/{task}/children") as fh:
                    kids = [int(x) for x in fh.read().split()]
                found += kids
                todo += kids
        except OSError:
            pass
    return found


def command_name(pid: int) -> str:
    """The process's command name (``/proc/PID/comm``, which a rewritten title leaves alone), or
    "" once it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def own_cpu(pid: int) -> float:
    """user+sys of ``pid`` alone (not its children)."""
    fields = _proc_stat(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / CLK_TCK


def own_system_cpu(pid: int) -> float:
    """sys of ``pid`` alone: the kernel's share of :func:`own_cpu`."""
    fields = _proc_stat(pid)
    return 0.0 if fields is None else int(fields[12]) / CLK_TCK


def self_cpu() -> float:
    times = os.times()
    return times.user + times.system


def machine_ticks() -> tuple[int, int, int]:
    """(busy, iowait, total) jiffies of all CPUs, from the first line of /proc/stat."""
    with open("/proc/stat") as fh:
        values = [int(x) for x in fh.readline().split()[1:]]
    total = sum(values[:8])  # user nice system idle iowait irq softirq steal (guest in user)
    return total - values[3] - values[4], values[4], total


def cpu_ticks() -> tuple[int, int, int]:
    """(idle and iowait, steal, everything else) jiffies of all CPUs, from /proc/stat."""
    with open("/proc/stat") as fh:
        values = [int(x) for x in fh.readline().split()[1:9]]
    return values[3] + values[4], values[7], sum(values) - values[3] - values[4] - values[7]


def context_switches(pids: list[int]) -> tuple[int, int]:
    """Voluntary and involuntary context switches of every thread of ``pids`` now (threads that
    ended are not counted: a threads pool's are alive until the worker stops)."""
    voluntary = involuntary = 0
    for status in (s for pid in pids for s in Path(f"/proc/{pid}/task").glob("*/status")):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    voluntary += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    involuntary += int(line.split()[1])
        except OSError:
            pass
    return voluntary, involuntary


def proc_status(pid: int) -> Optional[tuple[int, int]]:
    """A process's peak resident memory (KiB, VmHWM) and its threads, from /proc."""
    try:
        fields = dict(line.split(":", 1) for line in
                      Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
        return int(fields["VmHWM"].split()[0]), int(fields["Threads"])
    except (OSError, KeyError, ValueError):
        return None


# ------------------------------------------------------------------------------- processes


def stop_process(proc: subprocess.Popen, grace: float = 30) -> None:
    """SIGTERM ``proc`` (which stops what it started), SIGKILL after ``grace`` seconds; reap it."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except (ProcessLookupError, ChildProcessError):
        pass


def unwind_on_sigterm() -> None:
    """Make a SIGTERM (`timeout`, `kill`) unwind like Ctrl-C, so the sites, the workers and their
    Redis are stopped (finally blocks, atexit) instead of left running in their own sessions."""
    def terminate(*_) -> None:
        # A second one (`timeout` passes its own on) must not cut that clean-up short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, terminate)


def machine() -> str:
    """This machine in one line: host, CPUs, Python and the load average now."""
    model = "?"
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg()
    return (f"{platform.node()}, {os.cpu_count()} CPUs ({model}), Python "
            f"{platform.python_version()}, load average before the run {load[0]:.2f}")


# ------------------------------------------------------------------------------- a served site


def _serve_in_child(site: Site, delay: float, conn) -> None:
    server = SiteServer(site, delay=delay)
    conn.send(server.port)
    while True:
        message = conn.recv()
        if message == "mark":
            conn.send(len(server.requests))
        elif isinstance(message, tuple) and message[0] == "since":
            conn.send(dict(collections.Counter(server.requests[message[1] :])))
        elif message == "stop":
            server.stop()
            conn.send("stopped")
            return


class ServedSite:
    """A generated site on 127.0.0.1, either in a forked child process (so that the server's
    CPU does not share a GIL with the bench) or in a thread of this process. Fork it before this
    process has threads or connections."""

    def __init__(self, site: Site, delay: float, in_process: bool) -> None:
        self.in_process = in_process
        self.proc = None
        if in_process:
            self._server = SiteServer(site, delay=delay)
            port = self._server.port
        else:
            context = multiprocessing.get_context("fork")
            self._conn, child = context.Pipe()
            self.proc = context.Process(target=_serve_in_child, args=(site, delay, child),
                                        daemon=True)
            self.proc.start()
            port = self._conn.recv()
        self.base_url = f"http://127.0.0.1:{port}"

    def url(self, path: str = "/") -> str:
        return self.base_url + path

    def mark(self) -> int:
        """Where the request log ends now, for :meth:`counts_since`."""
        if self.in_process:
            return len(self._server.requests)
        self._conn.send("mark")
        return self._conn.recv()

    def counts_since(self, mark: int) -> dict[str, int]:
        """How often each path was requested since ``mark``."""
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
