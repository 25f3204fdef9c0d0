"""PostgresItemSaver: each page's records as rows of a PostgreSQL table, upserted by a key."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Optional, Union

from ..errors import ConfigError, SaveError
from ..job.saver_spec import RECORD_COLUMNS, SaverSpec
from ..web.fetch import Download
from .base import ItemSaver

if TYPE_CHECKING:
    import psycopg

    from ..settings import Settings

DSN_SETTING = "DISTSCRAPE_POSTGRES_DSN"
# libpq waits for a connection forever unless told otherwise.
CONNECT_TIMEOUT = 10
# What PostgreSQL's text and jsonb cannot hold: NUL, and UTF-16 surrogates (not UTF-8).
_UNSTORABLE = re.compile(r"\\u0000|[\ud800-\udfff]")
_UNSTORABLE_CHARS = re.compile(r"[\x00\ud800-\udfff]")

# A row's values in the order of PostgresItemSaver.columns: the key first.
Row = tuple[Any, ...]


def _driver() -> Any:
    """psycopg, imported on first use so that only a worker that saves to PostgreSQL needs it."""
    try:
        import psycopg
    except ImportError:
        raise ConfigError(
            "the postgres saver needs psycopg 3, which this worker lacks: install "
            "distscrape-celery[postgres] (or psycopg[binary]) on the workers"
        ) from None
    return psycopg


class PostgresItemSaver(ItemSaver):
    """Upserts each record of a page (:attr:`~Download.records`) as one row of ``table``.

    The row's ``key`` column (named after the record field ``key``, ``url`` by default) is its
    primary key; the other columns are ``job``, ``url``, ``status``, ``fetched_at``
    (timestamptz) and ``record`` (jsonb, the whole record). Saving a record again updates its
    row, unless the row holds a later fetch: a late save of an older copy changes nothing.

    ``dsn`` is the worker's connection string (``DISTSCRAPE_POSTGRES_DSN``), never the spec's.
    A save batch (:meth:`save_many`) is one transaction; a batch that the database refuses is
    saved page by page, so that one page the table cannot hold fails alone. With
    ``create_table`` the table is created if it does not exist. Threads may share the saver:
    they take turns on its one connection."""

    saves_records = True

    def __init__(
        self, dsn: Optional[str], table: str, key: str = "url", *, job: str = "",
        create_table: bool = False,
    ) -> None:
        self.dsn = dsn
        self.table = table
        self.key = key
        self.job = job
        self.create_table = create_table
        # The table's columns in the order rows give them: the key first.
        self.columns = (key, *(c for c in RECORD_COLUMNS if c != key))
        self._lock = threading.Lock()
        self._conn: Optional["psycopg.Connection"] = None
        self._upsert: Any = None

    @classmethod
    def from_spec(cls, spec: SaverSpec, *, job: str, worker_id: str) -> "PostgresItemSaver":
        """A saver without a database: only :meth:`for_worker` gives it the worker's."""
        return cls(None, spec.table or "", spec.key, job=job, create_table=spec.create_table)

    @classmethod
    def for_worker(
        cls, spec: SaverSpec, *, job: str, worker_id: str, settings: "Settings"
    ) -> "PostgresItemSaver":
        """The saver of ``spec`` on the database ``settings.postgres_dsn`` names."""
        return cls(settings.postgres_dsn, spec.table or "", spec.key, job=job,
                   create_table=spec.create_table)

    # -- the connection ------------------------------------------------------------------------

    def open(self) -> None:
        """Connect, create the table if asked, and check that it can take the rows: a missing
        driver, setting or table is a :class:`ConfigError` (no attempt would do better), an
        unreachable database a :class:`SaveError`."""
        with self._lock:
            self._connection()

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _connection(self) -> "psycopg.Connection":
        """The open connection, made (and the table checked) if there is none; under the lock."""
        if self._conn is not None and not self._conn.closed:
            return self._conn
        psycopg = _driver()
        if not self.dsn:
            raise ConfigError(
                f"the postgres saver (table {self.table}) needs the database it writes to: set "
                f"{DSN_SETTING} on the workers (the job spec names only the table)"
            )
        try:
            params = psycopg.conninfo.conninfo_to_dict(self.dsn)
        except psycopg.Error:
            # The message could quote the string, password and all.
            raise ConfigError(
                f"{DSN_SETTING} is not a libpq connection string (postgresql://... or key=value "
                "pairs)"
            ) from None
        params.setdefault("connect_timeout", CONNECT_TIMEOUT)
        try:
            conn = psycopg.connect(**params, autocommit=True)
        except psycopg.Error as exc:
            raise SaveError(f"cannot connect to the database of {DSN_SETTING}: {exc}") from None
        try:
            if self.create_table:
                self._create_table(conn)
            self._check_table(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _table_sql(self) -> Any:
        from psycopg import sql

        return sql.Identifier(*self.table.split("."))

    def _create_table(self, conn: "psycopg.Connection") -> None:
        from psycopg import sql

        types = {"job": "text NOT NULL", "url": "text NOT NULL", "status": "integer NOT NULL",
                 "fetched_at": "timestamptz NOT NULL", "record": "jsonb NOT NULL"}
        columns = sql.SQL(", ").join(
            sql.SQL("{} {}").format(
                sql.Identifier(name),
                sql.SQL("text PRIMARY KEY" if name == self.key else types[name]))
            for name in self.columns
        )
        try:
            with conn.transaction():
                # Workers that start together would race to create it (CREATE TABLE IF NOT
                # EXISTS is not safe against a concurrent one): one at a time.
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.table,))
                conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                    self._table_sql(), columns))
        except _driver().Error as exc:
            raise ConfigError(f"cannot create table {self.table}: {exc}") from None

    def _check_table(self, conn: "psycopg.Connection") -> None:
        """Refuse a table that is missing, lacks a column, or has no unique index on the key."""
        name = self._table_sql().as_string(conn)
        try:
            columns = {row[0] for row in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                "AND attnum > 0 AND NOT attisdropped", (name,))}
            unique = conn.execute(
                "SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                "AND a.attnum = i.indkey[0] WHERE i.indrelid = to_regclass(%s) "
                "AND i.indisunique AND i.indnkeyatts = 1 AND i.indpred IS NULL "
                "AND a.attname = %s", (name, self.key)).fetchone()
        except _driver().Error as exc:
            raise SaveError(f"cannot read the columns of table {self.table}: {exc}") from None
        if not columns:
            raise ConfigError(
                f"table {self.table} does not exist in the database of {DSN_SETTING}: create it "
                "(docs/configuration.md shows its columns) or set saver.create_table"
            )
        missing = [c for c in self.columns if c not in columns]
        if missing:
            raise ConfigError(f"table {self.table} lacks the column(s) {', '.join(missing)}")
        if unique is None:
            raise ConfigError(
                f"table {self.table} has no unique index on {self.key} alone, which the saver "
                "upserts by (make it the primary key)"
            )

    def _upsert_sql(self) -> Any:
        from psycopg import sql

        columns = self.columns
        return sql.SQL(
            "INSERT INTO {table} AS t ({columns}) VALUES ({values}) "
            "ON CONFLICT ({key}) DO UPDATE SET {updates} "
            "WHERE t.fetched_at <= EXCLUDED.fetched_at"
        ).format(
            table=self._table_sql(),
            columns=sql.SQL(", ").join(map(sql.Identifier, columns)),
            values=sql.SQL(", ").join(
                sql.SQL("%s::jsonb" if c == "record" else "%s") for c in columns),
            key=sql.Identifier(self.key),
            updates=sql.SQL(", ").join(
                sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c))
                for c in columns if c != self.key),
        )

    # -- saving --------------------------------------------------------------------------------

    def save(self, item: str, download: Download) -> str:
        """Upsert the page's records in one transaction; returns the table and how many."""
        [outcome] = self.save_many([(item, download)])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def commits_groups(self) -> bool:
        """A batch is one transaction, and a row written again is only updated."""
        return type(self).save is PostgresItemSaver.save

    def save_many(self, entries: Sequence[tuple[str, Download]]) -> list[Union[str, Exception]]:
        """Upsert the records of every entry in one transaction (one pipelined round trip);
        if the database refuses the batch for what it holds, each entry in its own."""
        results: list[Union[str, Exception]] = []
        rows: list[list[Row]] = []
        for item, download in entries:
            try:
                rows.append(self._rows(item, download))
                results.append(f"{self.table} ({len(rows[-1])} records)")
            except SaveError as exc:
                rows.append([])
                results.append(exc)
        ready = [i for i, outcome in enumerate(results) if isinstance(outcome, str)]
        if not any(rows[i] for i in ready):
            return results  # pages without records write nothing
        psycopg = _driver()
        with self._lock:
            try:
                self._write([row for i in ready for row in rows[i]])
            except ConfigError as exc:
                return [exc if i in ready else r for i, r in enumerate(results)]
            except SaveError as exc:
                refused = (psycopg.DataError, psycopg.IntegrityError,
                           psycopg.errors.ProgramLimitExceeded)
                if len(ready) == 1 or not isinstance(exc.__cause__, refused):
                    return [exc if i in ready else r for i, r in enumerate(results)]
                for i in ready:  # find the entries that the table cannot hold
                    try:
                        self._write(rows[i])
                    except SaveError as single:
                        results[i] = single
        return results

    def _write(self, rows: list[Row]) -> None:
        """Upsert ``rows`` in one transaction; under the lock. A lost connection is dropped (the
        next save connects again); an error the database gave is the cause of the SaveError."""
        if not rows:
            return
        psycopg = _driver()
        conn = self._connection()
        if self._upsert is None:
            self._upsert = self._upsert_sql()
        try:
            with conn.transaction(), conn.cursor() as cursor:
                cursor.executemany(self._upsert, rows)
        except psycopg.Error as exc:
            if conn.broken or conn.closed:
                self._conn = None
                conn.close()
            raise SaveError(f"cannot upsert {len(rows)} record(s) into {self.table}: {exc}") from exc

    def _rows(self, item: str, download: Download) -> list[Row]:
        """The rows of ``download``'s records; SaveError for a record without its key, or one
        that is not JSON."""
        fetched_at = datetime.fromtimestamp(download.fetched_at, timezone.utc)
        rows = []
        for index, record in enumerate(download.records):
            if not isinstance(record, dict):
                raise SaveError(f"{item}: record {index} is a {type(record).__name__}, not a dict")
            key = record.get(self.key, download.url if self.key == "url" else None)
            if key is None or key == "":
                raise SaveError(f"{item}: record {index} has no {self.key!r} field to key its row by")
            try:
                text = _json(record)
                key_text = key if isinstance(key, str) else json.dumps(
                    key, sort_keys=True, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise SaveError(f"{item}: record {index} is not JSON: {exc}") from None
            values = {"job": self.job, "url": _storable(download.url),
                      "status": download.status, "fetched_at": fetched_at, "record": text}
            rows.append((_storable(key_text), *(values[c] for c in self.columns[1:])))
        return rows


def _json(record: dict) -> str:
    """``record`` as JSON that jsonb takes: NUL and lone surrogates replaced by U+FFFD."""
    text = json.dumps(record, ensure_ascii=False, allow_nan=False)
    if _UNSTORABLE.search(text):
        text = json.dumps(_cleaned(record), ensure_ascii=False, allow_nan=False)
    return text


def _cleaned(value: Any) -> Any:
    if isinstance(value, str):
        return _storable(value)
    if isinstance(value, dict):
        return {_storable(str(k)): _cleaned(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_cleaned(v) for v in value]
    return value


def _storable(text: str) -> str:
    """``text`` with what PostgreSQL's text cannot hold replaced by U+FFFD."""
    return _UNSTORABLE_CHARS.sub("\ufffd", text)
