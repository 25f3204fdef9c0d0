"""The messages of `distscrape` (run as a subprocess) that show configured URLs never show their
passwords: refused seed URLs, a wrong saver's output URL, the summary of a real crawl."""

from __future__ import annotations

import redis

from tests.support.cli import run
from tests.support.http import RouteServer

SECRET = "s3cret"


def test_seed_urls_with_credentials_are_refused_without_showing_them(redis_url) -> None:
    res = run("seed", "j", "http://user:s3cret@127.0.0.1:9/", "--redis-url", redis_url)
    assert res.returncode == 2 and "carries credentials" in res.stderr, res.stderr
    assert SECRET not in res.stderr + res.stdout


def test_an_output_url_for_the_wrong_saver_is_shown_redacted(tmp_path) -> None:
    res = run("crawl", "--in-memory", "http://127.0.0.1:9/", "--saver", "files",
              "--output", "redis://:s3cret@127.0.0.1:9/2")
    assert res.returncode == 2 and "redis://:***@127.0.0.1:9/2" in res.stderr, res.stderr
    assert SECRET not in res.stderr + res.stdout


def test_the_crawl_summary_never_shows_the_output_password(redis_server_url, tmp_path) -> None:
    """A real crawl saving to the test Redis (which has a password) at database 2."""
    password = redis.connection.parse_url(redis_server_url)["password"]
    assert password
    output = redis_server_url.rsplit("/", 1)[0] + "/2"
    with RouteServer({"/": (200, b"<html>hello</html>")}) as server:
        res = run("crawl", "--in-memory", server.base + "/", "--output", output)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert "1 saved, 0 dead" in res.stdout
    assert f"output in {output.replace(password, '***')}" in res.stdout
    assert password not in res.stdout + res.stderr
    client = redis.Redis.from_url(output)
    try:
        assert client.dbsize() >= 1  # the page went there
        client.flushdb()
    finally:
        client.close()
