"""Job control commands of ``distscrape``: watch, list, pause, resume, cancel, export and delete
jobs, list or retry their dead items, and list the live workers."""

from __future__ import annotations

import json
import time
from typing import Any, Optional

import click

from ..core import jobs as job_control
from ..core.jobs import job_row, job_rows
from ..errors import ConfigError
from ..job.schedule import Schedule
from ..redaction import escape
from ..tracker import JobAction, JobState, Tracker
from .group import cli, redis_runtime, redis_tracker, redis_url_option, settings_for

JOB_COLUMNS = ("seen", "queued", "leased", "done", "dead")
# Dead items `status` shows below the figures; `dead` lists them all.
STATUS_DEAD_SHOWN = 10


def when(ts: Optional[float]) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def dead_line(item: str, reason: str, sep: str = "\t") -> str:
    """A dead item and its reason for a terminal. Both come from a site (a URL, and a reason that
    quotes URLs and headers): escaped here as well as where the reason was stored, since a tracker
    of an earlier version, or anyone writing to its Redis, may have stored them as they came."""
    return f"{escape(item)}{sep}{escape(reason)}"


# -- one job's figures ---------------------------------------------------------------------------


@cli.command()
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
@click.option("--watch", is_flag=True, help="A live view, refreshed every second until Ctrl-C "
                                            "or the job ends.")
@redis_url_option
def status(job, as_json, watch, redis_url) -> None:
    """Show how far JOB has got: its state, times and counts."""
    tracker = redis_tracker(settings_for(redis_url))
    tracker.load_spec(job)  # JobNotFound for a job never seeded
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
        # The job may have ended between the last view and the check: the view it leaves shows
        # how it ended.
        live.update(_status_view(tracker, job), refresh=True)


def _status_view(tracker, job: str):
    """The job's figures as a table, then up to ten dead items and how many more there are."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    row = job_row(tracker, job)
    table = Table(title=f"job {job}", show_header=False)
    for key, value in row.items():
        if key == "schedule" and value is not None:
            value = str(Schedule.parse(value))
        if key not in ("job", "final"):
            table.add_row(key, when(value) if key in ("started", "ended", "next_due") else str(value))
    dead = tracker.dead_items(job, limit=STATUS_DEAD_SHOWN)
    lines = [Text.assemble(("dead", "red"), f" {dead_line(item, reason, ': ')}")
             for item, reason in dead.items()]
    if row["dead"] > len(dead):
        lines.append(Text(f"{row['dead'] - len(dead)} more: see distscrape dead {job}"))
    return Group(table, *lines)


# -- every job, every worker ---------------------------------------------------------------------


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
@redis_url_option
def jobs(as_json, redis_url) -> None:
    """List every job: state, counts, pages/s, start time."""
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Column, Table
    from rich.text import Text

    tracker = redis_tracker(settings_for(redis_url))
    rows = job_rows(tracker)
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    table = Table(*(Column(name, no_wrap=True)
                    for name in ("job", "state", "gen", *JOB_COLUMNS, "pages/s", "started",
                                 "next run")))
    for r in rows:
        # Names come from Redis as they are found there; plain Text, so no markup applies.
        table.add_row(Text(escape(r["job"])), r["state"], str(r["generation"]),
                      *(str(r[c]) for c in JOB_COLUMNS), f"{r['rate']:.1f}", when(r["started"]),
                      _next_run(r))
    # Nothing is cut to fit the terminal (rich would crop the start time, or a job's name, to
    # "…"): a row wider than the terminal is as wide as it needs, and the terminal wraps it.
    console = Console()
    unbounded = console.options.update_width(1 << 16)
    console.width = max(console.width, Measurement.get(console, unbounded, table).maximum)
    console.print(table)


def _next_run(row: dict[str, Any]) -> str:
    """When a job's schedule next runs it: a time, "paused", or "-" without a schedule."""
    if row["schedule"] is None:
        return "-"
    return "paused" if row["schedule_paused"] else when(row["next_due"])


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
@redis_url_option
def workers(as_json, redis_url) -> None:
    """List the live workers: host, ID, concurrency, items held per job, last heartbeat."""
    from rich.console import Console
    from rich.table import Table

    rows = job_control.worker_rows(redis_tracker(settings_for(redis_url)))
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    table = Table("worker", "host", "pid", "concurrency", "leased", "last seen")
    for shown in rows:
        leased = ", ".join(f"{j}: {count}" for j, count in shown["leased"].items()) or "-"
        table.add_row(shown["worker"], shown["host"], str(shown["pid"]),
                      str(shown["concurrency"]), leased, when(shown["last_seen"]))
    Console().print(table)


# -- pause, resume, cancel -----------------------------------------------------------------------


@cli.command()
@redis_url_option
@click.argument("job")
def pause(job, redis_url) -> None:
    """Hold JOB's new work; what is queued stays, what is in flight ends."""
    _control(job, JobAction.PAUSE, redis_url)


@cli.command()
@redis_url_option
@click.argument("job")
def resume(job, redis_url) -> None:
    """Let a paused (or cancelled) JOB's work flow again at once."""
    _control(job, JobAction.RESUME, redis_url)


@cli.command()
@redis_url_option
@click.argument("job")
def cancel(job, redis_url) -> None:
    """Stop JOB for good: nothing more is fetched; its data stays for export."""
    _control(job, JobAction.CANCEL, redis_url)


def _control(job: str, action: JobAction, redis_url: Optional[str]) -> None:
    """Apply ``action`` to ``job``, send the workers what it lets flow, print the new state."""
    tracker, manager = redis_runtime(settings_for(redis_url))
    res = job_control.control(tracker, manager.publish, job, action)
    same = " (no change)" if res.before is res.after else ""
    click.echo(f"job {job}: {res.after.value}{same}")


# -- dead items ----------------------------------------------------------------------------------


@cli.command()
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line: item, reason.")
@redis_url_option
def dead(job, as_json, redis_url) -> None:
    """List every dead item of JOB with the reason it was given up on, one a line."""
    tracker = redis_tracker(settings_for(redis_url))
    for item, reason in tracker.iter_dead(job):
        if as_json:  # JSON escapes every control and non-ASCII character itself
            click.echo(json.dumps({"item": item, "reason": reason}))
        else:
            click.echo(dead_line(item, reason))


@cli.command()
@click.argument("job")
@click.option("--done", "which", flag_value="done",
              help="Not kept: refused with a pointer to the saver's output.")
@click.option("--dead", "which", flag_value="dead", help="The dead items, TAB, the reason.")
@click.option("--records", "which", flag_value="records",
              help="The records the redis saver keeps of a job with [extract], as JSON Lines.")
@click.option("--output", "-o", "output", type=click.Path(dir_okay=False, writable=True),
              help="With --records: write them to this file instead of the standard output.")
@redis_url_option
def export(job, which, output, redis_url) -> None:
    """Print JOB's dead items (--dead), one a line with the reason, or the records its redis
    saver keeps (--records), one JSON object a line; streamed."""
    if which is None:
        raise ConfigError("export: give --dead or --records (or --done, which is not kept)")
    if which == "done":
        # Redis keeps only an 8-byte fingerprint of a done item, not the item.
        raise ConfigError(
            "export --done: done items are not kept in Redis, only their fingerprints; the "
            "saver's output lists them (its output directory, or `distscrape tar-index "
            "OUTPUT` for tar shards)"
        )
    if output is not None and which != "records":
        raise ConfigError("export: --output goes with --records")
    tracker = redis_tracker(settings_for(redis_url))
    if which == "records":
        export_records(tracker, job, output)
        return
    for item, reason in tracker.iter_dead(job):
        click.echo(dead_line(item, reason))


def export_records(tracker: Tracker, job: str, output: Optional[str]) -> None:
    """Write the records that ``job``'s redis saver keeps as JSON Lines to ``output`` (a file,
    replaced once complete) or the standard output."""
    from ..job.spec import JobSpec
    from ..savers.jsonl import encode_records
    from ..savers.redis import RedisItemSaver

    spec = JobSpec.from_json(tracker.load_spec(job))
    if spec.extract is None:
        raise ConfigError(f"export --records: job {job!r} has no [extract], so it made no records")
    if spec.saver.kind != "redis":
        raise ConfigError(
            f"export --records: job {job!r} saves with the {spec.saver.kind} saver, not the "
            f"redis saver; its records are in its output, {spec.saver.output}"
        )
    saver = RedisItemSaver.from_spec(spec.saver, job=job, worker_id="")
    saver.open()
    try:
        with click.open_file(output or "-", "wb", atomic=output is not None) as sink:
            for record in saver.iter_records():
                sink.write(encode_records([record]))
    finally:
        saver.close()


@cli.command("retry-dead")
@click.argument("job")
@redis_url_option
def retry_dead(job, redis_url) -> None:
    """Queue every dead item of JOB again, its failure counts reset."""
    tracker, manager = redis_runtime(settings_for(redis_url))
    res = job_control.retry_dead(tracker, manager.publish, job)
    click.echo(f"job {job}: {res.requeued} dead item(s) queued again")


# -- delete --------------------------------------------------------------------------------------


@cli.command()
@click.argument("job")
@click.option("--force", is_flag=True, help="Delete a running or paused job too.")
@redis_url_option
def delete(job, force, redis_url) -> None:
    """Remove every key of JOB from Redis, in small batches (saved output is kept)."""
    n = job_control.delete(redis_tracker(settings_for(redis_url)), job, force)
    click.echo(f"job {job} deleted ({n} key(s))")

