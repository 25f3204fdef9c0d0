"""The crawl benchmark's report (``bench.bench_crawl``): the machine, a row a worker layout, the
ratios to the first, Redis commands by name, the checks, and the MONITOR run."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from dataclasses import dataclass, field
from typing import Any, Optional

from bench.helpers import ROOT


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
