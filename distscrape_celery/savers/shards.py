"""Per-worker archive shards: what the tar and WARC savers share.

Many workers, on many hosts, save into one job's archive at once, so no two processes ever write
one file. Each saver instance writes shards of its own, named after the job's output::

    /data/site.tar.gz  ->  /data/site-<worker>-<pid>-<seq>.tar.gz   (e.g. site-w3-4711-00001.tar.gz)

A shard is created with ``O_EXCL`` (the sequence number is bumped past any file that exists), and
nobody ever appends to a shard it did not create: the tail of an old one may be torn. Every item is
appended as one complete unit (for compressed formats, its own gzip member or bz2 stream) with a
single write, then fsynced if asked, before ``save`` returns; a crash can therefore only tear the
unit being written, and every earlier unit stays readable. :class:`CompleteUnits` reads a shard
back, stopping cleanly at a torn tail.
"""

from __future__ import annotations

import bz2
import contextlib
import hashlib
import logging
import os
import re
import secrets
import threading
import zlib
from abc import abstractmethod
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Optional

from ..errors import ConfigError, SaveError
from ..web.fetch import Download
from .base import ItemSaver

log = logging.getLogger(__name__)

_SEQ_DIGITS = 5
# Worker IDs go into file names; anything but these (":" of "host:pid", "/", "-") becomes "_",
# and "-" too, so that a shard name splits into its parts unambiguously.
_UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9_.]")
_READ_CHUNK = 1 << 16


class ShardNames:
    """How the shards of one output are named and found.

    ``output`` is the name the job's spec gives (``/data/site.tar.gz``); it must end with one of
    ``extensions`` (longest match wins) and have a non-empty stem. A bad name raises
    :class:`ConfigError` naming ``saver.output``.
    """

    def __init__(self, output: str | os.PathLike, extensions: tuple[str, ...], kind: str) -> None:
        path = Path(os.path.abspath(output))
        name = path.name
        ext = max((e for e in extensions if name.endswith(e)), key=len, default=None)
        if ext is None or not name[: -len(ext)]:
            raise ConfigError(
                f"saver.output {str(output)!r} is not a valid {kind} archive name: it must be a "
                f"file name ending with {' or '.join(extensions)} (shards are named after it)"
            )
        self.output = path
        self.directory = path.parent
        self.stem = name[: -len(ext)]
        self.ext = ext
        self._pattern = re.compile(
            re.escape(self.stem)
            + r"-([A-Za-z0-9_.]+)-(\d+)-(\d{%d,})" % _SEQ_DIGITS
            + re.escape(ext)
        )

    def path_for(self, worker_id: str, pid: int, seq: int) -> Path:
        worker = _UNSAFE_IN_NAME.sub("_", worker_id) or "_"
        return self.directory / f"{self.stem}-{worker}-{pid}-{seq:0{_SEQ_DIGITS}d}{self.ext}"

    def shards(self) -> list[Path]:
        """Every shard of this output that exists now, sorted by (worker, pid, sequence)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            match = self._pattern.fullmatch(name)
            if match and (self.directory / name).is_file():
                worker, pid, seq = match.groups()
                found.append(((worker, int(pid), int(seq)), self.directory / name))
        return [path for _, path in sorted(found)]


class ShardWriter:
    """The current shard of one saver instance: created with O_EXCL, appended to one whole unit
    at a time, rotated by size or item count. Not thread-safe by itself (the saver locks)."""

    def __init__(
        self, names: ShardNames, worker_id: str, *, max_bytes: int, max_items: Optional[int],
        fsync: bool, header: Optional[Callable[[Path], bytes]] = None, trailer: bytes = b"",
    ) -> None:
        self.names = names
        self.worker_id = worker_id
        self.max_bytes = max_bytes
        self.max_items = max_items
        self.fsync = fsync
        self._header = header
        self._trailer = trailer
        self._seq = 0
        self._fd: Optional[int] = None
        self._pid = 0
        self.path: Optional[Path] = None
        self.size = 0  # bytes known good on disk
        self.items = 0
        self._dir_ready = False

    def ensure_directory(self) -> None:
        if not self._dir_ready:
            try:
                self.names.directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise SaveError(
                    f"cannot create output directory {str(self.names.directory)!r}: "
                    f"{exc.strerror or exc}"
                ) from exc
            self._dir_ready = True

    def append(self, unit: bytes) -> Path:
        """Append ``unit`` (one item, complete) to the current shard, durably; return the shard.

        Opens a new shard first when there is none, or when ``unit`` would take a non-empty
        shard past ``max_bytes``; finishes the shard once it reaches ``max_bytes`` or
        ``max_items``. Raises :class:`SaveError` (with the OSError as its cause) on failure,
        leaving the shard as it was before the call, or abandoned if that cannot be ensured."""
        if self._fd is not None and self._pid != os.getpid():
            self._forget_inherited()  # forked with an open shard: the parent's, not ours
        if self._fd is not None and self.items and self.size + len(unit) > self.max_bytes:
            self.finish()
        if self._fd is None:
            self._open_new()
        assert self._fd is not None and self.path is not None
        path = self.path
        data = unit
        if self.size == 0 and self._header is not None:
            data = self._header(path) + unit
        self._write(data)
        self.items += 1
        full = self.max_items is not None and self.items >= self.max_items
        if full or self.size >= self.max_bytes:
            try:
                self.finish()
            except SaveError:
                # The item itself is safely written; a shard that cannot be finished stays
                # readable up to its last unit.
                log.exception("could not finish shard %s", path)
        return path

    def finish(self) -> None:
        """Write the trailer (end-of-archive), make it durable and close the shard."""
        fd, path = self._fd, self.path
        if fd is None or self._pid != os.getpid():
            self._forget_inherited()
            return
        try:
            if self._trailer:
                self._write(self._trailer)
            elif self.fsync:
                try:
                    os.fsync(fd)
                except OSError as exc:
                    raise SaveError(
                        f"cannot sync shard {str(path)!r}: {exc.strerror or exc}"
                    ) from exc
        finally:
            if self._fd == fd:  # not closed already by _abandon
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._fd = None
            self.path = None
        log.info("finished shard %s (%d items, %d bytes)", path, self.items, self.size)

    def _forget_inherited(self) -> None:
        # Never close: the descriptor may be the parent's own, shared after a fork.
        self._fd = None
        self.path = None

    def _open_new(self) -> None:
        self.ensure_directory()
        pid = os.getpid()
        while True:
            self._seq += 1
            path = self.names.path_for(self.worker_id, pid, self._seq)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o666)
            except FileExistsError:
                continue  # a shard of an earlier process with our pid (or a re-used saver)
            except OSError as exc:
                raise SaveError(
                    f"cannot create shard {str(path)!r}: {exc.strerror or exc}"
                ) from exc
            break
        self._fd, self._pid, self.path = fd, pid, path
        self.size = 0
        self.items = 0
        if self.fsync:
            try:
                _fsync_dir(self.names.directory)
            except OSError as exc:
                self._abandon()
                raise SaveError(
                    f"cannot make shard {str(path)!r} durable: {exc.strerror or exc}"
                ) from exc

    def _write(self, data: bytes) -> None:
        fd = self._fd
        assert fd is not None
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if self.fsync:
                os.fsync(fd)
        except OSError as exc:
            path = self.path
            # Put the shard back as it was, so the next unit follows a complete one; if that
            # fails too, leave it (readers stop at its torn tail) and start a new one next time.
            try:
                os.ftruncate(fd, self.size)
                if self.fsync:
                    os.fsync(fd)
            except OSError:
                self._abandon()
            raise SaveError(f"cannot write shard {str(path)!r}: {exc.strerror or exc}") from exc
        self.size += len(data)

    def _abandon(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None
        self.path = None


class ShardedItemSaver(ItemSaver):
    """Base of the savers that append items to per-worker shards (tar, WARC).

    Subclasses give ``_names`` and ``_writer`` and encode one item as one complete unit. Saving
    is thread-safe, durable when it returns (flushed; fsynced with ``fsync``), and idempotent
    within the instance: an item saved before is not written again.
    """

    _names: ShardNames
    _writer: ShardWriter

    def _init_shared(self) -> None:
        self._lock = threading.Lock()
        # sha1(item) -> index in self._shard_paths: what was saved, and where.
        self._saved: dict[bytes, int] = {}
        self._shard_paths: list[str] = []
        self._shard_index: dict[str, int] = {}

    def open(self) -> None:
        """Create the output's directory; the first shard is created by the first save."""
        with self._lock:
            self._writer.ensure_directory()

    def close(self) -> None:
        """Finish the current shard (end-of-archive, fsync) and close it."""
        with self._lock:
            self._writer.finish()

    def shards(self) -> list[Path]:
        """Every shard of this saver's output on this host (all workers', not only ours)."""
        return self._names.shards()

    @abstractmethod
    def _encode(self, item: str, download: Download) -> bytes:
        """``item`` as one complete unit of the shard format."""

    @abstractmethod
    def _location(self, shard: str, item: str) -> str:
        """What ``save`` returns for ``item`` saved in ``shard``."""

    def save(self, item: str, download: Download) -> str:
        key = hashlib.sha1(item.encode("utf-8", "surrogatepass")).digest()
        with self._lock:
            index = self._saved.get(key)
            if index is not None:
                return self._location(self._shard_paths[index], item)
        try:
            unit = self._encode(item, download)
        except (ValueError, UnicodeError) as exc:
            raise SaveError(f"cannot encode {item!r} for the archive: {exc}") from exc
        with self._lock:
            index = self._saved.get(key)  # a concurrent save of the same item won the race
            if index is None:
                shard = str(self._writer.append(unit))
                index = self._shard_index.get(shard)
                if index is None:
                    index = self._shard_index[shard] = len(self._shard_paths)
                    self._shard_paths.append(shard)
                self._saved[key] = index
            return self._location(self._shard_paths[index], item)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- reading shards back -----------------------------------------------------------------------


class CompleteUnits:
    """A read-only byte stream of a shard's complete units, decompressed.

    ``compression`` is "" (the file as is), "gz" (concatenated gzip members) or "bz2"
    (concatenated bz2 streams). For a compressed shard only members that end with a valid
    trailer (CRC and length checked) are passed on; the first torn or corrupt member ends the
    stream and sets ``torn``. An uncompressed shard is passed on whole: its reader must tell a
    torn last member itself (tar does, by the sizes in its headers).
    """

    def __init__(self, fh: BinaryIO, compression: str) -> None:
        if compression not in ("", "gz", "bz2"):
            raise ValueError(f"unknown compression {compression!r}")
        self._fh = fh
        self.compression = compression
        self.torn = False
        self.last_unit: Optional[bytes] = None  # the last complete unit, decompressed
        self._buf = b""
        self._pos = 0
        self._members = self._decompressed_members() if compression else None

    def read(self, size: int = -1) -> bytes:
        if self._members is None:
            return self._fh.read(size)
        out: list[bytes] = []
        want = size
        while want != 0:
            left = len(self._buf) - self._pos
            if left <= 0:
                chunk = next(self._members, None)
                if chunk is None:
                    break
                self._buf, self._pos = chunk, 0
                continue
            take = left if want < 0 else min(want, left)
            out.append(self._buf[self._pos:self._pos + take])
            self._pos += take
            if want > 0:
                want -= take
        return b"".join(out)

    def _new_decompressor(self):
        if self.compression == "gz":
            return zlib.decompressobj(zlib.MAX_WBITS | 16)  # a gzip member, trailer checked
        return bz2.BZ2Decompressor()

    def _decompressed_members(self) -> Iterator[bytes]:
        for _, data in self.members():
            yield data

    def members(self, max_unit: Optional[int] = None) -> Iterator[tuple[bytes, bytes]]:
        """Each complete unit of a compressed shard as (its bytes in the file, decompressed).

        Stops at a torn or corrupt unit (``torn``); raises :class:`NotAUnit` for one that
        decompresses to more than ``max_unit`` bytes (decompression stops there)."""
        pending = b""
        while True:
            if not pending:
                pending = self._fh.read(_READ_CHUNK)
                if not pending:
                    return  # the end of the last complete member: a clean end
            decomp = self._new_decompressor()
            fed: list[bytes] = []
            parts: list[bytes] = []
            size = 0
            try:
                while True:
                    fed.append(pending)
                    if max_unit is None:
                        out = decomp.decompress(pending)
                    else:
                        # Asking for one byte more than allowed tells a unit too large without
                        # ever holding more than that of it.
                        out = decomp.decompress(pending, max_unit + 1 - size)
                    size += len(out)
                    parts.append(out)
                    if max_unit is not None and size > max_unit:
                        raise NotAUnit(f"a unit larger than {max_unit} bytes")
                    if decomp.eof:
                        pending = decomp.unused_data
                        break
                    pending = self._fh.read(_READ_CHUNK)
                    if not pending:
                        self.torn = True  # the file ends inside this member
                        return
            except (zlib.error, OSError, EOFError, ValueError) as exc:
                if isinstance(exc, NotAUnit):
                    raise
                self.torn = True  # garbage: nothing after it can be trusted
                return
            raw = b"".join(fed)
            self.last_unit = b"".join(parts)
            yield raw[: len(raw) - len(pending)], self.last_unit


class NotAUnit(ValueError):
    """Part of an archive is not one unit a saver writes (one item, or the end marker)."""


# -- joining shards into the named output ------------------------------------------------------


@dataclass(frozen=True)
class Joined:
    """The output the shards were joined into, how many items it holds (None: not counted, as
    there was nothing to join into it) and the shards that were joined in and then removed."""

    path: Path
    items: Optional[int]
    shards: tuple[Path, ...]


# A source's units: (bytes to copy, key to keep each once, or None for a unit not to copy).
Units = Callable[[Path, bool], Iterator[tuple[bytes, Optional[Hashable]]]]


def join_shards(
    names: ShardNames, units: Units, *, item_of: Callable[[Hashable], Optional[str]],
    read_back: Callable[[Path], list[Hashable]], head: Callable[[Path], bytes] = lambda p: b"",
    tail: bytes = b"",
) -> Joined:
    """Join every shard of ``names.output`` (and the output itself, if it exists: an earlier
    join) into the output, each unit once, copied as it is on disk; then remove the shards.

    ``units(path, whole)`` gives a source's units (``whole`` for the existing output, which must
    read to its end without a torn tail and hold nothing but saved items). The new archive is
    ``head(path)``, the units, ``tail``; it is written beside the output, fsynced, read back
    with ``read_back`` (which must give every key written, in order, or raise
    :class:`NotAUnit`), and only then renamed over the output and the shards removed. Raises :class:`SaveError` naming the output when
    the join cannot be done; the shards and the output are then left as they were."""
    output = names.output
    shards = names.shards()
    if not shards and output.is_file():
        return Joined(output, None, ())  # nothing to add: the output is as an earlier join left it
    sources = shards + ([output] if output.exists() else [])
    # Not mkstemp: the archive gets the mode a shard gets (0666 less the umask), not 0600.
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    tmp = names.directory / f".{names.stem}.joining-{token}{names.ext}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise SaveError(
            f"cannot join the shards into {str(output)!r}: {exc.strerror or exc}"
        ) from exc
    try:
        written: list[Hashable] = []
        seen: set[Hashable] = set()
        with open(fd, "wb") as out:
            out.write(head(output))
            for source in sources:
                whole = source == output
                for raw, key in _checked_units(units, source, whole, output):
                    if key is None or key in seen:
                        continue  # a late duplicate: the first copy, in source order, is kept
                    seen.add(key)
                    written.append(key)
                    out.write(raw)
            out.write(tail)
            out.flush()
            os.fsync(out.fileno())
        try:
            problem = "" if read_back(tmp) == written else "not what was written"
        except NotAUnit as exc:
            problem = str(exc)
        if problem:
            raise SaveError(
                f"cannot join the shards into {str(output)!r}: the joined archive does not read "
                f"back ({problem}); nothing was changed"
            )
        os.replace(tmp, output)
        _fsync_dir(names.directory)
    except OSError as exc:
        raise SaveError(
            f"cannot join the shards into {str(output)!r}: {exc.strerror or exc}"
        ) from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    for shard in shards:
        with contextlib.suppress(FileNotFoundError):
            shard.unlink()
    with contextlib.suppress(OSError):
        _fsync_dir(names.directory)
    items = {item for item in map(item_of, written) if item is not None}
    return Joined(output, len(items), tuple(shards))


def _checked_units(
    units: Units, source: Path, whole: bool, output: Path
) -> Iterator[tuple[bytes, Optional[Hashable]]]:
    """``units(source, whole)``, with a unit that is not a saver's turned into a SaveError."""
    try:
        yield from units(source, whole)
    except NotAUnit as exc:
        what = (f"{str(output)!r} exists and is not an archive this crawler wrote"
                if whole else f"its shard {str(source)!r} holds something no saver wrote")
        raise SaveError(
            f"cannot join the shards into {str(output)!r}: {what} ({exc}); "
            f"nothing was changed"
        ) from None
