#!/usr/bin/env python
"""Client CPU of one download: ``python bench/bench_fetch.py [--calls 5000] [--rounds 3]``.

``Fetcher.get`` of a 6 KB page over a kept-alive connection to a server in another process on
127.0.0.1, two ways alternated in one run: plain URLs sent to their origin's pool directly
(``Fetcher._open``'s fast path, the default), and every URL through ``PoolManager.urlopen`` (the
fast path's pattern swapped for one that matches nothing). Prints microseconds of this
process's CPU a download; the server's CPU is not counted.
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from distscrape_celery.web import fetch
from distscrape_celery.web.fetch import Fetcher
from distscrape_celery.job.spec import FetchSpec

BODY = b"<html>" + b"x" * 6000 + b"</html>"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else each response waits out the client's delayed ACK

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(sock: socket.socket) -> None:
    server = ThreadingHTTPServer(sock.getsockname(), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    server = multiprocessing.get_context("fork").Process(target=serve, args=(sock,), daemon=True)
    server.start()
    fetcher = Fetcher(FetchSpec())
    urls = [f"http://127.0.0.1:{port}/p/{i}.html" for i in range(100)]
    plain, never = fetch._PLAIN_TARGET, re.compile(r"(?!)")
    ways = {"direct to the pool": plain, "through PoolManager.urlopen": never}
    try:
        for pattern in ways.values():
            fetch._PLAIN_TARGET = pattern
            for url in urls * 5:
                fetcher.get(url)
        for n in range(args.rounds):
            figures = []
            for name, pattern in ways.items():
                fetch._PLAIN_TARGET = pattern
                start = time.process_time()
                for i in range(args.calls):
                    fetcher.get(urls[i % len(urls)])
                figures.append(f"{name} {(time.process_time() - start) / args.calls * 1e6:.0f} us")
            print(f"round {n + 1}: " + ", ".join(figures))
    finally:
        fetch._PLAIN_TARGET = plain
        server.terminate()


if __name__ == "__main__":
    main()
