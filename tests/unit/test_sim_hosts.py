"""bench/cgroups.py, the simulated hosts' cgroups, against a fake kernel over a temp directory:
the quota arithmetic, where the cgroups go, what is written, the clean-up however the block ends,
and the errors that say what is needed. Nothing here touches the machine's cgroups."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cgroups import (PERIOD_US, CgroupError, CgroupFiles, HostCgroups, find_cpu_root,
                           quota_us)

V1_FILES = {"cgroup.procs": "", "tasks": "", "cpu.cfs_period_us": "100000\n",
            "cpu.cfs_quota_us": "-1\n", "cpu.stat": "nr_periods 0\nnr_throttled 0\n"}
V2_FILES = {"cgroup.procs": "", "cpu.max": "max 100000\n",
            "cpu.stat": "usage_usec 0\nnr_periods 0\nnr_throttled 0\n"}


class FakeKernel(CgroupFiles):
    """The kernel's part of a cgroup hierarchy over a plain directory: a new cgroup comes with
    its control files; a PID written to a cgroup.procs leaves every other one (ESRCH for a PID
    not in ``alive``); rmdir fails with EBUSY while cgroup.procs lists a live PID (and
    ``busy_rmdirs`` more times: an exiting process that keeps it). ``deny`` refuses every
    mkdir, as for a user who is not root."""

    def __init__(self, root: Path, version: int = 1, alive=(), deny=False, busy_rmdirs=0):
        self.root, self.version, self.alive, self.deny = root, version, set(alive), deny
        self.busy_rmdirs = busy_rmdirs
        self.writes: list[tuple[str, str]] = []
        for name, text in (V1_FILES if version == 1 else V2_FILES).items():
            (root / name).write_text(text)
        if version == 2:
            (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
            (root / "cgroup.subtree_control").write_text("")

    def mkdir(self, path: Path) -> None:
        if self.deny:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        super().mkdir(path)
        for name, text in (V1_FILES if self.version == 1 else V2_FILES).items():
            (path / name).write_text(text)

    def write(self, path: Path, text: str) -> None:
        self.writes.append((str(path.relative_to(self.root)), text))
        if path.name == "cgroup.procs":
            pid = int(text)
            if pid not in self.alive:
                raise ProcessLookupError(errno.ESRCH, "No such process")
            for procs in self.root.rglob("cgroup.procs"):
                kept = [p for p in procs.read_text().split() if int(p) != pid]
                procs.write_text("".join(f"{p}\n" for p in kept))
            path.write_text(path.read_text() + f"{pid}\n")
        elif path.name == "cgroup.subtree_control":
            path.write_text(path.read_text() + text.lstrip("+") + "\n")
        else:
            super().write(path, text)

    def rmdir(self, path: Path) -> None:
        if any(int(pid) in self.alive for pid in (path / "cgroup.procs").read_text().split()):
            raise OSError(errno.EBUSY, "Device or resource busy", str(path))
        if self.busy_rmdirs:
            self.busy_rmdirs -= 1
            raise OSError(errno.EBUSY, "Device or resource busy", str(path))
        shutil.rmtree(path)


def cgroups(root: Path, kernel: FakeKernel, share: float = 0.3, **kw) -> HostCgroups:
    return HostCgroups(share, root=root, version=kernel.version, files=kernel, prefix="t",
                       sleep=kw.pop("sleep", lambda s: None), **kw)


def children(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir())


# ----------------------------------------------------------------------------- arithmetic


def test_quota_is_the_share_of_each_period():
    assert quota_us(0.3) == 30_000
    assert quota_us(1.5) == 150_000  # more than a core: more than one CPU's time a period
    assert quota_us(0.25, period_us=10_000) == 2_500
    assert quota_us(0.01) == 1_000  # the least the kernel takes
    assert quota_us(1 / 3) == 33_333


@pytest.mark.parametrize("share", [0, -0.3, float("nan"), float("inf"), 0.009, "0.3"])
def test_shares_the_kernel_cannot_take_are_refused(share):
    with pytest.raises(ValueError):
        quota_us(share)


# ------------------------------------------------------------------------------- finding


HYBRID = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
"""


def test_the_v1_cpu_hierarchy_is_found_before_a_v2_one():
    """On a hybrid system the cpu controller is bound to v1; the v2 mount has none."""
    assert find_cpu_root(HYBRID) == (Path("/sys/fs/cgroup/cpu"), 1)
    joint = "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\n"
    assert find_cpu_root(joint) == (Path("/sys/fs/cgroup/cpu,cpuacct"), 1)


def test_a_v2_only_system_uses_its_cgroup2_mount():
    mounts = "proc /proc proc rw 0 0\ncgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n"
    assert find_cpu_root(mounts) == (Path("/sys/fs/cgroup"), 2)


def test_no_cpu_controller_mounted_says_what_is_needed():
    mounts = ("proc /proc proc rw 0 0\n"
              "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n")  # a v1 hierarchy, no cpu
    with pytest.raises(CgroupError, match="cpu controller.*root"):
        find_cpu_root(mounts)


# ---------------------------------------------------------------------------------- v1


def test_v1_cgroups_are_made_under_the_root_and_capped(tmp_path):
    kernel = FakeKernel(tmp_path)
    with cgroups(tmp_path, kernel) as hosts:
        a, b = hosts.make("1-0"), hosts.make("1-1")
        assert a == tmp_path / f"t-{os.getpid()}-1-0" and b.parent == tmp_path
        assert (a / "cpu.cfs_period_us").read_text() == str(PERIOD_US)
        assert (a / "cpu.cfs_quota_us").read_text() == "30000"
        # The period before the quota: the kernel checks a quota against its period.
        assert [w for w in kernel.writes if w[0].startswith(a.name)] == [
            (f"{a.name}/cpu.cfs_period_us", "100000"), (f"{a.name}/cpu.cfs_quota_us", "30000")]
        assert hosts.enter_command(a)[-1] == str(a / "cgroup.procs")
    assert children(tmp_path) == []


def test_a_process_put_in_a_cgroup_is_moved_out_before_the_cgroup_is_removed(tmp_path):
    kernel = FakeKernel(tmp_path, alive={4242, 4343})
    (tmp_path / "cgroup.procs").write_text("1\n")
    with cgroups(tmp_path, kernel) as hosts:
        group = hosts.make("w")
        hosts.add(group, 4242)
        hosts.add(group, 4343)
        assert hosts.pids(group) == [4242, 4343]
        kernel.alive.discard(4343)  # exits, but cgroup.procs still names it (a race)
    assert children(tmp_path) == []
    assert (tmp_path / "cgroup.procs").read_text().split() == ["1", "4242"]


def test_every_cgroup_is_removed_when_the_block_raises(tmp_path):
    kernel = FakeKernel(tmp_path, alive={7})
    with pytest.raises(KeyboardInterrupt):
        with cgroups(tmp_path, kernel) as hosts:
            hosts.make("a")
            hosts.add(hosts.make("b"), 7)
            raise KeyboardInterrupt
    assert children(tmp_path) == []


def test_a_cgroup_that_cannot_be_capped_is_removed_too(tmp_path):
    """make() fails after its mkdir (a quota the kernel refuses): the empty cgroup goes."""

    class Refusing(FakeKernel):
        def write(self, path, text):
            if path.name == "cpu.cfs_quota_us":
                raise OSError(errno.EINVAL, "Invalid argument", str(path))
            super().write(path, text)

    with pytest.raises(CgroupError, match="could not cap .* at 0.3 of a core"):
        with cgroups(tmp_path, Refusing(tmp_path)) as hosts:
            hosts.make("a")
    assert children(tmp_path) == []


def test_a_busy_rmdir_is_retried_with_the_injected_sleep(tmp_path):
    slept = []
    kernel = FakeKernel(tmp_path, busy_rmdirs=3)
    with cgroups(tmp_path, kernel, sleep=slept.append) as hosts:
        hosts.make("a")
    assert children(tmp_path) == [] and len(slept) == 3


def test_a_cgroup_that_stays_busy_is_named_and_the_others_still_go(tmp_path):
    slept = []
    kernel = FakeKernel(tmp_path, busy_rmdirs=10_000)
    hosts = cgroups(tmp_path, kernel, sleep=slept.append, busy_wait=0.5)
    with pytest.raises(CgroupError, match=r"could not remove .*t-\d+-a .*busy"):
        with hosts:
            hosts.make("a")
    assert len(slept) == 10  # 0.5 s of 0.05 s waits, none of them real
    assert hosts.made == []


def test_a_clean_up_failure_does_not_hide_the_blocks_own_error(tmp_path, capsys):
    kernel = FakeKernel(tmp_path, busy_rmdirs=10_000)
    with pytest.raises(RuntimeError, match="the crawl failed"):
        with cgroups(tmp_path, kernel, busy_wait=0) as hosts:
            hosts.make("a")
            raise RuntimeError("the crawl failed")
    assert "could not remove" in capsys.readouterr().err


def test_without_root_the_error_says_what_is_needed(tmp_path):
    with pytest.raises(CgroupError, match=r"may not make .*Permission denied.*needs root"):
        with cgroups(tmp_path, FakeKernel(tmp_path, deny=True)) as hosts:
            hosts.make("a")
    assert children(tmp_path) == []


def test_a_v1_hierarchy_without_the_cpu_controller_is_refused(tmp_path):
    (tmp_path / "cgroup.procs").write_text("")  # a hierarchy, but no cpu.cfs_quota_us
    with pytest.raises(CgroupError, match="no cpu.cfs_quota_us.*cpu controller"):
        with HostCgroups(0.3, root=tmp_path, version=1):
            pass
    with pytest.raises(CgroupError, match="not a cgroup hierarchy"):
        HostCgroups(0.3, root=tmp_path / "absent", version=1).check()


def test_throttling_is_read_from_cpu_stat(tmp_path):
    with cgroups(tmp_path, FakeKernel(tmp_path)) as hosts:
        group = hosts.make("a")
        (group / "cpu.stat").write_text("nr_periods 200\nnr_throttled 150\n"
                                        "throttled_time 99\n")
        assert hosts.throttling(group) == (200, 150)


# ---------------------------------------------------------------------------------- v2


def test_v2_cgroups_get_cpu_max_and_the_controller_enabled(tmp_path):
    kernel = FakeKernel(tmp_path, version=2)
    hosts = HostCgroups(0.3, root=tmp_path, files=kernel, prefix="t")  # version from the files
    assert hosts.version == 2
    with hosts:
        assert ("cgroup.subtree_control", "+cpu") in kernel.writes
        group = hosts.make("a")
        assert (group / "cpu.max").read_text() == "30000 100000"
    assert children(tmp_path) == []
    kernel.writes.clear()
    with hosts:  # already enabled: left as it is
        pass
    assert kernel.writes == []


def test_v2_without_the_cpu_controller_says_what_is_needed(tmp_path):
    kernel = FakeKernel(tmp_path, version=2)
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    with pytest.raises(CgroupError, match=r"does not offer the cpu controller \(cgroup."
                       r"controllers: memory pids.*needs root"):
        with cgroups(tmp_path, kernel):
            pass
    assert kernel.writes == []


# ----------------------------------------------------------------------- the real prefix


def test_the_prefix_puts_the_commands_own_pid_in_the_cgroup(tmp_path):
    """The shell writes its PID and then becomes the command: the PID written is the
    command's (a real shell and process; the cgroup.procs here is a plain file)."""
    group = tmp_path / "g"
    group.mkdir()
    command = cgroups(tmp_path, FakeKernel(tmp_path)).enter_command(group)
    out = subprocess.run([*command, sys.executable, "-c", "import os; print(os.getpid())"],
                         capture_output=True, text=True, check=True, timeout=30)
    assert (group / "cgroup.procs").read_text().split() == [out.stdout.strip()]


def test_the_prefix_does_not_start_the_command_if_it_cannot_join(tmp_path):
    command = cgroups(tmp_path, FakeKernel(tmp_path)).enter_command(tmp_path / "absent")
    out = subprocess.run([*command, sys.executable, "-c", "print('started')"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "started" not in out.stdout
