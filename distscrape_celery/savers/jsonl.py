"""JsonLinesItemSaver: a job's records as JSON Lines, in per-worker shards (.jsonl or .jsonl.gz).

A shard is itself JSON Lines: one record (a JSON object) a line, a page's records together. A
page's lines are one unit of the shard (see :mod:`.shards`): written with one write, in a
``.jsonl.gz`` shard as a gzip member of their own. A unit is known by its page's ``url`` and
``fetched_at``, which every record carries: a page saved twice (its save was interrupted after
the write, and done again) is in two units of the same ``url``, and :func:`join_jsonl` keeps
one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Optional, Union

from ..errors import SaveError
from ..job.saver_spec import SaverSpec
from ..web.fetch import Download
from .joining import CompleteUnits, Joined, NotAUnit, join_shards
from .shards import ShardedItemSaver, ShardNames, ShardWriter

log = logging.getLogger(__name__)

# Output name ending -> compression of its shards.
EXTENSIONS = {".jsonl": "", ".jsonl.gz": "gz"}
NO_RECORDS = "no records"
# The largest line a reader takes: the largest record a job may keep (max_record_bytes), and
# room. Anything longer was not written by this saver.
MAX_LINE_BYTES = 17 * 1024 * 1024
_READ_CHUNK = 1 << 16

# A unit's key: the url and fetched_at of its page, as its records hold them.
UnitKey = tuple[str, str]


def encode_records(records: Sequence[dict]) -> bytes:
    """``records`` as JSON Lines: compact, UTF-8, one object a line, each line ending with LF."""
    return b"".join(
        json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        + b"\n" for record in records
    )


def _gzip_member(data: bytes) -> bytes:
    comp = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS | 16)  # mtime 0: the same bytes
    return comp.compress(data) + comp.flush()


class JsonLinesItemSaver(ShardedItemSaver):
    """Appends each page's records (:attr:`Download.records`) to a JSON Lines shard of this
    saver's own: ``/data/items-<worker>-<pid>-<seq>.jsonl`` (or ``.jsonl.gz``) for ``output =
    "/data/items.jsonl"``. A page without records writes nothing, and counts as saved.

    Sharded, rotated and made durable as :class:`~distscrape_celery.savers.TarItemSaver` is; a
    save batch's pages go in one write and one fsync (a group commit), each page still a unit
    of its own. An instance writes a page once; a page saved again by another process (an
    interrupted save) is in two shards, and :func:`join_jsonl` keeps it once."""

    saves_records = True

    def __init__(
        self, output: str | os.PathLike, *, worker_id: str = "", fsync: bool = True,
        shard_max_bytes: int = 1024**3, shard_max_items: Optional[int] = None,
    ) -> None:
        self._names = ShardNames(output, tuple(EXTENSIONS), "JSON Lines")
        self.output = self._names.output
        self.compression = EXTENSIONS[self._names.extension]
        self.worker_id = worker_id or "local"
        self._writer = ShardWriter(
            self._names, self.worker_id, max_bytes=shard_max_bytes, max_items=shard_max_items,
            fsync=fsync,
        )
        self._init_shared()

    @classmethod
    def from_spec(cls, spec: SaverSpec, *, job: str, worker_id: str) -> "JsonLinesItemSaver":
        return cls(
            spec.output, worker_id=worker_id, fsync=spec.fsync,
            shard_max_bytes=spec.shard_max_bytes, shard_max_items=spec.shard_max_items,
        )

    def _encode(self, item: str, download: Download) -> bytes:
        lines = encode_records(download.records)
        return _gzip_member(lines) if self.compression else lines

    def _location(self, shard: str, item: str) -> str:
        return shard

    def save(self, item: str, download: Download) -> str:
        if not download.records:
            return NO_RECORDS
        return super().save(item, download)

    def commits_groups(self) -> bool:
        """A save batch's pages are appended with one write (one fsync): a group cut short by a
        crash is saved again in full, and the join keeps each page once."""
        return type(self).save is JsonLinesItemSaver.save

    def save_many(self, entries: Sequence[tuple[str, Download]]) -> list[Union[str, Exception]]:
        """The entries' records appended together, with one write and one fsync; each page is
        still a unit of its own (its own gzip member)."""
        results: list[Union[str, Exception]] = [NO_RECORDS] * len(entries)
        pending: list[tuple[int, bytes, bytes]] = []  # (entry, key, unit)
        for index, (item, download) in enumerate(entries):
            if not download.records:
                continue
            try:
                unit = self._encode(item, download)
            except (ValueError, UnicodeError) as exc:
                results[index] = SaveError(f"cannot encode the records of {item!r}: {exc}")
                continue
            pending.append((index, hashlib.sha1(item.encode("utf-8", "surrogatepass")).digest(), unit))
        with self._lock:
            fresh: dict[bytes, bytes] = {}  # key -> unit: each page once, none saved before
            for _, key, unit in pending:
                if key not in self._saved:
                    fresh.setdefault(key, unit)
            failed: Optional[SaveError] = None
            if fresh:
                try:
                    shard = str(self._writer.append(b"".join(fresh.values()), len(fresh)))
                except SaveError as exc:
                    failed = exc
                else:
                    index = self._shard_index.get(shard)
                    if index is None:
                        index = self._shard_index[shard] = len(self._shard_paths)
                        self._shard_paths.append(shard)
                    for key in fresh:
                        self._saved[key] = index
            for entry, key, _ in pending:
                saved = self._saved.get(key)
                results[entry] = self._shard_paths[saved] if saved is not None else failed  # type: ignore[assignment]
        return results


# -- reading shards ----------------------------------------------------------------------------


class JsonLinesShard:
    """Reads one shard (or a joined output) back, a page's records at a time, tolerating a torn
    tail: reading stops at a line cut short (no LF at the end), a line that is not a record, or
    a gzip member cut short or corrupt, and ``torn`` then says so. A page cut short at a line's
    end cannot be told from a whole one here: :func:`join_jsonl` keeps the longest copy."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        name = self.path.name
        ext = max((e for e in EXTENSIONS if name.endswith(e)), key=len, default=None)
        if ext is None:
            raise ValueError(f"{str(path)!r} is not a .jsonl or .jsonl.gz file")
        self.compression = EXTENSIONS[ext]
        self.torn = False

    def units(self) -> Iterator[tuple[UnitKey, list[bytes]]]:
        """Each page's lines (LF included), in order, with its key; raises :class:`NotAUnit` for
        a line longer than :data:`MAX_LINE_BYTES`."""
        self.torn = False
        key: Optional[UnitKey] = None
        lines: list[bytes] = []
        for line in self._lines():
            line_key = _key_of(line)
            if line_key is None:
                self.torn = True
                break
            if line_key != key and lines:
                yield key, lines  # type: ignore[misc]
                lines = []
            key = line_key
            lines.append(line)
        if lines:
            yield key, lines  # type: ignore[misc]

    def records(self) -> Iterator[dict]:
        """Every complete record, in order (duplicates included)."""
        for _, lines in self.units():
            for line in lines:
                yield json.loads(line)

    def _lines(self) -> Iterator[bytes]:
        with open(self.path, "rb") as fh:
            stream = CompleteUnits(fh, self.compression)
            pending = b""
            while True:
                chunk = stream.read(_READ_CHUNK)
                if not chunk:
                    break
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for line in complete:
                    yield line + b"\n"
                if len(pending) > MAX_LINE_BYTES:
                    raise NotAUnit(f"a line longer than {MAX_LINE_BYTES} bytes")
            self.torn = bool(pending) or stream.torn


def _key_of(line: bytes) -> Optional[UnitKey]:
    """The page key of a record line; None for a line that is not a record."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    url, fetched_at = record.get("url"), record.get("fetched_at")
    if not (isinstance(url, str) and isinstance(fetched_at, str)):
        return None
    return url, fetched_at


def jsonl_shards(output: str | os.PathLike) -> list[Path]:
    """Every shard of the JSON Lines output ``output`` names, in name order. Raises
    :class:`ConfigError` if ``output`` is not a .jsonl or .jsonl.gz name."""
    return ShardNames(output, tuple(EXTENSIONS), "JSON Lines").shards()


def join_jsonl(output: str | os.PathLike) -> Joined:
    """Join the shards of the JSON Lines output ``output`` into ``output`` itself and remove
    them (see :func:`~distscrape_celery.savers.joining.join_shards`): what an earlier join wrote
    there first, whole, then each page the shards hold once, in shard order. A page is its
    final URL: of the copies of its records in the shards (its save done again after a crash,
    from the same fetch or from a new download), the latest fetch is kept, and of that the
    longest copy (one cut short by a crash is a prefix of a whole one). ``Joined.items`` counts
    the pages written."""
    names = ShardNames(output, tuple(EXTENSIONS), "JSON Lines")
    compression = EXTENSIONS[names.extension]
    chosen: Optional[dict[str, tuple[Path, int]]] = None

    def choose(shards: list[Path]) -> dict[str, tuple[Path, int]]:
        """For each page's URL, the shard and position of the copy to keep."""
        best: dict[str, tuple[tuple[str, int], Path, int]] = {}
        for shard in shards:
            for position, ((url, fetched_at), lines) in enumerate(_units_of(shard, False)):
                rank = (fetched_at, len(lines))
                if url not in best or rank > best[url][0]:
                    best[url] = (rank, shard, position)
        return {url: (shard, position) for url, (_, shard, position) in best.items()}

    def units(path: Path, whole: bool) -> Iterator[tuple[bytes, Optional[UnitKey]]]:
        nonlocal chosen
        if chosen is None:
            chosen = choose(names.shards())
        for position, (key, lines) in enumerate(_units_of(path, whole)):
            data = b"".join(lines)
            keep = whole or chosen.get(key[0]) == (path, position)
            yield (_gzip_member(data) if compression else data), key if keep else None

    return join_shards(names, units, item_of=lambda key: key, read_back=_read_back)


def _units_of(path: Path, whole: bool) -> Iterator[tuple[UnitKey, list[bytes]]]:
    """The units of ``path``; for ``whole`` (an earlier join's output), :class:`NotAUnit` if it
    does not read to its end."""
    shard = JsonLinesShard(path)
    yield from shard.units()
    if shard.torn:
        if whole:
            raise NotAUnit("a line that is not a record, or a torn tail")
        log.warning("shard %s has a torn tail; its complete records were joined", path)


def _read_back(path: Path) -> list[UnitKey]:
    """The page keys of ``path`` in order, as a standard reader (the gzip module, each line
    parsed) sees them: :class:`NotAUnit` for anything but whole records."""
    import gzip

    keys: list[UnitKey] = []
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            for line in fh:
                key = _key_of(line) if line.endswith(b"\n") else None
                if key is None:
                    raise NotAUnit("a line that is not a whole record")
                if not keys or keys[-1] != key:
                    keys.append(key)
    except (OSError, EOFError, zlib.error) as exc:
        raise NotAUnit(str(exc)) from exc
    return keys
