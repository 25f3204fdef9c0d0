"""Crawl policy, unit by unit: canonical URLs, page encodings, link scope, the SSRF guard and
failure classification (the command line's policy options: integration/test_policy_cli.py).
Fast; HTTP only on 127.0.0.1."""

from __future__ import annotations

import email.utils
import re
import ipaddress
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from distscrape_celery.web.encoding import decode_html
from distscrape_celery.errors import ConfigError, FetchError
from distscrape_celery.web.fetch import Download, Fetcher, retry_after
from distscrape_celery.job.sections import FetchSpec
from distscrape_celery.job.spec import build_spec
from distscrape_celery.web.scope import LinkScope
from distscrape_celery.scrapers import SimpleScraper
from distscrape_celery.web.ssrf import AddressGuard, AddressRefused, address_kind
from distscrape_celery.job.urls import Canonicalizer, normalize_url
from tests.support.guard import public_test_hooks, resolver
from tests.support.http import reply, serve


# -- canonical URLs -------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("url", "canonical"),
    [
        ("HTTP://Example.COM:80/a/./b/../c?z=1&a=2#frag", "http://example.com/a/c?a=2&z=1"),
        ("https://example.com:443", "https://example.com/"),
        ("https://example.com:8443/x", "https://example.com:8443/x"),
        ("http://example.com/p?utm_source=3&utm_medium=x&id=7&fbclid=1&gclid=2#f",
         "http://example.com/p?id=7"),
        ("http://example.com/p?utm_source=1", "http://example.com/p"),
        ("http://example.com/p?mc_cid=1&mc_eid=2&q=a+b", "http://example.com/p?q=a+b"),
        ("http://example.com/h/über", "http://example.com/h/%C3%BCber"),
        ("http://[::0:1]:8080/x", "http://[::1]:8080/x"),
    ],
)
def test_canonical_form(url: str, canonical: str) -> None:
    assert normalize_url(url) == canonical


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://example.com/x", "not an http(s) URL"),
        ("mailto:a@example.com", "not an http(s) URL"),
        ("http://user:pw@example.com/", "credentials"),
        ("http:///path", "no host"),
        ("http://example.com:99999/", "Port out of range"),
    ],
)
def test_non_crawlable_urls_are_value_errors(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        normalize_url(url)


def test_tracking_parameters_are_configurable() -> None:
    keep_utm = Canonicalizer(["sessionid", "ref_*"])
    assert keep_utm.canonical("http://e.invalid/?utm_source=1&sessionid=9&ref_a=1").url == (
        "http://e.invalid/?utm_source=1"
    )
    assert Canonicalizer([]).canonical("http://e.invalid/?gclid=1").url == "http://e.invalid/?gclid=1"
    spec = build_spec({"seeds": ["http://e.invalid/?sessionid=1&x=2"],
                       "scraper": {"strip_params": ["sessionid"]}})
    assert spec.seeds == ["http://e.invalid/?x=2"]  # seeds go through the job's own rules


def test_two_thousand_tracking_variants_of_one_page_are_one_link() -> None:
    hrefs = "".join(f'<a href="/page?utm_source={n}&utm_campaign=c#f{n}">x</a>' for n in range(2000))
    body = f"<html><body>{hrefs}<a href='/page#top'>again</a></body></html>".encode()
    download = Download("http://site.invalid/", 200, "text/html", body)
    assert SimpleScraper().find_items(download.url, download) == ["http://site.invalid/page"]


# -- encodings ------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("text/html", '<a href="/h/über">'.encode()),  # no charset anywhere: UTF-8 first
        ("", '<a href="/h/über">'.encode()),
        ("text/html", '<a href="/h/über">'.encode("latin-1")),  # not UTF-8: windows-1252
        ("text/html", '<meta charset="iso-8859-1"><a href="/h/über">'.encode("latin-1")),
        ("text/html; charset=latin-1", '<a href="/h/über">'.encode("latin-1")),
        ("text/html; charset=iso-8859-1", b"\xef\xbb\xbf" + '<a href="/h/über">'.encode()),  # BOM wins
        ("text/html; charset=no-such-codec", '<a href="/h/über">'.encode()),
    ],
)
def test_pages_are_decoded_as_browsers_do(content_type: str, body: bytes) -> None:
    assert '<a href="/h/über">' in decode_html(content_type, body)


def test_utf8_link_without_charset_is_requested_as_utf8() -> None:
    body = '<html><a href="/h/über">über</a></html>'.encode()
    download = Download("http://site.invalid/", 200, "text/html", body)
    assert SimpleScraper().find_items(download.url, download) == [
        "http://site.invalid/h/%C3%BCber"  # not /h/%C3%83%C2%BCber (Ã¼)
    ]


# -- scope ----------------------------------------------------------------------------------------

def scope_of(**scraper) -> LinkScope:
    return LinkScope.from_spec(build_spec({"seeds": ["http://www.site.invalid/"], "scraper": scraper}))


def test_default_scope_is_the_seeds_hosts_exactly() -> None:
    scope = scope_of()
    assert scope.accept("http://WWW.site.invalid/a#x") == "http://www.site.invalid/a"
    assert scope.accept("https://www.site.invalid:8443/a") == "https://www.site.invalid:8443/a"
    assert scope.accept("http://sub.www.site.invalid/a") is None
    assert scope.accept("http://other.invalid/a") is None


def test_allowed_domains_take_their_subdomains() -> None:
    scope = scope_of(allowed_domains=["Site.Invalid"])
    assert scope.accept("http://site.invalid/") == "http://site.invalid/"
    assert scope.accept("http://a.b.site.invalid/") == "http://a.b.site.invalid/"
    assert scope.accept("http://evilsite.invalid/") is None
    assert scope.accept("http://site.invalid.evil.invalid/") is None


def test_allow_and_deny_regexes_and_link_regex() -> None:
    # link_regex is one more allow pattern: a link must match one of them, and no deny pattern.
    scope = scope_of(allow_regex=["/docs/", "/blog/"], deny_regex=["/draft"], link_regex="/news/")
    assert scope.accept("http://www.site.invalid/docs/2024/a") is not None
    assert scope.accept("http://www.site.invalid/news/today") is not None
    assert scope.accept("http://www.site.invalid/blog/2023/draft-1") is None
    assert scope.accept("http://www.site.invalid/shop/2024/") is None


@pytest.mark.parametrize(
    ("path", "followed"),
    [("/a.PNG", False), ("/x.tar.gz", False), ("/doc.pdf?download=1", False), ("/page.html", True),
     ("/dir.png/", True), ("/archive.gz.html", True), ("/noext", True)],
)
def test_denied_extensions(path: str, followed: bool) -> None:
    assert (scope_of().accept("http://www.site.invalid" + path) is not None) is followed
    assert scope_of(deny_extensions=[]).accept("http://www.site.invalid" + path) is not None


def test_scope_spec_errors_name_the_field() -> None:
    for scraper, field in [
        ({"allowed_domains": ["https://x.invalid/"]}, "scraper.allowed_domains"),
        ({"allow_regex": ["(unclosed"]}, "scraper.allow_regex"),
        ({"deny_regex": ["["]}, "scraper.deny_regex"),
        ({"max_depth": -1}, "scraper.max_depth"),
        ({"allowed_domains": ["x.invalid"], "same_host": False}, "scraper"),
    ]:
        with pytest.raises(ConfigError, match=field):
            build_spec({"seeds": ["http://x.invalid/"], "scraper": scraper})


# -- SSRF guard -----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("address", "kind"),
    [("127.0.0.1", "a loopback"), ("169.254.169.254", "a link-local"), ("10.1.2.3", "a private"),
     ("192.168.0.1", "a private"), ("::1", "a loopback"), ("fe80::1", "a link-local"),
     ("::ffff:127.0.0.1", "a loopback"), ("0.0.0.0", "an unspecified"), ("224.0.0.1", "a multicast"),
     ("100.64.0.1", "a non-public"), ("93.184.216.34", None), ("2606:4700::1111", None),
     # IPv6 forms that carry an IPv4 address are judged by it: mapped, NAT64, 6to4, Teredo.
     ("::ffff:169.254.169.254", "a link-local"), ("::ffff:93.184.216.34", None),
     ("64:ff9b::a9fe:a9fe", "a link-local"), ("64:ff9b::7f00:1", "a loopback"),
     ("64:ff9b::5db8:d822", None), ("64:ff9b:1::a9fe:a9fe", "a reserved"),
     ("2002:7f00:1::1", "a loopback"), ("2002:a9fe:a9fe::1", "a link-local"),
     ("2002:a00:1::1", "a private"), ("2002:5db8:d822::1", None),
     ("2001:0:4136:e378:8000:63bf:80ff:fffe", "a loopback"),  # Teredo, client 127.0.0.1
     ("2001:0:4136:e378:8000:63bf:a201:5601", "a private"),  # Teredo, public client: 2001::/23
     ("fec0::1", "a site-local"), ("::7f00:1", "a reserved"), ("ff02::1", "a multicast")],
)
def test_address_kinds(address: str, kind: str | None) -> None:
    assert address_kind("h", ipaddress.ip_address(address)) == kind


def test_guard_refuses_private_addresses_by_name_and_literal() -> None:
    guard = AddressGuard(
        trusted_urls=["http://public.invalid/"],
        resolver=resolver({"public.invalid": ["93.184.216.34"], "meta.invalid": ["169.254.169.254"],
                           "mixed.invalid": ["93.184.216.35", "10.0.0.1"]}),
    )
    assert guard.addresses("public.invalid", 80) == ["93.184.216.34"]
    with pytest.raises(AddressRefused, match=r"^refused: 169\.254\.169\.254 is a link-local address"):
        guard.addresses("169.254.169.254", 80)
    with pytest.raises(AddressRefused, match="meta.invalid resolves to 169.254.169.254, a link-local"):
        guard.addresses("meta.invalid", 80)
    with pytest.raises(AddressRefused, match="10.0.0.1, a private"):  # one bad answer is enough
        guard.addresses("mixed.invalid", 80)
    with pytest.raises(AddressRefused, match="loopback"):
        guard.addresses("[::1]", 80)
    with pytest.raises(socket.gaierror):
        guard.addresses("nowhere.invalid", 80)


def answers(host: str, *replies: list[str]):
    """A resolver whose answer for ``host`` changes at each call: ``replies`` in turn, then the
    last one again. It records every name it is asked."""
    queue = list(replies)
    asked: list[str] = []

    def resolve(name: str) -> list[str]:
        asked.append(name)
        if name != host:
            raise socket.gaierror(socket.EAI_NONAME, "unknown name")
        return queue.pop(0) if len(queue) > 1 else queue[0]

    resolve.asked = asked  # type: ignore[attr-defined]
    return resolve


def test_guard_trusts_the_literal_addresses_of_the_seeds_only() -> None:
    spec = build_spec({"seeds": ["http://10.0.0.5:8080/", "http://[fd00::5]/", "http://intranet.invalid/"]})
    guard = AddressGuard.from_spec(
        spec, resolver=resolver({"intranet.invalid": ["10.0.0.6"], "alias.invalid": ["10.0.0.5"]})
    )
    assert guard.addresses("10.0.0.5", 8080) == ["10.0.0.5"]
    assert guard.addresses("[fd00::5]", 80) == ["fd00::5"]
    # A seed given by name gets no trust from its DNS answer: the user is told what permits it.
    with pytest.raises(AddressRefused, match=r"^refused: intranet\.invalid resolves to 10\.0\.0\.6, "
                       r"a private address .*--allow-private / fetch\.allow_private"):
        guard.addresses("intranet.invalid", 80)
    with pytest.raises(AddressRefused, match="169.254.169.254"):
        guard.addresses("169.254.169.254", 80)
    allowed = AddressGuard.from_spec(
        build_spec({"seeds": ["http://intranet.invalid/"], "fetch": {"allow_private": True}}),
        resolver=resolver({"intranet.invalid": ["10.0.0.6"], "db.invalid": ["10.0.0.7"]}),
    )
    assert allowed.addresses("intranet.invalid", 80) == ["10.0.0.6"]
    assert allowed.addresses("db.invalid", 80) == ["10.0.0.7"]


def test_a_seed_literal_address_is_trusted_only_by_that_literal_on_its_port() -> None:
    """A seed's literal private address trusts that address and port, named literally: never a
    name that resolves to it, never another port of it, never a name that redirects there."""
    spec = build_spec({"seeds": ["http://10.0.0.5:8080/", "https://[fd00::5]/"]})
    guard = AddressGuard.from_spec(spec, resolver=resolver(
        {"alias.invalid": ["10.0.0.5"], "alias6.invalid": ["fd00::5"]}))
    assert guard.addresses("10.0.0.5", 8080) == ["10.0.0.5"]
    assert guard.addresses("[fd00::5]", 443) == ["fd00::5"]
    with pytest.raises(AddressRefused, match=r"^refused: alias\.invalid resolves to 10\.0\.0\.5, "
                       r"a private address \(only the address and port a seed URL gives literally"):
        guard.addresses("alias.invalid", 8080)
    with pytest.raises(AddressRefused, match="alias6.invalid resolves to fd00::5"):
        guard.addresses("alias6.invalid", 443)
    with pytest.raises(AddressRefused, match=r"^refused: 10\.0\.0\.5 is a private address on port "
                       r"80, not the seed's port"):
        guard.addresses("10.0.0.5", 80)
    with pytest.raises(AddressRefused, match="fd00::5 is a private address on port 80"):
        guard.addresses("[fd00::5]", 80)


def test_guard_trusts_a_literal_download_url_host() -> None:
    spec = build_spec({"seeds": ["1"], "scraper": {
        "kind": "ids", "id_regex": "x", "download_url_fmt": "http://10.0.0.7:9/item/{id}"}})
    assert AddressGuard.from_spec(spec, resolver=resolver({})).addresses("10.0.0.7", 9) == ["10.0.0.7"]


def test_a_seed_name_answering_public_then_metadata_is_refused() -> None:
    """The seed's own name answers a public address, then 169.254.169.254: the second answer is
    refused like any other, and it makes the metadata address trusted for nothing else."""
    resolve = answers("flip.invalid", ["93.184.216.34"], ["169.254.169.254"])
    guard = AddressGuard.from_spec(build_spec({"seeds": ["http://flip.invalid/"]}), resolver=resolve)
    assert guard.addresses("flip.invalid", 80) == ["93.184.216.34"]
    for _ in range(2):
        with pytest.raises(AddressRefused, match="flip.invalid resolves to 169.254.169.254, a link-local"):
            guard.addresses("flip.invalid", 80)
    with pytest.raises(AddressRefused, match=r"^refused: 169\.254\.169\.254 is a link-local"):
        guard.addresses("169.254.169.254", 80)


def test_a_seed_name_answering_metadata_then_public_trusts_nothing() -> None:
    """The reverse order: the seed's name answers 169.254.169.254 twice, then a public address.
    Another host is refused first, so that any look the guard takes at its seeds sees the
    metadata address. That address stays refused, by the seed's name and as a literal."""
    meta = ["169.254.169.254"]
    resolve = answers("flip.invalid", meta, meta, ["93.184.216.34"])
    guard = AddressGuard.from_spec(build_spec({"seeds": ["http://flip.invalid/"]}), resolver=resolve)
    with pytest.raises(AddressRefused, match="10.0.0.1"):
        guard.addresses("10.0.0.1", 80)
    for _ in range(2):
        with pytest.raises(AddressRefused, match="flip.invalid resolves to 169.254.169.254, a link-local"):
            guard.addresses("flip.invalid", 80)
    assert guard.addresses("flip.invalid", 80) == ["93.184.216.34"]
    with pytest.raises(AddressRefused, match=r"^refused: 169\.254\.169\.254 is a link-local"):
        guard.addresses("169.254.169.254", 80)


def test_localhost_names_are_loopback_without_asking_the_resolver() -> None:
    """``localhost`` and names under ``.localhost`` (RFC 6761) are the loopback addresses, never
    a resolver's answer; a seed there trusts them as a literal 127.0.0.1 would."""
    resolve = answers("localhost", ["169.254.169.254"])
    spec = build_spec({"seeds": ["http://localhost:8000/"]})
    guard = AddressGuard.from_spec(spec, resolver=resolve)
    for name in ("localhost", "LocalHost.", "app.localhost"):
        assert guard.addresses(name, 8000) == ["127.0.0.1", "::1"]
    assert guard.addresses("127.0.0.1", 8000) == ["127.0.0.1"]
    assert resolve.asked == []  # type: ignore[attr-defined]
    other = AddressGuard.from_spec(build_spec({"seeds": ["http://site.invalid/"]}), resolver=resolve)
    with pytest.raises(AddressRefused, match="^refused: localhost resolves to 127.0.0.1, a loopback"):
        other.addresses("localhost", 80)


def test_a_localhost_seed_is_crawled() -> None:
    with serve({"/": lambda h: reply(h, 200, b"home")}) as (base, _, log):
        url = base.replace("127.0.0.1", "localhost") + "/"
        assert Fetcher.for_job(build_spec({"seeds": [url]})).get(url).body == b"home"
    assert log[0]["headers"]["Host"] == url[len("http://"):-1]


def test_the_fetcher_never_reaches_an_internal_answer_of_the_seed_name() -> None:
    """End to end: the seed's name answers 127.0.0.1 (a "public" site here) and then 127.0.0.2,
    where an internal server listens on the same port. Nothing is fetched from it."""
    secret_hits: list[str] = []

    class Secret(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            secret_hits.append(self.path)
            reply(self, 200, b"internal")

        def log_message(self, format: str, *args: object) -> None:
            pass

    page = {"/": lambda h: reply(h, 200, b"public", {"Connection": "close"})}
    with serve(page) as (base, _, log):
        port = int(base.rsplit(":", 1)[1])
        internal = ThreadingHTTPServer(("127.0.0.2", port), Secret)
        threading.Thread(target=internal.serve_forever, daemon=True).start()
        try:
            hooks = {"resolver": answers("flip.invalid", ["127.0.0.1"], ["127.0.0.2"]),
                     "classify": lambda host, ip: None if str(ip) == "127.0.0.1" else address_kind(host, ip)}
            url = f"http://flip.invalid:{port}/"
            fetch = Fetcher.for_job(build_spec({"seeds": [url], "fetch": {"read_timeout": 2}}), **hooks)
            assert fetch.get(url).body == b"public"
            for _ in range(2):
                with pytest.raises(FetchError, match="flip.invalid resolves to 127.0.0.2, a loopback"):
                    fetch.get(url)
        finally:
            internal.shutdown()
            internal.server_close()
    assert secret_hits == [] and [e["path"] for e in log] == ["/"]


def test_guarded_fetcher_connects_to_the_checked_address_and_refuses_every_hop() -> None:
    secret_hits: list[str] = []
    routes = {
        "/page": lambda h: reply(h, 200, b"public page", {"Content-Type": "text/html"}),
        "/to-loopback": None,  # filled in below, once the port is known
        "/to-metadata": lambda h: reply(h, 302, headers={"Location": "http://169.254.169.254/latest/"}),
        "/secret": lambda h: (secret_hits.append(h.path), reply(h, 200, b"secret")),
    }
    with serve(routes) as (base, _, log):
        port = base.rsplit(":", 1)[1]
        routes["/to-loopback"] = lambda h: reply(h, 302, headers={"Location": f"{base}/secret"})
        spec = build_spec({"seeds": [f"http://public.invalid:{port}/page"],
                           "fetch": {"connect_timeout": 2, "read_timeout": 2}})
        fetch = Fetcher.for_job(spec, **public_test_hooks({"public.invalid": "127.0.0.1"}))
        got = fetch.get(f"http://public.invalid:{port}/page")
        assert (got.status, got.body) == (200, b"public page")
        assert log[0]["headers"]["Host"] == f"public.invalid:{port}"  # the name, not the address
        for path, address in [("/to-loopback", "127.0.0.1 is a loopback"),
                              ("/to-metadata", "169.254.169.254 is a link-local")]:
            with pytest.raises(FetchError, match=f"^refused: {address} address") as info:
                fetch.get(f"http://public.invalid:{port}{path}")
            assert info.value.retryable is False
        with pytest.raises(FetchError, match="127.0.0.1 is a loopback"):
            fetch.get(f"{base}/secret")
    assert secret_hits == []
    assert [entry["path"] for entry in log] == ["/page", "/to-loopback", "/to-metadata"]


def test_a_loopback_seed_may_crawl_its_own_address() -> None:
    with serve({"/": lambda h: reply(h, 200, b"home")}) as (base, _, _log):
        spec = build_spec({"seeds": [base + "/"]})
        assert Fetcher.for_job(spec).get(base + "/").body == b"home"


# -- failures -------------------------------------------------------------------------------------

def test_retry_after_seconds_and_http_date() -> None:
    now = 1_700_000_000.0
    assert retry_after("120", now) == 120.0
    assert retry_after(email.utils.formatdate(now + 30, usegmt=True), now) == pytest.approx(30)
    assert retry_after(email.utils.formatdate(now - 30, usegmt=True), now) == 0.0
    assert retry_after("soon", now) is None
    assert retry_after(None, now) is None
    assert retry_after("-5", now) is None


@pytest.mark.parametrize(
    ("status", "headers", "retryable", "after"),
    [(429, {"Retry-After": "7"}, True, 7.0), (503, {"Retry-After": "2"}, True, 2.0),
     (500, {}, True, None), (408, {}, True, None), (404, {"Retry-After": "5"}, False, None),
     (403, {}, False, None), (410, {}, False, None)],
)
def test_status_classification_carries_retry_after(status, headers, retryable, after) -> None:
    with serve({"/x": lambda h: reply(h, status, b"no", headers)}) as (base, _, _log):
        with pytest.raises(FetchError) as info:
            Fetcher(FetchSpec(read_timeout=2)).get(base + "/x")
    assert (info.value.retryable, info.value.retry_after) == (retryable, after)


def test_dns_failure_is_retryable() -> None:
    spec = build_spec({"seeds": ["http://nowhere.invalid/"]})
    with pytest.raises(FetchError, match="cannot resolve host") as info:
        Fetcher.for_job(spec, resolver=resolver({})).get("http://nowhere.invalid/")
    assert info.value.retryable is True


def test_redirect_loop_is_named() -> None:
    routes = {
        "/a": lambda h: reply(h, 302, headers={"Location": "/b"}),
        "/b": lambda h: reply(h, 301, headers={"Location": "/a#again"}),
    }
    with serve(routes) as (base, _, log):
        with pytest.raises(FetchError, match="^redirect loop: ") as info:
            Fetcher(FetchSpec(read_timeout=2, max_redirects=10)).get(base + "/a")
    assert info.value.retryable is False
    assert len(log) == 2


def test_total_timeout_covers_a_chain_of_slow_redirects() -> None:
    def slow_hop(h) -> None:
        n = int(h.path.rsplit("/", 1)[1])
        time.sleep(0.4)
        reply(h, 302, headers={"Location": f"/hop/{n + 1}"})

    routes = {f"/hop/{n}": slow_hop for n in range(20)}
    with serve(routes) as (base, _, log):
        fetch = Fetcher(FetchSpec(read_timeout=5, total_timeout=1, max_redirects=20))
        with pytest.raises(FetchError, match=r"\(total_timeout\) (fetching .*/hop/|following redirects)") as info:
            fetch.get(base + "/hop/0")
    assert info.value.retryable is True
    assert len(log) <= 4  # not all 20 hops of read_timeout each


def test_allowed_content_types_are_checked_before_the_body_is_read() -> None:
    big = b"\x89PNG" + b"\0" * 1_000_000
    routes = {"/img": lambda h: reply(h, 200, big, {"Content-Type": "image/png"}),
              "/page": lambda h: reply(h, 200, b"<p>", {"Content-Type": "text/html; charset=utf-8"})}
    with serve(routes) as (base, _, _log):
        spec = build_spec({"seeds": [base + "/"],
                           "scraper": {"allowed_content_types": ["text/*", "application/xhtml+xml"]}})
        fetch = Fetcher.for_job(spec)
        assert fetch.get(base + "/page").body == b"<p>"
        with pytest.raises(FetchError, match="content type image/png .* allowed_content_types") as info:
            fetch.get(base + "/img")
    assert info.value.retryable is False


# -- command line ---------------------------------------------------------------------------------

