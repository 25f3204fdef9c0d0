"""The benchmark's sites, each with an access log of ``time path status`` lines (and more
fields after those): a generated site served from static files by nginx (on 127.0.0.1, or from
a network namespace of :mod:`bench.netlink`) and by ``bench/latency_site.py`` on 127.0.0.1
(answers after a fixed delay, run by the peers' Python, which has uvloop)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from bench.helpers import BENCH, PEERS, descendants, free_port, own_cpu, wait_port
from distscrape_celery.testing.sitegen import generate_site

ROBOTS = b"User-agent: *\nAllow: /\n"


def site_pages(n_pages: int, page_bytes: int) -> dict[str, bytes]:
    site = generate_site(n_pages=n_pages, seed=1, page_padding=page_bytes - 400)
    pages = {p: site.pages[p] for p in site.reachable}
    pages["/robots.txt"] = ROBOTS
    return pages


def static_name(path: str) -> str:
    """The file nginx serves ``path`` from, relative to its root: ``/dir/`` is
    ``dir/index.html``, ``/q?id=N`` is ``q/N.html``."""
    if path.startswith("/q?id="):
        return f"q/{path[len('/q?id='):]}.html"
    if path.endswith("/"):
        return path[1:] + "index.html"
    return path[1:]


def write_static(pages: dict[str, bytes], root: Path) -> None:
    """Write each page under ``root`` as :func:`static_name` names it."""
    for path, body in pages.items():
        target = root / static_name(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(body)


NGINX_CONF = """\
daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    default_type text/html;
    types {{ text/plain txt; }}
    client_body_temp_path {dir}/tmp;
    proxy_temp_path {dir}/tmp;
    fastcgi_temp_path {dir}/tmp;
    uwsgi_temp_path {dir}/tmp;
    scgi_temp_path {dir}/tmp;
    log_format bench '$msec $request_uri $status $body_bytes_sent';
    access_log {dir}/access.log bench;
    sendfile on;
    tcp_nodelay on;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    server {{
        listen {address}:{port};
        root {root};
        location = /q {{ try_files /q/$arg_id.html =404; }}
{server}
    }}
}}
"""


def find_nginx() -> str:
    found = shutil.which("nginx", path=os.environ.get("PATH", "") + ":/usr/sbin")
    if found is None:
        print("installing nginx-light from Debian's packages", file=sys.stderr)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "install", "-y", "-q", "nginx-light"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        found = shutil.which("nginx") or "/usr/sbin/nginx"
    return found


class Site:
    """A server on 127.0.0.1 with an access log of ``time path status`` lines."""

    url: str
    log: Path
    expected: int  # the pages a whole crawl fetches, robots.txt not counted

    proc: subprocess.Popen

    @property
    def seeds(self) -> list[str]:
        """The URLs a crawl of the site starts from."""
        return [self.url]

    def mark(self) -> tuple[int, float]:
        """Where the access log ends now, and the server's CPU seconds so far."""
        return (self.log.stat().st_size if self.log.exists() else 0), self.cpu_seconds()

    def cpu_seconds(self) -> float:
        """CPU of the server's processes (nginx: master and workers): it shares the 2 cores."""
        return sum(own_cpu(pid) for pid in [self.proc.pid, *descendants(self.proc.pid)])

    def requests_since(self, offset: int) -> list[tuple[float, str]]:
        return [(float(stamp), path) for stamp, path, *_ in self._lines_since(offset)]

    def first_request_since(self, offset: int) -> Optional[float]:
        """When the site received the first request logged since ``offset`` (robots.txt too),
        on the wall clock (``time.time()``, as the logs are), or None before one is logged."""
        lines = self._lines_since(offset)
        return min(self.arrival(fields) for fields in lines) if lines else None

    def arrival(self, fields: list[str]) -> float:
        """When a log line's request arrived. nginx logs the time it answered a static file:
        a fraction of a millisecond later, within its millisecond resolution."""
        return float(fields[0])

    def lag_since(self, offset: int) -> list[float]:
        """The latency site's lag of each answer since ``offset``, in ms (nginx logs none)."""
        return [float(rest[0]) for _, _, _, *rest in self._lines_since(offset) if rest]

    def _lines_since(self, offset: int) -> list[list[str]]:
        with self.log.open("rb") as fh:
            fh.seek(offset)
            return [line.split(" ") for line in fh.read().decode().splitlines()]


class NginxSite(Site):
    """nginx serving ``pages`` as :func:`write_static` lays them out under ``root``; ``server``
    is more of its server block's configuration (one directive a line)."""

    def __init__(self, pages: dict[str, bytes], workdir: Path, server: str = "", *,
                 address: str = "127.0.0.1", prefix: Sequence[str] = ()) -> None:
        """``prefix``: a command that runs nginx elsewhere (in a network namespace) where it
        listens on ``address``."""
        self.root, self.dir = workdir / "static", workdir / "nginx"
        write_static(pages, self.root)
        (self.dir / "tmp").mkdir(parents=True)
        port = free_port()
        conf = self.dir / "nginx.conf"
        conf.write_text(NGINX_CONF.format(dir=self.dir, address=address, port=port,
                                          root=self.root,
                                          server=textwrap.indent(server, " " * 8)))
        self.log = self.dir / "access.log"
        self.url = f"http://{address}:{port}/"
        self.expected = sum(1 for path in pages if path != "/robots.txt")
        # `ip netns exec` execs nginx: the process held is nginx itself.
        self.proc = subprocess.Popen([*prefix, find_nginx(), "-c", str(conf), "-p",
                                      str(self.dir)], start_new_session=True)
        wait_port(port, host=address)

    def lag_since(self, offset: int) -> list[float]:
        return []  # nginx logs no lag (its fourth field is the body bytes)

    def responses_since(self, offset: int) -> list[tuple[float, str, int, int]]:
        """Each answer logged since ``offset``: when, the path, the status and the body bytes."""
        return [(float(stamp), path, int(status), int(sent))
                for stamp, path, status, sent in self._lines_since(offset)]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class LatencySite(Site):
    """``bench/latency_site.py``, run by the peers' Python (which has uvloop, so the server takes
    as little of the shared CPU as it can)."""

    def __init__(self, pages: dict[str, bytes], workdir: Path, delay: float) -> None:
        port = free_port()
        self.log = workdir / "latency-access.log"
        self.url = f"http://127.0.0.1:{port}/"
        self.expected = sum(1 for path in pages if path != "/robots.txt")
        pages_file = workdir / "latency-pages.json"
        pages_file.write_text(json.dumps({p: b.decode("latin-1") for p, b in pages.items()}))
        self.proc = subprocess.Popen(
            [str(PEERS / "bin" / "python"), str(BENCH / "latency_site.py"),
             "--port", str(port), "--delay", str(delay), "--pages", str(pages_file),
             "--log", str(self.log)], start_new_session=True)
        wait_port(port)
        self.delay = delay

    def arrival(self, fields: list[str]) -> float:
        # It logs when it answered: the delay and its lag (ms) after the request came.
        return float(fields[0]) - self.delay - float(fields[3]) / 1000

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
