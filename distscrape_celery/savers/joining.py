"""Reading archive shards back, and joining them into the output a job's spec names.

A shard's tail may be torn by a crash (see :mod:`.shards`): :class:`CompleteUnits` passes on only
its complete units. :func:`join_shards` copies every unit of every shard once into one archive,
checks that it reads back, and only then replaces the output and removes the shards; the tar and
WARC savers each give it their own unit reader.
"""

from __future__ import annotations

import bz2
import contextlib
import os
import secrets
import zlib
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Optional

from ..errors import SaveError
from .base import fsync_directory
from .shards import ShardNames

_READ_CHUNK = 1 << 16


class CompleteUnits:
    """A read-only byte stream of a shard's complete units, decompressed.

    ``compression`` is "" (the file as is), "gz" (concatenated gzip members) or "bz2"
    (concatenated bz2 streams). For a compressed shard only members that end with a valid
    trailer (CRC and length checked) are passed on; the first torn or corrupt member ends the
    stream and sets ``torn``. An uncompressed shard is passed on whole: its reader must tell a
    torn last member itself (tar does, by the sizes in its headers).
    """

    def __init__(self, shard: BinaryIO, compression: str) -> None:
        if compression not in ("", "gz", "bz2"):
            raise ValueError(f"unknown compression {compression!r}")
        self._shard = shard
        self.compression = compression
        self.torn = False
        self.last_unit: Optional[bytes] = None  # the last complete unit, decompressed
        self._unit = b""
        self._offset = 0
        self._members = self._decompressed_members() if compression else None

    def read(self, size: int = -1) -> bytes:
        if self._members is None:
            return self._shard.read(size)
        pieces: list[bytes] = []
        want = size
        while want != 0:
            left = len(self._unit) - self._offset
            if left <= 0:
                chunk = next(self._members, None)
                if chunk is None:
                    break
                self._unit, self._offset = chunk, 0
                continue
            take = left if want < 0 else min(want, left)
            pieces.append(self._unit[self._offset:self._offset + take])
            self._offset += take
            if want > 0:
                want -= take
        return b"".join(pieces)

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
                pending = self._shard.read(_READ_CHUNK)
                if not pending:
                    return  # the end of the last complete member: a clean end
            decomp = self._new_decompressor()
            consumed: list[bytes] = []
            parts: list[bytes] = []
            size = 0
            try:
                while True:
                    consumed.append(pending)
                    if max_unit is None:
                        piece = decomp.decompress(pending)
                    else:
                        # Asking for one byte more than allowed tells a unit too large without
                        # ever holding more than that of it.
                        piece = decomp.decompress(pending, max_unit + 1 - size)
                    size += len(piece)
                    parts.append(piece)
                    if max_unit is not None and size > max_unit:
                        raise NotAUnit(f"a unit larger than {max_unit} bytes")
                    if decomp.eof:
                        pending = decomp.unused_data
                        break
                    pending = self._shard.read(_READ_CHUNK)
                    if not pending:
                        self.torn = True  # the file ends inside this member
                        return
            except (zlib.error, OSError, EOFError, ValueError) as exc:
                if isinstance(exc, NotAUnit):
                    raise
                self.torn = True  # garbage: nothing after it can be trusted
                return
            compressed = b"".join(consumed)
            self.last_unit = b"".join(parts)
            yield compressed[: len(compressed) - len(pending)], self.last_unit


class NotAUnit(ValueError):
    """Part of an archive is not one unit a saver writes (one item, or the end marker)."""


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
    read_back: Callable[[Path], list[Hashable]], head: Callable[[Path], bytes] = lambda path: b"",
    tail: bytes = b"",
) -> Joined:
    """Join every shard of ``names.output`` (and the output itself, if it exists: an earlier
    join) into the output, each unit once, copied as it is on disk; then remove the shards.

    ``units(path, whole)`` gives a source's units (``whole`` for the existing output, which must
    read to its end without a torn tail and hold nothing but saved items). The new archive is
    ``head(path)``, the units, ``tail``; it is written beside the output, fsynced, read back
    with ``read_back`` (which must give every key written, in order, or raise
    :class:`NotAUnit`), and only then renamed over the output and the shards removed. Raises
    :class:`SaveError` naming the output when the join cannot be done; the shards and the
    output are then left as they were."""
    output = names.output
    shards = names.shards()
    if not shards and output.is_file():
        return Joined(output, None, ())  # nothing to add: the output is as an earlier join left it
    # The output first: a job that runs again appends its new captures to what it saved before.
    sources = ([output] if output.exists() else []) + shards
    joining, descriptor = _create_beside(names)
    try:
        with open(descriptor, "wb") as archive:
            written = _copy_units(archive, output, sources, units, head(output), tail)
        _check_reads_back(joining, written, read_back, output)
        os.replace(joining, output)
        fsync_directory(names.directory)
    except OSError as exc:
        raise SaveError(
            f"cannot join the shards into {str(output)!r}: {exc.strerror or exc}"
        ) from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            joining.unlink()
    _remove_shards(shards, names.directory)
    items = {item for item in map(item_of, written) if item is not None}
    return Joined(output, len(items), tuple(shards))


def _create_beside(names: ShardNames) -> tuple[Path, int]:
    """A new file beside the output, to join into: its path and its open descriptor."""
    # Not mkstemp: the archive gets the mode a shard gets (0666 less the umask), not 0600.
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    path = names.directory / f".{names.stem}.joining-{token}{names.extension}"
    try:
        return path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise SaveError(
            f"cannot join the shards into {str(names.output)!r}: {exc.strerror or exc}"
        ) from exc


def _copy_units(
    archive: BinaryIO, output: Path, sources: list[Path], units: Units, head: bytes, tail: bytes,
) -> list[Hashable]:
    """Write ``head``, each unit of ``sources`` once (the first copy, in source order) and
    ``tail`` to ``archive``, durably; return the keys written, in order."""
    written: list[Hashable] = []
    seen: set[Hashable] = set()
    archive.write(head)
    for source in sources:
        whole = source == output
        for unit, key in _checked_units(units, source, whole, output):
            if key is None or key in seen:
                continue  # a save written twice: its first copy, in source order, is kept
            seen.add(key)
            written.append(key)
            archive.write(unit)
    archive.write(tail)
    archive.flush()
    os.fsync(archive.fileno())
    return written


def _check_reads_back(
    path: Path, written: list[Hashable], read_back: Callable[[Path], list[Hashable]], output: Path,
) -> None:
    """Raise :class:`SaveError` unless the archive at ``path`` reads back as ``written``."""
    try:
        problem = "" if read_back(path) == written else "not what was written"
    except NotAUnit as exc:
        problem = str(exc)
    if problem:
        raise SaveError(
            f"cannot join the shards into {str(output)!r}: the joined archive does not read "
            f"back ({problem}); nothing was changed"
        )


def _remove_shards(shards: list[Path], directory: Path) -> None:
    """Remove the joined ``shards`` (one already gone is no error), durably if it can be."""
    for shard in shards:
        with contextlib.suppress(FileNotFoundError):
            shard.unlink()
    with contextlib.suppress(OSError):
        fsync_directory(directory)


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
