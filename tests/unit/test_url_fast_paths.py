"""The link fast paths against the library code they stand in for.

``Canonicalizer`` hands a URL that is already canonical back without w3lib, and ``SimpleScraper``
joins a plain href to its page without urljoin (the two took most of a page's link work).
Each must give exactly what the library would, for any input; anything they cannot vouch for
must go to the library. Hypothesis builds the inputs from pieces that hit the edges: case, dot
segments, empty segments, ports, percent signs, queries, fragments, credentials, IPv6, punycode.
"""

from __future__ import annotations

import re
from urllib.parse import urldefrag, urljoin

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from distscrape_celery.testing.sitegen import generate_site

from distscrape_celery.web.fetch import Download
from distscrape_celery.web.scope import LinkScope
from distscrape_celery.scrapers import simple
from distscrape_celery.scrapers.simple import SimpleScraper
from distscrape_celery.job.urls import Canonicalizer, is_plain_url

SETTINGS = settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])

schemes = st.sampled_from(["http", "https", "HTTP", "Https", "ftp", "mailto", ""])
labels = st.sampled_from(["a", "example", "Example", "127", "0", "1", "xn--bcher-kva", "xn--a",
                          "b-c", "-d", "e-", "é", "a" * 63, "a" * 64, "", "q_r", "%41"])
hosts = st.one_of(
    st.lists(labels, min_size=1, max_size=4).map(".".join),
    st.sampled_from(["127.0.0.1", "[::1]", "[::1", "user:pw@h", "user@h", "h.", ".h", "H.COM"]),
)
ports = st.sampled_from(["", ":80", ":443", ":8080", ":0", ":080", ":65535", ":65536", ":99999",
                         ":", ":x", ":8080:1"])
segments = st.sampled_from(["a", "B", "p", "1.html", "index.html", ".", "..", "...", ".a", "a.",
                            "", "~u", "a-b_c", "a b", "%20", "%zz", "é", "a;p", "a:b", "a@b",
                            "x.tar.gz", "a+b", "a,b", "a=b", "(a)", "'", "!", "$", "*", "a\tb"])
paths = st.lists(segments, max_size=5).map("/".join)
tails = st.sampled_from(["", "?", "?a=1", "?b=2&a=1", "?utm_source=x", "#", "#top", "#a b",
                         "#x?y", "#\n", "?a=1#f", ";p", "#%zz"])


@st.composite
def urls(draw) -> str:
    path = draw(paths)
    lead = draw(st.sampled_from(["/", "", "//"]))
    return f"{draw(schemes)}://{draw(hosts)}{draw(ports)}{lead if path else ''}{path}{draw(tails)}"


@st.composite
def hrefs(draw) -> str:
    lead = draw(st.one_of(
        st.lists(st.sampled_from(["./", "../", "."]), max_size=7).map("".join),
        st.sampled_from(["/", "//", "///", "http://a.example/", "https://b.example:8443/x/",
                         "HTTP://C/", "http://D.example/", "mailto:", "javascript:", "?q", "#f",
                         ";p"])))
    return lead + draw(paths) + draw(tails)


def _outcome(fn, *args):
    try:
        return fn(*args)
    except ValueError:
        return ValueError


@SETTINGS
@given(urls())
@example("http://127.0.0.1:8080/p/1.html")
@example("http://h:80/a#frag")
@example("https://h:443/")
@example("http://h/a/../b")
@example("http://h/..a/.b/c.")
@example("http://Example.a/x")
@example("http://a.B/")
@example("http://h:65536/")
def test_canonical_fast_path_agrees_with_w3lib(url: str) -> None:
    c = Canonicalizer()
    assert _outcome(c._canonical, url) == _outcome(c._canonical_w3lib, url)


def test_canonical_fast_path_is_taken_for_plain_urls(monkeypatch) -> None:
    c = Canonicalizer()
    monkeypatch.setattr(c, "_canonical_w3lib", lambda url: pytest.fail(f"w3lib called for {url}"))
    assert c._canonical("http://127.0.0.1:8080/p/1.html#top").url == "http://127.0.0.1:8080/p/1.html"
    assert c._canonical("https://example.com:443/a/b/").url == "https://example.com/a/b/"
    assert c._canonical("http://example.com").url == "http://example.com/"


@st.composite
def bases(draw) -> str:
    return draw(st.one_of(urls(), st.sampled_from([
        "http://127.0.0.1:8080/sec/3/17.html", "http://h/", "http://h", "http://h/a/b/",
        "http://h/a/../b/c", "http://h/a//b/c", "http://h/a;p/b", "http://h/a/b;p?q#f",
        "https://u@h/a/", "http://H/A/b.html?x=1", "http://h/a/b/c/d/e.html"])))


@SETTINGS
@given(bases(), hrefs())
@example("http://h/sec/3/17.html", "../../../../p/1.html")
@example("http://h/", "../")
@example("http://h/a/b.html", "./")
@example("http://h/a/b.html", "c.html#")
@example("http://h/a/b/c/d.html", "../../../../x.html")
@example("http://[::1", "http://a.example/")
def test_join_fast_paths_agree_with_urljoin(base: str, href: str) -> None:
    expected = _outcome(lambda: urldefrag(urljoin(base, href))[0])
    scraper = SimpleScraper(LinkScope())
    seen = []
    # What find_items and _follow do with this pair, with the scope replaced by a recorder of
    # the joined URL it is given (without its fragment, which canonicalization drops).
    scraper.scope = type("Record", (), {
        "max_url_length": LinkScope().max_url_length, "page_budget": lambda self: None,
        "accept": lambda self, u, budget=None: seen.append(urldefrag(u)[0]),
    })()
    body = f'<html><a href="{href}">x</a></html>'
    if any(ch in href for ch in '"<>&\x00') or href != href.strip(simple._HTML_WHITESPACE):
        return  # not a plain attribute value; the parser's reading of it is another matter
    scraper.find_items(base, Download(url=base, status=200, content_type="text/html",
                                      body=body.encode("utf-8", "surrogatepass")))
    if expected is ValueError:
        assert seen == []
    elif href and href[0] in "?#;":
        return  # not cached, not fast: urljoin itself
    else:
        assert seen == [expected]


def test_join_fast_path_is_taken_for_plain_hrefs(monkeypatch) -> None:
    monkeypatch.setattr(simple, "urljoin", lambda *a: pytest.fail(f"urljoin called for {a}"))
    scraper = SimpleScraper(LinkScope())
    body = b'<a href="/p/1.html">1</a><a href="../../q/2.html#x">2</a><a href="./3/">3</a>' \
           b'<a href="4.html">4</a><a href="http://other.example/5.html">5</a>'
    found = scraper.find_items("http://h/a/b/c.html", Download(
        url="http://h/a/b/c.html", status=200, content_type="text/html", body=body))
    assert found == ["http://h/p/1.html", "http://h/q/2.html", "http://h/a/b/3/",
                     "http://h/a/b/4.html", "http://other.example/5.html"]


def test_find_items_on_a_generated_site_is_the_same_without_the_fast_paths(monkeypatch) -> None:
    site = generate_site(n_pages=400, seed=5)
    pages = [(f"http://127.0.0.1:8080{p}", body) for p, body in site.pages.items()]

    def crawl_links() -> list[list[str]]:
        scraper = SimpleScraper(LinkScope(hosts=["127.0.0.1"]))
        return [scraper.find_items(url, Download(url=url, status=200, content_type="text/html",
                                                 body=body)) for url, body in pages]

    fast = crawl_links()
    never = re.compile(r"(?!)")
    monkeypatch.setattr(simple, "_PLAIN_HREF", never)
    monkeypatch.setattr(simple, "is_plain_url", lambda url: False)
    monkeypatch.setattr("distscrape_celery.job.urls._PLAIN_URL", never)
    assert not is_plain_url("http://h/")
    assert crawl_links() == fast
    assert sum(map(len, fast)) > 5 * len(pages)


@SETTINGS
@given(urls())
@example("http://127.0.0.1:8080/p/1.html")
@example("http://h:80/")
@example("http://h:65536/")
@example("http://a-/x")
@example("https://xn--bcher-kva.a/%7E")
def test_fetch_fast_path_picks_the_pool_and_target_urllib3_would(url: str) -> None:
    """A URL that Fetcher sends to its origin's pool directly must give the scheme, host, port
    and request target that PoolManager.urlopen gets from parse_url."""
    from urllib3.util import parse_url

    from distscrape_celery.web.fetch import _PLAIN_TARGET

    plain = _PLAIN_TARGET.match(url)
    if plain is None or (plain[3] and int(plain[3]) > 65535):
        return
    scheme, host, port, path = plain.groups()
    parsed = parse_url(url)
    assert (parsed.scheme, parsed.host, parsed.port, parsed.request_uri) == (
        scheme, host, int(port) if port else None, path)
