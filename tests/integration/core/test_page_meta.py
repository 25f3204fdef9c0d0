"""What a page says about itself, obeyed in real crawls: robots meta tags and X-Robots-Tag
headers (noindex: not saved, counted; nofollow: its links not followed), rel=nofollow links
skipped when asked, and a page whose canonical URL is another page left unsaved for it when
asked. ``distscrape crawl`` (real worker processes, the embedded Redis) and ``--in-memory``
(the in-memory tracker), real HTTP on loopback; checked from the output and from what the
server was asked. The pipeline on both trackers, for the counts and for revisits."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from distscrape_celery.core.runtime import Runtime
from distscrape_celery.job.spec import build_spec
from distscrape_celery.savers import FileItemSaver
from tests.support.cli import run
from tests.support.crawl import crawl_settings
from tests.support.http import RouteServer
from tests.support.pipeline import crawl_inline

AGENT = "distscrape-celery"


def _page(*links: str, head: str = "", rel: dict | None = None) -> bytes:
    rel = rel or {}
    anchors = "".join(
        f'<a href="{href}"{f" rel={rel[href]!r}" if href in rel else ""}>{href}</a>'
        for href in links)
    return f"<!DOCTYPE html><html><head>{head}</head><body>{anchors}</body></html>".encode()


def _meta(content: str, name: str = "robots") -> str:
    return f'<meta name="{name}" content="{content}">'


# path -> (body, headers). Every page the root links to, and the pages only they link to.
ROOT_LINKS = {"/noindex-meta", "/noindex-header", "/nofollow-meta", "/nofollow-header",
              "/none-meta", "/none-header", "/agent-meta", "/agent-header", "/otherbot-meta",
              "/otherbot-header", "/relnf", "/dup", "/dup-header", "/self-canonical",
              "/offsite-canonical", "/two-canonicals"}
SITE: dict[str, tuple[bytes, dict]] = {
    "/": (_page(*sorted(ROOT_LINKS)), {}),
    "/noindex-meta": (_page("/from-noindex-meta", head=_meta("NOINDEX, follow")), {}),
    "/noindex-header": (_page("/from-noindex-header"), {"X-Robots-Tag": "noindex"}),
    "/nofollow-meta": (_page("/from-nofollow-meta", head=_meta("nofollow")), {}),
    "/nofollow-header": (_page("/from-nofollow-header"), {"X-Robots-Tag": "nofollow"}),
    "/none-meta": (_page("/from-none-meta", head=_meta("none")), {}),
    "/none-header": (_page("/from-none-header"), {"X-Robots-Tag": f"{AGENT}: none"}),
    # Tags and headers for this crawler by name, and for another crawler (ignored).
    "/agent-meta": (_page(head=_meta("noindex", name=AGENT.upper())), {}),
    "/agent-header": (_page(), {"X-Robots-Tag": f"otherbot: nofollow, {AGENT}: noindex"}),
    "/otherbot-meta": (_page("/from-otherbot-meta", head=_meta("noindex, nofollow", "otherbot")),
                       {}),
    "/otherbot-header": (_page("/from-otherbot-header"),
                         {"X-Robots-Tag": "otherbot: noindex, nofollow"}),
    "/relnf": (_page("/via-relnf", "/plain", rel={"/via-relnf": "external NoFollow"}), {}),
    # /orig and /orig2 are linked from nowhere: only the canonical URLs name them.
    "/dup": (_page(head='<link rel="canonical" href="/orig">'), {}),
    "/dup-header": (_page(), {"Link": '</orig2>; rel="canonical"'}),
    "/self-canonical": (_page(head='<link rel="canonical" href="/self-canonical">'), {}),
    "/offsite-canonical": (_page(head='<link rel="canonical" href="http://elsewhere.invalid/">'),
                           {}),
    "/two-canonicals": (_page(head='<link rel="canonical" href="/orig">'),
                        {"Link": '</orig3>; rel="canonical"'}),
    "/orig": (_page(), {}),
    "/orig2": (_page(), {}),
    "/orig3": (_page(), {}),
}
for _leaf in ("/from-noindex-meta", "/from-noindex-header", "/from-nofollow-meta",
              "/from-nofollow-header", "/from-none-meta", "/from-none-header",
              "/from-otherbot-meta", "/from-otherbot-header", "/via-relnf", "/plain"):
    SITE[_leaf] = (_page(), {})

NOINDEX = {"/noindex-meta", "/noindex-header", "/none-meta", "/none-header", "/agent-meta",
           "/agent-header"}
NOT_FOLLOWED = {"/from-nofollow-meta", "/from-nofollow-header", "/from-none-meta",
                "/from-none-header"}
REACHABLE = set(SITE) - {"/orig", "/orig2", "/orig3"}


def _server() -> RouteServer:
    def route(path: str, _n: int):
        body, headers = SITE.get(path, (b"not here", {}))
        return (200 if path in SITE else 404), body, headers, 0
    return RouteServer(route)


def _saved(out: Path, base: str) -> set[str]:
    """The paths of the site whose pages are in the files output ``out``."""
    saver = FileItemSaver(str(out))
    return {path for path in SITE if (out / saver.name_for(base + path)).is_file()}


def _crawl(tmp_path: Path, server: RouteServer, scraper: dict, *extra: str, env=None):
    config = tmp_path / "job.toml"
    config.write_text("[scraper]\n" + "".join(
        f"{name} = {str(value).lower()}\n" for name, value in scraper.items()))
    out = tmp_path / "out"
    res = run("crawl", server.base + "/", "--output", str(out), "--config", str(config),
              "--concurrency", "4", *extra, env=env, timeout=180)
    assert res.returncode == 0, (res.stdout, res.stderr)
    return out, res


@pytest.mark.parametrize("tracker", ["redis", "redis-save-tasks", "memory"])
def test_robots_directives_are_obeyed_by_default(tmp_path, tracker):
    """Default spec: noindex pages are not saved but counted as done (and as noindex), their
    links followed; nofollow pages are saved and none of their links requested; tags and header
    lines for another crawler change nothing; rel=nofollow and canonical links are left alone.
    Saved inline (the crawl's default) or by save tasks that other worker processes run."""
    extra = ["--in-memory"] if tracker == "memory" else []
    env = {"DISTSCRAPE_SAVE_INLINE": "false"} if tracker == "redis-save-tasks" else None
    with _server() as server:
        out, res = _crawl(tmp_path, server, {}, *extra, env=env)
        hits = set(server.page_hits)
    saved = _saved(out, server.base)
    expected_hits = REACHABLE - NOT_FOLLOWED
    assert hits == expected_hits
    assert saved == expected_hits - NOINDEX
    assert f"{len(saved)} saved ({len(NOINDEX)} noindex), 0 dead, {len(hits)} seen" in res.stdout


@pytest.mark.parametrize("tracker", ["redis", "memory"])
def test_each_rule_can_be_turned_off_or_on(tmp_path, tracker):
    """obey_noindex and obey_nofollow off: every page saved, every link followed. And
    obey_rel_nofollow and dedupe_canonical on: the rel=nofollow link is not requested; /dup
    and /dup-header are not saved, their canonical URLs (linked from nowhere else) are; a page
    that names itself, an off-site URL or two URLs as canonical is saved."""
    rules = {"obey_noindex": False, "obey_nofollow": False, "obey_rel_nofollow": True,
             "dedupe_canonical": True}
    with _server() as server:
        out, res = _crawl(tmp_path, server, rules,
                          *(["--in-memory"] if tracker == "memory" else []))
        hits = set(server.page_hits)
    saved = _saved(out, server.base)
    expected_hits = (REACHABLE - {"/via-relnf"}) | {"/orig", "/orig2"}
    assert hits == expected_hits
    assert saved == expected_hits - {"/dup", "/dup-header"}
    assert f"{len(saved)} saved (2 canonical elsewhere), 0 dead" in res.stdout
    assert "elsewhere.invalid" not in "".join(hits)


def _runtime(store: str, redis_url: str) -> Runtime:
    settings = crawl_settings(redis_url, lease_seconds=30)
    return Runtime.for_redis(settings) if store == "redis" else Runtime.in_memory_runtime(settings)


@pytest.mark.parametrize("save_inline", [False, True], ids=["save-task", "inline"])
@pytest.mark.parametrize("store", ["redis", "memory"])
def test_the_tracker_counts_unsaved_pages_as_done(store, save_inline, redis_url, tmp_path):
    """The counts, on both trackers, whether pages are saved by save tasks or inline: every
    page done, none dead; noindex and canonical count the pages left unsaved, each once."""
    settings = crawl_settings(redis_url, lease_seconds=30, save_inline=save_inline)
    rt = Runtime.for_redis(settings) if store == "redis" else Runtime.in_memory_runtime(settings)
    with _server() as server:
        spec = build_spec({"seeds": [server.base + "/"], "saver": {"output": str(tmp_path / "o")},
                           "scraper": {"dedupe_canonical": True}})
        stats = crawl_inline(rt, "meta", spec)
    done = len(REACHABLE - NOT_FOLLOWED) + 2  # and /orig, /orig2
    assert (stats.done, stats.dead, stats.noindex, stats.canonical) == (done, 0, len(NOINDEX), 2)
    assert stats.saved == done - len(NOINDEX) - 2
    assert len(_saved(tmp_path / "o", server.base)) == stats.saved
    if store == "redis":  # what `distscrape status` shows of the job
        res = run("status", "meta", "--json", "--redis-url", redis_url)
        assert res.returncode == 0, res.stderr
        shown = json.loads(res.stdout)
        assert (shown["done"], shown["noindex"], shown["canonical"]) == (done, len(NOINDEX), 2)


def test_max_depth_pages_are_read_for_noindex_without_their_links(redis_url, tmp_path):
    """A page at the job's max_depth adds no links, yet its noindex still keeps it unsaved."""
    rt = _runtime("memory", redis_url)
    with _server() as server:
        spec = build_spec({"seeds": [server.base + "/"], "saver": {"output": str(tmp_path / "o")},
                           "scraper": {"max_depth": 1}})
        stats = crawl_inline(rt, "depth", spec)
        hits = set(server.page_hits)
    assert hits == {"/"} | ROOT_LINKS
    assert stats.noindex == len(NOINDEX)
    assert _saved(tmp_path / "o", server.base) == hits - NOINDEX


def test_a_noindex_page_is_judged_again_at_each_revisit(tmp_path):
    """A job that revisits keeps no digest or validators for a page it did not save: the next
    generation fetches it whole, and saves it once it no longer says noindex."""
    pages = {"/": _page("/a", "/b"), "/a": _page(head=_meta("noindex")), "/b": _page()}
    lock = threading.Lock()

    def route(path: str, _n: int):
        with lock:
            body = pages.get(path)
        return (200 if body is not None else 404), body or b"", {}, 0

    with RouteServer(route) as server:
        out = tmp_path / "out"

        def crawl():
            res = run("crawl", server.base + "/", "--output", str(out), "--revisit", "--quiet",
                      "--concurrency", "2", timeout=180)
            assert res.returncode == 0, (res.stdout, res.stderr)
            return res

        first = crawl()
        assert _saved_paths(out, server.base, pages) == {"/", "/b"}
        assert "2 saved (1 noindex)" in first.stdout, first.stdout
        with lock:
            pages["/a"] = _page()  # no longer noindex
        second = crawl()
    assert _saved_paths(out, server.base, pages) == {"/", "/a", "/b"}
    assert "generation 2" in second.stderr, second.stderr


def _saved_paths(out: Path, base: str, pages: dict) -> set[str]:
    saver = FileItemSaver(str(out))
    return {path for path in pages if (out / saver.name_for(base + path)).is_file()}


def test_an_unchanged_page_whose_header_now_says_noindex_gets_no_revisit_record(tmp_path):
    """A revisit that finds a page unchanged does not parse it, but reads its X-Robots-Tag: the
    WARC saver, which records unchanged pages as revisit records, records none for a page whose
    header says noindex now; the unchanged page without it gets its revisit record."""
    from warcio.archiveiterator import ArchiveIterator

    headers = {"/a": {}}
    pages = {"/": _page("/a", "/b"), "/a": _page(), "/b": _page()}

    def route(path: str, _n: int):
        body = pages.get(path)
        return (200 if body is not None else 404), body or b"", dict(headers.get(path, {})), 0

    warc = tmp_path / "site.warc.gz"
    with RouteServer(route) as server:
        for _ in range(2):
            res = run("crawl", server.base + "/", "--output", str(warc), "--revisit", "--quiet",
                      "--concurrency", "2", timeout=180)
            assert res.returncode == 0, (res.stdout, res.stderr)
            headers["/a"] = {"X-Robots-Tag": "noindex"}
        base = server.base
    with open(warc, "rb") as fh:
        records = [(r.rec_type, r.rec_headers.get_header("WARC-Target-URI"))
                   for r in ArchiveIterator(fh) if r.rec_type in ("response", "revisit")]
    assert sorted(records) == sorted([
        ("response", base + "/"), ("response", base + "/a"), ("response", base + "/b"),
        ("revisit", base + "/"), ("revisit", base + "/b")])
