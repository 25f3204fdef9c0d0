"""``distscrape tar-index``: what a crawl's tar archive holds, read from its shards."""

from __future__ import annotations

import json

import click

from ..errors import ConfigError
from ..job.spec import saver_kind_for
from ..redaction import escape
from .group import cli


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
            click.echo(f"{escape(item)}\t{shard}\t{escape(member)}")  # as a site sent them
    if not listed:
        raise ConfigError(f"no saved items found in the shards of {output!r}")
