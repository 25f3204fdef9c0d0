"""``distscrape tar-index`` and ``distscrape join``: what a crawl's tar archive holds, read from
its shards, and the shards of a tar or WARC archive or of a JSON Lines file joined into the one
file."""

from __future__ import annotations

import json

import click

from ..errors import ConfigError
from ..job.saver_spec import saver_kind_for
from ..job.sections import FetchSpec
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


@cli.command("join")
@click.argument("output")
@click.option("--max-bytes", type=click.IntRange(min=1), default=None,
              help="The job's fetch.max_bytes, if it raised it: the largest body an item holds "
              f"(default {FetchSpec.model_fields['max_bytes'].default}).")
@click.option("--job", default="", help="The job's name, for a WARC file's warcinfo record.")
def join_command(output, max_bytes, job) -> None:
    """Join the shards of the tar or WARC archive or JSON Lines file OUTPUT (the name given to
    --output) that are on this host into OUTPUT itself, each item (a JSON Lines file: each
    page's records) once, and remove them once OUTPUT reads back whole. For a seeded job, once
    it is finished: gather every host's shards into one directory first."""
    from ..local.crawl import join_archive_file
    from ..savers.jsonl import jsonl_shards
    from ..savers.tar import tar_shards
    from ..savers.warc import warc_shards

    kind = saver_kind_for(output)
    shards = {"tar": tar_shards, "warc": warc_shards, "jsonl": jsonl_shards}.get(kind)
    if shards is None:
        raise ConfigError(f"OUTPUT {output!r} is not a tar or WARC archive name (.tar, .tar.gz, "
                          ".tar.bz2, .warc.gz) nor a JSON Lines name (.jsonl, .jsonl.gz)")
    if not shards(output):
        raise ConfigError(f"no shards of {output!r} found to join")
    if max_bytes is None:
        max_bytes = FetchSpec.model_fields["max_bytes"].default
    joined = join_archive_file(kind, output, max_bytes=max_bytes, job=job)
    assert joined is not None
    what = "page(s) of records" if kind == "jsonl" else "item(s)"
    click.echo(f"joined {len(joined.shards)} shard(s) into {joined.path}"
               + (f": {joined.items} {what}" if joined.items is not None else ""))
