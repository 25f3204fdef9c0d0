"""Throughput and cost per page of a real distributed crawl on this machine, per worker layout.

    .venv/bin/python -m bench.bench_crawl [--pages 1000] [--page-bytes 6000]
                                          [--configs prefork:1x4,solo:2x1,threads:1x8]
                                          [--delay 0]

One run does everything, so the configurations are compared under the same machine load:

1. generates a site with ``distscrape_celery.testing.sitegen`` (pages padded to about
   ``--page-bytes``) and serves it on 127.0.0.1 with ``SiteServer``, by default in a forked child process so that the test
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
import contextlib
import datetime
import json
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from bench.crawl_report import Result, machine_info, print_report
from bench.helpers import CLK_TCK, ServedSite, group_cpu, machine_ticks, own_cpu, self_cpu
from bench.redis_monitor import (MonitorCounter, own_redis_addresses, redis_diff, redis_snapshot,
                                 script_names)
from distscrape_celery.testing.sitegen import Site, generate_site

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
