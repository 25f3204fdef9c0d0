"""Pages/s of a crawl into PostgreSQL against the raw-page crawl of the same site, in one run.

    .venv/bin/python -m bench.records_postgres [--pages 3000] [--page-bytes 6000] [--rounds 3]
                                               [--admin-dsn postgresql://postgres@127.0.0.1/postgres]

Serves a generated site with nginx on 127.0.0.1 (as ``bench.suite`` does), then, round after
round, crawls it with ``distscrape crawl`` twice, limits set high: into a directory (the files
saver: the raw pages) and into a table of a fresh PostgreSQL database (the postgres saver, one
record a page), created on the server ``--admin-dsn`` names and dropped afterwards. Each crawl
must save every page (the table must hold one row a page). Prints each crawl's pages/s, each
round's ratio and their median, and exits 1 if the median is under ``--bar`` (0.7).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench.crawl_command import HIGH_LIMITS
from bench.helpers import BIN, clean_env
from bench.sites import NginxSite, site_pages

JOB_FILE = '[saver]\nkind = "postgres"\ntable = "pages"\ncreate_table = true\n'
_SUMMARY = re.compile(r": (\d+) saved, (\d+) dead, \d+ seen in ([\d.]+)s \(([\d.]+) pages/s\)")


def crawl(site: NginxSite, work: Path, name: str, extra: list[str], env: dict,
          timeout: float) -> float:
    """One ``distscrape crawl`` of the whole site: its pages/s (its own summary's figure)."""
    command = [str(BIN / "distscrape"), "crawl", site.url, "--output", str(work / f"{name}-out"),
               "--quiet", *HIGH_LIMITS, *extra]
    started = time.monotonic()
    res = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout,
                         cwd=work)
    match = _SUMMARY.search(res.stdout)
    if res.returncode != 0 or match is None:
        raise SystemExit(f"{name}: crawl failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    saved, dead, rate = int(match[1]), int(match[2]), float(match[4])
    if (saved, dead) != (site.expected, 0):
        raise SystemExit(f"{name}: {saved} saved, {dead} dead; the site has {site.expected}")
    print(f"  {name:<10} {rate:8.1f} pages/s ({time.monotonic() - started:.1f} s in all)",
          flush=True)
    return rate


def crawl_into_postgres(site: NginxSite, work: Path, name: str, admin_dsn: str,
                        timeout: float) -> float:
    """A crawl into a table of a database of its own, checked (a row a page) and dropped."""
    database = f"distscrape_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        try:
            dsn = make_conninfo(admin_dsn, dbname=database)
            job_file = work / "postgres.toml"
            job_file.write_text(JOB_FILE)
            rate = crawl(site, work, name, ["--config", str(job_file)],
                         {**clean_env(), "DISTSCRAPE_POSTGRES_DSN": dsn}, timeout)
            with psycopg.connect(dsn) as conn:
                [(rows, urls)] = conn.execute(
                    "SELECT count(*), count(DISTINCT url) FROM pages").fetchall()
            if rows != site.expected or urls != rows:
                raise SystemExit(f"{name}: {rows} rows ({urls} URLs); the site has {site.expected}")
        finally:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(database)))
    return rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--page-bytes", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bar", type=float, default=0.7)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--admin-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres",
                        help="a database of the server on which the bench may create databases")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench-records-postgres-"))
    site = NginxSite(site_pages(args.pages, args.page_bytes), work)
    ratios = []
    try:
        for round_ in range(1, args.rounds + 1):
            print(f"round {round_} of {args.rounds}, {site.expected} pages", flush=True)
            raw = crawl(site, work, f"raw-{round_}", [], clean_env(), args.timeout)
            shutil.rmtree(work / f"raw-{round_}-out", ignore_errors=True)
            postgres = crawl_into_postgres(site, work, f"postgres-{round_}", args.admin_dsn,
                                           args.timeout)
            ratios.append(postgres / raw)
            print(f"  ratio      {ratios[-1]:8.2f}", flush=True)
    finally:
        site.stop()
        shutil.rmtree(work, ignore_errors=True)
    median = statistics.median(ratios)
    verdict = "meets" if median >= args.bar else "MISSES"
    print(f"postgres / raw pages/s: {', '.join(f'{r:.2f}' for r in ratios)}; median "
          f"{median:.2f} ({verdict} the bar of {args.bar})")
    return 0 if median >= args.bar else 1


if __name__ == "__main__":
    sys.exit(main())
