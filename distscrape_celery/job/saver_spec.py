"""The saver section of a job spec: which saver stores the downloads, where, and how durably; and
which built-in saver an output names."""

from __future__ import annotations

import os
from typing import Any, Optional

from pydantic import Field, ValidationInfo, field_validator, model_validator

from ..redaction import redact
from ..redis_urls import is_redis_url
from .sections import StrictModel, check_kind, field_label


# The built-in savers by what their output looks like; anything else is a directory (files).
TAR_EXTENSIONS = (".tar", ".tar.gz", ".tar.bz2")
WARC_EXTENSIONS = (".warc.gz",)
JSONL_EXTENSIONS = (".jsonl", ".jsonl.gz")


def saver_kind_for(output: str) -> str:
    """The built-in saver an output names: a Redis URL -> redis, a .tar/.tar.gz/.tar.bz2 name ->
    tar, a .warc.gz name -> warc, a .jsonl/.jsonl.gz name -> jsonl, anything else (a directory)
    -> files."""
    if is_redis_url(output):
        return "redis"
    if output.endswith(TAR_EXTENSIONS):
        return "tar"
    if output.endswith(WARC_EXTENSIONS):
        return "warc"
    if output.endswith(JSONL_EXTENSIONS):
        return "jsonl"
    return "files"


_OUTPUT_SHAPES = {
    "files": "a directory",
    "redis": "a redis://, rediss:// or unix:// URL",
    "tar": "a file name ending with " + ", ".join(TAR_EXTENSIONS),
    "warc": "a file name ending with " + " or ".join(WARC_EXTENSIONS),
    "jsonl": "a file name ending with " + " or ".join(JSONL_EXTENSIONS),
}


class SaverSpec(StrictModel):
    """Which saver stores downloaded items, and its options."""

    kind: str = Field(
        "files",
        description='"files", "redis", "tar", "warc", "jsonl" (the records of a job with '
        '[extract]), or a custom ItemSaver class as "package.module:Class"; when not given, the '
        'built-in saver the output names.',
    )
    output: str = Field(
        "crawl-output",
        description="files: a directory; tar: a .tar, .tar.gz or .tar.bz2 name; warc: a .warc.gz "
        "name; jsonl: a .jsonl or .jsonl.gz name (shards are named after it); redis: a redis:// "
        "or rediss:// URL (made absolute when seeded, unless a URL).",
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
        1024**3, gt=0, description="tar, warc and jsonl: start a new shard past this size."
    )
    shard_max_items: Optional[int] = Field(
        None, gt=0, description="tar, warc and jsonl: start a new shard past this many items (pages)."
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
        return check_kind(value, tuple(_OUTPUT_SHAPES))

    @field_validator("output")
    @classmethod
    def _output_suits_kind(cls, value: str, info: ValidationInfo) -> str:
        kind = info.data.get("kind")
        if kind in _OUTPUT_SHAPES and (
            saver_kind_for(value) != kind
            # An archive's shards are named after its stem, so it needs one.
            or (kind in ("tar", "warc", "jsonl") and os.path.basename(value).startswith("."))
        ):
            raise ValueError(
                f"{redact(value)!r} is not an output for the {kind} saver "
                f"({field_label(info, 'saver.kind')}), which takes {_OUTPUT_SHAPES[kind]}"
            )
        return value
