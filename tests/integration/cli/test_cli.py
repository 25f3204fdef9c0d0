"""The `distscrape` command as a user runs it: clear one-line errors, seed and status on Redis."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.cli import assert_one_line_error, run
from tests.support.ops import closed_port



def test_invalid_regex_is_named(redis_url, tmp_path):
    res = run("seed", "j", "http://127.0.0.1/", "--link-regex", "([a-z", "--redis-url", redis_url)
    assert_one_line_error(res, "--link-regex: invalid regular expression")


@pytest.mark.parametrize("seed", ["htp://127.0.0.1/", "http://", "not a url", "http://127.0.0.1:99999/"])
def test_malformed_seed_url_is_named(redis_url, seed):
    res = run("seed", "j", seed, "--redis-url", redis_url)
    assert_one_line_error(res, "malformed seed URL")


def test_unreachable_redis(tmp_path):
    url = f"redis://127.0.0.1:{closed_port()}/0"
    res = run("seed", "j", "http://127.0.0.1/", "--redis-url", url, "--output", str(tmp_path))
    assert_one_line_error(res, "unreachable", url)


def test_bad_settings_from_the_environment(redis_url):
    res = run("status", "j", env={"DISTSCRAPE_LEASE_SECONDS": "soon"})
    assert_one_line_error(res, "DISTSCRAPE_LEASE_SECONDS")
    res = run("status", "j", env={"DISTSCRAPE_LEASE": "5"})
    assert_one_line_error(res, "unknown setting", "DISTSCRAPE_LEASE")


def test_bad_config_file(tmp_path, redis_url):
    bad = tmp_path / "bad.toml"
    bad.write_text("seeds = [")
    assert_one_line_error(run("seed", "j", "--config", str(bad)), "not valid TOML")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('seeds = ["http://127.0.0.1/"]\n[scraper]\nlink_regexp = "x"\n')
    assert_one_line_error(
        run("seed", "j", "--config", str(unknown), "--redis-url", redis_url),
        f"scraper.link_regexp in {unknown}",
    )


def test_bad_job_name(redis_url):
    assert_one_line_error(
        run("seed", "no spaces", "http://127.0.0.1/", "--redis-url", redis_url), "invalid job name"
    )


def test_seed_and_status(redis_url, tmp_path):
    res = run("seed", "news", "http://127.0.0.1:9/", "--output", str(tmp_path), "--redis-url", redis_url)
    assert res.returncode == 0, res.stderr
    assert "job news created: 1 new item(s), 0 already seen; 0 sent to workers now" in res.stdout
    assert "no worker is alive yet" in res.stderr
    res = run("status", "news", "--json", "--redis-url", redis_url)
    assert res.returncode == 0, res.stderr
    status = json.loads(res.stdout)
    assert {k: status[k] for k in ("seen", "queued", "leased", "done", "dead", "finished")} == {
        "seen": 1, "queued": 1, "leased": 0, "done": 0, "dead": 0, "finished": False,
    }
    # The same seed again is harmless; another spec under the same name is refused.
    again = run("seed", "news", "http://127.0.0.1:9/", "--output", str(tmp_path), "--redis-url", redis_url)
    assert again.returncode == 0 and "0 new item(s), 1 already seen" in again.stdout
    other = run("seed", "news", "http://127.0.0.1:9/", "--link-regex", "x", "--output", str(tmp_path),
                "--redis-url", redis_url)
    assert_one_line_error(other, "already exists with a different spec (scraper.link_regex differs)")
    assert_one_line_error(run("status", "nosuch", "--redis-url", redis_url), "no job named 'nosuch'")


def test_crawl_of_a_dead_host_reports_dead_items(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}/"
    # One retry: its robots.txt is asked again (and the item retried) after 10 s.
    job = tmp_path / "job.toml"
    job.write_text("max_retries = 1\n")
    res = run("crawl", "--in-memory", url, "--output", str(tmp_path / "out"), "--config", str(job))
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert "0 saved, 1 dead" in res.stdout
    assert "dead: " + url in res.stderr and "refused" in res.stderr.lower()


@pytest.mark.parametrize("source", ["flag", "env"])
@pytest.mark.parametrize("url, why", [
    ("redis://127.0.0.1:notaport/0", "port"),
    ("redis://:s3cret-pw@127.0.0.1:99999/0", "port"),
    ("redis://127.0.0.1:6379/notadb", "database"),
    ("http://127.0.0.1:6379/0", "scheme"),
    ("127.0.0.1:6379", "not a URL"),
])
def test_malformed_redis_url_is_one_line(source, url, why):
    if source == "flag":
        res = run("status", "j", "--redis-url", url, timeout=30)
        field = "--redis-url"
    else:
        res = run("status", "j", env={"DISTSCRAPE_REDIS_URL": url}, timeout=30)
        field = "DISTSCRAPE_REDIS_URL"
    redacted = url.replace("s3cret-pw", "***")
    assert_one_line_error(res, field, redacted, why)
    assert "s3cret-pw" not in res.stderr


def test_malformed_broker_url_is_one_line():
    res = run("status", "j", env={"DISTSCRAPE_BROKER_URL": "redis://127.0.0.1:notaport/0"}, timeout=30)
    assert_one_line_error(res, "DISTSCRAPE_BROKER_URL", "port")


# Commands that only read or delete load neither Celery nor the in-memory tracker's fake Redis:
# those two imports were most of such a command's start-up.
READ_ONLY = [("status", "j"), ("status", "j", "--json"), ("jobs",), ("workers",), ("dead", "j"),
             ("export", "j", "--dead"), ("delete", "j", "--force")]


@pytest.mark.parametrize("args", READ_ONLY, ids=lambda a: " ".join(a))
def test_read_only_commands_load_no_celery(redis_url, args):
    from distscrape_celery.tracker import RedisTracker

    RedisTracker.from_url(redis_url).create_job("j", json.dumps({"seeds": ["http://127.0.0.1/"]}))
    code = (
        "import sys\n"
        "from distscrape_celery.cli import main\n"
        f"sys.argv = ['distscrape', *{list(args)!r}, '--redis-url', {redis_url!r}]\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    status = exc.code\nelse:\n    status = 0\n"
        "print('STATUS', status, sorted(m for m in ('celery', 'fakeredis', 'lupa') if m in sys.modules))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "STATUS 0 []", (res.stdout, res.stderr)
