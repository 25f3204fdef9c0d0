"""Owner-only directories and files for the one-machine crawl's state: nothing another local
user made or can reach is trusted, and no write follows a symlink.

The crawl's state directory holds its Redis's password, config, log, socket and data. Whoever
could write there first (a directory beside the output may be under /tmp) could hand the crawl's
Redis their password, or lead its writes through a symlink to a file of the user's. So a
directory is used only if it is a real directory of the user's with mode 0700, in parents no one
else can swap it in, and every file is created owner-only with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import Optional

from ..errors import ConfigError

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
# Never follow a symlink at the last component, never block on a FIFO left in a file's place.
_NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _user_name(uid: int) -> str:
    """``uid`` for a message: ``user 1000 (alice)``, or just the number if it has no name."""
    try:
        import pwd

        return f"user {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"user {uid}"


def absolute_path(path: str | os.PathLike) -> Path:
    """``path`` made absolute with its parent's symlinks resolved but not its own last
    component's, so that a symlink given (or found) in its place is seen, not followed."""
    plain = Path(os.path.abspath(Path(path).expanduser()))
    if plain.parent == plain:  # the root
        return plain
    return plain.parent.resolve() / plain.name


def check_parents(path: Path) -> None:
    """Raise :class:`ConfigError` unless no other user can swap ``path`` for a directory of
    theirs: each existing parent belongs to the user or root, and is writable only by its owner
    or sticky (as /tmp is, where no one may rename another's entry)."""
    my_uid = os.geteuid()
    for parent in path.parents:
        try:
            status = os.lstat(parent)
        except FileNotFoundError:
            continue  # yet to be made, by us
        if status.st_uid not in (my_uid, 0):
            raise ConfigError(
                f"the state directory {path} lies in {parent}, which belongs to "
                f"{_user_name(status.st_uid)}, who could swap it for theirs: choose a --state-dir "
                "in a directory of yours"
            )
        if status.st_mode & 0o022 and not status.st_mode & stat.S_ISVTX:
            raise ConfigError(
                f"the state directory {path} lies in {parent}, which other users can write to "
                f"(mode {stat.S_IMODE(status.st_mode):04o}, not sticky), so they could swap it for "
                "theirs: choose a --state-dir in a directory only you can write to"
            )


def check_private_directory(path: Path) -> None:
    """Raise :class:`ConfigError`, saying what is wrong and the way out, unless ``path`` (not
    followed if a symlink) is a directory of the user's that no one else can enter (no group or
    other bits: mode 0700)."""
    try:
        status = os.lstat(path)
    except OSError as exc:
        raise ConfigError(f"cannot use the state directory {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(status.st_mode):
        raise ConfigError(
            f"the state directory {path} is a symbolic link, which is not followed (whoever made "
            "it chooses where the crawl's Redis keeps its password and data): give the real "
            "directory as --state-dir, or remove the link"
        )
    if not stat.S_ISDIR(status.st_mode):
        raise ConfigError(f"the state directory {path} is not a directory: give another --state-dir")
    if status.st_uid != os.geteuid():
        raise ConfigError(
            f"the state directory {path} belongs to {_user_name(status.st_uid)}, not to you "
            f"({_user_name(os.geteuid())}): it may hold their Redis password or data; "
            "give another --state-dir"
        )
    mode = stat.S_IMODE(status.st_mode)
    if mode & 0o077:
        raise ConfigError(
            f"the state directory {path} has mode {mode:04o}, so other users can reach into it "
            f"and its Redis password: if only you ever wrote in it, chmod 700 {path}; "
            "otherwise remove it or give another --state-dir"
        )


def private_directory(path: Path) -> Path:
    """``path`` as a private directory: created with mode 0700 (whatever the umask) if it does
    not exist, its missing parents as the umask makes them; refused by :class:`ConfigError` if
    it, or a parent it lies in, fails :func:`check_private_directory` or :func:`check_parents`."""
    path = absolute_path(path)
    check_parents(path)  # before making anything in them
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot use the state directory {path}: {exc.strerror or exc}") from None
    check_parents(path)
    try:
        os.mkdir(path, PRIVATE_DIR_MODE)
    except FileExistsError:
        pass  # checked below, as found
    except OSError as exc:
        raise ConfigError(f"cannot use the state directory {path}: {exc.strerror or exc}") from None
    else:
        # The umask may have taken bits from the mode; none are added. The parents are checked,
        # so no one else can have put anything in its place since.
        os.chmod(path, PRIVATE_DIR_MODE, follow_symlinks=False)
    check_private_directory(path)
    return path


def _refuse_unless_owner_only(path: Path, status: os.stat_result, fix: str) -> None:
    """Raise :class:`ConfigError` unless ``status`` is a regular file of the user's that no one
    else may read or write; ``fix`` is the way out, for the message."""
    if not stat.S_ISREG(status.st_mode):
        raise ConfigError(f"{path} is not a regular file: {fix}")
    if status.st_uid != os.geteuid():
        raise ConfigError(f"{path} belongs to {_user_name(status.st_uid)}, not to you: {fix}")
    mode = stat.S_IMODE(status.st_mode)
    if mode & 0o077:
        raise ConfigError(f"{path} has mode {mode:04o}, so others may read or change it: {fix}")


def read_private_file(path: Path, fix: str) -> Optional[str]:
    """The text of ``path``, or None if there is none; :class:`ConfigError` (with ``fix``, the
    way out) if it is a symlink, not a regular file, another user's, or open to group or
    others. Opened without following a symlink, so what is checked is what is read."""
    try:
        descriptor = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os.path.islink(path):
            raise ConfigError(f"{path} is a symbolic link, which is not followed: {fix}") from None
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    with os.fdopen(descriptor, "r") as opened:
        _refuse_unless_owner_only(path, os.fstat(descriptor), fix)
        return opened.read()


def write_private_file(path: Path, text: str) -> None:
    """Replace ``path`` with a file of mode 0600 holding ``text``: written under a new name
    (``O_EXCL``, ``O_NOFOLLOW``) then renamed over it, so a symlink found at ``path`` is
    replaced, never written through, and a reader never sees half of it."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        descriptor = os.open(
            temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, PRIVATE_FILE_MODE
        )
        try:
            with os.fdopen(descriptor, "w") as opened:
                opened.write(text)
                opened.flush()
                os.fsync(opened.fileno())
            os.replace(temp, path)
        except BaseException:
            _unlink_if_there(temp)
            raise
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None


def open_private_file(path: Path, flags: int) -> int:
    """A descriptor of ``path`` opened with ``flags`` (besides ``O_CREAT``), made a regular file
    of the user's with mode 0600: created so if missing, tightened if ours but looser, and a
    symlink found in its place replaced (what it points at is not touched). Refused by
    :class:`ConfigError` if it is anything else (another user's file, a directory)."""
    flags |= os.O_CREAT | _NOFOLLOW
    try:
        try:
            descriptor = os.open(path, flags, PRIVATE_FILE_MODE)
        except OSError:
            if not os.path.islink(path):
                raise
            os.unlink(path)
            descriptor = os.open(path, flags | os.O_EXCL, PRIVATE_FILE_MODE)
    except OSError as exc:
        raise ConfigError(f"cannot use {path}: {exc.strerror or exc}") from None
    try:
        status = os.fstat(descriptor)
        if status.st_uid == os.geteuid() and stat.S_ISREG(status.st_mode):
            os.fchmod(descriptor, PRIVATE_FILE_MODE)
            status = os.fstat(descriptor)
        _refuse_unless_owner_only(path, status, "remove it, or give another --state-dir")
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def _unlink_if_there(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
