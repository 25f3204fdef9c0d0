"""Per-worker archive shards: what the tar, WARC and JSON Lines savers share.

Many workers, on many hosts, save into one job's archive at once, so no two processes ever write
one file. Each saver instance writes shards of its own, named after the job's output::

    /data/site.tar.gz  ->  /data/site-<worker>-<pid>-<seq>.tar.gz   (e.g. site-w3-4711-00001.tar.gz)

A shard is created with ``O_EXCL`` (the sequence number is bumped past any file that exists), and
nobody ever appends to a shard it did not create: the tail of an old one may be torn. Every item is
appended as one complete unit (for compressed formats, its own gzip member or bz2 stream) with a
single write, then fsynced if asked, before ``save`` returns; a crash can therefore only tear the
unit being written, and every earlier unit stays readable. :mod:`.joining` reads shards back,
stopping cleanly at a torn tail, and joins them into the named output.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import threading
from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from ..errors import ConfigError, SaveError
from ..web.fetch import Download
from .base import ItemSaver, fsync_directory

log = logging.getLogger(__name__)

_SEQ_DIGITS = 5
# Worker IDs go into file names; anything but these (":" of "host:pid", "/", "-") becomes "_",
# and "-" too, so that a shard name splits into its parts unambiguously.
_UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9_.]")


class ShardNames:
    """How the shards of one output are named and found.

    ``output`` is the name the job's spec gives (``/data/site.tar.gz``); it must end with one of
    ``extensions`` (longest match wins) and have a non-empty stem. A bad name raises
    :class:`ConfigError` naming ``saver.output``.
    """

    def __init__(self, output: str | os.PathLike, extensions: tuple[str, ...], kind: str) -> None:
        path = Path(os.path.abspath(output))
        name = path.name
        extension = max((ending for ending in extensions if name.endswith(ending)), key=len,
                        default=None)
        if extension is None or not name[: -len(extension)]:
            raise ConfigError(
                f"saver.output {str(output)!r} is not a valid {kind} archive name: it must be a "
                f"file name ending with {' or '.join(extensions)} (shards are named after it)"
            )
        self.output = path
        self.directory = path.parent
        self.stem = name[: -len(extension)]
        self.extension = extension
        self._pattern = re.compile(
            re.escape(self.stem)
            + r"-([A-Za-z0-9_.]+)-(\d+)-(\d{%d,})" % _SEQ_DIGITS
            + re.escape(extension)
        )

    def path_for(self, worker_id: str, pid: int, sequence: int) -> Path:
        """The shard ``sequence`` of process ``pid`` of worker ``worker_id``."""
        worker = _UNSAFE_IN_NAME.sub("_", worker_id) or "_"
        return self.directory / (
            f"{self.stem}-{worker}-{pid}-{sequence:0{_SEQ_DIGITS}d}{self.extension}"
        )

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
                worker, pid, sequence = match.groups()
                found.append(((worker, int(pid), int(sequence)), self.directory / name))
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
        self._sequence = 0
        self._descriptor: Optional[int] = None
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

    def append(self, unit: bytes, items: int = 1) -> Path:
        """Append ``unit`` (``items`` items, each complete) to the current shard, durably, with
        one write; return the shard.

        Opens a new shard first when there is none, or when ``unit`` would take a non-empty
        shard past ``max_bytes``; finishes the shard once it reaches ``max_bytes`` or
        ``max_items``. Raises :class:`SaveError` (with the OSError as its cause) on failure,
        leaving the shard as it was before the call, or abandoned if that cannot be ensured."""
        if self._descriptor is not None and self._pid != os.getpid():
            self._forget_inherited()  # forked with an open shard: the parent's, not ours
        if self._descriptor is not None and self.items and self.size + len(unit) > self.max_bytes:
            self.finish()
        if self._descriptor is None:
            self._open_new()
        assert self._descriptor is not None and self.path is not None
        path = self.path
        data = unit
        if self.size == 0 and self._header is not None:
            data = self._header(path) + unit
        self._write(data)
        self.items += items
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
        descriptor, path = self._descriptor, self.path
        if descriptor is None or self._pid != os.getpid():
            self._forget_inherited()
            return
        try:
            if self._trailer:
                self._write(self._trailer)
            elif self.fsync:
                try:
                    os.fsync(descriptor)
                except OSError as exc:
                    raise SaveError(
                        f"cannot sync shard {str(path)!r}: {exc.strerror or exc}"
                    ) from exc
        finally:
            if self._descriptor == descriptor:  # not closed already by _abandon
                with contextlib.suppress(OSError):
                    os.close(descriptor)
            self._descriptor = None
            self.path = None
        log.info("finished shard %s (%d items, %d bytes)", path, self.items, self.size)

    def _forget_inherited(self) -> None:
        # Never close: the descriptor may be the parent's own, shared after a fork.
        self._descriptor = None
        self.path = None

    def _open_new(self) -> None:
        self.ensure_directory()
        pid = os.getpid()
        while True:
            self._sequence += 1
            path = self.names.path_for(self.worker_id, pid, self._sequence)
            try:
                descriptor = os.open(
                    path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o666
                )
            except FileExistsError:
                continue  # a shard of an earlier process with our pid (or a re-used saver)
            except OSError as exc:
                raise SaveError(
                    f"cannot create shard {str(path)!r}: {exc.strerror or exc}"
                ) from exc
            break
        self._descriptor, self._pid, self.path = descriptor, pid, path
        self.size = 0
        self.items = 0
        if self.fsync:
            try:
                fsync_directory(self.names.directory)
            except OSError as exc:
                self._abandon()
                raise SaveError(
                    f"cannot make shard {str(path)!r} durable: {exc.strerror or exc}"
                ) from exc

    def _write(self, data: bytes) -> None:
        descriptor = self._descriptor
        assert descriptor is not None
        try:
            view = memoryview(data)
            while view:
                written = os.write(descriptor, view)
                view = view[written:]
            if self.fsync:
                os.fsync(descriptor)
        except OSError as exc:
            path = self.path
            # Put the shard back as it was, so the next unit follows a complete one; if that
            # fails too, leave it (readers stop at its torn tail) and start a new one next time.
            try:
                os.ftruncate(descriptor, self.size)
                if self.fsync:
                    os.fsync(descriptor)
            except OSError:
                self._abandon()
            raise SaveError(f"cannot write shard {str(path)!r}: {exc.strerror or exc}") from exc
        self.size += len(data)

    def _abandon(self) -> None:
        if self._descriptor is not None:
            with contextlib.suppress(OSError):
                os.close(self._descriptor)
        self._descriptor = None
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
