"""``distscrape crawl``: crawl a site on this machine in one command, start to finish."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import click

from ..errors import JobConflict, SaveError
from ..job.spec import JobSpec
from ..lifecycle import Terminated, stop_signals
from ..redaction import escape, redact
from ..local.shape import CRAWL_DEFAULTS, DEFAULT_CRAWL_CONCURRENCY
from ..settings import ENV_PREFIX, Settings
from ..tracker.keys import check_job_name
from .group import EXIT_DEAD_ITEMS, EXIT_ERROR, cli, redis_tracker, settings_for
from .progress import CrawlProgress
from .spec_options import check_spec_components, spec_data, spec_from_data, with_spec_options

if TYPE_CHECKING:
    from ..local.crawl import CrawlResult


@cli.command()
@click.argument("seeds", nargs=-1)
@click.option("--job", metavar="NAME", help="Job name (default: crawl-HOST, from the first seed).")
@with_spec_options
@click.option("--redis-url", metavar="URL",
              help="Crawl on this Redis, with its workers, instead of an embedded one. "
                   "$DISTSCRAPE_REDIS_URL is not used here: a crawl joins a shared Redis only "
                   "when told to.")
@click.option("--concurrency", type=click.IntRange(1, 256), default=DEFAULT_CRAWL_CONCURRENCY,
              show_default=True,
              help="Concurrent tasks (downloads, and saves when DISTSCRAPE_SAVE_INLINE=false), "
                   "split over two worker processes per core, each a threads pool.")
@click.option("--in-memory", is_flag=True,
              help="No Redis at all: one process, in-memory tracker and transport.")
@click.option("--lease-seconds", type=click.FloatRange(0.5), help="Lease length (default 60).")
@click.option("--state-dir", metavar="DIR",
              help="Where the embedded Redis keeps the crawl's state, so that running the same "
                   "command again resumes it (default: OUTPUT.distscrape-state beside the output).")
@click.option("--fresh", is_flag=True, help="Delete the crawl's state first and start over.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def crawl(seeds, job, spec_flags, redis_url, concurrency, in_memory, lease_seconds, state_dir,
          fresh, quiet) -> None:
    """Crawl from SEED URLs on this machine, start to finish, and exit.

    Without --redis-url an embedded Redis is started and stopped again; real Celery worker
    processes do the work. The embedded Redis keeps the crawl's state in --state-dir, so the same
    command, run again after an interruption, resumes the crawl. Exit status: 0 all saved, 1
    finished with dead items, 2 error, 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP.
    """
    with stop_signals():
        _crawl(seeds, job, spec_flags, redis_url, concurrency, in_memory, lease_seconds,
               state_dir, fresh, quiet)


def _crawl(seeds, job, spec_flags, redis_url, concurrency, in_memory, lease_seconds, state_dir,
           fresh, quiet) -> None:
    plan = _plan(seeds, job, spec_flags, redis_url, in_memory, lease_seconds, state_dir, fresh)
    progress = CrawlProgress(quiet)
    result, output, join_failed = _run(plan, progress, concurrency=concurrency, fresh=fresh)
    _report(plan, result, output, join_failed, progress.say)


@dataclass(frozen=True)
class _Plan:
    """What one ``distscrape crawl`` runs, checked before anything is started."""

    job: str
    spec: JobSpec
    settings: Settings
    in_memory: bool
    embedded: bool  # on a Redis of its own: neither --in-memory nor --redis-url
    # The embedded Redis's state directory; None with --in-memory or --redis-url.
    state: Optional[Path]


def _plan(seeds, job, spec_flags, redis_url, in_memory, lease_seconds, state_dir,
          fresh) -> _Plan:
    """Check the command line and build the crawl's spec, settings and job name; reach a Redis
    named by --redis-url, and the output directory, before anything is made on disk."""
    from ..core.seeding import check_local_output
    from ..local.crawl import default_job_name, with_own_output_root
    from ..local.state import state_dir_path

    data, names = spec_data(seeds, spec_flags)
    spec = spec_from_data(data, names)
    if spec.schedule is not None:
        raise click.UsageError(
            "distscrape crawl runs one generation and exits: a [schedule] is for jobs seeded to "
            "workers (distscrape seed --every/--cron); run the same crawl again (from cron, say) "
            "for its next generation")
    if in_memory and redis_url:
        raise click.UsageError("--in-memory and --redis-url exclude each other")
    if (state_dir or fresh) and (in_memory or redis_url):
        raise click.UsageError(
            "--state-dir and --fresh are for the embedded Redis: with --redis-url the state is in "
            "that Redis (use another --job to start over), and --in-memory keeps none"
        )
    # The user runs their own spec here, on workers this command starts for it: the classes it
    # names are theirs to load. Its workers get that allow-list; with --redis-url they also take
    # other jobs of that Redis, which may name these modules and no others.
    process_settings = settings_for(redis_url, lease_seconds, CRAWL_DEFAULTS)
    settings = with_own_output_root(_with_own_plugins(process_settings, spec), spec)
    check_spec_components(spec, settings, names)
    # Its own workers run with these settings: a proxy or credential missing here is missing
    # there.
    from ..web.fetch_policy import check_policy_settings

    check_policy_settings(spec, settings, own_workers=True)
    job = job or default_job_name(spec)
    check_job_name(job)
    if redis_url:
        # Reach the Redis named before anything is made on disk for the crawl.
        redis_tracker(settings).ping()
    check_local_output(spec)
    embedded = not in_memory and not redis_url
    if embedded and "redis_url" in process_settings.model_fields_set:  # from the environment
        click.echo(f"distscrape: note: crawl does not use ${ENV_PREFIX}REDIS_URL; it runs on a "
                   "Redis of its own (give --redis-url to crawl on that one)", err=True)
    state = state_dir_path(state_dir, spec, job) if embedded else None
    return _Plan(job, spec, settings, in_memory, embedded, state)


def _run(
    plan: _Plan, progress: CrawlProgress, *, concurrency: int, fresh: bool
) -> tuple[CrawlResult, str, Optional[SaveError]]:
    """Crawl ``plan`` to its end, holding its state directory, then join its archive shards
    into the output. Returns the crawl's result, where its output is, and the join's error (the
    shards are then kept). An interruption says where the state and the saved pages are."""
    from ..local.crawl import archive_shards, join_archive, run_in_memory_crawl, run_local_crawl
    from ..local.state import state_directory

    job, spec, settings, state = plan.job, plan.spec, plan.settings, plan.state
    say = progress.say
    with contextlib.ExitStack() as stack:
        if state is not None:
            stack.enter_context(state_directory(state, fresh=fresh))
        try:
            with progress as on_progress:
                if plan.in_memory:
                    result = run_in_memory_crawl(job, spec, settings, concurrency=concurrency,
                                                 on_progress=on_progress)
                    # This process ends soon: leave the stopped worker's objects to the exit,
                    # not to the collection on the way out (about 0.6 s for a small crawl).
                    gc.freeze()
                else:
                    result = run_local_crawl(job, spec, settings, embedded_redis=plan.embedded,
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
            shards = archive_shards(spec)
            if shards:
                then = ("the resumed crawl joins them into it at its end" if state is not None
                        else "they were not joined, as the crawl did not finish")
                say(f"distscrape: the pages saved so far are in {_shard_list(shards)}, "
                    f"not yet in {spec.saver.output}: {then}")
            raise
        # The workers are stopped: join their archive shards into the file the user named,
        # still holding the state directory, so that no other crawl adds shards meanwhile.
        output, join_failed = spec.saver.output, None
        if spec.saver.table is not None and spec.saver.kind == "postgres":
            output = f"table {spec.saver.table}"
        try:
            join_archive(spec, job)
        except SaveError as exc:
            join_failed = exc
            output = _shard_list(archive_shards(spec)) or output
    return result, output, join_failed


def _report(
    plan: _Plan, result: CrawlResult, output: str, join_failed: Optional[SaveError],
    say: Callable[[str], None],
) -> None:
    """Print how the crawl ended, and exit with its status: 2 when the join failed, 1 with
    dead items."""
    job, stats = plan.job, result.stats
    saved = stats.saved
    # A job that revisits says what its revisits found; any job, the pages it left unsaved
    # because of what they said.
    unsaved = ([f"{stats.unchanged} unchanged", f"{stats.gone} gone"]
               if stats.unchanged or stats.gone else [])
    if stats.noindex:
        unsaved.append(f"{stats.noindex} noindex")
    if stats.canonical:
        unsaved.append(f"{stats.canonical} canonical elsewhere")
    revisits = f" ({', '.join(unsaved)})" if unsaved else ""
    left = f", {stats.queued} left queued" if result.expired else ""
    if result.already_finished:
        ended = "expired (its max_duration ran out)" if result.expired else "finished"
        click.echo(
            f"job {job} is already {ended}: {saved} saved{revisits}, {stats.dead} dead, "
            f"{stats.seen} seen{left}; output in {redact(output)}"
        )
        if plan.state is not None:
            say(f"(its state is in {plan.state}; --fresh crawls it again)")
    else:
        ended = " expired (its max_duration ran out)" if result.expired else ""
        click.echo(
            f"job {job}{ended}: {saved} saved{revisits}, {stats.dead} dead, {stats.seen} seen{left} "
            f"in {result.seconds:.1f}s ({result.pages_per_second:.1f} pages/s); "
            f"output in {redact(output)}"
        )
    if stats.dead:
        for item, reason in list(result.dead.items())[:10]:
            # Both quote what a site sent: escaped, so no control character reaches the terminal.
            click.echo(f"  dead: {escape(item)}: {escape(reason)}", err=True)
    if join_failed is not None:
        click.echo(f"distscrape: error: {join_failed}; the shards are kept", err=True)
        sys.exit(EXIT_ERROR)
    if stats.dead:
        sys.exit(EXIT_DEAD_ITEMS)


def _with_own_plugins(settings: Settings, spec: JobSpec) -> Settings:
    """``settings`` that also allow the modules of the classes ``spec`` names: for `distscrape
    crawl`, whose spec is written by the very user who runs it, on workers of its own."""
    from ..core.components import spec_plugin_modules

    modules = spec_plugin_modules(spec)
    if not modules:
        return settings
    allowed = tuple(dict.fromkeys((*settings.plugin_modules, *modules)))
    return Settings.model_validate({**settings.model_dump(), "plugin_modules": allowed})


def _shard_list(shards: list[Path], show: int = 10) -> str:
    """``shards`` for a message: how many, and the names of the first ``show``."""
    if not shards:
        return ""
    names = ", ".join(str(shard) for shard in shards[:show])
    more = f" and {len(shards) - show} more beside them" if len(shards) > show else ""
    return f"{len(shards)} shard(s): {names}{more}"
