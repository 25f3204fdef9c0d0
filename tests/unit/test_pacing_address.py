"""The address a job that paces by address gives the tracker: resolved by the SSRF guard before
the lease, once, and the address the fetch then connects to."""

from __future__ import annotations

import socket

import pytest

from distscrape_celery.errors import ConfigError
from distscrape_celery.job.spec import build_spec
from distscrape_celery.scrapers import SimpleScraper
from distscrape_celery.web import ssrf
from distscrape_celery.web.fetch import Fetcher
from distscrape_celery.web.ssrf import AddressGuard, address_kind
from tests.support.http import reply, serve


def counting(table: dict[str, list[str]]):
    """A resolver of ``table`` that records the names it was asked for."""
    asked: list[str] = []

    def resolve(host: str) -> list[str]:
        asked.append(host)
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "unknown name")
        return table[host]

    resolve.asked = asked  # type: ignore[attr-defined]
    return resolve


def public(*names: str):
    """A classifier under which ``names`` count as public wherever they resolve."""
    return lambda host, ip: None if host in names else address_kind(host, ip)


def test_the_fetch_connects_to_the_address_paced_and_resolves_its_host_once() -> None:
    with serve({"/": lambda h: reply(h, 200, b"home")}) as (base, _, log):
        port = base.rsplit(":", 1)[1]
        url = f"http://site.invalid:{port}/"
        resolve = counting({"site.invalid": ["127.0.0.1"]})
        spec = build_spec({"seeds": [url], "politeness": {"key": "ip"}})
        scraper = SimpleScraper(fetcher=Fetcher.for_job(
            spec, resolver=resolve, classify=public("site.invalid")))
        assert scraper.address_of(url) == "127.0.0.1"
        assert scraper.download(url).body == b"home"
        assert resolve.asked == ["site.invalid"]  # type: ignore[attr-defined]
    assert log[0]["headers"]["Host"] == f"site.invalid:{port}"


def test_a_kept_answer_is_used_only_while_fresh(monkeypatch) -> None:
    resolve = counting({"site.invalid": ["192.0.2.1"]})
    guard = AddressGuard(resolver=resolve, classify=public("site.invalid"))
    assert guard.pacing_address("https://site.invalid/a") == "192.0.2.1"
    assert guard.addresses("site.invalid", 443) == ["192.0.2.1"]
    assert len(resolve.asked) == 1  # type: ignore[attr-defined]
    monkeypatch.setattr(ssrf, "KEEP_SECONDS", 0.0)
    guard.addresses("site.invalid", 443)
    assert len(resolve.asked) == 2  # type: ignore[attr-defined]


def test_an_answer_resolved_for_a_connection_alone_is_not_kept() -> None:
    resolve = counting({"site.invalid": ["192.0.2.1"]})
    guard = AddressGuard(resolver=resolve, classify=public("site.invalid"))
    guard.addresses("site.invalid", 80)
    guard.addresses("site.invalid", 80)
    assert len(resolve.asked) == 2  # type: ignore[attr-defined]


def test_a_host_the_guard_refuses_or_cannot_resolve_has_no_address() -> None:
    guard = AddressGuard(resolver=counting({"inside.invalid": ["10.0.0.1"]}))
    assert guard.pacing_address("http://inside.invalid/") == ""  # a private address
    assert guard.pacing_address("http://nowhere.invalid/") == ""  # no answer
    assert guard.pacing_address("not a url") == ""


def test_a_literal_address_is_its_own_site() -> None:
    spec = build_spec({"seeds": ["http://127.0.0.2:8000/"]})
    guard = AddressGuard.from_spec(spec, resolver=counting({}))
    assert guard.pacing_address("http://127.0.0.2:8000/x") == "127.0.0.2"
    assert guard.pacing_address("http://localhost:8000/x") == ""  # not a seed's endpoint


def test_the_key_is_checked_when_the_job_is_seeded() -> None:
    with pytest.raises(ConfigError, match="politeness.key: Input should be 'host' or 'ip'"):
        build_spec({"seeds": ["http://a.invalid/"], "politeness": {"key": "asn"}})
