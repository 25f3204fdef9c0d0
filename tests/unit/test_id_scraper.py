"""IDScraper: IDs found by a regex, each downloaded from a URL made from it."""

from __future__ import annotations

import pytest

from distscrape_celery.core.components import build_scraper
from distscrape_celery.errors import ConfigError, FetchError
from distscrape_celery.web.fetch import Download
from distscrape_celery.job.spec import build_spec
from distscrape_celery.scrapers import IDScraper
from distscrape_celery.settings import Settings

FMT = "http://127.0.0.1:9/item/{}.json"


def spec(**scraper):
    return build_spec({"seeds": ["42", "http://127.0.0.1:9/list?page=1"],
                       "scraper": {"kind": "ids", **scraper}})


def test_built_from_the_spec_and_seeds_may_be_ids_or_urls():
    s = spec(id_regex=r'"id": (\d+)', download_url_fmt=FMT)
    assert s.seeds == ["42", "http://127.0.0.1:9/list?page=1"]
    scraper = build_scraper(s, Settings())
    assert isinstance(scraper, IDScraper)
    assert scraper.url_for("42") == "http://127.0.0.1:9/item/42.json"
    assert scraper.url_for("http://127.0.0.1:9/list?page=1") == "http://127.0.0.1:9/list?page=1"


def test_ids_are_escaped_into_one_segment():
    scraper = IDScraper(r"x", "http://127.0.0.1:9/item/{id}?full=1")
    assert scraper.url_for("../admin?x=1") == "http://127.0.0.1:9/item/..%2Fadmin%3Fx%3D1?full=1"


def test_find_items_uses_the_first_group_each_id_once_in_order():
    scraper = IDScraper(r'"id": (\d+)', FMT)
    body = b'[{"id": 7}, {"id": 3}, {"id": 7}, {"name": "x"}, {"id": 12}]'
    dl = Download("http://127.0.0.1:9/list", 200, "application/json", body)
    assert scraper.find_items("list", dl) == ["7", "3", "12"]
    whole = IDScraper(r"\bID-\d+\b", FMT)
    dl = Download("u", 200, "text/plain; charset=latin-1", "ID-1 ID-2 caf\xe9 ID-1".encode("latin-1"))
    assert whole.find_items("x", dl) == ["ID-1", "ID-2"]


def test_hostile_bodies_give_no_junk_ids():
    scraper = IDScraper(r"id=(\S*)", FMT)
    body = b"id=" + b"9" * 5000 + b" id=\x00\x01 id=ok id=\xff\xfe" + b" id= "
    dl = Download("u", 200, "text/html; charset=no-such-charset", body)
    # Not UTF-8 and no charset known: read as windows-1252, as browsers do.
    assert scraper.find_items("x", dl) == ["ok", "\xff\xfe"]


@pytest.mark.parametrize(
    "scraper, fragment",
    [
        ({"id_regex": r"\d+"}, "needs download_url_fmt"),
        ({"download_url_fmt": FMT}, "needs id_regex"),
        ({"id_regex": "([0-9", "download_url_fmt": FMT}, "invalid regular expression"),
        ({"id_regex": r"\d+", "download_url_fmt": "http://127.0.0.1/item/"}, "has no {} or {id}"),
        ({"id_regex": r"\d+", "download_url_fmt": "http://127.0.0.1/{name}"}, "not a URL template"),
        ({"id_regex": r"\d+", "download_url_fmt": "ftp://127.0.0.1/{}"}, "does not make a URL"),
    ],
)
def test_bad_ids_config_names_the_problem(scraper, fragment):
    with pytest.raises(ConfigError, match="scraper") as exc:
        spec(**scraper)
    assert fragment in str(exc.value)


def test_id_seeds_only_with_the_ids_scraper():
    with pytest.raises(ConfigError, match="malformed seed URL"):
        build_spec({"seeds": ["42"]})


@pytest.mark.parametrize(
    "kind, fragment",
    [
        ("no_such_module_xyz:Saver", "cannot load 'no_such_module_xyz:Saver'"),
        ("distscrape_celery.savers:NoSuchClass", "cannot load"),
        ("distscrape_celery.web.fetch:Fetcher", "is not a subclass of ItemSaver"),
    ],
)
def test_bad_dotted_path_is_a_clear_error_at_seed(kind, fragment):
    from distscrape_celery.core.manager import CrawlManager
    from distscrape_celery.tracker import InMemoryTracker

    tracker = InMemoryTracker()
    s = build_spec({"seeds": ["http://127.0.0.1:9/"], "saver": {"kind": kind}})
    # Allowed by the seeding process's settings: what is wrong is the path itself.
    settings = Settings(plugin_modules=[kind.partition(":")[0]])
    with pytest.raises(ConfigError, match="cannot load|is not a") as exc:
        CrawlManager(tracker, lambda job, items: None, settings=settings).seed("j", s)
    assert fragment in str(exc.value)
    assert tracker.jobs() == []  # nothing was created


def test_a_found_id_shaped_like_a_url_is_still_an_id():
    """Whatever a page names as an ID is one escaped segment of the download URL: an ID that
    looks like a URL on another host is not fetched from that host."""
    scraper = IDScraper(r'"id": "([^"]*)"', FMT)
    body = (b'[{"id": "http://other.invalid/x"}, {"id": "HTTPS://other.invalid/y?z=1"}, '
            b'{"id": "../../etc"}, {"id": "7"}]')
    dl = Download("http://127.0.0.1:9/list", 200, "application/json", body)
    urls = [scraper.url_for(item) for item in scraper.find_items("list", dl)]
    assert urls == [
        "http://127.0.0.1:9/item/http%3A%2F%2Fother.invalid%2Fx.json",
        "http://127.0.0.1:9/item/HTTPS%3A%2F%2Fother.invalid%2Fy%3Fz%3D1.json",
        "http://127.0.0.1:9/item/..%2F..%2Fetc.json",
        "http://127.0.0.1:9/item/7.json",
    ]


def test_dot_ids_are_never_a_path_segment():
    """'.' and '..' stay themselves when escaped, and would climb the download URL's path: a
    page's are no IDs, a seed's is refused by name, and an item of them ends dead saying why."""
    scraper = IDScraper(r"id=(\S+)", "http://127.0.0.1:9/item/{}")
    dl = Download("u", 200, "text/plain", b"id=. id=.. id=... id=.x")
    assert scraper.find_items("x", dl) == ["...", ".x"]
    assert scraper.url_for("...") == "http://127.0.0.1:9/item/..."
    for dots in (".", ".."):
        with pytest.raises(FetchError, match="cannot be a path segment") as info:
            scraper.url_for(dots)
        assert info.value.retryable is False
        with pytest.raises(ConfigError, match=r"malformed seed ID '\.+'"):
            build_spec({"seeds": [dots], "scraper": {"kind": "ids", "id_regex": "x",
                                                     "download_url_fmt": FMT}})


def test_a_page_of_many_ids_is_collected_only_to_the_cap_and_the_rest_counted():
    """A page of 150,000 IDs keeps the cap's worth: the rest are counted, not collected."""
    scraper = IDScraper(r"id=(\d+)", FMT, max_ids=100)
    body = " ".join(f"id={i}" for i in range(150_000)).encode()
    found = scraper.find_items("seed", Download(url="http://127.0.0.1:9/", status=200,
                                                content_type="text/plain", body=body))
    assert list(found) == [str(i) for i in range(100)]
    assert (found.cut, found.looked_at) == (149_900, 100)
    assert "max_links_per_page=100" in found.limit


def test_a_page_of_one_id_repeated_stops_looking_after_twice_the_cap():
    scraper = IDScraper(r"id=(\d+)", FMT, max_ids=100)
    body = ("id=7 " * 10_000).encode()
    found = scraper.find_items("seed", Download(url="http://127.0.0.1:9/", status=200,
                                                content_type="text/plain", body=body))
    assert list(found) == ["7"] and found.looked_at == 200 and found.cut == 9_800
    assert "200 matches looked at" in found.limit
