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
    with http_proxy(credentials="px:se:cr@t") as proxy:
        fetcher, policy = policy_fetcher(
            {"proxies": ["office"], "headers": {"X-Job": "1"}}, [a + "/"],
            proxies={"office": proxy.url("http", "px:se%3Acr%40t")})
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
            {"proxies": ["one", "two"], "domains": {domain(b): {"proxies": []}}},
            [a + "/", b + "/"],
            proxies={"one": one.url("http"), "two": two.url("http")})
        for _ in range(4):
            get(fetcher, policy, a + "/p")
        get(fetcher, policy, b + "/p")
    assert len(one.log) == 2 and len(two.log) == 2
    assert len(log_a) == 4 and len(log_b) == 1  # b's request went straight to it


def test_a_socks_proxy_is_given_the_address_the_guard_checked():
    """Also with socks5h, the proxy resolves nothing: it is asked for the checked address."""
    with serve({"/p": ok}) as (base, _, log), socks5_proxy(credentials="u:p@ss") as proxy:
        port = int(base.rsplit(":", 1)[1])
        url = f"http://shop.example:{port}/p"
        fetcher, policy = policy_fetcher(
            {"proxies": ["tor"]}, [url], proxies={"tor": proxy.url("socks5h", "u:p%40ss")},
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


# -- cookies --------------------------------------------------------------------------------------

def set_cookies(*cookies: str):
    def route(handler) -> None:
        handler.send_response(200)
        for cookie in cookies:
            handler.send_header("Set-Cookie", cookie)
        handler.send_header("Content-Length", "2")
        handler.end_headers()
        handler.wfile.write(b"ok")
    return route


def cookies_sent(entry: dict) -> set[str]:
    header = entry["headers"].get("Cookie")
    return set(header.split("; ")) if header else set()


@pytest.fixture
def cookie_store(redis_url):
    import redis

    from distscrape_celery.web.cookies import RedisCookieStore

    client = redis.Redis.from_url(redis_url)
    yield RedisCookieStore(client)
    client.close()


def test_cookies_follow_path_secure_and_expiry_rules(cookie_store):
    routes = {
        "/login": set_cookies("sid=abc; Path=/", "pref=dark; Path=/app", "tls=1; Secure",
                              "brief=1; Max-Age=3"),
        "/logout": set_cookies("pref=; Path=/app; Max-Age=0"),
        "/app/page": ok, "/other": ok,
    }
    with serve(routes) as (base, _, log):
        fetcher, policy = policy_fetcher({"cookies": True}, [base + "/"],
                                         cookie_store=cookie_store)
        get(fetcher, policy, base + "/login")
        get(fetcher, policy, base + "/app/page")
        get(fetcher, policy, base + "/other")
        get(fetcher, policy, base + "/logout")
        import time
        time.sleep(3.1)  # http.cookiejar counts whole seconds: brief lives 2 to 3 s
        get(fetcher, policy, base + "/app/page")
    by_request = [cookies_sent(entry) for entry in log]
    assert by_request[0] == set()
    assert by_request[1] == {"sid=abc", "pref=dark", "brief=1"}  # never the Secure one on http
    assert by_request[2] == {"sid=abc", "brief=1"}  # pref's path is /app
    assert by_request[4] == {"sid=abc"}  # pref deleted, brief expired


def test_workers_share_one_jar_and_domain_rules_hold(cookie_store):
    """Two fetchers (as two workers) and a jar in Redis: a Domain cookie set by one host is
    sent by the other fetcher to a sibling host, never to another site, and a site cannot set
    or delete another site's cookie."""
    routes = {
        "/login": set_cookies("sid=s1; Domain=shop.example; Path=/",
                              "own=1; Path=/", "foreign=1; Domain=other.example"),
        "/hijack": set_cookies("sid=; Domain=shop.example; Max-Age=0"),
        "/p": ok,
    }
    hosts = {"a.shop.example": "a", "b.shop.example": "b", "other.example": "o"}
    with serve(routes) as (base, _, log):
        port = base.rsplit(":", 1)[1]
        url = lambda host, path: f"http://{host}:{port}{path}"  # noqa: E731
        first, policy = policy_fetcher({"cookies": True}, [url("a.shop.example", "/")],
                                       cookie_store=cookie_store, **public_test_hooks(hosts))
        second, policy_2 = policy_fetcher({"cookies": True}, [url("a.shop.example", "/")],
                                          cookie_store=cookie_store, **public_test_hooks(hosts))
        get(first, policy, url("a.shop.example", "/login"))
        get(second, policy_2, url("b.shop.example", "/p"))
        get(second, policy_2, url("a.shop.example", "/p"))
        get(second, policy_2, url("other.example", "/p"))
        get(first, policy, url("other.example", "/hijack"))
        get(second, policy_2, url("b.shop.example", "/p"))
    sent = [cookies_sent(entry) for entry in log]
    assert sent[1] == {"sid=s1"}  # the Domain cookie, not a.shop.example's host-only one
    assert sent[2] == {"sid=s1", "own=1"}
    assert sent[3] == set()  # neither shop's cookies nor the one it tried to plant for itself
    assert sent[5] == {"sid=s1"}  # other.example could not delete shop.example's cookie


def test_the_jar_is_bounded_per_domain_and_in_bytes(cookie_store, redis_url):
    import redis

    many = [f"c{i}=v{i}; Max-Age=600" for i in range(8)]
    big = "big=" + "x" * 3000
    routes = {"/many": set_cookies(*many), "/big": set_cookies(big), "/p": ok}
    with serve(routes) as (base, _, log):
        fetcher, policy = policy_fetcher(
            {"cookies": True, "cookies_per_domain": 3, "cookie_bytes": 2048}, [base + "/"],
            cookie_store=cookie_store, job="bounded")
        get(fetcher, policy, base + "/many")
        get(fetcher, policy, base + "/p")
        get(fetcher, policy, base + "/big")
        get(fetcher, policy, base + "/p")
    assert len(cookies_sent(log[1])) == 3
    assert not any(c.startswith("big=") for c in cookies_sent(log[3]))
    client = redis.Redis.from_url(redis_url)
    held = client.hgetall("ds:{bounded}:cookies")
    total = int(client.get("ds:{bounded}:cookie-bytes"))
    assert total == sum(len(k) + len(v) for k, v in held.items()) <= 2048
    client.close()


def test_a_job_without_cookies_asks_redis_nothing(cookie_store, redis_url):
    import redis

    client = redis.Redis.from_url(redis_url)

    def hmget_calls() -> int:
        return client.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0)

    with serve({"/set": set_cookies("sid=1"), "/p": ok}) as (base, _, log):
        fetcher, policy = policy_fetcher({"headers": {"X-A": "1"}}, [base + "/"],
                                         cookie_store=cookie_store, job="plain")
        before = hmget_calls()
        get(fetcher, policy, base + "/set")
        get(fetcher, policy, base + "/p")
        assert hmget_calls() == before
    assert policy.cookies is None and cookies_sent(log[1]) == set()
    assert client.keys("ds:{plain}:*") == []
    client.close()


def test_robots_txt_is_fetched_under_the_policy_and_a_workers_lack_is_never_shared():
    from distscrape_celery.web.robots import RobotsCache
    from distscrape_celery.web.robots_stores import MemoryRobotsStore

    robots = b"User-agent: *\nDisallow: /private\n"
    routes = {"/robots.txt": lambda h: reply(h, 200, robots, {"Content-Type": "text/plain"})}
    with serve(routes) as (base, _, log):
        store = MemoryRobotsStore()
        fetch = {"allow_private": True, "auth": {"scheme": "bearer", "credential": "T"}}
        spec = build_spec({"seeds": [base + "/"], "fetch": fetch})
        plain = build_spec({"seeds": [base + "/"], "fetch": {"allow_private": True}})
        # Requests that differ never share a record.
        assert (RobotsCache.from_spec(spec, store).digest
                != RobotsCache.from_spec(plain, store).digest)
        lacking = FetchPolicy.for_job("j", spec, proxies={}, credentials={}, cookie_store=None)
        with fetch_policy(lacking):
            RobotsCache.from_spec(spec, store).check(base + "/private")  # this job's own "allow"
        assert log == [] and len(store) == 0
        holding = FetchPolicy.for_job("j", spec, proxies={},
                                      credentials={"T": SecretStr("tok")}, cookie_store=None)
        with fetch_policy(holding), pytest.raises(FetchError, match="robots.txt"):
            RobotsCache.from_spec(spec, store).check(base + "/private")
    assert [r["headers"]["Authorization"] for r in log] == ["Bearer tok"]
    assert len(store) == 1


def test_a_jar_that_cannot_be_reached_is_a_retryable_failure():
    """Sending without the job's cookies could end an item for good (a 403 for want of its
    session): the request is not sent, and the item is tried again later."""
    import redis

    from distscrape_celery.web.cookies import RedisCookieStore

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # no Redis there
    store = RedisCookieStore(redis.Redis(port=port, socket_connect_timeout=1))
    with serve({"/p": ok}) as (base, _, log):
        fetcher, policy = policy_fetcher({"cookies": True}, [base + "/"], cookie_store=store)
        with pytest.raises(FetchError) as raised:
            get(fetcher, policy, base + "/p")
    assert raised.value.retryable and "cookie jar is unavailable" in str(raised.value)
    assert log == []


def test_no_site_sets_a_cookie_for_a_whole_country_domain(cookie_store):
    routes = {"/set": set_cookies("wide=1; Domain=co.uk", "shop=1; Domain=shop.co.uk"), "/p": ok}
    hosts = {"www.shop.co.uk": "a", "www.other.co.uk": "b", "x.shop.co.uk": "c"}
    with serve(routes) as (base, _, log):
        port = base.rsplit(":", 1)[1]
        fetcher, policy = policy_fetcher({"cookies": True}, [f"http://www.shop.co.uk:{port}/"],
                                         cookie_store=cookie_store, **public_test_hooks(hosts))
        for host, path in [("www.shop.co.uk", "/set"), ("www.other.co.uk", "/p"),
                           ("x.shop.co.uk", "/p")]:
            get(fetcher, policy, f"http://{host}:{port}{path}")
    assert [cookies_sent(entry) for entry in log[1:]] == [set(), {"shop=1"}]


def test_a_validator_the_policy_sends_makes_a_304_an_answer():
    """A 304 is the answer to a conditional request: one the job's policy makes conditional
    for a domain (its own If-Modified-Since) gets it as not modified; another domain, asking
    nothing conditionally, gets a retryable failure for the same answer."""
    unchanged = lambda h: reply(h, 304, headers={"ETag": '"v1"'})  # noqa: E731
    with serve({"/p": unchanged}) as (a, _, log_a), serve({"/p": unchanged}) as (b, _, _):
        fetcher, policy = policy_fetcher(
            {"domains": {domain(a): {"headers": {"If-Modified-Since":
                                                 "Sat, 01 Jan 2000 00:00:00 GMT"}}}},
            [a + "/", b + "/"])
        got = get(fetcher, policy, a + "/p")
        with pytest.raises(FetchError, match="asked nothing conditionally") as refused:
            get(fetcher, policy, b + "/p")
    assert got.not_modified and got.body == b""
    assert log_a[0]["headers"]["If-Modified-Since"] == "Sat, 01 Jan 2000 00:00:00 GMT"
    assert refused.value.retryable is True
