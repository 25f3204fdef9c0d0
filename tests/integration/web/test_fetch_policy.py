"""A job's fetch policy on real HTTP over loopback: the headers, credentials and cookies each
request carries as the server receives them, and the proxies requests go through, as those
proxies (tests/support/proxies.py) count them. Names resolve through the guard's injected
resolver only: no test asks real DNS."""

from __future__ import annotations

import base64
import socket
import threading

import pytest
from pydantic import SecretStr

from distscrape_celery.errors import FetchError
from distscrape_celery.job.spec import build_spec
from distscrape_celery.web.fetch import Fetcher
from distscrape_celery.web.fetch_policy import FetchPolicy, fetch_policy
from tests.support.guard import public_test_hooks, resolver
from tests.support.http import reply, serve
from tests.support.proxies import http_proxy, socks5_proxy


def ok(handler) -> None:
    reply(handler, 200, b"ok", {"Content-Type": "text/plain"})


def redirect_to(url: str):
    def route(handler) -> None:
        reply(handler, 302, b"", {"Location": url})
    return route


def policy_fetcher(fetch: dict, seeds: list[str], *, proxies=None, credentials=None,
                   cookie_store=None, job="j", **guard_hooks):
    """The fetcher and fetch policy of a job with ``fetch`` as its [fetch] section, on a worker
    with ``proxies`` and ``credentials``. Without ``guard_hooks`` the job may reach any
    loopback port (the test sites'); with them its guard is the default one, with those hooks."""
    spec = build_spec({"seeds": seeds, "fetch": {"allow_private": not guard_hooks, **fetch}})
    policy = FetchPolicy.for_job(
        job, spec, proxies=proxies or {},
        credentials={k: SecretStr(v) for k, v in (credentials or {}).items()},
        cookie_store=cookie_store)
    return Fetcher.for_job(spec, **guard_hooks), policy


def get(fetcher: Fetcher, policy, url: str):
    with fetch_policy(policy):
        return fetcher.get(url)


def domain(base: str) -> str:
    return base.split("://", 1)[1]


@pytest.fixture
def two_sites():
    with serve({"/p": ok}) as (a, _, log_a), serve({"/p": ok}) as (b, _, log_b):
        yield (a, log_a), (b, log_b)


def test_headers_of_the_job_and_of_a_domain_are_sent_where_they_belong(two_sites):
    (a, log_a), (b, log_b) = two_sites
    fetcher, policy = policy_fetcher(
        {"headers": {"X-Job": "1", "Accept-Language": "en"},
         "domains": {domain(b): {"headers": {"accept-language": "fr", "X-Site": "b"}}}},
        [a + "/"])
    get(fetcher, policy, a + "/p")
    get(fetcher, policy, b + "/p")
    sent_a, sent_b = log_a[0]["headers"], log_b[0]["headers"]
    assert sent_a["X-Job"] == "1" and sent_a.get_all("Accept-Language") == ["en"]
    assert "X-Site" not in sent_a
    assert sent_b["X-Job"] == "1" and sent_b["X-Site"] == "b"
    assert sent_b.get_all("Accept-Language") == ["fr"]  # replaced, not sent twice
    assert sent_a["User-Agent"] == sent_b["User-Agent"] == "distscrape-celery/0.1"


def test_auth_goes_only_to_the_domains_it_is_given_for():
    with serve({"/p": ok}) as (a, _, log_a), serve({"/p": ok}) as (b, _, log_b), \
            serve({"/p": ok}) as (c, _, log_c):
        a_routes_to = {"/to-c": redirect_to(c + "/p"), "/to-b": redirect_to(b + "/p")}
        with serve({"/p": ok, **a_routes_to}) as (seed, _, log_seed):
            fetcher, policy = policy_fetcher(
                {"auth": {"scheme": "bearer", "credential": "SHOP_TOKEN"},
                 "domains": {domain(b): {"auth": {"scheme": "basic", "credential": "B_LOGIN"}}}},
                [seed + "/"],
                credentials={"SHOP_TOKEN": "tok-123", "B_LOGIN": "bob:pw"})
            get(fetcher, policy, seed + "/p")
            get(fetcher, policy, a + "/p")
            get(fetcher, policy, seed + "/to-c")
            get(fetcher, policy, seed + "/to-b")
    assert [r["headers"]["Authorization"] for r in log_seed] == ["Bearer tok-123"] * 3
    # The job's auth is for its seeds' domain: another domain gets none, on a redirect neither.
    assert "Authorization" not in log_a[0]["headers"]
    assert [r["path"] for r in log_c] == ["/p"] and "Authorization" not in log_c[0]["headers"]
    # A domain with its own auth gets its own, also when a redirect leads there.
    assert log_b[0]["headers"]["Authorization"] == "Basic " + base64.b64encode(b"bob:pw").decode()


def test_a_credential_missing_on_the_worker_fails_the_fetch_for_good(caplog):
    with serve({"/p": ok}) as (base, _, log):
        fetcher, policy = policy_fetcher(
            {"auth": {"scheme": "bearer", "credential": "SHOP_TOKEN"}}, [base + "/"],
            credentials={"OTHER": "other-secret"})
        with pytest.raises(FetchError) as raised:
            get(fetcher, policy, base + "/p")
    assert not raised.value.retryable
    assert "DISTSCRAPE_CREDENTIAL_SHOP_TOKEN" in str(raised.value)
    assert log == []  # nothing was sent without it


def test_a_basic_credential_without_a_password_is_refused_without_showing_it():
    with serve({"/p": ok}) as (base, _, log):
        fetcher, policy = policy_fetcher(
            {"auth": {"scheme": "basic", "credential": "LOGIN"}}, [base + "/"],
            credentials={"LOGIN": "just-a-secret-token"})
        with pytest.raises(FetchError) as raised:
            get(fetcher, policy, base + "/p")
    assert not raised.value.retryable and "USER:PASSWORD" in str(raised.value)
    assert "just-a-secret-token" not in str(raised.value)
    assert log == []


# -- proxies ------------------------------------------------------------------------------------

def test_requests_go_through_an_http_proxy_with_its_credentials(two_sites):
    (a, log_a), _ = two_sites
    with http_proxy(credentials="px:secret") as proxy:
        fetcher, policy = policy_fetcher(
            {"proxies": ["office"], "headers": {"X-Job": "1"}}, [a + "/"],
            proxies={"office": proxy.url("http", "px:secret")})
        assert get(fetcher, policy, a + "/p").body == b"ok"
        assert get(fetcher, policy, a + "/p").body == b"ok"
    assert [e["target"] for e in proxy.log.entries] == [a + "/p"] * 2
    assert proxy.log.entries[0]["headers"]["x-job"] == "1"
    assert len(log_a) == 2
    # The proxy's credentials are for the proxy: the site never sees them.
    assert all("Proxy-Authorization" not in r["headers"] for r in log_a)


def test_proxies_are_taken_in_turn_and_a_domain_may_go_direct(two_sites):
    (a, log_a), (b, log_b) = two_sites
    with http_proxy() as one, http_proxy() as two:
        fetcher, policy = policy_fetcher(
            {"proxies": ["one", "two"], "domains": {domain(b): {"proxies": []}}}, [a + "/", b + "/"],
            proxies={"one": one.url("http"), "two": two.url("http")})
        for _ in range(4):
            get(fetcher, policy, a + "/p")
        get(fetcher, policy, b + "/p")
    assert len(one.log) == 2 and len(two.log) == 2
    assert len(log_a) == 4 and len(log_b) == 1  # b's request went straight to it


def test_a_socks_proxy_is_given_the_address_the_guard_checked():
    """Also with socks5h, the proxy resolves nothing: it is asked for the checked address."""
    with serve({"/p": ok}) as (base, _, log), socks5_proxy(credentials="u:pw") as proxy:
        port = int(base.rsplit(":", 1)[1])
        url = f"http://shop.example:{port}/p"
        fetcher, policy = policy_fetcher(
            {"proxies": ["tor"]}, [url], proxies={"tor": proxy.url("socks5h", "u:pw")},
            **public_test_hooks({"shop.example": "public"}))
        assert get(fetcher, policy, url).body == b"ok"
    [entry] = proxy.log.entries
    assert (entry["address_type"], entry["host"], entry["port"]) == ("ipv4", "127.0.0.1", port)
    assert entry["user"] == "u"
    assert log[0]["headers"]["Host"] == f"shop.example:{port}"


@pytest.mark.parametrize("scheme,make", [("http", http_proxy), ("socks5", socks5_proxy),
                                         ("socks5h", socks5_proxy)])
def test_the_ssrf_guard_checks_a_target_before_it_goes_to_a_proxy(scheme, make):
    """A name that resolves (here) to a loopback address is refused, and the proxy is never
    asked; the proxy's own loopback address is the operator's and is used (the seed)."""
    with serve({"/p": ok}) as (base, _, log), make() as proxy:
        port = int(base.rsplit(":", 1)[1])
        fetcher, policy = policy_fetcher(
            {"proxies": ["p"]}, ["http://public.example/"], proxies={"p": proxy.url(scheme)},
            resolver=resolver({"internal.example": ["127.0.0.1"]}))
        with pytest.raises(FetchError) as raised:
            get(fetcher, policy, f"http://internal.example:{port}/p")
    assert not raised.value.retryable and "loopback" in str(raised.value)
    assert len(proxy.log) == 0 and log == []


def test_an_https_target_goes_through_a_connect_tunnel_its_credential_inside():
    """The tunnel's far end speaks TLS only in its first bytes (no certificate this machine
    trusts): the proxy is asked to CONNECT, and what it relays is a TLS handshake, never the
    request's Authorization in clear."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    first: list[bytes] = []

    def accept() -> None:
        conn, _ = listener.accept()
        first.append(conn.recv(1))
        conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    url = f"https://127.0.0.1:{port}/p"
    with http_proxy() as proxy:
        fetcher, policy = policy_fetcher(
            {"proxies": ["p"], "auth": {"scheme": "bearer", "credential": "T"}}, [url],
            proxies={"p": proxy.url("http")}, credentials={"T": "tok-in-tunnel"})
        with pytest.raises(FetchError):
            get(fetcher, policy, url)
    thread.join(5)
    listener.close()
    [entry] = proxy.log.entries
    assert (entry["method"], entry["target"]) == ("CONNECT", f"127.0.0.1:{port}")
    assert "authorization" not in entry["headers"]
    assert first == [b"\x16"]  # a TLS handshake record


def test_an_unknown_proxy_fails_the_fetch_for_good(two_sites):
    (a, log_a), _ = two_sites
    fetcher, policy = policy_fetcher({"proxies": ["nowhere"]}, [a + "/"],
                                     proxies={"office": "http://127.0.0.1:9"})
    with pytest.raises(FetchError) as raised:
        get(fetcher, policy, a + "/p")
    assert not raised.value.retryable
    assert "'nowhere'" in str(raised.value) and "office" in str(raised.value)
    assert log_a == []


def test_a_proxy_that_is_down_is_retryable_and_its_credentials_never_shown(two_sites):
    (a, _), _ = two_sites
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    for scheme in ("http", "socks5"):
        fetcher, policy = policy_fetcher(
            {"proxies": ["p"]}, [a + "/"], proxies={"p": f"{scheme}://u:hush@127.0.0.1:{port}"})
        with pytest.raises(FetchError) as raised:
            get(fetcher, policy, a + "/p")
        assert raised.value.retryable, str(raised.value)
        assert "hush" not in str(raised.value)
