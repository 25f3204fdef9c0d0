"""A throwaway PostgreSQL database per test, on the server DISTSCRAPE_TEST_POSTGRES names (a
libpq connection string to a database the tests may create databases from; default the local
server, user postgres, trust auth). Without a reachable server the tests that need one skip,
saying why, unless CI is "true": there a missing server fails them."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

ADMIN_DSN = os.environ.get(
    "DISTSCRAPE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


def _admin() -> psycopg.Connection:
    """A connection to the server's admin database; skips (fails in CI) if there is none."""
    try:
        return psycopg.connect(make_conninfo(ADMIN_DSN, connect_timeout=5), autocommit=True)
    except psycopg.Error as exc:
        reason = f"no PostgreSQL server for the tests at DISTSCRAPE_TEST_POSTGRES or 127.0.0.1:5432: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


@contextlib.contextmanager
def throwaway_database() -> Iterator[str]:
    """A new, empty database of a unique name, dropped afterwards (with the connections left to
    it, such as those of killed workers); yields its connection string."""
    name = f"distscrape_test_{uuid.uuid4().hex[:16]}"
    admin = _admin()
    try:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield make_conninfo(ADMIN_DSN, dbname=name)
        finally:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))
    finally:
        admin.close()


def rows(dsn: str, table: str, key: str = "url") -> list[dict]:
    """Every row of ``table``, as a dict per row, ordered by its key."""
    with psycopg.connect(dsn) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute(sql.SQL("SELECT * FROM {} ORDER BY {}").format(
            sql.Identifier(*table.split(".")), sql.Identifier(key)))
        return cur.fetchall()
