"""A known item's record as the tracker keeps it (tracker/revisits.py): what a worker packs
comes back whole, and what is not a record is read as none."""

from __future__ import annotations

import pytest

from distscrape_celery.tracker.revisits import Record, digest


@pytest.mark.parametrize("record", [
    Record(depth=3, interval=3600, gone=1, digest=digest(b"x"), etag='"65a1b2c3-1f2e"'),
    Record(depth=255, interval=600, etag='W/"weak"'),
    Record(last_modified=1_700_000_000),
    Record(),
], ids=["strong-etag", "weak-etag", "last-modified", "empty"])
def test_a_record_comes_back_as_packed(record):
    packed = record.pack()
    assert len(packed) <= 64  # Redis keeps a hash value this long in its listpack encoding
    assert Record.unpack(packed) == record
    assert Record.from_hex(packed.hex()) == record


def test_one_validator_is_kept_the_etag_first():
    both = Record(etag='"abc"', last_modified=1_700_000_000)
    assert Record.unpack(both.pack()) == Record(etag='"abc"')
    too_long = Record(etag='"' + "x" * 60 + '"', last_modified=1_700_000_000)
    assert Record.unpack(too_long.pack()) == Record(last_modified=1_700_000_000)


@pytest.mark.parametrize("junk", ["zz", "0102", "ab" * 3])
def test_what_is_not_a_record_reads_as_none(junk):
    assert Record.from_hex(junk) is None
