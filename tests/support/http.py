"""HTTP servers on 127.0.0.1 that run in the test's own process: fixed routes
(:class:`RouteServer`), handler functions (:func:`serve`), an ID listing site (:class:`IdSite`)."""

from __future__ import annotations

import gzip
import json
import random
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

from distscrape_celery.testing.sitegen import QuietServer

Route = Callable[[BaseHTTPRequestHandler], None]


def reply(
    handler: BaseHTTPRequestHandler,
    status: int = 200,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> None:
    handler.send_response(status)
    headers = dict(headers or {})
    headers.setdefault("Content-Length", str(len(body)))
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


@contextmanager
def serve(
    routes: dict[str, Route], tls: ssl.SSLContext | None = None,
) -> Iterator[tuple[str, threading.Event, list[dict]]]:
    """Serve ``routes`` (path -> handler) on 127.0.0.1, HTTP/1.1 keep-alive; over TLS with the
    server context ``tls`` (an https:// base URL).

    Yields (base URL, an event set at teardown so stalled handlers give up, request log)."""
    release = threading.Event()
    log: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            log.append({"path": self.path, "port": self.client_address[1], "headers": self.headers})
            route = routes.get(self.path)
            if route is None:
                reply(self, 404, b"not here")
            else:
                route(self)

        def log_message(self, format: str, *args: object) -> None:
            pass

        def handle(self) -> None:
            try:
                super().handle()
            except OSError:  # the client gave up (as it should, in the timeout tests)
                pass

    server = QuietServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        # The handshake happens on the handler's first read, in its own thread: a client that
        # refuses the certificate fails only its own connection (handle() drops the error).
        server.socket = tls.wrap_socket(server.socket, server_side=True,
                                        do_handshake_on_connect=False)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        scheme = "https" if tls is not None else "http"
        yield f"{scheme}://127.0.0.1:{server.server_port}", release, log
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def nested_gzip_bomb() -> bytes:
    """About 1 kB that decode, through ``Content-Encoding: gzip, gzip``, to 256 MiB of zeros.
    The inner layer is 256 gzip members of 1 MiB each (cheap to build; one valid gzip body)."""
    return gzip.compress(gzip.compress(bytes(1 << 20), 9) * 256, 9)


class RouteServer:
    """Fixed responses on 127.0.0.1: ``routes`` maps a path to (status, body) or
    (status, body, seconds to wait first); anything else is a 404. Or ``routes`` is a function of
    (path, times it was asked for before) returning (status, body, headers, seconds to wait).
    ``hits`` logs request paths; ``log`` (monotonic arrival time, path) of each request."""

    def __init__(self, routes) -> None:
        self.hits: list[str] = []
        self.log: list[tuple[float, str]] = []
        lock = threading.Lock()
        server = self

        def respond(path: str) -> tuple:
            with lock:
                n = server.hits.count(path)
                server.hits.append(path)
                server.log.append((time.monotonic(), path))
            if callable(routes):
                return routes(path, n)
            status, body, *delay = routes.get(path, (404, b""))
            return status, body, {}, delay[0] if delay else 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                status, body, headers, delay = respond(self.path)
                if delay:
                    time.sleep(delay)
                self.send_response(status)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._httpd = QuietServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True).start()
        self.base = f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def page_hits(self) -> list[str]:
        """``hits`` without the crawler's robots.txt requests."""
        return [path for path in self.hits if path != "/robots.txt"]

    def __enter__(self) -> "RouteServer":
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class IdSite:
    """``/list/<n>`` pages name some IDs; ``/item/<id>.json`` names related IDs. Some IDs are
    reachable only through other items, some from nowhere."""

    def __init__(self, n_ids: int = 150, seed: int = 3) -> None:
        rng = random.Random(seed)
        self.ids = [f"{rng.randrange(10**6, 10**7)}" for _ in range(n_ids)]
        self.related = {i: rng.sample(self.ids, 3) for i in self.ids}
        self.lists = {n: self.ids[n * 10:n * 10 + 3] for n in range(3)}
        reach, todo = set(), [i for ids in self.lists.values() for i in ids]
        while todo:
            i = todo.pop()
            if i not in reach:
                reach.add(i)
                todo.extend(self.related[i])
        self.reachable = reach
        self.hits: Counter = Counter()
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                site.hits[self.path] += 1
                body, status = b"", 404
                if self.path.startswith("/list/") and int(self.path[6:]) in site.lists:
                    ids = site.lists[int(self.path[6:])]
                    body, status = json.dumps([{"id": i} for i in ids]).encode(), 200
                elif self.path.startswith("/item/") and self.path.endswith(".json"):
                    i = self.path[6:-5]
                    if i in site.related:
                        doc = {"id": i, "related": [{"id": r} for r in site.related[i]]}
                        body, status = json.dumps(doc).encode(), 200
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
