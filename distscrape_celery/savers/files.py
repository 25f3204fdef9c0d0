"""FileItemSaver: one file per item, under a name built from the item by a name scheme."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import re
import secrets
import string
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional, Union
from urllib.parse import urlsplit

from ..errors import ConfigError, SaveError
from ..web.fetch import Download
from ..job.saver_spec import SaverSpec
from .base import ItemSaver, fsync_directory


NAME_FIELDS = ("host", "port", "path", "query", "qhash", "sha1", "shard", "job")
DEFAULT_NAME_SCHEME = "{host}/{path}"
CONFLICTS_DIR = "_conflicts"

_ALLOWED_FIELDS = " ".join("{" + name + "}" for name in NAME_FIELDS)
# A "%XX" escape, or one character that may not appear as is in a file name.
_ESCAPE_OR_UNSAFE = re.compile(r"%([0-9A-Fa-f]{2})|[^A-Za-z0-9._~!$&'()+,;=@-]")
# Bytes a URL cannot carry raw (controls, space, non-ASCII, "<>\"\\^`{|}"): "%XX" and the raw
# character fetch the same resource, so both get the same name. Any other escape ("%2F", "%3F",
# "%26", "%2E", ...) means something else than its raw character, so its "%" is escaped in turn.
_RAW_ILLEGAL = frozenset(range(0x21)) | frozenset(range(0x7F, 0x100)) | frozenset(b'"<>\\^`{|}')
# urlsplit silently drops these; an item holding them is named as a non-URL, whole, so that it
# cannot share a name with the URL it would be mangled into.
_MANGLED_BY_URLSPLIT = re.compile(r"[\t\r\n]|^[\x00-\x20]")
# The tokens below never come out of _escape for a path segment ("." and "~" stay raw, raw "/"
# never occurs inside one), so names built with them cannot equal any other item's name.
_EMPTY_SEGMENT = "%2F"
_DOT = "%2E"
_CUT_MARK = "%7E"
_MAX_SEGMENT_BYTES = 200  # names are ASCII once escaped, so characters are bytes
_CUT_KEEP = 150
# No name ever holds "#" (_escape encodes it), so no item can land on a temporary file.
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
        self._parts = _parse_scheme(name_scheme)
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
        fields = _field_values(item, query_in_path=self._query_in_path)
        fields["job"] = _escape(self.job)
        rendered = "".join(
            literal + (fields[field] if field else "") for literal, field in self._parts
        )
        # Empty segments here come from the scheme (an empty {port}, say), not from the item.
        return Path(*(_finish_segment(segment) for segment in rendered.split("/") if segment))

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
            target = self.output / CONFLICTS_DIR / _sha1(item)
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
        out: list[Union[str, Exception, None]] = [None] * len(entries)
        try:
            real_output = self._opened_output()
        except SaveError as exc:
            return [exc] * len(entries)
        staged: list[tuple[int, Path, Path]] = []  # (entry, temporary file, target)
        alone: list[int] = []  # entries whose name the tree's shape forbids: saved as save does
        # A directory of each file system written to: one under the output may be another mount.
        devices: dict[int, str] = {}
        device_of: dict[Path, int] = {}
        for i, (item, download) in enumerate(entries):
            try:
                target = self.output / self.name_for(item)
                tmp = _write_temp(target, download.body, real_output, False)
                if tmp.parent not in device_of:
                    try:
                        device_of[tmp.parent] = os.stat(tmp.parent).st_dev
                    except OSError as exc:
                        with contextlib.suppress(OSError):
                            os.unlink(tmp)
                        raise _file_error(target, exc) from exc
                    devices.setdefault(device_of[tmp.parent], str(tmp.parent))
                staged.append((i, tmp, target))
            except _ShapeConflict:
                alone.append(i)
            except Exception as exc:
                out[i] = exc
        if staged:
            try:
                for directory in devices.values():  # the new contents are on disk before any
                    _syncfs(directory)              # file is replaced
                for i, tmp, target in staged:
                    try:
                        _rename_into_place(tmp, target)
                        out[i] = str(target)
                    except _ShapeConflict:
                        alone.append(i)
                    except SaveError as exc:
                        out[i] = exc
                for directory in devices.values():  # and the renames before any item counts
                    _syncfs(directory)              # as saved
            except OSError as exc:
                error = SaveError(
                    f"cannot make {len(staged)} files under {real_output!r} durable: "
                    f"{exc.strerror or exc}"
                )
                error.__cause__ = exc
                for i, tmp, _ in staged:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)  # gone already if it was renamed
                    if not isinstance(out[i], Exception):
                        out[i] = error
        for i in alone:
            try:
                out[i] = FileItemSaver.save(self, *entries[i])
            except Exception as exc:
                out[i] = exc
        return out  # type: ignore[return-value]

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


def _parse_scheme(scheme: str) -> list[tuple[str, Optional[str]]]:
    """Split ``scheme`` into (escaped literal text, field name or None) pairs, or raise
    :class:`ConfigError` naming what is wrong."""

    def invalid(reason: str) -> ConfigError:
        return ConfigError(
            f"invalid saver name_scheme {scheme!r}: {reason}; allowed fields: {_ALLOWED_FIELDS}"
        )

    try:
        parsed = list(string.Formatter().parse(scheme))
    except ValueError as exc:
        raise invalid(f"malformed format string ({exc})") from None
    parts: list[tuple[str, Optional[str]]] = []
    for literal, field, format_spec, conversion in parsed:
        if field is not None:
            if field == "" or field.isdigit():
                raise invalid(f"positional field {{{field}}} is not allowed")
            if field not in NAME_FIELDS:
                raise invalid(f"unknown field {{{field}}}")
            if format_spec or conversion:
                raise invalid(f"field {{{field}}} takes no conversion or format spec")
        parts.append(("/".join(_escape(piece) for piece in literal.split("/")), field))
    if not {"path", "sha1"} & {field for _, field in parts}:
        raise invalid("it must use {path} or {sha1}, or different items would share one file")
    return parts


def _field_values(item: str, *, query_in_path: bool) -> dict[str, str]:
    """The escaped value of every name field for ``item``; {path} is "/"-separated segments."""
    host, port, path, query = _split_item(item)
    sha1 = _sha1(item)
    if host == "_":
        # Not a URL (an ID, say): the whole item is one name, "/" and all escaped.
        segments = [path]
    else:
        segments = path.split("/")
        if not segments[-1]:
            segments[-1] = "index.html"
        elif "." not in segments[-1]:
            # "/a" becomes a/index.html so that it can coexist with "/a/b".
            segments.append("index.html")
    if query and query_in_path:
        segments[-1] += "?" + query
    return {
        # The port is part of the host's name so that two servers on one host never share files;
        # ":" is escaped, and no host name contains it.
        "host": _escape(f"{host}:{port}" if port else host),
        "port": port,
        "path": "/".join(_escape(segment) if segment else _EMPTY_SEGMENT for segment in segments),
        "query": _escape(query),
        "qhash": _sha1(query)[:16] if query else "",
        "sha1": sha1,
        "shard": f"{sha1[:2]}/{sha1[2:4]}",
    }


def _split_item(item: str) -> tuple[str, str, str, str]:
    """(host, port, path relative to the root, query) of ``item``; ("_", "", item, "") for an
    item that is not an absolute URL."""
    if not _MANGLED_BY_URLSPLIT.search(item):
        try:
            parts = urlsplit(item)
            port = parts.port
        except ValueError:  # a bad port or IPv6 literal: not a URL we can take apart
            pass
        else:
            if parts.scheme and parts.hostname:
                port_text = "" if port is None else str(port)
                return parts.hostname.lower(), port_text, parts.path[1:], parts.query
    return "_", "", item, ""


def _escape(text: str) -> str:
    """``text`` as part of one name segment: only [A-Za-z0-9._~!$&'()+,;=@-] and "%XX" escapes,
    so no "/" or control character; distinct texts stay distinct except as _RAW_ILLEGAL allows."""

    def replace(match: re.Match[str]) -> str:
        hex_digits = match.group(1)
        if hex_digits is None:
            raw = match.group().encode("utf-8", "surrogatepass")
            return "".join(f"%{byte:02X}" for byte in raw)
        if int(hex_digits, 16) in _RAW_ILLEGAL:
            return "%" + hex_digits.upper()
        return "%25" + hex_digits

    return _ESCAPE_OR_UNSAFE.sub(replace, text)


def _finish_segment(segment: str) -> str:
    """Make one escaped segment safe to join: never "." or "..", never starting with ".", at
    most 200 bytes."""
    if segment in (".", ".."):
        return _DOT * len(segment)
    if segment.startswith("."):
        # Dot names are what programs of the output's owner read on their own (.bashrc,
        # .ssh/authorized_keys, .local/lib/.../site-packages): no item may choose one.
        segment = _DOT + segment[1:]
    if len(segment) > _MAX_SEGMENT_BYTES:
        return segment[:_CUT_KEEP] + _CUT_MARK + _sha1(segment)[:16]
    return segment


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()


_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL  # and close-on-exec, as every os.open


def _write_atomically(target: Path, body: bytes, real_output: str, fsync: bool) -> None:
    """Replace ``target`` with ``body`` so that readers see the old file or the new one, never a
    part; with ``fsync``, durably (the file and the rename reach the disk before we return).
    Raises _ShapeConflict when the tree's shape forbids ``target``, SaveError otherwise."""
    tmp = _write_temp(target, body, real_output, fsync)
    _rename_into_place(tmp, target)
    if fsync:
        try:
            fsync_directory(target.parent)
        except OSError as exc:
            raise _file_error(target, exc) from exc


def _write_temp(target: Path, body: bytes, real_output: str, fsync: bool) -> Path:
    """Write ``body`` to a new temporary file beside ``target`` (fsynced with ``fsync``) and
    return its path. Raises _ShapeConflict or SaveError, as _write_atomically."""
    # Checked before mkdir, which would follow a symlink out of the output directory.
    real_target = os.path.realpath(target)
    if os.path.commonpath([real_output, real_target]) != real_output:
        raise SaveError(
            f"refusing to write {str(target)!r}: it resolves to {real_target!r}, "
            f"outside the output directory {real_output!r}"
        )
    tmp = target.parent / (_TMP_PREFIX + secrets.token_hex(8))
    try:
        # Not mkstemp: its mode is 0o600, and saved files should get the umask's usual mode.
        # The directory usually exists: make it only when the open says it does not.
        try:
            fd = os.open(tmp, _TMP_FLAGS, 0o666)
        except FileNotFoundError:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, _TMP_FLAGS, 0o666)
    except OSError as exc:
        raise _file_error(target, exc) from exc
    try:
        try:
            # Straight to the descriptor: a buffered file object costs four more system
            # calls per page (fstat, ioctl, two lseek), each a GIL hand-off under load.
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _file_error(target, exc) from exc
        raise
    return tmp


def _rename_into_place(tmp: Path, target: Path) -> None:
    """Move a temporary file of _write_temp to ``target`` (dropping it if that fails)."""
    try:
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
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
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int

    def syncfs(directory: str) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            if fn(fd) != 0:  # ctypes lets go of the GIL for the call
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
        finally:
            os.close(fd)

    return syncfs


_syncfs = _load_syncfs()
