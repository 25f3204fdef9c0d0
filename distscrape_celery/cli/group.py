"""The ``distscrape`` click group, what its commands share, and ``main``, which runs it and turns
errors into messages and exit statuses. The commands join the group in the modules by topic.

Heavy modules (celery, the worker, rich, prometheus_client) are imported inside the command
bodies, never at the top of a command module: ``distscrape --help`` then loads none of them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Optional

import click

from ..errors import DistscrapeError
from ..lifecycle import Terminated
from ..redaction import escape
from ..settings import Settings

EXIT_OK, EXIT_DEAD_ITEMS, EXIT_ERROR = 0, 1, 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Distributed web crawler on Celery and Redis."""


redis_url_option = click.option(
    "--redis-url", metavar="URL", help="Tracker Redis (default: $DISTSCRAPE_REDIS_URL or local)."
)


def settings_for(
    redis_url: Optional[str], lease_seconds: Optional[float] = None,
    defaults: Optional[Mapping[str, object]] = None,
) -> Settings:
    """This process's settings (from the environment, else ``defaults``, else the declared
    ones), with what the command's options set."""
    return Settings.from_env(defaults=defaults, redis_url=redis_url, lease_seconds=lease_seconds)


def redis_tracker(settings: Settings):
    """The tracker on the Redis of ``settings``, for a command that sends no tasks: it loads no
    Celery (the slowest import of a command)."""
    from ..tracker import RedisTracker

    return RedisTracker.from_settings(settings)


def redis_runtime(settings: Settings):
    """(tracker, manager) on the tracker Redis of ``settings``, the Celery app configured."""
    from ..worker.app import configure_app
    from ..core.manager import CrawlManager
    from ..worker.publish import publisher
    from ..tracker import RedisTracker

    tracker = RedisTracker.from_settings(settings)
    configure_app(settings)
    return tracker, CrawlManager(tracker, publisher.scrape, settings=settings)


def main(argv: Optional[list[str]] = None) -> None:
    """Run ``distscrape`` with ``argv`` (default: the process's arguments) and exit: errors are
    one line on stderr and exit status 2, interruptions 130 or the stopping signal's status."""
    try:
        cli.main(args=argv, prog_name="distscrape", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("distscrape: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_ERROR)
    except DistscrapeError as exc:
        click.echo(f"distscrape: error: {escape(str(exc))}", err=True)  # it may quote a site
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt:
        click.echo("distscrape: interrupted", err=True)
        sys.exit(130)
    except Terminated as exc:
        click.echo(f"distscrape: stopped by {exc.signal_name}", err=True)
        sys.exit(exc.exit_status)
