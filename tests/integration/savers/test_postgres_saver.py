"""The postgres saver against a real PostgreSQL server: a database of the test's own (see
tests/support/postgres.py), the saver built and opened as a worker builds it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from distscrape_celery.core.components import build_saver
from distscrape_celery.errors import ConfigError, SaveError
from distscrape_celery.job.spec import build_spec
from distscrape_celery.savers.postgres import PostgresItemSaver
from distscrape_celery.settings import Settings
from distscrape_celery.web.fetch import Download
from tests.support import REPO_ROOT
from tests.support.postgres import rows

URL = "http://127.0.0.1:8000/"


def _saver(dsn, table="pages", **saver) -> PostgresItemSaver:
    spec = build_spec({"seeds": [URL], "saver": {
        "kind": "postgres", "table": table, "create_table": True, **saver}})
    built = build_saver(spec, "shop", "w1", Settings(postgres_dsn=dsn))
    assert isinstance(built, PostgresItemSaver)
    built.open()
    return built


def _download(path: str, records, *, fetched_at: float = 1_700_000_000.0, status=200) -> Download:
    return Download(url=URL + path, status=status, content_type="text/html", body=b"<html>",
                    fetched_at=fetched_at, records=tuple(records))


def _record(path: str, **fields) -> dict:
    return {"url": URL + path, "status": 200, "fetched_at": "2023-11-14T22:13:20Z", "job": "shop",
            **fields}


def test_records_are_upserted_by_url_into_the_table_it_creates(postgres_dsn):
    saver = _saver(postgres_dsn)
    try:
        assert saver.save(URL + "a", _download("a", [_record("a", title="A")])) == "pages (1 records)"
        saver.save(URL + "b", _download("b", [_record("b", title="B")], status=404))
        # Saved again, from a later fetch: the row is updated, not added.
        saver.save(URL + "a", _download("a", [_record("a", title="A2")], fetched_at=1_700_000_100))
    finally:
        saver.close()
    got = rows(postgres_dsn, "pages")
    assert [(r["url"], r["job"], r["status"], r["record"]["title"]) for r in got] == [
        (URL + "a", "shop", 200, "A2"), (URL + "b", "shop", 404, "B"),
    ]
    assert got[0]["fetched_at"].timestamp() == 1_700_000_100
    assert got[1]["record"] == _record("b", title="B")
    with psycopg.connect(postgres_dsn) as conn:
        columns = conn.execute(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_name = 'pages' ORDER BY ordinal_position").fetchall()
        key = conn.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = 'pages'::regclass "
            "AND i.indisprimary").fetchall()
    assert columns == [
        ("url", "text", "NO"), ("job", "text", "NO"), ("status", "integer", "NO"),
        ("fetched_at", "timestamp with time zone", "NO"), ("record", "jsonb", "NO"),
    ]
    assert key == [("url",)]


def test_an_older_copy_saved_late_does_not_replace_a_newer_one(postgres_dsn):
    saver = _saver(postgres_dsn)
    try:
        saver.save(URL + "a", _download("a", [_record("a", v="new")], fetched_at=2_000))
        saver.save(URL + "a", _download("a", [_record("a", v="old")], fetched_at=1_000))
    finally:
        saver.close()
    assert [r["record"]["v"] for r in rows(postgres_dsn, "pages")] == ["new"]


def test_a_key_field_in_a_schema_qualified_table_and_many_records_a_page(postgres_dsn):
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA shop")
    saver = _saver(postgres_dsn, "shop.products", key="sku")
    try:
        saver.save(URL + "list", _download("list", [
            _record("list", sku="s1", price="1.50"), _record("list", sku=2, price="3"),
        ]))
        saver.save(URL + "other", _download("other", [_record("other", sku="s1", price="1.75")],
                                           fetched_at=1_700_000_001))
    finally:
        saver.close()
    got = rows(postgres_dsn, "shop.products", key="sku")
    # A key that is not a string is stored as its JSON text.
    assert [(r["sku"], r["url"], r["record"]["price"]) for r in got] == [
        ("2", URL + "list", "3"), ("s1", URL + "other", "1.75"),
    ]


def test_a_batch_is_one_transaction_and_a_page_without_records_writes_nothing(postgres_dsn):
    saver = _saver(postgres_dsn)
    try:
        entries = [(URL + p, _download(p, [_record(p)])) for p in ("a", "b", "c")]
        entries.append((URL + "empty", _download("empty", [])))
        assert saver.commits_groups()
        assert saver.save_many(entries) == ["pages (1 records)"] * 3 + ["pages (0 records)"]
    finally:
        saver.close()
    with psycopg.connect(postgres_dsn) as conn:
        transactions = conn.execute("SELECT DISTINCT xmin::text FROM pages").fetchall()
    assert len(transactions) == 1
    assert [r["url"] for r in rows(postgres_dsn, "pages")] == [URL + p for p in ("a", "b", "c")]


def test_a_record_the_table_cannot_hold_fails_alone(postgres_dsn):
    saver = _saver(postgres_dsn, key="sku")
    try:
        outcomes = saver.save_many([
            (URL + "a", _download("a", [_record("a", sku="a")])),
            (URL + "nokey", _download("nokey", [_record("nokey")])),
            # Longer than a btree index entry may be: the database refuses the whole batch.
            (URL + "huge", _download("huge", [_record("huge", sku=os.urandom(4000).hex())])),
            (URL + "b", _download("b", [_record("b", sku="b", v=float("nan"))])),
            (URL + "c", _download("c", [_record("c", sku="c")])),
        ])
    finally:
        saver.close()
    assert outcomes[0] == outcomes[4] == "pages (1 records)"
    assert isinstance(outcomes[1], SaveError) and "no 'sku' field" in str(outcomes[1])
    assert isinstance(outcomes[2], SaveError) and "index row" in str(outcomes[2])
    assert isinstance(outcomes[3], SaveError) and "not JSON" in str(outcomes[3])
    assert [r["sku"] for r in rows(postgres_dsn, "pages", key="sku")] == ["a", "c"]


def test_text_postgresql_cannot_hold_is_replaced_not_refused(postgres_dsn):
    saver = _saver(postgres_dsn)
    try:
        saver.save(URL + "a", _download("a", [_record("a", title="a\x00b\ud800c", **{"k\x00": 1})]))
    finally:
        saver.close()
    [row] = rows(postgres_dsn, "pages")
    assert row["record"]["title"] == "a\ufffdb\ufffdc"
    assert row["record"]["k\ufffd"] == 1


def test_a_lost_connection_fails_the_save_and_the_next_one_connects_again(postgres_dsn):
    saver = _saver(postgres_dsn)
    try:
        saver.save(URL + "a", _download("a", [_record("a")]))
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        with pytest.raises(SaveError, match="cannot upsert"):
            saver.save(URL + "b", _download("b", [_record("b")]))
        saver.save(URL + "b", _download("b", [_record("b")]))
    finally:
        saver.close()
    assert [r["url"] for r in rows(postgres_dsn, "pages")] == [URL + "a", URL + "b"]


@pytest.mark.parametrize("setup,message", [
    (None, "table pages does not exist"),
    ("CREATE TABLE pages (url text, job text, status int, fetched_at timestamptz, record jsonb)",
     "no unique index on url"),
    ("CREATE TABLE pages (url text PRIMARY KEY, job text, status int)",
     "lacks the column(s) fetched_at, record"),
])
def test_a_table_that_cannot_take_the_rows_is_refused_when_the_saver_opens(
        postgres_dsn, setup, message):
    if setup:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(setup)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _saver(postgres_dsn, create_table=False)


def test_a_table_of_the_users_own_with_more_columns_is_written(postgres_dsn):
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE pages (id serial, url text UNIQUE NOT NULL, job text, status int, "
            "fetched_at timestamptz, record jsonb, seen timestamptz DEFAULT now())")
    saver = _saver(postgres_dsn, create_table=False)
    try:
        saver.save(URL + "a", _download("a", [_record("a")]))
    finally:
        saver.close()
    [row] = rows(postgres_dsn, "pages")
    assert (row["id"], row["url"]) == (1, URL + "a") and row["seen"] is not None


def test_a_worker_without_the_database_setting_refuses_the_saver():
    spec = build_spec({"seeds": [URL], "saver": {"kind": "postgres", "table": "pages"}})
    saver = build_saver(spec, "shop", "w1", Settings())
    with pytest.raises(ConfigError, match="set DISTSCRAPE_POSTGRES_DSN on the workers"):
        saver.open()


def test_a_connection_string_that_cannot_be_read_is_not_repeated():
    saver = PostgresItemSaver("host=127.0.0.1 password=hunter2 nonsense", "pages")
    with pytest.raises(ConfigError) as error:
        saver.open()
    assert "DISTSCRAPE_POSTGRES_DSN is not a libpq connection string" in str(error.value)
    assert "hunter2" not in str(error.value)


def test_an_unreachable_database_is_an_error_worth_retrying():
    started = time.monotonic()
    saver = PostgresItemSaver("postgresql://postgres@127.0.0.1:1/x", "pages")
    with pytest.raises(SaveError, match="cannot connect"):
        saver.save(URL, _download("", [_record("")]))
    assert time.monotonic() - started < 10


def test_a_worker_without_psycopg_gets_a_clear_error():
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "from distscrape_celery.savers.postgres import PostgresItemSaver\n"
        "from distscrape_celery.errors import ConfigError\n"
        "try:\n"
        "    PostgresItemSaver('dbname=x', 'pages').open()\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO_ROOT, timeout=60, check=True).stdout
    assert "the postgres saver needs psycopg 3" in out
    assert "distscrape-celery[postgres]" in out


def test_the_table_created_holds_what_the_docs_say(postgres_dsn):
    """The CREATE TABLE in docs/configuration.md makes a table the saver writes."""
    doc = (REPO_ROOT / "docs" / "configuration.md").read_text()
    start = doc.index("CREATE TABLE pages")
    statement = doc[start:doc.index(";", start)]
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(statement)
    saver = _saver(postgres_dsn, create_table=False)
    try:
        saver.save(URL + "a", _download("a", [_record("a", title="T")]))
    finally:
        saver.close()
    assert json.dumps(rows(postgres_dsn, "pages")[0]["record"]["title"]) == '"T"'


def test_threads_share_one_saver(postgres_dsn):
    """A threads pool's tasks save through one saver at once: every batch lands whole."""
    saver = _saver(postgres_dsn)

    def save_batches(thread: int) -> list:
        outcomes = []
        for batch in range(10):
            paths = [f"t{thread}/b{batch}/{i}" for i in range(8)]
            outcomes += saver.save_many([(URL + p, _download(p, [_record(p)])) for p in paths])
        return outcomes

    try:
        with ThreadPoolExecutor(8) as pool:
            outcomes = [o for result in pool.map(save_batches, range(8)) for o in result]
    finally:
        saver.close()
    assert outcomes == ["pages (1 records)"] * 640
    assert len(rows(postgres_dsn, "pages")) == 640
