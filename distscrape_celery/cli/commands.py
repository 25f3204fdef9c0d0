"""The ``distscrape`` command: seed jobs, watch them, or crawl a site in one command."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import click

from .jobs import register as register_job_commands, when as _when
from ..errors import ConfigError, DistscrapeError, JobConflict, JobNotFound, SaveError
from ..job.spec import JobSpec, build_spec, load_config_file, merge, saver_kind_for
from ..tracker.keys import check_job_name
from ..lifecycle import Terminated, stop_signals
from ..redaction import redact
from ..job.seeds import BadLine, SeedFile
from ..settings import DEFAULT_CRAWL_CONCURRENCY, Settings
from ..tracker.model import JobState
from ..job.urls import DEFAULT_TRACKING_PARAMS, Canonicalizer

EXIT_OK, EXIT_DEAD_ITEMS, EXIT_ERROR = 0, 1, 2


def _settings(redis_url: Optional[str], lease_seconds: Optional[float] = None) -> Settings:
    return Settings.from_env(redis_url=redis_url, lease_seconds=lease_seconds)


def _spec_data(
    seeds: tuple[str, ...], flags: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The job's spec as data (--config, overridden by the flags and SEEDs), and what each field
    is called in errors: the flag that set it, or the field and the file it came from."""
    config = flags["config"]
    data: dict[str, Any] = load_config_file(config) if config else {}
    names = {field: f"{field} in {config}" for field in _fields(data)}
    overrides: dict[str, Any] = {"seeds": list(seeds) or None}
    for param, (option, field) in SPEC_FLAGS.items():
        value = flags[param]
        if param in FLAG_VALUES:
            value = FLAG_VALUES[param] if value else None
        elif isinstance(value, tuple):  # a repeatable option
            value = list(value) or None
        if value is not None:
            section, _, key = field.partition(".")
            overrides.setdefault(section, {})[key] = value
            names[field] = option
        elif field not in names:  # given nowhere: named as it may be given
            names[field] = f"{field} (or {option})" if config else option
    # Seeds are checked as a whole (they depend on the scraper), so their errors have no field.
    names["(root)"] = "SEED" if seeds else f"seeds in {config}"
    return merge(data, overrides), names


def _fields(data: Any, prefix: str = "") -> list[str]:
    """Every dotted field of a (nested) dict, sections included."""
    if not isinstance(data, dict):
        return []
    out = []
    for key, value in data.items():
        field = f"{prefix}{key}"
        out += [field, *_fields(value, field + ".")]
    return out


def _build_spec(data: dict[str, Any], names: dict[str, str]) -> JobSpec:
    if not data.get("seeds"):
        raise click.UsageError(
            "give at least one SEED URL (or seeds = [...] in --config, or an --ids-file)"
        )
    saver = data.setdefault("saver", {})
    if isinstance(saver, dict):
        output = str(saver.get("output") or "crawl-output")
        # Absolute, so that every worker writes to the same place whatever its directory. A URL
        # (the redis saver's output) is not a path.
        saver["output"] = output if "://" in output else str(Path(output).expanduser().resolve())
    # A problem with the saver or scraper as a whole is named by what chose its kind.
    for section in ("scraper", "saver"):
        if f"{section}.kind" in names:
            names[section] = names[f"{section}.kind"]
    return build_spec(data, names)


def _check_components(spec: JobSpec, settings: Settings, names: dict[str, str]) -> None:
    """Refuse, before anything is stored or fetched, a spec whose classes or output ``settings``
    (this process's) do not allow, as a worker with the same settings would."""
    from ..core.components import check_components

    check_components(spec, settings, names)


def _with_own_plugins(settings: Settings, spec: JobSpec) -> Settings:
    """``settings`` that also allow the modules of the classes ``spec`` names: for `distscrape
    crawl`, whose spec is written by the very user who runs it, on workers of its own."""
    from ..core.components import spec_plugin_modules

    modules = spec_plugin_modules(spec)
    if not modules:
        return settings
    allowed = tuple(dict.fromkeys((*settings.plugin_modules, *modules)))
    return Settings.model_validate({**settings.model_dump(), "plugin_modules": allowed})


def _redis_runtime(settings: Settings):
    from ..worker.app import configure_app
    from ..core.manager import CrawlManager
    from ..worker.tasks import publisher
    from ..tracker import RedisTracker

    tracker = RedisTracker.from_settings(settings)
    configure_app(settings)
    return tracker, CrawlManager(tracker, publisher.scrape, settings=settings)


redis_url_option = click.option(
    "--redis-url", metavar="URL", help="Tracker Redis (default: $DISTSCRAPE_REDIS_URL or local)."
)
spec_options = [
    click.option("--link-regex", metavar="REGEX", help="Follow only links whose URL matches."),
    click.option("--output", metavar="PATH",
                 help="Where items are saved: a directory, a .tar/.tar.gz/.tar.bz2 or .warc.gz "
                      "name, or a redis:// URL (default ./crawl-output)."),
    click.option("--config", type=click.Path(dir_okay=False), help="TOML job file."),
    click.option("--all-hosts", is_flag=True, help="Follow links to any host, not only the seeds'."),
]
scraper_saver_options = [
    click.option("--scraper", metavar="simple|ids|MODULE:CLASS",
                 help="What finds new items: links (simple, the default), IDs (ids), or a "
                      "Scraper class of your own, from a module that DISTSCRAPE_PLUGIN_MODULES "
                      "allows (in the workers' settings and this command's)."),
    click.option("--id-regex", metavar="REGEX",
                 help="ids scraper: new IDs are this regex's matches (its first group, if any)."),
    click.option("--download-url-fmt", metavar="URL",
                 help="ids scraper: the URL an ID is downloaded from, with {id} for the ID."),
    click.option("--saver", metavar="files|redis|tar|warc|MODULE:CLASS",
                 help="How items are saved (default: the saver --output names: a redis:// URL "
                      "redis, a .tar* name tar, a .warc.gz name warc, else files), or a class "
                      "of your own, as for --scraper."),
]
# What a job fetches and how (see docs/configuration.md, Crawl policy).
policy_options = [
    click.option("--ignore-robots", is_flag=True, help="Fetch what robots.txt disallows."),
    click.option("--user-agent", metavar="UA", help="User-Agent header, also matched in robots.txt."),
    click.option("--max-depth", type=click.IntRange(0), metavar="N",
                 help="Follow links at most N hops from a seed (0: the seeds only)."),
    click.option("--allow-domain", "allow_domains", multiple=True, metavar="DOMAIN",
                 help="Follow links to DOMAIN and its subdomains (repeatable; default: the "
                      "seeds' hosts)."),
    click.option("--allow-private", is_flag=True,
                 help="Let links reach private, loopback and link-local addresses (by default "
                      "only those the seeds give literally: an IP address, or localhost)."),
]
# How hard a job may hit each site, across all workers (see docs/configuration.md, Politeness).
politeness_options = [
    click.option("--max-rate", type=click.FloatRange(0, min_open=True), metavar="N",
                 help="Most requests per second to one domain, across all workers."),
    click.option("--per-domain-concurrency", type=click.IntRange(1), metavar="N",
                 help="Most requests in flight to one domain, across all workers (default 8)."),
    click.option("--max-pages", type=click.IntRange(1), metavar="N",
                 help="Stop adding items once the job holds N."),
    click.option("--max-pages-per-domain", type=click.IntRange(1), metavar="N",
                 help="Stop adding items of a domain once the job holds N of it."),
    click.option("--shards", type=int, metavar="N",
                 help="Spread the job over N hash-tag shards by domain, so it uses several "
                      "masters of a Redis Cluster (default 1)."),
]
# The flags that set a field of the job's spec, by parameter: (option, field). They override
# --config field by field.
SPEC_FLAGS = {
    "link_regex": ("--link-regex", "scraper.link_regex"),
    "all_hosts": ("--all-hosts", "scraper.same_host"),
    "scraper": ("--scraper", "scraper.kind"),
    "id_regex": ("--id-regex", "scraper.id_regex"),
    "download_url_fmt": ("--download-url-fmt", "scraper.download_url_fmt"),
    "saver": ("--saver", "saver.kind"),
    "output": ("--output", "saver.output"),
    "ignore_robots": ("--ignore-robots", "fetch.obey_robots"),
    "user_agent": ("--user-agent", "fetch.user_agent"),
    "max_depth": ("--max-depth", "scraper.max_depth"),
    "allow_domains": ("--allow-domain", "scraper.allowed_domains"),
    "allow_private": ("--allow-private", "fetch.allow_private"),
    "max_rate": ("--max-rate", "politeness.max_rate"),
    "per_domain_concurrency": ("--per-domain-concurrency", "politeness.per_domain_concurrency"),
    "max_pages": ("--max-pages", "politeness.max_pages"),
    "max_pages_per_domain": ("--max-pages-per-domain", "politeness.max_pages_per_domain"),
    "shards": ("--shards", "tracker.shards"),
}
# On/off flags: the value a given flag sets its field to (not given, the field is left alone).
FLAG_VALUES = {"all_hosts": False, "ignore_robots": False, "allow_private": True}


def with_spec_options(fn):
    """Give a command the spec's options; they reach it as one ``spec_flags`` dict."""

    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> Any:
        flags = {param: kwargs.pop(param) for param in (*SPEC_FLAGS, "config")}
        return fn(*args, spec_flags=flags, **kwargs)

    for option in reversed(
        spec_options + scraper_saver_options + policy_options + politeness_options
    ):
        command = option(command)
    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Distributed web crawler on Celery and Redis."""


class _StderrBar:
    """A rich progress bar on stderr, shown on a terminal only, stopped on exit."""

    bar: Any = None

    def _start(self, *columns: Any) -> bool:
        """Show a bar of ``columns``; False (no bar) when stderr is not a terminal."""
        from rich.console import Console
        from rich.progress import Progress

        console = Console(stderr=True)
        if not console.is_terminal:
            return False
        self.bar = Progress(*columns, console=console)
        self.bar.start()
        return True

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


@cli.command()
@click.argument("job")
@click.argument("seeds", nargs=-1)
@with_spec_options
@click.option("--ids-file", metavar="FILE",
              help="More seeds, one a line (- for stdin): IDs for the ids scraper, else URLs. "
                   "Streamed in batches; malformed lines (and lines over 8192 bytes) are "
                   "reported and skipped.")
@redis_url_option
def seed(job, seeds, spec_flags, ids_file, redis_url) -> None:
    """Create JOB (or add seeds to it) and queue its SEEDs for the workers.

    With no option but seeds, a JOB that exists takes them as it is. Exit status: 0 done, 1 done
    but malformed --ids-file lines were skipped, 2 error."""
    data, names = _spec_data(seeds, spec_flags)
    settings = _settings(redis_url)
    runtime = None
    if not any(spec_flags.values()):
        runtime = _redis_runtime(settings)
        stored = _stored_spec(runtime[0], job)
        if stored is not None:
            data = {**stored, "seeds": data.get("seeds")}
    progress = _SeedProgress()
    more: Iterator[str] = iter(())
    with contextlib.ExitStack() as stack:
        if ids_file is not None:
            reader = _open_seed_file(stack, ids_file, data, progress)
            more = iter(reader)
            if not data.get("seeds"):
                # The spec needs a seed: the file's first, which is then not offered again.
                first = next(more, None)
                data["seeds"] = [first] if first is not None else None
        spec = _build_spec(data, names)
        _check_components(spec, settings, names)
        tracker, manager = runtime or _redis_runtime(settings)
        live = [w for w in tracker.workers() if w.alive]
        if live and all(w.host == socket.gethostname() for w in live):
            # The output is written on this machine: a bad one is refused before anything is
            # fetched. Workers elsewhere write on their own hosts, which cannot be checked here.
            from ..local.crawl import check_local_output

            check_local_output(spec)
        with progress:
            res = manager.seed(job, spec, more, on_progress=progress.update)
    verb = "created" if res.created else "exists; seeds added"
    click.echo(
        f"job {job} {verb}: {res.added} new item(s), {res.already_seen} already seen; "
        f"{res.dispatched} sent to workers now"
    )
    if res.off_host:
        click.echo(
            f"distscrape: {res.off_host} seed(s) are on none of the job's seeds' hosts: they are "
            "downloaded, but their links are not followed (the job stays on its seeds' hosts)",
            err=True,
        )
    if not any(w.alive for w in tracker.workers()):
        click.echo("no worker is alive yet: the job waits in Redis until one starts", err=True)
    if ids_file is not None and reader.bad:
        click.echo(f"distscrape: {reader.bad} malformed line(s) of {ids_file} skipped", err=True)
        sys.exit(EXIT_DEAD_ITEMS)


def _stored_spec(tracker, job: str) -> Optional[dict[str, Any]]:
    """The spec of ``job`` as data, its seeds left out; None if there is no such job."""
    try:
        spec = json.loads(tracker.load_spec(job))
    except JobNotFound:
        return None
    spec.pop("seeds", None)
    return spec


# Malformed lines of a seed file reported one by one; past this, only counted.
MAX_BAD_LINES_SHOWN = 20


def _open_seed_file(
    stack: contextlib.ExitStack, path: str, data: dict[str, Any], progress: "_SeedProgress"
) -> SeedFile:
    """A reader of the seed file ``path`` (``-``: stdin) for the job ``data`` describes; its
    malformed lines are reported on stderr, above the progress bar."""
    if path == "-":
        stream, size = sys.stdin.buffer, None
    else:
        try:
            stream = stack.enter_context(open(path, "rb"))
            size = os.fstat(stream.fileno()).st_size if Path(path).is_file() else None
        except OSError as exc:
            raise ConfigError(f"--ids-file: cannot read {path!r}: {exc.strerror or exc}") from None
    scraper = data.get("scraper")
    scraper = scraper if isinstance(scraper, dict) else {}
    canonicalizer = Canonicalizer(scraper.get("strip_params", DEFAULT_TRACKING_PARAMS))

    def report(bad: BadLine) -> None:
        if reader.bad <= MAX_BAD_LINES_SHOWN:
            progress.say(f"{path}:{bad.number}: {bad.reason}; skipped")
        if reader.bad == MAX_BAD_LINES_SHOWN:
            progress.say(f"{path}: further malformed lines are counted, not shown")

    reader = SeedFile(stream, scraper.get("kind"), report, canonicalizer)
    progress.track(reader, size)
    return reader


class _SeedProgress(_StderrBar):
    """A progress bar of a seed file's import (bytes read, seeds new and seen)."""

    def __init__(self) -> None:
        self.reader: Optional[SeedFile] = None
        self.size: Optional[int] = None

    def track(self, reader: SeedFile, size: Optional[int]) -> None:
        self.reader, self.size = reader, size

    def __enter__(self) -> "_SeedProgress":
        from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

        if self.reader is not None and self._start(
            TextColumn("[bold]seeding"), BarColumn(), TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
        ):
            self.task = self.bar.add_task("seed", total=self.size, detail="")
        return self

    def update(self, taken: int, new: int) -> None:
        if self.bar is not None and self.reader is not None:
            self.bar.update(
                self.task, completed=self.reader.bytes_read,
                detail=f"{taken:,} read: {new:,} new, {taken - new:,} already seen",
            )


@cli.command("tar-index")
@click.argument("output")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
def tar_index_command(output, as_json) -> None:
    """List which item is in which shard of the tar archive OUTPUT (a .tar, .tar.gz or .tar.bz2
    name, as given to --output): item, shard file and member name, tab-separated, one a line."""
    from ..savers import tar_index

    if saver_kind_for(output) != "tar":
        raise ConfigError(f"OUTPUT {output!r} is not a tar archive name (.tar, .tar.gz, .tar.bz2)")
    listed = 0
    for item, shard, member in tar_index(output):
        listed += 1
        if as_json:
            click.echo(json.dumps({"item": item, "shard": shard, "member": member}))
        else:
            click.echo(f"{item}\t{shard}\t{member}")
    if not listed:
        raise ConfigError(f"no saved items found in the shards of {output!r}")


@cli.command()
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
@click.option("--watch", is_flag=True, help="A live view, refreshed every second until Ctrl-C "
                                            "or the job ends.")
@redis_url_option
def status(job, as_json, watch, redis_url) -> None:
    """Show how far JOB has got: its state, times and counts."""
    from .jobs import job_row

    tracker, manager = _redis_runtime(_settings(redis_url))
    manager.status(job)  # JobNotFound for a job never seeded
    if as_json:
        click.echo(json.dumps(job_row(tracker, job)))
    elif watch:
        _watch(tracker, job)
    else:
        from rich.console import Console

        Console().print(_status_view(tracker, job))


def _watch(tracker, job: str) -> None:
    from rich.live import Live

    with Live(_status_view(tracker, job), auto_refresh=False) as live:
        while tracker.job_info(job).state in (JobState.RUNNING, JobState.PAUSED):
            time.sleep(1.0)
            live.update(_status_view(tracker, job), refresh=True)


def _status_view(tracker, job: str):
    """The job's figures as a table, then up to ten dead items and how many more there are."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from .jobs import job_row

    row = job_row(tracker, job)
    table = Table(title=f"job {job}", show_header=False)
    for key, value in row.items():
        if key not in ("job", "final"):
            table.add_row(key, _when(value) if key in ("started", "ended") else str(value))
    dead = tracker.dead_items(job, limit=STATUS_DEAD_SHOWN)
    lines = [Text.assemble(("dead", "red"), f" {item}: {reason}") for item, reason in dead.items()]
    if row["dead"] > len(dead):
        lines.append(Text(f"{row['dead'] - len(dead)} more: see distscrape dead {job}"))
    return Group(table, *lines)


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
    from ..worker.tasks import publisher

    res = tracker.retry_dead(job)
    if res.dispatch:
        publisher.scrape(job, res.dispatch)
    click.echo(f"job {job}: {res.requeued} dead item(s) queued again")


@cli.command()
@click.argument("seeds", nargs=-1)
@click.option("--job", metavar="NAME", help="Job name (default: crawl-HOST, from the first seed).")
@with_spec_options
@redis_url_option
@click.option("--concurrency", type=click.IntRange(1, 256), default=DEFAULT_CRAWL_CONCURRENCY,
              show_default=True,
              help="Concurrent tasks (downloads and saves), split over two worker processes per "
                   "core, each a threads pool.")
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
    from ..local.crawl import (
        archive_shards, check_local_output, default_job_name, default_state_dir, join_archive,
        run_in_memory_crawl, run_local_crawl, state_directory,
    )

    data, names = _spec_data(seeds, spec_flags)
    spec = _build_spec(data, names)
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
    settings = _with_own_plugins(_settings(redis_url, lease_seconds), spec)
    _check_components(spec, settings, names)
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
        try:
            join_archive(spec, job)
        except SaveError as exc:
            join_failed = exc
            output = _shard_list(archive_shards(spec)) or output
    s = result.stats
    if result.already_finished:
        click.echo(
            f"job {job} is already finished: {s.done} saved, {s.dead} dead, {s.seen} seen; "
            f"output in {redact(output)}"
        )
        if state is not None:
            say(f"(its state is in {state}; --fresh crawls it again)")
    else:
        click.echo(
            f"job {job}: {s.done} saved, {s.dead} dead, {s.seen} seen in {result.seconds:.1f}s "
            f"({result.pages_per_second:.1f} pages/s); output in {redact(output)}"
        )
    if s.dead:
        for item, reason in list(result.dead.items())[:10]:
            click.echo(f"  dead: {item}: {reason}", err=True)
    if join_failed is not None:
        click.echo(f"distscrape: error: {join_failed}; the shards are kept", err=True)
        sys.exit(EXIT_ERROR)
    if s.dead:
        sys.exit(EXIT_DEAD_ITEMS)


def _shard_list(shards: list[Path], show: int = 10) -> str:
    """``shards`` for a message: how many, and the names of the first ``show``."""
    if not shards:
        return ""
    names = ", ".join(str(p) for p in shards[:show])
    more = f" and {len(shards) - show} more beside them" if len(shards) > show else ""
    return f"{len(shards)} shard(s): {names}{more}"


@cli.command()
@click.option("--port", type=click.IntRange(0, 65535), default=9808, show_default=True,
              help="Port to serve /metrics on (0: any free port).")
@click.option("--bind", metavar="ADDRESS", default="127.0.0.1", show_default=True,
              help="Address to listen on; 0.0.0.0 for every interface.")
@click.option("--once", is_flag=True, help="Print the metrics once to stdout and exit.")
@redis_url_option
def metrics(port, bind, once, redis_url) -> None:
    """Serve every job's and worker's figures for Prometheus, read from the tracker.

    Basic auth credentials come from $DISTSCRAPE_METRICS_AUTH (USER:PASSWORD) only.
    """
    from .exporter import MetricsServer, crawl_registry, render
    from ..tracker import RedisTracker

    settings = _settings(redis_url)
    registry = crawl_registry(RedisTracker.from_settings(settings))
    if once:
        click.echo(render(registry).decode(), nl=False)
        return
    try:
        server = MetricsServer(registry, bind=bind, port=port, auth=settings.metrics_auth)
    except OSError as exc:
        raise click.BadParameter(f"cannot listen on {bind}:{port}: {exc.strerror}",
                                 param_hint="--bind/--port") from None
    auth = "basic auth on" if settings.metrics_auth else "no auth (set DISTSCRAPE_METRICS_AUTH)"
    click.echo(f"serving crawl metrics on {server.url} ({auth})", err=True)
    with stop_signals():
        server.serve_forever()


class _progress(_StderrBar):
    """A live progress bar of a crawl on a terminal; nothing when quiet or not a terminal."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def __enter__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

        if self.quiet or not self._start(
            TextColumn("[bold]crawling"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
        ):
            return None
        task = self.bar.add_task("crawl", total=None, detail="")

        def update(stats) -> None:
            self.bar.update(
                task, total=max(stats.seen, 1), completed=stats.done + stats.dead,
                detail=f"{stats.leased} active, {stats.queued} queued, {stats.dead} dead",
            )

        return update


register_job_commands(cli, lambda redis_url: _redis_runtime(_settings(redis_url)), redis_url_option)


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
