"""The ``distscrape`` command: seed jobs, watch them, or crawl a site in one command."""

from __future__ import annotations

import contextlib
import json
import socket
import sys
from pathlib import Path
from typing import Any, Optional

import click

from .errors import DistscrapeError, JobConflict
from .jobspec import JobSpec, build_spec, load_config_file, merge
from .keys import check_job_name
from .lifecycle import Terminated, stop_signals
from .settings import Settings

EXIT_OK, EXIT_DEAD_ITEMS, EXIT_ERROR = 0, 1, 2


def _settings(redis_url: Optional[str], lease_seconds: Optional[float] = None) -> Settings:
    return Settings.from_env(redis_url=redis_url, lease_seconds=lease_seconds)


def _spec(
    seeds: tuple[str, ...], config: Optional[str], link_regex: Optional[str],
    output: Optional[str], all_hosts: bool = False, politeness: Optional[dict[str, Any]] = None,
) -> JobSpec:
    data: dict[str, Any] = load_config_file(config) if config else {}
    data = merge(
        data,
        {
            "seeds": list(seeds) or None,
            "scraper": {"link_regex": link_regex, "same_host": False if all_hosts else None},
            "saver": {"output": output},
            "politeness": politeness or {},
        },
    )
    if not data.get("seeds"):
        raise click.UsageError("give at least one SEED URL (or seeds = [...] in --config)")
    saver = data.setdefault("saver", {})
    if isinstance(saver, dict):
        output = str(saver.get("output") or "crawl-output")
        # Absolute, so that every worker writes to the same place whatever its directory. A URL
        # (the redis saver's output) is not a path.
        saver["output"] = output if "://" in output else str(Path(output).expanduser().resolve())
    return build_spec(data)


def _redis_runtime(settings: Settings):
    from .celery_app import configure_app
    from .manager import CrawlManager
    from .tasks import publisher
    from .tracker import RedisTracker

    tracker = RedisTracker.from_settings(settings)
    configure_app(settings)
    return tracker, CrawlManager(tracker, publisher.scrape)


redis_url_option = click.option(
    "--redis-url", metavar="URL", help="Tracker Redis (default: $DISTSCRAPE_REDIS_URL or local)."
)
spec_options = [
    click.option("--link-regex", metavar="REGEX", help="Follow only links whose URL matches."),
    click.option("--output", metavar="DIR", help="Where pages are saved (default ./crawl-output)."),
    click.option("--config", type=click.Path(dir_okay=False), help="TOML job file."),
    click.option("--all-hosts", is_flag=True, help="Follow links to any host, not only the seeds'."),
]


def with_spec_options(fn):
    for option in reversed(spec_options):
        fn = option(fn)
    return fn


# The job spec's `politeness` section; each option's value lands under its own name.
politeness_options = [
    click.option("--max-rate", type=click.FloatRange(0, min_open=True), metavar="N",
                  help="Most requests per second to one domain, across all workers."),
    click.option("--per-domain-concurrency", type=click.IntRange(1), metavar="N",
                  help="Most requests in flight to one domain, across all workers (default 8)."),
    click.option("--max-pages", type=click.IntRange(1), metavar="N",
                  help="Stop adding items once the job holds N."),
    click.option("--max-pages-per-domain", type=click.IntRange(1), metavar="N",
                  help="Stop adding items of a domain once the job holds N of it."),
]


def with_politeness_options(fn):
    for option in reversed(politeness_options):
        fn = option(fn)
    return fn


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Distributed web crawler on Celery and Redis."""


@cli.command()
@click.argument("job")
@click.argument("seeds", nargs=-1)
@with_spec_options
@with_politeness_options
@redis_url_option
def seed(job, seeds, link_regex, output, config, all_hosts, redis_url, **politeness) -> None:
    """Create JOB (or add to it) and queue its SEED URLs for the workers."""
    spec = _spec(seeds, config, link_regex, output, all_hosts, politeness)
    tracker, manager = _redis_runtime(_settings(redis_url))
    live = [w for w in tracker.workers() if w.alive]
    if live and all(w.host == socket.gethostname() for w in live):
        # The output is written on this machine: a bad one is refused before anything is fetched.
        # Workers elsewhere write on their own hosts, which cannot be checked from here.
        from .crawl import check_local_output

        check_local_output(spec)
    res = manager.seed(job, spec)
    verb = "created" if res.created else "already existed; seeds re-added"
    click.echo(f"job {job} {verb}: {res.added} new item(s), {res.dispatched} sent to workers now")
    if not any(w.alive for w in tracker.workers()):
        click.echo("no worker is alive yet: the job waits in Redis until one starts", err=True)


@cli.command()
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
@redis_url_option
def status(job, as_json, redis_url) -> None:
    """Show how far JOB has got."""
    tracker, manager = _redis_runtime(_settings(redis_url))
    stats = manager.status(job)
    if as_json:
        click.echo(json.dumps({"job": job, **stats.to_dict()}))
        return
    _print_stats(job, stats, tracker.dead_items(job, limit=STATUS_DEAD_SHOWN))


STATUS_DEAD_SHOWN = 10


@cli.command()
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line: item, reason.")
@redis_url_option
def dead(job, as_json, redis_url) -> None:
    """List every dead item of JOB with the reason it was given up on, one a line."""
    tracker, _ = _redis_runtime(_settings(redis_url))
    for item, reason in tracker.iter_dead(job):
        if as_json:
            click.echo(json.dumps({"item": item, "reason": reason}))
        else:
            click.echo(f"{item}\t{reason}")


@cli.command("retry-dead")
@click.argument("job")
@redis_url_option
def retry_dead(job, redis_url) -> None:
    """Queue every dead item of JOB again, its failure counts reset."""
    tracker, _ = _redis_runtime(_settings(redis_url))
    from .tasks import publisher

    res = tracker.retry_dead(job)
    if res.dispatch:
        publisher.scrape(job, res.dispatch)
    click.echo(f"job {job}: {res.requeued} dead item(s) queued again")


def _print_stats(job, stats, dead: dict[str, str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"job {job}", show_header=False)
    for key, value in stats.to_dict().items():
        table.add_row(key, str(value))
    console = Console()
    console.print(table)
    for item, reason in dead.items():
        console.print(f"[red]dead[/red] {item}: {reason}")
    if stats.dead > len(dead):
        console.print(f"{stats.dead - len(dead)} more: see distscrape dead {job}")


@cli.command()
@click.argument("seeds", nargs=-1)
@click.option("--job", metavar="NAME", help="Job name (default: crawl-HOST, from the first seed).")
@with_spec_options
@with_politeness_options
@redis_url_option
@click.option("--concurrency", type=click.IntRange(1, 256), default=4, show_default=True,
              help="Concurrent downloads.")
@click.option("--in-memory", is_flag=True,
              help="No Redis at all: one process, in-memory tracker and transport.")
@click.option("--lease-seconds", type=click.FloatRange(0.5), help="Lease length (default 60).")
@click.option("--state-dir", metavar="DIR",
              help="Where the embedded Redis keeps the crawl's state, so that running the same "
                   "command again resumes it (default: OUTPUT.distscrape-state beside the output).")
@click.option("--fresh", is_flag=True, help="Delete the crawl's state first and start over.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def crawl(seeds, job, link_regex, output, config, all_hosts, redis_url, concurrency, in_memory,
          lease_seconds, state_dir, fresh, quiet, **politeness) -> None:
    """Crawl from SEED URLs on this machine, start to finish, and exit.

    Without --redis-url an embedded Redis is started and stopped again; real Celery worker
    processes do the work. The embedded Redis keeps the crawl's state in --state-dir, so the same
    command, run again after an interruption, resumes the crawl. Exit status: 0 all saved, 1
    finished with dead items, 2 error, 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP.
    """
    with stop_signals():
        _crawl(seeds, job, link_regex, output, config, all_hosts, redis_url, concurrency,
               in_memory, lease_seconds, state_dir, fresh, quiet, politeness)


def _crawl(seeds, job, link_regex, output, config, all_hosts, redis_url, concurrency, in_memory,
           lease_seconds, state_dir, fresh, quiet, politeness) -> None:
    from .crawl import (
        check_local_output, default_job_name, default_state_dir, run_in_memory_crawl,
        run_local_crawl, state_directory,
    )

    spec = _spec(seeds, config, link_regex, output, all_hosts, politeness)
    if in_memory and redis_url:
        raise click.UsageError("--in-memory and --redis-url exclude each other")
    if (state_dir or fresh) and (in_memory or redis_url):
        raise click.UsageError(
            "--state-dir and --fresh are for the embedded Redis: with --redis-url the state is in "
            "that Redis (use another --job to start over), and --in-memory keeps none"
        )
    settings = _settings(redis_url, lease_seconds)
    job = job or default_job_name(spec)
    check_job_name(job)
    check_local_output(spec)
    embedded = not in_memory and not redis_url
    state = Path(state_dir or default_state_dir(spec, job)).expanduser().resolve() if embedded else None

    progress = _progress(quiet)
    say = progress.say
    with contextlib.ExitStack() as stack:
        if state is not None:
            stack.enter_context(state_directory(state, fresh=fresh))
        try:
            with progress as on_progress:
                if in_memory:
                    result = run_in_memory_crawl(job, spec, settings, concurrency=concurrency,
                                                 on_progress=on_progress)
                else:
                    result = run_local_crawl(job, spec, settings, embedded_redis=embedded,
                                             state_dir=state, concurrency=concurrency,
                                             on_progress=on_progress, say=say)
        except JobConflict as exc:
            hint = (f"; --fresh starts over in {state}" if state is not None
                    else "; give another --job")
            raise JobConflict(f"{exc}{hint}") from None
        except (KeyboardInterrupt, Terminated):
            if state is not None:
                say(f"distscrape: the crawl's state is kept in {state}; "
                    "run the same command again to resume it")
            raise
    s = result.stats
    if result.already_finished:
        click.echo(
            f"job {job} is already finished: {s.done} saved, {s.dead} dead, {s.seen} seen; "
            f"output in {spec.saver.output}"
        )
        if state is not None:
            say(f"(its state is in {state}; --fresh crawls it again)")
    else:
        click.echo(
            f"job {job}: {s.done} saved, {s.dead} dead, {s.seen} seen in {result.seconds:.1f}s "
            f"({result.pages_per_second:.1f} pages/s); output in {spec.saver.output}"
        )
    if s.dead:
        for item, reason in list(result.dead.items())[:10]:
            click.echo(f"  dead: {item}: {reason}", err=True)
        sys.exit(EXIT_DEAD_ITEMS)


class _progress:
    """A live progress bar on a terminal; nothing when quiet or not a terminal."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.bar = None

    def __enter__(self):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        if self.quiet or not console.is_terminal:
            return None
        self.bar = Progress(
            TextColumn("[bold]crawling"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console,
        )
        self.bar.start()
        task = self.bar.add_task("crawl", total=None, detail="")

        def update(stats) -> None:
            self.bar.update(
                task, total=max(stats.seen, 1), completed=stats.done + stats.dead,
                detail=f"{stats.leased} active, {stats.queued} queued, {stats.dead} dead",
            )

        return update

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def say(self, message: str) -> None:
        """A line on stderr, above the bar while it is shown (which would paint over it)."""
        if self.bar is not None:
            self.bar.console.print(message, markup=False, highlight=False, soft_wrap=True)
        else:
            click.echo(message, err=True)


def main(argv: Optional[list[str]] = None) -> None:
    try:
        cli.main(args=argv, prog_name="distscrape", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("distscrape: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_ERROR)
    except DistscrapeError as exc:
        click.echo(f"distscrape: error: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt:
        click.echo("distscrape: interrupted", err=True)
        sys.exit(130)
    except Terminated as exc:
        click.echo(f"distscrape: stopped by {exc.signal_name}", err=True)
        sys.exit(exc.exit_status)


if __name__ == "__main__":
    main()
