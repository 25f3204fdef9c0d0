"""`distscrape crawl` as a subprocess with a TMPDIR of its own, started as from a terminal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

TEMP_PREFIXES = ("distscrape-redis-", "distscrape-worker-")


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def as_from_a_terminal(then=None):
    """A preexec_fn: the child starts with the stop signals at their default action and
    unblocked, as a shell on a terminal starts it, whatever the test process inherited (under
    xdist, crawls started from one test process once ignored SIGINT), then runs ``then``."""
    def preexec() -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        if then is not None:
            then()
    return preexec


class Crawl:
    """One `distscrape crawl` subprocess with its own TMPDIR; output goes to files."""

    def __init__(self, tmp_path: Path, url: str, out: Path, *extra: str, tag: str = "run",
                 preexec_fn=None, env: Optional[dict[str, str]] = None) -> None:
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir(exist_ok=True)
        self.stdout_path, self.stderr_path = tmp_path / f"{tag}.out", tmp_path / f"{tag}.err"
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")},
               **(env or {}), "TMPDIR": str(self.tmp)}
        with self.stdout_path.open("w") as so, self.stderr_path.open("w") as se:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "distscrape_celery.cli", "crawl", url, "--output", str(out),
                 "--quiet", "--concurrency", "2", *extra],
                stdout=so, stderr=se, stdin=subprocess.DEVNULL, env=env,
                preexec_fn=as_from_a_terminal(preexec_fn),
            )

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"crawl did not exit within {timeout}s; stderr:\n{self.stderr}")

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text()

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def temp_dirs(self) -> list[str]:
        return sorted(p.name for p in self.tmp.iterdir() if p.name.startswith(TEMP_PREFIXES))


def wait_until(cond, timeout: float, what: str, crawl: Crawl | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if crawl is not None and crawl.proc.poll() is not None:
            raise AssertionError(f"crawl exited ({crawl.proc.returncode}) before {what}:\n"
                                 f"{crawl.stdout}\n{crawl.stderr}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
