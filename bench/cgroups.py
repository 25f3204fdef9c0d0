"""CPU cgroups capped at a share of a core, each a simulated host: the cgroup part of the
scale-out on simulated hosts (``python -m bench.sim_hosts``). Needs root and a cgroup hierarchy
with the cpu controller: cgroup v1's ``cpu`` (``cpu.cfs_quota_us``) or cgroup v2's
(``cpu.max``).

A library: it imports nothing of the benchmarks or the crawler, and importing it changes
nothing (no Celery app, no environment, no ``sys.path``). The suite and the tests import it.
"""

from __future__ import annotations

import errno
import math
import os
import sys
import time
from pathlib import Path
from typing import Callable, Optional

PERIOD_US = 100_000  # the scheduler's period for a cgroup's quota, as the kernel's default
MIN_QUOTA_US = 1_000  # the kernel refuses a quota under 1 ms
BUSY_STEP = 0.05  # seconds between tries to remove a cgroup that is still busy
NEEDS = ("root and a cgroup hierarchy with the cpu controller: cgroup v1's cpu controller "
         "mounted (e.g. /sys/fs/cgroup/cpu) or cgroup v2 with cpu in cgroup.controllers")


class CgroupError(RuntimeError):
    """The cgroups could not be made, filled or removed; the message says what is needed."""


def quota_us(share: float, period_us: int = PERIOD_US) -> int:
    """The CPU time in microseconds a cgroup may use each ``period_us`` to get ``share`` of a
    core (more than 1: more than one core)."""
    if not (isinstance(share, (int, float)) and math.isfinite(share) and share > 0):
        raise ValueError(f"a share of a core must be a number above 0, not {share!r}")
    quota = round(share * period_us)
    if quota < MIN_QUOTA_US:
        raise ValueError(f"{share} of a core is {quota} us in {period_us} us: under the "
                         f"kernel's least quota of {MIN_QUOTA_US} us")
    return quota


def find_cpu_root(mounts: str) -> tuple[Path, int]:
    """Where the cpu controller is mounted and the cgroup version, from the text of
    ``/proc/self/mounts``: a v1 hierarchy holding ``cpu`` first (on a hybrid system the
    controller is bound there, not to the unified hierarchy), else the first cgroup2 mount."""
    unified: Optional[Path] = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        where, fstype, options = fields[1], fields[2], fields[3].split(",")
        where = where.replace("\\040", " ")  # the mounts file escapes spaces
        if fstype == "cgroup" and "cpu" in options:
            return Path(where), 1
        if fstype == "cgroup2" and unified is None:
            unified = Path(where)
    if unified is not None:
        return unified, 2
    raise CgroupError(f"no cgroup hierarchy is mounted with the cpu controller; needs {NEEDS}")


class CgroupFiles:
    """How HostCgroups reads and changes the cgroup filesystem: plain file operations, the
    kernel doing the rest (a write to ``cgroup.procs`` moves a process; ``rmdir`` fails with
    EBUSY while the cgroup holds one). The tests give a fake kernel over a temp directory."""

    def read(self, path: Path) -> str:
        return path.read_text()

    def write(self, path: Path, text: str) -> None:
        with open(path, "w") as fh:  # one write() call: the kernel takes one value a write
            fh.write(text)

    def mkdir(self, path: Path) -> None:
        os.mkdir(path)

    def rmdir(self, path: Path) -> None:
        os.rmdir(path)


class HostCgroups:
    """CPU cgroups capped at ``share`` of a core each, one a simulated host, made directly under
    the cpu controller's root (``root``; found in ``/proc/self/mounts`` if not given).

    As a context manager it removes every cgroup it made when the block ends, however it ends:
    the processes still in one are moved out to the root first (as for any process the benchmark
    did not put anywhere). On cgroup v2 it enables the cpu controller for the root's children if
    it is not, and leaves it enabled.

    A process joins a cgroup by writing its PID to the cgroup's ``cgroup.procs``; its children
    inherit the cgroup. ``enter_command`` prefixes a command so that it joins before it starts
    (``celery multi start``: the worker it detaches is its child), the bench and Redis staying
    where they are."""

    def __init__(self, share: float, *, root: Optional[Path] = None, version: Optional[int] = None,
                 files: Optional[CgroupFiles] = None, prefix: str = "distscrape-host",
                 sleep: Callable[[float], None] = time.sleep, mounts: str = "/proc/self/mounts",
                 busy_wait: float = 5.0) -> None:
        self.quota = quota_us(share)
        self.share = share
        if root is None:
            with open(mounts) as fh:
                root, version = find_cpu_root(fh.read())
        elif version is None:
            version = 2 if (Path(root) / "cgroup.controllers").exists() else 1
        if version not in (1, 2):
            raise ValueError(f"cgroup version 1 or 2, not {version!r}")
        self.root, self.version = Path(root), version
        self.files = files or CgroupFiles()
        self.prefix = f"{prefix}-{os.getpid()}"
        self.sleep, self.busy_wait = sleep, busy_wait
        self.made: list[Path] = []

    # -------------------------------------------------------------------------- set-up

    def check(self) -> None:
        """Raise CgroupError, saying what is needed, if cgroups cannot be capped here."""
        if not self.root.is_dir():
            raise CgroupError(f"{self.root} is not a cgroup hierarchy; needs {NEEDS}")
        if self.version == 1:
            if not (self.root / "cpu.cfs_quota_us").exists():
                raise CgroupError(f"{self.root} has no cpu.cfs_quota_us (the cpu controller "
                                  f"is not on this hierarchy, or has no CFS bandwidth control); "
                                  f"needs {NEEDS}")
            return
        controllers = self._read(self.root / "cgroup.controllers").split()
        if "cpu" not in controllers:
            raise CgroupError(f"the cgroup v2 hierarchy at {self.root} does not offer the cpu "
                              f"controller (cgroup.controllers: {' '.join(controllers) or 'none'};"
                              f" on a hybrid system it may be bound to a v1 hierarchy); "
                              f"needs {NEEDS}")
        subtree = self.root / "cgroup.subtree_control"
        if "cpu" not in self._read(subtree).split():
            try:
                self.files.write(subtree, "+cpu")
            except OSError as exc:
                raise CgroupError(f"could not enable the cpu controller in {subtree} ({exc}); "
                                  f"needs {NEEDS}") from exc

    def __enter__(self) -> "HostCgroups":
        self.check()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except CgroupError as error:
            if exc_type is None:
                raise
            # The block's own exception goes on; this one must not hide it.
            print(f"cgroups: {error}", file=sys.stderr)

    def make(self, name: str) -> Path:
        """A new cgroup capped at the share, named after this process and ``name``."""
        path = self.root / f"{self.prefix}-{name}"
        try:
            self.files.mkdir(path)
        except PermissionError as exc:
            raise CgroupError(f"may not make {path} ({exc}); needs {NEEDS}") from exc
        except FileExistsError as exc:
            raise CgroupError(f"{path} exists already") from exc
        self.made.append(path)
        try:
            if self.version == 1:
                # The period first: the quota is a part of it.
                self.files.write(path / "cpu.cfs_period_us", str(PERIOD_US))
                self.files.write(path / "cpu.cfs_quota_us", str(self.quota))
            else:
                self.files.write(path / "cpu.max", f"{self.quota} {PERIOD_US}")
        except OSError as exc:
            raise CgroupError(f"could not cap {path} at {self.share} of a core ({exc}); "
                              f"needs {NEEDS}") from exc
        return path

    def enter_command(self, group: Path) -> list[str]:
        """A prefix for a command: a shell that moves itself into ``group`` and then becomes
        the command (``exec``), so the command and all it starts run in the cgroup from their
        first instruction."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs")]

    def add(self, group: Path, pid: int) -> None:
        """Move process ``pid`` (all its threads) into ``group``; its later children follow."""
        self.files.write(group / "cgroup.procs", str(pid))

    def pids(self, group: Path) -> list[int]:
        return [int(x) for x in self._read(group / "cgroup.procs").split()]

    def throttling(self, group: Path) -> tuple[int, int]:
        """(periods the group ran in, periods it was throttled in: its quota ran out)."""
        stat = dict(line.split()[:2] for line in self._read(group / "cpu.stat").splitlines()
                    if len(line.split()) >= 2)
        return int(stat.get("nr_periods", 0)), int(stat.get("nr_throttled", 0))

    # ------------------------------------------------------------------------- clean-up

    def close(self) -> None:
        """Remove every cgroup made, the last first, moving out the processes still in it; raise
        CgroupError naming those that could not be removed, after trying them all."""
        left = []
        while self.made:
            path = self.made.pop()
            try:
                self._remove(path)
            except OSError as exc:
                left.append(f"{path} ({exc})")
        if left:
            raise CgroupError("could not remove " + ", ".join(left))

    def _remove(self, path: Path) -> None:
        waits = round(self.busy_wait / BUSY_STEP)
        while True:
            for pid in self._pids_or_none(path):
                try:
                    self.files.write(self.root / "cgroup.procs", str(pid))
                except ProcessLookupError:
                    pass  # it exited meanwhile
            try:
                self.files.rmdir(path)
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                # EBUSY: a process in it has not quite left (an exiting one is not in
                # cgroup.procs but keeps the cgroup until it is gone).
                if exc.errno != errno.EBUSY or waits <= 0:
                    raise
            self.sleep(BUSY_STEP)
            waits -= 1

    def _pids_or_none(self, path: Path) -> list[int]:
        try:
            return self.pids(path)
        except FileNotFoundError:
            return []

    def _read(self, path: Path) -> str:
        try:
            return self.files.read(path)
        except FileNotFoundError as exc:
            raise CgroupError(f"{path} is missing; needs {NEEDS}") from exc
