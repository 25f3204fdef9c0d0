"""https:// pages over real TLS on loopback, signed by a CA of the test's own (trustme) that only
the ``ca_bundle`` setting makes trusted: fetched directly, through a CONNECT tunnel of an HTTP
proxy, through a SOCKS5 proxy, and through an ``https://`` proxy (TLS to the proxy itself); the
SSRF guard still refusing a private target through each. Names resolve through the guard's
injected resolver only: no test asks real DNS."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from distscrape_celery.errors import ConfigError, FetchError
from distscrape_celery.settings import Settings
from tests.support.cli import assert_one_line_error, run
from tests.support.guard import public_test_hooks, resolver
from tests.support.http import serve
from tests.support.proxies import http_proxy, socks5_proxy
from tests.support.tls import TestCA, trusting

from .test_fetch_policy import get, ok, policy_fetcher


@pytest.fixture
def test_ca(tmp_path) -> TestCA:
    return TestCA.create(tmp_path)


@pytest.fixture
def tls_site(test_ca):
    with serve({"/p": ok}, tls=test_ca.server_context()) as (base, _, log):
        yield base, log


def test_an_https_page_is_fetched_with_the_ca_bundle_and_refused_without_it(test_ca, tls_site):
    base, log = tls_site
    fetcher, policy = policy_fetcher({"headers": {"X-Job": "1"}}, [base + "/"])
    with trusting(None), pytest.raises(FetchError) as raised:
        get(fetcher, policy, base + "/p")
    # Final: the same certificate is refused on every try; the message names the setting.
    assert not raised.value.retryable
    message = str(raised.value)
    assert "TLS certificate of " + base + "/p is not trusted" in message
    assert "unable to get local issuer certificate" in message
    assert "DISTSCRAPE_CA_BUNDLE" in message
    assert log == []  # the handshake failed: no request was sent
    with trusting(test_ca.bundle):
        fetcher, policy = policy_fetcher({"headers": {"X-Job": "1"}}, [base + "/"])
        assert get(fetcher, policy, base + "/p").body == b"ok"
        # A job without a fetch policy takes the fetcher's own path to the pool: trusted too.
        plain, _ = policy_fetcher({}, [base + "/"])
        assert plain.get(base + "/p").body == b"ok"
    assert [entry["headers"].get("X-Job") for entry in log] == ["1", None]


def test_a_certificate_for_another_name_is_refused_even_from_a_trusted_ca(test_ca):
    with serve({"/p": ok}, tls=test_ca.server_context("other.example")) as (base, _, log), \
            trusting(test_ca.bundle):
        fetcher, policy = policy_fetcher({"headers": {"X-Job": "1"}}, [base + "/"])
        with pytest.raises(FetchError, match="not trusted: IP address mismatch") as raised:
            get(fetcher, policy, base + "/p")
    assert not raised.value.retryable and log == []


def test_an_https_page_goes_through_a_connect_tunnel(test_ca, tls_site):
    """The credential goes inside the tunnel: the site gets it, the proxy never sees it."""
    base, log = tls_site
    with http_proxy() as proxy, trusting(test_ca.bundle):
        fetcher, policy = policy_fetcher(
            {"proxies": ["p"], "auth": {"scheme": "bearer", "credential": "T"}}, [base + "/"],
            proxies={"p": proxy.url("http")}, credentials={"T": "tok-in-tunnel"})
        assert get(fetcher, policy, base + "/p").body == b"ok"
        assert get(fetcher, policy, base + "/p").body == b"ok"
    port = base.rsplit(":", 1)[1]
    # One tunnel, kept alive for the second request.
    assert [(e["method"], e["target"]) for e in proxy.log.entries] == [
        ("CONNECT", f"127.0.0.1:{port}")]
    assert "authorization" not in proxy.log.entries[0]["headers"]
    assert [entry["headers"]["Authorization"] for entry in log] == ["Bearer tok-in-tunnel"] * 2


def test_the_tunnels_far_end_is_verified_too(tls_site):
    base, log = tls_site
    with http_proxy() as proxy, trusting(None):
        fetcher, policy = policy_fetcher({"proxies": ["p"]}, [base + "/"],
                                         proxies={"p": proxy.url("http")})
        with pytest.raises(FetchError, match="is not trusted") as raised:
            get(fetcher, policy, base + "/p")
    assert not raised.value.retryable
    assert [e["method"] for e in proxy.log.entries] == ["CONNECT"] and log == []


@pytest.mark.parametrize("scheme", ["socks5", "socks5h"])
def test_an_https_page_goes_through_a_socks_proxy_verified_by_its_name(test_ca, scheme):
    """The proxy is asked for the address the guard checked; the certificate is checked against
    the URL's name (shop.example), not that address."""
    with serve({"/p": ok}, tls=test_ca.server_context("shop.example")) as (base, _, log), \
            socks5_proxy() as proxy, trusting(test_ca.bundle):
        port = int(base.rsplit(":", 1)[1])
        url = f"https://shop.example:{port}/p"
        fetcher, policy = policy_fetcher(
            {"proxies": ["tor"]}, [url], proxies={"tor": proxy.url(scheme)},
            **public_test_hooks({"shop.example": "public"}))
        assert get(fetcher, policy, url).body == b"ok"
        # The same certificate does not hold for the address itself.
        fetcher, policy = policy_fetcher(
            {"proxies": ["tor"]}, [f"https://127.0.0.1:{port}/"],
            proxies={"tor": proxy.url(scheme)})
        with pytest.raises(FetchError, match="not trusted"):
            get(fetcher, policy, f"https://127.0.0.1:{port}/p")
    assert [(e["address_type"], e["host"], e["port"]) for e in proxy.log.entries] == [
        ("ipv4", "127.0.0.1", port)] * 2
    assert [entry["headers"]["Host"] for entry in log] == [f"shop.example:{port}"]


def test_pages_go_through_an_https_proxy(test_ca, tls_site):
    """TLS to the proxy itself: an http:// page is forwarded inside it (with the proxy's
    credentials), an https:// page goes through a CONNECT tunnel inside it (TLS in TLS)."""
    base, log = tls_site
    with serve({"/p": ok}) as (plain, _, plain_log), trusting(test_ca.bundle), \
            http_proxy(credentials="px:pw", tls=test_ca.server_context()) as proxy:
        fetcher, policy = policy_fetcher(
            {"proxies": ["tls"]}, [base + "/", plain + "/"],
            proxies={"tls": proxy.url("https", "px:pw")})
        assert get(fetcher, policy, base + "/p").body == b"ok"
        assert get(fetcher, policy, plain + "/p").body == b"ok"
    entries = proxy.log.entries
    assert [(e["method"], e["target"]) for e in entries] == [
        ("CONNECT", base.split("://", 1)[1]), ("GET", plain + "/p")]
    assert all(e["proxy_auth"] == "Basic cHg6cHc=" for e in entries)
    assert len(log) == 1 and len(plain_log) == 1
    assert "Proxy-Authorization" not in plain_log[0]["headers"]


def test_an_https_proxy_whose_certificate_is_not_trusted_is_a_proxy_failure(test_ca, tls_site):
    base, log = tls_site
    with http_proxy(tls=test_ca.server_context()) as proxy, trusting(None):
        fetcher, policy = policy_fetcher({"proxies": ["tls"]}, [base + "/"],
                                         proxies={"tls": proxy.url("https", "px:hush")})
        with pytest.raises(FetchError) as raised:
            get(fetcher, policy, base + "/p")
    message = str(raised.value)
    assert message.startswith("proxy 'tls' failed for " + base + "/p: the proxy's TLS "
                              "certificate is not trusted"), message
    assert "DISTSCRAPE_CA_BUNDLE" in message and "hush" not in message
    assert raised.value.retryable  # as any proxy's failure: the next try may take another
    [entry] = proxy.log.entries
    assert entry["refused"] == "tls" and "unknown ca" in entry["error"]
    assert log == []


@pytest.mark.parametrize("scheme", ["http", "https", "socks5", "socks5h"])
def test_the_ssrf_guard_refuses_a_private_https_target_through_each_proxy(test_ca, tls_site,
                                                                          scheme):
    base, log = tls_site
    tls = test_ca.server_context() if scheme == "https" else None
    make = socks5_proxy if scheme.startswith("socks") else (lambda: http_proxy(tls=tls))
    with make() as proxy, trusting(test_ca.bundle):
        port = int(base.rsplit(":", 1)[1])
        fetcher, policy = policy_fetcher(
            {"proxies": ["p"]}, ["https://public.example/"], proxies={"p": proxy.url(scheme)},
            resolver=resolver({"internal.example": ["127.0.0.1"]}))
        with pytest.raises(FetchError) as raised:
            get(fetcher, policy, f"https://internal.example:{port}/p")
    assert not raised.value.retryable and "loopback" in str(raised.value)
    assert len(proxy.log) == 0 and log == []


# -- the setting ----------------------------------------------------------------------------------

def test_the_ca_bundle_setting_is_checked_when_read(test_ca, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Settings.from_env({"DISTSCRAPE_CA_BUNDLE": "test-ca.pem"}).ca_bundle == test_ca.bundle
    leaf = tmp_path / "leaf.pem"
    test_ca.server.cert_chain_pems[0].write_to_path(str(leaf))
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    for path, reason in [(tmp_path / "missing.pem", "No such file or directory"),
                         (tmp_path, "Is a directory"),
                         (junk, "NO_CERTIFICATE_OR_CRL_FOUND"),
                         (leaf, "holds no CA certificate")]:
        with pytest.raises(ConfigError) as raised:
            Settings.from_env({"DISTSCRAPE_CA_BUNDLE": str(path)})
        assert str(raised.value).startswith("DISTSCRAPE_CA_BUNDLE: ")
        assert reason in str(raised.value)
    # A worker started with the setting gets it whole.
    settings = Settings.from_env({"DISTSCRAPE_CA_BUNDLE": test_ca.bundle})
    assert Settings.from_env(settings.to_env()).ca_bundle == test_ca.bundle


def test_a_bad_ca_bundle_stops_a_worker_and_a_command_at_their_start(tmp_path):
    missing = str(tmp_path / "missing.pem")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")}
    worker = subprocess.run(
        [sys.executable, "-m", "distscrape_celery.worker.main", "-P", "solo", "-Q", "q"],
        env={**env, "DISTSCRAPE_CA_BUNDLE": missing}, capture_output=True, text=True,
        timeout=120)
    assert worker.returncode != 0
    assert worker.stderr.strip().splitlines()[-1].endswith(
        f"DISTSCRAPE_CA_BUNDLE: cannot load {missing!r} as a PEM bundle of CA certificates: "
        "No such file or directory")
    job = tmp_path / "job.toml"
    job.write_text('seeds = ["https://example.org/docs/"]\n')
    res = run("seed", "j", "--config", str(job), env={"DISTSCRAPE_CA_BUNDLE": missing})
    assert_one_line_error(res, "DISTSCRAPE_CA_BUNDLE: cannot load")
