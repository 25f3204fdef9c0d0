"""Wall time of the whole test suite, the README's command, with the load the machine had.

    .venv/bin/python -m bench.suite_time [--top 15] [-- extra pytest arguments, e.g. -n 0]

Runs ``python -m pytest --durations=N`` from the repository root, then prints the wall time, the
CPU time of pytest and the processes it reaped, pytest's closing line, the N slowest test phases,
and the 1-minute load average before and after (the machine is shared: read figures beside it).
The full output is kept in a temporary file whose path is printed.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.helpers import ROOT


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=15, help="slowest test phases to print")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args()

    log = Path(tempfile.mkstemp(prefix="suite-time-", suffix=".txt")[1])
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    with log.open("w") as out:
        code = subprocess.call(
            [sys.executable, "-m", "pytest", f"--durations={args.top}", "-q", *args.pytest_args],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    wall = time.monotonic() - started
    load_after = os.getloadavg()[0]
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)

    text = log.read_text(errors="replace")
    lines = text.splitlines()
    closing = next((l for l in reversed(lines) if re.search(r"\d+ (passed|failed)", l)), "(none)")
    start = next((i for i, l in enumerate(lines) if "slowest" in l and "durations" in l), None)
    slowest = []
    if start is not None:
        for line in lines[start + 1:]:
            if not re.match(r"^\d+\.\d+s ", line):
                break
            slowest.append(line)

    print(f"wall {wall:.0f} s; CPU {usage.ru_utime + usage.ru_stime:.0f} s (user+sys of pytest "
          f"and the processes it reaped); load average (1 min) {load_before:.1f} before, "
          f"{load_after:.1f} after; exit {code}")
    print(f"pytest: {closing.strip('= ')}")
    print(f"slowest {len(slowest)}:")
    for line in slowest:
        print("  " + line)
    print(f"full output: {log}")
    return code


if __name__ == "__main__":
    sys.exit(main())
