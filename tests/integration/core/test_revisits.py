"""Recurring crawls that fetch only what changed: ``distscrape crawl --revisit`` run again on a
site that changed in between (real worker processes, the embedded Redis, real HTTP on
loopback). The second run saves exactly the changed and added pages, counted from the output,
whether the server sends validators (ETag, Last-Modified: answered with 304) or not (digests)."""

from __future__ import annotations

import os
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


def test_a_run_that_finds_nothing_due_ends(tmp_path):
    """With a revisit interval of a day, the runs after the first find nothing due: each starts
    its generation, fetches nothing, saves nothing and ends (it waited for ever: a generation
    that sees no item never looked finished)."""
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
            assert ": 0 saved, 0 dead, 0 seen in" in again.stdout, again.stdout
            assert "revisiting 20 known page(s) that are due" not in again.stderr
        assert len(server.requests) == requests and _inodes(out) == before
