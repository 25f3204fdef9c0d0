"""The job API as the tests use it: ``distscrape api`` as a real process on a loopback port, and
HTTP requests and server-sent event streams to it with or without its token."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Optional

from tests.support.ops import cli_env, free_port

TOKEN = "test-token-0123456789abcdef"


class ApiServer:
    """``distscrape api`` on 127.0.0.1 against ``redis_url``, ``env`` added to its environment
    (default: the token in DISTSCRAPE_API_TOKEN); stopped (SIGTERM) at the end of a ``with``."""

    def __init__(self, redis_url: str, *args: str, env: Optional[dict[str, str]] = None,
                 token: Optional[str] = TOKEN) -> None:
        self.port = free_port()
        self.token = token
        extra = {"DISTSCRAPE_API_TOKEN": token} if token else {}
        self.env = cli_env(redis_url, **extra, **(env or {}))
        self.args = ["--port", str(self.port), *args]
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> "ApiServer":
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "distscrape_celery.cli", "api", *self.args], env=self.env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"distscrape api exited {self.proc.returncode}: "
                                     f"{self.proc.stderr.read()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                assert time.monotonic() < deadline, "distscrape api did not start listening"
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "ApiServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def request(self, method: str, path: str, body: Any = None, *,
                content_type: str = "application/json", token: Any = "default",
                headers: Optional[dict[str, str]] = None, timeout: float = 60) -> tuple[int, Any]:
        """(status, JSON body or raw bytes) of one request; ``body`` a dict is sent as JSON,
        bytes or str as they are; ``token`` None sends no Authorization header."""
        token = self.token if token == "default" else token
        sent = {"Content-Type": content_type, **(headers or {})}
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=sent)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, raw


class EventStream:
    """A server-sent event stream read in a thread: ``events`` collects (event, data) as they
    come; ``done`` is set when the server closes it."""

    def __init__(self, api: ApiServer, path: str, token: Optional[str] = TOKEN) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=120)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.conn.request("GET", path, headers=headers)
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.events: list[tuple[str, Any]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        if self.status == 200:
            self.thread.start()
        else:
            self.done.set()

    def _read(self) -> None:
        name, data = "message", []
        try:
            for raw in self.response:
                line = raw.decode().rstrip("\r\n")
                if not line:
                    if data:
                        self.events.append((name, json.loads("".join(data))))
                    name, data = "message", []
                elif line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
        finally:
            self.done.set()

    def close(self) -> None:
        self.conn.close()

