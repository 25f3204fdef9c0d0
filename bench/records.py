"""What extracting records costs a crawl: pages/s of a raw-page crawl against a crawl that
extracts 5 fields a page into a saver of records, in the same run.

    .venv/bin/python -m bench.records [--pages 3000] [--page-bytes 6000] [--rounds 3] [--saver jsonl]

Serves the suite's generated site from static files by nginx on 127.0.0.1 (``bench/sites.py``)
and crawls it with ``distscrape crawl URL`` (the suite's high per-domain limit) twice a round,
in alternating order: into a directory (the files saver: every page as it came), and with a job
file whose ``[extract]`` takes 5 fields of every page (title, heading, every link, the section's
id, a regex over the first link's text) into the ``--saver`` (``jsonl``: a ``.jsonl`` file,
joined at the end; ``jsonl-gz``: gzipped). Each crawl's pages/s is the command's own figure
(pages done over the crawl's seconds, start-up and the join after it left out); its wall time
is printed beside it. The records are checked: one a page, each with its 5 fields.

Bar (PASS or FAIL, exit status 1 on FAIL): the median over the rounds of records pages/s over
raw pages/s is at least 0.8. A saver of records is one entry of SAVERS: its output name and how
to count what it holds.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.crawl_command import HIGH_LIMITS
from bench.helpers import BIN, clean_env, machine, unwind_on_sigterm
from bench.probes import run_measured
from bench.sites import NginxSite, site_pages

MIN_RATIO = 0.8
JOB_FILE = """\
[extract]
fields.title = "title::text"
fields.heading = "h1::text"
fields.links = { css = "#main a::attr(href)", all = true }
fields.section = { xpath = "//h2/@id" }
fields.first_link = { css = "#main a::text", re = 'link (\\d+)' }
"""
FIELDS = ("title", "heading", "links", "section", "first_link")


def _jsonl_records(output: Path) -> list[dict]:
    opener = gzip.open if output.name.endswith(".gz") else open
    with opener(output, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


@dataclass(frozen=True)
class RecordsSaver:
    """A saver of records as the bench uses it: its ``--output`` in a work directory, and the
    records it holds once the crawl is over."""

    output: Callable[[Path], str]
    records: Callable[[str], list[dict]]


SAVERS = {
    "jsonl": RecordsSaver(lambda work: str(work / "items.jsonl"),
                          lambda output: _jsonl_records(Path(output))),
    "jsonl-gz": RecordsSaver(lambda work: str(work / "items.jsonl.gz"),
                             lambda output: _jsonl_records(Path(output))),
}


@dataclass
class Crawl:
    mode: str
    rate: float  # pages/s, as the command reports it
    wall: float
    cpu: float
    pages: int


def crawl(site: NginxSite, mode: str, work: Path, args) -> tuple[Crawl, str]:
    """One ``distscrape crawl`` of ``site``, raw or with records into ``args.saver``: its
    figures and its output."""
    work.mkdir(parents=True)
    if mode == "raw":
        output, extra = str(work / "pages"), []
    else:
        (work / "job.toml").write_text(JOB_FILE)
        output, extra = SAVERS[args.saver].output(work), ["--config", str(work / "job.toml")]
    command = [str(BIN / "distscrape"), "crawl", site.url, "--output", output, "--quiet",
               *HIGH_LIMITS, *extra]
    log = work / "crawl.log"
    status, wall, cpu, _ = run_measured(command, clean_env(), args.timeout, log)
    text = log.read_text(errors="replace")
    found = re.search(r": (\d+) saved, 0 dead.* \(([\d.]+) pages/s\)", text)
    if status != 0 or found is None:
        raise RuntimeError(f"the {mode} crawl exited {status}:\n{text[-2000:]}")
    return Crawl(mode, float(found[2]), wall, cpu, int(found[1])), output


def check_records(records: list[dict], expected: int) -> None:
    """One record a page, each with the 5 fields."""
    urls = {record["url"] for record in records}
    if len(records) != expected or len(urls) != expected:
        raise RuntimeError(f"{len(records)} records of {len(urls)} pages, not one of each of "
                           f"{expected} pages")
    for record in records:
        missing = [name for name in FIELDS if name not in record]
        if missing or record["title"] is None or not record["links"]:
            raise RuntimeError(f"a record without its fields: {record}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=3000, help="pages of the site")
    parser.add_argument("--page-bytes", type=int, default=6000, help="about a page's size")
    parser.add_argument("--rounds", type=int, default=3, help="pairs of crawls")
    parser.add_argument("--saver", choices=sorted(SAVERS), default="jsonl",
                        help="the saver of records")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a crawl may take")
    parser.add_argument("--keep", action="store_true", help="keep the outputs and the logs")
    args = parser.parse_args(argv)
    unwind_on_sigterm()
    print(machine(), flush=True)
    work = Path(tempfile.mkdtemp(prefix="distscrape-records-"))
    site = NginxSite(site_pages(args.pages, args.page_bytes), work / "site")
    print(f"site: {site.expected:,} pages of about {args.page_bytes:,} bytes, served by nginx; "
          f"records: 5 fields a page into {args.saver}", flush=True)
    ratios = []
    try:
        for round_ in range(1, args.rounds + 1):
            # Alternate which goes first, so that neither always meets a warmer page cache.
            order = ("raw", "records") if round_ % 2 else ("records", "raw")
            done = {}
            for mode in order:
                done[mode], output = crawl(site, mode, work / f"round-{round_}-{mode}", args)
                if mode == "records":
                    check_records(SAVERS[args.saver].records(output), site.expected)
            raw, records = done["raw"], done["records"]
            ratios.append(records.rate / raw.rate)
            print(f"round {round_}: raw {raw.rate:,.0f} pages/s ({raw.wall:.1f}s wall, "
                  f"{raw.cpu / raw.pages * 1000:.2f} ms CPU a page); records "
                  f"{records.rate:,.0f} pages/s ({records.wall:.1f}s wall, "
                  f"{records.cpu / records.pages * 1000:.2f} ms CPU a page); ratio "
                  f"{ratios[-1]:.2f}", flush=True)
    finally:
        site.stop()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    median = statistics.median(ratios)
    verdict = "PASS" if median >= MIN_RATIO else "FAIL"
    print(f"{verdict}: records pages/s over raw pages/s, median of {len(ratios)} round(s): "
          f"{median:.2f} (bar: at least {MIN_RATIO}); rounds: "
          + ", ".join(f"{r:.2f}" for r in ratios))
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
