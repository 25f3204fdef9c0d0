"""TarItemSaver and WarcItemSaver: per-worker shards, rotation, durability, torn tails."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import tarfile
import threading

import pytest
from warcio.archiveiterator import ArchiveIterator

from distscrape_celery.core.components import build_saver
from distscrape_celery.errors import ConfigError, SaveError
from distscrape_celery.web.fetch import Download
from distscrape_celery.job.spec import build_spec
from distscrape_celery.core.pipeline.failures import output_full
from distscrape_celery.savers import FileItemSaver, TarItemSaver, WarcItemSaver, tar_index
from distscrape_celery.savers import shards as shards_module
from distscrape_celery.savers.tar import TarShard, read_tar_shard, tar_shards
from distscrape_celery.savers.warc import warc_shards
from distscrape_celery.settings import Settings
from tests.support.saving import GNU_TAR_FLAG, download

TAR_EXTS = [".tar", ".tar.gz", ".tar.bz2"]


def sample_items() -> list[tuple[str, Download]]:
    """Items of every awkward shape: empty, binary, exactly one block, long names, an ID."""
    long_path = "/deep/" + "x" * 180 + "/" + "y" * 150 + ".html"
    bodies = [
        ("http://127.0.0.1:8080/", b"<html>home</html>"),
        ("http://127.0.0.1:8080/empty.html", b""),
        ("http://127.0.0.1:8080/block.bin", bytes(range(256)) * 2),  # exactly 512 bytes
        ("http://127.0.0.1:8080/binary", os.urandom(5000)),
        ("http://127.0.0.1:8080/q?id=7&x=%20y", b"query page"),
        ("http://127.0.0.1:8080" + long_path, b"long name" * 100),
        ("http://example.org/caf%C3%A9/", "café ünïcode".encode()),
    ]
    out = [(item, download(item, body)) for item, body in bodies]
    # An ID, downloaded from a URL of its own.
    out.append(("item-id-42", Download(
        url="http://127.0.0.1:8080/api/42.json", status=200, content_type="application/json",
        body=b'{"id": 42}', fetched_at=1700000000.25,
    )))
    out.append(("http://127.0.0.1:8080/moved", Download(
        url="http://127.0.0.1:8080/moved-here", status=301, content_type="text/plain; charset=x",
        body=b"redirected", fetched_at=1700000123.5,
    )))
    return out


def finished(shard) -> bool:
    reader = TarShard(shard)
    list(reader)
    return reader.finished and not reader.torn


def records_by_item(output) -> dict[str, list]:
    out: dict[str, list] = {}
    for shard in tar_shards(output):
        for record in read_tar_shard(shard):
            out.setdefault(record.item, []).append(record)
    return out


# -- naming -------------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", TAR_EXTS)
def test_shards_are_named_after_output_worker_pid_and_sequence(tmp_path, ext):
    saver = TarItemSaver(tmp_path / f"site{ext}", worker_id="w3", shard_max_items=1)
    saver.open()
    saver.save("http://h/a", download("http://h/a", b"a"))
    saver.save("http://h/b", download("http://h/b", b"b"))
    saver.close()
    pid = os.getpid()
    assert [p.name for p in tar_shards(tmp_path / f"site{ext}")] == [
        f"site-w3-{pid}-00001{ext}", f"site-w3-{pid}-00002{ext}",
    ]


def test_worker_ids_are_made_safe_for_file_names(tmp_path):
    saver = TarItemSaver(tmp_path / "site.tar", worker_id="host-a:12/x")
    saver.save("http://h/a", download("http://h/a", b"a"))
    saver.close()
    (shard,) = tar_shards(tmp_path / "site.tar")
    assert shard.name == f"site-host_a_12_x-{os.getpid()}-00001.tar"
    assert shard.parent == tmp_path


@pytest.mark.parametrize("output", [
    "site.zip", "site.gz", "site.tgz", "site.tar.xz", "site", ".tar.gz", "site.TAR", "site.warc.gz",
])
def test_bad_tar_names_are_rejected(tmp_path, output):
    with pytest.raises(ConfigError, match="saver.output"):
        TarItemSaver(tmp_path / output)
    # The spec refuses it already, so no worker ever gets it.
    with pytest.raises(ConfigError, match="saver.output: .* is not an output for the tar saver"):
        build_spec({"seeds": ["http://h/"], "saver": {"kind": "tar", "output": str(tmp_path / output)}})


@pytest.mark.parametrize("output", ["site.warc", "site.gz", "site.tar.gz", ".warc.gz", "site.arc.gz"])
def test_bad_warc_names_are_rejected(tmp_path, output):
    with pytest.raises(ConfigError, match="saver.output"):
        WarcItemSaver(tmp_path / output)
    with pytest.raises(ConfigError, match="saver.output: .* is not an output for the warc saver"):
        build_spec({"seeds": ["http://h/"], "saver": {"kind": "warc", "output": str(tmp_path / output)}})


def test_bad_name_scheme_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match="name_scheme"):
        TarItemSaver(tmp_path / "site.tar", "{host}/{nope}")


def test_spec_kinds_build_the_archive_savers(tmp_path):
    tar_spec = build_spec({"seeds": ["http://h/"], "saver": {
        "kind": "tar", "output": str(tmp_path / "a.tar.gz"), "shard_max_items": 5, "fsync": False,
    }})
    roots = Settings(output_roots=[str(tmp_path)])
    saver = build_saver(tar_spec, "job", "w9", roots)
    assert isinstance(saver, TarItemSaver) and saver.compression == "gz"
    assert saver._writer.max_items == 5 and not saver._writer.fsync
    warc_spec = build_spec({"seeds": ["http://h/"], "saver": {"kind": "warc", "output": str(tmp_path / "a.warc.gz")}})
    assert isinstance(build_saver(warc_spec, "job", "w9", roots), WarcItemSaver)


def test_an_existing_shard_is_never_appended_to(tmp_path):
    """O_EXCL: a file with our would-be name (a dead process's with the same pid) is skipped."""
    old = tmp_path / f"site-w1-{os.getpid()}-00001.tar.gz"
    old.write_bytes(b"torn tail of someone else")
    saver = TarItemSaver(tmp_path / "site.tar.gz", worker_id="w1")
    location = saver.save("http://h/a", download("http://h/a", b"a"))
    saver.close()
    assert old.read_bytes() == b"torn tail of someone else"
    assert location == f"{tmp_path}/site-w1-{os.getpid()}-00002.tar.gz#h/a/index.html"
    assert [(i, n) for i, _, n in tar_index(tmp_path / "site.tar.gz")] == [("http://h/a", "h/a/index.html")]


# -- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", TAR_EXTS)
def test_tar_round_trip_member_by_member(tmp_path, ext):
    output = tmp_path / f"site{ext}"
    saver = TarItemSaver(output, job="j", worker_id="w1")
    saver.open()
    items = sample_items()
    for item, dl in items:
        location = saver.save(item, dl)
        assert location.endswith("#" + saver.member_name(item))
    saver.close()

    (shard,) = tar_shards(output)
    reader = TarShard(shard)
    records = list(reader)
    assert reader.finished and not reader.torn
    namer = FileItemSaver(tmp_path, job="j")
    assert len(records) == len(items)
    for record, (item, dl) in zip(records, items):
        assert record.item == item
        assert record.name == namer.name_for(item).as_posix()
        assert record.body == dl.body
        assert (record.url, record.status, record.content_type, record.fetched_at) == (
            dl.url, dl.status, dl.content_type, dl.fetched_at,
        )

    # Python's tarfile, in its random-access mode, reads the same members and metadata.
    with tarfile.open(shard, "r:*") as tar:
        members = tar.getmembers()
        assert [m.pax_headers["DISTSCRAPE.item"] for m in members] == [i for i, _ in items]
        for member, (_, dl) in zip(members, items):
            assert tar.extractfile(member).read() == dl.body
            assert member.mtime == int(dl.fetched_at)


@pytest.mark.skipif(shutil.which("tar") is None, reason="no tar command")
@pytest.mark.parametrize("ext", TAR_EXTS)
def test_gnu_tar_lists_every_member(tmp_path, ext):
    if ext == ".tar.bz2" and shutil.which("bzip2") is None:
        pytest.skip("no bzip2 command")
    output = tmp_path / f"site{ext}"
    saver = TarItemSaver(output, worker_id="w1")
    items = sample_items()
    for item, dl in items:
        saver.save(item, dl)
    saver.close()
    (shard,) = tar_shards(output)
    res = subprocess.run(
        ["tar", "--warning=no-unknown-keyword", f"-t{GNU_TAR_FLAG[ext]}f", str(shard)],
        capture_output=True, text=True, timeout=30,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [saver.member_name(i) for i, _ in items]


@pytest.mark.parametrize("ext", TAR_EXTS)
def test_saving_an_item_twice_writes_it_once(tmp_path, ext):
    output = tmp_path / f"site{ext}"
    saver = TarItemSaver(output, worker_id="w1")
    first = saver.save("http://h/a", download("http://h/a", b"one"))
    again = saver.save("http://h/a", download("http://h/a", b"two"))
    saver.save("http://h/b", download("http://h/b", b"b"))
    saver.close()
    assert first == again
    assert {item: [r.body for r in recs] for item, recs in records_by_item(output).items()} == {
        "http://h/a": [b"one"], "http://h/b": [b"b"],
    }


def test_concurrent_saves_from_threads(tmp_path):
    output = tmp_path / "site.tar.gz"
    saver = TarItemSaver(output, worker_id="w1", shard_max_items=37)
    items = {f"http://h/{i}.html": os.urandom(100 + i) for i in range(400)}
    work = list(items.items())
    errors: list[BaseException] = []

    def run(offset: int) -> None:
        try:
            for n in range(offset, len(work) + offset):  # every thread saves every item
                item, body = work[n % len(work)]
                saver.save(item, download(item, body))
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k * 50,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    saver.close()
    assert not errors
    found = records_by_item(output)
    assert {item: [r.body for r in recs] for item, recs in found.items()} == {
        item: [body] for item, body in items.items()
    }
    for shard in tar_shards(output):
        reader = TarShard(shard)
        assert len(list(reader)) <= 37 and reader.finished


# -- rotation ------------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", TAR_EXTS)
def test_rotation_by_item_count(tmp_path, ext):
    output = tmp_path / f"site{ext}"
    saver = TarItemSaver(output, worker_id="w1", shard_max_items=3)
    items = [f"http://h/{i}" for i in range(7)]
    for item in items:
        saver.save(item, download(item, item.encode()))
    # A full shard is finished at once, without waiting for close().
    shards = tar_shards(output)
    assert [finished(s) for s in shards] == [True, True, False]
    saver.close()
    per_shard = [[r.item for r in read_tar_shard(s)] for s in tar_shards(output)]
    assert per_shard == [items[0:3], items[3:6], items[6:7]]
    assert all(finished(s) for s in tar_shards(output))


@pytest.mark.parametrize("ext", TAR_EXTS)
def test_rotation_by_size(tmp_path, ext):
    output = tmp_path / f"site{ext}"
    max_bytes = 6000
    saver = TarItemSaver(output, worker_id="w1", shard_max_bytes=max_bytes)
    items = {f"http://h/{i}": os.urandom(1500) for i in range(20)}  # incompressible
    for item, body in items.items():
        saver.save(item, download(item, body))
    saver.close()
    shards = tar_shards(output)
    assert len(shards) >= 4
    seen = []
    for shard in shards:
        records = list(read_tar_shard(shard))
        assert records, shard
        seen += [(r.item, r.body) for r in records]
        # Items stay under the limit; only the end-of-archive marker may go past it.
        assert os.path.getsize(shard) <= max_bytes + 1024 + 100
    assert seen == list(items.items())


def test_an_item_larger_than_a_shard_gets_a_shard_of_its_own(tmp_path):
    output = tmp_path / "site.tar"
    saver = TarItemSaver(output, worker_id="w1", shard_max_bytes=1000)
    for i, size in enumerate([10, 5000, 10]):
        saver.save(f"http://h/{i}", download(f"http://h/{i}", b"x" * size))
    saver.close()
    assert [[len(r.body) for r in read_tar_shard(s)] for s in tar_shards(output)] == [[10], [5000], [10]]


# -- durability and torn tails -----------------------------------------------------------------


def _save_tracking_sizes(saver, shard_glob_output, n):
    """Save ``n`` items without closing; return them and the shard's size after each save."""
    items, sizes = [], []
    for i in range(n):
        item = f"http://h/page/{i}.html"
        body = os.urandom(700 + 97 * i) if i % 2 else (b"text %d " % i) * 300
        saver.save(item, download(item, body))
        items.append((item, body))
        (shard,) = shard_glob_output()
        sizes.append(os.path.getsize(shard))
    return items, sizes, shard


@pytest.mark.parametrize("ext", TAR_EXTS)
def test_torn_tail_keeps_every_complete_member(tmp_path, ext):
    """A shard cut anywhere (a worker killed mid-write, a disk that lost the tail) still yields
    exactly the members that were complete before the cut, and tar_index lists those."""
    output = tmp_path / f"site{ext}"
    saver = TarItemSaver(output, worker_id="w1")  # never closed: as if killed
    items, sizes, shard = _save_tracking_sizes(saver, lambda: tar_shards(output), 5)
    data = shard.read_bytes()
    assert len(data) == sizes[-1]  # everything saved is on disk when save returns

    def complete_before(cut: int) -> int:
        return sum(1 for size in sizes if size <= cut)

    # Every byte of the last member's headers, then a stride; and around every boundary.
    cuts = set(range(0, len(data), 97)) | set(range(sizes[-2] - 3, sizes[-2] + 1100))
    cuts |= set(range(sizes[-2], len(data) + 1, 13))
    cuts |= {s + d for s in sizes for d in (-1, 0, 1, 511, 512, 513)}
    torn_copy = tmp_path / "cut" / shard.name
    torn_copy.parent.mkdir()
    for cut in sorted(c for c in cuts if 0 <= c <= len(data)):
        torn_copy.write_bytes(data[:cut])
        reader = TarShard(torn_copy)
        got = [(r.item, r.body) for r in reader]
        want = complete_before(cut)
        assert len(got) == want, cut
        assert got == items[: len(got)], cut
        if cut in sizes or cut == 0:
            assert not reader.torn, cut
        else:
            assert reader.torn, cut
        assert not reader.finished

    # "Truncate the shard by a few bytes": tar_index lists the earlier members.
    shard.write_bytes(data[:-5])
    assert [(item, path, name) for item, path, name in tar_index(output)] == [
        (item, str(shard), saver.member_name(item)) for item, _ in items[:4]
    ]


@pytest.mark.skipif(shutil.which("tar") is None, reason="no tar command")
def test_gnu_tar_lists_the_members_before_a_torn_tail(tmp_path):
    output = tmp_path / "site.tar.gz"
    saver = TarItemSaver(output, worker_id="w1")
    items, sizes, shard = _save_tracking_sizes(saver, lambda: tar_shards(output), 4)
    shard.write_bytes(shard.read_bytes()[:-20])
    res = subprocess.run(
        ["tar", "--warning=no-unknown-keyword", "-tzf", str(shard)], capture_output=True,
        text=True, timeout=30,
    )
    assert res.stdout.splitlines()[:3] == [saver.member_name(i) for i, _ in items[:3]]


def test_tar_index_reports_each_item_once_across_shards(tmp_path):
    """A duplicate save by another process lands in another shard; the index lists it once."""
    output = tmp_path / "site.tar.bz2"
    first = TarItemSaver(output, worker_id="w1")
    second = TarItemSaver(output, worker_id="w2")
    for i in range(5):
        first.save(f"http://h/{i}", download(f"http://h/{i}", b"first"))
    for i in range(3, 8):
        second.save(f"http://h/{i}", download(f"http://h/{i}", b"second"))
    first.close()
    second.close()
    (unrelated := tmp_path / "site-w1-1-00001.tar.gz").write_bytes(b"not ours")  # another output
    (tmp_path / "other-w1-1-00001.tar.bz2").write_bytes(b"not ours")
    index = list(tar_index(output))
    assert [item for item, _, _ in index] == [f"http://h/{i}" for i in range(8)]
    assert {shard for _, shard, _ in index} == {str(p) for p in tar_shards(output)}
    assert len(tar_shards(output)) == 2 and unrelated not in tar_shards(output)


def test_tar_index_of_nothing(tmp_path):
    assert list(tar_index(tmp_path / "missing" / "site.tar")) == []
    with pytest.raises(ConfigError):
        list(tar_index(tmp_path / "site.zip"))


@pytest.mark.parametrize("ext", TAR_EXTS)
def test_a_failed_write_leaves_no_garbage_and_is_a_disk_full_error(tmp_path, ext, monkeypatch):
    """ENOSPC halfway through a member: the save fails as "output full" (the pipeline retries
    it later), the shard is cut back to its last complete member, and later saves go on."""
    output = tmp_path / f"site{ext}"
    saver = TarItemSaver(output, worker_id="w1")
    saver.save("http://h/0", download("http://h/0", os.urandom(3000)))
    real_write = os.write
    calls = []

    def half_then_enospc(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shards_module.os, "write", half_then_enospc)
    with pytest.raises(SaveError) as info:
        saver.save("http://h/1", download("http://h/1", os.urandom(3000)))
    assert output_full(info.value) is not None
    monkeypatch.setattr(shards_module.os, "write", real_write)
    saver.save("http://h/1", download("http://h/1", b"again"))
    saver.save("http://h/2", download("http://h/2", b"two"))
    saver.close()
    (shard,) = tar_shards(output)
    reader = TarShard(shard)
    assert [(r.item, len(r.body)) for r in reader] == [("http://h/0", 3000), ("http://h/1", 5), ("http://h/2", 3)]
    assert reader.finished and not reader.torn


@pytest.mark.parametrize("fsync", [True, False])
def test_fsync_before_save_returns(tmp_path, monkeypatch, fsync):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(shards_module.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    saver = TarItemSaver(tmp_path / "site.tar.gz", worker_id="w1", fsync=fsync)
    saver.save("http://h/0", download("http://h/0", b"x"))
    before = len(synced)
    saver.save("http://h/1", download("http://h/1", b"y"))
    assert (len(synced) - before >= 1) if fsync else (len(synced) == 0)
    saver.close()


# -- WARC ----------------------------------------------------------------------------------------


def read_warc(path) -> list:
    """(type, headers, http headers, content) of every record, with warcio's own reader."""
    out = []
    with open(path, "rb") as fh:
        for record in ArchiveIterator(fh):
            out.append((
                record.rec_type, record.rec_headers, record.http_headers,
                record.content_stream().read(),
            ))
    return out


def test_warc_round_trip_with_warcio(tmp_path):
    output = tmp_path / "site.warc.gz"
    saver = WarcItemSaver(output, job="j", worker_id="w1")
    items = sample_items()
    for item, dl in items:
        assert saver.save(item, dl).endswith("#" + item)
    saver.close()
    (shard,) = warc_shards(output)
    assert re.fullmatch(rf"site-w1-{os.getpid()}-00001\.warc\.gz", shard.name)
    records = read_warc(shard)
    assert records[0][0] == "warcinfo"
    assert records[0][1].get_header("WARC-Filename") == shard.name
    assert b"job: j" in records[0][3] and b"worker: w1" in records[0][3]
    rest = records[1:]
    assert len(rest) == 2 * len(items)
    responses = [r for r in rest if r[0] == "response"]
    requests_ = {r[1].get_header("WARC-Concurrent-To"): r for r in rest if r[0] == "request"}
    for (_, head, http, content), (item, dl) in zip(responses, items):
        assert head.protocol == "WARC/1.1"
        assert head.get_header("DISTSCRAPE-Item") == item
        assert head.get_header("WARC-Target-URI") == dl.url
        assert head.get_header("WARC-Date").startswith("2023-11-14T22:")
        assert http.get_statuscode() == str(dl.status)
        assert http.get_header("Content-Type") == dl.content_type
        assert http.get_header("Content-Length") == str(len(dl.body))
        assert content == dl.body
        req_type, req_head, req_http, req_content = requests_[head.get_header("WARC-Record-ID")]
        assert req_head.get_header("WARC-Target-URI") == dl.url
        assert req_head.get_header("WARC-Date") == head.get_header("WARC-Date")
        assert req_http.protocol == "GET" and req_http.statusline.endswith("HTTP/1.1")
        assert req_http.get_header("Host") == dl.url.split("/")[2]
        assert req_content == b""
    assert responses[0][1].get_header("WARC-Date") == "2023-11-14T22:13:20.250000Z"
    assert requests_[responses[4][1].get_header("WARC-Record-ID")][2].statusline.startswith(
        "/q?id=7&x=%20y "
    )


def test_warc_rotation_idempotence_and_torn_tail(tmp_path):
    output = tmp_path / "site.warc.gz"
    saver = WarcItemSaver(output, worker_id="w1", shard_max_items=3)
    items = [f"http://h/{i}" for i in range(7)]
    for item in items:
        saver.save(item, download(item, item.encode() * 50))
        saver.save(item, download(item, b"again"))  # written once
    saver.close()
    shards = warc_shards(output)
    assert len(shards) == 3
    per_shard = [
        [r[1].get_header("DISTSCRAPE-Item") for r in read_warc(s) if r[0] == "response"] for s in shards
    ]
    assert per_shard == [items[0:3], items[3:6], items[6:7]]
    assert all(read_warc(s)[0][0] == "warcinfo" for s in shards)

    # A torn last record: warcio still reads every earlier one.
    data = shards[0].read_bytes()
    shards[0].write_bytes(data[: len(data) - 300])
    got = []
    with open(shards[0], "rb") as fh:
        try:
            for record in ArchiveIterator(fh):
                got.append((record.rec_type, record.content_stream().read()))
        except Exception:  # warcio may or may not complain about the torn tail
            pass
    responses = [body for kind, body in got if kind == "response"]
    assert responses[:2] == [items[0].encode() * 50, items[1].encode() * 50]
