"""Scale-out on simulated hosts: each worker "host" in a CPU cgroup of its own, capped at a share
of a core, so that 1, 2 and 4 hosts sharing one Redis can be compared on a machine of 2 cores.

    .venv/bin/python -m bench.sim_hosts [--host-cpu 0.3] [--pages 3000] [--rounds 3]

Runs ``python -m bench.suite --only scale-hosts``: the 50 ms site (``bench/latency_site.py`` on
127.0.0.1), a throwaway Redis, and for 1, 2 and 4 hosts one worker each (``celery multi start``
of ``-P threads -c 16``, ``--scale-args``), every worker started inside its host's cgroup
(``bench.cgroups``); it prints pages/s, CPU a page, the 2/1 and 4/1 ratios per round and their
medians. Needs root and a cgroup hierarchy with the cpu controller: cgroup v1's ``cpu``
(``cpu.cfs_quota_us``) or cgroup v2's (``cpu.max``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from bench import suite


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host-cpu", type=float, default=0.3,
                        help="each host's share of a core (default 0.3)")
    parser.add_argument("--pages", type=int, default=3000, help="pages each crawl fetches")
    parser.add_argument("--site-pages", type=int, default=5000, help="pages the site has")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of 1, 2 and 4 hosts (every other one 4, 2, 1)")
    parser.add_argument("--scale-args", default="-P threads -c 16",
                        help="celery worker options of each host's worker")
    parser.add_argument("--latency", type=float, default=0.05, help="the site's delay, seconds")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per crawl at most")
    args = parser.parse_args(argv)
    return suite.main([
        "--only", "scale-hosts", "--host-cpu", str(args.host_cpu),
        "--scale-pages", str(args.pages), "--pages", str(args.site_pages),
        "--rounds", str(args.rounds), f"--scale-args={args.scale_args}",
        "--latency", str(args.latency), "--timeout", str(args.timeout)])


if __name__ == "__main__":
    sys.exit(main())
