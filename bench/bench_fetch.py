"""The fetcher's CPU per download, as a worker process's threads share it.

    .venv/bin/python -m bench.bench_fetch [--threads 32] [--fetches 200] [--hosts 40] [--rounds 2]
                                [--code DIR]

Serves a 6,000-byte page (keep-alive, no delay) on ``--hosts`` loopback addresses (127.0.0.10
and up, one port) from a child process (asyncio), then, in a fresh process per round, runs
``--threads`` threads sharing one ``Fetcher``, each downloading ``--fetches`` pages, spread over
the hosts as a broad crawl spreads a thread's downloads. Prints that process's CPU (user + system)
per download and the downloads per second. ``--code DIR`` also measures the distscrape_celery
package in DIR (another version, e.g. from ``git archive OLD distscrape_celery | tar -x -C DIR``)
in alternate rounds. Network: 127.0.0.0/8 only.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.helpers import CHECKOUT_PRELUDE
from bench.latency_site import one_port

FIRST = ipaddress.IPv4Address("127.0.0.10")

SERVER = r'''
import asyncio, sys
body = b"x" * 6000
answer = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n"
          % len(body) + body)
async def handle(reader, writer):
    try:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
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

CLIENT = CHECKOUT_PRELUDE + r'''
import resource, threading, time
code, port, threads, fetches, hosts = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:6])
from distscrape_celery.job.spec import FetchSpec, JobSpec
from distscrape_celery.web import fetch
seeds = [f"http://127.0.0.{10 + h}:{port}/" for h in range(hosts)]
fetcher = (fetch.Fetcher.for_job(JobSpec(seeds=seeds)) if hasattr(fetch.Fetcher, "for_job")
           else fetch.Fetcher(FetchSpec()))
def run(k):
    for i in range(fetches):
        fetcher.get(f"{seeds[(i * 7 + k) % hosts]}p{i}.html")
workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
before, started = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
for t in workers:
    t.start()
for t in workers:
    t.join()
after, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - started
cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
n = threads * fetches
print(f"{1e6 * cpu / n:.0f} us CPU a download, {n / wall:.0f} downloads/s "
      f"({fetch.__file__.rsplit('/distscrape_celery/', 1)[0]})")
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--fetches", type=int, default=200, help="downloads of each thread")
    parser.add_argument("--hosts", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--code", help="also measure the distscrape_celery package in DIR")
    args = parser.parse_args()
    addresses = [str(FIRST + i) for i in range(args.hosts)]
    port = one_port(addresses)
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port), *addresses],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        load = os.getloadavg()[0]
        print(f"{args.threads} threads x {args.fetches} downloads, {args.hosts} hosts; "
              f"load average {load:.2f}")
        codes = [""] + ([str(Path(args.code).resolve())] if args.code else [])
        for number in range(args.rounds):
            for code in codes if number % 2 == 0 else codes[::-1]:
                out = subprocess.run(
                    [sys.executable, "-c", CLIENT, code, str(port), str(args.threads),
                     str(args.fetches), str(args.hosts)],
                    cwd="/", capture_output=True, text=True, check=True)
                print(f"round {number + 1}: {out.stdout.strip()}", flush=True)
                time.sleep(0.2)
    finally:
        server.terminate()
        server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
