"""What a page says about itself: the robots directives of meta tags and X-Robots-Tag headers
(every header form), canonical links and Link headers, read in the scraper's one parse of the
page, what a job's rules make of them, and the headers as a real fetch on 127.0.0.1 hands them
over. Hostile pages (huge or many meta tags) cost no more than their parse."""

from __future__ import annotations

import time

import pytest

from distscrape_celery.core.page_rules import CANONICAL, NOINDEX, PageRules
from distscrape_celery.job.sections import FetchSpec
from distscrape_celery.job.spec import build_spec
from distscrape_celery.scrapers import SimpleScraper
from distscrape_celery.scrapers.simple import _FEED_CHARS
from distscrape_celery.web.fetch import Download, Fetcher
from distscrape_celery.web.page_meta import (
    Directives, PageMeta, agent_token, header_canonicals, header_directives, meta_directives,
)
from tests.support.http import reply, serve as serve_routes

AGENT = "distscrape-celery"
URL = "http://site.invalid/dir/page.html"
NOINDEX_ONLY, NOFOLLOW_ONLY, BOTH = Directives(True, False), Directives(False, True), Directives(True, True)
NEITHER = Directives()


def download(html: str = "", url: str = URL, robots_tags=(), links=()) -> Download:
    return Download(url=url, status=200, content_type="text/html", body=html.encode(),
                    robots_tags=tuple(robots_tags), links=tuple(links))


# -- the directives ------------------------------------------------------------------------------


@pytest.mark.parametrize("content, expected", [
    ("noindex", NOINDEX_ONLY),
    ("NoFollow", NOFOLLOW_ONLY),
    ("noindex, nofollow", BOTH),
    (" noindex ,\tnofollow ", BOTH),
    ("none", BOTH),
    ("all", NEITHER),
    ("index, follow", NEITHER),
    ("noarchive, max-snippet:20, max-image-preview:large", NEITHER),
    ("", NEITHER),
    ("noindexx, no index", NEITHER),
])
def test_meta_content(content, expected):
    assert meta_directives(content) == expected


@pytest.mark.parametrize("values, expected", [
    (["noindex"], NOINDEX_ONLY),
    (["noindex, nofollow"], BOTH),
    (["noindex", "nofollow"], BOTH),  # two header lines
    (["none"], BOTH),
    (["all"], NEITHER),
    ([f"{AGENT}: noindex"], NOINDEX_ONLY),
    ([f"{AGENT.upper()}: NONE"], BOTH),
    (["googlebot: noindex"], NEITHER),  # another crawler's
    (["googlebot: noindex, nofollow"], NEITHER),  # the agent holds to the end of the line
    (["googlebot: noindex", "nofollow"], NOFOLLOW_ONLY),  # ... not past it
    ([f"googlebot: noindex, {AGENT}: nofollow"], NOFOLLOW_ONLY),
    ([f"{AGENT}: nofollow, googlebot: noindex"], NOFOLLOW_ONLY),
    (["unavailable_after: 25 Jun 2010 15:00:00 PST, noindex"], NOINDEX_ONLY),
    (["unavailable_after: Friday, 25-Jun-2010 15:00:00 PST, nofollow"], NOFOLLOW_ONLY),
    (["max-snippet: 20, noindex"], NOINDEX_ONLY),
    ([""], NEITHER),
    ([":::,,,:"], NEITHER),
])
def test_x_robots_tag_forms(values, expected):
    assert header_directives(values, AGENT) == expected


def test_agent_token_is_the_product_name():
    assert agent_token("distscrape-celery/0.1") == AGENT
    assert agent_token("MyBot/2.0 (+https://example.org/bot)") == "mybot"
    assert agent_token("plain name") == "plain"
    assert agent_token("") == ""


def test_link_header_canonicals():
    assert header_canonicals(['<https://a.invalid/x,y>; rel="canonical"']) == ["https://a.invalid/x,y"]
    assert header_canonicals(['</p.pdf>; rel="alternate", </c>; REL=canonical']) == ["/c"]
    assert header_canonicals(['</c>; type="text/html"; rel="alternate canonical"']) == ["/c"]
    assert header_canonicals(['</next>; rel="next"', "garbage <", "<>"]) == []
    assert header_canonicals(["</a>; rel=canonical", "</b>; rel=canonical", "</c>; rel=canonical"]) \
        == ["/a", "/b"]  # two are enough to tell that the page names several


# -- read in the scraper's parse -------------------------------------------------------------------


def scraped(html: str, scraper: SimpleScraper | None = None, url: str = URL):
    page = download(html, url=url)
    return (scraper or SimpleScraper(agent=AGENT)).find_items(page.url, page)


def test_meta_tags_and_canonical_come_with_the_links():
    found = scraped('<html><head><meta name="ROBOTS" content="noindex">'
                    '<link rel="Canonical" href="other.html"></head>'
                    '<body><a href="/a">a</a></body></html>')
    assert list(found) == ["http://site.invalid/a"]
    assert found.meta == PageMeta(NOINDEX_ONLY, ("http://site.invalid/dir/other.html",))


def test_meta_named_after_the_agent_counts_another_crawlers_does_not():
    assert scraped(f'<meta name="{AGENT}" content="nofollow">').meta.robots == NOFOLLOW_ONLY
    assert scraped('<meta name="googlebot" content="none">').meta.robots == NEITHER
    # Without an agent, only "robots".
    assert scraped(f'<meta name="{AGENT}" content="none">', SimpleScraper()).meta.robots == NEITHER


def test_many_meta_tags_add_up_and_meta_in_the_body_counts():
    found = scraped('<meta name="robots" content="noindex"><meta name=robots content=all>'
                    '<body><p>text</p><meta name="robots" content="nofollow"></body>')
    assert found.meta.robots == BOTH


def test_canonical_is_resolved_against_the_pages_base():
    found = scraped('<head><base href="http://other.invalid/base/">'
                    '<link rel="canonical" href="c.html"></head><a href="x">x</a>')
    assert found.meta.canonicals == ("http://other.invalid/base/c.html",)
    # A base after the first link: the page is parsed again, the meta kept.
    found = scraped('<a href="x">x</a><link rel="canonical" href="c.html">'
                    '<base href="http://other.invalid/late/">')
    assert list(found) == ["http://other.invalid/late/x"]
    assert found.meta.canonicals == ("http://other.invalid/late/c.html",)


def test_two_canonicals_are_both_kept_an_a_element_is_no_canonical():
    found = scraped('<link rel="canonical" href="/a"><link rel="canonical" href="/a">'
                    '<link rel="canonical" href="/b"><a rel="canonical" href="/c">c</a>')
    assert found.meta.canonicals == ("http://site.invalid/a", "http://site.invalid/b")


def test_meta_after_the_first_slice_is_read():
    filler = "<p>" + "x" * 100 + "</p>"
    html = "<a href='/a'>a</a>" + filler * (3 * _FEED_CHARS // len(filler)) + \
        '<meta name="robots" content="noindex">'
    assert scraped(html).meta.robots == NOINDEX_ONLY


def test_meta_is_read_past_the_link_cap():
    html = "".join(f'<a href="/p{i}">p</a>' for i in range(50)) + \
        '<meta name="robots" content="nofollow">'
    found = scraped(html, SimpleScraper(agent=AGENT, max_links=5))
    assert len(found) == 5 and found.cut == 45
    assert found.meta.robots == NOFOLLOW_ONLY


def test_page_meta_alone_reads_the_same_without_links():
    html = ('<meta name="robots" content="noindex"><link rel="canonical" href="/c">'
            + "<a href='/a'>a</a>" * 10)
    scraper = SimpleScraper(agent=AGENT)
    page = download(html)
    assert scraper.page_meta(page.url, page) == scraped(html).meta
    assert scraper.page_meta(page.url, Download(URL, 200, "image/png", b"\x89PNG")) == PageMeta()


def test_rel_nofollow_links_are_skipped_only_when_asked():
    html = ('<a href="/a" rel="nofollow">a</a><a href="/b" rel="noopener NOFOLLOW">b</a>'
            '<a href="/c" rel="nofollowing">c</a><area href="/d" rel="nofollow"><a href="/e">e</a>')
    assert len(scraped(html)) == 5
    skipping = SimpleScraper(agent=AGENT, skip_rel_nofollow=True)
    assert list(scraped(html, skipping)) == ["http://site.invalid/c", "http://site.invalid/e"]


def test_from_spec_takes_the_agent_and_rel_nofollow():
    scraper = SimpleScraper.from_spec(build_spec({
        "seeds": ["http://site.invalid/"], "fetch": {"user_agent": "MyBot/1.0 (+x)"},
        "scraper": {"obey_rel_nofollow": True}}))
    assert scraper.meta_names == {"robots", "mybot"} and scraper.skip_rel_nofollow


def test_hostile_meta_tags_cost_no_more_than_the_page():
    """A 5 MB content attribute, 50,000 robots meta tags, 50,000 canonical links: each page
    costs about what the parse of as many elements that mean nothing costs (the bound leaves
    room for a loaded machine)."""
    scraper = SimpleScraper(agent=AGENT)
    n = 50_000
    pages = {
        '<meta name="robots" content="' + "index," * 800_000 + 'noindex">':
            '<i name="robots" content="' + "index," * 800_000 + 'noindex">',
        '<meta name="robots" content="all">' * n: '<i name="robots" content="all">' * n,
        f'<meta name="{AGENT}" content="index">' * n: f'<i name="{AGENT}" content="index">' * n,
        '<link rel="canonical alternate" href="/x">' * n: '<i rel="canonical alternate" href="/x">' * n,
    }

    def timed(html: str) -> float:
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            scraped(html, scraper)
            best = min(best, time.perf_counter() - started)
        return best

    for hostile, inert in pages.items():
        assert timed(hostile) < 2 * timed(inert) + 0.2


def test_a_meta_content_is_read_to_its_first_kib_and_32_robots_tags_a_page():
    late = '<meta name="robots" content="' + "index," * 800_000 + 'noindex">'
    assert scraped(late).meta.robots == NEITHER
    assert scraped('<meta name="robots" content="all">' * 31 + _meta_tag("noindex")).meta.robots \
        == NOINDEX_ONLY
    assert scraped('<meta name="robots" content="all">' * 32 + _meta_tag("noindex")).meta.robots \
        == NEITHER


def _meta_tag(content: str) -> str:
    return f'<meta name="robots" content="{content}">'


# -- the job's rules ---------------------------------------------------------------------------------


def rules(**scraper) -> PageRules:
    return PageRules.from_spec(build_spec({"seeds": ["http://site.invalid/"], "scraper": scraper}))


def test_noindex_and_nofollow_from_tags_and_headers():
    judge = rules().judge
    assert judge(URL, download(), PageMeta(NOINDEX_ONLY)).skip == NOINDEX
    verdict = judge(URL, download(robots_tags=["nofollow"]), PageMeta())
    assert (verdict.skip, verdict.follow) == ("", False)
    verdict = judge(URL, download(robots_tags=[f"{AGENT}: noindex"]), PageMeta(NOFOLLOW_ONLY))
    assert (verdict.skip, verdict.follow) == (NOINDEX, False)
    assert judge(URL, download(robots_tags=["other: none"]), PageMeta()).follow


def test_each_directive_can_be_turned_off():
    meta = PageMeta(BOTH)
    verdict = rules(obey_noindex=False).judge(URL, download(), meta)
    assert (verdict.skip, verdict.follow) == ("", False)
    verdict = rules(obey_nofollow=False).judge(URL, download(), meta)
    assert (verdict.skip, verdict.follow) == (NOINDEX, True)
    off = rules(obey_noindex=False, obey_nofollow=False)
    assert not off.reads_pages
    assert off.judge(URL, download(robots_tags=["none"]), meta).follow


def test_canonical_elsewhere_in_scope_leaves_the_page_unsaved():
    judge = rules(dedupe_canonical=True).judge
    verdict = judge(URL, download(), PageMeta(canonicals=("http://site.invalid/Main?utm_source=x",)))
    assert (verdict.skip, verdict.canonical) == (CANONICAL, "http://site.invalid/Main")
    verdict = judge(URL, download(links=['</c>; rel="canonical"']), PageMeta())
    assert (verdict.skip, verdict.canonical) == (CANONICAL, "http://site.invalid/c")
    # Only when asked.
    assert rules().judge(URL, download(links=['</c>; rel="canonical"']), PageMeta()).skip == ""


@pytest.mark.parametrize("canonicals, link", [
    (("http://elsewhere.invalid/page",), None),  # off-site: out of the job's scope
    (("mailto:someone@site.invalid",), None),
    (("http://site.invalid/file.pdf",), None),  # a denied extension
    ((URL,), None),  # itself
    (("http://SITE.invalid:80/dir/page.html#top",), None),  # itself, in another form
    (("http://site.invalid/a",), '</b>; rel="canonical"'),  # the HTML and the header disagree
    (("http://site.invalid/a", "http://site.invalid/b"), None),  # two in the HTML
    (("http://[::1/",), None),  # malformed
])
def test_canonicals_that_change_nothing(canonicals, link):
    verdict = rules(dedupe_canonical=True).judge(
        URL, download(links=[link] if link else []), PageMeta(canonicals=canonicals))
    assert (verdict.skip, verdict.canonical) == ("", None)


def test_a_redirected_page_naming_its_final_url_is_saved():
    page = download(url="http://site.invalid/final")
    verdict = rules(dedupe_canonical=True).judge(
        "http://site.invalid/start", page, PageMeta(canonicals=("http://site.invalid/final",)))
    assert verdict.skip == ""


def test_a_canonical_the_ssrf_guard_refuses_is_ignored():
    """Any host in scope (same_host false): a canonical URL at a private address is no reason
    to leave the page unsaved, nor a URL to queue. The seed's own literal address is."""
    judge = PageRules.from_spec(build_spec({
        "seeds": ["http://127.0.0.1:8080/"],
        "scraper": {"dedupe_canonical": True, "same_host": False}})).judge
    for private in ("http://10.0.0.1/", "http://169.254.169.254/latest/", "http://localhost/x",
                    "http://127.0.0.1:9999/other-port"):
        assert judge(URL, download(), PageMeta(canonicals=(private,))).skip == "", private
    verdict = judge(URL, download(), PageMeta(canonicals=("http://127.0.0.1:8080/main",)))
    assert verdict.canonical == "http://127.0.0.1:8080/main"
    # A name is checked when it is fetched, as any link is.
    assert judge(URL, download(), PageMeta(canonicals=("http://a.invalid/",))).skip == CANONICAL


# -- the headers of a real fetch ---------------------------------------------------------------


def test_a_fetch_hands_over_every_x_robots_tag_and_link_line():
    lines = [("Content-Type", "text/html"), ("X-Robots-Tag", "googlebot: noindex"),
             ("X-Robots-Tag", f"{AGENT}: nofollow"), ("Link", '</c>; rel="canonical"'),
             ("Link", '</style.css>; rel="preload"'), ("Content-Length", "2")]

    def twice(handler):  # each header line as sent, the same name on two lines
        handler.send_response(200)
        for name, value in lines:
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(b"hi")

    with serve_routes({"/p": twice, "/q": lambda h: reply(h, 200, b"q", {})}) as (base, _, _log):
        fetcher = Fetcher(FetchSpec())
        got = fetcher.get(base + "/p")
        plain = fetcher.get(base + "/q")
    assert got.robots_tags == ("googlebot: noindex", f"{AGENT}: nofollow")
    assert got.links == ('</c>; rel="canonical"', '</style.css>; rel="preload"')
    assert header_directives(got.robots_tags, AGENT) == NOFOLLOW_ONLY
    assert (plain.robots_tags, plain.links) == ((), ())
    assert "robots_tags" not in got.meta()  # nothing of it travels with the save
