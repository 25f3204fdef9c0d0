"""The benchmark's stand-in for distant sites: serves fixed pages on loopback addresses, each
answer sent a fixed delay after its request arrived (HTTP/1.1, keep-alive), as a network of that
latency would. Run by ``bench/suite.py`` and ``bench/broad.py`` with the peers' Python
(``bench/.venv-peers``, which has uvloop).

    .venv/bin/python -m bench.latency_site --port N --delay 0.05 --pages pages.json --log access.log
    .venv/bin/python -m bench.latency_site --port N --sites sites.json --log access.log

``pages.json`` maps each path (``/robots.txt`` included) to its body, decoded as Latin-1, served
on 127.0.0.1 after ``--delay`` seconds. ``sites.json`` is a list of hosts, each
``{"address": "127.0.0.10", "delay": 0.4, "pages": {path: body}}``, all served by this one process
on ``--port`` of their own address (on Linux every 127.x.y.z is a distinct local address). The log
has a line per answer: ``unix-time path status lag-ms address``, the lag being how much later than
the delay the answer left (a starved event loop would add latency the crawler sees): the request
came at unix-time - delay - lag.

It shares the machine's cores with the crawler, so each ms it spends is one the crawler loses, a
cost a distant server would not put on the crawler's machine. Hence uvloop when it is installed,
a protocol (no task or stream per request), answers built once, and the log written a batch at a
time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import time
from dataclasses import dataclass


@dataclass
class Host:
    """One served address: its pages (path to body) and how long each answer waits."""

    address: str
    delay: float
    pages: dict[str, bytes]


def one_port(addresses: list[str]) -> int:
    """A port free on every address (tried by binding them all; a few tries)."""
    for _ in range(20):
        socks = []
        try:
            first = socket.socket()
            socks.append(first)
            first.bind((addresses[0], 0))
            port = first.getsockname()[1]
            for address in addresses[1:]:
                s = socket.socket()
                socks.append(s)
                s.bind((address, port))
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no port is free on all of {addresses[0]} ... {addresses[-1]}")


def answer(status: bytes, ctype: bytes, body: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype + b"\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


def serve(hosts: list[Host], port: int, log: str) -> None:
    """Serve every host on ``port`` of its address until SIGTERM, logging each answer."""
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    logfh = open(log, "ab")
    lines: list[bytes] = []
    not_found = answer(b"404 Not Found", b"text/plain", b"not found")

    def flush() -> None:
        logfh.write(b"".join(lines))
        logfh.flush()
        lines.clear()

    def protocol(host: Host) -> type[asyncio.Protocol]:
        """A protocol class bound to one host's answers and delay."""
        answers = {path.encode(): answer(b"200 OK", b"text/plain" if path == "/robots.txt"
                                         else b"text/html", body)
                   for path, body in host.pages.items()}
        delay, address = host.delay, host.address.encode()

        class Http(asyncio.Protocol):
            def connection_made(self, transport) -> None:
                self.transport, self.buf = transport, b""

            def data_received(self, data: bytes) -> None:
                # Wall clock, not loop.time(): uvloop's is in whole ms, and the log must tell
                # whether a request came before or after another one's answer.
                arrived = time.time()
                self.buf += data
                while (end := self.buf.find(b"\r\n\r\n")) >= 0:
                    head, self.buf = self.buf[:end], self.buf[end + 4:]
                    try:
                        target = head.split(b" ", 2)[1]
                    except IndexError:
                        self.transport.close()
                        return
                    loop.call_later(delay, self.respond, target, arrived)

            def respond(self, target: bytes, arrived: float) -> None:
                if self.transport.is_closing():
                    return
                out = answers.get(target)
                self.transport.write(out or not_found)
                now = time.time()
                if not lines:  # the first since the last write: write them all a little later
                    loop.call_later(0.02, flush)
                lines.append(b"%.6f %s %s %.3f %s\n" % (
                    now, target, b"200" if out else b"404", (now - arrived - delay) * 1000,
                    address))

        return Http

    async def main() -> None:
        servers = [await loop.create_server(protocol(host), host.address, port, backlog=1024)
                   for host in hosts]
        await asyncio.gather(*(server.serve_forever() for server in servers))

    loop.add_signal_handler(signal.SIGTERM, loop.stop)
    try:
        loop.run_until_complete(main())
    except RuntimeError:  # stopped by SIGTERM
        pass
    finally:
        flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, help="with --pages: seconds before each answer")
    parser.add_argument("--pages", help="one host, 127.0.0.1: a JSON object of path to body")
    parser.add_argument("--sites", help="many hosts: a JSON list of {address, delay, pages}")
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    if (args.pages is None) == (args.sites is None) or (args.pages and args.delay is None):
        parser.error("give either --pages and --delay, or --sites")

    def decoded(pages: dict[str, str]) -> dict[str, bytes]:
        return {path: body.encode("latin-1") for path, body in pages.items()}

    with open(args.pages or args.sites) as fh:
        data = json.load(fh)
    if args.pages:
        hosts = [Host("127.0.0.1", args.delay, decoded(data))]
    else:
        hosts = [Host(h["address"], float(h["delay"]), decoded(h["pages"])) for h in data]
    serve(hosts, args.port, args.log)


if __name__ == "__main__":
    main()
