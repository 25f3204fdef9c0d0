"""Start one Celery worker of this app without Celery's command line, for the worker processes
that ``distscrape crawl`` and the tests start themselves.

``python -m distscrape_celery.worker_main -Q QUEUES -P POOL -c N -n NAME -l LEVEL
[--without-gossip] [--without-mingle] [-I MODULES]`` runs the same worker as ``celery -A
distscrape_celery worker`` with those options: the same ``app.Worker`` class, its signal handling
and exit code. What it leaves out is Celery's command line, which loads every subcommand and
plugin (Flower's web app, click-repl, prompt_toolkit) before it starts a worker: about a quarter
of a worker's CPU from start to ready (bench/RESULTS.md), paid by every worker of every crawl.
Hosts of a distributed crawl keep using ``celery -A distscrape_celery worker``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m distscrape_celery.worker_main", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("-Q", "--queues", required=True, help="comma-separated queue names")
    parser.add_argument("-P", "--pool", default="threads", help="prefork, threads or solo")
    parser.add_argument("-c", "--concurrency", type=int, default=None)
    parser.add_argument("-n", "--hostname", default=None, help="node name; %%h is the host")
    parser.add_argument("-l", "--loglevel", default="WARNING")
    parser.add_argument("--without-gossip", action="store_true")
    parser.add_argument("--without-mingle", action="store_true")
    parser.add_argument("-I", "--include", default="", help="comma-separated modules to import")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    from celery.utils.nodenames import default_nodename, host_format

    from .celery_app import app

    worker = app.Worker(
        hostname=host_format(default_nodename(args.hostname)),
        pool_cls=args.pool,
        concurrency=args.concurrency,
        queues=args.queues,
        loglevel=args.loglevel,
        without_gossip=args.without_gossip,
        without_mingle=args.without_mingle,
        include=[m for m in args.include.split(",") if m],
    )
    worker.start()
    return worker.exitcode or 0


if __name__ == "__main__":
    sys.exit(main())
