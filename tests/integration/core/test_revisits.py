"""Recurring crawls that fetch only what changed: ``distscrape crawl --revisit`` run again on a
site that changed in between (real worker processes, the embedded Redis, real HTTP on
loopback). The second run saves exactly the changed and added pages, counted from the output,
whether the server sends validators (ETag, Last-Modified: answered with 304) or not (digests)."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from distscrape_celery.savers import FileItemSaver
from distscrape_celery.testing.sitegen import SiteServer, evolve_site, generate_site
from tests.support.cli import run


def _inodes(output: Path) -> dict[str, int]:
    return {str(p.relative_to(output)): p.stat().st_ino for p in output.rglob("*")
            if p.is_file() and not p.name.startswith(".~tmp-")}


def _crawl(server, out: Path):
    res = run("crawl", server.url("/"), "--output", str(out), "--quiet", "--concurrency", "4",
              "--revisit", timeout=180)
    assert res.returncode == 0, (res.stdout, res.stderr)
    return res


@pytest.mark.parametrize("validators", [True, False], ids=["etag", "digest"])
def test_a_second_run_saves_exactly_what_changed(tmp_path, validators):
    site = generate_site(120, seed=3, unreachable=0)
    with SiteServer(site, validators=validators) as server:
        out = tmp_path / "out"
        first = _crawl(server, out)
        assert "generation" not in first.stderr
        saver = FileItemSaver(str(out))
        name = {path: str(saver.name_for(server.url(path))) for path in site.reachable}
        before = _inodes(out)
        assert set(before) == set(name.values())
        bytes_first = server.body_bytes
        requests_first = len(server.requests)

        change = evolve_site(site, seed=1)
        server.replace_site(change.site)
        second = _crawl(server, out)
        assert "generation 2" in second.stderr, second.stderr
        after = _inodes(out)
        rewritten = {path for path, ino in after.items() if before.get(path) != ino}
        added_names = {str(saver.name_for(server.url(p))) for p in change.added}
        assert rewritten == {name[p] for p in change.changed} | added_names
        # Every saved page is the site as it is now.
        for path in change.changed | change.added:
            file = out / str(saver.name_for(server.url(path)))
            assert file.read_bytes() == change.site.pages[path]
        # Every known page was asked again, each once; the removed ones too (gone).
        second_requests = server.requests[requests_first:]
        assert sorted(second_requests) == sorted(site.reachable | change.added)
        if validators:
            sent = server.body_bytes - bytes_first
            assert sent <= 0.15 * bytes_first, (sent, bytes_first)
        assert f"({len(site.reachable) - len(change.changed) - len(change.removed)} unchanged, "\
            f"{len(change.removed)} gone)" in second.stdout, second.stdout


@pytest.mark.parametrize("validators", [True, False], ids=["etag", "digest"])
def test_archives_keep_every_capture_and_warc_records_the_revisits(tmp_path, validators):
    """A tar or WARC output is appended to: generation 2 adds its changed and added pages as
    new captures beside the first ones, and the WARC saver records each unchanged page as a
    revisit record (server-not-modified after a 304, identical-payload-digest otherwise)."""
    import tarfile

    from warcio.archiveiterator import ArchiveIterator

    site = generate_site(40, seed=5, unreachable=0)
    change = evolve_site(site, seed=2)
    unchanged = len(site.reachable) - len(change.changed) - len(change.removed)
    with SiteServer(site, validators=validators) as server:
        tar, warc = tmp_path / "site.tar", tmp_path / "site.warc.gz"
        for out in (tar, warc):
            _crawl(server, out)
        server.replace_site(change.site)
        for out in (tar, warc):
            _crawl(server, out)
    members = tarfile.open(tar).getmembers()
    assert len(members) == len(site.reachable) + len(change.changed) + len(change.added)
    with open(warc, "rb") as fh:
        records = [(r.rec_type, r.rec_headers.get_header("WARC-Profile") or "")
                   for r in ArchiveIterator(fh)]
    responses = [r for r in records if r[0] == "response"]
    revisits = [profile for kind, profile in records if kind == "revisit"]
    assert len(responses) == len(site.reachable) + len(change.changed) + len(change.added)
    profile = "server-not-modified" if validators else "identical-payload-digest"
    assert len(revisits) == unchanged and all(p.endswith(profile) for p in revisits), revisits


def _run_generation(tracker, manager, job: str, procs, timeout: float = 120):
    from distscrape_celery.core.schedules import run_again
    from tests.support.crawl import check_all

    result = run_again(tracker, job, manager.publish)
    assert result.started, result
    return manager.wait(job, timeout=timeout, check=check_all(procs))


def _workers_and_manager(redis_url, workers, n: int = 2):
    from distscrape_celery.core.manager import CrawlManager
    from distscrape_celery.local.processes import wait_for_workers
    from distscrape_celery.tracker import RedisTracker
    from distscrape_celery.worker.app import configure_app
    from distscrape_celery.worker.publish import publisher
    from tests.support.crawl import crawl_settings

    settings = crawl_settings(redis_url)
    procs = [workers(settings, f"w{i}") for i in range(n)]
    tracker = RedisTracker.from_url(redis_url)
    wait_for_workers(tracker, n, procs=procs)
    configure_app(settings)
    return tracker, CrawlManager(tracker, publisher.scrape), procs


def test_workers_that_stay_up_crawl_every_generation_whole(redis_url, workers, tmp_path):
    """A job without revisits fetches every page again in its next generation, on the same
    worker processes: nothing a worker kept of the last generation (the links it knows it
    added) holds the new one back."""
    from distscrape_celery.job.spec import build_spec
    from tests.support.crawl import check_all

    site = generate_site(60, seed=8, unreachable=0)
    tracker, manager, procs = _workers_and_manager(redis_url, workers)
    with SiteServer(site) as server:
        spec = build_spec({"seeds": [server.url("/")], "saver": {"output": str(tmp_path / "o")}})
        manager.seed("j", spec)
        manager.wait("j", timeout=120, check=check_all(procs))
        stats = _run_generation(tracker, manager, "j", procs)
        assert stats.done == len(site.reachable)
        assert server.counts() == {path: 2 for path in site.reachable}


def test_a_sitemap_lastmod_makes_a_known_page_due(redis_url, workers, tmp_path):
    """In a job that revisits every week, generation 2 fetches only the known page whose
    sitemap entry says it changed since it was fetched (and the sitemap itself)."""
    from distscrape_celery.job.spec import build_spec
    from tests.support.crawl import check_all
    from tests.support.http import RouteServer

    pages = {f"/p{i}.html": f"<html><body>page {i}</body></html>".encode() for i in range(5)}
    lastmod = {path: "2000-01-01" for path in pages}

    def sitemap():
        rows = "".join(f"<url><loc>{server.base}{p}</loc><lastmod>{lastmod[p]}</lastmod></url>"
                       for p in pages)
        return ('<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                f"{rows}</urlset>").encode()

    def routes(path: str, _n: int):
        if path in pages:
            return 200, pages[path], {}, 0
        if path == "/robots.txt":
            return 200, f"Sitemap: {server.base}/sitemap.xml\n".encode(), {}, 0
        if path == "/sitemap.xml":
            return 200, sitemap(), {}, 0
        return (200, b"<html>home</html>", {}, 0) if path == "/" else (404, b"", {}, 0)

    tracker, manager, procs = _workers_and_manager(redis_url, workers)
    with RouteServer(routes) as server:
        spec = build_spec({"seeds": [server.base + "/"], "saver": {"output": str(tmp_path / "o")},
                           "sitemaps": {"mode": "follow"},
                           "revisit": {"interval": "7d"}})
        manager.seed("j", spec)
        manager.wait("j", timeout=120, check=check_all(procs))
        first = collections.Counter(server.hits)
        assert all(first[path] == 1 for path in pages)
        lastmod["/p3.html"] = "2100-01-01"
        _run_generation(tracker, manager, "j", procs)
        second = collections.Counter(server.hits) - first
        assert {path: n for path, n in second.items() if path in pages} == {"/p3.html": 1}
        assert second["/sitemap.xml"] == 1


def test_a_run_that_finds_nothing_due_ends(tmp_path):
    """With a revisit interval of a day, the runs after the first find nothing due but their
    seed (every generation fetches its seeds): each starts its generation, fetches the seed
    alone, finds it unchanged, saves nothing and ends."""
    site = generate_site(20, seed=5, unreachable=0)
    with SiteServer(site) as server:
        out = tmp_path / "out"

        def crawl():
            return run("crawl", server.url("/"), "--output", str(out), "--quiet",
                       "--concurrency", "2", "--revisit", "--revisit-interval", "1d", timeout=90)

        first = crawl()
        assert first.returncode == 0, (first.stdout, first.stderr)
        before, requests = _inodes(out), len(server.requests)
        for generation in (2, 3):
            again = crawl()
            assert again.returncode == 0, (again.stdout, again.stderr)
            assert f"generation {generation}" in again.stderr, again.stderr
            assert ": 0 saved (1 unchanged, 0 gone), 0 dead, 1 seen in" in again.stdout, \
                again.stdout
        assert server.requests[requests:] == ["/", "/"] and _inodes(out) == before


def test_a_304_keeps_its_connection_for_the_next_request():
    """A conditional request answered 304 hands its connection back to the pool: a generation
    of revisits on one host reuses a connection, as a crawl of new pages does (closed unread,
    it opened a connection a page)."""
    from distscrape_celery.job.sections import FetchSpec
    from distscrape_celery.web.fetch import Fetcher, conditional

    site = generate_site(5, seed=1, unreachable=0)
    with SiteServer(site, validators=True) as server:
        opened = []
        track = server._track
        server._track = lambda conn, add: (opened.append(add), track(conn, add))
        fetcher = Fetcher(FetchSpec())
        first = fetcher.get(server.url("/"))
        for _ in range(10):
            with conditional(first.etag):
                assert fetcher.get(server.url("/")).not_modified
        assert opened.count(True) == 1
