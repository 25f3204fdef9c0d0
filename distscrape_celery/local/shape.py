"""The shape of ``distscrape crawl``: how many tasks it runs, over how many worker processes, and
where its settings differ from a worker's declared defaults."""

from __future__ import annotations

import os
from typing import Optional

# Concurrent tasks of `distscrape crawl`, shared by its worker processes (two per core, each a
# threads pool: see crawl_worker_processes). docs/performance.md, "Worker shape": two threads
# workers of 8 used 29 % less CPU per page than one prefork worker of 8 processes (the prefork
# parent passes every message to a child). A broad crawl (many hosts, each at most 8 requests
# in flight and far away) needs many tasks: 128 did about 1.5x the pages/s of 64 on
# bench/broad.py (docs/performance.md, "Broad crawl").
DEFAULT_CRAWL_CONCURRENCY = 128
# Where `distscrape crawl` differs from the declared defaults (the environment still decides): its
# worker processes share one machine, so a save task would only carry a page's body through
# Redis from one of them to another.
CRAWL_DEFAULTS: dict[str, object] = {"save_inline": True}
# Worker processes per core. One process holds its GIL for at most about one core, and leaves
# that core idle while its threads wait for the GIL; two per core filled both cores: 4 processes
# of 16 threads did 6-25 % more pages/s than 2 of 32 on 2 cores, on a local and a 50 ms site
# (docs/performance.md). More (6 or 8 of 8) cost more than they bought.
PROCESSES_PER_CORE = 2


def crawl_worker_processes(concurrency: int, cpus: Optional[int] = None) -> list[int]:
    """How `distscrape crawl` splits ``concurrency`` tasks over its worker processes: two per
    core (see PROCESSES_PER_CORE), at most one per task, as evenly as can be."""
    procs = max(1, min(PROCESSES_PER_CORE * (cpus or os.cpu_count() or 1), concurrency))
    return [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
