"""FileItemSaver: one file per item, under a name built from the item by a name scheme
(:mod:`.file_names`), each written atomically; a save batch's files made durable together."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import os
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional, Union

from ..errors import SaveError
from ..web.fetch import Download
from ..job.saver_spec import SaverSpec
from .base import ItemSaver, fsync_directory
from .file_names import (
    DEFAULT_NAME_SCHEME, escape_name, field_values, finish_segment, parse_scheme, sha1_hex,
)


CONFLICTS_DIR = "_conflicts"

# No name ever holds "#" (escape_name encodes it), so no item can land on a temporary file.
_TMP_PREFIX = ".~tmp-#"
# Failures that depend only on the tree's shape (a file where a directory is needed, a directory
# at the target, a path too long): the item goes to its fallback name instead.
_SHAPE_ERRNOS = frozenset({errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG})


class _ShapeConflict(Exception):
    """The target path cannot be created because of what already exists on the way."""


class FileItemSaver(ItemSaver):
    """Writes each item's body to its own file, ``output / name_for(item)``.

    ``name_scheme`` is a format string over the fields {host} {port} {path} {query} {qhash} {sha1}
    {shard} {job} (see :meth:`name_for`); it must use {path} or {sha1}. Every name stays inside
    ``output``, whatever the item.
    """

    def __init__(
        self, output: str | Path, name_scheme: str = DEFAULT_NAME_SCHEME, *, fsync: bool = True,
        job: str = "", group_commit: bool = True,
    ) -> None:
        self.output = Path(os.path.abspath(output))
        self.fsync = fsync
        self.group_commit = group_commit
        self.job = job
        self._parts = parse_scheme(name_scheme)
        used = {field for _, field in self._parts}
        self._query_in_path = "path" in used and "query" not in used
        self._real_output: Optional[str] = None

    @classmethod
    def from_spec(cls, spec: SaverSpec, *, job: str, worker_id: str) -> "FileItemSaver":
        """Build the saver ``spec`` describes. ``worker_id`` is unused: every item gets its own
        file, whichever worker saves it."""
        return cls(spec.output, spec.name_scheme, fsync=spec.fsync, job=job,
                   group_commit=spec.group_commit)

    def open(self) -> None:
        """Create the output directory (and its parents) if missing."""
        self._opened_output()

    def name_for(self, item: str) -> Path:
        """The relative path ``item`` is saved under; pure and deterministic.

        For an absolute URL: host is the lowercased host name with ":port" when the URL names a
        port (escaped: "127.0.0.1%3A8080"), port the explicit port or "",
        query the raw query, qhash the first 16 hex digits of the query's SHA-1 ("" without a
        query), sha1 the hex SHA-1 of ``item``, shard "ab/cd" from its first four hex digits
        (so that no directory holds more than 65,536 shards of files), job the job's name, and
        path the URL path with
        "index.html" appended to a directory-like path ("/", "/a/", "/a" -> "a/index.html"). When
        the scheme uses {path} but not {query}, "?query" is appended to the path's last segment.
        Any other item (an ID, say) is named with host "_" and path ``item`` as one segment.

        Each segment is percent-escaped down to [A-Za-z0-9._~!$&'()+,;=@-] and "%XX", so it holds
        no "/", NUL or control character; "." and ".." become "%2E" and "%2E%2E", a leading "."
        "%2E" (".ssh" -> "%2Essh": no name is hidden), empty path
        segments ("a//b") "%2F", and a segment over 200 bytes its first 150 characters, "%7E" and
        16 hex digits of its SHA-1. With the default scheme two items share a name only if they
        differ just in URL scheme, a default port written or not, user info, fragment, an empty query, the case of the
        host, a byte that a URL cannot carry raw (space, non-ASCII, ...) written raw or escaped,
        or in being "/a", "/a/" or "/a/index.html".
        """
        fields = field_values(item, query_in_path=self._query_in_path)
        fields["job"] = escape_name(self.job)
        rendered = "".join(
            literal + (fields[field] if field else "") for literal, field in self._parts
        )
        # Empty segments here come from the scheme (an empty {port}, say), not from the item.
        return Path(*(finish_segment(segment) for segment in rendered.split("/") if segment))

    def save(self, item: str, download: Download) -> str:
        """Atomically write ``download.body`` to ``output / name_for(item)``; return that
        absolute path.

        When the tree's shape forbids that name (a directory on the way is a file, as for
        "/x.html" then "/x.html/y"; the target is a directory; the path is too long), the body
        goes to ``output/_conflicts/<sha1 of item>`` instead. Saving again overwrites. Raises
        :class:`SaveError` on an I/O error or when the path would resolve outside ``output``.
        """
        real_output = self._opened_output()
        target = self.output / self.name_for(item)
        try:
            _write_atomically(target, download.body, real_output, self.fsync)
        except _ShapeConflict as first:
            target = self.output / CONFLICTS_DIR / sha1_hex(item)
            try:
                _write_atomically(target, download.body, real_output, self.fsync)
            except _ShapeConflict as second:
                raise SaveError(f"cannot save {item!r}: {first}, and {second}") from second
        return str(target)

    def commits_groups(self) -> bool:
        """True without ``fsync`` (nothing to flush: a batch's items are stored one after another
        and marked done together), and with ``fsync`` and ``group_commit`` where the C library has
        ``syncfs``; never when a subclass overrides :meth:`save` (its ``save`` is then called for
        each item). Without it, each item of a batch costs the tracker a round trip of its own."""
        if type(self).save is not FileItemSaver.save:
            return False
        return not self.fsync or (self.group_commit and _syncfs is not None)

    def save_many(self, entries: Sequence[tuple[str, Download]]) -> list[Union[str, Exception]]:
        """Save ``entries`` as :meth:`save` would, made durable together (group commit): every
        body goes to its temporary file, one ``syncfs`` makes them durable, the renames follow,
        and a second ``syncfs`` makes the renames durable before this returns. Two disk flushes
        for the group instead of two per item; as with :meth:`save`, no file is ever replaced by
        a part, and nothing counts as saved before it is on disk.

        One at a time instead where :meth:`commits_groups` says no, and without ``fsync``,
        which has no flush to share."""
        if len(entries) < 2 or not self.fsync or not self.commits_groups():
            return super().save_many(entries)
        results: list[Union[str, Exception, None]] = [None] * len(entries)
        try:
            real_output = self._opened_output()
        except SaveError as exc:
            return [exc] * len(entries)
        group = self._stage(entries, real_output, results)
        if group.staged:
            _commit(group, real_output, results)
        for index in group.alone:
            try:
                results[index] = FileItemSaver.save(self, *entries[index])
            except Exception as exc:
                results[index] = exc
        return results  # type: ignore[return-value]

    def _stage(
        self, entries: Sequence[tuple[str, Download]], real_output: str,
        results: list[Union[str, Exception, None]],
    ) -> _StagedGroup:
        """Write each entry's body to a temporary file beside its target, not yet synced; an
        entry that fails gets its exception in ``results``."""
        group = _StagedGroup()
        device_by_directory: dict[Path, int] = {}
        real_parents: dict[Path, str] = {}
        for index, (item, download) in enumerate(entries):
            try:
                target = self.output / self.name_for(item)
                temporary = _write_temp(target, download.body, real_output, False, real_parents)
                directory = temporary.parent
                if directory not in device_by_directory:
                    device_by_directory[directory] = _device_of(temporary, target)
                    group.devices.setdefault(device_by_directory[directory], str(directory))
                group.staged.append((index, temporary, target))
            except _ShapeConflict:
                group.alone.append(index)
            except Exception as exc:
                results[index] = exc
        return group

    def _opened_output(self) -> str:
        if self._real_output is None:
            try:
                self.output.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise SaveError(
                    f"cannot create output directory {str(self.output)!r}: {exc.strerror or exc}"
                ) from exc
            self._real_output = os.path.realpath(self.output)
        return self._real_output


@dataclasses.dataclass
class _StagedGroup:
    """A save batch's files on their way to disk (see :meth:`FileItemSaver.save_many`)."""

    # (entry, temporary file, target), for the entries written to their temporary file.
    staged: list[tuple[int, Path, Path]] = dataclasses.field(default_factory=list)
    # Entries whose name the tree's shape forbids: saved as save does.
    alone: list[int] = dataclasses.field(default_factory=list)
    # A directory of each file system written to: one under the output may be another mount.
    devices: dict[int, str] = dataclasses.field(default_factory=dict)


def _device_of(temporary: Path, target: Path) -> int:
    """The device of ``temporary``'s directory; when it cannot be read the temporary file is
    dropped and the error is ``target``'s."""
    try:
        return os.stat(temporary.parent).st_dev
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise _file_error(target, exc) from exc


def _commit(
    group: _StagedGroup, real_output: str, results: list[Union[str, Exception, None]]
) -> None:
    """Make ``group``'s staged files durable, rename each into place and make the renames
    durable, one ``syncfs`` a file system each time. An entry whose target the tree's shape
    forbids joins ``group.alone``; when a flush fails, every staged entry not failed already
    gets that error and its temporary file is removed."""
    try:
        for directory in group.devices.values():  # the new contents are on disk before any
            _syncfs(directory)                    # file is replaced
        for index, temporary, target in group.staged:
            try:
                _rename_into_place(temporary, target)
                results[index] = str(target)
            except _ShapeConflict:
                group.alone.append(index)
            except SaveError as exc:
                results[index] = exc
        for directory in group.devices.values():  # and the renames before any item counts
            _syncfs(directory)                    # as saved
    except OSError as exc:
        error = SaveError(
            f"cannot make {len(group.staged)} files under {real_output!r} durable: "
            f"{exc.strerror or exc}"
        )
        error.__cause__ = exc
        for index, temporary, _ in group.staged:
            with contextlib.suppress(OSError):
                os.unlink(temporary)  # gone already if it was renamed
            if not isinstance(results[index], Exception):
                results[index] = error


_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL  # and close-on-exec, as every os.open


def _write_atomically(target: Path, body: bytes, real_output: str, fsync: bool) -> None:
    """Replace ``target`` with ``body`` so that readers see the old file or the new one, never a
    part; with ``fsync``, durably (the file and the rename reach the disk before we return).
    Raises _ShapeConflict when the tree's shape forbids ``target``, SaveError otherwise."""
    temporary = _write_temp(target, body, real_output, fsync)
    _rename_into_place(temporary, target)
    if fsync:
        try:
            fsync_directory(target.parent)
        except OSError as exc:
            raise _file_error(target, exc) from exc


def _check_inside(target: Path, real_output: str, real_parents: dict[Path, str]) -> None:
    """Refuse ``target`` if it resolves outside the output directory, through a symlink among
    its directories or as a symlink itself. ``real_parents`` keeps each directory resolved, for
    the other files of one save: resolving costs a system call per part of the path."""
    parent = target.parent
    real_parent = real_parents.get(parent)
    if real_parent is None:
        real_parent = real_parents[parent] = os.path.realpath(parent)
    real_target = os.path.join(real_parent, target.name)
    if os.path.islink(real_target):
        real_target = os.path.realpath(real_target)
    if not real_target.startswith(real_output.rstrip(os.sep) + os.sep):
        raise SaveError(
            f"refusing to write {str(target)!r}: it resolves to {real_target!r}, "
            f"outside the output directory {real_output!r}"
        )


def _write_temp(target: Path, body: bytes, real_output: str, fsync: bool,
                real_parents: Optional[dict[Path, str]] = None) -> Path:
    """Write ``body`` to a new temporary file beside ``target`` (fsynced with ``fsync``) and
    return its path. ``real_parents``: as _check_inside takes it, for a group of files. Raises
    _ShapeConflict or SaveError, as _write_atomically."""
    # Checked before mkdir, which would follow a symlink out of the output directory.
    _check_inside(target, real_output, {} if real_parents is None else real_parents)
    temporary = target.parent / (_TMP_PREFIX + secrets.token_hex(8))
    try:
        # Not mkstemp: its mode is 0o600, and saved files should get the umask's usual mode.
        # The directory usually exists: make it only when the open says it does not.
        try:
            descriptor = os.open(temporary, _TMP_FLAGS, 0o666)
        except FileNotFoundError:
            target.parent.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(temporary, _TMP_FLAGS, 0o666)
    except OSError as exc:
        raise _file_error(target, exc) from exc
    try:
        try:
            # Straight to the descriptor: a buffered file object costs four more system
            # calls per page (fstat, ioctl, two lseek), each a GIL hand-off under load.
            view = memoryview(body)
            while view:
                view = view[os.write(descriptor, view):]
            if fsync:
                os.fsync(descriptor)
        finally:
            os.close(descriptor)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(exc, OSError):
            raise _file_error(target, exc) from exc
        raise
    return temporary


def _rename_into_place(temporary: Path, target: Path) -> None:
    """Move a temporary file of _write_temp to ``target`` (dropping it if that fails)."""
    try:
        os.replace(temporary, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise _file_error(target, exc) from exc


def _file_error(target: Path, exc: OSError) -> Exception:
    reason = exc.strerror or str(exc)
    if exc.errno in _SHAPE_ERRNOS:
        return _ShapeConflict(f"{str(target)!r}: {reason}")
    return SaveError(f"cannot write {str(target)!r}: {reason}")


def _load_syncfs() -> Optional[Callable[[str], None]]:
    """Linux's syncfs(2) (one flush of everything a file system holds dirty), or None where the
    C library has none. Since Linux 5.8 it reports a writeback error of any file written
    since the directory was opened, as fsync does for one file."""
    try:
        library_syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    library_syncfs.argtypes = [ctypes.c_int]
    library_syncfs.restype = ctypes.c_int

    def syncfs(directory: str) -> None:
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            if library_syncfs(descriptor) != 0:  # ctypes lets go of the GIL for the call
                error_number = ctypes.get_errno()
                raise OSError(error_number, os.strerror(error_number))
        finally:
            os.close(descriptor)

    return syncfs


_syncfs = _load_syncfs()
