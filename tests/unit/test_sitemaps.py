"""The sitemap reader: urlsets and indexes, gzip, <lastmod>, and its bounds (entries, bytes of
XML, a gzip bomb, entities that must expand or load nothing); and what a job takes of a sitemap
(its scope, the index depth, the item marker)."""

from __future__ import annotations

import gzip
import resource
import time
import zlib
from datetime import datetime, timedelta, timezone

import pytest

from distscrape_celery.job.spec import build_spec
from distscrape_celery.job.urls import normalize_url
from distscrape_celery.web.fetch import Fetcher
from distscrape_celery.job.sections import FetchSpec
from distscrape_celery.web.robots_stores import MemoryRobotsStore
from distscrape_celery.web.sitemap_items import (
    SITEMAP_MARKER, JobSitemaps, is_sitemap_item, sitemap_item, sitemap_url,
)
from distscrape_celery.web.sitemaps import (
    MAX_SITEMAP_BYTES, MAX_SITEMAP_URLS, SITEMAP_INDEX, URLSET, Sitemap, SitemapEntry,
    SitemapReader, parse_lastmod, parse_sitemap,
)
from tests.support.http import reply, serve

NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
UTC = timezone.utc


def urlset(*entries: str) -> bytes:
    return f'<?xml version="1.0" encoding="UTF-8"?><urlset {NS}>{"".join(entries)}</urlset>'.encode()


def url(loc: str, lastmod: str | None = None) -> str:
    mod = f"<lastmod>{lastmod}</lastmod>" if lastmod is not None else ""
    return f"<url><loc>{loc}</loc>{mod}<changefreq>daily</changefreq></url>"


def test_a_urlset_gives_its_locs_and_lastmods():
    sitemap = parse_sitemap(urlset(url(" http://a.example/1 ", "2024-05-01"),
                                   url("http://a.example/2", "2024-05-01T10:11:12.5+02:00"),
                                   url("http://a.example/3", "yesterday")))
    assert sitemap == Sitemap(URLSET, [
        SitemapEntry("http://a.example/1", datetime(2024, 5, 1, tzinfo=UTC)),
        SitemapEntry("http://a.example/2",
                     datetime(2024, 5, 1, 10, 11, 12, 500000,
                              tzinfo=timezone(timedelta(hours=2)))),
        SitemapEntry("http://a.example/3", None),
    ])


def test_an_index_gives_its_sitemaps_whatever_its_namespace():
    body = (b"<sitemapindex><sitemap><loc>http://a.example/s1.xml</loc></sitemap>"
            b"<sitemap><loc>http://a.example/s2.xml.gz</loc><lastmod>2023</lastmod></sitemap>"
            b"</sitemapindex>")
    sitemap = parse_sitemap(body)
    assert sitemap.kind == SITEMAP_INDEX and not sitemap.cut
    assert [e.url for e in sitemap.entries] == ["http://a.example/s1.xml", "http://a.example/s2.xml.gz"]
    assert sitemap.entries[1].lastmod == datetime(2023, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("text, expected", [
    ("2024", datetime(2024, 1, 1, tzinfo=UTC)),
    ("2024-02", datetime(2024, 2, 1, tzinfo=UTC)),
    ("2024-02-03T04:05Z", datetime(2024, 2, 3, 4, 5, tzinfo=UTC)),
    ("2024-02-03T04:05:06-05:30", datetime(2024, 2, 3, 4, 5, 6,
                                           tzinfo=timezone(-timedelta(hours=5, minutes=30)))),
    ("2024-13-01", None), ("2024-02-30", None), ("", None), (None, None), ("2" * 100, None),
])
def test_lastmod_is_a_w3c_datetime_or_none(text, expected):
    assert parse_lastmod(text) == expected


def test_gzip_is_told_by_its_bytes_and_read_member_after_member():
    body = urlset(*(url(f"http://a.example/{n}") for n in range(300)))
    half = len(body) // 2
    # Two gzip members that split the document (as `cat a.gz b.gz` joins them), fed 7 bytes at
    # a time.
    data = gzip.compress(body[:half]) + gzip.compress(body[half:])
    reader = SitemapReader()
    for start in range(0, len(data), 7):
        assert reader.write(data[start:start + 7])
    sitemap = reader.close()
    assert len(sitemap.entries) == 300 and not sitemap.cut


def test_a_gzip_file_cut_short_keeps_the_entries_before_the_cut():
    data = gzip.compress(urlset(*(url(f"http://a.example/{n}") for n in range(1000))))
    sitemap = parse_sitemap(data[:len(data) // 2])
    assert 0 < len(sitemap.entries) < 1000
    assert sitemap.cut == "gzip stream ends early"


def test_entries_past_the_cap_are_cut_with_a_reason():
    body = urlset(*(url(f"http://a.example/{n}") for n in range(MAX_SITEMAP_URLS + 5)))
    sitemap = parse_sitemap(body)
    assert len(sitemap.entries) == MAX_SITEMAP_URLS
    assert sitemap.entries[-1].url == f"http://a.example/{MAX_SITEMAP_URLS - 1}"
    assert sitemap.cut == f"more than {MAX_SITEMAP_URLS} entries"


def test_a_gzip_bomb_stops_at_50_mb_of_xml():
    """A 60 MB document (padding elements between two entries) in some 130 kB of gzip: the first
    entry is kept, the reading stops at the byte bound, and the entry after it is never read.
    The reader inflates a bounded piece at a time, whatever one write brings."""
    head = urlset(url("http://a.example/first")).replace(b"</urlset>", b"")
    inflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    data = inflate.compress(head)
    padding = (b"<pad>" + b" " * 1013 + b"</pad>") * 1024  # 1 MiB
    for _ in range(60):
        data += inflate.compress(padding)
    data += inflate.compress(url("http://a.example/after").encode() + b"</urlset>") + inflate.flush()
    assert len(data) < 200_000
    reader = SitemapReader()
    assert reader.write(data) is False
    sitemap = reader.close()
    assert [e.url for e in sitemap.entries] == ["http://a.example/first"]
    assert sitemap.cut == f"more than {MAX_SITEMAP_BYTES} bytes of XML"
    assert reader.write(b"more") is False


def test_an_external_entity_reads_no_file_and_no_url(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("http://a.example/SECRET")
    with serve({}) as (base, _, log):
        body = (f'<?xml version="1.0"?><!DOCTYPE urlset SYSTEM "{base}/dtd" ['
                f'<!ENTITY file SYSTEM "file://{secret}"><!ENTITY web SYSTEM "{base}/e">]>'
                f"<urlset><url><loc>&file;</loc></url><url><loc>&web;</loc></url>"
                f"<url><loc>http://a.example/ok</loc></url></urlset>").encode()
        sitemap = parse_sitemap(body)
    assert [e.url for e in sitemap.entries] == ["http://a.example/ok"]
    assert sitemap.malformed == 2
    assert log == []


def test_an_entity_bomb_expands_nothing():
    """A billion laughs: ten levels of ten references each, a 3 GB expansion. Nothing is
    expanded: the entry is left out (or, as libxml2 2.11 and later do, the file is refused as
    broken XML), fast and without the memory."""
    levels = ['<!ENTITY l0 "lol">'] + [
        f'<!ENTITY l{n} "{f"&l{n - 1};" * 10}">' for n in range(1, 10)]
    body = (f'<?xml version="1.0"?><!DOCTYPE urlset [{"".join(levels)}]><urlset>'
            f"<url><loc>http://a.example/&l9;</loc></url>"
            f"<url><loc>http://a.example/ok</loc></url></urlset>").encode()
    started, peak = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sitemap = parse_sitemap(body)
    assert time.monotonic() - started < 2
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 100_000  # KiB
    assert [e.url for e in sitemap.entries] in ([], ["http://a.example/ok"])
    assert sitemap.cut.startswith("broken XML") or sitemap.malformed == 1


def test_malformed_entries_are_skipped_and_counted_and_broken_xml_keeps_what_came_before():
    body = urlset("<url><lastmod>2024</lastmod></url>", url(""), url("http://a.example/" + "x" * 9000),
                  url("http://a.example/ok")).replace(b"</urlset>", b"<url><loc>http://a.example/cut")
    sitemap = parse_sitemap(body + b"<<<")
    assert [e.url for e in sitemap.entries] == ["http://a.example/ok"]
    assert sitemap.malformed == 3
    assert sitemap.cut.startswith("broken XML")


@pytest.mark.parametrize("body", [
    b"<html><body><a href='http://a.example/'>x</a></body></html>",
    b"<rss><channel><item><link>http://a.example/</link></item></channel></rss>",
    b"", b"\x1f", b"not xml at all",
])
def test_a_file_that_is_no_sitemap_gives_nothing(body):
    sitemap = parse_sitemap(body)
    assert sitemap.kind is None and sitemap.entries == []


def test_the_marker_never_names_a_page():
    item = sitemap_item("http://a.example/sitemap.xml")
    assert is_sitemap_item(item) and sitemap_url(item) == "http://a.example/sitemap.xml"
    # Every page item is canonical, and a canonical URL has no fragment.
    assert normalize_url(item) == "http://a.example/sitemap.xml"
    assert not is_sitemap_item(normalize_url("http://a.example/x" + SITEMAP_MARKER))


def job_sitemaps(**sitemaps) -> JobSitemaps:
    spec = build_spec({"seeds": ["http://a.example/"], "scraper": {"deny_regex": ["/private/"]},
                       "sitemaps": {"mode": "follow", **sitemaps}})
    return JobSitemaps.from_spec(spec, MemoryRobotsStore(1 << 20))


def test_a_job_takes_the_pages_its_link_scope_takes_in_canonical_form_with_their_lastmod():
    sitemap = parse_sitemap(urlset(
        url("HTTP://A.example:80/p?utm_source=x&amp;b=2&amp;a=1", "2024-05-01"),
        url("http://a.example/private/x"), url("http://other.example/y"), url("mailto:x@a.example"),
        url("http://a.example/file.pdf"), "<url></url>"))
    finds = job_sitemaps().finds(sitemap, depth=0)
    assert finds.pages == [SitemapEntry("http://a.example/p?a=1&b=2", datetime(2024, 5, 1, tzinfo=UTC))]
    assert finds.sitemaps == [] and finds.malformed == 1 and finds.out_of_scope == 4


def test_an_index_gives_sitemap_items_on_the_jobs_hosts_down_to_max_depth():
    index = parse_sitemap(b"<sitemapindex>"
                          b"<sitemap><loc>http://a.example/s/1.xml.gz</loc></sitemap>"
                          b"<sitemap><loc>http://other.example/s.xml</loc></sitemap>"
                          b"</sitemapindex>")
    sitemaps = job_sitemaps(max_depth=2)
    assert sitemaps.finds(index, depth=1).sitemaps == [
        "http://a.example/s/1.xml.gz" + SITEMAP_MARKER]
    assert sitemaps.finds(index, depth=1).out_of_scope == 1
    deepest = sitemaps.finds(index, depth=2)
    assert deepest.sitemaps == [] and deepest.pages == [] and deepest.out_of_scope == 2


def test_a_streamed_download_goes_to_the_reader_and_is_not_kept():
    body = gzip.compress(urlset(*(url(f"http://a.example/{n}") for n in range(2000))))
    routes = {"/s.xml.gz": lambda h: reply(h, 200, body, {"Content-Type": "application/gzip"})}
    with serve(routes) as (base, _, _log):
        reader = SitemapReader()
        download = Fetcher(FetchSpec()).get(base + "/s.xml.gz", sink=reader)
    assert download.body == b"" and download.status == 200
    assert len(reader.close().entries) == 2000
