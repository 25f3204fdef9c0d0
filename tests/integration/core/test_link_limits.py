"""Limits on what one page's links may cost a worker: over-long links are dropped before any
cache, the caches they pass through are bounded by bytes, a page gives at most
``max_links_per_page`` new items (the rest counted in the job's status, on both trackers), link
extraction stops there or after twice that many hrefs looked at, holding one slice of the page's
hrefs at a time, and user regexes run under a time budget that ends a page's extraction instead
of hanging it."""

from __future__ import annotations

import gc
import json
import logging
import subprocess
import sys
import textwrap
import tracemalloc

import pytest

from tests.support.crawl import crawl_settings
from tests.support.http import RouteServer

from distscrape_celery.core.jobs import job_row
from distscrape_celery.errors import ConfigError
from distscrape_celery.web.fetch import Download
from distscrape_celery.job.spec import build_spec
from distscrape_celery.core.pipeline import ItemPipeline
from distscrape_celery.core.runtime import Runtime
from distscrape_celery.job.urls import Canonicalizer
from distscrape_celery.scrapers import SimpleScraper
from distscrape_celery.web.scope import LinkScope
from tests.support.cli import run
from tests.support.memory import retained_after
from tests.support.pipeline import Recorder

MB = 1024 * 1024


def html_page(url: str, hrefs: list[str]) -> Download:
    body = "<html>" + "".join(f'<a href="{h}">x</a>' for h in hrefs) + "</html>"
    return Download(url=url, status=200, content_type="text/html", body=body.encode())


def test_overlong_links_are_dropped_before_they_are_cached() -> None:
    """1,200 distinct links of 100 KB each, ten a page: none followed, and the scraper keeps
    next to nothing of them (they used to sit in its link and URL caches, ~400 MB)."""
    scraper = SimpleScraper()
    scraper.find_items("http://site.invalid/", html_page("http://site.invalid/", ["/warm"]))

    def crawl() -> None:
        for p in range(120):
            hrefs = [f"/{p}/{n}/" + "y" * 100_000 for n in range(10)]
            url = f"http://site.invalid/dir/{p}.html"
            assert scraper.find_items(url, html_page(url, hrefs)) == []

    held = retained_after(crawl)
    assert held < 2 * MB, f"{held / MB:.1f} MB held after 1,200 dropped links"


def test_link_caches_are_bounded_by_bytes_not_entries() -> None:
    """5,000 distinct links just under the length limit, a few a page: what the caches keep is
    bounded by bytes (it used to be 8,192 entries each, whatever their size)."""
    scraper = SimpleScraper()
    scraper.find_items("http://site.invalid/", html_page("http://site.invalid/", ["/warm"]))
    tail = "z" * 1_900

    def crawl() -> None:
        for p in range(1_000):
            url = f"http://site.invalid/d{p}/page.html"
            hrefs = [f"/{p}/{n}/{tail}" for n in range(5)]
            assert len(scraper.find_items(url, html_page(url, hrefs))) == 5

    held = retained_after(crawl)
    assert held < 16 * MB, f"{held / MB:.1f} MB held by the link caches"


# -- the cap on links per page, through the pipeline and both trackers ------------------------

LINKS_ON_PAGE = 20_000
DEFAULT_CAP = 10_000


def runtime_of(kind: str, request) -> Runtime:
    if kind == "memory":
        return Runtime.in_memory_runtime(crawl_settings("redis://127.0.0.1:9/0", save_batch_size=1))
    redis_url = request.getfixturevalue("redis_url")
    return Runtime.for_redis(crawl_settings(redis_url, save_batch_size=1))


def scrape_one_page(kind, request, tmp_path, caplog, job: str, page: bytes):
    """Seed ``job`` with a site whose one page is ``page`` and scrape it through the pipeline,
    on a tracker of ``kind``, its warnings in ``caplog``: the runtime, to read the job from."""
    with RouteServer({"/": (200, page)}) as server:
        rt = runtime_of(kind, request)
        rt.tracker.register_worker("test", 1, 4)
        spec = build_spec({"seeds": [server.base + "/"], "saver": {"output": str(tmp_path / "out")}})
        rt.tracker.create_job(job, spec.to_json(), spec.crawl_limits())
        rt.tracker.add(job, spec.seeds)
        pipe = ItemPipeline(rt, Recorder())
        with caplog.at_level(logging.WARNING, logger="distscrape_celery.core.pipeline"):
            assert pipe.scrape(job, server.base + "/") == "scraped"
    return rt


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_page_gives_at_most_the_cap_and_status_counts_the_rest(kind, request, tmp_path, caplog):
    links = "".join(f'<a href="/p/{n}">{n}</a>' for n in range(LINKS_ON_PAGE))
    page = f"<html><body>{links}</body></html>".encode()
    rt = scrape_one_page(kind, request, tmp_path, caplog, "cap", page)
    stats = rt.tracker.stats("cap")
    assert stats.seen == 1 + DEFAULT_CAP  # the seed and the first 10,000 links, in page order
    assert stats.links_cut == LINKS_ON_PAGE - DEFAULT_CAP
    assert job_row(rt.tracker, "cap")["links_cut"] == LINKS_ON_PAGE - DEFAULT_CAP
    cut_lines = [r.getMessage() for r in caplog.records if "max_links_per_page" in r.getMessage()]
    assert len(cut_lines) == 1 and "10000 links cut" in cut_lines[0], cut_lines
    if kind == "redis":  # what `distscrape status` shows
        res = run("status", "cap", "--json", "--redis-url", request.getfixturevalue("redis_url"))
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["links_cut"] == LINKS_ON_PAGE - DEFAULT_CAP


# -- what a page costs before the cap: hrefs looked at, and held ------------------------------

MANY_HREFS = 150_000
HREFS_BOUND = 2 * DEFAULT_CAP  # HREFS_LOOKED_AT_PER_LINK x the default max_links_per_page
SITE = "http://site.invalid/dir/page.html"
# Pages of 150,000 hrefs (2.6 to 4.8 MB): distinct links on the page's host, distinct links to
# other hosts, one link written with a different fragment each time.
HREF_KINDS = {
    "in-scope": "/p/{n}",
    "off-site": "http://off{n}.invalid/",
    "repeats": "/a#{n}",
}


class CountingCanonicalizer(Canonicalizer):
    """The real canonicalizer, counting the URLs it works out (its cache's misses)."""

    def __init__(self) -> None:
        super().__init__()
        self.worked_out = 0

    def _canonical(self, url: str):
        self.worked_out += 1
        return super()._canonical(url)


@pytest.mark.parametrize(("kind", "looked_at", "found"), [
    ("in-scope", DEFAULT_CAP, DEFAULT_CAP), ("off-site", HREFS_BOUND, 0), ("repeats", HREFS_BOUND, 1),
])
def test_a_page_of_150k_links_is_resolved_only_to_the_cap_or_twice_the_cap(kind, looked_at, found):
    """Extraction stops at the 10,000th link found, or after 20,000 hrefs looked at when they are
    off-site or repeats: the rest of the page is counted as cut, never resolved or canonicalized
    (all 150,000 were, before the cap cut the result)."""
    canonicalizer = CountingCanonicalizer()
    scraper = SimpleScraper(LinkScope(canonicalizer, hosts=["site.invalid"]))
    hrefs = [HREF_KINDS[kind].format(n=n) for n in range(MANY_HREFS)]
    result = scraper.find_items(SITE, html_page(SITE, hrefs))
    assert canonicalizer.worked_out <= looked_at, canonicalizer.worked_out
    assert len(result) == found
    assert (result.looked_at, result.cut) == (looked_at, MANY_HREFS - looked_at)


def test_a_page_s_hrefs_are_held_a_slice_at_a_time_not_all_at_once() -> None:
    """4,000 hrefs of 2,100 characters (8.4 MB, dropped as over-long): while links are found the
    scraper holds little besides the page's text. It used to hold every href and a second copy
    of the page at once, twice the page's size."""
    hrefs = [f"/{n}/" + "y" * 2_100 for n in range(4_000)]
    download = html_page(SITE, hrefs + ["/last"])
    scraper = SimpleScraper()
    scraper.find_items(SITE, html_page(SITE, ["/warm"]))
    gc.collect()
    tracemalloc.start()
    try:
        found = scraper.find_items(SITE, download)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found == ["http://site.invalid/last"]
    text = len(download.body)  # the decoded page: ASCII, one byte a character
    assert peak - text < 2 * MB, f"{(peak - text) / MB:.1f} MB held besides the page's text"


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_page_past_the_hrefs_bound_is_cut_and_status_counts_the_rest(kind, request, tmp_path, caplog):
    """150,000 off-site links and then 50 on the site: the 20,000 first hrefs are looked at, the
    rest (the site's 50 among them) are cut, logged once and counted in the job's status. They
    used to be resolved, all of them, and the 50 followed."""
    off_site = "".join(f'<a href="http://off{n}.invalid/">o</a>' for n in range(MANY_HREFS))
    tail = "".join(f'<a href="/tail/{n}">t</a>' for n in range(50))
    page = f"<html><body>{off_site}{tail}</body></html>".encode()
    rt = scrape_one_page(kind, request, tmp_path, caplog, "bound", page)
    cut = MANY_HREFS + 50 - HREFS_BOUND
    stats = rt.tracker.stats("bound")
    assert stats.seen == 1, stats  # the seed only: no link of the site's tail was added
    assert stats.links_cut == cut
    cut_lines = [r.getMessage() for r in caplog.records if "links cut" in r.getMessage()]
    assert len(cut_lines) == 1 and f"{cut} links cut" in cut_lines[0], cut_lines
    assert "20000 hrefs looked at" in cut_lines[0], cut_lines
    if kind == "redis":  # what `distscrape status` shows
        res = run("status", "bound", "--json", "--redis-url", request.getfixturevalue("redis_url"))
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["links_cut"] == cut


def test_a_worker_follows_no_link_past_the_cap_or_the_hrefs_bound(redis_url, workers, tmp_path):
    """A real worker crawls a site on 127.0.0.1 with max_links_per_page = 100 (so 200 hrefs
    looked at a page): /many has 150 links on the site, /mixed 50, then 150,000 off-site ones,
    then 50 more on the site. The worker follows the first 100 of /many and the first 50 of
    /mixed, none after; the job finishes, the worker lives on and takes the next job, and the
    status counts every link left out (before, /mixed's last 50 were followed as well)."""
    from distscrape_celery.core.manager import CrawlManager
    from distscrape_celery.local.processes import wait_for_workers
    from distscrape_celery.tracker import RedisTracker
    from distscrape_celery.worker.app import configure_app
    from distscrape_celery.worker.publish import publisher

    cap, off_site = 100, MANY_HREFS
    links = lambda prefix, count: "".join(  # noqa: E731
        f'<a href="{prefix}{n}">x</a>' for n in range(count))
    routes = {
        "/": (200, b'<html><a href="/many">m</a><a href="/mixed">x</a></html>'),
        "/many": (200, f"<html>{links('/m/', 150)}</html>".encode()),
        "/mixed": (200, (f"<html>{links('/head/', 50)}{links('http://off.invalid/', off_site)}"
                         f"{links('/tail/', 50)}</html>").encode()),
        "/again": (200, b"<html>fine</html>"),
    }
    for n in range(150):
        routes.update({f"/m/{n}": (200, b"leaf"), f"/head/{n}": (200, b"leaf"),
                       f"/tail/{n}": (200, b"leaf")})
    settings = crawl_settings(redis_url)
    proc = workers(settings, "links", concurrency=4, pool="threads")
    tracker = RedisTracker.from_url(redis_url)
    wait_for_workers(tracker, 1, procs=[proc])
    configure_app(settings)
    manager = CrawlManager(tracker, publisher.scrape)
    with RouteServer(routes) as server:
        spec = build_spec({"seeds": [server.base + "/"], "saver": {"output": str(tmp_path / "a")},
                           "scraper": {"max_links_per_page": cap}})
        manager.seed("links", spec)
        stats = manager.wait("links", timeout=120, check=proc.check)
        hits = set(server.hits)
        again = build_spec({"seeds": [server.base + "/again"],
                            "saver": {"output": str(tmp_path / "b")}})
        manager.seed("again", again)
        assert manager.wait("again", timeout=60, check=proc.check).done == 1
    proc.check()  # alive after both jobs
    assert {f"/m/{n}" for n in range(cap)} <= hits
    assert not {f"/m/{n}" for n in range(cap, 150)} & hits
    assert {f"/head/{n}" for n in range(50)} <= hits
    assert not {f"/tail/{n}" for n in range(50)} & hits
    assert (stats.done, stats.dead) == (3 + cap + 50, 0), stats
    mixed_cut = 50 + off_site + 50 - 2 * cap
    assert stats.links_cut == (150 - cap) + mixed_cut, stats
    log = proc.log_path.read_text(errors="replace")
    assert f"{mixed_cut} links cut, past the page's {2 * cap} hrefs looked at" in log


def test_link_limits_are_spec_fields_left_out_of_the_stored_spec_at_their_default() -> None:
    plain = build_spec({"seeds": ["http://a.invalid/"]})
    assert (plain.scraper.max_links_per_page, plain.scraper.max_url_length) == (10_000, 2_083)
    # A job stored before these fields existed still takes new seeds: its stored spec is the same.
    for name in ("max_links_per_page", "max_url_length", "regex_seconds"):
        assert name not in plain.to_json()
    custom = build_spec({"seeds": ["http://a.invalid/"], "scraper": {"max_links_per_page": 50}})
    assert '"max_links_per_page":50' in custom.to_json()
    with pytest.raises(ConfigError, match="scraper.max_links_per_page"):
        build_spec({"seeds": ["http://a.invalid/"], "scraper": {"max_links_per_page": 0}})


# -- user regexes under a time budget -----------------------------------------------------------

# Run in a child process: a regex stuck in re's backtracking holds the GIL, so only a process can
# be given up on. The child prints what find_items returned, its log goes to stderr.
CHILD = textwrap.dedent("""
    import json, logging, sys
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from distscrape_celery.core.components import build_scraper
    from distscrape_celery.web.fetch import Download
    from distscrape_celery.job.spec import build_spec
    from distscrape_celery.settings import Settings
    spec = build_spec(json.loads(sys.argv[1]))
    body = sys.argv[2].encode()
    download = Download(url=spec.seeds[0], status=200, content_type="text/html", body=body)
    print(json.dumps(build_scraper(spec, Settings()).find_items(spec.seeds[0], download)))
""")


def find_in_child(spec: dict, body: str) -> tuple[list[str], str]:
    """(items found, log) of ``body`` scraped under ``spec`` in a child process; fails the test if
    the child has not returned within a generous bound."""
    try:
        res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec), body],
                             capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("find_items did not return within 60 s: the regex ran unbounded")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout), res.stderr


CRAFTED = "a" * 38 + "!"  # with the host's "/", a 40-byte run that makes nested quantifiers backtrack


def test_the_nested_quantifier_link_regex_of_the_report_no_longer_hangs() -> None:
    """``((\\w+-?)+)$`` took seconds on 32 bytes under re, four times longer per two more."""
    base = "http://site.invalid/"
    found, _ = find_in_child(
        {"seeds": [base], "scraper": {"link_regex": r"((\w+-?)+)$"}},
        f'<a href="/{CRAFTED}">x</a><a href="/fine-page">y</a>',
    )
    assert found == [base + "fine-page"]


def test_a_regex_that_runs_out_of_time_ends_the_page_keeping_what_was_found() -> None:
    base = "http://site.invalid/"
    found, log = find_in_child(
        {"seeds": [base], "scraper": {"deny_regex": [r"(\w|\w\w)+$"]}},
        f'<a href="/first/">a</a><a href="/{CRAFTED}">x</a><a href="/later/">y</a>',
    )
    assert found == [base + "first/"]
    assert "link extraction stopped" in log and "scraper.regex_seconds" in log, log


def test_an_id_regex_that_runs_out_of_time_keeps_the_ids_found_before() -> None:
    found, log = find_in_child(
        {"seeds": ["http://127.0.0.1:9/list"],
         "scraper": {"kind": "ids", "id_regex": r"id=(\d+)|(\w|\w\w)+$",
                     "download_url_fmt": "http://127.0.0.1:9/item/{}"}},
        "id=1 id=2 " + CRAFTED,
    )
    assert found == ["1", "2"]
    assert "ID extraction stopped" in log and "scraper.regex_seconds" in log, log


def test_a_regex_the_matcher_cannot_compile_is_named_at_validation() -> None:
    with pytest.raises(ConfigError, match=r"scraper.deny_regex.*invalid regular expression"):
        build_spec({"seeds": ["http://a.invalid/"], "scraper": {"deny_regex": ["ok", "(["]}})


def test_parsed_robots_files_are_kept_by_their_size_not_their_number() -> None:
    """Five hosts of a job with a 512 KiB robots.txt each: protego's rules of one take some 30 MB,
    so the process keeps two or three of them, not 1,024 (over 30 GB, were there that many)."""
    from distscrape_celery.web.fetch import FetchSpec, Fetcher
    from distscrape_celery.web.robots import RobotsCache
    from distscrape_celery.web.robots_stores import MemoryRobotsStore

    rules = "User-agent: *\n" + "".join(f"Disallow: /p{i}/x*y$\n" for i in range(30_000))
    rules = rules[:512 * 1024]
    store = MemoryRobotsStore()
    origins = [f"http://h{n}.invalid" for n in range(5)]
    for origin in origins:
        store.put(origin, json.dumps({"rules": rules}), ttl=600)
    robots = RobotsCache(Fetcher(FetchSpec()), store, user_agent="t", ttl=600)

    def read_all() -> None:
        for origin in origins:
            assert not robots.allowed(origin + "/p7/x-y")

    held = retained_after(read_all)
    assert held < 100 * MB, f"{held / MB:.0f} MB of parsed robots.txt held"
