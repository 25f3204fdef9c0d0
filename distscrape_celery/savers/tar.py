"""TarItemSaver: items as members of per-worker tar shards (.tar, .tar.gz or .tar.bz2)."""

from __future__ import annotations

import bz2
import gzip
import io
import logging
import os
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Optional

from ..web.fetch import Download
from ..job.saver_spec import SaverSpec
from .file_names import DEFAULT_NAME_SCHEME
from .files import FileItemSaver
from .joining import CompleteUnits, Joined, NotAUnit, join_shards
from .shards import ShardedItemSaver, ShardNames, ShardWriter

log = logging.getLogger(__name__)

# Output name ending -> compression of its shards.
EXTENSIONS = {".tar": "", ".tar.gz": "gz", ".tar.bz2": "bz2"}
# PAX keys of each member's metadata.
PAX_ITEM = "DISTSCRAPE.item"
PAX_URL = "DISTSCRAPE.url"
PAX_STATUS = "DISTSCRAPE.status"
PAX_CONTENT_TYPE = "DISTSCRAPE.content_type"
PAX_FETCHED_AT = "DISTSCRAPE.fetched_at"
_END_OF_ARCHIVE = b"\0" * (2 * tarfile.BLOCKSIZE)
_DRAIN_CHUNK = 1 << 20


class TarItemSaver(ShardedItemSaver):
    """Appends each item as one member of a tar shard of this saver's own.

    ``output`` names the archive: ``/data/site.tar``, ``.tar.gz`` or ``.tar.bz2``; its extension
    picks the compression. Each saver instance (one per worker process) writes its own shards,
    ``/data/site-<worker>-<pid>-<seq>.tar.gz``, each created with O_EXCL, and starts a new one
    once a shard would pass ``shard_max_bytes`` (on disk, compressed) or holds
    ``shard_max_items`` items. :meth:`close` ends the current shard with the end-of-archive
    blocks.

    A member is named by ``name_scheme`` exactly as :class:`FileItemSaver` names files, so two
    items may share a member name (e.g. "/a" and "/a/index.html"); the PAX header of every member
    holds the item itself (``DISTSCRAPE.item``), its final URL, status, content type and fetch
    time (``DISTSCRAPE.url``, ``.status``, ``.content_type``, ``.fetched_at``).

    Durability: a member (PAX header, data, padding) is written with one ``write`` as a complete
    unit, in a compressed shard as its own gzip member or bz2 stream (multi-member gzip and
    multi-stream bz2 are standard: ``tar -tzf``, ``tar -tjf``, ``gzip.open`` and ``bz2.open``
    read them; note that :mod:`tarfile`'s own stream modes ``r|gz`` and ``r|bz2`` stop after the
    first member, so read shards with :func:`read_tar_shard` or ``tarfile.open(path, "r:gz")``).
    ``save`` returns only after the unit is written (and fsynced with ``fsync``), so a killed
    worker loses no item it completed, and every member before a torn tail stays readable.

    Duplicates: within one instance, saving an item again writes nothing. Across processes, an
    item whose first save was interrupted, or that a stale worker saved late, may appear in two
    shards (with the same bytes, or a later download of them); :func:`tar_index` reports each
    item once, from the first shard in name order that holds it.
    """

    def __init__(
        self, output: str | os.PathLike, name_scheme: str = DEFAULT_NAME_SCHEME, *, job: str = "",
        worker_id: str = "", fsync: bool = True, shard_max_bytes: int = 1024**3,
        shard_max_items: Optional[int] = None, compresslevel: Optional[int] = None,
    ) -> None:
        self._names = ShardNames(output, tuple(EXTENSIONS), "tar")
        self.output = self._names.output
        self.compression = EXTENSIONS[self._names.extension]
        self.compresslevel = compresslevel
        # Names members exactly as the files saver names files; never writes anything.
        self._namer = FileItemSaver(self._names.directory, name_scheme, job=job, fsync=False)
        self._writer = ShardWriter(
            self._names, worker_id or "local",
            max_bytes=shard_max_bytes, max_items=shard_max_items, fsync=fsync,
            trailer=self._compress(_END_OF_ARCHIVE),
        )
        self._init_shared()

    @classmethod
    def from_spec(cls, spec: SaverSpec, *, job: str, worker_id: str) -> "TarItemSaver":
        return cls(
            spec.output, spec.name_scheme, job=job, worker_id=worker_id, fsync=spec.fsync,
            shard_max_bytes=spec.shard_max_bytes, shard_max_items=spec.shard_max_items,
        )

    def member_name(self, item: str) -> str:
        """The name of ``item``'s member (as :meth:`FileItemSaver.name_for` names its file)."""
        return self._namer.name_for(item).as_posix()

    def _compress(self, data: bytes) -> bytes:
        return _compress_with(self.compression, data, self.compresslevel)

    def _encode(self, item: str, download: Download) -> bytes:
        body = download.body
        info = tarfile.TarInfo(self.member_name(item))
        info.size = len(body)
        info.mtime = int(download.fetched_at)
        info.mode = 0o644
        info.type = tarfile.REGTYPE
        info.pax_headers = {
            PAX_ITEM: item,
            PAX_URL: download.url,
            PAX_STATUS: str(download.status),
            PAX_CONTENT_TYPE: download.content_type,
            PAX_FETCHED_AT: repr(float(download.fetched_at)),
        }
        header = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        padding = b"\0" * (_padded(len(body)) - len(body))
        return self._compress(header + body + padding)

    def _location(self, shard: str, item: str) -> str:
        return f"{shard}#{self.member_name(item)}"


# -- reading shards ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TarRecord:
    """One saved item, read back from a shard. ``body`` is None when bodies were not asked for."""

    item: str
    url: str
    status: int
    content_type: str
    fetched_at: float
    name: str
    shard: str
    body: Optional[bytes] = field(default=None, repr=False)


class TarShard:
    """Reads one tar shard back, member by member, tolerating a torn tail.

    Yields only complete members: in a compressed shard, those whose gzip member or bz2 stream
    is whole (CRC checked); in an uncompressed one, those whose header and data are whole.
    Reading stops at the first torn or corrupt unit; ``torn`` then says so (after iterating).
    A shard that simply ends after a complete member (its worker was killed between items, or
    is still writing) is not torn, only unfinished: ``finished`` is False.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        name = self.path.name
        ext = max((e for e in EXTENSIONS if name.endswith(e)), key=len, default=None)
        if ext is None:
            raise ValueError(f"{str(path)!r} is not a .tar, .tar.gz or .tar.bz2 file")
        self.compression = EXTENSIONS[ext]
        self.torn = False
        self.finished = False

    def __iter__(self) -> Iterator[TarRecord]:
        return self.records()

    def records(self, bodies: bool = True) -> Iterator[TarRecord]:
        self.torn = self.finished = False
        with open(self.path, "rb") as shard_file:
            stream = CompleteUnits(shard_file, self.compression)
            try:
                tar = tarfile.open(fileobj=stream, mode="r|", errorlevel=2)
            except tarfile.ReadError:
                # Nothing complete in it: an empty shard, or an empty archive (its end marker
                # alone) is fine, anything else is torn.
                self.finished = _starts_with_end_marker(shard_file, stream)
                self.torn = not self.finished and (
                    stream.torn or os.fstat(shard_file.fileno()).st_size > 0
                )
                return
            size = os.fstat(shard_file.fileno()).st_size
            for info in self._stream_members(tar):
                if not info.isfile():
                    continue
                try:
                    body = _read_member(tar, info, bodies)
                except (tarfile.ReadError, EOFError):
                    self.torn = True
                    return
                if not self.compression and size < info.offset_data + _padded(info.size):
                    # Its data is there but not its padding: the write of this member was cut
                    # short, so it was never saved (a compressed unit tells this by its CRC).
                    self.torn = True
                    return
                record = _record(info, str(self.path), body)
                if record is not None:
                    yield record
            if self.torn:
                return
            # tar.next() gave None: an end-of-archive marker, or the data simply ended (tarfile
            # cannot tell those apart from a torn header, so look at what is left).
            if self.compression:
                while stream.read(_DRAIN_CHUNK):  # anything after the marker
                    pass
                self.torn = stream.torn
                self.finished = stream.last_unit == _END_OF_ARCHIVE
            else:
                shard_file.seek(tar.offset)
                rest = shard_file.read(len(_END_OF_ARCHIVE))
                self.finished = rest == _END_OF_ARCHIVE
                self.torn = bool(rest) and not self.finished

    def _stream_members(self, tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
        """The members of stream-mode ``tar`` in order, none kept (stream mode keeps every one
        otherwise); a header that cannot be read sets ``torn`` and ends them."""
        while True:
            try:
                info = tar.next()
            except (tarfile.ReadError, EOFError):
                self.torn = True
                return
            if info is None:
                return
            tar.members.clear()
            yield info

    def units(self, max_unit: Optional[int] = None) -> Iterator[tuple[bytes, Optional[str]]]:
        """Each complete member as (its bytes in the file, its item or None), in order, up to
        the end-of-archive marker; ``torn`` and ``finished`` are set as :meth:`records` sets
        them. In a compressed shard a member's bytes are its own gzip member or bz2 stream, so
        they can be copied into another archive as they are. Raises :class:`NotAUnit` for a
        unit that is not exactly one member, or one larger than ``max_unit`` bytes."""
        self.torn = self.finished = False
        if self.compression:
            yield from self._compressed_units(max_unit)
        else:
            yield from self._plain_units(max_unit)

    def _compressed_units(self, max_unit: Optional[int]) -> Iterator[tuple[bytes, Optional[str]]]:
        with open(self.path, "rb") as fh:
            stream = CompleteUnits(fh, self.compression)
            members = stream.members(max_unit)
            for raw, data in members:
                if data == _END_OF_ARCHIVE:
                    self.finished = True
                    if next(members, None) is not None:
                        raise NotAUnit("data after the end-of-archive marker")
                    break
                yield raw, _unit_capture(data)
            self.torn = stream.torn

    def _plain_units(self, max_unit: Optional[int]) -> Iterator[tuple[bytes, Optional[str]]]:
        with open(self.path, "rb") as shard_file:
            descriptor = shard_file.fileno()
            size = os.fstat(descriptor).st_size
            if size == 0:
                return
            if os.pread(descriptor, len(_END_OF_ARCHIVE), 0) == _END_OF_ARCHIVE:
                self.finished = True  # an empty archive
                return
            try:
                tar = tarfile.open(fileobj=shard_file, mode="r|", errorlevel=2)
            except tarfile.ReadError:
                self.torn = True
                return
            for info in self._stream_members(tar):
                end = info.offset_data + _padded(info.size)
                if end > size:
                    self.torn = True  # its data or padding was cut short: never saved
                    return
                if max_unit is not None and end - info.offset > max_unit:
                    raise NotAUnit(f"a member larger than {max_unit} bytes")
                yield os.pread(descriptor, end - info.offset, info.offset), _capture(info)
            if self.torn:
                return
            rest = os.pread(descriptor, len(_END_OF_ARCHIVE), tar.offset)
            self.finished = rest == _END_OF_ARCHIVE
            self.torn = bool(rest) and not self.finished


def _starts_with_end_marker(fh: BinaryIO, stream: CompleteUnits) -> bool:
    if stream.compression:
        return stream.last_unit == _END_OF_ARCHIVE
    return os.pread(fh.fileno(), len(_END_OF_ARCHIVE), 0) == _END_OF_ARCHIVE


# One capture of an item: the item and when it was fetched (as its member records it). A job
# that runs again captures a page once a generation; a save that ran twice (its worker died
# before the tracker heard of it) wrote the same capture twice.
Capture = tuple[str, str]


def _capture(info: tarfile.TarInfo) -> Optional[Capture]:
    """The capture a member holds; None for a member no saver wrote."""
    item = info.pax_headers.get(PAX_ITEM) if info.isfile() else None
    if item is None:
        return None
    return item, info.pax_headers.get(PAX_FETCHED_AT, "")


def _unit_capture(data: bytes) -> Optional[Capture]:
    """The capture of the one member ``data`` (a decompressed unit) holds; :class:`NotAUnit` if
    it is not exactly one member."""
    try:
        info = tarfile.open(fileobj=io.BytesIO(data), mode="r|", errorlevel=2).next()
    except (tarfile.TarError, EOFError) as exc:
        raise NotAUnit(f"not a tar member: {exc}") from None
    if info is None or info.offset_data + _padded(info.size) != len(data):
        raise NotAUnit("not exactly one tar member")
    return _capture(info)


def _padded(size: int) -> int:
    return -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def _read_member(tar: tarfile.TarFile, info: tarfile.TarInfo, bodies: bool) -> Optional[bytes]:
    member = tar.extractfile(info)
    assert member is not None
    if bodies:
        body = member.read()
        if len(body) != info.size:
            raise tarfile.ReadError("unexpected end of data")
        return body
    left = info.size
    while left > 0:
        chunk = member.read(min(left, _DRAIN_CHUNK))
        if not chunk:
            raise tarfile.ReadError("unexpected end of data")
        left -= len(chunk)
    return None


def _record(info: tarfile.TarInfo, shard: str, body: Optional[bytes]) -> Optional[TarRecord]:
    pax = info.pax_headers
    item = pax.get(PAX_ITEM)
    if item is None:
        return None  # a member someone else put there
    try:
        status = int(pax.get(PAX_STATUS, "0"))
        fetched_at = float(pax.get(PAX_FETCHED_AT, info.mtime))
    except ValueError:
        status, fetched_at = 0, float(info.mtime)
    return TarRecord(
        item=item, url=pax.get(PAX_URL, ""), status=status,
        content_type=pax.get(PAX_CONTENT_TYPE, ""), fetched_at=fetched_at, name=info.name,
        shard=shard, body=body,
    )


def tar_shards(output: str | os.PathLike) -> list[Path]:
    """Every shard of the tar archive ``output`` names, in name order (worker, pid, sequence).
    Raises :class:`ConfigError` if ``output`` is not a .tar, .tar.gz or .tar.bz2 name."""
    return ShardNames(output, tuple(EXTENSIONS), "tar").shards()


def read_tar_shard(path: str | os.PathLike, *, bodies: bool = True) -> Iterator[TarRecord]:
    """The complete members of one shard, in order (see :class:`TarShard`)."""
    return TarShard(path).records(bodies)


def tar_index(output: str | os.PathLike) -> Iterator[tuple[str, str, str]]:
    """(item, file, member name) for every item saved in the shards of ``output`` and in
    ``output`` itself (where ``distscrape crawl`` joins its shards).

    Reads every shard matching the output's pattern, in name order, then the output, tolerating
    torn tails (a warning is logged for each); an item found in several is reported once, from
    the first (as :func:`join_tar` keeps it). Raises :class:`ConfigError` for an output that is
    not a tar name.
    """
    names = ShardNames(output, tuple(EXTENSIONS), "tar")
    joined = [names.output] if names.output.is_file() else []
    seen: set[str] = set()
    for path in names.shards() + joined:
        shard = TarShard(path)
        try:
            for record in shard.records(bodies=False):
                if record.item not in seen:
                    seen.add(record.item)
                    yield record.item, record.shard, record.name
        except FileNotFoundError:
            log.warning("shard %s went away while it was read", path)
            continue
        if shard.torn:
            log.warning("shard %s has a torn tail; its complete members were read", path)


def join_tar(output: str | os.PathLike, *, max_unit: int) -> Joined:
    """Join the shards of the tar archive ``output`` into ``output`` itself, each capture of an
    item once (a job that runs again adds a capture a generation), and remove them (see :func:`~distscrape_celery.savers.joining.join_shards`).

    A compressed member is copied as the gzip member or bz2 stream it is in its shard, not
    compressed again; only the shards' end-of-archive markers are left out, and one ends the
    joined archive, which tarfile (``r:gz``) and ``tar -tzf`` read whole. ``max_unit`` bounds
    one member (a bigger one means the file is not what a saver wrote)."""
    names = ShardNames(output, tuple(EXTENSIONS), "tar")
    compression = EXTENSIONS[names.extension]

    def units(path: Path, whole: bool) -> Iterator[tuple[bytes, Optional[Capture]]]:
        shard = TarShard(path)
        for raw, capture in shard.units(max_unit):
            if capture is None and whole:
                raise NotAUnit("a member that is not a saved item")
            yield raw, capture
        if shard.torn:
            if whole:
                raise NotAUnit("a torn tail")
            log.warning("shard %s has a torn tail; its complete members were joined", path)

    return join_shards(
        names, units, item_of=lambda key: key[0], read_back=lambda p: _standard_read(p, compression),
        tail=_compress_with(compression, _END_OF_ARCHIVE),
    )


def _compress_with(compression: str, data: bytes, level: Optional[int] = None) -> bytes:
    """``data`` as one gzip member (mtime 0) or bz2 stream, or as it is."""
    if compression == "gz":
        comp = zlib.compressobj(6 if level is None else level, zlib.DEFLATED, zlib.MAX_WBITS | 16)
        return comp.compress(data) + comp.flush()
    if compression == "bz2":
        return bz2.compress(data, 9 if level is None else level)
    return data


def _standard_read(path: Path, compression: str) -> list[Optional[Capture]]:
    """The captures of ``path`` as a standard reader sees them: the gzip or bz2 module (every
    member or stream, CRCs checked) under a tarfile stream that stops at the first end marker."""
    opener = {"": open, "gz": gzip.open, "bz2": bz2.open}[compression]
    items: list[Optional[Capture]] = []
    try:
        with opener(path, "rb") as fh:
            if fh.read(len(_END_OF_ARCHIVE) + 1) == _END_OF_ARCHIVE:
                return []  # an empty archive, which tarfile refuses to open
            fh.seek(0)
            with tarfile.open(fileobj=fh, mode="r|", errorlevel=2) as tar:
                for info in tar:
                    tar.members.clear()
                    items.append(_capture(info))
    except (OSError, EOFError, zlib.error, tarfile.TarError) as exc:
        raise NotAUnit(str(exc)) from exc
    return items
