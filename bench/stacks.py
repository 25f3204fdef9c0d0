"""Where the CPU of a py-spy recording goes: ``.venv/bin/python -m bench.stacks FILE [--top 40]``.

FILE holds collapsed stacks (``py-spy record --format raw``). Prints the share of samples spent
in each function (self) and under each function (total), by qualified name. ``--children REGEX``
splits the samples under the first frame that matches by the function it called next (``<self>``:
in that frame itself), to follow a cost down one level at a time.
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
    parser.add_argument("--children", default="", metavar="REGEX",
                        help="split the samples under the first frame matching REGEX by its callee")
    args = parser.parse_args()
    own, under, callees = collections.Counter(), collections.Counter(), collections.Counter()
    parent = re.compile(args.children) if args.children else None
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
            if parent is not None:
                at = next((i for i, f in enumerate(frames) if parent.search(f)), None)
                if at is not None:
                    callees[frames[at + 1] if at + 1 < len(frames) else "<self>"] += n
    print(f"{total} samples")
    if parent is not None:
        print(f"\n-- under {args.children}: {100 * sum(callees.values()) / max(total, 1):.1f}%")
        for frame, n in callees.most_common(args.top):
            print(f"{100 * n / total:5.1f}%  {frame}")
        return
    for title, counter in (("self", own), ("total (inclusive)", under)):
        print(f"\n-- {title}")
        for frame, n in counter.most_common(args.top):
            print(f"{100 * n / total:5.1f}%  {frame}")


if __name__ == "__main__":
    main()
