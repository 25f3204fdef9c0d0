"""The broad-crawl benchmark: many slow hosts at once, at most 8 requests in flight to each.

    .venv/bin/python -m bench.broad [--hosts 40] [--pages 150] [--min-delay 0.1] [--max-delay 1]
                                    [--only crawl,crawl-256,workers,scrapy,scrapy-redis]
                                    [--timeout 180]

One run, so that every figure is taken under the same machine load:

1. generates ``--hosts`` sites of ``--pages`` pages each with ``distscrape_celery.testing.sitegen``
   (robots.txt allowing everything, no Crawl-delay; off-site links only to names under ``.invalid``), adds to
   every page ``--cross-links`` links to pages of other hosts, and serves each on its own
   loopback address (127.0.0.10, 127.0.0.11, ...: distinct hosts on Linux), one port for all, by
   one ``bench/latency_site.py`` process. Host number i answers after
   ``min-delay * (max-delay / min-delay) ** (i / (hosts - 1))`` seconds (100 ms to 1 s by
   default), the delays dealt to the addresses in a fixed shuffled order;
2. crawls it from every host's root page, each crawl bounded by ``--timeout`` seconds, with the
   default politeness of 8 requests in flight to a host for every crawler: ``distscrape crawl``
   with its defaults (``crawl``); the same with ``--concurrency 256`` (``crawl-256``); the
   many-host workers of docs/deployment.md (``celery multi start`` of two ``-P threads -c 32``
   workers per core, then ``distscrape seed``: ``workers``); Scrapy, one process with
   CONCURRENT_REQUESTS_PER_DOMAIN=8 and CONCURRENT_REQUESTS=``--scrapy-concurrency`` (default
   hosts x 8), robots.txt obeyed (``scrapy``); scrapy-redis, ``--scrapy-redis-processes``
   processes sharing its Redis, each with 8 / processes a domain (scrapy-redis has no per-domain
   limit across processes, so this keeps its hosts at 8 too) and its share of the total
   (``scrapy-redis``).

Figures per crawl: pages/s and the seconds from the first page to the last, as the site saw them
(its access log, robots.txt left out); those seconds against the politeness floor, the slowest
host's pages / 8 x its delay (a crawl cannot end sooner; its robots.txt and the depth of its
links add a round trip or a few); CPU ms per page of the crawler's processes (rusage, start-up
included, Redis not); Redis CPU ms per page (``INFO`` used_cpu_sys + used_cpu_user, before and
after); site CPU ms per page (the server's processes); the CPU-bound seconds, the crawler's,
Redis's and the site's CPU over the cores (all share them: the least wall time this machine
allows the crawl), and the first-to-last seconds against the larger of the floor and that bound
(``/ bound``: how near the crawl comes to what politeness and the machine allow); for the
slowest host, when its first page came (after the crawl's first) and the mean requests in flight
to it (pages x delay / the time from its first request to its last answer:
8 at best); and when the last host's first page came. Each crawler's processes, the site and
every Redis are stopped at the end, on Ctrl-C and on SIGTERM. Network: 127.0.0.0/8 only.
"""

from __future__ import annotations

import argparse
import atexit
import ipaddress
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.crawl_command import crawl_default
from bench.helpers import BENCH, BENCH_SETTINGS, PEERS, machine, unwind_on_sigterm, wait_port
from bench.latency_site import one_port
from bench.peers import crawl_scrapy, crawl_scrapy_redis, ensure_peers
from bench.probes import Result
from bench.sites import ROBOTS, Site
from bench.worker_crawl import crawl_workers
from distscrape_celery.testing.sitegen import generate_site

POLITENESS = 8  # requests in flight to one host: distscrape's default, set for every crawler
FIRST_ADDRESS = ipaddress.IPv4Address("127.0.0.10")
ALL = ["crawl", "crawl-256", "workers", "scrapy", "scrapy-twisted", "scrapy-redis"]
# Scrapy's asyncio reactor (its default) starts every request waiting in a site's slot at once
# when the slot frees (the downloader counts a request as transferring only once its task runs),
# which can exceed CONCURRENT_REQUESTS_PER_DOMAIN; the plain Twisted reactor keeps to it.
TWISTED = {"TWISTED_REACTOR": "twisted.internet.epollreactor.EPollReactor"}


@dataclass
class Host:
    address: str
    delay: float
    pages: dict[str, bytes]  # path -> body, robots.txt included


def host_delays(n: int, low: float, high: float) -> list[float]:
    """``n`` delays spread geometrically from ``low`` to ``high``, dealt in a fixed shuffled
    order (so that the seeds' order says nothing of their hosts' speed)."""
    delays = [high if n == 1 else low * (high / low) ** (i / (n - 1)) for i in range(n)]
    random.Random(0).shuffle(delays)
    return delays


def make_hosts(n_hosts: int, n_pages: int, page_bytes: int, cross: int, low: float, high: float,
               port: int) -> list[Host]:
    """The sites: each host's own generated site, every page with ``cross`` more links to
    pages of other hosts (absolute URLs, inserted at the end of its list of links)."""
    addresses = [str(FIRST_ADDRESS + i) for i in range(n_hosts)]
    sites = [generate_site(n_pages=n_pages, seed=i, page_padding=page_bytes - 400)
             for i in range(n_hosts)]
    paths = [sorted(site.reachable) for site in sites]
    hosts = []
    for i, (site, delay) in enumerate(zip(sites, host_delays(n_hosts, low, high))):
        rng = random.Random(1000 + i)
        pages = {}
        for path in paths[i]:
            links = []
            for _ in range(cross if n_hosts > 1 else 0):
                j = rng.choice([k for k in range(n_hosts) if k != i])
                links.append(f'    <li><a href="http://{addresses[j]}:{port}'
                             f'{rng.choice(paths[j])}">elsewhere</a></li>\n')
            pages[path] = site.pages[path].replace(b"\n</ul>", b"\n" + "".join(links).encode()
                                                   + b"</ul>", 1)
        pages["/robots.txt"] = ROBOTS
        hosts.append(Host(addresses[i], delay, pages))
    return hosts


class BroadSite(Site):
    """``latency_site.py --sites``: every host on its own loopback address, one port."""

    def __init__(self, args, workdir: Path) -> None:
        addresses = [str(FIRST_ADDRESS + i) for i in range(args.hosts)]
        port = one_port(addresses)
        self.hosts = make_hosts(args.hosts, args.pages, args.page_bytes, args.cross_links,
                                args.min_delay, args.max_delay, port)
        self.log = workdir / "broad-access.log"
        self._seeds = [f"http://{h.address}:{port}/" for h in self.hosts]
        self.url = self._seeds[0]
        self.delays = {h.address: h.delay for h in self.hosts}
        self.expected = sum(len(h.pages) - 1 for h in self.hosts)
        sites_file = workdir / "broad-sites.json"
        sites_file.write_text(json.dumps([
            {"address": h.address, "delay": h.delay,
             "pages": {p: b.decode("latin-1") for p, b in h.pages.items()}} for h in self.hosts]))
        self.proc = subprocess.Popen(
            [str(PEERS / "bin" / "python"), str(BENCH / "latency_site.py"),
             "--port", str(port), "--sites", str(sites_file), "--log", str(self.log)],
            start_new_session=True)
        try:
            for address in addresses:
                wait_port(port, host=address)
        except BaseException:
            self.stop()
            raise

    @property
    def seeds(self) -> list[str]:
        return self._seeds

    def arrival(self, fields: list[str]) -> float:
        # It logs when it answered: the host's delay and its lag (ms) after the request came.
        return float(fields[0]) - self.delays[fields[4]] - float(fields[3]) / 1000

    @property
    def floor(self) -> float:
        """Seconds no crawl at POLITENESS a host can beat: the slowest host's pages, 8 at a
        time, one delay each."""
        return max((len(h.pages) - 1) / POLITENESS * h.delay for h in self.hosts)

    def requests_since(self, offset: int) -> list[tuple[float, str]]:
        """Pages answered since ``offset`` (robots.txt left out), each named address + path."""
        return [(float(stamp), address + path)
                for stamp, path, _, _, address in self._lines_since(offset)
                if path != "/robots.txt"]

    def peak_in_flight(self, offset: int) -> int:
        """The most requests (robots.txt too) any one host held at once since ``offset``: each
        held from its arrival (answer time - delay - lag) to its answer."""
        delay = {h.address: h.delay for h in self.hosts}
        events: dict[str, list[tuple[float, int]]] = {}
        for stamp, _, _, lag, address in self._lines_since(offset):
            answered = float(stamp)
            arrived = answered - delay[address] - float(lag) / 1000
            # An answer sorts before an arrival of the same instant: the slot was free again.
            events.setdefault(address, []).extend([(arrived, 1), (answered, -1)])
        peak = 0
        for host_events in events.values():
            held = 0
            for _, step in sorted(host_events):
                held += step
                peak = max(peak, held)
        return peak

    def hosts_figures(self, offset: int, first: float) -> str:
        """When the slowest host's first page came and how many requests were in flight to it on
        average, and when the last host to start had its first page (seconds after ``first``)."""
        by_host: dict[str, list[float]] = {}
        for stamp, path, _, _, address in self._lines_since(offset):
            if path != "/robots.txt":
                by_host.setdefault(address, []).append(float(stamp))
        slow = max(self.hosts, key=lambda h: h.delay)
        times = sorted(by_host.get(slow.address, []))
        if not times:
            return "the slowest host: no page"
        busy = times[-1] - times[0] + slow.delay  # from its first request to its last answer
        last_start = max(min(t) for t in by_host.values())
        return (f"slowest host ({slow.delay * 1000:.0f} ms): first page at +{times[0] - first:.1f}"
                f" s, {len(times)} pages, mean {len(times) * slow.delay / busy:.1f} in flight; "
                f"last host's first page at +{last_start - first:.1f} s")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def run_one(what: str, site: BroadSite, work: Path, args) -> tuple[Result, int]:
    """One crawl of the site by ``what`` (one of ALL), with POLITENESS a host; its result and
    the most requests one host held at once."""
    mark = site.mark()
    if what == "crawl":
        r = crawl_default(site, "broad", work, args, polite=True)
        r.name = "distscrape crawl (defaults)"
    elif re.fullmatch(r"crawl-[0-9]+", what):
        n = what.partition("-")[2]
        r = crawl_default(site, "broad", work, args, ["--concurrency", n], polite=True)
        r.name = f"distscrape crawl --concurrency {n}"
    elif what == "workers":
        r = crawl_workers(site, "broad", work, args, 2 * (os.cpu_count() or 1), polite=True)
    elif re.fullmatch(r"workers-c[0-9]+", what):
        n = what.partition("-c")[2]
        r = crawl_workers(site, "broad", work, args, 2 * (os.cpu_count() or 1), polite=True,
                          worker_args=["-P", "threads", "-c", n])
    elif what in ("scrapy", "scrapy-twisted"):
        r = crawl_scrapy(site, "broad", work, args, {
            "CONCURRENT_REQUESTS": args.scrapy_concurrency,
            "CONCURRENT_REQUESTS_PER_DOMAIN": POLITENESS, "ROBOTSTXT_OBEY": True,
            **(TWISTED if what == "scrapy-twisted" else {})})
        r.name += ", Twisted reactor" if what == "scrapy-twisted" else ""
    elif what == "scrapy-redis":
        n = args.scrapy_redis_processes
        r = crawl_scrapy_redis(site, "broad", work, args, {
            "CONCURRENT_REQUESTS": max(1, args.scrapy_concurrency // n),
            "CONCURRENT_REQUESTS_PER_DOMAIN": max(1, POLITENESS // n), "ROBOTSTXT_OBEY": True},
            processes=n)
    else:
        raise SystemExit(f"--only: {what!r} is not one of {','.join(ALL)}, crawl-N, workers-cN")
    hits = site.requests_since(mark[0])
    if hits:
        r.timeline = site.hosts_figures(mark[0], hits[0][0])
    # Every page fetched (a peer fetches its start URLs twice: they bypass its dupefilter).
    r.ok = r.ok and r.distinct == site.expected
    return r, site.peak_in_flight(mark[0])


def cpu_bound(r: Result) -> float:
    """Seconds the crawl's CPU needs of this machine at the least: the crawler's, Redis's and the
    site server's CPU seconds over the cores. All three share the cores, so where this passes the
    floor, the machine, not politeness, bounds the crawl. The crawler's start-up is counted in,
    so it errs on the high side by a second or so of CPU."""
    return (r.cpu + r.redis_cpu + r.site_cpu) / (os.cpu_count() or 1)


def table(results: list[tuple[Result, int]], floor: float) -> str:
    rows = ["| crawler | pages | pages/s | first to last page, s | / floor | CPU-bound, s | "
            "/ bound | most in flight to a host | CPU ms/page | Redis CPU ms/page | "
            "site CPU ms/page | Redis scripts/page | command wall s | checks |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, peak in results:
        notes = "; ".join(filter(None, [r.note, r.timeline]))
        redis_cpu = f"{1000 * r.per_page(r.redis_cpu):.2f}" if r.redis_cpu else "-"
        scripts = f"{r.per_page(r.redis_scripts):.2f}" if r.redis_scripts else "-"
        bound = cpu_bound(r)
        rows.append(
            f"| {r.name} | {r.pages} | {r.rate:.0f} | {r.seconds:.1f} | "
            f"{r.seconds / floor:.2f} | {bound:.1f} | {r.seconds / max(floor, bound):.2f} | "
            f"{peak} | {1000 * r.per_page(r.cpu):.2f} | {redis_cpu} | "
            f"{1000 * r.per_page(r.site_cpu):.2f} | {scripts} | "
            f"{r.wall:.1f} | {'ok' if r.ok else 'FAILED'}{' (' + notes + ')' if notes else ''} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=40, help="sites, each its own address")
    parser.add_argument("--pages", type=int, default=150, help="pages of each site")
    parser.add_argument("--page-bytes", type=int, default=6000)
    parser.add_argument("--cross-links", type=int, default=3,
                        help="links from each page to pages of other hosts")
    parser.add_argument("--min-delay", type=float, default=0.1, help="the fastest host's delay, s")
    parser.add_argument("--max-delay", type=float, default=1.0, help="the slowest host's delay, s")
    parser.add_argument("--scrapy-concurrency", type=int,
                        help="Scrapy's CONCURRENT_REQUESTS, split over scrapy-redis's processes "
                             "(default: hosts x 8, every host at its limit)")
    parser.add_argument("--scrapy-redis-processes", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per crawl at most")
    parser.add_argument("--only", default=",".join(ALL),
                        help=f"some of {','.join(ALL)}; also crawl-N (`distscrape crawl "
                        "--concurrency N`) and workers-cN (the workers with -P threads -c N)")
    parser.add_argument("--dispatch-factor", type=float,
                        help="DISTSCRAPE_DISPATCH_FACTOR of our crawlers (default: theirs, 2)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument("--sample", action="store_true",
                        help="for the workers: poll the tracker every 30 ms and add the mean "
                             "items dispatched, leased and waiting for a save message")
    parser.add_argument("--profile", metavar="DIR",
                        help="record each `distscrape crawl` with py-spy into DIR (bench.stacks "
                             "sums a recording); CPU figures then include py-spy")
    args = parser.parse_args()
    if not 1 <= args.hosts <= 200 or args.pages < 2 or not 0 < args.min_delay <= args.max_delay:
        parser.error("--hosts 1 to 200, --pages at least 2, 0 < --min-delay <= --max-delay")
    args.scrapy_concurrency = args.scrapy_concurrency or args.hosts * POLITENESS
    if args.dispatch_factor:
        BENCH_SETTINGS["DISTSCRAPE_DISPATCH_FACTOR"] = str(args.dispatch_factor)
    # What the suite's crawl helpers read: the peers crawl the whole site.
    args.peer_pages = 0
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    unwind_on_sigterm()
    only = args.only.split(",")
    for what in only:
        if what not in ALL and not re.fullmatch(r"(crawl-|workers-c)[0-9]+", what):
            parser.error(f"--only: {what!r} is not one of {','.join(ALL)}")
    header = machine()
    print(header, flush=True)
    ensure_peers()  # the site runs on their Python (uvloop)
    work = Path(tempfile.mkdtemp(prefix="distscrape-broad-"))
    if args.keep:
        atexit.register(print, f"logs in {work}", file=sys.stderr)
    else:
        # At exit, not in a finally block: an interrupted workers' crawl stops its workers at exit
        # (bench.worker_crawl), by their pid files in this directory.
        atexit.register(shutil.rmtree, work, ignore_errors=True)
    results: list[tuple[Result, int]] = []
    site = BroadSite(args, work)
    try:
        delays = sorted(h.delay for h in site.hosts)
        print(f"{args.hosts} hosts x {args.pages} pages ({site.expected} in all), delays "
              f"{delays[0] * 1000:.0f} to {delays[-1] * 1000:.0f} ms, politeness floor "
              f"{site.floor:.1f} s", flush=True)
        for what in only:
            results.append(run_one(what, site, work, args))
            print(table(results[-1:], site.floor), flush=True)
    finally:
        site.stop()
    load = os.getloadavg()
    print(f"\n{header}; load average after the run {load[0]:.2f}\n{args.hosts} hosts x "
          f"{args.pages} pages of {args.page_bytes} bytes, {args.cross_links} links a page to "
          f"other hosts, delays {args.min_delay * 1000:.0f} to {args.max_delay * 1000:.0f} "
          f"ms; {POLITENESS} requests in flight a host; politeness floor {site.floor:.1f} s\n")
    print(table(results, site.floor))
    return 0 if all(r.ok for r, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
