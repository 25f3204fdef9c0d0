"""Tests for the synthetic site generator and its local server (distscrape_celery/testing/sitegen.py)."""

from __future__ import annotations

import html
import http.client
import re
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, deque

import pytest

from distscrape_celery.testing.sitegen import Site, SiteServer, generate_site, resolve

_HREF_RE = re.compile(rb'<a href="([^"]*)"')


@pytest.fixture(scope="module")
def site() -> Site:
    return generate_site(n_pages=300, seed=0, unreachable=10)


def _html_hrefs(body: bytes) -> list[str]:
    return [html.unescape(h.decode("utf-8")) for h in _HREF_RE.findall(body)]


# ------------------------------------------------------------------ resolve


@pytest.mark.parametrize(
    "page, href, expected",
    [
        ("/p/5.html", "/p/3.html", "/p/3.html"),
        ("/p/5.html", "../p/3.html", "/p/3.html"),
        ("/p/5.html", "./4.html", "/p/4.html"),
        ("/p/5.html", "4.html", "/p/4.html"),
        ("/p/5.html", "/p/3.html#top", "/p/3.html"),
        ("/p/5.html", "#section", "/p/5.html"),
        ("/sec/3/", "../../p/1.html", "/p/1.html"),
        ("/sec/3/", "./", "/sec/3/"),
        ("/sec/3/7.html", "../../", "/"),
        ("/p/5.html", "../q?id=5", "/q?id=5"),
        ("/q?id=5", "#section", "/q?id=5"),
        ("/", "q?id=2#main", "/q?id=2"),
        ("/p/5.html", "http://host-1.example.invalid/x", None),
        ("/p/5.html", "mailto:someone@example.invalid", None),
    ],
)
def test_resolve(page, href, expected):
    assert resolve(page, href) == expected


# ------------------------------------------------------------------ generator


def test_deterministic_for_seed():
    a = generate_site(n_pages=120, seed=7, unreachable=5, page_padding=100)
    b = generate_site(n_pages=120, seed=7, unreachable=5, page_padding=100)
    assert a.pages == b.pages
    assert a.reachable == b.reachable and a.unreachable == b.unreachable
    c = generate_site(n_pages=120, seed=8, unreachable=5, page_padding=100)
    assert c.pages != a.pages


def test_sizes_and_shapes(site):
    assert len(site.reachable) == 300
    assert len(site.unreachable) == 10
    assert set(site.pages) == site.reachable | site.unreachable
    assert "/" in site.reachable
    paths = site.reachable
    assert any(re.fullmatch(r"/p/\d+\.html", p) for p in paths)
    assert any(re.fullmatch(r"/sec/\d+/", p) for p in paths)
    assert any(re.fullmatch(r"/q\?id=\d+", p) for p in paths)
    for p, body in site.pages.items():
        assert f"<title>{p}</title>".encode() in body
        assert b"<base" not in body


def test_reachable_and_unreachable_disjoint_and_orphans_unlinked(site):
    assert site.reachable.isdisjoint(site.unreachable)
    for page, body in site.pages.items():
        for href in _html_hrefs(body):
            target = resolve(page, href)
            if target is not None and target != page:
                assert target not in site.unreachable, (page, href)


def test_links_match_html_and_bfs_over_html_agrees(site):
    for page, body in site.pages.items():
        assert _html_hrefs(body) == site.links[page]
    seen, queue = {"/"}, deque(["/"])
    while queue:
        cur = queue.popleft()
        for href in _html_hrefs(site.pages[cur]):
            t = resolve(cur, href)
            if t is not None and t not in seen:
                seen.add(t)
                queue.append(t)
    assert seen == site.reachable


def test_every_onsite_link_exists(site):
    for page in site.reachable:
        for href in site.links[page]:
            target = resolve(page, href)
            if target is None:
                assert href.startswith("mailto:") or ".invalid" in href.split("/")[2], href
            else:
                assert target in site.pages, (page, href, target)


def test_graph_features(site):
    hrefs = [h for hs in site.links.values() for h in hs]
    assert any(h.startswith("../") for h in hrefs)
    assert any(h.startswith("./") for h in hrefs)
    assert any("#" in h and not h.startswith("#") for h in hrefs)
    assert "#section" in hrefs
    assert any(h.startswith("mailto:") for h in hrefs)
    offsite = [h for h in hrefs if h.startswith("http")]
    assert offsite and all(h.split("/")[2].endswith(".invalid") for h in offsite)
    # A cycle: some page links (directly) back to "/" and "/" reaches it; plus a
    # non-trivial back edge found by DFS.
    assert any(resolve(p, h) == "/" for p in site.reachable - {"/"} for h in site.links[p])
    graph = {p: {t for h in site.links[p] if (t := resolve(p, h)) is not None and t != p} for p in site.pages}
    state: dict[str, int] = {}
    found_cycle = False
    stack = [("/", iter(sorted(graph["/"])))]
    state["/"] = 1
    while stack and not found_cycle:
        node, it = stack[-1]
        nxt = next(it, None)
        if nxt is None:
            state[node] = 2
            stack.pop()
        elif state.get(nxt) == 1:
            found_cycle = True
        elif nxt not in state:
            state[nxt] = 1
            stack.append((nxt, iter(sorted(graph[nxt]))))
    assert found_cycle


def test_page_padding_and_small_sites():
    small = generate_site(n_pages=20, seed=1, unreachable=2, page_padding=0)
    padded = generate_site(n_pages=20, seed=1, unreachable=2, page_padding=4096)
    for p in small.pages:
        assert len(padded.pages[p]) == len(small.pages[p]) + 4096
    for n in (1, 2, 3, 5):
        s = generate_site(n_pages=n, seed=3, unreachable=2)
        assert len(s.reachable) == n and len(s.unreachable) == 2


# ------------------------------------------------------------------ server


def test_server_serves_404_logs_and_counts(site):
    with SiteServer(site) as srv:
        assert srv.base_url.startswith("http://127.0.0.1:")
        assert srv.url("/p/0.html") == srv.base_url + "/p/0.html"
        with urllib.request.urlopen(srv.url("/"), timeout=5) as r:
            assert r.status == 200
            assert r.headers["Content-Type"] == "text/html; charset=utf-8"
            assert int(r.headers["Content-Length"]) == len(site.pages["/"])
            assert r.read() == site.pages["/"]
        q = next(p for p in sorted(site.pages) if p.startswith("/q?"))
        with urllib.request.urlopen(srv.url(q), timeout=5) as r:
            assert r.read() == site.pages[q]
        with pytest.raises(urllib.error.HTTPError) as ei:
            urllib.request.urlopen(srv.url("/nope.html"), timeout=5)
        assert ei.value.code == 404
        urllib.request.urlopen(srv.url("/"), timeout=5).read()
        assert srv.requests == ["/", q, "/nope.html", "/"]
        assert srv.counts() == Counter({"/": 2, q: 1, "/nope.html": 1})
        every = srv.request_times()
        assert len(every) == 4 and every == sorted(every)
        assert srv.request_times("/") == [every[0], every[3]]


def test_server_keep_alive_reuses_connection(site):
    with SiteServer(site) as srv:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
        try:
            conn.request("GET", "/")
            r1 = conn.getresponse()
            assert r1.read() == site.pages["/"] and r1.version == 11
            sock = conn.sock
            conn.request("GET", "/missing")
            r2 = conn.getresponse()
            r2.read()
            assert r2.status == 404
            assert conn.sock is sock  # same TCP connection reused
        finally:
            conn.close()
        assert srv.requests == ["/", "/missing"]


def test_server_delay_and_concurrency(site):
    with SiteServer(site, delay=0.2) as srv:
        t0 = time.monotonic()
        urllib.request.urlopen(srv.url("/"), timeout=5).read()
        assert time.monotonic() - t0 >= 0.18
        # Threaded: 5 concurrent delayed requests take ~1 delay, not 5.
        t0 = time.monotonic()
        threads = [
            threading.Thread(target=lambda: urllib.request.urlopen(srv.url("/"), timeout=5).read()) for _ in range(5)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert time.monotonic() - t0 < 0.8
        assert srv.counts()["/"] == 6


def test_stop_is_idempotent_and_closes_idle_keepalive(site):
    srv = SiteServer(site)
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    conn.request("GET", "/")
    conn.getresponse().read()
    t0 = time.monotonic()
    srv.stop()
    srv.stop()
    assert time.monotonic() - t0 < 2
    conn.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(srv.url("/"), timeout=1)
