"""How fast `distscrape seed JOB --ids-file FILE` imports IDs, and how much memory the client needs.

    .venv/bin/python -m bench.bench_seed_ids [--ids 1000000] [--duplicates 0.1] [--once]

Writes a file of ``--ids`` generated IDs (a share of them repeated, and some blank lines), starts
a throwaway Redis, and runs the real command on it as a subprocess (no worker alive, so nothing
is dispatched). Prints IDs per second, the command's peak RSS (from the kernel's rusage of the
finished child, taken before Redis is stopped so that only the command counts), Redis's memory
per ID and the Redis CPU each run took. Then (unless ``--once``) runs the same import once more
on the same job, where every ID is already seen.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from distscrape_celery.local.embedded import EmbeddedRedis


def write_ids(path: Path, n: int, duplicates: float) -> int:
    """Write ``n`` distinct IDs (and repeats of earlier ones, and blank lines) to ``path``;
    returns how many lines hold an ID."""
    rng = random.Random(1)
    lines = 0
    with path.open("w") as fh:
        for i in range(n):
            fh.write(f"{1_000_000_000 + i * 7}\n")
            lines += 1
            if rng.random() < duplicates:
                fh.write(f"{1_000_000_000 + rng.randrange(i + 1) * 7}\n")
                lines += 1
            if i % 1000 == 0:
                fh.write("  \n")
    return lines


def redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def seed(url: str, path: Path) -> tuple[float, float, str]:
    """Run the command; (seconds, the largest peak RSS of the commands run so far in MiB, its
    summary line)."""
    cmd = [
        sys.executable, "-m", "distscrape_celery.cli", "seed", "bench", "--ids-file", str(path),
        "--scraper", "ids", "--id-regex", r"\d+", "--download-url-fmt",
        "http://127.0.0.1:9/item/{id}", "--output", str(path.parent / "out"), "--redis-url", url,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")}
    started = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if res.returncode != 0:
        raise SystemExit(f"seed failed ({res.returncode}): {res.stderr}")
    return seconds, peak / 1024, res.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ids", type=int, default=1_000_000)
    parser.add_argument("--duplicates", type=float, default=0.1,
                        help="share of lines that repeat an earlier ID")
    parser.add_argument("--once", action="store_true", help="skip the second (all seen) import")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-seed-") as tmp:
        path = Path(tmp) / "ids.txt"
        lines = write_ids(path, args.ids, args.duplicates)
        size_mib = path.stat().st_size / 2**20
        print(f"{lines:,} IDs ({args.ids:,} distinct) and some blank lines, {size_mib:.1f} MiB")
        with EmbeddedRedis() as server:
            client = redis.Redis.from_url(server.url)
            before = int(client.info("memory")["used_memory"])
            for run in ("new job",) if args.once else ("new job", "again (all seen)"):
                cpu = redis_cpu(client)
                seconds, rss, summary = seed(server.url, path)
                cpu = redis_cpu(client) - cpu
                counts = re.search(r"(\d+) new item\(s\), (\d+) already seen", summary)
                assert counts, summary
                new, seen = map(int, counts.groups())
                if run == "new job":
                    assert new == args.ids, summary
                    per_id = (int(client.info("memory")["used_memory"]) - before) / args.ids
                else:
                    assert new == 0, summary
                assert new + seen == lines, summary
                print(f"{run}: {lines / seconds:,.0f} IDs/s ({seconds:.1f} s, {new:,} new, "
                      f"{seen:,} already seen); command peak RSS {rss:.0f} MiB"
                      + (" (either run)" if run != "new job" else "")
                      + f"; Redis CPU {cpu:.1f} s ({cpu / lines * 1e6:.1f} us/ID)")
            print(f"Redis memory per ID: {per_id:.0f} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
