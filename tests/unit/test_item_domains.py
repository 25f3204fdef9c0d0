"""The domain rule in Python: an http(s) URL is its host's; anything else is an ID, fetched from the
job's download host, and so counts against that host's politeness. (The Lua twin of the rule is
checked against this one in tests/integration/scrapers/test_id_politeness.py.)"""

from __future__ import annotations

import pytest

from distscrape_celery.job.spec import build_spec, seed_item
from distscrape_celery.job.urls import is_url
from distscrape_celery.scrapers import IDScraper, SimpleScraper
from distscrape_celery.tracker.keys import NO_DOMAIN, domain_of, shard_of
from distscrape_celery.web.fetch import Download

DOWNLOAD_HOST = "127.0.0.1:8080"
FMT = f"http://{DOWNLOAD_HOST}/item/{{}}"

# Items that are not http(s) URLs, however much they look like one.
NOT_HTTP = [
    "a://x1", "A://x1", "x-a:///", "x-a:///\x1b]0;t\x07", "mailto:someone@x.invalid",
    "//other.invalid/x", "ftp://files.invalid/x", "file:///etc/passwd", "javascript://x",
    "http:/x.invalid/", "https:x.invalid", " http://x.invalid/", "httpx://x.invalid/",
    "http\u017f://x.invalid/",  # a long s: Python's re.IGNORECASE would take it for an "s"
    "12345", "", "http", "https:",
]
# http(s) URLs in any case, and the domain each is fetched from.
HTTP = [
    ("http://x.invalid/a", "x.invalid"),
    ("HTTP://X.Invalid/a", "x.invalid"),
    ("hTtPs://x.invalid:8443/a?b#c", "x.invalid:8443"),
    ("https://user:pw@x.invalid:8443/p", "x.invalid:8443"),
    ("http://127.0.0.1:8080/item/7", DOWNLOAD_HOST),
    ("http://x.invalid?q=/y", "x.invalid"),
    ("http://[::1]:80/", "[::1]:80"),
]


@pytest.mark.parametrize("item", NOT_HTTP)
def test_an_item_that_is_not_an_http_url_is_the_download_hosts(item: str) -> None:
    assert domain_of(item, DOWNLOAD_HOST) == DOWNLOAD_HOST
    assert domain_of(item) == NO_DOMAIN  # a job without download_url_fmt: one pseudo-domain
    assert not is_url(item)  # and the IDs scraper fetches it as an ID, from that host


@pytest.mark.parametrize("item, domain", HTTP)
def test_an_http_url_is_its_hosts(item: str, domain: str) -> None:
    assert domain_of(item, "api.invalid") == domain
    assert is_url(item)


def test_all_ids_of_a_job_live_in_the_download_hosts_shard() -> None:
    """A sharded job keeps a domain's politeness state in one shard: every ID goes to the
    download host's, so the one in-flight count there covers them all."""
    shards = {shard_of(domain_of(item, DOWNLOAD_HOST), 16) for item in NOT_HTTP}
    assert shards == {shard_of(DOWNLOAD_HOST, 16)}


@pytest.mark.parametrize("item_id", ["a://x1", "x-a:///", "mailto:a@b.invalid", "//h.invalid/x",
                                     "HTTP://other.invalid/x", "7"])
def test_an_id_is_paced_under_the_domain_its_download_url_is_on(item_id: str) -> None:
    """The tracker paces an ID under the job's id_domain; the worker passes robots.txt's
    Crawl-delay on under the domain of the URL it fetched: the two are the same domain."""
    spec = build_spec({"seeds": ["7"], "scraper": {"kind": "ids", "id_regex": r"\d+",
                                                   "download_url_fmt": FMT}})
    id_domain = spec.crawl_limits().id_domain
    assert id_domain == DOWNLOAD_HOST
    scraper = IDScraper(r"\S+", FMT)
    # A found ID shaped like an http(s) URL is handed on as its download URL (find_items).
    (item,) = scraper.find_items("list", Download("u", 200, "text/plain", item_id.encode()))
    assert domain_of(scraper.url_for(item)) == domain_of(item, id_domain) == DOWNLOAD_HOST


@pytest.mark.parametrize("item", ["a://x1", "x-a:///", "mailto:a@x.invalid", "A://x1"])
def test_a_url_job_takes_no_item_that_is_not_an_http_url(item: str) -> None:
    """A URL job never has an item that is not an http(s) URL: such a seed is refused with the
    reason, and such a link is not followed (were one added through the API, it would be in the
    job's pseudo-domain, and the fetcher refuses it). (A link "//host/x" is an http(s) URL once
    resolved against its page.)"""
    for kind in ("simple", None):
        with pytest.raises(ValueError, match="malformed seed URL"):
            seed_item(item, kind)
    page = Download("http://x.invalid/", 200, "text/html",
                    f'<a href="{item}">x</a><a href="/ok">ok</a>'.encode())
    assert SimpleScraper().find_items("http://x.invalid/", page) == ["http://x.invalid/ok"]
