"""In-process crawl through Celery's own pytest plugin (celery.contrib.pytest, enabled by the
pytest-celery 0.0.0 shim): our app on the in-memory transport with an InMemoryTracker."""

from __future__ import annotations

import pytest

from tests.support.crawl import TEST_OUTPUT_ROOT, expected_files, saved_files

from distscrape_celery.worker.agent import WorkerAgent
from distscrape_celery.worker.app import app, configure_app
from distscrape_celery.job.spec import build_spec
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.core.runtime import Runtime, install_runtime
from distscrape_celery.settings import Settings
from distscrape_celery.worker.publish import publisher


@pytest.fixture(scope="module")
def celery_worker_pool():
    return "threads"


@pytest.fixture(scope="module")
def celery_worker_parameters():
    return {"concurrency": 4, "perform_ping_check": False, "shutdown_timeout": 30}


@pytest.fixture
def runtime():
    settings = Settings.from_env({}, output_roots=TEST_OUTPUT_ROOT)
    configure_app(settings, in_memory=True)
    rt = Runtime.in_memory_runtime(settings)
    install_runtime(rt)
    yield rt
    install_runtime(None)


@pytest.fixture
def celery_app(runtime):
    """Celery's plugin runs the worker for the app this fixture gives: ours."""
    yield app


def test_in_process_worker_crawls_the_site(runtime, celery_worker, site, site_server, tmp_path):
    agent = WorkerAgent(runtime, concurrency=4, publish=publisher.scrape)
    agent.register()
    agent.start()
    try:
        out = tmp_path / "out"
        spec = build_spec({"seeds": [site_server.url("/")], "saver": {"output": str(out)}})
        manager = CrawlManager(runtime.tracker, publisher.scrape)
        manager.seed("mem", spec)
        stats = manager.wait("mem", timeout=120)
    finally:
        agent.stop()
    assert (stats.done, stats.dead) == (len(site.reachable), 0)
    assert saved_files(out) == expected_files(site_server, site, out)
    assert max(site_server.counts().values()) == 1
