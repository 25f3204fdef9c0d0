"""The crawl benchmark: our crawler against Scrapy, scrapy-redis and Crawlee, same site, same run.

    .venv/bin/python -m bench.suite [--pages 5000] [--peer-pages 2000] [--latency 0.05]
                                    [--only nginx-default,latency-default,...,chaos]
                                    [--profile DIR] [--rounds N] [--sample]

One run, in this order, so every figure is taken under the same machine load:

1. installs Scrapy, scrapy-redis, py-spy and uvloop into ``bench/.venv-peers`` if they are not
   there, and (with ``crawlee`` in ``--only``) Crawlee into ``bench/.venv-crawlee``;
2. generates a site with ``distscrape_celery.testing.sitegen`` (``--pages`` pages of about 6 KB, robots.txt
   allowing everything) and serves it on 127.0.0.1 twice: from static files by nginx (a child
   process with its own config; ``apt-get install nginx-light`` if it is missing) and by
   ``bench/latency_site.py`` (asyncio on uvloop, the peers' Python), which answers every request
   after ``--latency`` seconds;
3. crawls, each crawl bounded by ``--timeout`` seconds: Scrapy (a CrawlSpider, 1 process, 64
   concurrent requests), scrapy-redis (2 processes, its own throwaway redis-server) and Crawlee
   (a ParselCrawler, 1 process, 64 concurrent requests, storage in memory) for ``--peer-pages``
   pages; ``distscrape crawl`` with the README's defaults and the README's
   multi-worker command (``celery multi start`` of two ``-P threads -c 32`` workers per core,
   then ``distscrape seed``) for the whole site; the scale-out runs (1, 2, 4 README workers)
   against the latency site; with ``--only scale-hosts`` (``bench.sim_hosts``), the same
   with each worker a simulated host, in a CPU cgroup capped at ``--host-cpu`` of a core.

With ``chaos`` in ``--only``, first of all the chaos run (``bench.chaos``, its options in
``--chaos-args``): the same crawl undisturbed and under SIGKILLs, a Redis restart and a cut-off;
it fails the suite if a page is lost.

Figures per crawl: pages/s as the site saw it (requests in its access log, first to last), CPU
ms per page of the crawler's processes (rusage of every process, start-up included, without
Redis; for workers that ``celery multi`` detached, their CPU from /proc before they are
stopped), the same without the start-up (less the CPU all its processes had spent when the site
received its first request, ``bench.probes.StartupCpu``), Redis round trips, commands and CPU
per page (``INFO`` deltas: requests read from clients, each pipeline or script once; every
command, those a script runs included; CPU). Our politeness limits are set high
(``--per-domain-concurrency 256``, or ``--per-domain N``); robots.txt is fetched and obeyed (it allows everything); the
peers neither fetch it nor limit a site below their 64 requests in flight.
Network: 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional

from bench import chaos
from bench.cgroups import CgroupError, HostCgroups
from bench.crawl_command import crawl_default
from bench.crawlee_peer import crawl_crawlee, ensure_crawlee
from bench.helpers import machine, unwind_on_sigterm
from bench.peers import crawl_scrapy, crawl_scrapy_redis, ensure_peers
from bench.probes import Result
from bench.report import ceiling_table, table, target_table
from bench.sites import LatencySite, NginxSite, Site, site_pages
from bench.worker_crawl import README_WORKER_ARGS, crawl_hosts, crawl_workers


ALL = ["scrapy", "scrapy-redis", "crawlee", "nginx-default", "nginx-workers", "latency-default",
       "latency-workers", "scale", "variants"]
# Not in ALL either: scale-hosts (bench.sim_hosts), which needs root and a cgroup cpu
# controller; chaos (bench.chaos), which takes minutes of its own.
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
    if what.startswith(("scrapy", "crawlee")):
        where, kind = "nginx", what
    else:
        where, _, kind = what.partition("-")
    site = nginx if where == "nginx" else latency
    name = "nginx" if where == "nginx" else "latency"
    if kind == "scrapy":
        r = crawl_scrapy(site, name, work, args)
    elif kind == "scrapy-redis":
        r = crawl_scrapy_redis(site, name, work, args)
    elif kind == "crawlee":
        r = crawl_crawlee(site, name, work, args)
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
    if kind.startswith(("scrapy", "crawlee")):
        peers[(kind, name)] = r
    return [r]


def parser() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_argument("--pages", type=int, default=5000)
    options.add_argument("--page-bytes", type=int, default=6000)
    options.add_argument("--peer-pages", type=int, default=2000)
    options.add_argument("--scale-pages", type=int, default=1500)
    options.add_argument("--scale-args", default=" ".join(README_WORKER_ARGS),
                         help="celery worker options of each scale-out worker (default: the "
                              "README's)")
    options.add_argument("--host-cpu", type=float, default=0.3,
                         help="scale-hosts: each simulated host's share of a core")
    options.add_argument("--latency", type=float, default=0.05)
    options.add_argument("--per-domain", type=int, metavar="N",
                         help="requests in flight to the site for our crawls (default 256; the "
                         "peers keep 64)")
    options.add_argument("--timeout", type=float, default=150.0, help="seconds per crawl at most")
    options.add_argument("--only", default=",".join(ALL),
                         help=f"some of {','.join(ALL)}; also nginx-polite, latency-polite, "
                         "scale-hosts (1, 2, 4 workers each in a CPU cgroup of --host-cpu of a "
                         "core: needs root), nginx-baseline, latency-baseline, chaos (bench.chaos, "
                         "first of all)")
    options.add_argument("--sample", action="store_true",
                         help="README workers' crawls: poll the tracker every 30 ms and report the "
                         "items in flight and the broker's queues (slows the driver a little)")
    options.add_argument("--rounds", type=int, default=1,
                         help="run --only this many times, every other round in reverse order; "
                         "each round's ratios use that round's crawls, and a last table gives "
                         "each target in every round and its median")
    options.add_argument("--profile", metavar="DIR",
                         help="record `distscrape crawl` with py-spy --gil (collapsed stacks into "
                         "DIR)")
    options.add_argument("--variant", action="append", default=[], metavar="N|OPTIONS|ENV",
                         help="with --only ...,variants: N celery workers started with OPTIONS "
                         "(e.g. '2|-P threads -c 16|DISTSCRAPE_BROKER_ACK_EMULATION=False'), "
                         "run against each site named in --variant-sites; repeatable")
    options.add_argument("--variant-sites", default="nginx", help="nginx, latency or both")
    options.add_argument("--baseline", metavar="DIR",
                         help="for nginx-baseline and latency-baseline: run `distscrape crawl` "
                         "with the distscrape_celery package in DIR (another version, same run); "
                         "run the suite from outside the source tree, or the crawl's `python -m "
                         "celery` workers import the tree in the current directory instead")
    options.add_argument("--crawl-args", default="",
                         help="extra options for `distscrape crawl` (to compare settings)")
    options.add_argument("--chaos-args", default="",
                         help="with chaos in --only: options of bench.chaos (e.g. '--pages 1000')")
    return options


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(argv)
    unwind_on_sigterm()
    only = args.only.split(",")
    chaos_args = chaos.parser().parse_args(shlex.split(args.chaos_args))
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
    safe = True
    if "chaos" in only:
        # First: it forks its site's server before this process has threads or connections.
        only.remove("chaos")
        results = chaos.chaos_run(chaos_args)
        chaos.print_reports(results)
        safe = all(r["lost"] == 0 and r["finished"] for r in results)
    if not only:
        return 0 if safe else 1
    rounds = crawl_rounds(args, only)
    print(f"\n{header}; site {args.pages} pages, {args.page_bytes} bytes each; "
          f"latency site {args.latency * 1000:.0f} ms per response\n")
    for number, (results, peers) in enumerate(rounds, 1):
        if args.rounds > 1:
            print(f"\nround {number}:")
        print(table(results, peers))
    for summary in (target_table(rounds, args.host_cpu), ceiling_table(rounds)):
        if summary:
            print("\n" + summary)
    every = [r for round_results, _ in rounds for r in round_results]
    return 0 if safe and all(r.ok for r in every) else 1


def crawl_rounds(args, only: list[str]) -> list[tuple[list[Result], dict]]:
    """The crawls of ``only``, ``--rounds`` times, every other round in reverse order; each
    round's results and peers, each result printed as it comes."""
    ensure_peers()  # the latency site runs on their Python too
    if "crawlee" in only:
        ensure_crawlee()
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    args.pages_map = site_pages(args.pages, args.page_bytes)
    work = Path(tempfile.mkdtemp(prefix="distscrape-suite-"))
    # nginx only for the crawls of it (the scale-out ones use the 50 ms site alone).
    needs_nginx = any(w.startswith(("scrapy", "crawlee", "nginx")) for w in only) or (
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
                for result in run_one(what, nginx, latency, work, args, extra, peers):
                    results.append(result)
                    print(table([result], peers), flush=True)
    finally:
        if nginx is not None:
            nginx.stop()
        latency.stop()
    shutil.rmtree(work, ignore_errors=True)
    return rounds


if __name__ == "__main__":
    sys.exit(main())
