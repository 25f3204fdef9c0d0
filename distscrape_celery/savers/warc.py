"""WarcItemSaver: items as WARC/1.1 request and response records in per-worker .warc.gz shards."""

from __future__ import annotations

import io
import os
from datetime import datetime, timezone
from http import HTTPStatus
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

from warcio.statusandheaders import StatusAndHeaders, StatusAndHeadersParser
from warcio.timeutils import datetime_to_iso_date
from warcio.warcwriter import WARCWriter

from ..fetch import Download
from ..jobspec import SaverSpec
from .shards import ShardedItemSaver, ShardNames, ShardWriter

EXTENSIONS = (".warc.gz",)
WARC_VERSION = "1.1"
# A WARC extension field on both records: the crawl's item (an ID, or the URL before redirects).
ITEM_HEADER = "DISTSCRAPE-Item"
SOFTWARE = "distscrape-celery"
WARC_1_1_SPEC = "https://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.1/"


class WarcItemSaver(ShardedItemSaver):
    """Appends each item as a WARC/1.1 ``response`` record and its ``request`` record to a
    ``.warc.gz`` shard of this saver's own (``/data/site-<worker>-<pid>-<seq>.warc.gz`` for
    ``output = "/data/site.warc.gz"``), sharded, rotated and made durable exactly as
    :class:`~distscrape_celery.savers.TarItemSaver` does. Each shard starts with a ``warcinfo``
    record; every record is its own gzip member, and an item's two records are written together
    with one write before ``save`` returns.

    We keep no original response headers, so the response record's HTTP block is rebuilt from
    the status, the Content-Type and the (decoded) body, with a Content-Length; the request
    record is a ``GET`` with a ``Host`` header. WARC-Target-URI is the final URL, WARC-Date the
    fetch time, and both records carry the item in a ``DISTSCRAPE-Item`` field.

    Duplicates: as with the tar saver, an instance writes an item once, but an item saved again
    by another process (an interrupted or stale save) appears in two shards.
    """

    def __init__(
        self, output: str | os.PathLike, *, job: str = "", worker_id: str = "", fsync: bool = True,
        shard_max_bytes: int = 1024**3, shard_max_items: Optional[int] = None,
    ) -> None:
        self._names = ShardNames(output, EXTENSIONS, "WARC")
        self.output = self._names.output
        self.job = job
        self.worker_id = worker_id or "local"
        self._writer = ShardWriter(
            self._names, self.worker_id, max_bytes=shard_max_bytes, max_items=shard_max_items,
            fsync=fsync, header=self._warcinfo,
        )
        self._init_shared()

    @classmethod
    def from_spec(cls, spec: SaverSpec, *, job: str, worker_id: str) -> "WarcItemSaver":
        return cls(
            spec.output, job=job, worker_id=worker_id, fsync=spec.fsync,
            shard_max_bytes=spec.shard_max_bytes, shard_max_items=spec.shard_max_items,
        )

    def _warcinfo(self, shard: Path) -> bytes:
        buf = io.BytesIO()
        writer = WARCWriter(buf, gzip=True, warc_version=WARC_VERSION)
        writer.write_record(writer.create_warcinfo_record(shard.name, {
            "software": SOFTWARE,
            "format": "WARC File Format 1.1",
            "conformsTo": WARC_1_1_SPEC,
            "job": self.job,
            "worker": self.worker_id,
            "hostname": os.uname().nodename,
        }))
        return buf.getvalue()

    def _encode(self, item: str, download: Download) -> bytes:
        buf = io.BytesIO()
        writer = WARCWriter(buf, gzip=True, warc_version=WARC_VERSION)
        url = download.url
        date = datetime_to_iso_date(
            datetime.fromtimestamp(download.fetched_at, timezone.utc).replace(tzinfo=None),
            use_micros=True,
        )
        item_value = _header_value(item)
        try:
            reason = HTTPStatus(download.status).phrase
        except ValueError:
            reason = ""
        body = download.body
        http_response = StatusAndHeaders(
            f"{download.status} {reason}".rstrip(),
            [
                ("Content-Type", _header_value(download.content_type)),
                ("Content-Length", str(len(body))),
            ],
            protocol="HTTP/1.1",
        )
        response = writer.create_warc_record(
            url, "response", payload=io.BytesIO(body), length=len(body),
            http_headers=http_response,
            warc_headers_dict=_warc_fields("response", date, item_value),
        )
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.netloc.rpartition("@")[2]
        http_request = StatusAndHeaders(
            f"GET {target} HTTP/1.1", [("Host", host)], is_http_request=True,
        )
        request = writer.create_warc_record(
            url, "request", http_headers=http_request,
            warc_headers_dict=_warc_fields("request", date, item_value),
        )
        writer.write_request_response_pair(request, response)
        return buf.getvalue()

    def _location(self, shard: str, item: str) -> str:
        return f"{shard}#{item}"


def _warc_fields(record_type: str, date: str, item: str) -> dict[str, str]:
    # The mandatory fields first, in the usual order; warcio fills in the rest after them.
    return {
        "WARC-Type": record_type, "WARC-Record-ID": StatusAndHeadersParser.make_warc_id(),
        "WARC-Date": date, ITEM_HEADER: item,
    }


def _header_value(text: str) -> str:
    """``text`` fit for one header line: no CR, LF or other control characters."""
    return "".join(ch if ch.isprintable() else " " for ch in text)


def warc_shards(output: str | os.PathLike) -> list[Path]:
    """Every shard of the WARC archive ``output`` names, in name order."""
    return ShardNames(output, EXTENSIONS, "WARC").shards()
