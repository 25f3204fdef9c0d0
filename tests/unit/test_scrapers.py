"""SimpleScraper: link finding on crafted pages, and the whole download-then-scrape path over
real HTTP on 127.0.0.1."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from distscrape_celery.errors import FetchError
from distscrape_celery.web.fetch import Download, Fetcher
from distscrape_celery.job.sections import FetchSpec
from distscrape_celery.job.spec import build_spec
from distscrape_celery.web.scope import LinkScope
from distscrape_celery.scrapers import SimpleScraper
from distscrape_celery.scrapers.simple import _FEED_CHARS

PAGE_URL = "http://site.invalid/dir/sub/page.html?old=1"
OFFSITE = '<a href="http://example.invalid/elsewhere">off</a>'


def page(html: str | bytes, content_type: str = "text/html", url: str = PAGE_URL) -> Download:
    body = html.encode() if isinstance(html, str) else html
    return Download(url=url, status=200, content_type=content_type, body=body)


def links(html: str | bytes, scraper: SimpleScraper | None = None, **page_args: str) -> list[str]:
    download = page(html, **page_args)
    return (scraper or SimpleScraper()).find_items(download.url, download)


@contextmanager
def serve(pages: dict[str, tuple[int, dict[str, str], bytes]]) -> Iterator[str]:
    """Serve ``pages`` (path -> (status, headers, body)) on 127.0.0.1; yields the base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, headers, body = pages.get(self.path, (404, {}, b"not here"))
            self.send_response(status)
            for name, value in {"Content-Length": str(len(body)), **headers}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_relative_links_resolve_against_the_page_url() -> None:
    html = """<html><body>
        <a href="./same.html">a</a>
        <a href="../up.html">b</a>
        <a href="../../../../top.html">c</a>
        <a href="/root/path">d</a>
        <a href="?q=2">e</a>
        <a href="child/x?a=1&amp;b=2">f</a>
        <a href="//other.invalid/proto-relative">g</a>
        <a href="  spaced.html  ">h</a>
    </body></html>"""
    assert links(html) == [
        "http://site.invalid/dir/sub/same.html",
        "http://site.invalid/dir/up.html",
        "http://site.invalid/top.html",
        "http://site.invalid/root/path",
        "http://site.invalid/dir/sub/page.html?q=2",
        "http://site.invalid/dir/sub/child/x?a=1&b=2",
        "http://other.invalid/proto-relative",
        "http://site.invalid/dir/sub/spaced.html",
    ]


def test_one_scraper_resolves_the_same_href_on_many_pages_against_each_page() -> None:
    """The scraper remembers resolved links per base directory: the same href on pages of other
    directories, hosts, schemes or queries must still resolve against each page."""
    scraper = SimpleScraper()
    html = '<a href="x.html">1</a><a href="../y">2</a><a href="?q=2">3</a><a href="">4</a>'
    cases = {
        "http://a.invalid/d/p.html": ["http://a.invalid/d/x.html", "http://a.invalid/y",
                                      "http://a.invalid/d/p.html?q=2", "http://a.invalid/d/p.html"],
        "http://a.invalid/d/other.html?z=1": ["http://a.invalid/d/x.html", "http://a.invalid/y",
                                              "http://a.invalid/d/other.html?q=2",
                                              "http://a.invalid/d/other.html?z=1"],
        "http://a.invalid/e/f/p.html": ["http://a.invalid/e/f/x.html", "http://a.invalid/e/y",
                                        "http://a.invalid/e/f/p.html?q=2",
                                        "http://a.invalid/e/f/p.html"],
        "https://a.invalid/d/p.html": ["https://a.invalid/d/x.html", "https://a.invalid/y",
                                       "https://a.invalid/d/p.html?q=2",
                                       "https://a.invalid/d/p.html"],
        "http://b.invalid:8080/d/p.html": ["http://b.invalid:8080/d/x.html",
                                           "http://b.invalid:8080/y",
                                           "http://b.invalid:8080/d/p.html?q=2",
                                           "http://b.invalid:8080/d/p.html"],
    }
    for _ in range(2):  # the second round from what the first remembered
        for url, expected in cases.items():
            assert links(html, scraper, url=url) == expected, url


def test_links_are_normalised_and_deduplicated_in_document_order() -> None:
    html = """<a href="HTTP://Site.INVALID:80/b">1</a><a href="/a">2</a>
        <a href="http://site.invalid/b">3</a><area href="/c"><a href="/a#frag">4</a>
        <a name="no-href">5</a>"""
    assert links(html) == [
        "http://site.invalid/b",
        "http://site.invalid/a",
        "http://site.invalid/c",
    ]


def test_fragments_are_dropped() -> None:
    html = '<a href="/doc#section-2">x</a><a href="#top">y</a><a href="other.html#z">z</a>'
    assert links(html) == [
        "http://site.invalid/doc",
        "http://site.invalid/dir/sub/page.html?old=1",
        "http://site.invalid/dir/sub/other.html",
    ]


def test_base_href_is_honoured_even_when_relative() -> None:
    html = """<html><head><base href="/base/dir/"><base href="http://ignored.invalid/"></head>
        <body><a href="rel.html">x</a><a href="/abs">y</a></body></html>"""
    assert links(html) == ["http://site.invalid/base/dir/rel.html", "http://site.invalid/abs"]


def test_base_href_to_another_host() -> None:
    html = '<base href="http://cdn.invalid/assets/"><a href="img/1">x</a>'
    assert links(html) == ["http://cdn.invalid/assets/img/1"]


def test_malformed_base_href_falls_back_to_the_page_url() -> None:
    html = '<base href="http://[::1/oops/"><a href="x.html">x</a>'
    assert links(html) == ["http://site.invalid/dir/sub/x.html"]


def test_offsite_links_dropped_when_hosts_are_restricted() -> None:
    html = '<a href="/on">on</a>' + OFFSITE + '<a href="http://SITE.invalid:8080/port">p</a>'
    scraper = SimpleScraper(LinkScope(hosts=["Site.Invalid"]))
    assert links(html, scraper) == ["http://site.invalid/on", "http://site.invalid:8080/port"]


def test_offsite_links_kept_without_host_restriction() -> None:
    html = '<a href="/on">on</a>' + OFFSITE
    assert links(html) == ["http://site.invalid/on", "http://example.invalid/elsewhere"]


def test_link_regex_filters_on_the_absolute_normalised_url() -> None:
    html = """<a href="/item/1">1</a><a href="/about">about</a><a href="item/2">rel</a>
        <a href="/ITEM/3">upper</a>"""
    scraper = SimpleScraper(LinkScope(allow=[r"^http://site\.invalid/.*item/\d+$"]))
    assert links(html, scraper) == [
        "http://site.invalid/item/1",
        "http://site.invalid/dir/sub/item/2",
    ]


@pytest.mark.parametrize(
    "href",
    [
        "mailto:someone@site.invalid",
        "javascript:void(0)",
        "JavaScript:alert(1)",
        "data:text/html,<p>hi</p>",
        "ftp://site.invalid/file",
        "tel:+123",
        "http://[::1/bad-ipv6",
        "http://site.invalid:notaport/",
        "http://user:pw@site.invalid/",
    ],
)
def test_unfollowable_links_are_skipped(href: str) -> None:
    html = f'<a href="{href}">bad</a><a href="/good">good</a>'
    assert links(html) == ["http://site.invalid/good"]


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/json", "image/png", "application/pdf", "text/css"],
)
def test_non_html_content_type_gives_no_links(content_type: str) -> None:
    assert links('<html><a href="/x">x</a></html>', content_type=content_type) == []


@pytest.mark.parametrize(
    "content_type",
    ["text/html", "TEXT/HTML; charset=UTF-8", "application/xhtml+xml", " text/html ;q=1"],
)
def test_html_content_types_are_scraped(content_type: str) -> None:
    assert links('<a href="/x">x</a>', content_type=content_type) == ["http://site.invalid/x"]


def test_xhtml_document_with_namespace() -> None:
    html = """<?xml version="1.0" encoding="utf-8"?>
        <html xmlns="http://www.w3.org/1999/xhtml"><body><a href="/x">x</a></body></html>"""
    assert links(html, content_type="application/xhtml+xml") == ["http://site.invalid/x"]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'<!DOCTYPE html><a href="/x">x</a>', ["http://site.invalid/x"]),
        (b'\xef\xbb\xbf\n  <HTML><a href="/x">x</a></HTML>', ["http://site.invalid/x"]),
        (b'{"html": "<a href=\\"/x\\">x</a>"}', []),
        (b'plain text <a href="/x">x</a>', []),
    ],
)
def test_without_content_type_only_bodies_starting_like_html_are_scraped(
    body: bytes, expected: list[str]
) -> None:
    assert links(body, content_type="") == expected


def test_charset_from_content_type_decodes_hrefs() -> None:
    body = '<a href="/café">x</a>'.encode("latin-1")
    assert links(body, content_type="text/html; charset=ISO-8859-1") == [
        "http://site.invalid/caf%C3%A9"
    ]
    utf8 = '<a href="/café">x</a>'.encode()
    assert links(utf8, content_type='text/html; charset="utf-8"') == [
        "http://site.invalid/caf%C3%A9"
    ]


def test_unknown_charset_does_not_stop_scraping() -> None:
    assert links('<a href="/x">x</a>', content_type="text/html; charset=no-such-codec") == [
        "http://site.invalid/x"
    ]


HOSTILE_PAGES = {
    "empty": b"",
    "whitespace": b" \n\t ",
    "binary junk": bytes(range(256)) * 64,
    "nul bytes": b"\x00" * 1000,
    "nul inside tags": b'<a hr\x00ef="/x">\x00<a href="/y\x00z">',
    "unclosed everything": b"<html><body><a href='/x'><div><p><table><tr><td><!--",
    "comment only": b"<!-- nothing here -->",
    "invalid utf-8": b'<meta charset="utf-8"><a href="/bad\xff\xfe\xc3">x</a>',
    "cdata and pi": b"<![CDATA[<a href='/no'>]]><?php echo 1 ?><script>'<a href=/s>'</script>",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_PAGES))
def test_hostile_pages_give_a_list_without_raising(name: str) -> None:
    result = links(HOSTILE_PAGES[name])
    assert isinstance(result, list)
    assert all(url.startswith("http://site.invalid/") for url in result)


def test_hostile_page_with_empty_content_type_gives_no_links() -> None:
    assert links(bytes(range(256)) * 64, content_type="") == []


def test_ten_megabyte_attribute_does_not_hide_the_other_links() -> None:
    huge = "x" * (10 * 1024 * 1024)
    html = f'<a href="/before">b</a><div title="{huge}"></div><a href="/after">a</a>'
    assert links(html) == ["http://site.invalid/before", "http://site.invalid/after"]


def test_ten_megabyte_text_does_not_hide_the_other_links() -> None:
    html = f'<a href="/before">b</a><p>{"t" * (10 * 1024 * 1024)}</p><a href="/after">a</a>'
    assert links(html) == ["http://site.invalid/before", "http://site.invalid/after"]


def test_absurdly_long_href_is_skipped() -> None:
    html = f'<a href="/{"y" * (10 * 1024 * 1024)}">long</a><a href="/short">s</a>'
    assert links(html) == ["http://site.invalid/short"]


def test_deep_nesting_keeps_links_inside_and_after_it() -> None:
    depth = 5000
    html = (
        '<a href="/before">b</a>'
        + "<div>" * depth
        + '<a href="/deep">d</a>'
        + "</div>" * depth
        + '<a href="/after">a</a>'
    )
    assert links(html) == [
        "http://site.invalid/before",
        "http://site.invalid/deep",
        "http://site.invalid/after",
    ]


def test_invalid_utf8_keeps_the_valid_links() -> None:
    body = b'<a href="/ok1">1</a><p>\xff\xfe\x80\xc3(</p><a href="/ok2">2</a>'
    assert links(body, content_type="text/html; charset=utf-8") == [
        "http://site.invalid/ok1",
        "http://site.invalid/ok2",
    ]


# -- the page's hrefs, parsed a slice at a time and looked at up to the limits -------------------


def test_a_base_href_after_the_links_still_applies_to_them() -> None:
    """The hrefs stream out before the parse reaches a late <base>: the first base is found
    before any href is resolved, as when the whole page was parsed first."""
    for filler in (1, 20_000):  # a page of one slice, and of several
        html = '<a href="rel.html">x</a>' + "<p>filler</p>" * filler + '<base href="/late/dir/">'
        assert links(html) == ["http://site.invalid/late/dir/rel.html"], filler


def test_links_across_the_slices_fed_to_the_parser_are_whole() -> None:
    """An href cut by a slice's end, in ASCII and in two-byte characters, comes out whole."""
    for filler in ("f", "é"):
        for shift in range(-12, 13, 3):
            pad = filler * (_FEED_CHARS - len("<p>") - 8 + shift)
            html = f'<p>{pad}</p><a href="/straddle/é-{shift}">x</a><a href="/after">a</a>'
            assert links(html) == [
                f"http://site.invalid/straddle/%C3%A9-{shift}", "http://site.invalid/after",
            ], (filler, shift)


def test_a_page_stopped_at_the_cap_reports_the_rest_as_cut_and_leaves_no_trace() -> None:
    """With max_links 3, a page gives its first 3 distinct links and counts the 6 hrefs after
    the third as cut, unresolved; the next page on the thread's reused parser starts clean."""
    scraper = SimpleScraper(LinkScope(hosts=["site.invalid"]), max_links=3)
    hrefs = ["/1", "/1", "/2", "http://off.invalid/", "/3", "/4", "/5", "/1", "/6", "/7", "/8"]
    html = "".join(f'<a href="{h}">x</a>' for h in hrefs) + "<p>" + "x" * 2 * _FEED_CHARS
    found = links(html, scraper)
    assert found == ["http://site.invalid/1", "http://site.invalid/2", "http://site.invalid/3"]
    assert (found.cut, found.looked_at) == (6, 5)
    assert "max_links_per_page=3" in found.limit
    after = links('<a href="/next">n</a>', scraper)
    assert after == ["http://site.invalid/next"] and after.cut == 0


def test_hrefs_looked_at_stop_at_twice_the_cap() -> None:
    """With max_links 2, the 4 first hrefs are looked at (one link, three off-site), and the
    two on the site after them are cut."""
    scraper = SimpleScraper(LinkScope(hosts=["site.invalid"]), max_links=2)
    html = '<a href="/1">1</a>' + OFFSITE * 3 + '<a href="/2">2</a><a href="/3">3</a>'
    found = links(html, scraper)
    assert found == ["http://site.invalid/1"]
    assert (found.looked_at, found.cut) == (4, 2)
    assert found.limit == "4 hrefs looked at (2 x max_links_per_page=2)"


def test_a_page_under_the_limits_reports_nothing_cut() -> None:
    found = links('<a href="/a">a</a><a href="/a">a</a>' + OFFSITE)
    assert (found.cut, found.looked_at, found.limit) == (0, 3, "")


def test_a_cap_below_one_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match="scraper.max_links_per_page"):
        SimpleScraper(max_links=0)


def test_from_spec_takes_the_cap_of_the_spec() -> None:
    spec = build_spec({"seeds": ["http://site.invalid/"], "scraper": {"max_links_per_page": 7}})
    scraper = SimpleScraper.from_spec(spec)
    assert (scraper.max_links, scraper.max_hrefs) == (7, 14)


def test_from_spec_wires_regex_hosts_and_fetch_limits() -> None:
    spec = build_spec(
        {
            "seeds": ["http://Site.invalid/start", "https://second.invalid:8443/"],
            "scraper": {"link_regex": "/keep/"},
            "fetch": {"max_bytes": 1234, "read_timeout": 3},
        }
    )
    scraper = SimpleScraper.from_spec(spec)
    assert scraper.scope.hosts == frozenset({"site.invalid", "second.invalid"})
    assert [p.pattern for p in scraper.scope.allow] == ["/keep/"]
    assert isinstance(scraper.fetcher, Fetcher)
    assert scraper.fetcher.spec == spec.fetch
    html = """<a href="/keep/1">1</a><a href="/drop/2">2</a>
        <a href="https://second.invalid:8443/keep/3">3</a>
        <a href="http://third.invalid/keep/4">4</a>"""
    assert links(html, scraper) == [
        "http://site.invalid/keep/1",
        "https://second.invalid:8443/keep/3",
    ]


def test_from_spec_without_same_host_allows_every_host() -> None:
    spec = build_spec({"seeds": ["http://site.invalid/"], "scraper": {"same_host": False}})
    scraper = SimpleScraper.from_spec(spec)
    assert scraper.scope.hosts is None and scraper.scope.domains is None
    assert scraper.scope.allow == []
    assert links('<a href="/on">x</a>' + OFFSITE, scraper) == [
        "http://site.invalid/on",
        "http://example.invalid/elsewhere",
    ]


def test_download_then_find_items_over_http_resolves_against_the_final_url() -> None:
    html = b'<html><a href="next.html">n</a><a href="/other/">o</a>' + OFFSITE.encode() + b"</html>"
    pages = {
        "/start": (302, {"Location": "/moved/index.html"}, b""),
        "/moved/index.html": (200, {"Content-Type": "text/html; charset=utf-8"}, html),
    }
    with serve(pages) as base:
        spec = build_spec({"seeds": [base + "/start"], "fetch": {"read_timeout": 2}})
        scraper = SimpleScraper.from_spec(spec)
        download = scraper.download(base + "/start")
        found = scraper.find_items(base + "/start", download)
    assert download.url == base + "/moved/index.html"
    assert found == [base + "/moved/next.html", base + "/other/"]


def test_download_failure_is_a_fetch_error() -> None:
    with serve({}) as base:
        scraper = SimpleScraper(fetcher=Fetcher(FetchSpec(read_timeout=2)))
        with pytest.raises(FetchError) as info:
            scraper.download(base + "/missing")
    assert info.value.retryable is False
    assert str(info.value) == f"HTTP 404 for {base}/missing"
