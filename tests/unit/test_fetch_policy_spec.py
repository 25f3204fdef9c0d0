"""The fetch policy's fields of a job spec and the workers' proxies and credentials settings:
what is refused when the job is seeded (or the worker starts), naming the field."""

from __future__ import annotations

import pytest

from distscrape_celery.errors import ConfigError
from distscrape_celery.job.spec import JobSpec, build_spec
from distscrape_celery.settings import Settings

SEED = "https://example.org/docs/"


def spec(fetch: dict) -> JobSpec:
    return build_spec({"seeds": [SEED], "fetch": fetch})


def refused(fetch: dict) -> str:
    with pytest.raises(ConfigError) as raised:
        spec(fetch)
    return str(raised.value)


@pytest.mark.parametrize("name", ["Host", "content-length", "Transfer-Encoding", "Connection",
                                  "Keep-Alive", "TE", "Upgrade", "Proxy-Authorization",
                                  "Proxy-Anything", "User-Agent", "Authorization", "Cookie"])
def test_headers_the_client_or_another_field_sets_are_refused(name):
    message = refused({"headers": {name: "x"}})
    assert "fetch.headers" in message and repr(name) in message
    message = refused({"domains": {"example.org": {"headers": {name: "x"}}}})
    assert "fetch.domains" in message and repr(name) in message


@pytest.mark.parametrize("headers,why", [
    ({"Bad Name": "x"}, "not a header name"),
    ({"X-A": "a\r\nInjected: 1"}, "one line"),
    ({"X-A": "a\x00"}, "one line"),
    ({"X-A": "x" * 9000}, "one line"),
    ({"X-A": "1", "x-a": "2"}, "given twice"),
])
def test_malformed_headers_are_refused(headers, why):
    assert why in refused({"headers": headers})


def test_credentials_and_proxies_are_named_never_given():
    assert "credential name" in refused({"auth": {"scheme": "bearer", "credential": "tok-123"}})
    assert "scheme" in refused({"auth": {"scheme": "digest", "credential": "T"}})
    # No field takes the secret itself.
    assert "fetch.auth.token: Extra inputs" in refused(
        {"auth": {"scheme": "bearer", "credential": "T", "token": "x"}})
    assert "not a proxy name" in refused({"proxies": ["http://user:pw@proxy:3128"]})
    assert "named twice" in refused({"proxies": ["a", "a"]})
    assert "not a host" in refused({"domains": {"http://example.org/": {}}})


def test_a_valid_policy_is_kept_and_stored_as_json():
    stored = spec({
        "headers": {"Accept-Language": "en"}, "cookies": True,
        "auth": {"scheme": "bearer", "credential": "SHOP_TOKEN"}, "proxies": ["eu", "us"],
        "domains": {"Shop.Example.org:8443": {"proxies": [], "headers": {"X-A": "1"}}},
    })
    again = JobSpec.from_json(stored.to_json())
    assert again == stored
    assert list(again.fetch.domains) == ["shop.example.org:8443"]  # keys as domain_of gives them
    assert "SHOP_TOKEN" in stored.to_json()


def test_a_spec_without_a_policy_is_stored_as_before():
    assert '"fetch":{"connect_timeout"' in spec({}).to_json()
    fetch_json = spec({}).to_json().split('"fetch":', 1)[1].split("}", 1)[0]
    for name in ("headers", "auth", "proxies", "cookies", "domains"):
        assert f'"{name}"' not in fetch_json


def test_workers_read_proxies_and_credentials_from_their_environment():
    settings = Settings.from_env({
        "DISTSCRAPE_PROXIES": "eu=http://u:pw@10.0.0.5:3128, tor=socks5h://127.0.0.1:9050",
        "DISTSCRAPE_CREDENTIAL_SHOP_TOKEN": "tok-123",
    })
    assert settings.proxies == {"eu": "http://u:pw@10.0.0.5:3128",
                                "tor": "socks5h://127.0.0.1:9050"}
    assert settings.credentials["SHOP_TOKEN"].get_secret_value() == "tok-123"
    assert "tok-123" not in repr(settings) and "pw@" not in repr(settings)
    # A child process gets the same.
    assert Settings.from_env(settings.to_env()) == settings


@pytest.mark.parametrize("environ,why", [
    ({"DISTSCRAPE_PROXIES": "eu=ftp://u:hush@x:21"}, "not a proxy URL"),
    ({"DISTSCRAPE_PROXIES": "eu"}, "NAME=URL"),
    ({"DISTSCRAPE_PROXIES": "eu=http://a:1,eu=http://b:1"}, "given twice"),
    ({"DISTSCRAPE_CREDENTIAL_lower": "hush"}, "credential name"),
    ({"DISTSCRAPE_CREDENTIAL_TOKEN": "hush\r\nX-Injected: 1"}, "printable ASCII"),
    ({"DISTSCRAPE_CREDENTIAL_TOKEN": ""}, "printable ASCII"),
    ({"DISTSCRAPE_CREDENTIALS": "hush"}, "unknown setting"),
])
def test_bad_proxies_or_credentials_are_refused_without_their_secrets(environ, why):
    with pytest.raises(ConfigError) as raised:
        Settings.from_env(environ)
    assert why in str(raised.value) and "hush" not in str(raised.value)
