"""The JSON Lines saver: each page's records as one unit of a per-process shard, read back past a
torn tail, and joined into the named file with each page once."""

from __future__ import annotations

import gzip
import json

import pytest

from distscrape_celery.errors import SaveError
from distscrape_celery.savers.jsonl import (
    JsonLinesItemSaver, JsonLinesShard, NO_RECORDS, join_jsonl, jsonl_shards,
)
from distscrape_celery.web.fetch import Download


def _download(n: int, records: int = 2, fetched_at: str = "2026-05-01T00:00:00.000000Z") -> Download:
    url = f"http://127.0.0.1:1/p/{n}"
    return Download(url, 200, "text/html", b"", records=tuple(
        {"url": url, "status": 200, "fetched_at": fetched_at, "job": "j", "n": n, "k": k,
         "text": "caf\u00e9 \u2028"} for k in range(records)))


def _read(path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


@pytest.mark.parametrize("ext", [".jsonl", ".jsonl.gz"])
def test_pages_records_go_to_a_shard_of_the_process_and_join_into_the_named_file(tmp_path, ext):
    output = tmp_path / f"items{ext}"
    saver = JsonLinesItemSaver(output, worker_id="w1", shard_max_items=3)
    saver.open()
    locations = [saver.save(f"i{n}", _download(n)) for n in range(5)]
    assert saver.save("empty", Download("http://127.0.0.1:1/e", 200, "text/html", b"")) == NO_RECORDS
    assert saver.save("i0", _download(0)) == locations[0]  # written once
    results = saver.save_many([(f"i{n}", _download(n)) for n in range(5, 9)]
                              + [("i1", _download(1)), ("none", _download(99, records=0))])
    assert all(isinstance(r, str) for r in results) and results[-1] == NO_RECORDS
    saver.close()
    shards = jsonl_shards(output)
    assert len(shards) >= 2 and all(s.name.startswith("items-w1-") for s in shards)
    expected = [(n, k) for n in range(9) for k in range(2)]
    assert sorted((r["n"], r["k"]) for s in shards for r in _read(s)) == expected
    if ext == ".jsonl.gz":  # one gzip member a page
        with open(shards[0], "rb") as fh:
            assert fh.read().count(b"\x1f\x8b\x08") >= 3

    joined = join_jsonl(output)
    assert (joined.items, jsonl_shards(output)) == (9, [])
    records = _read(output)
    assert sorted((r["n"], r["k"]) for r in records) == expected
    assert records[0]["text"] == "caf\u00e9 \u2028"
    # Joined again with new shards: what was joined stays, the new pages follow.
    more = JsonLinesItemSaver(output, worker_id="w2")
    more.save("i0", _download(0))  # a page saved again (a late duplicate)
    more.save("i9", _download(9))
    more.close()
    assert join_jsonl(output).items == 10
    assert sorted((r["n"], r["k"]) for r in _read(output)) == expected + [(9, 0), (9, 1)]


def test_a_torn_tail_is_left_out_and_a_page_cut_short_is_joined_whole(tmp_path):
    output = tmp_path / "items.jsonl"
    first = JsonLinesItemSaver(output, worker_id="a")
    for n in range(3):
        first.save(f"i{n}", _download(n, records=3))
    first.close()
    [shard] = jsonl_shards(output)
    data = shard.read_bytes()
    # A crash in the write of page 2: two of its lines got to disk, and half of the third.
    lines = data.splitlines(keepends=True)
    shard.write_bytes(b"".join(lines[:8]) + lines[8][:10])
    reader = JsonLinesShard(shard)
    assert [len(lines) for _, lines in reader.units()] == [3, 3, 2] and reader.torn
    # The page's save was done again by another process, whole.
    second = JsonLinesItemSaver(output, worker_id="b")
    second.save("i2", _download(2, records=3))
    second.close()
    assert join_jsonl(output).items == 3
    assert sorted((r["n"], r["k"]) for r in _read(output)) == [
        (n, k) for n in range(3) for k in range(3)]


def test_a_torn_gzip_member_is_left_out(tmp_path):
    output = tmp_path / "items.jsonl.gz"
    saver = JsonLinesItemSaver(output, worker_id="a")
    for n in range(3):
        saver.save(f"i{n}", _download(n))
    saver.close()
    [shard] = jsonl_shards(output)
    shard.write_bytes(shard.read_bytes()[:-5])
    reader = JsonLinesShard(shard)
    assert [r["n"] for r in reader.records()] == [0, 0, 1, 1] and reader.torn


def test_a_join_refuses_an_output_that_is_not_records_and_changes_nothing(tmp_path):
    output = tmp_path / "items.jsonl"
    output.write_text('{"not": "a record"}\n')
    saver = JsonLinesItemSaver(output, worker_id="a")
    saver.save("i0", _download(0))
    saver.close()
    with pytest.raises(SaveError, match="not an archive this crawler wrote"):
        join_jsonl(output)
    assert output.read_text() == '{"not": "a record"}\n' and len(jsonl_shards(output)) == 1


def test_a_page_downloaded_again_after_a_crash_is_joined_once_from_its_latest_fetch(tmp_path):
    output = tmp_path / "items.jsonl"
    first = JsonLinesItemSaver(output, worker_id="a")
    first.save("i0", _download(0, fetched_at="2026-05-01T00:00:00.000000Z"))
    first.save("i1", _download(1))
    first.close()
    # Its worker died before the tracker heard of i0: another one downloaded and saved it again.
    second = JsonLinesItemSaver(output, worker_id="b")
    second.save("i0", _download(0, records=3, fetched_at="2026-05-01T00:00:09.000000Z"))
    second.close()
    assert join_jsonl(output).items == 2
    records = _read(output)
    assert sorted((r["n"], r["k"], r["fetched_at"][17:19]) for r in records) == [
        (0, 0, "09"), (0, 1, "09"), (0, 2, "09"), (1, 0, "00"), (1, 1, "00")]
    # A later run (a new generation) appends its pages, an earlier join's stay as they were.
    third = JsonLinesItemSaver(output, worker_id="c")
    third.save("i0", _download(0, records=1, fetched_at="2026-06-01T00:00:00.000000Z"))
    third.close()
    join_jsonl(output)
    assert [r["fetched_at"][:7] for r in _read(output) if r["n"] == 0] == ["2026-05"] * 3 + ["2026-06"]
