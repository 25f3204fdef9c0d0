"""A site's control characters never reach the operator's terminal or the workers' logs: a
redirect to a URL full of terminal escapes, a Content-Type holding them and a bidi override, all
served on 127.0.0.1 and crawled by real worker processes, show as visible escapes (``\\x1b``) in
the crawl's summary, `distscrape dead`, `status`, `export` and the worker log; and a reason
stored raw in Redis (by an earlier version, or anyone writing to it) is escaped where it is shown."""

from __future__ import annotations

import redis

from tests.support.cli import run
from tests.support.crawl import crawl_settings
from tests.support.http import reply, serve

from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.tracker import Fault, RedisTracker
from distscrape_celery.tracker.keys import JobKeys
from distscrape_celery.worker.app import configure_app
from distscrape_celery.worker.publish import publisher

# The redirect target of the report, byte for byte: set the window title, then clear the screen.
TITLE_AND_CLEAR = "x-a:///\x1b]0;PWNED\x07\x1b[2J"
SHOWN_TITLE_AND_CLEAR = r"x-a:///\x1b]0;PWNED\x07\x1b[2J"
# A right-to-left override: "evil\u202etxt.exe" shows as "evilexe.txt".
BIDI_TARGET = "x-b:///evil\u202etxt.exe"
SHOWN_BIDI = r"evil\u202etxt.exe"
# A Content-Type with ESC, BEL and the C1 CSI (0x9b: ESC [ on many terminals), no ";" to end it,
# in lower case as a media type is shown.
HOSTILE_TYPE = "application/x\x1b[2j\x07\x9b31m"
SHOWN_TYPE = r"application/x\x1b[2j\x07\x9b31m"
# What must never be written as it is.
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


def hostile_routes() -> dict:
    """A home page linking to three pages that answer with control characters."""
    links = "".join(f'<a href="{p}">x</a>' for p in ("/title", "/bidi", "/type"))
    # http.server sends a header as latin-1: the bidi override goes as its UTF-8 bytes.
    bidi = BIDI_TARGET.encode().decode("latin-1")
    return {
        "/": lambda h: reply(h, 200, f"<html>{links}</html>".encode(), {"Content-Type": "text/html"}),
        "/title": lambda h: reply(h, 302, headers={"Location": TITLE_AND_CLEAR}),
        "/bidi": lambda h: reply(h, 302, headers={"Location": bidi}),
        "/type": lambda h: reply(h, 200, b"x", {"Content-Type": HOSTILE_TYPE}),
    }


def assert_escaped(text: str, *shown: str) -> None:
    """``text`` holds no raw control or bidi character, and shows each of ``shown``."""
    raw = sorted({repr(c) for c in RAW if c in text})
    assert not raw, f"raw {', '.join(raw)} in:\n{text!r}"
    for visible in shown:
        assert visible in text, f"{visible!r} not in:\n{text}"


def test_the_crawl_summary_dead_and_status_show_a_sites_escapes_visibly(redis_url, tmp_path):
    """`distscrape crawl` (real worker processes) of the hostile site, then `dead`, `status`
    and `export --dead` on its Redis: every reason is there, escaped."""
    job_file = tmp_path / "job.toml"
    job_file.write_text('[scraper]\nallowed_content_types = ["text/html"]\n')
    with serve(hostile_routes()) as (base, _, _log):
        crawl = run("crawl", base + "/", "--job", "esc", "--config", str(job_file), "--quiet",
                    "--concurrency", "2", "--output", str(tmp_path / "out"),
                    "--redis-url", redis_url, timeout=180)
    assert crawl.returncode == 1, crawl.stderr  # finished, with dead items
    assert "3 dead" in crawl.stdout, crawl.stdout
    assert_escaped(crawl.stdout + crawl.stderr, SHOWN_TITLE_AND_CLEAR, SHOWN_BIDI, SHOWN_TYPE)
    dead = run("dead", "esc", "--redis-url", redis_url)
    assert dead.returncode == 0, dead.stderr
    assert len(dead.stdout.splitlines()) == 3, dead.stdout
    assert_escaped(dead.stdout, SHOWN_TITLE_AND_CLEAR, SHOWN_BIDI, SHOWN_TYPE)
    # A wide terminal, so that no line of the table is wrapped inside an escape.
    status = run("status", "esc", "--redis-url", redis_url, env={"COLUMNS": "1000"})
    assert status.returncode == 0, status.stderr
    assert status.stdout.count("dead http://") == 3, status.stdout
    assert_escaped(status.stdout, SHOWN_TITLE_AND_CLEAR, SHOWN_BIDI, SHOWN_TYPE)


def test_the_worker_log_shows_a_sites_escapes_visibly(redis_url, workers, tmp_path):
    """A real worker process crawls the hostile site, logging each dead item with its reason:
    its log file holds the reasons, escaped."""
    settings = crawl_settings(redis_url, lease_seconds=10)
    worker = workers(settings, "esc-log", concurrency=2)
    tracker = RedisTracker.from_url(redis_url)
    wait_for_workers(tracker, 1, procs=[worker])
    configure_app(settings)
    with serve(hostile_routes()) as (base, _, _log):
        spec = build_spec({"seeds": [base + "/"], "saver": {"output": str(tmp_path / "out")},
                           "scraper": {"allowed_content_types": ["text/html"]}})
        CrawlManager(tracker, publisher.scrape).seed("esc-log", spec)
        stats = CrawlManager(tracker, publisher.scrape).wait("esc-log", timeout=120,
                                                             check=worker.check)
    assert (stats.done, stats.dead) == (1, 3), stats
    log = worker.log_path.read_text(encoding="utf-8", errors="surrogateescape")
    assert "redirect to a non-http(s) URL" in log, log
    assert_escaped(log, SHOWN_TITLE_AND_CLEAR, SHOWN_BIDI, SHOWN_TYPE)


def dead_with_reason(redis_url: str, job: str, reason: str) -> str:
    """Make one item of a new ``job`` dead through the tracker, with ``reason``; the item."""
    tracker = RedisTracker.from_url(redis_url)
    tracker.create_job(job, '{"seeds": ["http://127.0.0.1:9/"]}')
    worker = tracker.register_worker("host", 1, 1)
    item = "http://127.0.0.1:9/"
    tracker.add(job, [item])
    token = tracker.checkout(job, item, worker, max_lost=1).token
    tracker.fail(job, item, token, reason, fault=Fault.ITEM, max_retries=0, max_lost=1,
                 retryable=False)
    return item


def test_a_failure_reason_is_stored_with_its_escapes_visible(redis_url):
    """Where a reason is recorded: what Redis holds is already escaped, for any reader of it."""
    item = dead_with_reason(redis_url, "stored", f"redirect to {TITLE_AND_CLEAR} {BIDI_TARGET}")
    held = redis.Redis.from_url(redis_url).hget(JobKeys("stored", 0).dead, item).decode()
    assert held == f"redirect to {SHOWN_TITLE_AND_CLEAR} x-b:///{SHOWN_BIDI}"


def test_a_reason_stored_raw_is_escaped_where_it_is_shown(redis_url):
    """The commands escape what they print, whatever the tracker holds: a dead item's reason
    written to Redis as a site sent it (by an earlier version, or by anyone who can write to
    that Redis) shows escaped in `dead`, `status` and `export --dead`."""
    item = dead_with_reason(redis_url, "raw", "placeholder")
    raw_reason = f"invalid URL {item}: redirect to {TITLE_AND_CLEAR} {BIDI_TARGET}"
    redis.Redis.from_url(redis_url).hset(JobKeys("raw", 0).dead, item, raw_reason.encode())
    assert RedisTracker.from_url(redis_url).dead_items("raw") == {item: raw_reason}  # stored raw, as a writer may
    for command in (["dead", "raw"], ["status", "raw"], ["export", "raw", "--dead"]):
        res = run(*command, "--redis-url", redis_url, env={"COLUMNS": "1000"})
        assert res.returncode == 0, res.stderr
        assert_escaped(res.stdout, SHOWN_TITLE_AND_CLEAR, SHOWN_BIDI)
