"""``distscrape api``: the job API and its dashboard over HTTP (:mod:`distscrape_celery.api`),
served by uvicorn."""

from __future__ import annotations

import ipaddress

import click

from .group import cli, redis_runtime, redis_url_option, settings_for


@cli.command()
@click.option("--bind", metavar="ADDRESS", default="127.0.0.1", show_default=True,
              help="Address to listen on; 0.0.0.0 for every interface (put TLS in front).")
@click.option("--port", type=click.IntRange(1, 65535), default=8808, show_default=True,
              help="Port to listen on.")
@click.option("--token-file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Read the bearer token from FILE's first line (default: "
                   "$DISTSCRAPE_API_TOKEN_FILE, else $DISTSCRAPE_API_TOKEN).")
@click.option("--max-body", type=click.IntRange(1024), default=1024 * 1024, show_default=True,
              metavar="BYTES", help="Refuse requests with a larger body (413).")
@redis_url_option
def api(bind, port, token_file, max_body, redis_url) -> None:
    """Serve the job API and the dashboard: create, watch, pause, resume, cancel and delete
    jobs and their schedules over HTTP, each request with the token as its bearer credentials.

    The token comes from the environment or a file, never from the command line."""
    import uvicorn

    from ..api import create_app
    from ..api.auth import load_token
    from ..api.runtime import Runtime

    settings = settings_for(redis_url)
    token = load_token(settings, token_file)
    tracker, manager = redis_runtime(settings)
    app = create_app(Runtime(settings, tracker, manager), token, max_body=max_body)
    try:
        host = str(ipaddress.ip_address(bind))
    except ValueError:
        raise click.BadParameter(f"{bind!r} is not an IP address", param_hint="--bind") from None
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"serving the job API and the dashboard on http://{shown}:{port}/", err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", server_header=False,
                proxy_headers=False, timeout_graceful_shutdown=5)
