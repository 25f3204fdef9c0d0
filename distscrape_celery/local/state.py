"""The state directory of a crawl on an embedded Redis: where it is, and how it is held (locked,
private to its user, refused when it holds other files), so that the same command run again
resumes the crawl."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

from ..errors import ConfigError
from ..job.spec import JobSpec
from .embedded import PASSWORD_FILE
from .private import absolute_path, open_private_file, private_directory

STATE_SUFFIX = ".distscrape-state"
_STATE_MARKER = PASSWORD_FILE  # written by EmbeddedRedis into every state directory
_STATE_LOCK = "distscrape.lock"


def default_state_dir(spec: JobSpec, job: str) -> Path:
    """Beside the output: ``<output>.distscrape-state``; for an output that is a URL (the redis
    saver), ``<job>.distscrape-state`` in the current directory."""
    output = spec.saver.output
    if "://" in output:
        return Path.cwd() / f"{job}{STATE_SUFFIX}"
    resolved = Path(output).expanduser().resolve()
    return resolved.with_name(resolved.name + STATE_SUFFIX)


def state_dir_path(given: Optional[str], spec: JobSpec, job: str) -> Path:
    """The state directory's absolute path: ``given`` (``--state-dir``) or the default, with
    the symlinks of its parents resolved but not its own (a symlink there is refused, not
    followed: see :func:`state_directory`)."""
    return absolute_path(given if given else default_state_dir(spec, job))


@contextlib.contextmanager
def state_directory(path: Path, *, fresh: bool = False) -> Iterator[Path]:
    """Hold ``path`` as the crawl's state directory for the block: locked against a second
    crawl on it, and emptied first if ``fresh``. A directory that holds other files but no crawl
    state is refused, so neither Redis nor ``--fresh`` touches it. So is one that is not the
    user's own, private one (see :func:`~.private.private_directory`): a symlink, another
    user's, or open to group or others; one made here is made mode 0700."""
    import fcntl

    _refuse_other_files(path)  # first: no advice to chmod a directory that is not for a crawl
    path = private_directory(path)
    lock = open_private_file(path / _STATE_LOCK, os.O_RDWR)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"another distscrape crawl is using the state directory {path}") from None
        _refuse_other_files(path)
        contents = [entry for entry in path.iterdir() if entry.name != _STATE_LOCK]
        if fresh:
            for entry in contents:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        yield path
    finally:
        os.close(lock)


def _refuse_other_files(path: Path) -> None:
    """Raise :class:`ConfigError` if ``path`` is a directory of the user's (not a symlink) that
    holds files, but no crawl state. Anything else is left to :func:`private_directory`."""
    try:
        status = os.lstat(path)
        if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.geteuid():
            return
        contents = [entry for entry in path.iterdir() if entry.name != _STATE_LOCK]
    except OSError:
        return
    if contents and not os.path.lexists(path / _STATE_MARKER):
        raise ConfigError(f"{path} is not empty and holds no crawl state; give another --state-dir")
