"""The peers: Scrapy (one process) and scrapy-redis (processes sharing a throwaway Redis) crawl a
site with ``bench/peer_spider.py``, from their own virtualenv (``bench/.venv-peers``, made here
with Scrapy, scrapy-redis, py-spy and uvloop if it is missing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

from bench.helpers import BENCH, PEERS, clean_env, stop_process
from bench.probes import RUNS, Result, StartupCpu, ThrowawayRedis, run_measured, site_figures
from bench.sites import Site

PEER_PACKAGES = ["scrapy", "scrapy-redis", "py-spy", "uvloop"]
SPIDER = BENCH / "peer_spider.py"

# The peers' settings (a crawl may override some): 64 requests in flight, as many to one site.
PEER_SETTINGS = {
    "CONCURRENT_REQUESTS": 64, "CONCURRENT_REQUESTS_PER_DOMAIN": 64,
    "CONCURRENT_REQUESTS_PER_IP": 0, "ROBOTSTXT_OBEY": False, "LOG_LEVEL": "WARNING",
    "TELNETCONSOLE_ENABLED": False, "COOKIES_ENABLED": False,
    "REQUEST_FINGERPRINTER_IMPLEMENTATION": "2.7",
}


def write_spider(path: Path, site: Site, settings: dict, redis_key: str = "") -> str:
    """The configuration of ``bench/peer_spider.py`` for ``site``'s hosts, into ``path`` (JSON):
    a CrawlSpider (a RedisCrawlSpider reading ``redis_key``, if given) with PEER_SETTINGS
    overridden by ``settings``; returns its label."""
    merged = {**PEER_SETTINGS, **settings}
    domains = sorted({urlsplit(url).hostname for url in site.seeds})
    path.write_text(json.dumps({
        "domains": domains, "settings": merged,
        **({"redis_key": redis_key} if redis_key else {"start_urls": site.seeds})}))
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
    out = work / f"scrapy-out-{next(RUNS)}"
    out.mkdir()
    config = work / "scrapy_spider.json"
    label = write_spider(config, site, settings or {})
    env = dict(clean_env(), BENCH_OUT=str(out), BENCH_SPIDER=str(config))
    # Scrapy installs its reactor before it reads the spider's settings: that one goes here.
    reactor = [f"TWISTED_REACTOR={settings['TWISTED_REACTOR']}"] if settings and (
        "TWISTED_REACTOR" in settings) else []
    mark = site.mark()
    startup = StartupCpu(site, mark)
    status, wall, cpu, _ = run_measured(
        [str(PEERS / "bin" / "scrapy"), "runspider", str(SPIDER),
         "-s", f"CLOSESPIDER_PAGECOUNT={args.peer_pages}", *(["-s", *reactor] if reactor else [])],
        env, args.timeout, work / "scrapy.log", startup=startup)
    r = Result(f"Scrapy CrawlSpider, 1 process x {label}", site_name, wall=wall, cpu=cpu,
               startup_cpu=startup.seconds(), ok=status == 0)
    site_figures(r, site, mark)
    r.note = f"{r.pages - r.distinct} fetched twice"
    return r


def crawl_scrapy_redis(site: Site, site_name: str, work: Path, args,
                       settings: Optional[dict] = None, processes: int = 2) -> Result:
    """scrapy-redis, ``processes`` processes sharing a throwaway Redis, as crawl_scrapy (each
    process stops at its share of ``--peer-pages``)."""
    out = work / f"scrapy-redis-out-{next(RUNS)}"
    out.mkdir()
    config = work / "scrapy_redis_spider.json"
    label = write_spider(config, site, settings or {}, redis_key="bench:start_urls")
    server = ThrowawayRedis(work, f"scrapy-redis-redis-{next(RUNS)}")
    server.probe.client.lpush("bench:start_urls", *site.seeds)
    env = dict(clean_env(), BENCH_OUT=str(out), BENCH_SPIDER=str(config))
    settings = ["-s", "SCHEDULER=scrapy_redis.scheduler.Scheduler",
                "-s", "DUPEFILTER_CLASS=scrapy_redis.dupefilter.RFPDupeFilter",
                "-s", f"REDIS_URL={server.url}", "-s", "MAX_IDLE_TIME_BEFORE_CLOSE=3",
                # The first process to stop must not flush the queue and the dupefilter.
                "-s", "SCHEDULER_PERSIST=True",
                "-s", f"CLOSESPIDER_PAGECOUNT={args.peer_pages // processes}"]
    mark = site.mark()
    started = time.monotonic()
    procs: list[subprocess.Popen] = []
    cpu, ok = 0.0, True
    startup = StartupCpu(site, mark)
    startup.watch(lambda: [proc.pid for proc in procs])
    try:
        for i in range(processes):
            with (work / f"scrapy-redis-{i}.log").open("ab") as log:
                procs.append(subprocess.Popen(
                    [str(PEERS / "bin" / "scrapy"), "runspider", str(SPIDER), *settings],
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
        startup.stop()
        server.stop()
    wall = time.monotonic() - started
    cmds, rcpu, reads = server.probe.delta()
    r = Result(f"scrapy-redis, {processes} processes x {label}", site_name, wall=wall, cpu=cpu,
               startup_cpu=startup.seconds(), redis_cmds=cmds, redis_reads=reads,
               redis_cpu=rcpu, ok=ok)
    r.redis_scripts = server.probe.scripts()
    site_figures(r, site, mark)
    r.note = f"{r.pages - r.distinct} fetched twice"
    return r
