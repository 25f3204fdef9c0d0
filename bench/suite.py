#!/usr/bin/env python
"""The crawl benchmark: our crawler against Scrapy and scrapy-redis, same site, same run.

    .venv/bin/python bench/suite.py [--pages 5000] [--peer-pages 2000] [--latency 0.05]
                                    [--only nginx-default,latency-default,...] [--profile DIR]
                                    [--rounds N] [--sample]

One run, in this order, so every figure is taken under the same machine load:

1. installs Scrapy, scrapy-redis, py-spy and uvloop into ``bench/.venv-peers`` if they are not
   there;
2. generates a site with ``tests/support/sitegen.py`` (``--pages`` pages of about 6 KB, robots.txt
   allowing everything) and serves it on 127.0.0.1 twice: from static files by nginx (a child
   process with its own config; ``apt-get install nginx-light`` if it is missing) and by
   ``bench/latency_site.py`` (asyncio on uvloop, the peers' Python), which answers every request
   after ``--latency`` seconds;
3. crawls, each crawl bounded by ``--timeout`` seconds: Scrapy (a CrawlSpider, 1 process, 64
   concurrent requests) and scrapy-redis (2 processes, its own throwaway redis-server) for
   ``--peer-pages`` pages; ``distscrape crawl`` with the README's defaults and the README's
   multi-worker command (``celery multi start`` of two ``-P threads -c 32`` workers per core,
   then ``distscrape seed``) for the whole site; the scale-out runs (1, 2, 4 README workers)
   against the latency site; with ``--only scale-hosts`` (``bench/sim_hosts.py``), the same
   with each worker a simulated host, in a CPU cgroup capped at ``--host-cpu`` of a core.

Figures per crawl: pages/s as the site saw it (requests in its access log, first to last), CPU
ms per page of the crawler's processes (rusage of every process, start-up included, without
Redis; for workers that ``celery multi`` detached, their CPU from /proc before they are
stopped), Redis round trips, commands and CPU per page (``INFO`` deltas: requests read from
clients, each pipeline or script once; every command, those a script runs included; CPU). Our
politeness limits are set high
(``--per-domain-concurrency 256``); robots.txt is fetched and obeyed (it allows everything).
Network: 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import itertools
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import ClassVar, Optional
from urllib.parse import urlsplit

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_crawl import children_of, own_cpu, own_system_cpu  # noqa: E402
from sim_hosts import CgroupError, HostCgroups  # noqa: E402
from tests.support.sitegen import generate_site  # noqa: E402

PEERS = ROOT / "bench" / ".venv-peers"
PEER_PACKAGES = ["scrapy", "scrapy-redis", "py-spy", "uvloop"]
BIN = Path(sys.executable).parent
ROBOTS = b"User-agent: *\nAllow: /\n"
HIGH_LIMITS = ["--per-domain-concurrency", "256"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------- the two sites


def site_pages(n_pages: int, page_bytes: int) -> dict[str, bytes]:
    site = generate_site(n_pages=n_pages, seed=1, page_padding=page_bytes - 400)
    pages = {p: site.pages[p] for p in site.reachable}
    pages["/robots.txt"] = ROBOTS
    return pages


def write_static(pages: dict[str, bytes], root: Path) -> None:
    """Files nginx serves: ``/dir/`` as ``dir/index.html``, ``/q?id=N`` as ``q/N.html``."""
    for path, body in pages.items():
        if path.startswith("/q?id="):
            rel = f"q/{path[len('/q?id='):]}.html"
        elif path.endswith("/"):
            rel = path[1:] + "index.html"
        else:
            rel = path[1:]
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(body)


NGINX_CONF = """\
daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    default_type text/html;
    types {{ text/plain txt; }}
    client_body_temp_path {dir}/tmp;
    proxy_temp_path {dir}/tmp;
    fastcgi_temp_path {dir}/tmp;
    uwsgi_temp_path {dir}/tmp;
    scgi_temp_path {dir}/tmp;
    log_format bench '$msec $request_uri $status';
    access_log {dir}/access.log bench;
    sendfile on;
    tcp_nodelay on;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location = /q {{ try_files /q/$arg_id.html =404; }}
    }}
}}
"""


def find_nginx() -> str:
    found = shutil.which("nginx", path=os.environ.get("PATH", "") + ":/usr/sbin")
    if found is None:
        print("installing nginx-light from Debian's packages", file=sys.stderr)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "install", "-y", "-q", "nginx-light"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        found = shutil.which("nginx") or "/usr/sbin/nginx"
    return found


class Site:
    """A server on 127.0.0.1 with an access log of ``time path status`` lines."""

    url: str
    log: Path
    expected: int  # the pages a whole crawl fetches, robots.txt not counted

    proc: subprocess.Popen

    @property
    def seeds(self) -> list[str]:
        """The URLs a crawl of the site starts from."""
        return [self.url]

    def mark(self) -> tuple[int, float]:
        """Where the access log ends now, and the server's CPU seconds so far."""
        return (self.log.stat().st_size if self.log.exists() else 0), self.cpu_seconds()

    def cpu_seconds(self) -> float:
        """CPU of the server's processes (nginx: master and workers): it shares the 2 cores."""
        return sum(own_cpu(pid) for pid in [self.proc.pid, *descendants(self.proc.pid)])

    def requests_since(self, offset: int) -> list[tuple[float, str]]:
        return [(float(stamp), path) for stamp, path, *_ in self._lines_since(offset)]

    def lag_since(self, offset: int) -> list[float]:
        """The latency site's lag of each answer since ``offset``, in ms (nginx logs none)."""
        return [float(rest[0]) for _, _, _, *rest in self._lines_since(offset) if rest]

    def _lines_since(self, offset: int) -> list[list[str]]:
        with self.log.open("rb") as fh:
            fh.seek(offset)
            return [line.split(" ") for line in fh.read().decode().splitlines()]


class NginxSite(Site):
    def __init__(self, pages: dict[str, bytes], workdir: Path) -> None:
        root, self.dir = workdir / "static", workdir / "nginx"
        write_static(pages, root)
        (self.dir / "tmp").mkdir(parents=True)
        port = free_port()
        conf = self.dir / "nginx.conf"
        conf.write_text(NGINX_CONF.format(dir=self.dir, port=port, root=root))
        self.log = self.dir / "access.log"
        self.url = f"http://127.0.0.1:{port}/"
        self.expected = sum(1 for path in pages if path != "/robots.txt")
        self.proc = subprocess.Popen([find_nginx(), "-c", str(conf), "-p", str(self.dir)],
                                     start_new_session=True)
        wait_port(port)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class LatencySite(Site):
    """``bench/latency_site.py``, run by the peers' Python (which has uvloop, so the server takes
    as little of the shared CPU as it can)."""

    def __init__(self, pages: dict[str, bytes], workdir: Path, delay: float) -> None:
        port = free_port()
        self.log = workdir / "latency-access.log"
        self.url = f"http://127.0.0.1:{port}/"
        self.expected = sum(1 for path in pages if path != "/robots.txt")
        pages_file = workdir / "latency-pages.json"
        pages_file.write_text(json.dumps({p: b.decode("latin-1") for p, b in pages.items()}))
        self.proc = subprocess.Popen(
            [str(PEERS / "bin" / "python"), str(ROOT / "bench" / "latency_site.py"),
             "--port", str(port), "--delay", str(delay), "--pages", str(pages_file),
             "--log", str(self.log)], start_new_session=True)
        wait_port(port)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def wait_port(port: int, timeout: float = 20, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {host}:{port}")


# ------------------------------------------------------------------------------ measurement


@dataclass
class Result:
    name: str
    site: str
    pages: int = 0
    distinct: int = 0
    seconds: float = 0.0
    wall: float = 0.0
    cpu: float = 0.0  # seconds, crawler processes, Redis excluded
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

    def per_page(self, value: float) -> float:
        return value / self.pages if self.pages else 0.0


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


def proc_status(pid: int) -> Optional[tuple[int, int]]:
    """A process's peak resident memory (KiB, VmHWM) and its threads, from /proc."""
    try:
        fields = dict(line.split(":", 1) for line in
                      Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
        return int(fields["VmHWM"].split()[0]), int(fields["Threads"])
    except (OSError, KeyError, ValueError):
        return None


def run_measured(cmd: list[str], env: dict, timeout: float, log: Path,
                 probe_for=None) -> tuple[int, float, float, Optional[RedisProbe]]:
    """Run ``cmd`` to its end (SIGTERM, then SIGKILL, at ``timeout``); return its status, wall
    seconds and the CPU seconds of it and every descendant it reaped. ``probe_for(pid)`` may
    return a RedisProbe, sampled every 0.25 s while the command runs."""
    started = time.monotonic()
    with log.open("ab") as out:
        # From the work directory, not the repository: a crawl that starts its workers with
        # `python -m` from the repository would run this checkout's package in them, whatever a
        # --baseline's PYTHONPATH says.
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=log.parent)
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
    proc.returncode = status
    return status, time.monotonic() - started, usage.ru_utime + usage.ru_stime, probe


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


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    kids = [int(x) for x in fh.read().split()]
                out += kids
                todo += kids
        except OSError:
            pass
    return out


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
                probe = RedisProbe(redis.Redis(**where, password=password))
                return probe if probe.sample() else None
        return None
    return find


def cpu_ticks() -> tuple[int, int, int]:
    """(idle and iowait, steal, everything else) jiffies of all CPUs, from /proc/stat."""
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:9]]
    return v[3] + v[4], v[7], sum(v) - v[3] - v[4] - v[7]


def context_switches(pids: list[int]) -> tuple[int, int]:
    """Voluntary and involuntary context switches of every thread of ``pids`` now (threads that
    ended are not counted: a threads pool's are alive until the worker stops)."""
    vol = invol = 0
    for status in (s for pid in pids for s in Path(f"/proc/{pid}/task").glob("*/status")):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    vol += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    invol += int(line.split()[1])
        except OSError:
            pass
    return vol, invol


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
        self.probe = RedisProbe(redis.Redis(port=self.port))
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


# Settings a bench sets for every crawler of ours (broad.py's --dispatch-factor); nothing else of
# the shell's DISTSCRAPE_* reaches a crawl.
BENCH_SETTINGS: dict[str, str] = {}


def clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")}
    return {**env, **BENCH_SETTINGS}


# ------------------------------------------------------------------------------------ crawls


SPIDER = '''
import hashlib, os
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule
{extra_import}

class Bench({base}):
    name = "bench"
    allowed_domains = {domains!r}
    {start}
    rules = (Rule(LinkExtractor(), callback="parse_item", follow=True),)
    custom_settings = {settings!r}

    def parse_start_url(self, response, **kwargs):
        return self.parse_item(response)

    def parse_item(self, response):
        name = hashlib.sha1(response.url.encode()).hexdigest()
        with open(os.path.join(os.environ["BENCH_OUT"], name), "wb") as fh:
            fh.write(response.body)
        return None
'''


# The peers' settings (a crawl may override some): 64 requests in flight, as many to one site.
PEER_SETTINGS = {
    "CONCURRENT_REQUESTS": 64, "CONCURRENT_REQUESTS_PER_DOMAIN": 64,
    "CONCURRENT_REQUESTS_PER_IP": 0, "ROBOTSTXT_OBEY": False, "LOG_LEVEL": "WARNING",
    "TELNETCONSOLE_ENABLED": False, "COOKIES_ENABLED": False,
    "REQUEST_FINGERPRINTER_IMPLEMENTATION": "2.7",
}


def write_spider(path: Path, site: Site, settings: dict, redis_key: str = "") -> str:
    """A CrawlSpider (a RedisCrawlSpider reading ``redis_key``, if given) of ``site``'s hosts
    into ``path``, with PEER_SETTINGS overridden by ``settings``; returns its label."""
    merged = {**PEER_SETTINGS, **settings}
    domains = sorted({urlsplit(url).hostname for url in site.seeds})
    path.write_text(SPIDER.format(
        extra_import=("from scrapy_redis.spiders import RedisCrawlSpider" if redis_key else ""),
        base="RedisCrawlSpider" if redis_key else "CrawlSpider", domains=domains,
        start=f"redis_key = {redis_key!r}" if redis_key else f"start_urls = {site.seeds!r}",
        settings=merged))
    total, per_domain = merged["CONCURRENT_REQUESTS"], merged["CONCURRENT_REQUESTS_PER_DOMAIN"]
    return f"{total}" + (f", {per_domain} a site" if per_domain < total else "")


def ensure_peers() -> None:
    have = (PEERS / "bin" / "scrapy").exists() and (PEERS / "bin" / "py-spy").exists() and any(
        PEERS.glob("lib/python*/site-packages/uvloop"))
    if not have:
        print("installing the peers into bench/.venv-peers", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(PEERS)], check=True)
        subprocess.run([str(PEERS / "bin" / "pip"), "install", "-q", *PEER_PACKAGES], check=True)


def crawl_scrapy(site: Site, site_name: str, work: Path, args,
                 settings: Optional[dict] = None) -> Result:
    """Scrapy, one process, for ``--peer-pages`` pages (0: the whole site), with PEER_SETTINGS
    overridden by ``settings``."""
    out = work / f"scrapy-out-{next(_RUNS)}"
    out.mkdir()
    spider = work / "scrapy_spider.py"
    label = write_spider(spider, site, settings or {})
    env = dict(clean_env(), BENCH_OUT=str(out))
    # Scrapy installs its reactor before it reads the spider's settings: that one goes here.
    reactor = [f"TWISTED_REACTOR={settings['TWISTED_REACTOR']}"] if settings and (
        "TWISTED_REACTOR" in settings) else []
    mark = site.mark()
    status, wall, cpu, _ = run_measured(
        [str(PEERS / "bin" / "scrapy"), "runspider", str(spider),
         "-s", f"CLOSESPIDER_PAGECOUNT={args.peer_pages}", *(["-s", *reactor] if reactor else [])],
        env, args.timeout, work / "scrapy.log")
    r = Result(f"Scrapy CrawlSpider, 1 process x {label}", site_name, wall=wall, cpu=cpu,
               ok=status == 0)
    site_figures(r, site, mark)
    r.note = f"{r.pages - r.distinct} fetched twice"
    return r


def crawl_scrapy_redis(site: Site, site_name: str, work: Path, args,
                       settings: Optional[dict] = None, processes: int = 2) -> Result:
    """scrapy-redis, ``processes`` processes sharing a throwaway Redis, as crawl_scrapy (each
    process stops at its share of ``--peer-pages``)."""
    out = work / f"scrapy-redis-out-{next(_RUNS)}"
    out.mkdir()
    spider = work / "scrapy_redis_spider.py"
    label = write_spider(spider, site, settings or {}, redis_key="bench:start_urls")
    server = ThrowawayRedis(work, f"scrapy-redis-redis-{next(_RUNS)}")
    server.probe.client.lpush("bench:start_urls", *site.seeds)
    env = dict(clean_env(), BENCH_OUT=str(out))
    settings = ["-s", "SCHEDULER=scrapy_redis.scheduler.Scheduler",
                "-s", "DUPEFILTER_CLASS=scrapy_redis.dupefilter.RFPDupeFilter",
                "-s", f"REDIS_URL={server.url}", "-s", "MAX_IDLE_TIME_BEFORE_CLOSE=3",
                # The first process to stop must not flush the queue and the dupefilter.
                "-s", "SCHEDULER_PERSIST=True",
                "-s", f"CLOSESPIDER_PAGECOUNT={args.peer_pages // processes}"]
    mark = site.mark()
    started = time.monotonic()
    procs = []
    cpu, ok = 0.0, True
    try:
        for i in range(processes):
            with (work / f"scrapy-redis-{i}.log").open("ab") as log:
                procs.append(subprocess.Popen(
                    [str(PEERS / "bin" / "scrapy"), "runspider", str(spider), *settings],
                    env=env, stdout=log, stderr=subprocess.STDOUT))
        for proc in procs:
            while True:
                pid, raw, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                server.probe.sample()
                if time.monotonic() - started > args.timeout:
                    proc.terminate()
                time.sleep(0.25)
            proc.returncode = os.waitstatus_to_exitcode(raw)
            ok = ok and proc.returncode == 0
            cpu += usage.ru_utime + usage.ru_stime
    except BaseException:
        for proc in procs:  # Ctrl-C or SIGTERM: none may outlive the benchmark
            if proc.returncode is None:
                stop_process(proc)
        raise
    finally:
        server.stop()
    wall = time.monotonic() - started
    cmds, rcpu, reads = server.probe.delta()
    r = Result(f"scrapy-redis, {processes} processes x {label}", site_name, wall=wall, cpu=cpu, redis_cmds=cmds,
               redis_reads=reads, redis_cpu=rcpu, ok=ok)
    r.redis_scripts = server.probe.scripts()
    site_figures(r, site, mark)
    r.note = f"{r.pages - r.distinct} fetched twice"
    return r


def crawl_default(site: Site, site_name: str, work: Path, args, extra: list[str] = (),
                  baseline: bool = False, polite: bool = False) -> Result:
    """The README's one command: ``distscrape crawl URL --output DIR``, limits set high (with
    ``polite``, the default limits: 8 requests in flight to the site). With ``baseline``, the
    package is imported from ``--baseline`` (another version's source)."""
    # Each run its own output: a crawl refuses an output that holds another job's state.
    out = work / f"default-{site_name}-{'baseline-' if baseline else ''}{next(_RUNS)}-out"
    mark = site.mark()
    state = Path(str(out) + ".distscrape-state")
    command = [str(BIN / "distscrape"), "crawl", *site.seeds, "--output", str(out), "--quiet",
               *([] if polite else HIGH_LIMITS), *extra]
    if args.profile:
        # Collapsed stacks of every Python process of the crawl, only samples holding the GIL
        # (Python CPU, not threads blocked in socket reads); CPU figures then include py-spy.
        command = [str(PEERS / "bin" / "py-spy"), "record", "--subprocesses", "--nonblocking",
                   "--format", "raw", "--gil",
                   "--rate", "100", "-o", str(Path(
                       args.profile, f"default-{site_name}{'-baseline' if baseline else ''}.txt")),
                   "--", *command]
    env = clean_env()
    if baseline:
        env["PYTHONPATH"] = args.baseline
    status, wall, cpu, probe = run_measured(
        command, env, args.timeout, work / f"default-{site_name}.log", embedded_probe(state))
    cmds, rcpu, reads = probe.delta() if probe else (0.0, 0.0, 0.0)
    name = ("distscrape crawl (defaults" + (", default politeness)" if polite else ")")
            + (" " + " ".join(extra) if extra else "") + (" [baseline]" if baseline else ""))
    r = Result(name, site_name, wall=wall, cpu=cpu, redis_cmds=cmds, redis_cpu=rcpu,
               redis_reads=reads, ok=status == 0, redis_probe=probe)
    r.redis_scripts = probe.scripts() if probe else 0.0
    site_figures(r, site, mark)
    # The embedded Redis is a child of the command: its CPU is in the rusage; take it out.
    r.cpu -= rcpu
    saved = sum(1 for p in out.rglob("*") if p.is_file())
    r.note = f"{saved} files saved"
    r.ok = r.ok and saved == r.distinct == site.expected
    return r


README_WORKER_ARGS = ["-P", "threads", "-c", "32", "--without-gossip", "--without-mingle"]  # two a core
_RUNS = itertools.count(1)


def crawl_workers(site: Site, site_name: str, work: Path, args, workers: int,
                  max_pages: Optional[int] = None, worker_args: Optional[list[str]] = None,
                  worker_env: Optional[dict[str, str]] = None,
                  worker_groups: Optional[list[tuple[int, list[str]]]] = None,
                  polite: bool = False, group_prefix: Optional[list[list[str]]] = None) -> Result:
    """The README's many-host setup on this host: ``celery multi start`` of ``workers`` workers
    with ``-P threads -c 32`` (or ``worker_args``; or ``worker_groups``, counts of workers with
    options of their own), with ``worker_env`` (BENCH_LAUNCH, BENCH_PIN: see below), then
    ``distscrape seed`` (limits set high; with ``polite``, the default ones); waits until the
    tracker says the job is finished. ``group_prefix``: a command prefix for each group, which
    its ``celery multi start`` (or each of its workers' commands) runs under."""
    worker_args = README_WORKER_ARGS if worker_args is None else worker_args
    groups = worker_groups or [(workers, worker_args)]
    workers = sum(n for n, _ in groups)
    prefix = group_prefix or [[] for _ in groups]
    from distscrape_celery.settings import Settings
    from distscrape_celery.tracker import RedisTracker

    run = next(_RUNS)  # each crawl its own Redis directory, job and output
    server = ThrowawayRedis(work, f"redis-{site_name}-{workers}w-{max_pages}-{run}")
    worker_env = dict(worker_env or {})
    # BENCH_PIN=1: each worker process on one CPU (taskset), round robin, to see what the
    # scheduler moving threads between CPUs costs.
    pin = worker_env.pop("BENCH_PIN", "") not in ("", "0")
    # BENCH_LAUNCH: how the workers are started. `multi` (the default, the README's command):
    # `celery multi start`, which detaches each worker into a session of its own; `sessions`:
    # each started here in a session of its own, as systemd starts its units; `loop`: as
    # background jobs of one shell, all in one session. Linux shares CPU between sessions
    # (autogroups) before it shares it between processes: workers in one session get no more
    # of it than the Redis server beside them.
    # `forks`: one `python -m distscrape_celery.worker.main --forks` process (as `distscrape
    # crawl` starts its workers, but with gossip and mingle on), which imports once and forks one
    # worker per group entry (each group's options must be `-P threads -c N`).
    launch = worker_env.pop("BENCH_LAUNCH", "sessions" if pin else "multi")
    # BENCH_PROFILE=DIR: py-spy records each worker (collapsed stacks, samples holding the GIL)
    # from the seed to the end, into DIR/LABEL-PID.txt.
    profile_dir = worker_env.pop("BENCH_PROFILE", "")
    # `mains`: as `sessions`, but each `python -m distscrape_celery.worker.main` (the same
    # worker without Celery's command line and the plugins it imports).
    if (launch not in ("multi", "sessions", "loop", "forks", "mains")
            or (pin and launch != "sessions")):
        raise SystemExit(f"BENCH_LAUNCH={launch!r}: multi, sessions, loop, forks or mains "
                         "(BENCH_PIN: sessions)")
    if group_prefix and launch in ("loop", "forks"):
        raise SystemExit(f"BENCH_LAUNCH={launch}: its workers cannot each have a prefix")
    env = dict(clean_env(), DISTSCRAPE_REDIS_URL=server.url, **worker_env)
    settings = Settings(redis_url=server.url)
    tracker = RedisTracker.from_settings(settings)
    job = f"bench-{site_name}-{workers}-{run}"
    out = work / f"{job}-out"
    started = time.monotonic()
    queues = ["-Q", "distscrape.scrape,distscrape.save"]
    commands = [
        [*before, *(["taskset", "-c", str(i % (os.cpu_count() or 1))] if pin else []),
         *([str(BIN / "python"), "-m", "distscrape_celery.worker.main"] if launch == "mains"
           else [str(BIN / "celery"), "-A", "distscrape_celery", "worker"]), *queues, *opts,
         "-n", f"distscrape-{i}@%h", "--loglevel", "WARNING"]
        for i, (before, opts) in enumerate(
            (before, opts) for before, (n, opts) in zip(prefix, groups) for _ in range(n))]
    procs = []
    multi_files = [f"--pidfile={work}/{job}-%n.pid", f"--logfile={work}/{job}-%n.log"]
    multi_groups = [([f"g{g}w{i}" for i in range(n)], opts) for g, (n, opts) in enumerate(groups)]
    multi_names = [name for names, _ in multi_groups for name in names]
    # Started in the work directory: `python -m` puts its directory first on sys.path, and from
    # a checkout that would import the checkout's package, not the one worker_env's PYTHONPATH
    # names (a baseline's).
    if launch == "multi":
        for before, (names, opts) in zip(prefix, multi_groups):
            subprocess.run([*before, str(BIN / "celery"), "multi", "start", *names, "-A",
                            "distscrape_celery", *queues, *opts, "--loglevel=WARNING",
                            *multi_files], env=env, check=True, capture_output=True, cwd=work)
    elif launch == "loop":
        script = " ".join(f"{shlex.join(c)} >{shlex.quote(str(work / f'{job}-worker{i}.log'))} "
                          f"2>&1 &" for i, c in enumerate(commands)) + " wait"
        shell = subprocess.Popen(["bash", "-c", script], env=env, start_new_session=True, cwd=work)
    elif launch == "forks":
        threads = [opts[opts.index("-c") + 1] for n, opts in groups for _ in range(n)]
        # worker.main's switches (--without-gossip, --without-mingle) pass on; the first
        # group's, which every worker then gets.
        flags = [o for o in groups[0][1] if o.startswith("--without-")]
        command = [str(BIN / "python"), "-m", "distscrape_celery.worker.main", *queues,
                   "-P", "threads", "--forks", ",".join(threads), "-n", "distscrape@%h",
                   "--loglevel", "WARNING", *flags]
        with (work / f"{job}-forks.log").open("ab") as log:
            procs.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True, cwd=work))
    else:
        for i, command in enumerate(commands):
            with (work / f"{job}-worker{i}.log").open("ab") as log:
                procs.append(subprocess.Popen(command, env=env, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True,
                                              cwd=work))

    def abandon() -> None:
        """The run failed before it stopped its workers: kill them and the Redis all the same
        (a failed run once left four idle workers polling for an hour and a half, beside every
        later measurement)."""
        if launch == "multi":
            subprocess.run([str(BIN / "celery"), "multi", "kill", *multi_names, *multi_files],
                           env=env, capture_output=True, timeout=60)
        for proc in [*procs, *([shell] if launch == "loop" else [])]:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        server.stop()

    atexit.register(abandon)
    deadline = time.monotonic() + 60
    while sum(1 for w in tracker.workers() if w.alive) < workers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{workers} workers did not come up; see {work}")
        time.sleep(0.1)
    mark = site.mark()
    server.probe.start = {}
    server.probe.sample()

    def worker_pids() -> list[int]:
        if launch == "multi":
            files = [Path(work, f"{job}-{name}.pid") for name in multi_names]
            deadline = time.monotonic() + 10  # a pidfile may come after the worker's heartbeat
            while not all(f.exists() for f in files) and time.monotonic() < deadline:
                time.sleep(0.05)
            return [int(f.read_text()) for f in files]
        if launch == "forks":
            return children_of(procs[0].pid)
        return [proc.pid for proc in procs] if launch != "loop" else children_of(shell.pid)

    def worker_cpu() -> float:  # from /proc: the workers' own CPU so far
        return sum(own_cpu(pid) for pid in worker_pids())

    def worker_system_cpu() -> float:  # the kernel's part of it
        return sum(own_system_cpu(pid) for pid in worker_pids())

    spies = []
    if profile_dir:
        Path(profile_dir).mkdir(parents=True, exist_ok=True)
        spies = [subprocess.Popen(
            [str(PEERS / "bin" / "py-spy"), "record", "--pid", str(pid), "--nonblocking", "--gil",
             "--format", "raw", "--rate", "100",
             "-o", str(Path(profile_dir, f"{site_name}-{launch}-{pid}.txt"))],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for pid in worker_pids()]
        time.sleep(0.5)
    switches_before = context_switches(worker_pids())
    cpu_before, system_before = worker_cpu(), worker_system_cpu()
    each_before, seeded = {pid: own_cpu(pid) for pid in worker_pids()}, time.monotonic()
    ticks = [(time.time(), cpu_ticks())]  # sampled as the crawl goes, for its idle time
    limit = ["--max-pages", str(max_pages)] if max_pages else []
    seed = subprocess.run([str(BIN / "distscrape"), "seed", job, *site.seeds, "--output", str(out),
                           *([] if polite else HIGH_LIMITS), *limit], env=env,
                          capture_output=True, text=True)
    if seed.returncode != 0:
        raise RuntimeError(f"seed failed: {seed.stderr}")
    ok = False
    occupancy = (Occupancy(server.probe.client, (settings.scrape_queue, settings.save_queue))
                 if args.sample else None)
    while time.monotonic() - started < args.timeout:
        server.probe.sample()
        ticks.append((time.time(), cpu_ticks()))
        stats = tracker.stats(job)
        if stats.finished:
            ok = True
            break
        if occupancy is not None:
            occupancy.add(stats)
        time.sleep(0.03 if occupancy is not None else 0.25)
    server.probe.sample()
    crawl_cpu, crawl_system = worker_cpu() - cpu_before, worker_system_cpu() - system_before
    seed_wall = time.monotonic() - seeded
    busiest = max((own_cpu(pid) - cpu for pid, cpu in each_before.items()), default=0.0) / max(
        seed_wall, 1e-9)
    for spy in spies:
        spy.send_signal(signal.SIGINT)
    for spy in spies:
        spy.wait(30)
    switches = [b - a for a, b in zip(switches_before, context_switches(worker_pids()))]
    memory = [proc_status(pid) for pid in worker_pids()]
    cpu = 0.0
    if launch == "multi":
        # Detached, not our children: their CPU up to now, from /proc, then a warm stop.
        cpu = worker_cpu()
        subprocess.run([str(BIN / "celery"), "multi", "stopwait", *multi_names, *multi_files],
                       env=env, capture_output=True, timeout=60)
    else:
        if launch == "loop":
            # The shell's wait reaps the workers: their CPU is in the shell's own rusage.
            pids, procs = children_of(shell.pid), [shell]
        else:
            pids = [proc.pid for proc in procs]
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        for proc in procs:
            try:
                _, raw, usage = os.wait4(proc.pid, 0)
                cpu += usage.ru_utime + usage.ru_stime
            except ChildProcessError:
                pass
    atexit.unregister(abandon)
    wall = time.monotonic() - started
    stats = tracker.stats(job)
    server.stop()
    cmds, rcpu, reads = server.probe.delta()
    label = " + ".join(f"{n} x celery {' '.join(opts)}" for n, opts in groups)
    label = " ".join([label, *(f"{k}={v}" for k, v in worker_env.items()), *(["pinned"] * pin),
                      *([f"({launch})"] * (launch != "multi"))])
    readme = (groups == [(workers, README_WORKER_ARGS)] and not worker_env and launch == "multi")
    r = Result(f"{'README workers' if readme else 'workers'}: "
               f"{'celery multi start: ' if launch == 'multi' else ''}{label}", site_name, wall=wall,
               cpu=cpu, redis_cmds=cmds, redis_cpu=rcpu, redis_reads=reads, busiest=busiest,
               seed_cpu=crawl_cpu, seed_wall=seed_wall, ok=ok and stats.dead == 0,
               redis_probe=server.probe)
    r.redis_scripts = server.probe.scripts()
    site_figures(r, site, mark)
    r.note = f"done {stats.done}, dead {stats.dead}" + (f"; {occupancy}" if occupancy else "")
    if r.pages:
        r.note += (f"; workers' CPU from seed to finish {1000 * crawl_cpu / r.pages:.2f} ms a page"
                   f" ({1000 * crawl_system / r.pages:.2f} in the kernel), the busiest process"
                   f" {busiest:.2f} of a core")
    if memory and all(memory):
        # Each worker's peak resident memory and its threads at the end (the pool's threads
        # start as tasks come; Celery's own besides).
        r.note += (f"; workers' peak RSS {statistics.mean(m[0] for m in memory) / 1024:.1f} MiB"
                   f" each (mean), {statistics.mean(m[1] for m in memory):.0f} threads")
        # Between the samples inside the site's first and last page: not the seed's start-up
        # or the wait for the last saves, which idle the machine whatever the workers do.
        hits = [t for t, path in site.requests_since(mark[0]) if path != "/robots.txt"]
        inside = [x for t, x in ticks if hits and hits[0] <= t <= hits[-1]]
        if len(inside) > 1:
            idle, steal, busy = (b - a for a, b in zip(inside[0], inside[-1]))
            total = idle + steal + busy
            r.note += f"; machine idle {idle / total:.0%}, steal {steal / total:.0%}"
    if switches and r.pages:
        r.note += (f"; context switches a page: {switches[0] / r.pages:.1f} voluntary, "
                   f"{switches[1] / r.pages:.1f} involuntary")
    r.ok = r.ok and r.pages == r.distinct
    return r


HOST_COUNTS = (1, 2, 4)


def crawl_hosts(site: Site, site_name: str, work: Path, args) -> list[Result]:
    """``--only scale-hosts``: 1, 2 and 4 simulated hosts (4, 2, 1 every other round) crawl
    ``--scale-pages`` pages of ``site``, sharing one Redis. Each host is one worker of
    ``--scale-args`` started by its own ``celery multi start`` inside a CPU cgroup capped at
    ``--host-cpu`` of a core (``sim_hosts.HostCgroups``); the bench, Redis and the site stay
    outside. Each row's note adds the machine's load average before and after the crawl and how
    often the hosts' quota ran out."""
    counts = HOST_COUNTS if args.round % 2 == 0 else HOST_COUNTS[::-1]
    opts = args.scale_args.split()
    out = []
    for n in counts:
        load = os.getloadavg()[0]
        with HostCgroups(args.host_cpu) as cgroups:
            run = next(_RUNS)
            groups = [cgroups.make(f"{run}-{i}") for i in range(n)]
            r = crawl_workers(site, site_name, work, args, n, max_pages=args.scale_pages,
                              worker_groups=[(1, opts)] * n,
                              group_prefix=[cgroups.enter_command(g) for g in groups])
            periods = [cgroups.throttling(g) for g in groups]
        r.kind = f"hosts-{n}"
        r.name = (f"{n} simulated host{'s' * (n > 1)} at {args.host_cpu:g} of a core, each "
                  f"celery multi start: 1 x celery {' '.join(opts)}")
        ran, throttled = sum(p for p, _ in periods), sum(t for _, t in periods)
        r.note += (f"; load average {load:.2f} -> {os.getloadavg()[0]:.2f}; quota used up in "
                   f"{throttled / max(ran, 1):.0%} of the hosts' {ran} periods; the hosts used "
                   f"{cap_used(r, n, args.host_cpu):.0%} of their cap")
        out.append(r)
    return out


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
        self.rows.append((stats.dispatched, stats.leased, stats.saving,
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


# ------------------------------------------------------------------------------------ report


def table(results: list[Result], peers: dict[str, Result]) -> str:
    rows = ["| crawler | site | pages | pages/s | vs Scrapy | vs scrapy-redis | CPU ms/page "
            "| Redis round trips / scripts a page | Redis cmds/page | Redis CPU ms/page | site CPU ms/page "
            "| command wall s | checks |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        scrapy, sredis = peers.get(("scrapy", r.site)), peers.get(("scrapy-redis", r.site))
        ratio = (lambda p: f"{r.rate / p.rate:.2f}x" if p and p.rate else "")
        notes = "; ".join(filter(None, [r.note, r.timeline]))
        rows.append(
            f"| {r.name} | {r.site} | {r.pages} | {r.rate:.0f} | {ratio(scrapy)} | "
            f"{ratio(sredis)} | {1000 * r.per_page(r.cpu):.2f} | "
            f"{r.per_page(r.redis_reads):.1f} / {r.per_page(r.redis_scripts):.2f} | "
            f"{r.per_page(r.redis_cmds):.1f} | "
            f"{1000 * r.per_page(r.redis_cpu):.2f} | "
            f"{1000 * r.per_page(r.site_cpu):.2f} | {r.wall:.1f} | {'ok' if r.ok else 'FAILED'}"
            f"{' (' + notes + ')' if notes else ''} |")
    return "\n".join(rows)


def machine() -> str:
    model = "?"
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg()
    return (f"{platform.node()}, {os.cpu_count()} CPUs ({model}), Python "
            f"{platform.python_version()}, load average before the run {load[0]:.2f}")


ALL = ["scrapy", "scrapy-redis", "nginx-default", "nginx-workers", "latency-default",
       "latency-workers", "scale", "variants"]
# Not in ALL either: scale-hosts (bench/sim_hosts.py), which needs root and a cgroup cpu
# controller.
# Not in ALL: nginx-polite and latency-polite, `distscrape crawl` with its default politeness
# (8 requests in flight to one site: at most 160 pages/s from the 50 ms site).
# With --baseline DIR (a directory holding another version's distscrape_celery, e.g. from
# `git archive OLD distscrape_celery | tar -x -C DIR`), also: nginx-baseline, latency-baseline.
# nginx-cN and latency-cN: `distscrape crawl --concurrency N` (to compare concurrencies).


def parse_variant(text: str) -> tuple[list[tuple[int, list[str]]], dict[str, str]]:
    """``N|celery worker options|VAR=VALUE,...`` (the last part optional). Groups of workers
    with options of their own are joined by `` + ``, e.g. ``3|-P threads -c 16 -Q
    distscrape.scrape + 1|-P solo -Q distscrape.save``."""
    groups, env = [], {}
    for part in text.split(" + "):
        fields = part.split("|")
        if len(fields) not in (2, 3) or not fields[0].strip().isdigit():
            raise SystemExit(f"--variant: {part!r} is not N|OPTIONS[|VAR=VALUE,...]")
        if len(fields) == 3:
            env.update(kv.split("=", 1) for kv in fields[2].split(",") if kv)
        groups.append((int(fields[0]), fields[1].split()))
    return groups, env


def run_one(what: str, nginx: Site, latency: Site, work: Path, args, extra: list[str],
            peers: dict) -> list[Result]:
    """The crawls ``what`` (one of ALL, or nginx-/latency-baseline) stands for, each result
    marked with its kind; a peer's result also goes into ``peers``."""
    if what == "variants":
        out = []
        for text in args.variant:
            groups, env = parse_variant(text)
            for name in args.variant_sites.split(","):
                site = nginx if name == "nginx" else latency
                out.append(crawl_workers(site, name, work, args, 0, worker_env=env,
                                         worker_groups=groups))
                out[-1].kind = "variant"
        return out
    if what == "scale-hosts":
        return crawl_hosts(latency, "latency", work, args)
    if what == "scale":
        out = []
        for n in (1, 2, 4):
            out.append(crawl_workers(latency, "latency", work, args, n,
                                     max_pages=args.scale_pages,
                                     worker_args=args.scale_args.split()))
            out[-1].kind = f"scale-{n}"
        return out
    if what.startswith("scrapy"):
        where, kind = "nginx", what
    else:
        where, _, kind = what.partition("-")
    site = nginx if where == "nginx" else latency
    name = "nginx" if where == "nginx" else "latency"
    if kind == "scrapy":
        r = crawl_scrapy(site, name, work, args)
    elif kind == "scrapy-redis":
        r = crawl_scrapy_redis(site, name, work, args)
    elif kind == "default":
        r = crawl_default(site, name, work, args, extra)
    elif kind == "baseline":
        r = crawl_default(site, name, work, args, extra, baseline=True)
    elif kind == "polite":
        r = crawl_default(site, name, work, args, extra, polite=True)
    elif re.fullmatch(r"c[0-9]+", kind):
        r = crawl_default(site, name, work, args, [*extra, "--concurrency", kind[1:]])
    else:
        kind = "workers"
        r = crawl_workers(site, name, work, args, 2 * (os.cpu_count() or 1))
    r.kind = kind
    if kind.startswith("scrapy"):
        peers[(kind, name)] = r
    return [r]


# The targets: (what, at least, numerator, denominator), each a (kind, site) of one round.
TARGETS = [
    ("`distscrape crawl` vs Scrapy", 3.0, ("default", "nginx"), ("scrapy", "nginx")),
    ("`distscrape crawl` vs scrapy-redis", 2.0, ("default", "nginx"), ("scrapy-redis", "nginx")),
    ("README workers vs Scrapy", 3.0, ("workers", "nginx"), ("scrapy", "nginx")),
    ("README workers vs scrapy-redis", 2.0, ("workers", "nginx"), ("scrapy-redis", "nginx")),
    ("50 ms site / loopback, crawl", 0.9, ("default", "latency"), ("default", "nginx")),
    ("50 ms site / loopback, README workers", 0.9, ("workers", "latency"), ("workers", "nginx")),
    ("scale-out, 1 -> 2 workers", 1.8, ("scale-2", "latency"), ("scale-1", "latency")),
    ("scale-out on simulated hosts, 1 -> 2", 1.8, ("hosts-2", "latency"), ("hosts-1", "latency")),
    ("scale-out on simulated hosts, 1 -> 4", 3.2, ("hosts-4", "latency"), ("hosts-1", "latency")),
    # Not targets. The 50 ms ratios between the first and the last 5 % of the pages: the steady
    # crawl, without the start, where each of the site's first levels of links costs a round
    # trip of 50 ms whatever the concurrency (about 0.15 s of a 4,000-page crawl).
    ("50 ms site / loopback, crawl, middle (not a target)", 0.9, ("default", "latency"),
     ("default", "nginx"), "middle"),
    ("50 ms site / loopback, README workers, middle (not a target)", 0.9, ("workers", "latency"),
     ("workers", "nginx"), "middle"),
    # The same between the first and the last 5 % of the pages: without the start, whose
    # levels of links cost the 50 ms site a round trip each, and the end, where the frontier
    # runs dry; times that hardly shrink with more hosts and so weigh more in their shorter
    # crawls.
    ("scale-out on simulated hosts, 1 -> 2, middle (not a target)", 1.8, ("hosts-2", "latency"),
     ("hosts-1", "latency"), "middle"),
    ("scale-out on simulated hosts, 1 -> 4, middle (not a target)", 3.2, ("hosts-4", "latency"),
     ("hosts-1", "latency"), "middle"),
    # This code against --baseline's, for a change's effect.
    ("`distscrape crawl` / --baseline, loopback", 1.0, ("default", "nginx"), ("baseline", "nginx")),
]


# Upper bounds: (what, at most, the crawl's (kind, site)), in Redis CPU ms a page. Both crawls
# keep tracker and broker on one Redis.
REDIS_CEILINGS = [
    ("Redis CPU ms a page, `distscrape crawl`", 0.25, ("default", "nginx")),
    ("Redis CPU ms a page, README workers", 0.25, ("workers", "nginx")),
]


def ceiling_table(rounds: list[tuple[list[Result], dict]]) -> str:
    """Each Redis CPU bound's figure in each round and the median; only crawls that ran."""
    figures = []
    for label, most, crawl in REDIS_CEILINGS:
        row: list[Optional[float]] = []
        for results, _ in rounds:
            found = {(r.kind, r.site): r for r in results}.get(crawl)
            row.append(1000 * found.per_page(found.redis_cpu) if found and found.pages else None)
        figures.append((label, most, row))
    return bound_table("bound", "at most", figures, len(rounds), lambda x, most: x <= most)


def bound_table(what: str, bound: str, figures: list[tuple[str, float, list[Optional[float]]]],
                rounds: int, meets: Callable[[float, float], bool]) -> str:
    """A table of (label, bound, figure per round) with each row's median and the rounds whose
    figure ``meets`` the bound; rows with no figure are left out, and no row is no table."""
    lines = []
    for label, limit, row in figures:
        got = [x for x in row if x is not None]
        if not got:
            continue
        cells = " | ".join(f"{x:.2f}" if x is not None else "" for x in row)
        met = sum(1 for x in got if meets(x, limit))
        lines.append(f"| {label} | {limit:.2f} | {cells} | {statistics.median(got):.2f} | "
                     f"{met} of {len(got)} |")
    if not lines:
        return ""
    head = f"| {what} | {bound} | " + " | ".join(f"round {i}" for i in range(1, rounds + 1))
    return "\n".join([head + " | median | met in |", "|---|---|" + "---|" * (rounds + 2), *lines])


def target_table(rounds: list[tuple[list[Result], dict]], host_cpu: float = 0.3) -> str:
    """Each target's ratio in each round (pages/s of two crawls of the same round) and the
    median over the rounds; only targets whose crawls ran."""
    ratios: list[tuple[str, float, list[Optional[float]]]] = []
    for label, least, top, bottom, *what in TARGETS:
        attr = what[0] if what else "rate"
        row: list[Optional[float]] = []
        for results, _ in rounds:
            found = {(r.kind, r.site): r for r in results}
            a, b = found.get(top), found.get(bottom)
            row.append(getattr(a, attr) / getattr(b, attr)
                       if a and b and getattr(b, attr) else None)
        ratios.append((label, least, row))
    table = bound_table("target", "at least", ratios, len(rounds), lambda x, least: x >= least)
    if not table:
        return ""
    lines = [table]
    alone = [r.busiest for results, _ in rounds for r in results
             if (r.kind, r.site) == ("scale-1", "latency") and r.busiest]
    if alone:
        # A worker process's threads share one GIL: near a whole core, one worker is held by it,
        # and on a machine of 2 cores the 1 -> 2 ratio then measures what the second worker,
        # Redis and the site find left of them, not the crawler (docs/performance.md).
        lines.append("\nscale-out: the 1-worker crawl's process used "
                     + " / ".join(f"{x:.2f}" for x in alone) + f" of a core ({os.cpu_count()} here)")
    hosts = hosts_summary(rounds, host_cpu)
    if hosts:
        lines.append("\n" + hosts)
    return "\n".join(lines)


def cap_used(r: Result, hosts: int, share: float) -> float:
    """How much of their caps ``hosts`` hosts of ``share`` of a core used from seed to finish:
    near 1, each got its share and pages/s measure the crawler; well under it, the hosts waited
    for pages or for a machine too busy to give them their share."""
    return r.seed_cpu / max(r.seed_wall * hosts * share, 1e-9)


def hosts_summary(rounds: list[tuple[list[Result], dict]], share: float) -> str:
    """The simulated hosts' pages/s, workers' CPU a page (from seed to finish) and the share of
    their cap they used, in every round, and the medians."""
    lines = []
    for n in HOST_COUNTS:
        found = [r for results, _ in rounds for r in results if r.kind == f"hosts-{n}"]
        if not found:
            continue
        rates = [r.rate for r in found]
        cpu = [1000 * r.per_page(r.seed_cpu) for r in found]
        used = [cap_used(r, n, share) for r in found]
        lines.append(f"| {n} | {' / '.join(f'{x:.0f}' for x in rates)} | "
                     f"{statistics.median(rates):.0f} | {' / '.join(f'{x:.2f}' for x in cpu)} | "
                     f"{statistics.median(cpu):.2f} | {' / '.join(f'{x:.0%}' for x in used)} |")
    if not lines:
        return ""
    return "\n".join([f"| simulated hosts ({share:g} of a core each) | pages/s, per round | median "
                      "| workers' CPU ms a page from seed to finish, per round | median "
                      "| of their cap used, per round |", "|---|---|---|---|---|---|", *lines])


def unwind_on_sigterm() -> None:
    """Make a SIGTERM (`timeout`, `kill`) unwind like Ctrl-C, so the sites, the workers and their
    Redis are stopped (finally blocks, atexit) instead of left running in their own sessions."""
    def terminate(*_) -> None:
        # A second one (`timeout` passes its own on) must not cut that clean-up short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, terminate)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=5000)
    parser.add_argument("--page-bytes", type=int, default=6000)
    parser.add_argument("--peer-pages", type=int, default=2000)
    parser.add_argument("--scale-pages", type=int, default=1500)
    parser.add_argument("--scale-args", default=" ".join(README_WORKER_ARGS),
                        help="celery worker options of each scale-out worker (default: the "
                             "README's)")
    parser.add_argument("--host-cpu", type=float, default=0.3,
                        help="scale-hosts: each simulated host's share of a core")
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per crawl at most")
    parser.add_argument("--only", default=",".join(ALL),
                        help=f"some of {','.join(ALL)}; also nginx-polite, latency-polite, "
                        "scale-hosts (1, 2, 4 workers each in a CPU cgroup of --host-cpu of a "
                        "core: needs root), nginx-baseline, latency-baseline")
    parser.add_argument("--sample", action="store_true",
                        help="README workers' crawls: poll the tracker every 30 ms and report the "
                        "items in flight and the broker's queues (slows the driver a little)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run --only this many times, every other round in reverse order; "
                        "each round's ratios use that round's crawls, and a last table gives "
                        "each target in every round and its median")
    parser.add_argument("--profile", metavar="DIR",
                        help="record `distscrape crawl` with py-spy --gil (collapsed stacks into DIR)")
    parser.add_argument("--variant", action="append", default=[], metavar="N|OPTIONS|ENV",
                        help="with --only ...,variants: N celery workers started with OPTIONS "
                        "(e.g. '2|-P threads -c 16|DISTSCRAPE_BROKER_ACK_EMULATION=False'), "
                        "run against each site named in --variant-sites; repeatable")
    parser.add_argument("--variant-sites", default="nginx", help="nginx, latency or both")
    parser.add_argument("--baseline", metavar="DIR",
                        help="for nginx-baseline and latency-baseline: run `distscrape crawl` "
                        "with the distscrape_celery package in DIR (another version, same run); "
                        "run the suite from outside the source tree, or the crawl's `python -m "
                        "celery` workers import the tree in the current directory instead")
    parser.add_argument("--crawl-args", default="",
                        help="extra options for `distscrape crawl` (to compare settings)")
    args = parser.parse_args(argv)
    unwind_on_sigterm()
    only = args.only.split(",")
    if "scale-hosts" in only:
        # Before the sites are made: without root or a cpu controller, say so at once.
        try:
            with HostCgroups(args.host_cpu) as cgroups:
                cgroups.make("check")
        except (CgroupError, ValueError) as exc:
            raise SystemExit(f"scale-hosts: {exc}") from exc
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = f"{stamp}; {machine()}"
    print(header, flush=True)
    ensure_peers()  # the latency site runs on their Python too
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    args.pages_map = site_pages(args.pages, args.page_bytes)
    work = Path(tempfile.mkdtemp(prefix="distscrape-suite-"))
    # nginx only for the crawls of it (the scale-out ones use the 50 ms site alone).
    needs_nginx = any(w.startswith(("scrapy", "nginx")) for w in only) or (
        "variants" in only and args.variant_sites != "latency")
    nginx = NginxSite(args.pages_map, work) if needs_nginx else None
    latency = LatencySite(args.pages_map, work, args.latency)
    rounds: list[tuple[list[Result], dict]] = []
    extra = args.crawl_args.split()
    try:
        for number in range(args.rounds):
            # Every other round in the opposite order, so that no crawler always goes first.
            order = only if number % 2 == 0 else only[::-1]
            results: list[Result] = []
            peers: dict = {}
            rounds.append((results, peers))
            args.round = number
            if args.rounds > 1:
                print(f"\nround {number + 1} of {args.rounds}: {','.join(order)}", flush=True)
            for what in order:
                for r in run_one(what, nginx, latency, work, args, extra, peers):
                    results.append(r)
                    print(table([r], peers), flush=True)
    finally:
        if nginx is not None:
            nginx.stop()
        latency.stop()
    print(f"\n{header}; site {args.pages} pages, {args.page_bytes} bytes each; "
          f"latency site {args.latency * 1000:.0f} ms per response\n")
    for number, (results, peers) in enumerate(rounds, 1):
        if args.rounds > 1:
            print(f"\nround {number}:")
        print(table(results, peers))
    summary = target_table(rounds, args.host_cpu)
    if summary:
        print("\n" + summary)
    ceilings = ceiling_table(rounds)
    if ceilings:
        print("\n" + ceilings)
    shutil.rmtree(work, ignore_errors=True)
    results = [r for round_results, _ in rounds for r in round_results]
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
