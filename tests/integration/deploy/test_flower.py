"""Flower as the README starts it (basic auth, config/flowerconfig.py) against two real workers
with distinct node names: its API shows both workers and tasks naming their job and URL."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from tests.support.crawl import crawl_settings
from tests.support.ops import free_port, http_get, wait_for
from tests.support.sockets import listening
from distscrape_celery.testing.sitegen import SiteServer, generate_site
from tests.support import REPO_ROOT as ROOT

from distscrape_celery.worker.app import configure_app
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import WorkerProcess, wait_for_workers
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.worker.publish import publisher
from distscrape_celery.tracker import RedisTracker

AUTH = "ops:flower-pw"


def test_flower_shows_two_workers_and_tasks_with_job_and_url(redis_url, tmp_path):
    settings = crawl_settings(redis_url, lease_seconds=10)
    procs = [
        # Without -E, as the README starts them: Flower turns task events on in every worker.
        WorkerProcess(settings, name=f"distscrape-flower{i}", concurrency=2, log_dir=str(tmp_path),
                     loglevel="INFO")
        for i in range(2)
    ]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTSCRAPE_", "FLOWER_"))}
    env.update(settings.to_env(), FLOWER_BASIC_AUTH=AUTH)
    flower_log = (tmp_path / "flower.log").open("wb")
    flower = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "distscrape_celery", "flower",
         f"--conf={ROOT / 'config' / 'flowerconfig.py'}", f"--port={port}"],
        env=env, cwd=str(tmp_path), stdout=flower_log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        for p in procs:
            p.start()
        tracker = RedisTracker.from_url(redis_url)
        wait_for_workers(tracker, 2, procs=procs)
        wait_for("Flower to answer", lambda: http_get(f"{base}/healthcheck")[0] == 200)
        # Started as documented, without --address: the config file keeps it on loopback.
        assert listening(flower.pid).addresses_on(port) == {"127.0.0.1"}

        for path in ("/api/workers", "/api/tasks", "/metrics", "/"):
            assert http_get(base + path)[0] == 401, path
            assert http_get(base + path, "ops:wrong")[0] == 401, path

        def both_workers():
            status, body = http_get(f"{base}/api/workers?refresh=1", AUTH)
            names = set(json.loads(body)) if status == 200 else set()
            return names if len(names) >= 2 else None

        names = wait_for("two workers in Flower", both_workers)
        host = socket.gethostname()
        assert names == {f"distscrape-flower0@{host}", f"distscrape-flower1@{host}"}
        # Flower asks every worker for task events every 5 s (enable_events in flowerconfig.py).
        wait_for("Flower to turn task events on in both workers", lambda: all(
            "enabled by remote" in p.log_path.read_text(errors="replace") for p in procs))

        site = generate_site(n_pages=30, seed=11)
        with SiteServer(site, delay=0.2) as server:
            configure_app(settings)
            spec = build_spec({"seeds": [server.url("/")], "saver": {"output": str(tmp_path / "o")}})
            CrawlManager(tracker, publisher.scrape).seed("flowerjob", spec)

            def scrape_tasks_on_both():
                status, body = http_get(f"{base}/api/tasks", AUTH)
                if status != 200:
                    return None
                tasks = [t for t in json.loads(body).values() if t["name"] == "distscrape.scrape"]
                workers = {t["worker"] for t in tasks}
                return tasks if workers == names else None

            tasks = wait_for("scrape tasks of both workers in Flower", scrape_tasks_on_both)
            for task in tasks:
                args = task["args"]
                assert "'flowerjob'" in args and server.base_url in args, args
            urls = {server.url(p) for p in site.pages}
            assert any(f"'{u}'" in t["args"] for t in tasks for u in urls)

            # Flower's own /metrics answers with the same credentials.
            status, body = http_get(f"{base}/metrics", AUTH)
            assert status == 200 and b"flower_events_total" in body
    finally:
        flower.terminate()
        try:
            flower.wait(15)
        except subprocess.TimeoutExpired:
            flower.kill()
        flower_log.close()
        for p in procs:
            p.stop(timeout=10)
