"""Proxies on 127.0.0.1 for the tests, each counting what passes through it: an HTTP proxy
that forwards plain requests and tunnels CONNECT (served over TLS too, as an ``https://``
proxy), and a SOCKS5 proxy (RFC 1928, with RFC 1929's user name and password when asked).
They connect only to 127.0.0.x: a test's request for anything else through them is refused and
counted, never sent."""

from __future__ import annotations

import base64
import ipaddress
import select
import socket
import socketserver
import ssl
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional
from urllib.parse import urlsplit


@dataclass
class ProxyLog:
    """What a proxy was asked: one entry per request (forwarded), tunnel or SOCKS connect."""

    entries: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, **entry) -> None:
        with self.lock:
            self.entries.append(entry)

    def __len__(self) -> int:
        return len(self.entries)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")) in ipaddress.ip_network("127.0.0.0/8")
    except ValueError:
        return host == "localhost"


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes. One thread: a TLS socket (the client's,
    to an https:// proxy) must not be read and written from two at once."""
    ends = {a: b, b: a}
    try:
        while True:
            # Bytes a TLS socket has decrypted already are not seen by select.
            ready = [s for s in ends if isinstance(s, ssl.SSLSocket) and s.pending()]
            ready = ready or select.select(list(ends), [], [], 30)[0]
            if not ready:
                return  # idle: the client keeps a pool's connection it will not use again
            for src in ready:
                data = src.recv(65536)
                if not data:
                    return
                ends[src].sendall(data)
    except OSError:
        pass
    finally:
        for sock in (a, b):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _read_head(rfile) -> Optional[tuple[str, list[tuple[str, str]]]]:
    line = rfile.readline(65536)
    if not line.strip():
        return None
    headers = []
    while (header := rfile.readline(65536)) not in (b"\r\n", b"\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    return line.decode("latin-1").strip(), headers


class _HttpProxyHandler(socketserver.StreamRequestHandler):
    server: "_ProxyServer"

    def handle(self) -> None:
        while True:
            head = _read_head(self.rfile)
            if head is None:
                return
            request_line, headers = head
            method, target, _ = request_line.split(" ", 2)
            auth = next((v for k, v in headers if k.lower() == "proxy-authorization"), None)
            self.server.log.add(method=method, target=target, proxy_auth=auth,
                                headers={k.lower(): v for k, v in headers})
            if self.server.credentials is not None and auth != _basic(self.server.credentials):
                self.wfile.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                                 b"Proxy-Authenticate: Basic\r\nContent-Length: 0\r\n\r\n")
                continue
            if method == "CONNECT":
                self._tunnel(target)
                return
            self._forward(method, target, headers)

    def _tunnel(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        if not _loopback(host):
            self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
        self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        _relay(self.connection, upstream)

    def _forward(self, method: str, target: str, headers: list[tuple[str, str]]) -> None:
        """Send the request on with Connection: close, and its whole answer back (the test
        sites frame every answer by its Content-Length)."""
        parts = urlsplit(target)
        if not _loopback(parts.hostname or ""):
            self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        upstream = socket.create_connection((parts.hostname, parts.port or 80), timeout=10)
        kept = [(k, v) for k, v in headers
                if k.lower() not in ("connection", "proxy-connection", "proxy-authorization")]
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in kept)
        upstream.sendall((head + "Connection: close\r\n\r\n").encode("latin-1"))
        answer = b""
        while data := upstream.recv(65536):
            answer += data
        upstream.close()
        self.wfile.write(answer)  # framed by its Content-Length: the client's connection stays


class _Socks5Handler(socketserver.StreamRequestHandler):
    server: "_ProxyServer"

    def handle(self) -> None:
        read = self.rfile.read
        version, count = read(2)
        methods = read(count)
        wanted = 0x02 if self.server.credentials is not None else 0x00
        if version != 5 or wanted not in methods:
            self.wfile.write(b"\x05\xff")
            return
        self.wfile.write(bytes([5, wanted]))
        user = None
        if wanted == 0x02:
            _, n = read(2)
            user = read(n).decode()
            (n,) = read(1)
            password = read(n).decode()
            ok = f"{user}:{password}" == self.server.credentials
            self.wfile.write(b"\x01\x00" if ok else b"\x01\x01")
            if not ok:
                self.server.log.add(refused="credentials", user=user)
                return
        _, command, _, kind = read(4)
        if kind == 1:
            host = socket.inet_ntoa(read(4))
        elif kind == 4:
            host = socket.inet_ntop(socket.AF_INET6, read(16))
        else:
            (n,) = read(1)
            host = read(n).decode()
        (port,) = struct.unpack("!H", read(2))
        self.server.log.add(command=command, address_type={1: "ipv4", 3: "name", 4: "ipv6"}[kind],
                            host=host, port=port, user=user)
        if command != 1 or not _loopback(host):
            self.wfile.write(b"\x05\x02\x00\x01" + bytes(6))  # not allowed by the rule set
            return
        upstream = socket.create_connection((host, port), timeout=10)
        bound_host, bound_port = upstream.getsockname()[:2]
        self.wfile.write(b"\x05\x00\x00\x01" + socket.inet_aton(bound_host)
                         + struct.pack("!H", bound_port))
        _relay(self.connection, upstream)


def _basic(credentials: str) -> str:
    return "Basic " + base64.b64encode(credentials.encode()).decode()


class _ProxyServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, handler, credentials: Optional[str],
                 tls: Optional[ssl.SSLContext] = None) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.log = ProxyLog()
        self.credentials = credentials
        self.tls = tls

    def finish_request(self, request, client_address) -> None:
        if self.tls is not None:
            # In the request's own thread: a client that refuses the certificate is logged
            # and fails its connection only.
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except OSError as exc:
                self.log.add(refused="tls", error=str(exc))
                return
        super().finish_request(request, client_address)

    def handle_error(self, request, client_address) -> None:
        pass  # a client that hangs up mid-tunnel is no test's failure


@dataclass
class RunningProxy:
    """A proxy serving on 127.0.0.1: its ``port``, and the ``log`` of what it was asked."""

    port: int
    log: ProxyLog

    def url(self, scheme: str, credentials: Optional[str] = None) -> str:
        return f"{scheme}://{credentials + '@' if credentials else ''}127.0.0.1:{self.port}"


@contextmanager
def _running(handler, credentials: Optional[str],
             tls: Optional[ssl.SSLContext] = None) -> Iterator[RunningProxy]:
    server = _ProxyServer(handler, credentials, tls)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield RunningProxy(server.server_address[1], server.log)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def http_proxy(credentials: Optional[str] = None, tls: Optional[ssl.SSLContext] = None):
    """An HTTP proxy (forwarding, and CONNECT tunnels) that asks for basic auth with
    ``credentials`` (``user:password``) when given; with the server context ``tls``, an
    ``https://`` proxy (its clients speak TLS to it)."""
    return _running(_HttpProxyHandler, credentials, tls)


def socks5_proxy(credentials: Optional[str] = None):
    """A SOCKS5 proxy that asks for ``credentials`` (``user:password``) when given."""
    return _running(_Socks5Handler, credentials)
