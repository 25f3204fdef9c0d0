"""The postgres saver's spec fields are checked when a job is seeded, each error naming its
field; the spec holds no database address (that is each worker's setting)."""

from __future__ import annotations

import pytest

from distscrape_celery.core.components import check_components
from distscrape_celery.errors import ConfigError
from distscrape_celery.job.spec import build_spec
from distscrape_celery.settings import Settings

SEED = "http://127.0.0.1:8000/"


def _spec(**saver):
    return build_spec({"seeds": [SEED], "saver": {"kind": "postgres", **saver}})


@pytest.mark.parametrize("table", ["pages", "crawl.pages", "_t1", "a" * 63 + "." + "b" * 63])
def test_a_table_name_or_schema_qualified_name_is_taken(table):
    assert _spec(table=table).saver.table == table


@pytest.mark.parametrize("field,value,message", [
    ("table", "Pages", "saver.table: 'Pages' is not a table name"),
    ("table", "a.b.c", "saver.table: 'a.b.c' is not a table name"),
    ("table", 'pages"; DROP TABLE x; --', "saver.table: "),
    ("table", "1pages", "saver.table: '1pages' is not a table name"),
    ("table", "a" * 64, "is not a table name"),
    ("key", "Sku", "saver.key: 'Sku' cannot name the key column"),
    ("key", "record", "saver.key: 'record' is a column the saver fills itself"),
    ("key", "fetched_at", "saver.key: 'fetched_at' is a column the saver fills itself"),
])
def test_a_bad_table_or_key_is_refused_naming_its_field(field, value, message):
    fields = {"table": "pages", field: value}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        _spec(**fields)


def test_the_table_is_required():
    with pytest.raises(ConfigError, match="the postgres saver needs saver.table"):
        _spec()


def test_a_postgres_job_is_seeded_from_a_machine_without_the_database_setting():
    spec = _spec(table="pages", key="sku", create_table=True)
    check_components(spec, Settings())
    dumped = spec.model_dump()["saver"]
    assert (dumped["table"], dumped["key"], dumped["create_table"]) == ("pages", "sku", True)
    # Nowhere in the spec for a database's address: a spec with one is refused.
    with pytest.raises(ConfigError, match="dsn"):
        _spec(table="pages", dsn="postgresql://u:p@db/x")
