"""The CPU and memory of finding the links of one page with 150,000 of them.

    .venv/bin/python -m bench.bench_links [--links 150000] [--kinds in-scope,off-site,repeats,odd-form]
                                [--rounds 2] [--code DIR]

Builds, in a fresh process per measurement, an HTML page of ``--links`` links and runs the
``SimpleScraper`` of a job seeded with the page's URL (the default scope: the seed's host,
``max_links_per_page`` 10,000) over it once, as a worker does after the download. The kinds:
``in-scope`` (distinct links on the page's host, ``<a href=/0a3f2>``: 2.25 MB), ``off-site``
(distinct links to other hosts, ``<a href=//0a3f2>``), ``repeats`` (one page written with a
different fragment each time, ``<a href=/a#0a3f2>``: every href is resolved, all give one URL),
and, when asked for, ``odd-form`` (off-site links that w3lib must canonicalize, the dearest
kind, ``<a href=HTTP://X0a3f2/?b&a>``).
Prints, per kind: the links found, those the scraper reports cut, the hrefs it looked at (when
it reports them), the process CPU (user + system) of the extraction, how much the process's peak
RSS grew during it, and, from a second process under tracemalloc, the peak of the Python heap
during it. ``--code DIR`` also measures the distscrape_celery package in DIR (another version,
e.g. from ``git archive OLD distscrape_celery | tar -x -C DIR``) in alternate rounds. No network.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from bench.helpers import CHECKOUT_PRELUDE

KINDS = {
    "in-scope": "<a href=/{n:05x}>",
    "off-site": "<a href=//{n:05x}>",
    "repeats": "<a href=/a#{n:05x}>",
    "odd-form": "<a href=HTTP://X{n:05x}/?b&a>",
}
DEFAULT_KINDS = ("in-scope", "off-site", "repeats")

CHILD = CHECKOUT_PRELUDE + r'''
import json, resource, time, tracemalloc
code, link, count, traced = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
from distscrape_celery.job.spec import JobSpec
from distscrape_celery.scrapers import SimpleScraper
from distscrape_celery.web.fetch import Download
url = "http://site.invalid/dir/page.html"
body = ("<html><body>" + "".join(link.format(n=n) for n in range(count))
        + "</body></html>").encode()
scraper = SimpleScraper.from_spec(JobSpec(seeds=[url]))
warm = Download(url=url, status=200, content_type="text/html", body=b"<a href=/warm>")
scraper.find_items(url, warm)  # the thread's parser is made once per thread, not per page
page = Download(url=url, status=200, content_type="text/html", body=body)
if traced:
    tracemalloc.start()
rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
before = resource.getrusage(resource.RUSAGE_SELF)
found = scraper.find_items(url, page)
after = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({
    "bytes": len(body), "found": len(found), "cut": getattr(found, "cut", None),
    "looked_at": getattr(found, "looked_at", None),
    "cpu": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
    "rss_growth_kb": after.ru_maxrss - rss_before,
    "heap_peak": tracemalloc.get_traced_memory()[1] if traced else None,
    "code": sys.modules["distscrape_celery"].__file__,
}))
'''


def measure(code: str, kind: str, links: int, traced: bool) -> dict:
    """One extraction of a page of ``kind`` in a fresh process, with the package in ``code``
    (the installed one if empty); with ``traced``, under tracemalloc."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, code, KINDS[kind], str(links), "1" if traced else "0"],
        cwd="/", capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--links", type=int, default=150_000)
    parser.add_argument("--kinds", default=",".join(DEFAULT_KINDS), help="of " + ", ".join(KINDS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--code", help="also measure the distscrape_celery package in DIR")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"--kinds: unknown {', '.join(sorted(unknown))}; use {', '.join(KINDS)}")
    codes = [""] + ([str(Path(args.code).resolve())] if args.code else [])
    print(f"{args.links} links a page; load average {os.getloadavg()[0]:.2f}")
    for number in range(args.rounds):
        for code in codes if number % 2 == 0 else codes[::-1]:
            for kind in kinds:
                plain = measure(code, kind, args.links, traced=False)
                heap = measure(code, kind, args.links, traced=True)["heap_peak"]
                where = (code or "installed") + ("" if code else f" ({plain['code']})")
                print(f"round {number + 1} {kind:8s} {plain['bytes'] / 1e6:.2f} MB: "
                      f"{plain['found']} found, cut {plain['cut']}, looked at "
                      f"{plain['looked_at']}; {plain['cpu']:.2f} s CPU, peak RSS +"
                      f"{plain['rss_growth_kb'] / 1024:.1f} MB, Python heap peak "
                      f"{heap / 1e6:.1f} MB [{where}]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
