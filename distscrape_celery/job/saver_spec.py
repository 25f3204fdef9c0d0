"""The saver section of a job spec: which saver stores the downloads, where, and how durably; and
which built-in saver an output names."""

from __future__ import annotations

import os
import re
from typing import Any, Optional

from pydantic import Field, ValidationInfo, field_validator, model_validator

from ..redaction import redact
from ..redis_urls import is_redis_url
from .sections import StrictModel, check_kind, field_label


# The built-in savers by what their output looks like; anything else is a directory (files).
TAR_EXTENSIONS = (".tar", ".tar.gz", ".tar.bz2")
WARC_EXTENSIONS = (".warc.gz",)


def saver_kind_for(output: str) -> str:
    """The built-in saver an output names: a Redis URL -> redis, a .tar/.tar.gz/.tar.bz2 name ->
    tar, a .warc.gz name -> warc, anything else (a directory) -> files."""
    if is_redis_url(output):
        return "redis"
    if output.endswith(TAR_EXTENSIONS):
        return "tar"
    if output.endswith(WARC_EXTENSIONS):
        return "warc"
    return "files"


_OUTPUT_SHAPES = {
    "files": "a directory",
    "redis": "a redis://, rediss:// or unix:// URL",
    "tar": "a file name ending with " + ", ".join(TAR_EXTENSIONS),
    "warc": "a file name ending with " + " or ".join(WARC_EXTENSIONS),
}
# Built-in savers that write no output of their own: the postgres saver writes to a table of the
# database its worker's settings name.
_TABLE_SAVERS = ("postgres",)
BUILTIN_SAVERS = (*_OUTPUT_SHAPES, *_TABLE_SAVERS)

# A PostgreSQL name as the saver takes it: lower case, so that it means the same quoted (as the
# saver writes it) and unquoted (as a person types it in psql); at most 63 bytes, PostgreSQL's
# NAMEDATALEN less one, beyond which it would cut the name silently.
_SQL_NAME = r"[a-z_][a-z0-9_]{0,62}"
_TABLE = re.compile(rf"(?:{_SQL_NAME}\.)?{_SQL_NAME}")
_COLUMN = re.compile(_SQL_NAME)
# The columns every records table has besides its key.
RECORD_COLUMNS = ("job", "url", "status", "fetched_at", "record")


class SaverSpec(StrictModel):
    """Which saver stores downloaded items, and its options."""

    kind: str = Field(
        "files",
        description='"files", "redis", "tar", "warc", "postgres", or a custom ItemSaver class '
        'as "package.module:Class"; when not given, the built-in saver the output names.',
    )
    output: str = Field(
        "crawl-output",
        description="files: a directory; tar: a .tar, .tar.gz or .tar.bz2 name; warc: a .warc.gz "
        "name (shards are named after it); redis: a redis:// or rediss:// URL (made absolute "
        "when seeded, unless a URL). postgres: unused (see table).",
    )
    name_scheme: str = Field(
        "{host}/{path}",
        description="files and tar: file or member name; fields {host} {port} {path} {query} "
        "{qhash} {sha1} {shard} {job}; every part is sanitised so no name leaves the output.",
    )
    key_scheme: str = Field(
        "ds:out:{job}:{sha1}",
        description="redis: the key of each item's hash; fields {job} {item} {sha1}.",
    )
    ttl_seconds: Optional[float] = Field(
        None, gt=0, description="redis: keys expire after this long; None: never."
    )
    shard_max_bytes: int = Field(
        1024**3, gt=0, description="tar and warc: start a new shard past this size."
    )
    shard_max_items: Optional[int] = Field(
        None, gt=0, description="tar and warc: start a new shard past this many items."
    )
    fsync: bool = Field(
        True,
        description="fsync each write before the item counts as done, so a power cut of the "
        "worker host loses nothing; false skips the disk flushes (with group_commit, two a save "
        "batch: on a slow disk that is time, on the benchmark's no measurable speed) and survives "
        "only crashes of the worker process.",
    )
    group_commit: bool = Field(
        True,
        description="files, with fsync: make a save batch's files durable together, with two "
        "syncfs calls for the batch instead of two fsyncs per file. syncfs flushes everything the "
        "output's file system holds dirty: false where other programs write much to it.",
    )

    table: Optional[str] = Field(
        None,
        description="postgres: the table the records go to, as name or schema.name (lower-case "
        "letters, digits and _); the database is the workers' DISTSCRAPE_POSTGRES_DSN.",
    )
    key: str = Field(
        "url",
        description="postgres: the record field each row is upserted by (the table's primary "
        "key column, named after it): url, or a field the extraction gives.",
    )
    create_table: bool = Field(
        False,
        description="postgres: create the table (its schema must exist) if it does not exist.",
    )

    @model_validator(mode="before")
    @classmethod
    def _kind_from_output(cls, data: Any) -> Any:
        """No kind given: the one the output names (see :func:`saver_kind_for`)."""
        if isinstance(data, dict) and data.get("kind") is None:
            output = data.get("output")
            return {**data, "kind": saver_kind_for(output if isinstance(output, str) else "")}
        return data

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        return check_kind(value, BUILTIN_SAVERS)

    @field_validator("table")
    @classmethod
    def _table(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not _TABLE.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a table name: give name or schema.name, each of lower-case "
                "letters, digits and _ (not starting with a digit), at most 63 characters"
            )
        return value

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        if not _COLUMN.fullmatch(value):
            raise ValueError(
                f"{value!r} cannot name the key column: use lower-case letters, digits and _ "
                "(not starting with a digit), at most 63 characters"
            )
        if value in RECORD_COLUMNS and value != "url":
            raise ValueError(f"{value!r} is a column the saver fills itself; name another field")
        return value

    @field_validator("output")
    @classmethod
    def _output_suits_kind(cls, value: str, info: ValidationInfo) -> str:
        kind = info.data.get("kind")
        if kind in _OUTPUT_SHAPES and (
            saver_kind_for(value) != kind
            # An archive's shards are named after its stem, so it needs one.
            or (kind in ("tar", "warc") and os.path.basename(value).startswith("."))
        ):
            raise ValueError(
                f"{redact(value)!r} is not an output for the {kind} saver "
                f"({field_label(info, 'saver.kind')}), which takes {_OUTPUT_SHAPES[kind]}"
            )
        return value

    @model_validator(mode="after")
    def _table_for_table_savers(self, info: ValidationInfo) -> "SaverSpec":
        if self.kind in _TABLE_SAVERS and self.table is None:
            raise ValueError(
                f"the {self.kind} saver needs {field_label(info, 'saver.table')}: the table its "
                "records go to"
            )
        return self
