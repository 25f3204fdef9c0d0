#!/usr/bin/env python
"""The benchmark's stand-in for a distant site: serves fixed pages on 127.0.0.1, each answer sent
``--delay`` seconds after its request arrived (HTTP/1.1, keep-alive), as a network of that latency
would. Run by ``bench/suite.py`` with the peers' Python (``bench/.venv-peers``, which has uvloop).

    python bench/latency_site.py --port N --delay 0.05 --pages pages.json --log access.log

``pages.json`` maps each path (``/robots.txt`` included) to its body, decoded as Latin-1. The log
has a line per answer: ``unix-time path status lag-ms``, the lag being how much later than
``--delay`` the answer left (a starved event loop would add latency the crawler sees).

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
import time


def answer(status: bytes, ctype: bytes, body: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype + b"\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


def serve(pages: dict[str, bytes], port: int, delay: float, log: str) -> None:
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    logfh = open(log, "ab")
    lines: list[bytes] = []
    answers = {path.encode(): answer(b"200 OK", b"text/plain" if path == "/robots.txt"
                                     else b"text/html", body) for path, body in pages.items()}
    not_found = answer(b"404 Not Found", b"text/plain", b"not found")

    def flush() -> None:
        logfh.write(b"".join(lines))
        logfh.flush()
        lines.clear()

    class Http(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            self.transport, self.buf = transport, b""

        def data_received(self, data: bytes) -> None:
            self.buf += data
            while (end := self.buf.find(b"\r\n\r\n")) >= 0:
                head, self.buf = self.buf[:end], self.buf[end + 4:]
                try:
                    target = head.split(b" ", 2)[1]
                except IndexError:
                    self.transport.close()
                    return
                loop.call_later(delay, self.respond, target, loop.time())

        def respond(self, target: bytes, asked: float) -> None:
            if self.transport.is_closing():
                return
            out = answers.get(target)
            self.transport.write(out or not_found)
            late = (loop.time() - asked - delay) * 1000
            if not lines:  # the first since the last write: write them all a little later
                loop.call_later(0.02, flush)
            lines.append(b"%.3f %s %s %.1f\n" % (time.time(), target, b"200" if out else b"404",
                                                  late))

    async def main() -> None:
        server = await loop.create_server(Http, "127.0.0.1", port, backlog=1024)
        async with server:
            await server.serve_forever()

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
    parser.add_argument("--delay", type=float, required=True)
    parser.add_argument("--pages", required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    with open(args.pages) as fh:
        pages = {path: body.encode("latin-1") for path, body in json.load(fh).items()}
    serve(pages, args.port, args.delay, args.log)


if __name__ == "__main__":
    main()
