"""WarcItemSaver: items as WARC/1.1 request and response records in per-worker .warc.gz shards."""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import os
import zlib
from datetime import datetime, timezone
from http import HTTPStatus
from pathlib import Path
from collections.abc import Iterator
from typing import Optional
from urllib.parse import urlsplit

from warcio.archiveiterator import ArchiveIterator
from warcio.exceptions import ArchiveLoadFailed
from warcio.statusandheaders import StatusAndHeaders, StatusAndHeadersParser
from warcio.timeutils import datetime_to_iso_date
from warcio.warcwriter import WARCWriter

from ..web.fetch import Download
from ..job.saver_spec import SaverSpec
from .joining import CompleteUnits, Joined, NotAUnit, join_shards
from .shards import ShardedItemSaver, ShardNames, ShardWriter

log = logging.getLogger(__name__)

EXTENSIONS = (".warc.gz",)
WARC_VERSION = "1.1"
# A WARC extension field on both records: the crawl's item (an ID, or the URL before redirects).
ITEM_HEADER = "DISTSCRAPE-Item"
# The profiles of a revisit record (WARC 1.1, section 6.7).
REVISIT_NOT_MODIFIED = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
REVISIT_IDENTICAL = "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"
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
        return _warcinfo_record(shard.name, {
            "job": self.job, "worker": self.worker_id, "hostname": os.uname().nodename,
        })

    writes_revisits = True

    def _encode(self, item: str, download: Download) -> bytes:
        buffer = io.BytesIO()
        writer = WARCWriter(buffer, gzip=True, warc_version=WARC_VERSION)
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
        if download.unchanged:
            response = _revisit_record(writer, download, date, item_value, http_response)
        else:
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
        return buffer.getvalue()

    def _location(self, shard: str, item: str) -> str:
        return f"{shard}#{item}"


def _revisit_record(writer: WARCWriter, download: Download, date: str, item: str,
                    http_response: StatusAndHeaders):
    """A ``revisit`` record of a page found unchanged: its server answered 304
    (server-not-modified), or sent the same payload again (identical-payload-digest, with the
    payload's SHA-1). Its HTTP headers are kept, its payload not."""
    record = writer.create_warc_record(
        download.url, "revisit", http_headers=http_response,
        warc_headers_dict=_warc_fields("revisit", date, item))
    headers = record.rec_headers
    if download.not_modified:
        headers.add_header("WARC-Profile", REVISIT_NOT_MODIFIED)
    else:
        headers.add_header("WARC-Profile", REVISIT_IDENTICAL)
        digest = base64.b32encode(hashlib.sha1(download.body).digest()).decode()
        headers.add_header("WARC-Payload-Digest", f"sha1:{digest}")
    headers.add_header("WARC-Refers-To-Target-URI", download.url)
    return record


def _warcinfo_record(filename: str, fields: dict[str, str]) -> bytes:
    """A gzipped ``warcinfo`` record for the file ``filename``, with ``fields`` after ours."""
    buffer = io.BytesIO()
    writer = WARCWriter(buffer, gzip=True, warc_version=WARC_VERSION)
    writer.write_record(writer.create_warcinfo_record(filename, {
        "software": SOFTWARE,
        "format": "WARC File Format 1.1",
        "conformsTo": WARC_1_1_SPEC,
        **fields,
    }))
    return buffer.getvalue()


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


# What identifies a record when shards are joined: (WARC-Type, DISTSCRAPE-Item, WARC-Date). A
# job that runs again captures a page once a generation; a save that ran twice (its worker died
# before the tracker heard of it) wrote the same capture twice.
RecordKey = tuple[str, str, str]


def join_warc(output: str | os.PathLike, *, max_unit: int, job: str = "") -> Joined:
    """Join the shards of the WARC file ``output`` into ``output`` itself and remove them (see
    :func:`~distscrape_celery.savers.joining.join_shards`): one ``warcinfo`` record naming it,
    then every request and response record once, each the gzip member it is in its shard (not
    compressed again). The shards' own ``warcinfo`` records, which name the shards, are left
    out. ``max_unit`` bounds one record."""
    names = ShardNames(output, EXTENSIONS, "WARC")

    def units(path: Path, whole: bool) -> Iterator[tuple[bytes, Optional[RecordKey]]]:
        # An item's records were written together: they are passed on once the next item's
        # begin, so that a pair cut by a torn tail (never saved) is left out whole.
        pending: list[tuple[bytes, RecordKey]] = []
        with open(path, "rb") as fh:
            stream = CompleteUnits(fh, "gz")
            for raw, data in stream.members(max_unit):
                kind, item, date = _record_type_and_item(data)
                if kind == "warcinfo":
                    continue
                if item is None:
                    if whole:
                        raise NotAUnit(f"a {kind} record of no saved item")
                    continue
                if pending and pending[0][1][1:] != (item, date):
                    yield from pending
                    pending = []
                pending.append((raw, (kind, item, date)))
            if stream.torn:
                if whole:
                    raise NotAUnit("a torn tail")
                log.warning("shard %s has a torn tail; its complete records were joined", path)
                if len({key[0] for _, key in pending} & {"request", "response", "revisit"}) != 2:
                    pending = []  # the item whose write was cut short
            yield from pending

    return join_shards(
        names, units, item_of=lambda key: key[1] if key[0] in ("response", "revisit") else None,
        read_back=_warc_keys,
        head=lambda path: _warcinfo_record(path.name, {"job": job} if job else {}),
    )


def _record_type_and_item(data: bytes) -> tuple[str, Optional[str], str]:
    """WARC-Type, DISTSCRAPE-Item and WARC-Date of the one record ``data`` (a decompressed gzip
    member) holds; :class:`NotAUnit` if it is not exactly one WARC record."""
    head, sep, _ = data.partition(b"\r\n\r\n")
    lines = head.decode("utf-8", "replace").split("\r\n")
    if not sep or not lines[0].startswith("WARC/"):
        raise NotAUnit("not a WARC record")
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    try:
        length = int(fields.get("content-length", ""))
    except ValueError:
        raise NotAUnit("a WARC record without a Content-Length") from None
    if len(head) + 4 + length + 4 != len(data):
        raise NotAUnit("not exactly one WARC record")
    return fields.get("warc-type", ""), fields.get(ITEM_HEADER.lower()), fields.get("warc-date", "")


def _warc_keys(path: Path) -> list[RecordKey]:
    """(type, item, date) of every record but warcinfo in ``path``, as warcio reads them."""
    keys: list[RecordKey] = []
    try:
        with open(path, "rb") as fh:
            for record in ArchiveIterator(fh):
                if record.rec_type != "warcinfo":
                    headers = record.rec_headers
                    keys.append((record.rec_type, headers.get_header(ITEM_HEADER),
                                 headers.get_header("WARC-Date") or ""))
    except (ArchiveLoadFailed, OSError, ValueError, EOFError, zlib.error) as exc:
        raise NotAUnit(str(exc)) from exc
    return keys
