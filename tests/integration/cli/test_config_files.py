"""The job files in config/ are valid and do what they say, through real workers on loopback.

Each file names public example hosts; the tests keep everything else from the file and point
only the seeds (and the ID URL template) at sites served on 127.0.0.1.
"""

from __future__ import annotations

import json

import pytest

from tests.support.crawl import crawl_settings, expected_files, saved_files
from distscrape_celery.testing.sitegen import SiteServer, generate_site
from tests.support.http import IdSite
from tests.support import REPO_ROOT

from distscrape_celery.worker.app import configure_app
from distscrape_celery.job.spec import build_spec, load_config_file
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.savers import tar_index
from distscrape_celery.savers.tar import TarShard, tar_shards
from distscrape_celery.savers.warc import warc_shards
from distscrape_celery.worker.publish import publisher
from distscrape_celery.tracker import RedisTracker

CONFIG = REPO_ROOT / "config"


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIG.glob("*.toml")))
def test_every_job_file_is_valid(name):
    spec = build_spec(load_config_file(CONFIG / name))
    assert spec.seeds


@pytest.fixture
def crawl(redis_url, workers):
    settings = crawl_settings(redis_url, lease_seconds=5)
    tracker = RedisTracker.from_url(redis_url)
    procs = [workers(settings, "cfg-a", concurrency=2), workers(settings, "cfg-b", concurrency=2)]
    wait_for_workers(tracker, 2, procs=procs)
    configure_app(settings)

    def run(job, data):
        manager = CrawlManager(tracker, publisher.scrape)
        manager.seed(job, build_spec(data))
        return manager.wait(job, timeout=90)

    return run


def test_site_mirror(crawl, tmp_path):
    data = load_config_file(CONFIG / "site-mirror.toml")
    site = generate_site(n_pages=60, seed=31, unreachable=3)
    with SiteServer(site) as server:
        data["seeds"] = [server.url("/")]
        del data["scraper"]["link_regex"]
        data["saver"]["output"] = str(tmp_path / "mirror")
        stats = crawl("mirror", data)
    assert (stats.done, stats.dead) == (len(site.reachable), 0)
    out = tmp_path / "mirror"
    assert saved_files(out) == expected_files(server, site, out)


def test_id_discovery_into_tar_shards(crawl, tmp_path):
    data = load_config_file(CONFIG / "id-discovery.toml")
    site = IdSite(seed=8)
    try:
        data["seeds"] = [f"{site.base}/list/{n}" for n in site.lists]
        data["scraper"]["download_url_fmt"] = site.base + "/item/{id}.json"
        data["saver"]["output"] = str(tmp_path / "items.tar.gz")
        stats = crawl("items", data)
    finally:
        site.close()
    assert stats.dead == 0 and stats.done == len(site.reachable) + len(site.lists)
    indexed = {item for item, _, _ in tar_index(tmp_path / "items.tar.gz")}
    assert indexed >= site.reachable
    bodies = {r.item: r.body for shard in tar_shards(tmp_path / "items.tar.gz")
              for r in TarShard(shard)}
    for i in site.reachable:
        assert json.loads(bodies[i])["id"] == i


def test_warc_archive(crawl, tmp_path):
    from warcio.archiveiterator import ArchiveIterator

    data = load_config_file(CONFIG / "warc-archive.toml")
    site = generate_site(n_pages=40, seed=32, unreachable=0)
    with SiteServer(site) as server:
        data["seeds"] = [server.url("/")]
        data["saver"]["output"] = str(tmp_path / "archive.warc.gz")
        stats = crawl("archive", data)
    assert (stats.done, stats.dead) == (len(site.reachable), 0)
    got = {}
    for shard in warc_shards(tmp_path / "archive.warc.gz"):
        with open(shard, "rb") as fh:
            for record in ArchiveIterator(fh):
                if record.rec_type == "response":
                    got[record.rec_headers.get_header("WARC-Target-URI")] = (
                        record.content_stream().read()
                    )
    assert got == {server.url(p): site.pages[p] for p in site.reachable}
