"""``distscrape seed``: create a job in the tracker Redis (or add seeds to it) for the workers."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import click

from ..core.seeding import seed_job
from ..errors import ConfigError, JobNotFound
from ..job.seeds import BadLine, SeedFile
from ..job.urls import DEFAULT_TRACKING_PARAMS, Canonicalizer
from ..tracker.base import PRIORITY_MAX
from .group import EXIT_DEAD_ITEMS, cli, redis_runtime, redis_url_option, settings_for
from .progress import SeedProgress
from .jobs import when
from .spec_options import (
    SCHEDULE_FLAGS, check_spec_components, spec_data, spec_from_data, with_spec_options,
)

# Malformed lines of a seed file reported one by one; past this, only counted.
MAX_BAD_LINES_SHOWN = 20


@cli.command()
@click.argument("job")
@click.argument("seeds", nargs=-1)
@with_spec_options(schedules=True)
@click.option("--ids-file", metavar="FILE",
              help="More seeds, one a line (- for stdin): IDs for the ids scraper, else URLs. "
                   "Streamed in batches; malformed lines (and lines over 8192 bytes) are "
                   "reported and skipped.")
@click.option("--priority", type=click.IntRange(-PRIORITY_MAX, PRIORITY_MAX), default=0,
              metavar="N",
              help=f"Queue these seeds at priority N ({-PRIORITY_MAX} to {PRIORITY_MAX}; "
                   "default 0): within a domain a higher priority is dispatched first, equal "
                   "ones first come, first served. Items already seen keep theirs.")
@redis_url_option
def seed(job, seeds, spec_flags, ids_file, priority, redis_url) -> None:
    """Create JOB (or add seeds to it) and queue its SEEDs for the workers.

    With no option but seeds (and --priority, --every or --cron), a JOB that exists takes them
    as it is. With --every or --cron the job runs again on that schedule (distscrape schedule
    shows, pauses and deletes it). Exit status: 0 done, 1 done but malformed --ids-file lines
    were skipped, 2 error."""
    data, names = spec_data(seeds, spec_flags)
    settings = settings_for(redis_url)
    runtime = None
    if not any(v for k, v in spec_flags.items() if k not in SCHEDULE_FLAGS):
        runtime = redis_runtime(settings)
        stored = _stored_spec(runtime[0], job)
        if stored is not None:
            data = {**stored, "seeds": data.get("seeds"),
                    **({"schedule": data["schedule"]} if "schedule" in data else {})}
    progress = SeedProgress()
    more: Iterator[str] = iter(())
    with contextlib.ExitStack() as stack:
        if ids_file is not None:
            reader = _open_seed_file(stack, ids_file, data, progress)
            more = iter(reader)
            if not data.get("seeds"):
                # The spec needs a seed: the file's first, which is then not offered again.
                first = next(more, None)
                data["seeds"] = [first] if first is not None else None
        spec = spec_from_data(data, names)
        check_spec_components(spec, settings, names)
        tracker, manager = runtime or redis_runtime(settings)
        with progress:
            done = seed_job(tracker, manager, job, spec, more=more, priority=priority,
                            on_progress=progress.update)
    seeded = done.seeded
    verb = "created" if seeded.created else "exists; seeds added"
    click.echo(
        f"job {job} {verb}: {seeded.added} new item(s), {seeded.already_seen} already seen; "
        f"{seeded.dispatched} sent to workers now"
    )
    if done.schedule is not None:
        click.echo(f"job {job} runs again {done.schedule}: next at {when(done.next_due)}")
    if seeded.off_host:
        click.echo(
            f"distscrape: {seeded.off_host} seed(s) are on none of the job's seeds' hosts: they are "
            "downloaded, but their links are not followed (the job stays on its seeds' hosts)",
            err=True,
        )
    _note_output_roots(spec, settings)
    if not any(worker.alive for worker in tracker.workers()):
        click.echo("no worker is alive yet: the job waits in Redis until one starts", err=True)
    if ids_file is not None and reader.bad:
        click.echo(f"distscrape: {reader.bad} malformed line(s) of {ids_file} skipped", err=True)
        sys.exit(EXIT_DEAD_ITEMS)


def _note_output_roots(spec, settings) -> None:
    """Without roots of its own, this process did not check the output for the workers (it
    writes nothing); once seeded, say that theirs decide, since a worker without them refuses
    every path. Likewise for a table: the workers' database setting decides where it is."""
    from ..core.components import writes_paths
    from ..settings import ENV_PREFIX

    if settings.output_roots is None and writes_paths(spec, settings):
        click.echo(
            f"distscrape: note: workers write {spec.saver.output} only if their "
            f"{ENV_PREFIX}OUTPUT_ROOTS allows it",
            err=True,
        )
    if spec.saver.kind == "postgres":
        # The database is each worker's setting: this process neither has nor checks it.
        click.echo(
            f"distscrape: note: workers write table {spec.saver.table} into the database of "
            f"their own {ENV_PREFIX}POSTGRES_DSN",
            err=True,
        )


def _stored_spec(tracker, job: str) -> Optional[dict[str, Any]]:
    """The spec of ``job`` as data, its seeds left out; None if there is no such job."""
    try:
        spec = json.loads(tracker.load_spec(job))
    except JobNotFound:
        return None
    spec.pop("seeds", None)
    return spec


def _open_seed_file(
    stack: contextlib.ExitStack, path: str, data: dict[str, Any], progress: SeedProgress
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
