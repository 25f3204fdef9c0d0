"""The fetcher's CPU per download, as a worker process's threads share it.

    .venv/bin/python -m bench.bench_fetch [--threads 32] [--fetches 200] [--hosts 40] [--rounds 2]
                                [--code DIR] [--revalidate] [--clients fetcher,urllib3,pycurl,impit]

Serves a 6,000-byte page (keep-alive, no delay) on ``--hosts`` loopback addresses (127.0.0.10
and up, one port) from a child process (asyncio), then, in a fresh process per round, runs
``--threads`` threads sharing one ``Fetcher``, each downloading ``--fetches`` pages, spread over
the hosts as a broad crawl spreads a thread's downloads. Prints that process's CPU (user + system)
per download and the downloads per second. ``--code DIR`` also measures the distscrape_celery
package in DIR (another version, e.g. from ``git archive OLD distscrape_celery | tar -x -C DIR``)
in alternate rounds. ``--revalidate``: every request carries the page's ETag in If-None-Match
and the server answers 304 with no body, as a revisit of an unchanged page goes.

``--clients`` measures other HTTP clients the same way, in the same rounds: ``urllib3`` (a pool
per host, what the fetcher builds on, without its limits, guard and deadline), and, from their
own virtualenv (``bench/.venv-http``, made here with the pinned versions if it is missing),
``pycurl`` (libcurl: a handle per thread, with connections to every host) and ``impit`` (the
Rust client Crawlee uses: a client per thread). Network: 127.0.0.0/8 only.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.helpers import BENCH, CHECKOUT_PRELUDE
from bench.latency_site import one_port

FIRST = ipaddress.IPv4Address("127.0.0.10")
HTTP = BENCH / ".venv-http"  # pycurl and impit, pinned
HTTP_PEERS = ["pycurl==7.49.0", "impit==0.15.1", "urllib3==2.8.0"]
ETAG = '"65a1b2c3-1770"'

SERVER = r'''
import asyncio, sys
body = b"x" * 6000
etag = b'"65a1b2c3-1770"'
answer = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nETag: %s\r\nContent-Length: %d\r\n\r\n"
          % (etag, len(body)) + body)
unchanged = b"HTTP/1.1 304 Not Modified\r\nETag: %s\r\n\r\n" % etag
async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            writer.write(unchanged if b"\r\nif-none-match: " + etag in head.lower() else answer)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    for address in sys.argv[2:]:
        await asyncio.start_server(handle, address, int(sys.argv[1]))
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
'''

# The end of every client's script: ``run(k)`` in ``threads`` threads, timed; ``label`` names it.
TIMED = r'''
workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
before, started = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
for t in workers:
    t.start()
for t in workers:
    t.join()
after, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - started
cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
n = threads * fetches
print(f"{1e6 * cpu / n:.0f} us CPU a download, {n / wall:.0f} downloads/s ({label})")
'''

CLIENT = CHECKOUT_PRELUDE + r'''
import resource, threading, time
import contextlib
code, port, threads, fetches, hosts = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:6])
etag = sys.argv[6]
from distscrape_celery.job.spec import FetchSpec, JobSpec
from distscrape_celery.web import fetch
seeds = [f"http://127.0.0.{10 + h}:{port}/" for h in range(hosts)]
fetcher = (fetch.Fetcher.for_job(JobSpec(seeds=seeds)) if hasattr(fetch.Fetcher, "for_job")
           else fetch.Fetcher(FetchSpec()))
expected = 304 if etag else 200
def run(k):
    with fetch.conditional(etag) if etag else contextlib.nullcontext():
        for i in range(fetches):
            got = fetcher.get(f"{seeds[(i * 7 + k) % hosts]}p{i}.html")
            assert got.status == expected, got.status
label = fetch.__file__.rsplit('/distscrape_celery/', 1)[0]
''' + TIMED


# The other clients, each as its documentation has a program use it from many threads.
PEER = r'''
import resource, sys, threading, time
kind, port, threads, fetches, hosts, etag = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6]
seeds = [f"http://127.0.0.{10 + h}:{port}/" for h in range(hosts)]
headers = {"User-Agent": "bench", "Accept": "*/*", **({"If-None-Match": etag} if etag else {})}
expected = 304 if etag else 200
if kind == "urllib3":
    import urllib3
    manager = urllib3.PoolManager(num_pools=100, maxsize=threads, retries=False)
    def run(k):
        for i in range(fetches):
            r = manager.request("GET", f"{seeds[(i * 7 + k) % hosts]}p{i}.html", headers=headers,
                                redirect=False, timeout=30)
            assert r.status == expected, r.status
elif kind == "pycurl":
    import io, pycurl
    lines = [f"{k}: {v}" for k, v in headers.items()]
    def run(k):
        # A connection cache of its own (sharing one between threads, LOCK_DATA_CONNECT,
        # crashed pycurl 7.49.0 here), large enough for every host.
        c = pycurl.Curl()
        c.setopt(pycurl.MAXCONNECTS, hosts)
        c.setopt(pycurl.HTTPHEADER, lines)
        c.setopt(pycurl.TIMEOUT_MS, 30000)
        for i in range(fetches):
            body, head = io.BytesIO(), []
            c.setopt(pycurl.URL, f"{seeds[(i * 7 + k) % hosts]}p{i}.html")
            c.setopt(pycurl.WRITEDATA, body)
            c.setopt(pycurl.HEADERFUNCTION, head.append)
            c.perform()
            assert c.getinfo(pycurl.RESPONSE_CODE) == expected
elif kind == "impit":
    import impit
    def run(k):
        client = impit.Client(timeout=30)
        for i in range(fetches):
            r = client.get(f"{seeds[(i * 7 + k) % hosts]}p{i}.html", headers=headers)
            r.content
            assert r.status_code == expected, r.status_code
label = kind
''' + TIMED
CLIENTS = ("fetcher", "urllib3", "pycurl", "impit")


def ensure_http_peers() -> None:
    """Make ``bench/.venv-http`` with HTTP_PEERS unless it is there."""
    if not (HTTP / "bin" / "python").exists() or subprocess.run(
            [str(HTTP / "bin" / "python"), "-c", "import pycurl, impit"],
            capture_output=True).returncode:
        print("installing pycurl and impit into bench/.venv-http", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(HTTP)], check=True)
        subprocess.run([str(HTTP / "bin" / "pip"), "install", "-q", *HTTP_PEERS], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--fetches", type=int, default=200, help="downloads of each thread")
    parser.add_argument("--hosts", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--code", help="also measure the distscrape_celery package in DIR")
    parser.add_argument("--revalidate", action="store_true",
                        help="conditional requests, each answered 304")
    parser.add_argument("--clients", default="fetcher",
                        help=f"comma-separated, of {', '.join(CLIENTS)}")
    args = parser.parse_args()
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    if not clients or set(clients) - set(CLIENTS):
        parser.error(f"--clients: one or more of {', '.join(CLIENTS)}")
    if {"pycurl", "impit"} & set(clients):
        ensure_http_peers()
    etag = ETAG if args.revalidate else ""
    addresses = [str(FIRST + i) for i in range(args.hosts)]
    port = one_port(addresses)
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port), *addresses],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        load = os.getloadavg()[0]
        print(f"{args.threads} threads x {args.fetches} downloads, {args.hosts} hosts"
              f"{', each request answered 304' if etag else ''}; load average {load:.2f}")
        counts = [str(port), str(args.threads), str(args.fetches), str(args.hosts), etag]
        runs = [[sys.executable, "-c", CLIENT, code, *counts]
                for code in ([""] + ([str(Path(args.code).resolve())] if args.code else []))
                if "fetcher" in clients]
        runs += [[sys.executable if c == "urllib3" else str(HTTP / "bin" / "python"), "-c", PEER,
                  c, *counts] for c in clients if c != "fetcher"]
        for number in range(args.rounds):
            for command in runs if number % 2 == 0 else runs[::-1]:
                out = subprocess.run(command, cwd="/", capture_output=True, text=True,
                                     check=True)
                print(f"round {number + 1}: {out.stdout.strip()}", flush=True)
                time.sleep(0.2)
    finally:
        server.terminate()
        server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
