"""A recurring crawl's second generation against its first: what it downloads, saves and costs.

    .venv/bin/python -m bench.revisits [--pages 5000] [--page-bytes 6000] [--modes etag,digest]
                                       [--rounds 3] [--link-rate RATE]

Serves a generated site (``--pages`` pages of about ``--page-bytes``, as the suite's, and the
suite's robots.txt that allows everything) on 127.0.0.1 with nginx, from static files, and crawls
it with ``distscrape crawl URL --revisit --output DIR`` (the embedded Redis, its state beside
DIR; the suite's high per-domain limit), then serves the site changed as :func:`evolve_site`
changes it (10 % of the pages changed, 2 % added, 2 % removed: their files rewritten with a
later modification time, written, or deleted; the others left alone) and runs the same command
again: generation 2 of its job. That is one round; each of ``--rounds`` is a new job (its own
output), the modes taking turns, so that a machine that is slower for a while weighs on one
round of each and not on a whole mode. In mode ``etag`` nginx serves its static files as it
does by default: ETag (the file's modification time and size) and Last-Modified, and 304 to a
matching conditional request; in mode ``digest`` it sends neither and ignores conditional
requests, and only the body's digest tells an unchanged page. A removed page is a 404 in both.
With ``--link-rate RATE`` (root) nginx serves from a network namespace over a link of that rate
(:mod:`bench.netlink`) instead of 127.0.0.1, so that bytes not sent save time, as on a network.

For each round it prints both generations' wall time (of the command, start-up and shutdown
included) and, from nginx's access log, their first-to-last page request, the pages requested
and the body bytes sent; the CPU a page of the crawl's processes, of its Redis and of nginx
(from /proc); and the pages generation 2 saved, counted from the output: the files whose inode
changed (the files saver replaces a file atomically) or that are new, against the changed and
added pages (missed and extra must be 0), each of them the page as served. Bars, each PASS or
FAIL (exit status 1 if any fails): generation 2 saves exactly the changed and added pages, in
every round of both modes; in mode etag it downloads at most 15 % of generation 1's body bytes
(the median of the rounds); its first-to-last page request takes at most half of generation
1's, in both modes (the median of the rounds' ratios; the command's wall time is printed beside
it: it adds a start-up and a shutdown that do not shrink with the pages fetched).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from bench.crawl_command import HIGH_LIMITS
from bench.helpers import BIN, clean_env, machine, unwind_on_sigterm
from bench.netlink import RateLimitedLink
from bench.probes import StartupCpu, embedded_probe, run_measured
from bench.sites import ROBOTS, NginxSite, static_name, write_static
from distscrape_celery.savers import FileItemSaver
from distscrape_celery.testing.sitegen import Site, SiteChange, evolve_site, generate_site

MODES = ("etag", "digest")
# More of nginx's server block, by mode. etag: its defaults for static files. digest: no ETag,
# no Last-Modified (add_header with an empty value takes the static module's away) and
# If-Modified-Since ignored; an If-None-Match naming a tag then never matches (only "*" would,
# which a crawl never sends).
SERVER_CONF = {
    "etag": "",
    "digest": 'etag off;\nif_modified_since off;\nadd_header Last-Modified "";\n',
}
# A removed section page (/sec/K/) leaves its directory behind, with the section's other pages:
# nginx would answer 403 (no index, no listing), which a crawl does not take for gone. A removed
# page's 404 is expected: not an error line each.
GONE = "log_not_found off;\nlocation ~ /$ { try_files ${uri}index.html =404; }\n"
# The bars.
MAX_BYTES_RATIO = 0.15  # etag: generation 2's body bytes against generation 1's
MAX_TIME_RATIO = 0.5  # generation 2's first-to-last page request against generation 1's


@dataclass
class Generation:
    """One run of the command: its wall seconds, the CPU seconds of its processes (workers and
    the command; its embedded Redis's apart; ``startup_cpu``: of those up to the site's first
    request) and of nginx, the first-to-last page request, the
    pages requested and the body bytes sent (from nginx's log, robots.txt's request left out of
    the first two), Redis's round trips and script calls, and the command's report."""

    wall: float
    cpu: float
    startup_cpu: float
    redis_cpu: float
    server_cpu: float
    span: float
    requests: int
    body_bytes: int
    round_trips: float
    scripts: float
    summary: str

    @property
    def working_cpu(self) -> float:
        """The CPU of the crawl's processes once the site was asked for its first page."""
        return self.cpu - self.startup_cpu

    def per_page(self, value: float) -> float:
        return value / max(self.requests, 1)


def crawl(server: NginxSite, out: Path, log: Path, timeout: float) -> Generation:
    """``distscrape crawl URL --revisit --output OUT`` to its end, measured."""
    command = [str(BIN / "distscrape"), "crawl", server.url, "--revisit", "--output",
               str(out), "--quiet", *HIGH_LIMITS]
    mark = server.mark()
    offset, served = mark
    state = Path(str(out) + ".distscrape-state")
    startup = StartupCpu(server, mark, leave_out=frozenset({"redis-server"}))
    status, wall, cpu, probe = run_measured(command, clean_env(), timeout, log,
                                            embedded_probe(state), startup)
    served = server.cpu_seconds() - served
    text = log.read_text(errors="replace")
    if status != 0:
        raise RuntimeError(f"the crawl exited {status}:\n{text[-2000:]}")
    _, redis_cpu, reads = probe.delta() if probe else (0.0, 0.0, 0.0)
    answers = server.responses_since(offset)
    times = [when for when, path, _, _ in answers if path != "/robots.txt"]
    lines = [line for line in text.splitlines() if line.startswith("job ")]
    # The embedded Redis is a child of the command: its CPU is in the rusage; take it out.
    return Generation(wall, cpu - redis_cpu, startup.seconds(), redis_cpu, served,
                      max(times) - min(times) if times else 0.0, len(times),
                      sum(sent for _, _, _, sent in answers), reads,
                      probe.scripts() if probe else 0.0, " / ".join(lines))


def change_files(root: Path, change: SiteChange) -> None:
    """Make nginx's files under ``root`` the changed site: the changed and added pages written,
    with a modification time a whole second past every other file's (nginx's ETag and
    Last-Modified count whole seconds), the removed ones deleted, the rest left alone."""
    latest = max(p.stat().st_mtime for p in root.rglob("*") if p.is_file())
    when = max(int(time.time()), int(latest) + 1)
    written = change.changed | change.added
    write_static({path: change.site.pages[path] for path in written}, root)
    for path in written:
        os.utime(root / static_name(path), (when, when))
    for path in change.removed:
        (root / static_name(path)).unlink()


class SiteVersions:
    """The site's files as generation 1 sees them and as generation 2 does, both kept, nginx's
    root a symbolic link to one of them: each round crawls the first version, then the second.
    The second is a copy of the first (modification times kept: nginx's ETag is the time and
    the size) changed by :func:`change_files`."""

    def __init__(self, server: NginxSite, change: SiteChange) -> None:
        self.link = server.root
        self.first = self.link.with_name(self.link.name + "-1")
        self.second = self.link.with_name(self.link.name + "-2")
        self.link.rename(self.first)
        shutil.copytree(self.first, self.second)
        change_files(self.second, change)
        self.serve(1)

    def serve(self, generation: int) -> None:
        """Point nginx's root at the files of ``generation`` (1 or 2), atomically."""
        staged = self.link.with_name(self.link.name + ".new")
        staged.unlink(missing_ok=True)
        staged.symlink_to(self.first if generation == 1 else self.second)
        staged.replace(self.link)


def page_url(server: NginxSite, path: str) -> str:
    """The URL of the site's page ``path`` (which starts with "/")."""
    return server.url.rstrip("/") + path


def inodes(output: Path) -> dict[str, int]:
    """Each saved file (relative name) and its inode; the saver's temporary files left out."""
    return {str(p.relative_to(output)): p.stat().st_ino for p in output.rglob("*")
            if p.is_file() and not p.name.startswith(".~tmp-")}


@dataclass
class Round:
    """One job crawled twice: generation 1 on the site, generation 2 on the changed site, and
    what generation 2 wrote: the files ``saved``, those of the changed and added pages it
    ``missed``, the ``extra`` ones, and the ``wrong`` ones (not the page as the site serves
    it now)."""

    first: Generation
    second: Generation
    saved: int
    missed: list[str]
    extra: list[str]
    wrong: list[str]

    def ratio(self, what: str) -> float:
        return getattr(self.second, what) / max(getattr(self.first, what), 1e-9)

    def ratio_a_page(self, what: str) -> float:
        return (self.second.per_page(getattr(self.second, what))
                / max(self.first.per_page(getattr(self.first, what)), 1e-9))


class Mode:
    """A mode's site, served by nginx as the mode says, in both versions, and its rounds so far;
    the changed site's counts."""

    def __init__(self, mode: str, site: Site, work: Path, seed: int,
                 link: Optional[RateLimitedLink] = None) -> None:
        pages = {**{path: site.pages[path] for path in site.reachable}, "/robots.txt": ROBOTS}
        self.mode, self.work = mode, work / mode
        self.work.mkdir(parents=True)
        self.change = evolve_site(site, seed=seed)
        where = {"address": link.address, "prefix": link.prefix()} if link else {}
        self.server = NginxSite(pages, self.work, SERVER_CONF[mode] + GONE, **where)
        self.rounds: list[Round] = []
        try:
            self.versions = SiteVersions(self.server, self.change)
        except BaseException:
            self.server.stop()
            raise

    def run(self, timeout: float) -> Round:
        """One more round: a new job's two generations."""
        number = len(self.rounds) + 1
        r = run_round(self.server, self.versions, self.change, self.work / f"round-{number}",
                      timeout)
        self.rounds.append(r)
        print(f"{self.mode}, round {number}: from first to last page request, generation 1 "
              f"{r.first.span:.2f}s, generation 2 {r.second.span:.2f}s ({r.ratio('span'):.3f}); "
              f"the command {r.first.wall:.1f}s and {r.second.wall:.1f}s", flush=True)
        return r

    def median(self, ratio: Callable[[Round], float]) -> float:
        return statistics.median(ratio(r) for r in self.rounds)

    def stop(self) -> None:
        self.server.stop()


def run_round(server: NginxSite, versions: SiteVersions, change: SiteChange, work: Path,
              timeout: float) -> Round:
    """Generation 1 of a new job on the site, then generation 2 on the changed site."""
    work.mkdir()
    out = work / "out"
    versions.serve(1)
    saver = FileItemSaver(str(out))
    first = crawl(server, out, work / "generation-1.log", timeout)
    before = inodes(out)
    versions.serve(2)
    second = crawl(server, out, work / "generation-2.log", timeout)
    if "generation 2" not in (work / "generation-2.log").read_text():
        raise RuntimeError(f"the second run did not start generation 2: see {work}")
    after = inodes(out)
    name = {str(saver.name_for(page_url(server, p))): p for p in change.site.reachable}
    expected = {str(saver.name_for(page_url(server, p))) for p in change.changed | change.added}
    written = {n for n, ino in after.items() if before.get(n) != ino}
    wrong = sorted(n for n in written & expected
                   if (out / n).read_bytes() != change.site.pages[name[n]])
    return Round(first, second, len(written), sorted(expected - written),
                 sorted(written - expected), wrong)


def report(modes: list[Mode]) -> bool:
    """Print the figures and the bars; whether every bar passed."""
    print("\n| mode | round | generation | command wall, s | first to last page request, s | "
          "pages requested | body MB sent | crawl CPU ms a page | of which after start-up | Redis "
          "CPU ms a page | round trips a page | script calls a page | server CPU ms a page |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m in modes:
        for number, r in enumerate(m.rounds, start=1):
            for label, g in (("1", r.first), ("2", r.second)):
                print(f"| {m.mode} | {number} | {label} | {g.wall:.2f} | {g.span:.2f} | "
                      f"{g.requests:,} | {g.body_bytes / 1e6:.2f} | "
                      f"{1000 * g.per_page(g.cpu):.2f} | {1000 * g.per_page(g.working_cpu):.2f} | "
                      f"{1000 * g.per_page(g.redis_cpu):.3f} | "
                      f"{g.per_page(g.round_trips):.2f} | {g.per_page(g.scripts):.2f} | "
                      f"{1000 * g.per_page(g.server_cpu):.2f} |")
            print(f"| {m.mode} | {number} | 2 / 1 | {r.ratio('wall'):.3f} | "
                  f"{r.ratio('span'):.3f} | {r.ratio('requests'):.3f} | "
                  f"{r.ratio('body_bytes'):.3f} | {r.ratio_a_page('cpu'):.3f} | "
                  f"{r.ratio_a_page('working_cpu'):.3f} | "
                  f"{r.ratio_a_page('redis_cpu'):.3f} | {r.ratio_a_page('round_trips'):.3f} | "
                  f"{r.ratio_a_page('scripts'):.3f} | {r.ratio_a_page('server_cpu'):.3f} |")
    print()
    for m in modes:
        print(f"{m.mode}: generation 1: {m.rounds[-1].first.summary}")
        print(f"{m.mode}: generation 2: {m.rounds[-1].second.summary}")
        for number, r in enumerate(m.rounds, start=1):
            print(f"{m.mode}, round {number}: the site changed {len(m.change.changed)} pages, "
                  f"added {len(m.change.added)}, removed {len(m.change.removed)}; generation 2 "
                  f"wrote {r.saved} files: {len(r.missed)} missed, {len(r.extra)} extra, "
                  f"{len(r.wrong)} not the page served"
                  + (f" (missed {r.missed[:5]}, extra {r.extra[:5]}, wrong {r.wrong[:5]})"
                     if r.missed or r.extra or r.wrong else ""))
    bars: list[tuple[str, bool]] = []
    for m in modes:
        inexact = [r for r in m.rounds if r.missed or r.extra or r.wrong]
        bars.append((f"{m.mode}: generation 2 saves exactly the changed and added pages, in "
                     f"every round ({len(inexact)} of {len(m.rounds)} rounds did not)",
                     not inexact))
        spans = sorted(r.ratio("span") for r in m.rounds)
        if m.mode == "etag":
            sent = m.median(lambda r: r.ratio("body_bytes"))
            bars.append((f"etag: generation 2 downloads at most {MAX_BYTES_RATIO:.0%} of "
                         f"generation 1's body bytes (median of the rounds {sent:.1%})",
                         sent <= MAX_BYTES_RATIO))
        middle = statistics.median(spans)
        bars.append((f"{m.mode}: generation 2's first to last page request at most "
                     f"{MAX_TIME_RATIO:.0%} of generation 1's (median of the rounds "
                     f"{middle:.1%}, from {spans[0]:.1%} to {spans[-1]:.1%}; the command's wall "
                     f"time: {m.median(lambda r: r.ratio('wall')):.1%}; the crawl's CPU a page "
                     f"after start-up: {m.median(lambda r: r.ratio_a_page('working_cpu')):.1%})",
                     middle <= MAX_TIME_RATIO))
    print()
    for text, ok in bars:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    if any(m.mode == "digest" for m in modes):
        print("\n(digest: the server sends no validators, so every known page's whole body is "
              "downloaded again; an unchanged one is neither saved nor parsed for links.)")
    return all(ok for _, ok in bars)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=5000, help="pages of the site (reachable)")
    parser.add_argument("--page-bytes", type=int, default=6000, help="about a page's size")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="etag (validators and 304s), digest (neither), or both")
    parser.add_argument("--rounds", type=int, default=3,
                        help="new jobs crawled twice, in each mode (the modes take turns)")
    parser.add_argument("--link-rate", metavar="RATE",
                        help="serve the site from a network namespace over a link of RATE "
                             "(tc's notation, e.g. 20mbit; needs root) instead of 127.0.0.1")
    parser.add_argument("--seed", type=int, default=2, help="evolve_site's seed")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a crawl may take")
    parser.add_argument("--keep", action="store_true", help="keep the outputs and the logs")
    args = parser.parse_args(argv)
    names = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not names or set(names) - set(MODES):
        parser.error(f"--modes: one or more of {', '.join(MODES)}")
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    unwind_on_sigterm()
    print(machine(), flush=True)
    site = generate_site(args.pages, seed=1, unreachable=0,
                         page_padding=max(0, args.page_bytes - 400))
    mean = sum(len(b) for b in site.pages.values()) / len(site.pages)
    print(f"site: {len(site.reachable):,} pages of {mean:,.0f} bytes on average; between the "
          "generations 10 % change, 2 % are added, 2 % removed", flush=True)
    work = Path(tempfile.mkdtemp(prefix="distscrape-revisits-"))
    modes: list[Mode] = []
    link = None
    try:
        if args.link_rate:
            link = RateLimitedLink(args.link_rate)
            print(f"the site is served over a link of {args.link_rate}, from {link.address}",
                  flush=True)
        for name in names:
            modes.append(Mode(name, site, work, args.seed, link))
        for _ in range(args.rounds):
            for mode in modes:
                mode.run(args.timeout)
    finally:
        for mode in modes:
            mode.stop()
        if link is not None:
            link.close()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if report(modes) else 1


if __name__ == "__main__":
    sys.exit(main())
