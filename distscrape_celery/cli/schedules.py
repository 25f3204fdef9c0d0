"""``distscrape schedule`` (list, set, pause, resume and delete the schedules that run jobs
again) and ``distscrape run`` (a job's next generation, now)."""

from __future__ import annotations

import json

import click

from ..errors import ConfigError
from ..redaction import escape
from .group import cli, redis_runtime, redis_tracker, redis_url_option, settings_for
from .jobs import when


@cli.group()
def schedule() -> None:
    """List, set, pause, resume and delete the schedules that run jobs again."""


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
@redis_url_option
def list_schedules(as_json, redis_url) -> None:
    """Every job with a schedule: the schedule, its state, the job's generation and next run."""
    from ..core.schedules import schedule_rows

    rows = schedule_rows(redis_tracker(settings_for(redis_url)))
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    if not rows:
        click.echo("no job has a schedule")
    for r in rows:
        due = "paused" if r["paused"] else f"next {when(r['next_due'])}"
        click.echo(f"{escape(r['job'])}\t{r['schedule']}\t{due}\tgeneration {r['generation']} "
                   f"{r['state']}")


@schedule.command("set")
@click.argument("job")
@click.option("--every", metavar="DURATION", help="Run JOB again every DURATION (e.g. 6h).")
@click.option("--cron", metavar="EXPR", help="Run JOB at the times of a cron expression (UTC).")
@redis_url_option
def set_schedule(job, every, cron, redis_url) -> None:
    """Give JOB a schedule (or a new one); its next run is the schedule's first time from now."""
    if (every is None) == (cron is None):
        raise click.UsageError("give --every or --cron")
    from ..core.schedules import schedule_of, set_schedule

    due = schedule_of(every, cron)
    next_due = set_schedule(redis_tracker(settings_for(redis_url)), job, due)
    click.echo(f"job {job} runs again {due}: next at {when(next_due)}")


@schedule.command()
@click.argument("job")
@redis_url_option
def pause(job, redis_url) -> None:
    """Start no more runs of JOB (a run under way goes on)."""
    from ..core.schedules import pause_schedule

    pause_schedule(redis_tracker(settings_for(redis_url)), job)
    click.echo(f"job {job}: schedule paused")


@schedule.command()
@click.argument("job")
@redis_url_option
def resume(job, redis_url) -> None:
    """Run JOB on its schedule again, from its next time from now (missed runs are not made up)."""
    from ..core.schedules import resume_schedule

    next_due = resume_schedule(redis_tracker(settings_for(redis_url)), job)
    click.echo(f"job {job}: schedule resumed, next at {when(next_due)}")


@schedule.command()
@click.argument("job")
@redis_url_option
def delete(job, redis_url) -> None:
    """Remove JOB's schedule (the job and its data stay)."""
    from ..core.schedules import delete_schedule

    delete_schedule(redis_tracker(settings_for(redis_url)), job)
    click.echo(f"job {job}: schedule deleted")


@cli.command()
@click.argument("job")
@redis_url_option
def run(job, redis_url) -> None:
    """Start JOB's next generation now: it runs again from its seeds (a job that revisits
    fetches what is due). JOB must be finished (or expired); its schedule is left as it is."""
    from ..core.schedules import run_again

    tracker, manager = redis_runtime(settings_for(redis_url))
    result = run_again(tracker, job, manager.publish)
    if not result.started:
        raise ConfigError(f"job {job!r} is {result.status}: only a finished job runs again "
                          "(pause or cancel it, or wait for it to finish)")
    click.echo(f"job {job}: generation {result.generation} started; "
               f"{len(result.dispatch)} item(s) sent to workers now")
