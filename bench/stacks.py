"""Where the CPU of a py-spy recording goes: ``.venv/bin/python -m bench.stacks FILE [--top 40]``.

FILE holds collapsed stacks (``py-spy record --format raw``). Prints the share of samples spent
in each function (self) and under each function (total), by qualified name. ``--children REGEX``
splits the samples under the first frame that matches by the function it called next (``<self>``:
in that frame itself), to follow a cost down one level at a time. ``--concerns`` gives the share
of each concern of a page instead (CONCERNS: Celery, the tracker calls, HTTP, parsing, saving,
start-up), each sample counted under the concern of its innermost frame that has one.
"""

from __future__ import annotations

import argparse
import collections
import re


# (concern, frames that are its own), in the order a sample's frames are matched, innermost
# first: a sample in redis-py under a tracker call is the tracker's, one in kombu under the
# publisher is publishing's.
CONCERNS = [
    ("start-up", r"freeze_startup_objects|importlib|_find_and_load"),
    ("saving", r"ScrapedSaves|scraped_saves|pipeline/saving\.py|savers/"),
    ("tracker calls", r"distscrape_celery/tracker/"),
    ("HTTP", r"web/fetch\.py|web/deadline|web/ssrf|web/robots|web/encoding|urllib3|http/client"),
    ("parsing and links", r"scrapers/|page_meta|web/scope|job/urls|pipeline/links|page_rules"),
    ("Celery: publishing", r"worker/publish|pipeline/publishing|kombu/messaging|apply_async"),
    ("Celery: running the task", r"celery/app/trace|apply_target|concurrent/futures"),
    ("Celery: fetching and delivering messages", r"kombu|celery/worker|celery/concurrency"),
    ("the rest of the pipeline", r"distscrape_celery"),
]


def concerns(lines) -> tuple[int, collections.Counter]:
    """The samples of a recording's lines, and how many of them each concern took."""
    compiled = [(name, re.compile(pattern)) for name, pattern in CONCERNS]
    shares: collections.Counter = collections.Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        n = int(count)
        total += n
        for frame in reversed(stack.split(";")):
            name = next((name for name, pattern in compiled if pattern.search(frame)), None)
            if name is not None:
                shares[name] += n
                break
        else:
            shares["other (threads, the interpreter)"] += n
    return total, shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--match", default="", help="only stacks with a frame matching this regex")
    parser.add_argument("--children", default="", metavar="REGEX",
                        help="split the samples under the first frame matching REGEX by its callee")
    parser.add_argument("--concerns", action="store_true",
                        help="the share of each concern of a page (Celery, tracker, HTTP, ...)")
    args = parser.parse_args()
    if args.concerns:
        with open(args.file) as fh:
            total, shares = concerns(fh)
        print(f"{total} samples")
        for name, n in shares.most_common():
            print(f"{100 * n / max(total, 1):5.1f}%  {name}")
        return
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
