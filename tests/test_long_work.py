"""Work that outlasts the lease keeps its lease while its worker lives: fetched once, not stolen."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from conftest import crawl_settings

from distscrape_celery.celery_app import configure_app
from distscrape_celery.jobspec import build_spec
from distscrape_celery.local import wait_for_workers
from distscrape_celery.manager import CrawlManager
from distscrape_celery.tasks import publisher
from distscrape_celery.tracker import RedisTracker

LEASE = 1.0
SLOW = 4 * LEASE


class SlowPage(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self):
        SlowPage.hits.append(self.path)
        if self.path == "/slow":
            time.sleep(SLOW)
        body = b'<a href="/slow">slow</a>' if self.path == "/" else b"done at last"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_download_longer_than_the_lease_is_not_reclaimed(redis_url, workers, tmp_path):
    settings = crawl_settings(redis_url, lease_seconds=LEASE)
    # Two workers: had the slow item's lease lapsed, the idle one would have fetched it again.
    procs = [workers(settings, f"long-{i}", concurrency=2) for i in range(2)]
    tracker = RedisTracker.from_url(redis_url)
    wait_for_workers(tracker, 2, procs=procs)
    configure_app(settings)
    SlowPage.hits = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), SlowPage)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        spec = build_spec({"seeds": [base + "/"], "saver": {"output": str(tmp_path / "out")}})
        manager = CrawlManager(tracker, publisher.scrape)
        manager.seed("long", spec)
        stats = manager.wait("long", timeout=60)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert (stats.done, stats.dead) == (2, 0), tracker.dead_items("long")
    assert SlowPage.hits.count("/slow") == 1
    assert (tmp_path / "out").is_dir()
