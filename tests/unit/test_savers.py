"""FileItemSaver on real files under tmp_path: names, confinement, injectivity, atomic writes."""

from __future__ import annotations

import errno
import itertools
import os
import re
from pathlib import Path

import pytest

from distscrape_celery.errors import ConfigError, SaveError
from distscrape_celery.web.fetch import Download
from distscrape_celery.job.saver_spec import SaverSpec
from distscrape_celery.savers import FileItemSaver, ItemSaver
from tests.support.saving import sha1

SEGMENT_RE = re.compile(r"^(?:[A-Za-z0-9._~!$&'()+,;=@-]|%[0-9A-Fa-f%])+$")


def page(body: bytes, url: str = "http://h/") -> Download:
    return Download(url=url, status=200, content_type="text/html", body=body)


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if not p.is_dir())


@pytest.mark.parametrize(
    ("item", "name"),
    [
        ("http://Example.COM", "example.com/index.html"),
        ("http://example.com/", "example.com/index.html"),
        ("http://example.com/docs/", "example.com/docs/index.html"),
        ("http://example.com/docs", "example.com/docs/index.html"),
        ("http://example.com/a/b/c.html", "example.com/a/b/c.html"),
        ("http://example.com/a/b?x=1&y=%2F", "example.com/a/b/index.html%3Fx=1&y=%252F"),
        ("http://example.com/s.php?q=a%26b", "example.com/s.php%3Fq=a%2526b"),
        ("http://example.com/s.php?q=a&b", "example.com/s.php%3Fq=a&b"),
        ("http://example.com/s.php?a/b", "example.com/s.php%3Fa%2Fb"),
        ("http://example.com/a%20b.txt", "example.com/a%20b.txt"),
        ("http://example.com/a b.txt", "example.com/a%20b.txt"),
        ("http://example.com/caf%c3%a9.html", "example.com/caf%C3%A9.html"),
        ("http://example.com/café.html", "example.com/caf%C3%A9.html"),
        ("http://example.com/%41", "example.com/%2541/index.html"),
        ("http://example.com/100%", "example.com/100%25/index.html"),
        ("http://example.com/100%25", "example.com/100%2525/index.html"),
        ("http://example.com:8080/x.html", "example.com%3A8080/x.html"),
        ("http://[::1]:8080/", "%3A%3A1%3A8080/index.html"),
        ("http://example.com/a//b.html", "example.com/a/%2F/b.html"),
        ("not a url", "_/not%20a%20url"),
        ("12345", "_/12345"),
        ("a/../b", "_/a%2F..%2Fb"),
        ("..", "_/%2E%2E"),
    ],
)
def test_default_names(tmp_path: Path, item: str, name: str) -> None:
    saver = FileItemSaver(tmp_path / "out")
    assert saver.name_for(item) == Path(name)
    assert saver.name_for(item) == Path(name)  # deterministic
    assert not (tmp_path / "out").exists()  # and pure: naming touches no file


@pytest.mark.parametrize(
    ("scheme", "item", "name"),
    [
        ("{host}/{port}/{path}", "http://h:8080/x.html", "h%3A8080/8080/x.html"),
        ("{host}/{port}/{path}", "http://h/x.html", "h/x.html"),  # empty {port} leaves no segment
        ("{host}/{path}/{query}", "http://h/x.html?q=1", "h/x.html/q=1"),
        ("{host}/{path}/{query}", "http://h/x.html", "h/x.html"),
        ("{sha1}", "http://h/x.html", sha1("http://h/x.html")),
        ("{host}-{sha1}.bin", "http://h/x", "h-" + sha1("http://h/x") + ".bin"),
        ("../{host}/{{x}}/{path}", "http://h/x.html", "%2E%2E/h/%7Bx%7D/x.html"),
    ],
)
def test_custom_schemes(scheme: str, item: str, name: str) -> None:
    assert FileItemSaver("out", scheme).name_for(item) == Path(name)


HOSTILE = [
    "http://h/../../etc/passwd",
    "http://h/%2e%2e/%2e%2e/x",
    "http://h/%2E%2E/%2E%2E/x",
    "http://h/..%2f..%2fx",
    "http://h/..%2F..%2F..%2Fetc%2Fpasswd",
    "http://h/..\\..\\x",
    "http://h/%5c..%5c..%5cx",
    "http://h/a\x00b",
    "http://h/a%00b",
    "http://h//etc/passwd",
    "http://h/x.html?/../../etc/passwd",
    "http://../x",
    "http://./",
    "/etc/passwd",
    "../../etc/passwd",
    "..",
    ".",
    "",
    "C:\\Windows\\system.ini",
    "\\\\server\\share\\x",
    "file:///etc/passwd",
    "http://h/\x1b[31m\x7f",
    "http://h/" + "a" * 1000,
    "http://h/" + "é" * 300 + "/x",
    "http://h/" + "%2e" * 300,
    "http://h/x?" + "../" * 300,
]


@pytest.mark.parametrize("item", HOSTILE)
def test_hostile_items_stay_inside_output(tmp_path: Path, item: str) -> None:
    out = tmp_path / "out"
    saver = FileItemSaver(out)
    name = saver.name_for(item)
    assert not name.is_absolute()
    for segment in name.parts:
        assert segment not in ("", ".", "..")
        assert len(segment.encode()) <= 200
        assert SEGMENT_RE.match(segment), segment
    written = Path(saver.save(item, page(b"body")))
    assert written.read_bytes() == b"body"
    assert os.path.commonpath([out.resolve(), written.resolve()]) == str(out.resolve())
    assert [p.relative_to(tmp_path).parts[0] for p in files_under(tmp_path)] == ["out"]


LONG = "b" * 300
# One path segment each; no two are the same resource (no raw/escaped pairs of bytes a URL
# cannot carry raw), so only the index.html rule may give two URLs one name.
PIECES = [
    "", ".", "..", "a", "A", "a.html", "index.html", "%2e", "%2E", "%2e%2e", "%2F", "%2f",
    "%252F", "%", "%%", "%25", "%41", "%2541", "&", "%26", "%3F", ":", "%3A", "~", "%7E",
    " ", "é", "%FF", "\\", "\x00", "+", "%2B",
    # A long segment, and short ones spelling what it is cut to.
    LONG, LONG[:150] + "~" + sha1(LONG)[:16], LONG[:150] + "%7E" + sha1(LONG)[:16], LONG + "c",
]
QUERIES = ["", "q", "q=a%26b", "q=a&b", "a/b", "a%2Fb", "?"]


def same_resource_key(path: str, query: str) -> tuple[tuple[str, ...], str]:
    """Where two URLs may legitimately share a name: "/a", "/a/" and "/a/index.html"."""
    segments = path.split("/")[1:]
    if segments[-1] == "":
        segments[-1] = "index.html"
    elif "." not in segments[-1]:
        segments.append("index.html")
    return tuple(segments), query


def test_names_are_injective() -> None:
    saver = FileItemSaver("out")
    seen: dict[Path, tuple[str, tuple[tuple[str, ...], str]]] = {}
    paths = ["/" + first for first in PIECES]
    paths += ["/" + first + "/" + second for first, second in itertools.product(PIECES, PIECES)]
    for path, query in itertools.product(paths, QUERIES):
        item = "http://h" + path + ("?" + query if query else "")
        name = saver.name_for(item)
        key = same_resource_key(path, query)
        if name in seen:
            other, other_key = seen[name]
            assert other_key == key, f"{item!r} and {other!r} both map to {name}"
        else:
            seen[name] = (item, key)
    assert len(seen) > 1000


def test_equivalent_urls_share_a_name() -> None:
    saver = FileItemSaver("out")
    assert saver.name_for("http://h/a b/é") == saver.name_for("http://h/a%20b/%c3%a9")
    assert saver.name_for("http://h/a") == saver.name_for("http://h/a/")


@pytest.mark.parametrize(
    "item", ["http://h/a\tb", "http://h/a\nb", " http://h/ab", "\x01http://h/ab"]
)
def test_items_urlsplit_would_mangle_keep_their_own_name(item: str) -> None:
    saver = FileItemSaver("out")
    assert saver.name_for(item) != saver.name_for("http://h/ab")


def test_symlink_out_of_output_is_refused(tmp_path: Path) -> None:
    out, outside = tmp_path / "out", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    (out / "evil").symlink_to(outside)
    (out / "h").mkdir()
    (out / "h" / "x.html").symlink_to(outside / "target")
    saver = FileItemSaver(out)
    with pytest.raises(SaveError, match="outside the output directory"):
        saver.save("http://evil/x.html", page(b"nope"))
    with pytest.raises(SaveError, match="outside the output directory"):
        saver.save("http://h/x.html", page(b"nope"))
    assert list(outside.iterdir()) == []


def test_symlink_within_output_is_followed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "real").mkdir(parents=True)
    (out / "alias").symlink_to(out / "real")
    written = FileItemSaver(out).save("http://alias/x.html", page(b"ok"))
    assert (out / "real" / "x.html").read_bytes() == b"ok"
    assert written == str(out / "alias" / "x.html")


def test_save_writes_atomically_and_overwrites(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    saver = FileItemSaver(out)
    first = saver.save("http://h/p.html", page(b"one"))
    second = saver.save("http://h/p.html", page(b"two"))
    assert first == second == str(out / "h" / "p.html")
    assert Path(first).read_bytes() == b"two"
    assert files_under(tmp_path) == [out / "h" / "p.html"]


def test_failed_write_leaves_old_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    saver = FileItemSaver(out)
    saver.save("http://h/p.html", page(b"old"))

    def no_space(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(SaveError) as caught:
        saver.save("http://h/p.html", page(b"new"))
    assert str(out / "h" / "p.html") in str(caught.value)
    assert os.strerror(errno.ENOSPC) in str(caught.value)
    assert files_under(tmp_path) == [out / "h" / "p.html"]
    assert (out / "h" / "p.html").read_bytes() == b"old"


def test_conflicting_names_fall_back_to_sha1(tmp_path: Path) -> None:
    out = tmp_path / "out"
    saver = FileItemSaver(out)
    file_item, dir_item = "http://h/x.html", "http://h/x.html/y"
    assert saver.save(file_item, page(b"file")) == str(out / "h" / "x.html")
    fallback = str(out / "_conflicts" / sha1(dir_item))
    assert saver.save(dir_item, page(b"under")) == fallback
    assert saver.save(dir_item, page(b"again")) == fallback
    assert (out / "h" / "x.html").read_bytes() == b"file"
    assert Path(fallback).read_bytes() == b"again"
    assert len(files_under(out)) == 2


def test_target_that_is_a_directory_falls_back(tmp_path: Path) -> None:
    out = tmp_path / "out"
    saver = FileItemSaver(out)
    saver.save("http://h/x.html/y", page(b"under"))
    written = saver.save("http://h/x.html", page(b"file"))
    assert written == str(out / "_conflicts" / sha1("http://h/x.html"))
    assert (out / "h" / "x.html" / "y" / "index.html").read_bytes() == b"under"
    assert Path(written).read_bytes() == b"file"


def test_output_directory_is_created_on_open(tmp_path: Path) -> None:
    saver = FileItemSaver(tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists()
    saver.open()
    assert (tmp_path / "a" / "b").is_dir()


def test_output_that_is_a_file_is_a_save_error(tmp_path: Path) -> None:
    (tmp_path / "out").write_bytes(b"")
    with pytest.raises(SaveError, match="output directory"):
        FileItemSaver(tmp_path / "out").save("http://h/", page(b"x"))


@pytest.mark.parametrize(
    ("scheme", "mention"),
    [
        ("{host}/{nope}", "{nope}"),
        ("{0}/{path}", "{0}"),
        ("{}/{path}", "positional field {}"),
        ("{path!r}", "{path}"),
        ("{path:>20}", "{path}"),
        ("{host.real}/{path}", "{host.real}"),
        ("{host", "'{host'"),
        ("{host}/{path}}", "malformed"),
        ("{host}/{query}", "{path} or {sha1}"),
    ],
)
def test_bad_schemes_are_config_errors(scheme: str, mention: str) -> None:
    with pytest.raises(ConfigError) as caught:
        FileItemSaver("out", scheme)
    assert mention in str(caught.value)
    assert "{host} {port} {path} {query} {qhash} {sha1} {shard} {job}" in str(caught.value)


def test_from_spec(tmp_path: Path) -> None:
    spec = SaverSpec(output=str(tmp_path / "out"), name_scheme="{host}/{sha1}")
    saver = FileItemSaver.from_spec(spec, job="j", worker_id="w1")
    assert isinstance(saver, ItemSaver)
    written = saver.save("http://h/x", page(b"x"))
    assert written == str(tmp_path / "out" / "h" / sha1("http://h/x"))
    default = FileItemSaver.from_spec(SaverSpec(), job="j", worker_id="w1")
    assert default.name_for("http://h/x.html") == Path("h/x.html")


def test_job_query_hash_and_shard_fields(tmp_path: Path) -> None:
    saver = FileItemSaver(tmp_path, "{job}/{shard}/{sha1}-{qhash}", job="my/job")
    item = "http://h/search?q=1"
    h = sha1(item)
    assert saver.name_for(item) == Path("my%2Fjob", h[:2], h[2:4], f"{h}-{sha1('q=1')[:16]}")
    assert saver.name_for("http://h/plain") == Path("my%2Fjob", sha1("http://h/plain")[:2],
                                                    sha1("http://h/plain")[2:4],
                                                    sha1("http://h/plain") + "-")


@pytest.mark.parametrize("fsync, expected_calls", [(True, 2), (False, 0)])
def test_fsync_file_and_directory_only_when_asked(tmp_path, monkeypatch, fsync, expected_calls):
    calls = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd)))
    saver = FileItemSaver(tmp_path / "out", fsync=fsync)
    saver.save("http://h/a.html", Download("http://h/a.html", 200, "text/html", b"x"))
    assert len(calls) == expected_calls  # the file, then the directory holding its new name
    assert (tmp_path / "out" / "h" / "a.html").read_bytes() == b"x"


def test_a_save_into_an_existing_directory_makes_no_directory(tmp_path, monkeypatch):
    """Every system call of a save hands the GIL over under load: the directory is made
    only when it is missing, and the body goes straight to the descriptor."""
    saver = FileItemSaver(tmp_path / "out", fsync=False)
    saver.save("http://h/d/a.html", page(b"a"))  # makes h/d
    made = []
    real_mkdir = os.mkdir
    monkeypatch.setattr(os, "mkdir", lambda *a, **k: (made.append(a[0]), real_mkdir(*a, **k)))
    fdopens = []
    real_fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda *a, **k: (fdopens.append(1), real_fdopen(*a, **k))[1])
    saver.save("http://h/d/b.html", page(b"b"))
    assert made == [] and fdopens == []
    saver.save("http://h/e/c.html", page(b"c"))  # a new directory is still made
    assert [Path(m).name for m in made] == ["e"]
    assert (tmp_path / "out" / "h" / "d" / "b.html").read_bytes() == b"b"
    assert (tmp_path / "out" / "h" / "e" / "c.html").read_bytes() == b"c"


def test_a_short_write_is_continued(tmp_path, monkeypatch):
    """os.write may write less than it was given; the rest follows, nothing is lost."""
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:1000])))
    body = bytes(range(256)) * 40
    path = FileItemSaver(tmp_path / "out", fsync=False).save("http://h/big", page(body))
    assert Path(path).read_bytes() == body


# -- save_many: a save batch's group commit ----------------------------------------------------

GROUP = [
    ("http://h/a.html", b"a"), ("http://h/d/b.html", b"b"), ("http://h/d/e/c", b"c"),
    ("http://g:8080/", b"g"), ("12345", b"id"),
]


def _record_syncfs(monkeypatch, out: Path) -> list[dict]:
    """Replace the saver's syncfs with a real one that also records, at each call, which final
    files exist and which temporary files wait."""
    from distscrape_celery.savers import files

    calls: list[dict] = []
    real = files._syncfs

    def syncfs(directory: str) -> None:
        names = [p for p in out.rglob("*") if p.is_file()]
        calls.append({
            "directory": directory,
            "final": sorted(str(p.relative_to(out)) for p in names if not p.name.startswith(".~tmp-")),
            "temporary": sum(p.name.startswith(".~tmp-") for p in names),
        })
        real(directory)

    monkeypatch.setattr(files, "_syncfs", syncfs)
    return calls


def test_save_many_writes_what_saves_one_at_a_time_would(tmp_path: Path) -> None:
    one, many = FileItemSaver(tmp_path / "one"), FileItemSaver(tmp_path / "many")
    expected = [one.save(item, page(body)) for item, body in GROUP]
    got = many.save_many([(item, page(body)) for item, body in GROUP])
    assert got == [p.replace(str(tmp_path / "one"), str(tmp_path / "many")) for p in expected]
    for item, body in GROUP:
        assert (tmp_path / "many" / many.name_for(item)).read_bytes() == body
    assert [p.relative_to(tmp_path / "many") for p in files_under(tmp_path / "many")] == \
        [p.relative_to(tmp_path / "one") for p in files_under(tmp_path / "one")]


def test_save_many_flushes_the_contents_before_any_rename_and_the_renames_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group's durability order: every new content on disk (first syncfs, nothing replaced
    yet), then the renames, then a second syncfs before any item may count as saved."""
    out = tmp_path / "out"
    saver = FileItemSaver(out)
    saver.save("http://h/a.html", page(b"old"))
    calls = _record_syncfs(monkeypatch, out)
    fsyncs: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: fsyncs.append(fd))
    saver.save_many([(item, page(body)) for item, body in GROUP])
    assert len(calls) == 2 and calls[0]["directory"] == calls[1]["directory"]  # one file system
    assert {k: calls[0][k] for k in ("final", "temporary")} == {"final": ["h/a.html"],
                                                               "temporary": len(GROUP)}
    assert calls[1]["temporary"] == 0 and len(calls[1]["final"]) == len(GROUP)
    assert (out / "h" / "a.html").read_bytes() == b"a"
    assert fsyncs == []  # no flush per file


def test_save_many_one_bad_entry_leaves_the_others_saved(tmp_path: Path) -> None:
    out, outside = tmp_path / "out", tmp_path / "outside"
    (out / "h").mkdir(parents=True)
    outside.mkdir()
    (out / "evil").symlink_to(outside)
    saver = FileItemSaver(out)
    saver.save("http://h/x.html", page(b"file"))
    got = saver.save_many([
        ("http://h/a.html", page(b"a")),
        ("http://evil/x.html", page(b"nope")),
        ("http://h/x.html/y", page(b"under")),  # its directory would be a file: _conflicts
        ("http://h/b.html", page(b"b")),
        ("http://evil/y.html", page(b"nope")),  # its directory, resolved once, still refused
    ])
    assert isinstance(got[1], SaveError) and "outside the output directory" in str(got[1])
    assert isinstance(got[4], SaveError) and "outside the output directory" in str(got[4])
    assert list(outside.iterdir()) == []
    assert got[0] == str(out / "h" / "a.html") and got[3] == str(out / "h" / "b.html")
    assert got[2] == str(out / "_conflicts" / sha1("http://h/x.html/y"))
    assert Path(got[2]).read_bytes() == b"under"
    assert list(outside.iterdir()) == []
    assert not [p for p in out.rglob(".~tmp-*")]


@pytest.mark.parametrize("which", [0, 1])
def test_save_many_a_failed_flush_fails_every_entry_and_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: int
) -> None:
    """The first or the second syncfs fails (a full disk shows as ENOSPC at writeback): no item
    of the group counts as saved, the disk-full error is the cause the pipeline looks for, and
    the old file stays whole where nothing was renamed yet."""
    from distscrape_celery.core.pipeline.failures import output_full
    from distscrape_celery.savers import files

    out = tmp_path / "out"
    saver = FileItemSaver(out)
    saver.save("http://h/a.html", page(b"old"))
    calls = []

    def syncfs(directory: str) -> None:
        calls.append(directory)
        if len(calls) == which + 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files, "_syncfs", syncfs)
    got = saver.save_many([(item, page(body)) for item, body in GROUP])
    assert all(isinstance(r, SaveError) for r in got), got
    assert all(output_full(r) is not None for r in got)
    assert not [p for p in out.rglob(".~tmp-*")]
    assert (out / "h" / "a.html").read_bytes() == (b"old" if which == 0 else b"a")


def test_save_many_saves_one_at_a_time_without_fsync_or_syncfs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from distscrape_celery.savers import files

    calls = _record_syncfs(monkeypatch, tmp_path / "nofsync")
    got = FileItemSaver(tmp_path / "nofsync", fsync=False).save_many(
        [(item, page(body)) for item, body in GROUP])
    assert calls == [] and all(isinstance(r, str) for r in got)
    spec = SaverSpec(output=str(tmp_path / "apart"), group_commit=False)
    saver = FileItemSaver.from_spec(spec, job="j", worker_id="w1")
    calls = _record_syncfs(monkeypatch, tmp_path / "apart")
    got = saver.save_many([(item, page(body)) for item, body in GROUP])
    assert calls == [] and all(isinstance(r, str) for r in got)
    monkeypatch.setattr(files, "_syncfs", None)  # a C library without syncfs: fsync per file
    fsyncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd)))
    got = FileItemSaver(tmp_path / "plain").save_many([(item, page(body)) for item, body in GROUP])
    assert all(isinstance(r, str) for r in got) and len(fsyncs) == 2 * len(GROUP)


def test_save_many_calls_a_subclass_save_for_each_item(tmp_path: Path) -> None:
    class Counting(FileItemSaver):
        seen: list[str] = []

        def save(self, item, download):
            self.seen.append(item)
            return super().save(item, download)

    got = Counting(tmp_path / "out").save_many([(item, page(body)) for item, body in GROUP])
    assert Counting.seen == [item for item, _ in GROUP] and all(isinstance(r, str) for r in got)


def test_item_saver_save_many_returns_each_error_in_its_place() -> None:
    class Picky(ItemSaver):
        @classmethod
        def from_spec(cls, spec, *, job, worker_id):
            return cls()

        def save(self, item, download):
            if item == "bad":
                raise SaveError("no")
            return item

    got = Picky().save_many([("a", page(b"")), ("bad", page(b"")), ("c", page(b""))])
    assert got[0] == "a" and got[2] == "c" and isinstance(got[1], SaveError)


def test_save_many_flushes_every_file_system_it_wrote_to(tmp_path: Path, monkeypatch) -> None:
    """A directory under the output may be another file system (a mount): each one written to
    is flushed, before the renames and after them."""
    out = tmp_path / "out"
    saver = FileItemSaver(out)
    saver.save("http://g:8080/", page(b"makes the directories"))
    saver.save("http://h/a.html", page(b"makes the directories"))
    calls = _record_syncfs(monkeypatch, out)
    real_stat = os.stat
    other = os.path.realpath(out / "g%3A8080")

    def stat(path, *args, **kwargs):
        st = real_stat(path, *args, **kwargs)
        if isinstance(path, (str, Path)) and os.path.realpath(path) == other:
            fields = list(st)
            fields[2] = st.st_dev + 1  # st_dev
            return os.stat_result(fields)
        return st

    monkeypatch.setattr(os, "stat", stat)
    got = saver.save_many([(item, page(body)) for item, body in GROUP])
    assert all(isinstance(r, str) for r in got)
    dirs = [c["directory"] for c in calls]
    assert len(dirs) == 4 and dirs[:2] == dirs[2:] and other in dirs[:2], dirs


def test_the_files_saver_never_writes_a_dot_name(tmp_path):
    """A URL path chooses names under the output: none may be a hidden file or directory that
    programs of the output's owner read on their own."""
    saver = FileItemSaver(tmp_path, "{path}", fsync=False)
    base = "http://127.0.0.1:9"
    items = {
        f"{base}/.ssh/authorized_keys": "%2Essh/authorized_keys/index.html",
        f"{base}/.bashrc": "%2Ebashrc",
        f"{base}/.local/lib/python3.11/site-packages/x.pth":
            "%2Elocal/lib/python3.11/site-packages/x.pth",
        f"{base}/a/.git/config": "a/%2Egit/config/index.html",
        f"{base}/%2Essh/k.txt": "%252Essh/k.txt",  # an escape in the URL stays apart from ours
        f"{base}/.": "%2E",
    }
    from distscrape_celery.web.fetch import Download

    for item, name in items.items():
        assert str(saver.name_for(item)) == name, item
        saver.save(item, Download(url=item, status=200, content_type="text/plain", body=b"x"))
    written = [p for p in tmp_path.rglob("*")]
    assert written and not [p for p in written if p.name.startswith(".")], written
    hosts = FileItemSaver(tmp_path / "h", fsync=False)
    assert not str(hosts.name_for("http://.evil.invalid/x.html")).startswith(".")
