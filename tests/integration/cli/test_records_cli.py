"""Records through the `distscrape` command: seeding refuses what cannot run, `crawl` leaves the
one JSON Lines file the user named, and a job that revisits writes nothing for unchanged pages."""

from __future__ import annotations

import gzip
import json
import signal
from collections import Counter
from pathlib import Path

import pytest
from distscrape_celery.testing.sitegen import SiteServer
from tests.support.cli import assert_one_line_error, run
from tests.support.crawl_command import Crawl, wait_until

from distscrape_celery.savers.jsonl import jsonl_shards

JOB_FILE = """\
[saver]
shard_max_items = 5

[extract]
fields.title = "title::text"
fields.heading = "h1#top::text"
fields.links = { css = "#main a::attr(href)", all = true }
fields.first_link = { css = "#main a::text", re = 'link (\\d+)' }
fields.section = { xpath = "//h2/@id" }
"""


def _job_file(tmp_path: Path, text: str = JOB_FILE) -> str:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return str(path)


def read_records(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _assert_each_page_once(output: Path, server, site, job: str) -> None:
    records = read_records(output)
    assert Counter(r["url"] for r in records) == Counter(server.url(p) for p in site.reachable)
    for record in records:
        path = record["url"][len(server.url("/")) - 1:]
        assert record["status"] == 200 and record["job"] == job
        assert record["fetched_at"].endswith("Z") and "T" in record["fetched_at"]
        assert record["title"] == record["heading"] == path
        assert record["section"] == "section"
        assert record["first_link"] == ("0" if record["links"] else None)
        assert site.pages[path].count(b"<li><a href=") == len(record["links"])


@pytest.mark.parametrize("ext", [".jsonl", ".jsonl.gz"])
def test_the_crawl_leaves_one_file_of_each_pages_record(ext, small_site, tmp_path):
    output = tmp_path / "out" / f"items{ext}"
    with SiteServer(small_site) as server:
        crawl = Crawl(tmp_path, server.url("/"), output, "--config", _job_file(tmp_path),
                      "--job", "records")
        assert crawl.wait(120) == 0, crawl.stderr
    assert f"output in {output}" in crawl.stdout, crawl.stdout
    assert sorted(p.name for p in output.parent.iterdir()) == sorted(
        [output.name, output.name + ".distscrape-state"])
    _assert_each_page_once(output, server, small_site, "records")


def test_an_interrupted_crawl_names_its_shards_and_its_resume_joins_them(small_site, tmp_path):
    output = tmp_path / "out" / "items.jsonl"
    config = _job_file(tmp_path)
    with SiteServer(small_site, delay=0.1) as server:
        first = Crawl(tmp_path, server.url("/"), output, "--config", config, "--job", "rec",
                      tag="first")
        try:
            wait_until(lambda: len(jsonl_shards(output)) >= 3, 60, "3 shards written", first)
            first.proc.send_signal(signal.SIGINT)
            assert first.wait(30) == 130, first.stderr
        finally:
            if first.proc.poll() is None:
                first.proc.kill()
        assert jsonl_shards(output) and not output.exists()
        assert jsonl_shards(output)[0].name in first.stderr, first.stderr
        server.delay = 0.0
        second = Crawl(tmp_path, server.url("/"), output, "--config", config, "--job", "rec",
                       tag="second")
        assert second.wait(120) == 0, second.stderr
    _assert_each_page_once(output, server, small_site, "rec")


def test_a_revisit_writes_records_only_for_the_pages_that_changed(small_site, tmp_path):
    output = tmp_path / "out" / "items.jsonl"
    config = _job_file(tmp_path)
    with SiteServer(small_site) as server:
        first = Crawl(tmp_path, server.url("/"), output, "--config", config, "--revisit",
                      "--job", "rev", tag="first")
        assert first.wait(120) == 0, first.stderr
        assert len(read_records(output)) == len(small_site.reachable)
        again = Crawl(tmp_path, server.url("/"), output, "--config", config, "--revisit",
                      "--job", "rev", tag="again")
        assert again.wait(120) == 0, again.stderr
    assert "unchanged" in again.stdout, again.stdout
    # Every page answered 304 or came back the same: no record was written again.
    assert len(read_records(output)) == len(small_site.reachable)


@pytest.mark.parametrize("command", ["seed", "crawl"])
@pytest.mark.parametrize("extract,fragments", [
    ('fields.price = ".price[::text"', ["extract.fields.price", "does not parse"]),
    ('fields.price = { xpath = "//span[" }', ["extract.fields.price", "XPath"]),
    ('fields.price = { css = "span", re = "(" }', ["extract.fields.price.re"]),
])
def test_a_selector_that_does_not_parse_is_refused_naming_its_field(
        command, extract, fragments, tmp_path):
    config = _job_file(tmp_path, f"[extract]\n{extract}\n")
    args = (["seed", "job", "http://127.0.0.1:9/", "--redis-url", "redis://127.0.0.1:9/0"]
            if command == "seed" else ["crawl", "http://127.0.0.1:9/", "--in-memory"])
    res = run(*args, "--config", config, "--output", str(tmp_path / "items.jsonl"))
    assert_one_line_error(res, *fragments)
    assert not (tmp_path / "items.jsonl").exists()


def test_savers_and_extraction_must_go_together_when_seeded(tmp_path):
    seed = ["seed", "job", "http://127.0.0.1:9/", "--redis-url", "redis://127.0.0.1:9/0"]
    res = run(*seed, "--config", _job_file(tmp_path), "--output", str(tmp_path / "pages"))
    assert_one_line_error(res, "--saver", "keeps no records", "jsonl")
    res = run(*seed, "--config", _job_file(tmp_path, '[extract]\nfunction = "tests.plugins.extractors:headings"\n'),
              "--output", str(tmp_path / "items.jsonl"))
    assert_one_line_error(res, "extract.function", "not allowed")


def test_extracted_records_go_to_postgres_one_row_each(postgres_dsn, small_site, tmp_path):
    """The same [extract] into the postgres saver: a row per page (its URL the key), the record's
    fields in its `record` column."""
    from tests.support.postgres import rows

    config = _job_file(tmp_path, JOB_FILE.replace(
        "[saver]\nshard_max_items = 5\n",
        '[saver]\nkind = "postgres"\ntable = "records"\ncreate_table = true\n'))
    with SiteServer(small_site) as server:
        crawl = Crawl(tmp_path, server.url("/"), tmp_path / "unused", "--config", config,
                      "--job", "pg", env={"DISTSCRAPE_POSTGRES_DSN": postgres_dsn})
        assert crawl.wait(120) == 0, crawl.stderr
    got = rows(postgres_dsn, "records")
    assert sorted(r["url"] for r in got) == sorted(server.url(p) for p in small_site.reachable)
    for row in got:
        record = row["record"]
        path = row["url"][len(server.url("/")) - 1:]
        assert (record["job"], record["title"], record["section"]) == ("pg", path, "section")
        assert record["first_link"] == ("0" if record["links"] else None)
