"""Redis commands and CPU a page, command by command, tracker and broker apart.

    .venv/bin/python -m bench.bench_redis_cpu [--pages 3000] [--modes crawl,workers]
                                              [--rounds 1] [--trace] [--baseline DIR]
                                              [--idle 10] [--top 30]

Serves a generated site by nginx on 127.0.0.1 (as ``bench.suite`` does) and crawls it whole with
``distscrape crawl`` (``crawl``: its embedded Redis) and with the README's workers (``workers``:
``celery multi start`` of two ``-P threads -c 32`` workers and ``distscrape seed``, on a
throwaway Redis; ``split``: the same with ``DISTSCRAPE_BROKER_URL`` naming a second Redis, whose
figures, from before the workers start to after they stop, are given apart), limits set high. For each crawl it prints Redis's CPU (``used_cpu_user`` +
``used_cpu_sys``), commands and round trips a page, and ``INFO commandstats`` per page: calls
and microseconds of each command. A command a Lua script runs is counted on its own there, and
its time is in the script's ``evalsha`` too.

``--trace`` also logs every command (SLOWLOG at threshold 0, drained every 0.25 s), to split
``evalsha`` and ``fcall`` by tracker script (each script's SHA1 computed from the package's ``lua/`` files) and
the rest by what it is: the broker's queues, its unacked bookkeeping, event and remote-control
``PUBLISH``, the tracker's plain commands. The log costs Redis CPU of its own (about a tenth):
compare Redis CPU between crawls traced alike only.

``--baseline DIR`` crawls with another checkout's package too (``PYTHONPATH=DIR``), in the same
run, alternating, for before/after ratios. ``--idle S`` measures idle workers: Redis CPU and
commands a second for S seconds, with ``--idle-workers`` of ``distscrape crawl``'s workers
(``worker.main``, gossip and mingle off), of the README's (``celery worker``, all on), and of the
README's with ``--without-gossip --without-mingle``, nothing to do; and with no worker (Redis's
own timers and the bench's INFO).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

from bench.crawl_command import crawl_default
from bench.helpers import BIN, ROOT, clean_env, unwind_on_sigterm
from bench.probes import RedisProbe, Result, ThrowawayRedis
from bench.sites import NginxSite, site_pages
from bench.worker_crawl import crawl_workers
QUEUES = (b"distscrape.scrape", b"distscrape.save")
PROBE_COMMANDS = {b"info", b"slowlog", b"config"}


# Asked of each checkout's own scripts module, so that the texts are the ones Redis runs there
# (an item script with the library first; the batch script, or in older checkouts the batch
# forms NAME_many).
_SHAS = """
import hashlib, json, pathlib
from distscrape_celery.tracker.redis import scripts
names = [p.stem for p in pathlib.Path(scripts.__file__).with_name("lua").glob("*.lua")]
if not hasattr(scripts, "BATCH"):
    names += [n + "_many" for n in getattr(scripts, "BATCH_SCRIPTS", ())]
names += [n for n in [getattr(scripts, "BATCH", None)] if n]
print(json.dumps({hashlib.sha1(scripts.source(n).encode()).hexdigest(): n for n in names}))
"""


def script_names(*roots: Path) -> dict[bytes, str]:
    """SHA1 (hex, as EVALSHA sends it) of each tracker script of each checkout, to its name. An
    item script is ``_lib.lua`` and its own file; both forms are listed for every file, and the
    batch forms as their checkout builds them."""
    names: dict[bytes, str] = {}
    for root in roots:
        lua = root / "distscrape_celery" / "tracker" / "redis" / "lua"
        if not lua.is_dir():
            continue
        lib = (lua / "_lib.lua").read_text("utf-8") if (lua / "_lib.lua").exists() else ""
        for path in lua.glob("*.lua"):
            source = path.read_text("utf-8")
            for text in (source, lib + "\n" + source):
                names[hashlib.sha1(text.encode()).hexdigest().encode()] = path.stem
        asked = subprocess.run([sys.executable, "-c", _SHAS], cwd=root, capture_output=True,
                               text=True, env={**os.environ, "PYTHONPATH": str(root)})
        if asked.returncode == 0:
            names.update({sha.encode(): name for sha, name in json.loads(asked.stdout).items()})
    return names


def classifier(shas: dict[bytes, str]):
    """A label for each logged command: ``script NAME``, ``in scripts: CMD`` (run by a script:
    its time is also the script's), ``broker: ...``, ``tracker: CMD``, ``bench: CMD``."""

    def label(args: list[bytes], addr) -> str:
        cmd = args[0].lower()
        name = cmd.decode(errors="replace")
        key = args[1] if len(args) > 1 else b""
        if addr in (b"?:0", "?:0"):
            return f"in scripts: {name}"
        if cmd in (b"evalsha", b"eval"):
            script = shas.get(key.lower(), f"? {key[:8].decode(errors='replace')}")
            return f"tracker script: {script}"
        if cmd == b"fcall":  # the function library: distscrape_<hash>_NAME
            return f"tracker script: {key.decode(errors='replace')[len('distscrape_') + 17:]}"
        if cmd in PROBE_COMMANDS:
            return f"bench: {name}"
        if cmd in (b"brpop", b"blmpop"):
            return f"broker: {name} (consume)"
        if any(key.startswith(q) for q in QUEUES):
            return f"broker: {name} (queue)"
        if key.startswith(b"unacked"):
            return f"broker: {name} (unacked)"
        if key.startswith(b"_kombu"):
            return f"broker: {name} (bindings)"
        if cmd == b"publish":
            channel = key.decode(errors="replace")
            kind = ("events" if "celeryev" in channel else "pidbox" if "pidbox" in channel
                    else channel)
            return f"broker: publish ({kind})"
        if cmd in (b"subscribe", b"psubscribe", b"unsubscribe", b"punsubscribe"):
            return f"broker: {name}"
        if cmd in (b"client", b"hello", b"auth", b"ping", b"select", b"multi", b"exec"):
            return f"connections: {name}"
        return f"tracker: {name}"

    return label


def commandstats_table(results: list[tuple[str, Result]], top: int) -> str:
    """INFO commandstats per page, side by side: calls and microseconds a page."""
    per = [(label, {k: (c / r.pages, u / r.pages) for k, (c, u) in
                    r.redis_probe.command_delta().items()}) for label, r in results if r.pages]
    if not per:
        return ""
    order = sorted({k for _, d in per for k in d}, key=lambda k: -max(d.get(k, (0, 0))[1]
                                                                       for _, d in per))
    head = " | ".join(f"{label}: calls / µs a page" for label, _ in per)
    lines = [f"| command | {head} |", "|---" * (len(per) + 1) + "|"]
    for k in order[:top]:
        cells = " | ".join(f"{d.get(k, (0, 0))[0]:.2f} / {d.get(k, (0, 0))[1]:.1f}"
                           for _, d in per)
        lines.append(f"| {k} | {cells} |")
    return "\n".join(lines)


def traced_table(results: list[tuple[str, Result]], top: int) -> str:
    per = [(label, {k: (c / r.pages, u / r.pages) for k, (c, u) in
                    r.redis_probe.traced.items()}) for label, r in results
           if r.pages and r.redis_probe.traced]
    if not per:
        return ""
    groups = {}
    for _, d in per:
        for k in d:
            groups.setdefault(k.split(":")[0], set()).add(k)
    lines = [f"| what | {' | '.join(f'{label}: calls / µs a page' for label, _ in per)} |",
             "|---" * (len(per) + 1) + "|"]
    for group in sorted(groups, key=lambda g: -max(sum(d.get(k, (0, 0))[1] for k in groups[g])
                                                   for _, d in per)):
        sums = " | ".join(
            f"**{sum(d.get(k, (0, 0))[0] for k in groups[group]):.2f} / "
            f"{sum(d.get(k, (0, 0))[1] for k in groups[group]):.1f}**" for _, d in per)
        lines.append(f"| **{group}** | {sums} |")
        keys = sorted(groups[group], key=lambda k: -max(d.get(k, (0, 0))[1] for _, d in per))
        for k in keys[:top]:
            cells = " | ".join(f"{d.get(k, (0, 0))[0]:.2f} / {d.get(k, (0, 0))[1]:.1f}"
                               for _, d in per)
            lines.append(f"| {k} | {cells} |")
    return "\n".join(lines)


def summary_line(label: str, r: Result) -> str:
    cmds, cpu, reads = r.redis_probe.delta() if r.redis_probe else (0, 0, 0)
    stats = r.redis_probe.command_delta() if r.redis_probe else {}
    bench_usec = sum(u for k, (_, u) in stats.items()
                     if k.split("|")[0].encode() in PROBE_COMMANDS)
    cpu_net = cpu - bench_usec / 1e6  # the probe's own INFO and SLOWLOG taken out
    ms = 1000 * r.per_page(cpu_net)
    if r.redis_probe is not None and r.redis_probe.trace is not None:
        label += " (traced: CPU not comparable)"
    return (f"| {label} | {r.pages} | {r.rate:.0f} | {ms:.3f} | "
            f"{1000 / ms if ms else 0:.0f} | {r.per_page(cmds):.1f} | {r.per_page(reads):.2f} | "
            f"{'ok' if r.ok else 'FAILED'} |")


SUMMARY_HEAD = ("| crawl | pages | pages/s | Redis CPU ms a page | pages/s a Redis core "
                "| commands a page | round trips a page | |\n|---|---|---|---|---|---|---|---|")


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def idle_workers(work: Path, args, launch: str, code: Optional[str]) -> tuple[str, RedisProbe]:
    """``--idle`` seconds of ``--idle-workers`` idle workers started as ``launch`` says, on a
    throwaway Redis: the probe over that time."""
    server = ThrowawayRedis(work, f"idle-{launch}-{time.monotonic_ns()}")
    env = dict(clean_env(), DISTSCRAPE_REDIS_URL=server.url,
               **({"PYTHONPATH": code} if code else {}))
    queues = ["-Q", "distscrape.scrape,distscrape.save", "-P", "threads", "-c", "16",
              "--loglevel", "WARNING"]
    if launch == "worker.main":
        base = [str(BIN / "python"), "-m", "distscrape_celery.worker.main", *queues,
                "--without-gossip", "--without-mingle"]
    else:
        base = [str(BIN / "celery"), "-A", "distscrape_celery", "worker", *queues,
                *launch.split()[2:]]
    count = 0 if launch == "no workers" else args.idle_workers
    procs = [subprocess.Popen([*base, "-n", f"idle{i}@%h"], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for i in range(count)]
    try:
        from distscrape_celery.settings import Settings
        from distscrape_celery.tracker import RedisTracker
        tracker = RedisTracker.from_settings(Settings(redis_url=server.url))
        deadline = time.monotonic() + 60
        while sum(1 for w in tracker.workers() if w.alive) < count:
            if time.monotonic() > deadline:
                raise RuntimeError("idle workers did not come up")
            time.sleep(0.2)
        time.sleep(3)  # past start-up (mingle's wait among it)
        server.probe.start = {}
        server.probe.sample()
        end = time.monotonic() + args.idle
        while time.monotonic() < end:
            time.sleep(0.25)
            server.probe.sample()
        probe = copy.copy(server.probe)  # not the workers' stopping, which stop() samples
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        server.stop()
    return launch, probe


def idle_report(runs: list[tuple[str, RedisProbe]], seconds: float, workers: int) -> str:
    lines = ["| idle workers (-c 16 each) | Redis CPU ms a second | commands a second | "
             "the commands (a second) |", "|---|---|---|---|"]
    for label, probe in runs:
        cmds, cpu, _ = probe.delta()
        stats = probe.command_delta()
        bench_usec = sum(u for k, (_, u) in stats.items()
                         if k.split("|")[0].encode() in PROBE_COMMANDS)
        own = {k: c for k, (c, _) in stats.items()
               if k.split("|")[0].encode() not in PROBE_COMMANDS}
        probe_calls = sum(c for k, (c, _) in stats.items() if k not in own)
        top = ", ".join(f"{k} {c / seconds:.1f}" for k, c in
                        sorted(own.items(), key=lambda kv: -kv[1])[:8])
        lines.append(f"| {label} | {1000 * (cpu - bench_usec / 1e6) / seconds:.2f} | "
                     f"{(cmds - probe_calls) / seconds:.1f} | {top} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--page-bytes", type=int, default=6000)
    parser.add_argument("--modes", default="crawl,workers", help="crawl, workers, split")
    parser.add_argument("--workers", type=int, default=2, help="README workers in `workers`")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--trace", action="store_true", help="split by script and by key")
    parser.add_argument("--baseline", metavar="DIR", help="another checkout, crawled alike")
    parser.add_argument("--idle", type=float, default=0, help="seconds of idle workers")
    parser.add_argument("--idle-workers", type=int, default=4, help="workers in --idle")
    parser.add_argument("--top", type=int, default=30, help="rows of each table at most")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    args.profile = None  # what suite's crawls read
    args.sample = False
    modes = [m for m in args.modes.split(",") if m]
    codes = [("this", None)] + ([("baseline", args.baseline)] if args.baseline else [])
    if args.trace:
        roots = [ROOT] + ([Path(args.baseline)] if args.baseline else [])
        RedisProbe.trace_default = classifier(script_names(*roots))
    unwind_on_sigterm()
    work = Path(tempfile.mkdtemp(prefix="bench-redis-cpu-"))
    print(f"load average before: {load()}", flush=True)
    site = NginxSite(site_pages(args.pages, args.page_bytes), work)
    results: list[tuple[str, Result]] = []
    idle: list[tuple[str, RedisProbe]] = []
    try:
        for n in range(args.rounds):
            order = codes if n % 2 == 0 else codes[::-1]
            for mode in modes:
                for code, path in order:
                    label = f"{mode}, {code}" + (f" #{n + 1}" if args.rounds > 1 else "")
                    if mode == "crawl":
                        r = crawl_default(site, "nginx", work, SimpleNamespace(
                            **{**vars(args), "baseline": path}), baseline=path is not None)
                    elif mode == "workers":
                        r = crawl_workers(site, "nginx", work, args, args.workers,
                                          worker_env={"PYTHONPATH": path} if path else None)
                    else:  # split: the broker on a Redis of its own
                        broker = ThrowawayRedis(work, f"broker-{time.monotonic_ns()}")
                        try:
                            broker.probe.sample()
                            r = crawl_workers(site, "nginx", work, args, args.workers, worker_env={
                                "DISTSCRAPE_BROKER_URL": broker.url,
                                **({"PYTHONPATH": path} if path else {})})
                        finally:
                            broker.stop()
                        broker_result = Result(r.name, r.site, pages=r.pages, seconds=r.seconds,
                                               ok=r.ok, redis_probe=broker.probe)
                        results.append((f"{label}: the broker's Redis", broker_result))
                        label += ": the tracker's Redis"
                    results.append((label, r))
                    print(f"{label}: {r.pages} pages, {r.rate:.0f} pages/s, load {load()}",
                          flush=True)
            if args.idle:
                idle.append(idle_workers(work, args, "no workers", None))
                for launch in ("worker.main", "celery worker",
                               "celery worker --without-gossip --without-mingle"):
                    for code, path in order:
                        idle.append(idle_workers(work, args, launch, path))
                        idle[-1] = (f"{launch}, {code}", idle[-1][1])
    finally:
        site.stop()
    print(f"load average after: {load()}\n")
    print(SUMMARY_HEAD)
    for label, r in results:
        print(summary_line(label, r))
    print("\nRedis CPU a page: used_cpu_user + used_cpu_sys, the bench's own INFO/SLOWLOG "
          "commands taken out.\n")
    for mode in modes:
        of_mode = [(label, r) for label, r in results if label.startswith(mode + ",")]
        if mode == "split":  # the tracker's commands are those of `workers`
            of_mode = [(label, r) for label, r in of_mode if "broker" in label]
        print(f"INFO commandstats, {mode}:\n\n{commandstats_table(of_mode, args.top)}\n")
        if args.trace:
            print(f"By script and key, {mode}:\n\n{traced_table(of_mode, args.top)}\n")
    if idle:
        print(f"{args.idle_workers} idle workers, {args.idle:g} s:\n")
        print(idle_report(idle, args.idle, args.idle_workers))
    return 0 if all(r.ok for _, r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
