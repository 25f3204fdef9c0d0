#!/usr/bin/env python
"""Where the CPU of a py-spy recording goes: ``python bench/stacks.py FILE [--top 40]``.

FILE holds collapsed stacks (``py-spy record --format raw``). Prints the share of samples spent
in each function (self) and under each function (total), by qualified name.
"""

from __future__ import annotations

import argparse
import collections
import re


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--match", default="", help="only stacks with a frame matching this regex")
    args = parser.parse_args()
    own, under = collections.Counter(), collections.Counter()
    total = 0
    match = re.compile(args.match) if args.match else None
    with open(args.file) as fh:
        for line in fh:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            frames = [re.sub(r":\d+\)", ")", f) for f in stack.split(";")]
            if match and not any(match.search(f) for f in frames):
                continue
            n = int(count)
            total += n
            own[frames[-1]] += n
            for f in set(frames):
                under[f] += n
    print(f"{total} samples")
    for title, counter in (("self", own), ("total (inclusive)", under)):
        print(f"\n-- {title}")
        for frame, n in counter.most_common(args.top):
            print(f"{100 * n / total:5.1f}%  {frame}")


if __name__ == "__main__":
    main()
