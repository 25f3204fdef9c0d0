"""`distscrape crawl --output X.tar.gz` leaves exactly X: the workers' shards are joined into the
named archive at the end, which standard readers (tarfile, GNU tar, warcio) read whole and
`tar-index` lists; an interrupted crawl names the shards it leaves, and its resume joins them."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tarfile
from pathlib import Path

import pytest
from distscrape_celery.testing.sitegen import SiteServer
from tests.support.cli import run
from tests.support.crawl_command import Crawl, wait_until
from tests.support.saving import GNU_TAR_FLAG, download
from warcio.archiveiterator import ArchiveIterator

from distscrape_celery.savers import FileItemSaver, TarItemSaver, WarcItemSaver
from distscrape_celery.savers.tar import PAX_ITEM, tar_shards
from distscrape_celery.savers.warc import warc_shards

ARCHIVES = [".tar", ".tar.gz", ".tar.bz2", ".warc.gz"]


def _config(tmp_path: Path, output: Path) -> Path:
    """A job file that rotates shards every 5 items (the output is given by --output)."""
    path = tmp_path / "job.toml"
    kind = "warc" if output.name.endswith(".warc.gz") else "tar"
    path.write_text(f'[saver]\nkind = "{kind}"\nshard_max_items = 5\n')
    return path


def tar_items(path: Path) -> list[str]:
    """The item of every member of the archive at ``path``, read by tarfile alone."""
    with tarfile.open(path, "r:*") as tar:
        return [m.pax_headers[PAX_ITEM] for m in tar.getmembers()]


def warc_items(path: Path) -> list[str]:
    """The item of every response record of the WARC file at ``path``, read by warcio."""
    out = []
    with open(path, "rb") as fh:
        for record in ArchiveIterator(fh):
            if record.rec_type == "response":
                out.append(record.rec_headers.get_header("DISTSCRAPE-Item"))
    return out


def items_in(path: Path) -> list[str]:
    return warc_items(path) if path.name.endswith(".warc.gz") else tar_items(path)


def shards_of(output: Path) -> list[Path]:
    return warc_shards(output) if output.name.endswith(".warc.gz") else tar_shards(output)


def assert_one_archive(output: Path, expected: set[str]) -> None:
    """Exactly ``output`` beside the state directory, holding every expected item once, read by
    the standard readers; tar-index lists it too."""
    assert sorted(p.name for p in output.parent.iterdir()) == sorted(
        [output.name, output.name + ".distscrape-state"]
    )
    got = items_in(output)
    assert sorted(got) == sorted(expected)
    ext = next(e for e in ARCHIVES if output.name.endswith(e))
    if ext == ".warc.gz":
        return
    if shutil.which("tar") and (ext != ".tar.bz2" or shutil.which("bzip2")):
        res = subprocess.run(
            ["tar", "--warning=no-unknown-keyword", f"-t{GNU_TAR_FLAG[ext]}f", str(output)],
            capture_output=True, text=True, timeout=60,
        )
        assert res.returncode == 0, res.stderr
        namer = FileItemSaver(output.parent)
        assert sorted(res.stdout.splitlines()) == sorted(
            namer.name_for(i).as_posix() for i in expected
        )
    res = run("tar-index", str(output))
    assert res.returncode == 0, res.stderr
    lines = [line.split("\t") for line in res.stdout.splitlines()]
    assert sorted(item for item, _, _ in lines) == sorted(expected)
    assert {shard for _, shard, _ in lines} == {str(output)}


@pytest.mark.parametrize("ext", ARCHIVES)
def test_the_crawl_leaves_exactly_the_named_archive(ext, small_site, tmp_path):
    out_dir = tmp_path / "out"
    output = out_dir / f"items{ext}"
    with SiteServer(small_site) as server:
        crawl = Crawl(tmp_path, server.url("/"), output, "--config", str(_config(tmp_path, output)))
        assert crawl.wait(120) == 0, crawl.stderr
    expected = {server.url(p) for p in small_site.reachable}
    assert f"output in {output}" in crawl.stdout, crawl.stdout
    assert_one_archive(output, expected)


@pytest.mark.parametrize("ext", [".tar.gz", ".warc.gz"])
def test_an_interrupted_archive_crawl_names_its_shards_and_its_resume_joins_them(
        ext, small_site, tmp_path):
    out_dir = tmp_path / "out"
    output = out_dir / f"items{ext}"
    config = str(_config(tmp_path, output))
    with SiteServer(small_site, delay=0.1) as server:
        first = Crawl(tmp_path, server.url("/"), output, "--config", config, tag="first")
        try:
            wait_until(lambda: len(shards_of(output)) >= 3, 60, "3 shards written", first)
            first.proc.send_signal(signal.SIGINT)
            assert first.wait(30) == 130, first.stderr
        finally:
            if first.proc.poll() is None:
                first.proc.kill()
        left = shards_of(output)
        assert left and not output.exists()
        # The message names the shards that exist, and says the resume joins them.
        for shard in left[:10]:
            assert shard.name in first.stderr, first.stderr
        assert "join" in first.stderr, first.stderr

        server.delay = 0.0
        second = Crawl(tmp_path, server.url("/"), output, "--config", config, tag="second")
        assert second.wait(120) == 0, second.stderr
        assert "resuming job" in second.stderr, second.stderr
    expected = {server.url(p) for p in small_site.reachable}
    assert f"output in {output}" in second.stdout, second.stdout
    assert_one_archive(output, expected)


# -- joining, without a crawl ------------------------------------------------------------------


def _saver(output: Path, worker: str, **kw):
    if output.name.endswith(".warc.gz"):
        return WarcItemSaver(output, worker_id=worker, **kw)
    return TarItemSaver(output, worker_id=worker, **kw)


def _join(output: Path):
    from distscrape_celery.savers.tar import join_tar
    from distscrape_celery.savers.warc import join_warc

    if output.name.endswith(".warc.gz"):
        return join_warc(output, max_unit=1 << 20)
    return join_tar(output, max_unit=1 << 20)


@pytest.mark.parametrize("ext", ARCHIVES)
def test_join_keeps_each_item_once_and_takes_an_earlier_join_in(ext, tmp_path):
    """A late duplicate in a second shard is dropped; a torn shard gives its complete items; a
    second join (a crawl that went on after the first) adds new shards to the archive."""
    output = tmp_path / f"site{ext}"
    first, second = _saver(output, "w1", shard_max_items=2), _saver(output, "w2")
    for i in range(5):
        first.save(f"http://h/{i}", download(f"http://h/{i}", b"first %d" % i))
    for i in range(3, 8):
        second.save(f"http://h/{i}", download(f"http://h/{i}", b"second %d" % i))
    first.close()  # the second one is left open, as if killed mid-write: its last item torn
    (torn,) = [s for s in shards_of(output) if "-w2-" in s.name]
    torn.write_bytes(torn.read_bytes()[:-5])
    mode = torn.stat().st_mode & 0o777
    result = _join(output)
    assert result.path == output and result.items == 7
    assert shards_of(output) == []
    assert sorted(items_in(output)) == [f"http://h/{i}" for i in range(7)]
    assert output.stat().st_mode & 0o777 == mode  # as a shard's, not a temporary file's 0600

    later = _saver(output, "w3")
    for i in range(7, 10):
        later.save(f"http://h/{i}", download(f"http://h/{i}", b"later"))
    later.close()
    assert _join(output).items == 10
    assert sorted(items_in(output)) == [f"http://h/{i}" for i in range(10)]
    assert shards_of(output) == []


@pytest.mark.parametrize("ext", ARCHIVES)
def test_join_of_nothing_writes_an_empty_archive(ext, tmp_path):
    output = tmp_path / f"site{ext}"
    assert _join(output).items == 0
    assert items_in(output) == []


@pytest.mark.parametrize("ext", ARCHIVES)
def test_join_never_overwrites_a_file_it_did_not_write(ext, tmp_path):
    """An output that exists and is not an archive of saved items stays as it is, and so do the
    shards; the error says why."""
    from distscrape_celery.errors import SaveError

    output = tmp_path / f"site{ext}"
    output.write_bytes(b"someone else's file")
    saver = _saver(output, "w1")
    saver.save("http://h/1", download("http://h/1", b"x"))
    saver.close()
    with pytest.raises(SaveError, match=str(output)):
        _join(output)
    assert output.read_bytes() == b"someone else's file"
    assert len(shards_of(output)) == 1


@pytest.mark.parametrize("ext", [".tar.gz", ".warc.gz"])
def test_join_command_joins_shards_gathered_from_many_hosts(ext, tmp_path):
    """A seeded job's shards, one set a host, copied into one directory: `distscrape join`
    makes the one archive of them, which the standard readers read whole."""
    output = tmp_path / f"site{ext}"
    for host in ("a", "b"):
        saver = _saver(output, f"w-{host}")
        for i in range(3):
            item = f"http://{host}.invalid/{i}"
            saver.save(item, download(item, b"page %d" % i))
        saver.close()
    res = run("join", str(output), "--job", "site")
    assert res.returncode == 0, res.stderr
    assert "joined 2 shard(s)" in res.stdout and "6 item(s)" in res.stdout, res.stdout
    assert sorted(items_in(output)) == sorted(
        f"http://{h}.invalid/{i}" for h in ("a", "b") for i in range(3))
    assert shards_of(output) == []


def test_join_command_without_shards_writes_nothing(tmp_path):
    output = tmp_path / "site.tar.gz"
    res = run("join", str(output))
    assert res.returncode == 2 and "no shards" in res.stderr, res.stderr
    assert not output.exists()
    res = run("join", str(tmp_path / "dir"))
    assert res.returncode == 2 and "not a tar or WARC archive name" in res.stderr, res.stderr
