"""Shared fixtures: a real throwaway Redis server, loopback sites, trackers of both kinds.

Set DISTSCRAPE_TEST_REDIS_URL to run against an existing Redis instead; the tests FLUSH its
database before each test, so point it at a database that holds nothing you need.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis

sys.path.insert(0, str(Path(__file__).parent))  # for `import sitegen`

from distscrape_celery.local.embedded import EmbeddedRedis  # noqa: E402
from distscrape_celery.tracker import InMemoryTracker, RedisTracker  # noqa: E402


@pytest.fixture(scope="session")
def redis_server_url():
    url = os.environ.get("DISTSCRAPE_TEST_REDIS_URL")
    if url:
        yield url
        return
    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture
def redis_url(redis_server_url):
    client = redis.Redis.from_url(redis_server_url)
    client.flushdb()
    client.close()
    return redis_server_url


@pytest.fixture
def redis_client(redis_url):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


def make_tracker(kind: str, redis_url: str | None, **kw):
    if kind == "memory":
        return InMemoryTracker(bound_refresh_seconds=0, **kw)
    return RedisTracker.from_url(redis_url, bound_refresh_seconds=0, **kw)


@pytest.fixture(params=["memory", "redis"])
def tracker_factory(request):
    """Builds trackers of one kind; for Redis, all share one freshly flushed database."""
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    return lambda **kw: make_tracker(request.param, url, **kw)


# -- crawls with real worker processes --------------------------------------------------------

from sitegen import SiteServer, generate_site  # noqa: E402

from distscrape_celery.local.processes import WorkerProcess  # noqa: E402
from distscrape_celery.settings import Settings  # noqa: E402


@pytest.fixture(scope="session")
def site():
    return generate_site(n_pages=300, seed=7, unreachable=10)


@pytest.fixture
def site_server(site):
    with SiteServer(site) as server:
        yield server


def plugins_path(*first: str) -> str:
    """PYTHONPATH for a worker that imports the tests' ``plugins``: ``first``, tests/, then the
    caller's own PYTHONPATH."""
    return os.pathsep.join(filter(None, [*first, str(Path(__file__).parent),
                                         os.environ.get("PYTHONPATH")]))


def crawl_settings(redis_url: str, **overrides) -> Settings:
    # An empty environ: tests must not depend on the shell's DISTSCRAPE_* variables.
    return Settings.from_env({}, redis_url=redis_url, **overrides)


@pytest.fixture
def workers(tmp_path):
    """Start real `celery worker` processes; every one is stopped (its whole group) at the end."""
    started: list[WorkerProcess] = []

    def start(settings: Settings, name: str, concurrency: int = 3, **kw) -> WorkerProcess:
        w = WorkerProcess(settings, name=name, concurrency=concurrency, log_dir=str(tmp_path),
                          loglevel="INFO", **kw)
        started.append(w.start())
        return w

    yield start
    stop_all(started, timeout=10)


def crawl_site_with_workers(settings: Settings, workers, site_server, out, job: str,
                            n_workers: int = 2, timeout: float = 120):
    """Start ``n_workers`` real workers, seed ``job`` with the site's root (the files saver into
    ``out``) and wait until it finishes, failing at once if a worker dies. Returns its stats."""
    from distscrape_celery.worker.app import configure_app
    from distscrape_celery.job.spec import build_spec
    from distscrape_celery.local.processes import wait_for_workers
    from distscrape_celery.core.manager import CrawlManager
    from distscrape_celery.worker.tasks import publisher

    procs = [workers(settings, f"{job}-{i}") for i in range(n_workers)]
    tracker = RedisTracker.from_url(settings.redis_url)
    wait_for_workers(tracker, n_workers, procs=procs)
    configure_app(settings)
    manager = CrawlManager(tracker, publisher.scrape)
    manager.seed(job, build_spec({"seeds": [site_server.url("/")], "saver": {"output": str(out)}}))

    def check():
        for p in procs:
            p.check()

    return manager.wait(job, timeout=timeout, check=check)


def stop_all(procs, timeout: float) -> None:
    """Stop every worker of ``procs`` at once: each warm shutdown spends ~1.5 s closing its
    prefork pool, which would add up, worker after worker, at the end of every crawl test."""
    threads = [threading.Thread(target=w.stop, kwargs={"timeout": timeout}) for w in procs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def saved_files(output) -> dict[str, bytes]:
    """Every file under ``output`` (relative path -> content), temp files of the saver excluded."""
    out = {}
    for path in Path(output).rglob("*"):
        if path.is_file() and not path.name.startswith(".~tmp-"):
            out[str(path.relative_to(output))] = path.read_bytes()
    return out


def expected_files(server, site, output) -> dict[str, bytes]:
    from distscrape_celery.savers import FileItemSaver

    saver = FileItemSaver(output)
    return {str(saver.name_for(server.url(p))): site.pages[p] for p in site.reachable}


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

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
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
