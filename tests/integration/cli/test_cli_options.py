"""The scraper and saver options of `distscrape crawl` and `seed`, `seed --ids-file`, seeding a job
that exists, and `distscrape tar-index`: real Redis, real workers, real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import os
import pty
import random
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
import redis
from tests.support.crawl import crawl_settings, saved_files
from tests.support.http import RouteServer
from tests.support.cli import assert_one_line_error, run
from tests.support.tracker_state import live_items
from tests.support.http import IdSite

import distscrape_celery.cli as cli
from distscrape_celery.tracker import keys
from distscrape_celery.worker.app import configure_app
from distscrape_celery.job.spec import JobSpec, build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.savers import FileItemSaver, tar_index
from distscrape_celery.worker.publish import publisher
from distscrape_celery.tracker import MAX_ADD_BATCH, RedisTracker
from distscrape_celery.tracker.redis.items import ADD_STREAM_PIPELINE

ID_OPTIONS = ["--scraper", "ids", "--id-regex", r'"id": "(\d+)"']


def main(capsys, *args: str) -> tuple[int, str, str]:
    """``distscrape ARGS`` in this process: (exit status, stdout, stderr)."""
    try:
        cli.main(list(args))
        status = 0
    except SystemExit as exc:
        status = exc.code or 0
    out, err = capsys.readouterr()
    return status, out, err


def assert_one_line(result: tuple[int, str, str], *fragments: str) -> None:
    status, _, err = result
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def stored_spec(redis_url: str, job: str) -> JobSpec:
    return JobSpec.from_json(RedisTracker.from_url(redis_url).load_spec(job))


# -- options ---------------------------------------------------------------------------------


BAD_OPTIONS = [
    (["--id-regex", "([0-9", "--scraper", "ids", "--download-url-fmt", "http://127.0.0.1/{id}"],
     "--id-regex: invalid regular expression"),
    (["--scraper", "ids", "--id-regex", "x", "--download-url-fmt", "http://127.0.0.1/item"],
     "--download-url-fmt: 'http://127.0.0.1/item' has no {} or {id}"),
    (["--scraper", "ids"], "--scraper: the ids scraper needs --id-regex and --download-url-fmt"),
    (["--scraper", "nope"], "--scraper: unknown kind 'nope'"),
    (["--scraper", "no_such_module_xyz:Scraper"], "--scraper: cannot load"),
    (["--saver", "nope"], "--saver: unknown kind 'nope'"),
    (["--saver", "distscrape_celery.web.fetch:Fetcher"], "--saver: 'distscrape_celery.web.fetch:Fetcher' is not a subclass"),
    (["--saver", "tar", "--output", "out/"], "--output: ", "is not an output for the tar saver (--saver)"),
    (["--saver", "redis", "--output", "dir"], "--output: ", "is not an output for the redis saver (--saver)"),
    (["--saver", "warc", "--output", "site.tar.gz"], "is not an output for the warc saver (--saver)"),
    (["--saver", "files", "--output", "redis://127.0.0.1:9/0"], "is not an output for the files saver"),
    (["--link-regex", "(["], "--link-regex: invalid regular expression"),
]


@pytest.mark.parametrize("command", ["seed", "crawl"])
@pytest.mark.parametrize("args, fragments", [(args, tuple(f)) for args, *f in BAD_OPTIONS])
def test_each_bad_option_is_one_line_naming_it(command, args, fragments, capsys, redis_url, tmp_path,
                                               monkeypatch):
    monkeypatch.chdir(tmp_path)
    # The modules of the bad dotted paths are allowed: what is wrong is the path itself.
    monkeypatch.setenv("DISTSCRAPE_PLUGIN_MODULES", "no_such_module_xyz,distscrape_celery.web.fetch")
    head = ["seed", "j"] if command == "seed" else ["crawl", "--in-memory"]
    tail = ["--redis-url", redis_url] if command == "seed" else []
    assert_one_line(main(capsys, *head, "http://127.0.0.1:9/", *args, *tail), *fragments)
    if command == "seed":
        assert RedisTracker.from_url(redis_url).jobs() == []  # nothing was created


def test_errors_from_a_job_file_name_the_field_and_the_file(capsys, redis_url, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('seeds = ["http://127.0.0.1:9/"]\n[scraper]\nkind = "ids"\nid_regex = "(["\n'
                   'download_url_fmt = "http://127.0.0.1:9/{id}"\n[saver]\nkind = "tar"\n'
                   f'output = "{tmp_path}/out"\n')
    res = main(capsys, "seed", "j", "--config", str(job), "--redis-url", redis_url)
    assert_one_line(res, f"scraper.id_regex in {job}: invalid regular expression",
                    f"saver.output in {job}: ", f"(saver.kind in {job})")
    # A flag that fixes the file's value is named instead, and only what is still wrong remains.
    res = main(capsys, "seed", "j", "--config", str(job), "--id-regex", "x", "--redis-url", redis_url)
    assert_one_line(res, f"saver.output in {job}")
    assert "id_regex" not in res[2]
    res = main(capsys, "seed", "j", "--config", str(job), "--id-regex", "x", "--output", "o",
               "--redis-url", redis_url)
    assert_one_line(res, "--output: ", f"(saver.kind in {job})")


def test_flags_override_the_file_field_by_field(capsys, redis_url, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('seeds = ["http://127.0.0.1:9/list"]\n[scraper]\nkind = "ids"\n'
                   'id_regex = "file-regex"\ndownload_url_fmt = "http://127.0.0.1:9/file/{id}"\n'
                   f'[saver]\noutput = "{tmp_path}/file.tar"\nshard_max_items = 5\n')
    status, out, err = main(capsys, "seed", "a", "--config", str(job), "--redis-url", redis_url)
    assert status == 0, err
    spec = stored_spec(redis_url, "a")
    assert (spec.scraper.id_regex, spec.saver.kind, spec.saver.output) == (
        "file-regex", "tar", f"{tmp_path}/file.tar")
    status, out, err = main(
        capsys, "seed", "b", "--config", str(job), "--id-regex", r"\d+", "--output", "flag.warc.gz",
        "--redis-url", redis_url,
    )
    assert status == 0, err
    spec = stored_spec(redis_url, "b")
    assert spec.scraper.id_regex == r"\d+"
    assert spec.scraper.download_url_fmt == "http://127.0.0.1:9/file/{id}"  # from the file
    assert (spec.saver.kind, spec.saver.output) == ("warc", str(Path.cwd() / "flag.warc.gz"))
    assert spec.saver.shard_max_items == 5  # from the file
    status, _, err = main(capsys, "seed", "c", "--config", str(job), "--scraper", "simple",
                          "--saver", "files", "--output", str(tmp_path / "dir"), "--redis-url", redis_url)
    assert status == 0, err
    spec = stored_spec(redis_url, "c")
    assert (spec.scraper.kind, spec.saver.kind) == ("simple", "files")


@pytest.mark.parametrize("output, kind", [
    ("pages", "files"), ("site.tar", "tar"), ("site.tar.gz", "tar"), ("site.tar.bz2", "tar"),
    ("site.warc.gz", "warc"), ("redis://127.0.0.1:9/3", "redis"),
])
def test_the_saver_follows_the_output_when_not_given(output, kind, capsys, redis_url, tmp_path,
                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, _, err = main(capsys, "seed", "j", "http://127.0.0.1:9/", "--output", output,
                          "--redis-url", redis_url)
    assert status == 0, err
    spec = stored_spec(redis_url, "j")
    assert spec.saver.kind == kind
    assert spec.saver.output == (output if kind == "redis" else str(tmp_path / output))


@pytest.mark.parametrize("output", ["site.tar.gz", "site.warc.gz", "pages"])
def test_crawl_checks_each_savers_output_before_anything_is_fetched(output, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    with RouteServer({"/": (200, b"<a href='/x'>x</a>")}) as server:
        res = run("crawl", server.base + "/", "--output", str(a_file / output), "--in-memory")
        assert_one_line_error(res, "cannot write the output", str(a_file))
        assert server.hits == []


# -- seed --ids-file -------------------------------------------------------------------------


def _id_lines(n: int, rng: random.Random) -> tuple[list[str], set[str]]:
    """``n`` ID lines with duplicates, blank lines and whitespace; and the IDs in them."""
    ids = [str(10**6 + i) for i in range(n)]
    lines = []
    for i in ids:
        lines.append(f"  {i}\t" if rng.random() < 0.1 else i)
        if rng.random() < 0.05:
            lines.append("")
        if rng.random() < 0.05:
            lines.append(rng.choice(ids))  # a duplicate
    return lines, set(ids)


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_ids_file_counts_new_and_seen_and_reports_bad_lines(source, redis_url, tmp_path):
    lines, ids = _id_lines(20_000, random.Random(5))
    lines[100:100] = ["bad\x01id"]  # line 101
    lines[5000:5000] = ["9" * 300]  # line 5001
    lines.append("1000007")  # already in the file
    path = tmp_path / "ids.txt"
    path.write_text("\n".join(lines) + "\n")
    options = [*ID_OPTIONS, "--download-url-fmt", "http://127.0.0.1:9/item/{id}",
               "--output", str(tmp_path / "out"), "--redis-url", redis_url]
    # A job that exists already knows some of them.
    res = run("seed", "ids", "1000000", "1000001", "42", *options)
    assert res.returncode == 0, res.stderr
    assert "created: 3 new item(s), 0 already seen" in res.stdout
    if source == "file":
        res = run("seed", "ids", "--ids-file", str(path), *options)
    else:  # with no options, the job takes its seeds as it is (IDs, for its ids scraper)
        res = run("seed", "ids", "--ids-file", "-", "--redis-url", redis_url,
                  input=path.read_text())
    name = str(path) if source == "file" else "-"
    assert res.returncode == 1, res.stderr  # done, but lines were skipped
    offered = sum(1 for line in lines if line.strip()) - 2
    assert (f"job ids exists; seeds added: {len(ids) - 2} new item(s), "
            f"{offered - (len(ids) - 2)} already seen") in res.stdout
    assert f"{name}:101: malformed seed ID 'bad\\x01id'" in res.stderr
    assert f"{name}:5001: malformed seed ID '{'9' * 100}'...: longer than 256 characters" in res.stderr
    assert f"2 malformed line(s) of {name} skipped" in res.stderr
    assert "seeding" not in res.stderr  # no progress bar when stderr is not a terminal
    tracker = RedisTracker.from_url(redis_url)
    assert tracker.stats("ids").seen == len(ids) + 1  # and 42
    # The job keeps the spec it was created with.
    assert stored_spec(redis_url, "ids").seeds == ["1000000", "1000001", "42"]


def test_a_progress_bar_on_a_terminal(redis_url, tmp_path):
    path = tmp_path / "ids.txt"
    path.write_text("".join(f"{i}\n" for i in range(30_000)) + "bad\x02\n")
    primary, secondary = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "distscrape_celery.cli", "seed", "tty", "--ids-file", str(path),
         *ID_OPTIONS, "--download-url-fmt", "http://127.0.0.1:9/{id}", "--output",
         str(tmp_path / "o"), "--redis-url", redis_url],
        stdout=subprocess.PIPE, stderr=secondary, env={**env, "COLUMNS": "120"},
    )
    os.close(secondary)
    chunks: list[bytes] = []

    def drain() -> None:  # the bar must never block on a full terminal
        while True:
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # the other end closed
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out, _ = proc.communicate(timeout=120)
    reader.join(30)
    os.close(primary)
    err = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 1, err
    assert "job tty created: 30000 new item(s), 0 already seen" in out.decode()
    assert "seeding" in err and "30,000 read: 30,000 new, 0 already seen" in err
    assert f"{path}:30001: malformed seed ID" in err


def test_a_url_file_is_normalised_and_bad_urls_reported(redis_url, tmp_path, redis_client):
    path = tmp_path / "urls.txt"
    path.write_text("HTTP://127.0.0.1:80/a#top\n\nhttp://127.0.0.1/a\nftp://127.0.0.1/x\n"
                    "  http://127.0.0.1/b  \nnot a url\n")
    res = run("seed", "u", "--ids-file", str(path), "--output", str(tmp_path / "o"),
              "--redis-url", redis_url)
    assert res.returncode == 1, res.stderr
    assert "job u created: 2 new item(s), 1 already seen" in res.stdout
    assert f"{path}:4: malformed seed URL 'ftp://127.0.0.1/x'" in res.stderr
    assert f"{path}:6: malformed seed URL 'not a url'" in res.stderr
    items = list(live_items(redis_client, "u"))
    assert sorted(items) == ["http://127.0.0.1/a", "http://127.0.0.1/b"]
    # The first seed of the file is the new job's seed.
    assert stored_spec(redis_url, "u").seeds == ["http://127.0.0.1/a"]
    # A seed on another host is taken, but the job stays on its seeds' hosts: that is said.
    res = run("seed", "u", "http://elsewhere.invalid/", "http://127.0.0.1/c", "--redis-url", redis_url)
    assert res.returncode == 0, res.stderr
    assert "job u exists; seeds added: 2 new item(s), 0 already seen" in res.stdout
    assert "1 seed(s) are on none of the job's seeds' hosts" in res.stderr
    bad = tmp_path / "nothing.txt"
    bad.write_text("\n  \nnope\n")
    res = run("seed", "v", "--ids-file", str(bad), "--redis-url", redis_url)
    assert res.returncode == 2 and "give at least one SEED" in res.stderr
    assert_one_line_error(run("seed", "w", "--ids-file", str(tmp_path / "missing.txt"),
                              "--redis-url", redis_url), "--ids-file: cannot read")


def test_seeding_streams_in_batches_never_the_whole_input(redis_url):
    """The manager takes items from its input as it adds them: while it is still reading, the
    items read so far are already in Redis but for at most three round trips' worth (the one
    Redis is adding, the next one read ahead, and the one being read)."""
    tracker = RedisTracker.from_url(redis_url)
    watcher = redis.Redis.from_url(redis_url, decode_responses=True)
    stats_key = keys.JobKeys("big").stats
    round_trip = MAX_ADD_BATCH * ADD_STREAM_PIPELINE
    checked = []

    def items():
        for i in range(60_000):
            if i and i % 5_000 == 0:
                in_redis = int(watcher.hget(stats_key, "seen") or 0)
                assert in_redis >= i - 3 * round_trip, (i, in_redis)  # a materialised list fails
                checked.append(i)
            yield f"id-{i}"

    spec = build_spec({"seeds": ["id-0"], "scraper": {
        "kind": "ids", "id_regex": "x", "download_url_fmt": "http://127.0.0.1:9/{id}"}})
    progress = []
    res = CrawlManager(tracker, lambda job, batch: None).seed(
        "big", spec, items(), on_progress=lambda taken, new: progress.append(taken))
    assert (res.added, res.already_seen) == (60_000, 1)
    assert len(checked) == 11
    assert progress == sorted(progress) and len(progress) >= 60_000 // round_trip


def test_an_ids_file_crawl_downloads_every_reachable_id_once(redis_url, workers, tmp_path):
    site = IdSite(seed=12)
    rng = random.Random(4)
    seeds = rng.sample(site.ids, 6)
    reach, todo = set(), list(seeds)
    while todo:
        i = todo.pop()
        if i not in reach:
            reach.add(i)
            todo.extend(site.related[i])
    path = tmp_path / "ids.txt"
    path.write_text("\n".join([*seeds, "", seeds[0], " " + seeds[1]]) + "\n")
    settings = crawl_settings(redis_url, lease_seconds=5)
    tracker = RedisTracker.from_url(redis_url)
    procs = [workers(settings, "idf-a", concurrency=2), workers(settings, "idf-b", concurrency=2)]
    wait_for_workers(tracker, 2, procs=procs)
    try:
        res = run("seed", "idf", "--ids-file", str(path), *ID_OPTIONS,
                  "--download-url-fmt", site.base + "/item/{id}.json",
                  "--output", str(tmp_path / "out"), "--redis-url", redis_url)
        assert res.returncode == 0, res.stderr
        assert "job idf created: 6 new item(s), 2 already seen" in res.stdout
        configure_app(settings)
        stats = CrawlManager(tracker, publisher.scrape).wait("idf", timeout=120)
    finally:
        site.close()
    assert (stats.dead, stats.done) == (0, len(reach))
    fetched = Counter(p[6:-5] for p in site.hits if p.startswith("/item/"))
    assert set(fetched) == reach
    assert all(site.hits[p] == 1 for p in site.hits), site.hits.most_common(3)
    assert len(saved_files(tmp_path / "out")) == len(reach)


# -- tar-index -------------------------------------------------------------------------------


def test_tar_index_lists_the_shards_of_a_real_crawl(tmp_path, capsys):
    site = IdSite(seed=21)
    output = tmp_path / "items.tar.gz"
    try:
        res = run("crawl", *(f"{site.base}/list/{n}" for n in site.lists), *ID_OPTIONS,
                  "--download-url-fmt", site.base + "/item/{id}.json", "--saver", "tar",
                  "--output", str(output), "--concurrency", "3", "--lease-seconds", "5", timeout=240)
    finally:
        site.close()
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert f"output in {output}" in res.stdout
    expected = {(item, shard, name) for item, shard, name in tar_index(output)}
    assert {item for item, _, _ in expected} == site.reachable | {
        f"{site.base}/list/{n}" for n in site.lists}
    status, out, err = main(capsys, "tar-index", str(output))
    assert status == 0, err
    assert {tuple(line.split("\t")) for line in out.splitlines()} == expected
    status, out, err = main(capsys, "tar-index", str(output), "--json")
    assert status == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert {(r["item"], r["shard"], r["member"]) for r in rows} == expected
    # The crawl joined its shards into the output it was given; the index lists that file.
    assert {r["shard"] for r in rows} == {str(output)}
    assert_one_line(main(capsys, "tar-index", str(tmp_path / "items.zip")), "is not a tar archive name")
    assert_one_line(main(capsys, "tar-index", str(tmp_path / "other.tar")), "no saved items found")


# -- seeding a job that exists ---------------------------------------------------------------


def test_seeds_added_to_an_existing_job_are_crawled_and_a_changed_spec_refused(
    redis_url, workers, tmp_path
):
    page = b"<a href='%s'>x</a>"
    routes = {
        "/a/": (200, page % b"/a/1"), "/a/1": (200, b"a1"),
        "/b/": (200, page % b"/b/1"), "/b/1": (200, page % b"/b/2"), "/b/2": (200, b"b2"),
        "/c/": (200, b"c"),
    }
    settings = crawl_settings(redis_url, lease_seconds=5)
    tracker = RedisTracker.from_url(redis_url)
    wait_for_workers(tracker, 1, procs=[workers(settings, "again", concurrency=2)])
    configure_app(settings)
    manager = CrawlManager(tracker, publisher.scrape)
    out = tmp_path / "out"
    with RouteServer(routes) as server:
        common = ["--output", str(out), "--redis-url", redis_url]
        res = run("seed", "site", server.base + "/a/", *common)
        assert "job site created: 1 new item(s), 0 already seen" in res.stdout, res.stderr
        assert manager.wait("site", timeout=60).done == 2
        res = run("seed", "site", server.base + "/a/", server.base + "/b/", *common)
        assert res.returncode == 0, res.stderr
        assert "job site exists; seeds added: 1 new item(s), 1 already seen" in res.stdout
        assert manager.wait("site", timeout=60).done == 5
        urls = tmp_path / "urls.txt"
        urls.write_text(f"{server.base}/c/\n{server.base}/b/1\n")
        # With no option but seeds, the job takes them as it is (its output, from anywhere).
        res = run("seed", "site", "--ids-file", str(urls), "--redis-url", redis_url)
        assert "job site exists; seeds added: 1 new item(s), 1 already seen" in res.stdout, res.stderr
        stats = manager.wait("site", timeout=60)
        # A changed spec is refused, naming what differs; nothing is added.
        res = run("seed", "site", server.base + "/d/", "--output", str(tmp_path / "other"),
                  "--redis-url", redis_url)
        assert_one_line_error(res, "already exists with a different spec (saver.output differs)")
        res = run("seed", "site", server.base + "/d/", "--link-regex", "x", "--scraper", "simple",
                  *common)
        assert_one_line_error(res, "(scraper.link_regex differs)")
    assert (stats.done, stats.dead, stats.seen) == (6, 0, 6)
    assert tracker.stats("site").seen == 6
    assert sorted(server.page_hits) == sorted(routes)  # each page downloaded once
    names = FileItemSaver(out)
    assert saved_files(out) == {str(names.name_for(server.base + p)): routes[p][1] for p in routes}
    assert stored_spec(redis_url, "site").seeds == [server.base + "/a/"]
