"""Records from pages: the [extract] spec refuses what cannot run, and the extractor turns pages
into records, whatever the page holds."""

from __future__ import annotations

import json
import time

import pytest

from distscrape_celery.core.components import build_extractor, check_components
from distscrape_celery.errors import ConfigError, PluginNotAllowed
from distscrape_celery.extract import Extractor
from distscrape_celery.job.spec import build_spec
from distscrape_celery.settings import Settings
from distscrape_celery.web.fetch import Download

URL = "http://shop.example.org/list"
FETCHED_AT = 1_780_000_000.25
LIST_PAGE = b"""<!DOCTYPE html><html><head><title>Products</title>
<script type="application/ld+json">{"@context": "https://schema.org", "@type": "Store",
 "name": "Example store"}</script></head><body>
<h1>Products</h1>
<ul>
  <li class="product"><a href="/p/1">Lamp</a><span class="price">$12.50</span>
      <i>red</i><i>small</i></li>
  <li class="product"><a href="/p/2">Chair</a></li>
</ul>
<div itemscope itemtype="https://schema.org/Offer"><span itemprop="price">9.99</span></div>
</body></html>"""


def _spec(extract: dict, **saver):
    return build_spec({"seeds": [URL], "extract": extract,
                       "saver": saver or {"output": "/tmp/records.jsonl"}})


def _records(extract: dict, body: bytes = LIST_PAGE, content_type="text/html; charset=utf-8",
             function=None):
    spec = _spec(extract)
    extractor = Extractor(spec.extract, "shop", function=function)
    return extractor.records(Download(URL, 200, content_type, body, fetched_at=FETCHED_AT))


PAGE_KEYS = {"url": URL, "status": 200, "fetched_at": "2026-05-28T20:26:40.250000Z",
             "job": "shop"}


def test_one_record_per_page_with_text_attributes_regex_and_lists():
    records = _records({"fields": {
        "title": "title::text",
        "first_link": {"css": "li a::attr(href)"},
        "names": {"xpath": "//li/a/text()", "all": True},
        "price": {"css": ".price::text", "re": r"\$([\d.]+)"},
        "heading_html": "h1",
        "missing": ".nothing::text",
        "missing_list": {"css": ".nothing::text", "all": True},
    }})
    assert records == ({**PAGE_KEYS, "title": "Products", "first_link": "/p/1",
                        "names": ["Lamp", "Chair"], "price": "12.50",
                        "heading_html": "<h1>Products</h1>", "missing": None,
                        "missing_list": []},)
    assert json.loads(json.dumps(records[0])) == records[0]


def test_a_record_per_repeating_block_with_fields_relative_to_it():
    records = _records({"item": "li.product", "fields": {
        "name": "a::text", "price": {"css": ".price::text", "re": r"[\d.]+"},
        "tags": {"xpath": "./i/text()", "all": True},
    }})
    assert [{k: r[k] for k in ("name", "price", "tags")} for r in records] == [
        {"name": "Lamp", "price": "12.50", "tags": ["red", "small"]},
        {"name": "Chair", "price": None, "tags": []},
    ]
    assert all(r["url"] == URL and r["job"] == "shop" for r in records)
    by_xpath = _records({"item_xpath": "//li[@class='product']", "fields": {"name": "a::text"}})
    assert [r["name"] for r in by_xpath] == ["Lamp", "Chair"]
    assert _records({"item": "table tr", "fields": {"name": "td::text"}}) == ()


def test_exslt_regex_functions_in_xpath():
    records = _records({"fields": {"cheap": {
        "xpath": "//li[re:test(span, '^\\$1[0-9]\\.')]/a/text()"}}})
    assert records[0]["cheap"] == "Lamp"


def test_json_ld_and_microdata_when_asked():
    [record] = _records({"structured": ["json-ld", "microdata"], "fields": {"title": "title::text"}})
    assert record["json_ld"] == [{"@context": "https://schema.org", "@type": "Store",
                                  "name": "Example store"}]
    assert record["microdata"] == [{"type": "https://schema.org/Offer",
                                    "properties": {"price": "9.99"}}]
    [bare] = _records({"structured": ["json-ld"]})
    assert set(bare) == set(PAGE_KEYS) | {"json_ld"}
    [none] = _records({"structured": ["json-ld"]}, body=b"<html><body>plain</body></html>")
    assert none["json_ld"] == []
    nested = (b'<div itemscope itemtype="https://schema.org/Product" itemref="more">'
              b'<span itemprop="name">Lamp</span><img itemprop="image" src="/i.png">'
              b'<div itemprop="offers" itemscope itemtype="https://schema.org/Offer">'
              b'<meta itemprop="price" content="9.99"><time itemprop="from" datetime="2026-01-01">'
              b'Jan</time></div><b itemprop="color">red</b><b itemprop="color">blue</b></div>'
              b'<p id="more"><a itemprop="url" href="/p/1">x</a></p>'
              b'<script type="application/ld+json"><!-- [{"@type": "A"}, {"@type": "B"}] -->'
              b'</script><script type="application/ld+json">{not json</script>')
    [record] = _records({"structured": ["json-ld", "microdata"]}, body=nested)
    assert record["json_ld"] == [{"@type": "A"}, {"@type": "B"}]
    assert record["microdata"] == [{"type": "https://schema.org/Product", "properties": {
        "name": "Lamp", "image": "http://shop.example.org/i.png",
        "offers": {"type": "https://schema.org/Offer",
                   "properties": {"price": "9.99", "from": "2026-01-01"}},
        "color": ["red", "blue"], "url": "http://shop.example.org/p/1"}}]


def test_a_function_of_the_jobs_own_gives_records_after_the_selectors():
    from tests.plugins.extractors import headings

    records = _records({"function": "tests.plugins.extractors:headings",
                        "fields": {"title": "title::text"}}, function=headings)
    assert [{k: v for k, v in r.items() if k not in PAGE_KEYS} for r in records] == [
        {"title": "Products"}, {"level": "h1", "text": "Products"}]
    # The page's keys are every record's, whatever the function says.
    [record] = _records({"function": "f:g"}, function=lambda page: [{"url": "x", "a": 1}])
    assert record == {**PAGE_KEYS, "a": 1}


@pytest.mark.parametrize("extract,fragments", [
    ({"fields": {"price": ".price[::text"}}, ["extract.fields.price", "CSS selector", "does not parse"]),
    ({"fields": {"price": {"xpath": "//span[@class="}}}, ["extract.fields.price", "XPath"]),
    ({"fields": {"price": {"css": "span", "re": "(unclosed"}}}, ["extract.fields.price.re"]),
    ({"fields": {"price": {"css": "a", "xpath": "//a"}}}, ["extract.fields.price", "exactly one"]),
    ({"fields": {"url": "a::attr(href)"}}, ["extract.fields", "'url' is taken"]),
    ({"item": "li[", "fields": {"a": "a"}}, ["extract.item", "does not parse"]),
    ({"item": "li"}, ["extract", "give fields too"]),
    ({"item": "li", "fields": {"a": "a"}, "structured": ["json-ld"]}, ["extract", "structured"]),
    ({"structured": ["rdfa"]}, ["extract.structured"]),
    ({"function": "not a function"}, ["extract.function"]),
    ({}, ["extract", "nothing to extract"]),
])
def test_what_cannot_run_is_refused_with_the_fields_name(extract, fragments):
    with pytest.raises(ConfigError) as caught:
        _spec(extract)
    message = str(caught.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_savers_and_extraction_must_go_together():
    settings = Settings()
    check_components(_spec({"fields": {"t": "title::text"}}), settings)
    check_components(_spec({"fields": {"t": "title::text"}}, output="redis://127.0.0.1:1/0"),
                     settings)
    with pytest.raises(ConfigError, match="saver.kind: the files saver keeps no records"):
        check_components(_spec({"fields": {"t": "title::text"}}, output="/tmp/dir"), settings)
    # Without [extract], a saver of records gets each page's own record.
    check_components(build_spec({"seeds": [URL], "saver": {"output": "/tmp/records.jsonl.gz"}}),
                     settings)


def test_the_function_is_loaded_like_every_plug_in():
    spec = _spec({"function": "tests.plugins.extractors:headings"})
    with pytest.raises(PluginNotAllowed, match="extract.function: .*not allowed"):
        check_components(spec, Settings())
    allowed = Settings(plugin_modules=("tests.plugins",))
    check_components(spec, allowed)
    assert build_extractor(spec, "shop", allowed) is not None
    for path, message in [("tests.plugins.extractors:not_a_function", "is not a function"),
                          ("tests.plugins.extractors:absent", "cannot load")]:
        with pytest.raises(ConfigError, match=f"extract.function: .*{message}"):
            check_components(_spec({"function": path}), allowed)


def test_a_failing_function_costs_only_that_pages_records(caplog):
    from tests.plugins.extractors import broken, not_dicts

    assert _records({"function": "a:b"}, function=broken) == ()
    assert _records({"function": "a:b"}, function=not_dicts) == ()
    assert "no records from this page" in caplog.text


def test_records_are_bounded_in_number_and_size(caplog):
    many = b"<ul>" + b"<li>x</li>" * 5000 + b"</ul>"
    records = _records({"item": "li", "fields": {"t": "::text"}, "max_records": 100}, body=many)
    assert len(records) == 100
    big = b"<p>" + b"y" * 10_000 + b"</p><h1>small</h1>"
    [record] = _records({"fields": {"h": "h1::text"}, "max_record_bytes": 1000}, body=big)
    assert record["h"] == "small"
    assert _records({"fields": {"p": "p::text"}, "max_record_bytes": 1000}, body=big) == ()
    assert "more than max_record_bytes" in caplog.text
    # Not JSON: a function's value that json cannot write is dropped with its record.
    assert _records({"function": "a:b"}, function=lambda page: [{"when": object()}, {"ok": 1}]) \
        == ({**PAGE_KEYS, "ok": 1},)


@pytest.mark.parametrize("body", [
    pytest.param(b"<div>" * 200_000 + b"<h1>deep</h1>", id="deep-nesting"),
    pytest.param(b"\x00\xff<<<h1>>>\xfe<title>" + bytes(range(256)) * 100, id="malformed"),
    pytest.param(b"<html><body>" + b"<p class=price>1</p>" * 100_000 + b"</body></html>",
                 id="huge"),
    pytest.param(b"", id="empty"),
    pytest.param(b"<div itemscope>" * 5_000 + b"<b itemprop=x>y</b>", id="nested-items"),
    pytest.param(b"<div itemscope itemref='a'><p id=a itemscope itemprop=p itemref=a>"
                 b"<i itemprop=q>1</i></p></div>", id="itemref-loop"),
])
def test_a_hostile_page_gives_at_most_its_own_records(body):
    started = time.monotonic()
    records = _records({"fields": {"h": "h1::text", "prices": {"css": ".price::text", "all": True}},
                        "structured": ["json-ld", "microdata"], "max_record_bytes": 16 * 1024},
                       body=body)
    assert time.monotonic() - started < 30
    assert len(records) <= 1
    for record in records:
        assert len(json.dumps(record)) <= 16 * 1024


def test_a_catastrophic_regex_ends_in_its_time_budget():
    spec = _spec({"fields": {"x": {"css": "p::text", "re": r"(\w|\w\w)+$"}}})
    extractor = Extractor(spec.extract, "shop", regex_seconds=0.2)
    started = time.monotonic()
    body = b"<p>" + b"a" * 5000 + b"!</p>"
    assert extractor.records(Download(URL, 200, "text/html", body)) == ()
    assert time.monotonic() - started < 5
