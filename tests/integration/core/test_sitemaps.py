"""Sitemaps crawled as a job's items: robots.txt lists a sitemap index of two sitemaps (one
gzipped), whose pages nothing links to. ``follow`` finds them and their links, ``ignore`` reads
no sitemap, ``only`` crawls the seed and the listed pages and nothing they link to; a missing
sitemap ends nothing badly, and a sitemap past 50,000 entries is cut there. Real Redis, real
HTTP on 127.0.0.1, the pipeline run inline."""

from __future__ import annotations

import gzip

import pytest

from distscrape_celery.core.runtime import Runtime
from distscrape_celery.job.spec import build_spec
from distscrape_celery.web.sitemap_items import SITEMAP_MARKER
from distscrape_celery.web.sitemaps import MAX_SITEMAP_URLS
from tests.support.cli import assert_one_line_error, run
from tests.support.crawl import crawl_settings
from tests.support.crawl_command import Crawl
from tests.support.http import reply, serve
from tests.support.pipeline import crawl_inline

HTML = {"Content-Type": "text/html"}
XML = {"Content-Type": "application/xml"}
NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
HIDDEN = [f"/hidden/{n}.html" for n in range(1, 5)]  # listed by the sitemaps, linked from nowhere
CHILDREN = [f"/child/{n}.html" for n in range(1, 5)]  # linked from the hidden pages only


def urlset(base: str, paths: list[str], extra: str = "") -> bytes:
    entries = "".join(f"<url><loc>{base}{p}</loc><lastmod>2024-05-01</lastmod></url>"
                      for p in paths)
    return f'<?xml version="1.0"?><urlset {NS}>{entries}{extra}</urlset>'.encode()


def page(*hrefs: str) -> bytes:
    return ("<html>" + "".join(f'<a href="{h}">x</a>' for h in hrefs) + "</html>").encode()


def site_routes(routes: dict) -> dict:
    """The test site once its base URL is known: ``/`` links to /linked.html; robots.txt lists
    an index (of /sm/a.xml and the gzipped /sm/b.xml.gz, with an off-host sitemap), a sitemap
    that is not there and one it disallows."""
    def build(base: str) -> None:
        index = (f'<?xml version="1.0"?><sitemapindex {NS}>'
                 f"<sitemap><loc>{base}/sm/a.xml</loc></sitemap>"
                 f"<sitemap><loc>{base}/sm/b.xml.gz</loc></sitemap>"
                 "<sitemap><loc>http://elsewhere.invalid/sm.xml</loc></sitemap>"
                 "</sitemapindex>").encode()
        a = urlset(base, HIDDEN[:2], extra="<url><lastmod>2024-01-01</lastmod></url>"
                   "<url><loc>http://elsewhere.invalid/x.html</loc></url>")
        b = gzip.compress(urlset(base, HIDDEN[2:]))
        robots = (b"User-agent: *\nDisallow: /private/\nSitemap: /index.xml\n"
                  b"Sitemap: /missing.xml\nSitemap: /private/sm.xml\n")
        routes.update({
            "/robots.txt": lambda h: reply(h, 200, robots, {"Content-Type": "text/plain"}),
            "/index.xml": lambda h: reply(h, 200, index, XML),
            "/sm/a.xml": lambda h: reply(h, 200, a, XML),
            "/sm/b.xml.gz": lambda h: reply(h, 200, b, {"Content-Type": "application/gzip"}),
            "/": lambda h: reply(h, 200, page("/linked.html"), HTML),
            "/linked.html": lambda h: reply(h, 200, page("/"), HTML),
        })
        for hidden, child in zip(HIDDEN, CHILDREN):
            routes[hidden] = lambda h, c=child: reply(h, 200, page(c), HTML)
            routes[child] = lambda h: reply(h, 200, page("/"), HTML)
    return build


def crawl(redis_url, tmp_path, job: str, sitemaps: dict, routes: dict, build=None, **more):
    """Crawl the site from ``/`` with the spec's ``sitemaps`` section (and ``more`` of the
    spec); returns the stats, the paths requested (robots.txt aside), the tracker and the base
    URL."""
    with serve(routes) as (base, _, log):
        (build or site_routes(routes))(base)
        spec = build_spec({"seeds": [base + "/"], "max_retries": 0, "sitemaps": sitemaps,
                           "saver": {"output": str(tmp_path / job)}, **more})
        rt = Runtime.for_redis(crawl_settings(redis_url, lease_seconds=30))
        stats = crawl_inline(rt, job, spec, max_tasks=2000, timeout=60)
    paths = [entry["path"] for entry in log if entry["path"] != "/robots.txt"]
    return stats, paths, rt.tracker, base


def saved(tmp_path, job: str) -> set[str]:
    """The paths saved under the job's output (the files saver: host/path)."""
    root = tmp_path / job
    return {"/" + str(p.relative_to(root)).split("/", 1)[1] for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("obey_robots", [True, False])
def test_follow_crawls_the_pages_only_sitemaps_list_and_their_links(redis_url, tmp_path,
                                                                    obey_robots):
    """Also for a job that ignores robots.txt: its Sitemap lines are read all the same, and the
    sitemap it disallows is read too (it is not there)."""
    stats, paths, tracker, base = crawl(redis_url, tmp_path, "follow", {"mode": "follow"}, {},
                                        fetch={"obey_robots": obey_robots})
    pages = {"/index.html", "/linked.html", *HIDDEN, *CHILDREN}
    assert saved(tmp_path, "follow") == pages
    # Each sitemap read once, the missing one asked once and done, not dead; nothing saved of
    # them; the one robots.txt disallows never asked for.
    sitemap_files = ["/index.xml", "/missing.xml", "/sm/a.xml", "/sm/b.xml.gz"]
    if not obey_robots:
        sitemap_files.insert(2, "/private/sm.xml")
    assert sorted(p for p in paths if p not in {"/", *pages}) == sitemap_files
    assert len(paths) == len(set(paths))
    assert stats.dead == 0, tracker.dead_items("follow")
    assert stats.done == len(pages) + len(sitemap_files)
    assert stats.seen == stats.done  # the off-host and malformed entries were never items


def test_ignore_reads_no_sitemap(redis_url, tmp_path):
    stats, paths, tracker, _ = crawl(redis_url, tmp_path, "ignore", {"mode": "ignore"}, {})
    assert sorted(paths) == ["/", "/linked.html"]
    assert stats.done == 2 and stats.dead == 0
    # The section at its default leaves the stored spec as it was before sitemaps existed.
    assert "sitemaps" not in tracker.load_spec("ignore")


def test_only_crawls_the_seed_and_the_listed_pages_and_none_of_their_links(redis_url, tmp_path):
    stats, paths, tracker, _ = crawl(redis_url, tmp_path, "only", {"mode": "only"}, {})
    assert saved(tmp_path, "only") == {"/index.html", *HIDDEN}
    assert "/linked.html" not in paths and not set(CHILDREN) & set(paths)
    assert stats.dead == 0, tracker.dead_items("only")


def test_max_depth_0_reads_no_index_and_the_host_total_cuts_entries(redis_url, tmp_path):
    """With max_depth 0 the index robots.txt lists gives no sitemap; with a host total of 3
    entries, the index's 2 in-scope sitemaps and 1 of their 4 pages are taken."""
    _, paths, _, _ = crawl(redis_url, tmp_path, "shallow", {"mode": "only", "max_depth": 0}, {})
    assert sorted(paths) == ["/", "/index.xml", "/missing.xml"]
    stats, paths, _, _ = crawl(redis_url, tmp_path, "capped",
                               {"mode": "only", "max_urls_per_host": 3}, {})
    assert len(set(HIDDEN) & set(paths)) == 1
    assert stats.dead == 0


def test_a_sitemap_past_50000_entries_is_cut_there(redis_url, tmp_path):
    """Entry 50,000 is crawled, entry 50,001 is not (the others are denied by a pattern)."""
    routes: dict = {}

    def build(base: str) -> None:
        skipped = [f"/skip/{n}" for n in range(MAX_SITEMAP_URLS - 1)]
        big = gzip.compress(urlset(base, [*skipped, "/edge.html", "/last.html"]))
        robots = b"User-agent: *\nSitemap: /big.xml.gz\n"
        routes.update({
            "/robots.txt": lambda h: reply(h, 200, robots, {"Content-Type": "text/plain"}),
            "/big.xml.gz": lambda h: reply(h, 200, big, {"Content-Type": "application/gzip"}),
            "/": lambda h: reply(h, 200, page(), HTML),
            "/edge.html": lambda h: reply(h, 200, page(), HTML),
            "/last.html": lambda h: reply(h, 200, page(), HTML),
        })

    with serve(routes) as (base, _, log):
        build(base)
        # Matching 50,000 entries against the pattern takes about a second; on a loaded machine
        # longer than the default budget, which would cut the sitemap's entries short.
        spec = build_spec({"seeds": [base + "/"], "max_retries": 0,
                           "scraper": {"deny_regex": ["/skip/"], "regex_seconds": 60},
                           "sitemaps": {"mode": "only"}, "saver": {"output": str(tmp_path / "o")}})
        rt = Runtime.for_redis(crawl_settings(redis_url, lease_seconds=30))
        stats = crawl_inline(rt, "big", spec, timeout=60)
    paths = [entry["path"] for entry in log]
    assert "/edge.html" in paths and "/last.html" not in paths
    assert stats.dead == 0 and stats.done == 3  # the seed, the sitemap, the edge page


@pytest.mark.parametrize("status", [403, 503])
def test_a_sitemap_that_fails_otherwise_is_dead_with_its_reason(redis_url, tmp_path, status):
    """Not 404 or 410: the sitemap item is retried as a page would be, then dead, and the crawl
    of the rest goes on."""
    routes: dict = {}

    def build(base: str) -> None:
        routes.update({
            "/robots.txt": lambda h: reply(h, 200, b"Sitemap: /sm.xml\n", {"Content-Type": "text/plain"}),
            "/sm.xml": lambda h: reply(h, status, b"no"),
            "/": lambda h: reply(h, 200, page("/linked.html"), HTML),
            "/linked.html": lambda h: reply(h, 200, page(), HTML),
        })

    stats, paths, tracker, base = crawl(redis_url, tmp_path, f"fails{status}", {"mode": "follow"},
                                        routes, build)
    dead = tracker.dead_items(f"fails{status}")
    assert list(dead) == [f"{base}/sm.xml{SITEMAP_MARKER}"]
    assert f"HTTP {status}" in dead[f"{base}/sm.xml{SITEMAP_MARKER}"]
    assert stats.done == 2


@pytest.mark.parametrize("in_memory", [False, True])
def test_the_crawl_command_takes_only_the_listed_pages_with_sitemaps_only(tmp_path, in_memory):
    """`distscrape crawl --sitemaps only`: real worker processes and the embedded Redis (or
    the in-memory tracker), saving inline; the exit status is 0 (the missing sitemap is no dead
    item)."""
    routes: dict = {}
    with serve(routes) as (base, _, log):
        site_routes(routes)(base)
        out = tmp_path / "out"
        crawl = Crawl(tmp_path, base + "/", out, "--sitemaps", "only",
                      *(["--in-memory"] if in_memory else []))
        assert crawl.wait(120) == 0, crawl.stderr
    assert {"/" + str(p.relative_to(out)).split("/", 1)[1] for p in out.rglob("*")
            if p.is_file()} == {"/index.html", *HIDDEN}
    paths = [entry["path"] for entry in log]
    assert "/linked.html" not in paths and "/sm/b.xml.gz" in paths


def test_the_sitemap_options_are_checked_and_named():
    for args, fragment in [(("--sitemaps", "all"), "'all' is not one of 'ignore', 'follow', 'only'"),
                           (("--max-sitemap-depth", "9"), "'--max-sitemap-depth'"),
                           (("--max-sitemap-urls", "0"), "'--max-sitemap-urls'")]:
        res = run("seed", "j", "http://127.0.0.1:9/", *args)
        assert res.returncode == 2 and fragment in res.stderr, res.stderr
    assert_one_line_error(
        run("seed", "j", "1", "--sitemaps", "follow", "--scraper", "ids", "--id-regex", "x",
            "--download-url-fmt", "http://127.0.0.1:9/{id}"),
        "--sitemaps: mode 'follow' needs a scraper of URLs", "ids scraper (--scraper)")
