"""``distscrape crawl`` as the benchmark runs it: the README's one command on a site, limits set
high (or the default ones), with this checkout's package or another's (``--baseline``), under
py-spy if asked (``--profile``)."""

from __future__ import annotations

from pathlib import Path

from bench.helpers import BIN, PEERS, clean_env
from bench.probes import (RUNS, Result, StartupCpu, embedded_probe, run_measured,
                          site_figures)
from bench.sites import Site

# Our politeness limits set high, so that a crawl of one site measures the crawler.
HIGH_LIMITS = ["--per-domain-concurrency", "256"]


def high_limits(args) -> list[str]:
    """The suite's per-site limit for our crawls: HIGH_LIMITS, or ``--per-domain`` (the peers'
    64 in flight, to compare at equal concurrency)."""
    per_domain = getattr(args, "per_domain", None)
    return HIGH_LIMITS if per_domain is None else ["--per-domain-concurrency", str(per_domain)]


def crawl_default(site: Site, site_name: str, work: Path, args, extra: list[str] = (),
                  baseline: bool = False, polite: bool = False) -> Result:
    """The README's one command: ``distscrape crawl URL --output DIR``, limits set high (with
    ``polite``, the default limits: 8 requests in flight to the site). With ``baseline``, the
    package is imported from ``--baseline`` (another version's source)."""
    # Each run its own output: a crawl refuses an output that holds another job's state.
    out = work / f"default-{site_name}-{'baseline-' if baseline else ''}{next(RUNS)}-out"
    mark = site.mark()
    state = Path(str(out) + ".distscrape-state")
    command = [str(BIN / "distscrape"), "crawl", *site.seeds, "--output", str(out), "--quiet",
               *([] if polite else high_limits(args)), *extra]
    if args.profile:
        # Collapsed stacks of every Python process of the crawl, only samples holding the GIL
        # (Python CPU, not threads blocked in socket reads); CPU figures then include py-spy.
        command = [str(PEERS / "bin" / "py-spy"), "record", "--subprocesses", "--nonblocking",
                   "--format", "raw", "--gil",
                   "--rate", "100", "-o", str(Path(
                       args.profile, f"default-{site_name}{'-baseline' if baseline else ''}.txt")),
                   "--", *command]
    env = clean_env()
    if baseline:
        env["PYTHONPATH"] = args.baseline
    # Its embedded Redis is left out of the start-up as it is out of the whole (below).
    startup = StartupCpu(site, mark, leave_out=frozenset({"redis-server"}))
    status, wall, cpu, probe = run_measured(
        command, env, args.timeout, work / f"default-{site_name}.log", embedded_probe(state),
        startup)
    cmds, rcpu, reads = probe.delta() if probe else (0.0, 0.0, 0.0)
    name = ("distscrape crawl (defaults" + (", default politeness)" if polite else ")")
            + (" " + " ".join(extra) if extra else "") + (" [baseline]" if baseline else ""))
    r = Result(name, site_name, wall=wall, cpu=cpu, startup_cpu=startup.seconds(),
               redis_cmds=cmds, redis_cpu=rcpu, redis_reads=reads, ok=status == 0,
               redis_probe=probe)
    r.redis_scripts = probe.scripts() if probe else 0.0
    site_figures(r, site, mark)
    # The embedded Redis is a child of the command: its CPU is in the rusage; take it out,
    # all of it (INFO's CPU counts from its start), not only the crawl's share in rcpu.
    r.cpu -= probe.last["cpu"] if probe else 0.0
    saved = sum(1 for p in out.rglob("*") if p.is_file())
    r.note = f"{saved} files saved"
    r.ok = r.ok and saved == r.distinct == site.expected
    return r
