"""Crawls into tar and WARC shards with real worker processes, and a worker SIGKILLed mid-write."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.support.crawl import check_all, crawl_settings, registered_id, sigkill_mid_crawl
from tests.support.saving import GNU_TAR_FLAG
from distscrape_celery.testing.sitegen import SiteServer, generate_site
from tests.support.tracker_state import live_items
from warcio.archiveiterator import ArchiveIterator

from distscrape_celery.worker.app import configure_app
from distscrape_celery.job.spec import build_spec
from distscrape_celery.tracker.keys import JobKeys
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.savers import FileItemSaver, tar_index
from distscrape_celery.savers.tar import TarShard, tar_shards
from distscrape_celery.savers.warc import warc_shards
from distscrape_celery.worker.publish import publisher
from distscrape_celery.tracker import RedisTracker
from distscrape_celery.tracker.model import LeaseStatus

LEASE = 2.0
SHARD_ITEMS = 7  # small, so that real crawls rotate shards too


@pytest.fixture(scope="module")
def archive_site():
    """A 60-page site with 4 pages no link reaches: an archive must hold none of them."""
    return generate_site(n_pages=60, seed=23, unreachable=4)


def _start(redis_url, workers, names, concurrency=2, **settings_overrides):
    settings = crawl_settings(redis_url, **settings_overrides)
    tracker = RedisTracker.from_url(redis_url)
    procs = [workers(settings, name, concurrency=concurrency) for name in names]
    wait_for_workers(tracker, len(procs), procs=procs)
    configure_app(settings)
    return settings, tracker, procs


def tar_records(output, strict: bool = True) -> dict[str, list]:
    """item -> every record of it in the output's shards (duplicates included); with
    ``strict``, checking that every shard reads cleanly to its end."""
    out: dict[str, list] = {}
    for shard in tar_shards(output):
        reader = TarShard(shard)
        for record in reader:
            out.setdefault(record.item, []).append(record)
        assert not (strict and reader.torn), shard
    return out


def warc_bodies(output) -> dict[str, list[bytes]]:
    """item -> the bodies of its response records, read with warcio's own ArchiveIterator."""
    out: dict[str, list[bytes]] = {}
    for shard in warc_shards(output):
        with open(shard, "rb") as fh:
            for record in ArchiveIterator(fh):
                if record.rec_type != "response":
                    continue
                item = record.rec_headers.get_header("DISTSCRAPE-Item")
                assert record.rec_headers.get_header("WARC-Target-URI") == item
                assert record.http_headers.get_statuscode() == "200"
                out.setdefault(item, []).append(record.content_stream().read())
    return out


@pytest.mark.parametrize("kind,ext", [
    ("tar", ".tar.gz"), ("tar", ".tar"), ("tar", ".tar.bz2"), ("warc", ".warc.gz"),
])
def test_crawl_into_archive_shards(redis_url, workers, tmp_path, archive_site, kind, ext):
    site = archive_site
    _, tracker, procs = _start(redis_url, workers, ["arch-a", "arch-b"], lease_seconds=30)
    output = tmp_path / "archive" / f"site{ext}"
    with SiteServer(site) as server:
        spec = build_spec({"seeds": [server.url("/")], "saver": {
            "kind": kind, "output": str(output), "shard_max_items": SHARD_ITEMS,
        }})
        manager = CrawlManager(tracker, publisher.scrape)
        manager.seed("archive", spec)
        stats = manager.wait("archive", timeout=120, check=check_all(procs))
    n = len(site.reachable)
    assert (stats.done, stats.dead, stats.seen) == (n, 0, n)
    expected = {server.url(p): site.pages[p] for p in site.reachable}

    # Read while the workers still run: every saved item is on disk already.
    if kind == "tar":
        records = tar_records(output)
        assert {item: [r.body for r in recs] for item, recs in records.items()} == {
            item: [body] for item, body in expected.items()
        }
        namer = FileItemSaver(output.parent, job="archive")
        for item, (record,) in records.items():
            assert record.name == namer.name_for(item).as_posix()
            assert (record.url, record.status) == (item, 200)
            assert record.content_type.startswith("text/html")
    else:
        assert warc_bodies(output) == {item: [body] for item, body in expected.items()}

    shards = tar_shards(output) if kind == "tar" else warc_shards(output)
    assert len(shards) >= n // SHARD_ITEMS
    workers_seen = {re.match(r"site-([^-]+)-", s.name).group(1) for s in shards}
    assert len(workers_seen) == 2  # each worker wrote shards of its own

    # A clean stop closes every pool process's saver: each tar shard gets its end marker.
    for p in procs:
        p.stop(timeout=20)
    if kind == "tar":
        for shard in tar_shards(output):
            reader = TarShard(shard)
            assert len(list(reader)) <= SHARD_ITEMS
            assert reader.finished and not reader.torn, shard
        if shutil.which("tar") and (ext != ".tar.bz2" or shutil.which("bzip2")):
            flag = GNU_TAR_FLAG[ext]
            listed = []
            for shard in tar_shards(output):
                res = subprocess.run(
                    ["tar", "--warning=no-unknown-keyword", f"-t{flag}f", str(shard)],
                    capture_output=True, text=True, timeout=30,
                )
                assert res.returncode == 0, res.stderr
                listed += res.stdout.splitlines()
            assert sorted(listed) == sorted(namer.name_for(i).as_posix() for i in expected)
    else:
        assert warc_bodies(output) == {item: [body] for item, body in expected.items()}


def _shards_of(output: Path, worker_id: str) -> list[Path]:
    return [s for s in tar_shards(output) if s.name.startswith(f"{output.name[:-7]}-{worker_id}-")]


def test_worker_sigkilled_while_writing_tar_shards(redis_url, redis_client, workers, tmp_path):
    site = generate_site(n_pages=120, seed=31, unreachable=4)
    n = len(site.reachable)
    _, tracker, procs = _start(
        redis_url, workers, ["tar-victim", "tar-survivor"], concurrency=3, lease_seconds=LEASE,
    )
    victim, survivor = procs
    victim_id = registered_id(tracker, victim)
    output = tmp_path / "site.tar.gz"
    job = "tarcrash"

    with SiteServer(site, delay=0.05) as server:
        spec = build_spec({"seeds": [server.url("/")], "saver": {
            "kind": "tar", "output": str(output), "shard_max_items": SHARD_ITEMS,
        }})
        manager = CrawlManager(tracker, publisher.scrape)
        manager.seed(job, spec)
        # Kill while the victim holds items and has written shards.
        done_at_kill = sigkill_mid_crawl(
            tracker, redis_client, job, victim, survivor, done=n // 3,
            also=lambda: any(s.stat().st_size for s in _shards_of(output, victim_id)))
        replacement = workers(crawl_settings(redis_url, lease_seconds=LEASE), "tar-replacement", concurrency=3)
        stats = manager.wait(job, timeout=120, check=check_all([survivor, replacement]))

    assert done_at_kill < n
    assert (stats.done, stats.dead, stats.seen) == (n, 0, n)
    expected = {server.url(p): site.pages[p] for p in site.reachable}

    # Every item the tracker marks done is in some shard, and every reachable page is there,
    # with its bytes (a duplicate, if any, holds the same bytes).
    # Done items leave the live items (only the seen set remembers them): nothing is left
    # live, and a checkout of every reachable page says it is done.
    assert live_items(redis_client, job) == {}
    assert not list(redis_client.scan_iter(match=JobKeys(job).item_buckets + "*"))
    done = {item for item in expected
            if tracker.checkout(job, item, "probe", max_lost=10).status is LeaseStatus.DONE}
    assert done == set(expected)
    index = {item: (shard, name) for item, shard, name in tar_index(output)}
    assert done <= set(index)
    records = tar_records(output, strict=False)
    assert set(records) == set(expected)
    for item, recs in records.items():
        assert all(r.body == expected[item] for r in recs), item

    # The killed worker's shards read up to their last complete member; the ones its pool
    # processes were writing when killed never got an end marker.
    victim_shards = _shards_of(output, victim_id)
    assert victim_shards
    unfinished = 0
    for shard in victim_shards:
        reader = TarShard(shard)
        got = list(reader)
        assert all(r.body == expected[r.item] for r in got)
        unfinished += not reader.finished
        if shutil.which("tar") and not reader.torn:
            res = subprocess.run(
                ["tar", "--warning=no-unknown-keyword", "-tzf", str(shard)],
                capture_output=True, text=True, timeout=30,
            )
            assert res.stdout.splitlines() == [r.name for r in got], res.stderr
    assert unfinished >= 1
    print(f"\ntar crash test: killed at {done_at_kill}/{n} done, victim shards "
          f"{len(victim_shards)} ({unfinished} unfinished), duplicates "
          f"{sum(len(r) - 1 for r in records.values())}")
