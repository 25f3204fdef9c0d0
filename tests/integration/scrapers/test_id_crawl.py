"""IDScraper through real workers: listing pages and /item/<id>.json targets on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.crawl import crawl_settings
from tests.support.http import IdSite, RouteServer

from distscrape_celery.worker.app import configure_app
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.worker.publish import publisher
from distscrape_celery.tracker import RedisTracker


def test_every_reachable_id_downloaded_once(redis_url, workers, tmp_path):
    site = IdSite()
    settings = crawl_settings(redis_url, lease_seconds=5)
    tracker = RedisTracker.from_url(redis_url)
    workers(settings, "ids-a", concurrency=2)
    workers(settings, "ids-b", concurrency=2)
    wait_for_workers(tracker, 2)
    configure_app(settings)
    try:
        spec = build_spec({
            "seeds": [f"{site.base}/list/{n}" for n in site.lists],
            "scraper": {"kind": "ids", "id_regex": r'"id": "(\d+)"',
                        "download_url_fmt": site.base + "/item/{id}.json"},
            "saver": {"output": str(tmp_path / "out"), "name_scheme": "{path}"},
        })
        manager = CrawlManager(tracker, publisher.scrape)
        manager.seed("ids", spec)
        stats = manager.wait("ids", timeout=90)
    finally:
        site.close()
    assert stats.dead == 0
    assert stats.done == len(site.reachable) + len(site.lists)
    fetched_items = {p[6:-5] for p in site.hits if p.startswith("/item/")}
    assert fetched_items == site.reachable
    assert all(count == 1 for count in site.hits.values()), site.hits.most_common(3)
    saved = {p.name for p in (tmp_path / "out").iterdir()}
    assert saved >= site.reachable  # IDs are saved under their own names
    for i in site.reachable:
        assert json.loads((tmp_path / "out" / i).read_text())["id"] == i


def test_ids_shaped_like_urls_or_paths_are_fetched_from_the_download_host(tmp_path):
    """A page names IDs that look like a URL on another host and like a path: each is fetched
    from the download URL's host, escaped into its one segment, and nothing else is fetched."""
    ids = ["http://other.invalid/x", "../../etc", "7"]
    listing = json.dumps([{"id": i} for i in ids]).encode()
    with RouteServer(lambda path, n: (200, listing if path == "/list" else b"{}", {}, 0)) as server:
        job = tmp_path / "job.toml"
        job.write_text("max_retries = 0\n")
        res = subprocess.run(
            [sys.executable, "-m", "distscrape_celery.cli", "crawl", "--in-memory",
             server.base + "/list", "--scraper", "ids", "--id-regex", r'"id": "([^"]*)"',
             "--download-url-fmt", server.base + "/item/{}", "--config", str(job),
             "--output", str(tmp_path / "out")],
            capture_output=True, text=True, timeout=120,
            env={k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")},
        )
        hits = sorted(server.page_hits)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert "4 saved, 0 dead" in res.stdout
    assert hits == ["/item/..%2F..%2Fetc", "/item/7", "/item/http%3A%2F%2Fother.invalid%2Fx",
                    "/list"]
