"""The Crawlee peer: Crawlee for Python's ParselCrawler crawls a site with
``bench/crawlee_spider.py``, one process, from its own virtualenv (``bench/.venv-crawlee``, made
here with the pinned Crawlee if it is missing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.helpers import BENCH, CRAWLEE, clean_env
from bench.probes import RUNS, Result, StartupCpu, run_measured, site_figures
from bench.sites import Site

# Pinned, so that figures of different days are of the same Crawlee.
CRAWLEE_VERSION = "1.11.0"
SPIDER = BENCH / "crawlee_spider.py"
CONCURRENCY = 64  # requests in flight, as the Scrapy peers


def ensure_crawlee() -> None:
    """Make ``bench/.venv-crawlee`` with ``crawlee[parsel]`` at CRAWLEE_VERSION unless it is
    there."""
    if not any(CRAWLEE.glob(f"lib/python*/site-packages/crawlee-{CRAWLEE_VERSION}.dist-info")):
        print(f"installing Crawlee {CRAWLEE_VERSION} into bench/.venv-crawlee", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(CRAWLEE)], check=True)
        subprocess.run([str(CRAWLEE / "bin" / "pip"), "install", "-q",
                        f"crawlee[parsel]=={CRAWLEE_VERSION}"], check=True)


def crawl_crawlee(site: Site, site_name: str, work: Path, args) -> Result:
    """Crawlee, one process, CONCURRENCY requests in flight, for ``--peer-pages`` pages (0: the
    whole site); ok only if it fetched each of the pages it was asked for once and saved it."""
    out = work / f"crawlee-out-{next(RUNS)}"
    out.mkdir()
    env = dict(clean_env(), BENCH_OUT=str(out))
    mark = site.mark()
    startup = StartupCpu(site, mark)
    status, wall, cpu, _ = run_measured(
        [str(CRAWLEE / "bin" / "python"), str(SPIDER), "--max-pages", str(args.peer_pages),
         "--concurrency", str(CONCURRENCY), *site.seeds],
        env, args.timeout, work / "crawlee.log", startup=startup)
    r = Result(f"Crawlee {CRAWLEE_VERSION} ParselCrawler, 1 process x {CONCURRENCY}", site_name,
               wall=wall, cpu=cpu, startup_cpu=startup.seconds(), ok=status == 0)
    site_figures(r, site, mark)
    saved = sum(1 for p in out.iterdir())
    wanted = min(args.peer_pages or site.expected, site.expected)
    r.note = f"{saved} files saved, {r.pages - r.distinct} fetched twice"
    r.ok = r.ok and r.pages == r.distinct == saved and r.distinct >= wanted
    return r
