"""A recurring crawl's second generation against its first: what it downloads, saves and costs.

    .venv/bin/python -m bench.revisits [--pages 5000] [--page-bytes 6000] [--modes etag,digest]

Serves a generated site (``--pages`` pages of about ``--page-bytes``, as the suite's, and the
suite's robots.txt that allows everything) on 127.0.0.1 with nginx, from static files, and crawls
it with ``distscrape crawl URL --revisit --output DIR`` (the embedded Redis, its state beside
DIR; the suite's high per-domain limit), then changes the site as :func:`evolve_site` does (10 %
of the pages changed, 2 % added, 2 % removed: their files rewritten with a later modification
time, written, or deleted; the others left alone) and runs the same command again: generation 2
of its job. In mode ``etag`` nginx serves its static files as it does by default: ETag (the
file's modification time and size) and Last-Modified, and 304 to a matching conditional
request; in mode ``digest`` it sends neither and ignores conditional requests, and only the
body's digest tells an unchanged page. A removed page is a 404 in both.

For each mode it prints both generations' wall time (of the command, start-up and shutdown
included) and, from nginx's access log, their first-to-last page request, the pages requested
and the body bytes sent; the CPU a page of the crawl's processes, of its Redis and of nginx
(from /proc); and the pages generation 2 saved, counted from the output: the files whose inode
changed (the files saver replaces a file atomically) or that are new, against the changed and
added pages (missed and extra must be 0), each of them the page as served. Bars, each PASS or
FAIL (exit status 1 if any fails): generation 2 saves exactly the changed and added pages, in
both modes; in mode etag it downloads at most 15 % of generation 1's body bytes; its
first-to-last page request takes at most half of generation 1's, in both modes (the command's
wall time is printed beside it: it adds a start-up and a shutdown that do not shrink with the
pages fetched).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.crawl_command import HIGH_LIMITS
from bench.helpers import BIN, clean_env, machine, unwind_on_sigterm
from bench.probes import embedded_probe, run_measured
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
    the command; its embedded Redis's apart) and of nginx, the first-to-last page request, the
    pages requested and the body bytes sent (from nginx's log, robots.txt's request left out of
    the first two), Redis's round trips and script calls, and the command's report."""

    wall: float
    cpu: float
    redis_cpu: float
    server_cpu: float
    span: float
    requests: int
    body_bytes: int
    round_trips: float
    scripts: float
    summary: str

    def per_page(self, value: float) -> float:
        return value / max(self.requests, 1)


def crawl(server: NginxSite, out: Path, log: Path, timeout: float) -> Generation:
    """``distscrape crawl URL --revisit --output OUT`` to its end, measured."""
    command = [str(BIN / "distscrape"), "crawl", server.url, "--revisit", "--output",
               str(out), "--quiet", *HIGH_LIMITS]
    offset, served = server.mark()
    state = Path(str(out) + ".distscrape-state")
    status, wall, cpu, probe = run_measured(command, clean_env(), timeout, log,
                                            embedded_probe(state))
    served = server.cpu_seconds() - served
    text = log.read_text(errors="replace")
    if status != 0:
        raise RuntimeError(f"the crawl exited {status}:\n{text[-2000:]}")
    _, redis_cpu, reads = probe.delta() if probe else (0.0, 0.0, 0.0)
    answers = server.responses_since(offset)
    times = [when for when, path, _, _ in answers if path != "/robots.txt"]
    lines = [line for line in text.splitlines() if line.startswith("job ")]
    # The embedded Redis is a child of the command: its CPU is in the rusage; take it out.
    return Generation(wall, cpu - redis_cpu, redis_cpu, served,
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


def page_url(server: NginxSite, path: str) -> str:
    """The URL of the site's page ``path`` (which starts with "/")."""
    return server.url.rstrip("/") + path


def inodes(output: Path) -> dict[str, int]:
    """Each saved file (relative name) and its inode; the saver's temporary files left out."""
    return {str(p.relative_to(output)): p.stat().st_ino for p in output.rglob("*")
            if p.is_file() and not p.name.startswith(".~tmp-")}


@dataclass
class ModeResult:
    mode: str
    first: Generation
    second: Generation
    changed: int
    added: int
    removed: int
    saved: int  # files generation 2 wrote, from the output
    missed: list[str]
    extra: list[str]
    wrong: list[str]  # saved, but not the page as the site serves it now

    def ratio(self, what: str) -> float:
        return getattr(self.second, what) / max(getattr(self.first, what), 1e-9)

    def ratio_a_page(self, what: str) -> float:
        return (self.second.per_page(getattr(self.second, what))
                / max(self.first.per_page(getattr(self.first, what)), 1e-9))


def run_mode(mode: str, site: Site, work: Path, seed: int, timeout: float) -> ModeResult:
    out, logs = work / mode / "out", work / mode
    logs.mkdir(parents=True)
    pages = {**{path: site.pages[path] for path in site.reachable}, "/robots.txt": ROBOTS}
    server = NginxSite(pages, logs, SERVER_CONF[mode] + GONE)
    try:
        saver = FileItemSaver(str(out))
        first = crawl(server, out, logs / "generation-1.log", timeout)
        before = inodes(out)
        change = evolve_site(site, seed=seed)
        change_files(server.root, change)
        second = crawl(server, out, logs / "generation-2.log", timeout)
        if "generation 2" not in (logs / "generation-2.log").read_text():
            raise RuntimeError(f"the second run did not start generation 2: see {logs}")
        after = inodes(out)
        name = {str(saver.name_for(page_url(server, p))): p for p in change.site.reachable}
        expected = {str(saver.name_for(page_url(server, p)))
                    for p in change.changed | change.added}
    finally:
        server.stop()
    written = {n for n, ino in after.items() if before.get(n) != ino}
    wrong = sorted(n for n in written & expected
                   if (out / n).read_bytes() != change.site.pages[name[n]])
    return ModeResult(mode, first, second, len(change.changed), len(change.added),
                      len(change.removed), len(written), sorted(expected - written),
                      sorted(written - expected), wrong)


def report(results: list[ModeResult]) -> bool:
    """Print the figures and the bars; whether every bar passed."""
    print("\n| mode | generation | command wall, s | first to last page request, s | pages "
          "requested | body MB sent | crawl CPU ms a page | Redis CPU ms a page | round trips "
          "a page | script calls a page | server CPU ms a page |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        for label, g in (("1", r.first), ("2", r.second)):
            print(f"| {r.mode} | {label} | {g.wall:.2f} | {g.span:.2f} | {g.requests:,} | "
                  f"{g.body_bytes / 1e6:.2f} | {1000 * g.per_page(g.cpu):.2f} | "
                  f"{1000 * g.per_page(g.redis_cpu):.3f} | {g.per_page(g.round_trips):.2f} | "
                  f"{g.per_page(g.scripts):.2f} | {1000 * g.per_page(g.server_cpu):.2f} |")
        print(f"| {r.mode} | 2 / 1 | {r.ratio('wall'):.3f} | {r.ratio('span'):.3f} | "
              f"{r.ratio('requests'):.3f} | {r.ratio('body_bytes'):.3f} | "
              f"{r.ratio_a_page('cpu'):.3f} | {r.ratio_a_page('redis_cpu'):.3f} | "
              f"{r.ratio_a_page('round_trips'):.3f} | {r.ratio_a_page('scripts'):.3f} | "
              f"{r.ratio_a_page('server_cpu'):.3f} |")
    print()
    for r in results:
        print(f"{r.mode}: generation 1: {r.first.summary}")
        print(f"{r.mode}: generation 2: {r.second.summary}")
        print(f"{r.mode}: the site changed {r.changed} pages, added {r.added}, removed "
              f"{r.removed}; generation 2 wrote {r.saved} files: {len(r.missed)} missed, "
              f"{len(r.extra)} extra, {len(r.wrong)} not the page served"
              + (f" (missed {r.missed[:5]}, extra {r.extra[:5]}, wrong {r.wrong[:5]})"
                 if r.missed or r.extra or r.wrong else ""))
    bars: list[tuple[str, bool]] = []
    for r in results:
        bars.append((f"{r.mode}: generation 2 saves exactly the changed and added pages "
                     f"({len(r.missed)} missed, {len(r.extra)} extra)",
                     not (r.missed or r.extra or r.wrong)))
        if r.mode == "etag":
            bars.append((f"etag: generation 2 downloads at most {MAX_BYTES_RATIO:.0%} of "
                         f"generation 1's body bytes ({r.ratio('body_bytes'):.1%})",
                         r.ratio("body_bytes") <= MAX_BYTES_RATIO))
        bars.append((f"{r.mode}: generation 2's first to last page request at most "
                     f"{MAX_TIME_RATIO:.0%} of generation 1's ({r.ratio('span'):.1%}; the "
                     f"command's wall time: {r.ratio('wall'):.1%})",
                     r.ratio("span") <= MAX_TIME_RATIO))
    print()
    for text, ok in bars:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    if any(r.mode == "digest" for r in results):
        print("\n(digest: the server sends no validators, so every known page's whole body is "
              "downloaded again; an unchanged one is neither saved nor parsed for links.)")
    return all(ok for _, ok in bars)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=5000, help="pages of the site (reachable)")
    parser.add_argument("--page-bytes", type=int, default=6000, help="about a page's size")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="etag (validators and 304s), digest (neither), or both")
    parser.add_argument("--seed", type=int, default=2, help="evolve_site's seed")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a crawl may take")
    parser.add_argument("--keep", action="store_true", help="keep the outputs and the logs")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes: one or more of {', '.join(MODES)}")
    unwind_on_sigterm()
    print(machine(), flush=True)
    site = generate_site(args.pages, seed=1, unreachable=0,
                         page_padding=max(0, args.page_bytes - 400))
    mean = sum(len(b) for b in site.pages.values()) / len(site.pages)
    print(f"site: {len(site.reachable):,} pages of {mean:,.0f} bytes on average; between the "
          "generations 10 % change, 2 % are added, 2 % removed", flush=True)
    work = Path(tempfile.mkdtemp(prefix="distscrape-revisits-"))
    results = []
    try:
        for mode in modes:
            results.append(run_mode(mode, site, work, args.seed, args.timeout))
            g1, g2 = results[-1].first, results[-1].second
            print(f"{mode}: generation 1 {g1.wall:.1f}s, generation 2 {g2.wall:.1f}s",
                  flush=True)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if report(results) else 1


if __name__ == "__main__":
    sys.exit(main())
