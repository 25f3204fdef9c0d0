"""``distscrape metrics``: the Prometheus exporter of every job's and worker's figures; the
collector and HTTP server it runs are in :mod:`.exporter`."""

from __future__ import annotations

import click

from ..lifecycle import stop_signals
from .group import cli, redis_url_option, settings_for


@cli.command()
@click.option("--port", type=click.IntRange(0, 65535), default=9808, show_default=True,
              help="Port to serve /metrics on (0: any free port).")
@click.option("--bind", metavar="ADDRESS", default="127.0.0.1", show_default=True,
              help="Address to listen on; 0.0.0.0 for every interface, which needs "
                   "DISTSCRAPE_METRICS_AUTH.")
@click.option("--once", is_flag=True, help="Print the metrics once to stdout and exit.")
@redis_url_option
def metrics(port, bind, once, redis_url) -> None:
    """Serve every job's and worker's figures for Prometheus, read from the tracker.

    Basic auth credentials come from $DISTSCRAPE_METRICS_AUTH (USER:PASSWORD) only; without
    them it serves on a loopback address only.
    """
    from .exporter import MetricsServer, crawl_registry, render
    from ..tracker import RedisTracker

    settings = settings_for(redis_url)
    registry = crawl_registry(RedisTracker.from_settings(settings))
    if once:
        click.echo(render(registry).decode(), nl=False)
        return
    try:
        server = MetricsServer(registry, bind=bind, port=port, auth=settings.metrics_auth)
    except OSError as exc:
        raise click.BadParameter(f"cannot listen on {bind}:{port}: {exc.strerror}",
                                 param_hint="--bind/--port") from None
    auth = ("basic auth on" if settings.metrics_auth
            else "no auth: this host only (set DISTSCRAPE_METRICS_AUTH to serve beyond it)")
    click.echo(f"serving crawl metrics on {server.url} ({auth})", err=True)
    with stop_signals():
        server.serve_forever()
