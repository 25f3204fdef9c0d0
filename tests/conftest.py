"""Shared fixtures: a real throwaway Redis server, loopback sites, trackers of both kinds, real
worker processes. Helpers are in ``tests/support``.

Set DISTSCRAPE_TEST_REDIS_URL to run against an existing Redis instead; the tests FLUSH its
database before each test, so point it at a database that holds nothing you need. The PostgreSQL
tests make a database of their own on DISTSCRAPE_TEST_POSTGRES (tests/support/postgres.py).
"""

from __future__ import annotations

import os

import pytest
import redis

from distscrape_celery.local.embedded import EmbeddedRedis
from distscrape_celery.tracker import InMemoryTracker, RedisTracker


def pytest_collection_modifyitems(config, items):
    """The Docker stack's test first: on a machine's first run it builds its images for minutes,
    which then overlap the rest of the suite (on another xdist process) instead of trailing it."""
    items.sort(key=lambda item: item.get_closest_marker("docker_engine") is None)


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
def postgres_dsn():
    """The connection string of a new, empty PostgreSQL database, dropped after the test."""
    from tests.support.postgres import throwaway_database

    with throwaway_database() as dsn:
        yield dsn


@pytest.fixture
def redis_client(redis_url):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


# The tracker tests count what a call hands out at two scrape messages a task slot, unless a
# test sets its own: they are about the dispatch rules, not the default bound's size.
TEST_DISPATCH_FACTOR = 2.0


def make_tracker(kind: str, redis_url: str | None, **kw):
    kw.setdefault("dispatch_factor", TEST_DISPATCH_FACTOR)
    if kind == "memory":
        return InMemoryTracker(bound_refresh_seconds=0, **kw)
    return RedisTracker.from_url(redis_url, bound_refresh_seconds=0, **kw)


@pytest.fixture(params=["memory", "redis"])
def tracker_factory(request):
    """Builds trackers of one kind; for Redis, all share one freshly flushed database."""
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    return lambda **kw: make_tracker(request.param, url, **kw)


# -- crawls with real worker processes --------------------------------------------------------

from distscrape_celery.settings import Settings  # noqa: E402
from tests.support.crawl import PluginWorker, kill_all, plugins_path  # noqa: E402
from tests.support.http import RouteServer  # noqa: E402
from tests.support.pipeline import ROUTES  # noqa: E402
from distscrape_celery.testing.sitegen import SiteServer, generate_site  # noqa: E402


@pytest.fixture(scope="session")
def site():
    return generate_site(n_pages=300, seed=7, unreachable=10)


@pytest.fixture(scope="session")
def small_site():
    """An 80-page site, every page reachable: for crawls that are stopped, resumed and joined."""
    return generate_site(n_pages=80, seed=11, unreachable=0)


@pytest.fixture
def site_server(site):
    with SiteServer(site) as server:
        yield server


@pytest.fixture
def start_worker(tmp_path):
    """Start real `celery worker` processes that can import ``tests.plugins`` (the repository
    root on their PYTHONPATH, after ``path_first``), logging into ``tmp_path/logs``, each
    consuming ``queues`` (default: both) with ``env`` added to its environment (``options``:
    more of WorkerProcess's, such as ``include``). Every one is
    killed, whole process group, at the end: frozen ones too."""
    started: list[PluginWorker] = []
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(settings: Settings, name: str, concurrency: int = 3, *, queues=None,
              pool: str = "prefork", path_first=(), env=None, **options) -> PluginWorker:
        worker = PluginWorker(
            settings, name=name, concurrency=concurrency, log_dir=str(logs), loglevel="INFO",
            extra_env={"PYTHONPATH": plugins_path(*map(str, path_first)), **(env or {})},
            queues=queues, pool=pool, **options,
        )
        started.append(worker.start())
        return worker

    yield start
    kill_all(started)


@pytest.fixture
def workers(start_worker):
    """:func:`start_worker` under the name most crawl tests use."""
    return start_worker


@pytest.fixture
def server():
    """The pipeline tests' site (``tests.support.pipeline.ROUTES``) on 127.0.0.1."""
    with RouteServer(ROUTES) as server:
        yield server
