"""The `distscrape` command as a subprocess, the way a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys


def run(
    *args: str, env: dict | None = None, timeout: float = 120, input: str | None = None
) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")}
    return subprocess.run(
        [sys.executable, "-m", "distscrape_celery.cli", *args], capture_output=True, text=True,
        env={**base, **(env or {})}, timeout=timeout, input=input,
    )


def assert_one_line_error(res, *fragments: str) -> None:
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
